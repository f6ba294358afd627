"""``tik sglang-check``: start SGLang with the plugin on a model and report which ops ran through ours.

The check runs a real ``sglang.Engine`` in a child process (a failing Engine kills its parent), with
``attention_backend="tik"``, generates a few batched requests (greedy and sampled, a shared prefix
so the radix cache is hit, chunked prefill with a small chunk), and prints

* our own call counters per op (from every scheduler process, ``TIK_SGLANG_STATS``),
* SGLang's fused-op trace (op class -> dispatch label; ``plugin`` means ours),
* pass/fail: every hot op ran through ours and no fused op ran on another path.

The same child-process worker (:func:`run_worker`) is what the CPU proof tests use
(tests/integrations/test_sglang_*.py): it takes a JSON spec {engines: [{engine_kwargs, jobs, env}], ...} and writes
the outputs (token ids, log-probs, cached tokens) plus the stats files.

On a machine without CUDA the child gets ``TRITON_INTERPRET=1`` (our kernels run in Triton's
interpreter) and, when torchvision is missing, the import-only stubs of ``devenv/cpu_stubs`` on PYTHONPATH.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time

# ops that must have run through ours in a dense / MoE model
COMMON_OPS = ("attention_extend", "attention_decode", "kv_write", "rms_norm", "rms_norm_residual", "apply_rope",
              "linear", "lm_head", "token_logprobs")
DENSE_OPS = COMMON_OPS + ("swiglu_fused",)
MOE_OPS = COMMON_OPS + ("moe_route", "moe_experts")
PLUGIN_FUSED_OPS = ("RMSNorm", "RotaryEmbedding", "SiluAndMul", "TopK", "UnquantizedFusedMoEMethod")


def cpu_stub_path() -> str | None:
    """torchvision / vllm import stand-ins for SGLang on a CPU machine (``devenv/cpu_stubs``; source checkout only)."""
    from areal_tik_plugin.runtime.source_checkout import devenv_dir

    return devenv_dir("cpu_stubs")


def gpu_stub_path() -> str:
    """``sgl_kernel`` import stand-in (``devenv/gpu_stubs/sgl_kernel``) for a GPU box without sgl-kernel."""
    from areal_tik_plugin.runtime.source_checkout import devenv_dir

    return devenv_dir("gpu_stubs", required=True)


def child_env(stats_dir: str | None = None, extra: dict | None = None) -> dict:
    """Environment for a process that starts SGLang with the plugin on this machine."""
    import importlib.util

    env = dict(os.environ)
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    stubs = cpu_stub_path()
    if importlib.util.find_spec("torchvision") is None and stubs and stubs not in paths:
        paths.append(stubs)
    env["PYTHONPATH"] = os.pathsep.join(paths)
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        has_cuda = False
    if not has_cuda:
        env["TRITON_INTERPRET"] = "1"
        if not plugin_system() and importlib.util.find_spec("sgl_kernel") is None:
            # SGLang 0.5.10 imports sgl_kernel (CUDA wheel) at module import even on CPU; the
            # import-only stand-in raises on any call, so a kernel of it that would run is a finding
            paths.append(gpu_stub_path())
            env["PYTHONPATH"] = os.pathsep.join(paths)
            env.setdefault("SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK", "1")
    if stats_dir:
        env["TIK_SGLANG_STATS"] = stats_dir
    env.setdefault("SGLANG_PLUGINS", "tik")
    if extra:
        env.update({k: str(v) for k, v in extra.items()})
    return env


def plugin_system() -> bool:
    """Whether the installed SGLang loads ``sglang.srt.plugins`` entry points (0.5.2x); without it
    (0.5.10.post1) the plugin enters through :mod:`areal_tik_plugin.integrations.sglang.launch`."""
    import importlib.util

    try:
        return importlib.util.find_spec("sglang.srt.plugins") is not None
    except ModuleNotFoundError:
        return False


def default_engine_kwargs(model: str, backend: str = "tik", device: str | None = None, **over) -> dict:
    import torch

    dev = device or ("cuda" if torch.cuda.is_available() else "cpu")
    # on CPU mem_fraction_static is a fraction of *host* RAM that must exceed what is already in use
    # (a small value refuses to start on a busy machine); the KV pool stays capped by max_total_tokens
    kw = dict(model_path=model, device=dev, attention_backend=backend, dtype="bfloat16",
              mem_fraction_static=0.4 if dev == "cpu" else 0.5, max_total_tokens=4096, max_running_requests=8,
              chunked_prefill_size=16, disable_cuda_graph=(dev == "cpu"), skip_server_warmup=True,
              sampling_backend="pytorch", grammar_backend="none", log_level="error")
    kw.update(over)
    return kw


def installed_engine_kwargs(kw: dict) -> dict:
    """``kw`` completed for the SGLang installed in this process (the child that starts the Engine):
    on CPU, SGLang 0.5.10 captures piecewise CUDA graphs unless told not to (torch.cpu has no graph
    pool); later versions have no such field."""
    kw = dict(kw)
    if kw.get("device") == "cpu" and "disable_piecewise_cuda_graph" in _server_arg_names():
        kw.setdefault("disable_piecewise_cuda_graph", True)
    return kw


def _server_arg_names() -> set:
    """Field names of the installed SGLang's ``ServerArgs`` (a dataclass in 0.5.10, a msgspec Struct later)."""
    try:
        from sglang.srt.server_args import ServerArgs
    except ImportError:
        return set()
    fields = getattr(ServerArgs, "__struct_fields__", None)
    if fields is None:
        import dataclasses

        fields = [f.name for f in dataclasses.fields(ServerArgs)]
    return set(fields)


