"""Compile the row-wise op kernels (rmsnorm, rope, swiglu, kv_write, logprob) for sm_90 on the CPU.

The interpreter runs the INTERP=True code paths; this compiles the GPU ones (ptxas ships in the
triton wheel) and checks statically that every RMSNorm / log-prob reduction has the same layout for
any row count, stride and the fused residual (see benchmarks/compile_rowops_sm90.py).
"""

from __future__ import annotations

import pytest

from tests.helpers.scripts import ptxas_available, run_script


@pytest.mark.skipif(not ptxas_available(), reason="triton's bundled ptxas not found")
def test_rowops_compile_for_sm90():
    r = run_script("compile_rowops_sm90", "--quick")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert "0 failures" in r.stdout
