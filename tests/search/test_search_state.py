"""Search IR, run directory, promotion rule, knob driver and resume -- without subprocesses.

A deterministic fake evaluator (latency = a cost model of the candidate's knob values) replaces the
process-isolated one here, so every rule can be checked exactly and fast; the real evaluator is
exercised in test_search_e2e.py and test_search_llm.py.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest
import yaml

from areal_tik_plugin.runtime import loader
from areal_tik_plugin.search import TESTDATA_DIR, SPECS_DIR, edits as E, ir, spec as S
from areal_tik_plugin.search.drivers.knobs import KnobsDriver
from areal_tik_plugin.search.engine import run_search
from areal_tik_plugin.search.state import CorruptRun, Run, RunError, is_promotion, score

TOY = os.path.join(TESTDATA_DIR, "toy_v1")


def toy_spec(tmp_path, **search):
    with open(os.path.join(SPECS_DIR, "cpu_toy.yaml")) as f:
        s = yaml.safe_load(f)
    s["max_slowdown"] = 1.05
    s["search"].update(search)
    p = os.path.join(str(tmp_path), "spec.yaml")
    with open(p, "w") as f:
        yaml.safe_dump(s, f)
    return p


class FakeEvaluator:
    """Cost model over the toy's knobs. ROW_BLOCK=64 'fails to compile'; TOY_CHUNK=8 breaks the bits."""

    FULL = {1: 1.0, 4: 0.30, 16: 0.12, 64: None}
    STEP = {1: 1.0, 4: 0.50, 16: 0.45}
    CHUNK = {8: 1.0, 16: 1.0, 32: 0.995}

    def __init__(self, interrupt_at: int | None = None):
        self.calls = 0
        self.interrupt_at = interrupt_at

    def evaluate(self, run, iid, progress=None):
        self.calls += 1
        if self.interrupt_at is not None and self.calls == self.interrupt_at:
            raise KeyboardInterrupt("simulated Ctrl-C during an evaluation")
        k = run.impls[iid].knobs
        base = {"full_T48": 20000.0, "full_T96": 70000.0, "step_b1_ctx48": 500.0, "step_b1_ctx96": 900.0,
                "step_b4_ctx96": 4000.0}
        res = {"stage": "done", "checks": [], "compile": {}, "dispatch": {}, "timing": {}, "error": None,
               "log_tail": "", "hashes": {"candidate_before": run.impls[iid].source_hash}, "env": {"cpu_model": "fake"}}
        f = self.FULL[k["ROW_BLOCK"]]
        if f is None:
            return {**res, "status": "compile_error", "stage": "compile", "error": "out of resources", "latencies_us": {}}
        if k["TOY_CHUNK"] == 8:
            return {**res, "status": "contract_violation", "stage": "bitwise", "error": "step rows differ",
                    "latencies_us": {}}
        c = self.CHUNK[k["TOY_CHUNK"]]
        lat = {n: v * c * (f if n.startswith("full") else self.STEP[k["STEP_BLOCK"]]) for n, v in base.items()}
        return {**res, "status": "ok", "latencies_us": lat}


# ------------------------------------------------------------------------------------------------
# records
# ------------------------------------------------------------------------------------------------
def _opp(**kw):
    d = dict(id="O0001", step=0, kind="initial", mechanism="m", entry_points=["toy.full"], target_workloads=[],
             evidence=["E0000"], evidence_notes="", applies_to=["I0000"], created_by="t")
    d.update(kw)
    return d


def test_records_validate_and_are_write_once(tmp_path):
    rec = ir.validate("opportunity", _opp())
    assert rec.priority == 0.0 and rec.details == {}
    ir.write_record(str(tmp_path), rec)
    ir.write_record(str(tmp_path), rec)  # identical rewrite: no-op
    assert ir.load_record(str(tmp_path), "opportunity", "O0001") == rec
    with pytest.raises(ir.RecordConflict):
        ir.write_record(str(tmp_path), ir.validate("opportunity", _opp(mechanism="other")))
    for bad, msg in ((_opp(id="X1"), "does not match"), (_opp(step="0"), "expected an integer"),
                     (_opp(kind="guess"), "expected one of"), (_opp(extra=1), "unknown fields"),
                     ({k: v for k, v in _opp().items() if k != "applies_to"}, "missing field"),
                     (_opp(applies_to="I0000"), "expected a list"), (_opp(priority=True), "expected a number")):
        with pytest.raises(ir.SchemaError, match=msg):
            ir.validate("opportunity", bad)
    # a corrupted file on disk is refused on load
    p = ir.record_path(str(tmp_path), "opportunity", "O0001")
    with open(p) as f:
        data = json.load(f)
    data["evidence"] = "E0000"
    with open(p, "w") as f:
        json.dump(data, f)
    with pytest.raises(ir.SchemaError):
        ir.load_record(str(tmp_path), "opportunity", "O0001")


