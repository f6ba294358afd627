"""``tik search report RUN``: markdown + PNG plots of a run (matplotlib, imported here only).

Plots: best aggregate speedup T(I0)/T(I*_t) against the step (every audited candidate's own speedup
as points, coloured by status); cumulative LLM tokens against the step (when any were used); the
derivation graph G_t (x = step, y = generation; colour = status; merges as dashed second-parent
edges; the current best outlined). Tables: per-step records and per-workload latency of the best vs
the root with each workload's limit.
"""

from __future__ import annotations

import os
from typing import Any

from areal_tik_plugin.search import ir

STATUS_COLOR = {
    "ok": "#2b8cbe", "compile_error": "#a50f15", "runtime_error": "#de2d26", "contract_violation": "#fb6a4a",
    "inaccurate": "#fc9272", "timeout": "#756bb1", "infra_error": "#636363", "pending": "#bdbdbd",
}


def _f1(x) -> str:
    return "" if x is None else f"{x:.1f}"


def _speedup(root_T, T):
    return root_T / T if root_T and T else None


def write_report(run, out: str | None = None) -> str:
    out = out or run.path("report")
    os.makedirs(out, exist_ok=True)
    root_T = run.audits["E0000"].objective_us if "E0000" in run.audits else None
    files: dict[str, str] = {}
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        plt = None
    if plt is not None:
        _plots(run, out, files, plt, root_T)
    return _markdown(run, out, files, root_T, plots=plt is not None)


def _plots(run, out, files, plt, root_T) -> None:
    st = run.state()

    # ---- speedup vs step ----------------------------------------------------------------------------
    fig, ax = plt.subplots(figsize=(7, 4))
    hs = st.history
    ax.step([h["step"] for h in hs], [_speedup(root_T, h["best_objective_us"]) or 1.0 for h in hs], where="post",
            color="#31a354", label="best (promoted)")
    ok = [(h["step"], _speedup(root_T, h["objective_us"])) for h in hs if h["objective_us"] and h.get("admissible", True)]
    bad = [(h["step"], _speedup(root_T, h["objective_us"])) for h in hs if h["objective_us"] and not h.get("admissible", True)]
    if ok:
        ax.scatter(*zip(*ok), s=18, color=STATUS_COLOR["ok"], label="verified candidate", zorder=3)
    if bad:
        ax.scatter(*zip(*bad), s=18, color="#fdae6b", label="verified, a workload over its limit", zorder=3)
    fails = [h["step"] for h in hs if h["status"] != "ok"]
    if fails:
        ax.scatter(fails, [1.0] * len(fails), marker="x", color="#de2d26", label="failed (no score)", zorder=3)
    ax.axhline(1.0, color="#999", lw=0.8)
    ax.set_xlabel("step (audited candidates)")
    ax.set_ylabel("T(I0) / T")
    ax.set_title(f"{run.spec['name']} ({run.spec.get('variant')}): best aggregate speedup")
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    files["speedup"] = os.path.join(out, "speedup.png")
    fig.savefig(files["speedup"], dpi=110)
    plt.close(fig)

    # ---- tokens vs step -----------------------------------------------------------------------------
    if st.tokens:
        fig, ax = plt.subplots(figsize=(7, 3.2))
        ax.plot([h["step"] for h in hs], [h.get("tokens", 0) / 1e3 for h in hs], marker="o", ms=3)
        ax.set_xlabel("step")
        ax.set_ylabel("cumulative LLM tokens (k)")
        ax.set_title("LLM tokens")
        fig.tight_layout()
        files["tokens"] = os.path.join(out, "tokens.png")
        fig.savefig(files["tokens"], dpi=110)
        plt.close(fig)

    # ---- derivation graph ---------------------------------------------------------------------------
    files["graph"] = os.path.join(out, "graph.png")
    _draw_graph(run, files["graph"], plt)



