"""Test-session setup shared by every test module.

Triton decides between its interpreter and compiled kernels when a ``@triton.jit`` function is
defined, including Triton's own ``tl.cdiv`` etc. at ``import triton``. Some test modules import
triton at collection time, so the interpreter must be switched on (no GPU) before any of them is
collected; otherwise an interpreted kernel that calls ``tl.cdiv`` fails depending on test order.
"""

from areal_tik_plugin.runtime.interp import ensure_interpreter_if_no_gpu

ensure_interpreter_if_no_gpu()


import pytest  # noqa: E402


@pytest.fixture
def private_tik_v1(tmp_path):
    """A rehashed private copy of kernels/tik_v1 (so concurrent edits elsewhere cannot interfere)."""
    import shutil

    from areal_tik_plugin.runtime import loader

    root = str(tmp_path / "tik_v1")
    shutil.copytree(loader.resolve_path("tik_v1"), root, ignore=shutil.ignore_patterns("__pycache__"))
    loader.write_manifest_hash(root)
    return root


@pytest.fixture
def knob_run_on_tik_v1(tmp_path, private_tik_v1):
    """Run the knobs driver on ``private_tik_v1`` for a spec and a step count; returns the opened run."""
    import os

    from areal_tik_plugin.cli import main
    from areal_tik_plugin.search.state import Run

    def run(spec: str, max_steps: int):
        d = os.path.join(str(tmp_path), "run")
        assert main(["search", "run", "--driver", "knobs", "--spec", spec, "--impl", private_tik_v1,
                     "--run-dir", d, "--max-steps", str(max_steps), "--no-progress"]) == 0
        return Run.open(d, lock=False)

    return run
