"""Batch-invariant dense linear ``y = x @ weight.T (+ bias)``.

Every output row is bit-identical whatever the number of rows in the call (1 .. 65536+) and the
row's position in it: the K reduction is one fixed chain of GEMM_BLOCK_K chunks (no split-K), so
QKV/O/MLP/lm_head/router projections agree between SGLang decode, chunked prefill and the trainer's
full-sequence forward. Backward (dgrad, wgrad) uses cuBLAS: it has no invariance requirement.
"""

from __future__ import annotations

import torch

from areal_tik_plugin.runtime import loader as _loader
from areal_tik_plugin.runtime import native as _native
from areal_tik_plugin.ops import _validate as V


def _impl():
    return _loader.current_module("gemm")


def _forward(x2, weight, bias):
    """The kernel module's ``linear`` on a 2-D operand, through the native host path when it serves the
    call (same kernel, same bits)."""
    return _native.forward("linear", (x2, weight, bias), lambda: _impl().linear(x2, weight, bias))


class _Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x2, weight, bias):
        y = _forward(x2, weight, bias)
        ctx.save_for_backward(x2, weight)
        ctx.has_bias = bias is not None
        ctx.bias_dtype = bias.dtype if bias is not None else None
        return y

    @staticmethod
    def backward(ctx, dy):
        x2, weight = ctx.saved_tensors
        need_dx, need_dw, need_db = ctx.needs_input_grad[:3]
        dx, dw, db = _impl().linear_backward(dy, x2, weight, need_dx, need_dw, need_db and ctx.has_bias)
        if db is not None:
            db = db.to(ctx.bias_dtype)
        return dx, dw, db


def check_linear_args(x, weight, bias):
    V.tensor("x", x, dtypes=V.FLOAT_DTYPES, contiguous_last=True, allow_empty=True)
    if x.dim() < 1:
        raise ValueError(f"x: expected a tensor [..., K], got shape {tuple(x.shape)}")
    V.tensor("weight", weight, ndim=2, dtypes=V.FLOAT_DTYPES, device=x.device, contiguous_last=True)
    V.same_dtype("x", x, weight=weight)
    if weight.shape[1] != x.shape[-1]:
        raise ValueError(f"weight: expected shape [N, K={x.shape[-1]}] (K = x.shape[-1]), got {tuple(weight.shape)}")
    if weight.stride(0) < weight.shape[1]:
        raise ValueError(f"weight: expected row-major rows (stride(0) >= K), got strides {weight.stride()}")
    if bias is not None:
        V.tensor("bias", bias, ndim=1, dtypes=(x.dtype, torch.float32), device=x.device, contiguous=True)
        if bias.shape[0] != weight.shape[0]:
            raise ValueError(f"bias: expected shape [{weight.shape[0]}] (N = weight.shape[0]), got {tuple(bias.shape)}")


def linear(x, weight, bias=None):
    """``x @ weight.T (+ bias)`` with rows independent of the batch (bit-identical for any M).

    Parameters
    ----------
    x : Tensor [..., K] bf16/fp16 (last dim contiguous); M = prod(x.shape[:-1]) may be 0
    weight : Tensor [N, K], same dtype and device (last dim contiguous; e.g. a Linear's weight)
    bias : optional Tensor [N] (x.dtype or float32), added in fp32 after the K reduction

    Returns
    -------
    Tensor [..., N] in x.dtype (fp32 accumulation, one rounding). Differentiable w.r.t. x, weight
    and bias (backward through cuBLAS).

    The checks read only shapes, strides, dtypes and devices: they run once per argument signature
    (:class:`~areal_tik_plugin.ops._validate.Memo`), so a repeated call costs a dictionary lookup.
    """
    r = _native.served("linear", x, weight, bias)  # eager 2-D forward through the native host path (same kernel, same bits)
    if r is not None:
        return r
    _MEMO.once((V.sig(x), V.sig(weight), V.sig(bias)), check_linear_args, x, weight, bias)
    if x.dim() != 2:
        return _run(x, weight, bias)
    # a 2-D x (the integrations' usual case): the kernel's [M, K] operand as is, no reshapes
    needs_grad = x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)
    if torch.is_grad_enabled() and needs_grad:
        return _Linear.apply(x, weight, bias)
    return _forward(x, weight, bias)


_MEMO = V.Memo()


def _run(x, weight, bias):
    K = x.shape[-1]
    lead = x.shape[:-1]
    x2 = x.reshape(-1, K)
    if x2.shape[0] > 0 and x2.stride(-1) != 1:
        x2 = x2.contiguous()
    needs_grad = x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)
    if torch.is_grad_enabled() and needs_grad:
        y = _Linear.apply(x2, weight, bias)
    else:  # inference (rollout): no autograd node, less host overhead
        y = _forward(x2, weight, bias)
    return y.reshape(*lead, weight.shape[0])
