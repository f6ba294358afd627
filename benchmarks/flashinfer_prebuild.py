"""JIT-build the FlashInfer kernels the baselines use, once and in parallel, before the benchmarks run
(GPU machine; nvcc + ninja there):

    python3 -m benchmarks.flashinfer_prebuild --out $OUT/fi_prebuild.json [--timeout 300] [--jobs 16]

Each job runs in its own process and builds its modules through the same factories the benchmarks call
(areal_tik_plugin.contract.attention / norm / rope / swiglu), so the module names and template arguments
match and the benchmarks find them in FlashInfer's JIT cache.

``--only sglang`` (the ``sgl_*`` jobs; benchmarks.sglang_gpu_proof starts it beside the tik engine) builds
the modules stock SGLang's ``--attention-backend flashinfer`` engine builds at start for the proof's
qwen3-4b shape (:data:`SGL_SHAPE`), through the wrappers SGLang's backend constructs, planned with the
arguments it passes (:func:`plan_like_sglang`), plus the FlashInfer ops its fused-op calls reach through the
sgl_kernel shim (TIK_SGL_KERNEL_SHIM=flashinfer); :func:`sglang_specs` names them, and each ``sgl_*`` job
checks afterwards that every one it names is compiled in the cache. A job that fails or outlives ``--timeout``
is recorded; ``--print-failed`` prints the comma list of failed job keys for ``--fi-failed``, which
makes the matching baselines record "not built" instead of compiling inside a timed run.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time

# job key -> the modules it builds (in order, one process); keys are what --fi-failed names
JOBS = {
    "rowops": ("norm", "rope", "activation"),
    "decode": ("decode",),
    "prefill_fa2": ("prefill_fa2", "decode_tc"),  # tensor-core decode runs the FA2 prefill kernels
    "prefill_fa3": ("prefill_fa3",),
    # SGLang's flashinfer backend (see plan_like_sglang / sglang_specs)
    "sgl_fa3": ("sgl_ragged",),
    "sgl_fa2": ("sgl_paged", "sgl_decode"),
    "sgl_ops": ("sgl_cascade", "sgl_norm", "sgl_activation", "sgl_sampling"),
}
# --only names that stand for several jobs
GROUPS = {"sglang": ("sgl_fa3", "sgl_fa2", "sgl_ops")}
# share of the ninja jobs per job key: the prefill modules have ~10 heavy translation units each
# (FA3's sm90 kernels the slowest), the others 1-3 light ones
WEIGHTS = {"rowops": 1, "decode": 1, "prefill_fa2": 3, "prefill_fa3": 4, "sgl_fa3": 4, "sgl_fa2": 3, "sgl_ops": 2}

# the proof's qwen3-4b shape as SGLang's flashinfer backend sees it (benchmarks.sglang_gpu_proof: bf16
# model and KV cache, page size 1, no sliding window, no logits soft cap)
SGL_SHAPE = {"num_qo_heads": 32, "num_kv_heads": 8, "head_dim": 128}


def sglang_process_setup() -> None:
    """Import SGLang before FlashInfer, as SGLang's engine processes do: ``import sglang`` points
    FlashInfer's JIT workspace at SGLang's cache (FLASHINFER_WORKSPACE_BASE, unless set), and FlashInfer
    fixes its workspace when imported -- a build made before that would land where the engine never looks."""
    if "flashinfer" in sys.modules:
        raise RuntimeError("sglang_process_setup: FlashInfer is imported already; its JIT workspace is fixed")
    import sglang  # noqa: F401


def sglang_tensor_cores(num_qo_heads: int, num_kv_heads: int, kv_dtype) -> bool:
    """Whether SGLang's flashinfer backend decodes with tensor cores (its own should_use_tensor_core)."""
    from sglang.srt.layers.attention.flashinfer_backend import should_use_tensor_core

    return should_use_tensor_core(kv_cache_dtype=kv_dtype, num_attention_heads=num_qo_heads,
                                  num_kv_heads=num_kv_heads)


