"""The evaluation specification S (paper §4.1): YAML per GPU, frozen into each run directory.

A spec fixes the target hardware, the workloads (entry point, shape, weight c_w), the allowed
slowdown of every workload relative to the root, the bitwise suites, the accuracy cases and their
tolerances, the evaluator settings, and the search limits (kappa_max, step and time budgets).

The root's latency per workload is not written by hand: ``root_latency_us`` is null in the shipped
YAML and is filled by measuring the root during initialization of a run (``baseline`` section of the
run's frozen ``spec.json``, with the root audit id and environment). Hashes: :func:`criteria_hash`
covers everything except the baseline; :func:`baseline_hash` covers the baseline. Both are bound to
every audit.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
from typing import Any

# full_sequence: rollout prefill / extend and the training forward; decode: one token per request over the
# KV cache; train_fwd_bwd: the training step, forward with log-sum-exp then backward (dq, dk, dv)
ENTRY_KINDS = ("full_sequence", "decode", "train_fwd_bwd")


class SpecError(ValueError):
    """The evaluation specification is malformed."""


def _req(d: dict, key: str, where: str, types) -> Any:
    if key not in d:
        raise SpecError(f"{where}: missing key {key!r}")
    v = d[key]
    if not isinstance(v, types):
        raise SpecError(f"{where}.{key}: expected {types}, got {v!r}")
    return v


def resolve(path_or_name: str) -> str:
    """A spec path, or the name of a shipped spec (``h200_attention``)."""
    if os.path.isfile(path_or_name):
        return os.path.abspath(path_or_name)
    from areal_tik_plugin.search import SPECS_DIR

    for cand in (os.path.join(SPECS_DIR, path_or_name), os.path.join(SPECS_DIR, path_or_name + ".yaml")):
        if os.path.isfile(cand):
            return cand
    raise SpecError(f"spec {path_or_name!r} not found (a YAML path, or one of {shipped()})")


def shipped() -> list[str]:
    from areal_tik_plugin.search import SPECS_DIR

    return sorted(f[:-5] for f in os.listdir(SPECS_DIR) if f.endswith(".yaml"))


def load(path: str) -> dict[str, Any]:
    """Read and validate a spec YAML (or a frozen spec JSON)."""
    path = resolve(path)
    with open(path) as f:
        if path.endswith(".json"):
            spec = json.load(f)
        else:
            import yaml

            spec = yaml.safe_load(f)
    validate(spec, where=os.path.basename(path))
    return spec


def validate(spec: Any, where: str = "spec") -> None:
    if not isinstance(spec, dict):
        raise SpecError(f"{where}: expected a mapping")
    _req(spec, "name", where, str)
    target = _req(spec, "target", where, dict)
    dev = _req(target, "device", f"{where}.target", str)
    if dev not in ("cuda", "cpu"):
        raise SpecError(f"{where}.target.device: expected 'cuda' or 'cpu', got {dev!r}")
    _req(spec, "runner", where, str)
    entries = _req(spec, "entry_points", where, dict)
    for ep, kind in entries.items():
        if kind not in ENTRY_KINDS:
            raise SpecError(f"{where}.entry_points.{ep}: expected one of {ENTRY_KINDS}, got {kind!r}")
    wls = _req(spec, "workloads", where, list)
    if not wls:
        raise SpecError(f"{where}.workloads: expected at least one workload")
    names = set()
    default_slow = float(spec.get("max_slowdown", 1.05))
    if default_slow < 1.0:
        raise SpecError(f"{where}.max_slowdown: expected >= 1.0, got {default_slow}")
    for i, w in enumerate(wls):
        wh = f"{where}.workloads[{i}]"
        if not isinstance(w, dict):
            raise SpecError(f"{wh}: expected a mapping")
        n = _req(w, "name", wh, str)
        if n in names:
            raise SpecError(f"{wh}: duplicate workload name {n!r}")
        names.add(n)
        ep = _req(w, "entry", wh, str)
        if ep not in entries:
            raise SpecError(f"{wh}.entry: {ep!r} is not in entry_points {list(entries)}")
        _req(w, "shape", wh, dict)
        wt = w.get("weight", 1.0)
        if isinstance(wt, bool) or not isinstance(wt, (int, float)) or wt < 0:
            raise SpecError(f"{wh}.weight: expected a number >= 0, got {wt!r}")
        ms = w.get("max_slowdown", default_slow)
        if isinstance(ms, bool) or not isinstance(ms, (int, float)) or ms < 1.0:
            raise SpecError(f"{wh}.max_slowdown: expected a number >= 1.0, got {ms!r}")
        rl = w.get("root_latency_us")
        if rl is not None and (isinstance(rl, bool) or not isinstance(rl, (int, float)) or rl <= 0):
            raise SpecError(f"{wh}.root_latency_us: expected null or a positive number, got {rl!r}")
    for key in ("bitwise", "accuracy"):
        items = spec.get(key, [])
        if not isinstance(items, list):
            raise SpecError(f"{where}.{key}: expected a list")
        for i, it in enumerate(items):
            if not isinstance(it, dict) or not isinstance(it.get("suite"), str):
                raise SpecError(f"{where}.{key}[{i}]: expected a mapping with a 'suite' name")
    ev = spec.get("evaluation", {})
    if not isinstance(ev, dict):
        raise SpecError(f"{where}.evaluation: expected a mapping")
    to = ev.get("timeout_s", 600)
    if isinstance(to, bool) or not isinstance(to, (int, float)) or to <= 0:
        raise SpecError(f"{where}.evaluation.timeout_s: expected a positive number, got {to!r}")
    s = spec.get("search", {})
    if not isinstance(s, dict):
        raise SpecError(f"{where}.search: expected a mapping")
    km = s.get("kappa_max", 20)
    if isinstance(km, bool) or not isinstance(km, int) or km < 1:
        raise SpecError(f"{where}.search.kappa_max: expected an integer >= 1, got {km!r}")
    for k in ("max_steps", "time_budget_s"):
        v = s.get(k)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0):
            raise SpecError(f"{where}.search.{k}: expected null or a positive number, got {v!r}")
    base = spec.get("baseline")
    if base is not None:
        if not isinstance(base, dict) or not isinstance(base.get("latencies_us"), dict):
            raise SpecError(f"{where}.baseline: expected a mapping with latencies_us")
        missing = names - set(base["latencies_us"])
        if missing:
            raise SpecError(f"{where}.baseline.latencies_us: missing workloads {sorted(missing)}")


def check_runner(spec: dict[str, Any]) -> None:
    """The spec's runner checks what only it knows (entry points it can call, shape keys, suite names)
    through its optional ``check_spec(spec)``; a ``ValueError`` there becomes a :class:`SpecError`, so a
    spec the runner cannot run is refused before a run directory or a worker exists."""
    from areal_tik_plugin.search.runners import load_runner

    try:
        runner = load_runner(spec["runner"])
    except ImportError as e:
        raise SpecError(f"runner: expected an importable runner module, got {spec['runner']!r} ({e})") from e
    fn = getattr(runner, "check_spec", None)
    if fn is None:
        return
    try:
        fn(spec)
    except ValueError as e:
        raise SpecError(f"spec {spec.get('name')!r} (runner {spec['runner']}): {e}") from e


def freeze(spec: dict[str, Any], *, quick: bool = False) -> dict[str, Any]:
    """The run's copy of S: defaults filled in, ``--quick`` applied (drops workloads with quick: false)."""
    s = copy.deepcopy(spec)
    default_slow = float(s.get("max_slowdown", 1.05))
    wls = []
    for w in s["workloads"]:
        if quick and w.get("quick", True) is False:
            continue
        w = dict(w)
        w["weight"] = float(w.get("weight", 1.0))
        w["max_slowdown"] = float(w.get("max_slowdown", default_slow))
        w.setdefault("root_latency_us", None)
        w.pop("quick", None)
        wls.append(w)
    s["workloads"] = wls
    s["variant"] = "quick" if quick else "full"
    s.setdefault("bitwise", [])
    s.setdefault("accuracy", [])
    ev = s.setdefault("evaluation", {})
    ev.setdefault("timeout_s", 600)
    ev.setdefault("measure_failed", False)
    ev.setdefault("timing", {})
    quick_timing = ev.pop("quick_timing", None)
    if quick and isinstance(quick_timing, dict):
        ev["timing"].update(quick_timing)
    if quick:
        for key in ("bitwise", "accuracy"):
            s[key] = [it for it in s[key] if it.get("quick", True) is not False]
    se = s.setdefault("search", {})
    se.setdefault("kappa_max", 20)
    se.setdefault("max_steps", None)
    se.setdefault("time_budget_s", None)
    se.setdefault("improve_eps", 0.02)
    s.setdefault("knobs", {})
    s.pop("baseline", None)
    validate(s, where="frozen spec")
    return s


