"""The search loop (paper Algorithm 1) over a run directory, with a live status line.

    INITIALIZE (audit the root, fill the baseline, initial opportunities)
    while O_t != {} and kappa_t < kappa_max (and step / time budgets):
        ACTION -> AUDIT (+ promotion, kappa) -> LINEAGE MANAGEMENT

Every phase is persisted before the next begins, so ``run_search`` on an existing run directory
resumes exactly where the previous invocation stopped (Ctrl-C included: the candidate's process group
is killed and its audit simply runs again).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from areal_tik_plugin.search import ir


class Progress:
    """One live line on a terminal (``\\r``), plain log lines otherwise."""

    def __init__(self, stream=None, enabled: bool = True):
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()
        self._last = ""
        self._last_plain = 0.0

    def line(self, text: str) -> None:
        if not self.enabled:
            return
        if self.tty:
            width = 160
            self.stream.write("\r" + text[:width].ljust(min(width, max(len(self._last), len(text)))))
            self.stream.flush()
            self._last = text
        elif time.time() - self._last_plain > 30:
            self.stream.write(text + "\n")
            self.stream.flush()
            self._last_plain = time.time()

    def log(self, text: str) -> None:
        if not self.enabled:
            return
        if self.tty and self._last:
            self.stream.write("\r" + " " * min(160, len(self._last)) + "\r")
        self.stream.write(text + "\n")
        self.stream.flush()
        self._last = ""


def _bar(frac: float, width: int = 20) -> str:
    frac = min(max(frac, 0.0), 1.0)
    n = int(round(frac * width))
    return "[" + "#" * n + "-" * (width - n) + "]"


def status_line(run, extra: str = "") -> str:
    st = run.state()
    lim = run.limits()
    root_T = run.audits["E0000"].objective_us if "E0000" in run.audits else None
    sp = (root_T / st.best_objective_us) if root_T and st.best_objective_us else 1.0
    fr = []
    if lim["max_steps"]:
        fr.append(st.t / lim["max_steps"])
    if lim["time_budget_s"]:
        fr.append(st.time_used_s / lim["time_budget_s"])
    fr.append(st.kappa / lim["kappa_max"])
    opps = run.opps
    s = (f"{_bar(max(fr))} step {st.t}{'/' + str(lim['max_steps']) if lim['max_steps'] else ''} "
         f"kappa {st.kappa}/{lim['kappa_max']} best {st.best} x{sp:.3f} "
         f"F{len(st.frontier(opps))} R{len(st.archive(opps))} O{len(st.pending)} "
         f"{st.time_used_s:.0f}s")
    if st.tokens:
        s += f" tok {st.tokens / 1e3:.1f}k"
    return s + (" | " + extra if extra else "")


def run_search(run, driver, evaluator, progress: Progress | None = None, *, max_new_steps: int | None = None) -> dict[str, Any]:
    """Run (or resume) the loop until a stopping rule holds. Returns a short summary."""
    progress = progress or Progress(enabled=False)
    t_wall = time.time()
    steps_done = 0

    def on_eval(iid):
        t0 = time.time()

        def cb(p: dict) -> None:
            what = p.get("stage", "?")
            if p.get("workload"):
                what += f" {p.get('index', 0) + 1}/{p.get('total', '?')} {p['workload']}"
            progress.line(status_line(run, f"evaluating {iid}: {what} {time.time() - t0:.0f}s"))

        return cb

    while True:
        ph = run.state().phase
        if ph == "init":
            progress.log(f"initializing: auditing the root {run.meta['root_name']} on {run.spec['name']} "
                         f"({len(run.spec['workloads'])} workloads)")
            a = run.initialize(evaluator, progress=on_eval("I0000"))
            progress.log(f"root verified: T(I0) = {a.objective_us:.1f} us; baseline recorded in spec.json")
            continue
        if ph == "decide":
            st = run.state()
            if st.open_step in (None, 0):
                driver.initial_decision(run)
            else:
                d = driver.decide(run)
                au = run.audits[d.audit]
                progress.log(f"step {au.step}: {au.implementation} {au.status}"
                             + (f" T={au.objective_us:.1f}us" if au.objective_us else "")
                             + (" PROMOTED" if au.promoted else "")
                             + (f" limits: {au.limit_violations}" if au.limit_violations else "")
                             + f" -> {d.decision}  [{run.actions[ir.make_id('action', au.step)].opportunity}: "
                             + f"{run.opps[run.actions[ir.make_id('action', au.step)].opportunity].mechanism[:70]}]")
            steps_done += 1 if st.open_step else 0
            continue
        if ph == "audit":
            st = run.state()
            run.audit(evaluator, progress=on_eval(ir.make_id("implementation", st.open_step)))
            continue
        # action
        reason = run.stop_reason()
        if reason is None and hasattr(driver, "stop_reason"):
            reason = driver.stop_reason(run)
        if reason is None and max_new_steps is not None and steps_done >= max_new_steps:
            reason = f"--max-new-steps {max_new_steps} reached"
        if reason is None:
            est = _mean_eval_s(run)
            tb = run.limits()["time_budget_s"]
            if tb is not None and est and run.state().time_used_s + est > tb:
                reason = f"time budget: {run.state().time_used_s:.0f} s used, next evaluation ~{est:.0f} s > {tb} s"
        if reason:
            run.set_stopped(reason)
            progress.log(f"stopped: {reason}")
            break
        progress.line(status_line(run, "action"))
        driver.act(run)
    st = run.state()
    root_T = run.audits["E0000"].objective_us
    return {"stopped": run.meta.get("stopped"), "steps": st.t, "best": st.best,
            "best_objective_us": st.best_objective_us, "root_objective_us": root_T,
            "speedup": root_T / st.best_objective_us if st.best_objective_us else None, "kappa": st.kappa,
            "tokens": st.tokens, "wall_s": round(time.time() - t_wall, 1), "run_dir": run.root}


def _mean_eval_s(run) -> float | None:
    xs = [a.wall_s for a in run.audits.values() if a.status == "ok"]
    return sum(xs) / len(xs) if xs else None


def best_path(run) -> str:
    return os.path.join(run.root, run.impls[run.state().best].path)
