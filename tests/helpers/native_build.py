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
