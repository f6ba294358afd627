"""Compile the decode-sized split GEMM (the partial kernel, every configuration) for sm_90 on the CPU:
no compile error, shared memory within the limit, and the C7515 report (serialized wgmma) present in the
output; once the fixed trip count (SPLIT_PARTIAL_FIXED_TRIPS) is on, a serialized variant fails the script."""

from __future__ import annotations

import pytest

from tests.helpers.scripts import ptxas_available, run_script


@pytest.mark.skipif(not ptxas_available(), reason="triton's bundled ptxas not found")
def test_split_partial_kernel_compiles_for_sm90():
    r = run_script("compile_gemm_moe_sm90", "--only", "linear_partial/bf16", timeout=900)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith(("ok ", "FAIL"))]
    assert len(lines) >= 40 and all("linear_partial/bf16/" in ln for ln in lines)  # the filter took effect
    assert "variant(s) with serialized wgmma (ptxas C7515)" in r.stdout and "0 failure(s)" in r.stdout
