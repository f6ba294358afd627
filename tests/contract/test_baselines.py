"""Baseline selection for the benchmark rows (areal_tik_plugin/contract/baselines.py): skips recorded with
their reason, the strongest baseline chosen and named per timing method, context ratios kept out of the
headline, bandwidth shares against the spec and the measured copy."""

import math

import pytest

from areal_tik_plugin.contract import baselines as B
from areal_tik_plugin.contract.suite import Recorder


def test_collect_records_every_skip_once_with_its_reason(monkeypatch):
    monkeypatch.setattr(B, "OFF", frozenset({"liger"}))
    rec = Recorder("x")

    def broken():
        raise RuntimeError("plan failed")

    facs = {"flashinfer.norm.rmsnorm": lambda: (B.flashinfer(), None)[1],
            "liger_kernel.LigerRMSNorm": lambda: (B.liger(), None)[1],
            "broken": broken, "torch.addcmul": lambda: "call"}
    got = B.collect(rec, "rmsnorm", facs)
    got2 = B.collect(rec, "rmsnorm", facs)
    assert got == got2 == {"torch.addcmul": "call"}
    skips = {b["baseline"]: b["reason"] for b in rec.benchmarks if b["name"] == "baseline_skipped"}
    assert len([b for b in rec.benchmarks if b["name"] == "baseline_skipped"]) == 3  # once each, not per call
    assert skips["liger_kernel.LigerRMSNorm"] == "liger: switched off by --baselines-off"
    assert skips["broken"] == "set-up failed: RuntimeError: plan failed"
    import torch

    if not torch.cuda.is_available():
        assert skips["flashinfer.norm.rmsnorm"] == "flashinfer: no CUDA GPU"


def test_switched_off_rejects_unknown_family():
    assert B.switched_off("compile", " compile ,liger")
    assert not B.switched_off("flashinfer", "compile")
    with pytest.raises(ValueError, match="baseline family"):
        B.switched_off("flash", "")
    with pytest.raises(ValueError, match="expected names from"):
        B.switched_off("compile", "compile,flash")


def test_best_of_per_method_and_ratio_against_the_strongest_only():
    ours = {"cold_us": 10.0, "graph_us": 5.0}
    base = {"flashinfer.a": {"cold_us": 12.0, "graph_us": 4.0},
            "liger.b": {"cold_us": 9.0, "graph_us": 6.0},
            "torch.compile(c)": None,                       # failed while timing
            "d": {"cold_us": 8.0, "graph_us": None}}        # graph capture failed
    row = B.build_row(ours, base, {"eager_hf": {"cold_us": 40.0, "graph_us": 20.0}})
    assert row["strongest_cold"] == "d" and row["vs_strongest_cold"] == pytest.approx(0.8)
    assert row["strongest_graph"] == "flashinfer.a" and row["vs_strongest_graph"] == pytest.approx(0.8)
    assert row["baselines"]["torch.compile(c)"] == "failed (see errors)"
    assert row[B.CONTEXT_KEY]["eager_hf"] == {"cold": pytest.approx(4.0), "graph": pytest.approx(4.0)}
    empty = B.build_row(ours, {"x": None})
    assert empty["strongest_cold"] is None and empty["vs_strongest_graph"] is None
    assert B.best_of({"a": {"k": 2.0}, "b": {"k": 2.0}, "c": {"k": float("nan")}}, "k")[0] == "a"


def test_compare_times_every_candidate_and_summary_keeps_context_apart():
    rec = Recorder("x")
    times = {"ours": 2.0, "fi": 3.0, "lg": 2.5, "eager_hf": 8.0}

    def timer(rec_, label, fn, graph):
        v = times[label.split("/")[1]]
        return {"cold_us": v, "graph_us": v / 2}

    rows = [B.compare(rec, f"r{i}", None, {"fi": None, "lg": None}, {"eager_hf": None}, timer=timer, T=i)
            for i in range(3)]
    rows[0]["extra"] = 1  # the returned dict is the recorded one
    assert rec.benchmarks[0]["extra"] == 1 and rec.benchmarks[0]["T"] == 0
    B.summarize(rec, rows)
    s = rec.bench_summary
    assert s["vs_strongest_cold"]["geomean"] == pytest.approx(1.25)       # vs liger (2.5 / 2), not hf
    assert s[f"{B.CONTEXT_KEY}[eager_hf]_cold"]["geomean"] == pytest.approx(4.0)
    counts = next(b for b in rec.benchmarks if b["name"] == "strongest_baselines")["counts"]
    assert counts == {"cold": {"lg": 3}, "graph": {"lg": 3}}


def test_shares_against_spec_and_measured_copy():
    s = B.shares(2.4, 4.0)
    assert s == {"of_spec": pytest.approx(0.5), "of_measured_copy": pytest.approx(0.6)}
    assert B.shares(None, 4.0) == {"of_spec": None, "of_measured_copy": None}
    assert B.shares(2.4, None)["of_measured_copy"] is None
    assert B.HBM_SPEC_TBPS == 4.8


def test_versions_name_every_baseline_package():
    v = B.versions()
    for k in ("torch", "flashinfer-python", "liger-kernel", "areal", "sglang", "transformers", "torch_cuda"):
        assert k in v
    import torch

    assert v["torch"] == torch.__version__.split("+")[0] or v["torch"].startswith(torch.__version__[:4])


def test_try_compiled_reports_why_instead_of_raising(monkeypatch):
    monkeypatch.setattr(B, "OFF", frozenset({"compile"}))
    e = B.try_compiled(lambda x: x, "m")
    assert isinstance(e, B.Unavailable) and "switched off" in str(e)
    with pytest.raises(B.Unavailable):
        B.call_or_raise(e)
    assert isinstance(B.try_compiled(None, "Qwen3RMSNorm"), B.Unavailable)
    assert B.call_or_raise(math.sqrt) is math.sqrt


def test_fi_page_table_covers_every_token_once_in_random_page_order():
    import torch

    from areal_tik_plugin.contract.attention import fi_page_table

    lens = [1, 16, 17, 300, 5]
    indptr, indices, last = fi_page_table(lens, 16)
    assert indptr.tolist() == [0, 1, 2, 4, 23, 24] and last.tolist() == [1, 16, 1, 12, 5]
    assert sorted(indices.tolist()) == list(range(24)) and indices.tolist() != list(range(24))
    assert indptr.dtype == indices.dtype == last.dtype == torch.int32
    i1, x1, l1 = fi_page_table(lens, 1)
    assert i1[-1].item() == sum(lens) and set(l1.tolist()) == {1}
    with pytest.raises(ValueError, match="page_size"):
        fi_page_table([0, 3], 16)
