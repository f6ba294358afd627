"""scripts/rowops_knob_probe.py's bookkeeping on the CPU (the probe itself needs a GPU): which bit
differences are expected (a coupled knob moved) and which are failures (a free knob changed bits), and the
A/B summary's medians."""

from __future__ import annotations

import pytest

from ._scripts import load_script


def _probe():
    return load_script("rowops_knob_probe")


def _row(knobs, same, frac=0.8, T=1024):
    return {"op": "logprob", "T": T, "knobs": knobs, "us": 1.0, "hbm_frac": frac, "bits_equal_default": same,
            "logp_max_abs_err": 1e-6}


def test_unexpected_mismatches():
    p = _probe()
    rows = [_row({"entropy": True, "EXP2": False}, False),      # coupled knob moved off its value: expected
            _row({"entropy": True, "EXP2": True}, True),
            _row({"entropy": True, "SELECT_FREE": True}, False),  # a free knob changed bits: failure
            _row({"entropy": False, "EXP2": True}, False),      # coupled at its value, bits differ: failure
            _row("default", True)]
    bad = p.unexpected_mismatches(rows, {"EXP2": True})
    assert [r["knobs"] for r in bad] == [{"entropy": True, "SELECT_FREE": True}, {"entropy": False, "EXP2": True}]


def test_ab_summary(capsys):
    p = _probe()
    rows = []
    for frac_off, frac_on in ((0.70, 0.80), (0.72, 0.78), (0.10, 0.79)):   # medians 0.70 / 0.79
        for ent in (False, True):
            rows.append(_row({"entropy": ent, "SELECT_FREE": False}, True, frac_off))
            rows.append(_row({"entropy": ent, "SELECT_FREE": True}, True, frac_on))
    p._print_ab(rows, "SELECT_FREE")
    out = capsys.readouterr().out
    assert "off 0.700" in out and "SELECT_FREE 0.790" in out and "[3 rounds]" in out


def test_rope_kv_and_logprob_ab_probes_run_on_cpu(monkeypatch):
    """The rope_kv probe and the log-prob A/B end to end on the CPU interpreter at tiny shapes (timings
    stubbed): every free-knob row bit-equal to the default, no errors."""
    import types

    from areal_tik_plugin.loader import get_implementation

    p = _probe()
    impl = get_implementation()
    monkeypatch.setattr(p, "DEV", "cpu")
    monkeypatch.setattr(p, "bench", types.SimpleNamespace(time_graph_us=lambda fn, **kw: 1.0,
                                                          time_graph_each_us=lambda fns, **kw: 1.0))
    monkeypatch.setattr(p, "ROPE_MODELS", {"tiny": (4, 2)})
    monkeypatch.setattr(p, "ROPE_T", (9,))
    monkeypatch.setattr(p, "ROPE_KV_SLOTS", 64)
    monkeypatch.setattr(p, "LOGPROB_T", (3,))
    monkeypatch.setattr(p, "VOCAB", 5000)
    monkeypatch.setattr(impl.module("rope"), "TOKEN_TILES_MIN_T", 1)   # the token-tile path at T=9
    rows = []
    p.probe_rope_kv(impl, rows)
    p.probe_logprob(impl, rows, ab="EXP2", rounds=1)
    assert not [r for r in rows if "error" in r], [r for r in rows if "error" in r][:2]
    assert len([r for r in rows if r["op"] == "rope_kv"]) == 1 + 4
    assert all(r["bits_equal_default"] for r in rows if r["op"] == "rope_kv")
    lp = impl.module("logprob")
    assert not p.unexpected_mismatches(rows, {"EXP2": lp.EXP2})
    assert any(not r["bits_equal_default"] for r in rows if r["op"] == "logprob")  # EXP2 moved: bits differ


@pytest.mark.parametrize("contract", [{"LOGPROB_LOAD_GROUP": 2}, {"LOGPROB_LOAD_GROUP": 2, "LOGPROB_CHUNK_WARPS": 2}])
def test_logprob_contract_ab_runs_on_cpu(monkeypatch, capsys, contract):
    """--logprob-contract: coupled contract constants at their values against others, interleaved; the
    constants are restored after every row, rows with them moved may differ in bits, the others may not."""
    import types

    from areal_tik_plugin.loader import get_implementation

    p = _probe()
    impl = get_implementation()
    C = impl.module("logprob").C
    before = {k: getattr(C, k) for k in contract}
    label = p.contract_label(contract)
    monkeypatch.setattr(p, "DEV", "cpu")
    monkeypatch.setattr(p, "bench", types.SimpleNamespace(time_graph_us=lambda fn, **kw: 1.0))
    monkeypatch.setattr(p, "LOGPROB_T", (3,))
    monkeypatch.setattr(p, "VOCAB", 5000)
    rows = []
    p.probe_logprob(impl, rows, rounds=2, contract=contract)
    assert {k: getattr(C, k) for k in contract} == before
    assert not [r for r in rows if "error" in r]
    assert len(rows) == 2 * 2 * 2 and {tuple(sorted(r["knobs"])) for r in rows} == {(label, "entropy")}
    assert all(r["bits_equal_default"] for r in rows if not r["knobs"][label])
    assert not p.unexpected_mismatches(rows, {label: False})


def test_logprob_contract_bad_arguments(capsys):
    p = _probe()
    for bad in ("LOGPROB_EXP=exp", "LOGPROB_CHUNK_WARPS=0", "LOGPROB_CHUNK_WARPS", "MERGE_ROWS=64",
                "LOGPROB_CHUNK_WARPS=8,LOGPROB_CHUNK_WARPS=2", "LOGPROB_CHUNK_WARPS=8,"):
        with pytest.raises(SystemExit) as e:
            p.main(["--out", "/tmp/x", "--ops", "logprob", "--logprob-contract", bad])
        assert e.value.code == 2
        assert "expected NAME=VALUE" in capsys.readouterr().err
    for bad in ("0,64", "1,x", "70000"):
        with pytest.raises(SystemExit) as e:
            p.main(["--out", "/tmp/x", "--ops", "logprob", "--logprob-t", bad])
        assert e.value.code == 2
        assert "--logprob-t (row counts): expected a comma list of integers in [1, 65536]" in capsys.readouterr().err
