"""GPU evidence: JSON written only by ``python -m areal_tik_plugin.gpu`` on a GPU, committed under
``evidence/<implementation>/``, bound to the implementation's source hash and the environment.

``tik evidence --json`` summarizes it per op; ``tests/test_evidence.py`` fails when the selected
implementation has no passing evidence for its current hash.

Bits are only ever compared within one environment, so evidence covers one (kernels x Triton x torch x
GPU) combination: :func:`env_key`. The committed evidence was produced on H200s with the Triton / torch
recorded in each file; a user's own combination is covered by ``tik qualify`` (contract suite + ``tik
verify`` on their GPU), which writes a qualification record (:func:`qualification_record`) to the user
evidence dir (:func:`user_evidence_dir`). :func:`find_qualification` looks in both places; the loader
(at the first kernel load on a GPU) and the AReaL plan report when nothing covers the running
environment.
"""

from __future__ import annotations

import glob
import json
import os
from typing import Any

SCHEMA = "areal-tik-evidence/1"
QUALIFY_SCHEMA = "areal-tik-qualify/1"
# the environment fields evidence is bound to (beyond the kernels' name and source hash)
ENV_KEY_FIELDS = ("triton", "torch", "gpu", "sm")


def repo_evidence_dir() -> str:
    env = os.environ.get("TIK_EVIDENCE_DIR")
    if env:
        return env
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return os.path.join(here, "evidence")


def user_evidence_dir() -> str:
    """Where ``tik qualify`` writes by default: ``$TIK_USER_EVIDENCE_DIR`` or
    ``$XDG_CACHE_HOME/areal_tik_plugin/evidence`` (``~/.cache/...``)."""
    env = os.environ.get("TIK_USER_EVIDENCE_DIR")
    if env:
        return env
    return os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "areal_tik_plugin",
                        "evidence")


def environment() -> dict[str, Any]:
    import platform

    import torch

    env = {"python": platform.python_version(), "torch": torch.__version__}
    try:
        import triton

        env["triton"] = triton.__version__
    except Exception:  # pragma: no cover
        env["triton"] = None
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        env.update(gpu=p.name, sm=f"{p.major}{p.minor}", sms=p.multi_processor_count, cuda=torch.version.cuda)
        try:
            import subprocess

            env["driver"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=20,
            ).stdout.strip()
        except Exception:
            env["driver"] = None
    return env


def load_all(impl_name: str | None = None, root: str | None = None) -> list[dict[str, Any]]:
    root = root or repo_evidence_dir()
    pattern = os.path.join(root, impl_name or "*", "*.json")
    out = []
    for p in sorted(glob.glob(pattern)):
        with open(p) as f:
            try:
                rec = json.load(f)
            except json.JSONDecodeError:
                continue
        if rec.get("schema") != SCHEMA:
            continue
        rec["_path"] = p
        out.append(rec)
    return out


def summary(impl=None, root: str | None = None) -> dict[str, Any]:
    """Per-op summary for the implementation (default: the selected one)."""
    from areal_tik_plugin import loader

    if impl is None:
        impl = loader.load_implementation(loader.resolve_path(loader.selected_name("sm_90")))
    recs = [r for r in load_all(impl.name, root) if r.get("source_hash") == impl.source_hash]
    ops_declared = sorted({e.split(".")[0] for e in impl.manifest["entry_points"]})
    per_op: dict[str, Any] = {}
    for op in ops_declared:
        passed = failed = 0
        bench: dict[str, Any] = {}
        files = []
        for r in recs:
            op_rec = r.get("ops", {}).get(op)
            if not op_rec:
                continue
            files.append(os.path.relpath(r["_path"], os.path.dirname(root or repo_evidence_dir())))
            for c in op_rec.get("checks", []):
                if c.get("passed"):
                    passed += 1
                else:
                    failed += 1
            for bname, b in op_rec.get("bench_summary", {}).items():
                bench[bname] = b
        per_op[op] = {
            "implementation": impl.name,
            "source_hash": impl.source_hash,
            "evidence_matches_hash": bool(files),
            "checks_passed": passed,
            "checks_failed": failed,
            "ok": bool(files) and passed > 0 and failed == 0,
            "benchmarks": bench,
            "files": files,
        }
    return {
        "implementation": impl.name,
        "source_hash": impl.source_hash,
        "models": model_summary(impl, root),
        "integrations": integration_summary(impl, root),
        "evidence_files": [os.path.basename(r["_path"]) for r in recs],
        "environments": sorted({json.dumps(r.get("env", {}).get("gpu")) for r in recs}),
        "ops": per_op,
        "all_ok": all(v["ok"] for v in per_op.values()),
    }


