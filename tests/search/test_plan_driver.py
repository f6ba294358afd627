"""The plan driver: a coding agent's actions and branch decisions, written before a batch call to the
GPU, replayed through the same records as the step-by-step verbs (cost-model evaluator of
test_search_state: these are rules of the run directory, not of the measurement)."""

from __future__ import annotations

import os

import pytest
import yaml

from areal_tik_plugin.search import engine
from areal_tik_plugin.search.drivers.plan import PlanDriver, PlanError
from tests.search.test_search_state import FakeEvaluator, _run

ROW = "ROW_BLOCK = 1    # free: query rows per block in full()"
STEP = "STEP_BLOCK = 1   # free: requests per block in step()"


def _edits(path, old, new):
    with open(path, "w") as f:
        f.write(f"FILE: toy.py\n<<<<<<< SEARCH\n{old}\n=======\n{new}\n>>>>>>> REPLACE\n")


def _write(tmp_path, name, plan):
    p = os.path.join(str(tmp_path), name)
    with open(p, "w") as f:
        yaml.safe_dump(plan, f)
    return p


def _opp(key, entry="toy.full", applies=None):
    o = {"key": key, "mechanism": f"mechanism {key}", "entry_points": [entry]}
    if applies:
        o["applies_to"] = applies
    return o


@pytest.fixture
def files(tmp_path):
    _edits(tmp_path / "row16.edits", ROW, ROW.replace("= 1 ", "= 16"))
    _edits(tmp_path / "row64.edits", ROW, ROW.replace("= 1 ", "= 64"))
    _edits(tmp_path / "step4.edits", STEP, STEP.replace("= 1 ", "= 4 "))
    _edits(tmp_path / "step16.edits", STEP.replace("= 1 ", "= 4 "), STEP.replace("= 1 ", "= 16"))
    return tmp_path


def test_plan_plays_actions_branches_skips_and_resumes(files, tmp_path):
    plan = {
        "initial": {"interpretation": "root measured", "rationale": "rows first",
                    "opportunities": [_opp("row16"), _opp("row64"), _opp("after-bad")]},
        "steps": [
            {"opportunity": "row16", "parents": ["root"], "edits": "row16.edits", "kind": "full_sequence",
             "expected_effect": "fewer Python blocks", "numerical_risks": "none", "falsifier": "full_T96 not faster",
             "on_promoted": {"decision": "CONTINUE", "interpretation": "rows were the cost", "rationale": "now steps",
                             "opportunities": [_opp("step4", "toy.step", ["self"])]},
             "on_verified": {"decision": "ARCHIVE", "interpretation": "no gain", "rationale": "keep"},
             "on_failed": {"decision": "ABANDON", "interpretation": "broke", "rationale": "stop"}},
            {"opportunity": "row64", "parents": ["root"], "edits": "row64.edits", "kind": "full_sequence",
             "on_failed": {"decision": "ABANDON", "interpretation": "64 rows do not fit", "rationale": "evidence"}},
            {"opportunity": "after-bad", "parents": ["row64"], "edits": "step4.edits", "kind": "decode"},
            {"opportunity": "step4", "parents": ["row16"], "edits": "step4.edits", "kind": "decode",
             "on_verified": {"decision": "CONTINUE", "interpretation": "steps too", "rationale": "more",
                             "opportunities": [_opp("step16", "toy.step", ["self"])]}},
        ],
    }
    run = _run(tmp_path, kappa_max=20, max_steps=30)
    try:
        out = engine.run_search(run, PlanDriver(_write(tmp_path, "p1.yaml", plan)), FakeEvaluator())
        assert out["stopped"]["reason"].startswith("plan exhausted")
        acts = sorted(run.actions.values(), key=lambda a: a.step)
        assert [run.opps[a.opportunity].details["plan_key"] for a in acts] == ["row16", "row64", "step4"]
        auds = {a.implementation: a for a in run.audits.values()}
        assert auds[acts[0].offspring].promoted and auds[acts[1].offspring].status == "compile_error"
        decs = sorted(run.decisions.values(), key=lambda d: d.step)
        assert [d.decision for d in decs] == ["CONTINUE", "CONTINUE", "ABANDON", "CONTINUE"]
        # the agent's text and the audit's facts side by side
        assert decs[1].interpretation.startswith("rows were the cost | audit E0001: ok")
        assert "compile_error" in decs[2].interpretation and "out of resources" in decs[2].interpretation
        # the step on the failed offspring never ran
        assert "after-bad" not in [run.opps[a.opportunity].details["plan_key"] for a in acts]
        assert acts[2].parents == [acts[0].offspring]
    finally:
        run.close()
    # the next call: a new plan on the same run directory names the follow-up by its key
    plan2 = {"steps": [{"opportunity": "step16", "parents": ["step4"], "edits": "step16.edits", "kind": "decode",
                        "on_verified": {"decision": "ARCHIVE", "interpretation": "done", "rationale": "end"}}]}
    from areal_tik_plugin.search.state import Run

    run = Run.open(os.path.join(str(tmp_path), "run"))
    try:
        run.set_stopped(None)
        engine.run_search(run, PlanDriver(_write(tmp_path, "p2.yaml", plan2)), FakeEvaluator())
        last = max(run.actions.values(), key=lambda a: a.step)
        assert run.opps[last.opportunity].details["plan_key"] == "step16"
        assert run.impls[last.offspring].knobs["STEP_BLOCK"] == 16
    finally:
        run.close()


