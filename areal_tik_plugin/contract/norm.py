"""GPU contract checks and benchmarks for the RMSNorm family (hidden norm, per-head Q/K norm, fused
residual + norm) at the shapes of Qwen2.5-1.5B, Qwen3-4B and Qwen3-30B-A3B.

Checks (bitwise): rows of a 16384-token call == the same rows computed in calls of 1..16384 tokens
at the start / middle / end and shuffled; fused residual == rms_norm(x + residual) and its new
residual == torch's add; per-head norm on a strided QKV slice == contiguous == flattened rows
(SGLang's layout) == one decode token; CUDA-graph replay == eager. Accuracy vs fp64 (and not worse
than HF's Qwen3RMSNorm); gradients vs fp64.
Benchmarks: vs the strongest of FlashInfer's norm kernels, Liger-Kernel and torch.compile of HF's
Qwen3RMSNorm (each named; eager HF as context), achieved TB/s and its share of spec / measured copy.
"""

from __future__ import annotations

import torch

from areal_tik_plugin.runtime import loader
from areal_tik_plugin.contract._rowops import (BENCH_T, DEV, MODELS, QUICK_BENCH_T, add_shares, check_native,
                                               check_native_autograd, native_host_row, copy_of, graph_vs_eager,
                                               rand, rel_l2, row_slices, shuffled_rows, streamed, tbps)
from areal_tik_plugin.contract import baselines as B
from areal_tik_plugin.ops import qk_rms_norm, rms_norm, rms_norm_residual

N_FULL = 16384   # rows of the full-sequence call
N_QK = 4096      # tokens of the per-head norm checks
N_ACC = 4096     # rows of the accuracy checks
N_BWD = 1024     # rows of the gradient checks
TOL = {torch.bfloat16: (1e-5, 2 ** -7), torch.float16: (1e-5, 2 ** -10), torch.float32: (1e-6, 1e-5)}
TOL_GRAD = {torch.bfloat16: 1e-2, torch.float16: 2e-3, torch.float32: 1e-5}


def _w(H, dtype, seed=1):
    return (1 + 0.2 * rand(H, dtype=torch.float32, seed=seed)).to(dtype)


def _ref(x, w, eps):
    x64 = x.double()
    return w.double() * (x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps))


def _hf_norm(H, eps, w):
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    m = Qwen3RMSNorm(H, eps).to(device=DEV, dtype=w.dtype)
    with torch.no_grad():
        m.weight.copy_(w)
    m.weight.requires_grad_(False)  # inference baseline: no autograd recording
    return m


# ------------------------------------------------------------------------------------------------
# contract checks
# ------------------------------------------------------------------------------------------------
def _check_rows(rec, tag, H, dtype, eps):
    x = rand(N_FULL, H, dtype=dtype, scale=2.0, seed=H)
    w = _w(H, dtype)
    full = rms_norm(x, w, eps)
    for t, sl in row_slices(N_FULL):
        rec.bitwise(f"rows[{tag}/{t}]", rms_norm(x[sl], w, eps), full[sl])
    idx = shuffled_rows(N_FULL, 1000)
    rec.bitwise(f"rows_shuffled1000[{tag}]", rms_norm(x[idx], w, eps), full[idx])
    rec.bitwise(f"rows_strided_view[{tag}]", rms_norm(x[1::3], w, eps), full[1::3])
    r = rand(N_FULL, H, dtype=dtype, scale=3.0, seed=H + 1)
    y, nr = rms_norm_residual(x, r, w, eps)
    rec.bitwise(f"residual_new_eq_torch_add[{tag}]", nr, x + r)
    rec.bitwise(f"residual_fused_eq_unfused[{tag}]", y, rms_norm(x + r, w, eps))
    for t, sl in row_slices(N_FULL, (1, 7, 257, 4096)):
        y2, nr2 = rms_norm_residual(x[sl], r[sl], w, eps)
        rec.bitwise(f"residual_rows[{tag}/{t}]", y2, y[sl])
        rec.bitwise(f"residual_new_rows[{tag}/{t}]", nr2, nr[sl])
    xg = x[:257].clone().requires_grad_()
    rec.bitwise(f"autograd_forward_eq_inference[{tag}]", rms_norm(xg, w, eps).detach(), full[:257])


