"""The timing helpers' CPU-checkable parts (the CUDA-graph timing itself needs a GPU)."""

from __future__ import annotations

from areal_tik_plugin import bench


def test_time_graph_each_us_calls_each_once_per_replay_and_divides(monkeypatch):
    calls = []

    def fake_time_graph_us(fn, *, n_inner, rounds):
        assert n_inner == 1 and rounds == 7
        fn()  # one replay
        return 30.0

    monkeypatch.setattr(bench, "time_graph_us", fake_time_graph_us)
    fns = [lambda i=i: calls.append(i) for i in range(3)]
    assert bench.time_graph_each_us(iter(fns), rounds=7) == 10.0
    assert calls == [0, 1, 2]
