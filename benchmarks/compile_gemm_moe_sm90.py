"""Compile the GEMM and MoE kernels for sm_90 on a CPU box (no GPU needed).

Every kernel x every configuration of the free-knob tables (gemm.all_configs, moe.all_configs) is
compiled with ``triton.compile(ASTSource(...), GPUTarget("cuda", 90, 32))`` with the
specializations a real launch gets (16-byte aligned pointers and strides), then assembled by the
ptxas shipped in the triton wheel. Reported per kernel: shared memory, registers, spills, and
whether the dot chain lowered to wgmma (sm_90 tensor cores) or mma.sync, and loads to TMA. Fails
(exit 1) on a compile error, on > 227 KiB of shared memory, or on register spills in a GEMM (except the
few measured ones named below).

Also reported: variants whose wgmma chain ptxas serializes (warning C7515: each wgmma waited for before the
next); with ``gemm.SPLIT_PARTIAL_FIXED_TRIPS`` on, a serialized split partial variant is a failure.

Usage: ``python benchmarks/compile_gemm_moe_sm90.py [--impl kernels/tik_v1] [--only linear_partial/bf16]``.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import subprocess
import sys
import tempfile
import types

SMEM_LIMIT = 227 * 1024
SMALL_SPILL_OK = 32  # bytes of spill tolerated in the two decode-sized partial variants (see below)


def load_impl_no_interp(path):
    os.environ.pop("TRITON_INTERPRET", None)
    pkg = "_tik_sm90_gemm_check"
    mod = types.ModuleType(pkg)
    mod.__path__ = [os.path.abspath(path)]
    mod.__package__ = pkg
    sys.modules[pkg] = mod
    return lambda name: importlib.import_module(f"{pkg}.{name}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--impl", default=os.path.join(os.path.dirname(__file__), "..", "kernels", "tik_v1"))
    ap.add_argument("--only", default="", help="comma list of label prefixes to compile (e.g. linear_partial/bf16)")
    ap.add_argument("--sweep-split", action="store_true",
                    help="compile the split-weight configurations of gpu.gemm_sweep --split (bf16, GEMM only)")
    args = ap.parse_args(argv)
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    mod = load_impl_no_interp(args.impl)
    gemm, moe, C = mod("gemm"), mod("moe"), mod("contract")
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    target = GPUTarget("cuda", 90, 32)
    failures = []
    serialized = []

    only = [p for p in args.only.split(",") if p]
    # the split partial kernel's chunk loop with a fixed trip count (free knob SPLIT_PARTIAL_FIXED_TRIPS; an
    # implementation without the knob compiles the runtime form): a serialized variant is then a failure
    fixed_trips = bool(getattr(gemm, "SPLIT_PARTIAL_FIXED_TRIPS", False))

    def compile_one(label, fn, sig, consts, aligned, opts, gemm_like=True):
        if only and not any(label.startswith(p) for p in only):
            return
        if "PDL" in fn.arg_names:  # what an sm_90 launch gets (kernels/tik_v1/_rowops.py, PDL)
            sig, consts, opts = {**sig, "PDL": "constexpr"}, {**consts, "PDL": True}, {**opts, "launch_pdl": True}
        try:
            src = ASTSource(fn=fn, signature=sig, constexprs=consts,
                            attrs={(i,): [["tt.divisibility", 16]] for i in aligned})
            c = triton.compile(src, target=target, options=opts)
        except Exception as e:  # noqa: BLE001
            failures.append(f"{label}: compile error {type(e).__name__}: {str(e)[:300]}")
            print(f"FAIL {label}: {type(e).__name__}: {str(e)[:300]}")
            return
        ptx = c.asm["ptx"]
        if consts.get("PDL") and "griddepcontrol.wait" not in ptx:
            failures.append(f"{label}: PDL launch without griddepcontrol.wait")
        with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
            f.write(ptx)
        r = subprocess.run([ptxas, "-arch=sm_90a", "-v", f.name, "-o", os.devnull], capture_output=True, text=True)
        os.unlink(f.name)
        regs = max((int(x) for x in re.findall(r"Used (\d+) registers", r.stderr)), default=-1)
        spill = max((int(x) for x in re.findall(r"(\d+) bytes spill stores", r.stderr)), default=0)
        smem = c.metadata.shared
        mma = "wgmma" if "wgmma.mma_async" in ptx else ("mma.sync" if "mma.sync" in ptx else "-")
        tma = "tma" if "cp.async.bulk.tensor" in ptx else ("cp.async" if "cp.async" in ptx else "ld")
        # a split weight's large-M tiles may spill a little (128x128 on one warpgroup holds two fp32
        # accumulators), and so may two decode-sized partial-kernel variants (<= SMALL_SPILL_OK bytes:
        # BLOCK_M 32 x BLOCK_N 128, and the unpipelined odd-K form of 16 x 64 with the fused reduce):
        # measured faster than the spill-free alternatives (H200 sweep), so reported, not failed
        small_ok = "linear_partial/" in label and spill <= SMALL_SPILL_OK
        ok = r.returncode == 0 and smem <= SMEM_LIMIT and not (gemm_like and spill and "/split" not in label
                                                                and not small_ok)
        # ptxas C7515: the wgmma of a chain issued one at a time, each waited for (e.g. a K loop whose trip
        # count ptxas cannot see as a fixed pipeline): reported per variant
        serial = "serial" if (mma == "wgmma" and "C7515" in r.stderr) else ""
        if serial:
            serialized.append(label)
            ok = ok and not (fixed_trips and label.startswith("linear_partial/"))
        print(f"{'ok  ' if ok else 'FAIL'} {label:<44} smem {smem:>6}  regs {regs:>3}  spill {spill:>4}  {mma:<8} {tma} {serial}")
        if not ok:
            failures.append(f"{label}: ptxas rc {r.returncode}, smem {smem}, spill {spill}{', serialized wgmma' if serial else ''}")

    bk = C.GEMM_BLOCK_K
    aligned_ptr = list(range(10))
    # split-K variants: (CHUNK_K, N_CHUNKS) = (0, 1) is the unsplit chain; (1984, 5) is Qwen3-4B's
    # down_proj (gemm.split_chunk(9728)): large configs keep a second accumulator ("fused"),
    # small ones write chunk partials (_linear_partial_kernel) reduced by _linear_reduce_kernel
    splits = ((0, 1), (gemm.split_chunk(9728), -(-9728 // gemm.split_chunk(9728))))
    cfgs = gemm.all_configs()
    if args.sweep_split:
        from benchmarks.gemm_sweep import split_configs

        cfgs = [dict(c, split_weight=True) for c in split_configs(64) + split_configs(1024)]
    for dt in ("bf16",) if args.sweep_split else ("bf16", "fp16"):
        for cfg in cfgs:
            bm, bn = cfg["BLOCK_M"], cfg["BLOCK_N"]
            opts = dict(num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], enable_fp_fusion=False)
            fused = cfg.get("split") == "fused"
            for chunk, n_chunks in splits if cfg.get("split_weight") else splits[:1]:
                tag = f"/split{n_chunks}" if n_chunks > 1 else ""
                for has_bias, even_k in ((False, True), (True, True), (True, False)):
                    sig = {"X": f"*{dt}", "W": f"*{dt}", "Bias": f"*{dt}", "Y": f"*{dt}", "M": "i32", "N": "i32",
                           "K": "i32", "stride_xm": "i32", "stride_wn": "i32", "stride_ym": "i32",
                           "HAS_BIAS": "constexpr", "EVEN_K": "constexpr", "BLOCK_M": "constexpr",
                           "BLOCK_N": "constexpr", "BLOCK_K": "constexpr", "GROUP": "constexpr",
                           "CHUNK_K": "constexpr", "N_CHUNKS": "constexpr", "SPLIT_FLAT": "constexpr"}
                    consts = dict(HAS_BIAS=has_bias, EVEN_K=even_k, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
                                  GROUP=cfg["GROUP_M"], CHUNK_K=chunk, N_CHUNKS=n_chunks,
                                  SPLIT_FLAT=bool(cfg.get("flat", gemm.SPLIT_FLAT)) and n_chunks > 1)
                    compile_one(f"linear_ptr/{dt}/{cfg['name']}{tag}/b{int(has_bias)}e{int(even_k)}",
                                gemm._linear_ptr_kernel, sig, consts, [i for i in aligned_ptr if i != 4], opts)
                if cfg["tma"]:  # the persistent TMA kernel (cfg["persistent"]) runs the flat split form only
                    persistent = bool(cfg.get("persistent"))
                    kern = gemm._linear_tma_persistent_kernel if persistent else gemm._linear_tma_kernel
                    for has_bias in (False, True):
                        def desc(shape):
                            return f"tensordesc<{dt}[{shape[0]}, {shape[1]}]>"

                        sig = {"x_desc": desc([bm, bk]), "w_desc": desc([bn, bk]), "y_desc": desc([bm, bn]),
                               "Bias": f"*{dt}", "M": "i32", "N": "i32", "K": "i32", "HAS_BIAS": "constexpr",
                               "BLOCK_M": "constexpr", "BLOCK_N": "constexpr", "BLOCK_K": "constexpr",
                               "GROUP": "constexpr", "CHUNK_K": "constexpr", "N_CHUNKS": "constexpr"}
                        consts = dict(HAS_BIAS=has_bias, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP=cfg["GROUP_M"],
                                      CHUNK_K=chunk, N_CHUNKS=n_chunks)
                        if persistent:
                            sig["NUM_PROGRAMS"], consts["NUM_PROGRAMS"] = "constexpr", 132
                        else:
                            sig["SPLIT_FLAT"] = "constexpr"
                            consts["SPLIT_FLAT"] = bool(cfg.get("flat", gemm.SPLIT_FLAT)) and n_chunks > 1
                        bn2 = int(cfg.get("BLOCK_N2", 0))
                        if bn2:  # a tile of BLOCK_N + BLOCK_N2 columns (gemm.WIDE_TILES): the second descriptor pair
                            sig.update(w2_desc=desc([bn2, bk]), y2_desc=desc([bm, bn2]), BLOCK_N2="constexpr")
                            consts.update(BLOCK_N2=bn2)
                        elif "BLOCK_N2" in kern.arg_names:   # a power-of-two tile: no second pair (a launch's defaults)
                            sig.update(w2_desc="constexpr", y2_desc="constexpr", BLOCK_N2="constexpr")
                            consts.update(w2_desc=None, y2_desc=None, BLOCK_N2=0)
                        compile_one(f"linear_tma{'_persistent' if persistent else ''}/{dt}/{cfg['name']}{tag}"
                                    f"/b{int(has_bias)}", kern, sig, consts, [3, 5, 6], opts)
            if not fused:
                chunk, n_chunks = splits[1]
                # the chunk loop's trip-count form (free knob SPLIT_PARTIAL_FIXED_TRIPS): fixed, with the zero-filled
                # tail of a short last chunk (Qwen3-4B down: 9728 = 4 x 1984 + 1792) or without (equal chunks,
                # "/even_chunks": K 4096 = 2 x 2048)
                for even_k, last, has_bias, mask_k in ((True, False, False, True), (False, False, False, True),
                                                       (True, True, False, True), (True, True, True, True),
                                                       (False, True, True, True), (True, True, False, False)):
                    if not fixed_trips and not mask_k:
                        continue
                    sig = {"X": f"*{dt}", "W": f"*{dt}", "P": "*fp32", "M": "i32", "N": "i32", "K": "i32",
                           "stride_xm": "i32", "stride_wn": "i32", "EVEN_K": "constexpr", "BLOCK_M": "constexpr",
                           "BLOCK_N": "constexpr", "BLOCK_K": "constexpr", "GROUP": "constexpr", "CHUNK_K": "constexpr",
                           "Bias": f"*{dt}", "Y": f"*{dt}", "stride_ym": "i32", "CNT": "*i32",
                           "HAS_BIAS": "constexpr", "N_CHUNKS": "constexpr", "LAST_REDUCES": "constexpr"}
                    consts = dict(EVEN_K=even_k, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP=cfg["GROUP_M"], CHUNK_K=chunk,
                                  HAS_BIAS=has_bias, N_CHUNKS=n_chunks, LAST_REDUCES=last)
                    if fixed_trips:
                        sig.update(FIXED_TRIPS="constexpr", MASK_K="constexpr")
                        consts.update(FIXED_TRIPS=True, MASK_K=mask_k)
                    compile_one(f"linear_partial/{dt}/{cfg['name']}/e{int(even_k)}{'/last' if last else ''}"
                                f"{'/bias' if has_bias else ''}{'' if mask_k else '/even_chunks'}",
                                gemm._linear_partial_kernel, sig, consts,
                                # K: a multiple of BLOCK_K (EVEN_K) is specialized as divisible by 16 at launch
                                [0, 1, 2, 4, 6, 7, 14, 15, 16, 17] + ([5] if even_k else []), opts)
        for has_bias in (False, True):
            sig = {"P": "*fp32", "Bias": f"*{dt}", "Y": f"*{dt}", "M": "i32", "N": "i32", "stride_ym": "i32",
                   "HAS_BIAS": "constexpr", "N_CHUNKS": "constexpr", "BLOCK": "constexpr"}
            compile_one(f"linear_reduce/{dt}/b{int(has_bias)}", gemm._linear_reduce_kernel, sig,
                        dict(HAS_BIAS=has_bias, N_CHUNKS=splits[1][1], BLOCK=gemm.REDUCE_BLOCK), [0, 1, 2, 5],
                        dict(num_warps=4, num_stages=1, enable_fp_fusion=False), False)

    if args.sweep_split:
        print(f"{len(failures)} failures")
        return 1 if failures else 0
    E, K_TOP = 128, 8
    e_pad = max(16, triton.next_power_of_2(E))
    for ldt in ("bf16", "fp32"):
        sig = {"Logits": f"*{ldt}", "W_out": "*fp32", "I_out": "*i32", "T": "i32", "stride_l": "i32",
               "E": "constexpr", "E_PAD": "constexpr", "TOP_K": "constexpr", "K_PAD": "constexpr",
               "NORM": "constexpr", "BLOCK_T": "constexpr"}
        compile_one(f"moe_route/{ldt}", moe._moe_route_kernel, sig,
                    dict(E=E, E_PAD=e_pad, TOP_K=K_TOP, K_PAD=8, NORM=True, BLOCK_T=C.MOE_ROUTE_BLOCK_T),
                    [0, 1, 2], dict(num_warps=C.MOE_ROUTE_WARPS, num_stages=1, enable_fp_fusion=False), False)
    sig = {"Ids": "*i32", "Counts": "*i32", "Rank": "*i32", "n": "i32", "E": "constexpr", "BLOCK": "constexpr"}
    compile_one("moe_count", moe._moe_count_kernel, sig, dict(E=E, BLOCK=moe.SORT_BLOCK), [0, 1, 2],
                dict(num_warps=4, num_stages=1), False)
    sb = max(16, min(moe.SORT_BLOCK, 8192 // e_pad))
    sig = {"Ids": "*i32", "Counts": "*i32", "Rank": "*i32", "Sorted": "*i32", "BlkExpert": "*i32",
           "BlkRow0": "*i32", "BlkRows": "*i32", "n": "i32", "n_blocks": "i32", "E": "constexpr",
           "E_PAD": "constexpr", "BLOCK_M": "constexpr", "BLOCK": "constexpr"}
    for cfg in moe.all_configs():
        compile_one(f"moe_scatter/{cfg['name']}", moe._moe_scatter_kernel, sig,
                    dict(E=E, E_PAD=e_pad, BLOCK_M=cfg["BLOCK_M"], BLOCK=sb), list(range(7)),
                    dict(num_warps=4, num_stages=1), False)
    for cfg in moe.all_configs():
        opts = dict(num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], enable_fp_fusion=False)
        sig = {"X": "*bf16", "Wgu": "*bf16", "Act": "*bf16", "Sorted": "*i32", "BlkExpert": "*i32",
               "BlkRow0": "*i32", "BlkRows": "*i32", "H": "i32", "I": "i32", "stride_xt": "i32",
               "stride_we": "i32", "stride_wn": "i32", "stride_act": "i32", "TOP_K": "constexpr",
               "EVEN_K": "constexpr", "BLOCK_M": "constexpr", "BLOCK_N": "constexpr", "BLOCK_K": "constexpr"}
        compile_one(f"moe_gate_up/{cfg['name']}", moe._moe_gate_up_kernel, sig,
                    dict(TOP_K=K_TOP, EVEN_K=True, BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N1"], BLOCK_K=bk),
                    list(range(13)), opts)
        sig = {"Act": "*bf16", "Wd": "*bf16", "Y": "*bf16", "Sorted": "*i32", "BlkExpert": "*i32",
               "BlkRow0": "*i32", "BlkRows": "*i32", "H": "i32", "I": "i32", "stride_act": "i32",
               "stride_we": "i32", "stride_wn": "i32", "stride_y": "i32", "EVEN_K": "constexpr",
               "BLOCK_M": "constexpr", "BLOCK_N": "constexpr", "BLOCK_K": "constexpr"}
        compile_one(f"moe_down/{cfg['name']}", moe._moe_down_kernel, sig,
                    dict(EVEN_K=True, BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N2"], BLOCK_K=bk),
                    list(range(13)), opts)
    sig = {"Y": "*bf16", "Wt": "*fp32", "Out": "*bf16", "H": "i32", "stride_y": "i32", "stride_o": "i32",
           "TOP_K": "constexpr", "BLOCK_H": "constexpr"}
    compile_one("moe_combine", moe._moe_combine_kernel, sig, dict(TOP_K=K_TOP, BLOCK_H=moe.COMBINE_BLOCK_H),
                list(range(6)), dict(num_warps=4, num_stages=1, enable_fp_fusion=False), False)

    print(f"\n{len(serialized)} variant(s) with serialized wgmma (ptxas C7515)")
    print(f"{len(failures)} failure(s)")
    for f in failures:
        print("  ", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
