"""GPU contract checks and benchmarks for SwiGLU (fused gate_up and separate gate/up) at the MLP
widths of Qwen2.5-1.5B (8960), Qwen3-4B (9728) and Qwen3-30B-A3B experts (768).

Checks (bitwise): fused == separate (views and copies); rows of a 16384-token call == the same rows
in calls of 1..4096 tokens and shuffled; free launch knobs (block, warps) do not change bits;
CUDA-graph replay == eager. Accuracy vs fp64 and not worse than HF ``act_fn(gate) * up``; gradients.
Benchmarks: fused vs the strongest of FlashInfer silu_and_mul, Liger SiLU-mul (contiguous gate / up) and
torch.compile of HF's act_fn(gate) * up (eager HF as context), TB/s and shares of spec / measured copy.
"""

from __future__ import annotations

import torch

from areal_tik_plugin.runtime import loader
from areal_tik_plugin.contract._rowops import (BENCH_T, MODELS, QUICK_BENCH_T, add_shares, check_native,
                                               check_native_autograd, copy_of, graph_vs_eager, native_host_row,
                                               rand, rel_l2, row_slices, shuffled_rows, streamed, tbps)
from areal_tik_plugin.contract import baselines as B
from areal_tik_plugin.ops import swiglu, swiglu_fused

N_FULL = 16384   # rows of the full-sequence call
N_ACC = 4096     # rows of the accuracy / free-knob checks
N_BWD = 1024     # rows of the gradient checks
TOL = {torch.bfloat16: (1e-5, 2 ** -8), torch.float16: (1e-5, 2 ** -10), torch.float32: (2e-6, 4e-6)}  # GPU exp: ex2.approx
TOL_GRAD = {torch.bfloat16: 1e-2, torch.float32: 1e-5}


def _ref(g, u):
    g = g.double()
    return g * torch.sigmoid(g) * u.double()


def _hf_act():
    from transformers.activations import ACT2FN

    return ACT2FN["silu"]


def _check_rows(rec, tag, I, dtype):
    gu = rand(N_FULL, 2 * I, dtype=dtype, scale=2.0, seed=I)
    full = swiglu_fused(gu)
    rec.bitwise(f"fused_eq_separate_views[{tag}]", swiglu(gu[:, :I], gu[:, I:]), full)
    rec.bitwise(f"fused_eq_separate_copies[{tag}]", swiglu(gu[:, :I].contiguous(), gu[:, I:].contiguous()), full)
    for t, sl in row_slices(N_FULL, (1, 7, 64, 257, 1024, 4096)):
        rec.bitwise(f"rows[{tag}/{t}]", swiglu_fused(gu[sl]), full[sl])
    idx = shuffled_rows(N_FULL, 1000)
    rec.bitwise(f"rows_shuffled1000[{tag}]", swiglu_fused(gu[idx]), full[idx])
    gg = gu[:257].clone().requires_grad_()
    rec.bitwise(f"autograd_forward_eq_inference[{tag}]", swiglu_fused(gg).detach(), full[:257])


def _check_free_knobs(rec, I):
    from areal_tik_plugin.runtime.loader import get_implementation

    sw = get_implementation().module("swiglu")
    gu = rand(N_ACC, 2 * I, scale=2.0, seed=2)
    ref = sw.forward_fused(gu)
    saved = (sw.BLOCK, sw.WARPS)
    try:
        for b, w in ((256, 1), (512, 2), (2048, 4), (4096, 8)):
            sw.BLOCK, sw.WARPS = b, w
            rec.bitwise(f"free_knobs[I{I}/b{b}/w{w}]", sw.forward_fused(gu), ref)
    finally:
        sw.BLOCK, sw.WARPS = saved


def _check_graph(rec, I):
    B = 64
    gu = rand(B, 2 * I, seed=3)

    def refresh(i):
        gu.copy_(rand(B, 2 * I, scale=2.0, seed=500 + i))

    graph_vs_eager(rec, f"graph_swiglu_fused[I{I}]", lambda: swiglu_fused(gu), refresh, lambda: swiglu_fused(gu))


def _check_accuracy(rec, I):
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        g, u = rand(N_ACC, I, dtype=dtype, scale=3.0, seed=4), rand(N_ACC, I, dtype=dtype, seed=5)
        out = swiglu(g, u)
        ref = _ref(g, u)
        tag = f"I{I}/{str(dtype)[6:]}"
        rec.close(f"accuracy_vs_fp64[{tag}]", out, ref, atol=TOL[dtype][0], rtol=TOL[dtype][1])
        if dtype != torch.float32:
            try:
                hf = _hf_act()(g) * u
                e_o, e_h = float((out.double() - ref).abs().max()), float((hf.double() - ref).abs().max())
                rec.check(f"error_not_worse_than_hf[{tag}]", e_o <= e_h, ours=e_o, hf=e_h)
            except ImportError as e:
                rec.check(f"error_not_worse_than_hf[{tag}]", True, skipped=f"transformers unavailable: {e}"[:200])


def _check_backward(rec, I):
    for dtype in (torch.bfloat16, torch.float32):
        gu = rand(N_BWD, 2 * I, dtype=dtype, scale=3.0, seed=6).requires_grad_()
        dy = rand(N_BWD, I, dtype=dtype, seed=7)
        (d,) = torch.autograd.grad((swiglu_fused(gu).float() * dy.float()).sum(), (gu,))
        g64 = gu.detach().double().requires_grad_()
        (r,) = torch.autograd.grad((_ref(g64[:, :I], g64[:, I:]) * dy.double()).sum(), (g64,))
        rel = rel_l2(d, r)
        rec.check(f"grad_gate_up[I{I}/{str(dtype)[6:]}]", rel < TOL_GRAD[dtype], rel_l2=rel)


