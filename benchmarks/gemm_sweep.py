"""Free-knob sweep for the batch-invariant GEMM on the GPU (tile shape, warps, stages, TMA).

``python -m benchmarks.gemm_sweep --out DIR`` writes ``gemm_sweep.json`` and prints, per
(shape, M), the current ``config_for`` choice, the fastest swept configuration and cuBLAS. Every
configuration's output is compared bit for bit with the current choice (free knobs must not change
bits; a mismatch is reported, never hidden). Timing: CUDA-graph replay over enough weight copies to
exceed the 50 MB L2 (a decode layer streams its weights from HBM), so small shapes are not measured
L2-resident.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

from areal_tik_plugin.contract._rowops import stream_copies
from areal_tik_plugin.contract.suite import bits
from areal_tik_plugin.models import weight_shapes

DEV = "cuda"
# (model, layer) -> (N, K): the decode-relevant dense shapes (from areal_tik_plugin.models); --lm-head adds the
# vocab projections (not in the default sweep: one copy is 470 / 780 MB)
_SWEPT = (("qwen2.5-1.5b", ("o", "down")), ("qwen3-4b", ("qkv", "o", "gate_up", "down")),
          ("qwen3-8b", ("qkv", "o", "gate_up", "down")), ("qwen3-30b-a3b", ("qkv", "o")),
          ("qwen2.5-1.5b", ("lm_head",)), ("qwen3-4b", ("lm_head",)))
SHAPES = {(m, layer): weight_shapes(m)[layer][:2] for m, layers in _SWEPT for layer in layers}
LM_HEAD = {k for k in SHAPES if k[1] == "lm_head"}
SMALL_M = (1, 16, 64)
LARGE_M = (1024, 4096)
SMALL_BN = (16, 32, 64, 128)
SMALL_WARPS = (2, 4)
SMALL_STAGES = (3, 5, 8, 12)
LARGE = ((128, 256, 8, 3), (128, 256, 8, 4), (128, 128, 8, 3), (128, 128, 8, 4), (128, 128, 4, 4),
         (128, 128, 8, 5), (64, 256, 4, 4), (128, 64, 4, 4), (256, 128, 8, 3))
# --persistent: the same tile shapes on the persistent TMA kernel (one program per SM striding over the
# tiles in the grouped order), added to the large-M list
PERSISTENT = ((128, 128, 4, 4), (128, 128, 4, 3), (128, 128, 8, 4), (128, 256, 8, 3), (64, 256, 4, 4))


def _small_bm(M: int) -> int:
    return 16 if M <= 16 else (32 if M <= 32 else 64)


def configs(M: int, persistent: bool = False) -> list[dict]:
    out = []
    if M <= 64:
        bm = _small_bm(M)
        for bn, w, st, tma in itertools.product(SMALL_BN, SMALL_WARPS, SMALL_STAGES, (False, True)):
            if tma and bm < 64:
                continue
            out.append(dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=w, num_stages=st, GROUP_M=1, tma=tma,
                            name=f"s_m{bm}_n{bn}_w{w}_s{st}{'_tma' if tma else ''}"))
    else:
        for bm, bn, w, st in LARGE:
            out.append(dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=w, num_stages=st, GROUP_M=8, tma=True,
                            name=f"l_m{bm}_n{bn}_w{w}_s{st}"))
        for bm, bn, w, st in PERSISTENT if persistent else ():
            out.append(dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=w, num_stages=st, GROUP_M=8, tma=True,
                            persistent=True, name=f"p_m{bm}_n{bn}_w{w}_s{st}"))
    return out


# --split: for a split weight (K >= GEMM_SPLIT_MIN_K) the paths and loop forms of the split: small M
# partial (workspace + ordered reduce) vs fused (two accumulators per program, one loop per chunk or
# one flat loop); large M the fused path on these tiles, both loop forms
SPLIT_SMALL_BN = (32, 64, 128, 256)
SPLIT_SMALL_STAGES = (4, 8, 12)
SPLIT_SMALL_WARPS = (4, 8)  # 8 warps only for BLOCK_N >= 128 (two warpgroups over the N tile)
SPLIT_LARGE = ((128, 128, 4, 4), (128, 128, 4, 3), (128, 128, 8, 3), (128, 128, 8, 4),
               (64, 128, 4, 4), (64, 128, 4, 3), (128, 64, 4, 4), (64, 256, 4, 3))


# mid M (64 < M <= SPLIT_MID_MAX_M) on a split weight: also the chunk-partial path (tiles x chunks programs, the
# ordered reduction in each tile's last program) over these tiles, beside the fused large-M tiles. The mid-M rule
# (gemm.MID_M_SPLIT_TILES) takes the first tile that gives 0.6 programs per SM: Qwen3-4B o / down at M=256 get
# 80 / 200 programs of 128 x 128 (0.57 / 0.64x cuBLAS in evidence/tik_v2); smaller tiles give 2-5x the programs.
SPLIT_MID_MAX_M = 2048
SPLIT_MID_PARTIAL = ((64, 64, 4), (64, 128, 4), (128, 64, 4), (128, 128, 8), (64, 256, 8))
SPLIT_MID_STAGES = (3, 4, 6)


# --split-tma: at BLOCK_M 64 also the fused flat loop on the TMA kernel (narrow split weights at M=64,
# where each program re-reads the activation tile: the TMA loads against the pointer loads)
SPLIT_TMA_BN = (32, 64, 128)
SPLIT_TMA_STAGES = (4, 6, 8, 12)


def split_configs(M: int, tma: bool = False) -> list[dict]:
    out = []
    if tma and _small_bm(M) == 64:
        for bn, st, w in itertools.product(SPLIT_TMA_BN, SPLIT_TMA_STAGES, (4, 8)):
            if w == 8 and bn < 64:
                continue
            out.append(dict(BLOCK_M=64, BLOCK_N=bn, num_warps=w, num_stages=st, GROUP_M=1, tma=True,
                            split="fused", flat=True, name=f"s_m64_n{bn}_s{st}_w{w}_tma_fused_flat"))
    if M <= 64:
        bm = _small_bm(M)
        for bn, st, w in itertools.product(SPLIT_SMALL_BN if M > 16 else (16, 32, 64), SPLIT_SMALL_STAGES,
                                           SPLIT_SMALL_WARPS):
            if w == 8 and bn < 128:
                continue
            for split, flat in (("partial", False), ("fused", False), ("fused", True)):
                if split == "fused" and not flat and M <= 16:
                    continue  # decode M: the flat fused loop only (one program per tile, no workspace/reduce)
                out.append(dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=w, num_stages=st, GROUP_M=1, tma=False,
                                split=split, flat=flat,
                                name=f"s_m{bm}_n{bn}_s{st}{'_w8' if w == 8 else ''}_{split}{'_flat' if flat else ''}"))
    else:
        for (bm, bn, w, st), flat in itertools.product(SPLIT_LARGE, (False, True)):
            out.append(dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=w, num_stages=st, GROUP_M=8, tma=True,
                            split="fused", flat=flat, name=f"l_m{bm}_n{bn}_w{w}_s{st}{'_flat' if flat else ''}"))
        if M <= SPLIT_MID_MAX_M:
            for (bm, bn, w), st in itertools.product(SPLIT_MID_PARTIAL, SPLIT_MID_STAGES):
                out.append(dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=w, num_stages=st, GROUP_M=8, tma=False,
                                split="partial", flat=False, name=f"p_m{bm}_n{bn}_w{w}_s{st}_partial"))
    return out


def _graph_us(fns) -> float:
    from areal_tik_plugin import bench

    return bench.time_graph_each_us(fns, rounds=20)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.gemm_sweep")
    ap.add_argument("--out", required=True)
    ap.add_argument("--small-m", default=",".join(map(str, SMALL_M)))
    ap.add_argument("--large-m", default=",".join(map(str, LARGE_M)))
    ap.add_argument("--shapes", default="", help="comma list of model:layer (default: all)")
    ap.add_argument("--split", action="store_true",
                    help="on split weights sweep the split paths / loop forms (split_configs) instead of configs")
    ap.add_argument("--split-tma", action="store_true",
                    help="with --split: add the fused flat loop on the TMA kernel at BLOCK_M 64 (SPLIT_TMA_*)")
    ap.add_argument("--persistent", action="store_true",
                    help="large M: add the persistent TMA kernel on the PERSISTENT tiles (split weights: flat form)")
    ap.add_argument("--lm-head", action="store_true", help="add the lm_head shapes")
    ap.add_argument("--current-only", action="store_true",
                    help="time only config_for's choice (and cuBLAS), plus that choice at each --stages value")
    ap.add_argument("--stages", default="", help="with --current-only: comma list of num_stages to try on the choice")
    ap.add_argument("--chunk-max", type=int, default=0,
                    help="probe a different coupled split chunk (contract GEMM_SPLIT_CHUNK_MAX, a multiple of "
                         "GEMM_BLOCK_K) for this run: every configuration, and the reference bits, use it")
    args = ap.parse_args(argv)
    from areal_tik_plugin.runtime.loader import get_implementation

    impl = get_implementation()
    gemm = impl.module("gemm")
    contract = impl.module("contract")
    if args.chunk_max:
        if args.chunk_max <= 0 or args.chunk_max % contract.GEMM_BLOCK_K:
            ap.error(f"--chunk-max must be a positive multiple of GEMM_BLOCK_K={contract.GEMM_BLOCK_K}, "
                     f"got {args.chunk_max}")
        contract.GEMM_SPLIT_CHUNK_MAX = args.chunk_max
        gemm._config_for.cache_clear()
    n_sms = torch.cuda.get_device_properties(0).multi_processor_count
    shapes = {k: v for k, v in SHAPES.items() if args.lm_head or k not in LM_HEAD}
    if args.shapes:
        shapes = {k: v for k, v in SHAPES.items() if f"{k[0]}:{k[1]}" in args.shapes.split(",")}
    Ms = [int(x) for x in args.small_m.split(",") if x] + [int(x) for x in args.large_m.split(",") if x]
    res = {"implementation": impl.name, "source_hash": impl.source_hash, "rows": [], "started": time.time(),
           "split_chunk_max": contract.GEMM_SPLIT_CHUNK_MAX}
    t0 = time.time()
    for (model, layer), (N, K) in shapes.items():
        copies = stream_copies(N * K * 2)
        ws = [(torch.randn(N, K, device=DEV) / K ** 0.5).to(torch.bfloat16) for _ in range(copies)]
        for M in Ms:
            x = torch.randn(M, K, device=DEV, dtype=torch.bfloat16)
            cur = gemm.config_for(M, N, K, n_sms)
            ref = bits(gemm.linear(x, ws[0], config=cur)).clone()
            row = {"model": model, "layer": layer, "N": N, "K": K, "M": M, "current": cur["name"],
                   "current_us": _graph_us([lambda w=w: gemm.linear(x, w, config=cur) for w in ws]),
                   "cublas_us": _graph_us([lambda w=w: F.linear(x, w) for w in ws]), "configs": {}, "mismatch": []}
            split_weight = gemm.split_chunk(K) < K
            if args.current_only:
                cands = [dict(cur, num_stages=int(st), name=f"{cur['name']}_s{st}") for st in args.stages.split(",") if st]
            else:
                cands = split_configs(M, args.split_tma) if args.split and split_weight else configs(M, args.persistent)
            for cfg in cands:
                try:
                    y = gemm.linear(x, ws[0], config=cfg)
                    torch.cuda.synchronize()
                    if not torch.equal(bits(y), ref):
                        row["mismatch"].append(cfg["name"])
                        continue
                    row["configs"][cfg["name"]] = _graph_us([lambda w=w, c=cfg: gemm.linear(x, w, config=c) for w in ws])
                except Exception as e:
                    row["configs"][cfg["name"]] = f"{type(e).__name__}: {e}"[:160]
            timed = {k: v for k, v in row["configs"].items() if isinstance(v, float)}
            if timed:
                best = min(timed, key=timed.get)
                row["best"], row["best_us"] = best, timed[best]
            res["rows"].append(row)
            row["current_stages"] = cur["num_stages"]
            print(f"{model:<14}{layer:<8}M={M:<6} current {row['current'] + '_s' + str(cur['num_stages']):<34}{row['current_us']:8.1f}  "
                  f"best {row.get('best', '-'):<24}{row.get('best_us', float('nan')):8.1f}  cublas {row['cublas_us']:8.1f}"
                  f"  mismatches {len(row['mismatch'])}", flush=True)
        del ws
        torch.cuda.empty_cache()
    res["seconds"] = time.time() - t0
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "gemm_sweep.json"), "w") as f:
        json.dump(res, f, indent=1)
    # per-M tier: the single config with the best geomean ratio to cuBLAS over all shapes
    import math

    for M in Ms:
        rows = [r for r in res["rows"] if r["M"] == M]
        names = set.intersection(*[{k for k, v in r["configs"].items() if isinstance(v, float)} for r in rows]) if rows else set()
        score = {n: math.exp(sum(math.log(r["cublas_us"] / r["configs"][n]) for r in rows) / len(rows)) for n in names}
        cur = math.exp(sum(math.log(r["cublas_us"] / r["current_us"]) for r in rows) / len(rows)) if rows else float("nan")
        top = sorted(score, key=score.get, reverse=True)[:3]
        print(f"M={M}: current geomean vs cuBLAS {cur:.3f}; best single configs " + ", ".join(f"{n} {score[n]:.3f}" for n in top))
    print(f"mismatching configs: {sum(len(r['mismatch']) for r in res['rows'])}; {res['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
