"""RMSNorm family: hidden-state norm, per-head Q/K norm, fused residual-add + norm.

HF Qwen2/Qwen3/Llama semantics: variance in fp32, ``x * rsqrt(var + eps)`` rounded to the input
dtype, *then* multiplied by the weight (one rounding). Every output row depends only on its own
input row (bitwise, for any number of rows / position in the batch / fused or unfused residual).

Usage::

    h = rms_norm(x, layer.input_layernorm.weight, eps)              # x [T, H]
    q = rms_norm(q.view(T, Hq, D), attn.q_norm.weight, eps)         # Qwen3 per-head norm
    y, residual = rms_norm_residual(x, residual, w, eps)             # SGLang fused add + norm
"""

from __future__ import annotations

import torch

from areal_tik_plugin.runtime import loader as _loader
from areal_tik_plugin.runtime import native as _native
from areal_tik_plugin.ops import _validate as V

FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _impl():
    return _loader.current_module("rmsnorm")


def _forward(x, weight, eps, residual=None):
    """The kernel module's forward (also autograd's forward: grad mode is off there), through the native
    host path when it serves the call (same kernel, same bits)."""
    return _native.forward("rmsnorm", (x, weight, eps, residual),
                           lambda: _impl().forward(x, weight, eps, residual=residual))


def _needs_grad(*ts):
    return torch.is_grad_enabled() and any(t.requires_grad for t in ts)


def _check(x, weight, eps):
    V.tensor("x", x, dtypes=FLOAT_DTYPES, contiguous_last=True, allow_empty=True)
    if x.dim() < 1:
        raise ValueError("x: expected a tensor [..., H] with at least one dimension, got a scalar")
    H = x.shape[-1]
    if H < 1:
        raise ValueError(f"x: expected a positive hidden size (last dim), got shape {tuple(x.shape)}")
    impl = _impl()
    if H > impl.MAX_H:
        raise ValueError(f"x: expected hidden size <= {impl.MAX_H}, got {H}")
    V.tensor("weight", weight, ndim=1, dtypes=(x.dtype, torch.float32), device=x.device)
    if weight.numel() != H:
        raise ValueError(f"weight: expected shape ({H},) (the last dim of x), got {tuple(weight.shape)}")
    if weight.stride(0) != 1:
        raise ValueError(f"weight: expected a contiguous tensor, got stride {weight.stride()}")
    return V.positive_float("eps", eps)


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps):
        ctx.save_for_backward(x, weight)
        ctx.eps = eps
        return _forward(x, weight, eps)

    @staticmethod
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        dx, dw = _impl().backward(dy, x, weight, ctx.eps)
        return dx, dw.to(weight.dtype), None


class _RMSNormResidual(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, residual, weight, eps):
        y, new_res = _forward(x, weight, eps, residual)
        ctx.save_for_backward(new_res, weight)
        ctx.eps = eps
        return y, new_res

    @staticmethod
    def backward(ctx, dy, dres):
        new_res, weight = ctx.saved_tensors
        if dy is None:
            dy = torch.zeros_like(new_res)
        dx, dw = _impl().backward(dy, new_res, weight, ctx.eps, dres=dres)
        return dx, dx, dw.to(weight.dtype), None


_MEMO, _MEMO_RES, _MEMO_QK = V.Memo(), V.Memo(), V.Memo()


def rms_norm(x, weight, eps):
    """RMSNorm over the last dim.

    Parameters
    ----------
    x : Tensor [..., H] bf16/fp16/fp32, last dim contiguous. Per-head Q/K norm: x = q.view(T, Hq, D)
        (a strided slice of a fused QKV output is read in place) with weight [D].
    weight : Tensor [H], dtype of x or fp32
    eps : float > 0

    Returns
    -------
    Tensor like x (contiguous, x.dtype); differentiable w.r.t. x and weight.
    """
    r = _native.served("rmsnorm", x, weight, eps, None)  # eager forward through the native host path (same kernel, same bits)
    if r is not None:
        return r
    _MEMO.once((_impl(), V.sig(x), V.sig(weight), type(eps), eps), _check, x, weight, eps)
    eps = float(eps)
    if not _needs_grad(x, weight):  # inference (SGLang): the same kernel without autograd bookkeeping
        return _forward(x, weight, eps)
    return _RMSNorm.apply(x, weight, eps)


