"""Run directory and search state Z_t = <S, G_t, F_t, R_t, O_t, I*_t, kappa_t> (paper §4.3, §5).

Layout of a run directory::

    run.json                  run metadata: hashes bound at creation, budgets, stop reason (mutable)
    spec.json                 the frozen evaluation specification S (+ the measured root baseline)
    records/<kind>/<id>.json  IR records, one file each, write-once (see ``ir``)
    impls/I0000/ ...          complete source trees: the root snapshot and every offspring
    work/                     evaluator scratch (results and logs of evaluations)

The state is never stored as the source of truth: :func:`replay` rebuilds it from the records, step
by step, re-checking every rule (parents verified and retained, opportunities pending, promotion and
kappa exactly as recorded). A step is written in a fixed order -- action, offspring folder +
implementation record, audit, opportunities + decision -- so an interruption anywhere leaves a
prefix that :meth:`Run.open` completes or cleans deterministically; the run then resumes exactly at
the phase where it stopped.

Promotion (paper §5.3): an offspring replaces I* only if it is verified, fully measured, within every
workload's limit and has strictly lower T(I) = sum_w c_w lat(I, w). Otherwise kappa increases by one,
including ties and failed audits. Frontier / archive: a retained verified implementation is in F_t
when some pending opportunity applies to it, else in R_t.
"""

from __future__ import annotations

import copy
import fcntl
import os
import shutil
import time
from dataclasses import dataclass, field
from typing import Any

from areal_tik_plugin.runtime import loader
from areal_tik_plugin.search import edits as E
from areal_tik_plugin.search.export import EVIDENCE_FILE
from areal_tik_plugin.search import ir
from areal_tik_plugin.search import spec as S

RUN_SCHEMA = "areal-tik-search-run/1"


class RunError(RuntimeError):
    """An operation is not allowed in the run's current state (message says what is expected)."""


class CorruptRun(RuntimeError):
    """The records of a run contradict each other or the rules."""


class RootInvalid(RuntimeError):
    """The root failed its audit: the search cannot start (paper Algorithm 1, line 2)."""


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


# ------------------------------------------------------------------------------------------------
# state
# ------------------------------------------------------------------------------------------------
@dataclass
class State:
    t: int = 0                                           # completed steps (actions whose decision is recorded)
    phase: str = "init"                                  # init | decide | action | audit | done
    graph: dict[str, list[str]] = field(default_factory=dict)   # implementation -> parents (G_t)
    verified: set[str] = field(default_factory=set)
    retained: set[str] = field(default_factory=set)
    pending: list[str] = field(default_factory=list)     # O_t (opportunity ids, creation order)
    consumed: dict[str, str] = field(default_factory=dict)  # opportunity -> action that used it
    best: str | None = None                              # I*_t
    best_objective_us: float | None = None
    kappa: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)  # per audit: step, impl, status, T, best T
    tokens: int = 0
    time_used_s: float = 0.0
    open_step: int | None = None                         # step whose action exists but is not decided
    revoked: dict[str, str] = field(default_factory=dict)   # implementation -> revocation id

    def frontier(self, opps: dict[str, ir.Opportunity]) -> list[str]:
        live = {i for o in self.pending for i in opps[o].applies_to}
        return sorted((i for i in self.retained if i in live), key=ir.id_number)

    def archive(self, opps: dict[str, ir.Opportunity]) -> list[str]:
        f = set(self.frontier(opps))
        return sorted((i for i in self.retained if i not in f), key=ir.id_number)


def ab_verdict(spec: dict, ab: dict | None) -> dict[str, Any] | None:
    """The A/B part of the promotion rule, from the per-round objective ratios candidate / incumbent
    measured interleaved in one process (``timing.ab.objective_ratios``).

    gain = 1 - median(ratios); noise = 1.4826 * median(|ratio - median|) (the robust spread of the
    rounds). The candidate is faster only if (a) it won enough rounds (ratio < 1) for a one-sided sign
    test at level ``search.ab_alpha`` (default 0.01): an unchanged kernel wins each round with
    probability 1/2, so e.g. 7 of 7 or 10 of 11 wins happen by chance with probability < 1 % (one
    round hit by a stall of the shared machine is tolerated from 10 rounds on), and (b) gain >
    max(improve_eps, noise_k * noise): a gain inside the spread of its own rounds is not evidence.
    With too few rounds for the level nothing is ever promoted, and the verdict says so. None when the
    audit has no A/B measurement."""
    ratios = (ab or {}).get("objective_ratios")
    if not ratios:
        return None
    import math
    import statistics

    med = float(statistics.median(ratios))
    noise = 1.4826 * float(statistics.median(abs(r - med) for r in ratios))
    se = spec.get("search", {})
    eps = float(se.get("improve_eps", 0.02))
    k = float(se.get("noise_k", 3.0))
    alpha = float(se.get("ab_alpha", 0.01))
    n = len(ratios)
    need_wins = next((m for m in range(1, n + 1)
                      if sum(math.comb(n, j) for j in range(m, n + 1)) / 2 ** n <= alpha), None)
    wins = sum(1 for r in ratios if r < 1.0)
    needed = max(eps, k * noise)
    gain = 1.0 - med
    out = {"ratio_median": med, "ratio_worst": float(max(ratios)), "noise": noise, "gain": gain, "needed": needed,
           "improve_eps": eps, "noise_k": k, "wins": wins, "needed_wins": need_wins, "ab_alpha": alpha,
           "faster": need_wins is not None and wins >= need_wins and gain > needed, "rounds": n}
    if need_wins is None:
        out["why"] = f"{n} rounds cannot reach the sign-test level {alpha}: raise evaluation.timing.ab_rounds"
    return out


