"""GPU run of the SGLang proof + decode throughput (for the lead; needs SGLang on the GPU box, see
:mod:`devenv.sglang_wheels`). From the repository root::

    python3 -m benchmarks.sglang_gpu_proof --out $OUT [--stub-sgl-kernel]

1. builds a qwen3-4b-shaped random checkpoint (36 layers, hidden 2560, 32/8 heads x 128, MLP 9728,
   vocab 151936; tiny local tokenizer) on the GPU, or with ``--shape qwen3-30b-a3b`` a Qwen3-MoE one with
   Qwen3-30B-A3B's layer shape (128 experts, top-8) and its first ``--moe-layers`` (4) layers;
2. SGLang Engine ``attention_backend="tik"`` (CUDA graphs on): after a warm-up batch on other prompts
   (JIT compilation; neither timed nor compared), ``--batch`` requests sharing a prefix, greedy then
   sampled (per-request temperatures, radix-cache hits), chunked prefill, ``--new`` tokens each; timed;
3. the same jobs on stock SGLang with ``--attention-backend flashinfer`` (``--baselines``; the FlashInfer
   modules its engine JIT-compiles at start -- ragged prefill FA3 on sm90, paged prefill and tensor-core
   decode FA2, merge_state, the shim's norm / SiLU-and-mul / sampling -- are built by
   ``benchmarks.flashinfer_prebuild --only sglang`` in a background process (niced) while the tik engine
   runs, into the same FlashInfer JIT cache, so that the baseline's start finds them compiled;
   ``--no-fi-prebuild`` leaves them to the engine; the JSON's ``flashinfer_prebuild`` says what was built
   and how long the baseline waited for it): with
   ``--stub-sgl-kernel`` (sgl-kernel's wheel cannot be carried) its fused ops -- RMSNorm, fused
   add+RMSNorm, SiLU-and-mul, top-k/top-p renorm -- are served by FlashInfer through the sgl_kernel
   shim's FlashInfer mode (``--sgl-kernel-shim flashinfer``, the default; ``raise`` instead forces
   SGLang's torch-native fused ops, ``SGLANG_FORCE_FUSED_OP_BACKEND=torch``); RoPE is SGLang's own JIT
   kernel either way. The JSON's ``baseline_stack`` says exactly what ran;
4. the training-side log-probs (plugin-patched HF model, packed, training mode) of every tik rollout,
   compared bit for bit.

Writes ``sglang_gpu_proof.json`` (mismatching requests, per-backend job seconds and decode tokens/s,
our op counters, SGLang's fused-op trace) and prints a summary; exit 1 on any bit mismatch, 3 when the proof holds but a baseline failed.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from areal_tik_plugin.integrations.sglang import check as SC
from areal_tik_plugin.models import checkpoint_kwargs

# the shapes of areal_tik_plugin.models; Qwen3-30B-A3B's first --moe-layers layers (default 4): the MoE
# model path in SGLang (fused RoPE + set_kv_buffer on a CUDA bf16 pool, our MoE layer)
MOE_LAYERS = 4
SHAPES = {"qwen3-4b": checkpoint_kwargs("qwen3-4b"),
          "qwen3-30b-a3b": checkpoint_kwargs("qwen3-30b-a3b", layers=MOE_LAYERS),
          "tiny": ("qwen3", {})}


def _shim_map() -> dict:
    """sgl_kernel function -> (FlashInfer module, function) of the shim's FlashInfer mode, read from the
    shim's source (importing it here would install its import hook in this process)."""
    import ast

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "devenv", "gpu_stubs",
                        "sgl_kernel", "__init__.py")
    tree = ast.parse(open(path).read())
    node = next(n for n in tree.body if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "FLASHINFER_MAP")
    return ast.literal_eval(node.value)


