"""The generic native launcher: every launch a kernel module makes through its launch helper (the
manifest's ``native_host_path.launch``, ``_rowops:_launch``, and the packed helpers it lists under
``launch_packed``, e.g. tik_v6's ``attention_gluon:_launch`` for the Gluon prefill) served by one C call,
``glaunch``, instead of Triton's ``JITFunction.run`` (binder, cache key, launcher, TMA descriptor encoding
in Python).

Why: on the H200 machines Triton's path costs 50-90 us of host time per launch (``tma_host_probe``: a TMA
GEMM issues in 76-97 us, the attention prefill in 154 us, against ~20 us for ``F.linear``); cold timings
and eager training at short sequences wait on it.

What is served: a launch whose positional arguments are tensors, ints, bools, floats, None and host
``TensorDescriptor``s (Triton's, or Gluon's with the layout in the class), whose keyword arguments are
constexprs and compile options, with no launch hook, pre-run hook, Triton debug or instrumentation mode set. The first call of each *class* (see
``_tik_native.c``: kernel, keyword values, device, and per argument a refinement of Triton's
specialization key) goes through Triton; its compiled kernel's signature gives the parameter kinds, the
C side derives the parameters it would pass for that very call, and the variant is kept only if they
equal, one by one and byte for byte for each TMA descriptor, what Triton's launcher passes. The kernel, and
so every bit of every output, is the one Triton launches. Setting a knob or switching implementation drops
every variant (:func:`areal_tik_plugin.runtime.native.invalidate`); ``TIK_NATIVE=0`` turns the path off.
"""

from __future__ import annotations

import struct

GP_DROP, GP_PTR, GP_I32, GP_I64, GP_F32, GP_I8, GP_DESC = range(7)
# Triton's TMA element-type codes -> the driver's (triton/backends/nvidia/driver.py, TMA_DTYPE_DEVICE_TO_HOST)
_TMA_HOST = {i: i for i in range(16)}
_TMA_HOST.update({8: 10, 9: 8, 10: 9})
_SCALARS = {"i32": GP_I32, "i64": GP_I64, "fp32": GP_F32, "i1": GP_I8, "u1": GP_I8}
_UNSET = object()

# kernels whose calling convention the path does not take (a declared constexpr passed positionally, a
# runtime parameter among the keyword options): always Triton's path
REFUSED_KERNELS: dict = {}
# kernels with runtime (non-constexpr) parameters after the positional ones, passed by keyword or left to
# their defaults (e.g. rope's optional KV-write operands): fn -> (positional count, ((name, default), ...),
# their names). Those values are appended to the positional arguments in parameter order, so the C side
# classifies them like any argument (a tensor by dtype and alignment, not by identity).
TRAILING: dict = {}
_STATE = {"m": _UNSET}


def _module():
    from areal_tik_plugin.runtime import native

    m = native.module()
    if m is None or not hasattr(m, "glaunch"):
        return None
    from triton.tools.tensor_descriptor import TensorDescriptor

    m.gsetup((TensorDescriptor, _gluon_descriptor_type()))
    return m


def _gluon_descriptor_type():
    """Gluon's host TensorDescriptor class (its ``layout`` is part of the class), or None without Gluon."""
    try:
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    except ImportError:
        return None
    return TensorDescriptor


def compiled_kernel(fn, args, kw):
    """The kernel Triton compiled for ``fn[grid](*args, **kw)`` (its binder and cache key, as ``run`` finds
    it), or None when there is none yet or the lookup does not apply (another Triton)."""
    try:
        from triton import knobs
        from triton.runtime.driver import driver
        from triton.runtime.jit import compute_cache_key

        kb = dict(kw, debug=kw.get("debug", fn.debug) or knobs.runtime.debug,
                  instrumentation_mode=knobs.compilation.instrumentation_mode)
        kernel_cache, key_cache, _, _, binder = fn.device_caches[driver.active.get_current_device()]
        _, specialization, options = binder(*args, **kb)
        k = kernel_cache.get(compute_cache_key(key_cache, specialization, options))
    except (AttributeError, ImportError, KeyError, TypeError, ValueError):
        return None
    return None if k is None or hasattr(k, "result") else k


def reset() -> None:
    """Forget the module lookup (tests; the native module was reset)."""
    _STATE["m"] = _UNSET
    REFUSED_KERNELS.clear()
    TRAILING.clear()


