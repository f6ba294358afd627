"""RMSNorm family (hidden norm, per-head Q/K norm, fused residual + norm): CPU tests (interpreter).

Two kinds of test, never mixed: bitwise invariance between our own paths, and accuracy against an
fp64 reference with the tolerance table below.
"""

from __future__ import annotations

import pytest
import torch

from areal_tik_plugin import ops

from tests.helpers.rowops_testutil import assert_bitwise, assert_close, rand

EPS = 1e-6
# forward: two roundings to the activation dtype (normalized row, weight product) -> 2 units
TOL_FWD = {torch.bfloat16: (1e-6, 2 ** -7), torch.float16: (1e-6, 2 ** -10), torch.float32: (1e-7, 2e-6)}
# gradients: relative L2 error against fp64
TOL_GRAD = {torch.bfloat16: 1e-2, torch.float16: 2e-3, torch.float32: 1e-5}


def ref_rmsnorm(x, w, eps=EPS):
    x64 = x.double()
    return w.double() * (x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps))


def rel_l2(out, ref):
    return float((out.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30))


# ---- accuracy -----------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("M,H", [(1, 2048), (17, 96), (129, 64), (127, 2048)])
def test_accuracy(dtype, M, H):
    x = rand(M, H, dtype=dtype, scale=2.0, seed=M + H)
    w = (1 + 0.2 * rand(H, seed=7, dtype=torch.float32)).to(dtype)
    y = ops.rms_norm(x, w, EPS)
    assert y.dtype == dtype and y.shape == x.shape
    atol, rtol = TOL_FWD[dtype]
    assert_close(y, ref_rmsnorm(x, w), atol, rtol, f"rms_norm {dtype} {M}x{H}")


def test_accuracy_fp32_weight_and_leading_dims():
    x = rand(3, 5, 96, scale=3.0, seed=1)
    w = 1 + 0.2 * rand(96, dtype=torch.float32, seed=2)
    y = ops.rms_norm(x, w, 1e-5)
    assert y.shape == (3, 5, 96) and y.dtype == torch.bfloat16
    assert_close(y, ref_rmsnorm(x, w, 1e-5), *TOL_FWD[torch.bfloat16], "fp32 weight")


def test_hf_order_bf16():
    """HF order: round the normalized row to bf16, then multiply by the (bf16) weight, round once."""
    x = rand(17, 128, scale=2.0, seed=3)
    w = (1 + 0.3 * rand(128, dtype=torch.float32, seed=4)).bfloat16()
    y = ops.rms_norm(x, w, EPS)
    xf = x.float()
    hf = w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)).bfloat16()
    # same rounding points: at most one bf16 ulp apart (only the fp32 sum order may differ)
    assert_close(y, hf, 0.0, 2 ** -8, "vs HF formula")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_residual_accuracy(dtype):
    x, r = rand(17, 96, dtype=dtype, seed=5), rand(17, 96, dtype=dtype, seed=6, scale=4.0)
    w = (1 + 0.2 * rand(96, seed=8, dtype=torch.float32)).to(dtype)
    y, nr = ops.rms_norm_residual(x, r, w, EPS)
    assert_close(nr, x.double() + r.double(), 0.0, TOL_FWD[dtype][1] / 2, "new residual")
    assert_close(y, ref_rmsnorm(nr, w), *TOL_FWD[dtype], "residual norm")


# ---- bitwise invariance -------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("H", [64, 96, 2048])
def test_rows_invariant_to_batch(dtype, H):
    M = 129
    x = rand(M, H, dtype=dtype, scale=2.0, seed=H)
    w = (1 + 0.2 * rand(H, seed=9, dtype=torch.float32)).to(dtype)
    full = ops.rms_norm(x, w, EPS)
    for i in (0, 1, 64, 127, 128):  # decode-sized calls: one row alone
        assert_bitwise(ops.rms_norm(x[i:i + 1], w, EPS), full[i:i + 1], f"row {i} alone")
    assert_bitwise(ops.rms_norm(x[:17], w, EPS), full[:17], "first 17 rows")
    perm = torch.randperm(M, generator=torch.Generator().manual_seed(0))[:127]
    assert_bitwise(ops.rms_norm(x[perm], w, EPS), full[perm], "127 rows, shuffled")
    assert_bitwise(ops.rms_norm(x[1::2], w, EPS), full[1::2], "strided rows (view)")
    padded = torch.zeros(M, H + 64, dtype=dtype)
    padded[:, 32:32 + H] = x
    assert_bitwise(ops.rms_norm(padded[:, 32:32 + H], w, EPS), full, "rows inside a wider buffer")