def plan_like_sglang(part: str, device, tensor_cores: bool, dtype=None, num_qo_heads=32, num_kv_heads=8,
                     head_dim=128):
    """Construct the FlashInfer wrapper that SGLang 0.5.23's FlashInferAttnBackend constructs for ``part``
    and plan it with the arguments its call_begin_forward passes (a 2-request batch, page size 1, int32
    indptrs). Planning fetches the wrapper's JIT module (building it when the cache lacks it).

    * ``ragged``: BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD", backend="auto") (FA3 on sm90);
    * ``paged``: BatchPrefillWithPagedKVCacheWrapper(ws, "NHD", backend="fa2");
    * ``decode``: BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", backend="fa2", use_tensor_cores=...)."""
    import torch
    import flashinfer

    dt = dtype or torch.bfloat16
    i32 = dict(dtype=torch.int32, device=device)
    ws = torch.empty(128 << 20, dtype=torch.uint8, device=device)
    qo = torch.tensor([0, 5, 9], **i32)
    kv_indices, last_page = torch.arange(9, **i32), torch.ones(2, **i32)
    H, K, D = num_qo_heads, num_kv_heads, head_dim
    if part == "ragged":
        w = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD", backend="auto")
        w.begin_forward(qo, qo, H, K, D, q_data_type=dt)
    elif part == "paged":
        w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD", backend="fa2")
        w.begin_forward(qo, qo, kv_indices, last_page, H, K, D, 1, q_data_type=dt, kv_data_type=dt)
    elif part == "decode":
        w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", backend="fa2", use_tensor_cores=tensor_cores)
        w.begin_forward(qo, kv_indices, last_page, H, K, D, 1, data_type=dt, q_data_type=dt)
    else:
        raise ValueError(f"plan_like_sglang: part {part!r}; expected 'ragged', 'paged' or 'decode'")
    return w


def sglang_specs(tensor_cores: bool, sm90: bool = True, dtype=None, head_dim=128, keys=None) -> dict:
    """module key of the sgl_* jobs -> the FlashInfer JitSpecs it builds (their ``name`` is the module URI
    in the JIT cache). ``sm90``: the ragged prefill's backend "auto" resolves to FA3 (Hopper). ``keys``:
    only these (generating a spec writes its sources: a job names only its own while others build)."""
    import torch
    from flashinfer.jit import activation, cascade, norm, sampling
    from flashinfer.jit.attention import modules as M

    dt = dtype or torch.bfloat16
    # (q, kv, o dtypes, index dtype, head_dim qk / vo, pos-encoding NONE, sliding window, soft cap,
    # fp16 qk reduction): what the wrappers' plan passes for SGLang's arguments
    args = (dt, dt, dt, torch.int32, head_dim, head_dim, 0, False, False, False)
    fa2 = lambda: M.gen_batch_prefill_module("fa2", *args)  # noqa: E731
    make = {
        "sgl_ragged": lambda: M.gen_batch_prefill_module("fa3", *args) if sm90 else fa2(),
        "sgl_paged": fa2,
        # tensor-core decode runs the FA2 prefill kernels
        "sgl_decode": lambda: fa2() if tensor_cores else M.gen_batch_decode_module(*args[:9]),
        "sgl_cascade": cascade.gen_cascade_module,  # merge_state: ragged + paged halves of a cached prefix
        "sgl_norm": norm.gen_norm_module,  # shim: rmsnorm, fused_add_rmsnorm
        "sgl_activation": lambda: activation.gen_act_and_mul_module("silu"),  # shim: silu_and_mul
        "sgl_sampling": sampling.gen_sampling_module,  # shim: top-k / top-p renorm; SGLang's sampler
    }
    return {k: [f()] for k, f in make.items() if keys is None or k in keys}


