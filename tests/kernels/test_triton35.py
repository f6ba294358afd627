"""The op tests under Triton 3.5.1's interpreter (torch 2.9.1, AReaL 1.0.4's torch with SGLang
0.5.10.post1, pins triton==3.5.1): tests/ops/test_memo.py run in the venv ``TIK_TRITON35_VENV`` names
(made by ``.ci/install_triton35.sh``; .ci/run exports it), from this checkout. The wider op suite and the
sm_90 compile scripts were run on 3.5.1 by hand (install matrix)."""

from __future__ import annotations

import os
import pathlib
import subprocess

import pytest

VENV = os.environ.get("TIK_TRITON35_VENV")
ROOT = pathlib.Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(not VENV, reason="TIK_TRITON35_VENV unset (bash .ci/install_triton35.sh)")


def test_op_tests_pass_on_triton_3_5():
    py = os.path.join(VENV, "bin", "python")
    ver = subprocess.run([py, "-c", "import triton; print(triton.__version__)"], capture_output=True, text=True,
                         timeout=120)
    assert ver.returncode == 0 and ver.stdout.strip().startswith("3.5."), ver.stdout + ver.stderr
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([py, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "tests/ops/test_memo.py"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0 and " passed" in r.stdout and "skipped" not in r.stdout, (r.stdout + r.stderr)[-4000:]
