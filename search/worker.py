"""Evaluate one candidate implementation in this (dedicated, killable) process.

``python -m areal_tik_plugin.search.worker --impl DIR --spec SPEC.json --out RESULT.json``

Stages, in order, stopping at the first failure: compile -> bitwise contract -> accuracy -> latency on
every workload. The result JSON is rewritten atomically after every stage (and every workload), so a
crash or a kill leaves the last stage reached for the parent to report. The exit code is 0 whenever
a result with a status was written, whatever the status.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import sys
import time
import traceback
from typing import Any

# The evaluator's clock, bound before any candidate module is imported: a candidate that replaces
# ``time.perf_counter`` (the static check refuses it first) still cannot change what is timed here.
_CLOCK = time.perf_counter

STAGES = ("start", "compile", "bitwise", "accuracy", "latency", "dispatch", "done")
FOREIGN_KERNELS = re.compile(r"flash|fmha|cudnn|cutlass|xmma|sdpa|attention|gemm|cublas", re.I)


def _write(path: str, obj: dict[str, Any]) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1, default=str)
    os.replace(tmp, path)


def environment(device: str) -> dict[str, Any]:
    from areal_tik_plugin import evidence

    env = evidence.environment()
    env["hostname"] = platform.node()
    env["cuda_visible_devices"] = os.environ.get("CUDA_VISIBLE_DEVICES")
    env["triton_interpret"] = os.environ.get("TRITON_INTERPRET")
    env["device"] = device
    if device == "cpu":
        env["cpu_model"] = _cpu_model()
        env["cpu_count"] = os.cpu_count()
    return env


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _sync(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def measure(fn, spec: dict[str, Any], device: str) -> dict[str, Any]:
    """Latency of ``fn`` in microseconds by the spec's timing method (GPU: areal_tik_plugin.bench)."""
    t = spec["evaluation"].get("timing", {})
    if device == "cpu":
        import statistics

        for _ in range(int(t.get("warmup", 1))):
            fn()
        times = []
        for _ in range(int(t.get("reps", 5))):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e6)
        stat = t.get("stat", "median")
        us = float(min(times) if stat == "min" else statistics.median(times))
        return {"method": f"cpu_perf_counter_{stat}", "us": us, "reps": len(times), "all_us": times}
    import torch

    from areal_tik_plugin import bench

    fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    fn()
    b.record()
    b.synchronize()
    est_us = max(a.elapsed_time(b) * 1e3, 1.0)
    method = t.get("method", "graph")
    out: dict[str, Any] = {"method": method, "single_call_us": est_us}
    if method in ("graph", "both"):
        n_inner = t.get("n_inner", "auto")
        if n_inner == "auto":
            n_inner = int(min(max(1, round(float(t.get("target_ms", 2.0)) * 1e3 / est_us)), int(t.get("max_inner", 20))))
        rounds = int(t.get("rounds", 7))
        out["graph_us"] = bench.time_graph_us(fn, n_inner=int(n_inner), rounds=rounds)
        out.update(n_inner=int(n_inner), rounds=rounds)
    if method in ("cold", "both"):
        out["cold_us"] = bench.time_cold_us(fn, warmup_ms=float(t.get("warmup_ms", 5)), rep_ms=float(t.get("rep_ms", 25)))
    out["us"] = out["graph_us"] if method in ("graph", "both") else out["cold_us"]
    return out


def _own_kernel_names(impl) -> set[str]:
    names = set()
    try:
        from triton.runtime.jit import JITFunction
    except Exception:  # pragma: no cover
        return names
    for modname, mod in list(sys.modules.items()):
        if not modname.startswith(impl.package + ".") or mod is None:
            continue
        for obj in vars(mod).values():
            if isinstance(obj, JITFunction):
                names.add(getattr(obj.fn, "__name__", ""))
    return names


