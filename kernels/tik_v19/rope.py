"""NeoX (rotate-half) rotary position embedding on Q and K from arbitrary per-token positions.

Per token t with position p and rotary dim R = 2 * len(inv_freq) (R <= D; dims >= R pass through)::

    f      = float32(p) * inv_freq[j]                      # j < R/2, one fp32 multiply (as HF)
    c, s   = cos(f) * scaling, sin(f) * scaling            # fp32 (libdevice cosf/sinf on GPU)
    out[j]       = x[j] * c - x[j + R/2] * s               # fp32, contraction off,
    out[j + R/2] = x[j + R/2] * c + x[j] * s               # rounded once to the activation dtype

This is HF's ``q * cos + rotate_half(q) * sin`` with cos/sin kept in fp32 (HF rounds cos, sin and each
product to the activation dtype; we round once). The backward is the inverse rotation (s -> -s).

Token invariance: purely elementwise given (token row, position), so no launch shape can change a bit.
One program = one token x a block of heads; cos/sin are computed once per program (not per head).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._rowops import cdiv as _cdiv, next_pow2 as _next_pow2, interpreting, launch_opts, pdl_start, to_act
from ._rowops import launch

KNOBS = {"free": {"HEAD_ELEMS": (1024, 2048, 4096), "WARPS": (2, 4, 8), "TOKEN_TILES": (False, True),
                  "TOKEN_TILE_ELEMS": (2048, 4096, 8192), "TOKEN_WARPS": (4, 8),
                  "TOKEN_TILES_MIN_T": (1, 256, 1024, 4096), "HEAD_GROUPS": (False, True),
                  "KV_TOKEN_TILES": (False, True)}}
HEAD_ELEMS = 2048   # elements of one program's [BLOCK_HEADS, R/2] half-tile target
WARPS = 4
# forward/backward with one program per BLOCK_T tokens x all q and k heads (_rope_tokens_kernel) instead
# of one per (token, head block): fewer, evenly sized programs (Qwen2.5-1.5B's 12 / 2 heads left half
# of the per-token programs rotating 2 heads). BLOCK_T = largest power of two with
# BLOCK_T * (pow2(Hq) + pow2(Hkv)) * pow2(R/2) <= TOKEN_TILE_ELEMS. Used from TOKEN_TILES_MIN_T tokens
# (H200 probe, graph replay: T 4096 / 16384 faster on every model, Qwen2.5-1.5B 22.5 -> 9.6
# and 84.1 -> 38.2 us, HBM share at T >= 4096 0.52 -> 0.75; T 1 / 256 0.1-1.1 us slower).
# H200 probe (inputs streamed from HBM): TOKEN_TILE_ELEMS 2048
# against 8192 at TOKEN_WARPS 2, HBM share at T 4096 / 16384: Qwen2.5-1.5B 0.719 / 0.737 -> 0.713 / 0.759,
# Qwen3-4B 0.755 / 0.864 -> 0.763 / 0.882, Qwen3-30B-A3B 0.717 / 0.836 -> 0.757 / 0.850.
# Token tiles over a head count that is not a power of two (Qwen2.5-1.5B: 12 q heads): HEAD_GROUPS rotates
# the heads in groups of the largest power of two dividing the count (12 -> 3 x 4) instead of one tile
# padded to the next power of two (12 -> 16, a quarter of the lanes masked); the tile budget
# TOKEN_TILE_ELEMS then counts real heads. H200 probe:
# Qwen2.5-1.5B at T 4096 / 16384, default (2048, padded) 0.713 / 0.736 of HBM -> 4096 with head groups
# 0.752 / 0.756 (2048 with head groups: 0.567 / 0.631, one token per program); Qwen3-4B and Qwen3-30B-A3B
# (power-of-two heads, groups change nothing) 2048 vs 4096 within +-2%, the spread of repeated configs.
TOKEN_TILES = True
TOKEN_TILES_MIN_T = 1024
TOKEN_TILE_ELEMS = 4096
TOKEN_WARPS = 2
HEAD_GROUPS = True
# forward_kv_write (SGLang's fused RoPE + set_kv_buffer; the rollout prefill of tik verify and the layer
# bench) on the token-tile kernel from TOKEN_TILES_MIN_T tokens, the rotated k rows and the v rows written
# to their pool slots by the same program (free knob; off: one program per (token, head block)). H200
# probe (q / k / v views of a fused QKV, 2^18-slot pool),
# share of HBM at T 4096 / 16384, head blocks -> token tiles (TOKEN_TILE_ELEMS 4096): Qwen2.5-1.5B 0.316 /
# 0.335 -> 0.743 / 0.760, Qwen3-4B 0.698 / 0.769 -> 0.746 / 0.870, Qwen3-30B-A3B 0.616 / 0.645 -> 0.707 /
# 0.770; same bits.
KV_TOKEN_TILES = True


@triton.jit
def _rotate_heads(X, O, t, h0, NH, sxt, sxh, c, s,
                  HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_HEADS: tl.constexpr,
                  D: tl.constexpr, PASS_BLOCK: tl.constexpr, INTERP: tl.constexpr,
                  o_row=None, sot=0, soh=0, OUT_STRIDED: tl.constexpr = False):
    """Rotate heads [h0, h0 + BLOCK_HEADS) of token t; output row (t, head) contiguous [T, NH, D], or
    at ``o_row * sot + head * soh`` (OUT_STRIDED: a KV-pool slot)."""
    heads = h0 + tl.arange(0, BLOCK_HEADS)
    j = tl.arange(0, BLOCK_HALF)
    hmask = heads < NH
    mask = hmask[:, None] & (j < HALF)[None, :]
    xrow = X + t.to(tl.int64) * sxt + heads.to(tl.int64)[:, None] * sxh
    if OUT_STRIDED:
        orow = O + o_row.to(tl.int64) * sot + heads.to(tl.int64)[:, None] * soh
    else:
        orow = O + (t.to(tl.int64) * NH + heads.to(tl.int64))[:, None] * D
    x1 = tl.load(xrow + j[None, :], mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(xrow + HALF + j[None, :], mask=mask, other=0.0).to(tl.float32)
    o1 = x1 * c[None, :] - x2 * s[None, :]
    o2 = x2 * c[None, :] + x1 * s[None, :]
    tl.store(orow + j[None, :], to_act(o1, O.dtype.element_ty, INTERP), mask=mask)
    tl.store(orow + HALF + j[None, :], to_act(o2, O.dtype.element_ty, INTERP), mask=mask)
    if PASS_BLOCK > 0:  # dims [2*HALF, D) pass through unchanged
        pj = 2 * HALF + tl.arange(0, PASS_BLOCK)
        pmask = hmask[:, None] & (pj < D)[None, :]
        xp = tl.load(xrow + pj[None, :], mask=pmask, other=0.0)
        tl.store(orow + pj[None, :], xp, mask=pmask)


@triton.jit
def _rope_kernel(
    Q, K, QO, KO, POS, INV_FREQ,
    sqt, sqh, skt, skh, scaling,
    HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, HALF: tl.constexpr,
    BLOCK_HALF: tl.constexpr, BLOCK_HEADS: tl.constexpr, PASS_BLOCK: tl.constexpr,
    BACKWARD: tl.constexpr, INTERP: tl.constexpr,
    VIN=None, VC=None, LOC=None, svt=0, svh=0, skc_t=0, skc_h=0, svc_t=0, svc_h=0,
    KV_WRITE: tl.constexpr = False, BLOCK_D: tl.constexpr = 1, PDL: tl.constexpr = False,
):
    pdl_start(PDL)
    t = tl.program_id(0)
    hb = tl.program_id(1)
    j = tl.arange(0, BLOCK_HALF)
    pos = tl.load(POS + t).to(tl.float32)
    inv = tl.load(INV_FREQ + j, mask=j < HALF, other=0.0)
    f = pos * inv
    c = tl.cos(f) * scaling
    s = tl.sin(f) * scaling
    if BACKWARD:
        s = -s
    NQB: tl.constexpr = (HQ + BLOCK_HEADS - 1) // BLOCK_HEADS
    if hb < NQB:
        _rotate_heads(Q, QO, t, hb * BLOCK_HEADS, HQ, sqt, sqh, c, s,
                      HALF, BLOCK_HALF, BLOCK_HEADS, D, PASS_BLOCK, INTERP)
    elif KV_WRITE:  # rotated k rows go to the KV pool at slot LOC[t]; v rows are copied there (exact)
        h0 = (hb - NQB) * BLOCK_HEADS
        slot = tl.load(LOC + t)
        _rotate_heads(K, KO, t, h0, HKV, skt, skh, c, s,
                      HALF, BLOCK_HALF, BLOCK_HEADS, D, PASS_BLOCK, INTERP, slot, skc_t, skc_h, True)
        heads = h0 + tl.arange(0, BLOCK_HEADS)
        d = tl.arange(0, BLOCK_D)
        vmask = (heads < HKV)[:, None] & (d < D)[None, :]
        vrow = tl.load(VIN + t.to(tl.int64) * svt + heads.to(tl.int64)[:, None] * svh + d[None, :], mask=vmask)
        tl.store(VC + slot.to(tl.int64) * svc_t + heads.to(tl.int64)[:, None] * svc_h + d[None, :], vrow, mask=vmask)
    else:
        _rotate_heads(K, KO, t, (hb - NQB) * BLOCK_HEADS, HKV, skt, skh, c, s,
                      HALF, BLOCK_HALF, BLOCK_HEADS, D, PASS_BLOCK, INTERP)


@triton.jit
def _rotate_tokens(X, O, tt, t_ok, NH: tl.constexpr, sxt, sxh, c, s,
                   HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, BH: tl.constexpr,
                   D: tl.constexpr, PASS_BLOCK: tl.constexpr, INTERP: tl.constexpr,
                   o_rows=None, sot=0, soh=0, OUT_STRIDED: tl.constexpr = False):
    """Rotate every head of BLOCK_T tokens in tiles [BLOCK_T, BH, BLOCK_HALF], heads [h0, h0 + BH) for h0 =
    0, BH, .. < NH (BH >= NH: one tile, padded); c, s [BLOCK_T, BLOCK_HALF]. Output rows contiguous
    [T, NH, D], or (OUT_STRIDED) at ``o_rows[t] * sot + head * soh`` (KV-pool slots)."""
    j = tl.arange(0, BLOCK_HALF)
    for h0 in tl.static_range(0, NH, BH):
        heads = h0 + tl.arange(0, BH)
        rowmask = t_ok[:, None] & (heads < NH)[None, :]
        mask = rowmask[:, :, None] & (j < HALF)[None, None, :]
        xrow = X + tt.to(tl.int64)[:, None] * sxt + heads.to(tl.int64)[None, :] * sxh
        if OUT_STRIDED:
            orow = O + o_rows.to(tl.int64)[:, None] * sot + heads.to(tl.int64)[None, :] * soh
        else:
            orow = O + (tt.to(tl.int64)[:, None] * NH + heads.to(tl.int64)[None, :]) * D
        x1 = tl.load(xrow[:, :, None] + j[None, None, :], mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(xrow[:, :, None] + HALF + j[None, None, :], mask=mask, other=0.0).to(tl.float32)
        o1 = x1 * c[:, None, :] - x2 * s[:, None, :]
        o2 = x2 * c[:, None, :] + x1 * s[:, None, :]
        tl.store(orow[:, :, None] + j[None, None, :], to_act(o1, O.dtype.element_ty, INTERP), mask=mask)
        tl.store(orow[:, :, None] + HALF + j[None, None, :], to_act(o2, O.dtype.element_ty, INTERP), mask=mask)
        if PASS_BLOCK > 0:  # dims [2*HALF, D) pass through unchanged
            pj = 2 * HALF + tl.arange(0, PASS_BLOCK)
            pmask = rowmask[:, :, None] & (pj < D)[None, None, :]
            xp = tl.load(xrow[:, :, None] + pj[None, None, :], mask=pmask, other=0.0)
            tl.store(orow[:, :, None] + pj[None, None, :], xp, mask=pmask)


@triton.jit
def _copy_tokens(VIN, VC, tt, t_ok, slots, NH: tl.constexpr, svt, svh, svc_t, svc_h,
                 BH: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr):
    """VC[slots[t], h, :] = VIN[t, h, :] for BLOCK_T tokens, heads in tiles of BH (an exact copy)."""
    d = tl.arange(0, BLOCK_D)
    for h0 in tl.static_range(0, NH, BH):
        heads = h0 + tl.arange(0, BH)
        m = (t_ok[:, None] & (heads < NH)[None, :])[:, :, None] & (d < D)[None, None, :]
        src = VIN + tt.to(tl.int64)[:, None, None] * svt + heads.to(tl.int64)[None, :, None] * svh + d[None, None, :]
        dst = VC + slots.to(tl.int64)[:, None, None] * svc_t + heads.to(tl.int64)[None, :, None] * svc_h \
            + d[None, None, :]
        tl.store(dst, tl.load(src, mask=m), mask=m)


@triton.jit(do_not_specialize=["T"])
def _rope_tokens_kernel(
    Q, K, QO, KO, POS, INV_FREQ, T,
    sqt, sqh, skt, skh, scaling,
    HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, HALF: tl.constexpr,
    BLOCK_HALF: tl.constexpr, BQ: tl.constexpr, BK: tl.constexpr, BLOCK_T: tl.constexpr,
    PASS_BLOCK: tl.constexpr, BACKWARD: tl.constexpr, INTERP: tl.constexpr, PDL: tl.constexpr = False,
    VIN=None, VC=None, LOC=None, svt=0, svh=0, skc_t=0, skc_h=0, svc_t=0, svc_h=0,
    KV_WRITE: tl.constexpr = False, BLOCK_D: tl.constexpr = 1,
):
    """One program = BLOCK_T tokens x every q and k head: cos/sin once per (token, frequency), the
    same per-element arithmetic as :func:`_rope_kernel` (the variant is a free knob). KV_WRITE: the
    rotated k rows go to the pool KO at slots LOC[t] and v's rows are copied to VC there."""
    pdl_start(PDL)
    tt = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    t_ok = tt < T
    j = tl.arange(0, BLOCK_HALF)
    pos = tl.load(POS + tt, mask=t_ok, other=0).to(tl.float32)
    inv = tl.load(INV_FREQ + j, mask=j < HALF, other=0.0)
    f = pos[:, None] * inv[None, :]
    c = tl.cos(f) * scaling
    s = tl.sin(f) * scaling
    if BACKWARD:
        s = -s
    _rotate_tokens(Q, QO, tt, t_ok, HQ, sqt, sqh, c, s, HALF, BLOCK_HALF, BQ, D, PASS_BLOCK, INTERP)
    if KV_WRITE:
        slots = tl.load(LOC + tt, mask=t_ok, other=0)
        _rotate_tokens(K, KO, tt, t_ok, HKV, skt, skh, c, s, HALF, BLOCK_HALF, BK, D, PASS_BLOCK, INTERP,
                       slots, skc_t, skc_h, True)
        _copy_tokens(VIN, VC, tt, t_ok, slots, HKV, svt, svh, svc_t, svc_h, BK, D, BLOCK_D)
    elif HKV > 0:
        _rotate_tokens(K, KO, tt, t_ok, HKV, skt, skh, c, s, HALF, BLOCK_HALF, BK, D, PASS_BLOCK, INTERP)