def _check_qk_norm(rec, tag, hq, hkv, d, eps):
    T = N_QK
    qkv = rand(T, (hq + 2 * hkv) * d, scale=2.0, seed=hq)
    q = qkv[:, : hq * d].view(T, hq, d)
    k = qkv[:, hq * d:(hq + hkv) * d].view(T, hkv, d)
    wq, wk = _w(d, torch.bfloat16, 3), _w(d, torch.bfloat16, 4)
    yq, yk = rms_norm(q, wq, eps), rms_norm(k, wk, eps)
    rec.bitwise(f"qnorm_view_eq_contiguous[{tag}]", rms_norm(q.contiguous(), wq, eps), yq)
    rec.bitwise(f"qnorm_eq_flat_rows[{tag}]", rms_norm(q.reshape(-1, d).contiguous(), wq, eps).view(T, hq, d), yq)
    rec.bitwise(f"knorm_eq_flat_rows[{tag}]", rms_norm(k.reshape(-1, d).contiguous(), wk, eps).view(T, hkv, d), yk)
    for t, sl in row_slices(T, (1, 7, 257)):
        rec.bitwise(f"qnorm_tokens[{tag}/{t}]", rms_norm(q[sl], wq, eps), yq[sl])
        rec.bitwise(f"knorm_tokens[{tag}/{t}]", rms_norm(k[sl], wk, eps), yk[sl])
    yref = _ref(q.float(), wq, eps)
    rec.close(f"qnorm_accuracy[{tag}]", yq, yref, atol=TOL[torch.bfloat16][0], rtol=TOL[torch.bfloat16][1])
    # q_norm + k_norm in one launch (rollout) over the adjacent q and k heads == the two calls
    qk = qkv[:, :(hq + hkv) * d].view(T, hq + hkv, d)
    y2 = qk_rms_norm(qk, wq, wk, hq, eps)
    rec.bitwise(f"qk_one_launch_q[{tag}]", y2[:, :hq], yq)
    rec.bitwise(f"qk_one_launch_k[{tag}]", y2[:, hq:], yk)
    for t, sl in row_slices(T, (1, 7)):
        rec.bitwise(f"qk_one_launch_tokens[{tag}/{t}]", qk_rms_norm(qk[sl], wq, wk, hq, eps), y2[sl])


def _check_graph(rec, H, eps):
    B = 64
    x = rand(B, H, seed=5)
    r = rand(B, H, seed=6)
    w = _w(H, torch.bfloat16)

    def refresh(i):
        x.copy_(rand(B, H, seed=100 + i))
        r.copy_(rand(B, H, seed=200 + i))

    graph_vs_eager(rec, f"graph_rms_norm[H{H}]", lambda: rms_norm(x, w, eps), refresh, lambda: rms_norm(x, w, eps))
    graph_vs_eager(rec, f"graph_rms_norm_residual[H{H}]", lambda: rms_norm_residual(x, r, w, eps), refresh,
                   lambda: rms_norm_residual(x, r, w, eps))


def _check_accuracy(rec, H, eps):
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        x = rand(N_ACC, H, dtype=dtype, scale=2.0, seed=7)
        w = _w(H, dtype)
        y = rms_norm(x, w, eps)
        ref = _ref(x, w, eps)
        atol, rtol = TOL[dtype]
        tag = f"H{H}/{str(dtype)[6:]}"
        rec.close(f"accuracy_vs_fp64[{tag}]", y, ref, atol=atol, rtol=rtol)
        try:
            hf = _hf_norm(H, eps, w)(x)
            e_o = float((y.double() - ref).abs().max())
            e_h = float((hf.double() - ref).abs().max())
            rec.check(f"error_not_worse_than_hf[{tag}]", e_o <= e_h * 1.01 + 1e-7, ours=e_o, hf=e_h,
                      bitwise_equal_frac=float((y == hf.to(y.dtype)).float().mean()))
        except ImportError as e:
            rec.check(f"error_not_worse_than_hf[{tag}]", True, skipped=f"transformers unavailable: {e}"[:200])