def _baseline_env(a) -> dict:
    """Environment of a stock-SGLang baseline engine (beside the --stub-sgl-kernel paths)."""
    env = {"SGLANG_PLUGINS": "none", "TIK_SGLANG_STATS": ""}
    if a.stub_sgl_kernel and a.sgl_kernel_shim == "flashinfer":
        # an environment variable, not a flag: the stub is imported inside SGLang's spawned scheduler
        # processes, whose command lines SGLang builds
        env["TIK_SGL_KERNEL_SHIM"] = "flashinfer"
    elif a.stub_sgl_kernel:
        env["SGLANG_FORCE_FUSED_OP_BACKEND"] = "torch"
    return env


def _prompts(batch, prefix_len, vocab_hi, seed=0):
    rng = random.Random(seed)
    prefix = [rng.randrange(4, vocab_hi) for _ in range(prefix_len)]
    return [prefix + [rng.randrange(4, vocab_hi) for _ in range(1 + i % 17)] for i in range(batch)]


def start_fi_prebuild(out_dir: str, env: dict, timeout: float, jobs: int):
    """The FlashInfer modules of SGLang's flashinfer backend, built in a background process group at
    niceness 10 (the tik engine runs meanwhile); ``env``: the baseline engine's environment, so that the
    build lands in the JIT cache that engine reads. Returns (process, json path, log path, start time)."""
    path = os.path.join(out_dir, "fi_prebuild.json")
    log = os.path.join(out_dir, "fi_prebuild.log")
    cmd = [sys.executable, "-m", "benchmarks.flashinfer_prebuild", "--out", path, "--only", "sglang",
           "--timeout", str(int(timeout)), "--jobs", str(jobs), "--nice", "10"]
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    atexit.register(_kill_group, proc)  # a proof that fails early leaves no nvcc behind
    return proc, path, log, time.time()


def _kill_group(proc) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def wait_fi_prebuild(pre, timeout: float) -> dict:
    """Wait up to ``timeout`` s for :func:`start_fi_prebuild`'s process (its whole group is killed past
    that: the baseline engine then compiles what is missing itself); what it reported, plus the wait."""
    proc, path, log, t0 = pre
    t = time.time()
    still_running = proc.poll() is None
    try:
        proc.wait(timeout=max(1.0, timeout))
    except subprocess.TimeoutExpired:
        _kill_group(proc)
    res = {"running_when_baseline_due": still_running, "waited_s": round(time.time() - t, 1),
           "seconds_since_start": round(time.time() - t0, 1), "rc": proc.returncode}
    try:
        with open(path) as f:
            res.update(json.load(f))
    except (OSError, ValueError):
        res["error"] = "no result: " + open(log).read()[-1500:]
    return res


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.sglang_gpu_proof")
    ap.add_argument("--out", required=True)
    ap.add_argument("--model-dir", default=None)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--prefix", type=int, default=600)
    ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--chunk", type=int, default=256)
    ap.add_argument("--baselines", default="flashinfer",
                    help="stock SGLang attention backends timed on the same jobs (comma list; '' for none)")
    ap.add_argument("--sgl-kernel-shim", default="flashinfer", choices=("flashinfer", "raise"),
                    help="with --stub-sgl-kernel: how the baselines' sgl_kernel calls are served")
    ap.add_argument("--stub-sgl-kernel", action="store_true")
    ap.add_argument("--device", default="cuda", help="cuda (the run), or cpu with --shape tiny (smoke test)")
    ap.add_argument("--shape", default="qwen3-4b", choices=sorted(SHAPES))
    ap.add_argument("--timeout", type=float, default=1500,
                    help="seconds for all engines together (each baseline gets what is left, minus --reserve)")
    ap.add_argument("--reserve", type=float, default=90,
                    help="seconds kept for the training-side log-probs after the engines")
    ap.add_argument("--repeat", type=int, default=6,
                    help="greedy jobs timed per engine (>= 1); the ones after the first run on radix-cached prompts, "
                         "and their median decode tokens/s (>= 5 of them by default) is reported next to the first job's")
    ap.add_argument("--moe-layers", type=int, default=MOE_LAYERS,
                    help="with --shape qwen3-30b-a3b: how many of its layers the checkpoint has")
    ap.add_argument("--fi-prebuild", action=argparse.BooleanOptionalAction, default=True,
                    help="with the flashinfer baseline on CUDA: build its FlashInfer modules in the background "
                         "while the tik engine runs (benchmarks.flashinfer_prebuild --only sglang)")
    ap.add_argument("--fi-prebuild-jobs", type=int, default=os.cpu_count() or 16,
                    help="ninja jobs of that build in total")
    ap.add_argument("--engine-arg", action="append", default=[], metavar="KEY=VALUE",
                    help="extra sglang.Engine argument for every engine, e.g. disable_prefill_cuda_graph=true")
    return ap