def test_spec_shipped_and_frozen():
    h = S.freeze(S.load("h200_attention"))
    names = S.workload_names(h)
    assert len(names) == 50 and all(w["root_latency_us"] is None for w in h["workloads"])
    assert {"prefill_b16_L16384", "train_b1_L1152", "decode_b16_ctx8192", "decode_b256_mixed"} <= set(names)
    assert h["model"] == {"heads_q": 32, "heads_kv": 8, "head_dim": 128, "dtype": "bfloat16"}
    q = S.freeze(S.load("h200_attention"), quick=True)
    assert "prefill_b16_L16384" not in S.workload_names(q) and "decode_b256_mixed" in S.workload_names(q)
    assert S.criteria_hash(h) != S.criteria_hash(q)
    with pytest.raises(S.SpecError, match="duplicate"):
        bad = S.load("cpu_toy")
        bad["workloads"].append(dict(bad["workloads"][0]))
        S.validate(bad)


def test_promotion_rule():
    spec = S.freeze(S.load("cpu_toy"))
    base = {w["name"]: 1000.0 for w in spec["workloads"]}
    spec = S.with_baseline(spec, base, audit_id="E0000", env={}, measured_at="now")
    T0 = S.objective(spec, base)
    faster = {n: 700.0 for n in base}
    assert is_promotion(spec, score(spec, "ok", faster), T0)
    assert not is_promotion(spec, score(spec, "ok", dict(base)), T0)            # a tie is not an improvement
    for st in ("compile_error", "runtime_error", "contract_violation", "inaccurate", "timeout", "infra_error"):
        assert not is_promotion(spec, score(spec, st, faster), T0)             # failures never score
    one_slow = dict(faster, step_b1_ctx48=1000.0 * 1.5 + 1)                     # lower T, one workload over
    sc = score(spec, "ok", one_slow)
    assert sc["objective_us"] < T0 and sc["limit_violations"] == ["step_b1_ctx48"]
    assert not is_promotion(spec, sc, T0)
    partial = {n: 1.0 for n in list(base)[:-1]}                                 # not fully measured
    assert score(spec, "ok", partial)["objective_us"] is None
    assert not is_promotion(spec, score(spec, "ok", partial), T0)


def test_edits_and_knobs():
    files = E.read_files(TOY)
    ks = E.discover_knobs(files, "cpu")
    assert ks["TOY_CHUNK"].coupled and ks["TOY_CHUNK"].file == "contract.py" and ks["TOY_CHUNK"].choices == (8, 16, 32)
    assert not ks["ROW_BLOCK"].coupled and ks["ROW_BLOCK"].value == 1
    new = E.apply_edits(files, [E.knob_edit(files, ks["TOY_CHUNK"], 32)])
    assert E.changed_files(files, new) == ["contract.py"]  # a coupled knob is one edit, every path reads it
    assert E.knob_values(new)["TOY_CHUNK"] == 32
    # per-device dict knobs (tik_v1 style)
    src = {"attention.py": 'X = 1\nPREFILL_BLOCK_M = {"gpu": 128, "cpu": 32}\nKNOBS = {"coupled": {}, '
                           '"free": {"PREFILL_BLOCK_M": (64, 128)}}\n'}
    k = E.discover_knobs(src, "gpu")["PREFILL_BLOCK_M"]
    out = E.apply_edits(src, [E.knob_edit(src, k, 64)])
    assert 'PREFILL_BLOCK_M = {"gpu": 64, "cpu": 32}' in out["attention.py"]
    # SEARCH/REPLACE text format and its failures
    text = "FILE: toy.py\n<<<<<<< SEARCH\nROW_BLOCK = 1    # free: query rows per block in full()\n=======\n" \
           "ROW_BLOCK = 4    # free: query rows per block in full()\n>>>>>>> REPLACE\n"
    eds = E.parse_search_replace(text)
    assert E.knob_values(E.apply_edits(files, eds))["ROW_BLOCK"] == 4
    with pytest.raises(E.EditError, match="not found"):
        E.apply_edits(files, [{"file": "toy.py", "search": "ROW_BLOCK = 2\n", "replace": "x"}])
    with pytest.raises(E.EditError, match="occurs"):
        E.apply_edits(files, [{"file": "toy.py", "search": "import", "replace": "x"}])
    with pytest.raises(E.EditError, match="manifest"):
        E.apply_edits(files, [{"file": "manifest.json", "op": "write", "content": "{}"}])
    with pytest.raises(E.EditError, match="not valid Python"):
        E.apply_edits(files, [{"file": "toy.py", "search": "def full(q, k, v):", "replace": "def full(q, k, v)"}])
    with pytest.raises(E.EditError, match="markers"):
        E.parse_search_replace("<<<<<<< SEARCH\nx\n=======\ny\n>>>>>>> REPLACE\n")


