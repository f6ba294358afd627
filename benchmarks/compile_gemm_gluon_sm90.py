"""Compile an implementation's Gluon GEMM (``gemm_gluon.py``) for sm_90 on a CPU box (no GPU).

Every work-item form gemm_gluon.plan can choose (BLOCK_N 256 on one-chunk weights only; split items on
weights of several chunks; 128-row tiles on two consumer warpgroups and 64-row ones on one, the latter also
with x in SMALL_M_BOX-row boxes where the implementation has them), bf16 with and without a bias, plus fp16: registers, spill bytes and shared
memory from the triton wheel's ptxas, the wgmma instruction shapes, TMA loads, setmaxnreg, whether ptxas
serialized the wgmma (C7514 / C7515) and whether any fp32 fma appears (FP contraction must stay off).
Fails (exit 1) on a compile error, a spill, more than 227 KiB of shared memory, loads or MMAs that are not
TMA + wgmma, a serialized wgmma, an fp32 fma, or setmaxnreg asking for more than the SM's registers.
Gluon kernels cannot run under TRITON_INTERPRET; this script must run without it.

Usage: ``python benchmarks/compile_gemm_gluon_sm90.py [--impl kernels/tik_v7] [--json OUT.json] [--quick]``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from benchmarks.compile_attention_sm90 import ptxas_v  # noqa: E402
from benchmarks.compile_gluon_sm90 import _load  # noqa: E402

SMEM_LIMIT = 227 * 1024


def variants(g, quick: bool = False) -> list[dict]:
    """(BLOCK_N, split, chunks, halves, bias, dtype) that plan() can choose; --quick: one per (BLOCK_N, split,
    halves)."""
    out = []
    for halves in (2, 1):
        for bn in g.BLOCK_NS:
            for split in (0, 1):
                for chunks in (1, 6):
                    if (split and chunks == 1) or (bn == 256 and chunks > 1) or (quick and not split and chunks > 1):
                        continue
                    for bias in ((False,) if quick else (False, True)):
                        out.append({"BLOCK_N": bn, "split": split, "chunks": chunks, "halves": halves, "bias": bias,
                                    "dtype": "bf16"})
    if not quick:
        out.append({"BLOCK_N": 128, "split": 1, "chunks": 2, "halves": 2, "bias": True, "dtype": "fp16"})
    if "stream" in g.KNOBS:  # the stream form (tiles cut into K-step pieces, a handoff state between programs)
        out += [{"BLOCK_N": bn, "split": 0, "chunks": chunks, "halves": halves, "bias": False, "dtype": "bf16",
                 "stream": 1} for halves in (2, 1) for bn in g.BLOCK_NS for chunks in (1, 6)
                if not (bn == 256 and chunks > 1) and not (quick and chunks > 1 and bn != 128)]
    # below M 64 an implementation may read x in smaller boxes on its one 64-row tile (gemm_gluon.SMALL_M_BOX)
    box = getattr(g, "SMALL_M_BOX", 0)
    if box:
        out += [dict(v, xbox=box) for v in out if v["halves"] == 1 and not v.get("stream")]
    return out


def compile_variant(g, v: dict) -> dict:
    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    from triton.runtime.jit import mangle_type

    dtype = torch.bfloat16 if v["dtype"] == "bf16" else torch.float16
    gdt = gl.bfloat16 if dtype == torch.bfloat16 else gl.float16
    bn, bk = v["BLOCK_N"], 64

    def desc(rows):
        return mangle_type(TensorDescriptor(torch.zeros(rows, bk, dtype=dtype), [rows, bk], [bk, 1], [rows, bk],
                                              gl.NVMMASharedLayout.get_default_for([rows, bk], gdt)))

    ptr = "*bf16" if dtype == torch.bfloat16 else "*fp16"
    work = v["split"] or v.get("stream")
    sig = {"x_desc": desc(v.get("xbox", g.HALF_M)), "w_desc": desc(bn), "Y": ptr, "P": "*fp32" if work else ptr, "Bias": ptr,
           "CNT": "*i32" if work else ptr, "M": "i32", "N": "i32", "K": "i32", "stride_ym": "i32", "n_m": "i32",
           "n_n": "i32", "n_items": "i32"}
    stages = g.STAGES[bn, v["halves"]]
    cx = {"CHUNK_K": 2048, "N_CHUNKS": v["chunks"], "GROUP": g.GROUP_M, "SPLIT": bool(v["split"]), "HAS_BIAS": v["bias"],
          "STAGES": stages, "BN": bn, "BK": bk, "HALVES": v["halves"]}
    if "stream" in g.KNOBS:   # the stream form's kernel: the stream tiles' count, the STREAM switch
        sig["n_sk"] = "i32"
        cx["STREAM"] = bool(v.get("stream"))
    sig.update({k: "constexpr" for k in cx})
    c = triton.compile(GluonASTSource(g._linear_gluon_ws, sig, constexprs=cx), target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": 4, "enable_fp_fusion": False})
    ptx = c.asm["ptx"]
    r = ptxas_v(ptx)
    if r["rc"]:
        raise RuntimeError(f"ptxas failed: {r['stderr'][-600:]}")
    return dict(v, stages=stages, regs=r["regs"], spill_bytes=r["spill_bytes"], smem=int(c.metadata.shared),
                setmaxnreg_inc=sorted({int(x) for x in re.findall(r"setmaxnreg\.inc\.sync\.aligned\.u32\s+(\d+)", ptx)}),
                worker_regs=[int(getattr(x, "value", x)) for x in (g.REGS_CONSUMER, g.REGS_PRODUCER)],
                wgmma=sorted(set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+)", ptx))),
                tma="cp.async.bulk.tensor" in ptx, tma_copies=len(re.findall(r"cp\.async\.bulk\.tensor\.", ptx)), serialized_wgmma=bool(re.search(r"C751[45]", r["stderr"])),
                fma_f32=len(re.findall(r"\bfma\.rn\.f32", ptx)),
                named_barriers=sorted(set(re.findall(r"bar\.sync\s+(\d+),\s*128;", ptx))))


def failures(r: dict) -> list[str]:
    out = []
    if r["spill_bytes"]:
        out.append(f"spills {r['spill_bytes']} B")
    if r["smem"] > SMEM_LIMIT:
        out.append(f"shared memory {r['smem']} B > {SMEM_LIMIT}")
    if not r["tma"] or r["wgmma"] != [f"m64n{r['BLOCK_N']}k16"]:
        out.append(f"not TMA + wgmma m64n{r['BLOCK_N']}k16 (wgmma {r['wgmma']}, tma {r['tma']})")
    if r["serialized_wgmma"]:
        out.append("ptxas serialized the wgmma")
    if r["fma_f32"]:
        out.append(f"{r['fma_f32']} fp32 fma (FP contraction must be off)")
    regs = max(r["setmaxnreg_inc"], default=0) + (sum(r["worker_regs"]) if r["halves"] == 2 else r["worker_regs"][1])
    if 128 * regs > 65536:
        out.append("setmaxnreg asks more than 64K registers per SM")
    if (r["split"] or r.get("stream")) and len(r["named_barriers"]) < r["halves"]:
        out.append(f"the consumers' ticket barriers are not one named barrier each ({r['named_barriers']})")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python benchmarks/compile_gemm_gluon_sm90.py")
    ap.add_argument("--impl", default="kernels/tik_v7")
    ap.add_argument("--json", default=None)
    ap.add_argument("--quick", action="store_true", help="one variant per (BLOCK_N, split, halves), no bias, bf16")
    args = ap.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        ap.error("TRITON_INTERPRET is set: Gluon kernels only compile for the GPU; unset it")
    g = _load(args.impl, "gemm_gluon", "compile_gemm_gluon_sm90")
    res, bad = [], 0
    for v in variants(g, args.quick):
        r = compile_variant(g, v)
        f = failures(r)
        bad += bool(f)
        res.append(r)
        print(f"{'FAIL' if f else 'ok  '} m{64 * r['halves']:<3} n{r['BLOCK_N']:<3} {'split' if r['split'] else ('stream' if r.get('stream') else 'fused')} chunks {r['chunks']} "
              + (f"xbox {r['xbox']} " if "xbox" in r else "") +
              f"bias {r['bias']!s:5} {r['dtype']} s{r['stages']} regs {r['regs']} spill {r['spill_bytes']} "
              f"smem {r['smem']} setmaxnreg {r['setmaxnreg_inc']} wgmma {','.join(r['wgmma'])}"
              + (f"  ({'; '.join(f)})" if f else ""), flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"impl": args.impl, "variants": res}, fh, indent=1)
            fh.write("\n")
    print(f"{bad} failure(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