def _check_backward(rec, H, eps):
    for dtype in (torch.bfloat16, torch.float32):
        x = rand(N_BWD, H, dtype=dtype, scale=2.0, seed=8).requires_grad_()
        r = rand(N_BWD, H, dtype=dtype, seed=9).requires_grad_()
        w = _w(H, dtype).requires_grad_()
        dy, dr = rand(N_BWD, H, dtype=dtype, seed=10), rand(N_BWD, H, dtype=dtype, seed=11)
        y, nr = rms_norm_residual(x, r, w, eps)
        gx, gr, gw = torch.autograd.grad((y.float() * dy.float()).sum() + (nr.float() * dr.float()).sum(), (x, r, w))
        x64, r64, w64 = (t.detach().double().requires_grad_() for t in (x, r, w))
        s = x64 + r64
        rx, rr, rw = torch.autograd.grad((_ref(s, w64, eps) * dy.double()).sum() + (s * dr.double()).sum(),
                                         (x64, r64, w64))
        tag = f"H{H}/{str(dtype)[6:]}"
        for name, a, b in (("dx", gx, rx), ("dres", gr, rr), ("dw", gw, rw)):
            rel = rel_l2(a, b)
            rec.check(f"grad_{name}[{tag}]", rel < TOL_GRAD[dtype], rel_l2=rel)


NATIVE_T = (1, 3, 17, 256, 4097)


def _check_native(rec, name, H, hq, hkv, d, eps):
    """Public calls served by the native host path == the kernel module's forward (Triton's launch):
    plain, fused residual, and per-head Q/K norm read in place from a fused QKV output."""
    impl = loader.current_module("rmsnorm")
    w, wd = _w(H, torch.bfloat16), _w(d, torch.bfloat16)
    for T in NATIVE_T:
        x, r = rand(T, H, seed=T), rand(T, H, seed=T + 1)
        qkv = rand(T, (hq + 2 * hkv) * d, seed=T + 2)
        q = qkv[:, : hq * d].view(T, hq, d)
        tag = f"{name}/T{T}"
        check_native(rec, f"rmsnorm/{tag}", lambda: rms_norm(x, w, eps), lambda: impl.forward(x, w, eps))
        check_native(rec, f"residual/{tag}", lambda: rms_norm_residual(x, r, w, eps),
                     lambda: impl.forward(x, w, eps, residual=r))
        check_native(rec, f"qk_view/{tag}", lambda: rms_norm(q, wd, eps), lambda: impl.forward(q, wd, eps))
    for T in (1, 17):
        x0, r0 = rand(T, H, seed=T + 7), rand(T, H, seed=T + 8)
        leaf = lambda t: t.clone().requires_grad_()  # noqa: E731
        check_native_autograd(rec, f"rmsnorm/{name}/T{T}", lambda: (leaf(x0), leaf(w)),
                              lambda a, b: rms_norm(a, b, eps))
        check_native_autograd(rec, f"residual/{name}/T{T}", lambda: (leaf(x0), leaf(r0), leaf(w)),
                              lambda a, b, c: rms_norm_residual(a, b, c, eps))
    x32 = rand(3, H, dtype=torch.float32, seed=5)
    check_native(rec, f"rmsnorm/{name}/T3/fp32_w32", lambda: rms_norm(x32, w.float(), eps),
                 lambda: impl.forward(x32, w.float(), eps))


def run_checks(rec, quick: bool = False) -> None:
    torch.manual_seed(0)
    models = list(MODELS.items())[:1] if quick else list(MODELS.items())
    for name, cfg in models:
        H, eps = cfg["hidden"], cfg["eps"]
        for dtype in ((torch.bfloat16,) if quick else (torch.bfloat16, torch.float16)):
            rec.run(f"rows[{name}/{str(dtype)[6:]}]", _check_rows, rec, f"{name}/{str(dtype)[6:]}", H, dtype, eps)
        rec.run(f"qk_norm[{name}]", _check_qk_norm, rec, name, cfg["hq"], cfg["hkv"], cfg["d"], eps)
        rec.run(f"native[{name}]", _check_native, rec, name, H, cfg["hq"], cfg["hkv"], cfg["d"], eps)
        rec.run(f"graph[{name}]", _check_graph, rec, H, eps)
        rec.run(f"accuracy[{name}]", _check_accuracy, rec, H, eps)
        rec.run(f"backward[{name}]", _check_backward, rec, H, eps)
    rec.run("rows_fp32[qwen3-4b]", _check_rows, rec, "qwen3-4b/fp32", 2560, torch.float32, 1e-6)


