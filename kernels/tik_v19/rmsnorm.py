"""RMSNorm family: hidden-state norm, per-head Q/K norm, fused residual-add + norm.

Semantics (Hugging Face Qwen2/Qwen3/Llama ``RMSNorm``)::

    s   = x (+ residual, rounded to x.dtype)          # new residual (fused variant)
    var = sum(float(s)^2) / H                         # fp32, correctly rounded division
    y   = dtype(w * dtype(float(s) * rsqrt(var + eps)))

i.e. the normalized row is cast back to the activation dtype *before* the weight is applied, and the
weight product is rounded once (for a bf16 weight this is exactly PyTorch's bf16 ``weight * h``).

Token invariance: one tile of ``[ROWS, next_pow2(H)]`` rows per program whose shape and ``num_warps``
depend on H only (:func:`tile_config`), so every row's sum of squares is reduced by the same tree for
any number of rows, any position of the row in the batch and with or without the residual add (the
fused kernel is the same kernel with two more memory streams). Row strides and the row count are not
specialized (see ``_rowops``). Per-head Q/K norm is the same kernel over rows ``(token, head)`` of a
``[T, NH, D]`` view (e.g. a slice of the fused QKV output), without a copy.

The backward recomputes ``rstd`` from the saved input (no extra forward output, so the training
forward and the rollout forward run the very same kernel) and reduces ``dw`` over a fixed grid of
programs (deterministic for a given shape).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from . import contract as C
from ._rowops import (cdiv as _cdiv, next_pow2 as _next_pow2, canonical, fresh_copy, interpreting, launch_opts,
                      pdl_start, to_act, vec_for)
from ._rowops import launch

KNOBS = {
    "coupled": {"RMSNORM_TILE_ELEMS": C.RMSNORM_TILE_ELEMS},
    # a function of H only; changing it moves the bits of every row at once (still invariant)
    "per_shape": {"tile_config": "(BLOCK_H, ROWS, num_warps) = tile_config(H)"},
    "free": {"BWD_PROGRAMS_PER_SM": (2, 4, 8)},
}
BWD_PROGRAMS_PER_SM = 4
MAX_H = 65536


def tile_config(H: int):
    """(BLOCK_H, ROWS, num_warps) for hidden size H -- never a function of the row count."""
    block = _next_pow2(H)
    rows = max(1, C.RMSNORM_TILE_ELEMS // block)
    elems = rows * block
    warps = 4 if elems <= 2048 else (8 if elems <= 8192 else 16)
    return block, rows, warps


@triton.jit(do_not_specialize=["M", "NH", "sxt", "sxh", "srt", "srh", "HEADS", "HEADS1"])
def _rmsnorm_fwd_kernel(
    X, R, W, Y, RES_OUT,
    M, NH, sxt, sxh, srt, srh,      # strides in units of VEC elements
    eps,
    H: tl.constexpr, BLOCK_H: tl.constexpr, ROWS: tl.constexpr, VEC: tl.constexpr,
    HAS_RES: tl.constexpr, INTERP: tl.constexpr,
    W2=None, HEADS=1, HEADS1=1, TWO_W: tl.constexpr = False, PDL: tl.constexpr = False,
):
    pdl_start(PDL)
    pid = tl.program_id(0)
    rows = pid * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_H)
    row_ok = rows < M
    mask = row_ok[:, None] & (cols < H)[None, :]
    t = (rows // NH).to(tl.int64)
    h = (rows % NH).to(tl.int64)
    xoff = t * (sxt * VEC) + h * (sxh * VEC)
    x = tl.load(X + xoff[:, None] + cols[None, :], mask=mask, other=0.0)
    ooff = rows.to(tl.int64)[:, None] * H + cols[None, :]
    if HAS_RES:
        roff = t * (srt * VEC) + h * (srh * VEC)
        r = tl.load(R + roff[:, None] + cols[None, :], mask=mask, other=0.0)
        x = to_act(x.to(tl.float32) + r.to(tl.float32), x.dtype, INTERP)
        tl.store(RES_OUT + ooff, x, mask=mask)
    xf = x.to(tl.float32)
    ss = tl.sum(xf * xf, axis=1)
    var = tl.math.div_rn(ss, tl.full((ROWS,), H, tl.float32))
    rstd = tl.rsqrt(var + eps)
    xh = to_act(xf * rstd[:, None], x.dtype, INTERP)
    w = tl.load(W + cols, mask=cols < H, other=0.0).to(tl.float32)
    if TWO_W:  # per-head Q/K norm in one launch: rows (token, head) with head >= HEADS1 take W2
        w2 = tl.load(W2 + cols, mask=cols < H, other=0.0).to(tl.float32)
        y = xh.to(tl.float32) * tl.where(((rows % HEADS) < HEADS1)[:, None], w[None, :], w2[None, :])
    else:
        y = xh.to(tl.float32) * w[None, :]
    tl.store(Y + ooff, to_act(y, Y.dtype.element_ty, INTERP), mask=mask)


@triton.jit(do_not_specialize=["M", "n_blocks"])
def _rmsnorm_bwd_kernel(
    DY, X, W, DRES, DX, DW_PART,
    M, n_blocks, eps,
    H: tl.constexpr, BLOCK_H: tl.constexpr, ROWS: tl.constexpr, HAS_DRES: tl.constexpr,
    INTERP: tl.constexpr, PDL: tl.constexpr = False,
):
    """X, DY, DRES, DX contiguous [M, H]; program p handles row blocks p, p + G, p + 2G, ..."""
    pdl_start(PDL)
    pid = tl.program_id(0)
    G = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_H)
    col_ok = cols < H
    w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)
    dw = tl.zeros((BLOCK_H,), tl.float32)
    for b in range(pid, n_blocks, G):
        rows = b * ROWS + tl.arange(0, ROWS)
        mask = (rows < M)[:, None] & col_ok[None, :]
        off = rows.to(tl.int64)[:, None] * H + cols[None, :]
        x = tl.load(X + off, mask=mask, other=0.0)
        xf = x.to(tl.float32)
        ss = tl.sum(xf * xf, axis=1)
        var = tl.math.div_rn(ss, tl.full((ROWS,), H, tl.float32))
        rstd = tl.rsqrt(var + eps)
        xhat = xf * rstd[:, None]
        dy = tl.load(DY + off, mask=mask, other=0.0).to(tl.float32)
        dw += tl.sum(dy * to_act(xhat, x.dtype, INTERP).to(tl.float32), axis=0)
        wdy = dy * w[None, :]
        c = tl.sum(wdy * xhat, axis=1) / H
        dx = rstd[:, None] * (wdy - xhat * c[:, None])
        if HAS_DRES:
            dx += tl.load(DRES + off, mask=mask, other=0.0).to(tl.float32)
        tl.store(DX + off, to_act(dx, DX.dtype.element_ty, INTERP), mask=mask)
    tl.store(DW_PART + pid.to(tl.int64) * BLOCK_H + cols, dw)


# ------------------------------------------------------------------------------------------------
# Launchers (inputs validated by areal_tik_plugin.ops.norm)
# ------------------------------------------------------------------------------------------------
def _weight(weight, vec):
    return weight if weight.data_ptr() % 16 == 0 and weight.stride(0) == 1 else fresh_copy(weight)


def forward(x, weight, eps, residual=None):
    """y = rmsnorm(x [+ residual]) over the last dim.

    x: [..., H] (last dim contiguous; up to two levels of row strides are used in place, e.g. a
    per-head ``[T, NH, D]`` slice of a fused QKV output); weight [H]; residual like x or None.
    Returns ``y`` (contiguous, x's shape and dtype) or ``(y, new_residual)`` when residual is given.
    """
    H = x.shape[-1]
    block, rows, warps = tile_config(H)
    vec = vec_for(H, x.element_size())
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    res_out = torch.empty(x.shape, dtype=x.dtype, device=x.device) if residual is not None else y
    if x.numel() == 0:
        return (y, res_out) if residual is not None else y
    xu, M, NH, sxt, sxh = canonical(x, vec)
    if residual is not None:
        ru, _, NHr, srt, srh = canonical(residual, vec)
        if NHr != NH:  # different row structure: give both the contiguous one
            xu, M, NH, sxt, sxh = canonical(fresh_copy(x), vec)
            ru, _, _, srt, srh = canonical(fresh_copy(residual), vec)
    else:
        ru, srt, srh = xu, 0, 0
    w = _weight(weight, vec)
    launch(_rmsnorm_fwd_kernel, (_cdiv(M, rows),),
        xu, ru, w, y, res_out, M, NH, sxt // vec, sxh // vec, srt // vec, srh // vec, float(eps),
        H=H, BLOCK_H=block, ROWS=rows, VEC=vec, HAS_RES=residual is not None, INTERP=interpreting(),
        **launch_opts(warps),
    )
    return (y, res_out) if residual is not None else y


def forward_two_weights(x, weight1, weight2, heads1, eps):
    """Per-head RMSNorm of x [T, NH, D] with ``weight1`` on heads ``< heads1`` and ``weight2`` on the
    rest (Qwen3's q_norm / k_norm over the adjacent q and k heads of a fused QKV output), one launch.
    Bitwise ``cat([forward(x[:, :heads1], weight1), forward(x[:, heads1:], weight2)], 1)``: the same
    kernel and tile (a function of D only); the weight is selected per row after the reduction."""
    T, NH, H = x.shape
    block, rows, warps = tile_config(H)
    vec = vec_for(H, x.element_size())
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if x.numel() == 0:
        return y
    xu, M, NHc, sxt, sxh = canonical(x, vec)
    launch(_rmsnorm_fwd_kernel, (_cdiv(M, rows),),
        xu, xu, _weight(weight1, vec), y, y, M, NHc, sxt // vec, sxh // vec, 0, 0, float(eps),
        H=H, BLOCK_H=block, ROWS=rows, VEC=vec, HAS_RES=False, INTERP=interpreting(),
        W2=_weight(weight2, vec), HEADS=NH, HEADS1=heads1, TWO_W=True,
        **launch_opts(warps),
    )
    return y


@functools.lru_cache(maxsize=8)
def _n_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def backward(dy, x, weight, eps, dres=None):
    """Gradients of y = rmsnorm(x) (x = the normalized input, i.e. the new residual of the fused op).

    dx = rstd * (dy*w - xhat * mean(dy*w*xhat)) (+ dres); dw = sum_rows(dy * dtype(xhat)).
    Returns (dx like x, dw fp32 [H]).
    """
    H = x.shape[-1]
    block, rows, warps = tile_config(H)
    M = x.numel() // H if H else 0
    x2 = x.reshape(M, H).contiguous()
    dy2 = dy.reshape(M, H).contiguous()
    dres2 = dres.reshape(M, H).contiguous() if dres is not None else dy2
    dx = torch.empty((M, H), dtype=x.dtype, device=x.device)
    if M == 0:
        return dx.reshape(x.shape), torch.zeros(H, dtype=torch.float32, device=x.device)
    n_blocks = _cdiv(M, rows)
    cap = 4 if interpreting() or x.device.type != "cuda" else BWD_PROGRAMS_PER_SM * _n_sms(x.device.index or 0)
    G = min(n_blocks, cap)
    part = torch.empty((G, block), dtype=torch.float32, device=x.device)
    launch(_rmsnorm_bwd_kernel, (G,),
        dy2, x2, weight, dres2, dx, part, M, n_blocks, float(eps),
        H=H, BLOCK_H=block, ROWS=rows, HAS_DRES=dres is not None, INTERP=interpreting(),
        **launch_opts(warps),
    )
    return dx.reshape(x.shape), part[:, :H].sum(0)
