"""GPU evidence: JSON written only by ``python -m areal_tik_plugin.contract`` on a GPU, committed under
``evidence/<implementation>/``, bound to the implementation's source hash and the environment.

``tik evidence --json`` summarizes it per op; ``tik evidence --markdown`` renders the README's
"Measured" table from it (:func:`render_markdown`); ``tests/tools/test_evidence.py`` fails when the
selected implementation has no passing evidence for its current hash.

Benchmark rows (``Recorder.bench``) hold timing dicts ``{"cold_us": ..., "graph_us": ...}``: ``ours``
(decode rows of attention: ``paged``, the kernel SGLang serves) and one per baseline. A baseline names
itself exactly with ``"name"`` inside its dict (or ``"<key>_name"`` / ``"baseline_names": {key: name}``
in the row, or a ``"baselines": {key: {...}}`` dict); ``"context": true`` marks a baseline that is
context only (eager or stubbed code), never a headline. Unnamed row keys of the suite are named by
:data:`KNOWN_BASELINES`.

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
import math
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
    from areal_tik_plugin.contract.baselines import versions

    env["versions"] = versions()  # the baselines' stack (FlashInfer, Liger, AReaL, SGLang, cuDNN, ...)
    return env


def record_header(impl, argv: list[str], env: dict[str, Any] | None = None) -> dict[str, Any]:
    """The top of one evidence JSON: schema, implementation + source hash, environment, command."""
    import time

    return {
        "schema": SCHEMA,
        "implementation": impl.name,
        "source_hash": impl.source_hash,
        "env": environment() if env is None else env,
        "argv": list(argv),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "ops": {},
    }


def record_path(out_dir: str, impl, ops: list[str]) -> str:
    return os.path.join(out_dir, f"{impl.name}-{impl.source_hash[:12]}-{'-'.join(ops)[:60]}.json")


def write_record(path: str, record: dict[str, Any]) -> None:
    """Write atomically, so a run that dies later keeps the ops finished so far."""
    with open(path + ".tmp", "w") as f:
        json.dump(record, f, indent=1)
    os.replace(path + ".tmp", path)


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


def summary(impl, root: str | None = None) -> dict[str, Any]:
    """Per-op summary for the implementation ``impl`` (a loaded :class:`~areal_tik_plugin.runtime.loader.Implementation`)."""
    recs = [r for r in load_all(impl.name, root) if r.get("source_hash") == impl.source_hash]
    ops_declared = sorted({e.split(".")[0] for e in impl.manifest["entry_points"]})
    per_op: dict[str, Any] = {}
    # per op, the newest run that checked it decides (a re-run after a fix supersedes the failed one; a
    # benchmark-only run checks nothing and decides nothing); benchmarks likewise from the newest run that has them
    order = sorted(recs, key=lambda r: (r.get("started") or "", r["_path"]))
    for op in ops_declared:
        # an unfinished run (contract suite cut by its time limit: complete false) decides only by a failure
        checked = [r for r in order if r.get("ops", {}).get(op, {}).get("checks")
                   and (r["ops"][op].get("complete", True)
                        or not all(c.get("passed") for c in r["ops"][op]["checks"]))]
        benched = [r for r in order if r.get("ops", {}).get(op, {}).get("bench_summary")]
        files = [os.path.relpath(r["_path"], os.path.dirname(root or repo_evidence_dir()))
                 for r in order if op in r.get("ops", {})]
        checks = checked[-1]["ops"][op]["checks"] if checked else []
        passed = sum(1 for c in checks if c.get("passed"))
        failed = len(checks) - passed
        bench = dict(benched[-1]["ops"][op]["bench_summary"]) if benched else {}
        per_op[op] = {
            "implementation": impl.name,
            "source_hash": impl.source_hash,
            "evidence_matches_hash": bool(files),
            "checks_passed": passed,
            "checks_failed": failed,
            "ok": bool(checked) and passed > 0 and failed == 0,
            "checks_file": (os.path.relpath(checked[-1]["_path"], os.path.dirname(root or repo_evidence_dir()))
                            if checked else None),
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


def layer_bench_summary(models: list[dict]) -> dict[str, Any]:
    """The summary ``python -m benchmarks.layer_bench`` writes at its end, from its per-model records."""
    def geomean(v):
        v = [x for x in v if x and x > 0]
        return math.exp(sum(math.log(x) for x in v) / len(v)) if v else None

    ratios = [row["ratio"] for m in models for row in m.get("results") or [] if row.get("ratio")]
    return {"mean_ratio": (sum(ratios) / len(ratios)) if ratios else None, "geomean_ratio": geomean(ratios),
            "per_model_geomean": {m["model"]: geomean([row.get("ratio") for row in m.get("results") or []])
                                  for m in models},
            "n": len(ratios), "min_ratio": min(ratios) if ratios else None}


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
      actor vs the plain plugin-patched HF forward, bit for bit);
    * ``megatron_verify`` / ``megatron_bench``: ``tik verify --engine megatron`` and
      ``python -m benchmarks.megatron_bench`` JSON under ``evidence/megatron/`` (the plugin's layer spec on
      megatron-core: bits against the rollout side; forward + backward time against Megatron's local spec).
    """
    root = root or repo_evidence_dir()
    rel = lambda p: os.path.relpath(p, os.path.dirname(root))  # noqa: E731
    out: dict[str, list[dict[str, Any]]] = {"layer_bench": [], "sglang_gpu": [], "areal_recompute": [],
                                            "areal_gsm8k": [], "areal_bits": [], "megatron_verify": [],
                                            "megatron_bench": []}
    for p in sorted(glob.glob(os.path.join(root, "layer_bench", "*.json"))):
        rec = _load_json(p)
        if not rec or rec.get("schema") != "areal-tik-layer-bench/1":
            continue
        summ = rec.get("summary")
        if summ is None:  # a run cut before its summary: the bench rewrites its JSON after each model it finishes
            summ = layer_bench_summary([m for m in rec.get("models") or [] if isinstance(m, dict)])
            summ = summ if summ["n"] else {}
        out["layer_bench"].append({
            "file": rel(p), "gpu": rec.get("env", {}).get("gpu"), "quick": rec.get("quick"),
            "partial": "summary" not in rec,
            "matches_hash": rec.get("implementation") == impl.name and rec.get("source_hash") == impl.source_hash,
            "mean_ratio": summ.get("mean_ratio"), "geomean_ratio": summ.get("geomean_ratio"),
            "min_ratio": summ.get("min_ratio"), "per_model_geomean": summ.get("per_model_geomean"), "n": summ.get("n"),
            "baselines_skipped": sorted({k for m in rec.get("models") or [] if isinstance(m, dict)
                                         for k in ((m.get("notes") or {}).get("baseline_skipped") or {})}),
        })
    for p in sorted(glob.glob(os.path.join(root, "sglang", "*.json"))):
        rec = _load_json(p)
        if not rec or "bitwise_mismatching_requests" not in rec:
            continue
        ih = rec.get("implementation") or {}
        bk = rec.get("backends") or {}
        out["sglang_gpu"].append({
            "file": rel(p), "device": rec.get("device"), "gpu": rec.get("env", {}).get("gpu"),
            "model": os.path.basename(str(rec.get("model"))), "batch": rec.get("batch"),
            "new_tokens": rec.get("new_tokens"), "requests": rec.get("requests"),
            "bit_identical": not rec["bitwise_mismatching_requests"] and bool(rec.get("requests")),
            "ops_through_ours": bool((rec.get("ops") or {}).get("ok")),
            "matches_hash": (ih.get("name") == impl.name and ih.get("source_hash") == impl.source_hash) if ih else None,
            "cuda_graphs": not (rec.get("engine_args") or {}).get("disable_cuda_graph", True) if "engine_args" in rec else None,
            "backends": {k: ({"error": True} if "error" in v else
                             {"greedy_tokens_per_s": v.get("greedy_tokens_per_s"),
                              "repeat_tokens_per_s": v.get("greedy_repeat_median_tokens_per_s")})
                         for k, v in bk.items()},
        })
    for p in sorted(glob.glob(os.path.join(root, "megatron", "*.json"))):
        rec = _load_json(p)
        if not rec:
            continue
        ih = (rec.get("versions") or {}).get("implementation") or {}
        common = {"file": rel(p), "model": rec.get("model"), "layers": rec.get("layers"),
                  "megatron_core": (rec.get("versions") or {}).get("megatron-core"),
                  "gpu": ((rec.get("versions") or {}).get("env") or {}).get("gpu"),
                  "matches_hash": ih.get("name") == impl.name and ih.get("source_hash") == impl.source_hash}
        if rec.get("engine") == "megatron" and "bit_identical" in rec:
            out["megatron_verify"].append({**common, "batch": rec.get("batch"), "device": rec.get("device"),
                                           "prompt_lens": rec.get("prompt_lens"),
                                           "response_lens": rec.get("response_lens"),
                                           "bit_identical": bool(rec["bit_identical"]),
                                           "rows": {c.get("check"): [c.get("identical_rows"), c.get("rows")]
                                                    for c in rec.get("checks") or [] if isinstance(c, dict)}})
        elif rec.get("variants"):
            out["megatron_bench"].append({**common, "tokens_per_step": rec.get("tokens_per_step"),
                                          "micro_batch": rec.get("micro_batch"), "seq_len": rec.get("seq_len"),
                                          "tokens_per_s": {k: v.get("tokens_per_s") for k, v in rec["variants"].items()
                                                           if v.get("tokens_per_s")}})
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