def is_promotion(spec: dict, audit_fields: dict, best_objective: float | None, ab: dict | None = None,
                 best: str | None = None) -> bool:
    """Paper §5.3: verified, fully measured, every workload within its limit, strictly lower T.

    With an A/B measurement (every audit of the real evaluator after the root's) "lower T" is the
    interleaved comparison against the incumbent that was best when the audit ran
    (:func:`ab_verdict`); a measurement against any other implementation never promotes. Without one
    (recorded fakes in tests) the recorded objectives are compared."""
    if not audit_fields["verified"] or not audit_fields["fully_measured"] or not audit_fields["admissible"]:
        return False
    T = audit_fields["objective_us"]
    if T is None:
        return False
    if ab is not None and ("objective_ratios" in ab or "incumbent" in ab):
        v = ab_verdict(spec, ab)
        return bool(v and v["faster"] and ab.get("incumbent") == best)
    return best_objective is None or T < best_objective


def share(spec: dict, latencies: dict[str, float]) -> dict[str, float]:
    """Each workload's share of T = sum_w c_w lat_w (where the time goes; SKILL.md's ``share``)."""
    T = S.objective(spec, latencies)
    if not T:
        return {}
    return {w["name"]: round(float(w["weight"]) * float(latencies[w["name"]]) / T, 4) for w in spec["workloads"]}


def score(spec: dict, status: str, latencies: dict[str, float], ab: dict | None = None) -> dict[str, Any]:
    """verified / fully_measured / admissible / T / violations from an evaluator result. With an A/B
    measurement that timed the root in the same rounds, the per-workload limits use those ratios
    (candidate / root, median over rounds) instead of the root latency measured at initialization."""
    verified = status == "ok"
    T = S.objective(spec, latencies) if verified else None
    fully = T is not None
    if verified and ab and isinstance(ab.get("root_ratio"), dict):
        rr = ab["root_ratio"]
        viol = [w["name"] for w in spec["workloads"]
                if w["name"] not in rr or float(rr[w["name"]]) > float(w["max_slowdown"])]
    else:
        viol = S.limit_violations(spec, latencies) if verified else []
    has_limits = spec.get("baseline") is not None
    admissible = verified and fully and has_limits and not viol
    return {"verified": verified, "fully_measured": fully, "admissible": admissible, "objective_us": T,
            "limit_violations": viol}