def install(mod, attr: str, packed: bool = False) -> None:
    """Wrap ``mod.<attr>`` (a kernel module's ``_launch(fn, grid, *args, **kw)``; with ``packed``,
    ``_launch(fn, grid, args, kw)``: :func:`install_packed`) with the native launcher. The native module is
    looked up at the first launch; without it every call takes the wrapped path."""
    if packed:
        return install_packed(mod, attr)
    py_launch = getattr(mod, attr)
    if getattr(py_launch, "__tik_native_launch__", False):
        return
    from triton import knobs

    rt, comp = knobs.runtime, knobs.compilation

    def _launch(fn, grid, *args, **kw):
        m = _native_for(fn, rt, comp)
        if m is None:
            return py_launch(fn, grid, *args, **kw)
        tr = TRAILING.get(fn)
        if tr is None:
            cargs, ckw = args, kw
        elif len(args) != tr[0]:
            return py_launch(fn, grid, *args, **kw)
        else:
            cargs = args + tuple(kw.get(n, d) for n, d in tr[1])
            ckw = {k: v for k, v in kw.items() if k not in tr[2]}
        r = m.glaunch(fn, grid, cargs, ckw)
        if r is not None and r is not False:
            return r
        k = py_launch(fn, grid, *args, **kw)
        if r is False and k is not None:
            learn(m, fn, grid, args, kw, k)
        return k

    _wrap(mod, attr, _launch, py_launch)


def install_packed(mod, attr: str) -> None:
    """Wrap ``mod.<attr>``, a launch helper taking ``(fn, grid, args, kw)`` (a tuple of every runtime
    argument, positional, and a dict of keywords) and returning nothing, with the native launcher. The
    compiled kernel a variant is learned from is the one Triton's cache holds for the call just made."""
    py_launch = getattr(mod, attr)
    if getattr(py_launch, "__tik_native_launch__", False):
        return
    from triton import knobs

    rt, comp = knobs.runtime, knobs.compilation

    def _launch(fn, grid, args, kw):
        m = _native_for(fn, rt, comp)
        if m is None or fn in TRAILING:
            return py_launch(fn, grid, args, kw)
        r = m.glaunch(fn, grid, args, kw)
        if r is not None and r is not False:
            return r
        k = py_launch(fn, grid, args, kw)
        if r is False:
            k = k if k is not None else compiled_kernel(fn, args, kw)
            if k is not None:
                learn(m, fn, grid, args, kw, k)
        return k

    _wrap(mod, attr, _launch, py_launch)


def _native_for(fn, rt, comp):
    """The native module for a launch of ``fn``, or None where Triton's own path must run: no native module,
    a refused kernel, Triton's debug or instrumentation mode, a launch hook or a pre-run hook."""
    m = _STATE["m"]
    if m is _UNSET:
        m = _STATE["m"] = _module()
    if m is None or fn in REFUSED_KERNELS or rt.debug or comp.instrumentation_mode or _hooked(rt.launch_enter_hook) \
            or _hooked(rt.launch_exit_hook) or getattr(fn, "pre_run_hooks", None):
        return None
    return m


def _wrap(mod, attr: str, launch, py_launch) -> None:
    launch.__tik_native_launch__ = True
    launch.__wrapped__ = py_launch
    setattr(mod, attr, launch)


def _hooked(hook) -> bool:
    return hook is not None and bool(getattr(hook, "calls", True))


def layout(fn, args, kw):
    """The arguments the C side classifies for this call: ``(params, values, keywords)`` -- the positional
    arguments, then the runtime parameters after them (:data:`TRAILING`), and the keywords left."""
    tr = TRAILING.get(fn)
    params = list(fn.params)
    if tr is None:
        trailing = [p for p in params[len(args):] if not p.is_constexpr]
        if not trailing:
            return params[:len(args)], tuple(args), kw
        names = tuple((p.name, p.default) for p in trailing)
        tr = TRAILING[fn] = (len(args), names, frozenset(n for n, _ in names))
    byname = {p.name: p for p in params}
    extra = [byname[n] for n, _ in tr[1]]
    return (params[:tr[0]] + extra, tuple(args) + tuple(kw.get(n, d) for n, d in tr[1]),
            {k: v for k, v in kw.items() if k not in tr[2]})