def test_toy_manifest_hash_is_current():
    assert loader.read_manifest(TOY)["source_hash"] == loader.compute_source_hash(TOY)


# ------------------------------------------------------------------------------------------------
# the loop with the knob driver
# ------------------------------------------------------------------------------------------------
def _run(tmp_path, name="run", **search):
    return Run.create(os.path.join(str(tmp_path), name), toy_spec(tmp_path, **search), TOY)


def _check_invariants(run):
    st = run.state()
    failed = {a.implementation for a in run.audits.values() if not a.verified}
    for a in run.actions.values():
        assert not set(a.parents) & failed, f"{a.id} used a failed parent"
        for p in a.parents:
            assert run.audits[ir.make_id("audit", ir.id_number(p))].verified
    for o in run.opps.values():
        assert not set(o.applies_to) & failed
    assert not (set(st.frontier(run.opps)) | set(st.archive(run.opps))) & failed
    for a in run.audits.values():
        if a.promoted:
            assert a.status == "ok" and a.admissible
    # kappa = consecutive non-promotions since the last promotion
    k = 0
    for h in st.history[1:]:
        k = 0 if h.get("promoted") else k + 1
        assert h["kappa"] == k
    assert st.kappa == k
    # every offspring is a new complete folder whose manifest names its parent, hash verified
    for iid, rec in run.impls.items():
        if iid == "I0000" or not rec.materialized:
            continue
        man = loader.read_manifest(run.impl_dir(iid))
        assert man["search"]["parents"] == rec.parents and man["name"].endswith(iid)
        assert loader.compute_source_hash(run.impl_dir(iid)) == man["source_hash"] == rec.source_hash
    return st


def test_knob_driver_loop(tmp_path):
    run = _run(tmp_path, kappa_max=6, max_steps=30)
    summary = run_search(run, KnobsDriver(), FakeEvaluator())
    st = _check_invariants(run)
    assert summary["speedup"] > 3.0
    best = run.impls[st.best].knobs
    assert best["ROW_BLOCK"] == 16 and best["STEP_BLOCK"] in (4, 16) and best["TOY_CHUNK"] == 32
    statuses = {a.status for a in run.audits.values()}
    assert {"compile_error", "contract_violation", "ok"} <= statuses
    decisions = {d.decision for d in run.decisions.values()}
    assert {"CONTINUE", "ABANDON"} <= decisions
    # coupled knob moves touch contract.py only (one constant moves every path)
    for a in run.actions.values():
        if "TOY_CHUNK" in a.knob_moves:
            assert {e["file"] for e in a.edits} <= {"contract.py"}
    # a verified non-best intermediate was continued (used as a parent while another was the best)
    best_at = {}
    cur = "I0000"
    for h in st.history:
        best_at[h["step"]] = cur
        cur = h["best"]
    assert any(a.parents[0] != best_at[a.step] for a in run.actions.values())
    assert run.meta["stopped"]["reason"]
    assert run.phase() == "done"


