"""SwiGLU activation: ``silu(gate) * up`` in fp32, rounded once to the activation dtype.

``swiglu_fused`` takes the fused gate_up projection output (SGLang ``MergedColumnParallelLinear`` /
``SiluAndMul`` layout: gate first, up second). Elementwise, hence token invariant.
"""

from __future__ import annotations

import torch

from areal_tik_plugin.runtime import loader as _loader
from areal_tik_plugin.runtime import native as _native
from areal_tik_plugin.ops import _validate as V

FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _impl():
    return _loader.current_module("swiglu")


def _forward(gate, up):
    """The kernel module's forward (also autograd's forward), through the native host path when it serves
    the call (same kernel, same bits)."""
    return _native.forward("swiglu", (gate, up), lambda: _impl().forward(gate, up))


def _forward_fused(gate_up):
    return _native.forward("swiglu_fused", (gate_up,), lambda: _impl().forward_fused(gate_up))


def _grad(dy):
    return dy if dy.stride(-1) == 1 else dy.contiguous()


class _SwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate, up):
        ctx.save_for_backward(gate, up)
        return _forward(gate, up)

    @staticmethod
    def backward(ctx, dy):
        gate, up = ctx.saved_tensors
        return _impl().backward(_grad(dy), gate, up)


class _SwiGLUFused(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate_up):
        ctx.save_for_backward(gate_up)
        return _forward_fused(gate_up)

    @staticmethod
    def backward(ctx, dy):
        (gate_up,) = ctx.saved_tensors
        return _impl().backward_fused(_grad(dy), gate_up)


_MEMO, _MEMO_FUSED = V.Memo(), V.Memo()


def swiglu(gate, up):
    """``silu(gate) * up``.

    Parameters
    ----------
    gate, up : Tensor [..., I], same shape and dtype (bf16/fp16/fp32), last dim contiguous

    Returns
    -------
    Tensor [..., I] (contiguous); differentiable w.r.t. gate and up.
    """
    r = _native.served("swiglu", gate, up)  # eager forward through the native host path (same kernel, same bits)
    if r is not None:
        return r
    _MEMO.once((V.sig(gate), V.sig(up)), _check, gate, up)
    return _run(gate, up)


def _check(gate, up):
    V.tensor("gate", gate, dtypes=FLOAT_DTYPES, contiguous_last=True, allow_empty=True)
    V.tensor("up", up, dtypes=(gate.dtype,), device=gate.device, contiguous_last=True, allow_empty=True)
    if gate.dim() < 1:
        raise ValueError("gate: expected a tensor [..., I], got a scalar")
    if up.shape != gate.shape:
        raise ValueError(f"up: expected shape {tuple(gate.shape)} (same as gate), got {tuple(up.shape)}")


def _run(gate, up):
    if not (torch.is_grad_enabled() and (gate.requires_grad or up.requires_grad)):
        return _forward(gate, up)
    return _SwiGLU.apply(gate, up)


def swiglu_fused(gate_up):
    """``silu(gate_up[..., :I]) * gate_up[..., I:]``.

    Parameters
    ----------
    gate_up : Tensor [..., 2I] bf16/fp16/fp32, last dim contiguous, even last dim

    Returns
    -------
    Tensor [..., I] (contiguous); differentiable w.r.t. gate_up.
    """
    r = _native.served("swiglu_fused", gate_up)  # the native host path (same kernel, same bits)
    if r is not None:
        return r
    _MEMO_FUSED.once(V.sig(gate_up), _check_fused, gate_up)
    return _run_fused(gate_up)


def _check_fused(gate_up):
    V.tensor("gate_up", gate_up, dtypes=FLOAT_DTYPES, contiguous_last=True, allow_empty=True)
    if gate_up.dim() < 1 or gate_up.shape[-1] % 2:
        raise ValueError(f"gate_up: expected a tensor [..., 2I] with an even last dim, got shape {tuple(gate_up.shape)}")


def _run_fused(gate_up):
    if not (torch.is_grad_enabled() and gate_up.requires_grad):
        return _forward_fused(gate_up)
    return _SwiGLUFused.apply(gate_up)
