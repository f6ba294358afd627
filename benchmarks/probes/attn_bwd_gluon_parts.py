"""Where tik_v18's Gluon attention backward kernel spends its time: the kernel alone (not the preprocess, the
accumulator's zero fill or the finalize) timed with work left out: 3 all, 2 without the dQ reduce-add, 1 without
the dQ MMA either, 0 without the dV / dK MMAs either (S, dP, the softmax and the shared-memory stores of P / dS
remain). The differences are what each part adds on the critical path. The cut kernels give wrong results, so they
are built here, in a temporary copy of the folder with a constexpr PARTS edited in (``PARTS_EDITS``), and the
folder itself keeps its hash and evidence. Also the whole ``prefill_backward`` of tik_v18 and tik_v13's split
backward, same inputs (32 / 8 heads, D 128, bf16; cold L2, ``do_bench`` medians).

Usage (GPU): ``python -m benchmarks.probes.attn_bwd_gluon_parts --out $OUT [--cells 4x4224,1x16512]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time

# (anchor, replacement) in attention_bwd_gluon.py: PARTS gates the reduce-add (3), the dQ MMA and its store (2), the
# dV / dK MMAs (1)
PARTS_EDITS = [
    ("GROUP: gl.constexpr, D: gl.constexpr, BN: gl.constexpr, BM: gl.constexpr):",
     "GROUP: gl.constexpr, D: gl.constexpr, BN: gl.constexpr, BM: gl.constexpr, PARTS: gl.constexpr = 3):"),
    ("""            dv = warpgroup_mma(p_s.permute((1, 0)), do_s.index(sl), dv, is_async=True)
            dk = warpgroup_mma(ds_s.permute((1, 0)), q_s.index(sl), dk, is_async=True)
            dq = warpgroup_mma(ds_s, k_s, zq, use_acc=False, is_async=True)
            dv, dk, dq = warpgroup_mma_wait(0, deps=[dv, dk, dq])
""", """            if PARTS >= 1:
                dv = warpgroup_mma(p_s.permute((1, 0)), do_s.index(sl), dv, is_async=True)
                dk = warpgroup_mma(ds_s.permute((1, 0)), q_s.index(sl), dk, is_async=True)
            if PARTS >= 2:
                dq = warpgroup_mma(ds_s, k_s, zq, use_acc=False, is_async=True)
                dv, dk, dq = warpgroup_mma_wait(0, deps=[dv, dk, dq])
            elif PARTS >= 1:
                dv, dk = warpgroup_mma_wait(0, deps=[dv, dk])
"""),
    ("""            dq_s.store((dq * gl.expand_dims(sc, 1)).to(gl.int32))
            fence_async_shared()
            gl.thread_barrier()
            _tma_add(dq_desc, [row, col], dq_s)
""", """            if PARTS >= 2:
                dq_s.store((dq * gl.expand_dims(sc, 1)).to(gl.int32))
                fence_async_shared()
                gl.thread_barrier()
                if PARTS >= 3:
                    _tma_add(dq_desc, [row, col], dq_s)