def main(argv=None) -> int:
    ap = build_parser()
    a = ap.parse_args(argv)
    if a.repeat < 1:
        ap.error(f"--repeat {a.repeat}: expected a number of greedy jobs >= 1")
    if a.moe_layers < 1:
        ap.error(f"--moe-layers {a.moe_layers}: expected a number of layers >= 1")
    if a.device == "cpu":  # before anything defines a @triton.jit function
        os.environ["TRITON_INTERPRET"] = "1"
    from areal_tik_plugin.models import SGLANG_TINY, build_model

    os.makedirs(a.out, exist_ok=True)
    extra = {}
    if a.stub_sgl_kernel:
        extra = {"PYTHONPATH": os.pathsep.join(x for x in (SC.gpu_stub_path(), os.getcwd(),
                                                           os.environ.get("PYTHONPATH", "")) if x),
                 "SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK": "1",
                 # the trimmed wheel's prebuilt Rust radix TreeCore fails on the GPU image's torch 2.11
                 # ("Unsupported TypeMeta in ATen"): SGLang's pure-Python TreeCore, same radix semantics
                 "SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND": os.environ.get("SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND", "python")}
    baselines = [x for x in a.baselines.split(",") if x]
    fi_pre = None
    if a.fi_prebuild and a.device == "cuda" and "flashinfer" in baselines:
        # the baseline engine's environment (below); started first: it runs beside the model build and tik
        fi_pre = start_fi_prebuild(a.out, {**os.environ, **extra, **_baseline_env(a)},
                                   a.timeout - a.reserve - 30, a.fi_prebuild_jobs)
    kind, shape = SHAPES[a.shape]
    if a.shape == "qwen3-30b-a3b":
        kind, shape = checkpoint_kwargs("qwen3-30b-a3b", layers=a.moe_layers)
    model = a.model_dir or os.path.join(tempfile.gettempdir(), f"tik-{kind}-{a.shape}-random")
    if not os.path.exists(os.path.join(model, "config.json")):
        t = time.time()
        build_model(model, kind, device=a.device, **{**SGLANG_TINY, **shape})
        print(f"built {model} in {time.time() - t:.0f} s", flush=True)
    ids = _prompts(a.batch, a.prefix, 100)
    temps = [(0.6, 0.8, 1.0, 1.2)[i % 4] for i in range(a.batch)]
    sp = lambda t: {"temperature": t, "max_new_tokens": a.new, "ignore_eos": True}  # noqa: E731
    # job 0 warms up (Triton JIT, allocator) on other prompts (no radix hits for the timed jobs) and is
    # neither timed nor compared; job 1 greedy (timed: tokens/s), job 2 sampled (tik only); then --repeat - 1
    # more greedy jobs (timed; prompts radix-cached by then)
    warm = {"input_ids": _prompts(a.batch, a.prefix, 100, seed=1),
            "sampling_params": {"temperature": 0.0, "max_new_tokens": min(a.new, 16), "ignore_eos": True}}
    greedy_job = {"input_ids": ids, "sampling_params": sp(0.0)}
    # every engine runs the same jobs in the same order (symmetric timing): the repeat median is over the
    # greedy jobs after the sampled one, for each engine alike
    tik_jobs = [warm, greedy_job, {"input_ids": ids, "sampling_params": [sp(t) for t in temps]}]
    tik_jobs += [greedy_job] * (a.repeat - 1)
    bench_jobs = list(tik_jobs)
    if a.device == "cuda":
        common = dict(device="cuda", chunked_prefill_size=a.chunk, max_running_requests=a.batch,
                      max_total_tokens=None, mem_fraction_static=0.6, disable_cuda_graph=False,
                      cuda_graph_max_bs_decode=a.batch)
    else:
        common = dict(device="cpu", chunked_prefill_size=a.chunk, max_running_requests=a.batch)
    for kv in a.engine_arg:
        k, v = kv.split("=", 1)
        common[k] = json.loads(v) if v[:1] in "0123456789-[{tfn\"" else v
    stats_dir = os.path.join(a.out, "stats")
    engines = [{"engine_kwargs": {k: v for k, v in SC.default_engine_kwargs(model, "tik", **common).items()
                                  if v is not None},
                "jobs": tik_jobs, "env": {"TIK_SGLANG_STATS": stats_dir}}]
    names = ["tik"]
    baseline_stack = {}
    for b in baselines:
        env = _baseline_env(a)
        fused = "sgl-kernel (installed)"
        if a.stub_sgl_kernel and a.sgl_kernel_shim == "flashinfer":
            fused = ("FlashInfer through devenv/gpu_stubs/sgl_kernel (TIK_SGL_KERNEL_SHIM=flashinfer): "
                     + ", ".join(f"sgl_kernel.{k} -> {m}.{f}" for k, (m, f) in _shim_map().items()))
        elif a.stub_sgl_kernel:
            fused = "SGLang's torch-native fused ops (SGLANG_FORCE_FUSED_OP_BACKEND=torch)"
        baseline_stack[b] = {"attention_backend": b, "fused_ops": fused,
                             "rope": "SGLang's own JIT kernel (sglang.kernels.ops.attention.rope)",
                             "cuda_graph": b != "torch_native"}
        kw = {k: v for k, v in SC.default_engine_kwargs(model, b, **common).items() if v is not None}
        if b == "torch_native":
            kw["disable_cuda_graph"] = True
        engines.append({"engine_kwargs": kw, "jobs": bench_jobs, "env": env})
        names.append(b)
    from areal_tik_plugin import evidence
    from areal_tik_plugin.runtime import loader

    impl = loader.get_implementation()
    report = {"model": model, "device": a.device, "batch": a.batch, "prefix": a.prefix, "new_tokens": a.new,
              "implementation": {"name": impl.name, "source_hash": impl.source_hash}, "env": evidence.environment(),
              "engine_args": {k: v for k, v in common.items()}, "argv": sys.argv[1:] if argv is None else list(argv),
              "backends": {}, "baseline_stack": baseline_stack,
              "timing": {"jobs": "the same list for every engine: warm-up, greedy, sampled, then repeat - 1 greedy",
                         "excluded": "job 0 (warm-up) for every engine",
                         "repeat_median": "greedy jobs after the sampled one (radix-cached prompts), every engine",
                         "n_repeat_median": a.repeat - 1}}
    results = []
    deadline = time.time() + a.timeout
    for name, eng_spec in zip(names, engines):  # one worker per engine: a failing baseline keeps tik's result
        left = deadline - time.time() - (a.reserve if name != "tik" else 0.0)
        if name == "flashinfer" and fi_pre is not None:
            # the engine would block on the same modules (FlashInfer's build locks) or compile them anew
            report["flashinfer_prebuild"] = pre = wait_fi_prebuild(fi_pre, left - 60)
            fi_pre = None
            print(f"flashinfer prebuild: {pre.get('seconds', '?')} s, baseline waited {pre['waited_s']} s; "
                  f"failed: {','.join(pre.get('failed', [])) or pre.get('error', 'none')[:200]}", flush=True)
            left = deadline - time.time() - a.reserve
        if name != "tik" and left < 30:
            report["backends"][name] = {"error": f"not run: {left:.0f} s left of --timeout {a.timeout:.0f}"}
            print(f"{name}: not run (no time left)", flush=True)
            continue
        with tempfile.TemporaryDirectory() as d:
            try:
                eng = SC.launch_worker({"engines": [eng_spec]}, d, timeout=left, extra_env=extra)["engines"][0]
            except RuntimeError as e:
                if name == "tik":
                    raise
                report["backends"][name] = {"error": str(e)[-3000:]}
                print(f"{name}: failed ({str(e).splitlines()[-1][:300]})", flush=True)
                continue
        results.append(eng)
        greedy = eng["jobs"][1]
        report["backends"][name] = {"startup_s": eng["startup_s"], "warmup_s": eng["jobs"][0]["seconds"],
                                    "job_seconds": [j["seconds"] for j in eng["jobs"][1:]],
                                    "greedy_tokens_per_s": a.batch * a.new / greedy["seconds"]}
        reps = [j["seconds"] for j in eng["jobs"][len(eng["jobs"]) - (a.repeat - 1):]] if a.repeat > 1 else []
        if reps:
            report["backends"][name]["greedy_repeat_seconds"] = reps
            report["backends"][name]["greedy_repeat_median_tokens_per_s"] = a.batch * a.new / statistics.median(reps)
        print(f"{name}: startup {eng['startup_s']:.0f} s, warm-up {eng['jobs'][0]['seconds']:.1f} s, "
              f"jobs {[round(j['seconds'], 1) for j in eng['jobs'][1:]]} s", flush=True)
    tik = results[0]
    reqs, lps = [], []
    for job, tt in zip(tik["jobs"][1:], ([1.0] * a.batch, temps)):
        for p, r, t in zip(ids, job["requests"], tt):
            reqs.append((p, r["tokens"], t))
            lps.append(r["logprobs"])
    train = SC.training_logprobs(model, reqs, device=a.device)
    bad = SC.bitwise_mismatches(lps, train)
    report["requests"] = len(reqs)
    report["bitwise_mismatching_requests"] = bad
    report["cached_tokens_second_round"] = [r["cached_tokens"] for r in tik["jobs"][2]["requests"]]
    report["shape"], report["model_kind"] = a.shape, kind
    report["ops"] = SC.summarize(SC.read_stats(stats_dir), moe=kind == "qwen3_moe")
    with open(os.path.join(a.out, "sglang_gpu_proof.json"), "w") as f:
        json.dump(report, f, indent=2)
    for name, b in report["backends"].items():
        if "error" in b:
            print(f"{name:<14} failed: {b['error'].splitlines()[-1][:200]}")
            continue
        rep_s = (f"  repeats (cached prompts) median {b['greedy_repeat_median_tokens_per_s']:.0f} tok/s"
                 if "greedy_repeat_median_tokens_per_s" in b else "")
        print(f"{name:<14} startup {b['startup_s']:.0f} s  greedy decode {b['greedy_tokens_per_s']:.0f} tok/s  "
              f"jobs {[round(x, 2) for x in b['job_seconds']]} s{rep_s}")
    print(f"bitwise: {len(reqs) - len(bad)}/{len(reqs)} requests identical; ops through ours: {report['ops']['ok']} "
          f"(missing {report['ops']['missing']}, other paths {report['ops']['other_paths']})")
    ok = not bad and report["ops"]["ok"]
    if ok and any("error" in b for b in report["backends"].values()):
        return 3  # the proof holds; a baseline measurement is missing
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
