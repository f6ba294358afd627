"""``tik search ...``: run a driver, or drive the loop step by step (the agent protocol).

    tik search run --driver knobs|llm --spec SPEC --impl NAME|DIR --run-dir DIR [--quick] [--time-budget-s N]
    tik search init --spec SPEC --impl NAME|DIR --run-dir DIR [--quick] [--opportunities FILE]
    tik search next RUN            what the run expects now, with the records that matter
    tik search record-action RUN --opportunity O --parents I[,I] (--edits FILE | --from-dir DIR) --kind K ...
    tik search audit RUN           evaluate the pending offspring (own process), promotion + kappa
    tik search decide RUN --decision D --interpretation TEXT --rationale TEXT [--opportunities FILE] ...
    tik search status RUN          state Z_t (frontier, archive, pending, best, kappa, budgets)
    tik search show RUN ID         one record as JSON
    tik search checkout RUN ID DIR copy an implementation's folder (to edit it for --from-dir)
    tik search report RUN          markdown + PNG plots under RUN/report
    tik search apply RUN --parent I --edits FILE [--dry-run | --out DIR]   preview / apply SEARCH/REPLACE edits
    tik search revoke RUN --id I --reason TEXT [--keep-descendants]       withdraw a verdict (best recomputed)
    tik search reaudit RUN --id I [--seed N]   evaluate again on another input draw; a failure revokes it
    tik search export RUN [--id I] --name NAME [--dest DIR]   installable implementation folder + its audits
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from typing import Any


_OPENED: list = []


def _open(path: str, lock: bool = True):
    from areal_tik_plugin.search.state import Run

    run = Run.open(path, lock=lock)
    _OPENED.append(run)
    return run


def _print(obj: Any) -> None:
    print(json.dumps(obj, indent=1, default=str))


def _load_data(path: str) -> Any:
    with open(path) as f:
        text = f.read()
    if path.endswith((".yaml", ".yml")):
        import yaml

        return yaml.safe_load(text)
    return json.loads(text)


def _evaluator(args):
    from areal_tik_plugin.search.evaluator import Evaluator

    return Evaluator()


def _progress(args):
    from areal_tik_plugin.search.engine import Progress

    return Progress(enabled=not getattr(args, "no_progress", False))


# ------------------------------------------------------------------------------------------------
def cmd_run(args) -> int:
    from areal_tik_plugin.search import engine
    from areal_tik_plugin.search import spec as S
    from areal_tik_plugin.search.drivers import get_driver
    from areal_tik_plugin.search.state import Run, RootInvalid

    kw: dict[str, Any] = {}
    if args.driver == "llm":
        from areal_tik_plugin.search.drivers.llm import ChatClient, LLMError

        try:
            kw["client"] = ChatClient(base_url=args.llm_base_url, model=args.llm_model)
        except LLMError as e:
            print(f"tik search: {e}", file=sys.stderr)
            return 2
        kw["max_edit_retries"] = args.llm_retries
    if args.driver == "plan":
        if not args.plan:
            print("tik search run --driver plan needs --plan FILE (see search/drivers/plan.py)", file=sys.stderr)
            return 2
        from areal_tik_plugin.search.drivers.plan import PlanError

        try:
            kw["plan"] = args.plan
            driver = get_driver(args.driver, **kw)
        except PlanError as e:
            print(f"tik search: {e}", file=sys.stderr)
            return 2
    else:
        if args.plan:
            print("--plan goes with --driver plan", file=sys.stderr)
            return 2
        driver = get_driver(args.driver, **kw)
    opts = {"time_budget_s": args.time_budget_s, "max_steps": args.max_steps}
    if os.path.isfile(os.path.join(args.run_dir, "run.json")):
        run = _open(args.run_dir)
        if args.spec and S.load(args.spec)["name"] != run.spec["name"]:
            print(f"{args.run_dir} is a run of spec {run.spec['name']!r}, not {args.spec!r}", file=sys.stderr)
            return 2
        run.set_options(**opts)
        print(f"resuming {run.root} at step {run.state().t} (phase {run.phase()})", file=sys.stderr)
    else:
        if not args.spec or not args.impl:
            print("a new run needs --spec and --impl", file=sys.stderr)
            return 2
        run = Run.create(args.run_dir, args.spec, args.impl, quick=args.quick,
                         options={k: v for k, v in opts.items() if v is not None})
        _OPENED.append(run)
    try:
        summary = engine.run_search(run, driver, _evaluator(args), _progress(args), max_new_steps=args.max_new_steps)
    except RootInvalid as e:
        print(f"search not started: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"\ninterrupted; resume with the same command (run dir {run.root})", file=sys.stderr)
        return 130
    except Exception as e:
        from areal_tik_plugin.search.drivers.llm import LLMError

        if isinstance(e, LLMError):
            print(f"tik search: {e}; the run can be resumed", file=sys.stderr)
            return 1
        raise
    if args.report:
        from areal_tik_plugin.search.report import write_report

        summary["report"] = write_report(run)
    _print(summary)
    return 0


def cmd_init(args) -> int:
    from areal_tik_plugin.search.state import Run, RootInvalid

    run = Run.create(args.run_dir, args.spec, args.impl, quick=args.quick,
                     options={k: v for k, v in {"time_budget_s": args.time_budget_s, "max_steps": args.max_steps}.items()
                              if v is not None})
    _OPENED.append(run)
    try:
        audit = run.initialize(_evaluator(args), progress=None)
    except RootInvalid as e:
        print(f"root not verified, search not started: {e}", file=sys.stderr)
        return 1
    print(f"root I0000 verified: T = {audit.objective_us:.1f} us over {len(run.spec['workloads'])} workloads")
    if args.opportunities:
        opps = _load_data(args.opportunities)
        run.decide(decision="CONTINUE", interpretation="root verified", rationale="initial opportunities",
                   new_opportunities=opps, created_by=args.created_by)
        print(f"{len(opps)} initial opportunities recorded")
    return cmd_next(args, run=run)


def cmd_next(args, run=None) -> int:
    from areal_tik_plugin.search import drivers as D
    from areal_tik_plugin.search import ir

    run = run or _open(args.run, lock=False)
    st = run.state()
    ph = run.phase()
    lim = run.limits()
    out: dict[str, Any] = {"run": run.root, "phase": ph, "step": st.t, "best": st.best,
                           "best_objective_us": st.best_objective_us, "kappa": st.kappa,
                           "kappa_max": lim["kappa_max"],
                           "limits": {**lim, "from": run.limit_sources(),
                                      "steps_left": None if lim["max_steps"] is None else max(0, lim["max_steps"] - st.t)},
                           "revoked": st.revoked}
    if ph == "init":
        out["do"] = "tik search init ... (or `tik search run`): the root has not been audited"
    elif ph == "decide":
        step = st.open_step or 0
        au = run.audits[ir.make_id("audit", step)]
        out["audit"] = {"id": au.id, "implementation": au.implementation, "status": au.status, "stage": au.stage,
                        "objective_us": au.objective_us, "promoted": au.promoted, "share": au.timing.get("share", {}),
                        "limit_violations": au.limit_violations, "error": (au.error or "")[:1500]}
        allowed = ["CONTINUE"] if step == 0 else (["CONTINUE", "MERGE", "ARCHIVE", "RETRY", "ABANDON"] if au.verified
                                                   else ["RETRY", "ABANDON"])
        out["allowed_decisions"] = allowed
        out["do"] = (f"tik search decide {run.root} --decision {allowed[0]} --interpretation '...' --rationale '...' "
                     f"--opportunities opps.json   (opportunities may apply only to verified implementations: "
                     f"{sorted(st.verified | ({au.implementation} if au.verified else set()))})")
    elif ph == "audit":
        out["do"] = f"tik search audit {run.root}   (evaluates {ir.make_id('implementation', st.open_step)})"
    elif ph == "action":
        out["pending"] = [{"id": o.id, "priority": o.priority, "kind": o.kind, "mechanism": o.mechanism,
                           "applies_to": o.applies_to, "target_workloads": o.target_workloads[:6]}
                          for o in D.pending_sorted(run)]
        out["frontier"] = st.frontier(run.opps)
        out["archive"] = st.archive(run.opps)
        out["do"] = (f"tik search checkout {run.root} <PARENT> /tmp/work && edit && tik search record-action "
                     f"{run.root} --opportunity <O> --parents <PARENT> --from-dir /tmp/work --kind joint "
                     f"--expected-effect '...' --numerical-risks '...' --falsifier '...'")
    else:
        out["stopped"] = run.stop_reason()
        out["do"] = f"tik search report {run.root}"
    _print(out)
    return 0


def cmd_record_action(args) -> int:
    from areal_tik_plugin.search import edits as E

    run = _open(args.run)
    parents = [p for p in args.parents.split(",") if p]
    if args.edits and args.from_dir or not (args.edits or args.from_dir or len(parents) > 1):
        print("give exactly one of --edits FILE or --from-dir DIR (or neither for a pure MERGE of several "
              "--parents)", file=sys.stderr)
        return 2
    if args.edits:
        edits = _read_edits(args.edits)
    elif args.from_dir:
        edits = E.edits_from_dirs(run.files_of(parents[0]), E.read_files(args.from_dir))
    else:
        edits = []
    meta = _load_data(args.meta) if args.meta else {}

    def pick(key, default):
        v = getattr(args, key, None)
        return v if v not in (None, "", []) else meta.get(key, default)

    a = run.record_action(
        opportunity=args.opportunity, parents=parents, edits=edits, kind=pick("kind", "joint"),
        targeted_workloads=pick("targeted_workloads", None), kernel_variants=meta.get("kernel_variants"),
        scope=pick("scope", ""), affected_regions=meta.get("affected_regions"),
        expected_effect=pick("expected_effect", ""), numerical_risks=pick("numerical_risks", ""),
        falsifier=pick("falsifier", ""), created_by=args.created_by,
        llm={"total_tokens": int(args.tokens)} if args.tokens else None,
        merge=not args.from_dir)  # --from-dir is the complete (merged) tree; --edits go on the merge
    print(f"{a.id}: {a.parents} -> {a.offspring}" + (f"  (edits did not apply: {a.apply_error})" if a.apply_error else ""))
    print(a.diff[:4000])
    print(f"next: tik search audit {run.root}")
    return 0


def cmd_audit(args) -> int:
    from areal_tik_plugin.search.engine import status_line

    run = _open(args.run)
    prog = _progress(args)
    from areal_tik_plugin.search import ir

    st = run.state()
    iid = ir.make_id("implementation", st.open_step) if st.open_step else "?"

    def cb(p):
        prog.line(status_line(run, f"evaluating {iid}: {p.get('stage')} {p.get('workload', '')}"))

    a = run.audit(_evaluator(args), progress=cb)
    prog.log(f"{a.id} {a.implementation}: {a.status}" + (f" T={a.objective_us:.1f}us" if a.objective_us else ""))
    _print({"audit": a.id, "implementation": a.implementation, "status": a.status, "stage": a.stage,
            "verified": a.verified, "admissible": a.admissible, "objective_us": a.objective_us,
            "limit_violations": a.limit_violations, "share": a.timing.get("share", {}),
            "ab": {k: v for k, v in (a.timing.get("ab") or {}).get("verdict", {}).items()} if a.timing.get("ab") else None,
            "promoted": a.promoted, "best": a.best_after,
            "kappa": a.kappa_after, "error": (a.error or "")[:2000],
            "failed_checks": [c for c in a.checks if not c.get("passed")][:10],
            "next": f"tik search decide {run.root} ..."})
    return 0


def cmd_decide(args) -> int:
    run = _open(args.run)
    opps = _load_data(args.opportunities) if args.opportunities else []
    d = run.decide(decision=args.decision, interpretation=args.interpretation, rationale=args.rationale,
                   new_opportunities=opps, close=[x for x in (args.close or "").split(",") if x],
                   abandon=[x for x in (args.abandon or "").split(",") if x], created_by=args.created_by,
                   end=args.end)
    print(f"{d.id}: {d.decision} on {d.implementation}; new opportunities {d.new_opportunities}")
    return cmd_next(args, run=run)


def _read_edits(path: str):
    from areal_tik_plugin.search import edits as E

    with open(path) as f:
        text = f.read()
    try:
        edits = json.loads(text)
        if not isinstance(edits, list):
            raise ValueError
    except ValueError:
        edits = E.parse_search_replace(text)
    return edits


def cmd_apply(args) -> int:
    """Apply SEARCH/REPLACE edits to a parent's files without recording anything: the diff, or the
    exact reason an edit does not apply (text not found / not unique, with the closest line)."""
    from areal_tik_plugin.search import edits as E

    run = _open(args.run, lock=False)
    if args.parent not in run.impls:
        print(f"unknown implementation {args.parent}", file=sys.stderr)
        return 2
    parent = run.files_of(args.parent)
    try:
        new = E.apply_edits(parent, _read_edits(args.edits))
    except E.EditError as e:
        _print({"applies": False, "error": str(e)})
        return 1
    diff = E.diff_files(parent, new)
    if not args.dry_run:
        if not args.out:
            print("give --out DIR (a copy with the edits applied, for --from-dir) or --dry-run", file=sys.stderr)
            return 2
        shutil.copytree(run.impl_dir(args.parent), args.out, ignore=shutil.ignore_patterns("__pycache__"))
        for rel in E.changed_files(parent, new):
            p = os.path.join(args.out, rel)
            if rel in new:
                os.makedirs(os.path.dirname(p), exist_ok=True)
                with open(p, "w") as f:
                    f.write(new[rel])
            elif os.path.exists(p):
                os.unlink(p)
    _print({"applies": bool(diff), "changed_files": E.changed_files(parent, new), "diff": diff,
            **({} if diff else {"error": "the edits change nothing"})})
    return 0 if diff else 1


def cmd_revoke(args) -> int:
    run = _open(args.run)
    rec = run.revoke(args.id, reason=args.reason, keep_descendants=args.keep_descendants, created_by=args.created_by)
    st = run.state()
    _print({"revocation": rec.id, "revoked": rec.revoked, "reason": rec.reason, "best": st.best,
            "best_objective_us": st.best_objective_us, "frontier": st.frontier(run.opps)})
    return 0


def cmd_reaudit(args) -> int:
    run = _open(args.run)
    out = run.reaudit(_evaluator(args), args.id, seed=args.seed)
    out["best"] = run.state().best
    _print(out)
    return 0 if out["status"] == "ok" else 1


def cmd_export(args) -> int:
    from areal_tik_plugin.search.export import export

    run = _open(args.run, lock=False)
    out = export(run, name=args.name, iid=args.id, dest=args.dest)
    out["use"] = (f"tik verify --implementation {out['path']}   |   recipe override tik.implementation={out['path']}"
                  f"   |   TIK_IMPLEMENTATION={out['path']}")
    _print(out)
    return 0


def cmd_limits(args) -> int:
    run = _open(args.run)
    if args.max_steps is None and args.time_budget_s is None:
        print("give --max-steps N and/or --time-budget-s S (kappa_max is part of the spec and cannot change)",
              file=sys.stderr)
        return 2
    for k, v in (("max_steps", args.max_steps), ("time_budget_s", args.time_budget_s)):
        if v is not None and v <= 0:
            print(f"--{k.replace('_', '-')} must be positive, got {v}", file=sys.stderr)
            return 2
    run.set_options(max_steps=args.max_steps, time_budget_s=args.time_budget_s)
    _print({"limits": run.limits(), "from": run.limit_sources(), "phase": run.phase()})
    return 0


def cmd_status(args) -> int:
    from areal_tik_plugin.search.engine import status_line

    run = _open(args.run, lock=False)
    st = run.state()
    out = {"run": run.root, "spec": run.spec["name"], "variant": run.spec.get("variant"), "phase": run.phase(),
           "t": st.t, "best": st.best, "best_objective_us": st.best_objective_us,
           "root_objective_us": run.audits["E0000"].objective_us if "E0000" in run.audits else None,
           "kappa": st.kappa, "limits": run.limits(), "frontier": st.frontier(run.opps),
           "archive": st.archive(run.opps), "pending": st.pending, "tokens": st.tokens,
           "time_used_s": round(st.time_used_s, 1), "stopped": run.meta.get("stopped"),
           "history": st.history}
    if args.json:
        _print(out)
    else:
        print(status_line(run))
        for h in st.history:
            print(f"  step {h['step']:>3} {h['implementation']} {h['status']:<18} T={h['objective_us']}"
                  f"{'  PROMOTED' if h.get('promoted') else ''}  best {h['best']} kappa {h['kappa']}")
    return 0


def cmd_show(args) -> int:
    from areal_tik_plugin.search import ir

    kinds = {"O": "opportunity", "I": "implementation", "A": "action", "E": "audit", "L": "decision",
             "R": "revocation"}
    kind = kinds.get(args.id[:1])
    if kind is None:
        print(f"unknown id {args.id!r}; ids start with O, I, A, E or L", file=sys.stderr)
        return 2
    _print(ir.to_json(ir.load_record(os.path.abspath(args.run), kind, args.id)))
    return 0


def cmd_checkout(args) -> int:
    run = _open(args.run, lock=False)
    if args.id not in run.impls or not run.impls[args.id].materialized:
        print(f"{args.id} is not a built implementation of this run", file=sys.stderr)
        return 2
    if os.path.exists(args.dir):
        print(f"{args.dir} exists; give a new folder", file=sys.stderr)
        return 2
    shutil.copytree(run.impl_dir(args.id), args.dir, ignore=shutil.ignore_patterns("__pycache__"))
    print(f"copied {args.id} to {args.dir}; edit its sources (not manifest.json), then "
          f"tik search record-action {run.root} --parents {args.id} --from-dir {args.dir} ...")
    return 0


def cmd_report(args) -> int:
    from areal_tik_plugin.search.report import write_report

    run = _open(args.run, lock=False)
    print(write_report(run, args.out))
    return 0


def _safe(fn):
    """Expected failures (wrong phase, bad edit, bad spec) print one message instead of a traceback."""

    def wrapped(args) -> int:
        from areal_tik_plugin.runtime.loader import ImplementationError
        from areal_tik_plugin.search.edits import EditError
        from areal_tik_plugin.search.evaluator import BindingError
        from areal_tik_plugin.search.export import ExportError
        from areal_tik_plugin.search.ir import RecordConflict, SchemaError
        from areal_tik_plugin.search.spec import SpecError
        from areal_tik_plugin.search.state import CorruptRun, RunError

        try:
            return fn(args)
        except (RunError, CorruptRun, SpecError, EditError, SchemaError, RecordConflict, ImplementationError,
                BindingError, ExportError) as e:
            print(f"tik search: {type(e).__name__}: {e}", file=sys.stderr)
            return 2
        finally:  # release run-directory locks (matters when called in-process, e.g. from tests)
            while _OPENED:
                _OPENED.pop().close()

    return wrapped


# ------------------------------------------------------------------------------------------------
def register(sub) -> None:
    p = sub.add_parser("search", help="kernel search: optimization IR, evaluator, drivers (tik search -h)")
    s = p.add_subparsers(dest="search_command", metavar="VERB")

    def common(q):
        q.add_argument("--created-by", default="agent", help="name recorded in the records")
        q.add_argument("--no-progress", action="store_true")

    r = s.add_parser("run", help="run a driver (knobs | llm | plan) until a stopping rule holds; resumes a run dir")
    r.add_argument("--driver", choices=["knobs", "llm", "plan"], required=True)
    r.add_argument("--plan", default=None, help="--driver plan: the agent's plan file (YAML/JSON)")
    r.add_argument("--spec", help="spec YAML path or shipped name (h200_attention, cpu_toy, ...)")
    r.add_argument("--impl", help="root implementation: a name under kernels/ or a folder")
    r.add_argument("--run-dir", required=True)
    r.add_argument("--quick", action="store_true", help="drop the spec's quick:false workloads/suites (new runs)")
    r.add_argument("--time-budget-s", type=float, default=None)
    r.add_argument("--max-steps", type=int, default=None)
    r.add_argument("--max-new-steps", type=int, default=None, help="stop after this many steps in this invocation")
    r.add_argument("--llm-base-url", default=None)
    r.add_argument("--llm-model", default=None)
    r.add_argument("--llm-retries", type=int, default=2)
    r.add_argument("--report", action="store_true", help="write the report at the end")
    r.add_argument("--no-progress", action="store_true")
    r.set_defaults(func=_safe(cmd_run))

    r = s.add_parser("init", help="create a run and audit the root (agent protocol: Initialization)")
    r.add_argument("--spec", required=True)
    r.add_argument("--impl", required=True)
    r.add_argument("--run-dir", required=True)
    r.add_argument("--quick", action="store_true")
    r.add_argument("--time-budget-s", type=float, default=None)
    r.add_argument("--max-steps", type=int, default=None)
    r.add_argument("--opportunities", help="JSON/YAML list of initial opportunities (else: tik search decide)")
    common(r)
    r.set_defaults(func=_safe(cmd_init))

    r = s.add_parser("next", help="what the run expects now")
    r.add_argument("run")
    r.set_defaults(func=_safe(cmd_next))

    r = s.add_parser("record-action", help="Action: record an edit of verified parent(s); builds the offspring")
    r.add_argument("run")
    r.add_argument("--opportunity", required=True)
    r.add_argument("--parents", required=True, help="comma list; the first one is the edited copy")
    r.add_argument("--edits", help="SEARCH/REPLACE blocks (text) or a JSON list of edits")
    r.add_argument("--from-dir", help="a complete edited copy of the first parent (see checkout)")
    r.add_argument("--kind", choices=["full_sequence", "decode", "joint"])
    r.add_argument("--meta", help="JSON/YAML with scope, targeted_workloads, kernel_variants, affected_regions, "
                                  "expected_effect, numerical_risks, falsifier")
    r.add_argument("--scope", default="")
    r.add_argument("--targeted-workloads", dest="targeted_workloads", type=lambda s: s.split(","), default=None)
    r.add_argument("--expected-effect", dest="expected_effect", default="")
    r.add_argument("--numerical-risks", dest="numerical_risks", default="")
    r.add_argument("--falsifier", default="")
    r.add_argument("--tokens", type=int, default=0, help="LLM tokens the agent spent on this action")
    common(r)
    r.set_defaults(func=_safe(cmd_record_action))

    r = s.add_parser("audit", help="Audit: evaluate the pending offspring; promotion and kappa")
    r.add_argument("run")
    common(r)
    r.set_defaults(func=_safe(cmd_audit))

    r = s.add_parser("decide", help="Lineage management: branch decision + follow-up opportunities")
    r.add_argument("run")
    r.add_argument("--decision", required=True, choices=["CONTINUE", "MERGE", "ARCHIVE", "ABANDON", "RETRY"])
    r.add_argument("--interpretation", required=True)
    r.add_argument("--rationale", required=True)
    r.add_argument("--opportunities", help="JSON/YAML list of new opportunities")
    r.add_argument("--close", help="comma list of pending opportunities to drop")
    r.add_argument("--abandon", help="comma list of retained implementations to drop")
    r.add_argument("--end", action="store_true",
                   help="allow the decision to leave no pending opportunity (ends the search); refused otherwise")
    common(r)
    r.set_defaults(func=_safe(cmd_decide))

    r = s.add_parser("status", help="search state Z_t")
    r.add_argument("run")
    r.add_argument("--json", action="store_true")
    r.set_defaults(func=_safe(cmd_status))

    r = s.add_parser("show", help="print one record (O/I/A/E/L id)")
    r.add_argument("run")
    r.add_argument("id")
    r.set_defaults(func=_safe(cmd_show))

    r = s.add_parser("checkout", help="copy an implementation folder for editing")
    r.add_argument("run")
    r.add_argument("id")
    r.add_argument("dir")
    r.set_defaults(func=_safe(cmd_checkout))

    r = s.add_parser("report", help="markdown + PNG plots of a run")
    r.add_argument("run")
    r.add_argument("--out", default=None, help="folder (default RUN/report)")
    r.set_defaults(func=_safe(cmd_report))

    r = s.add_parser("apply", help="apply SEARCH/REPLACE edits to a parent: --dry-run shows the diff or the error")
    r.add_argument("run")
    r.add_argument("--parent", required=True)
    r.add_argument("--edits", required=True)
    r.add_argument("--dry-run", action="store_true", help="only report whether/how the edits apply")
    r.add_argument("--out", default=None, help="write the edited copy here (for record-action --from-dir)")
    r.set_defaults(func=_safe(cmd_apply))

    r = s.add_parser("limits", help="raise / set the run's step and time budgets (reported by `next`)")
    r.add_argument("run")
    r.add_argument("--max-steps", type=int, default=None)
    r.add_argument("--time-budget-s", type=float, default=None)
    r.set_defaults(func=_safe(cmd_limits))

    r = s.add_parser("revoke", help="withdraw a verdict: out of best/frontier/archive, best recomputed")
    r.add_argument("run")
    r.add_argument("--id", required=True)
    r.add_argument("--reason", required=True)
    r.add_argument("--keep-descendants", action="store_true", help="revoke only this implementation")
    common(r)
    r.set_defaults(func=_safe(cmd_revoke))

    r = s.add_parser("reaudit", help="re-evaluate a verified implementation on another input draw")
    r.add_argument("run")
    r.add_argument("--id", required=True)
    r.add_argument("--seed", type=int, default=1, help="input draw of the timed checks (0 = the audit's own)")
    common(r)
    r.set_defaults(func=_safe(cmd_reaudit))

    r = s.add_parser("export", help="installable implementation folder from a verified implementation")
    r.add_argument("run")
    r.add_argument("--id", default=None, help="default: the run's best")
    r.add_argument("--name", required=True)
    r.add_argument("--dest", default=None, help="parent folder (default: the installed kernels/)")
    r.set_defaults(func=_safe(cmd_export))

    p.set_defaults(func=lambda a: (p.print_help(), 0)[1])
