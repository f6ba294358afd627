"""The native host path's extension module for the CPU tests (tests/runtime): built into a fresh cache."""

from __future__ import annotations

import os

import pytest

from areal_tik_plugin import versions
from areal_tik_plugin.runtime import native

# The derivations are checked against Triton 3.6's own binder (native_specialize_impl) and serve 3.6's
# compiled-kernel ABI; on another Triton the native path is off (native.module() returns None) and the
# ops take Triton's launch path, which the op tests cover.
needs_triton36 = pytest.mark.skipif(not versions.fast_host_path(),
                                    reason="the native host path is built for Triton 3.6's kernel ABI")


def build_native(tmp_path_factory):
    """``_tik_native`` built under a temporary ``TIK_CACHE_DIR`` and imported (no setup)."""
    old = os.environ.get("TIK_CACHE_DIR")
    os.environ["TIK_CACHE_DIR"] = str(tmp_path_factory.mktemp("native-cache"))
    try:
        return native.load_module(native.build())
    finally:
        if old is None:
            os.environ.pop("TIK_CACHE_DIR", None)
        else:
            os.environ["TIK_CACHE_DIR"] = old


def launcher_params(args) -> list:
    """What Triton's launcher passes for these positional kernel arguments, as the C side's linear_derive lists
    them without encoding the maps: a host descriptor as (GP_DESC, None) then its sizes (i32) and strides (i64),
    a tensor as its pointer, every other argument an i32."""
    import torch

    from areal_tik_plugin.runtime.native import launch as NL

    out = []
    for a in args:
        if hasattr(a, "block_shape"):
            out += [(NL.GP_DESC, None)] + [(NL.GP_I32, s) for s in a.shape] + [(NL.GP_I64, s) for s in a.strides]
        elif isinstance(a, torch.Tensor):
            out.append((NL.GP_PTR, a.data_ptr()))
        else:
            out.append((NL.GP_I32, a))
    return out
