"""Plan driver: plays a coding agent's actions written down before the evaluator runs.

The H200 is reached only in batch calls of at most ten minutes, so the agent cannot answer each
audit live. It writes a *plan*: the initial opportunities, then steps, each one action (the source
edit, its expected effect, numerical risks and falsifier) and the agent's branch decisions for the
outcomes the audit can have (promoted / verified / failed). This driver replays the plan through the
same records as the step-by-step verbs (``record_action``, ``audit``, ``decide``), so promotion, the
contract checks and the A/B rounds are the evaluator's as always. Each decision's interpretation is
the agent's text for that branch followed by the audit's facts (status, stage, T, the A/B verdict,
the first error), so the record says both what was expected and what was measured. Between calls
the agent reads the audits and writes the next plan for the same run directory (it resumes).

Plan file (YAML or JSON; ``edits`` / ``from_dir`` paths are relative to the plan file)::

    root: tik_v2                   # optional: the root implementation the plan is written for (checked
                                   # against the run's; benchmarks/gpu_search.sh takes it as IMPL's default)
    initial:                       # the root's lineage decision (used only right after `init`)
      interpretation: "..."
      rationale: "..."
      opportunities:               # O_0; `key` names each one for the steps
        - {key: bm128, mechanism: "...", entry_points: [attention.prefill], target_workloads: [...],
           evidence_notes: "...", priority: 1.0}          # applies_to defaults to [root]
    steps:
      - opportunity: bm128         # the key of a pending opportunity (O_0 or a follow-up)
        parents: [root]            # root, or keys: the offspring of the step that took that opportunity
        edits: attn/bm128.edits    # SEARCH/REPLACE blocks (or from_dir: a complete tree)
        kind: full_sequence
        expected_effect: "..."
        numerical_risks: "..."
        falsifier: "..."
        on_promoted: {decision: CONTINUE, interpretation: "...", rationale: "...",
                      opportunities: [{key: bm128-ws, applies_to: [self], ...}]}
        on_verified: {decision: ARCHIVE, interpretation: "...", rationale: "..."}
        on_slower:   {decision: ARCHIVE, interpretation: "...", rationale: "..."}
        on_failed:   {decision: ABANDON, interpretation: "...", rationale: "..."}

``applies_to`` entries: ``self`` (the implementation just audited), ``root`` or a step key. A step
whose opportunity is no longer pending, or whose parents did not come out verified, is skipped with
the reason printed; when no step is left the driver stops the run ("plan exhausted").
``on_slower`` is taken by a verified offspring that is slower than its first parent or over a
workload's limit (a verified regression, which a chain should not build on); without it such an
offspring is ARCHIVEd. A missing ``on_promoted`` falls back to ``on_verified``; a missing branch is
ARCHIVE (verified) or ABANDON (failed) with an interpretation that says the plan had none.
"""

from __future__ import annotations

import os
from typing import Any

from areal_tik_plugin.search import ir

BRANCH_KEYS = ("decision", "interpretation", "rationale", "opportunities", "close", "abandon")
STEP_KEYS = ("opportunity", "parents", "edits", "from_dir", "kind", "expected_effect", "numerical_risks",
             "falsifier", "tokens", "targeted_workloads", "scope", "on_promoted", "on_verified", "on_slower",
             "on_failed")
OPP_KEYS = ("key", "mechanism", "entry_points", "target_workloads", "evidence", "evidence_notes", "applies_to",
            "priority", "kind")


class PlanError(ValueError):
    """The plan file is malformed; the message names the field and what was expected."""


def _load(path: str) -> dict[str, Any]:
    if not os.path.isfile(path):
        raise PlanError(f"plan {path!r}: no such file (expected a YAML or JSON plan, see search/drivers/plan.py)")
    with open(path) as f:
        text = f.read()
    if path.endswith((".yaml", ".yml")):
        import yaml

        data = yaml.safe_load(text)
    else:
        import json

        data = json.loads(text)
    if not isinstance(data, dict) or not isinstance(data.get("steps"), list):
        raise PlanError(f"plan {path!r}: expected a mapping with a 'steps' list")
    return data


def _check_keys(where: str, obj: Any, allowed: tuple) -> None:
    if not isinstance(obj, dict):
        raise PlanError(f"{where}: expected a mapping, got {type(obj).__name__}")
    bad = sorted(set(obj) - set(allowed))
    if bad:
        raise PlanError(f"{where}: unknown field(s) {bad}; expected some of {list(allowed)}")