def model_summary(impl, root: str | None = None) -> list[dict[str, Any]]:
    """Whole-model Constraint (1) results (`tik verify --out` JSON under evidence/verify/) for impl."""
    root = root or repo_evidence_dir()
    out = []
    for p in sorted(glob.glob(os.path.join(root, "verify", "*.json"))):
        try:
            with open(p) as f:
                rec = json.load(f)
        except (OSError, json.JSONDecodeError):
            continue
        if rec.get("schema") != "areal-tik-verify/1":
            continue
        ih = rec.get("implementation", {})
        checks = rec.get("checks", [])
        out.append({
            "model": rec.get("model"),
            "layers": rec.get("config", {}).get("num_hidden_layers"),
            "device": rec.get("device"),
            "gpu": rec.get("env", {}).get("gpu"),
            "batch": rec.get("batch"),
            "prompt_len": max(rec.get("prompt_lens") or [0]),
            "response_len": max(rec.get("response_lens") or [0]),
            "response_len_min": min(rec.get("response_lens") or [0]),
            "matches_hash": ih.get("name") == impl.name and ih.get("source_hash") == impl.source_hash,
            "plugin_bit_identical": bool(rec.get("plugin_bit_identical")),
            "n_checks": len(checks),
            "file": os.path.relpath(p, os.path.dirname(root)),
        })
    return out


def _load_json(path: str) -> dict | None:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError):
        return None


def integration_summary(impl, root: str | None = None) -> dict[str, list[dict[str, Any]]]:
    """GPU results beyond the op suites, each as its producing command wrote it:

    * ``layer_bench``: ``python -m areal_tik_plugin.gpu.layer_bench`` JSON under ``evidence/layer_bench/``
      (per-layer prefill + decode + update phase times, plugin vs stock-with-recompute);
    * ``sglang_gpu``: ``python -m areal_tik_plugin.integrations.sglang_gpu_proof`` JSON under
      ``evidence/sglang/`` (a real SGLang Engine with ``attention_backend="tik"`` vs the training path);
    * ``areal_recompute``: ``recipes/bench_recompute.py`` JSON under ``evidence/areal/`` (AReaL's FSDP
      PPO actor: train-step time with and without the recompute forward);
    * ``areal_gsm8k``: ``gsm8k-summary.json`` of ``bash scripts/gpu_integrations.sh gsm8k`` under
      ``evidence/areal/*/`` (the GSM8K recipe, tik vs baseline: tokens/s, phases, mismatch monitor);
    * ``areal_bits``: ``bench_recompute.py --check-bits`` JSON under ``evidence/areal/*/`` (AReaL's FSDP
      actor vs the plain plugin-patched HF forward, bit for bit).
    """
    root = root or repo_evidence_dir()
    rel = lambda p: os.path.relpath(p, os.path.dirname(root))  # noqa: E731
    out: dict[str, list[dict[str, Any]]] = {"layer_bench": [], "sglang_gpu": [], "areal_recompute": [],
                                            "areal_gsm8k": [], "areal_bits": []}
    for p in sorted(glob.glob(os.path.join(root, "layer_bench", "*.json"))):
        rec = _load_json(p)
        if not rec or rec.get("schema") != "areal-tik-layer-bench/1":
            continue
        summ = rec.get("summary") or {}
        out["layer_bench"].append({
            "file": rel(p), "gpu": rec.get("env", {}).get("gpu"), "quick": rec.get("quick"),
            "matches_hash": rec.get("implementation") == impl.name and rec.get("source_hash") == impl.source_hash,
            "mean_ratio": summ.get("mean_ratio"), "geomean_ratio": summ.get("geomean_ratio"),
            "min_ratio": summ.get("min_ratio"), "per_model_geomean": summ.get("per_model_geomean"), "n": summ.get("n"),
        })
    for p in sorted(glob.glob(os.path.join(root, "sglang", "*.json"))):
        rec = _load_json(p)
        if not rec or "bitwise_mismatching_requests" not in rec:
            continue
        ih = rec.get("implementation") or {}
        out["sglang_gpu"].append({
            "file": rel(p), "device": rec.get("device"), "gpu": rec.get("env", {}).get("gpu"),
            "model": os.path.basename(str(rec.get("model"))), "batch": rec.get("batch"),
            "new_tokens": rec.get("new_tokens"), "requests": rec.get("requests"),
            "bit_identical": not rec["bitwise_mismatching_requests"] and bool(rec.get("requests")),
            "ops_through_ours": bool((rec.get("ops") or {}).get("ok")),
            "matches_hash": (ih.get("name") == impl.name and ih.get("source_hash") == impl.source_hash) if ih else None,
            "cuda_graphs": not (rec.get("engine_args") or {}).get("disable_cuda_graph", True) if "engine_args" in rec else None,
            "backends": {k: ({"error": True} if "error" in v else {"greedy_tokens_per_s": v.get("greedy_tokens_per_s")})
                         for k, v in (rec.get("backends") or {}).items()},
        })
    for p in sorted(glob.glob(os.path.join(root, "areal", "*.json"))):
        rec = _load_json(p)
        if not rec or "mean" not in rec or "args" not in rec:
            continue
        m = rec["mean"]
        out["areal_recompute"].append({
            "file": rel(p), "gpu": rec.get("device"), "tik": bool(rec["args"].get("tik")),
            "batch": rec["args"].get("batch"), "tokens_per_step": m.get("tokens"),
            "step_with_recompute_s": m.get("step_with_recompute_s"),
            "step_without_recompute_s": m.get("step_without_recompute_s"),
            "recompute_fraction": m.get("saving_fraction"),
        })
    for p in sorted(glob.glob(os.path.join(root, "areal", "*", "gsm8k-summary.json"))):
        rec = _load_json(p)
        if not rec or "tik" not in rec or "baseline" not in rec:
            continue
        row = {"file": rel(p)}
        for mode in ("tik", "baseline"):
            r = rec[mode]
            row[mode] = {"tokens_per_s": r.get("tokens_per_s"), "step_s": r.get("step_s"),
                         "measured_steps": r.get("measured_steps"), "fallback_active": r.get("fallback_active"),
                         "monitor": r.get("monitor")}
        out["areal_gsm8k"].append(row)
    for p in sorted(glob.glob(os.path.join(root, "areal", "*", "bits-areal.json"))):
        rec = _load_json(p)
        cb = (rec or {}).get("check_bits")
        if not cb:
            continue
        out["areal_bits"].append({"file": rel(p), "gpu": rec.get("device"), "model": rec["args"].get("model_dir"),
                                  "sequences": cb.get("sequences"), "tokens": cb.get("tokens"),
                                  "mismatched_tokens": cb["shifted"]["mismatched_tokens"],
                                  "max_abs_diff": cb["shifted"]["max_abs_diff"]})
    return out


