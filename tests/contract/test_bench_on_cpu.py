"""The row ops' benchmark code end to end on CPU (tiny shapes, timings stubbed, Triton interpreter): every
candidate is timed under its exact name or skipped with its reason (FlashInfer: no GPU), eager HF only as
context, the strongest baseline named per row."""

import pytest
import torch

from areal_tik_plugin.contract import baselines as B
from areal_tik_plugin.contract.suite import Recorder

TINY = {"tiny": dict(hidden=64, hq=4, hkv=2, d=16, vocab=512, inter=96, theta=1e6, eps=1e-6)}


@pytest.fixture
def cpu_bench(monkeypatch):
    from areal_tik_plugin.contract import _rowops, kv_write, logprob, norm, rope, swiglu, suite

    calls = []

    def fake_timed(rec, name, fn, graph=True):
        fn()
        calls.append(name)
        return {"cold_us": 10.0 if name.endswith("/ours") else 12.0 + len(name) % 5, "graph_us": 5.0 if graph else None}

    for m in (_rowops, norm, rope, swiglu, logprob, kv_write):
        for attr, val in (("DEV", "cpu"), ("MODELS", TINY), ("QUICK_BENCH_T", (3, 5)), ("VOCAB", 512),
                          ("FLCE_T", (4,)), ("FLCE_HIDDEN", 32)):
            if hasattr(m, attr):
                monkeypatch.setattr(m, attr, val)
    monkeypatch.setattr(suite, "timed", fake_timed)
    monkeypatch.setattr(kv_write, "timed", fake_timed)  # imported by name there
    monkeypatch.setattr(B, "measured_copy_tbps", lambda nbytes=0: 4.0)
    host = lambda rec, name, public, python_path, hf=None: {"native_vs_hf_host": 1.0, "native_vs_python_host": 1.0}  # noqa: E731
    for m in (norm, swiglu):
        monkeypatch.setattr(m, "native_host_row", host)
    monkeypatch.setattr(rope, "MAX_POS", 64)
    monkeypatch.setattr(B, "OFF", frozenset({"compile", "areal"}))  # inductor (AReaL's log-prob too) needs a GPU here
    return calls


@pytest.mark.parametrize("op", ["rmsnorm", "rope", "swiglu", "logprob", "kv_write"])
def test_row_op_bench_rows_name_their_baselines(cpu_bench, op):
    import importlib

    from areal_tik_plugin.contract import OP_MODULES

    mod = importlib.import_module(OP_MODULES[op])
    rec = Recorder(op)
    mod.run_bench(rec, True)
    assert rec.errors == [], rec.errors
    skipped = {b["baseline"]: b["reason"] for b in rec.benchmarks if b["name"] == "baseline_skipped"}
    assert op in ("logprob", "kv_write") or any(n.startswith("flashinfer") for n in skipped)
    assert (skipped or op == "kv_write") and all(r in ("flashinfer: no CUDA GPU", "compile: switched off by --baselines-off",
                                 "areal: switched off by --baselines-off")
                           or r.startswith("liger") or "not importable" in r for r in skipped.values()), skipped
    rows = [b for b in rec.benchmarks if "baselines" in b]
    if op == "kv_write":  # SGLang's own write is the one baseline: always there, always the strongest
        assert rows and all(r["strongest_cold"].startswith("torch index_put") for r in rows)
    assert rows and all(B.CONTEXT_KEY in r for r in rows if "context" in r)
    assert op == "kv_write" or any("context" in r for r in rows)
    assert all(not any(k.startswith("eager") for k in r["baselines"]) for r in rows)  # context never a baseline
    assert "vs_strongest_cold" in rec.bench_summary or all(not r["baselines"] for r in rows)
    assert op == "kv_write" or any(k.startswith(B.CONTEXT_KEY) for k in rec.bench_summary)