def test_per_head_qk_norm_invariant():
    T, Hq, Hkv, D = 17, 4, 2, 128
    qkv = rand(T, (Hq + 2 * Hkv) * D, scale=2.0, seed=11)
    wq = (1 + 0.2 * rand(D, seed=12, dtype=torch.float32)).bfloat16()
    q = qkv[:, : Hq * D].view(T, Hq, D)        # strided view of the fused projection
    k = qkv[:, Hq * D: (Hq + Hkv) * D].view(T, Hkv, D)
    yq = ops.rms_norm(q, wq, EPS)
    assert_bitwise(ops.rms_norm(q.contiguous(), wq, EPS), yq, "q view vs contiguous")
    assert_bitwise(ops.rms_norm(q.reshape(T * Hq, D), wq, EPS).view(T, Hq, D), yq, "3-D vs flattened rows")
    for t in (0, 9, 16):
        assert_bitwise(ops.rms_norm(q[t:t + 1], wq, EPS), yq[t:t + 1], f"decode token {t}")
    yk = ops.rms_norm(k, wq, EPS)
    # a K row equals a Q row with the same values (the op never looks at which head it is)
    qk = torch.cat([q[:, :1], k[:, 1:2]], 1)
    assert_bitwise(ops.rms_norm(qk, wq, EPS), torch.cat([yq[:, :1], yk[:, 1:2]], 1), "mixed heads")


def test_misaligned_view_same_bits():
    M, H = 17, 96
    buf = rand(M * H + 1, scale=2.0, seed=13)
    x = buf[1:].view(M, H)  # data pointer 2 bytes off a 16-byte boundary
    w = (1 + 0.2 * rand(H, seed=14, dtype=torch.float32)).bfloat16()
    assert_bitwise(ops.rms_norm(x, w, EPS), ops.rms_norm(x.clone(), w, EPS), "misaligned view")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_residual_fused_equals_unfused(dtype):
    M, H = 129, 2048
    x, r = rand(M, H, dtype=dtype, seed=15), rand(M, H, dtype=dtype, seed=16, scale=3.0)
    w = (1 + 0.2 * rand(H, seed=17, dtype=torch.float32)).to(dtype)
    y, nr = ops.rms_norm_residual(x, r, w, EPS)
    assert_bitwise(nr, x + r, "new residual == torch add")
    assert_bitwise(y, ops.rms_norm(x + r, w, EPS), "fused == rms_norm(x + residual)")
    for i in (0, 128):
        yi, nri = ops.rms_norm_residual(x[i:i + 1], r[i:i + 1], w, EPS)
        assert_bitwise(yi, y[i:i + 1], f"fused row {i} alone")
        assert_bitwise(nri, nr[i:i + 1], f"fused residual row {i} alone")


def test_training_forward_equals_inference_forward():
    x = rand(17, 96, seed=18)
    w = (1 + 0.2 * rand(96, seed=19, dtype=torch.float32)).bfloat16()
    y0 = ops.rms_norm(x, w, EPS)
    xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
    assert_bitwise(ops.rms_norm(xg, wg, EPS).detach(), y0, "autograd forward")


# ---- gradients ----------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", [(17, 96), (3, 4, 64)])
def test_grad(dtype, shape):
    H = shape[-1]
    x = rand(*shape, dtype=dtype, scale=2.0, seed=20).requires_grad_()
    w = (1 + 0.2 * rand(H, seed=21, dtype=torch.float32)).to(dtype).requires_grad_()
    dy = rand(*shape, dtype=dtype, seed=22)
    ops.rms_norm(x, w, EPS).backward(dy)
    x64 = x.detach().double().requires_grad_()
    w64 = w.detach().double().requires_grad_()
    ref_rmsnorm(x64, w64).backward(dy.double())
    assert x.grad.dtype == dtype and w.grad.dtype == dtype
    assert rel_l2(x.grad, x64.grad) < TOL_GRAD[dtype]
    assert rel_l2(w.grad, w64.grad) < TOL_GRAD[dtype]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_grad_residual(dtype):
    x = rand(17, 64, dtype=dtype, seed=23).requires_grad_()
    r = rand(17, 64, dtype=dtype, seed=24).requires_grad_()
    w = (1 + 0.2 * rand(64, seed=25, dtype=torch.float32)).to(dtype).requires_grad_()
    dy, dr = rand(17, 64, dtype=dtype, seed=26), rand(17, 64, dtype=dtype, seed=27)
    y, nr = ops.rms_norm_residual(x, r, w, EPS)
    (y.float() * dy.float()).sum().add((nr.float() * dr.float()).sum()).backward()
    x64, r64, w64 = (t.detach().double().requires_grad_() for t in (x, r, w))
    s = x64 + r64
    (ref_rmsnorm(s, w64) * dy.double()).sum().add((s * dr.double()).sum()).backward()
    for out, ref in ((x.grad, x64.grad), (r.grad, r64.grad), (w.grad, w64.grad)):
        assert rel_l2(out, ref) < TOL_GRAD[dtype]


