"""Running Triton kernels on the CPU through Triton's interpreter (``TRITON_INTERPRET=1``).

Used only when no CUDA device is present (tests, CI, the CPU SGLang/AReaL runs). The same kernel
sources run; only the executor differs. These fixes to the interpreter are applied here (the same on Triton 3.5.x and 3.6.x):

* ``tl.dot`` on bf16 operands: the interpreter stores bf16 as raw ``uint16`` and multiplies the raw
  integers (Triton 3.5 and 3.6). We convert bf16/fp16 operands to exact float64 values first.
* fp32 -> bf16 casts round to nearest even (the interpreter truncates; the GPU rounds).
* ``int()`` of run-time scalars (loop bounds): made to work with numpy >= 2.3.
* Import order: Triton decides between interpreter and compiled code when a ``@triton.jit`` function is
  defined, and its own helpers (``tl.cdiv``, ``tl.sigmoid``, ``tl.max``...) are defined at
  ``import triton``. When triton is imported before the interpreter is switched on (a user's
  ``import triton`` first, or torch importing it for meta-tensor arithmetic), those helpers are
  compiled-mode ``JITFunction`` objects whose ``__call__`` raises "Cannot call @triton.jit'd outside of
  the scope of a kernel" when an interpreted kernel calls them. While interpreting, such a call runs the
  helper as the interpreter runs its own device functions (the same Python function, patched
  ``tl``), so the order of imports does not matter. The helper objects stay the same (the interpreter's
  reductions recognise ``tl.standard._sum_combine`` etc. by identity).
* Row invariance of ``tl.dot`` on the CPU: numpy's float32 matmul may block differently for
  different M. bf16/fp16 products are exact in float64 and a sum of up to a few hundred of them is
  exact there too, so computing in float64 and rounding once to float32 gives the correctly rounded
  dot whatever the tile shape — the CPU analogue of the GPU's shape-independent ``tl.dot``.
"""

from __future__ import annotations

import os

_PATCHED = False


def interpreter_requested() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def ensure_interpreter_if_no_gpu() -> bool:
    """Turn on Triton's interpreter when no CUDA GPU is visible. Returns True when interpreting.

    Must run before any ``@triton.jit`` function is defined (the loader calls it before it imports
    an implementation).
    """
    import torch

    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"
    if interpreter_requested():
        _patch_interpreter_dot()
        return True
    return False


def _patch_interpreter_dot() -> None:
    global _PATCHED
    if _PATCHED:
        return
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter as _itp

    builder_cls = None
    for name in ("InterpreterBuilder", "Builder"):
        builder_cls = getattr(_itp, name, None)
        if builder_cls is not None and hasattr(builder_cls, "create_dot"):
            break
    if builder_cls is None:  # pragma: no cover - depends on the Triton version
        raise RuntimeError("areal_tik_plugin: cannot find Triton's interpreter builder to patch tl.dot")

    def _to_f64(data, dtype):
        if dtype == tl.bfloat16:
            u = data.astype(np.uint32) << 16
            return u.view(np.float32).astype(np.float64)
        return data.astype(np.float64)

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):  # noqa: ARG001
        a64 = _to_f64(a.data, a.dtype.scalar if hasattr(a.dtype, "scalar") else a.dtype)
        b64 = _to_f64(b.data, b.dtype.scalar if hasattr(b.dtype, "scalar") else b.dtype)
        out = np.matmul(a64, b64).astype(d.data.dtype) + d.data
        return _itp.TensorHandle(out, d.dtype.scalar)

    builder_cls.create_dot = create_dot

    # Scalars derived from tl.program_id are 1-element arrays in the interpreter; numpy >= 2.3
    # refuses int() on them, which breaks `range(0, n)` with a run-time n. Index through .item().
    # Triton 3.6 patches through a scope that undoes the patch after the kernel
    # (``_patch_lang_tensor(tensor, scope)``); Triton 3.5 sets the attributes for good
    # (``_patch_lang_tensor(tensor)``). Follow whichever signature the installed Triton calls.
    orig_patch_tensor = _itp._patch_lang_tensor

    def _index(self):
        return int(np.asarray(self.handle.data).reshape(-1)[0])

    def _patch_lang_tensor(tensor, scope=None):
        if scope is None:
            orig_patch_tensor(tensor)
            tensor.__index__ = _index
        else:
            orig_patch_tensor(tensor, scope)
            scope.set_attr(tensor, "__index__", _index)

    _itp._patch_lang_tensor = _patch_lang_tensor

    # fp32 -> bf16 casts: Triton 3.6's interpreter truncates; the GPU rounds to nearest even.
    orig_cast = builder_cls.cast_impl

    def cast_impl(self, src, dst_type):
        if dst_type.scalar == tl.bfloat16 and src.dtype.scalar in (tl.float32, tl.float16, tl.float64):
            import torch

            f32 = torch.from_numpy(np.ascontiguousarray(src.data, dtype=np.float32))
            data = f32.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
            return _itp.TensorHandle(data, dst_type.scalar)
        return orig_cast(self, src, dst_type)

    builder_cls.cast_impl = cast_impl
    _patch_jit_call()
    _PATCHED = True


def _patch_jit_call() -> None:
    """A compiled-mode ``JITFunction`` called while interpreting runs as an interpreted device function
    (see the module doc: import order); outside the interpreter its call still raises Triton's error."""
    from triton.runtime import interpreter as _itp
    from triton.runtime.jit import JITFunction

    if getattr(JITFunction.__call__, "_tik_interpreted", False):
        return
    orig_call = JITFunction.__call__

    def __call__(self, *args, **kwargs):
        if not interpreter_requested():
            return orig_call(self, *args, **kwargs)
        f = self.__dict__.get("_tik_interpreted_fn")
        if f is None:
            f = self.__dict__["_tik_interpreted_fn"] = _itp.InterpretedFunction(self.fn)
        return f(*args, **kwargs)

    __call__._tik_interpreted = True
    JITFunction.__call__ = __call__