def test_merge_of_compatible_branches(tmp_path):
    run = _run(tmp_path, kappa_max=20, max_steps=40)
    run_search(run, KnobsDriver(), FakeEvaluator())
    _check_invariants(run)
    merges = [a for a in run.actions.values() if len(a.parents) == 2]
    assert merges, "the knob driver should merge compatible improvements of two branches"
    for a in merges:
        o = run.opps[a.opportunity]
        assert o.kind == "merge" and o.applies_to == a.parents
        k0, k1 = run.impls[a.parents[0]].knobs, run.impls[a.parents[1]].knobs
        child = run.impls[a.offspring].knobs
        root = run.impls["I0000"].knobs
        for n in child:
            assert child[n] in (k0[n], k1[n])
            if k1[n] != root[n]:
                assert child[n] == k1[n]
    assert any(d.decision == "MERGE" for d in run.decisions.values())


def test_resume_is_exact_after_interruptions(tmp_path):
    ref = _run(tmp_path, "ref", kappa_max=5, max_steps=12)
    run_search(ref, KnobsDriver(), FakeEvaluator())
    path = os.path.join(str(tmp_path), "int")
    run = Run.create(path, toy_spec(tmp_path, kappa_max=5, max_steps=12), TOY)
    # Ctrl-C during the 4th evaluation (an offspring's audit), then twice more
    for n in (4, 3, 5):
        with pytest.raises(KeyboardInterrupt):
            run_search(run, KnobsDriver(), FakeEvaluator(interrupt_at=n))
        run.close()
        run = Run.open(path)
        assert run.phase() == "audit"
    run_search(run, KnobsDriver(), FakeEvaluator())
    _check_invariants(run)

    def strip(recs, drop=("wall_s", "evaluated_at")):
        return [{k: v for k, v in ir.to_json(r).items() if k not in drop} for r in recs.values()]

    assert strip(run.actions) == strip(ref.actions)
    assert strip(run.audits) == strip(ref.audits)
    assert strip(run.decisions) == strip(ref.decisions)
    assert strip(run.opps) == strip(ref.opps)
    assert run.state().best == ref.state().best


def test_repair_of_half_written_steps(tmp_path):
    run = _run(tmp_path, max_steps=3)
    ev = FakeEvaluator()
    run.initialize(ev)
    KnobsDriver().initial_decision(run)
    a = KnobsDriver().act(run)
    h = run.impls[a.offspring].source_hash
    # crash after the action record, before the offspring folder / record were finished
    shutil.rmtree(run.impl_dir(a.offspring))
    ir.remove_record(run.root, "implementation", a.offspring)
    os.makedirs(run.path("impls", ".I0009.tmp"))
    # and an opportunity written by a decision that never landed
    ir.write_record(run.root, ir.validate("opportunity", _opp(id="O0999", step=1)))
    run.close()
    run = Run.open(run.root)
    assert run.phase() == "audit" and run.impls[a.offspring].source_hash == h
    assert "O0999" not in run.opps and not os.path.exists(run.path("impls", ".I0009.tmp"))
    run.audit(ev)
    KnobsDriver().decide(run)
    assert run.phase() == "action"