def _markdown(run, out, files, root_T, plots: bool) -> str:
    st = run.state()
    hs = st.history
    lines = [f"# Search report: `{os.path.basename(run.root)}`", ""]
    best = st.best
    sp = _speedup(root_T, st.best_objective_us)
    lines += [
        f"- spec: `{run.spec['name']}` ({run.spec.get('variant')}), {len(run.spec['workloads'])} workloads, "
        f"spec hash `{run.meta['spec_hash'][:12]}`, evaluator hash `{run.meta['evaluator_hash'][:12]}`",
        f"- root: `{run.meta['root_name']}` from `{run.meta['root_origin']}`; T(I0) = {root_T and f'{root_T:.1f}'} us "
        f"(measured at initialization, audit E0000)",
        f"- best: `{best}` (`{run.impls[best].path if best else ''}`), T = "
        f"{st.best_objective_us and f'{st.best_objective_us:.1f}'} us, **speedup {sp and f'{sp:.3f}'}x** on the "
        f"spec's objective",
        f"- steps: {st.t}, kappa {st.kappa}/{run.limits()['kappa_max']}, frontier {st.frontier(run.opps)}, "
        f"archive {st.archive(run.opps)}, pending opportunities {len(st.pending)}",
        f"- stopped: {(run.meta.get('stopped') or {}).get('reason') or run.stop_reason() or 'not stopped'}",
        f"- time used: {st.time_used_s:.0f} s; LLM tokens: {st.tokens}",
    ]
    env = (run.spec.get("baseline") or {}).get("env") or {}
    if env:
        lines.append("- environment: " + ", ".join(f"{k}={env.get(k)}" for k in
                                                     ("gpu", "driver", "cuda", "torch", "triton", "cpu_model")
                                                     if env.get(k)))
    counts: dict[str, int] = {}
    for h in hs[1:]:
        counts[h["status"]] = counts.get(h["status"], 0) + 1
    lines += ["", "Statuses: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())), ""]
    if plots:
        lines += ["![speedup](speedup.png)", ""]
        if "tokens" in files:
            lines += ["![tokens](tokens.png)", ""]
        lines += ["![derivation graph](graph.png)", ""]
    else:
        lines += ["(plots skipped: matplotlib is not installed here; run `tik search report` where it is)", ""]

    lines += ["## Steps", "", "| step | action | parents -> offspring | opportunity | status | T us | speedup | "
              "over limit | promoted | decision |", "|---|---|---|---|---|---|---|---|---|---|"]
    for h in hs[1:]:
        s = h["step"]
        a = run.actions.get(ir.make_id("action", s))
        d = run.decisions.get(ir.make_id("decision", s))
        mech = run.opps[a.opportunity].mechanism.replace("|", "/")[:80] if a else ""
        au = run.audits.get(ir.make_id("audit", s))
        over = ", ".join(au.limit_violations[:3]) if au else ""
        lines.append(f"| {s} | {a.id if a else ''} | {','.join(a.parents) if a else ''} -> {h['implementation']} | "
                     f"{mech} | {h['status']} | {_f1(h['objective_us'])} | "
                     f"{(_speedup(root_T, h['objective_us']) or 0):.3f} | {over} | {'yes' if h.get('promoted') else ''} | "
                     f"{d.decision if d else ''} |")
    if best and root_T:
        ab = run.audits[ir.make_id("audit", ir.id_number(best))]
        base = run.spec["baseline"]["latencies_us"]
        lines += ["", f"## Workloads: best `{best}` vs root", "",
                  "| workload | entry | c_w | root us | best us | root/best | limit us |", "|---|---|---|---|---|---|---|"]
        for w in run.spec["workloads"]:
            r, b = base[w["name"]], ab.latencies_us.get(w["name"])
            lines.append(f"| {w['name']} | {w['entry']} | {w['weight']:g} | {r:.1f} | {b and f'{b:.1f}'} | "
                         f"{(r / b if b else 0):.3f} | {r * w['max_slowdown']:.1f} |")
        if best != "I0000":
            a = run.actions[ir.make_id("action", ir.id_number(best))]
            lines += ["", f"## Change of the best (`{a.id}`, parents {a.parents})", "", "```diff", a.diff[:20000], "```"]
    path = os.path.join(out, "report.md")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


def _draw_graph(run, path: str, plt) -> None:
    st = run.state()
    nodes = sorted(st.graph, key=ir.id_number)
    depth: dict[str, int] = {}
    for n in nodes:
        ps = st.graph[n]
        depth[n] = 0 if not ps else 1 + max(depth.get(p, 0) for p in ps)
    pos = {n: (ir.id_number(n), -depth[n]) for n in nodes}
    fig_w = min(30, 3 + 0.45 * len(nodes))
    fig, ax = plt.subplots(figsize=(fig_w, 2.5 + 0.5 * (max(depth.values()) + 1)))
    for n in nodes:
        for i, p in enumerate(st.graph[n]):
            (x0, y0), (x1, y1) = pos[p], pos[n]
            ax.annotate("", xy=(x1, y1), xytext=(x0, y0),
                        arrowprops={"arrowstyle": "->", "color": "#777", "lw": 0.8, "ls": "--" if i else "-",
                                    "shrinkA": 7, "shrinkB": 7})
    for n in nodes:
        au = run.audits.get(ir.make_id("audit", ir.id_number(n)))
        status = au.status if au else "pending"
        color = STATUS_COLOR.get(status, "#bdbdbd")
        if au and au.status == "ok" and not au.admissible:
            color = "#fdae6b"
        edge = "#31a354" if au and au.promoted else "black"
        lw = 3 if n == st.best else (1.8 if au and au.promoted else 0.6)
        x, y = pos[n]
        ax.scatter([x], [y], s=160, color=color, edgecolors=edge, linewidths=lw, zorder=3)
        d = run.decisions.get(ir.make_id("decision", ir.id_number(n)))
        label = n[1:].lstrip("0") or "0"
        ax.annotate(f"I{label}\n{status if status != 'ok' else ('best' if n == st.best else ('+' if au and au.promoted else 'ok'))}"
                    + (f"\n{d.decision[:4]}" if d and n != "I0000" else ""),
                    (x, y), textcoords="offset points", xytext=(0, -26), ha="center", fontsize=6)
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], marker="o", ls="", color=c, label=s) for s, c in STATUS_COLOR.items() if s != "pending"]
    handles.append(Line2D([], [], marker="o", ls="", color="#fdae6b", label="ok, limit violated"))
    handles.append(Line2D([], [], marker="o", ls="", color="white", markeredgecolor="#31a354", markeredgewidth=2,
                          label="promoted"))
    ax.legend(handles=handles, fontsize=6, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_xlabel("step")
    ax.set_ylabel("generation")
    ax.set_yticks(sorted({-d for d in depth.values()}))
    ax.set_yticklabels([str(d) for d in sorted({d for d in depth.values()}, reverse=True)])
    ax.set_title("derivation graph G_t (dashed: second parent of a merge)", fontsize=9)
    ax.margins(x=0.05, y=0.35)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def summary(run) -> dict[str, Any]:
    st = run.state()
    root_T = run.audits["E0000"].objective_us
    return {"best": st.best, "speedup": _speedup(root_T, st.best_objective_us), "steps": st.t, "kappa": st.kappa}
