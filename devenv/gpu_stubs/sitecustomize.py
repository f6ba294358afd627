"""Environment shim for the carried GPU environment (SGLang without its CUDA dependency wheels).

SGLang 0.5.23 builds a ``DualGemm`` for every Qwen2/Qwen3 MLP and, on CUDA, imports its CuTe-DSL
kernel module (``import cutlass``) before checking the GPU; the kernel itself only runs on SM100
(``can_use_dual_gemm`` requires ``is_sm100_supported()``). Where the CUTLASS DSL is not installed,
this shim makes ``DualGemm._select_mode`` return None on GPUs below SM100 -- what SGLang itself
decides there with the DSL installed -- and leaves it alone everywhere else (an SM100 machine
without the DSL still fails loudly). The ``tik`` backend turns DualGemm off by its own hook
(``sglang_layers.dual_gemm_select_hook``); this shim is for the stock baselines started with
``SGLANG_PLUGINS=none``. On PYTHONPATH only through ``sglang_check.gpu_stub_path()``.
"""

import importlib.abc
import importlib.machinery
import importlib.util
import sys

_TARGET = "sglang.srt.layers.dual_gemm"


def _patch(module):
    cls = getattr(module, "DualGemm", None)
    if cls is None or importlib.util.find_spec("cutlass") is not None:
        return
    original = cls._select_mode

    def _select_mode(self, *args, **kwargs):
        import torch

        if torch.cuda.is_available() and torch.cuda.get_device_capability()[0] < 10:
            return None
        return original(self, *args, **kwargs)

    cls._select_mode = _select_mode


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname != _TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        exec_module = loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            _patch(module)

        loader.exec_module = exec_and_patch
        return spec


sys.meta_path.insert(0, _Finder())
