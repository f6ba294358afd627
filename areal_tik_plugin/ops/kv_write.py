"""KV-cache write with SGLang ``MHATokenToKVPool.set_kv_buffer`` semantics (rollout only).

``k_cache[loc] = k; v_cache[loc] = v`` as an exact bit copy. Usage::

    kv_write(pool.k_buffer[layer_id], pool.v_buffer[layer_id], forward_batch.out_cache_loc,
             k.view(-1, Hkv, D), v.view(-1, Hkv, D))
"""

from __future__ import annotations

import torch

from areal_tik_plugin.runtime import loader as _loader
from areal_tik_plugin.ops import _validate as V

CACHE_DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn, torch.float8_e5m2)


def _impl():
    return _loader.current_module("kv_write")


_MEMO = V.Memo()


def kv_write(k_cache, v_cache, loc, k, v):
    """Write K/V rows of T tokens into the pool at slots ``loc``.

    Parameters
    ----------
    k_cache, v_cache : Tensor [slots, Hkv, D], last dim contiguous (written in place)
    loc : int32/int64 Tensor [T], slot of each token, 0 <= loc < slots (duplicates: unspecified winner)
    k, v : Tensor [T, Hkv, D], same dtype as the caches, last dim contiguous

    Returns
    -------
    None. The launch depends on shapes only (CUDA-graph capturable). The value check 0 <= loc < slots
    reads loc, a host sync: it runs on CPU tensors always and on CUDA tensors only with
    ``TIK_CHECK_VALUES=1`` outside CUDA-graph capture; an out-of-range slot on the GPU otherwise is
    undefined behaviour.
    """
    _MEMO.once((V.sig(k_cache), V.sig(v_cache), V.sig(loc), V.sig(k), V.sig(v)), _check, k_cache, v_cache, loc, k, v)
    _check_loc(k_cache, loc)
    _impl().forward(k_cache, v_cache, loc, k, v)


def _check(k_cache, v_cache, loc, k, v):
    V.tensor("k_cache", k_cache, ndim=3, dtypes=CACHE_DTYPES, contiguous_last=True)
    dev = k_cache.device
    V.tensor("v_cache", v_cache, ndim=3, dtypes=(k_cache.dtype,), device=dev, contiguous_last=True)
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"v_cache: expected shape {tuple(k_cache.shape)} (same as k_cache), got {tuple(v_cache.shape)}")
    _, hkv, D = k_cache.shape
    V.tensor("k", k, ndim=3, dtypes=(k_cache.dtype,), device=dev, contiguous_last=True, allow_empty=True)
    V.tensor("v", v, ndim=3, dtypes=(k_cache.dtype,), device=dev, contiguous_last=True, allow_empty=True)
    T = k.shape[0]
    if tuple(k.shape) != (T, hkv, D):
        raise ValueError(f"k: expected shape [T, {hkv}, {D}] (heads and head_dim of the cache), got {tuple(k.shape)}")
    if v.shape != k.shape:
        raise ValueError(f"v: expected shape {tuple(k.shape)} (same as k), got {tuple(v.shape)}")
    V.tensor("loc", loc, ndim=1, dtypes=V.INDEX_DTYPES, device=dev, contiguous=True, allow_empty=True)
    if loc.numel() != T:
        raise ValueError(f"loc: expected {T} entries (one per token), got {loc.numel()}")


def _check_loc(k_cache, loc):
    """Value check (a host sync; CPU always, GPU with ``TIK_CHECK_VALUES=1``): every call."""
    if loc.numel() and V.check_values(k_cache.device):
        lo, hi = int(loc.min()), int(loc.max())
        if lo < 0 or hi >= k_cache.shape[0]:
            raise ValueError(f"loc: expected slots in [0, {k_cache.shape[0]}), got min {lo} max {hi}")
