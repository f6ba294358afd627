"""Parent side of the evaluator: one process per candidate, hard wall-clock limit, typed status.

The candidate runs in ``python -m areal_tik_plugin.search.worker`` started with
``start_new_session=True``; on timeout (or when this process is interrupted) the whole process group
is killed with SIGKILL, so a hung kernel, a stuck compiler or a sleeping candidate cannot outlive
its evaluation. The status is typed (``ok, compile_error, runtime_error, contract_violation,
inaccurate, timeout, infra_error``) and only ``ok`` can ever score.

Hash binding: the candidate's source hash is checked against its implementation record before the
run, reported by the worker as loaded, and re-checked after; the spec (criteria and baseline) and
the evaluator's own sources (this file, the worker, the runner, the timing function, the loader) are
hashed before and after and compared with the hashes bound to the run at its creation. Any mismatch
is an ``infra_error``: the measurement is not comparable with the others.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

from areal_tik_plugin.runtime import loader
from areal_tik_plugin.search import sandbox as X
from areal_tik_plugin.search import spec as S

STATUS_FROM_STAGE_CRASH = {"start": "infra_error", "compile": "compile_error"}


class BindingError(RuntimeError):
    """The evaluator or spec differs from the one bound to the run: no audit of this run is comparable
    any more (start a new run). Raised before evaluating, so nothing is recorded and kappa is untouched."""


def evaluator_files(spec: dict[str, Any]) -> list[str]:
    import areal_tik_plugin
    from areal_tik_plugin.search import runners

    pkg = os.path.dirname(os.path.abspath(areal_tik_plugin.__file__))
    here = os.path.dirname(os.path.abspath(__file__))
    files = [
        os.path.join(here, "evaluator.py"), os.path.join(here, "worker.py"), os.path.join(here, "spec.py"),
        os.path.abspath(runners.__file__), runners.runner_file(spec["runner"]),
        os.path.join(pkg, "bench.py"), os.path.join(pkg, "runtime", "loader.py"),
        os.path.join(pkg, "runtime", "interp.py"), os.path.join(pkg, "contract", "suite.py"),
        os.path.join(here, "sandbox.py"), os.path.join(here, "state.py"), os.path.join(pkg, "evidence.py"),
    ]
    return sorted(set(files))


def evaluator_hash(spec: dict[str, Any]) -> str:
    h = hashlib.sha256()
    for p in evaluator_files(spec):
        with open(p, "rb") as f:
            data = f.read()
        h.update(os.path.basename(p).encode() + b"\0" + len(data).to_bytes(8, "little") + data)
    return h.hexdigest()


class Evaluator:
    """Runs the worker for one implementation of a run and returns the typed result.

    Parameters
    ----------
    timeout_s : hard wall-clock limit per candidate (default: the spec's ``evaluation.timeout_s``)
    python : interpreter for the worker (default: this one)
    static_check : refuse candidate sources that fail :func:`sandbox.static_check` before running them;
        off only in tests that plant an attack the static check would stop, to show the next layer
        (process isolation, integrity snapshot) holds on its own
    """

    def __init__(self, timeout_s: float | None = None, python: str | None = None, poll_s: float = 0.25,
                 static_check: bool = True):
        self.timeout_s = timeout_s
        self.python = python or sys.executable
        self.poll_s = poll_s
        self.static_check = static_check

    def evaluate(self, run, iid: str, progress: Callable[[dict], None] | None = None, *, seed: int = 0,
                 ab: bool = True) -> dict[str, Any]:
        """Evaluate ``iid``; with ``ab`` (every audit after the root's) the run's current best and the
        root are timed interleaved with it in the same process (``timing.ab``)."""
        t_start = time.time()
        spec = run.spec
        rec = run.impls[iid]
        impl_dir = run.impl_dir(iid)
        work = run.path("work")
        os.makedirs(work, exist_ok=True)
        out_path = os.path.join(work, f"{iid}.result.json")
        log_path = os.path.join(work, f"{iid}.log")
        spec_path = run.path("spec.json")
        for p in (out_path,):
            if os.path.exists(p):
                os.unlink(p)
        hashes = {
            "candidate_record": rec.source_hash,
            "candidate_before": loader.compute_source_hash(impl_dir),
            "spec_bound": run.meta["spec_hash"],
            "baseline_bound": run.meta.get("baseline_hash", ""),
            "spec_before": S.criteria_hash(spec),
            "evaluator_bound": run.meta["evaluator_hash"],
            "evaluator_before": evaluator_hash(spec),
        }

        isolation: dict[str, Any] = {}

        def result(status, stage, error, res=None):
            r = {"status": status, "stage": stage, "latencies_us": {}, "checks": [], "compile": {},
                 "dispatch": {}, "timing": {}, "error": error, "env": {}}
            if res:
                for k in ("latencies_us", "checks", "compile", "dispatch", "timing", "env"):
                    if isinstance(res.get(k), type(r[k])):
                        r[k] = res[k]
                for k, v in (res.get("hashes") or {}).items():
                    hashes[f"worker_{k}"] = v
            r["hashes"] = hashes
            if res and isinstance(res.get("sandbox"), dict):
                isolation.update(res["sandbox"])
            r["env"] = {**r["env"], "isolation": dict(isolation)}
            r["log_tail"] = _tail(log_path)
            r["wall_s"] = round(time.time() - t_start, 3)
            if status != "ok":
                r["latencies_us"] = r["latencies_us"] if spec["evaluation"].get("measure_failed") else {}
            return r

        if hashes["candidate_before"] != rec.source_hash:
            return result("infra_error", "start", f"hash binding: {iid} sources ({hashes['candidate_before'][:12]}) "
                                                  f"differ from its record ({rec.source_hash[:12]})")
        if hashes["evaluator_before"] != hashes["evaluator_bound"]:
            raise BindingError(
                f"the evaluator sources ({', '.join(os.path.basename(p) for p in evaluator_files(spec))}) changed "
                f"since {run.root} was created ({hashes['evaluator_bound'][:12]} -> {hashes['evaluator_before'][:12]}); "
                "its measurements would not be comparable: start a new run")
        if hashes["spec_before"] != hashes["spec_bound"]:
            raise BindingError("the spec criteria changed since the run was created; start a new run")

        violations = X.static_check(impl_dir, run.impl_dir("I0000") if iid != "I0000" else impl_dir) \
            if self.static_check else []
        if violations:
            r = result("contract_violation", "static", "static check of the candidate's sources: "
                                                        + "; ".join(violations[:10]))
            r["checks"] = [{"name": f"static:{v.split(':', 2)[0]}", "passed": False, "kind": "static", "finding": v}
                           for v in violations[:50]]
            return r

        from areal_tik_plugin.search import instructions as INS

        try:
            findings, instr = INS.check(run.impl_dir("I0000"), impl_dir, loader.read_manifest(impl_dir)["entry_points"],
                                        list(spec["entry_points"]))
        except (SyntaxError, OSError, ValueError) as e:
            findings, instr = [], {"error": f"{type(e).__name__}: {e}"[:300]}
        if findings:
            r = result("contract_violation", "static", "instructions per path: " + "; ".join(findings[:6]))
            r["checks"] = [{"name": "instructions_per_path", "passed": False, "kind": "static", "findings": findings,
                            "instructions": instr}]
            return r

        st = run.state()
        incumbent = st.best if ab and iid != "I0000" and st.best and st.best != iid else None
        timeout = float(self.timeout_s or spec["evaluation"]["timeout_s"])
        lim = X.limits(spec, timeout)
        token = X.new_token()
        scratch = tempfile.mkdtemp(prefix=f"tik-audit-{iid}-")
        home = os.path.join(scratch, "home")
        private = os.path.join(scratch, "result")
        os.makedirs(home)
        os.makedirs(private, mode=0o700)
        worker_out = os.path.join(private, "result.json")
        env = X.scrubbed_env(spec["target"]["device"], home, int(spec["evaluation"].get("cpu_threads", 1)), token)
        net = spec["evaluation"].get("network", "unshare")
        cmd = [self.python, "-m", "areal_tik_plugin.search.worker", "--impl", impl_dir, "--spec", spec_path,
               "--out", worker_out, "--seed", str(int(seed))]
        if incumbent:
            cmd += ["--incumbent", run.impl_dir(incumbent), "--root", run.impl_dir("I0000")]
        if net == "unshare":
            cmd.append("--unshare-net")
        isolation.update({"process": "new session (setsid), own process group, killed at the end of the audit",
                          "cwd": "private temporary folder (also HOME, TMPDIR, caches)",
                          "env_keys": sorted(env), "limits": lim, "network_requested": net,
                          "static_check": "passed" if self.static_check else "off (test of the next layer)",
                          "incumbent": incumbent})
        snap = X.Snapshot(run.root, evaluator_files(spec) + _spec_sources(run))
        isolation["subreaper"] = X.become_subreaper()
        known_children = X.children_of_me()
        with open(log_path, "w") as logf:
            proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True, env=env, cwd=home, preexec_fn=X.preexec(lim))
        with open(os.path.join(work, f"{iid}.pid"), "w") as f:
            f.write(str(proc.pid))
        deadline = time.time() + timeout
        timed_out = False
        stray: list[int] = []
        try:
            while True:
                try:
                    proc.wait(timeout=self.poll_s)
                    break
                except subprocess.TimeoutExpired:
                    pass
                if progress is not None:
                    progress(_read(worker_out).get("progress") or {"stage": "start"})
                if time.time() > deadline:
                    timed_out = True
                    break
        finally:
            stray = X.kill_audit(proc.pid, token, known_children | {proc.pid})  # the whole group, detached children included
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:  # pragma: no cover
                pass
            if os.path.exists(worker_out):
                shutil.copyfile(worker_out, out_path)
            shutil.rmtree(scratch, ignore_errors=True)
        isolation["stray_processes_killed"] = stray
        changed = snap.changes()
        if changed:
            snap.restore()
            left = snap.changes()
            isolation["integrity"] = {"changed": changed, "restored": not left}
            r = result("infra_error", _read(out_path).get("stage", "start"),
                       f"integrity: the evaluation changed {len(changed)} protected path(s) "
                       f"({', '.join(changed[:8])}); restored from the copy taken before the audit"
                       + ("" if not left else f", but {left[:4]} could not be restored"), _read(out_path))
            r["latencies_us"] = {}
            r["timing"] = {}
            r["checks"] = [{"name": "integrity", "passed": False, "kind": "integrity", "changed": changed[:50]}]
            return r
        isolation["integrity"] = {"changed": [], "snapshot": snap.digest}
        res = _read(out_path)
        rc = proc.returncode
        hashes["candidate_after"] = loader.compute_source_hash(impl_dir)
        hashes["evaluator_after"] = evaluator_hash(spec)
        hashes["spec_after"] = S.criteria_hash(S.load(spec_path))
        stage = res.get("stage", "start")
        if timed_out:
            return result("timeout", stage, f"killed after the {timeout:.0f} s wall-clock limit (stage {stage}, "
                                            f"progress {res.get('progress')})", res)
        if res.get("status") is None:
            why = f"killed by signal {-rc}" if rc is not None and rc < 0 else f"exited with code {rc}"
            status = STATUS_FROM_STAGE_CRASH.get(stage, "runtime_error")
            return result(status, stage, f"the candidate process {why} during stage {stage} without a result", res)
        binding = []
        if hashes["candidate_after"] != hashes["candidate_before"]:
            binding.append("the candidate's sources changed during its evaluation")
        if res.get("hashes", {}).get("candidate_loaded") not in (None, hashes["candidate_before"]):
            binding.append("the worker loaded sources with another hash")
        if hashes["evaluator_after"] != hashes["evaluator_before"] or \
                res.get("hashes", {}).get("evaluator") not in (None, hashes["evaluator_before"]):
            binding.append("the evaluator sources changed during the evaluation")
        if hashes["spec_after"] != hashes["spec_before"] or res.get("hashes", {}).get("spec") != hashes["spec_before"]:
            binding.append("the spec changed during the evaluation")
        if binding:
            return result("infra_error", stage, "hash binding: " + "; ".join(binding), res)
        r = result(res["status"], stage, res.get("error"), res)
        r["compile"]["instructions_per_path"] = instr
        r["dispatch"]["rules"] = list(rec.dispatch_rules)
        if isinstance(r["timing"].get("ab"), dict):
            r["timing"]["ab"]["incumbent"] = incumbent
        if r["status"] == "ok" and incumbent and not (r["timing"].get("ab") or {}).get("objective_ratios"):
            return result("infra_error", stage, "the worker returned no A/B measurement against the incumbent "
                                                f"{incumbent}", res)
        return r


def _spec_sources(run) -> list[str]:
    src = run.meta.get("spec_source")
    return [src] if src and os.path.isfile(src) else []


def _read(path: str) -> dict[str, Any]:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError):
        return {}


def _tail(path: str, n: int = 6000) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - n))
            return f.read().decode(errors="replace")
    except OSError:
        return ""
