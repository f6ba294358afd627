"""Rough edges of the agent protocol: apply --dry-run, names in opportunities, a decision that would
end the search, visible budgets, MERGE that builds the merged source (or refuses), the audit's share.
The cost-model evaluator of test_search_state stands in for the process-isolated one here: these are
rules of the run directory, not of the measurement."""

from __future__ import annotations

import json
import os

import pytest

from areal_tik_plugin.cli import main
from areal_tik_plugin.search.state import RunError
from tests.search.test_search_state import FakeEvaluator, _run


def _step(run, opp, parents, edits, decision="ARCHIVE", opps=None):
    run.record_action(opportunity=opp, parents=parents, edits=edits, kind="joint")
    a = run.audit(FakeEvaluator())
    run.decide(decision=decision, interpretation="t", rationale="t", new_opportunities=opps)
    return a


def _edit(search, replace):
    return [{"file": "toy.py", "search": search, "replace": replace}]


@pytest.fixture
def run(tmp_path):
    r = _run(tmp_path, kappa_max=20, max_steps=30)
    r.initialize(FakeEvaluator())
    r.decide(decision="CONTINUE", interpretation="root", rationale="r",
             new_opportunities=[{"mechanism": f"m{i}", "entry_points": ["toy.full"]} for i in range(4)])
    yield r
    r.close()


LINE = "ROW_BLOCK = 1    # free: query rows per block in full()"


