"""areal-tik-plugin: unified bitwise rollout/training kernels for AReaL.

``import areal_tik_plugin`` is light: no GPU, SGLang, AReaL or Megatron is needed. Kernels are
loaded on first use of an op (see :mod:`areal_tik_plugin.runtime.loader`).
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