NATIVE_T = (1, 3, 17, 256, 4097)


def _check_native(rec, name, I):
    """Public calls served by the native host path == the kernel module's forward (Triton's launch)."""
    impl = loader.current_module("swiglu")
    for T in NATIVE_T:
        for dt in ((torch.bfloat16, torch.float32) if T == 3 else (torch.bfloat16,)):
            gu = rand(T, 2 * I, dtype=dt, scale=2.0, seed=T)
            g, u = gu[:, :I], gu[:, I:]
            tag = f"{name}/T{T}/{str(dt)[6:]}"
            check_native(rec, f"fused/{tag}", lambda: swiglu_fused(gu), lambda: impl.forward_fused(gu))
            check_native(rec, f"separate/{tag}", lambda: swiglu(g, u), lambda: impl.forward(g, u))
    for T in (1, 17):
        gu0 = rand(T, 2 * I, scale=2.0, seed=T + 7)
        check_native_autograd(rec, f"fused/{name}/T{T}", lambda: (gu0.clone().requires_grad_(),), swiglu_fused)
        check_native_autograd(rec, f"separate/{name}/T{T}",
                              lambda: (gu0[:, :I].clone().requires_grad_(), gu0[:, I:].clone().requires_grad_()), swiglu)


def run_checks(rec, quick: bool = False) -> None:
    torch.manual_seed(0)
    models = list(MODELS.items())[:1] if quick else list(MODELS.items())
    for name, cfg in models:
        I = cfg["inter"]
        for dtype in ((torch.bfloat16,) if quick else (torch.bfloat16, torch.float16)):
            rec.run(f"rows[{name}/{str(dtype)[6:]}]", _check_rows, rec, f"{name}/{str(dtype)[6:]}", I, dtype)
        rec.run(f"free_knobs[{name}]", _check_free_knobs, rec, I)
        rec.run(f"native[{name}]", _check_native, rec, name, I)
        rec.run(f"graph[{name}]", _check_graph, rec, I)
        rec.run(f"accuracy[{name}]", _check_accuracy, rec, I)
        rec.run(f"backward[{name}]", _check_backward, rec, I)


def run_bench(rec, quick: bool = False) -> None:
    """Ours (fused gate_up in, one pass) vs the strongest of FlashInfer's ``silu_and_mul`` on the same
    fused tensor (what sgl-kernel ships; SGLang's MLP calls it), Liger's SiLU-mul fed the separate
    contiguous gate / up tensors HF's two projections produce (no copies), and ``torch.compile`` of HF's
    ``act_fn(gate) * up``; eager HF as labelled context."""
    torch.manual_seed(0)
    ratios, rows = {}, []
    try:
        act = _hf_act()
    except Exception as e:
        rec.errors.append(f"hf baseline: {type(e).__name__}: {e}"[:300])
        act = None
    Ts = QUICK_BENCH_T if quick else BENCH_T
    native_rows = []
    fim = B.flashinfer_or_none()  # resolved once: no lookup inside a timed call
    for name, cfg in MODELS.items():
        I = cfg["inter"]
        c_hf = B.try_compiled((lambda g, u: act(g) * u) if act else None, "act_fn(gate) * up")
        for T in Ts:
            gu = rand(T, 2 * I, scale=2.0, seed=T)
            g, u = gu[:, :I].contiguous(), gu[:, I:].contiguous()  # HF: gate_proj(x), up_proj(x): two tensors

            def fi():
                return fim.activation.silu_and_mul(gu)

            def lg():
                from liger_kernel.ops.swiglu import LigerSiLUMulFunction

                return lambda: LigerSiLUMulFunction.apply(g, u)

            base = B.collect(rec, "swiglu", {
                "flashinfer.activation.silu_and_mul": lambda: (B.flashinfer("rowops"), fi)[1],
                "liger_kernel.ops.swiglu.LigerSiLUMulFunction (contiguous gate, up)": lambda: (B.liger(), lg())[1],
                "torch.compile(transformers ACT2FN['silu'](gate) * up)":
                    lambda: B.call_or_raise((lambda: c_hf(g, u)) if callable(c_hf) else c_hf),
            })
            nbytes = 3 * T * I * 2
            row = B.compare(rec, f"swiglu[{name}/T{T}]", lambda: swiglu_fused(gu), base,
                            {"eager_hf": (lambda: act(g) * u)} if act else None, T=T, I=I, bytes=nbytes)
            ours = row["ours"]
            if T >= 4096:
                streamed(rec, "swiglu/ours", ours, nbytes, lambda i: (lambda gu=copy_of(gu, i): swiglu_fused(gu)))
            row["ours_bw"] = bw = tbps(nbytes, ours)
            if bw:
                row["ours_share"] = B.shares(bw.get("graph_tbps"), B.measured_copy_tbps())
            if T >= 4096:
                add_shares(ratios, bw, T)
            rows.append(row)
            if T <= 256:
                impl = loader.current_module("swiglu")
                h = native_host_row(rec, f"swiglu[{name}/T{T}]", lambda: swiglu_fused(gu),
                                    lambda: impl.forward_fused(gu), (lambda: act(g) * u) if act else None)
                native_rows.append(h)
    B.summarize(rec, rows)
    for k, v in ratios.items():
        rec.summarize(k, v)
    for k in ("native_vs_hf_host", "native_vs_python_host"):
        rec.summarize(k, [h.get(k) for h in native_rows])
