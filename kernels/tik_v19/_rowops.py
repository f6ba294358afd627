"""Launch helpers shared by the row-wise ops (rmsnorm, rope, swiglu, kv_write, logprob).

Row reductions (RMSNorm's sum of squares, log-prob's max / sum-exp) are summed by ``tl.sum`` in an
order fixed by the register layout of the tile, and Triton picks that layout from the tile shape,
``num_warps`` *and* what it knows about the alignment of the pointers (16-byte specialization of
pointer arguments, divisibility-by-16 specialization of integer arguments). Two calls that differ
only in a row stride or in the alignment of a view could therefore compile to two variants that sum
a row in different orders. These helpers make the compiled variant a function of the op's fixed
sizes (hidden size / vocab) and dtype only:

* integer arguments that vary between calls (row counts, strides) are ``do_not_specialize`` in the
  kernels; strides are passed in units of ``VEC`` elements (``stride // VEC``) and multiplied back
  by the constexpr ``VEC`` inside the kernel, so the compiler still knows they are multiples of VEC;
* every tensor handed to a reduction kernel starts at a 16-byte aligned address and has strides that
  are multiples of ``VEC`` (:func:`canonical`), copying the (rare) view that does not.

:func:`to_act` is the one place where an fp32 value is rounded to the activation dtype. On the GPU it
is the plain conversion (round to nearest even). Triton 3.6's *interpreter* truncates fp32 -> bf16
(``_convert_float`` with no rounding mode), so under the interpreter the value is rounded to nearest
even by integer arithmetic first and the low bits cleared, which makes the following conversion exact
whatever rounding the interpreter uses.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


# Triton picks the interpreter when a @triton.jit function is defined, i.e. when this implementation
# is imported (the loader sets TRITON_INTERPRET first on a machine without a GPU): read it once.
_INTERPRETING = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def interpreting() -> bool:
    return _INTERPRETING


# Host-side integer helpers. triton.cdiv / triton.next_power_of_2 are constexpr_functions in
# Triton 3.6 and cost ~6 us per host call (argument unwrapping); launchers call these instead.
def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


_TICKETS: dict = {}
_TICKETS_KEPT: list = []  # replaced buffers stay allocated: a captured CUDA graph may still use them


def tickets(device: torch.device, n: int) -> torch.Tensor:
    """Zeroed int32 tickets (atomic counters) for ``n`` tiles, one buffer per (device, stream), shared
    by every kernel that elects a last program with a ticket (the GEMM split reduce, the decode split
    merge): each kernel resets the tickets it used before it ends, so the buffer is zero again for the
    next launch on that stream (stream order) and for CUDA-graph replay; two streams never share one.
    65536 tickets cover N <= 1M at BLOCK_N 16, or 65536 (request, kv head) pairs."""
    if device.type != "cuda":
        return torch.zeros(n, dtype=torch.int32, device=device)
    key = (device.index, torch.cuda.current_stream(device).cuda_stream)
    buf = _TICKETS.get(key)
    if buf is None or buf.numel() < n:
        if buf is not None:
            _TICKETS_KEPT.append(buf)
        buf = torch.zeros(max(n, 65536), dtype=torch.int32, device=device)
        _TICKETS[key] = buf
    return buf


# Programmatic dependent launch (free knob; sm_90+): every kernel of this implementation is launched
# with launch_pdl and starts with pdl_start(PDL), which waits for the previous kernel on the stream to
# finish (griddepcontrol.wait: all its memory operations visible) before its first load or store, then
# lets the next kernel's programs be scheduled. So a kernel's launch and scheduling overlap the tail of
# the one before it (decode steps are chains of ~20 short kernels, replayed as CUDA graphs); no
# instruction that touches memory runs earlier, so no value and no bit changes.
PDL = True
_PDL_DEVICES: dict = {}


def pdl_opts() -> dict:
    """``PDL`` constexpr + ``launch_pdl`` for a launch on the current CUDA device (sm_90 or newer)."""
    if not PDL or interpreting():
        return {}
    try:
        idx = torch.cuda.current_device()
    except (AssertionError, RuntimeError):  # no CUDA (the sm_90 compile checks on a CPU box)
        idx = -1
    ok = _PDL_DEVICES.get(idx)
    if ok is None:
        ok = _PDL_DEVICES[idx] = idx >= 0 and torch.cuda.get_device_capability(idx)[0] >= 9
    return {"PDL": True, "launch_pdl": True} if ok else {}


@triton.jit
def pdl_start(PDL: tl.constexpr):
    """First statement of every kernel (see ``PDL``)."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


# Host launch path (free knob: the same compiled kernel gets the same arguments; no value can change).
# Triton 3.6's ``jit_fn[grid](...)`` costs ~25 us of host time per launch on the H200 machine, against
# 3.7 us for its argument binder and 5.2 us for the compiled kernel's launcher (H200 probe of
# the host launch breakdown): eager prefill and the training forward issue ~15 launches
# per layer and wait on the host. With FAST_LAUNCH, :func:`launch` binds the arguments with Triton's own
# binder, finds the kernel under Triton's own cache key (so the very variant ``run`` would pick) and calls
# its launcher. Anything else -- a cache miss (first call: Triton compiles), an asynchronous compile, a
# launch hook (profilers), a pre-run hook, a changed global the kernel read, another Triton version, the
# interpreter -- goes through ``jit_fn[grid](...)`` unchanged.
FAST_LAUNCH = True
try:
    from triton import knobs
    from triton.runtime.driver import driver
    from triton.runtime.jit import compute_cache_key

    _FAST_TRITON = triton.__version__.split(".")[:2] == ["3", "6"]