def max_jobs(jobs: list[str], total: int) -> dict:
    """ninja jobs per job key, proportional to WEIGHTS, at least 1 each."""
    w = sum(WEIGHTS[j] for j in jobs) or 1
    return {j: max(1, round(total * WEIGHTS[j] / w)) for j in jobs}


def _build(module: str) -> None:
    import torch

    from areal_tik_plugin.contract import attention as att
    from areal_tik_plugin.contract import baselines as B

    fi = B.flashinfer()
    dev, bf = "cuda", torch.bfloat16
    if module == "norm":
        x, w = torch.randn(4, 2560, device=dev, dtype=bf), torch.ones(2560, device=dev, dtype=bf)
        fi.norm.rmsnorm(x, w, 1e-6)
        fi.norm.fused_add_rmsnorm(x, x.clone(), w, 1e-6)
    elif module == "rope":
        q, k = torch.randn(4, 32 * 128, device=dev, dtype=bf), torch.randn(4, 8 * 128, device=dev, dtype=bf)
        pos = torch.arange(4, device=dev)
        cache = torch.randn(16, 128, device=dev, dtype=torch.float32)
        fi.rope.apply_rope_with_cos_sin_cache_inplace(pos, q, k, 128, cache, is_neox=True)
        fi.rope.apply_rope_pos_ids(q.view(4, 32, 128), k.view(4, 8, 128), pos.to(torch.int32), rope_theta=1e6)
    elif module == "activation":
        fi.activation.silu_and_mul(torch.randn(4, 2 * 768, device=dev, dtype=bf))
    elif module in ("decode", "decode_tc"):
        q = torch.randn(2, 32, 128, device=dev, dtype=bf)
        for page in att.FI_DECODE_PAGES:
            att._fi_decode(q, [100, 37], page, module == "decode_tc", 8, 128)()
    elif module in ("sgl_ragged", "sgl_paged", "sgl_decode"):
        D = SGL_SHAPE["head_dim"]
        tc = sglang_tensor_cores(SGL_SHAPE["num_qo_heads"], SGL_SHAPE["num_kv_heads"], bf)
        plan_like_sglang(module.split("_")[1], dev, tc, bf, **SGL_SHAPE)
        from flashinfer.utils import is_sm90a_supported

        _check_compiled(sglang_specs(tc, is_sm90a_supported(torch.device(dev)), bf, D, keys=(module,))[module])
    elif module == "sgl_cascade":
        import flashinfer.cascade

        v = torch.randn(4, 32, 128, device=dev, dtype=bf)
        s_ = torch.randn(4, 32, device=dev, dtype=torch.float32)
        flashinfer.cascade.merge_state(v, s_, v.clone(), s_.clone())
        _check_compiled(sglang_specs(True, keys=(module,))[module])
    elif module in ("sgl_norm", "sgl_activation", "sgl_sampling"):
        if module == "sgl_sampling":
            import flashinfer.sampling

            probs = torch.softmax(torch.randn(4, 1000, device=dev), -1)
            flashinfer.sampling.top_k_renorm_probs(probs, 20)
            flashinfer.sampling.top_p_renorm_probs(probs, 0.9)
            flashinfer.sampling.top_k_top_p_sampling_from_probs(probs, 20, 0.9)
        else:
            _build(module.split("_", 1)[1])
        _check_compiled(sglang_specs(True, keys=(module,))[module])
    elif module.startswith("prefill_"):
        lens = [100, 37]
        q = torch.randn(sum(lens), 32, 128, device=dev, dtype=bf)
        k, v = (torch.randn(sum(lens), 8, 128, device=dev, dtype=bf) for _ in range(2))
        att._fi_ragged_prefill(module.split("_")[1], q, k, v, lens, 32, 8, 128)()
    else:
        raise ValueError(f"unknown FlashInfer module {module!r}; expected one of {sorted(sum(JOBS.values(), ()))}")
    torch.cuda.synchronize()