def default_jobs(vocab_words=None) -> list:
    """Greedy then sampled requests; prompts share a long prefix (radix hit on the second job)."""
    from_words = vocab_words or ("the cat sat on the mat and then ran far up the hill to see the big red sun "
                                 "and the moon").split()
    prefix = " ".join(from_words)
    tails = ["one two three", "four five", "six", "seven eight nine ten"]
    prompts = [f"{prefix} {t}" for t in tails]
    return [
        {"prompts": prompts, "sampling_params": {"temperature": 0.0, "max_new_tokens": 6}},
        {"prompts": prompts, "sampling_params": [{"temperature": 1.0, "max_new_tokens": 6},
                                                 {"temperature": 0.7, "max_new_tokens": 6},
                                                 {"temperature": 1.0, "max_new_tokens": 6},
                                                 {"temperature": 1.3, "max_new_tokens": 6}]},
    ]


# ------------------------------------------------------------------------------------------------
# child process
# ------------------------------------------------------------------------------------------------

def _run_engine(engine_kwargs: dict, jobs: list) -> dict:
    from sglang.srt.entrypoints.engine import Engine

    t0 = time.time()
    engine = Engine(**installed_engine_kwargs(engine_kwargs))
    out = {"startup_s": time.time() - t0, "jobs": []}
    try:
        for job in jobs:
            t1 = time.time()
            res = engine.generate(input_ids=job.get("input_ids"), prompt=job.get("prompts"),
                                  sampling_params=job["sampling_params"], return_logprob=True)
            reqs = []
            for r in res:
                mi = r["meta_info"]
                reqs.append({"input_ids": None, "output_ids": r.get("output_ids"),
                             "logprobs": [x[0] for x in mi["output_token_logprobs"]],
                             "tokens": [x[1] for x in mi["output_token_logprobs"]],
                             "cached_tokens": mi.get("cached_tokens", 0), "prompt_tokens": mi.get("prompt_tokens")})
            out["jobs"].append({"seconds": time.time() - t1, "requests": reqs})
    finally:
        engine.shutdown()
    return out


def run_worker(spec_path: str, out_path: str) -> int:
    with open(spec_path) as f:
        spec = json.load(f)
    if spec.get("tokenize_with"):
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(spec["tokenize_with"])
    else:
        tok = None
    results = []
    for eng in spec["engines"]:
        os.environ.update({k: str(v) for k, v in (eng.get("env") or {}).items()})
        backend = eng["engine_kwargs"].get("attention_backend")
        # the no-plugin-system path (asked for, or the only one this SGLang has): spawn targets register
        if eng.get("launcher") or (backend == "tik" and not plugin_system()):
            from areal_tik_plugin.integrations.sglang import launch as sglang_launch

            sglang_launch.install()
        r = _run_engine(eng["engine_kwargs"], eng["jobs"])
        if tok is not None:
            for job, jr in zip(eng["jobs"], r["jobs"]):
                for p, req in zip(job.get("prompts") or [], jr["requests"]):
                    req["input_ids"] = tok(p)["input_ids"]
        results.append(r)
    with open(out_path, "w") as f:
        json.dump({"engines": results}, f)
    return 0