# ------------------------------------------------------------------------------------------------
# benchmarks
# ------------------------------------------------------------------------------------------------
def _liger_module(cls_path, H, eps, w):
    """A Liger norm module (``module:Class``) holding weight ``w`` (frozen), or None without Liger."""
    try:
        import importlib

        mod, cls = cls_path.split(":")
        m = getattr(importlib.import_module(mod), cls)(H, eps).to(device=DEV, dtype=w.dtype)
        with torch.no_grad():
            m.weight.copy_(w)
        m.weight.requires_grad_(False)
        return m
    except Exception:
        return None


def _liger_norm(H, eps, w):
    return _liger_module("liger_kernel.transformers.rms_norm:LigerRMSNorm", H, eps, w)


def _liger_fused_add(H, eps, w):
    return _liger_module("liger_kernel.transformers.fused_add_rms_norm:LigerFusedAddRMSNorm", H, eps, w)


def _candidates(rec, op, fi_call, liger_call, hf_mod, compiled_call):
    """The strongest paths a user would pick for one norm row, by exact name (skips recorded);
    ``compiled_call``: the zero-argument call of the model's compiled HF module, or None."""
    return B.collect(rec, op, {
        "flashinfer.norm." + fi_call.__name__: lambda: (B.flashinfer("rowops"), fi_call)[1],
        "liger_kernel." + liger_call.__name__: lambda: (B.liger(), liger_call)[1],
        f"torch.compile(transformers {hf_mod})": lambda: B.call_or_raise(compiled_call),
    })


def _bench_case(rec, rows, ratios, name, op, ours_fn, baselines, hf_fn, nbytes, T, make_ours=None, **fields):
    row = B.compare(rec, name, ours_fn, baselines, {"eager_hf": hf_fn} if hf_fn else None, T=T, bytes=nbytes,
                    **fields)
    ours = row["ours"]
    if T >= 4096 and make_ours is not None:
        streamed(rec, f"{name}/ours", ours, nbytes, make_ours)
    row["ours_bw"] = bw = tbps(nbytes, ours)
    if bw:
        row["ours_share"] = B.shares(bw.get("graph_tbps"), B.measured_copy_tbps())
    if T >= 4096:
        add_shares(ratios, bw, T)
    rows.setdefault(op, []).append(row)


