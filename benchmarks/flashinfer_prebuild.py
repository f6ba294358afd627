"""JIT-build the FlashInfer kernels the baselines use, once and in parallel, before the benchmarks run
(GPU machine; nvcc + ninja there):

    python3 -m benchmarks.flashinfer_prebuild --out $OUT/fi_prebuild.json [--timeout 300] [--jobs 16]

Each job runs in its own process and builds its modules through the same factories the benchmarks call
(areal_tik_plugin.contract.attention / norm / rope / swiglu), so the module names and template arguments
match and the benchmarks find them in FlashInfer's JIT cache. A job that fails or outlives ``--timeout``
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
}
# share of the ninja jobs per job key: the prefill modules have ~10 heavy translation units each
# (FA3's sm90 kernels the slowest), the others 1-3 light ones
WEIGHTS = {"rowops": 1, "decode": 1, "prefill_fa2": 3, "prefill_fa3": 4}


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
    elif module.startswith("prefill_"):
        lens = [100, 37]
        q = torch.randn(sum(lens), 32, 128, device=dev, dtype=bf)
        k, v = (torch.randn(sum(lens), 8, 128, device=dev, dtype=bf) for _ in range(2))
        att._fi_ragged_prefill(module.split("_")[1], q, k, v, lens, 32, 8, 128)()
    else:
        raise ValueError(f"unknown FlashInfer module {module!r}; expected one of {sorted(sum(JOBS.values(), ()))}")
    torch.cuda.synchronize()


def _child(job: str) -> int:
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
    ap.add_argument("--only", default=",".join(JOBS), help=f"comma list from {list(JOBS)}")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        return _child(a.child)
    jobs = [j for j in a.only.split(",") if j]
    bad = [j for j in jobs if j not in JOBS]
    if bad:
        raise SystemExit(f"--only: unknown jobs {bad}; expected from {list(JOBS)}")
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