def test_apply_dry_run(run, tmp_path, capsys):
    good, bad, dup = (str(tmp_path / n) for n in ("good.txt", "bad.txt", "dup.txt"))
    with open(good, "w") as f:
        f.write(f"FILE: toy.py\n<<<<<<< SEARCH\n{LINE}\n=======\n{LINE.replace('= 1', '= 4')}\n>>>>>>> REPLACE\n")
    with open(bad, "w") as f:  # SEARCH blocks are whole lines: a line prefix does not match
        f.write("FILE: toy.py\n<<<<<<< SEARCH\nROW_BLOCK = 1\n=======\nROW_BLOCK = 4\n>>>>>>> REPLACE\n")
    with open(dup, "w") as f:
        f.write("FILE: toy.py\n<<<<<<< SEARCH\n    return out\n=======\n    return out + 0\n>>>>>>> REPLACE\n")
    capsys.readouterr()
    assert main(["search", "apply", run.root, "--parent", "I0000", "--edits", good, "--dry-run"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["applies"] and "+ROW_BLOCK = 4" in out["diff"] and out["changed_files"] == ["toy.py"]
    assert main(["search", "apply", run.root, "--parent", "I0000", "--edits", bad, "--dry-run"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert not out["applies"] and "not found" in out["error"] and "ROW_BLOCK = 1" in out["error"]
    assert main(["search", "apply", run.root, "--parent", "I0000", "--edits", dup, "--dry-run"]) == 1
    assert "occurs 2 times" in json.loads(capsys.readouterr().out)["error"]
    assert not run.actions, "a dry run records nothing"
    dest = str(tmp_path / "edited")
    assert main(["search", "apply", run.root, "--parent", "I0000", "--edits", good, "--out", dest]) == 0
    assert "ROW_BLOCK = 4 " in open(os.path.join(dest, "toy.py")).read()


def test_names_in_opportunities_are_checked(run):
    run.record_action(opportunity="O0001", parents=["I0000"], edits=_edit("ROW_BLOCK = 1 ", "ROW_BLOCK = 4 "),
                      kind="joint")
    run.audit(FakeEvaluator())
    with pytest.raises(RunError, match=r"unknown workloads \['full_T4800'\], expected some of \['full_T48'"):
        run.decide(decision="CONTINUE", interpretation="t", rationale="t",
                   new_opportunities=[{"mechanism": "x", "target_workloads": ["full_T4800"], "applies_to": ["I0001"]}])
    with pytest.raises(RunError, match=r"unknown entry points \['toy.decode'\]"):
        run.decide(decision="CONTINUE", interpretation="t", rationale="t",
                   new_opportunities=[{"mechanism": "x", "entry_points": ["toy.decode"], "applies_to": ["I0001"]}])


def test_ending_the_search_is_said_not_silent(run, capsys):
    # the library default lets drivers end a run; the agent's command line passes end=False unless --end
    for i in range(1, 4):
        _step(run, f"O000{i}", ["I0000"], _edit("ROW_BLOCK = 1 ", f"ROW_BLOCK = {(1, 4, 16, 1)[i]} ")
              if i < 3 else _edit("STEP_BLOCK = 1 ", "STEP_BLOCK = 4 "))
    run.record_action(opportunity="O0004", parents=["I0000"], edits=_edit("STEP_BLOCK = 1 ", "STEP_BLOCK = 16 "),
                      kind="joint")
    run.audit(FakeEvaluator())
    with pytest.raises(RunError, match="leaves no pending opportunity"):
        run.decide(decision="ARCHIVE", interpretation="t", rationale="t", end=False)
    run.decide(decision="ARCHIVE", interpretation="t", rationale="t", end=True)
    assert run.phase() == "done"


def test_budgets_are_visible_and_raisable(tmp_path, capsys):
    r = _run(tmp_path, "small", kappa_max=20, max_steps=1)
    r.initialize(FakeEvaluator())
    r.decide(decision="CONTINUE", interpretation="root", rationale="r",
             new_opportunities=[{"mechanism": "a"}, {"mechanism": "b"}])
    _step(r, "O0001", ["I0000"], _edit("ROW_BLOCK = 1 ", "ROW_BLOCK = 4 "))
    assert r.phase() == "done" and "spec search.max_steps" in r.stop_reason() and "tik search limits" in r.stop_reason()
    r.close()
    capsys.readouterr()
    assert main(["search", "next", r.root]) == 0
    nxt = json.loads(capsys.readouterr().out)
    assert nxt["limits"]["max_steps"] == 1 and nxt["limits"]["steps_left"] == 0
    assert main(["search", "limits", r.root, "--max-steps", "5"]) == 0
    capsys.readouterr()
    assert main(["search", "next", r.root]) == 0
    nxt = json.loads(capsys.readouterr().out)
    assert nxt["phase"] == "action" and nxt["limits"]["from"]["max_steps"] == "run option"


def test_merge_builds_the_merged_source_or_refuses(run):
    _step(run, "O0001", ["I0000"], _edit("ROW_BLOCK = 1 ", "ROW_BLOCK = 4 "), decision="CONTINUE",
          opps=[{"mechanism": "merge", "applies_to": ["I0001"]}])
    _step(run, "O0002", ["I0000"], _edit("STEP_BLOCK = 1 ", "STEP_BLOCK = 4 "), decision="MERGE",
          opps=[{"mechanism": "merge both", "applies_to": ["I0002", "I0001"], "kind": "merge"}])
    _step(run, "O0003", ["I0000"], _edit("ROW_BLOCK = 1 ", "ROW_BLOCK = 16 "), decision="CONTINUE",
          opps=[{"mechanism": "conflicting merge", "applies_to": ["I0003", "I0001"], "kind": "merge"}])
    a = run.record_action(opportunity="O0006", parents=["I0002", "I0001"], edits=[], kind="joint")
    assert a.apply_error is None and "merge of I0002, I0001" in a.scope
    src = run.files_of(a.offspring)["toy.py"]
    assert "ROW_BLOCK = 4 " in src and "STEP_BLOCK = 4 " in src
    run.audit(FakeEvaluator())
    run.decide(decision="ARCHIVE", interpretation="t", rationale="t")
    with pytest.raises(RunError, match=r"both changed \['toy.py'\] differently since their common ancestor I0000"):
        run.record_action(opportunity="O0007", parents=["I0003", "I0001"], edits=[], kind="joint")


def test_audit_reports_share(run):
    a = _step(run, "O0001", ["I0000"], _edit("ROW_BLOCK = 1 ", "ROW_BLOCK = 4 "))
    sh = a.timing["share"]
    assert set(sh) == {w["name"] for w in run.spec["workloads"]} and abs(sum(sh.values()) - 1) < 1e-3


class _Reauditor(FakeEvaluator):
    """The cost model for audits; a re-audit (seed given) of ``fails`` returns a failed timed check."""

    def __init__(self, fails):
        super().__init__()
        self.fails = fails

    def evaluate(self, run, iid, progress=None, seed=0, ab=True):
        res = super().evaluate(run, iid, progress)
        if seed and iid == self.fails:
            return {**res, "status": "inaccurate", "stage": "latency", "latencies_us": {},
                    "checks": [{"name": "timed[full_T48][seed=1]:vs_fp64", "passed": False, "kind": "accuracy"}],
                    "error": "outputs of the timed calls are wrong"}
        return res


def test_failed_reaudit_revokes_automatically(run):
    _step(run, "O0001", ["I0000"], _edit("ROW_BLOCK = 1 ", "ROW_BLOCK = 4 "), decision="CONTINUE",
          opps=[{"mechanism": "more", "applies_to": ["I0001"]}])
    assert run.state().best == "I0001"
    ev = _Reauditor(fails="I0001")
    out = run.reaudit(ev, "I0000", seed=1)
    assert out["status"] == "ok" and out["revocation"] is None
    out = run.reaudit(ev, "I0001", seed=1)
    assert out["status"] == "inaccurate" and out["revocation"] == "R0001"
    st = run.state()
    rec = run.revocations["R0001"]
    assert rec.source == "heldout" and rec.evidence["failed_checks"][0]["name"].startswith("timed[")
    assert st.best == "I0000" and "I0001" in st.revoked
    assert all("I0001" not in run.opps[o].applies_to for o in st.pending)
    with pytest.raises(RunError, match="not a verified implementation"):
        run.reaudit(ev, "I0001", seed=2)
