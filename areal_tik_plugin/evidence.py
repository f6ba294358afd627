"""GPU evidence: JSON written only by ``python -m areal_tik_plugin.contract`` on a GPU, committed under
``evidence/<implementation>/``, bound to the implementation's source hash and the environment.

``tik evidence --json`` summarizes it per op; ``tests/tools/test_evidence.py`` fails when the selected
implementation has no passing evidence for its current hash.
"""

from __future__ import annotations

import glob
import json
import os
from typing import Any

SCHEMA = "areal-tik-evidence/1"


def repo_evidence_dir() -> str:
    env = os.environ.get("TIK_EVIDENCE_DIR")
    if env:
        return env
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return os.path.join(here, "evidence")


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
    from areal_tik_plugin.contract.baselines import versions

    env["versions"] = versions()  # the baselines' stack (FlashInfer, Liger, AReaL, SGLang, cuDNN, ...)
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
    from areal_tik_plugin.runtime import loader

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

    * ``layer_bench``: ``python -m benchmarks.layer_bench`` JSON under ``evidence/layer_bench/``
      (per-layer prefill + decode + update phase times, plugin vs stock-with-recompute);
    * ``sglang_gpu``: ``python -m benchmarks.sglang_gpu_proof`` JSON under
      ``evidence/sglang/`` (a real SGLang Engine with ``attention_backend="tik"`` vs the training path);
    * ``areal_recompute``: ``recipes/bench_recompute.py`` JSON under ``evidence/areal/`` (AReaL's FSDP
      PPO actor: train-step time with and without the recompute forward);
    * ``areal_gsm8k``: ``gsm8k-summary.json`` of ``bash benchmarks/gpu_integrations.sh gsm8k`` under
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
