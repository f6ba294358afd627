"""`python -m benchmarks.host_overhead --stub-launch`: the host-path timer runs on CPU."""

from __future__ import annotations

import json
import subprocess
import sys


def test_stub_launch_measures_host_path(tmp_path):
    # a subprocess: the stub replaces Triton's launch for the whole process
    r = subprocess.run([sys.executable, "-m", "benchmarks.host_overhead", "--stub-launch",
                        "--train-forward", "--out", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    rec = json.loads((tmp_path / "host_overhead_stub.json").read_text())
    assert rec["stub_launch"] and rec["tokens"] == 4 and rec["model"] == "qwen3-4b"
    assert 0 < rec["host_us_per_layer"] < 1e6
    assert 0 < rec["train_forward_host_us_per_layer"] < 1e6
    assert "us host Python per layer" in r.stdout
