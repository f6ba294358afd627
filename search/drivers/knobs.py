"""Knob driver: searches the knobs an implementation declares, without an LLM.

Knobs come from the modules behind the spec's entry points (``KNOBS`` dicts; coupled ones are the
constants of ``contract.py``, see :mod:`..edits`). A coupled knob is one constant read by every path,
so moving it is one edit and the paths always move together; a free knob affects only the entry
points of its scope (spec ``knobs.scope``).

Opportunities come from audit evidence: for a verified implementation, each knob's neighbouring
values (one step along its declared choices) become an opportunity whose priority is the share of
T(I) held by the workloads the knob can affect, times how slow those workloads are relative to the
root; continuing a direction that improved gets a bonus, a value that already failed somewhere gets a
penalty, and assignments already built (or pending) are never proposed again.

Lineage management: a promoted offspring, or a verified one that improved a targeted workload by
more than ``search.improve_eps`` over its parent (an intermediate), is CONTINUEd with its neighbour
opportunities, and MERGE opportunities are proposed with other improving implementations whose knob
changes (relative to the root) are compatible; a verified offspring that improved nothing is
ARCHIVEd; a failed offspring is ABANDONed (a knob assignment is deterministic: retrying it cannot
help, and the failure stays as negative evidence for that value).
"""

from __future__ import annotations

from typing import Any

from areal_tik_plugin.search import drivers as D
from areal_tik_plugin.search import edits as E
from areal_tik_plugin.search import ir


