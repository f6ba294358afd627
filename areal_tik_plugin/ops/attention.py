"""Unified causal attention: three entry points, bit-identical per token.

How SGLang's ``ForwardBatch`` maps onto these calls (page size 1, ``MHATokenToKVPool``)::

    # extend (prefill chunk / prefix-cache hit); K/V of the new tokens written first
    # (areal_tik_plugin.ops.kv_write at fb.out_cache_loc)
    attention_extend(q.view(-1, Hq, D), pool.k_buffer[layer_id], pool.v_buffer[layer_id],
                     cu_seqlens_q=cumsum0(fb.extend_seq_lens), prefix_lens=fb.extend_prefix_lens,
                     kv_indices=fb.req_to_token_pool.req_to_token, table_rows=fb.req_pool_indices,
                     max_extend_len=max(fb.extend_seq_lens_cpu), softmax_scale=layer.scaling)
    # decode: one token per request, K/V written at fb.out_cache_loc first
    attention_decode(q.view(-1, Hq, D), pool.k_buffer[layer_id], pool.v_buffer[layer_id],
                     seq_lens=fb.seq_lens, kv_indices=req_to_token, table_rows=fb.req_pool_indices,
                     softmax_scale=layer.scaling, max_context_len=req_to_token.shape[1])

``fb.seq_lens`` counts the current token (its K/V is already in the pool); ``max_context_len`` is a
shape (the table width), so the decode launch is the same for any lengths: CUDA-graph capturable.
With page size P > 1, pass a page table ``kv_indices[row, pos // P]`` (page ids) and ``page_size=P``.
"""

from __future__ import annotations

import torch

from areal_tik_plugin.runtime import loader as _loader
from areal_tik_plugin.ops import _validate as V


def _impl():
    return _loader.current_module("attention")


def _check_qkv(q, k, v, *, q_ndim, kv_ndim, head_axis, kv_names=("k", "v")):
    kn, vn = kv_names
    V.tensor("q", q, ndim=q_ndim, dtypes=V.FLOAT_DTYPES, contiguous_last=True)
    V.tensor(kn, k, ndim=kv_ndim, dtypes=V.FLOAT_DTYPES, device=q.device, contiguous_last=True)
    V.tensor(vn, v, ndim=kv_ndim, dtypes=V.FLOAT_DTYPES, device=q.device, contiguous_last=True)
    V.same_dtype("q", q, **{kn: k, vn: v})
    D = q.shape[-1]
    V.power_of_two_head_dim("q.shape[-1]", D)
    if k.shape[-1] != D or v.shape[-1] != D:
        raise ValueError(f"{kn}, {vn}: expected head_dim {D} (same as q), got {k.shape[-1]} and {v.shape[-1]}")
    if k.shape != v.shape:
        raise ValueError(f"{vn}: expected the shape of {kn} {tuple(k.shape)}, got {tuple(v.shape)}")
    hq, hkv = q.shape[-2], k.shape[head_axis]
    if hkv == 0 or hq % hkv != 0:
        raise ValueError(f"q heads ({hq}) must be a positive multiple of kv heads ({hkv})")
    if hq // hkv > 64:
        raise ValueError(f"GQA group size {hq // hkv} > 64 is not supported")
    return D


def _scale(softmax_scale, D):
    if softmax_scale is None:
        return D ** -0.5
    return V.positive_float("softmax_scale", softmax_scale)


def _check_index(name, x, device, ndim=1):
    V.tensor(name, x, ndim=ndim, dtypes=V.INDEX_DTYPES, device=device, contiguous=True)
    return x


class _AttnVarlen(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, cu_seqlens, max_seqlen, scale):
        impl = _impl()
        need_grad = any(t.requires_grad for t in (q, k, v))
        if need_grad:
            o, lse = impl.prefill(q, k, v, cu_seqlens, max_seqlen, scale, return_lse=True)
            ctx.save_for_backward(q, k, v, o, lse, cu_seqlens)
        else:
            o = impl.prefill(q, k, v, cu_seqlens, max_seqlen, scale)
        ctx.max_seqlen, ctx.scale = max_seqlen, scale
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse, cu = ctx.saved_tensors
        dq, dk, dv = _impl().prefill_backward(do, q, k, v, o, lse, cu, ctx.max_seqlen, ctx.scale)
        return dq, dk, dv, None, None, None