# ------------------------------------------------------------------------------------------------
# evidence per environment: the contract record, the qualification record, the lookup
# ------------------------------------------------------------------------------------------------
def env_key(env: dict[str, Any]) -> dict[str, Any]:
    """The part of an environment evidence is bound to: Triton, torch (with its CUDA tag), GPU name, sm."""
    return {k: env.get(k) for k in ENV_KEY_FIELDS}


def describe_env(impl_name: str, source_hash: str, env: dict[str, Any]) -> str:
    k = env_key(env)
    return (f"kernels {impl_name} {source_hash[:12]} x triton {k['triton']} x torch {k['torch']} x "
            f"{k['gpu'] or 'no GPU'}" + (f" (sm_{k['sm']})" if k.get("sm") else ""))


def contract_record(impl, env: dict[str, Any], argv: list[str]) -> dict[str, Any]:
    """The header of a contract-suite evidence file (``python -m areal_tik_plugin.gpu``); the suite fills
    ``ops[op]`` with each op's :class:`~areal_tik_plugin.gpu.suite.Recorder` JSON."""
    import time

    return {"schema": SCHEMA, "implementation": impl.name, "source_hash": impl.source_hash, "env": env,
            "argv": list(argv), "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "ops": {}}


def _contract_counts(records: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    per_op: dict[str, dict[str, int]] = {}
    for r in records:
        for op, o in (r.get("ops") or {}).items():
            c = per_op.setdefault(op, {"passed": 0, "failed": 0})
            for chk in o.get("checks", []):
                c["passed" if chk.get("passed") else "failed"] += 1
    return per_op


def qualification_record(impl, env: dict[str, Any], contract: list[dict[str, Any]], verify: list[dict[str, Any]],
                         argv: list[str] | None = None, files: dict[str, Any] | None = None) -> dict[str, Any]:
    """What ``tik qualify`` writes: the contract suite's records and ``tik verify`` reports of one run,
    reduced to per-op and per-model verdicts, bound to ``impl`` and ``env``. ``ok`` only when every op the
    implementation declares has passing checks and none failed, every verify report is bit-identical,
    and every input was produced for the same kernels and environment."""
    import time

    declared = sorted({e.split(".")[0] for e in impl.manifest["entry_points"]})
    per_op = _contract_counts(contract)
    problems = []
    for r in contract:
        if r.get("schema") != SCHEMA:
            problems.append(f"contract record with schema {r.get('schema')!r}, expected {SCHEMA!r}")
        elif (r.get("implementation"), r.get("source_hash")) != (impl.name, impl.source_hash):
            problems.append(f"contract record for {r.get('implementation')} {str(r.get('source_hash'))[:12]}")
        elif env_key(r.get("env") or {}) != env_key(env):
            problems.append(f"contract record from another environment: {env_key(r.get('env') or {})}")
    for v in verify:
        ih = v.get("implementation") or {}
        if (ih.get("name"), ih.get("source_hash")) != (impl.name, impl.source_hash):
            problems.append(f"verify report of {v.get('model')} for other kernels {ih}")
        elif env_key(v.get("env") or {}) != env_key(env):
            problems.append(f"verify report of {v.get('model')} from another environment")
    missing = [op for op in declared if per_op.get(op, {}).get("passed", 0) == 0]
    failed = {op: c["failed"] for op, c in per_op.items() if c["failed"]}
    models = [{"model": v.get("model"), "bit_identical": bool(v.get("plugin_bit_identical")),
               "checks": len(v.get("checks", []))} for v in verify]
    ok = not problems and not missing and not failed and bool(models) and all(m["bit_identical"] for m in models)
    return {"schema": QUALIFY_SCHEMA, "implementation": impl.name, "source_hash": impl.source_hash,
            "env": env, "env_key": env_key(env), "argv": list(argv or []),
            "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "contract": per_op, "ops_missing": missing, "ops_failed": failed, "models": models,
            "problems": problems, "files": files or {}, "ok": ok}


def write_qualification(out_dir: str, record: dict[str, Any]) -> str:
    """Write ``record`` (from :func:`qualification_record`) under ``out_dir``; returns the path."""
    if record.get("schema") != QUALIFY_SCHEMA:
        raise ValueError(f"expected a {QUALIFY_SCHEMA} record from qualification_record(), got "
                         f"schema {record.get('schema')!r}")
    k = record["env_key"]
    tag = "-".join(str(k.get(f) or "none").replace(" ", "_").replace("/", "_") for f in ENV_KEY_FIELDS)
    d = os.path.join(out_dir, "qualify")
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, f"{record['implementation']}-{record['source_hash'][:12]}-{tag}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(record, f, indent=1)
    os.replace(path + ".tmp", path)
    return path


def evidence_roots() -> list[str]:
    """Where evidence is looked up: the user evidence dir (``tik qualify``) and the committed evidence."""
    extra = [p for p in os.environ.get("TIK_EVIDENCE_PATH", "").split(os.pathsep) if p]
    out = []
    for p in [user_evidence_dir(), *extra, repo_evidence_dir()]:
        if p not in out:
            out.append(p)
    return out


def find_qualification(impl, env: dict[str, Any] | None = None, roots: list[str] | None = None) -> dict[str, Any]:
    """Evidence covering ``impl`` x ``env`` (default: this process's environment).

    Accepted: a passing ``tik qualify`` record for the same kernels and :func:`env_key`, or committed
    contract-suite records for the same kernels and environment that together cover every declared op
    with no failed check. Returns ``{"covered", "source", "message", "other_envs"}``."""
    env = environment() if env is None else env
    roots = evidence_roots() if roots is None else roots
    key = env_key(env)
    want = describe_env(impl.name, impl.source_hash, env)
    others: list[dict[str, Any]] = []
    for root in roots:
        for p in sorted(glob.glob(os.path.join(root, "qualify", "*.json"))):
            rec = _load_json(p)
            if not rec or rec.get("schema") != QUALIFY_SCHEMA:
                continue
            if (rec.get("implementation"), rec.get("source_hash")) != (impl.name, impl.source_hash):
                continue
            if rec.get("env_key") != key:
                others.append(rec.get("env_key"))
                continue
            if rec.get("ok"):
                return {"covered": True, "source": p, "other_envs": others,
                        "message": f"evidence for {want}: tik qualify record {p}"}
    declared = sorted({e.split(".")[0] for e in impl.manifest["entry_points"]})
    for root in roots:
        recs = [r for r in load_all(impl.name, root) if r.get("source_hash") == impl.source_hash]
        same = [r for r in recs if env_key(r.get("env") or {}) == key]
        others += [env_key(r.get("env") or {}) for r in recs if env_key(r.get("env") or {}) != key]
        counts = _contract_counts(same)
        if same and all(counts.get(op, {}).get("passed", 0) > 0 for op in declared) \
                and not any(c["failed"] for c in counts.values()):
            return {"covered": True, "source": os.path.dirname(same[0]["_path"]), "other_envs": others,
                    "message": f"evidence for {want}: contract suite records in {os.path.dirname(same[0]['_path'])}"}
    uniq = []
    for o in others:
        if o not in uniq:
            uniq.append(o)
    seen = "; ".join(f"triton {o['triton']} x torch {o['torch']} x {o['gpu']}" for o in uniq[:4]) or "none"
    return {"covered": False, "source": None, "other_envs": uniq,
            "message": (f"no GPU evidence for {want} (evidence for these kernels exists for: {seen}); bits are "
                        f"only established per environment: run `tik qualify` on this machine (writes to "
                        f"{user_evidence_dir()})")}