def rms_norm_residual(x, residual, weight, eps):
    """Fused residual add + RMSNorm: ``new_residual = x + residual`` (rounded to x.dtype, as
    PyTorch's add), ``y = rms_norm(new_residual)``. Bitwise ``y == rms_norm(x + residual)``.

    Parameters
    ----------
    x, residual : Tensor [..., H], same shape and dtype, last dim contiguous
    weight : Tensor [H]
    eps : float > 0

    Returns
    -------
    (y, new_residual), both like x (new tensors; inputs are not modified).
    """
    r = _native.served("rmsnorm", x, weight, eps, residual)  # the native host path (same kernel, same bits)
    if r is not None:
        return r
    key = (_impl(), V.sig(x), V.sig(residual), V.sig(weight), type(eps), eps)
    _MEMO_RES.once(key, _check_residual, x, residual, weight, eps)
    eps = float(eps)
    if not _needs_grad(x, residual, weight):
        return _forward(x, weight, eps, residual)
    return _RMSNormResidual.apply(x, residual, weight, eps)


def _check_residual(x, residual, weight, eps):
    """Static checks of :func:`rms_norm_residual` -> eps."""
    eps = _check(x, weight, eps)
    V.tensor("residual", residual, dtypes=(x.dtype,), device=x.device, contiguous_last=True, allow_empty=True)
    if residual.shape != x.shape:
        raise ValueError(f"residual: expected shape {tuple(x.shape)} (same as x), got {tuple(residual.shape)}")
    return eps


def qk_rms_norm(qk, q_weight, k_weight, num_q_heads, eps):
    """Qwen3's per-head q_norm and k_norm in one launch, over the adjacent q and k heads of a fused
    QKV output (no gradients: the rollout path).

    Bitwise ``cat([rms_norm(qk[:, :Hq], q_weight, eps), rms_norm(qk[:, Hq:], k_weight, eps)], 1)``.

    Parameters
    ----------
    qk : Tensor [T, Hq + Hkv, D] bf16/fp16/fp32, last dim contiguous (e.g.
        ``qkv[:, :(Hq + Hkv) * D].view(T, -1, D)``, read in place)
    q_weight, k_weight : Tensor [D], dtype of qk or fp32, contiguous
    num_q_heads : int, 1 <= Hq <= Hq + Hkv (heads ``< Hq`` take q_weight)
    eps : float > 0

    Returns
    -------
    Tensor [T, Hq + Hkv, D] (contiguous, qk.dtype); not differentiable (raises when a gradient is
    required: the training forward runs :func:`rms_norm` per projection).
    """
    impl = _impl()
    key = (impl, V.sig(qk), V.sig(q_weight), V.sig(k_weight), V.sig(num_q_heads), type(eps), eps)
    _MEMO_QK.once(key, _check_qk, qk, q_weight, k_weight, num_q_heads, eps)
    if _needs_grad(qk, q_weight, k_weight):  # not in the signature: checked (raises) on every call
        _check_qk(qk, q_weight, k_weight, num_q_heads, eps)
    return impl.forward_two_weights(qk, q_weight, k_weight, int(num_q_heads), float(eps))


def _check_qk(qk, q_weight, k_weight, num_q_heads, eps):
    V.tensor("qk", qk, ndim=3, dtypes=FLOAT_DTYPES, contiguous_last=True, allow_empty=True)
    eps = _check(qk, q_weight, eps)
    _check(qk, k_weight, eps)
    if isinstance(num_q_heads, bool) or not isinstance(num_q_heads, int) or not 1 <= num_q_heads <= qk.shape[1]:
        raise ValueError(f"num_q_heads: expected an int in [1, {qk.shape[1]}] (the heads of qk), got {num_q_heads!r}")
    if _needs_grad(qk, q_weight, k_weight):
        raise ValueError("qk_rms_norm: inputs require grad; it has no backward (the training forward runs "
                         "rms_norm on q and k separately, with the same bits)")
    return eps
