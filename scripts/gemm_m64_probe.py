"""GPU probe: where does the decode-sized GEMM lose at M=64 on the narrow split weights?

The session-15..18 sweeps found Qwen3-4B ``o`` (N 2560, K 4096) at 9.2-10.5 us for M = 1..16 (cuBLAS
10.5-10.7) but 12.1-12.7 us at M = 64 (cuBLAS 9.8), and no tile, stage, loop-form or split-chunk choice
that follows a model there. This probe separates the parts of the M=64 configuration's work, each timed
with the weights streamed from HBM (one call per weight copy, as in the sweeps):

* ``m64``: M=64 rows through the M=64 configuration (what decode at batch 64 runs);
* ``m1_in_m64_tile``: M=1 through the same configuration (BLOCK_M 64, same BLOCK_N / stages / path): the
  x rows past M are masked, so no activation bytes move, but the tile's MMA work is the same;
* ``m16_in_m64_tile``: 16 real rows in the 64-row tile (a quarter of the activation bytes);
* ``m64_as_m16_tiles`` / ``m64_as_m32_tiles``: M=64 through the M=16 / M=32 configurations (4 / 2 row
  tiles: the weights are read 4 / 2 times, from L2 after the first);
* ``cublas_m1`` / ``cublas_m64``;
* on split weights, the 64-row tile at other widths and paths (``m64_partial_n{16,32,64,128}_w*``,
  ``m64_fused_n{32,64}[_tma]``) and on 2 warps (mma.sync) or 8 (two warpgroups); the partial path at
  BLOCK_N 32 / 64 with 3, 6 or 8 stages (``*_s{3,6,8}``) and with the chunk loop's runtime trip count.

Reading: if ``m1_in_m64_tile`` is near M=1's time, the 64-row tile's MMA and shared-memory work is free and
the activation traffic costs the difference; if it is near ``m64``, the tile work itself is the cost.
Every output row is compared bit for bit with the same row computed alone (M=1, default configuration):
token invariance holds for every configuration, so a mismatch is a bug and is reported.

    python scripts/gemm_m64_probe.py --out DIR [--shapes qwen3-4b:o,qwen3-4b:down,qwen3-30b-a3b:o]
"""

from __future__ import annotations

import sys

from areal_tik_plugin.gpu import probe
from areal_tik_plugin.gpu.gemm import named_shapes

# the split weights whose M=64 configuration the probe separates (narrow ones: few column tiles)
SHAPES = {k: v for k, v in named_shapes().items()
          if k in ("qwen3-4b:o", "qwen3-4b:down", "qwen3-30b-a3b:o", "qwen3-8b:o", "qwen2.5-1.5b:down")}


