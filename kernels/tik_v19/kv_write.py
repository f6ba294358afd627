"""KV-cache write (SGLang ``set_kv_buffer`` semantics): k_cache[loc[i]] = k[i], v_cache[loc[i]] = v[i].

A bit copy through integer views of the same width (no float conversion, NaN payloads kept). One
program copies a tile of tokens x KV heads (~TILE_ELEMS elements); out-of-range slots are skipped (``ops.kv_write`` rejects them when it may read
values). The launch depends on shapes only: CUDA-graph capturable.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._rowops import cdiv as _cdiv, next_pow2 as _next_pow2, launch_opts, pdl_start
from ._rowops import launch

KNOBS = {"free": {"TILE_ELEMS": (1024, 2048, 4096), "WARPS": (1, 2, 4)}}
TILE_ELEMS = 2048
WARPS = 4

_INT_VIEW = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


@triton.jit
def _kv_write_kernel(
    K, V, KC, VC, LOC, T, n_slots,
    skt, skh, svt, svh, skct, skch, svct, svch,
    HKV: tl.constexpr, D: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """One program copies BLOCK_T tokens x all KV heads (in blocks of BLOCK_H heads) of K and V."""
    pdl_start(PDL)
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    t_ok = t < T
    slot = tl.load(LOC + t, mask=t_ok, other=-1).to(tl.int64)
    ok = t_ok & (slot >= 0) & (slot < n_slots)
    t3 = t.to(tl.int64)[:, None, None]
    s3 = slot[:, None, None]
    ok3 = ok[:, None, None]
    d = tl.arange(0, BLOCK_D)[None, None, :]
    for h0 in tl.static_range(0, HKV, BLOCK_H):
        h = h0 + tl.arange(0, BLOCK_H)
        h3 = h.to(tl.int64)[None, :, None]
        m = ok3 & (h3 < HKV) & (d < D)
        kx = tl.load(K + t3 * skt + h3 * skh + d, mask=m)
        tl.store(KC + s3 * skct + h3 * skch + d, kx, mask=m)
        vx = tl.load(V + t3 * svt + h3 * svh + d, mask=m)
        tl.store(VC + s3 * svct + h3 * svch + d, vx, mask=m)


def forward(k_cache, v_cache, loc, k, v):
    """k/v [T, Hkv, D] into k_cache/v_cache [slots, Hkv, D] at rows ``loc`` [T] (int32/int64)."""
    T, hkv, D = k.shape
    if T == 0:
        return None
    iv = _INT_VIEW[k.element_size()]
    kc, vc, ki, vi = k_cache.view(iv), v_cache.view(iv), k.view(iv), v.view(iv)
    block_d = _next_pow2(D)
    block_h = max(1, min(_next_pow2(hkv), TILE_ELEMS // block_d))
    block_t = max(1, TILE_ELEMS // (block_h * block_d))
    launch(_kv_write_kernel, (_cdiv(T, block_t),),
        ki, vi, kc, vc, loc, T, k_cache.shape[0],
        ki.stride(0), ki.stride(1), vi.stride(0), vi.stride(1),
        kc.stride(0), kc.stride(1), vc.stride(0), vc.stride(1),
        HKV=hkv, D=D, BLOCK_T=block_t, BLOCK_H=block_h, BLOCK_D=block_d, **launch_opts(WARPS),
    )
    return None
