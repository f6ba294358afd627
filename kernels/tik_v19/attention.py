"""Unified causal attention: full-sequence (varlen), extend over a paged KV cache, paged decode.

Token invariance (see ``contract.py``): for a query row at absolute position ``i`` every path
computes, with the same instructions,

    for each split s of ATTN_SPLIT_KV keys (absolute positions), in order:
        (m_s, l_s, acc_s) = online softmax over the split's ATTN_KV_TILE-wide key tiles <= i
        (M, L, ACC)      = merge((M, L, ACC), (m_s, l_s, acc_s))
    out = ACC / L

Full-sequence and extend run the splits in sequence inside one program (cheap register merges);
decode runs them in parallel programs and merges the partial states in a second kernel in the same
order with the same helper. Row sums of P come out of the tensor cores (``dot(P, ones)``) so they do
not depend on the register layout of a tile, and FP contraction is off so ``a*b+c`` is never fused
differently on two paths.

KV addressing (constexpr ``KV_LAYOUT``):
    0  contiguous packed   k[total_k, Hkv, D] with per-sequence start offsets
    1  token table         k_pool[slots, Hkv, D], slot = table[row, pos]          (SGLang page size 1)
    2  page table          k_pool[slots, Hkv, D], slot = table[row, pos // P] * P + pos % P
    3  dense cache         k_cache[B, S, Hkv, D]  (decode only)
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from ._rowops import (cdiv as _cdiv, interpreting as _rowops_interpreting, launch_opts as _rowops_launch_opts,
                      next_pow2 as _next_pow2, pdl_start, tickets as _tickets)
from ._rowops import launch

from . import contract as C

LOG2E = 1.4426950408889634

# Free knobs (may differ per path; bits do not depend on them).
PREFILL_BLOCK_M = {"gpu": 64, "cpu": 32}  # GPU sweep (run 2): 64 x 4 warps fastest at split 512
PREFILL_WARPS = 4
PREFILL_STAGES = 2
PREFILL_SCRATCH_ACC = False  # keep the merged accumulator in an fp32 scratch between splits (GPU)
# sm_90: the packed prefill through attention_gluon (the same instructions written in Gluon, launched
# and pipelined by hand); attention_gluon.applies says when
PREFILL_GLUON = True
DECODE_WARPS = 4
DECODE_STAGES = 2
MERGE_BLOCK_D = 32   # decode split merge: head dims per program (elementwise in D; 0 = all of D)
MERGE_WARPS = 1
# decode split merge in the last split program of each (request, kv head) (atomic ticket, no second
# launch) instead of in _attn_decode_merge_kernel; the same merges in the same order. Measured slower
# (H200 probe, graph replay, ctx 4096 / 8192, B 1..16: 0.89x of the merge kernel; b1/8K
# 23.8 vs 20.1 us): one program per (request, kv head) runs the whole ordered merge after its split.
DECODE_MERGE_IN_LAST = False
BWD_BLOCK = {"gpu": 64, "cpu": 32}
BWD_WARPS = 4
# Backward dQ. The fused kernel computes each key block's dQ contribution next to its dK / dV (5 matmuls
# per tile instead of the split kernels' 7) and adds it into an integer fixed-point accumulator: integer
# addition is associative, so dQ's bits do not depend on the order the programs' atomics land in (fp32
# atomics, as FA2 / FA3 / cuDNN's backward add, do). "int64" / "int32" pick the accumulator width (a step of at
# most 2^-61 / 2^-29 of the row's bound; see _bwd_fx_preprocess); "split" runs _bwd_dkdv_kernel and _bwd_dq_kernel.
# "gluon": on sm_90 attention_bwd_gluon's kernel (5 wgmma per tile pair, 128 keys per program, the int32 tiles
# sent as TMA reduce-adds that run behind the next pair's matmuls) where its applies() holds, elsewhere the
# int32 fused kernel here (the same formulas and fixed-point scale; the backward has no bit contract)
BWD_DQ = "gluon"
BWD_FUSED_BLOCK_M = {"gpu": 64, "cpu": 16}
BWD_FUSED_BLOCK_N = {"gpu": 64, "cpu": 32}  # sm_90 ptxas: 64 x 64 x 8 warps int64 is the tile without spills
BWD_FUSED_WARPS = 8
BWD_FUSED_STAGES = 2
BWD_FUSED_TMA = True  # dQ's integer tiles go to the accumulator as TMA bulk reduce-adds (sm_90)

KNOBS = {
    "coupled": {"ATTN_KV_TILE": C.ATTN_KV_TILE, "ATTN_SPLIT_KV": C.ATTN_SPLIT_KV},
    "free": {
        "PREFILL_BLOCK_M": (64, 128),
        "PREFILL_WARPS": (4, 8),
        "PREFILL_STAGES": (1, 2, 3),
        "PREFILL_SCRATCH_ACC": (False, True),
        "PREFILL_GLUON": (False, True),
        "DECODE_WARPS": (2, 4, 8),
        "DECODE_STAGES": (1, 2, 3, 4),
        "MERGE_BLOCK_D": (0, 16, 32, 64),
        "MERGE_WARPS": (1, 2, 4),
        "DECODE_MERGE_IN_LAST": (False, True),
        "BWD_DQ": ("gluon", "int64", "int32", "split"),
        "BWD_FUSED_WARPS": (4, 8),
        "BWD_FUSED_STAGES": (1, 2, 3),
    },
}

def _interpreting() -> bool:
    return _rowops_interpreting()


def _launch_opts(num_warps, num_stages):
    return _rowops_launch_opts(num_warps, num_stages)


# ------------------------------------------------------------------------------------------------
# Shared helpers: the only place where softmax arithmetic is written.
# ------------------------------------------------------------------------------------------------
@triton.jit
def _online_step(m_i, l_i, acc, q, k, v, mask, qk_scale, ones, MASKED: tl.constexpr):
    """One KV tile of online softmax for a block of query rows (k: [TILE, D], v: [TILE, D]).

    ``MASKED=False`` is only used for tiles where every key is visible to every row; the values are
    then identical to the masked form (FP contraction is off, so no instruction differs in value).
    """
    s = tl.dot(q, tl.trans(k))
    s = s * qk_scale
    if MASKED:
        s = tl.where(mask, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(s - m_safe[:, None])
    alpha = tl.exp2(m_i - m_safe)
    pb = p.to(v.dtype)
    l_new = l_i * alpha + tl.max(tl.dot(pb, ones), 1)
    acc = acc * alpha[:, None] + tl.dot(pb, v)
    return m_new, l_new, acc


@triton.jit
def _merge(M, L, ACC, m_s, l_s, acc_s):
    """Merge partial state (m_s, l_s, acc_s) into (M, L, ACC); elementwise, fixed formula."""
    M_new = tl.maximum(M, m_s)
    M_safe = tl.where(M_new == float("-inf"), 0.0, M_new)
    a = tl.exp2(M - M_safe)
    b = tl.exp2(m_s - M_safe)
    L = L * a + l_s * b
    ACC = ACC * a[:, None] + acc_s * b[:, None]
    return M_new, L, ACC


@triton.jit
def _kv_offsets(pos, valid, row, table_ptr, table_stride, seq_base, h_kv, stride_t, stride_h,
                KV_LAYOUT: tl.constexpr, PAGE_SIZE: tl.constexpr):
    """Element offsets (without the head-dim index) of K/V rows at absolute positions ``pos``."""
    if KV_LAYOUT == 0:
        off = (seq_base + pos).to(tl.int64) * stride_t
    elif KV_LAYOUT == 1:
        slot = tl.load(table_ptr + row.to(tl.int64) * table_stride + pos, mask=valid, other=0)
        off = slot.to(tl.int64) * stride_t
    elif KV_LAYOUT == 2:
        page = tl.load(table_ptr + row.to(tl.int64) * table_stride + pos // PAGE_SIZE, mask=valid, other=0)
        off = (page.to(tl.int64) * PAGE_SIZE + pos % PAGE_SIZE) * stride_t
    else:  # dense [B, S, Hkv, D]: seq_base is b * stride_b in elements, stride_t is the S stride
        off = seq_base.to(tl.int64) + pos.to(tl.int64) * stride_t
    return off + h_kv * stride_h


# ------------------------------------------------------------------------------------------------
# Full-sequence / extend forward (one program = BLOCK_M query rows of one head of one sequence)
# ------------------------------------------------------------------------------------------------
@triton.jit
def _fwd_tiles(m_i, l_i, acc, q, q_abs, lo, hi_t, hi, K, V, row, table, table_stride, seq_base, h_kv,
               stride_kt, stride_kh, stride_vt, stride_vh, qk_scale, ones,
               D: tl.constexpr, TILE: tl.constexpr, KV_LAYOUT: tl.constexpr, PAGE_SIZE: tl.constexpr,
               MASKED: tl.constexpr, KV_DESC: tl.constexpr = False):
    offs_d = tl.arange(0, D)
    offs_n = tl.arange(0, TILE)
    for start_n in range(lo, hi_t, TILE):
        k_pos = start_n + offs_n
        if MASKED:
            k_ok = k_pos < hi
        else:
            k_ok = k_pos >= 0
        if KV_DESC:
            # K/V of the packed layout through TMA ([T, Hkv, D] descriptors, box TILE x 1 x D): no
            # per-element address registers. Rows past `hi` are the next sequence's keys (or zero fill
            # past the end of the tensor) where the pointer path loads 0: their scores are masked to
            # -inf before the max, so p = 0 there and P@V, the row sum and every other element keep
            # their bits (0 * finite = 0 on the tensor cores either way).
            k = K.load([seq_base + start_n, h_kv, 0]).reshape(TILE, D)
            v = V.load([seq_base + start_n, h_kv, 0]).reshape(TILE, D)
        else:
            koff = _kv_offsets(k_pos, k_ok, row, table, table_stride, seq_base, h_kv,
                               stride_kt, stride_kh, KV_LAYOUT, PAGE_SIZE)
            voff = _kv_offsets(k_pos, k_ok, row, table, table_stride, seq_base, h_kv,
                               stride_vt, stride_vh, KV_LAYOUT, PAGE_SIZE)
            if MASKED:
                k = tl.load(K + koff[:, None] + offs_d[None, :], mask=k_ok[:, None], other=0.0)
                v = tl.load(V + voff[:, None] + offs_d[None, :], mask=k_ok[:, None], other=0.0)
            else:
                k = tl.load(K + koff[:, None] + offs_d[None, :])
                v = tl.load(V + voff[:, None] + offs_d[None, :])
        if MASKED:
            mask = (k_pos[None, :] <= q_abs[:, None]) & k_ok[None, :]
        else:
            mask = k_ok[None, :]
        m_i, l_i, acc = _online_step(m_i, l_i, acc, q, k, v, mask, qk_scale, ones, MASKED)
    return m_i, l_i, acc


@triton.jit
def _attn_fwd_kernel(
    Q, K, V, O, LSE, WS,
    cu_q, q_pos0,            # [B+1] packed q offsets; [B] absolute position of each seq's first query
    kv_base,                 # layout 0: [B+1] packed kv offsets; else unused
    table, table_stride, table_rows,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
    lse_stride_h, ws_stride_t,
    qk_scale,
    GROUP: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr,
    TILE: tl.constexpr, SPLIT: tl.constexpr,
    KV_LAYOUT: tl.constexpr, PAGE_SIZE: tl.constexpr, STORE_LSE: tl.constexpr, SCRATCH_ACC: tl.constexpr,
    PDL: tl.constexpr = False, KV_DESC: tl.constexpr = False,
):
    pdl_start(PDL)
    pid_m = tl.program_id(0)
    b = tl.program_id(1)
    h = tl.program_id(2)
    h_kv = h // GROUP
    q_start = tl.load(cu_q + b)
    q_len = tl.load(cu_q + b + 1) - q_start
    start_m = pid_m * BLOCK_M
    if start_m >= q_len:
        return
    pos0 = tl.load(q_pos0 + b)
    if KV_LAYOUT == 0:
        seq_base = tl.load(kv_base + b)
        row = b
    else:
        seq_base = 0
        row = tl.load(table_rows + b)

    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    row_ok = offs_m < q_len
    q_abs = pos0 + offs_m
    q_rows = (q_start + offs_m).to(tl.int64)
    q = tl.load(Q + q_rows[:, None] * stride_qt + h * stride_qh + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    ones = tl.full((TILE, 16), 1.0, tl.float32).to(q.dtype)
    ws_ptr = WS + q_rows[:, None] * ws_stride_t + h * D + offs_d[None, :]

    M = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    L = tl.zeros((BLOCK_M,), tl.float32)
    ACC = tl.zeros((BLOCK_M, D), tl.float32)
    hi = pos0 + tl.minimum(start_m + BLOCK_M, q_len)  # exclusive end of keys any row here needs
    # keys < full_end are visible to every row of this block (no mask needed)
    full_end = ((pos0 + start_m + 1) // TILE) * TILE
    n_splits = tl.cdiv(hi, SPLIT)
    for s in range(0, n_splits):
        lo_s = s * SPLIT
        hi_s = tl.minimum(lo_s + SPLIT, hi)
        mid = tl.maximum(lo_s, tl.minimum(hi_s, full_end))
        m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
        l_i = tl.zeros((BLOCK_M,), tl.float32)
        acc = tl.zeros((BLOCK_M, D), tl.float32)
        m_i, l_i, acc = _fwd_tiles(m_i, l_i, acc, q, q_abs, lo_s, mid, hi, K, V, row, table, table_stride,
                                   seq_base, h_kv, stride_kt, stride_kh, stride_vt, stride_vh, qk_scale, ones,
                                   D, TILE, KV_LAYOUT, PAGE_SIZE, False, KV_DESC)
        m_i, l_i, acc = _fwd_tiles(m_i, l_i, acc, q, q_abs, mid, hi_s, hi, K, V, row, table, table_stride,
                                   seq_base, h_kv, stride_kt, stride_kh, stride_vt, stride_vh, qk_scale, ones,
                                   D, TILE, KV_LAYOUT, PAGE_SIZE, True, KV_DESC)
        if SCRATCH_ACC:
            # the merged accumulator waits in an fp32 scratch row between splits (exact), so only
            # one [BLOCK_M, D] accumulator is live in registers during the tile loop
            prev = tl.load(ws_ptr, mask=(row_ok[:, None]) & (s > 0), other=0.0)
            M, L, merged = _merge(M, L, prev, m_i, l_i, acc)
            tl.store(ws_ptr, merged, mask=row_ok[:, None])
            tl.debug_barrier()
        else:
            M, L, ACC = _merge(M, L, ACC, m_i, l_i, acc)

    if SCRATCH_ACC:
        ACC = tl.load(ws_ptr, mask=row_ok[:, None], other=0.0)
    out = ACC / L[:, None]
    tl.store(O + q_rows[:, None] * stride_ot + h * stride_oh + offs_d[None, :],
             out.to(O.dtype.element_ty), mask=row_ok[:, None])
    if STORE_LSE:
        tl.store(LSE + h * lse_stride_h + q_start + offs_m, M + tl.log2(L), mask=row_ok)


# ------------------------------------------------------------------------------------------------
# Decode: one query token per request; program = (request, kv head, split)
# ------------------------------------------------------------------------------------------------
@triton.jit
def _attn_decode_kernel(
    Q, K, V, O, WS_ACC, WS_ML,
    seq_lens, table, table_stride, table_rows,
    stride_qb, stride_qh, stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh,
    stride_ob, stride_oh,
    ws_stride_b, ws_stride_h, ws_stride_s,
    qk_scale,
    GROUP: tl.constexpr, BLOCK_H: tl.constexpr, D: tl.constexpr,
    TILE: tl.constexpr, SPLIT: tl.constexpr,
    KV_LAYOUT: tl.constexpr, PAGE_SIZE: tl.constexpr,
    CNT=None, MERGE_IN_LAST: tl.constexpr = False, PDL: tl.constexpr = False,
):
    """Program (request, kv head, split). With MERGE_IN_LAST the split program that finishes last
    (an atomic ticket per (request, kv head) in CNT) merges every split's state in split order -- the
    merge kernel's arithmetic, without a second launch -- and resets its ticket to 0."""
    pdl_start(PDL)
    b = tl.program_id(0)
    h_kv = tl.program_id(1)
    s = tl.program_id(2)
    ctx = tl.load(seq_lens + b)
    lo_s = s * SPLIT
    if lo_s >= ctx:
        return
    hi_s = tl.minimum(lo_s + SPLIT, ctx)
    n_splits = tl.cdiv(ctx, SPLIT)
    if KV_LAYOUT == 3:
        kbase = b * stride_kb
        vbase = b * stride_vb
        row = b
    else:
        kbase = 0
        vbase = 0
        row = tl.load(table_rows + b)

    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, D)
    offs_n = tl.arange(0, TILE)
    h_ok = offs_h < GROUP
    heads = h_kv * GROUP + offs_h
    q = tl.load(Q + b.to(tl.int64) * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
                mask=h_ok[:, None], other=0.0)
    ones = tl.full((TILE, 16), 1.0, tl.float32).to(q.dtype)
    q_abs = ctx - 1

    m_i = tl.full((BLOCK_H,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_H,), tl.float32)
    acc = tl.zeros((BLOCK_H, D), tl.float32)
    mid = tl.maximum(lo_s, tl.minimum(hi_s, (ctx // TILE) * TILE))  # tiles before mid are full
    for start_n in range(lo_s, mid, TILE):
        k_pos = start_n + offs_n
        koff = _kv_offsets(k_pos, k_pos >= 0, row, table, table_stride, kbase, h_kv, stride_kt, stride_kh,
                           KV_LAYOUT, PAGE_SIZE)
        voff = _kv_offsets(k_pos, k_pos >= 0, row, table, table_stride, vbase, h_kv, stride_vt, stride_vh,
                           KV_LAYOUT, PAGE_SIZE)
        k = tl.load(K + koff[:, None] + offs_d[None, :])
        v = tl.load(V + voff[:, None] + offs_d[None, :])
        m_i, l_i, acc = _online_step(m_i, l_i, acc, q, k, v, k_pos[None, :] >= 0, qk_scale, ones, False)
    for start_n in range(mid, hi_s, TILE):
        k_pos = start_n + offs_n
        k_ok = k_pos < ctx
        koff = _kv_offsets(k_pos, k_ok, row, table, table_stride, kbase, h_kv, stride_kt, stride_kh,
                           KV_LAYOUT, PAGE_SIZE)
        voff = _kv_offsets(k_pos, k_ok, row, table, table_stride, vbase, h_kv, stride_vt, stride_vh,
                           KV_LAYOUT, PAGE_SIZE)
        k = tl.load(K + koff[:, None] + offs_d[None, :], mask=k_ok[:, None], other=0.0)
        v = tl.load(V + voff[:, None] + offs_d[None, :], mask=k_ok[:, None], other=0.0)
        mask = (k_pos[None, :] <= q_abs) & k_ok[None, :] & (offs_h[:, None] >= 0)
        m_i, l_i, acc = _online_step(m_i, l_i, acc, q, k, v, mask, qk_scale, ones, True)

    if n_splits == 1:
        M = tl.full((BLOCK_H,), float("-inf"), tl.float32)
        L = tl.zeros((BLOCK_H,), tl.float32)
        ACC = tl.zeros((BLOCK_H, D), tl.float32)
        M, L, ACC = _merge(M, L, ACC, m_i, l_i, acc)
        out = ACC / L[:, None]
        tl.store(O + b.to(tl.int64) * stride_ob + heads[:, None] * stride_oh + offs_d[None, :],
                 out.to(O.dtype.element_ty), mask=h_ok[:, None])
    else:
        wbase = b.to(tl.int64) * ws_stride_b + heads * ws_stride_h + s * ws_stride_s
        tl.store(WS_ACC + wbase[:, None] * D + offs_d[None, :], acc, mask=h_ok[:, None])
        tl.store(WS_ML + wbase * 2, m_i, mask=h_ok)
        tl.store(WS_ML + wbase * 2 + 1, l_i, mask=h_ok)
        if MERGE_IN_LAST:
            tl.debug_barrier()  # every thread's state is stored before the ticket is taken (release)
            cnt = CNT + b * tl.num_programs(1) + h_kv
            ticket = tl.atomic_add(cnt, 1, sem="acq_rel", scope="gpu")
            if ticket == n_splits - 1:  # every split's state is in the workspace (acquire)
                out = _merge_splits(WS_ACC, WS_ML, b.to(tl.int64) * ws_stride_b + heads * ws_stride_h, n_splits,
                                    ws_stride_s, h_ok, offs_d, BLOCK_H, D, D, ".cg")
                tl.store(O + b.to(tl.int64) * stride_ob + heads[:, None] * stride_oh + offs_d[None, :],
                         out.to(O.dtype.element_ty), mask=h_ok[:, None])
                tl.atomic_xchg(cnt, 0, sem="relaxed", scope="gpu")


@triton.jit
def _ws_state(WS_ACC, WS_ML, wb, s, n_splits, ws_stride_s, h_ok, offs_d, D: tl.constexpr, CACHE: tl.constexpr = ""):
    """Split ``s``'s partial state (m, l, acc) from the decode workspace; neutral fill past n_splits
    (never merged). CACHE ".cg": read from L2 (states written by other programs of the same launch)."""
    ok = h_ok & (s < n_splits)
    w = wb + s * ws_stride_s
    m_s = tl.load(WS_ML + w * 2, mask=ok, other=0.0, cache_modifier=CACHE)
    l_s = tl.load(WS_ML + w * 2 + 1, mask=ok, other=1.0, cache_modifier=CACHE)
    acc_s = tl.load(WS_ACC + w[:, None] * D + offs_d[None, :], mask=ok[:, None], other=0.0, cache_modifier=CACHE)
    return m_s, l_s, acc_s


@triton.jit
def _merge_splits(WS_ACC, WS_ML, wb, n_splits, ws_stride_s, h_ok, offs_d, BLOCK_H: tl.constexpr, BD: tl.constexpr,
                  D: tl.constexpr, CACHE: tl.constexpr):
    """ACC / L after merging the splits' states in split order (columns ``offs_d`` of the head dim).

    Split states are loaded four splits ahead of the merge that uses them (a register ring; Triton
    does not pipeline loads that feed no dot), so the ordered merge chain waits for one workspace
    read at the start instead of one per split. Same merges in the same order."""
    M = tl.full((BLOCK_H,), float("-inf"), tl.float32)
    L = tl.zeros((BLOCK_H,), tl.float32)
    ACC = tl.zeros((BLOCK_H, BD), tl.float32)
    m0, l0, a0 = _ws_state(WS_ACC, WS_ML, wb, 0, n_splits, ws_stride_s, h_ok, offs_d, D, CACHE)
    m1, l1, a1 = _ws_state(WS_ACC, WS_ML, wb, 1, n_splits, ws_stride_s, h_ok, offs_d, D, CACHE)
    m2, l2, a2 = _ws_state(WS_ACC, WS_ML, wb, 2, n_splits, ws_stride_s, h_ok, offs_d, D, CACHE)
    m3, l3, a3 = _ws_state(WS_ACC, WS_ML, wb, 3, n_splits, ws_stride_s, h_ok, offs_d, D, CACHE)
    for s in range(0, n_splits):
        m_s, l_s, acc_s = m0, l0, a0
        m0, l0, a0 = m1, l1, a1
        m1, l1, a1 = m2, l2, a2
        m2, l2, a2 = m3, l3, a3
        m3, l3, a3 = _ws_state(WS_ACC, WS_ML, wb, s + 4, n_splits, ws_stride_s, h_ok, offs_d, D, CACHE)
        M, L, ACC = _merge(M, L, ACC, m_s, l_s, acc_s)
    return ACC / L[:, None]


@triton.jit
def _attn_decode_merge_kernel(
    O, WS_ACC, WS_ML, seq_lens,
    stride_ob, stride_oh, ws_stride_b, ws_stride_h, ws_stride_s,
    GROUP: tl.constexpr, BLOCK_H: tl.constexpr, D: tl.constexpr, SPLIT: tl.constexpr,
    BLOCK_D: tl.constexpr = 0, PDL: tl.constexpr = False,
):
    """Program (request, kv head, slice of BLOCK_D head dims): the merge is elementwise in the head dim
    (m and l are per head and computed the same way by every slice), so slicing D only adds programs."""
    pdl_start(PDL)
    b = tl.program_id(0)
    h_kv = tl.program_id(1)
    ctx = tl.load(seq_lens + b)
    n_splits = tl.cdiv(ctx, SPLIT)
    if n_splits <= 1:
        return
    offs_h = tl.arange(0, BLOCK_H)
    BD: tl.constexpr = D if BLOCK_D == 0 else BLOCK_D
    offs_d = tl.program_id(2) * BD + tl.arange(0, BD)
    h_ok = offs_h < GROUP
    heads = h_kv * GROUP + offs_h
    out = _merge_splits(WS_ACC, WS_ML, b.to(tl.int64) * ws_stride_b + heads * ws_stride_h, n_splits, ws_stride_s,
                        h_ok, offs_d, BLOCK_H, BD, D, "")
    tl.store(O + b.to(tl.int64) * stride_ob + heads[:, None] * stride_oh + offs_d[None, :],
             out.to(O.dtype.element_ty), mask=h_ok[:, None])


# ------------------------------------------------------------------------------------------------
# Backward (full-sequence, contiguous packed varlen). FA2-style, recomputes P from the saved LSE.
# No bitwise requirement across paths; accuracy against an fp32 reference.
# ------------------------------------------------------------------------------------------------
@triton.jit
def _bwd_preprocess(O, DO, DELTA, stride_ot, stride_oh, total, H, D: tl.constexpr, BLOCK: tl.constexpr,
                    PDL: tl.constexpr = False):
    pdl_start(PDL)
    pid = tl.program_id(0)
    h = tl.program_id(1)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    offs_d = tl.arange(0, D)
    ok = offs < total
    ptr = offs.to(tl.int64)[:, None] * stride_ot + h * stride_oh + offs_d[None, :]
    o = tl.load(O + ptr, mask=ok[:, None], other=0.0).to(tl.float32)
    do = tl.load(DO + ptr, mask=ok[:, None], other=0.0).to(tl.float32)
    tl.store(DELTA + h * total + offs, tl.sum(o * do, 1), mask=ok)


@triton.jit
def _bwd_dkdv_kernel(
    Q, K, V, DO, LSE, DELTA, DK, DV, cu,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_dt, stride_dh,
    total, qk_scale, sm_scale,
    GROUP: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PDL: tl.constexpr = False,
):
    pdl_start(PDL)
    pid_n = tl.program_id(0)
    b = tl.program_id(1)
    h_kv = tl.program_id(2)
    start = tl.load(cu + b)
    seqlen = tl.load(cu + b + 1) - start
    start_n = pid_n * BLOCK_N
    if start_n >= seqlen:
        return
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    n_ok = offs_n < seqlen
    kv_ptr = (start + offs_n).to(tl.int64)[:, None] * stride_kt + h_kv * stride_kh + offs_d[None, :]
    k = tl.load(K + kv_ptr, mask=n_ok[:, None], other=0.0)
    v = tl.load(V + kv_ptr, mask=n_ok[:, None], other=0.0)
    dk = tl.zeros((BLOCK_N, D), tl.float32)
    dv = tl.zeros((BLOCK_N, D), tl.float32)
    for g in range(0, GROUP):
        h = h_kv * GROUP + g
        for start_m in range((start_n // BLOCK_M) * BLOCK_M, seqlen, BLOCK_M):
            offs_m = start_m + tl.arange(0, BLOCK_M)
            m_ok = offs_m < seqlen
            q_ptr = (start + offs_m).to(tl.int64)[:, None] * stride_qt + h * stride_qh + offs_d[None, :]
            q = tl.load(Q + q_ptr, mask=m_ok[:, None], other=0.0)
            do = tl.load(DO + q_ptr, mask=m_ok[:, None], other=0.0)
            lse = tl.load(LSE + h * total + start + offs_m, mask=m_ok, other=0.0)
            delta = tl.load(DELTA + h * total + start + offs_m, mask=m_ok, other=0.0)
            qk = tl.dot(q, tl.trans(k)) * qk_scale
            valid = (offs_n[None, :] <= offs_m[:, None]) & m_ok[:, None] & n_ok[None, :]
            p = tl.where(valid, tl.exp2(qk - lse[:, None]), 0.0)
            dv += tl.dot(tl.trans(p.to(do.dtype)), do)
            dp = tl.dot(do, tl.trans(v))
            ds = p * (dp - delta[:, None])
            dk += tl.dot(tl.trans(ds.to(q.dtype)), q)
    d_ptr = (start + offs_n).to(tl.int64)[:, None] * stride_dt + h_kv * stride_dh + offs_d[None, :]
    tl.store(DK + d_ptr, (dk * sm_scale).to(DK.dtype.element_ty), mask=n_ok[:, None])
    tl.store(DV + d_ptr, dv.to(DV.dtype.element_ty), mask=n_ok[:, None])


@triton.jit
def _bwd_dq_kernel(
    Q, K, V, DO, LSE, DELTA, DQ, cu,
    stride_qt, stride_qh, stride_kt, stride_kh,
    total, qk_scale, sm_scale,
    GROUP: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PDL: tl.constexpr = False,
):
    pdl_start(PDL)
    pid_m = tl.program_id(0)
    b = tl.program_id(1)
    h = tl.program_id(2)
    h_kv = h // GROUP
    start = tl.load(cu + b)
    seqlen = tl.load(cu + b + 1) - start
    start_m = pid_m * BLOCK_M
    if start_m >= seqlen:
        return
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    m_ok = offs_m < seqlen
    q_ptr = (start + offs_m).to(tl.int64)[:, None] * stride_qt + h * stride_qh + offs_d[None, :]
    q = tl.load(Q + q_ptr, mask=m_ok[:, None], other=0.0)
    do = tl.load(DO + q_ptr, mask=m_ok[:, None], other=0.0)
    lse = tl.load(LSE + h * total + start + offs_m, mask=m_ok, other=0.0)
    delta = tl.load(DELTA + h * total + start + offs_m, mask=m_ok, other=0.0)
    dq = tl.zeros((BLOCK_M, D), tl.float32)
    hi = tl.minimum(start_m + BLOCK_M, seqlen)
    for start_n in range(0, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        n_ok = offs_n < seqlen
        kv_ptr = (start + offs_n).to(tl.int64)[:, None] * stride_kt + h_kv * stride_kh + offs_d[None, :]
        k = tl.load(K + kv_ptr, mask=n_ok[:, None], other=0.0)
        v = tl.load(V + kv_ptr, mask=n_ok[:, None], other=0.0)
        qk = tl.dot(q, tl.trans(k)) * qk_scale
        valid = (offs_n[None, :] <= offs_m[:, None]) & m_ok[:, None] & n_ok[None, :]
        p = tl.where(valid, tl.exp2(qk - lse[:, None]), 0.0)
        dp = tl.dot(do, tl.trans(v))
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k)
    tl.store(DQ + q_ptr, (dq * sm_scale).to(DQ.dtype.element_ty), mask=m_ok[:, None])


@triton.jit
def _sqrt_ub(x):
    """A power of two in [sqrt(x), 2 sqrt(x)] for finite x >= 2^-126 (x in [2^e, 2^(e+1)): 2^ceil((e+1)/2)); 2^-63
    for 0 and subnormals; inf / NaN stay. The fixed point needs only its bound's exponent, and without a sqrt the
    backward keeps the forward's instruction families (tik search's per-path instruction check refuses a sqrt that
    only prefill_backward runs)."""
    ex = (x.to(tl.int32, bitcast=True) >> 23) & 0xFF
    ub = ((((ex - 127 + 2) >> 1) + 127) << 23).to(tl.float32, bitcast=True)
    return tl.where(ex == 255, x, ub)


@triton.jit
def _bwd_kv_bound_kernel(K, V, KVB, stride_kt, stride_kh, total, D: tl.constexpr, BLOCK: tl.constexpr,
                         PDL: tl.constexpr = False):
    """KVB[h] = (max |K[:, h, :]|, a power of two >= max_t ||V[t, h, :]||_2): the key / value factors of dQ's
    bound. fp32 max is exact and commutative, so the atomics give the same bits in any order."""
    pdl_start(PDL)
    pid = tl.program_id(0)
    h = tl.program_id(1)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    offs_d = tl.arange(0, D)
    ok = offs < total
    ptr = offs.to(tl.int64)[:, None] * stride_kt + h * stride_kh + offs_d[None, :]
    k = tl.load(K + ptr, mask=ok[:, None], other=0.0).to(tl.float32)
    v = tl.load(V + ptr, mask=ok[:, None], other=0.0).to(tl.float32)
    tl.atomic_max(KVB + 2 * h, tl.max(tl.max(tl.abs(k), 1), 0), sem="relaxed")
    tl.atomic_max(KVB + 2 * h + 1, tl.max(_sqrt_ub(tl.sum(v * v, 1)), 0), sem="relaxed")


@triton.jit
def _bwd_fx_preprocess(O, DO, KVB, DELTA, SCALE, stride_ot, stride_oh, total, H, GROUP: tl.constexpr,
                       D: tl.constexpr, BLOCK: tl.constexpr, SHIFT: tl.constexpr, PDL: tl.constexpr = False):
    """DELTA = rowsum(O * dO) and SCALE, the power of two that maps row t of head h into the fixed-point range.

    With p <= 1 and sum_j p_j = 1 (the forward's LSE), every partial sum of dQ[t, h, d] = sum_j ds_j K[j, d],
    ds_j = p_j (dO_t . V_j - delta_t), is at most bound = max|K| (||dO_t|| max||V|| + |delta_t|), the norms here
    taken as powers of two at most twice their value (_sqrt_ub), so the bound is up to 4x loose (two bits of the
    fixed point); twice it covers the dot's and bf16 ds's rounding (the exact bound is reached: two keys K and -K
    at equal weight, V and -V along dO). With b = 2 bound, SCALE = 2^(SHIFT - 1 - floor(log2 b)) puts b * SCALE in [2^(SHIFT-1), 2^SHIFT),
    so every partial sum stays under 2^(SHIFT-1) in magnitude, whatever order the integers are added in
    (SHIFT 31 / 63: int32 / int64). A non-finite bound (inf / NaN inputs) gives SCALE = NaN, which the
    finalize turns into a NaN dQ row, as fp32 accumulation would."""
    pdl_start(PDL)
    pid = tl.program_id(0)
    h = tl.program_id(1)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    offs_d = tl.arange(0, D)
    ok = offs < total
    ptr = offs.to(tl.int64)[:, None] * stride_ot + h * stride_oh + offs_d[None, :]
    o = tl.load(O + ptr, mask=ok[:, None], other=0.0).to(tl.float32)
    do = tl.load(DO + ptr, mask=ok[:, None], other=0.0).to(tl.float32)
    delta = tl.sum(o * do, 1)
    kb = tl.load(KVB + 2 * (h // GROUP))
    vb = tl.load(KVB + 2 * (h // GROUP) + 1)
    bound = 2.0 * kb * (_sqrt_ub(tl.sum(do * do, 1)) * vb + tl.abs(delta))
    bexp = (bound.to(tl.int32, bitcast=True) >> 23) & 0xFF
    s = tl.minimum(tl.maximum(SHIFT - 1 - (bexp - 127), -125), 125)
    scale = ((s + 127) << 23).to(tl.float32, bitcast=True)
    scale = tl.where(bexp == 255, float("nan"), scale)
    tl.store(DELTA + h * total + offs, delta, mask=ok)
    tl.store(SCALE + h * total + offs, scale, mask=ok)


@triton.jit
def _bwd_fused_kernel(
    Q, K, V, DO, LSE, DELTA, SCALE, DK, DV, DQACC, DQD, cu,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_dt, stride_dh, stride_at, stride_ah,
    total, qk_scale, sm_scale,
    GROUP: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ACC64: tl.constexpr,
    TMA_ACC: tl.constexpr, PDL: tl.constexpr = False,
):
    """One program per (key block, sequence, kv head): dK / dV of the block in registers over the GROUP query
    heads and every query block at or after it; each tile's dQ contribution ds @ K is scaled by the row's
    power of two, truncated to an integer (exact scaling, deterministic truncation) and added atomically."""
    pdl_start(PDL)
    pid_n = tl.program_id(0)
    b = tl.program_id(1)
    h_kv = tl.program_id(2)
    start = tl.load(cu + b)
    seqlen = tl.load(cu + b + 1) - start
    start_n = pid_n * BLOCK_N
    if start_n >= seqlen:
        return
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    n_ok = offs_n < seqlen
    kv_ptr = (start + offs_n).to(tl.int64)[:, None] * stride_kt + h_kv * stride_kh + offs_d[None, :]
    k = tl.load(K + kv_ptr, mask=n_ok[:, None], other=0.0)
    v = tl.load(V + kv_ptr, mask=n_ok[:, None], other=0.0)
    dk = tl.zeros((BLOCK_N, D), tl.float32)
    dv = tl.zeros((BLOCK_N, D), tl.float32)
    for g in range(0, GROUP):
        h = h_kv * GROUP + g
        for start_m in range((start_n // BLOCK_M) * BLOCK_M, seqlen, BLOCK_M):
            offs_m = start_m + tl.arange(0, BLOCK_M)
            m_ok = offs_m < seqlen
            q_ptr = (start + offs_m).to(tl.int64)[:, None] * stride_qt + h * stride_qh + offs_d[None, :]
            q = tl.load(Q + q_ptr, mask=m_ok[:, None], other=0.0)
            do = tl.load(DO + q_ptr, mask=m_ok[:, None], other=0.0)
            lse = tl.load(LSE + h * total + start + offs_m, mask=m_ok, other=0.0)
            delta = tl.load(DELTA + h * total + start + offs_m, mask=m_ok, other=0.0)
            sc = tl.load(SCALE + h * total + start + offs_m, mask=m_ok, other=0.0)
            qk = tl.dot(q, tl.trans(k)) * qk_scale
            valid = (offs_n[None, :] <= offs_m[:, None]) & m_ok[:, None] & n_ok[None, :]
            p = tl.where(valid, tl.exp2(qk - lse[:, None]), 0.0)
            dv += tl.dot(tl.trans(p.to(do.dtype)), do)
            dp = tl.dot(do, tl.trans(v))
            ds = (p * (dp - delta[:, None])).to(q.dtype)
            dk += tl.dot(tl.trans(ds), q)
            dqp = tl.dot(ds, k) * sc[:, None]
            if ACC64:
                fx = dqp.to(tl.int64)
            else:
                fx = dqp.to(tl.int32)
            if TMA_ACC:
                # one bulk reduce per tile through shared memory (no per-element addresses in registers); rows
                # past the sequence add 0 (p = 0 there), which leaves the next sequence's integers unchanged
                if ACC64:
                    DQD.atomic_add([start + start_m, h * D], fx.to(tl.uint64, bitcast=True))
                else:
                    DQD.atomic_add([start + start_m, h * D], fx)
            else:
                a_ptr = (start + offs_m).to(tl.int64)[:, None] * stride_at + h * stride_ah + offs_d[None, :]
                tl.atomic_add(DQACC + a_ptr, fx, mask=m_ok[:, None], sem="relaxed")
    d_ptr = (start + offs_n).to(tl.int64)[:, None] * stride_dt + h_kv * stride_dh + offs_d[None, :]
    tl.store(DK + d_ptr, (dk * sm_scale).to(DK.dtype.element_ty), mask=n_ok[:, None])
    tl.store(DV + d_ptr, dv.to(DV.dtype.element_ty), mask=n_ok[:, None])


@triton.jit
def _bwd_fx_finalize(DQACC, SCALE, DQ, stride_at, stride_ah, stride_qt, stride_qh, total, sm_scale,
                     D: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    """dQ = acc / SCALE * sm_scale: the division by a power of two is exact; NaN SCALE gives a NaN row."""
    pdl_start(PDL)
    pid = tl.program_id(0)
    h = tl.program_id(1)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    offs_d = tl.arange(0, D)
    ok = offs < total
    acc = tl.load(DQACC + offs.to(tl.int64)[:, None] * stride_at + h * stride_ah + offs_d[None, :],
                  mask=ok[:, None], other=0)
    sc = tl.load(SCALE + h * total + offs, mask=ok, other=1.0)
    dq = acc.to(tl.float32) * (1.0 / sc)[:, None] * sm_scale
    tl.store(DQ + offs.to(tl.int64)[:, None] * stride_qt + h * stride_qh + offs_d[None, :],
             dq.to(DQ.dtype.element_ty), mask=ok[:, None])


# ------------------------------------------------------------------------------------------------
# Host launchers (inputs already validated by areal_tik_plugin.ops.attention)
# ------------------------------------------------------------------------------------------------
def _cfg(**over):
    """Launch config: contract constants (coupled) + free knobs; ``over`` is used by benchmark sweeps."""
    gpu = not _interpreting()
    cfg = {
        "tile": C.ATTN_KV_TILE, "split": C.ATTN_SPLIT_KV,
        "block_m": PREFILL_BLOCK_M["gpu" if gpu else "cpu"], "warps": PREFILL_WARPS, "stages": PREFILL_STAGES,
        "scratch": PREFILL_SCRATCH_ACC and gpu, "gluon": PREFILL_GLUON and gpu,
        "dec_warps": DECODE_WARPS, "dec_stages": DECODE_STAGES,
        "merge_block_d": MERGE_BLOCK_D, "merge_warps": MERGE_WARPS, "merge_in_last": DECODE_MERGE_IN_LAST,
    }
    for k, v in over.items():
        if v is not None:
            cfg[k] = v
    return cfg


def _tma_ok(x) -> bool:
    """A [T, Hkv, D] tensor TMA can read: unit stride in D, 16-byte aligned base and outer strides."""
    es = x.element_size()
    return (x.dim() == 3 and x.shape[0] > 0 and x.stride(2) == 1 and x.data_ptr() % 16 == 0
            and (x.stride(0) * es) % 16 == 0 and (x.stride(1) * es) % 16 == 0 and (x.shape[2] * es) % 16 == 0)


def _fwd(q, k, v, o, lse, ws, cu_q, pos0, kv_base, table, tstride, rows, max_q, scale, layout, page_size,
         store_lse, cfg):
    T, Hq, D = q.shape
    Hkv = k.shape[1]
    B = cu_q.numel() - 1
    bm = cfg["block_m"]
    if layout == 0 and cfg["gluon"] and not cfg["scratch"] and kv_base is cu_q:
        from . import attention_gluon as G

        if G.applies(q, k, v, cfg["tile"], cfg["split"]):
            G.prefill(q, k, v, o, lse, cu_q, max_q, scale * LOG2E, store_lse, cfg["tile"], cfg["split"],
                      G.config(**cfg.get("gluon_cfg", {})))
            return
    if pos0 is None:   # prefill: every sequence starts at position 0 (the Gluon program reads no pos0)
        pos0 = torch.zeros(B, device=q.device, dtype=torch.int32)
    grid = (_cdiv(max(int(max_q), 1), bm), B, Hq)
    desc = layout == 0 and _tma_ok(k) and _tma_ok(v)
    if desc:
        box = [cfg["tile"], 1, D]
        kd = TensorDescriptor(k, list(k.shape), list(k.stride()), box)
        vd = TensorDescriptor(v, list(v.shape), list(v.stride()), box)
    else:
        kd, vd = k, v
    launch(_attn_fwd_kernel, grid,
        q, kd, vd, o, lse, ws, cu_q, pos0, kv_base, table, tstride, rows,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        o.stride(0), o.stride(1), lse.stride(0) if store_lse else 0, Hq * D, scale * LOG2E,
        GROUP=Hq // Hkv, D=D, BLOCK_M=bm, TILE=cfg["tile"], SPLIT=cfg["split"],
        KV_LAYOUT=layout, PAGE_SIZE=page_size, STORE_LSE=store_lse, SCRATCH_ACC=bool(cfg["scratch"]),
        KV_DESC=desc, **_launch_opts(cfg["warps"], cfg["stages"]),
    )


def _scratch(q, cfg):
    if cfg["scratch"]:
        return torch.empty((q.shape[0], q.shape[1], q.shape[2]), device=q.device, dtype=torch.float32)
    return q


def prefill(q, k, v, cu_seqlens, max_seqlen, softmax_scale, return_lse=False, block_m=None, **over):
    """Full-sequence causal attention over packed sequences. q [T, Hq, D], k/v [T, Hkv, D]."""
    cfg = _cfg(block_m=block_m, **over)
    o = torch.empty_like(q)
    lse = torch.empty((q.shape[1], q.shape[0]), device=q.device, dtype=torch.float32) if return_lse else o
    _fwd(q, k, v, o, lse, _scratch(q, cfg), cu_seqlens, None, cu_seqlens, cu_seqlens, 0, cu_seqlens,
         max_seqlen, softmax_scale, 0, 1, return_lse, cfg)
    return (o, lse) if return_lse else o


def extend(q, k_pool, v_pool, cu_seqlens_q, prefix_lens, kv_indices, table_rows, max_extend_len,
           softmax_scale, page_size=1, block_m=None, **over):
    """New tokens of each request attend to its cached prefix + themselves (K/V already in the pool)."""
    cfg = _cfg(block_m=block_m, **over)
    o = torch.empty_like(q)
    _fwd(q, k_pool, v_pool, o, o, _scratch(q, cfg), cu_seqlens_q, prefix_lens, cu_seqlens_q, kv_indices,
         kv_indices.stride(0), table_rows, max_extend_len, softmax_scale, 1 if page_size == 1 else 2, page_size,
         False, cfg)
    return o


_WS_CACHE: dict = {}


def _decode_ws(q, B, Hq, max_splits, D):
    """Per-(device, shape) decode workspace, reused across calls (no allocation in the hot path)."""
    key = (q.device, B, Hq, max_splits, D)
    ws = _WS_CACHE.get(key)
    if ws is None:
        ws = (torch.empty((B, Hq, max_splits, D), device=q.device, dtype=torch.float32),
              torch.empty((B, Hq, max_splits, 2), device=q.device, dtype=torch.float32))
        if len(_WS_CACHE) > 64:
            _WS_CACHE.clear()
        _WS_CACHE[key] = ws
    return ws


def decode(q, k_cache, v_cache, seq_lens, kv_indices, table_rows, softmax_scale, page_size, max_context_len,
           out=None, **over):
    """One query per request. q [B, Hq, D]. Paged (kv_indices given) or dense cache [B, S, Hkv, D].

    The grid depends only on shapes (B, heads, max_context_len), never on the values of seq_lens,
    so the call is CUDA-graph capturable.
    """
    cfg = _cfg(**over)
    split, tile = cfg["split"], cfg["tile"]
    B, Hq, D = q.shape
    dense = kv_indices is None
    Hkv = k_cache.shape[2] if dense else k_cache.shape[1]
    group = Hq // Hkv
    block_h = max(16, _next_pow2(group))
    max_splits = max(1, _cdiv(int(max_context_len), split))
    o = torch.empty_like(q) if out is None else out
    ws_acc, ws_ml = _decode_ws(q, B, Hq, max_splits, D)
    if dense:
        layout, table, tstride, rows = 3, seq_lens, 0, seq_lens
        skb, skt, skh = k_cache.stride(0), k_cache.stride(1), k_cache.stride(2)
        svb, svt, svh = v_cache.stride(0), v_cache.stride(1), v_cache.stride(2)
    else:
        layout = 1 if page_size == 1 else 2
        table, tstride, rows = kv_indices, kv_indices.stride(0), table_rows
        skb, skt, skh = 0, k_cache.stride(0), k_cache.stride(1)
        svb, svt, svh = 0, v_cache.stride(0), v_cache.stride(1)
    ws_sb, ws_sh, ws_ss = Hq * max_splits, max_splits, 1
    last = (dict(CNT=_tickets(q.device, B * Hkv), MERGE_IN_LAST=True)
            if max_splits > 1 and cfg["merge_in_last"] else {})
    launch(_attn_decode_kernel, (B, Hkv, max_splits),
        q, k_cache, v_cache, o, ws_acc, ws_ml, seq_lens, table, tstride, rows,
        q.stride(0), q.stride(1), skb, skt, skh, svb, svt, svh, o.stride(0), o.stride(1),
        ws_sb, ws_sh, ws_ss, softmax_scale * LOG2E,
        GROUP=group, BLOCK_H=block_h, D=D, TILE=tile, SPLIT=split,
        KV_LAYOUT=layout, PAGE_SIZE=page_size, **last,
        **_launch_opts(cfg["dec_warps"], cfg["dec_stages"]),
    )
    if max_splits > 1 and not last:
        bd = min(D, cfg["merge_block_d"]) if cfg["merge_block_d"] else D
        launch(_attn_decode_merge_kernel, (B, Hkv, _cdiv(D, bd)),
            o, ws_acc, ws_ml, seq_lens, o.stride(0), o.stride(1), ws_sb, ws_sh, ws_ss,
            GROUP=group, BLOCK_H=block_h, D=D, SPLIT=split, BLOCK_D=bd,
            **_launch_opts(cfg["merge_warps"], 1),
        )
    return o


_BWD_CONFIG_KEYS = ("dq", "block_m", "block_n", "warps", "stages", "tma")


def _bwd_cfg(config):
    """The backward's launch config: module knobs, overridden by ``config`` (benchmark sweeps)."""
    cpu = _interpreting()
    cfg = {"dq": BWD_DQ, "block_m": BWD_FUSED_BLOCK_M["cpu" if cpu else "gpu"],
           "block_n": BWD_FUSED_BLOCK_N["cpu" if cpu else "gpu"], "warps": BWD_FUSED_WARPS, "stages": BWD_FUSED_STAGES,
           "tma": BWD_FUSED_TMA}
    if config:
        bad = sorted(set(config) - set(_BWD_CONFIG_KEYS))
        if bad:
            raise ValueError(f"prefill_backward config: unknown keys {bad}; expected a subset of {list(_BWD_CONFIG_KEYS)}")
        cfg.update({k: v for k, v in config.items() if v is not None})
    if cfg["dq"] not in ("gluon", "int64", "int32", "split"):
        raise ValueError(f"prefill_backward config: dq must be 'gluon', 'int64', 'int32' or 'split', got {cfg['dq']!r}")
    bm, bn = cfg["block_m"], cfg["block_n"]
    for name in ("block_m", "block_n"):
        x = cfg[name]
        if not isinstance(x, int) or x < 16 or x & (x - 1):
            raise ValueError(f"prefill_backward config: {name} must be a power of two >= 16, got {x!r}")
    if bm % bn and bn % bm:
        raise ValueError(f"prefill_backward config: block_m {bm} and block_n {bn} must divide one another")
    return cfg


def _split_backward(do, q, k, v, o, lse, cu_seqlens, max_seqlen, softmax_scale):
    T, Hq, D = q.shape
    Hkv = k.shape[1]
    B = cu_seqlens.numel() - 1
    blk = BWD_BLOCK["cpu" if _interpreting() else "gpu"]
    delta = torch.empty((Hq, T), device=q.device, dtype=torch.float32)
    launch(_bwd_preprocess, (_cdiv(T, 64), Hq), o, do, delta, o.stride(0), o.stride(1), T, Hq, D=D, BLOCK=64)
    dq = torch.empty_like(q)
    dk = torch.empty_like(k)
    dv = torch.empty_like(v)
    qk_scale = softmax_scale * LOG2E
    nb = _cdiv(max(int(max_seqlen), 1), blk)
    opts = _launch_opts(BWD_WARPS, 2)
    if "enable_fp_fusion" in opts:
        opts.pop("enable_fp_fusion")
    launch(_bwd_dkdv_kernel, (nb, B, Hkv),
        q, k, v, do, lse, delta, dk, dv, cu_seqlens,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), dk.stride(0), dk.stride(1),
        T, qk_scale, softmax_scale, GROUP=Hq // Hkv, D=D, BLOCK_M=blk, BLOCK_N=blk, **opts,
    )
    launch(_bwd_dq_kernel, (nb, B, Hq),
        q, k, v, do, lse, delta, dq, cu_seqlens,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1),
        T, qk_scale, softmax_scale, GROUP=Hq // Hkv, D=D, BLOCK_M=blk, BLOCK_N=blk, **opts,
    )
    return dq, dk, dv


def prefill_backward(do, q, k, v, o, lse, cu_seqlens, max_seqlen, softmax_scale, config=None):
    cfg = _bwd_cfg(config)
    do = do.contiguous()
    if cfg["dq"] == "split":
        return _split_backward(do, q, k, v, o, lse, cu_seqlens, max_seqlen, softmax_scale)
    T, Hq, D = q.shape
    Hkv = k.shape[1]
    B = cu_seqlens.numel() - 1
    acc64 = cfg["dq"] == "int64"
    gluon = None
    if cfg["dq"] == "gluon" and not _interpreting():
        from . import attention_bwd_gluon as gluon
        if not gluon.applies(q, k, v, do):
            gluon = None
    kvb = torch.zeros((Hkv, 2), device=q.device, dtype=torch.float32)
    launch(_bwd_kv_bound_kernel, (_cdiv(T, 64), Hkv), k, v, kvb, k.stride(0), k.stride(1), T, D=D, BLOCK=64)
    delta = torch.empty((Hq, T), device=q.device, dtype=torch.float32)
    scale = torch.empty((Hq, T), device=q.device, dtype=torch.float32)
    launch(_bwd_fx_preprocess, (_cdiv(T, 64), Hq), o, do, kvb, delta, scale, o.stride(0), o.stride(1), T, Hq,
           GROUP=Hq // Hkv, D=D, BLOCK=64, SHIFT=63 if acc64 else 31)
    acc = torch.zeros((T, Hq, D), device=q.device, dtype=torch.int64 if acc64 else torch.int32)
    dq = torch.empty_like(q)
    dk = torch.empty_like(k)
    dv = torch.empty_like(v)
    if gluon is not None:
        gluon.backward(q, k, v, do, lse, delta, scale, acc, dk, dv, cu_seqlens, max_seqlen, softmax_scale,
                       softmax_scale * LOG2E)
        launch(_bwd_fx_finalize, (_cdiv(T, 64), Hq), acc, scale, dq, acc.stride(0), acc.stride(1), dq.stride(0),
               dq.stride(1), T, softmax_scale, D=D, BLOCK=64)
        return dq, dk, dv
    bm, bn = cfg["block_m"], cfg["block_n"]
    tma = cfg["tma"] and not _interpreting()  # the interpreter has no descriptor reduce: same integers, per element
    dqd = (TensorDescriptor.from_tensor(acc.view(T, Hq * D).view(torch.uint64) if acc64 else acc.view(T, Hq * D),
                                        [bm, D]) if tma else None)
    opts = _launch_opts(cfg["warps"], cfg["stages"])
    opts.pop("enable_fp_fusion", None)
    launch(_bwd_fused_kernel, (_cdiv(max(int(max_seqlen), 1), bn), B, Hkv),
        q, k, v, do, lse, delta, scale, dk, dv, acc, dqd, cu_seqlens,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), dk.stride(0), dk.stride(1), acc.stride(0), acc.stride(1),
        T, softmax_scale * LOG2E, softmax_scale,
        GROUP=Hq // Hkv, D=D, BLOCK_M=bm, BLOCK_N=bn, ACC64=acc64, TMA_ACC=tma, **opts,
    )
    launch(_bwd_fx_finalize, (_cdiv(T, 64), Hq), acc, scale, dq, acc.stride(0), acc.stride(1), dq.stride(0),
           dq.stride(1), T, softmax_scale, D=D, BLOCK=64)
    return dq, dk, dv


def default_scale(head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim)
