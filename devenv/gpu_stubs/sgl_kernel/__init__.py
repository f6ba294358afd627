"""Import-only stand-in for ``sgl_kernel`` (SGLang's CUDA kernel wheel, not carried to the GPU box);
with ``TIK_SGL_KERNEL_SHIM=flashinfer`` the fused ops SGLang calls are served by FlashInfer (below).

SGLang on CUDA imports sgl_kernel functions at module import time even when a backend never calls
them. With ``--attention-backend tik`` every hot op runs through areal_tik_plugin.ops; anything that
still reaches sgl_kernel raises here, naming the function (a finding, never a silent fallback).
The submodules in ``SUBMODULES`` are created on import by the finder below; the list was found by
importing SGLang's CUDA code paths with a faked CUDA device on the CPU machine.
"""

import importlib
import importlib.abc
import importlib.machinery
import os
import sys
import types

__version__ = "0.4.10"  # what sglang 0.5.23 pins; with SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1 unused


# Submodules SGLang imports without an ImportError fallback; every other ``sgl_kernel.<sub>`` is absent
# (ImportError), so SGLang's own ``try: from sgl_kernel.x import ... except ImportError`` paths run.
SUBMODULES: set = {'sgl_kernel.kvcacheio', 'sgl_kernel.quantization', 'sgl_kernel.utils'}


def _missing(qualname):
    def fn(*args, **kwargs):
        raise RuntimeError(f"sgl_kernel stub: {qualname} was called; the tik plugin does not cover this path")

    fn.__name__ = qualname.rsplit(".", 1)[-1]
    fn.__qualname__ = qualname
    return fn


def _module_getattr(modname):
    def __getattr__(name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _missing(f"{modname}.{name}")

    return __getattr__


# Two non-kernel helpers SGLang's CUDA graph runner and Triton backend call on every CUDA run. Their
# stand-ins change no value: ``weak_ref_tensor`` returns the tensor itself (the graph runner then
# holds a strong reference to its output buffers: more memory kept, same data); PDL (programmatic
# dependent launch, a launch-overlap feature) is reported unsupported, so SGLang launches without it.
def weak_ref_tensor(t):
    return t


def _is_arch_support_pdl() -> bool:
    return False


_IMPLEMENTED = {"sgl_kernel.utils": {"is_arch_support_pdl": _is_arch_support_pdl}}

# ``TIK_SGL_KERNEL_SHIM=flashinfer``: the sgl_kernel functions SGLang calls for a Qwen3 dense / MoE model
# on its stock path, served by FlashInfer's kernels of the same name and signature (sgl-kernel's
# norm / activation / RoPE / sampling kernels are FlashInfer's; the wheel cannot be carried). Anything
# not in this table still raises, naming the function. Calls are counted in ``CALLS`` (per name).
FLASHINFER_MAP = {
    "rmsnorm": ("flashinfer.norm", "rmsnorm"),
    "fused_add_rmsnorm": ("flashinfer.norm", "fused_add_rmsnorm"),
    "gemma_rmsnorm": ("flashinfer.norm", "gemma_rmsnorm"),
    "gemma_fused_add_rmsnorm": ("flashinfer.norm", "gemma_fused_add_rmsnorm"),
    "silu_and_mul": ("flashinfer.activation", "silu_and_mul"),
    "gelu_and_mul": ("flashinfer.activation", "gelu_and_mul"),
    "gelu_tanh_and_mul": ("flashinfer.activation", "gelu_tanh_and_mul"),
    "apply_rope_with_cos_sin_cache_inplace": ("flashinfer.rope", "apply_rope_with_cos_sin_cache_inplace"),
    "top_k_renorm_prob": ("flashinfer.sampling", "top_k_renorm_probs"),
    "top_p_renorm_prob": ("flashinfer.sampling", "top_p_renorm_probs"),
    "top_k_top_p_sampling_from_probs": ("flashinfer.sampling", "top_k_top_p_sampling_from_probs"),
    "min_p_sampling_from_probs": ("flashinfer.sampling", "min_p_sampling_from_probs"),
}
CALLS: dict = {}
# read from the environment: this module is imported in SGLang's scheduler processes, which inherit the
# environment but not a command line of ours
MODE = os.environ.get("TIK_SGL_KERNEL_SHIM", "raise")
if MODE not in ("raise", "flashinfer"):
    raise ValueError(f"TIK_SGL_KERNEL_SHIM: expected 'raise' or 'flashinfer', got {MODE!r}")


def _flashinfer_fn(name):
    modname, attr = FLASHINFER_MAP[name]
    target = []

    def fn(*args, **kwargs):
        if not target:  # resolved at the first call: importing sgl_kernel must not import flashinfer
            target.append(getattr(importlib.import_module(modname), attr))
        CALLS[name] = CALLS.get(name, 0) + 1
        return target[0](*args, **kwargs)

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"sgl_kernel.{name} served by {modname}.{attr} (TIK_SGL_KERNEL_SHIM=flashinfer)"
    return fn


if MODE == "flashinfer":
    for _n in FLASHINFER_MAP:
        globals()[_n] = _flashinfer_fn(_n)


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith("sgl_kernel.") and fullname in SUBMODULES:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        m = types.ModuleType(spec.name)
        m.__path__ = []
        m.__getattr__ = _module_getattr(spec.name)
        for k, v in _IMPLEMENTED.get(spec.name, {}).items():
            setattr(m, k, v)
        return m

    def exec_module(self, module):
        return None


if not any(isinstance(f, _Finder) for f in sys.meta_path):
    sys.meta_path.insert(0, _Finder())

__getattr__ = _module_getattr("sgl_kernel")