def run_bench(rec, quick: bool = False) -> None:
    """Ours vs the strongest of FlashInfer's norm kernels (what sgl-kernel ships), Liger-Kernel and
    ``torch.compile`` of HF's Qwen3RMSNorm; eager HF as labelled context."""
    torch.manual_seed(0)
    ratios, rows = {}, {}
    Ts = QUICK_BENCH_T if quick else BENCH_T
    native_rows = []
    fim = B.flashinfer_or_none()  # resolved once: no lookup inside a timed call
    for name, cfg in MODELS.items():
        H, eps, hq, d = cfg["hidden"], cfg["eps"], cfg["hq"], cfg["d"]
        w = _w(H, torch.bfloat16)
        wd = _w(d, torch.bfloat16)
        try:
            hf, hf_qk = _hf_norm(H, eps, w), _hf_norm(d, eps, wd)
        except Exception as e:
            rec.errors.append(f"hf baseline: {type(e).__name__}: {e}"[:300])
            hf = hf_qk = None
        lg, lg_qk, lg_add = _liger_norm(H, eps, w), _liger_norm(d, eps, wd), _liger_fused_add(H, eps, w)
        # one compiled callable per (model, op) across the T loop, as a model compiles its module once
        c_norm = B.try_compiled((lambda x: hf(x)) if hf else None, "Qwen3RMSNorm")
        c_add = B.try_compiled((lambda x, r: (hf(x + r), x + r)) if hf else None, "x + r; Qwen3RMSNorm")
        c_qk = B.try_compiled((lambda q: hf_qk(q)) if hf_qk else None, "Qwen3RMSNorm per head")
        for T in Ts:
            x, r = rand(T, H, seed=T), rand(T, H, seed=T + 1)
            xf, rf = x.clone(), r.clone()  # FlashInfer's fused add works in place: its own buffers

            def fi_norm():
                return fim.norm.rmsnorm(x, w, eps)

            def fi_add():
                return fim.norm.fused_add_rmsnorm(xf, rf, w, eps)

            def liger_norm():
                if lg is None:
                    raise B.Unavailable("liger_kernel.transformers.rms_norm.LigerRMSNorm not importable")
                return lg(x)

            def liger_add():
                if lg_add is None:
                    raise B.Unavailable("liger_kernel.transformers.fused_add_rms_norm.LigerFusedAddRMSNorm not importable")
                return lg_add(x, r)

            fi_norm.__name__, fi_add.__name__ = "rmsnorm", "fused_add_rmsnorm (in place)"
            liger_norm.__name__, liger_add.__name__ = "LigerRMSNorm", "LigerFusedAddRMSNorm"
            base = _candidates(rec, "rmsnorm", fi_norm, liger_norm, "Qwen3RMSNorm",
                               (lambda: c_norm(x)) if callable(c_norm) else c_norm)
            _bench_case(rec, rows, ratios, f"rmsnorm[{name}/T{T}]", "rmsnorm", lambda: rms_norm(x, w, eps), base,
                        (lambda: hf(x)) if hf else None, 2 * T * H * 2 + H * 2, T, H=H,
                        make_ours=lambda i: (lambda x=copy_of(x, i): rms_norm(x, w, eps)))
            base = _candidates(rec, "rmsnorm_residual", fi_add, liger_add, "x + r; Qwen3RMSNorm",
                               (lambda: c_add(x, r)) if callable(c_add) else c_add)
            _bench_case(rec, rows, ratios, f"rmsnorm_residual[{name}/T{T}]", "rmsnorm_residual",
                        lambda: rms_norm_residual(x, r, w, eps), base, (lambda: hf(x + r)) if hf else None,
                        4 * T * H * 2 + H * 2, T, H=H,
                        make_ours=lambda i: (lambda x=copy_of(x, i), r=copy_of(r, i): rms_norm_residual(x, r, w, eps)))
            q = rand(T, hq, d, seed=T + 2)
            q2 = q.view(-1, d)  # SGLang's Qwen3 q_norm: rows of head_dim (q.reshape(-1, head_dim))

            def fi_qk():
                return fim.norm.rmsnorm(q2, wd, eps)

            def liger_qk():
                if lg_qk is None:
                    raise B.Unavailable("liger_kernel.transformers.rms_norm.LigerRMSNorm not importable")
                return lg_qk(q)

            fi_qk.__name__, liger_qk.__name__ = "rmsnorm (rows of head_dim)", "LigerRMSNorm"
            base = _candidates(rec, "qk_norm", fi_qk, liger_qk, "Qwen3RMSNorm (per head)",
                               (lambda: c_qk(q)) if callable(c_qk) else c_qk)
            _bench_case(rec, rows, ratios, f"qk_norm[{name}/T{T}]", "qk_norm", lambda: rms_norm(q, wd, eps), base,
                        (lambda: hf_qk(q)) if hf_qk else None, 2 * T * hq * d * 2 + d * 2, T, heads=hq, d=d,
                        make_ours=lambda i: (lambda q=copy_of(q, i): rms_norm(q, wd, eps)))
            if T <= 256:
                impl = loader.current_module("rmsnorm")
                native_rows += [
                    native_host_row(rec, f"rmsnorm[{name}/T{T}]", lambda: rms_norm(x, w, eps),
                                    lambda: impl.forward(x, w, eps), (lambda: hf(x)) if hf else None),
                    native_host_row(rec, f"rmsnorm_residual[{name}/T{T}]", lambda: rms_norm_residual(x, r, w, eps),
                                    lambda: impl.forward(x, w, eps, residual=r), (lambda: hf(x + r)) if hf else None),
                    native_host_row(rec, f"qk_norm[{name}/T{T}]", lambda: rms_norm(q, wd, eps),
                                    lambda: impl.forward(q, wd, eps), (lambda: hf_qk(q)) if hf_qk else None)]
    B.summarize(rec, [r for v in rows.values() for r in v])
    for op, v in rows.items():
        B.summarize(rec, v, prefix=f"{op}.")
    for k, v in ratios.items():
        rec.summarize(k, v)
    for k in ("native_vs_hf_host", "native_vs_python_host"):
        rec.summarize(k, [h.get(k) for h in native_rows])

