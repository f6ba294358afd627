"""Compile, for sm_90 on a CPU box, the GEMM kernel variant every workload of a spec launches, for the root and
for each candidate tree of this plan (no GPU needed).

For each tree and each workload (M, N, K) of the spec, ``gemm.config_for(M, N, K, 132)`` picks the configuration
and the branch logic of ``gemm.linear`` picks the kernel and its constexprs (16-byte aligned x / W / y, as the
runner's tensors are); that variant is compiled with ``triton.compile(ASTSource, GPUTarget("cuda", 90, 32))``
and assembled by the triton wheel's ptxas (``-arch=sm_90a -v``). Reported per variant: shared memory, registers,
spill bytes, wgmma or mma.sync, TMA or cp.async loads, and ptxas C7515 (serialized wgmma).

Usage: python compile_plan_sm90.py --spec search/specs/h200_gemm.yaml --out compile_sm90.json \
           root=kernels/tik_v1 s1=/tmp/sg/s1 ...   [--only-m 256,1024] [--quick]
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import subprocess
import sys
import tempfile
import types

SMEM_LIMIT = 227 * 1024


def load_tree(tag: str, path: str):
    os.environ.pop("TRITON_INTERPRET", None)
    pkg = f"_plan_sm90_{tag}"
    mod = types.ModuleType(pkg)
    mod.__path__ = [os.path.abspath(path)]
    mod.__package__ = pkg
    sys.modules[pkg] = mod
    return importlib.import_module(f"{pkg}.gemm"), importlib.import_module(f"{pkg}.contract")


def variant(gemm, C, M, N, K, dt="bf16"):
    """(kernel, signature, constexprs, aligned arg indices, options, label) that gemm.linear launches."""
    cfg = gemm.config_for(M, N, K, 132)
    bm, bn, bk = cfg["BLOCK_M"], cfg["BLOCK_N"], C.GEMM_BLOCK_K
    chunk = gemm.split_chunk(K)
    n_chunks = -(-K // chunk)
    opts = dict(num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], enable_fp_fusion=False)
    split = n_chunks > 1

    def desc(shape):
        return f"tensordesc<{dt}[{shape[0]}, {shape[1]}]>"

    if split and cfg.get("split", "partial" if bm <= gemm.SMALL_M_TIERS[-1][1] else "fused") == "partial":
        common = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP=cfg["GROUP_M"], CHUNK_K=chunk, HAS_BIAS=False,
                      N_CHUNKS=n_chunks, LAST_REDUCES=bool(cfg.get("reduce_in_last", gemm.SPLIT_REDUCE_IN_LAST)))
        if cfg.get("tma") and hasattr(gemm, "_linear_partial_tma_kernel"):
            sig = {"x_desc": desc([bm, bk]), "w_desc": desc([bn, bk]), "P": "*fp32", "M": "i32", "N": "i32",
                   "K": "i32", "BLOCK_M": "constexpr", "BLOCK_N": "constexpr", "BLOCK_K": "constexpr",
                   "GROUP": "constexpr", "CHUNK_K": "constexpr", "Bias": f"*{dt}", "Y": f"*{dt}", "stride_ym": "i32",
                   "CNT": "*i32", "HAS_BIAS": "constexpr", "N_CHUNKS": "constexpr", "LAST_REDUCES": "constexpr"}
            return (gemm._linear_partial_tma_kernel, sig, common, [2, 4, 11, 12, 13, 14] + ([5] if K % 16 == 0 else []),
                    opts, f"partial_tma/{cfg['name']}")
        sig = {"X": f"*{dt}", "W": f"*{dt}", "P": "*fp32", "M": "i32", "N": "i32", "K": "i32", "stride_xm": "i32",
               "stride_wn": "i32", "EVEN_K": "constexpr", "BLOCK_M": "constexpr", "BLOCK_N": "constexpr",
               "BLOCK_K": "constexpr", "GROUP": "constexpr", "CHUNK_K": "constexpr", "Bias": f"*{dt}", "Y": f"*{dt}",
               "stride_ym": "i32", "CNT": "*i32", "HAS_BIAS": "constexpr", "N_CHUNKS": "constexpr",
               "LAST_REDUCES": "constexpr", "FIXED_TRIPS": "constexpr", "MASK_K": "constexpr"}
        consts = dict(common, EVEN_K=(K % bk == 0), FIXED_TRIPS=bool(cfg.get("fixed_trips", gemm.SPLIT_PARTIAL_FIXED_TRIPS)),
                      MASK_K=(K % chunk != 0))
        return (gemm._linear_partial_kernel, sig, consts, [0, 1, 2, 4, 6, 7, 14, 15, 16, 17] + ([5] if K % bk == 0 else []), opts,
                f"partial_ptr/{cfg['name']}")
    sc = dict(CHUNK_K=chunk, N_CHUNKS=n_chunks) if split else dict(CHUNK_K=0, N_CHUNKS=1)
    if cfg["tma"]:
        sig = {"x_desc": desc([bm, bk]), "w_desc": desc([bn, bk]), "y_desc": desc([bm, bn]), "Bias": f"*{dt}",
               "M": "i32", "N": "i32", "K": "i32", "HAS_BIAS": "constexpr", "BLOCK_M": "constexpr",
               "BLOCK_N": "constexpr", "BLOCK_K": "constexpr", "GROUP": "constexpr", "CHUNK_K": "constexpr",
               "N_CHUNKS": "constexpr"}
        consts = dict(HAS_BIAS=False, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP=cfg["GROUP_M"], **sc)
        if cfg.get("persistent"):
            sig["NUM_PROGRAMS"], consts["NUM_PROGRAMS"] = "constexpr", 132 * int(cfg.get("programs_per_sm", 1))
            return gemm._linear_tma_persistent_kernel, sig, consts, [3, 5, 6], opts, f"tma_persistent/{cfg['name']}"
        sig["SPLIT_FLAT"] = "constexpr"
        consts["SPLIT_FLAT"] = bool(cfg.get("flat", gemm.SPLIT_FLAT)) and split
        return gemm._linear_tma_kernel, sig, consts, [3, 5, 6], opts, f"tma/{cfg['name']}"
    sig = {"X": f"*{dt}", "W": f"*{dt}", "Bias": f"*{dt}", "Y": f"*{dt}", "M": "i32", "N": "i32", "K": "i32",
           "stride_xm": "i32", "stride_wn": "i32", "stride_ym": "i32", "HAS_BIAS": "constexpr", "EVEN_K": "constexpr",
           "BLOCK_M": "constexpr", "BLOCK_N": "constexpr", "BLOCK_K": "constexpr", "GROUP": "constexpr",
           "CHUNK_K": "constexpr", "N_CHUNKS": "constexpr", "SPLIT_FLAT": "constexpr"}
    consts = dict(HAS_BIAS=False, EVEN_K=(K % bk == 0), BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP=cfg["GROUP_M"],
                  **sc, SPLIT_FLAT=bool(cfg.get("flat", gemm.SPLIT_FLAT)) and split)
    return gemm._linear_ptr_kernel, sig, consts, [0, 1, 2, 3, 5, 6, 7, 8, 9], opts, f"ptr/{cfg['name']}"


def compile_variant(fn, sig, consts, aligned, opts):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if "PDL" in fn.arg_names:  # what an sm_90 launch gets (kernels/tik_v1/_rowops.py)
        sig, consts, opts = {**sig, "PDL": "constexpr"}, {**consts, "PDL": True}, {**opts, "launch_pdl": True}
    src = ASTSource(fn=fn, signature=sig, constexprs=consts, attrs={(i,): [["tt.divisibility", 16]] for i in aligned})
    c = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts)
    ptx = c.asm["ptx"]
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(ptx)
    r = subprocess.run([ptxas, "-arch=sm_90a", "-v", f.name, "-o", os.devnull], capture_output=True, text=True)
    os.unlink(f.name)
    mma = "wgmma" if "wgmma.mma_async" in ptx else ("mma.sync" if "mma.sync" in ptx else "-")
    return {
        "ptxas_rc": r.returncode,
        "registers": max((int(x) for x in re.findall(r"Used (\d+) registers", r.stderr)), default=-1),
        "spill_bytes": max((int(x) for x in re.findall(r"(\d+) bytes spill stores", r.stderr)), default=0),
        "shared_bytes": c.metadata.shared,
        "mma": mma,
        "loads": "tma" if "cp.async.bulk.tensor" in ptx else ("cp.async" if "cp.async" in ptx else "ld"),
        "wgmma_serialized_C7515": mma == "wgmma" and "C7515" in r.stderr,
        "wgmma_count_ptx": ptx.count("wgmma.mma_async"),
        "num_warps": opts["num_warps"], "num_stages": opts["num_stages"],
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--only-m", default="", help="comma list of M values to compile (default: every workload)")
    ap.add_argument("--quick", action="store_true", help="the spec's quick workloads only")
    ap.add_argument("trees", nargs="+", help="TAG=PATH of an implementation folder")
    args = ap.parse_args(argv)
    import yaml

    spec = yaml.safe_load(open(args.spec))
    wls = [w for w in spec["workloads"] if not (args.quick and w.get("quick", True) is False)]
    only = {int(m) for m in args.only_m.split(",") if m}
    if only:
        wls = [w for w in wls if w["shape"]["M"] in only]
    out = {"spec": os.path.basename(args.spec), "target": "sm_90a (ptxas of the triton wheel)", "smem_limit": SMEM_LIMIT,
           "trees": {}}
    failures = []
    for spec_tree in args.trees:
        tag, path = spec_tree.split("=", 1)
        gemm, C = load_tree(tag, path)
        done, rows = {}, {}
        for w in wls:
            s = w["shape"]
            fn, sig, consts, aligned, opts, label = variant(gemm, C, s["M"], s["N"], s["K"])
            key = (fn.__name__ if hasattr(fn, "__name__") else label, json.dumps(consts, sort_keys=True),
                   json.dumps(opts, sort_keys=True))
            if key not in done:
                try:
                    done[key] = dict(kernel=label, constexprs=consts, **compile_variant(fn, sig, consts, aligned, opts))
                except Exception as e:  # noqa: BLE001
                    done[key] = dict(kernel=label, constexprs=consts, error=f"{type(e).__name__}: {str(e)[:300]}")
                v = done[key]
                bad = ("error" in v or v["ptxas_rc"] != 0 or v["shared_bytes"] > SMEM_LIMIT
                       or (v["spill_bytes"] and "split" not in label))
                if bad:
                    failures.append(f"{tag}: {label}: {v.get('error') or v}")
                print(f"{tag:5} {label:<56} " + (v.get("error") or
                      f"smem {v['shared_bytes']:>6} regs {v['registers']:>3} spill {v['spill_bytes']:>4} "
                      f"{v['mma']} {v['loads']}{' SERIAL' if v['wgmma_serialized_C7515'] else ''}"), flush=True)
            rows[w["name"]] = done[key]
        out["trees"][tag] = {"path": path, "workloads": rows}
    out["failures"] = failures
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)
    print(f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
