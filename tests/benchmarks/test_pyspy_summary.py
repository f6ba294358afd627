"""benchmarks/probes/pyspy_summary.py on py-spy's raw (collapsed) format with --subprocesses: the owner of a stack is
its last ``process`` frame, samples are attributed to packages by file path, and an unreadable file is a
clear error (exit 2)."""

from __future__ import annotations

from tests.helpers.scripts import load_script


def _mod():
    return load_script("pyspy_summary")


RAW = """process 10:"python -m proof";process 11:"python -m sched";event_loop (/x/site-packages/sglang/srt/managers/scheduler.py:900);forward (/work/main/areal_tik_plugin/ops/attention.py:50);launch (/work/main/kernels/tik_v1/_rowops.py:150) 30
process 10:"python -m proof";process 11:"python -m sched";event_loop (/x/site-packages/sglang/srt/managers/scheduler.py:900);replay (/x/site-packages/torch/cuda/graphs.py:80) 60
process 10:"python -m proof";process 11:"python -m sched";recv (/x/site-packages/zmq/sugar/socket.py:7) 10
process 10:"python -m proof";<module> (proof.py:3);wait (/usr/lib/python3.12/subprocess.py:1) 5
process 10:"python -m proof" 1
garbage line
"""


def test_summary_per_process_and_package(tmp_path):
    m = _mod()
    res = m.summarize(RAW.splitlines(keepends=True), top=5)
    sched = res['11:"python -m sched"']
    assert sched["samples"] == 100
    assert sched["share_through"]["sglang"] == 0.9
    assert sched["share_through"]["areal_tik_plugin"] == 0.3
    assert sched["share_through"]["torch"] == 0.6
    assert sched["self_top"][0][0].startswith("replay (torch/cuda/graphs.py:80)")
    proof = res['10:"python -m proof"']
    assert proof["samples"] == 6
    assert list(res)[0] == '11:"python -m sched"'  # most samples first


def test_cli_json_and_missing_file(tmp_path, capsys):
    m = _mod()
    raw = tmp_path / "raw.txt"
    raw.write_text(RAW)
    out = tmp_path / "s.json"
    assert m.main([str(raw), "--json", str(out), "--top", "3"]) == 0
    assert "through sglang 90%" in capsys.readouterr().out
    assert out.exists()
    assert m.main([str(tmp_path / "nope.txt")]) == 2
    assert "cannot read the py-spy raw file" in capsys.readouterr().err