def _token_tile(T, hq, hkv, block_half, extra_per_t=0):
    """(BQ, BK, BLOCK_T) of the token-tile kernel: head tiles (HEAD_GROUPS: the largest power of two
    dividing the head count, else one padded tile) and the most tokens (a power of two, < 2T) whose
    elements per program stay within TOKEN_TILE_ELEMS (``extra_per_t``: the v copy's per-token elements)."""
    if HEAD_GROUPS:  # groups of the largest power of two dividing the head count; budget in real heads
        bq, bk = hq & -hq, (hkv & -hkv if hkv else 1)
        per_t = (hq + hkv) * block_half
    else:
        bq, bk = _next_pow2(hq), (_next_pow2(hkv) if hkv else 1)
        per_t = (bq + bk) * block_half
    per_t += extra_per_t
    bt = 1
    while 2 * bt * per_t <= TOKEN_TILE_ELEMS and bt < T:
        bt *= 2
    return bq, bk, bt


def _config(hq, hkv, half):
    block_half = _next_pow2(half)
    bh = max(1, min(_next_pow2(max(hq, hkv)), HEAD_ELEMS // block_half))
    return block_half, bh


def forward(q, k, positions, inv_freq, attention_scaling=1.0, backward=False):
    """q [T, Hq, D], k [T, Hkv, D] or None (last dim contiguous), positions int [T], inv_freq fp32
    [R/2]. Returns (q_out, k_out) contiguous (k_out None when k is None). ``backward=True`` applies
    the inverse rotation (the gradient of the forward)."""
    import torch

    T, hq, D = q.shape
    half = inv_freq.numel()
    q_out = torch.empty((T, hq, D), dtype=q.dtype, device=q.device)
    if k is None:
        k_arg, hkv, skt, skh, k_out = q, 0, 0, 0, None
    else:
        hkv = k.shape[1]
        k_out = torch.empty((T, hkv, D), dtype=k.dtype, device=k.device)
        k_arg, skt, skh = k, k.stride(0), k.stride(1)
    if T == 0:
        return q_out, k_out
    pass_block = _next_pow2(D - 2 * half) if D > 2 * half else 0
    if TOKEN_TILES and T >= TOKEN_TILES_MIN_T:
        block_half = _next_pow2(half)
        bq, bk, bt = _token_tile(T, hq, hkv, block_half)
        launch(_rope_tokens_kernel, (_cdiv(T, bt),),
            q, k_arg, q_out, k_out if k_out is not None else q_out, positions, inv_freq, T,
            q.stride(0), q.stride(1), skt, skh, float(attention_scaling),
            HQ=hq, HKV=hkv, D=D, HALF=half, BLOCK_HALF=block_half, BQ=bq, BK=bk, BLOCK_T=bt,
            PASS_BLOCK=pass_block, BACKWARD=bool(backward), INTERP=interpreting(),
            **launch_opts(TOKEN_WARPS),
        )
        return q_out, k_out
    block_half, bh = _config(hq, hkv, half)
    nblocks = _cdiv(hq, bh) + (_cdiv(hkv, bh) if hkv else 0)
    launch(_rope_kernel, (T, nblocks),
        q, k_arg, q_out, k_out if k_out is not None else q_out, positions, inv_freq,
        q.stride(0), q.stride(1), skt, skh, float(attention_scaling),
        HQ=hq, HKV=hkv, D=D, HALF=half, BLOCK_HALF=block_half, BLOCK_HEADS=bh,
        PASS_BLOCK=pass_block, BACKWARD=bool(backward), INTERP=interpreting(),
        **launch_opts(WARPS),
    )
    return q_out, k_out


def forward_kv_write(q, k, v, positions, inv_freq, attention_scaling, k_cache, v_cache, loc):
    """RoPE on q and k with the rotated k rows written to ``k_cache[loc[t]]`` and v's rows copied to
    ``v_cache[loc[t]]`` (SGLang ``set_kv_buffer`` after RoPE), one launch. Returns q_out [T, Hq, D]
    contiguous. Bitwise: q_out and the pool rows equal :func:`forward` + an exact copy."""
    import torch

    T, hq, D = q.shape
    hkv = k.shape[1]
    half = inv_freq.numel()
    q_out = torch.empty((T, hq, D), dtype=q.dtype, device=q.device)
    if T == 0:
        return q_out
    pass_block = _next_pow2(D - 2 * half) if D > 2 * half else 0
    kv = dict(VIN=v, VC=v_cache, LOC=loc, svt=v.stride(0), svh=v.stride(1), skc_t=k_cache.stride(0),
              skc_h=k_cache.stride(1), svc_t=v_cache.stride(0), svc_h=v_cache.stride(1),
              KV_WRITE=True, BLOCK_D=_next_pow2(D))
    if KV_TOKEN_TILES and TOKEN_TILES and T >= TOKEN_TILES_MIN_T:
        block_half = _next_pow2(half)
        bq, bk, bt = _token_tile(T, hq, hkv, block_half, extra_per_t=hkv * _next_pow2(D) // 2)
        launch(_rope_tokens_kernel, (_cdiv(T, bt),),
            q, k, q_out, k_cache, positions, inv_freq, T,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), float(attention_scaling),
            HQ=hq, HKV=hkv, D=D, HALF=half, BLOCK_HALF=block_half, BQ=bq, BK=bk, BLOCK_T=bt,
            PASS_BLOCK=pass_block, BACKWARD=False, INTERP=interpreting(), **kv,
            **launch_opts(TOKEN_WARPS),
        )
        return q_out
    block_half, bh = _config(hq, hkv, half)
    nblocks = _cdiv(hq, bh) + _cdiv(hkv, bh)
    launch(_rope_kernel, (T, nblocks),
        q, k, q_out, k_cache, positions, inv_freq,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), float(attention_scaling),
        HQ=hq, HKV=hkv, D=D, HALF=half, BLOCK_HALF=block_half, BLOCK_HEADS=bh,
        PASS_BLOCK=pass_block, BACKWARD=False, INTERP=interpreting(), **kv,
        **launch_opts(WARPS),
    )
    return q_out


def backward(dq_out, dk_out, positions, inv_freq, attention_scaling=1.0):
    """Gradients w.r.t. q and k: the inverse rotation of the output gradients."""
    return forward(dq_out, dk_out, positions, inv_freq, attention_scaling, backward=True)
