"""The SGLang integration's stats file (TIK_SGLANG_STATS, read by the proofs): SGLang's fused-op trace is
consumed as it is counted (its list cleared, so each step costs only its new records), a file is written at
once when an op or an op|backend pair is new and otherwise at most every STATS_INTERVAL_S seconds. A fake
``sglang.kernels.fused_op`` stands in (no Engine; importing SGLang itself would patch this process)."""

from __future__ import annotations

import json
import sys
import types

from areal_tik_plugin.integrations.sglang import layers as L


def _fake_fused_op(monkeypatch):
    records: list = []
    mod = types.ModuleType("sglang.kernels.fused_op")
    mod.get_fused_op_trace = lambda: list(records)
    mod.clear_fused_op_trace = records.clear
    for name in ("sglang", "sglang.kernels"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "sglang.kernels.fused_op", mod)
    return records


def test_stats_file_consumes_trace_and_throttles(tmp_path, monkeypatch):
    records = _fake_fused_op(monkeypatch)
    rec = lambda op, be: types.SimpleNamespace(op=op, backend=be)  # noqa: E731
    monkeypatch.setattr(L, "COUNTS", L.collections.Counter())
    monkeypatch.setattr(L, "_TRACE", L.collections.Counter())
    monkeypatch.setitem(L._STATE, "stats_dir", str(tmp_path))
    monkeypatch.setitem(L._STATE, "trace", True)
    monkeypatch.setitem(L._STATE, "last_dump", 0.0)
    monkeypatch.setitem(L._STATE, "dumped_keys", None)
    monkeypatch.setattr(L, "STATS_INTERVAL_S", 3600.0)
    path = tmp_path / f"stats-{L.os.getpid()}.json"
    read = lambda: json.loads(path.read_text())  # noqa: E731

    L.COUNTS["linear"] += 2
    records += [rec("RMSNorm", "plugin")] * 3
    L._maybe_dump_stats()  # first file
    assert read()["counts"] == {"linear": 2} and read()["fused_op_trace"] == {"RMSNorm|plugin": 3}
    assert records == []  # consumed

    L.COUNTS["linear"] += 5
    records += [rec("RMSNorm", "plugin")] * 2
    L._maybe_dump_stats()  # nothing new by key, inside the interval: no write, but the trace is counted
    assert read()["counts"] == {"linear": 2} and records == [] and L._TRACE["RMSNorm|plugin"] == 5

    records.append(rec("SiluAndMul", "torch"))  # a new op|backend pair (e.g. a foreign path): written at once
    L._maybe_dump_stats()
    assert read()["fused_op_trace"] == {"RMSNorm|plugin": 5, "SiluAndMul|torch": 1}
    assert read()["counts"] == {"linear": 7}

    L.COUNTS["attention_decode"] += 1  # a new op counter: written at once
    L._maybe_dump_stats()
    assert read()["counts"] == {"linear": 7, "attention_decode": 1}

    L.COUNTS["linear"] += 1
    L._maybe_dump_stats(force=True)
    assert read()["counts"]["linear"] == 8

    monkeypatch.setattr(L, "STATS_INTERVAL_S", 0.0)  # interval elapsed: the lagging counts are written
    L.COUNTS["linear"] += 1
    L._maybe_dump_stats()
    assert read()["counts"]["linear"] == 9


def test_no_stats_dir_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setitem(L._STATE, "stats_dir", None)
    L._maybe_dump_stats(force=True)
    assert list(tmp_path.iterdir()) == []
