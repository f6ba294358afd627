"""SwiGLU: out = silu(gate) * up, from separate gate/up or one fused gate_up projection output.

Math (fp32, contraction off, one rounding to the activation dtype)::

    silu(g) = g / (1 + exp(-g))          # PyTorch's formula
    out     = dtype(silu(g) * u)

HF computes ``act_fn(gate) * up`` with silu rounded to the activation dtype first; SGLang's
``SiluAndMul`` rounds once, as here. Elementwise: token invariant for any launch shape.

Backward: s = sigmoid(g); d_up = dy * silu(g); d_gate = dy * u * s * (1 + g * (1 - s)).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._rowops import cdiv as _cdiv, next_pow2 as _next_pow2, interpreting, launch_opts, pdl_start, to_act
from ._rowops import launch

KNOBS = {"free": {"BLOCK": (512, 1024, 2048, 4096), "WARPS": (2, 4, 8)}}
BLOCK = 1024
WARPS = 4


@triton.jit
def _swiglu_fwd_kernel(G, U, O, sg, su, I, BLOCK: tl.constexpr, INTERP: tl.constexpr, PDL: tl.constexpr = False):
    pdl_start(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < I
    g = tl.load(G + row * sg + cols, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(U + row * su + cols, mask=ok, other=0.0).to(tl.float32)
    silu = g / (1.0 + tl.exp(-g))
    tl.store(O + row * I + cols, to_act(silu * u, O.dtype.element_ty, INTERP), mask=ok)


@triton.jit
def _swiglu_bwd_kernel(DY, G, U, DG, DU, sg, su, sdg, sdu, I, BLOCK: tl.constexpr, INTERP: tl.constexpr,
                       PDL: tl.constexpr = False):
    pdl_start(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < I
    dy = tl.load(DY + row * I + cols, mask=ok, other=0.0).to(tl.float32)
    g = tl.load(G + row * sg + cols, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(U + row * su + cols, mask=ok, other=0.0).to(tl.float32)
    sig = 1.0 / (1.0 + tl.exp(-g))
    silu = g * sig
    du = dy * silu
    dg = dy * u * sig * (1.0 + g * (1.0 - sig))
    tl.store(DU + row * sdu + cols, to_act(du, DU.dtype.element_ty, INTERP), mask=ok)
    tl.store(DG + row * sdg + cols, to_act(dg, DG.dtype.element_ty, INTERP), mask=ok)


def _rows(x):
    """x [..., I] with last dim contiguous -> (x2 [M, I] view or copy, M)."""
    I = x.shape[-1]
    M = x.numel() // I if I else 0
    try:
        x2 = x.view(M, I)
    except RuntimeError:
        x2 = x.reshape(M, I).contiguous()
    return x2, M


def forward(gate, up):
    """silu(gate) * up; gate/up [..., I] (same shape, last dim contiguous). Returns contiguous [..., I]."""
    I = gate.shape[-1]
    out = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
    g2, M = _rows(gate)
    u2, _ = _rows(up)
    if M == 0 or I == 0:
        return out
    launch(_swiglu_fwd_kernel, (M, _cdiv(I, BLOCK)),
        g2, u2, out, g2.stride(0), u2.stride(0), I, BLOCK=BLOCK, INTERP=interpreting(), **launch_opts(WARPS)
    )
    return out


def forward_fused(gate_up):
    """gate_up [..., 2I] -> silu(gate_up[..., :I]) * gate_up[..., I:]."""
    I = gate_up.shape[-1] // 2
    return forward(gate_up[..., :I], gate_up[..., I:])


def backward(dy, gate, up):
    """Returns (d_gate, d_up), contiguous like gate."""
    I = gate.shape[-1]
    dg = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
    du = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
    g2, M = _rows(gate)
    u2, _ = _rows(up)
    if M == 0 or I == 0:
        return dg, du
    dy2 = dy.reshape(M, I).contiguous()
    launch(_swiglu_bwd_kernel, (M, _cdiv(I, BLOCK)),
        dy2, g2, u2, dg, du, g2.stride(0), u2.stride(0), I, I, I, BLOCK=BLOCK, INTERP=interpreting(),
        **launch_opts(WARPS),
    )
    return dg, du


def backward_fused(dy, gate_up):
    """Returns d_gate_up [..., 2I] (contiguous)."""
    I = gate_up.shape[-1] // 2
    dgu = torch.empty(gate_up.shape, dtype=gate_up.dtype, device=gate_up.device)
    g2, M = _rows(gate_up[..., :I])
    u2, _ = _rows(gate_up[..., I:])
    if M == 0 or I == 0:
        return dgu
    dgu2 = dgu.view(M, 2 * I)
    dy2 = dy.reshape(M, I).contiguous()
    launch(_swiglu_bwd_kernel, (M, _cdiv(I, BLOCK)),
        dy2, g2, u2, dgu2, dgu2[:, I:], g2.stride(0), u2.stride(0), 2 * I, 2 * I, I,
        BLOCK=BLOCK, INTERP=interpreting(), **launch_opts(WARPS),
    )
    return dgu