def _canon(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def criteria_hash(spec: dict[str, Any]) -> str:
    """sha256 of the spec without its baseline (the immutable criteria)."""
    s = {k: v for k, v in spec.items() if k != "baseline"}
    return hashlib.sha256(_canon(s)).hexdigest()


def baseline_hash(spec: dict[str, Any]) -> str:
    base = spec.get("baseline")
    return hashlib.sha256(_canon(base)).hexdigest() if base is not None else ""


def with_baseline(spec: dict[str, Any], latencies_us: dict[str, float], *, audit_id: str, env: dict,
                  measured_at: str) -> dict[str, Any]:
    s = copy.deepcopy(spec)
    names = [w["name"] for w in s["workloads"]]
    s["baseline"] = {
        "source": "measured: root implementation audited at initialization of this run",
        "root_audit": audit_id,
        "measured_at": measured_at,
        "env": env,
        "latencies_us": {n: float(latencies_us[n]) for n in names},
    }
    validate(s, where="spec with baseline")
    return s


def workloads(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return spec["workloads"]


def workload_names(spec: dict[str, Any]) -> list[str]:
    return [w["name"] for w in spec["workloads"]]


def root_latency(spec: dict[str, Any], name: str) -> float | None:
    base = spec.get("baseline")
    if base:
        return base["latencies_us"].get(name)
    for w in spec["workloads"]:
        if w["name"] == name:
            return w.get("root_latency_us")
    return None


def limit_us(spec: dict[str, Any], w: dict[str, Any]) -> float | None:
    root = root_latency(spec, w["name"])
    return None if root is None else root * float(w["max_slowdown"])


def objective(spec: dict[str, Any], latencies_us: dict[str, float]) -> float | None:
    """T(I) = sum_w c_w lat(I, w); None unless every workload has a finite positive latency."""
    total = 0.0
    for w in spec["workloads"]:
        v = latencies_us.get(w["name"])
        if v is None or not isinstance(v, (int, float)) or not (v > 0) or v == float("inf"):
            return None
        total += float(w["weight"]) * float(v)
    return total


def limit_violations(spec: dict[str, Any], latencies_us: dict[str, float]) -> list[str]:
    out = []
    for w in spec["workloads"]:
        lim = limit_us(spec, w)
        v = latencies_us.get(w["name"])
        if lim is not None and v is not None and v > lim:
            out.append(w["name"])
    return out


def entry_kind(spec: dict[str, Any], entry: str) -> str:
    return spec["entry_points"][entry]