def validate_plan(plan: dict[str, Any], base_dir: str) -> None:
    """Static checks before anything is recorded: fields, keys, files, branch decisions."""
    keys = set()
    if "root" in plan and not (isinstance(plan["root"], str) and plan["root"]):
        raise PlanError(f"root: expected the name of the root implementation, got {plan['root']!r}")
    init = plan.get("initial")
    if init is not None:
        _check_keys("initial", init, ("interpretation", "rationale", "opportunities"))
        for i, o in enumerate(init.get("opportunities") or []):
            _check_opp(f"initial.opportunities[{i}]", o, keys)
    for i, s in enumerate(plan["steps"]):
        where = f"steps[{i}]"
        _check_keys(where, s, STEP_KEYS)
        if not s.get("opportunity"):
            raise PlanError(f"{where}: 'opportunity' (a key) is required")
        if not isinstance(s.get("parents", ["root"]), list) or not s.get("parents", ["root"]):
            raise PlanError(f"{where}.parents: expected a non-empty list of 'root' or step keys")
        if bool(s.get("edits")) == bool(s.get("from_dir")):
            raise PlanError(f"{where}: give exactly one of 'edits' (SEARCH/REPLACE file) or 'from_dir'")
        p = os.path.join(base_dir, s.get("edits") or s.get("from_dir"))
        if not os.path.exists(p):
            raise PlanError(f"{where}: {p} does not exist")
        for b in ("on_promoted", "on_verified", "on_slower", "on_failed"):
            if b in s:
                _check_keys(f"{where}.{b}", s[b], BRANCH_KEYS)
                if not s[b].get("decision"):
                    raise PlanError(f"{where}.{b}: 'decision' is required")
                for j, o in enumerate(s[b].get("opportunities") or []):
                    _check_opp(f"{where}.{b}.opportunities[{j}]", o, keys)
                # the run refuses a CONTINUE with no follow-up on the implementation just audited (state.py):
                # say so at load, not after the step's device time is spent
                if s[b]["decision"] == "CONTINUE" and b != "on_failed" and not any(
                        "self" in (o.get("applies_to") or ["self"]) or s["opportunity"] in (o.get("applies_to") or [])
                        for o in s[b].get("opportunities") or []):
                    raise PlanError(f"{where}.{b}: CONTINUE builds on this step's implementation, so it needs an "
                                    "opportunity with applies_to [self]; use ARCHIVE to follow up on another one")
        if "on_failed" in s and s["on_failed"]["decision"] not in ("ABANDON", "RETRY"):
            raise PlanError(f"{where}.on_failed: a failed offspring allows only ABANDON or RETRY, "
                            f"got {s['on_failed']['decision']!r}")


def _check_opp(where: str, o: Any, keys: set) -> None:
    _check_keys(where, o, OPP_KEYS)
    if not o.get("key"):
        raise PlanError(f"{where}: 'key' is required (steps name opportunities by key)")
    if o["key"] in keys or o["key"] in ("root", "self"):
        raise PlanError(f"{where}: key {o['key']!r} is used twice (or is reserved: root, self)")
    keys.add(o["key"])


