"""Native host path for forward calls of RMSNorm (with or without the residual, per-head Q/K norm through
``rms_norm``), SwiGLU (fused or separate) and the dense linear at every M: eager calls, and the kernel call inside
autograd's forward (training).

Why: a Python-launched op costs 20-60 us of host time on the H200 machines (argument checks, the kernel
module's wrapper, Triton's binder and launcher), against 8-20 us for Hugging Face's two-to-seven ATen
launches. At a few tokens the GPU work is 2-4 us, so an eager call is bound by that host time.

What: ``_tik_native.c`` (CPython API + cuda.h, built with the system C compiler on first use and cached
under ``$TIK_CACHE_DIR`` or ``~/.cache/areal_tik_plugin/native``) serves a call in one C function: it
reads the arguments, allocates the outputs with ``torch.empty`` and launches, with ``cuLaunchKernelEx``
on the current stream, the CUfunction Triton compiled for that kind of call, with the grid, parameters
and launch options Triton's launcher would use. The kernel, and so every bit of the result, is the one
the Python path launches.

Plans are learned, not written: the first call of a kind (op, dtype, size, specialization class of
every kernel argument) goes through the Python path with its launch recorded (``_rowops._RECORDS``);
:func:`learn` registers a plan only if the C side derives the same grid and the same value for every
kernel parameter from the same inputs, and the kernel's specialization flags are the ones it assumes.
Otherwise the kind is refused (kept on the Python path; :func:`stats` says why). Setting any attribute
of a loaded implementation's module (knobs), or switching implementation, drops every plan.

The dense linear (``ops.linear``) is served by *recipes*: its configuration is a function of (M, N, K), so
a plan for one exact (M, N, K, row strides, alignments, bias) maps each kernel parameter of the recorded
launch to an operand's pointer, a temporary (allocated per call), the split reduce's ticket buffer (bound
to the stream it was learned on), a host TMA descriptor over an operand (its map encoded per call with
cuTensorMapEncodeTiled; its sizes and strides are the recipe's) or a constant. Served: 2-D ``x`` on every
kernel the manifest lists (pointer loads, chunk partials with the reduce in the last program, the TMA
kernels, one program per tile and persistent). A recipe is kept only if the parameters C derives for the
recorded call equal, byte for byte for each map, what Triton's launcher passed
(:func:`check_linear_recipe`).

Not served natively (the Python path runs, with its checks and errors): the autograd-tracked call itself
(the kernel call inside autograd's forward is served; validation and autograd bookkeeping stay), tensor
subclasses other than ``nn.Parameter``, a tensor on a device other than the current one, views the
kernel module would copy, empty tensors, non-float ``eps``, the interpreter, a Triton other than 3.6.
Triton's launch hooks (profilers such as Proton) do not see native launches; ``TIK_NATIVE=0`` turns the
path off.

``TIK_NATIVE``: unset or ``auto`` -- on when CUDA is available and the module builds (a build failure
is reported once as a warning); ``1`` -- on, and a build failure is an error; ``0`` -- off.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import subprocess
import sys
import sysconfig
import tempfile
import threading
import types
import warnings

_SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_tik_native.c")
_UNSET = object()
_MOD = _UNSET
_LOCK = threading.Lock()
_REFUSED: dict = {}

# The kernels these plans launch, and the integer arguments each does not specialize
# (``do_not_specialize``); every pointer is specialized on alignment. learn() checks both.


def host_path_table(impl=None) -> dict:
    """What the implementation declares for this path (its manifest's ``native_host_path``): the module
    whose ``launch`` records launches (``records``: ``module:attr`` of the list pushed while recording),
    the split reduce's ticket buffers (``tickets``), and per entry the kernel it launches, the parameters
    it marks ``do_not_specialize`` and the launcher argument that names the compiled variant. An
    implementation without that section gets no native plans (every call stays on the Python path)."""
    from areal_tik_plugin.runtime import loader

    impl = impl or loader.get_implementation()
    return impl.manifest.get("native_host_path") or {}


def _kernel_entry(op: str):
    k = host_path_table().get("kernels", {}).get(op)
    if k is None:
        return None
    return k["kernel"], set(k.get("do_not_specialize", ())), k["config_arg"]


def _attr(spec: str):
    """``module:attr`` of the current implementation (e.g. ``_rowops:_RECORDS``)."""
    from areal_tik_plugin.runtime import loader

    mod, _, attr = spec.partition(":")
    return getattr(loader.current_module(mod), attr)


class NativeBuildError(RuntimeError):
    """The native module could not be built or loaded."""


def _policy() -> str:
    v = os.environ.get("TIK_NATIVE", "auto").strip().lower() or "auto"
    if v not in ("auto", "0", "1"):
        raise ValueError(f"TIK_NATIVE: expected auto, 0 or 1, got {v!r}")
    return v


def cache_dir() -> str:
    base = os.environ.get("TIK_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "areal_tik_plugin")
    return os.path.join(base, "native")


def _include_dirs() -> list[str]:
    import triton

    cuda_inc = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "include")
    if not os.path.isfile(os.path.join(cuda_inc, "cuda.h")):
        raise NativeBuildError(f"cuda.h not found under {cuda_inc} (Triton's CUDA headers)")
    return [sysconfig.get_paths()["include"], cuda_inc]


def build(force: bool = False) -> str:
    """Compile ``_tik_native.c`` (if not cached) and return the shared object's path."""
    with open(_SRC, "rb") as f:
        src = f.read()
    tag = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    h = hashlib.sha256(src + tag.encode() + sys.version.encode()).hexdigest()[:16]
    out_dir = os.path.join(cache_dir(), h)
    out = os.path.join(out_dir, "_tik_native" + tag)
    if os.path.isfile(out) and not force:
        return out
    os.makedirs(out_dir, exist_ok=True)
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    cc = cc.split()[0]
    fd, tmp = tempfile.mkstemp(suffix=tag, dir=out_dir)
    os.close(fd)
    cmd = [cc, "-O2", "-shared", "-fPIC", "-std=c11", "-Wall", "-Werror=implicit-function-declaration",
           *(f"-I{d}" for d in _include_dirs()), _SRC, "-o", tmp, "-ldl"]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as e:
        os.unlink(tmp)
        raise NativeBuildError(f"cannot run the C compiler {cc!r}: {e}") from e
    if r.returncode != 0:
        os.unlink(tmp)
        raise NativeBuildError(f"building {_SRC} failed ({' '.join(cmd)}):\n{r.stderr[-2000:]}")
    os.replace(tmp, out)
    return out


def load_module(path: str | None = None) -> types.ModuleType:
    """Import the built extension (no setup)."""
    path = path or build()
    loader = importlib.machinery.ExtensionFileLoader("_tik_native", path)
    spec = importlib.util.spec_from_file_location("_tik_native", path, loader=loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def _init():
    global _MOD
    with _LOCK:
        if _MOD is not _UNSET:
            return _MOD
        mod = None
        pol = _policy()
        if pol != "0":
            mod = _try_init(pol)
        _MOD = mod
        return mod


def _try_init(pol: str):
    import torch

    from areal_tik_plugin.runtime.interp import interpreter_requested

    if interpreter_requested() or not torch.cuda.is_available():
        if pol == "1" and not torch.cuda.is_available():
            raise NativeBuildError("TIK_NATIVE=1: no CUDA device (the native path launches CUDA kernels)")
        return None
    import triton

    if triton.__version__.split(".")[:2] != ["3", "6"]:
        if pol == "1":
            raise NativeBuildError(f"TIK_NATIVE=1: built for Triton 3.6's kernel ABI, found {triton.__version__}")
        return None
    try:
        mod = load_module()
        mod.setup(torch)
    except Exception as e:
        if pol == "1":
            raise NativeBuildError(f"TIK_NATIVE=1: {e}") from e
        warnings.warn(f"areal_tik_plugin: native host path off ({type(e).__name__}: {e}); eager calls take the "
                      "Python launch path (same kernels, same bits)", RuntimeWarning, stacklevel=3)
        return None
    return mod


def module():
    """The ready native module, or None when the path is off (see the module doc)."""
    m = _MOD
    return _init() if m is _UNSET else m


def invalidate() -> None:
    """Drop every learned plan (a knob or the implementation changed)."""
    m = _MOD
    if m is not _UNSET and m is not None:
        m.invalidate()
    _REFUSED.clear()
    from areal_tik_plugin.runtime.native import launch

    launch.REFUSED_KERNELS.clear()


def stats() -> dict:
    m = module()
    return {"enabled": False} if m is None else {"enabled": True, **m.stats()}


def _reset_for_tests() -> None:
    global _MOD
    from areal_tik_plugin.runtime.native import launch

    invalidate()
    _MOD = _UNSET
    launch.reset()


def recorded(records: list, run):
    """``run()`` with every kernel launch recorded into a list pushed on ``records`` (the implementation's
    recording stack, ``host_path_table()["records"]``): returns (result, [(fn, grid, args, kw, kernel)])."""
    rec: list = []
    records.append(rec)
    try:
        out = run()
    finally:
        records.pop()
    return out, rec


def kernel_params(fn):
    """Triton's ``KernelParam`` list of a ``@triton.jit`` kernel (for an interpreted one, the compiled
    form's: same source, same ``do_not_specialize``)."""
    params = getattr(fn, "params", None)
    if params is None:
        from triton.runtime.jit import JITFunction

        kw = getattr(fn, "kwargs", {})
        params = JITFunction(fn.fn, do_not_specialize=kw.get("do_not_specialize"),
                             do_not_specialize_on_alignment=kw.get("do_not_specialize_on_alignment")).params
    return params


def _param_list(fn, args, kw, kernel):
    """The recorded launch's kernel parameters as Triton passes them: [(type, value)], constexprs left out,
    tensors as data_ptr."""
    import inspect

    import torch

    sig = inspect.signature(fn.fn)
    bound = sig.bind(*args, **{k: v for k, v in kw.items() if k in sig.parameters})
    bound.apply_defaults()
    types_ = kernel.src.signature
    out = []
    for name, val in bound.arguments.items():
        ty = types_[name] if name in types_ else types_[fn.arg_names.index(name)]
        if ty == "constexpr":
            continue
        out.append((ty, val.data_ptr() if isinstance(val, torch.Tensor) else val))
    return out


def learn(m, op: str, inputs: tuple, outputs: tuple, rec: list) -> tuple[bool, str]:
    """Register a plan for this kind of call from its recorded launch, or register the kind as refused
    (see the module doc). Returns (registered, reason)."""
    entry = _kernel_entry(op)
    kname, dns, cfg_name = entry or (None, set(), None)
    why, cfg, grid, params, info = "", 0, (), [], (0, 1, 1, 0, 0, 0, 0, 0, False, None)
    if entry is None:
        why = f"the implementation declares no native kernel for {op!r}"
    elif len(rec) != 1:
        why = f"{len(rec)} launches recorded (expected 1)"
    else:
        fn, grid, args, kw, kernel = rec[0]
        if getattr(fn, "__name__", None) != kname or kernel is None:
            why = f"recorded kernel {getattr(fn, '__name__', fn)!r}, expected {kname}"
        else:
            spec_ok = all((p.do_not_specialize == (p.name in dns)) and not p.do_not_specialize_on_alignment
                          for p in kernel_params(fn) if not p.is_constexpr)
            try:
                params = _param_list(fn, args, kw, kernel)
                md = kernel.metadata
                info = (int(kernel.function), int(md.num_warps), int(getattr(md, "num_ctas", 1)), int(md.shared),
                        int(bool(getattr(md, "launch_pdl", False))),
                        int(bool(getattr(md, "launch_cooperative_grid", False))),
                        int(getattr(md, "global_scratch_size", 0) or 0),
                        int(getattr(md, "profile_scratch_size", 0) or 0), spec_ok, outputs[0].device)
                cfg = int(kw[cfg_name])
            except (AttributeError, KeyError, TypeError, ValueError) as e:
                why = f"cannot read the compiled kernel: {type(e).__name__}: {e}"[:90]
        grid = tuple(grid) if isinstance(grid, (tuple, list)) else ()
    return m.learn(op, inputs, outputs, cfg, grid, params, info, why or None)


R_X, R_W, R_B, R_Y, R_TMP, R_FIXED, R_I32, R_I64, R_F32, R_DESC = range(10)
LIN_MAXP = 32  # LIN_MAXP in _tik_native.c


def _desc_param(v, meta, operands, name):
    """The recipe parameters of a host TMA descriptor argument: ``(R_DESC, spec)`` then its sizes (i32) and
    strides (i64), as Triton's launcher passes them -- or None with why (not a whole operand)."""
    from areal_tik_plugin.runtime.native.launch import _TMA_HOST

    if meta is None or meta.get("fp4_padded"):
        return None, f"parameter {name}: a descriptor lowered without TMA or fp4-padded"
    base = v.base
    hits = [k for k, t in operands if t is not None and t.data_ptr() == base.data_ptr()]
    if len(hits) != 1:
        return None, f"parameter {name}: a descriptor over no operand (or over two)"
    t = dict(operands)[hits[0]]
    shape, strides = [int(s) for s in v.shape], [int(s) for s in v.strides]
    if len(shape) != 2 or shape != list(t.shape) or strides != list(t.stride()) or base.dtype != t.dtype:
        return None, f"parameter {name}: a descriptor that is not its operand's full [rows, cols] extent"
    block = tuple(int(b) for b in meta["block_size"])
    if len(block) != 2:
        return None, f"parameter {name}: a block of rank {len(block)}"
    spec = (hits[0], int(meta["swizzle"]), int(meta["elem_size"]), _TMA_HOST[int(meta["elem_type"])],
            1 if getattr(v, "padding", "zero") == "nan" else 0, block, tuple(shape), tuple(strides))
    return [(R_DESC, spec)] + [(R_I32, s) for s in shape] + [(R_I64, s) for s in strides], ""


def linear_recipe(tickets: dict, x, weight, bias, y, rec, temp_tensors: list | None = None):
    """The recipe of a recorded GEMM launch (see ``_tik_native.c``, linear): (recipe, "") or (None, why).
    Pointer kernels and host-TMA kernels alike: a descriptor parameter becomes the map of its operand,
    encoded per call, and the sizes and strides that follow it, constants of the recipe. The recorded
    launch's temporaries are appended to ``temp_tensors`` (for :func:`check_linear_recipe`)."""
    import inspect

    import torch
    from triton.tools.tensor_descriptor import TensorDescriptor

    from areal_tik_plugin.runtime.native.launch import _gluon_descriptor_type

    # host descriptors of both front ends: the TMA map is encoded from the compiled kernel's tensordesc_meta
    # either way (a Gluon descriptor's layout is what that meta was compiled from)
    host_descs = tuple(t for t in (TensorDescriptor, _gluon_descriptor_type()) if t is not None)
    if len(rec) != 1:
        return None, f"{len(rec)} launches recorded (expected 1)"
    fn, grid, args, kw, kernel = rec[0]
    if getattr(fn, "__name__", None) not in host_path_table().get("linear_kernels", ()) or kernel is None:
        return None, f"kernel {getattr(fn, '__name__', fn)!r} is not served natively (not in the manifest's linear_kernels)"
    md = kernel.metadata
    if (getattr(md, "num_ctas", 1) != 1 or getattr(md, "global_scratch_size", 0) or getattr(md, "profile_scratch_size", 0)
            or getattr(md, "launch_cooperative_grid", False)):
        return None, "kernel needs clusters, scratch memory or a cooperative launch"
    codes = {torch.bfloat16: 0, torch.float16: 1, torch.float32: 2}
    fixed = {t.data_ptr(): key for key, t in tickets.items()}
    operands = ((R_X, x), (R_W, weight), (R_B, bias), (R_Y, y))
    metas = list(getattr(md, "tensordesc_meta", None) or [])
    sig = inspect.signature(fn.fn)
    bound = sig.bind(*args, **{k: v for k, v in kw.items() if k in sig.parameters})
    bound.apply_defaults()
    types_ = kernel.src.signature
    params, temps, stream, ndesc = [], [], 0, 0
    for name, v in bound.arguments.items():
        ty = types_[name]
        if ty == "constexpr":
            continue
        if ty.startswith("tensordesc"):
            if not isinstance(v, host_descs):
                return None, f"parameter {name}: a device-side descriptor"
            got, why = _desc_param(v, metas[ndesc] if ndesc < len(metas) else None, operands, name)
            ndesc += 1
            if got is None:
                return None, why
            params += got
        elif isinstance(v, torch.Tensor):
            p = v.data_ptr()
            hits = [k for k, t in operands if t is not None and t.data_ptr() == p]
            if len(hits) > 1:
                return None, f"parameter {name}: pointer shared by two operands"
            if hits:
                params.append((hits[0], 0))
            elif p in fixed:
                params.append((R_FIXED, p))
                stream = int(fixed[p][1])
            elif v.is_contiguous() and v.dtype in codes and v.dim() <= 3 and len(temps) < 2:
                params.append((R_TMP, len(temps)))
                temps.append((tuple(v.shape), codes[v.dtype]))
                if temp_tensors is not None:
                    temp_tensors.append(v)
            else:
                return None, f"parameter {name}: a tensor that is no operand, temporary or fixed buffer"
        elif isinstance(v, bool) or ty not in ("i32", "i64", "fp32"):
            return None, f"parameter {name}: type {ty}"
        else:
            params.append(({"i32": R_I32, "i64": R_I64, "fp32": R_F32}[ty], v))
    if ndesc > 3:
        return None, f"{ndesc} tensor descriptors (the native path takes at most 3)"
    if len(params) > LIN_MAXP:
        return None, f"{len(params)} kernel parameters (the native path takes at most {LIN_MAXP})"
    g = tuple(grid) + (1,) * (3 - len(grid))
    return (g, params, temps, stream, int(kernel.function), int(md.num_warps), int(md.shared),
            bool(getattr(md, "launch_pdl", False)), y.device), ""


def check_linear_recipe(m, x, weight, bias, y, rec, temps=()) -> str:
    """'' when the parameters the registered recipe derives for the recorded call (its output and
    temporaries) are, one by one and byte for byte for each TMA map, those Triton's launcher passed;
    else why not."""
    from areal_tik_plugin.runtime.native import launch as NL

    fn, grid, args, kw, kernel = rec[0]
    try:
        arg_params, values, _ = NL.layout(fn, args, kw)
        theirs = NL.expected(m, arg_params, values, kernel)
    except (AttributeError, KeyError, TypeError, ValueError, RuntimeError) as e:
        return f"cannot read Triton's parameters: {type(e).__name__}: {e}"[:90]
    ours = m.linear_derive(x, weight, bias, y, tuple(temps), True)
    if ours is None:
        return "no recipe registered"
    if ours != theirs:
        bad = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
        return f"derived parameter {bad} differs from Triton's"
    return ""


def _learn_call(m, entry: str, args: tuple, run):
    """Run the Python path (``run()``) with its launch recorded and register a plan for this kind of call
    (a recipe for ``linear``, checked against the parameters Triton passed), or register the kind as
    refused; returns run()'s result unchanged."""
    table = host_path_table()
    out, rec = recorded(_attr(table["records"]), run)
    if entry == "linear":
        temps = []
        recipe, why = linear_recipe(_attr(table["tickets"]) if "tickets" in table else {}, *args, out, rec, temps)
        ok = recipe is not None and bool(m.learn_linear(*args, recipe, None))
        if ok:
            why = check_linear_recipe(m, *args, out, rec, temps)
            ok = not why
        if recipe is None or why:
            m.learn_linear(*args, None, why)
    else:
        ok, why = learn(m, entry, args, out if isinstance(out, tuple) else (out,), rec)
    if not ok:
        _REFUSED[(entry, why)] = _REFUSED.get((entry, why), 0) + 1
    return out


def served(entry: str, *args):
    """The native path's result for ``entry(*args)`` (``rmsnorm``, ``swiglu``, ``swiglu_fused``,
    ``linear``), or None: the path is off, has no plan for this kind of call yet, or leaves it to Python.
    For the public entry points, before their Python checks."""
    m = module()
    if m is None:
        return None
    r = getattr(m, entry)(*args)
    return None if r is None or r is False else r


def forward(entry: str, args: tuple, run):
    """The kernel module's forward for ``args`` (checked inputs): through the native path when it has a
    plan, else ``run()`` (Triton's launch), with the launch learned when the kind has no plan yet."""
    m = module()
    if m is not None:
        r = getattr(m, entry)(*args)
        if r is False:
            return _learn_call(m, entry, args, run)
        if r is not None:
            return r
    return run()


def _register() -> None:
    from areal_tik_plugin.runtime import loader
    from areal_tik_plugin.runtime.native import launch

    loader.on_change(invalidate)
    loader.on_launch_helper(launch.install)


_register()