@pytest.mark.parametrize("bad, msg", [
    ({"steps": "x"}, "a 'steps' list"),
    ({"steps": [{"parents": ["root"], "edits": "row16.edits"}]}, "'opportunity'"),
    ({"steps": [{"opportunity": "a", "edits": "nope.edits"}]}, "does not exist"),
    ({"steps": [{"opportunity": "a", "edits": "row16.edits", "from_dir": "."}]}, "exactly one of"),
    ({"steps": [{"opportunity": "a", "edits": "row16.edits", "speed": 2}]}, "unknown field"),
    ({"steps": [{"opportunity": "a", "edits": "row16.edits", "on_failed": {"decision": "CONTINUE"}}]},
     "only ABANDON or RETRY"),
    ({"initial": {"opportunities": [_opp("a"), _opp("a")]}, "steps": []}, "used twice"),
    ({"root": 2, "steps": []}, "root: expected the name"),
    # a CONTINUE whose follow-ups all apply to another implementation: the run would refuse it only after
    # the step's audit (state.py), so the plan is refused at load
    ({"steps": [{"opportunity": "a", "edits": "row16.edits", "on_verified": {
        "decision": "CONTINUE", "interpretation": "i", "rationale": "r",
        "opportunities": [_opp("b", applies=["root"])]}}]}, "needs an opportunity with applies_to \\[self\\]"),
])
def test_malformed_plans_are_refused_by_name(files, tmp_path, bad, msg):
    with pytest.raises(PlanError, match=msg):
        PlanDriver(_write(tmp_path, "bad.yaml", bad))


def test_cli_needs_a_plan_for_the_plan_driver(tmp_path, capsys):
    from areal_tik_plugin.cli import main

    assert main(["search", "run", "--driver", "plan", "--run-dir", str(tmp_path / "r")]) == 2
    assert "--plan FILE" in capsys.readouterr().err


def test_a_verified_regression_takes_the_slower_branch(files, tmp_path):
    """A chain must not build on a verified offspring that is slower than its parent: on_slower, not
    on_verified, decides it (ROW_BLOCK 16 -> 4 is slower in the cost model)."""
    _edits(tmp_path / "row4.edits", ROW.replace("= 1 ", "= 16"), ROW.replace("= 1 ", "= 4 "))
    cont = {"decision": "CONTINUE", "interpretation": "build on it", "rationale": "chain",
            "opportunities": [_opp("next", "toy.step", ["self"])]}
    plan = {"initial": {"interpretation": "i", "rationale": "r", "opportunities": [_opp("row16")]},
            "steps": [{"opportunity": "row16", "parents": ["root"], "edits": "row16.edits", "kind": "full_sequence",
                       "on_promoted": {**cont, "opportunities": [_opp("row4", applies=["self"])]}},
                      {"opportunity": "row4", "parents": ["row16"], "edits": "row4.edits", "kind": "full_sequence",
                       "on_verified": cont,
                       "on_slower": {"decision": "ARCHIVE", "interpretation": "slower", "rationale": "no"}},
                      {"opportunity": "next", "parents": ["row4"], "edits": "step4.edits", "kind": "decode"}]}
    run = _run(tmp_path, kappa_max=20, max_steps=30)
    try:
        out = engine.run_search(run, PlanDriver(_write(tmp_path, "p.yaml", plan)), FakeEvaluator())
        decs = sorted(run.decisions.values(), key=lambda d: d.step)
        assert [d.decision for d in decs] == ["CONTINUE", "CONTINUE", "ARCHIVE"]
        assert decs[2].interpretation.startswith("slower | audit E0002: ok")
        assert len(run.actions) == 2 and out["stopped"]["reason"]
    finally:
        run.close()


def test_a_plan_for_another_root_stops_before_its_first_decision(files, tmp_path):
    plan = {"root": "tik_v9", "initial": {"interpretation": "i", "rationale": "r", "opportunities": [_opp("row16")]},
            "steps": [{"opportunity": "row16", "parents": ["root"], "edits": "row16.edits", "kind": "full_sequence"}]}
    run = _run(tmp_path, kappa_max=20, max_steps=30)
    try:
        with pytest.raises(PlanError, match="written for the root 'tik_v9', but this run's root is"):
            engine.run_search(run, PlanDriver(_write(tmp_path, "p.yaml", plan)), FakeEvaluator())
        assert not run.actions and not run.decisions
    finally:
        run.close()
