"""The training attention step (entry ``attention.prefill_backward``, kind ``train_fwd_bwd``) in the search:
tik_v2 evaluated end to end on the CPU smoke spec (init, then the knob driver), a plan whose backward is
wrong (dq scaled) or nondeterministic refused with a typed status, and specs the runner cannot run refused
before a run directory exists, naming what was expected."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import yaml

from areal_tik_plugin.cli import main
from areal_tik_plugin.contract.suite import Recorder
from areal_tik_plugin.runtime import loader
from areal_tik_plugin.search import SPECS_DIR, spec as S
from areal_tik_plugin.search.runners import Context, attention as R
from areal_tik_plugin.search.state import Run

SMOKE = os.path.join(SPECS_DIR, "cpu_attention_train_smoke.yaml")
RETURN = "    return dq, dk, dv\n"
# wrong by 1 %: above the training specs' gradient tolerance (8e-3 relative L2; tik_v2 is at ~3e-3 here)
SCALED = "    return dq * 1.01, dk, dv\n"
# about one bf16 ulp on half the elements, a new draw per call: accurate, but not the same bits twice
NOISY = "    return dq + (torch.rand_like(dq, dtype=torch.float32) < 0.5).to(dq.dtype) * dq * 2 ** -7, dk, dv\n"


def _tik_v2(tmp_path, name="tik_v2", edit=None) -> str:
    d = os.path.join(str(tmp_path), name)
    shutil.copytree(loader.resolve_path("tik_v2"), d, ignore=shutil.ignore_patterns("__pycache__"))
    if edit:
        p = os.path.join(d, "attention.py")
        with open(p) as f:
            t = f.read()
        assert t.count(RETURN) == 1
        with open(p, "w") as f:
            f.write(t.replace(RETURN, edit))
    loader.write_manifest_hash(d)
    return d


def test_train_smoke_evaluates_tik_v2_init_then_knobs(tmp_path, capsys):
    d = os.path.join(str(tmp_path), "run")
    assert main(["search", "init", "--spec", SMOKE, "--impl", _tik_v2(tmp_path), "--run-dir", d]) == 0
    assert main(["search", "run", "--driver", "knobs", "--run-dir", d, "--max-steps", "1", "--no-progress"]) == 0
    capsys.readouterr()
    run = Run.open(d, lock=False)
    e0, e1 = run.audits["E0000"], run.audits["E0001"]
    assert e0.status == "ok", e0.error
    assert set(e0.latencies_us) == {"train_lens37_61", "train_b2_L33"}
    names = {c["name"] for c in e0.checks}
    assert {"prefix_rows[P=70,A=3]", "train_determinism[[37, 61, 1]]:repeat[1]:dv",
            "train_determinism[[37, 61, 1]]:o_vs_prefill", "train_vs_fp32[[37, 61, 5]]:dk",
            "timed[train_lens37_61][seed=0]:train:repeat[0]:dq",
            "timed[train_lens37_61][seed=0]:seq1:vs_fp32:dv"} <= names
    grads = [c for c in e0.checks if c["name"].startswith("train_vs_fp32") and c["name"][-2:] in ("dq", "dk", "dv")]
    assert grads and all(c["passed"] and c["rel_l2"] < c["tol_rel_l2"] for c in grads)
    assert e0.dispatch["entry_calls"]["attention.prefill_backward"] > 0
    assert e1.status == "ok", e1.error
    assert run.actions["A0001"].knob_moves


def _edits(path, new):
    with open(path, "w") as f:
        f.write(f"FILE: attention.py\n<<<<<<< SEARCH\n{RETURN}=======\n{new}>>>>>>> REPLACE\n")


def test_plan_with_a_wrong_or_nondeterministic_backward_is_refused(tmp_path, capsys):
    _edits(tmp_path / "scaled.edits", SCALED)
    _edits(tmp_path / "noisy.edits", NOISY)
    opp = {"mechanism": "backward epilogue", "entry_points": ["attention.prefill_backward"]}
    fail = {"decision": "ABANDON", "interpretation": "refused", "rationale": "the evaluator said no"}
    plan = {"initial": {"interpretation": "root measured", "rationale": "two bad backwards",
                        "opportunities": [{"key": "scaled", **opp}, {"key": "noisy", **opp}]},
            "steps": [{"opportunity": key, "parents": ["root"], "edits": f"{key}.edits", "kind": "full_sequence",
                       "on_failed": fail} for key in ("scaled", "noisy")]}
    p = tmp_path / "plan.yaml"
    p.write_text(yaml.safe_dump(plan))
    d = os.path.join(str(tmp_path), "run")
    assert main(["search", "run", "--driver", "plan", "--plan", str(p), "--spec", SMOKE,
                 "--impl", _tik_v2(tmp_path), "--run-dir", d, "--no-progress"]) == 0
    capsys.readouterr()
    run = Run.open(d, lock=False)
    assert run.audits["E0000"].status == "ok"
    scaled, noisy = run.audits["E0001"], run.audits["E0002"]
    assert scaled.status == "inaccurate" and "train_vs_fp32[[37, 61, 5]]:dq" in scaled.error, scaled.error
    bad = [c for c in scaled.checks if not c["passed"]]
    assert [c["name"][-2:] for c in bad] == ["dq"] and bad[0]["rel_l2"] > bad[0]["tol_rel_l2"]
    assert noisy.status == "contract_violation" and "train_determinism" in noisy.error, noisy.error
    assert not scaled.verified and not noisy.verified and run.state().best == "I0000"
    assert run.state().kappa == 2


def test_timed_call_check_catches_a_nondeterministic_backward(tmp_path):
    """The timed calls are checked too (each repeated on its inputs), not only the bitwise suite."""
    spec = S.freeze(S.load(SMOKE))
    ctx = Context(loader.load_implementation(_tik_v2(tmp_path, "tik_noisy", NOISY)), spec, "cpu", Recorder("t"))
    call, check = R.workload_case(ctx, spec["workloads"][1], 0)
    check(call())
    bad = [c for c in ctx.rec.checks if not c["passed"]]
    assert bad and all(c["kind"] == "bitwise" and ":dq" in c["name"] for c in bad), bad
    assert all(c["passed"] for c in ctx.rec.checks if c["kind"] == "accuracy")


def _spec(tmp_path, mutate):
    with open(SMOKE) as f:
        s = yaml.safe_load(f)
    mutate(s)
    p = os.path.join(str(tmp_path), "bad.yaml")
    with open(p, "w") as f:
        yaml.safe_dump(s, f)
    return p


@pytest.mark.parametrize("mutate,expected", [
    (lambda s: s["entry_points"].update({"attention.backward": "train_fwd_bwd"}),
     "entry_points.attention.backward: the attention runner knows the entries"),
    (lambda s: s["entry_points"].update({"attention.prefill_backward": "full_sequence"}),
     "entry_points.attention.prefill_backward: expected the kind 'train_fwd_bwd', got 'full_sequence'"),
    (lambda s: s["entry_points"].update({"attention.prefill_backward": "training"}),
     "expected one of ('full_sequence', 'decode', 'train_fwd_bwd'), got 'training'"),
    (lambda s: s["workloads"][1]["shape"].pop("seqlen"),
     "workloads[1] (train_b2_L33).shape: attention.prefill_backward expects the keys {batch, seqlen} or {lens}, "
     "got ['batch']"),
    (lambda s: s["workloads"][0]["shape"].update({"lens": [37, 0]}),
     "workloads[0] (train_lens37_61).shape.lens: expected a positive integer list, got [37, 0]"),
    (lambda s: s["workloads"][0].update({"entry": "attention.backward"}),
     "'attention.backward' is not in entry_points"),
    (lambda s: s["accuracy"].append({"suite": "train_vs_fp64"}),
     "accuracy[2].suite: 'train_vs_fp64'; the attention runner has ['varlen_vs_fp32', 'train_vs_fp32']"),
], ids=["unknown_entry_point", "wrong_kind", "unknown_kind", "missing_shape_key", "bad_lens", "unknown_workload_entry",
        "unknown_suite"])
def test_bad_train_spec_is_refused_naming_what_was_expected(tmp_path, capsys, mutate, expected):
    d = os.path.join(str(tmp_path), "run")
    assert main(["search", "init", "--spec", _spec(tmp_path, mutate), "--impl", "tik_v2", "--run-dir", d]) == 2
    err = capsys.readouterr().err
    assert expected in err, err
    assert not os.path.exists(d), "a refused spec leaves no run directory"


def test_h200_train_spec_quick_and_full():
    full = S.freeze(S.load("h200_attention_train"))
    quick = S.freeze(S.load("h200_attention_train"), quick=True)
    S.check_runner(full)
    assert len(full["workloads"]) == 16 and len(quick["workloads"]) == 12
    assert {w["entry"] for w in full["workloads"]} == {"attention.prefill_backward"}
    assert all("16512" in w["name"] for w in full["workloads"] if w not in quick["workloads"])
    assert all(w["weight"] == 1.0 and w["max_slowdown"] == 1.05 for w in full["workloads"])
    assert full["entry_points"]["attention.prefill_backward"] == "train_fwd_bwd"
    # the forward's bitwise suites are those of the rollout spec; the train suites come on top
    fwd = S.freeze(S.load("h200_attention"))
    assert fwd["bitwise"] == [b for b in full["bitwise"] if not b["suite"].startswith("train_")]
    assert json.dumps(full["model"]) == json.dumps(fwd["model"])
