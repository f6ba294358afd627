"""Knob sweep for attention on the GPU: coupled (tile, split) x free (block_m, warps, stages, scratch).

``python -m benchmarks.attention_sweep --out DIR`` writes ``attention_sweep.json`` and prints
the best configurations. Bits are checked for every config against the config with the same coupled
constants (free knobs must not change bits); timings use areal_tik_plugin.bench.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

import torch

from areal_tik_plugin import bench
from areal_tik_plugin.contract.attention import _cu, _pool_from_seqs, _rand
from areal_tik_plugin.contract.suite import bits
from areal_tik_plugin.runtime.loader import get_implementation

PREFILL_FREE = [(64, 4, 2, False), (64, 8, 2, False), (64, 8, 3, False), (128, 8, 2, False),
                (128, 8, 2, True), (64, 4, 3, True), (64, 8, 2, True), (128, 4, 2, True)]
DECODE_FREE = [(4, 2), (4, 4), (8, 2), (8, 3)]
TILES = (64, 128)
PREFILL_SPLITS = (512, 2048)
DECODE_SPLITS = (256, 512, 1024)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--tiles", default=",".join(map(str, TILES)))
    ap.add_argument("--prefill-splits", default=",".join(map(str, PREFILL_SPLITS)))
    ap.add_argument("--decode-splits", default=",".join(map(str, DECODE_SPLITS)))
    ap.add_argument("--no-decode", action="store_true")
    args = ap.parse_args(argv)
    tiles = [int(x) for x in args.tiles.split(",")]
    psplits = [int(x) for x in args.prefill_splits.split(",")]
    dsplits = [] if args.no_decode else [int(x) for x in args.decode_splits.split(",")]
    att = get_implementation().module("attention")
    torch.manual_seed(0)
    random.seed(0)
    Hq, Hkv, D = 32, 8, 128
    sc = D ** -0.5
    res = {"prefill": [], "decode": [], "overhead": {}}
    t0 = time.time()
    # ---------------- prefill
    cells = [(1, 8192), (4, 4096), (1, 1024)]
    data = {}
    for B, L in cells:
        q, k, v = _rand(B * L, Hq, D), _rand(B * L, Hkv, D), _rand(B * L, Hkv, D)
        data[(B, L)] = (q, k, v, _cu([L] * B))
    for tile in tiles:
        for split in psplits:
            ref_bits = {}
            for bm, w, st, scr in PREFILL_FREE:
                row = {"tile": tile, "split": split, "block_m": bm, "warps": w, "stages": st, "scratch": scr}
                try:
                    for (B, L), (q, k, v, cu) in data.items():
                        fn = lambda: att.prefill(q, k, v, cu, L, sc, block_m=bm, tile=tile, split=split,  # noqa
                                                 warps=w, stages=st, scratch=scr)
                        o = fn()
                        torch.cuda.synchronize()
                        key = (B, L)
                        if key not in ref_bits:
                            ref_bits[key] = bits(o).clone()
                        row[f"same_bits_b{B}_L{L}"] = bool(torch.equal(bits(o), ref_bits[key]))
                        row[f"us_b{B}_L{L}"] = bench.time_cold_us(fn, warmup_ms=10, rep_ms=60)
                except Exception as e:
                    row["error"] = f"{type(e).__name__}: {e}"[:300]
                res["prefill"].append(row)
                print("prefill", json.dumps(row), flush=True)
    # cuDNN reference for the same cells
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F

    for B, L in cells:
        qs, ks, vs = _rand(B, Hq, L, D), _rand(B, Hkv, L, D), _rand(B, Hkv, L, D)

        def cud():
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                return F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, enable_gqa=True)

        res[f"cudnn_prefill_b{B}_L{L}_us"] = bench.time_cold_us(cud, warmup_ms=10, rep_ms=60)
    del data
    # ---------------- decode
    dcells = [(1, [8192]), (16, [8192] * 16), (4, [1024] * 4), (64, [random.randint(128, 4096) for _ in range(64)])]
    ddata = {}
    for B, lens in dcells:
        ks_ = [_rand(n, Hkv, D) for n in lens]
        vs_ = [_rand(n, Hkv, D) for n in lens]
        kp, vp, table, rows = _pool_from_seqs(ks_, vs_, n_spare=8)
        ddata[B] = (_rand(B, Hq, D), kp, vp, table, rows, torch.tensor(lens, dtype=torch.int32, device="cuda"),
                    torch.empty(B, Hq, D, device="cuda", dtype=torch.bfloat16), max(lens))
    for tile in tiles:
        for split in dsplits:
            ref_bits = {}
            for w, st in DECODE_FREE:
                row = {"tile": tile, "split": split, "warps": w, "stages": st}
                try:
                    for B, (q, kp, vp, table, rows, sl, out, cap) in ddata.items():
                        fn = lambda: att.decode(q, kp, vp, sl, table, rows, sc, 1, cap, out=out, tile=tile,  # noqa
                                                split=split, dec_warps=w, dec_stages=st)
                        fn()
                        torch.cuda.synchronize()
                        if B not in ref_bits:
                            ref_bits[B] = bits(out).clone()
                        row[f"same_bits_b{B}"] = bool(torch.equal(bits(out), ref_bits[B]))
                        row[f"graph_us_b{B}"] = bench.time_graph_us(fn)
                except Exception as e:
                    row["error"] = f"{type(e).__name__}: {e}"[:300]
                res["decode"].append(row)
                print("decode", json.dumps(row), flush=True)
    # ---------------- host overhead of one small decode call (cold = includes Python + launch)
    from areal_tik_plugin.ops import attention_decode

    q, kp, vp, table, rows, sl, out, cap = ddata[1]
    res["overhead"]["impl_decode_cold_us"] = bench.time_cold_us(
        lambda: att.decode(q, kp, vp, sl, table, rows, sc, 1, cap, out=out))
    res["overhead"]["op_decode_cold_us"] = bench.time_cold_us(
        lambda: attention_decode(q, kp, vp, seq_lens=sl, kv_indices=table, table_rows=rows, max_context_len=cap, out=out))
    res["overhead"]["impl_decode_graph_us"] = bench.time_graph_us(
        lambda: att.decode(q, kp, vp, sl, table, rows, sc, 1, cap, out=out))
    res["seconds"] = time.time() - t0
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "attention_sweep.json"), "w") as f:
        json.dump(res, f, indent=1)
    # ---------------- table
    print("\nprefill (us; cudnn:", {k: round(v, 1) for k, v in res.items() if k.startswith("cudnn")}, ")")
    ok = [r for r in res["prefill"] if "error" not in r]
    for r in sorted([r for r in ok if "us_b1_L1024" in r], key=lambda r: r.get("us_b1_L8192", 1e9))[:12]:
        print(r["tile"], r["split"], r["block_m"], r["warps"], r["stages"], int(r["scratch"]),
              round(r["us_b1_L8192"], 1), round(r["us_b4_L4096"], 1), round(r["us_b1_L1024"], 1),
              all(v for k, v in r.items() if k.startswith("same")))
    print("decode graph us (b1/8K, b16/8K, b4/1K, b64 mixed)")
    ok = [r for r in res["decode"] if "error" not in r and "graph_us_b1" in r]
    for r in sorted(ok, key=lambda r: r["graph_us_b1"] + r["graph_us_b16"] / 4)[:12]:
        print(r["tile"], r["split"], r["warps"], r["stages"], round(r["graph_us_b1"], 1), round(r["graph_us_b16"], 1),
              round(r["graph_us_b4"], 1), round(r["graph_us_b64"], 1), all(v for k, v in r.items() if k.startswith("same")))
    print("overhead", res["overhead"], "errors", sum("error" in r for r in res["prefill"] + res["decode"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
