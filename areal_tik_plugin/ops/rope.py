"""NeoX (rotate-half) rotary position embedding from arbitrary per-token positions.

Matches HF ``apply_rotary_pos_emb(q, k, cos, sin)`` with ``cos, sin = RotaryEmbedding(x, position_ids)``
(``freq = position.float() * inv_freq`` in fp32, ``cos/sin * attention_scaling``) except that cos/sin
and the products stay in fp32 and the result is rounded once. Works for packed sequences (positions
restart per sequence) and decode (one position per request) alike: elementwise per token.

Usage (Qwen3; after the per-head q/k norm)::

    inv_freq = rotary_emb.inv_freq            # fp32 [head_dim // 2] (or [rotary_dim // 2])
    q, k = apply_rope(q.view(T, Hq, D), k.view(T, Hkv, D), position_ids.view(-1), inv_freq,
                      rotary_emb.attention_scaling)
"""

from __future__ import annotations

import torch

from areal_tik_plugin.runtime import loader as _loader
from areal_tik_plugin.ops import _validate as V
from areal_tik_plugin.ops.kv_write import _check as _kv_check, _check_loc as _kv_check_loc

FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
MAX_EXACT_POSITION = 1 << 24  # positions are converted to fp32 exactly below this


def _impl():
    return _loader.current_module("rope")


class _Rope(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, positions, inv_freq, scaling):
        ctx.save_for_backward(positions, inv_freq)
        ctx.scaling = scaling
        ctx.q_shape, ctx.dtype = q.shape, q.dtype
        return _impl().forward(q, k, positions, inv_freq, scaling)

    @staticmethod
    def backward(ctx, dq, dk):
        positions, inv_freq = ctx.saved_tensors
        if dq is None:
            dq = torch.zeros(ctx.q_shape, dtype=ctx.dtype, device=positions.device)
        dq = dq if dq.stride(-1) == 1 else dq.contiguous()
        if dk is not None and dk.stride(-1) != 1:
            dk = dk.contiguous()
        dq_in, dk_in = _impl().backward(dq, dk, positions, inv_freq, ctx.scaling)
        return dq_in, dk_in, None, None, None


_MEMO, _MEMO_KV = V.Memo(), V.Memo()


def apply_rope(q, k, positions, inv_freq, attention_scaling=1.0):
    """Rotate q and k by their tokens' positions (NeoX rotate-half).

    Parameters
    ----------
    q : Tensor [T, Hq, D] bf16/fp16/fp32, last dim contiguous (strided views of a QKV output are fine)
    k : Tensor [T, Hkv, D] same dtype, or None
    positions : int32/int64 Tensor [T], 0 <= position < 2**24
    inv_freq : fp32 Tensor [R/2], R = rotary dim <= D (even); dims [R, D) pass through unchanged
    attention_scaling : float > 0, multiplies cos and sin (HF ``attention_scaling``; 1.0 for default RoPE)

    Returns
    -------
    (q_out, k_out), new contiguous tensors (k_out None when k is None); differentiable w.r.t. q, k.

    Value checks (0 <= positions < 2**24) read tensor values, a host sync: they run on CPU tensors
    always and on CUDA tensors only with ``TIK_CHECK_VALUES=1`` outside CUDA-graph capture (SGLang's
    decode is captured); a bad value on the GPU otherwise gives undefined rows.
    """
    key = (V.sig(q), V.sig(k), V.sig(positions), V.sig(inv_freq), type(attention_scaling), attention_scaling)
    _MEMO.once(key, _check, q, k, positions, inv_freq, attention_scaling)
    _check_positions(q, positions)
    return _run(q, k, positions, inv_freq, float(attention_scaling))


