"""GPU probe: does the Gluon GEMM lose its time at ragged M to TMA boxes past the last row of x?

The Gluon probe found the kernel fast where M fills its 64-row halves (M 64 / 128 / 255 / 256: 0.90-0.94x
cuBLAS on Qwen3-4B / 8B o and down) and slow where the last half holds few rows (M 33 / 65 / 129 / 160 / 200:
0.52-0.83x), on the same tiles and items. One candidate: the TMA loads of x whose box lies mostly past row M
(zero-filled by the hardware), repeated for every column tile. This probe times, per (shape, M), in one process:

* ``exact``: ``gemm.linear`` on an x of its own M rows (the TMA descriptor has M rows: the boxes past M are
  zero-filled);
* ``desc_padded``: the same call on x = the first M rows of a buffer of whole tiles, its descriptor given the
  buffer's rows (the boxes read real rows past M, which no output row depends on: outputs stay masked to M);
* ``full``: the call at M = the buffer's rows (the cost of the same tiles with every row real);

and checks that ``exact`` and ``desc_padded`` give the same bits. If ``desc_padded`` runs at ``full``'s time,
the zero fill is the cost, and a descriptor over rows that the caller's storage already has (SGLang's CUDA-graph
buffers are max-batch sized) removes it without a copy. Writes ``gluon_gemm_oob_probe-<impl>.json`` under
``--out``, prints a table last. CUDA-graph replay over weight copies past L2 (as gluon_gemm_probe).

Usage (GPU): ``TIK_IMPLEMENTATION=tik_v10 TIK_NATIVE=0 python -m benchmarks.probes.gluon_gemm_oob_probe --out $OUT``
"""

from __future__ import annotations

import argparse
import json
import os

from benchmarks.probes.gluon_gemm_probe import parse_ms

DEFAULT_SHAPES = "qwen3-4b:o,qwen3-4b:down,qwen3-8b:o,qwen3-8b:down"


def padded_rows(M: int, halves: int) -> int:
    """Rows of whole tiles of ``halves`` x 64 rows covering M."""
    tile = 64 * halves
    return -(-M // tile) * tile


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.probes.gluon_gemm_oob_probe")
    ap.add_argument("--out", required=True)
    ap.add_argument("--m", default="33,65,96,129,160,200")
    ap.add_argument("--shapes", default=DEFAULT_SHAPES, help="comma list of model:layer")
    args = ap.parse_args(argv)
    try:
        Ms = parse_ms(args.m)
    except ValueError as e:
        ap.error(str(e))
    import torch

    from areal_tik_plugin.contract._rowops import stream_copies
    from areal_tik_plugin.contract.suite import bits
    from areal_tik_plugin.runtime import loader
    from benchmarks.gemm_sweep import SHAPES, _graph_us

    want = [tuple(s.split(":")) for s in args.shapes.split(",") if s]
    missing = [s for s in want if s not in SHAPES]
    if not want or missing:
        ap.error(f"--shapes: expected model:layer from {sorted(f'{a}:{b}' for a, b in SHAPES)}, got {args.shapes!r}")
    if not torch.cuda.is_available():
        ap.error("needs a CUDA device (the Gluon kernel runs on sm_90 only)")
    impl = loader.get_implementation()
    gemm = impl.module("gemm")
    if not hasattr(gemm, "_gluon"):
        ap.error(f"implementation {impl.name} has no Gluon GEMM (expected gemm._gluon, e.g. TIK_IMPLEMENTATION=tik_v10)")
    AG = impl.module("attention_gluon")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    pad_rows: dict[int, int] = {}          # data_ptr of an x view -> the rows its descriptor is given
    orig = AG._descriptor

    def descriptor(t, heads, D, block):
        d = orig(t, heads, D, block)
        rows = pad_rows.get(t.data_ptr())
        if rows and rows > t.shape[0]:
            d.shape = [rows, d.shape[1]]
        return d

    AG._descriptor = descriptor
    res = {"implementation": impl.name, "source_hash": impl.source_hash, "device": torch.cuda.get_device_name(0),
           "torch": torch.__version__, "native": os.environ.get("TIK_NATIVE", "auto"), "rows": []}
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"gluon_gemm_oob_probe-{impl.name}.json")
    for model, layer in want:
        N, K = SHAPES[(model, layer)]
        torch.manual_seed(N + K)
        ws = [(torch.randn(N, K, device="cuda") / K ** 0.5).to(torch.bfloat16) for _ in range(stream_copies(N * K * 2))]
        for M in Ms:
            cfg = gemm.config_for(M, N, K, sms)
            row = {"model": model, "layer": layer, "N": N, "K": K, "M": M, "config": cfg["name"]}
            if "gluon" not in cfg:
                row["skipped"] = "config_for gives no Gluon plan at this M"
                res["rows"].append(row)
                print(f"{model:<14}{layer:<8}M={M:<5} {cfg['name']}: no Gluon plan, skipped", flush=True)
                continue
            P = padded_rows(M, cfg["gluon"]["halves"])
            big = torch.randn(P, K, device="cuda").to(torch.bfloat16)
            view, exact = big[:M], big[:M].clone()
            pad_rows[view.data_ptr()] = P
            full_cfg = gemm.config_for(P, N, K, sms)
            y0 = bits(gemm.linear(exact, ws[0], config=cfg)).clone()
            y1 = bits(gemm.linear(view, ws[0], config=cfg)).clone()
            row.update(padded_rows=P, full_config=full_cfg["name"], bits_equal=bool(torch.equal(y0, y1)),
                       exact_us=_graph_us([lambda w=w: gemm.linear(exact, w, config=cfg) for w in ws]),
                       desc_padded_us=_graph_us([lambda w=w: gemm.linear(view, w, config=cfg) for w in ws]),
                       full_us=_graph_us([lambda w=w: gemm.linear(big, w, config=full_cfg) for w in ws]))
            del pad_rows[view.data_ptr()]
            res["rows"].append(row)
            with open(path, "w") as f:
                json.dump(res, f, indent=1)
        del ws
        torch.cuda.empty_cache()
    AG._descriptor = orig
    with open(path, "w") as f:
        json.dump(res, f, indent=1)
    print(f"{'shape':<22}{'M':>5}{'rows':>6}  {'exact us':>9}{'desc_padded':>12}{'full':>8}  bits")
    for r in res["rows"]:
        if "exact_us" in r:
            print(f"{r['model'] + ' ' + r['layer']:<22}{r['M']:>5}{r['padded_rows']:>6}  {r['exact_us']:9.1f}"
                  f"{r['desc_padded_us']:12.1f}{r['full_us']:8.1f}  {'equal' if r['bits_equal'] else 'DIFFER'}")
    bad = sum(1 for r in res["rows"] if r.get("bits_equal") is False)
    print(f"-> {path}; bit differences {bad}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
