"""GPU probe of an implementation's Gluon GEMM (``gemm_gluon.py``, sm_90) against its parent's Triton
kernels and cuBLAS, in one process.

For every dense shape of ``benchmarks.gemm_sweep.SHAPES`` (lm_head left out) and every M of ``--m``:
the bits of ``gemm.linear`` through the Gluon kernel (config_for's plan, then every other plan of
BLOCK_N x split, at the M values of ``--alt-m``, in the kernel's M band or outside it: M = 64 is
gemm.py's decode-sized kernels' today) against the reference implementation's ``linear`` (``--ref``, default tik_v6: its
contract evidence covers M 1..65536), the same call repeated (the tile tickets must be back at 0), a
biased and an fp16 call on the first M; then CUDA-graph replay times over enough weight copies to exceed
L2 (as gemm_sweep): the Gluon plan, the reference's config_for choice, and cuBLAS (``F.linear``, the
baseline a user gets from torch). A bit mismatch is reported and that plan is not timed.

``--guard-s`` first runs every plan on three small problems in a child process under a wall-clock limit
(a hang or a crash there ends the probe with exit 3 instead of taking the device call with it). Writes
``gluon_gemm_probe-<impl>.json`` under ``--out`` after every row (a hang leaves the rows before it) and prints a table and, per M, the geomean of cuBLAS time / ours for the Gluon plan and for the reference.

Usage (GPU): ``TIK_IMPLEMENTATION=tik_v7 python -m benchmarks.probes.gluon_gemm_probe --out $OUT``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

DEFAULT_M = (64, 65, 128, 256, 777, 1024)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def parse_ms(text: str) -> list[int]:
    try:
        ms = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--m: expected a comma list of positive integers, got {text!r}") from None
    if not ms or any(m <= 0 for m in ms):
        raise ValueError(f"--m: expected a comma list of positive integers, got {text!r}")
    return ms


HALVES_1_UP_TO = 128   # M 65..128: 64-row tiles on one consumer too (twice the tiles of the 128-row default)


def plans(g, M: int | None = None, halves_1_up_to: int = HALVES_1_UP_TO) -> list[dict]:
    """Every (BLOCK_N, split) knob set of gemm_gluon at its default ring depth (64- or 128-row tiles by M); for
    M in HALVES_1_MAX_M + 1..halves_1_up_to also every set on 64-row tiles, where 128-row ones leave SMs idle;
    where the implementation has the stream form (knob ``stream``), each unsplit set with it too (plan() runs
    the whole-tile form where the tiles fill whole waves: such a plan is timed under its own name once)."""
    halves = (None, 1) if M is not None and g.HALVES_1_MAX_M < M <= halves_1_up_to else (None,)
    forms = [(0, None), (1, None)] + ([(0, 1)] if "stream" in g.KNOBS else [])
    return [g.config(BLOCK_N=bn, split=s, halves=h, stream=st) for h in halves for bn in g.BLOCK_NS
            for s, st in forms]


def plan_config(cfg: dict, p: dict) -> dict:
    """gemm.linear's configuration ``cfg`` sent to the Gluon kernel with plan ``p``'s BLOCK_N, split and tile rows
    (the ring depth its default for them; the rows by M unless ``p`` sets them), at any M."""
    gl = {"BLOCK_N": p["BLOCK_N"], "split": p["split"], "stages": None, "halves": p.get("halves")}
    if p.get("stream") is not None:
        gl["stream"] = p["stream"]
    return dict(cfg, gluon=gl)


def plan_name(p: dict) -> str:
    form = "split" if p["split"] else ("stream" if p.get("stream") else "fused")
    return f"m{64 * p['halves']}_n{p['BLOCK_N']}_{form}_s{p['stages']}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.probes.gluon_gemm_probe")
    ap.add_argument("--out", required=True)
    ap.add_argument("--ref", default="tik_v6", help="the implementation whose linear gives the reference bits")
    ap.add_argument("--m", default=",".join(map(str, DEFAULT_M)))
    ap.add_argument("--shapes", default="", help="comma list of model:layer (default: every non-lm_head shape)")
    ap.add_argument("--alt-m", default="64,128,256", help="comma list of the M values where every plan is checked and "
                    "timed too, in gemm_gluon's M band or not ('' for none)")
    ap.add_argument("--halves-1-up-to", type=int, default=HALVES_1_UP_TO,
                    help="at the --alt-m values up to this M, every plan on 64-row tiles (one consumer) too "
                         f"[{HALVES_1_UP_TO}]")
    ap.add_argument("--guard-s", type=float, default=0.0,
                    help="first run every plan once on two small problems in a child process with this wall-clock "
                         "limit: a hang or a crash there is reported and ends the probe (exit 3) instead of taking "
                         "the call with it (0: no guard)")
    ap.add_argument("--smoke", action="store_true", help=argparse.SUPPRESS)   # the guard's child
    args = ap.parse_args(argv)
    if args.guard_s < 0:
        ap.error(f"--guard-s: expected >= 0, got {args.guard_s}")
    if args.halves_1_up_to < 1:
        ap.error(f"--halves-1-up-to: expected a positive M, got {args.halves_1_up_to}")
    try:
        Ms = parse_ms(args.m)
        alt_ms = set(parse_ms(args.alt_m)) if args.alt_m.strip() else set()
    except ValueError as e:
        ap.error(str(e))
    import torch
    import torch.nn.functional as F

    from areal_tik_plugin.contract.suite import bits
    from areal_tik_plugin.runtime import loader
    from benchmarks.gemm_sweep import LM_HEAD, SHAPES, _graph_us
    from areal_tik_plugin.contract._rowops import stream_copies

    if not torch.cuda.is_available():
        ap.error("needs a CUDA device (the Gluon kernel runs on sm_90 only)")
    impl = loader.get_implementation()
    gemm = impl.module("gemm")
    if not hasattr(gemm, "_gluon"):
        ap.error(f"implementation {impl.name} has no Gluon GEMM (expected gemm._gluon, e.g. TIK_IMPLEMENTATION=tik_v7)")
    g = gemm._gluon()
    ref = loader.load_implementation(loader.resolve_path(args.ref)).module("gemm")
    dev = "cuda"
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    shapes = {k: v for k, v in SHAPES.items() if k not in LM_HEAD}
    if args.shapes:
        want = set(args.shapes.split(","))
        shapes = {k: v for k, v in SHAPES.items() if f"{k[0]}:{k[1]}" in want}
        if not shapes:
            ap.error(f"--shapes: none of {sorted(want)} in {sorted(f'{a}:{b}' for a, b in SHAPES)}")
    if args.smoke:
        return smoke(torch, gemm, g, ref, sms)
    res = {"implementation": impl.name, "source_hash": impl.source_hash, "reference": args.ref,
           "device": torch.cuda.get_device_name(0), "torch": torch.__version__, "rows": [], "started": time.time()}
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"gluon_gemm_probe-{impl.name}.json")

    def dump():
        with open(path, "w") as f:
            json.dump(res, f, indent=1)

    if args.guard_s:
        res["guard"] = guard(args.ref, args.guard_s)
        if res["guard"]["status"] != "ok":
            dump()
            print(f"gluon_gemm_probe: the guard run ended {res['guard']['status']}; nothing else run", file=sys.stderr)
            return 3

    for (model, layer), (N, K) in shapes.items():
        copies = stream_copies(N * K * 2)
        torch.manual_seed(N + K)
        ws = [(torch.randn(N, K, device=dev) / K ** 0.5).to(torch.bfloat16) for _ in range(copies)]
        for i, M in enumerate(Ms):
            x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
            cfg = gemm.config_for(M, N, K, sms)
            rcfg = ref.config_for(M, N, K, sms)
            want = bits(ref.linear(x, ws[0], config=rcfg)).clone()
            row = {"model": model, "layer": layer, "N": N, "K": K, "M": M, "config": cfg["name"],
                   "ref_config": rcfg["name"], "gluon_applies": bool(cfg.get("gluon")) and g.applies(x, ws[0], torch.empty(M, N, device=dev, dtype=x.dtype)),
                   "mismatch": [], "plans": {}}
            try:
                for rep in range(2):   # the second call reuses the tickets the first one left at 0
                    got = gemm.linear(x, ws[0], config=cfg)
                    torch.cuda.synchronize()
                    if not torch.equal(bits(got), want):
                        row["mismatch"].append(f"{cfg['name']}/call{rep}")
                if i == 0:
                    b = torch.randn(N, device=dev).to(torch.bfloat16)
                    if not torch.equal(bits(gemm.linear(x, ws[0], b, config=cfg)), bits(ref.linear(x, ws[0], b, config=rcfg))):
                        row["mismatch"].append(f"{cfg['name']}/bias")
                    xh, wh = x.half(), ws[0].half()
                    if not torch.equal(bits(gemm.linear(xh, wh, config=cfg)), bits(ref.linear(xh, wh, config=rcfg))):
                        row["mismatch"].append(f"{cfg['name']}/fp16")
                # outside the band too: what the kernel would give there
                alts = plans(g, M, args.halves_1_up_to) if M in alt_ms else []
                for p in alts:
                    pc = plan_config(cfg, p)
                    name = plan_name(g.plan(M, N, K, gemm.split_chunk(K), sms, dict(p)))
                    if name in row["plans"] or name in row["mismatch"]:
                        continue
                    y = gemm.linear(x, ws[0], config=pc)
                    torch.cuda.synchronize()
                    if not torch.equal(bits(y), want):
                        row["mismatch"].append(name)
                        continue
                    row["plans"][name] = _graph_us([lambda w=w, c=pc: gemm.linear(x, w, config=c) for w in ws])
                row["ours_us"] = _graph_us([lambda w=w: gemm.linear(x, w, config=cfg) for w in ws])
                row["ref_us"] = _graph_us([lambda w=w: ref.linear(x, w, config=rcfg) for w in ws])
                row["cublas_us"] = _graph_us([lambda w=w: F.linear(x, w) for w in ws])
            except Exception as e:   # recorded, never hidden; the next shape still runs
                row["error"] = f"{type(e).__name__}: {e}"[:300]
            res["rows"].append(row)
            dump()
            best = min(row["plans"], key=row["plans"].get) if row["plans"] else "-"
            print(f"{model:<14}{layer:<8}M={M:<5} {cfg['name']:<34} ours {row.get('ours_us', float('nan')):7.1f}  "
                  f"{args.ref} {row.get('ref_us', float('nan')):7.1f}  cublas {row.get('cublas_us', float('nan')):7.1f}  "
                  f"best plan {best} {row['plans'].get(best, float('nan')):7.1f}  mismatches {len(row['mismatch'])}"
                  + (f"  ERROR {row['error']}" if "error" in row else ""), flush=True)
        del ws
        torch.cuda.empty_cache()
    res["seconds"] = time.time() - res["started"]
    summary = {}
    for M in Ms:
        rows = [r for r in res["rows"] if r["M"] == M and "ours_us" in r]
        if rows:
            gm = lambda key: math.exp(sum(math.log(r["cublas_us"] / r[key]) for r in rows) / len(rows))  # noqa: E731
            summary[M] = {"ours_vs_cublas": gm("ours_us"), "ref_vs_cublas": gm("ref_us"), "shapes": len(rows)}
    res["summary"] = summary
    res["mismatches"] = sum(len(r["mismatch"]) for r in res["rows"])
    res["errors"] = sum("error" in r for r in res["rows"])
    dump()
    print(f"{'M':>6} {'ours/cuBLAS':>12} {args.ref + '/cuBLAS':>16}  (geomean of cuBLAS us / us)")
    for M, s in summary.items():
        print(f"{M:>6} {s['ours_vs_cublas']:12.3f} {s['ref_vs_cublas']:16.3f}")
    print(f"mismatches {res['mismatches']}, errors {res['errors']}; {res['seconds']:.0f} s -> {path}")
    return 1 if res["mismatches"] or res["errors"] else 0


# split weights, a one-chunk weight, odd M; then tiles past one wave, not whole waves (the stream form's cuts), on one
# chunk and on two
SMOKE = ((200, 4096, 12288), (130, 1536, 1536), (77, 2560, 9728), (256, 19456, 2560), (300, 6144, 4096))


def smoke(torch, gemm, g, ref, sms) -> int:
    """The guard's child: every plan twice (the second call reuses the tickets) on SMOKE's problems with a bias,
    synchronized after each; prints each result; exit 1 on a bit mismatch against the reference."""
    from areal_tik_plugin.contract.suite import bits

    bad = 0
    for M, N, K in SMOKE:
        torch.manual_seed(M)
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        w = (torch.randn(N, K, device="cuda") / K ** 0.5).to(torch.bfloat16)
        b = torch.randn(N, device="cuda").to(torch.bfloat16)
        base = gemm.config_for(M, N, K, sms)
        want = bits(ref.linear(x, w, b, config=ref.config_for(M, N, K, sms))).clone()
        for p in plans(g, M):
            pc = plan_config(base, p)
            for rep in range(2):
                y = gemm.linear(x, w, b, config=pc)
                torch.cuda.synchronize()
                ok = torch.equal(bits(y), want)
                bad += not ok
                print(f"smoke M={M} N={N} K={K} n{p['BLOCK_N']} split {p['split']} halves {p.get('halves') or 'default'} "
                      f"call {rep}: bits equal {ok}",
                      flush=True)
    return 1 if bad else 0


def guard(ref: str, limit_s: float) -> dict:
    """``--smoke`` in a child process with a wall-clock limit: status ok / mismatch / timeout / error."""
    import subprocess

    cmd = [sys.executable, "-m", "benchmarks.probes.gluon_gemm_probe", "--out", os.devnull, "--ref", ref, "--smoke"]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=limit_s, cwd=ROOT)
        status = {0: "ok", 1: "mismatch"}.get(r.returncode, f"error (exit {r.returncode})")
        tail = (r.stdout + r.stderr)[-1500:]
    except subprocess.TimeoutExpired as e:
        status, tail = f"timeout ({limit_s:.0f} s)", str((e.stdout or b"")[-1500:])
    print(f"guard: {status}", flush=True)
    return {"status": status, "tail": tail}


if __name__ == "__main__":
    sys.exit(main())