def _check(q, k, positions, inv_freq, attention_scaling):
    """Static checks of :func:`apply_rope` (shapes, dtypes, devices, layouts, scaling) -> scaling."""
    V.tensor("q", q, ndim=3, dtypes=FLOAT_DTYPES, contiguous_last=True, allow_empty=True)
    T, _, D = q.shape
    if D < 2 or D % 2:
        raise ValueError(f"q: expected an even head_dim >= 2, got {D}")
    if k is not None:
        V.tensor("k", k, ndim=3, dtypes=(q.dtype,), device=q.device, contiguous_last=True, allow_empty=True)
        if k.shape[0] != T or k.shape[2] != D:
            raise ValueError(f"k: expected shape [{T}, Hkv, {D}] (tokens and head_dim of q), got {tuple(k.shape)}")
    V.tensor("positions", positions, ndim=1, dtypes=V.INDEX_DTYPES, device=q.device, contiguous=True,
             allow_empty=True)
    if positions.numel() != T:
        raise ValueError(f"positions: expected {T} entries (one per token of q), got {positions.numel()}")
    V.tensor("inv_freq", inv_freq, ndim=1, dtypes=(torch.float32,), device=q.device, contiguous=True)
    if 2 * inv_freq.numel() > D:
        raise ValueError(f"inv_freq: expected at most head_dim/2 = {D // 2} entries, got {inv_freq.numel()}")
    return V.positive_float("attention_scaling", attention_scaling)


def _check_positions(q, positions):
    """Value check (a host sync; CPU always, GPU with ``TIK_CHECK_VALUES=1``): every call."""
    if q.shape[0] and V.check_values(q.device):
        lo, hi = int(positions.min()), int(positions.max())
        if lo < 0 or hi >= MAX_EXACT_POSITION:
            raise ValueError(f"positions: expected values in [0, {MAX_EXACT_POSITION}), got min {lo} max {hi}")


def _run(q, k, positions, inv_freq, scaling):
    if not (torch.is_grad_enabled() and (q.requires_grad or (k is not None and k.requires_grad))):
        return _impl().forward(q, k, positions, inv_freq, scaling)
    return _Rope.apply(q, k, positions, inv_freq, scaling)


def apply_rope_kv_write(q, k, v, positions, inv_freq, attention_scaling, k_cache, v_cache, loc):
    """:func:`apply_rope` on q and k with k's rotated rows and v's rows written into the paged KV pool
    at slots ``loc`` (SGLang: RoPE, then ``set_kv_buffer``), in one launch (rollout path, no gradients).

    Bitwise: the returned q equals ``apply_rope(q, k, ...)[0]``; after the call
    ``k_cache[loc] == apply_rope(q, k, ...)[1]`` and ``v_cache[loc] == v`` (as :func:`ops.kv_write`).

    Parameters
    ----------
    q, k, positions, inv_freq, attention_scaling : as :func:`apply_rope` (k required)
    v : Tensor [T, Hkv, D], dtype of k, last dim contiguous
    k_cache, v_cache, loc : as :func:`ops.kv_write` (caches in the dtype of q)

    Returns
    -------
    q_out [T, Hq, D] contiguous; the caches are written in place.

    Value checks (positions as :func:`apply_rope`, 0 <= loc < slots) read tensor values, a host sync:
    they run on CPU tensors always and on CUDA tensors only with ``TIK_CHECK_VALUES=1`` outside CUDA-
    graph capture (SGLang's decode is captured); a bad value on the GPU otherwise gives undefined rows.
    """
    key = (V.sig(q), V.sig(k), V.sig(v), V.sig(positions), V.sig(inv_freq), type(attention_scaling),
           attention_scaling, V.sig(k_cache), V.sig(v_cache), V.sig(loc))
    _MEMO_KV.once(key, _check_kv_write, q, k, v, positions, inv_freq, attention_scaling, k_cache, v_cache, loc)
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):  # not in the signature: every call
        _check_kv_write(q, k, v, positions, inv_freq, attention_scaling, k_cache, v_cache, loc)
    _check_values_kv(q, positions, k_cache, loc)
    return _impl().forward_kv_write(q, k, v, positions, inv_freq, float(attention_scaling), k_cache, v_cache, loc)


def _check_kv_write(q, k, v, positions, inv_freq, attention_scaling, k_cache, v_cache, loc):
    if k is None:
        raise ValueError("k: expected a tensor [T, Hkv, D] (its rotated rows are written to k_cache), got None")
    scaling = _check(q, k, positions, inv_freq, attention_scaling)
    _kv_check(k_cache, v_cache, loc, k, v)
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        raise ValueError("apply_rope_kv_write: inputs require grad; it has no backward (the rollout path; "
                         "training runs apply_rope)")
    return scaling


def _check_values_kv(q, positions, k_cache, loc):
    _check_positions(q, positions)
    _kv_check_loc(k_cache, loc)