# ---- the "Measured" table (README) -----------------------------------------------------------------
MEASURED_BEGIN = "<!-- measured:begin -->"
MEASURED_END = "<!-- measured:end -->"
METHODS = (("cold", "cold_us"), ("graph", "graph_us"))

# Row keys the contract suite writes for its baselines, named as the suite calls them (versions: the
# table's "Measured on" line; a name may hold "{torch}"); (workload family, key) entries name a key
# whose meaning differs per family. Context baselines (eager code) never make a headline row.
KNOWN_BASELINES: dict[Any, tuple[str, bool]] = {
    "cudnn": ("torch SDPA, cuDNN backend", False),
    "fa2": ("torch SDPA, FlashAttention-2 backend", False),
    "sdpa_masked_padded": ("torch SDPA, padded cache + key mask", False),
    "cublas": ("cuBLAS (torch F.linear)", False),
    "torch_index_put": ("torch index_put_ into the pool", False),
    "hf_grouped_mm": ("transformers Qwen3-MoE block, grouped_mm", False),
    ("rmsnorm", "liger"): ("Liger LigerRMSNorm", False),
    ("rmsnorm_residual", "liger"): ("Liger LigerFusedAddRMSNorm", False),
    ("qk_norm", "liger"): ("Liger LigerRMSNorm (per head)", False),
    ("rope", "liger"): ("Liger liger_rotary_pos_emb", False),
    ("swiglu", "liger"): ("Liger LigerSiLUMulFunction", False),
    "hf_eager": ("transformers eager module", True),
    "hf_eager_apply": ("transformers eager apply_rotary_pos_emb", True),
    "hf_eager_cos_sin_apply": ("transformers eager rotary embedding + apply", True),
    "areal_chunked": ("AReaL-style chunked fp32 log_softmax (eager torch)", True),
}
# keys of a row that hold our own timings (never a baseline)
_OURS_KEYS = ("ours", "paged")


