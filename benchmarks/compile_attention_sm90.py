"""Compile the attention kernels of an implementation folder for sm_90 on a CPU box (no GPU needed).

The real launchers (``attention.prefill`` / ``extend`` / ``decode``) run on CPU tensors at the
H200 spec's head shape (32 q heads, 8 kv heads, D 128, bf16) with ``kernel[grid](...)`` intercepted
(benchmarks/compile_rowops_sm90.py: Capture, compile_record); every launch is compiled with
``triton.compile(..., GPUTarget("cuda", 90, 32))`` with the options the launcher passes (warps,
stages, FP contraction off, PDL) and assembled by the ptxas of the triton wheel. Reported per kernel
variant: registers, spill bytes, shared memory, whether the dots lowered to wgmma or mma.sync, the
load path (TMA / cp.async / plain loads), ptxas' serialized-wgmma warning (C7515), and PTX counts of
the instructions the bitwise contract names (ex2, rcp / div, fma). Fails (exit 1) on a compile error,
on spills, or on more than 227 KiB of shared memory.

Usage: ``python benchmarks/compile_attention_sm90.py [--impl DIR] [--json OUT.json] [--label NAME] [--only CASES]``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

SMEM_LIMIT = 227 * 1024


def _ptx_counts(ptx: str) -> dict:
    return {"ex2": len(re.findall(r"\bex2\.approx", ptx)), "rcp": len(re.findall(r"\brcp\.", ptx)),
            "div": len(re.findall(r"\bdiv\.", ptx)), "fma": len(re.findall(r"\bfma\.rn", ptx)),
            "wgmma": len(re.findall(r"\bwgmma\.mma_async", ptx)), "mma_sync": len(re.findall(r"\bmma\.sync", ptx))}


def ptxas_v(ptx: str) -> dict:
    """``ptxas -arch=sm_90a -v`` of PTX text with the triton wheel's ptxas: return code, stderr, registers
    (-1 when ptxas printed none) and spill-store bytes."""
    import triton

    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(ptx)
    try:
        r = subprocess.run([ptxas, "-arch=sm_90a", "-v", f.name, "-o", os.devnull], capture_output=True, text=True)
    finally:
        os.unlink(f.name)
    return {"rc": r.returncode, "stderr": r.stderr,
            "regs": max((int(x) for x in re.findall(r"Used (\d+) registers", r.stderr)), default=-1),
            "spill_bytes": max((int(x) for x in re.findall(r"(\d+) bytes spill stores", r.stderr)), default=0)}


def assemble(c) -> dict:
    """ptxas -v of a compiled kernel: registers, spills, C7515; plus metadata and PTX facts."""
    ptx = c.asm["ptx"]
    r = ptxas_v(ptx)
    return {
        "ptxas_rc": r["rc"], "regs": r["regs"], "spill_bytes": r["spill_bytes"], "smem": int(c.metadata.shared),
        "num_warps": int(c.metadata.num_warps), "num_stages": int(c.metadata.num_stages),
        "mma": "wgmma" if "wgmma.mma_async" in ptx else ("mma.sync" if "mma.sync" in ptx else "-"),
        "loads": "tma" if "cp.async.bulk.tensor" in ptx else ("cp.async" if "cp.async" in ptx else "ld"),
        "serialized_wgmma": "C7515" in r["stderr"], "ptx": _ptx_counts(ptx),
    }


def compile_launch(kernel, args, kw):
    """benchmarks/compile_rowops_sm90.compile_record, plus host tensor descriptors (TMA) as arguments:
    signature ``tensordesc<dtype[block]>`` as Triton 3.6 specializes them."""
    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.tools.tensor_descriptor import TensorDescriptor

    from benchmarks.compile_rowops_sm90 import _DT, compile_record

    if not any(isinstance(a, TensorDescriptor) for a in list(args) + list(kw.values())):
        return compile_record(kernel, args, kw)
    opts = {k: kw.pop(k) for k in ("num_warps", "num_stages", "enable_fp_fusion", "launch_pdl") if k in kw}
    values = dict(zip([p.name for p in kernel.params], args))
    values.update(kw)
    sig, constexprs, attrs = {}, {}, {}
    for i, p in enumerate(kernel.params):
        v = values[p.name] if p.name in values else p.default
        if p.is_constexpr or v is None:
            sig[p.name] = "constexpr"
            constexprs[p.name] = v
        elif isinstance(v, TensorDescriptor):
            sig[p.name] = f"tensordesc<{_DT[str(v.base.dtype)]}[{', '.join(str(b) for b in v.block_shape)}]>"
        elif isinstance(v, torch.Tensor):
            sig[p.name] = "*" + _DT[str(v.dtype)]
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(v, bool):
            sig[p.name] = "i1"
        elif isinstance(v, int):
            sig[p.name] = "i64" if abs(v) >= 2**31 else "i32"
            if p.name not in set(kernel.do_not_specialize or []) and v % 16 == 0 and v != 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(v, float):
            sig[p.name] = "fp32"
        else:
            raise TypeError(f"{kernel.fn.__name__}.{p.name}: cannot map {type(v)}")
    src = ASTSource(fn=kernel, signature=sig, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts)


def cases(attn, torch, bwd_configs=()):
    """(label, launcher call) at the spec's head shape; lengths only pick grids, not the compiled code.
    ``bwd_configs``: ``prefill_backward(config=...)`` overrides, each its own case "backward <json>"."""
    bf16 = torch.bfloat16
    Hq, Hkv, D = 32, 8, 128
    scale = attn.default_scale(D)
    T = 1024
    q = torch.empty(T, Hq, D, dtype=bf16)
    k = torch.empty(T, Hkv, D, dtype=bf16)
    cu = torch.tensor([0, T], dtype=torch.int32)
    slots = 4096
    pool = torch.empty(slots, Hkv, D, dtype=bf16)
    table = torch.zeros(2, 4096, dtype=torch.int32)
    rows = torch.zeros(1, dtype=torch.int32)
    qd = torch.empty(4, Hq, D, dtype=bf16)
    lens = torch.full((4,), 4096, dtype=torch.int32)
    rows4 = torch.zeros(4, dtype=torch.int32)
    table4 = torch.zeros(4, 4096, dtype=torch.int32)
    lse = torch.empty(Hq, T, dtype=torch.float32)
    return [
        ("prefill", lambda: attn.prefill(q, k, k, cu, T, scale)),
        ("prefill+lse", lambda: attn.prefill(q, k, k, cu, T, scale, return_lse=True)),
        ("extend page1", lambda: attn.extend(q, pool, pool, cu, torch.zeros(1, dtype=torch.int32), table, rows, T,
                                             scale, page_size=1)),
        ("extend page16", lambda: attn.extend(q, pool, pool, cu, torch.zeros(1, dtype=torch.int32), table, rows, T,
                                              scale, page_size=16)),
        ("decode page1", lambda: attn.decode(qd, pool, pool, lens, table4, rows4, scale, 1, 4096)),
        ("decode page16", lambda: attn.decode(qd, pool, pool, lens, table4, rows4, scale, 16, 4096)),
        ("backward", lambda: attn.prefill_backward(q, q, k, k, q, lse, cu, T, scale)),
    ] + [(f"backward {json.dumps(c, sort_keys=True)}",
          lambda c=c: attn.prefill_backward(q, q, k, k, q, lse, cu, T, scale, config=c)) for c in bwd_configs]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--impl", default=os.path.join(os.path.dirname(__file__), "..", "kernels", "tik_v1"))
    ap.add_argument("--json", default="", help="write the per-kernel facts to this JSON file")
    ap.add_argument("--label", default="", help="name of this implementation in the JSON (default: --impl)")
    ap.add_argument("--only", default="", help="comma list of case labels to compile (e.g. 'prefill,decode page1'); "
                    "'backward' also takes the --bwd-configs cases")
    ap.add_argument("--bwd-configs", default="[]",
                    help='JSON list of prefill_backward config overrides to compile too (e.g. \'[{"per_head": true}]\')')
    args = ap.parse_args(argv)
    bwd_configs = json.loads(args.bwd_configs)
    if not isinstance(bwd_configs, list) or not all(isinstance(c, dict) for c in bwd_configs):
        raise SystemExit(f"--bwd-configs: expected a JSON list of objects, got {args.bwd_configs!r}")
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from benchmarks.compile_rowops_sm90 import Capture, load_impl_no_interp

    mod = load_impl_no_interp(args.impl)
    mod("_rowops")._PDL_DEVICES[-1] = True  # what an sm_90 launch gets: PDL on (no GPU here)
    mod("_rowops").FAST_LAUNCH = False  # launches go through kernel[grid](...), which Capture records
    attn = mod("attention")
    import torch

    out, failures = {}, []
    only = [x for x in args.only.split(",") if x]
    for label, fn in cases(attn, torch, bwd_configs):
        if only and label not in only and not (label.startswith("backward ") and "backward" in only):
            continue
        with Capture() as cap:
            fn()
        for kernel, a, kw in cap.records:
            name = f"{label}/{kernel.fn.__name__}"
            try:
                facts = assemble(compile_launch(kernel, a, dict(kw)))
            except Exception as e:  # noqa: BLE001 -- a compile error is the finding
                failures.append(f"{name}: {type(e).__name__}: {str(e)[:600]}")
                print(f"FAIL {name}: {type(e).__name__}: {str(e)[:600]}")
                continue
            ok = facts["ptxas_rc"] == 0 and facts["spill_bytes"] == 0 and facts["smem"] <= SMEM_LIMIT
            if not ok:
                failures.append(f"{name}: ptxas rc {facts['ptxas_rc']}, spill {facts['spill_bytes']}, smem {facts['smem']}")
            out[name] = facts
            print(f"{'ok  ' if ok else 'FAIL'} {name:<52} warps {facts['num_warps']} stages {facts['num_stages']} "
                  f"regs {facts['regs']:>3} spill {facts['spill_bytes']:>4} smem {facts['smem']:>6} {facts['mma']:<8} "
                  f"{facts['loads']:<8} {'serial' if facts['serialized_wgmma'] else ''} ptx {facts['ptx']}", flush=True)
    if args.json:
        data = {}
        if os.path.exists(args.json):
            with open(args.json) as f:
                data = json.load(f)
        import triton

        data.setdefault("env", {"triton": triton.__version__, "target": "cuda sm_90 (ptxas -arch=sm_90a)"})
        data.setdefault("implementations", {})[args.label or args.impl] = {"kernels": out, "failures": failures}
        with open(args.json, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
    print(f"{len(failures)} failure(s)")
    for f in failures:
        print("  ", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
