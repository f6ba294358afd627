"""scripts/rowops_knob_probe.py's bookkeeping on the CPU (the probe itself needs a GPU): which bit
differences are expected (a coupled knob moved) and which are failures (a free knob changed bits), and the
A/B summary's medians."""

from __future__ import annotations

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