def _timing(v) -> bool:
    return isinstance(v, dict) and any(isinstance(v.get(k), (int, float)) for _, k in METHODS)


def _group(row: dict[str, Any]) -> str:
    """The workload family of a bench row: its ``kind``, else its name up to ``[`` or ``_``."""
    if row.get("kind"):
        return str(row["kind"])
    name = str(row.get("name", "?"))
    return name.split("[")[0] if "[" in name else name.split("_")[0]


def _ours(row: dict[str, Any]) -> dict[str, Any] | None:
    key = row.get("ours_key")
    if key:
        return row.get(key) if _timing(row.get(key)) else None
    for k in _OURS_KEYS:
        if _timing(row.get(k)):
            return row[k]
    return None


def unnamed_timings(row: dict[str, Any]) -> list[str]:
    """Timing dicts of a row that are neither ours nor a named baseline (variants of ours, or a baseline
    whose writer forgot its name: ``tik evidence --markdown`` lists them)."""
    named = {b["key"] for b in row_baselines(row)}
    ours = set(_OURS_KEYS) | {row.get("ours_key")}
    return [k for k, v in row.items() if _timing(v) and k not in ours and k not in named]


def row_baselines(row: dict[str, Any], env: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The baselines one bench row measured: ``{"key", "name", "context", "cold_us", "graph_us"}`` each.
    A timing dict counts only when it is named (by the row or :data:`KNOWN_BASELINES`); unnamed
    timings are variants of ours (e.g. attention's dense / page-16 decode)."""
    torch_v = str((env or {}).get("torch") or "?")
    group = _group(row)
    out = []
    named = dict(row.get("baseline_names") or {})
    cands = {k: v for k, v in row.items() if _timing(v) and k not in _OURS_KEYS and k != row.get("ours_key")}
    # the harness's form: {"baselines": {exact name: timings}, "context": {name: timings}} (the key is the name)
    keyed: dict[str, bool] = {}
    for field, ctx in (("baselines", False), ("context", True)):
        sub = row.get(field)
        for k, v in (sub.items() if isinstance(sub, dict) else ()):
            if _timing(v):
                cands[k], keyed[k] = v, ctx
    for key, v in cands.items():
        name = v.get("name") or row.get(f"{key}_name") or named.get(key) or (key if key in keyed else None)
        context = bool(v.get("context", False)) or keyed.get(key, False)
        if not name:
            known = KNOWN_BASELINES.get((group, key)) or KNOWN_BASELINES.get(key)
            if known is None:
                continue
            name, context = known[0].format(torch=torch_v), known[1] or context
        out.append({"key": key, "name": str(name), "context": context,
                    **{k: v.get(k) for _, k in METHODS}})
    return out


def _fmt_us(us: float) -> str:
    if us >= 1000:
        return f"{us / 1000:.3g} ms"
    return f"{us:.3g} µs"


def _span(vals: list[float], fmt) -> str:
    lo, hi = min(vals), max(vals)
    return fmt(lo) if fmt(lo) == fmt(hi) else f"{fmt(lo)}–{fmt(hi)}"


_DIMS = ("B", "L", "ctx", "T", "M", "N", "K")


def _workload(group: str, rows: list[dict[str, Any]]) -> str:
    parts = []
    for d in _DIMS:
        vals = [r[d] for r in rows if isinstance(r.get(d), (int, float)) and not isinstance(r.get(d), bool)]
        if vals and len(set(vals)) > 1:
            parts.append(f"{d} {_span(vals, lambda x: f'{x:g}')}")
        elif vals and len(rows) == 1:
            parts.append(f"{d} {vals[0]:g}")
    n = f" ×{len(rows)}" if len(rows) > 1 else ""
    return f"{group}{n}" + (f" ({', '.join(parts)})" if parts else "")


def _latest_per_op(recs: list[dict[str, Any]], key: str) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """op -> (op record, evidence record) of the newest file whose record of that op has ``key``
    (``checks``: the run that decides the op's contract status; ``benchmarks``: its numbers)."""
    out: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
    for r in sorted(recs, key=lambda r: (r.get("started") or "", r.get("_path", ""))):
        for op, op_rec in (r.get("ops") or {}).items():
            if op_rec.get(key):
                out[op] = (op_rec, r)
    return out


def measured(impl, root: str | None = None, source_hash: str | None = None) -> dict[str, Any]:
    """The rows of the Measured table: per op, per workload family and timing method, our time against
    the strongest (fastest) non-context baseline each workload measured, from the newest evidence file
    of ``source_hash`` (default: the implementation's current hash). Ops without such evidence are
    listed in ``awaiting``; ops whose contract checks fail get no performance rows (``failing``)."""
    root = root or repo_evidence_dir()
    h = source_hash or impl.source_hash
    recs = [r for r in load_all(impl.name, root) if r.get("source_hash") == h]
    ops_declared = list(dict.fromkeys(e.split(".")[0] for e in impl.manifest["entry_points"]))
    checked, benched = _latest_per_op(recs, "checks"), _latest_per_op(recs, "benchmarks")
    rows: list[dict[str, Any]] = []
    awaiting, failing, no_headline = [], [], []
    unnamed: dict[str, set[str]] = {}
    envs: dict[str, dict[str, Any]] = {}
    for op in ops_declared:
        if op not in checked and op not in benched:
            awaiting.append(op)
            continue
        checks = checked[op][0]["checks"] if op in checked else []
        if not checks or any(not c.get("passed") for c in checks):
            failing.append(op)
            continue
        if op not in benched:
            awaiting.append(op)
            continue
        op_rec, rec = benched[op]
        env = rec.get("env") or {}
        fname = os.path.relpath(rec["_path"], os.path.dirname(root)).replace(os.sep, "/")
        groups: dict[tuple[str, str, str], list[tuple[dict[str, Any], float, float]]] = {}
        for b in op_rec.get("benchmarks") or []:
            ours = _ours(b)
            if ours is None:
                continue
            for k in unnamed_timings(b):
                unnamed.setdefault(op, set()).add(k)
            bases = [x for x in row_baselines(b, env) if not x["context"]]
            for method, key in METHODS:
                o = ours.get(key)
                timed = [x for x in bases if isinstance(x.get(key), (int, float)) and x[key] > 0]
                if not isinstance(o, (int, float)) or o <= 0 or not timed:
                    continue
                best = min(timed, key=lambda x: x[key])
                groups.setdefault((_group(b), method), []).append((b, o, best[key], best["name"]))
        if not groups:
            no_headline.append(op)
            continue
        envs[fname] = env
        for (group, method), items in groups.items():
            # the strongest baseline can differ between the workloads of a family: name each, with its count
            counts: dict[str, int] = {}
            for *_, name in items:
                counts[name] = counts.get(name, 0) + 1
            base = ", ".join(f"{n} ×{c}" if len(counts) > 1 else n
                             for n, c in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
            items = [(b, o, bt) for b, o, bt, _ in items]
            ratios = [bt / o for _, o, bt in items]
            geo = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
            rows.append({"op": op, "workload": _workload(group, [b for b, _, _ in items]), "group": group,
                         "n": len(items), "ours_us": [o for _, o, _ in items], "baseline": base,
                         "ratio_geomean": geo, "ratio_min": min(ratios), "ratio_max": max(ratios),
                         "method": method, "file": fname})
    return {"implementation": impl.name, "source_hash": h, "ops": ops_declared, "rows": rows, "awaiting": awaiting,
            "failing": failing, "no_headline": no_headline, "envs": envs,
            "unnamed": {op: sorted(v) for op, v in unnamed.items()}}


def _env_line(env: dict[str, Any]) -> str:
    bits = [env.get("gpu") or "?"]
    for k, label in (("torch", "torch"), ("triton", "Triton"), ("cuda", "CUDA"), ("driver", "driver")):
        if env.get(k):
            bits.append(f"{label} {env[k]}")
    return ", ".join(bits)


def render_markdown(impl, root: str | None = None, source_hash: str | None = None) -> str:
    """The README's Measured table (between :data:`MEASURED_BEGIN` / :data:`MEASURED_END`)."""
    m = measured(impl, root, source_hash)
    files = sorted({r["file"] for r in m["rows"]} | set(m["envs"]))
    ref = {f: f"e{i + 1}" for i, f in enumerate(files)}
    out = [MEASURED_BEGIN,
           f"Kernels `{m['implementation']}` at its manifest's hash (`tik evidence --markdown`). Ratio = baseline "
           "time / ours (> 1: ours faster), geomean (min–max) over workloads; cold = `do_bench` median, graph = "
           "CUDA-graph replay; baseline = the fastest non-eager one per workload.",
           ""]
    by_env: dict[str, list[str]] = {}
    for f in files:
        by_env.setdefault(_env_line(m["envs"].get(f, {})), []).append(f"[{ref[f]}]")
    for line, refs in by_env.items():
        out += [f"Measured on {line} ({', '.join(refs)}).", ""]
    out += ["| op | workload | ours | baseline | ratio | method | evidence |",
            "|---|---|---|---|---|---|---|"]
    for op in m["ops"]:
        op_rows = [r for r in m["rows"] if r["op"] == op]
        for r in op_rows:
            ratio = (f"{r['ratio_geomean']:.2f}" if r["n"] == 1 else
                     f"{r['ratio_geomean']:.2f} ({r['ratio_min']:.2f}–{r['ratio_max']:.2f})")
            out.append(f"| {op} | {r['workload']} | {_span(r['ours_us'], _fmt_us)} | {r['baseline']} | {ratio} "
                       f"| {r['method']} | [{ref[r['file']]}] |")
        if op in m["awaiting"]:
            out.append(f"| {op} | — | — | — | — | — | awaiting GPU run |")
        elif op in m["failing"]:
            out.append(f"| {op} | — | — | — | — | — | contract checks failing: no numbers |")
        elif op in m["no_headline"]:
            out.append(f"| {op} | — | — | only eager baselines recorded (context, not a headline) | — | — | — |")
    out.append("")
    if m["awaiting"]:
        out.append(f"Awaiting the GPU run for this hash: {', '.join(m['awaiting'])}.")
        out.append("")
    whole = integration_rows(impl, root, source_hash)
    if whole:
        out += ["| whole model / engine | workload | result | baseline | ratio | command | evidence |",
                "|---|---|---|---|---|---|---|"]
        for r in whole:
            # the op rows' "Measured on" line does not cover these: each names its own card
            wl = r["workload"] + (f" ({r['gpu']})" if r.get("gpu") else "")
            out.append(f"| {r['what']} | {wl} | {r['result']} | {r['baseline']} | {r['ratio']} "
                       f"| `{r['command']}` | {r['file']} |")
        out.append("")
    for f in files:
        out.append(f"[{ref[f]}]: {f}")
    if files:
        out.append("")
    out.append(MEASURED_END)
    return "\n".join(out) + "\n"


def integration_rows(impl, root: str | None = None, source_hash: str | None = None) -> list[dict[str, Any]]:
    """Whole-model and engine results of the current hash for the Measured block: ``tik verify``, the
    SGLang Engine proof, the layer bench (each as its producing command wrote it)."""
    h = source_hash or impl.source_hash
    if h != impl.source_hash:
        return []
    s_models, integ = model_summary(impl, root), integration_summary(impl, root)
    out = []
    verified = [v for v in s_models if v["matches_hash"] and v["device"] == "cuda"]
    shapes = sorted({(v["batch"], v["prompt_len"], v["response_len_min"], v["response_len"]) for v in verified})
    for b, pl, r0, r1 in shapes:
        vs = [v for v in verified if (v["batch"], v["prompt_len"], v["response_len_min"], v["response_len"]) ==
              (b, pl, r0, r1)]
        ok = all(v["plugin_bit_identical"] for v in vs)
        gpus = sorted({v["gpu"] for v in vs if v.get("gpu")})
        out.append({"what": "tik verify " + ", ".join(v["model"] for v in vs), "gpu": ", ".join(gpus),
                    "file": ", ".join(v["file"] for v in vs),
                    "workload": f"batch {b}, prompt {pl}, responses {r0}..{r1}",
                    "result": "bit-identical" if ok else "NOT bit-identical", "baseline": "—", "ratio": "—",
                    "command": f"tik verify --batch {b} --prompt-len {pl} --response-len {r0}..{r1}"})
    for r in integ.get("sglang_gpu", []):
        if not r.get("matches_hash"):
            continue
        tps = (r.get("backends", {}).get("tik") or {}).get("greedy_tokens_per_s")
        others = {k: v for k, v in (r.get("backends") or {}).items() if k != "tik"}
        base = ", ".join(f"`{k}`: " + ("not run" if v.get("error") or not v.get("greedy_tokens_per_s")
                                       else f"{v['greedy_tokens_per_s']:.0f} tok/s")
                         for k, v in others.items()) or "—"
        ratio = "—"
        fi = others.get("flashinfer") or {}
        if tps and fi.get("greedy_tokens_per_s"):
            ratio = f"{tps / fi['greedy_tokens_per_s']:.2f}"
            if (r["backends"]["tik"].get("repeat_tokens_per_s") and fi.get("repeat_tokens_per_s")):
                ratio += f" (cached prompts {r['backends']['tik']['repeat_tokens_per_s'] / fi['repeat_tokens_per_s']:.2f})"
        out.append({"what": "SGLang Engine, backend `tik`", "file": r["file"], "gpu": r.get("gpu"),
                    "workload": f"{r.get('model')}, batch {r.get('batch')}, {r.get('new_tokens')} new tokens"
                                + (", CUDA graphs" if r.get("cuda_graphs") else ""),
                    "result": f"{r.get('requests')} requests "
                              + ("bit-identical to the training forward" if r.get("bit_identical") else "DIFFER")
                              + (f"; {tps:.0f} tok/s greedy decode" if tps else ""),
                    "baseline": base, "ratio": ratio, "command": "python -m benchmarks.sglang_gpu_proof"})
    for r in integ.get("megatron_verify", []):
        if not r["matches_hash"] or r.get("device") != "cuda":
            continue
        pl, rl = r.get("prompt_lens") or [], r.get("response_lens") or []
        shape = (f"prompt {min(pl)}..{max(pl)}" if pl and min(pl) != max(pl) else f"prompt {pl[0]}" if pl else "")
        shape += f", responses {min(rl)}..{max(rl)}" if rl else ""
        out.append({"what": f"tik verify --engine megatron {r['model']} ({r['layers']} layers, megatron-core "
                            f"{r['megatron_core']})", "file": r["file"], "gpu": r.get("gpu"),
                    "workload": f"batch {r['batch']}, {shape}",
                    "result": "bit-identical" if r["bit_identical"] else "NOT bit-identical",
                    "baseline": "—", "ratio": "—", "command": "tik verify --engine megatron"})
    for r in integ.get("megatron_bench", []):
        t = r["tokens_per_s"]
        if not r["matches_hash"] or "tik" not in t:
            continue
        ours = t["tik"]  # [s, b] input like the baselines; the packed (THD) layout AReaL feeds is shown beside it
        base = {k: v for k, v in t.items() if not k.startswith("tik")}
        names = {"local": "Megatron local spec (no TE)", "hf": "HF + SDPA"}
        out.append({"what": "Megatron forward + backward, plugin spec", "file": r["file"], "gpu": r.get("gpu"),
                    "workload": f"{r['model']} x {r['layers']} layers, micro-batch {r['micro_batch']} x {r['seq_len']}",
                    "result": f"{ours:.0f} tok/s" + (f" ({t['tik-thd']:.0f} packed THD)" if "tik-thd" in t else ""),
                    "baseline": ", ".join(f"{names.get(k, k)}: {v:.0f} tok/s" for k, v in base.items()) or "—",
                    "ratio": ", ".join(f"{ours / v:.2f} vs {k}" for k, v in base.items()) or "—",
                    "command": "python -m benchmarks.megatron_bench"})
    for r in integ.get("layer_bench", []):
        if not r.get("matches_hash") or r.get("geomean_ratio") is None:
            continue
        per = ", ".join(f"{k} {v:.2f}" for k, v in (r.get("per_model_geomean") or {}).items() if v is not None)
        out.append({"what": "layer bench (rollout + update per layer)", "file": r["file"], "gpu": r.get("gpu"),
                    "workload": f"{r['n']} (model, batch, length) cells" + (f": {per}" if per else "")
                                + (" (run cut: the models it finished)" if r.get("partial") else ""),
                    "result": "unified kernels, no recompute",
                    "baseline": "FlashInfer fused ops + cuBLAS rollout, HF + Liger update, recompute on"
                                + (f" ({', '.join(r['baselines_skipped'])}: not built, not compared)"
                                   if r.get("baselines_skipped") else ""),
                    "ratio": f"{r['geomean_ratio']:.2f} (min {r['min_ratio']:.2f})",
                    "command": "python -m benchmarks.layer_bench"})
    return out


def readme_table(text: str) -> str | None:
    """The Measured block of a README text (markers included, as :func:`render_markdown` ends it),
    or None without markers."""
    i, j = text.find(MEASURED_BEGIN), text.find(MEASURED_END)
    if i < 0 or j < i:
        return None
    return text[i:j + len(MEASURED_END)] + "\n"


def update_readme(path: str, table: str) -> bool:
    """Replace the Measured block of the README at ``path``; True when the file changed."""
    with open(path) as f:
        text = f.read()
    i, j = text.find(MEASURED_BEGIN), text.find(MEASURED_END)
    if i < 0 or j < i:
        raise ValueError(f"{path}: expected the markers {MEASURED_BEGIN} ... {MEASURED_END}")
    new = text[:i] + table.rstrip("\n") + text[j + len(MEASURED_END):]
    if new == text:
        return False
    with open(path, "w") as f:
        f.write(new)
    return True
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
    """The header of a contract-suite evidence file (``python -m areal_tik_plugin.contract``); the suite fills
    ``ops[op]`` with each op's :class:`~areal_tik_plugin.contract.suite.Recorder` JSON."""
    import time

    return {"schema": SCHEMA, "implementation": impl.name, "source_hash": impl.source_hash, "env": env,
            "argv": list(argv), "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "ops": {}}


def _contract_counts(records: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """Per op, the passed / failed checks of the newest record that checked it (as :func:`summary`)."""
    per_op: dict[str, dict[str, int]] = {}
    for op, (o, _) in _latest_per_op(records, "checks").items():
        n = sum(1 for chk in o["checks"] if chk.get("passed"))
        per_op[op] = {"passed": n, "failed": len(o["checks"]) - n}
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