def test_rules_are_enforced(tmp_path):
    run = _run(tmp_path, max_steps=10)
    ev = FakeEvaluator()
    with pytest.raises(RunError, match="expects"):
        run.decide(decision="CONTINUE", interpretation="", rationale="")
    run.initialize(ev)
    KnobsDriver().initial_decision(run)
    pending = run.state().pending
    opp = next(o for o in pending if run.opps[o].details["knob_moves"] == {"TOY_CHUNK": 8})
    with pytest.raises(RunError, match="not a verified"):
        run.record_action(opportunity=opp, parents=["I0005"], edits=[], kind="joint")
    with pytest.raises(RunError, match="not pending"):
        run.record_action(opportunity="O0999", parents=["I0000"], edits=[], kind="joint")
    files = run.files_of("I0000")
    k = run.knobs_of("I0000")["TOY_CHUNK"]
    a = run.record_action(opportunity=opp, parents=["I0000"], edits=[E.knob_edit(files, k, 8)], kind="joint")
    with pytest.raises(RunError, match="no audit awaits"):
        run.decide(decision="CONTINUE", interpretation="", rationale="")
    au = run.audit(ev)
    assert au.status == "contract_violation" and not au.verified and au.kappa_after == 1
    # a failed offspring can only be retried from a verified parent or abandoned
    with pytest.raises(RunError, match="only RETRY"):
        run.decide(decision="ARCHIVE", interpretation="", rationale="")
    with pytest.raises(RunError, match="not verified"):
        run.decide(decision="RETRY", interpretation="", rationale="",
                   new_opportunities=[{"mechanism": "again", "applies_to": [a.offspring]}])
    run.decide(decision="RETRY", interpretation="", rationale="",
               new_opportunities=[{"kind": "retry", "mechanism": "again", "applies_to": ["I0000"]}])
    new = run.state().pending[-1]
    with pytest.raises(RunError, match="not a verified"):
        run.record_action(opportunity=new, parents=[a.offspring], edits=[], kind="joint")
    # an edit that does not apply still creates an action + implementation record, audited as a failure
    b = run.record_action(opportunity=new, parents=["I0000"],
                          edits=[{"file": "toy.py", "search": "NOT THERE\n", "replace": "x\n"}], kind="joint")
    assert b.apply_error and not run.impls[b.offspring].materialized
    au = run.audit(ev)
    assert au.status == "compile_error" and au.stage == "build" and au.kappa_after == 2
    # tampering with a record is detected on load
    run.decide(decision="ABANDON", interpretation="", rationale="")
    run.close()
    p = ir.record_path(run.root, "audit", au.id)
    with open(p) as f:
        data = json.load(f)
    data["kappa_after"] = 0
    with open(p, "w") as f:
        json.dump(data, f)
    with pytest.raises(CorruptRun, match="kappa"):
        Run.open(run.root)
    data["kappa_after"] = 2
    with open(p, "w") as f:
        json.dump(data, f)
    Run.open(run.root).close()
    with open(run.path("spec.json")) as f:
        spec = json.load(f)
    spec["max_slowdown"] = 9.0
    with open(run.path("spec.json"), "w") as f:
        json.dump(spec, f)
    with pytest.raises(CorruptRun, match="immutable"):
        Run.open(run.root)


def test_kappa_max_stops_the_search(tmp_path):
    run = _run(tmp_path, kappa_max=2, max_steps=50)

    class AllFail(FakeEvaluator):
        def evaluate(self, run, iid, progress=None):
            r = super().evaluate(run, iid, progress)
            return r if iid == "I0000" else {**r, "status": "timeout", "latencies_us": {}}

    s = run_search(run, KnobsDriver(), AllFail())
    assert s["steps"] == 2 and s["kappa"] == 2 and "kappa" in s["stopped"]["reason"]
    assert s["best"] == "I0000"
    _check_invariants(run)


def test_changed_environment_is_an_infra_error(tmp_path):
    run = _run(tmp_path, max_steps=5)
    run.initialize(FakeEvaluator())
    KnobsDriver().initial_decision(run)
    opp = next(o for o in run.state().pending if run.opps[o].details["knob_moves"] == {"ROW_BLOCK": 4})
    files = run.files_of("I0000")
    run.record_action(opportunity=opp, parents=["I0000"], kind="full_sequence",
                      edits=[E.knob_edit(files, run.knobs_of("I0000")["ROW_BLOCK"], 4)])

    class Moved(FakeEvaluator):
        def evaluate(self, run, iid, progress=None):
            return dict(super().evaluate(run, iid, progress), env={"cpu_model": "another machine"})

    au = run.audit(Moved())
    assert au.status == "infra_error" and "environment" in au.error
    assert not au.promoted and au.latencies_us == {} and au.kappa_after == 1


def test_changed_evaluator_refuses_to_audit(tmp_path):
    from areal_tik_plugin.search.evaluator import BindingError, Evaluator

    run = _run(tmp_path, max_steps=5)
    run.initialize(FakeEvaluator())
    run.meta["evaluator_hash"] = "0" * 64  # as if worker/runner/bench/loader changed since creation
    with pytest.raises(BindingError, match="start a new run"):
        Evaluator().evaluate(run, "I0000")