# ------------------------------------------------------------------------------------------------
# run directory
# ------------------------------------------------------------------------------------------------
class Run:
    def __init__(self, root: str):
        self.root = os.path.abspath(root)
        self.meta: dict[str, Any] = {}
        self.spec: dict[str, Any] = {}
        self.opps: dict[str, ir.Opportunity] = {}
        self.impls: dict[str, ir.Implementation] = {}
        self.actions: dict[str, ir.Action] = {}
        self.audits: dict[str, ir.Audit] = {}
        self.decisions: dict[str, ir.LineageDecision] = {}
        self.revocations: dict[str, ir.Revocation] = {}
        self._state: State | None = None
        self._lock_fd: int | None = None

    # ---- paths ---------------------------------------------------------------------------------
    def path(self, *parts: str) -> str:
        return os.path.join(self.root, *parts)

    def impl_dir(self, iid: str) -> str:
        return self.path("impls", iid)

    # ---- creation / loading --------------------------------------------------------------------
    @classmethod
    def create(cls, root: str, spec_path: str, implementation: str, *, quick: bool = False,
               options: dict[str, Any] | None = None) -> "Run":
        """New run: frozen spec, root snapshot I0000 (complete copy of the implementation folder)."""
        root = os.path.abspath(root)
        if os.path.exists(os.path.join(root, "run.json")):
            raise RunError(f"{root} already holds a run; open it (resume) instead of creating it")
        spec = S.freeze(S.load(spec_path), quick=quick)
        S.check_runner(spec)
        os.makedirs(root, exist_ok=True)
        src = loader.resolve_path(implementation)
        man = loader.read_manifest(src)
        actual = loader.compute_source_hash(src)
        if man["source_hash"] != actual:
            raise RunError(f"root implementation {src}: manifest hash {man['source_hash'][:12]} does not match its "
                           f"sources ({actual[:12]}); rehash it first")
        self = cls(root)
        self._acquire_lock()
        ir.atomic_write_json(self.path("spec.json"), spec)
        from areal_tik_plugin.search.evaluator import evaluator_hash

        self.meta = {
            "schema": RUN_SCHEMA,
            "created": now(),
            "spec_source": S.resolve(spec_path),
            "spec_name": spec["name"],
            "variant": spec["variant"],
            "spec_hash": S.criteria_hash(spec),
            "baseline_hash": "",
            "evaluator_hash": evaluator_hash(spec),
            "root_origin": src,
            "root_name": man["name"],
            "options": dict(options or {}),
            "stopped": None,
        }
        dst = self.impl_dir("I0000")
        tmp = self.path("impls", ".I0000.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        _copytree(src, tmp)
        os.replace(tmp, dst)
        self.spec = spec
        rec = self._impl_record("I0000", 0, origin=f"root:{src}", parents=[], materialized=True)
        if rec.source_hash != actual:
            raise CorruptRun("root snapshot hash differs from its source folder")
        ir.write_record(self.root, rec)
        self._write_meta()
        return cls.open(root, lock=True, _inherit=self)

    @classmethod
    def open(cls, root: str, *, lock: bool = True, _inherit: "Run | None" = None) -> "Run":
        """Load, validate and replay a run; complete or clean a step interrupted half-way."""
        root = os.path.abspath(root)
        if not os.path.isfile(os.path.join(root, "run.json")):
            raise RunError(f"{root} is not a search run directory (no run.json); create one with `tik search init`")
        self = _inherit or cls(root)
        if lock and self._lock_fd is None:
            self._acquire_lock()
        try:
            return self._load(lock)
        except BaseException:
            self.close()
            raise

    def _load(self, lock: bool) -> "Run":
        root = self.root
        self.meta = ir.read_json(self.path("run.json"))
        if self.meta.get("schema") != RUN_SCHEMA:
            raise CorruptRun(f"{root}/run.json: schema {self.meta.get('schema')!r}, expected {RUN_SCHEMA!r}")
        self.spec = S.load(self.path("spec.json"))
        if S.criteria_hash(self.spec) != self.meta["spec_hash"]:
            raise CorruptRun(f"{root}/spec.json: its criteria hash does not match the one bound at creation; "
                             "the evaluation specification of a run is immutable")
        if self.meta.get("baseline_hash") and S.baseline_hash(self.spec) != self.meta["baseline_hash"]:
            raise CorruptRun(f"{root}/spec.json: the root baseline was changed after initialization")
        self._load_records()
        if lock:
            self._repair()
        self._state = None
        self.state()
        return self

    def _load_records(self) -> None:
        self.opps = ir.load_all(self.root, "opportunity")
        self.impls = ir.load_all(self.root, "implementation")
        self.actions = ir.load_all(self.root, "action")
        self.audits = ir.load_all(self.root, "audit")
        self.decisions = ir.load_all(self.root, "decision")
        self.revocations = ir.load_all(self.root, "revocation")

    def _acquire_lock(self) -> None:
        os.makedirs(self.root, exist_ok=True)
        fd = os.open(self.path(".lock"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise RunError(f"another `tik search` process is working on {self.root}") from None
        self._lock_fd = fd

    def close(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def _write_meta(self) -> None:
        ir.atomic_write_json(self.path("run.json"), self.meta)

    def _repair(self) -> None:
        """Finish or drop what an interruption left half-written (deterministically)."""
        changed = False
        # offspring whose action exists but whose folder/record was not finished
        for aid, a in self.actions.items():
            if a.offspring not in self.impls:
                self._materialize(a)
                changed = True
        # opportunities not referenced by any decision: written just before an interrupted decision
        referenced = {o for d in self.decisions.values() for o in d.new_opportunities}
        for oid in list(self.opps):
            if oid not in referenced:
                ir.remove_record(self.root, "opportunity", oid)
                del self.opps[oid]
                changed = True
        # implementation folders without a record (copy interrupted before the record was written)
        impls_dir = self.path("impls")
        if os.path.isdir(impls_dir):
            for name in os.listdir(impls_dir):
                full = os.path.join(impls_dir, name)
                if name.startswith(".") and name.endswith(".tmp"):
                    shutil.rmtree(full, ignore_errors=True)
                elif ir.ID_PATTERNS["implementation"].match(name) and name not in self.impls:
                    shutil.rmtree(full, ignore_errors=True)
        if changed:
            self._load_records()

    # ---- state ---------------------------------------------------------------------------------
    def state(self) -> State:
        if self._state is None:
            self._state = replay(self)
        return self._state

    def invalidate(self) -> None:
        self._state = None

    def options(self) -> dict[str, Any]:
        return self.meta.get("options") or {}

    def limits(self) -> dict[str, Any]:
        se = self.spec["search"]
        o = self.options()
        return {
            "kappa_max": int(se["kappa_max"]),
            "max_steps": o.get("max_steps") or se.get("max_steps"),
            "time_budget_s": o.get("time_budget_s") or se.get("time_budget_s"),
        }

    def limit_sources(self) -> dict[str, str]:
        o = self.options()
        return {k: ("run option" if o.get(k) else "spec search." + k) for k in ("max_steps", "time_budget_s")} | {
            "kappa_max": "spec search.kappa_max (immutable within a run)"}

    def stop_reason(self, st: State | None = None) -> str | None:
        st = st or self.state()
        lim = self.limits()
        if st.phase == "init":
            return None
        if not st.pending:
            return "no pending opportunity"
        if st.kappa >= lim["kappa_max"]:
            return f"kappa reached kappa_max={lim['kappa_max']}"
        src = self.limit_sources()
        if lim["max_steps"] is not None and st.t >= lim["max_steps"]:
            return (f"step budget reached ({lim['max_steps']} steps, from {src['max_steps']}); raise it with "
                    f"`tik search limits {self.root} --max-steps N`")
        if lim["time_budget_s"] is not None and st.time_used_s >= lim["time_budget_s"]:
            return (f"time budget reached ({st.time_used_s:.0f} s >= {lim['time_budget_s']} s, from "
                    f"{src['time_budget_s']}); raise it with `tik search limits {self.root} --time-budget-s S`")
        return None

    def phase(self) -> str:
        st = self.state()
        if st.phase == "action" and self.stop_reason(st):
            return "done"
        return st.phase

    def next_step(self) -> int:
        return max([ir.id_number(a) for a in self.actions] + [0]) + 1

    # ---- implementation records ----------------------------------------------------------------
    def knob_modules(self, manifest: dict[str, Any]) -> list[str]:
        return E.entry_modules(manifest, list(self.spec["entry_points"]))

    def knob_key(self) -> str:
        return self.spec["target"].get("knob_key", "gpu" if self.spec["target"]["device"] == "cuda" else "cpu")

    def _impl_record(self, iid: str, step: int, *, origin: str, parents: list[str], materialized: bool,
                     name: str = "") -> ir.Implementation:
        if not materialized:
            return ir.Implementation(
                id=iid, step=step, name=name, path=f"impls/{iid}", origin=origin, parents=parents, source_hash="",
                materialized=False, target_arch=[], entry_points={}, shared_regions=[], dispatch_rules=[],
                numerical_requirements=[], knobs={}, files=[])
        d = self.impl_dir(iid)
        man = loader.read_manifest(d)
        files = E.read_files(d)
        knobs = E.knob_values(files, self.knob_key(), self.knob_modules(man))
        return ir.Implementation(
            id=iid, step=step, name=man["name"], path=f"impls/{iid}", origin=origin, parents=parents,
            source_hash=loader.compute_source_hash(d), materialized=True,
            target_arch=[str(a) for a in man.get("target_arch", [])], entry_points=dict(man["entry_points"]),
            shared_regions=[str(x) for x in man.get("shared_regions", [])],
            dispatch_rules=[str(x) for x in man.get("dispatch_rules", [])],
            numerical_requirements=[str(x) for x in man.get("numerical_requirements", [])],
            knobs=knobs, files=sorted(files))

    def files_of(self, iid: str) -> dict[str, str]:
        return E.read_files(self.impl_dir(iid))

    def knobs_of(self, iid: str) -> dict[str, E.Knob]:
        d = self.impl_dir(iid)
        man = loader.read_manifest(d)
        return E.select_knobs(E.discover_knobs(E.read_files(d), self.knob_key(), self.knob_modules(man)), self.spec)

    # ---- operations ----------------------------------------------------------------------------
    def initialize(self, evaluator, progress=None) -> ir.Audit:
        """Audit the root; fill the baseline (root latencies) into S; record E0000 (I*_0 = I0000, kappa_0 = 0)."""
        if self.state().phase != "init":
            raise RunError("this run is already initialized")
        t0 = time.time()
        res = evaluator.evaluate(self, "I0000", progress=progress)
        sc = score(self.spec, res["status"], res["latencies_us"])
        if not (sc["verified"] and sc["fully_measured"]):
            ir.atomic_write_json(self.path("work", "root_audit_failed.json"), res)
            raise RootInvalid(
                f"root I0000 is not verified / fully measured (status {res['status']}, stage {res['stage']}): "
                f"{(res.get('error') or '')[:600]} -- see {self.path('work', 'root_audit_failed.json')}")
        res["timing"]["share"] = share(self.spec, res["latencies_us"])
        spec = S.with_baseline(self.spec, res["latencies_us"], audit_id="E0000", env=res["env"], measured_at=now())
        ir.atomic_write_json(self.path("spec.json"), spec)
        self.spec = spec
        self.meta["baseline_hash"] = S.baseline_hash(spec)
        self._write_meta()
        sc = score(self.spec, res["status"], res["latencies_us"])
        if not sc["admissible"]:
            raise CorruptRun("root not admissible against its own baseline")  # pragma: no cover
        audit = ir.Audit(
            id="E0000", step=0, implementation="I0000", status=res["status"], stage=res["stage"],
            verified=True, fully_measured=True, admissible=True, objective_us=sc["objective_us"],
            latencies_us=res["latencies_us"], limit_violations=[], checks=res["checks"], compile=res["compile"],
            dispatch=res["dispatch"], timing=res["timing"], error=res.get("error"), log_tail=res["log_tail"],
            hashes=res["hashes"], env=res["env"], promoted=True, best_after="I0000",
            best_objective_after_us=sc["objective_us"], kappa_after=0, wall_s=round(time.time() - t0, 3),
            evaluated_at=now())
        ir.write_record(self.root, audit)
        self.audits["E0000"] = audit
        self.invalidate()
        return audit

    def record_action(self, *, opportunity: str, parents: list[str], edits: list[dict[str, Any]], kind: str,
                      targeted_workloads: list[str] | None = None, kernel_variants: list[str] | None = None,
                      scope: str = "", affected_regions: list[str] | None = None, expected_effect: str = "",
                      numerical_risks: str = "", falsifier: str = "", created_by: str = "agent",
                      knob_moves: dict[str, Any] | None = None, llm: dict[str, Any] | None = None,
                      apply_error: str | None = None, wall_s: float = 0.0, merge: bool = True) -> ir.Action:
        """ACTION: record the modification, then build the offspring (a complete new folder).

        With several parents and ``merge`` (MERGE), the offspring is built from a file-level three-way
        merge of every parent over their nearest common ancestor, then ``edits``; a file changed
        differently by two parents is refused with the files named (give the merged tree instead:
        ``merge=False`` with whole-file edits, the command line's ``--from-dir``)."""
        st = self.state()
        if st.phase != "action":
            raise RunError(f"cannot record an action now: the run expects '{self.phase()}'")
        reason = self.stop_reason(st)
        if reason:
            raise RunError(f"the search has stopped: {reason}")
        if opportunity not in st.pending:
            raise RunError(f"opportunity {opportunity} is not pending; pending: {st.pending}")
        opp = self.opps[opportunity]
        if not parents:
            raise RunError("an action needs at least one parent implementation")
        for p in parents:
            if p not in st.verified:
                raise RunError(f"parent {p} is not a verified implementation (failed offspring can never be parents)")
            if p not in st.retained:
                raise RunError(f"parent {p} was abandoned; choose one of the frontier/archive {sorted(st.retained)}")
            if p not in opp.applies_to:
                raise RunError(f"parent {p} is not one of the implementations opportunity {opportunity} applies to "
                               f"({opp.applies_to})")
        if kind not in ("full_sequence", "decode", "joint"):
            raise RunError(f"action kind {kind!r}: expected full_sequence, decode or joint")
        step = self.next_step()
        aid, iid = ir.make_id("action", step), ir.make_id("implementation", step)
        diff = ""
        merged_from = None
        if apply_error is None and len(parents) > 1 and merge:
            edits, merged_from = self._merge_edits(parents, edits)
            scope = f"merge of {', '.join(parents)} ({merged_from})" + (f"; {scope}" if scope else "")
        if apply_error is None:
            parent_files = self.files_of(parents[0])
            try:
                new_files = E.apply_edits(parent_files, edits)
                diff = E.diff_files(parent_files, new_files)
                if not diff:
                    apply_error = "the edits change nothing"
            except E.EditError as e:
                apply_error = str(e)
        action = ir.Action(
            id=aid, step=step, opportunity=opportunity, parents=list(parents), offspring=iid, kind=kind,  # type: ignore[arg-type]
            edits=edits, diff=diff, apply_error=apply_error,
            targeted_workloads=list(targeted_workloads or opp.target_workloads),
            kernel_variants=list(kernel_variants or []), scope=scope, affected_regions=list(affected_regions or []),
            expected_effect=expected_effect, numerical_risks=numerical_risks, falsifier=falsifier,
            created_by=created_by, knob_moves=dict(knob_moves or {}), llm=dict(llm or {}), wall_s=round(wall_s, 3))
        ir.write_record(self.root, action)
        self.actions[aid] = action
        self._materialize(action)
        self.invalidate()
        return action

    def _ancestors(self, iid: str) -> list[str]:
        st = self.state()
        seen, todo, order = set(), [iid], []
        while todo:
            x = todo.pop(0)
            if x in seen:
                continue
            seen.add(x)
            order.append(x)
            todo.extend(st.graph.get(x, []))
        return order

    def _merge_edits(self, parents: list[str], edits: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], str]:
        """Whole-file edits that turn parents[0] into the merge of all parents, followed by ``edits``."""
        files = self.files_of(parents[0])
        bases = []
        for other in parents[1:]:
            anc0 = self._ancestors(parents[0])
            anco = set(self._ancestors(other))
            base = next((x for x in anc0 if x in anco), "I0000")
            merged, conflicts = E.merge_files(self.files_of(base), files, self.files_of(other))
            if conflicts:
                raise RunError(f"MERGE {parents[0]} + {other}: both changed {conflicts} differently since their common "
                               f"ancestor {base}; merge those files yourself and record the merged tree with "
                               f"--from-dir (checkout {parents[0]}, apply {other}'s changes)")
            files = merged
            bases.append(f"{other} over {base}")
        pre = E.edits_from_dirs(self.files_of(parents[0]), files)
        return pre + list(edits), "; ".join(bases)

    def _materialize(self, action: ir.Action) -> ir.Implementation:
        iid = action.offspring
        if iid in self.impls:
            return self.impls[iid]
        origin = f"action:{action.id}"
        root_name = self.meta.get("root_name", "impl")
        name = f"{root_name}_{iid}"
        if action.apply_error is not None:
            rec = self._impl_record(iid, action.step, origin=origin, parents=action.parents, materialized=False,
                                    name=name)
        else:
            parent_dir = self.impl_dir(action.parents[0])
            parent_files = E.read_files(parent_dir)
            new_files = E.apply_edits(parent_files, action.edits)
            final = self.impl_dir(iid)
            shutil.rmtree(final, ignore_errors=True)
            tmp = self.path("impls", f".{iid}.tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            _copytree(parent_dir, tmp)
            for rel in E.changed_files(parent_files, new_files):
                p = os.path.join(tmp, rel)
                if rel in new_files:
                    os.makedirs(os.path.dirname(p), exist_ok=True)
                    with open(p, "w") as f:
                        f.write(new_files[rel])
                elif os.path.exists(p):
                    os.unlink(p)
            man = loader.read_manifest(tmp)
            parent_name = man.get("name")
            # an offspring of an exported root is a new, unaudited implementation: its audit is the one
            # this step runs, so the export's evidence gate (and the parent's audits, whose hash is not
            # this one) do not come along; a loader gate here would refuse every candidate on the GPU
            man.pop("evidence_required", None)
            stale = os.path.join(tmp, EVIDENCE_FILE)
            if os.path.exists(stale):
                os.unlink(stale)
            man.update({
                "name": name,
                "parent": parent_name,
                "search": {"run": os.path.basename(self.root), "implementation": iid, "action": action.id,
                           "parents": list(action.parents)},
            })
            ir.atomic_write_json(os.path.join(tmp, loader.MANIFEST), man)
            loader.write_manifest_hash(tmp)
            os.replace(tmp, final)
            rec = self._impl_record(iid, action.step, origin=origin, parents=action.parents, materialized=True)
        ir.write_record(self.root, rec)
        self.impls[iid] = rec
        return rec

    def audit(self, evaluator, progress=None) -> ir.Audit:
        """AUDIT + RECORD AUDIT: evaluate the pending offspring, apply promotion and kappa."""
        st = self.state()
        if st.phase != "audit":
            raise RunError(f"nothing to audit: the run expects '{self.phase()}'")
        step = st.open_step
        assert step is not None
        iid = ir.make_id("implementation", step)
        rec = self.impls[iid]
        t0 = time.time()
        if not rec.materialized:
            a = self.actions[ir.make_id("action", step)]
            res = empty_result("compile_error", "build", f"the action's edits could not be applied: {a.apply_error}")
        else:
            res = evaluator.evaluate(self, iid, progress=progress)
            res = self._check_env(res)
        ab = (res.get("timing") or {}).get("ab")
        sc = score(self.spec, res["status"], res["latencies_us"], ab)
        promoted = is_promotion(self.spec, sc, st.best_objective_us, ab, st.best)
        if isinstance(ab, dict):
            ab["verdict"] = ab_verdict(self.spec, ab)
        if sc["objective_us"]:
            res["timing"]["share"] = share(self.spec, res["latencies_us"])
        audit = ir.Audit(
            id=ir.make_id("audit", step), step=step, implementation=iid, status=res["status"], stage=res["stage"],
            verified=sc["verified"], fully_measured=sc["fully_measured"], admissible=sc["admissible"],
            objective_us=sc["objective_us"], latencies_us=res["latencies_us"], limit_violations=sc["limit_violations"],
            checks=res["checks"], compile=res["compile"], dispatch=res["dispatch"], timing=res["timing"],
            error=res.get("error"), log_tail=res["log_tail"], hashes=res["hashes"], env=res["env"],
            promoted=promoted, best_after=iid if promoted else st.best,  # type: ignore[arg-type]
            best_objective_after_us=sc["objective_us"] if promoted else st.best_objective_us,
            kappa_after=0 if promoted else st.kappa + 1, wall_s=round(time.time() - t0, 3), evaluated_at=now())
        ir.write_record(self.root, audit)
        self.audits[audit.id] = audit
        self.invalidate()
        return audit

    def _check_env(self, res: dict[str, Any]) -> dict[str, Any]:
        """A changed environment invalidates the root measurement: such an audit is an infra_error."""
        base = (self.spec.get("baseline") or {}).get("env") or {}
        keys = ("gpu", "sm", "driver", "cuda", "torch", "triton", "cpu_model")
        diff = {k: (base.get(k), res["env"].get(k)) for k in keys if base.get(k) != res["env"].get(k)}
        if base and res["status"] == "ok" and (diff or not res["env"]):
            res = dict(res)
            res["status"] = "infra_error"
            res["error"] = f"environment differs from the root measurement {diff}; latencies are not comparable"
            res["latencies_us"] = {}
        return res

    def decide(self, *, decision: str, interpretation: str, rationale: str,
               new_opportunities: list[dict[str, Any]] | None = None, close: list[str] | None = None,
               abandon: list[str] | None = None, created_by: str = "agent", end: bool = True) -> ir.LineageDecision:
        """LINEAGE MANAGEMENT: branch decision + follow-up opportunities for the last audit.

        ``end=False`` (the agent command line): a decision that would leave no pending opportunity,
        which ends the search, is refused instead of ending it silently."""
        st = self.state()
        if st.phase != "decide":
            raise RunError(f"no audit awaits a decision: the run expects '{self.phase()}'")
        step = st.open_step if st.open_step is not None else 0
        audit = self.audits[ir.make_id("audit", step)]
        n0 = max([ir.id_number(o) for o in self.opps] + [0]) + 1
        recs = []
        for i, o in enumerate(new_opportunities or []):
            o = dict(o)
            o.setdefault("kind", "initial" if step == 0 else "followup")
            o.setdefault("evidence", [audit.id])
            o.setdefault("evidence_notes", "")
            o.setdefault("entry_points", list(self.spec["entry_points"]))
            o.setdefault("target_workloads", [])
            o.setdefault("applies_to", [audit.implementation])
            o.setdefault("created_by", created_by)
            o.setdefault("details", {})
            o.setdefault("priority", 0.0)
            o["id"] = ir.make_id("opportunity", n0 + i)
            o["step"] = step
            _check_names(self.spec, o, i)
            recs.append(ir.validate("opportunity", o))
        d = ir.LineageDecision(
            id=ir.make_id("decision", step), step=step, audit=audit.id, implementation=audit.implementation,
            decision=decision, interpretation=interpretation, rationale=rationale,  # type: ignore[arg-type]
            new_opportunities=[r.id for r in recs], closed_opportunities=list(close or []),
            abandon=list(abandon or []), created_by=created_by)
        # validate against the rules before writing anything
        trial = copy.copy(self)
        trial.opps = {**self.opps, **{r.id: r for r in recs}}
        trial.decisions = {**self.decisions, d.id: d}
        trial._state = None
        try:
            tst = replay(trial)
        except CorruptRun as e:
            raise RunError(f"decision rejected: {e}") from None
        if not end and not tst.pending:
            raise RunError(
                f"{decision} leaves no pending opportunity, which ends the search (best {tst.best}); give follow-up "
                "opportunities (--opportunities FILE) or say --end to end the run on purpose")
        for r in recs:
            ir.write_record(self.root, r)
            self.opps[r.id] = r
        ir.write_record(self.root, d)
        self.decisions[d.id] = d
        self.invalidate()
        return d

    def revoke(self, iid: str, *, reason: str, source: str = "user", evidence: dict[str, Any] | None = None,
               keep_descendants: bool = False, created_by: str = "user") -> ir.Revocation:
        """Withdraw a verdict: ``iid`` (and its offspring unless ``keep_descendants``) leaves the verified
        set, best and frontier / archive; the best becomes the latest promotion that still stands."""
        st = self.state()
        if not reason or not reason.strip():
            raise RunError("a revocation needs a reason (--reason)")
        if st.phase not in ("action", "done"):
            raise RunError(f"revoke between steps: the run expects '{self.phase()}' first")
        if iid not in self.impls:
            raise RunError(f"unknown implementation {iid}; the run has {sorted(self.impls, key=ir.id_number)}")
        if iid == "I0000":
            raise RunError("the root I0000 defines the baseline and cannot be revoked; start a new run instead")
        if iid in st.revoked:
            raise RunError(f"{iid} is already revoked ({st.revoked[iid]})")
        if iid not in st.verified:
            raise RunError(f"{iid} was never verified: there is no verdict to revoke")
        revoked = [iid] if keep_descendants else [i for i in descendants(st.graph, iid) if i not in st.revoked]
        n = max([ir.id_number(r) for r in self.revocations] + [0]) + 1
        rec = ir.Revocation(id=ir.make_id("revocation", n), after_step=st.t, implementation=iid, reason=reason,
                            source=source, evidence=dict(evidence or {}), revoked=revoked, created_by=created_by,
                            created_at=now())
        trial = copy.copy(self)
        trial.revocations = {**self.revocations, rec.id: rec}
        trial._state = None
        try:
            replay(trial)
        except CorruptRun as e:
            raise RunError(f"revocation rejected: {e}") from None
        ir.write_record(self.root, rec)
        self.revocations[rec.id] = rec
        self.invalidate()
        return rec

    def reaudit(self, evaluator, iid: str, *, seed: int = 1, progress=None) -> dict[str, Any]:
        """Evaluate a verified implementation again on another input draw (``seed``; a held-out check
        when the seed was never used). A failure revokes it automatically."""
        st = self.state()
        if iid not in st.verified:
            raise RunError(f"{iid} is not a verified implementation of this run")
        res = evaluator.evaluate(self, iid, progress=progress, seed=seed, ab=False)
        res = self._check_env(res)
        os.makedirs(self.path("work", "reaudits"), exist_ok=True)
        ir.atomic_write_json(self.path("work", "reaudits", f"{iid}.seed{seed}.json"), res)
        out = {"implementation": iid, "seed": seed, "status": res["status"], "error": res.get("error"),
               "revocation": None}
        if res["status"] != "ok" and res["status"] != "infra_error" and iid != "I0000":
            bad = [c for c in res.get("checks", []) if not c.get("passed")][:10]
            rec = self.revoke(iid, reason=f"re-audit with seed {seed}: {res['status']}: {(res.get('error') or '')[:300]}",
                              source="reaudit" if seed == 0 else "heldout",
                              evidence={"status": res["status"], "stage": res["stage"], "failed_checks": bad},
                              created_by="evaluator")
            out["revocation"] = rec.id
        return out

    def set_stopped(self, reason: str | None) -> None:
        self.meta["stopped"] = {"reason": reason, "at_step": self.state().t, "at": now()} if reason else None
        self._write_meta()

    def set_options(self, **kw) -> None:
        o = dict(self.meta.get("options") or {})
        for k, v in kw.items():
            if v is not None:
                o[k] = v
        self.meta["options"] = o
        self._write_meta()
        self.invalidate()


def _check_names(spec: dict, o: dict, i: int) -> None:
    """Entry points and target workloads of an opportunity must be the spec's (a typo would silently
    target nothing)."""
    eps = set(spec["entry_points"])
    wls = [w["name"] for w in spec["workloads"]]
    bad_e = [e for e in o.get("entry_points") or [] if e not in eps]
    bad_w = [w for w in o.get("target_workloads") or [] if w not in wls]
    if bad_e or bad_w:
        raise RunError(f"opportunity {i + 1} ({o.get('mechanism', '')[:60]!r}): "
                       + (f"unknown entry points {bad_e}, expected some of {sorted(eps)}; " if bad_e else "")
                       + (f"unknown workloads {bad_w}, expected some of {wls}" if bad_w else ""))


def _copytree(src: str, dst: str) -> None:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__", ".*", "*.pyc"))


def empty_result(status: str, stage: str, error: str) -> dict[str, Any]:
    return {"status": status, "stage": stage, "latencies_us": {}, "checks": [], "compile": {}, "dispatch": {},
            "timing": {}, "error": error, "log_tail": "", "hashes": {}, "env": {}}


# ------------------------------------------------------------------------------------------------
# replay
# ------------------------------------------------------------------------------------------------
def replay(run: Run) -> State:
    """Rebuild Z_t from the records, enforcing every rule; raises :class:`CorruptRun`."""
    st = State()
    spec = run.spec
    if "I0000" not in run.impls:
        raise CorruptRun("the root implementation record I0000 is missing")
    st.graph["I0000"] = []
    e0 = run.audits.get("E0000")
    if e0 is None:
        st.phase = "init"
        return st
    if not (e0.verified and e0.admissible and e0.promoted and e0.best_after == "I0000" and e0.kappa_after == 0):
        raise CorruptRun("E0000 must verify the root and make it the initial best")
    st.verified.add("I0000")
    st.best, st.best_objective_us, st.kappa = "I0000", e0.objective_us, 0
    st.time_used_s += e0.wall_s
    st.history.append({"step": 0, "implementation": "I0000", "status": e0.status, "objective_us": e0.objective_us,
                       "best": "I0000", "best_objective_us": e0.objective_us, "kappa": 0, "tokens": 0})
    d0 = run.decisions.get("L0000")
    if d0 is None:
        st.phase = "decide"
        st.open_step = 0
        return st
    st.retained.add("I0000")
    _apply_decision(run, st, d0, e0, step=0)
    st.t = 0
    _apply_revocations(run, st, 0)
    step = 1
    while True:
        aid = ir.make_id("action", step)
        a = run.actions.get(aid)
        if a is None:
            break
        if step > 1 and ir.make_id("decision", step - 1) not in run.decisions:
            raise CorruptRun(f"{aid} exists but step {step - 1} has no decision")
        if a.opportunity not in st.pending:
            raise CorruptRun(f"{aid} uses opportunity {a.opportunity}, which is not pending")
        opp = run.opps[a.opportunity]
        for p in a.parents:
            if p not in st.verified or p not in st.retained or p not in opp.applies_to:
                raise CorruptRun(f"{aid}: parent {p} is not a retained verified implementation of {a.opportunity}")
        st.pending.remove(a.opportunity)
        st.consumed[a.opportunity] = aid
        st.tokens += int(a.llm.get("total_tokens", 0) or 0)
        st.time_used_s += a.wall_s
        iid = a.offspring
        if iid != ir.make_id("implementation", step):
            raise CorruptRun(f"{aid}: offspring {iid}, expected {ir.make_id('implementation', step)}")
        st.graph[iid] = list(a.parents)
        st.open_step = step
        if iid not in run.impls:  # interrupted while building; Run.open(lock=True) finishes it
            st.phase = "audit"
            return st
        audit = run.audits.get(ir.make_id("audit", step))
        if audit is None:
            st.phase = "audit"
            return st
        if audit.implementation != iid:
            raise CorruptRun(f"{audit.id} audits {audit.implementation}, expected {iid}")
        ab = (audit.timing or {}).get("ab")
        sc = score(spec, audit.status, audit.latencies_us, ab)
        for k in ("verified", "fully_measured", "admissible", "objective_us"):
            if sc[k] != getattr(audit, k):
                raise CorruptRun(f"{audit.id}: recorded {k}={getattr(audit, k)!r}, the rules give {sc[k]!r}")
        promoted = is_promotion(spec, sc, st.best_objective_us, ab, st.best)
        if promoted != audit.promoted:
            raise CorruptRun(f"{audit.id}: recorded promoted={audit.promoted}, the rule gives {promoted}")
        if promoted:
            st.best, st.best_objective_us, st.kappa = iid, sc["objective_us"], 0
        else:
            st.kappa += 1
        if audit.kappa_after != st.kappa or audit.best_after != st.best:
            raise CorruptRun(f"{audit.id}: recorded kappa/best {audit.kappa_after}/{audit.best_after}, "
                             f"replay gives {st.kappa}/{st.best}")
        if audit.verified:
            st.verified.add(iid)
        st.time_used_s += audit.wall_s
        st.history.append({"step": step, "implementation": iid, "status": audit.status,
                           "objective_us": audit.objective_us, "best": st.best,
                           "best_objective_us": st.best_objective_us, "kappa": st.kappa, "tokens": st.tokens,
                           "promoted": promoted, "admissible": audit.admissible})
        d = run.decisions.get(ir.make_id("decision", step))
        if d is None:
            st.phase = "decide"
            return st
        _apply_decision(run, st, d, audit, step=step)
        st.t = step
        st.open_step = None
        _apply_revocations(run, st, step)
        step += 1
    st.phase = "action"
    st.open_step = None
    return st


def _apply_decision(run: Run, st: State, d: ir.LineageDecision, audit: ir.Audit, *, step: int) -> None:
    off = audit.implementation
    if d.audit != audit.id or d.implementation != off:
        raise CorruptRun(f"{d.id} refers to {d.audit}/{d.implementation}, expected {audit.id}/{off}")
    if audit.verified:
        if d.decision in ("CONTINUE", "MERGE", "ARCHIVE", "RETRY"):
            st.retained.add(off)
    elif d.decision not in ("RETRY", "ABANDON"):
        raise CorruptRun(f"{d.id}: {off} failed its audit ({audit.status}); only RETRY (from a verified parent) "
                         f"or ABANDON are possible, not {d.decision}")
    new = []
    for oid in d.new_opportunities:
        o = run.opps.get(oid)
        if o is None:
            raise CorruptRun(f"{d.id}: opportunity {oid} missing")
        if o.step != step:
            raise CorruptRun(f"{oid}: created at step {o.step}, but by decision {d.id}")
        if not o.applies_to:
            raise CorruptRun(f"{oid}: applies to no implementation")
        for i in o.applies_to:
            if i not in st.verified:
                raise CorruptRun(f"{oid}: applies to {i}, which is not verified (failed offspring can never be parents)")
            if i not in st.retained:
                raise CorruptRun(f"{oid}: applies to {i}, which is neither in the frontier nor in the archive")
        for a in o.evidence:
            if a not in run.audits:
                raise CorruptRun(f"{oid}: evidence {a} is not an audit of this run")
        new.append(o)
    if d.decision == "CONTINUE" and step > 0 and not any(off in o.applies_to for o in new):
        raise CorruptRun(f"{d.id}: CONTINUE needs a follow-up opportunity that applies to {off}")
    if d.decision == "MERGE" and not any(len(o.applies_to) >= 2 and off in o.applies_to for o in new):
        raise CorruptRun(f"{d.id}: MERGE needs an opportunity applying to {off} and another implementation")
    if d.decision == "RETRY" and not new:
        raise CorruptRun(f"{d.id}: RETRY needs a new opportunity on a verified parent")
    for oid in d.closed_opportunities:
        if oid not in st.pending:
            raise CorruptRun(f"{d.id}: cannot close {oid}: not pending")
        st.pending.remove(oid)
    for i in d.abandon:
        st.retained.discard(i)
    st.pending.extend(o.id for o in new)
    # opportunities whose implementations have all been abandoned can no longer be acted on
    st.pending = [o for o in st.pending if any(i in st.retained for i in run.opps[o].applies_to)]


def descendants(graph: dict[str, list[str]], iid: str) -> list[str]:
    """``iid`` and every implementation built (transitively) from it, in id order."""
    out = {iid}
    changed = True
    while changed:
        changed = False
        for child, parents in graph.items():
            if child not in out and any(p in out for p in parents):
                out.add(child)
                changed = True
    return sorted(out, key=ir.id_number)


def _apply_revocations(run: Run, st: State, step: int) -> None:
    revs = sorted((r for r in run.revocations.values() if r.after_step == step), key=lambda r: ir.id_number(r.id))
    for r in revs:
        if r.implementation == "I0000":
            raise CorruptRun(f"{r.id}: the root cannot be revoked (it defines the baseline)")
        if not r.revoked or r.revoked[0] != r.implementation:
            raise CorruptRun(f"{r.id}: revoked list must start with {r.implementation}")
        for i in r.revoked:
            if i not in st.graph:
                raise CorruptRun(f"{r.id}: {i} does not exist at step {step}")
            st.verified.discard(i)
            st.retained.discard(i)
            st.revoked[i] = r.id
        if st.best in st.revoked:
            # best again from the remaining records: the latest promotion that still stands. Each was
            # measured A/B against the best before it; objectives of audits from different rounds are
            # not compared (that would let timing noise pick the best).
            cands = [a for a in run.audits.values() if a.step <= step and a.promoted and a.admissible
                     and a.implementation in st.verified and a.implementation not in st.revoked]
            a = max(cands, key=lambda a: a.step)
            st.best, st.best_objective_us = a.implementation, a.objective_us
        st.pending = [o for o in st.pending if any(i in st.retained for i in run.opps[o].applies_to)]
        st.history.append({"step": step, "implementation": r.implementation, "status": "revoked", "objective_us": None,
                           "admissible": False, "revocation": r.id, "revoked": list(r.revoked), "reason": r.reason,
                           "best": st.best, "best_objective_us": st.best_objective_us, "kappa": st.kappa,
                           "tokens": st.tokens})
