"""Compile an implementation's Gluon attention backward (``attention_bwd_gluon.py``) for sm_90 on a CPU box.

For D 128, bf16 and fp16, GQA groups 1 and 4: registers, spill bytes and shared memory from the triton
wheel's ptxas, whether Q / dO / K / V come through TMA, the MMAs are wgmma, the dQ integers leave as TMA bulk
reduce-adds (``cp.reduce.async.bulk.tensor``) and ptxas left the wgmma unserialized (no C7514 / C7515). Fails
(exit 1) on a compile error, a spill, more than the SM's 227 KiB of shared memory, or a missing instruction
form. ``--max-spill`` admits a spill up to that many bytes (tik_v18 spills 212-216 B: in its SASS a dozen
64-bit values computed before the loop are reloaded once per tile pair and a few are stored and reloaded around
the dQ MMA; no MMA accumulator is spilled: dK, dV, S / dQ and dP hold R24-R215).
``--quick``: bf16, group 4 only. Gluon kernels cannot run under TRITON_INTERPRET; this script must run without it.

Usage: ``python benchmarks/compile_attention_bwd_gluon_sm90.py [--impl kernels/tik_v18] [--json OUT.json]
[--max-spill N] [--quick]``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from benchmarks.compile_attention_sm90 import ptxas_v  # noqa: E402
from benchmarks.compile_gluon_sm90 import SMEM_LIMIT, _load  # noqa: E402


def compile_variant(g, d: int, dtype, group: int) -> dict:
    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import mangle_type

    def desc(rows, dt):
        t = torch.zeros(rows, d, dtype=dt)
        return mangle_type(g.TensorDescriptor(t, [rows, d], [d, 1], [rows, d], g._smem_layout((rows, d), dt)))

    ptr = "*bf16" if dtype == torch.bfloat16 else "*fp16"
    sig = {"q_desc": desc(g.BLOCK_M, dtype), "do_desc": desc(g.BLOCK_M, dtype), "k_desc": desc(g.BLOCK_N, dtype),
           "v_desc": desc(g.BLOCK_N, dtype), "dq_desc": desc(g.BLOCK_M, torch.int32), "LSE": "*fp32",
           "DELTA": "*fp32", "SCALE": "*fp32", "DK": ptr, "DV": ptr, "cu": "*i32", "stride_dt": "i32",
           "stride_dh": "i32", "total": "i32", "qk_scale": "fp32", "sm_scale": "fp32"}
    cx = {"GROUP": group, "D": d, "BN": g.BLOCK_N, "BM": g.BLOCK_M}
    sig.update({k: "constexpr" for k in cx})
    c = triton.compile(GluonASTSource(g._attn_bwd_gluon, sig, constexprs=cx), target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": g.WARPS})
    ptx = c.asm["ptx"]
    r = ptxas_v(ptx)
    if r["rc"]:
        raise RuntimeError(f"ptxas failed: {r['stderr'][-600:]}")
    return {"d": d, "dtype": str(dtype).split(".")[-1], "group": group, "warps": int(c.metadata.num_warps),
            "regs": r["regs"], "spill_bytes": r["spill_bytes"], "smem": int(c.metadata.shared),
            "serialized_wgmma": ("C7514" in r["stderr"]) or ("C7515" in r["stderr"]),
            "tma_load": "cp.async.bulk.tensor.2d.shared" in ptx, "tma_reduce": "cp.reduce.async.bulk.tensor" in ptx,
            "wgmma": len(re.findall(r"wgmma\.mma_async", ptx)), "ptxas_stderr": r["stderr"][-400:]}


def failures(r: dict, max_spill: int = 0) -> list[str]:
    out = []
    if r["serialized_wgmma"]:
        out.append("ptxas serialized the wgmma")
    if r["spill_bytes"] > max_spill:
        out.append(f"spills {r['spill_bytes']} B")
    if r["smem"] > SMEM_LIMIT:
        out.append(f"shared memory {r['smem']} B > {SMEM_LIMIT}")
    if not (r["tma_load"] and r["tma_reduce"] and r["wgmma"]):
        out.append("not TMA loads + wgmma + TMA reduce-add")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python benchmarks/compile_attention_bwd_gluon_sm90.py")
    ap.add_argument("--impl", default="kernels/tik_v18")
    ap.add_argument("--json", default=None)
    ap.add_argument("--max-spill", type=int, default=0, help="spill bytes admitted (default 0)")
    ap.add_argument("--quick", action="store_true", help="bf16, GQA group 4 only")
    args = ap.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        ap.error("TRITON_INTERPRET is set: Gluon kernels only compile for the GPU; unset it")
    import torch

    g = _load(args.impl, "attention_bwd_gluon", "compile_attention_bwd_gluon_sm90")
    res, bad = [], 0
    for d in g.HEAD_DIMS:
        for dt in (g.DTYPES[:1] if args.quick else g.DTYPES):
            for group in ((4,) if args.quick else (1, 4)):
                r = compile_variant(g, d, dt, group)
                f = failures(r, args.max_spill)
                bad += bool(f)
                res.append(r)
                print(f"{'FAIL' if f else 'ok  '} D {d} {r['dtype']:8s} group {group} warps {r['warps']} regs {r['regs']} "
                      f"spill {r['spill_bytes']} smem {r['smem']} wgmma {r['wgmma']} tma_reduce {r['tma_reduce']}"
                      + (f"  ({'; '.join(f)})" if f else ""))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"impl": args.impl, "torch": torch.__version__, "variants": res}, fh, indent=1)
            fh.write("\n")
    print(f"{bad} failure(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
