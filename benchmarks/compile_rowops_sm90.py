"""Compile the row-wise op kernels (rmsnorm, rope, swiglu, kv_write, logprob) for sm_90 on a CPU box.

No GPU needed: the real launchers run on CPU tensors with ``kernel[grid](...)`` intercepted; each
intercepted launch is compiled with ``triton.compile(ASTSource(...), GPUTarget("cuda", 90, 32))``
(ptxas ships in the triton wheel), so syntax/type errors of the GPU code paths (INTERP=False) show up
before a GPU run. It also checks what the token-invariance argument relies on, statically:

* the layout of every ``tt.reduce`` in the RMSNorm forward is the same for the plain and the fused
  residual kernel, for a 2-D and a per-head 3-D call, and for row counts 1, 17, 4096;
* the log-prob chunk reduction has the same layout for any row count, row stride and logits dtype
  (bf16 logits and their fp32 copy must give the same bits);
* no ``fma`` outside libdevice calls where FP contraction must be off (PTX ``fma.rn`` count reported).

Usage: ``python benchmarks/compile_rowops_sm90.py [--impl kernels/tik_v1] [--quick]``. Exit 1 on failure.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import sys
import time
import types


def load_impl_no_interp(path):
    os.environ.pop("TRITON_INTERPRET", None)
    pkg = "_tik_sm90_check"
    mod = types.ModuleType(pkg)
    mod.__path__ = [os.path.abspath(path)]
    mod.__package__ = pkg
    sys.modules[pkg] = mod
    import importlib

    return lambda name: importlib.import_module(f"{pkg}.{name}")


class Capture:
    """Intercept ``kernel[grid](*args, **kw)``: record and compile instead of launching."""

    def __init__(self):
        import triton.runtime.jit as jit

        self.jit = jit
        self.records = []

    def __enter__(self):
        cap = self
        self._orig = self.jit.KernelInterface.__getitem__

        def getitem(kernel, grid):
            def run(*args, **kw):
                cap.records.append((kernel, args, kw))

            return run

        self.jit.KernelInterface.__getitem__ = getitem
        return self

    def __exit__(self, *exc):
        self.jit.KernelInterface.__getitem__ = self._orig
        return False


_DT = {"torch.bfloat16": "bf16", "torch.float16": "fp16", "torch.float32": "fp32", "torch.int32": "i32",
       "torch.int64": "i64", "torch.uint64": "u64", "torch.int16": "i16", "torch.int8": "i8", "torch.float8_e4m3fn": "fp8e4nv"}


def compile_record(kernel, args, kw):
    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    opts = {k: kw.pop(k) for k in ("num_warps", "num_stages", "enable_fp_fusion", "launch_pdl") if k in kw}
    names = [p.name for p in kernel.params]
    values = dict(zip(names, args))
    values.update(kw)
    dns = set(kernel.do_not_specialize or [])
    sig, constexprs, attrs = {}, {}, {}
    for i, p in enumerate(kernel.params):
        v = values[p.name] if p.name in values else p.default  # a parameter left at its default
        if p.is_constexpr or v is None:  # None (an unused optional pointer) is a constexpr in Triton
            sig[p.name] = "constexpr"
            constexprs[p.name] = v
        elif isinstance(v, torch.Tensor):
            sig[p.name] = "*" + _DT[str(v.dtype)]
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(v, bool):
            sig[p.name] = "i1"
        elif isinstance(v, int):
            sig[p.name] = "i64" if abs(v) >= 2**31 else "i32"
            if p.name not in dns and v % 16 == 0 and v != 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(v, float):
            sig[p.name] = "fp32"
        else:
            raise TypeError(f"{kernel.fn.__name__}.{p.name}: cannot map {type(v)}")
    src = ASTSource(fn=kernel, signature=sig, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts)


def reduce_layouts(ttgir: str):
    """The layout attribute of every tt.reduce operand, resolved to its definition text."""
    defs = dict(re.findall(r"^(#\w+) = (#ttg\.\w+<.*>)$", ttgir, re.M))
    out = []
    for m in re.finditer(r'"tt\.reduce"\(.*?\) <\{axis = (\d+).*?\}> \(\{.*?\}\) : \(tensor<([^,>]+), (#\w+)>', ttgir, re.S):
        out.append((int(m.group(1)), m.group(2), defs.get(m.group(3), m.group(3))))
    return out


def fma_outside_libdevice(ptx: str) -> int:
    """fma instructions in the kernel body (libdevice functions are inlined; we count all)."""
    return len(re.findall(r"\bfma\.rn", ptx))


def _with(mod, **values):
    """A runner of ``fn()`` with module knobs set (``gpu._rowops.knobs``: restored after)."""
    from areal_tik_plugin.contract._rowops import knobs

    def run(fn):
        with knobs(mod, **values):
            return fn()
    return run


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--impl", default=os.path.join(os.path.dirname(__file__), "..", "kernels", "tik_v1"))
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    mod = load_impl_no_interp(args.impl)
    mod("_rowops")._PDL_DEVICES[-1] = True  # compile what an sm_90 launch gets: PDL on (no GPU here)
    mod("_rowops").FAST_LAUNCH = False  # launches go through kernel[grid](...), which Capture records
    import torch

    failures = []
    t0 = time.time()
    n_compiled = 0

    def compile_all(label, fn):
        nonlocal n_compiled
        with Capture() as cap:
            fn()
        outs = []
        for kernel, a, kw in cap.records:
            try:
                c = compile_record(kernel, a, dict(kw))
                outs.append((kernel.fn.__name__, c))
                n_compiled += 1
                if kw.get("launch_pdl") and "griddepcontrol.wait" not in c.asm["ptx"]:
                    failures.append(f"{label}: {kernel.fn.__name__}: launched with PDL but no griddepcontrol.wait")
            except Exception as e:
                failures.append(f"{label}: {kernel.fn.__name__}: {type(e).__name__}: {str(e)[:2000]}")
        return outs

    bf16 = torch.bfloat16
    rms = mod("rmsnorm")
    Hs = (128, 1536) if args.quick else (64, 96, 128, 1536, 2048, 2560, 4096)
    for H in Hs:
        w = torch.ones(H, dtype=bf16)
        lays = {}
        for label, fn in {
            "plain M=1": lambda: rms.forward(torch.empty(1, H, dtype=bf16), w, 1e-6),
            "plain M=17": lambda: rms.forward(torch.empty(17, H, dtype=bf16), w, 1e-6),
            "plain M=4096": lambda: rms.forward(torch.empty(4096, H, dtype=bf16), w, 1e-6),
            "per-head strided": lambda: rms.forward(torch.empty(17, 48, H, dtype=bf16)[:, 8:40], w, 1e-6),
            "row stride H+8": lambda: rms.forward(torch.empty(17, H + 8, dtype=bf16)[:, :H], w, 1e-6),
            "fused residual": lambda: rms.forward(torch.empty(17, H, dtype=bf16), w, 1e-6,
                                                  residual=torch.empty(17, H, dtype=bf16)),
            "two weights (q/k heads)": lambda: rms.forward_two_weights(
                torch.empty(17, 48, H, dtype=bf16)[:, :40], w, w, 32, 1e-6),
        }.items():
            outs = compile_all(f"rmsnorm H={H} {label}", fn)
            for name, c in outs:
                lays[label] = reduce_layouts(c.asm["ttgir"])
                n_fma = fma_outside_libdevice(c.asm["ptx"])
                if n_fma:
                    failures.append(f"rmsnorm H={H} {label}: {n_fma} fma in PTX (contraction must be off)")
        ref = lays.get("plain M=1")
        for label, lay in lays.items():
            if lay != ref:
                failures.append(f"rmsnorm H={H}: reduce layout of '{label}' {lay} != plain M=1 {ref}")
        print(f"rmsnorm H={H}: reduce layouts {ref}")
        compile_all(f"rmsnorm.backward H={H}", lambda: rms.backward(
            torch.empty(17, H, dtype=bf16), torch.empty(17, H, dtype=bf16), w, 1e-6, dres=torch.empty(17, H, dtype=bf16)))

    rope = mod("rope")
    for (hq, hkv, D, half) in ((12, 2, 128, 64), (32, 8, 128, 64), (32, 4, 128, 64), (4, 2, 96, 24)):
        q = torch.empty(5, hq + 2 * hkv, D, dtype=bf16)
        inv = torch.empty(half, dtype=torch.float32)
        compile_all(f"rope {hq}/{hkv}/{D}", lambda: rope.forward(q[:, :hq], q[:, hq:hq + hkv], torch.zeros(5, dtype=torch.int64), inv, 1.0))
        compile_all(f"rope.forward_kv_write {hq}/{hkv}/{D}", lambda: rope.forward_kv_write(
            q[:, :hq], q[:, hq:hq + hkv], q[:, hq + hkv:], torch.zeros(5, dtype=torch.int64), inv, 1.0,
            torch.empty(9, hkv, D, dtype=bf16), torch.empty(9, hkv, D, dtype=bf16), torch.zeros(5, dtype=torch.int64)))
        compile_all(f"rope.backward {hq}/{hkv}/{D}", lambda: rope.backward(
            torch.empty(5, hq, D, dtype=bf16), torch.empty(5, hkv, D, dtype=bf16), torch.zeros(5, dtype=torch.int32), inv, 1.0))
        for groups in (False, True):  # token tiles (from TOKEN_TILES_MIN_T tokens): padded heads, head groups
            compile_all(f"rope token tiles groups={groups} {hq}/{hkv}/{D}", lambda: _with(
                rope, TOKEN_TILES=True, TOKEN_TILES_MIN_T=1, HEAD_GROUPS=groups)(lambda: rope.forward(
                    q[:, :hq], q[:, hq:hq + hkv], torch.zeros(5, dtype=torch.int64), inv, 1.0)))
            compile_all(f"rope.forward_kv_write token tiles groups={groups} {hq}/{hkv}/{D}", lambda: _with(
                rope, KV_TOKEN_TILES=True, TOKEN_TILES=True, TOKEN_TILES_MIN_T=1, HEAD_GROUPS=groups)(
                    lambda: rope.forward_kv_write(
                        q[:, :hq], q[:, hq:hq + hkv], q[:, hq + hkv:], torch.zeros(5, dtype=torch.int64), inv, 1.0,
                        torch.empty(9, hkv, D, dtype=bf16), torch.empty(9, hkv, D, dtype=bf16),
                        torch.zeros(5, dtype=torch.int64))))

    sw = mod("swiglu")
    for I in (768, 8960):
        gu = torch.empty(7, 2 * I, dtype=bf16)
        compile_all(f"swiglu I={I}", lambda: sw.forward_fused(gu))
        compile_all(f"swiglu.backward_fused I={I}", lambda: sw.backward_fused(torch.empty(7, I, dtype=bf16), gu))
        compile_all(f"swiglu.backward I={I}", lambda: sw.backward(torch.empty(7, I, dtype=bf16), gu[:, :I], gu[:, I:]))

    kv = mod("kv_write")
    for hkv, D in ((2, 128), (8, 128), (4, 128)):
        kc = torch.empty(64, hkv, D, dtype=bf16)
        kv_in = torch.empty(5, hkv, D, dtype=bf16)
        compile_all(f"kv_write {hkv}x{D}", lambda: kv.forward(kc, kc.clone(), torch.zeros(5, dtype=torch.int64), kv_in, kv_in))

    lp = mod("logprob")
    for Vn in ((1000, 151936) if not args.quick else (151936,)):
        ttg = {}
        for label, fn in {
            "T=1": lambda: lp.forward(torch.empty(1, Vn, dtype=bf16), torch.zeros(1, dtype=torch.int64), 1.0),
            "T=33 strided": lambda: lp.forward(torch.empty(33, Vn + 64, dtype=bf16)[:, :Vn], torch.zeros(33, dtype=torch.int64), 0.7),
            "per-row T": lambda: lp.forward(torch.empty(16, Vn, dtype=bf16), torch.zeros(16, dtype=torch.int64),
                                           torch.ones(16, dtype=torch.float32)),
            "fp32 logits": lambda: lp.forward(torch.empty(5, Vn, dtype=torch.float32), torch.zeros(5, dtype=torch.int64), 1.0),
            "fp16 logits": lambda: lp.forward(torch.empty(5, Vn, dtype=torch.float16), torch.zeros(5, dtype=torch.int64), 1.0),
            # without the entropy sums: the max and sum-exp reductions must keep the layout (logp's bits)
            "no entropy": lambda: lp.forward(torch.empty(7, Vn, dtype=bf16), torch.zeros(7, dtype=torch.int64), 0.7,
                                             entropy=False),
            "evict first": lambda: _with(lp, EVICT_FIRST=True)(lambda: lp.forward(
                torch.empty(7, Vn, dtype=bf16), torch.zeros(7, dtype=torch.int64), 0.7)),
            "no entropy fp32": lambda: lp.forward(torch.empty(7, Vn, dtype=torch.float32), torch.zeros(7, dtype=torch.int64),
                                                  0.7, entropy=False),
            # the entropy sum without the per-element select (free knob SELECT_FREE): 32 setp + 32 selp -> 32 max
            "entropy select-free": lambda: _with(lp, SELECT_FREE=True)(lambda: lp.forward(
                torch.empty(7, Vn, dtype=bf16), torch.zeros(7, dtype=torch.int64), 0.7)),
            # the natural-exp form (contract LOGPROB_EXP "exp"; "exp2" is one multiply per element less)
            "no entropy exp": lambda: _with(lp, EXP2=False)(lambda: lp.forward(
                torch.empty(7, Vn, dtype=bf16), torch.zeros(7, dtype=torch.int64), 0.7, entropy=False)),
            # s - max in the other form of the contract's LOGPROB_SHIFT (mul_sub <-> fma): same reduce layouts
            "other shift": lambda: _with(lp, SHIFT_FMA=not lp.SHIFT_FMA)(lambda: lp.forward(
                torch.empty(7, Vn, dtype=bf16), torch.zeros(7, dtype=torch.int64), 0.7)),
            # the sum of exp and the entropy sum in two reductions (FUSED_SUMS off; on: one two-operand reduce)
            "separate sums": lambda: _with(lp, FUSED_SUMS=False)(lambda: lp.forward(
                torch.empty(7, Vn, dtype=bf16), torch.zeros(7, dtype=torch.int64), 0.7)),
        }.items():
            for name, c in compile_all(f"logprob V={Vn} {label}", fn):
                if name == "_logprob_partial_kernel":
                    ttg[label] = reduce_layouts(c.asm["ttgir"])
                    if label in ("T=1", "entropy select-free", "no entropy", "no entropy exp", "separate sums",
                                 "other shift"):  # per-element instruction counts
                        ptx = c.asm["ptx"]
                        ops = dict(collections.Counter(m.group(1) for m in re.finditer(
                            r"^\s*((?:mul|fma|sub|add|max|ex2|cvt|shl|prmt|neg|mov|setp|selp|and|or)\.[\w.]+)", ptx, re.M)))
                        print(f"logprob V={Vn} {label}: partial kernel PTX {ops}")
                    if label == "evict first" and "evict_first" not in c.asm["ptx"]:
                        failures.append(f"logprob V={Vn}: EVICT_FIRST compiled without an evict_first load")
        ref = ttg.get("T=1")
        for label, lay in ttg.items():
            # (max, sum exp[, entropy sum]); FUSED_SUMS: (max, (sum exp, entropy sum)), one reduce for both sums
            want = ref[:2] if label.startswith("no entropy") else ref
            if getattr(lp, "FUSED_SUMS", False) and label == "separate sums":
                want = ref[:2] + ref[1:2]
            if lay != want:
                failures.append(f"logprob V={Vn}: chunk reduce layout of '{label}' {lay} != {want}")
        print(f"logprob V={Vn}: chunk reduce layouts {ref}")
        compile_all(f"logprob.backward V={Vn}", lambda: lp.backward(
            torch.empty(3, Vn, dtype=bf16), torch.zeros(3, dtype=torch.int64), 1.0, torch.empty(3), torch.empty(3),
            torch.empty(3), torch.empty(3)))

    print(f"compiled {n_compiled} kernels for sm_90 in {time.time() - t0:.0f}s; {len(failures)} failures")
    for f in failures:
        print("FAIL", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
