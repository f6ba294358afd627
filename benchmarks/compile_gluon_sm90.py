"""Compile an implementation's Gluon prefill (``attention_gluon.py``) for sm_90 on a CPU box (no GPU).

For every variant ``attention_gluon.applies`` admits (D 64 / 128, bf16 / fp16, with and without the
LSE), at GQA group 4: registers, spill bytes and shared memory from the triton wheel's ptxas, whether K /
V come through TMA and the MMAs are wgmma, how many ``wgmma.wait_group 1`` (an MMA left in flight) the
PTX has, and whether any fp32 fma appears (FP contraction must stay off); ``--configs`` adds knob sets
(warps, ring depths, issue order; ``tile=128`` compiles a knob set at a 128-key tile, the contract's
ATTN_KV_TILE alternative, for an implementation whose ``applies`` admits it). Fails (exit 1) on a compile error, a spill, more than the SM's 227 KiB
of shared memory, the FA3 order without an MMA in flight, or an fp32 fma. Gluon kernels cannot run under
TRITON_INTERPRET; this script must run without it.

Usage: ``python benchmarks/compile_gluon_sm90.py [--impl kernels/tik_v4] [--json OUT.json] [--configs 'warps=8,k_stages=3;order=1']``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import sys
import types

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from benchmarks.compile_attention_sm90 import ptxas_v  # noqa: E402

SMEM_LIMIT = 227 * 1024


def _load(impl: str, module: str = "attention_gluon", script: str = "compile_gluon_sm90"):
    """``module`` of the implementation folder as a module of a package over that folder (its relative imports
    resolve there), without the loader, which would switch on the interpreter here."""
    path = os.path.join(impl, f"{module}.py")
    if not os.path.isfile(path):
        raise SystemExit(f"{script}: {path} not found (expected an implementation folder with {module}.py)")
    pkg = types.ModuleType(f"_tik_{module}_sm90")
    pkg.__path__ = [os.path.abspath(impl)]
    sys.modules[pkg.__name__] = pkg
    return importlib.import_module(f"{pkg.__name__}.{module}")


TILES = (64, 128)   # the contract's ATTN_KV_TILE and its coupled alternative


def parse_knob_sets(text: str, g) -> list[tuple[dict, int]]:
    """``'warps=8,k_stages=3;order=1,tile=128'`` -> [(knobs checked by attention_gluon.config, tile)]; the
    ``--configs`` syntax of this script and of benchmarks/probes/gluon_prefill_probe.py."""
    out = []
    for c in [c for c in text.split(";") if c]:
        try:
            kv = dict((x.split("=")[0], int(x.split("=")[1])) for x in c.split(","))
        except (ValueError, IndexError):
            raise ValueError(f"{c!r} is not knob=value,... (knobs {sorted(g.KNOBS)} and tile)")
        tile = kv.pop("tile", 64)
        if tile not in TILES:
            raise ValueError(f"tile={tile}; expected one of {TILES}")
        g.config(**kv)
        out.append((kv, tile))
    return out


def compile_variant(g, d: int, dtype, lse: bool, cfg: dict | None = None, tile: int = 64) -> dict:
    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import mangle_type

    cfg = cfg or g.config()
    bm = g.block_m(cfg)
    gdt = gl.bfloat16 if dtype == torch.bfloat16 else gl.float16
    lay = gl.NVMMASharedLayout.get_default_for([tile, d], gdt)
    desc = mangle_type(g.TensorDescriptor(torch.zeros(tile, d, dtype=dtype), [tile, d], [d, 1], [tile, d], lay))
    qdesc = mangle_type(g.TensorDescriptor(torch.zeros(bm, d, dtype=dtype), [bm, d], [d, 1], [bm, d],
                                           gl.NVMMASharedLayout.get_default_for([bm, d], gdt)))
    ptr = "*bf16" if dtype == torch.bfloat16 else "*fp16"
    sig = {"q_desc": qdesc, "k_desc": desc, "v_desc": desc, "O": ptr, "LSE": "*fp32", "cu_q": "*i32",
           "stride_ot": "i32", "stride_oh": "i32", "lse_stride_h": "i32", "qk_scale": "fp32"}
    if cfg["ws"] and hasattr(g, "_attn_fwd_gluon_wsp"):   # the work-item program (persistent or not: same code)
        fn, warps = g._attn_fwd_gluon_wsp, 4
        sig.update({"sched": "*i32", "W": "i32", "G": "i32", "SEC": "i32", "NMB": "i32", "HP": "i32"})
        cx = {"GROUP": 4, "D": d, "TILE": tile, "TPS": 512 // tile, "STAGES": cfg["k_stages"], "STORE_LSE": lse,
              "REV": cfg["rev"], "PP": cfg["pp"], "DYN": cfg["persist"] == 2}
    elif cfg["ws"]:
        fn, warps = g._attn_fwd_gluon_ws, 4
        cx = {"GROUP": 4, "D": d, "TILE": tile, "TPS": 512 // tile, "STAGES": cfg["k_stages"], "STORE_LSE": lse}
    else:
        fn, warps = g._attn_fwd_gluon, cfg["warps"]
        cx = {"GROUP": 4, "D": d, "BM": bm, "TILE": tile, "TPS": 512 // tile, "KSTAGES": cfg["k_stages"],
              "VSTAGES": cfg["v_stages"], "ORDER": cfg["order"], "STORE_LSE": lse}
    if "rev" in cfg and "PP" not in cx:   # the launch-order knob (and FA3's order in tik_v5's ws program)
        cx["REV"] = cfg["rev"]
        if cfg["ws"]:
            cx["ORDER"] = cfg["order"]
    sig.update({k: "constexpr" for k in cx})
    c = triton.compile(GluonASTSource(fn, sig, constexprs=cx), target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": warps, "enable_fp_fusion": False})
    ptx = c.asm["ptx"]
    r = ptxas_v(ptx)
    if r["rc"]:
        raise RuntimeError(f"ptxas failed: {r['stderr'][-600:]}")
    setmaxnreg = sorted({int(x) for x in re.findall(r"setmaxnreg\.inc\.sync\.aligned\.u32\s+(\d+)", ptx)})
    return {"d": d, "dtype": str(dtype).split(".")[-1], "lse": lse, "config": cfg, "tile": tile,
            "warps": int(c.metadata.num_warps),
            "setmaxnreg_inc": setmaxnreg,
            "worker_regs": (g.ws_regs(cfg) if hasattr(g, "ws_regs") else
                            [int(getattr(g.REGS_CONSUMER, "value", g.REGS_CONSUMER)),
                             int(getattr(g.REGS_PRODUCER, "value", g.REGS_PRODUCER))]) if cfg["ws"] else [],
            "serialized_wgmma": "C7514" in r["stderr"], "regs": r["regs"], "spill_bytes": r["spill_bytes"],
            "smem": int(c.metadata.shared), "tma": "cp.async.bulk.tensor" in ptx, "wgmma": "wgmma.mma_async" in ptx,
            "wgmma_wait_1": len(re.findall(r"wgmma\.wait_group\.sync\.aligned\s+1", ptx)),
            "fma_f32": len(re.findall(r"\bfma\.rn\.f32", ptx)), "ex2": len(re.findall(r"\bex2\.approx", ptx))}


def failures(r: dict) -> list[str]:
    out = []
    if r["serialized_wgmma"]:
        out.append("ptxas serialized the wgmma (C7514)")
    if r["spill_bytes"]:
        out.append(f"spills {r['spill_bytes']} B")
    if r["smem"] > SMEM_LIMIT:
        out.append(f"shared memory {r['smem']} B > {SMEM_LIMIT}")
    if not (r["tma"] and r["wgmma"]):
        out.append("not TMA + wgmma")
    if r["config"]["ws"]:
        # the warp groups' register counts after setmaxnreg must fit the SM's 64K registers
        regs = 128 * (max(r["setmaxnreg_inc"]) + sum(r["worker_regs"]))
        if regs > 65536:
            out.append(f"setmaxnreg asks {regs} registers per SM")
    if r["config"]["order"] == 1 and not r["wgmma_wait_1"]:
        out.append("FA3 order without a wgmma left in flight")
    if r["fma_f32"]:
        out.append(f"{r['fma_f32']} fp32 fma (FP contraction must be off)")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python benchmarks/compile_gluon_sm90.py")
    ap.add_argument("--impl", default="kernels/tik_v4")
    ap.add_argument("--json", default=None)
    ap.add_argument("--configs", default="", help="';'-separated knob sets beyond the defaults, each "
                    "'knob=value,...' (attention_gluon.KNOBS), compiled at D 128 bf16 with the LSE")
    args = ap.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        ap.error("TRITON_INTERPRET is set: Gluon kernels only compile for the GPU; unset it")
    import torch

    g = _load(args.impl)
    try:
        sweep = [(g.config(**kv), tile) for kv, tile in parse_knob_sets(args.configs, g)]
    except ValueError as e:
        ap.error(f"--configs: {e} (expected e.g. 'warps=8,k_stages=3;order=1;order=1,tile=128')")
    cases = [(d, dt, lse, None, 64) for d in g.HEAD_DIMS for dt in g.DTYPES for lse in (False, True)]
    cases += [(128, torch.bfloat16, True, c, t) for c, t in sweep]
    res, bad = [], 0
    for d, dt, lse, cfg, tile in cases:
        r = compile_variant(g, d, dt, lse, cfg, tile)
        f = failures(r)
        bad += bool(f)
        res.append(r)
        c = r["config"]
        print(f"{'FAIL' if f else 'ok  '} D {d:3d} {r['dtype']:8s} lse {lse!s:5s} t{tile} w{c['warps']} k{c['k_stages']} "
              f"v{c['v_stages']} o{c['order']} ws{c['ws']} r{c.get('rev', 0)}"
              + (f" p{c['persist']} pp{c['pp']}" if "pp" in c else "") + f" regs {r['regs']} spill {r['spill_bytes']} smem {r['smem']} "
              f"wait1 {r['wgmma_wait_1']} ex2 {r['ex2']}" + (f"  ({'; '.join(f)})" if f else ""))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"impl": args.impl, "torch": torch.__version__, "variants": res}, fh, indent=1)
            fh.write("\n")
    print(f"{bad} failure(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