def launch_worker(spec: dict, workdir: str, timeout: float = 900, stats_dir: str | None = None,
                  extra_env: dict | None = None) -> dict:
    """Run :func:`run_worker` in a child process (own process group, killed on timeout)."""
    import signal

    spec_path = os.path.join(workdir, "spec.json")
    out_path = os.path.join(workdir, "out.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    log_path = os.path.join(workdir, "worker.log")
    with open(log_path, "w") as log:
        p = subprocess.Popen([sys.executable, "-m", "areal_tik_plugin.integrations.sglang.check", "--worker",
                              spec_path, out_path], env=child_env(stats_dir, extra_env), stdout=log,
                             stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = None
        finally:
            try:  # the engine's scheduler / detokenizer children share the group
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
    if rc != 0 or not os.path.exists(out_path):
        with open(log_path) as f:
            tail = f.read()[-6000:]
        why = f"timed out after {timeout:.0f} s" if rc is None else f"failed (rc={rc})"
        raise RuntimeError(f"SGLang worker {why}; log tail:\n{tail}")
    with open(out_path) as f:
        return json.load(f)


def read_stats(stats_dir: str) -> list:
    out = []
    for path in sorted(glob.glob(os.path.join(stats_dir, "stats-*.json"))):
        with open(path) as f:
            out.append(json.load(f))
    return out


def summarize(stats: list, moe: bool) -> dict:
    """Merge per-process stats; decide whether every hot op ran through ours."""
    counts, trace = {}, {}
    for s in stats:
        for k, v in s.get("counts", {}).items():
            counts[k] = counts.get(k, 0) + v
        for k, v in s.get("fused_op_trace", {}).items():
            trace[k] = trace.get(k, 0) + v
    need = MOE_OPS if moe else DENSE_OPS
    missing = [op for op in need if counts.get(op, 0) == 0]
    other_paths = {k: v for k, v in trace.items() if k.split("|")[0] in PLUGIN_FUSED_OPS and not k.endswith("|plugin")}
    return {"counts": counts, "fused_op_trace": trace, "missing": missing, "other_paths": other_paths,
            "active": any(s.get("active") for s in stats), "ok": bool(stats) and not missing and not other_paths}


def training_logprobs(path: str, reqs, device: str = "cpu", dtype=None, max_tokens_per_forward: int = 8192) -> list:
    """Training-side log-probs of rollouts: packed ``[1, total]`` forwards (AReaL's layout:
    ``cu_seq_lens_q/k``, ``max_length_q/k``, per-sequence ``position_ids``; requests grouped in order
    into micro-batches of at most ``max_tokens_per_forward`` tokens, a longer request alone) through the
    plugin-patched HF model in training mode (autograd on), then ``ops.token_logprobs`` at each
    response token with the request's temperature.

    ``reqs``: ``[(prompt_ids, response_ids, temperature), ...]``. Returns one fp32 tensor per request.
    """
    import torch
    from transformers import AutoModelForCausalLM

    from areal_tik_plugin import ops
    from areal_tik_plugin.integrations.transformers import apply_to_model
    from areal_tik_plugin.verify import hf_packed_logits, packed_groups

    if max_tokens_per_forward < 1:
        raise ValueError(f"max_tokens_per_forward must be >= 1, got {max_tokens_per_forward}")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype or torch.bfloat16).to(device)
    model = apply_to_model(model)
    model.train()
    out = [None] * len(reqs)
    for group in packed_groups([len(p) + len(r) for p, r, _ in reqs], max_tokens_per_forward):
        seqs = [torch.tensor(list(reqs[i][0]) + list(reqs[i][1])) for i in group]
        for i, logits in zip(group, hf_packed_logits(model, seqs, device)):
            p, r, t = reqs[i]
            rows = logits.detach()[len(p) - 1:len(p) - 1 + len(r)].contiguous()
            out[i] = ops.token_logprobs(rows, torch.tensor(list(r), device=device), temperature=float(t)).cpu()
    del model
    return out


def bitwise_mismatches(rollout_logprobs, train_logprobs) -> list:
    """Indices of requests whose SGLang log-probs differ in any bit from the training-side ones."""
    import torch

    bad = []
    for i, (a, b) in enumerate(zip(rollout_logprobs, train_logprobs)):
        ta = torch.as_tensor(a, dtype=torch.float32)
        if ta.shape != b.shape or not torch.equal(ta.view(torch.int32), b.view(torch.int32)):
            bad.append(i)
    return bad


def _is_moe(model: str) -> bool:
    try:
        with open(os.path.join(model, "config.json")) as f:
            cfg = json.load(f)
    except OSError:
        return False
    return "moe" in str(cfg.get("model_type", "")) or bool(cfg.get("num_experts") or cfg.get("num_local_experts"))


def _cmd_check(args) -> int:
    kw = default_engine_kwargs(args.model, backend="tik", device=args.device,
                               chunked_prefill_size=args.chunked_prefill_size)
    spec = {"engines": [{"engine_kwargs": kw, "jobs": default_jobs()}]}
    extra = {}
    if args.stub_sgl_kernel:
        extra = {"PYTHONPATH": os.pathsep.join(p for p in (gpu_stub_path(), os.environ.get("PYTHONPATH", "")) if p),
                 "SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK": "1"}
    with tempfile.TemporaryDirectory(prefix="tik-sglang-check-") as d:
        stats_dir = os.path.join(d, "stats")
        res = launch_worker(spec, d, timeout=args.timeout, stats_dir=stats_dir, extra_env=extra)
        summ = summarize(read_stats(stats_dir), moe=_is_moe(args.model))
    eng = res["engines"][0]
    summ["startup_s"] = round(eng["startup_s"], 1)
    summ["job_seconds"] = [round(j["seconds"], 1) for j in eng["jobs"]]
    summ["cached_tokens"] = [r["cached_tokens"] for j in eng["jobs"] for r in j["requests"]]
    if args.json:
        print(json.dumps(summ, indent=2))
    else:
        print(f"SGLang engine with attention_backend=tik on {args.model}: startup {summ['startup_s']} s, "
              f"jobs {summ['job_seconds']} s, cached prefix tokens per request {summ['cached_tokens']}")
        print("our op calls (all scheduler processes):")
        for k, v in sorted(summ["counts"].items()):
            print(f"  {k:<28}{v:>8}")
        print("SGLang fused-op trace (op|path -> calls; 'plugin' = ours):")
        for k, v in sorted(summ["fused_op_trace"].items()):
            print(f"  {k:<40}{v:>8}")
        if summ["missing"]:
            print(f"NOT through ours (no calls): {summ['missing']}")
        if summ["other_paths"]:
            print(f"fused ops on another path: {summ['other_paths']}")
        print("OK: every hot op ran through areal_tik_plugin.ops" if summ["ok"] else "FAIL")
    return 0 if summ["ok"] else 1


def register(sub) -> None:
    p = sub.add_parser("sglang-check", help="start SGLang with the tik plugin on a model; report which ops ran through ours")
    p.add_argument("--model", required=True, help="HF checkpoint folder (Qwen3 / Qwen3-MoE / Qwen2 / Llama)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--chunked-prefill-size", type=int, default=16)
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--json", action="store_true")
    p.add_argument("--stub-sgl-kernel", action="store_true",
                   help="GPU without the sgl-kernel wheel: import stand-in that raises on any call")
    p.set_defaults(func=_cmd_check)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m areal_tik_plugin.integrations.sglang.check")
    ap.add_argument("--worker", nargs=2, metavar=("SPEC", "OUT"), required=True)
    a = ap.parse_args(argv)
    return run_worker(*a.worker)


if __name__ == "__main__":
    sys.exit(main())