def attention_varlen(q, k, v, cu_seqlens, max_seqlen=None, softmax_scale=None):
    """Causal self-attention over packed variable-length sequences (training forward, prefill).

    Parameters
    ----------
    q : Tensor [T, Hq, D] bf16/fp16 (last dim contiguous)
    k, v : Tensor [T, Hkv, D], Hq a multiple of Hkv (GQA)
    cu_seqlens : int32/int64 Tensor [B+1], 0 = cu[0] <= cu[1] <= ... = T
    max_seqlen : int, longest sequence (avoids a host sync); computed when None
    softmax_scale : float, default D**-0.5

    Returns
    -------
    Tensor [T, Hq, D], differentiable w.r.t. q, k, v.

    Value checks (cu_seqlens monotone from 0 to T, max_seqlen >= the longest run; with max_seqlen=None
    the offsets are read anyway) read tensor values, a host sync: they run on CPU tensors always and on
    CUDA tensors only with ``TIK_CHECK_VALUES=1`` outside CUDA-graph capture (SGLang's decode is
    captured); a bad value on the GPU otherwise gives undefined rows.
    """
    key = (V.sig(q), V.sig(k), V.sig(v), V.sig(cu_seqlens), V.sig(softmax_scale))
    _MEMO_VARLEN.once(key, lambda: _scale(softmax_scale, _check_varlen(q, k, v, cu_seqlens)))
    max_seqlen = _varlen_max_seqlen(q, cu_seqlens, max_seqlen)
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else float(softmax_scale)
    return _AttnVarlen.apply(q, k, v, cu_seqlens, max_seqlen, scale)


def _check_varlen(q, k, v, cu_seqlens):
    """Static checks of :func:`attention_varlen` -> head_dim."""
    D = _check_qkv(q, k, v, q_ndim=3, kv_ndim=3, head_axis=1)
    if k.shape[0] != q.shape[0]:
        raise ValueError(f"k: expected {q.shape[0]} tokens (same as q), got {k.shape[0]}")
    _check_index("cu_seqlens", cu_seqlens, q.device)
    if cu_seqlens.numel() < 2:
        raise ValueError("cu_seqlens: expected at least 2 entries [0, ..., total_tokens]")
    return D


def _varlen_max_seqlen(q, cu_seqlens, max_seqlen):
    """``max_seqlen`` checked, or computed from the offsets (a host sync) when None. The offsets' value
    check (start 0, non-decreasing, end T; ``max_seqlen`` not below the longest run) runs whenever the
    offsets are read anyway (``max_seqlen=None``) and where value checks run (:func:`V.check_values`)."""
    if max_seqlen is not None:
        if isinstance(max_seqlen, bool) or not isinstance(max_seqlen, int):
            raise TypeError(f"max_seqlen: expected a non-negative int, got {max_seqlen!r}")
        if max_seqlen < 0:
            raise ValueError(f"max_seqlen: expected a non-negative int, got {max_seqlen!r}")
    if max_seqlen is None or V.check_values(q.device):
        lens = cu_seqlens[1:] - cu_seqlens[:-1]
        if int(cu_seqlens[0]) != 0 or int(cu_seqlens[-1]) != q.shape[0] or bool((lens < 0).any()):
            raise ValueError(f"cu_seqlens: expected non-decreasing offsets from 0 to {q.shape[0]}, got {cu_seqlens.tolist()}")
        longest = int(lens.max())
        if max_seqlen is None:
            max_seqlen = longest
        elif max_seqlen < longest:
            raise ValueError(f"max_seqlen: {max_seqlen} is smaller than the longest sequence {longest} (cu_seqlens)")
    return max_seqlen