class PlanDriver:
    name = "plan"

    def __init__(self, plan: str, created_by: str = "agent-plan"):
        self.path = os.path.abspath(plan)
        self.base = os.path.dirname(self.path)
        self.plan = _load(self.path)
        validate_plan(self.plan, self.base)
        self.created_by = created_by
        self.skipped: list[str] = []

    # ---- key resolution (keys live in the opportunities' details, so a resumed run finds them) ------
    @staticmethod
    def _opp_by_key(run, key: str) -> ir.Opportunity | None:
        hits = [o for o in run.opps.values() if o.details.get("plan_key") == key]
        return hits[-1] if hits else None

    def _impl_of_key(self, run, key: str) -> str | None:
        if key == "root":
            return "I0000"
        if key.startswith("I") and key in run.impls:
            return key
        o = self._opp_by_key(run, key)
        if o is None:
            return None
        for a in run.actions.values():
            if a.opportunity == o.id:
                return a.offspring
        return None

    def _opps(self, run, raw: list[dict[str, Any]], current: str, evidence: str) -> list[dict[str, Any]]:
        out = []
        for o in raw or []:
            o = dict(o)
            key = o.pop("key")
            apps = []
            for k in o.get("applies_to") or ["self"]:
                iid = current if k == "self" else self._impl_of_key(run, k)
                if iid is None:
                    raise PlanError(f"opportunity {key!r}: applies_to {k!r} names no implementation of this run")
                apps.append(iid)
            o["applies_to"] = apps
            o.setdefault("evidence", [evidence])
            o["details"] = {"plan_key": key, "plan": os.path.basename(self.path)}
            out.append(o)
        return out

    # ---- driver API ---------------------------------------------------------------------------------
    def initial_decision(self, run) -> ir.LineageDecision:
        init = self.plan.get("initial")
        if not init:
            raise PlanError(f"{self.path}: the run is right after init, so the plan needs 'initial' (O_0)")
        want, got = self.plan.get("root"), run.meta.get("root_name")
        if want and want != got:
            raise PlanError(f"{self.path}: written for the root {want!r}, but this run's root is {got!r} "
                            f"(a new run takes its root from --impl)")
        au = run.audits["E0000"]
        return run.decide(decision="CONTINUE",
                          interpretation=(init.get("interpretation") or "") + " | " + self._facts(run, au),
                          rationale=init.get("rationale") or "",
                          new_opportunities=self._opps(run, init.get("opportunities"), "I0000", "E0000"),
                          created_by=self.created_by)

    def _next_step(self, run) -> dict[str, Any] | None:
        st = run.state()
        used = {a.opportunity for a in run.actions.values()}
        for i, s in enumerate(self.plan["steps"]):
            o = self._opp_by_key(run, s["opportunity"])
            if o is not None and o.id in used:
                continue  # done in this or an earlier call
            tag = f"plan step {i} ({s['opportunity']})"
            if o is None or o.id not in st.pending:
                why = "no such opportunity" if o is None else f"{o.id} is not pending"
                self._skip(f"{tag}: {why}")
                continue
            parents = [self._impl_of_key(run, k) for k in s.get("parents", ["root"])]
            bad = [k for k, p in zip(s.get("parents", ["root"]), parents) if p is None or p not in st.verified]
            if bad:
                self._skip(f"{tag}: parent(s) {bad} not verified")
                continue
            return {**s, "_opp": o.id, "_parents": parents}
        return None

    def _skip(self, msg: str) -> None:
        if msg not in self.skipped:
            self.skipped.append(msg)
            print(f"plan: skipped {msg}", flush=True)

    def stop_reason(self, run) -> str | None:
        if self._next_step(run) is None:
            return (f"plan exhausted ({os.path.basename(self.path)}: {len(self.plan['steps'])} steps, "
                    f"{len(self.skipped)} skipped)")
        return None

    def act(self, run) -> ir.Action:
        from areal_tik_plugin.search import edits as E

        s = self._next_step(run)
        if s is None:
            raise PlanError("plan exhausted: no step left to act on")
        parent = s["_parents"][0]
        if s.get("edits"):
            with open(os.path.join(self.base, s["edits"])) as f:
                edits = E.parse_search_replace(f.read())
        else:
            edits = E.edits_from_dirs(run.files_of(parent), E.read_files(os.path.join(self.base, s["from_dir"])))
        return run.record_action(
            opportunity=s["_opp"], parents=s["_parents"], edits=edits, kind=s.get("kind", "joint"),
            targeted_workloads=s.get("targeted_workloads"), scope=s.get("scope", ""),
            expected_effect=s.get("expected_effect", ""), numerical_risks=s.get("numerical_risks", ""),
            falsifier=s.get("falsifier", ""), created_by=self.created_by,
            llm={"total_tokens": int(s["tokens"])} if s.get("tokens") else None, merge=not s.get("from_dir"))

    @staticmethod
    def _slower(run, au: ir.Audit, act: ir.Action) -> bool:
        parent = run.audits[ir.make_id("audit", ir.id_number(act.parents[0]))]
        return bool(au.limit_violations) or bool(au.objective_us and parent.objective_us
                                                 and au.objective_us > parent.objective_us)

    @staticmethod
    def _facts(run, au: ir.Audit) -> str:
        bits = [f"audit {au.id}: {au.status} at stage {au.stage}"]
        if au.objective_us:
            root = run.audits["E0000"].objective_us
            bits.append(f"T={au.objective_us:.1f}us (x{root / au.objective_us:.3f} of the root)")
        ab = (au.timing or {}).get("ab") or {}
        if ab.get("verdict"):
            bits.append(f"A/B {ab['verdict']}")
        if au.limit_violations:
            bits.append(f"limit violations {au.limit_violations[:6]}")
        if au.promoted:
            bits.append("PROMOTED")
        if au.error:
            bits.append(f"error: {au.error[:300]}")
        return "; ".join(str(b) for b in bits)

    def decide(self, run) -> ir.LineageDecision:
        st = run.state()
        au = run.audits[ir.make_id("audit", st.open_step)]
        act = run.actions[ir.make_id("action", st.open_step)]
        key = run.opps[act.opportunity].details.get("plan_key")
        step = next((s for s in self.plan["steps"] if s["opportunity"] == key), {})
        if au.verified and not au.promoted and self._slower(run, au, act):
            br = step.get("on_slower") or {
                "decision": "ARCHIVE", "interpretation": "verified but slower than its parent (or over a limit)",
                "rationale": "a regression is not built on; kept in the archive as evidence"}
        elif au.verified:
            br = step.get("on_promoted") if au.promoted and step.get("on_promoted") else step.get("on_verified")
            br = br or {"decision": "ARCHIVE", "interpretation": "the plan has no branch for a verified offspring",
                        "rationale": "kept in the archive for a later plan"}
        else:
            br = step.get("on_failed") or {"decision": "ABANDON",
                                           "interpretation": "the plan has no branch for a failed offspring",
                                           "rationale": "a failure stays as evidence"}
        return run.decide(decision=br["decision"],
                          interpretation=(br.get("interpretation") or "") + " | " + self._facts(run, au),
                          rationale=br.get("rationale") or "",
                          new_opportunities=self._opps(run, br.get("opportunities"), au.implementation, au.id),
                          close=[self._opp_by_key(run, k).id for k in br.get("close") or [] if self._opp_by_key(run, k)],
                          abandon=[x for x in (self._impl_of_key(run, k) for k in br.get("abandon") or []) if x],
                          created_by=self.created_by)