def classify_kernels(kernels, own_names) -> dict[str, Any]:
    """Split the GPU kernel names of one profiled call into the candidate's own (names starting with
    one of its ``@triton.jit`` functions) and foreign library kernels (cuDNN, FlashAttention, cuBLAS...).
    Pure function, so the parsing is tested on CPU with a recorded profile."""
    kernels = sorted(set(kernels))
    own = [k for k in kernels if any(k.startswith(n) for n in own_names if n)]
    foreign = [k for k in kernels if k not in own and FOREIGN_KERNELS.search(k)]
    return {"kernels": kernels, "own": own, "foreign": foreign}


def gpu_kernel_names(events) -> list[str]:
    """Names of the device-side (CUDA) events of a ``torch.profiler`` trace (objects or dicts)."""
    out = []
    for e in events:
        name = e.get("name") if isinstance(e, dict) else getattr(e, "name", None)
        dev = e.get("device_type") if isinstance(e, dict) else getattr(e, "device_type", "")
        if name and str(dev).endswith("CUDA"):
            out.append(str(name))
    return out


def profile_dispatch(ctx, fn) -> dict[str, Any]:
    """Kernels launched by one call (GPU profiler); own = JIT functions of the candidate's modules."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return classify_kernels(gpu_kernel_names(prof.events()), _own_kernel_names(ctx.impl))


def compile_evidence(impl) -> list[dict[str, Any]]:
    """Registers / spills / shared memory of every compiled Triton kernel of the candidate (GPU)."""
    out = []
    try:
        from triton.runtime.jit import JITFunction
    except Exception:  # pragma: no cover
        return out
    for modname, mod in list(sys.modules.items()):
        if not modname.startswith(impl.package + ".") or mod is None:
            continue
        for obj in vars(mod).values():
            if not isinstance(obj, JITFunction):
                continue
            caches = getattr(obj, "device_caches", None) or {}
            for dev_cache in caches.values():
                kc = dev_cache[0] if isinstance(dev_cache, (tuple, list)) else dev_cache
                for k in getattr(kc, "values", lambda: [])():
                    md = getattr(k, "metadata", None)
                    out.append({
                        "kernel": obj.fn.__name__,
                        "n_regs": getattr(k, "n_regs", None),
                        "n_spills": getattr(k, "n_spills", None),
                        "shared": getattr(md, "shared", None),
                        "num_warps": getattr(md, "num_warps", None),
                        "num_stages": getattr(md, "num_stages", None),
                    })
    return out


def _sentinels() -> dict[str, Any]:
    """Objects the evaluator relies on, captured before candidate code loads (compared after)."""
    import torch

    from areal_tik_plugin.contract import suite

    out = {"time.perf_counter": time.perf_counter, "time.time": time.time, "torch.equal": torch.equal,
           "Recorder.check": suite.Recorder.check, "Recorder.bitwise": suite.Recorder.bitwise,
           "Recorder.close": suite.Recorder.close, "suite.bits": suite.bits,
           "torch.Tensor.double": torch.Tensor.double, "torch.Tensor.__eq__": torch.Tensor.__eq__}
    if torch.cuda.is_available():
        out["torch.cuda.Event"] = torch.cuda.Event
        out["torch.cuda.synchronize"] = torch.cuda.synchronize
    return out


def _tampered(before: dict[str, Any]) -> list[str]:
    now = _sentinels()
    return [k for k, v in before.items() if now.get(k) is not v]


def _measure_fixed(res, spec, runner, ctx, rec, device, write, fail):
    """Runners without ``workload_case`` (fixed inputs, no A/B): latency only; recorded as such."""
    wls = spec["workloads"]
    res["timing"]["inputs"] = "fixed (the runner has no workload_case: outputs of timed calls unchecked)"
    for i, w in enumerate(wls):
        res["progress"] = {"stage": "latency", "workload": w["name"], "index": i, "total": len(wls), "t": time.time()}
        write()
        try:
            fn = runner.workload(ctx, w)
            n0 = ctx.calls[w["entry"]]
            fn()
            _sync(device)
            if ctx.calls[w["entry"]] == n0:
                rec.check(f"own_code[{w['name']}]", False, kind="dispatch",
                          error=f"the workload did not call the candidate's entry point {w['entry']}")
                res["checks"] = rec.checks
                return fail("contract_violation", f"workload {w['name']} did not run the candidate's {w['entry']}")
            t = measure(fn, spec, device)
            res["timing"][w["name"]] = t
            res["latencies_us"][w["name"]] = t["us"]
            del fn
        except BaseException as e:  # noqa: BLE001
            if isinstance(e, KeyboardInterrupt):
                raise
            res["checks"] = rec.checks
            return fail("runtime_error", f"workload {w['name']}: {type(e).__name__}: {e}\n{traceback.format_exc()}")
        write()
    return None


def _timed_call(fn, device: str, events) -> tuple[float, Any]:
    """One call on fresh inputs, timed with the clock / events bound before the candidate loaded."""
    if device == "cuda":
        import torch

        torch.cuda.synchronize()
        a, b = events[0](enable_timing=True), events[0](enable_timing=True)
        a.record()
        out = fn()
        b.record()
        b.synchronize()
        return a.elapsed_time(b) * 1e3, out
    t0 = _CLOCK()
    out = fn()
    return (_CLOCK() - t0) * 1e6, out


def _stat(xs: list[float], stat: str) -> float:
    return float(min(xs) if stat == "min" else statistics.median(xs))


def _measure_ab(res, spec, runner, ctx, rec, device, *, stage_write, incumbent, root, seed, fail):
    """Interleaved A/B(/root) timing on fresh inputs: in every round, every workload gets a new draw
    of its inputs (the same draw for every arm), each arm is timed once on it (order alternating
    between rounds), and the candidate's output of that timed call is checked against the reference.

    ``res["timing"]["ab"]``: per-round objective ratios candidate / incumbent and per-workload median
    ratios candidate / root, from which the promotion rule (``state.ab_verdict``) decides."""
    from areal_tik_plugin.runtime import loader
    from areal_tik_plugin.contract.suite import Recorder
    from areal_tik_plugin.search.runners import Context

    t = spec["evaluation"].get("timing", {})
    warm = int(t.get("warmup", 1))
    rounds = int(t.get("ab_rounds", t.get("reps", 5)))
    stat = t.get("stat", "median")
    wls = spec["workloads"]
    arms = [("candidate", ctx)]
    for label, path in (("incumbent", incumbent), ("root", root)):
        if path and not (label == "root" and root == incumbent):
            try:
                other = loader.load_implementation(path)
                octx = Context(other, spec, device, Recorder(label))
                runner.compile(octx)
                _sync(device)
            except BaseException as e:  # noqa: BLE001 - the reference arm is evaluator state
                if isinstance(e, KeyboardInterrupt):
                    raise
                return fail("infra_error", f"the {label} arm ({path}) failed to load: {type(e).__name__}: {e}")
            arms.append((label, octx))
    events = None
    if device == "cuda":
        import torch

        events = (torch.cuda.Event,)
    times: dict[str, dict[str, list[float]]] = {a: {w["name"]: [] for w in wls} for a, _ in arms}
    for r in range(warm + rounds):
        order = arms if r % 2 == 0 else arms[::-1]
        for i, w in enumerate(wls):
            res["progress"] = {"stage": "latency", "workload": w["name"], "round": r, "rounds": warm + rounds,
                               "index": i, "total": len(wls), "t": time.time()}
            for label, actx in order:
                s = seed * 100_003 + r
                try:
                    fn, check = runner.workload_case(actx, w, s)
                    n0 = actx.calls[w["entry"]]
                    if device == "cuda":  # CUDA-graph / cold timing of this draw, then one eager call to check
                        us = measure(fn, spec, device)["us"]
                        out = fn()
                    else:
                        us, out = _timed_call(fn, device, events)
                    _sync(device)
                    if actx.calls[w["entry"]] == n0:
                        if label != "candidate":
                            return fail("infra_error", f"the {label} arm did not run its {w['entry']}")
                        rec.check(f"own_code[{w['name']}]", False, kind="dispatch",
                                  error=f"the workload did not call the candidate's entry point {w['entry']}")
                        res["checks"] = rec.checks
                        return fail("contract_violation", f"workload {w['name']} did not run the candidate's "
                                                          f"{w['entry']}")
                    if label == "candidate":
                        n_checks = len(rec.checks)
                        check(out)
                        if len(rec.checks) == n_checks:
                            rec.check(f"timed[{w['name']}][seed={s}]", False, kind="error",
                                      error="the runner's check of a timed output recorded nothing")
                    del fn, out
                except BaseException as e:  # noqa: BLE001
                    if isinstance(e, KeyboardInterrupt):
                        raise
                    res["checks"] = rec.checks
                    if label != "candidate":
                        return fail("infra_error", f"the {label} arm failed on {w['name']}: {type(e).__name__}: {e}")
                    return fail("runtime_error", f"workload {w['name']}: {type(e).__name__}: {e}\n"
                                                 f"{traceback.format_exc()}")
                if r >= warm:
                    times[label][w["name"]].append(us)
            if any(not c["passed"] for c in rec.checks if str(c["name"]).startswith("timed[")):
                res["checks"] = rec.checks
                return None  # the caller types the failure
        stage_write()
    weights = {w["name"]: float(w["weight"]) for w in wls}
    for w in wls:
        xs = times["candidate"][w["name"]]
        res["latencies_us"][w["name"]] = _stat(xs, stat)
        res["timing"][w["name"]] = {"method": f"fresh_inputs_{'cuda_event' if device == 'cuda' else 'perf_counter'}"
                                              f"_{stat}", "us": _stat(xs, stat), "all_us": xs,
                                    **{f"{a}_all_us": times[a][w["name"]] for a, _ in arms if a != "candidate"}}
    ab: dict[str, Any] = {"rounds": rounds, "warmup": warm, "arms": [a for a, _ in arms], "seed": seed}

    def T(arm, r):
        return sum(weights[n] * times[arm][n][r] for n in weights)

    if incumbent:
        ab["objective_ratios"] = [T("candidate", r) / T("incumbent", r) for r in range(rounds)]
    root_arm = "root" if any(a == "root" for a, _ in arms) else ("incumbent" if root and root == incumbent else None)
    if root_arm:
        ab["root_arm"] = root_arm
        ab["root_ratio"] = {n: float(statistics.median(c / b for c, b in zip(times["candidate"][n], times[root_arm][n])))
                            for n in weights}
    res["timing"]["ab"] = ab
    res["timing"]["inputs"] = "fresh per timed call (same draw for every arm), outputs checked"
    res["checks"] = rec.checks
    return None


def run(impl_path: str, spec_path: str, out_path: str, *, incumbent: str | None = None, root: str | None = None,
        seed: int = 0, sandbox: dict[str, Any] | None = None) -> dict[str, Any]:
    res: dict[str, Any] = {
        "status": None, "stage": "start", "latencies_us": {}, "checks": [], "compile": {}, "dispatch": {},
        "timing": {}, "error": None, "hashes": {}, "env": {}, "progress": {}, "pid": os.getpid(),
        "sandbox": dict(sandbox or {}),
    }

    def stage(name: str) -> None:
        res["stage"] = name
        res["progress"] = {"stage": name, "t": time.time()}
        _write(out_path, res)

    def fail(status: str, msg: str) -> dict[str, Any]:
        res["status"] = status
        res["error"] = msg[-4000:]
        _write(out_path, res)
        return res

    _write(out_path, res)
    from areal_tik_plugin.search import spec as S
    from areal_tik_plugin.search.evaluator import evaluator_hash

    with open(spec_path) as f:
        spec = json.load(f)
    res["hashes"]["spec"] = S.criteria_hash(spec)
    res["hashes"]["baseline"] = S.baseline_hash(spec)
    device = spec["target"]["device"]
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        return fail("infra_error", "the spec targets CUDA but no CUDA device is visible")
    if device == "cpu":
        torch.set_num_threads(int(spec["evaluation"].get("cpu_threads", 1)))
    res["env"] = environment(device)
    try:
        res["hashes"]["evaluator"] = evaluator_hash(spec)
        from areal_tik_plugin.contract.suite import Recorder
        from areal_tik_plugin.search.runners import Context, load_runner

        runner = load_runner(spec["runner"])
    except Exception as e:
        return fail("infra_error", f"evaluator setup failed: {type(e).__name__}: {e}\n{traceback.format_exc()}")
    mf = spec["evaluation"].get("measure_failed", False)

    sentinels = _sentinels()

    # ---- compile ---------------------------------------------------------------------------------
    stage("compile")
    from areal_tik_plugin.runtime import loader

    try:
        impl = loader.load_implementation(impl_path)
    except loader.ImplementationError as e:
        kind = "infra_error" if "does not match" in str(e) else "compile_error"
        return fail(kind, f"{type(e).__name__}: {e}")
    res["hashes"]["candidate_loaded"] = impl.source_hash
    rec = Recorder(spec["name"])
    ctx = Context(impl, spec, device, rec)
    try:
        info = runner.compile(ctx) or {}
        _sync(device)
    except BaseException as e:  # noqa: BLE001 - a candidate may raise anything, SystemExit included
        if isinstance(e, KeyboardInterrupt):
            raise
        return fail("compile_error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}")
    if device == "cuda":
        try:  # evidence only: never fails a candidate
            info["kernels"] = compile_evidence(impl)
        except Exception as e:  # pragma: no cover
            info["kernels_error"] = f"{type(e).__name__}: {e}"[:300]
    res["compile"] = info
    failed_status = None
    tampered = _tampered(sentinels)
    if tampered:
        rec.check("evaluator_integrity", False, kind="dispatch", replaced=tampered)
        res["checks"] = rec.checks
        return fail("contract_violation", f"the candidate replaced evaluator objects at import: {tampered}")

    def run_items(items, label: str, noun: str, call):
        """Run each bitwise suite / accuracy case: a raise ends the evaluation as runtime_error; an item
        that records no check fails as one. Returns the fail() result or None."""
        for item in items:
            n_before = len(rec.checks)
            try:
                call(ctx, item)
                _sync(device)
            except BaseException as e:  # noqa: BLE001
                if isinstance(e, KeyboardInterrupt):
                    raise
                rec.check(f"{label}:{item['suite']}", False, kind="error", error=f"{type(e).__name__}: {e}"[:800],
                          trace=traceback.format_exc()[-2000:])
                res["checks"] = rec.checks
                return fail("runtime_error", f"{label} {noun} {item['suite']}: {type(e).__name__}: {e}\n"
                                             f"{traceback.format_exc()}")
            if len(rec.checks) == n_before:
                rec.check(f"{label}:{item['suite']}", False, kind="error", error=f"the {noun} recorded no check")
            res["checks"] = rec.checks
            _write(out_path, res)
        return None

    # ---- bitwise contract ------------------------------------------------------------------------
    stage("bitwise")
    failed = run_items(spec.get("bitwise", []), "bitwise", "suite", runner.bitwise_suite)
    if failed is not None:
        return failed
    bad = [c["name"] for c in rec.checks if not c["passed"]]
    if bad:
        failed_status = "contract_violation"
        if not mf:
            return fail("contract_violation", f"bitwise checks failed: {bad[:20]}")

    # ---- accuracy --------------------------------------------------------------------------------
    stage("accuracy")
    failed = run_items(spec.get("accuracy", []), "accuracy", "case", runner.accuracy_case)
    if failed is not None:
        return failed
    bad = [c["name"] for c in rec.checks if not c["passed"] and c.get("kind") == "accuracy"]
    if bad and failed_status is None:
        failed_status = "inaccurate"
        if not mf:
            return fail("inaccurate", f"accuracy checks failed: {bad[:20]}")

    # ---- latency on every workload ---------------------------------------------------------------
    stage("latency")
    wls = spec["workloads"]
    if hasattr(runner, "workload_case"):
        failed = _measure_ab(res, spec, runner, ctx, rec, device, stage_write=lambda: _write(out_path, res),
                             incumbent=incumbent, root=root, seed=seed, fail=fail)
        if failed is not None:
            return failed
    else:
        failed = _measure_fixed(res, spec, runner, ctx, rec, device, lambda: _write(out_path, res), fail)
        if failed is not None:
            return failed
    bad = [c for c in rec.checks if not c["passed"] and str(c["name"]).startswith("timed[")]
    if bad and failed_status is None:
        failed_status = "contract_violation" if any(c.get("kind") == "bitwise" for c in bad) else "inaccurate"
        res["checks"] = rec.checks
        if not mf:
            return fail(failed_status, f"outputs of the timed calls are wrong: {[c['name'] for c in bad][:10]}")
    tampered = _tampered(sentinels)
    if tampered:
        rec.check("evaluator_integrity", False, kind="dispatch", replaced=tampered)
        res["checks"] = rec.checks
        return fail("contract_violation", f"the candidate replaced evaluator objects: {tampered}")
    if device == "cpu":
        rec.check("own_code", True, kind="dispatch", calls=dict(ctx.calls))
    res["dispatch"]["entry_calls"] = dict(ctx.calls)

    # ---- observed dispatch (GPU profiler), after timing so profiling cannot perturb the latencies ---
    dispatch_mode = spec["evaluation"].get("dispatch", "all")
    if device == "cuda" and dispatch_mode != "off":
        stage("dispatch")
        first, last = {}, {}
        for i, w in enumerate(wls):
            first.setdefault(w["entry"], i)
            last[w["entry"]] = i
        chosen = [w for i, w in enumerate(wls)
                  if dispatch_mode == "all" or i in (first[w["entry"]], last[w["entry"]])]
        for w in chosen:
            try:
                # a fresh draw (not the timed ones): a memo or a shape-only shortcut launches no own kernel
                fn = runner.workload_case(ctx, w, 10_007)[0] if hasattr(runner, "workload_case") \
                    else runner.workload(ctx, w)
                fn()
                _sync(device)
                try:
                    d = runner.dispatch(ctx, fn, w) if hasattr(runner, "dispatch") else profile_dispatch(ctx, fn)
                except Exception as e:  # the profiler itself failed: the call-count check still holds
                    d = {"kernels": [], "own": ["?"], "foreign": [], "error": f"{type(e).__name__}: {e}"[:300]}
                del fn
            except BaseException as e:  # noqa: BLE001
                if isinstance(e, KeyboardInterrupt):
                    raise
                res["checks"] = rec.checks
                return fail("runtime_error", f"dispatch of {w['name']}: {type(e).__name__}: {e}")
            res["dispatch"][w["name"]] = d
            ok = bool(d["own"]) and not d["foreign"]
            rec.check(f"own_kernels[{w['name']}]", ok, kind="dispatch", kernels=d["kernels"][:20],
                      **({"skipped": d["error"]} if d.get("error") else {}))
            if not ok:
                res["checks"] = rec.checks
                return fail("contract_violation", f"workload {w['name']}: kernels {d['kernels'][:10]} "
                                                  f"(own {d['own']}, foreign {d['foreign']})")
    res["checks"] = rec.checks
    stage("done")
    if failed_status:
        return fail(failed_status, "correctness checks failed (latency measured for evidence only)")
    res["status"] = "ok"
    _write(out_path, res)
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m areal_tik_plugin.search.worker")
    ap.add_argument("--impl", required=True)
    ap.add_argument("--spec", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--incumbent", default=None, help="implementation folder timed A/B against the candidate")
    ap.add_argument("--root", default=None, help="root implementation folder (per-workload limits)")
    ap.add_argument("--seed", type=int, default=0, help="input draw of the timed calls (re-audits use others)")
    ap.add_argument("--unshare-net", action="store_true", help="enter a new network namespace first")
    args = ap.parse_args(argv)
    sandbox = {}
    if args.unshare_net:
        from areal_tik_plugin.search.sandbox import unshare_network

        sandbox = unshare_network()
    run(args.impl, args.spec, args.out, incumbent=args.incumbent, root=args.root, seed=args.seed, sandbox=sandbox)
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