def plan(arg_params, values, kw, kernel):
    """``(plan, "")`` for ``glearn`` from the compiled kernel Triton launched for this call (arguments as
    :func:`layout` lays them out), ``(None, why)`` when the call's class is refused, or ``(False, why)`` when
    the kernel's calling convention is."""
    md = kernel.metadata
    if getattr(md, "num_ctas", 1) != 1:
        return None, "clusters (num_ctas > 1)"
    if getattr(md, "global_scratch_size", 0) or getattr(md, "profile_scratch_size", 0):
        return None, "global or profile scratch memory"
    sig = kernel.src.signature
    for name in kw:
        if name in sig and sig[name] != "constexpr":
            return False, f"runtime parameter {name} among the keyword options"
    metas = list(getattr(md, "tensordesc_meta", None) or [])
    kinds, descs, di = [], [], 0
    for p, v in zip(arg_params, values):
        if p.is_constexpr:
            return False, f"constexpr {p.name} passed positionally"
        ty = sig[p.name]
        if ty == "constexpr":
            kinds.append(GP_DROP)
        elif ty.startswith("*"):
            kinds.append(GP_PTR)
        elif ty.startswith("tensordesc"):
            meta = metas[di] if di < len(metas) else None
            di += 1
            if meta is None:
                return None, "a tensor descriptor lowered without TMA"
            if meta.get("fp4_padded"):
                return None, "an fp4-padded tensor descriptor"
            descs.append((int(meta["swizzle"]), int(meta["elem_size"]), _TMA_HOST[int(meta["elem_type"])],
                          1 if getattr(v, "padding", "zero") == "nan" else 0, tuple(int(b) for b in meta["block_size"])))
            kinds.append(GP_DESC)
        elif ty in _SCALARS:
            kinds.append(_SCALARS[ty])
        else:
            return None, f"parameter {p.name} of type {ty}"
    return (kinds, descs, int(kernel.function), int(md.num_warps), int(md.shared),
            bool(getattr(md, "launch_pdl", False)), bool(getattr(md, "launch_cooperative_grid", False)), kernel), ""


def expected(m, arg_params, values, kernel) -> list:
    """What Triton's launcher passes for this call: [(kind, value)] in parameter order (floats as fp32 bits,
    TMA descriptors as the 128 bytes Triton encodes)."""
    from triton.backends.nvidia.driver import make_tensordesc_arg

    sig = kernel.src.signature
    metas = list(getattr(kernel.metadata, "tensordesc_meta", None) or [])
    out, di = [], 0
    for p, v in zip(arg_params, values):
        ty = sig[p.name]
        if ty == "constexpr":
            continue
        if ty.startswith("*"):
            out.append((GP_PTR, v.data_ptr()))
        elif ty.startswith("tensordesc"):
            tmap, *rest = make_tensordesc_arg(v, metas[di])
            di += 1
            r = len(rest) // 2
            out.append((GP_DESC, m.tmap_bytes(tmap)))
            out += [(GP_I32, int(s)) for s in rest[:r]] + [(GP_I64, int(s)) for s in rest[r:]]
        elif ty == "fp32":
            out.append((GP_F32, struct.unpack("<I", struct.pack("<f", v))[0]))
        else:
            out.append((_SCALARS[ty], int(v)))
    return out


def learn(m, fn, grid, args, kw, kernel) -> tuple[bool, str]:
    """Register the variant of this call's class from Triton's launch of it (or refuse the class or the
    kernel); returns (registered, reason)."""
    try:
        arg_params, values, ckw = layout(fn, args, kw)
        p, why = plan(arg_params, values, ckw, kernel)
    except (AttributeError, KeyError, TypeError, ValueError) as e:
        p, why = None, f"cannot read the compiled kernel: {type(e).__name__}: {e}"[:90]
        arg_params, values, ckw = None, args, kw
    if p is False:
        REFUSED_KERNELS[fn] = why
        return False, why
    if p is None:
        m.glearn(fn, grid, values, ckw, None, why)
        return False, why
    m.glearn(fn, grid, values, ckw, p)
    ours = m.gderive(fn, grid, values, ckw, True)
    theirs = expected(m, arg_params, values, kernel)
    if ours != theirs:
        bad = next((i for i, (a, b) in enumerate(zip(ours or [], theirs)) if a != b), min(len(ours or []), len(theirs)))
        why = f"derived parameter {bad} differs from Triton's"
        m.glearn(fn, grid, values, ckw, None, why)
        return False, why
    return True, ""
