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


def test_host_us_counts_calls_and_takes_the_best_round():
    calls = []
    t = bench.host_us(lambda: calls.append(1), n=50, reps=3, warmup=4)
    assert len(calls) == 4 + 3 * 50
    assert 0.0 < t < 1e4


def test_knobs_sets_and_restores_also_on_error():
    import types

    import pytest

    from areal_tik_plugin.contract._rowops import knobs

    mod = types.SimpleNamespace(A=1, B="x")
    with knobs(mod, A=2, B="y"):
        assert (mod.A, mod.B) == (2, "y")
    assert (mod.A, mod.B) == (1, "x")
    with pytest.raises(RuntimeError):
        with knobs(mod, A=3):
            assert mod.A == 3
            raise RuntimeError("inside")
    assert mod.A == 1


def test_tbps_and_add_shares_copy_ceiling():
    """A streamed row's TB/s, its share of HBM and of a same-size copy; rows without a streamed time or a
    copy time add no copy share."""
    from areal_tik_plugin.contract._rowops import HBM_TBPS, add_shares, tbps

    nbytes = 43 * 10 ** 6  # 43 MB: 10 us is 4.3 TB/s
    row = {"cold_us": 20.0, "graph_us": 8.0, "graph_streamed_us": 10.0, "copy_same_bytes_us": 9.0}
    bw = tbps(nbytes, row)
    assert abs(bw["graph_tbps"] - 4.3) < 1e-9 and bw["graph_basis"] == "streamed"
    assert abs(bw["copy_same_bytes_tbps"] - 43 / 9) < 1e-9 and abs(bw["vs_copy_same_bytes"] - 0.9) < 1e-12
    ratios = {}
    add_shares(ratios, bw)
    assert abs(ratios["hbm_frac_T4096plus_graph"][0] - 4.3 / HBM_TBPS) < 1e-9
    assert abs(ratios["hbm_frac_T4096plus"][0] - 2.15 / HBM_TBPS) < 1e-9
    assert ratios["vs_copy_same_bytes_T4096plus_graph"] == [0.9]
    plain = tbps(nbytes, {"cold_us": 20.0, "graph_us": 8.0})
    assert "vs_copy_same_bytes" not in plain and plain["graph_basis"] == "same_buffers"
    add_shares(ratios, plain)
    assert len(ratios["vs_copy_same_bytes_T4096plus_graph"]) == 1 and len(ratios["hbm_frac_T4096plus"]) == 2
    add_shares(ratios, None)
    assert len(ratios["hbm_frac_T4096plus"]) == 2
    assert not any("T65536" in k for k in ratios)     # no row of the large token count yet
    add_shares(ratios, bw, 65536)                     # a T=65536 row: in both lists
    assert len(ratios["hbm_frac_T4096plus_graph"]) == 3 and ratios["vs_copy_same_bytes_T65536_graph"] == [0.9]
    assert abs(ratios["hbm_frac_T65536_graph"][0] - 4.3 / HBM_TBPS) < 1e-9 and len(ratios["hbm_frac_T65536"]) == 1
    assert HBM_TBPS == 4.8 and not any(k.startswith("measured_copy") for k in ratios)  # no GPU: no copy measured
    add_shares(ratios, bw, 0, copy_tbps=4.0)  # against the copy measured in the process
    assert abs(ratios["measured_copy_frac_T4096plus_graph"][0] - 4.3 / 4.0) < 1e-12


def test_interleaved_medians_rounds_in_order_and_median():
    order = []
    times = {"a": iter([5.0, 1.0, 3.0]), "b": iter([2.0, 2.0, 9.0])}

    def time_fn(name):
        order.append(name)
        return next(times[name])

    med, samples = bench.interleaved_medians({"a": "a", "b": "b"}, time_fn, 3)
    assert order == ["a", "b"] * 3                    # every variant once per round, in order
    assert med == {"a": 3.0, "b": 2.0} and samples == {"a": [5.0, 1.0, 3.0], "b": [2.0, 2.0, 9.0]}
    import pytest

    with pytest.raises(ValueError, match="rounds"):
        bench.interleaved_medians({"a": "a"}, time_fn, 0)


def test_spread_median_min_max():
    import pytest

    assert bench.spread([3.0, 1.0, 2.0, 10.0]) == {"median": 2.5, "min": 1.0, "max": 10.0, "n": 4}
    with pytest.raises(ValueError, match="at least one sample"):
        bench.spread([])
