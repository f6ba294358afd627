"""Compile the row-wise op kernels (rmsnorm, rope, swiglu, kv_write, logprob) for sm_90 on the CPU.

The interpreter runs the INTERP=True code paths; this compiles the GPU ones (ptxas ships in the
triton wheel) and checks statically that every RMSNorm / log-prob reduction has the same layout for
any row count, stride and the fused residual (see scripts/compile_rowops_sm90.py).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "compile_rowops_sm90.py")


def _ptxas_available() -> bool:
    try:
        import triton

        return os.path.exists(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas"))
    except Exception:
        return False


@pytest.mark.skipif(not _ptxas_available(), reason="triton's bundled ptxas not found")
def test_rowops_compile_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, SCRIPT, "--quick"], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert "0 failures" in r.stdout
