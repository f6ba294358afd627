"""Search drivers: ACTION and LINEAGE MANAGEMENT policies over a :class:`~..state.Run`.

A driver has ``initial_decision(run)`` (lineage decision of the root: initial opportunities O_0),
``act(run)`` (select a pending opportunity and verified parents, produce the edit, record the action)
and ``decide(run)`` (branch decision for the last audit). Audits and promotion are not the driver's
business: :meth:`Run.audit` applies the rule of paper §5.3.

``knobs``  moves declared knobs (no LLM)                      -> :mod:`.knobs`
``llm``    SEARCH/REPLACE edits from an OpenAI-compatible LLM -> :mod:`.llm`
``plan``   a coding agent's actions and branch decisions, written before a batch call -> :mod:`.plan`
``agent``  any coding agent through ``tik search`` verbs      -> ``search/skill/SKILL.md``
"""

from __future__ import annotations

from typing import Any

from areal_tik_plugin.search import ir


def workload_shares(run, latencies: dict[str, float]) -> dict[str, float]:
    """c_w lat(w) / T for each workload (the part of the objective a workload holds)."""
    tot = 0.0
    out = {}
    for w in run.spec["workloads"]:
        v = latencies.get(w["name"])
        out[w["name"]] = w["weight"] * v if v else 0.0
        tot += out[w["name"]]
    return {k: (v / tot if tot else 0.0) for k, v in out.items()}


def ratios_to_root(run, latencies: dict[str, float]) -> dict[str, float]:
    base = (run.spec.get("baseline") or {}).get("latencies_us", {})
    return {n: latencies[n] / base[n] for n in latencies if base.get(n)}


def workloads_of(run, entry_points: list[str]) -> list[str]:
    return [w["name"] for w in run.spec["workloads"] if w["entry"] in entry_points]


def action_kind(run, entry_points: list[str]) -> str:
    kinds = {run.spec["entry_points"][e] for e in entry_points if e in run.spec["entry_points"]}
    # the training step's forward and backward are full-sequence paths (no KV cache, whole sequences)
    kinds = {"full_sequence" if k == "train_fwd_bwd" else k for k in kinds}
    if kinds == {"full_sequence"}:
        return "full_sequence"
    if kinds == {"decode"}:
        return "decode"
    return "joint"


def audit_of(run, iid: str) -> ir.Audit:
    return run.audits[ir.make_id("audit", ir.id_number(iid))]


def improved_targets(run, audit: ir.Audit, action: ir.Action, eps: float) -> list[str]:
    """Targeted workloads where the offspring beats its (first) parent by more than ``eps``."""
    if not audit.verified:
        return []
    parent = audit_of(run, action.parents[0])
    out = []
    for w in action.targeted_workloads:
        a, b = audit.latencies_us.get(w), parent.latencies_us.get(w)
        if a and b and a < b * (1.0 - eps):
            out.append(w)
    return out


def slowest_note(run, latencies: dict[str, float], names: list[str], k: int = 4) -> str:
    r = ratios_to_root(run, latencies)
    sh = workload_shares(run, latencies)
    top = sorted(names, key=lambda n: -sh.get(n, 0.0))[:k]
    return ", ".join(f"{n} {latencies.get(n, 0):.1f}us (x{r.get(n, 1.0):.3f} of root, {100 * sh.get(n, 0):.1f}% of T)"
                     for n in top)


def pending_sorted(run) -> list[ir.Opportunity]:
    st = run.state()
    return sorted((run.opps[o] for o in st.pending), key=lambda o: (-o.priority, ir.id_number(o.id)))


def get_driver(name: str, **kw: Any):
    if name == "knobs":
        from areal_tik_plugin.search.drivers.knobs import KnobsDriver

        return KnobsDriver(**kw)
    if name == "llm":
        from areal_tik_plugin.search.drivers.llm import LLMDriver

        return LLMDriver(**kw)
    if name == "plan":
        from areal_tik_plugin.search.drivers.plan import PlanDriver

        return PlanDriver(**kw)
    raise ValueError(f"unknown driver {name!r}; expected knobs, llm or plan (the agent driver is the `tik search` verbs)")