# ---- errors --------------------------------------------------------------------------------------
def test_bad_inputs():
    x = rand(4, 64)
    w = torch.ones(64, dtype=torch.bfloat16)
    with pytest.raises(TypeError):
        ops.rms_norm(x.tolist(), w, EPS)
    with pytest.raises(TypeError):
        ops.rms_norm(x, w, "1e-6")
    with pytest.raises(ValueError, match="eps"):
        ops.rms_norm(x, w, 0.0)
    with pytest.raises(ValueError, match="weight"):
        ops.rms_norm(x, torch.ones(32, dtype=torch.bfloat16), EPS)
    with pytest.raises(ValueError, match="weight"):
        ops.rms_norm(x, torch.ones(64, dtype=torch.float16), EPS)
    with pytest.raises(ValueError, match="dtype"):
        ops.rms_norm(x.to(torch.int32), w, EPS)
    with pytest.raises(ValueError, match="contiguous"):
        ops.rms_norm(rand(64, 4).t(), w, EPS)
    with pytest.raises(ValueError, match="residual"):
        ops.rms_norm_residual(x, rand(4, 32), w, EPS)
    with pytest.raises(ValueError, match="residual"):
        ops.rms_norm_residual(x, x.float(), w, EPS)


def test_empty():
    w = torch.ones(64, dtype=torch.bfloat16)
    assert ops.rms_norm(torch.empty(0, 64, dtype=torch.bfloat16), w, EPS).shape == (0, 64)
    y, nr = ops.rms_norm_residual(torch.empty(0, 64, dtype=torch.bfloat16), torch.empty(0, 64, dtype=torch.bfloat16), w, EPS)
    assert y.shape == nr.shape == (0, 64)


# ---- q/k norm in one launch (rollout) ------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("T,Hq,Hkv,D", [(1, 4, 2, 64), (13, 5, 3, 64), (7, 8, 1, 128)])
def test_qk_rms_norm_bitwise_equals_two_norms(dtype, T, Hq, Hkv, D):
    qkv = rand(T, (Hq + 2 * Hkv) * D, dtype=dtype, scale=2.0, seed=T + Hq)  # a fused QKV output
    qk = qkv[:, :(Hq + Hkv) * D].view(T, Hq + Hkv, D)                       # strided view, read in place
    wq = (1 + 0.3 * rand(D, seed=1, dtype=torch.float32)).to(dtype)
    wk = (1 + 0.3 * rand(D, seed=2, dtype=torch.float32)).to(dtype)
    ref = torch.cat([ops.rms_norm(qk[:, :Hq], wq, EPS), ops.rms_norm(qk[:, Hq:], wk, EPS)], 1)
    for _ in range(2):  # the checked first call, then a memoized signature
        y = ops.qk_rms_norm(qk, wq, wk, Hq, EPS)
        assert y.shape == qk.shape and y.is_contiguous()
        assert_bitwise(y, ref)
    # one token alone == the same token inside the batch
    assert_bitwise(ops.qk_rms_norm(qk[T - 1:], wq, wk, Hq, EPS), ref[T - 1:])


def test_qk_rms_norm_bad_inputs():
    qk = rand(3, 6, 64, dtype=torch.bfloat16)
    w = torch.ones(64, dtype=torch.bfloat16)
    fn = ops.qk_rms_norm
    for memoized in (False, True):  # after a good call of the same signature the errors are the same
        if memoized:
            fn(qk, w, w, 4, EPS)
        with pytest.raises(ValueError, match="num_q_heads"):
            fn(qk, w, w, 0, EPS)
        with pytest.raises(ValueError, match="num_q_heads"):
            fn(qk, w, w, 7, EPS)
        with pytest.raises(ValueError, match="weight"):
            fn(qk, w, torch.ones(32, dtype=torch.bfloat16), 4, EPS)
        with pytest.raises(ValueError, match="qk"):
            fn(qk[0], w, w, 4, EPS)
        with pytest.raises(ValueError, match="eps"):
            fn(qk, w, w, 4, -1.0)
    with pytest.raises(ValueError, match="grad"):
        fn(qk.clone().requires_grad_(), w, w, 4, EPS)
    fn(qk, w, w, 4, EPS)  # memoized signature: the grad check still runs
    with pytest.raises(ValueError, match="grad"):
        fn(qk.clone().requires_grad_(), w, w, 4, EPS)
