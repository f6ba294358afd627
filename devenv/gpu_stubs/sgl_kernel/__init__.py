"""Import-only stand-in for ``sgl_kernel`` (SGLang's CUDA kernel wheel, not carried to the GPU box).

SGLang on CUDA imports sgl_kernel functions at module import time even when a backend never calls
them. With ``--attention-backend tik`` every hot op runs through areal_tik_plugin.ops; anything that
still reaches sgl_kernel raises here, naming the function (a finding, never a silent fallback).
The submodules in ``SUBMODULES`` are created on import by the finder below; the list was found by
importing SGLang's CUDA code paths with a faked CUDA device on the CPU machine.
"""

import importlib.abc
import importlib.machinery
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