class KnobsDriver:
    name = "knobs"

    def __init__(self, continue_bonus: float = 1.5, failed_value_penalty: float = 0.25, repeat_decay: float = 0.85,
                 merge_bonus: float = 2.0):
        self.continue_bonus = continue_bonus
        self.failed_value_penalty = failed_value_penalty
        self.repeat_decay = repeat_decay
        self.merge_bonus = merge_bonus

    # ---- helpers ---------------------------------------------------------------------------------
    @staticmethod
    def _sig(knobs: dict[str, Any]) -> tuple:
        return tuple(sorted((k, repr(v)) for k, v in knobs.items()))

    def _built_and_pending(self, run) -> set[tuple]:
        sigs = {self._sig(r.knobs) for r in run.impls.values() if r.materialized}
        # edits that failed to build still count as tried
        for a in run.actions.values():
            if a.knob_moves and a.parents[0] in run.impls:
                sigs.add(self._sig({**run.impls[a.parents[0]].knobs, **a.knob_moves}))
        for oid in run.state().pending:
            o = run.opps[oid]
            moves = o.details.get("knob_moves")
            if moves and o.applies_to and o.applies_to[0] in run.impls:
                sigs.add(self._sig({**run.impls[o.applies_to[0]].knobs, **moves}))
        return sigs

    def _failed_values(self, run) -> set[tuple]:
        out = set()
        for a in run.actions.values():
            au = run.audits.get(ir.make_id("audit", a.step))
            if au is not None and not au.verified:
                out.update((k, repr(v)) for k, v in a.knob_moves.items())
        return out

    def _tries(self, run) -> dict[str, int]:
        n: dict[str, int] = {}
        for a in run.actions.values():
            for k in a.knob_moves:
                n[k] = n.get(k, 0) + 1
        return n

    def _neighbours(self, run, iid: str, *, direction: dict[str, int] | None = None,
                    exclude: set[tuple] | None = None) -> list[dict[str, Any]]:
        knobs = run.knobs_of(iid)
        audit = D.audit_of(run, iid)
        lat = audit.latencies_us
        shares = D.workload_shares(run, lat)
        ratios = D.ratios_to_root(run, lat)
        base = dict(run.impls[iid].knobs)
        seen = set(exclude or set()) | self._built_and_pending(run)
        failed = self._failed_values(run)
        tries = self._tries(run)
        out = []
        for name, k in sorted(knobs.items()):
            if k.value not in k.choices:
                continue
            i = k.choices.index(k.value)
            for d in (-1, +1):
                j = i + d
                if not 0 <= j < len(k.choices):
                    continue
                v = k.choices[j]
                sig = self._sig({**base, name: v})
                if sig in seen:
                    continue
                seen.add(sig)
                scope = E.knob_scope(name, k.coupled, run.spec)
                targets = D.workloads_of(run, scope)
                targets.sort(key=lambda n: -shares.get(n, 0.0))
                share = sum(shares.get(n, 0.0) for n in targets)
                worst = max([ratios.get(n, 1.0) for n in targets] + [1.0])
                prio = share * worst
                if direction and direction.get(name) == d:
                    prio *= self.continue_bonus
                if (name, repr(v)) in failed:
                    prio *= self.failed_value_penalty
                prio *= self.repeat_decay ** tries.get(name, 0)
                kind = "coupled" if k.coupled else "free"
                out.append({
                    "kind": "initial" if iid == "I0000" and not run.actions else "followup",
                    "mechanism": f"{kind} knob {name}: {k.value!r} -> {v!r} "
                                 f"({'every path' if k.coupled else ', '.join(scope)})",
                    "entry_points": scope,
                    "target_workloads": targets,
                    "evidence": [audit.id],
                    "evidence_notes": f"largest / slowest targeted workloads of {iid}: "
                                      + D.slowest_note(run, lat, targets),
                    "applies_to": [iid],
                    "priority": round(prio, 6),
                    "details": {"knob_moves": {name: v}, "coupled": k.coupled, "file": k.file},
                })
        return out

    def _improving(self, run) -> list[str]:
        """Retained verified implementations whose audit improved on their parent (or promoted)."""
        eps = float(run.spec["search"].get("improve_eps", 0.02))
        st = run.state()
        out = []
        for iid in sorted(st.retained, key=ir.id_number):
            if iid == "I0000":
                continue
            a = run.actions.get(ir.make_id("action", ir.id_number(iid)))
            au = run.audits.get(ir.make_id("audit", ir.id_number(iid)))
            if a and au and au.verified and (au.promoted or D.improved_targets(run, au, a, eps)):
                out.append(iid)
        return out

    def _merges(self, run, iid: str) -> list[dict[str, Any]]:
        root = run.impls["I0000"].knobs
        mine = run.impls[iid].knobs
        d_mine = {k: v for k, v in mine.items() if root.get(k) != v}
        seen = self._built_and_pending(run)
        out = []
        for other in self._improving(run):
            if other == iid:
                continue
            theirs = run.impls[other].knobs
            d_theirs = {k: v for k, v in theirs.items() if root.get(k) != v}
            if any(k in d_mine and d_mine[k] != v for k, v in d_theirs.items()):
                continue  # incompatible: the same knob moved to different values
            moves = {k: v for k, v in d_theirs.items() if mine.get(k) != v}
            if not moves:
                continue
            sig = self._sig({**mine, **moves})
            if sig in seen:
                continue
            seen.add(sig)
            oa, ob = D.audit_of(run, iid), D.audit_of(run, other)
            eps_names = sorted(set(moves))
            kn = run.knobs_of(iid)
            out.append({
                "kind": "merge",
                "mechanism": f"merge: apply {other}'s knob changes {moves} to {iid}",
                "entry_points": sorted({e for k in moves for e in E.knob_scope(k, kn[k].coupled if k in kn else True,
                                                                                run.spec)}),
                "target_workloads": [w["name"] for w in run.spec["workloads"]],
                "evidence": [oa.id, ob.id],
                "evidence_notes": f"{iid} and {other} both improved on their parents with disjoint knob changes "
                                  f"({sorted(d_mine)} vs {eps_names})",
                "applies_to": [iid, other],
                "priority": round(self.merge_bonus * (1.0 + 1.0 / max(1, len(moves))), 6),
                "details": {"knob_moves": moves},
            })
        return out

    # ---- driver API ------------------------------------------------------------------------------
    def initial_decision(self, run) -> ir.LineageDecision:
        opps = self._neighbours(run, "I0000")
        knobs = run.knobs_of("I0000")
        return run.decide(
            decision="CONTINUE",
            interpretation=f"root verified; {len(knobs)} knobs declared "
                           f"({sum(k.coupled for k in knobs.values())} coupled): "
                           + ", ".join(f"{n}={k.value!r}" for n, k in sorted(knobs.items())),
            rationale="one opportunity per neighbouring value of each knob, ranked by the share of T(I0) its "
                      "workloads hold and their slowdown relative to the root",
            new_opportunities=opps, created_by=self.name)

    def act(self, run) -> ir.Action:
        import time

        t0 = time.time()
        opp = D.pending_sorted(run)[0]
        parents = list(opp.applies_to)
        moves = dict(opp.details.get("knob_moves") or {})
        files = run.files_of(parents[0])
        knobs = run.knobs_of(parents[0])
        edits, regions, kernel_variants = [], [], []
        coupled = []
        for name, v in moves.items():
            if name not in knobs:
                continue
            k = knobs[name]
            if k.value == v:
                continue
            edits.append(E.knob_edit(files, k, v))
            regions.append(f"{k.file}:{name}")
            if k.coupled:
                coupled.append(name)
        scope = sorted({e for n in moves if n in knobs for e in E.knob_scope(n, knobs[n].coupled, run.spec)})
        kind = D.action_kind(run, scope or list(run.spec["entry_points"]))
        if coupled:
            risks = (f"coupled constant(s) {coupled}: one definition read by every path, so the paths stay equal; "
                     "the bits change relative to the parent, and accuracy against the reference may move")
        else:
            risks = "free knob(s): the bits of every path must stay exactly as in the parent"
        targets = list(opp.target_workloads)
        return run.record_action(
            opportunity=opp.id, parents=parents, edits=edits, kind=kind, targeted_workloads=targets,
            kernel_variants=kernel_variants or scope, scope=f"set {moves} in {sorted({r.split(':')[0] for r in regions})}",
            affected_regions=regions,
            expected_effect=f"{opp.mechanism}: lower latency on {targets[:4]}",
            numerical_risks=risks,
            falsifier=f"no targeted workload faster than {parents[0]} by more than "
                      f"{100 * float(run.spec['search'].get('improve_eps', 0.02)):.0f}%, or any bitwise check fails",
            created_by=self.name, knob_moves=moves, wall_s=time.time() - t0,
            merge=False)  # the knob moves already carry every parent's values (the merge itself)

    def decide(self, run) -> ir.LineageDecision:
        st = run.state()
        step = st.open_step
        action = run.actions[ir.make_id("action", step)]
        audit = run.audits[ir.make_id("audit", step)]
        off = audit.implementation
        eps = float(run.spec["search"].get("improve_eps", 0.02))
        if not audit.verified:
            return run.decide(
                decision="ABANDON",
                interpretation=f"{off} failed: {audit.status} at stage {audit.stage}: {(audit.error or '')[:300]}",
                rationale=f"knob assignment {action.knob_moves} on {action.parents[0]} is deterministic; retrying "
                          "cannot change the outcome, the failure stays as evidence against this value",
                created_by=self.name)
        improved = D.improved_targets(run, audit, action, eps)
        if audit.promoted or improved:
            parent_knobs = run.impls[action.parents[0]].knobs
            direction = {}
            for k, v in action.knob_moves.items():
                kn = run.knobs_of(off).get(k)
                if kn and v in kn.choices and parent_knobs.get(k) in kn.choices:
                    direction[k] = 1 if kn.choices.index(v) > kn.choices.index(parent_knobs[k]) else -1
            opps = self._neighbours(run, off, direction=direction)
            merges = self._merges(run, off)
            what = "promoted" if audit.promoted else f"not promoted but improved {improved}"
            if not opps and not merges:
                return run.decide(decision="ARCHIVE", interpretation=f"{off} {what}; no unexplored neighbour left",
                                  rationale="kept for reuse", created_by=self.name)
            return run.decide(
                decision="MERGE" if merges else "CONTINUE",
                interpretation=f"{off} verified and {what}; T={audit.objective_us:.1f}us "
                               f"(best {st.best} {st.best_objective_us:.1f}us)",
                rationale=("keep it on the frontier: its neighbours continue the improving direction "
                           f"{direction}" + (f"; merge with {[m['applies_to'][1] for m in merges]}" if merges else "")),
                new_opportunities=merges + opps, created_by=self.name)
        note = "limits violated: " + ", ".join(audit.limit_violations) if audit.limit_violations else \
            "no targeted workload improved"
        return run.decide(
            decision="ARCHIVE",
            interpretation=f"{off} verified, not promoted ({note}); T={audit.objective_us}",
            rationale="retained without an immediate follow-up; may be reactivated by a merge or new evidence",
            created_by=self.name)