# FA2 paged prefill resolves its KV-stride specialization from the tensors at run time (FlashInfer's
# jit.attention.modules URI suffixes): the module built carries one of these after the planned name
FA2_STRIDE_SUFFIXES = ("_kv_stride_equal", "_kv_stride_independent", "_paged_kv_stride_independent")


def _compiled(sp) -> bool:
    if sp.is_compiled:
        return True
    lib = str(sp.get_library_path())
    return any(os.path.exists(lib.replace(sp.name, sp.name + sfx)) for sfx in FA2_STRIDE_SUFFIXES)


def _check_compiled(specs) -> None:
    missing = [sp.name for sp in specs if not _compiled(sp)]
    if missing:
        raise RuntimeError(f"built, yet not in the JIT cache under the names SGLang's backend asks for: {missing}")


def expand(only: str) -> list[str]:
    """--only's comma list, group names (:data:`GROUPS`) replaced by their jobs."""
    jobs = []
    for j in (x for x in only.split(",") if x):
        jobs += list(GROUPS.get(j, (j,)))
    return jobs


def _child(job: str) -> int:
    if job.startswith("sgl_"):
        sglang_process_setup()
    out = {}
    for m in JOBS[job]:
        t0 = time.time()
        try:
            _build(m)
            out[m] = {"ok": True, "seconds": round(time.time() - t0, 1)}
        except Exception as e:
            out[m] = {"ok": False, "seconds": round(time.time() - t0, 1), "error": f"{type(e).__name__}: {e}"[-600:]}
    print("PREBUILD_RESULT " + json.dumps(out), flush=True)
    return 0 if all(v["ok"] for v in out.values()) else 1


def failed_keys(result: dict) -> list[str]:
    """Job keys whose build failed, timed out, or did not report (what --fi-failed lists)."""
    return sorted(k for k, v in result.get("jobs", {}).items() if not v.get("ok"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.flashinfer_prebuild")
    ap.add_argument("--out", required=True)
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds for all jobs together")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 16, help="ninja jobs in total")
    ap.add_argument("--only", default=",".join(j for j in JOBS if not j.startswith("sgl_")),
                    help=f"comma list from {list(JOBS)} or {list(GROUPS)}")
    ap.add_argument("--nice", type=int, default=0, help="niceness of the build processes (0: as started)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        return _child(a.child)
    jobs = expand(a.only)
    bad = [j for j in jobs if j not in JOBS]
    if bad:
        raise SystemExit(f"--only: unknown jobs {bad}; expected from {list(JOBS)} or {list(GROUPS)}")
    if a.nice:
        os.nice(a.nice)  # the children (and their ninja / nvcc) inherit it
    mj = max_jobs(jobs, a.jobs)
    t0 = time.time()
    procs = {j: subprocess.Popen([sys.executable, "-m", "benchmarks.flashinfer_prebuild", "--out", a.out, "--child", j],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                                 env={**os.environ, "MAX_JOBS": str(mj[j])}) for j in jobs}
    result = {"jobs": {}, "max_jobs": mj}
    for j, p in procs.items():
        left = max(1.0, a.timeout - (time.time() - t0))
        try:
            log, _ = p.communicate(timeout=left)
        except subprocess.TimeoutExpired:
            # the job's whole process group: its ninja / nvcc children must not compete with the benchmarks
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            log, _ = p.communicate()
            result["jobs"][j] = {"ok": False, "error": f"timed out after {a.timeout:.0f} s", "log_tail": log[-1500:]}
            continue
        line = next((ln for ln in log.splitlines() if ln.startswith("PREBUILD_RESULT ")), None)
        mods = json.loads(line.split(" ", 1)[1]) if line else {}
        result["jobs"][j] = {"ok": p.returncode == 0 and bool(mods), "modules": mods, "rc": p.returncode,
                             "log_tail": log[-1500:] if p.returncode else ""}
    result["seconds"] = round(time.time() - t0, 1)
    result["failed"] = failed_keys(result)
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"flashinfer prebuild: {result['seconds']} s; failed: {','.join(result['failed']) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