def variants(gemm, N: int, K: int, n_sms: int) -> dict:
    """(rows M, configuration) per variant name; configurations from the implementation's own rule."""
    c64 = gemm.config_for(64, N, K, n_sms)
    out = {
        "m64": (64, c64),
        "m1_in_m64_tile": (1, c64),
        "m16_in_m64_tile": (16, c64),
        "m64_as_m16_tiles": (64, gemm.config_for(16, N, K, n_sms)),
        "m64_as_m32_tiles": (64, gemm.config_for(32, N, K, n_sms)),
    }
    chunks = -(-K // gemm.split_chunk(K))
    if chunks > 1:
        # the 64-row tile at other widths: activation bytes read from L2 scale with the number of column
        # tiles (N / BLOCK_N re-reads of x), weight bytes do not
        for bn, warps in ((16, 4), (32, 4), (64, 4), (128, 8)):
            progs = -(-N // bn) * chunks
            out[f"m64_partial_n{bn}_w{warps}"] = (64, gemm._small_config(64, bn, split="partial", warps=warps,
                                                                         programs=progs, num_sms=n_sms))
        for bn, tma in ((32, True), (64, False), (64, True)):
            out[f"m64_fused_n{bn}{'_tma' if tma else ''}"] = (64, gemm._small_config(
                64, bn, split="fused", flat=True, programs=-(-N // bn), num_sms=n_sms, tma=tma))
        # the MMA instruction: Triton 3.6 takes wgmma (MMAv3) only when num_warps % 4 == 0, so 2 warps run
        # the same 64-row tile on mma.sync (MMAv2, as the BLOCK_M 16 / 32 tiers do); 8 warps: two warpgroups
        for bn in (32, 64):
            out[f"m64_partial_n{bn}_w2"] = (64, gemm._small_config(64, bn, split="partial", warps=2,
                                                                   programs=-(-N // bn) * chunks, num_sms=n_sms))
            out[f"m64_fused_n{bn}_w2"] = (64, gemm._small_config(64, bn, split="fused", flat=True, warps=2,
                                                                 programs=-(-N // bn), num_sms=n_sms))
        out["m64_partial_n64_w8"] = (64, gemm._small_config(64, 64, split="partial", warps=8,
                                                            programs=-(-N // 64) * chunks, num_sms=n_sms))
        # the chunk programs' K loop with a runtime trip count (free knob SPLIT_PARTIAL_FIXED_TRIPS off): ptxas
        # serializes the 64-row tile's wgmma there (C7515), so these are the before-rows of that knob
        for bn in (32, 64):
            cfg = out[f"m64_partial_n{bn}_w4"][1]
            out[f"m64_partial_n{bn}_w4_runtime_trips"] = (64, dict(cfg, fixed_trips=False))
        if c64.get("split") == "partial":
            out["m64_runtime_trips"] = (64, dict(c64, fixed_trips=False))
        # the pipeline depth of the chunk programs: the residency rule (_small_stages) gives Qwen3-4B down 4
        # stages at 3 programs per SM; deeper pipelines keep more weight bytes in flight per program
        for bn in (32, 64):
            cfg = out[f"m64_partial_n{bn}_w4"][1]
            for st in (3, 6, 8):
                if st != cfg["num_stages"]:
                    out[f"m64_partial_n{bn}_w4_s{st}"] = (64, dict(cfg, num_stages=st))
    return out


def parse_shapes(text: str) -> dict:
    names = [s for s in text.split(",") if s]
    bad = [s for s in names if s not in SHAPES]
    if bad or not names:
        raise ValueError(f"--shapes: expected a comma list of {sorted(SHAPES)}, got {text!r}")
    return {s: SHAPES[s] for s in names}


def main(argv=None) -> int:
    ap = probe.parser("gemm_m64_probe", rounds=3)
    ap.add_argument("--shapes", default="qwen3-4b:o,qwen3-4b:down,qwen3-30b-a3b:o")
    args, shapes = probe.parse(ap, argv, lambda a: parse_shapes(a.shapes))
    if probe.cuda_missing("gemm_m64_probe"):
        return 2
    import torch
    import torch.nn.functional as F

    from areal_tik_plugin import bench
    from areal_tik_plugin.gpu.gemm import _weight_copies
    from areal_tik_plugin.gpu.suite import bits
    from areal_tik_plugin.loader import get_implementation

    impl = get_implementation()
    gemm = impl.module("gemm")
    n_sms = torch.cuda.get_device_properties(0).multi_processor_count
    res = probe.new_result(impl)
    for name, (N, K) in shapes.items():
        ws, _ = _weight_copies(N, K, False, seed=N + K)
        x = torch.randn(64, K, device="cuda", dtype=torch.bfloat16)
        alone = torch.stack([bits(gemm.linear(x[i:i + 1], ws[0]))[0] for i in range(64)])
        calls = variants(gemm, N, K, n_sms)
        row = {"shape": name, "N": N, "K": K, "configs": {}, "mismatch": [], "us": {}}
        for v, (m, c) in calls.items():
            row["configs"][v] = c["name"] + f"_s{c['num_stages']}"
            y = gemm.linear(x[:m], ws[0], config=c)
            torch.cuda.synchronize()
            if not torch.equal(bits(y), alone[:m]):
                row["mismatch"].append(v)
        timed = {v: [lambda w=w, m=m, c=c: gemm.linear(x[:m], w, config=c) for w in ws]
                 for v, (m, c) in calls.items()}
        timed["cublas_m1"] = [lambda w=w: F.linear(x[:1], w) for w in ws]
        timed["cublas_m64"] = [lambda w=w: F.linear(x, w) for w in ws]
        row["us"], row["samples_us"] = bench.interleaved_medians(
            timed, lambda fns: bench.time_graph_each_us(fns, rounds=20), args.rounds)
        res["rows"].append(row)
        print(f"{name:<18} " + "  ".join(f"{v} {u:.1f}" for v, u in row["us"].items())
              + f"  mismatches {row['mismatch'] or 0}", flush=True)
        del ws
        torch.cuda.empty_cache()
    return probe.write_result(res, args.out, "gemm_m64_probe.json", "shapes")

if __name__ == "__main__":
    sys.exit(main())