except ImportError:  # another Triton: its own launch path only
    _FAST_TRITON = False
_MISSING = object()


def _globals_unchanged(fn) -> bool:
    for (name, _), (val, globals_dict) in fn.used_global_vals.items():
        if globals_dict.get(name, _MISSING) != val:
            return False
    return True


def _hooked(hook) -> bool:
    """A launch hook is set (Triton 3.6 keeps an empty HookChain when none is)."""
    return hook is not None and bool(getattr(hook, "calls", True))


# Launch records for the package's native host path (areal_tik_plugin.runtime.native): while a list is pushed
# here, every launch appends (fn, grid, args, kw, compiled kernel) to the last one; the native side
# registers a plan only if it derives the same launch from the same inputs. Mutated, never reassigned.
_RECORDS: list = []


def launch(fn, grid, *args, **kw):
    """``fn[grid](*args, **kw)`` (a ``@triton.jit`` kernel), through the short host path on a cache hit
    (``FAST_LAUNCH``). Returns what Triton's launch returns (the compiled kernel)."""
    k = _launch(fn, grid, *args, **kw)
    if _RECORDS:
        _RECORDS[-1].append((fn, grid, args, kw, k))
    return k


def _launch(fn, grid, *args, **kw):
    if _INTERPRETING or not (FAST_LAUNCH and _FAST_TRITON):
        return fn[grid](*args, **kw)
    runtime = knobs.runtime
    if _hooked(runtime.launch_enter_hook) or _hooked(runtime.launch_exit_hook) or fn.pre_run_hooks:
        return fn[grid](*args, **kw)
    kw["debug"] = kw.get("debug", fn.debug) or runtime.debug  # as JITFunction.run: part of the cache key
    kw["instrumentation_mode"] = knobs.compilation.instrumentation_mode
    device = driver.active.get_current_device()
    kernel_cache, key_cache, _, _, binder = fn.device_caches[device]
    bound, specialization, options = binder(*args, **kw)
    kernel = kernel_cache.get(compute_cache_key(key_cache, specialization, options))
    if kernel is None or hasattr(kernel, "result") or not _globals_unchanged(fn):
        return fn.run(*args, grid=grid, warmup=False, **kw)
    n = len(grid)
    kernel.run(grid[0], grid[1] if n > 1 else 1, grid[2] if n > 2 else 1, driver.active.get_current_stream(device),
               kernel.function, kernel.packed_metadata, None, None, None, *bound.values())  # no hooks: no metadata
    return kernel


def launch_opts(num_warps: int, num_stages: int = 1) -> dict:
    """Launch keywords: fixed warps, FP contraction off (a*b+c never fused differently), PDL."""
    if interpreting():
        return {}
    return {"num_warps": num_warps, "num_stages": num_stages, "enable_fp_fusion": False, **pdl_opts()}


def vec_for(n: int, elem_size: int) -> int:
    """Largest power of two <= 16 bytes / elem_size that divides ``n`` (elements per vector load)."""
    v = max(1, 16 // elem_size)
    while v > 1 and n % v:
        v //= 2
    return v


def aligned(t: torch.Tensor, vec: int, strides) -> bool:
    return t.data_ptr() % 16 == 0 and all(s % vec == 0 for s in strides)


def fresh_copy(t: torch.Tensor) -> torch.Tensor:
    """A contiguous copy in a new (16-byte aligned) allocation, even if ``t`` is contiguous."""
    out = torch.empty(t.shape, dtype=t.dtype, device=t.device)
    out.copy_(t)
    return out


def row_layout(x: torch.Tensor):
    """Describe the rows of ``x`` [..., H] (last dim stride 1) as ``(M, NH, st, sh)``: row ``r`` starts
    at element ``(r // NH) * st + (r % NH) * sh``. Returns None when the leading dims cannot be
    folded into two levels."""
    dims = [(n, s) for n, s in zip(x.shape[:-1], x.stride()[:-1]) if n != 1]
    merged: list[list[int]] = []
    for n, s in dims:
        if merged and merged[-1][1] == s * n:
            merged[-1] = [merged[-1][0] * n, s]
        else:
            merged.append([n, s])
    m = 1
    for n in x.shape[:-1]:
        m *= n
    if not merged:
        return m, 1, 0, 0
    if len(merged) == 1:
        return m, 1, merged[0][1], 0
    if len(merged) == 2:
        return m, merged[1][0], merged[0][1], merged[1][1]
    return None


def canonical(x: torch.Tensor, vec: int):
    """``(x_used, M, NH, st, sh)`` with ``x_used`` 16-byte aligned and st, sh multiples of ``vec``."""
    lay = row_layout(x) if x.stride(-1) == 1 else None
    if lay is None or not aligned(x, vec, lay[2:]):
        x = fresh_copy(x)
        lay = row_layout(x)
    return (x,) + tuple(lay)


@triton.jit
def to_act(x, dtype: tl.constexpr, INTERP: tl.constexpr):
    """Round fp32 ``x`` to ``dtype`` to nearest even (GPU: one cvt; interpreter: see module doc)."""
    if INTERP:
        if dtype == tl.bfloat16:
            u = x.to(tl.uint32, bitcast=True)
            u = (u + (0x7FFF + ((u >> 16) & 1))) & 0xFFFF0000
            x = tl.where(x != x, x, u.to(tl.float32, bitcast=True))
    return x.to(dtype)