def _check_paged(k_cache, v_cache, kv_indices, table_rows, page_size, device, n_req):
    V.tensor("k_cache", k_cache, ndim=3, dtypes=V.FLOAT_DTYPES, device=device, contiguous_last=True)
    if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1 or page_size & (page_size - 1):
        raise ValueError(f"page_size: expected a power of two >= 1, got {page_size!r}")
    _check_index("kv_indices", kv_indices, device, ndim=2)
    _check_index("table_rows", table_rows, device)
    if table_rows.numel() != n_req:
        raise ValueError(f"table_rows: expected {n_req} entries (one per request), got {table_rows.numel()}")


def _check_slots(k_cache, kv_indices, table_rows, ctx_lens, page_size):
    """Every slot a request will read lies inside the pool (value check; needs a host sync)."""
    n_slots = k_cache.shape[0]
    for r, n in zip(table_rows.tolist(), ctx_lens.tolist()):
        if not 0 <= r < kv_indices.shape[0]:
            raise ValueError(f"table_rows: expected values in [0, {kv_indices.shape[0]}), got {r}")
        if n > kv_indices.shape[1] * page_size:
            raise ValueError(f"context length {n} exceeds the kv_indices table width {kv_indices.shape[1]} x page_size {page_size}")
        ids = kv_indices[r, : (n + page_size - 1) // page_size].to(torch.int64)
        hi = (ids.max() * page_size + page_size - 1) if ids.numel() else torch.tensor(0)
        if ids.numel() and (int(ids.min()) < 0 or int(hi) >= n_slots):
            raise ValueError(f"kv_indices: request row {r} points at slots outside the pool [0, {n_slots}) "
                             f"(min id {int(ids.min())}, max slot {int(hi)})")


def attention_extend(q, k_cache, v_cache, *, cu_seqlens_q, prefix_lens, kv_indices, table_rows,
                     max_extend_len=None, softmax_scale=None, page_size=1):
    """New tokens attend causally to themselves plus their request's cached prefix (paged KV).

    Parameters
    ----------
    q : Tensor [T, Hq, D], the new tokens of B requests packed by ``cu_seqlens_q`` [B+1]
    k_cache, v_cache : Tensor [slots, Hkv, D], the pool; the new tokens' K/V already written
    prefix_lens : int Tensor [B], cached tokens before each request's first new token
    kv_indices : int Tensor [R, W]; page_size 1: slot of token ``pos`` of row r is ``kv_indices[r, pos]``
        (SGLang ``req_to_token``); page_size P: page id of ``pos`` is ``kv_indices[r, pos // P]``
    table_rows : int Tensor [B], the row of ``kv_indices`` for each request (``req_pool_indices``)
    max_extend_len : int, longest new-token run (computed with a host sync when None)

    Returns
    -------
    Tensor [T, Hq, D]

    Value checks (cu_seqlens_q, prefix_lens >= 0, context within the table, table_rows and slots inside
    the table and pool) read tensor values, a host sync: they run on CPU tensors always and on CUDA
    tensors only with ``TIK_CHECK_VALUES=1`` outside CUDA-graph capture (SGLang's decode is captured); a
    bad value on the GPU otherwise gives undefined rows.
    """
    key = (V.sig(q), V.sig(k_cache), V.sig(v_cache), V.sig(cu_seqlens_q), V.sig(prefix_lens), V.sig(kv_indices),
           V.sig(table_rows), V.sig(softmax_scale), V.sig(page_size))
    _MEMO_EXTEND.once(key, lambda: _scale(softmax_scale, _check_extend(
        q, k_cache, v_cache, cu_seqlens_q, prefix_lens, kv_indices, table_rows, page_size)))
    max_extend_len = _extend_values(q, k_cache, cu_seqlens_q, prefix_lens, kv_indices, table_rows, max_extend_len,
                                    page_size)
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else float(softmax_scale)
    return _impl().extend(q, k_cache, v_cache, cu_seqlens_q, prefix_lens, kv_indices, table_rows,
                          max_extend_len, scale, page_size)


def _check_extend(q, k_cache, v_cache, cu_seqlens_q, prefix_lens, kv_indices, table_rows, page_size):
    """Static checks of :func:`attention_extend` -> head_dim."""
    D = _check_qkv(q, k_cache, v_cache, q_ndim=3, kv_ndim=3, head_axis=1, kv_names=("k_cache", "v_cache"))
    _check_index("cu_seqlens_q", cu_seqlens_q, q.device)
    B = cu_seqlens_q.numel() - 1
    if B < 1:
        raise ValueError("cu_seqlens_q: expected at least 2 entries")
    _check_index("prefix_lens", prefix_lens, q.device)
    if prefix_lens.numel() != B:
        raise ValueError(f"prefix_lens: expected {B} entries, got {prefix_lens.numel()}")
    _check_paged(k_cache, v_cache, kv_indices, table_rows, page_size, q.device, B)
    return D


def _extend_values(q, k_cache, cu_seqlens_q, prefix_lens, kv_indices, table_rows, max_extend_len, page_size):
    """``max_extend_len`` (computed with a host sync when None) and the value checks (CPU always, GPU
    with ``TIK_CHECK_VALUES=1``): every call."""
    if max_extend_len is None:
        max_extend_len = int((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).max())
    elif isinstance(max_extend_len, bool) or not isinstance(max_extend_len, int):
        raise TypeError(f"max_extend_len: expected a non-negative int, got {max_extend_len!r}")
    elif max_extend_len < 0:
        raise ValueError(f"max_extend_len: expected a non-negative int, got {max_extend_len!r}")
    if V.check_values(q.device):
        lens = cu_seqlens_q[1:] - cu_seqlens_q[:-1]
        if int(cu_seqlens_q[0]) != 0 or int(cu_seqlens_q[-1]) != q.shape[0] or bool((lens < 0).any()):
            raise ValueError(f"cu_seqlens_q: expected non-decreasing offsets from 0 to {q.shape[0]}, "
                             f"got {cu_seqlens_q.tolist()}")
        if int(lens.max()) > max_extend_len:
            raise ValueError(f"max_extend_len: {max_extend_len} is smaller than the longest run {int(lens.max())}")
        if int(prefix_lens.min()) < 0:
            raise ValueError(f"prefix_lens: expected non-negative lengths, got {prefix_lens.tolist()}")
        ctx = prefix_lens.to(torch.int64) + lens.to(torch.int64)
        if int(ctx.max()) > kv_indices.shape[1] * page_size:
            raise ValueError(f"context length {int(ctx.max())} exceeds the kv_indices table width "
                             f"{kv_indices.shape[1]} x page_size {page_size}")
        if int(table_rows.max()) >= kv_indices.shape[0] or int(table_rows.min()) < 0:
            raise ValueError(f"table_rows: expected values in [0, {kv_indices.shape[0]}), got {table_rows.tolist()}")
        _check_slots(k_cache, kv_indices, table_rows, ctx, page_size)
    return max_extend_len


def attention_decode(q, k_cache, v_cache, *, seq_lens, kv_indices=None, table_rows=None, softmax_scale=None,
                     page_size=1, max_context_len=None, out=None):
    """One query token per request against its KV cache (lengths may differ within the batch).

    Parameters
    ----------
    q : Tensor [B, Hq, D]
    k_cache, v_cache : paged pool [slots, Hkv, D] (with ``kv_indices``/``table_rows``, see
        :func:`attention_extend`) or a dense cache [B, S, Hkv, D] (``kv_indices=None``)
    seq_lens : int Tensor [B], context length including the current token (its K/V written)
    max_context_len : int, an upper bound of ``seq_lens`` fixed for the capture (default: table
        width x page_size, or S). The launch depends only on shapes: CUDA-graph capturable.

    Returns
    -------
    Tensor [B, Hq, D]

    Value checks (1 <= seq_lens <= min(max_context_len, capacity), table_rows and slots inside the table
    and pool) read tensor values, a host sync: they run on CPU tensors always and on CUDA tensors only
    with ``TIK_CHECK_VALUES=1`` outside CUDA-graph capture (SGLang's decode is captured); a bad value on
    the GPU otherwise gives undefined rows.
    """
    key = (V.sig(q), V.sig(k_cache), V.sig(v_cache), V.sig(seq_lens), V.sig(kv_indices), V.sig(table_rows),
           V.sig(softmax_scale), V.sig(page_size), V.sig(max_context_len), V.sig(out))
    _MEMO_DECODE.once(key, _check_decode, q, k_cache, v_cache, seq_lens, kv_indices, table_rows, softmax_scale,
                      page_size, max_context_len, out)
    cap = kv_indices.shape[1] * page_size if kv_indices is not None else k_cache.shape[1]
    if max_context_len is None:
        max_context_len = cap
    if V.check_values(q.device):
        _decode_values(q, k_cache, seq_lens, kv_indices, table_rows, page_size, min(max_context_len, cap))
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else float(softmax_scale)
    return _impl().decode(q, k_cache, v_cache, seq_lens, kv_indices, table_rows, scale, page_size, max_context_len,
                          out=out)


def _check_decode(q, k_cache, v_cache, seq_lens, kv_indices, table_rows, softmax_scale, page_size, max_context_len,
                  out):
    """Static checks of :func:`attention_decode`."""
    dense = kv_indices is None
    D = _check_qkv(q, k_cache, v_cache, q_ndim=3, kv_ndim=3 if not dense else 4, head_axis=1 if not dense else 2,
                   kv_names=("k_cache", "v_cache"))
    B = q.shape[0]
    _check_index("seq_lens", seq_lens, q.device)
    if seq_lens.numel() != B:
        raise ValueError(f"seq_lens: expected {B} entries (one per request), got {seq_lens.numel()}")
    if dense:
        if table_rows is not None:
            raise ValueError("table_rows: expected None with a dense cache (kv_indices=None)")
        if k_cache.shape[0] != B:
            raise ValueError(f"k_cache: expected a dense cache [B={B}, S, Hkv, D], got {tuple(k_cache.shape)}")
    else:
        if table_rows is None:
            raise ValueError("table_rows: expected an int tensor [B] with a paged cache")
        _check_paged(k_cache, v_cache, kv_indices, table_rows, page_size, q.device, B)
    if max_context_len is not None and (isinstance(max_context_len, bool) or not isinstance(max_context_len, int)
                                        or max_context_len < 1):
        raise TypeError(f"max_context_len: expected a positive int, got {max_context_len!r}")
    if out is not None:
        V.tensor("out", out, ndim=3, dtypes=(q.dtype,), device=q.device, contiguous_last=True)
        if out.shape != q.shape:
            raise ValueError(f"out: expected shape {tuple(q.shape)}, got {tuple(out.shape)}")
    _scale(softmax_scale, D)


def _decode_values(q, k_cache, seq_lens, kv_indices, table_rows, page_size, limit):
    """Value checks of :func:`attention_decode` (a host sync: CPU always, GPU with ``TIK_CHECK_VALUES=1``);
    ``limit``: min(max_context_len, the cache length S or the table width x page_size)."""
    if q.shape[0] and (int(seq_lens.min()) < 1 or int(seq_lens.max()) > limit):
        raise ValueError(f"seq_lens: expected values in [1, {limit}] (max_context_len and the cache / table "
                         f"capacity), got min {int(seq_lens.min())} max {int(seq_lens.max())}")
    if kv_indices is not None:
        _check_slots(k_cache, kv_indices, table_rows, seq_lens, page_size)


_MEMO_VARLEN, _MEMO_EXTEND, _MEMO_DECODE = V.Memo(), V.Memo(), V.Memo()