"""),
    ("def backward(q, k, v, do, lse, delta, scale, acc, dk, dv, cu_seqlens, max_seqlen, softmax_scale, qk_scale):",
     "def backward(q, k, v, do, lse, delta, scale, acc, dk, dv, cu_seqlens, max_seqlen, softmax_scale, qk_scale, parts=3):"),
    ("BN=BLOCK_N, BM=BLOCK_M,", "BN=BLOCK_N, BM=BLOCK_M, PARTS=parts,"),
]


def parts_copy(folder: str, dest: str) -> str:
    """A copy of the implementation ``folder`` under ``dest`` with PARTS_EDITS applied (each anchor found once)."""
    out = os.path.join(dest, os.path.basename(folder.rstrip("/")) + "_parts")
    shutil.copytree(folder, out, ignore=shutil.ignore_patterns("__pycache__"))
    path = os.path.join(out, "attention_bwd_gluon.py")
    with open(path) as f:
        text = f.read()
    for old, new in PARTS_EDITS:
        if text.count(old) != 1:
            raise RuntimeError(f"attn_bwd_gluon_parts: anchor not found once in {path}: {old[:80]!r}")
        text = text.replace(old, new)
    with open(path, "w") as f:
        f.write(text)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.probes.attn_bwd_gluon_parts")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--cells", default="4x4224,1x16512")
    args = ap.parse_args(argv)
    import torch
    import triton

    from areal_tik_plugin.runtime import loader

    root = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "kernels")
    v18 = loader.load_implementation(os.path.join(root, "tik_v18"))
    v13 = loader.load_implementation(os.path.join(root, "tik_v13"))
    cut = loader.load_implementation(parts_copy(os.path.join(root, "tik_v18"), tempfile.mkdtemp()), verify_hash=False)
    A18, G, A13 = v18.module("attention"), cut.module("attention_bwd_gluon"), v13.module("attention")
    Hq, Hkv, D = 32, 8, 128
    scale = D ** -0.5
    rows = []

    def bench(fn):
        return float(triton.testing.do_bench(fn, warmup=10, rep=60, return_mode="median")) * 1e3

    for cell in args.cells.split(","):
        Bn, L = (int(x) for x in cell.split("x"))
        T = Bn * L
        g = torch.Generator(device="cuda").manual_seed(Bn * 7 + L)
        q, k, v, do = (torch.randn(T, h, D, device="cuda", generator=g).to(torch.bfloat16) for h in (Hq, Hkv, Hkv, Hq))
        cu = torch.arange(0, T + 1, L, device="cuda", dtype=torch.int32)
        o, lse = A18.prefill(q, k, v, cu, L, scale, return_lse=True)
        kvb = torch.zeros((Hkv, 2), device="cuda", dtype=torch.float32)
        A18.launch(A18._bwd_kv_bound_kernel, (A18._cdiv(T, 64), Hkv), k, v, kvb, k.stride(0), k.stride(1), T, D=D,
                   BLOCK=64)
        delta = torch.empty((Hq, T), device="cuda", dtype=torch.float32)
        sc = torch.empty((Hq, T), device="cuda", dtype=torch.float32)
        A18.launch(A18._bwd_fx_preprocess, (A18._cdiv(T, 64), Hq), o, do, kvb, delta, sc, o.stride(0), o.stride(1), T,
                   Hq, GROUP=Hq // Hkv, D=D, BLOCK=64, SHIFT=31)
        acc = torch.zeros((T, Hq, D), device="cuda", dtype=torch.int32)
        dk, dv = torch.empty_like(k), torch.empty_like(v)
        row = {"cell": cell, "B": Bn, "L": L, "kernel_us": {}}
        for parts in (3, 2, 1, 0):
            row["kernel_us"][parts] = bench(lambda: G.backward(q, k, v, do, lse, delta, sc, acc, dk, dv, cu, L, scale,
                                                               scale * A18.LOG2E, parts=parts))
        row["tik_v18_backward_us"] = bench(lambda: A18.prefill_backward(do, q, k, v, o, lse, cu, L, scale))
        row["tik_v13_backward_us"] = bench(lambda: A13.prefill_backward(do, q, k, v, o, lse, cu, L, scale))
        row["pairs"] = Bn * Hkv * sum((Hq // Hkv) * -(-(L - n) // 64) for n in range(0, L, 128))
        row["sms"] = torch.cuda.get_device_properties(0).multi_processor_count
        rows.append(row)
        del q, k, v, do, o, lse, acc, dk, dv, delta, sc
        torch.cuda.empty_cache()
    rec = {"schema": "areal-tik-attn-bwd-gluon-parts/1", "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "source_hash": v18.source_hash[:12], "rows": rows}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "attn_bwd_gluon_parts.json"), "w") as f:
        json.dump(rec, f, indent=1)
    for r in rows:
        us = r["kernel_us"]
        per = {p: us[p] / (r["pairs"] / r["sms"]) for p in us}
        print(f"{r['cell']:>8} kernel us: all {us[3]:.0f}, no reduce {us[2]:.0f}, no dQ {us[1]:.0f}, no dV/dK {us[0]:.0f} | "
              f"per pair per SM us: {per[3]:.2f} {per[2]:.2f} {per[1]:.2f} {per[0]:.2f} | backward tik_v18 "
              f"{r['tik_v18_backward_us']:.0f} tik_v13 {r['tik_v13_backward_us']:.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
