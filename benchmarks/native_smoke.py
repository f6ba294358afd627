"""GPU smoke of the native host path: its contract checks for SwiGLU and RMSNorm (every model shape) and
host time per call at T=1 (native / Triton's launch path / HF eager), JSON to --out, a table last.

``python benchmarks/native_smoke.py --out DIR`` (CUDA machine)."""

from __future__ import annotations

import argparse
import json
import os
import sys


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    a = ap.parse_args(argv)
    import torch
    import torch.nn.functional as F

    from areal_tik_plugin.runtime import loader, native
    from areal_tik_plugin.contract import norm as N
    from areal_tik_plugin.contract import swiglu as S
    from areal_tik_plugin.contract._rowops import MODELS, native_host_row, rand
    from areal_tik_plugin.contract.suite import Recorder
    from areal_tik_plugin.ops import rms_norm, swiglu_fused

    rec = Recorder("native")
    for name, cfg in MODELS.items():
        rec.run(f"swiglu[{name}]", S._check_native, rec, name, cfg["inter"])
        rec.run(f"norm[{name}]", N._check_native, rec, name, cfg["hidden"], cfg["hq"], cfg["hkv"], cfg["d"], cfg["eps"])
    from areal_tik_plugin.contract import gemm as G

    rec.run("gemm", G._check_native, rec)
    act = S._hf_act()
    for name, cfg in MODELS.items():
        I, H = cfg["inter"], cfg["hidden"]
        for T in (1, 256):
            gu = rand(T, 2 * I, seed=T)
            g, u = gu[:, :I], gu[:, I:]
            native_host_row(rec, f"swiglu[{name}/T{T}]", lambda: swiglu_fused(gu),
                            lambda: loader.current_module("swiglu").forward_fused(gu), lambda: act(g) * u)
            x, w = rand(T, H, seed=T), N._w(H, torch.bfloat16)
            hf = N._hf_norm(H, cfg["eps"], w)
            native_host_row(rec, f"rmsnorm[{name}/T{T}]", lambda: rms_norm(x, w, cfg["eps"]),
                            lambda: loader.current_module("rmsnorm").forward(x, w, cfg["eps"]), lambda: hf(x))
    def native_off(fn):
        def g():
            saved, native._MOD = native._MOD, None
            try:
                return fn()
            finally:
                native._MOD = saved
        return g

    for name, cfg in MODELS.items():  # training forward (autograd): native inside autograd's forward vs off
        I, H = cfg["inter"], cfg["hidden"]
        gu = rand(1, 2 * I, seed=3).requires_grad_()
        x, w = rand(1, H, seed=4).requires_grad_(), N._w(H, torch.bfloat16)
        f1 = lambda: swiglu_fused(gu)  # noqa: E731
        f2 = lambda: rms_norm(x, w, cfg["eps"])  # noqa: E731
        native_host_row(rec, f"swiglu_autograd[{name}/T1]", f1, native_off(f1))
        native_host_row(rec, f"rmsnorm_autograd[{name}/T1]", f2, native_off(f2))
    from areal_tik_plugin import bench
    from areal_tik_plugin.ops import linear

    gemm = loader.current_module("gemm")
    cold = []
    for layer in ("qkv", "o", "gate_up", "down", "lm_head"):
        N, K, _ = G.SHAPES[("qwen3-4b", layer)]
        w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * K ** -0.5
        for M in (1, 8, 64):
            x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
            f_nat, f_py, f_cub = (lambda: linear(x, w)), (lambda: gemm.linear(x, w)), (lambda: F.linear(x, w))
            if M in (1, 8):
                native_host_row(rec, f"linear[qwen3-4b/{layer}/M{M}]", f_nat, f_py, f_cub)
            row = {"native_cold_us": bench.time_cold_us(f_nat), "python_cold_us": bench.time_cold_us(f_py),
                   "cublas_cold_us": bench.time_cold_us(f_cub)}
            row["native_vs_cublas_cold"] = row["cublas_cold_us"] / row["native_cold_us"]
            row["python_vs_cublas_cold"] = row["cublas_cold_us"] / row["python_cold_us"]
            rec.bench(f"linear_cold[qwen3-4b/{layer}/M{M}]", **row)
            cold.append(row)
    fails = [c for c in rec.checks if not c["passed"]]
    out = {"checks": rec.checks, "benchmarks": rec.benchmarks, "errors": rec.errors, "stats": native.stats(),
           "source_hash": loader.get_implementation().source_hash}
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "native_smoke.json"), "w") as f:
        json.dump(out, f, indent=1, default=str)
    for f_ in fails[:20]:
        print("FAIL", json.dumps(f_, default=str)[:400])
    for e in rec.errors[:10]:
        print("ERROR", e[:400])
    st = native.stats()
    print(f"native stats: hits {st.get('hits')} misses {st.get('misses')} not_handled {st.get('not_handled')} "
          f"plans {len(st.get('plans', []))} refused {sum(p['refused'] for p in st.get('plans', []))}")
    print(f"{'row':44s} {'native':>8s} {'python':>8s} {'base':>8s}  us (host/call; linear_cold: do_bench cold)")
    for b in rec.benchmarks:
        if "native_host_us" in b:
            print(f"{b['name']:44s} {b['native_host_us']:8.1f} {b['python_host_us']:8.1f} {b.get('hf_host_us', 0):8.1f}")
        else:
            print(f"{b['name']:44s} {b['native_cold_us']:8.1f} {b['python_cold_us']:8.1f} {b['cublas_cold_us']:8.1f}")
    import math

    gm = lambda k: math.exp(sum(math.log(r[k]) for r in cold) / len(cold))  # noqa: E731
    print(f"GEMM cold vs cuBLAS, Qwen3-4B M 1/8/64: native {gm('native_vs_cublas_cold'):.3f}, "
          f"Triton's launch {gm('python_vs_cublas_cold'):.3f}")
    print(f"checks {len(rec.checks) - len(fails)}/{len(rec.checks)} passed")
    return 1 if fails or rec.errors else 0


if __name__ == "__main__":
    sys.exit(main())
