"""Batch-invariant dense linear: ``y = x @ W^T (+ bias)``, bf16/fp16 in, fp32 accumulate.

Token invariance (see ``contract.py``): every output row is

    for each K chunk c of split_chunk(K) columns (one chunk = all of K for most weights):
        part_c = 0 (fp32)
        for k0 in the chunk, GEMM_BLOCK_K at a time, increasing:   # never split across programs
            part_c = tl.dot(x[row, k0:k0+BK], W[:, k0:k0+BK]^T, part_c)
    acc = part_0                       (one chunk)      or   ((0 + part_0) + part_1) + ...  (split)
    acc = acc + 0.0                                      # -0.0 -> +0.0 (see _bias_epilogue)
    acc = acc + float32(bias)                            # only when a bias is given
    y[row] = acc.to(x.dtype)

Each chunk is one chain of tensor-core MMAs into one fp32 accumulator, in increasing K order, on
every path. Measured on H200 (Triton 3.6, DESIGN.md): that chain gives the same bits for any
BLOCK_M / BLOCK_N, any num_warps / num_stages, wgmma or mma.sync, TMA or pointer loads. The split is a
function of K only, never of M or N: long-K weights (O / down projections) get enough programs at
decode-sized M without changing any row's arithmetic between M = 1 and M = 65536, and a fused
qkv / gate_up weight splits exactly as its separate parts do. Small M computes the chunk partials in separate programs into an fp32 workspace and
adds them in chunk order in a second kernel; large M keeps a second accumulator in registers and
adds each finished chunk in the same order: the same fp32 additions. So the tile configuration is
a *free knob* chosen per problem shape, while ``GEMM_BLOCK_K`` and the split rule are the coupled
contract. On the CPU interpreter a ``tl.dot`` of one K chunk is computed exactly (see
``areal_tik_plugin.runtime.interp``), so the bits there depend only on the contract as well.

Kernels (the same arithmetic):
* ``_linear_ptr_kernel``: pointer loads (cp.async pipeline on sm_80/90), any 16-bit-aligned strides;
* ``_linear_tma_kernel``: TMA descriptors (sm_90), used when base pointers and row strides are
  16-byte aligned;
* ``_linear_partial_kernel`` + ``_linear_reduce_kernel``: the small-M split path;
* ``gemm_gluon._linear_gluon_ws`` (sm_90, M in gemm_gluon's band): the same chains in Gluon, warp-specialized
  and persistent (a producer warp's TMA ring, two consumer warpgroups per 128-row tile).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from . import contract as C
from ._rowops import (cdiv as _cdiv, interpreting as _rowops_interpreting, launch_opts as _rowops_launch_opts,
                      next_pow2 as _next_pow2, pdl_start, tickets as _tickets)
from ._rowops import launch

# ------------------------------------------------------------------------------------------------
# Free knobs (bits do not depend on any of these; the search may move them freely).
# ------------------------------------------------------------------------------------------------
# Decode-sized M (<= 64): weight-bandwidth bound. One row tile (x rows past M are masked, so they
# cost no memory traffic); many programs over N. Per row tier (max_M, BLOCK_M): the widest BLOCK_N of
# the tier's candidates that still gives >= the tier's programs per SM (else the narrowest); warps per
# BLOCK_N on unsplit weights (SMALL_M_WARPS on split ones); stages from Little's law: about
# SMALL_M_INFLIGHT_BYTES of weights in flight per SM at the average programs per SM, clamped to
# [SMALL_M_MIN_STAGES, SMALL_M_MAX_STAGES] and to what one wave of programs can hold in
# SMALL_M_SMEM_PER_SM (programs that do not fit would run as a tail wave). H200 sweep
# (python -m benchmarks.gemm_sweep --small-m 1,8,16,32,64 --split: 12 dense shapes of
# Qwen2.5-1.5B / Qwen3-4B / Qwen3-8B / Qwen3-30B-A3B, weights streamed from HBM, 0 bit mismatches): the
# old rule (BLOCK_N 32, 9 stages, 4 warps) left e.g. Qwen3-4B gate_up at M=1 at 38.5 us where BLOCK_N 64
# with 5 stages took 28.3 (cuBLAS 31.6): 9 stages let only 4 of its 4.6 programs per SM be resident.
SMALL_M_TIERS = (
    # (max_M, BLOCK_M, BLOCK_N candidates unsplit, min programs/SM, BLOCK_N candidates split partials,
    #  min programs/SM (tiles x chunks), warps by BLOCK_N on unsplit weights)
    (16, 16, (64, 32, 16), 0.6, (64, 32, 16), 0.6, ((64, 4), (32, 2), (16, 4))),
    (32, 32, (128, 64, 32, 16), 1.0, (128, 64, 32), 1.0, ((128, 2), (64, 2), (32, 2), (16, 2))),
    (64, 64, (64, 32, 16), 0.6, (64, 32), 2.5, ((64, 4), (32, 4), (16, 4))),
)
SMALL_M_INFLIGHT_BYTES = 49152
# ... except with >= SMALL_M_MANY_WAVES waves of programs (lm_head: 2374 at BLOCK_N 64), where the stage
# count per BLOCK_M is SMALL_M_MANY_WAVES_STAGES (H200 sweep, Qwen3-4B lm_head: M=1 182.8 us at 12
# stages vs 193.6 at 4, M=64 197.9 at 4 vs 213.7 at 8; cuBLAS 188.4 / 200.2)
SMALL_M_MANY_WAVES = 8
SMALL_M_MANY_WAVES_STAGES = ((16, 12), (32, 4), (64, 4))
SMALL_M_MIN_STAGES = 4
SMALL_M_MAX_STAGES = 12
SMALL_M_SMEM_PER_SM = 200 * 1024
SMALL_M_WARPS = 4                                   # split weights (partial and fused flat paths)
# unsplit weights at BLOCK_M >= TMA_MIN_BLOCK_M and BLOCK_N >= SMALL_M_TMA_MIN_BLOCK_N: TMA loads (sweep,
# M=64, BLOCK_N 64: 1-5% faster; BLOCK_N 16 / 32 on Qwen2.5-1.5B o: 6.1 / 6.3 us vs 5.2 / 5.6 without)
SMALL_M_TMA = True
SMALL_M_TMA_MIN_BLOCK_N = 64
# Larger M: compute bound. Candidate tiles (BLOCK_M, BLOCK_N, num_warps, num_stages, programs per
# SM that fit in shared memory, relative per-SM throughput); config_for picks the one with the
# least modeled time (waves x tile work / throughput). The same sweep measured 128x128 with one
# warpgroup (4 warps, 4 stages) fastest at M = 1024 and 4096 on every shape but two, where 64x256
# was within 2%; every 8-warp tile was 5-40% slower.
LARGE_M_TILES = (
    (128, 128, 4, 4, 1, 1.00),
    (64, 256, 4, 4, 1, 0.98),
)
# Unsplit weights at large M run the chosen tile on the persistent TMA kernel (one program per SM
# striding over the tiles; H200 sweep `gemm_sweep --persistent`, M 1024 / 4096 over the four
# unsplit shapes: geomean vs cuBLAS 0.825 -> 0.861 and 0.909 -> 0.984 for 128x128 on one warpgroup).
LARGE_M_PERSISTENT = True
# Large M on a split weight (split_chunk < K) keeps two fp32 accumulators (chunk partial + running
# sum), on the non-persistent kernel (persistent lost 15-60% there: the flat loop's second
# accumulator spills). Candidates (BLOCK_M, BLOCK_N, num_warps, num_stages, programs per SM, relative
# speed) chosen by the same wave model as LARGE_M_TILES: H200 sweep over the eight split shapes
# at M 1024 / 4096, two warpgroups, 128x128 with 5 stages or 128x256 with 4; the model picks the
# measured faster of the two on all 16 (shape, M) points (geomean vs cuBLAS 0.793 -> 0.90 at M=1024
# and 0.859 -> 0.884 at 4096 when each point takes its faster one).
LARGE_M_SPLIT_TILES = (
    (128, 128, 8, 5, 1, 0.97),
    (128, 256, 8, 4, 1, 1.00),
)
# Mid M: M > 64 where the large-M tile chosen above gives fewer than MID_M_MIN_PROGRAMS_PER_SM programs per SM
# (Qwen3-4B o at M=256: 2 x 20 tiles of 128 x 128 on 132 SMs, each program walking all of K). There the
# decode-sized kernels run instead, over several row tiles: unsplit weights with 64-row tiles at the widest
# BLOCK_N of MID_M_BLOCK_N that still gives that many programs (else the narrowest; TMA from
# SMALL_M_TMA_MIN_BLOCK_N), split weights on the chunk-partial path (tiles x chunks programs) with the first
# (BLOCK_M, BLOCK_N, warps) of MID_M_SPLIT_TILES that does (else the last: the most programs). H200 probe (11 shapes x M 128 / 256 / 512 / 1024, weights streamed, 0 bit mismatches): the large tile had a floor of
# ~10 us on small unsplit weights (Qwen2.5-1.5B o M=128: 10.4 vs 5.8 at 64 x 32; cuBLAS 5.9) and of one
# program's whole K on split ones (Qwen3-4B down M=128: 49.5 vs 28.4 partial 128 x 128; cuBLAS 22.1); the
# tile-count threshold 0.6 x SMs separates the points where the large tile won (80+ tiles) from those where
# the smaller ones did (64 or fewer); 64 x 64 partials as the last resort: Qwen3-30B-A3B o at M=128 10.8 us
# against 14.8 at 128 x 64 (32 / 64 programs at 128 rows; cuBLAS 9.9).
MID_M = True
MID_M_MIN_PROGRAMS_PER_SM = 0.6
MID_M_BLOCK_N = (128, 64, 32)
MID_M_SPLIT_TILES = ((128, 128, 8), (128, 64, 4), (64, 64, 4))
# Small M on a split weight: the chunk-partial path (tiles x chunks programs, the ordered reduce in
# each tile's last program), except a weight of <= SPLIT_FUSED_MAX_CHUNKS chunks that has >=
# SPLIT_FUSED_MIN_PROGRAMS_PER_SM programs per SM at BLOCK_N SPLIT_FUSED_BLOCK_N (wide fused qkv /
# gate_up): the fused flat path there
# (no workspace; sweep: Qwen3-8B gate_up M=1 51.6 us vs 54.2 partial); and from M >=
# SPLIT_FUSED_NARROW_MIN_M the narrow ones too, at BLOCK_N SPLIT_FUSED_NARROW_BLOCK_N. Off (65) since the
# partial kernel's chunk loop got a fixed trip count (SPLIT_PARTIAL_FIXED_TRIPS: its 64-row wgmma is no
# longer serialized): H200 probe (weights streamed, 3 rounds, us at
# M=64, fused flat n32 -> partial n32): Qwen3-4B o 13.2 -> 12.5, Qwen3-30B-A3B o 12.6 -> 8.8, Qwen3-8B o
# 13.5 -> 13.7 (cuBLAS 10.0 / 10.2 / 12.4). Before that knob the fused flat path won at M=64 (sweep:
# Qwen3-4B o 12.7 vs 13.7 partial, Qwen3-8B o 13.4 vs 14.2).
SPLIT_FUSED_MAX_CHUNKS = 2
SPLIT_FUSED_BLOCK_N = 64
SPLIT_FUSED_MIN_PROGRAMS_PER_SM = 0.6  # (sweep, M=32: Qwen3-8B qkv fused flat 17.0 us vs 18.7 partial)
SPLIT_FUSED_NARROW_MIN_M = 65
SPLIT_FUSED_NARROW_BLOCK_N = 32
# Split weight, M <= SPLIT_PARTIAL_MAX_M: the small-M rule above (chunk partials in separate programs,
# tiles x chunks, + the ordered reduction, or the fused flat path); larger M: both accumulators in one program ("fused"), whose program count
# equals the unsplit kernel's. SPLIT_FLAT: the fused path runs one pipelined K loop and adds the
# finished chunk at each chunk boundary (else one loop per chunk). Same arithmetic on every path.
SPLIT_PARTIAL_MAX_M = 64
SPLIT_FLAT = True          # sweep: flat within 2% of one-loop-per-chunk or faster on every large-M tile
GROUP_M = 8              # grouped (swizzled) tile order for L2 reuse
USE_TMA = True           # TMA descriptor loads/stores for BLOCK_M >= TMA_MIN_BLOCK_M when aligned
TMA_MIN_BLOCK_M = 64
# CPU interpreter: fewer, larger programs run faster in numpy.
CPU_BLOCK = (64, 64)
# sm_90, M in gemm_gluon's band (MIN_M..MAX_M): gemm_gluon's warp-specialized kernel instead of the Triton ones
# (the same chains, so the same bits). config_for marks those shapes "gluon" and keeps the Triton configuration
# as the fallback for devices and tensors gemm_gluon.applies refuses.
GLUON = True

KNOBS = {
    "coupled": {"GEMM_BLOCK_K": C.GEMM_BLOCK_K},
    "free": {
        "SMALL_M_TIERS": SMALL_M_TIERS,
        "SMALL_M_INFLIGHT_BYTES": (32768, 49152, 65536),
        "SMALL_M_MANY_WAVES": (4, 8, 16),
        "SMALL_M_MANY_WAVES_STAGES": SMALL_M_MANY_WAVES_STAGES,
        "SMALL_M_MIN_STAGES": (2, 3, 4),
        "SMALL_M_MAX_STAGES": (8, 12, 16),
        "SMALL_M_SMEM_PER_SM": (160 * 1024, 200 * 1024, 224 * 1024),
        "SMALL_M_WARPS": (2, 4),
        "SMALL_M_TMA": (False, True),
        "SMALL_M_TMA_MIN_BLOCK_N": (16, 32, 64),
        "LARGE_M_TILES": LARGE_M_TILES,
        "LARGE_M_SPLIT_TILES": LARGE_M_SPLIT_TILES,
        "LARGE_M_PERSISTENT": (False, True),
        "MID_M": (False, True),
        "MID_M_MIN_PROGRAMS_PER_SM": (0.3, 0.6, 1.0),
        "MID_M_BLOCK_N": MID_M_BLOCK_N,
        "MID_M_SPLIT_TILES": MID_M_SPLIT_TILES,
        "SPLIT_FUSED_MAX_CHUNKS": (1, 2, 3),
        "SPLIT_FUSED_BLOCK_N": (32, 64, 128),
        "SPLIT_FUSED_MIN_PROGRAMS_PER_SM": (0.6, 1.0, 1e9),
        "SPLIT_FUSED_NARROW_MIN_M": (17, 33, 65),
        "SPLIT_FUSED_NARROW_BLOCK_N": (16, 32, 64),
        "SPLIT_PARTIAL_MAX_M": (1, 16, 32, 64),
        "SPLIT_FLAT": (False, True),
        "SPLIT_REDUCE_IN_LAST": (False, True),
        "SPLIT_PARTIAL_FIXED_TRIPS": (False, True),
        "GROUP_M": (1, 4, 8, 16),
        "USE_TMA": (False, True),
        "GLUON": (False, True),
    },
}


def _interpreting() -> bool:
    return _rowops_interpreting()


# ------------------------------------------------------------------------------------------------
# Kernels
# ------------------------------------------------------------------------------------------------
@triton.jit
def _tile_ids(pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP: tl.constexpr):
    """Grouped tile order: GROUP row-tiles share each column-tile sweep (L2 reuse of W and x)."""
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_in_group = GROUP * num_pid_n
    group_id = pid // num_in_group
    first_m = group_id * GROUP
    group_size = tl.minimum(num_pid_m - first_m, GROUP)
    pid_m = first_m + (pid % num_in_group) % group_size
    pid_n = (pid % num_in_group) // group_size
    return pid_m, pid_n


@triton.jit
def _bias_epilogue(acc, Bias, offs_n, N, HAS_BIAS: tl.constexpr):
    """The one place where a bias is applied: fp32 add after the whole K loop.

    ``acc + 0.0`` first turns a -0.0 sum into +0.0: on sm_90 the first wgmma of a chain may run
    without the (zero) accumulator while mma.sync adds it, which can differ only in the sign of an
    exactly-zero row (all products -0.0); every other value is unchanged."""
    acc = acc + 0.0
    if HAS_BIAS:
        b = tl.load(Bias + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)
        acc = acc + b[None, :]
    return acc


@triton.jit
def _ptr_tile(pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP: tl.constexpr):
    """Row/column/K offsets of a pointer-load program's tile. x rows past M are masked (zero-filled, no
    memory traffic: decode M << BLOCK_M); weight rows past N re-read row 0 (results discarded). Masks
    never change the values of valid rows."""
    pid_m, pid_n = _tile_ids(pid, M, N, BLOCK_M, BLOCK_N, GROUP)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_ok = offs_m[:, None] < M
    rn = tl.where(offs_n < N, offs_n, 0).to(tl.int64)
    return offs_m, offs_n, offs_k, m_ok, rn


@triton.jit
def _chunk_chain_ptr(x_row, w_row, m_ok, offs_k, k_lo, k_hi, K,
                     EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """One chunk's chain from zero: part = dot(x[:, k_lo:k_hi], w[:, k_lo:k_hi]^T), BLOCK_K at a time."""
    part = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        kk = k0 + offs_k
        if EVEN_K:
            a = tl.load(x_row + kk[None, :], mask=m_ok, other=0.0)
            b = tl.load(w_row + kk[None, :])
        else:
            kmask = kk[None, :] < K
            a = tl.load(x_row + kk[None, :], mask=m_ok & kmask, other=0.0)
            b = tl.load(w_row + kk[None, :], mask=kmask, other=0.0)
        part = tl.dot(a, tl.trans(b), part)
    return part


@triton.jit
def _chunk_chain_fixed(x_row, w_row, m_ok, offs_k, k_lo, k_hi,
                       MASK_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       TRIPS: tl.constexpr):
    """:func:`_chunk_chain_ptr` with a trip count the compiler sees: TRIPS = CHUNK_K / BLOCK_K for every
    chunk; a shorter last chunk (MASK_K) runs its trailing steps on zero-filled tiles (masked loads move no
    bytes). A dot of zero tiles adds exact zeros to the chain, which changes at most the sign of an
    exactly-zero partial, and the ordered chunk sum ``(0 + part_0) + ...`` and ``acc + 0.0`` make that sign
    +0 on every path: the same bits. Why: with a runtime trip count ptxas serializes the chain's wgmma (warning
    C7515, each wgmma waited for before the next is issued; benchmarks/compile_gemm_moe_sm90.py reports it)."""
    part = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    xp = x_row + k_lo + offs_k[None, :]
    wp = w_row + k_lo + offs_k[None, :]
    for ki in range(0, TRIPS):
        if MASK_K:
            kmask = (k_lo + ki * BLOCK_K + offs_k[None, :]) < k_hi
            a = tl.load(xp, mask=m_ok & kmask, other=0.0)
            b = tl.load(wp, mask=kmask, other=0.0)
        else:
            a = tl.load(xp, mask=m_ok, other=0.0)
            b = tl.load(wp)
        part = tl.dot(a, tl.trans(b), part)
        xp += BLOCK_K
        wp += BLOCK_K
    return part


@triton.jit(do_not_specialize=["M"])
def _linear_ptr_kernel(
    X, W, Bias, Y, M, N, K, stride_xm, stride_wn, stride_ym,
    HAS_BIAS: tl.constexpr, EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP: tl.constexpr,
    CHUNK_K: tl.constexpr = 0, N_CHUNKS: tl.constexpr = 1, SPLIT_FLAT: tl.constexpr = False, PDL: tl.constexpr = False,
):
    pdl_start(PDL)
    offs_m, offs_n, offs_k, m_ok, rn = _ptr_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, BLOCK_K, GROUP)
    if N_CHUNKS == 1:
        x_ptrs = X + offs_m.to(tl.int64)[:, None] * stride_xm + offs_k[None, :]
        w_ptrs = W + rn[:, None] * stride_wn + offs_k[None, :]
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            if EVEN_K:
                a = tl.load(x_ptrs, mask=m_ok, other=0.0)
                b = tl.load(w_ptrs)
            else:
                kmask = offs_k[None, :] < K - k0
                a = tl.load(x_ptrs, mask=m_ok & kmask, other=0.0)
                b = tl.load(w_ptrs, mask=kmask, other=0.0)
            acc = tl.dot(a, tl.trans(b), acc)
            x_ptrs += BLOCK_K
            w_ptrs += BLOCK_K
    elif SPLIT_FLAT:  # split weight: one pipelined K loop, the finished chunk added at each boundary
        x_ptrs = X + offs_m.to(tl.int64)[:, None] * stride_xm + offs_k[None, :]
        w_ptrs = W + rn[:, None] * stride_wn + offs_k[None, :]
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        part = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        k_tiles = tl.cdiv(K, BLOCK_K)
        for ki in range(0, k_tiles):
            if EVEN_K:
                a = tl.load(x_ptrs, mask=m_ok, other=0.0)
                b = tl.load(w_ptrs)
            else:
                kmask = offs_k[None, :] < K - ki * BLOCK_K
                a = tl.load(x_ptrs, mask=m_ok & kmask, other=0.0)
                b = tl.load(w_ptrs, mask=kmask, other=0.0)
            part = tl.dot(a, tl.trans(b), part)
            if ((ki + 1) % (CHUNK_K // BLOCK_K) == 0) | (ki == k_tiles - 1):
                acc = acc + part
                part = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            x_ptrs += BLOCK_K
            w_ptrs += BLOCK_K
    else:  # split weight, large M: finished chunk partials added in chunk order, in registers
        x_row = X + offs_m.to(tl.int64)[:, None] * stride_xm
        w_row = W + rn[:, None] * stride_wn
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for c in range(N_CHUNKS):
            k_lo = c * CHUNK_K
            k_hi = tl.minimum(k_lo + CHUNK_K, K)
            acc = acc + _chunk_chain_ptr(x_row, w_row, m_ok, offs_k, k_lo, k_hi, K,
                                         EVEN_K, BLOCK_M, BLOCK_N, BLOCK_K)
    acc = _bias_epilogue(acc, Bias, offs_n, N, HAS_BIAS)
    y_ptrs = Y + offs_m.to(tl.int64)[:, None] * stride_ym + offs_n[None, :]
    tl.store(y_ptrs, acc.to(Y.dtype.element_ty), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


@triton.jit
def _tma_chain(x_desc, w_desc, off_m, off_n, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               BLOCK_K: tl.constexpr, CHUNK_K: tl.constexpr, N_CHUNKS: tl.constexpr):
    """One tile's K reduction with TMA loads (out-of-bounds K columns are zero-filled by TMA): one chain
    (N_CHUNKS == 1), or a split weight's flat form: one pipelined loop that adds the finished chunk to
    the running sum at each chunk boundary, chunks in order."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_tiles = tl.cdiv(K, BLOCK_K)
    if N_CHUNKS == 1:
        for ki in range(k_tiles):
            a = x_desc.load([off_m, ki * BLOCK_K])
            b = w_desc.load([off_n, ki * BLOCK_K])
            acc = tl.dot(a, b.T, acc)
    else:
        part = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for ki in range(k_tiles):
            a = x_desc.load([off_m, ki * BLOCK_K])
            b = w_desc.load([off_n, ki * BLOCK_K])
            part = tl.dot(a, b.T, part)
            if ((ki + 1) % (CHUNK_K // BLOCK_K) == 0) | (ki == k_tiles - 1):
                acc = acc + part
                part = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    return acc


@triton.jit(do_not_specialize=["M"])
def _linear_tma_kernel(
    x_desc, w_desc, y_desc, Bias, M, N, K,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP: tl.constexpr,
    CHUNK_K: tl.constexpr = 0, N_CHUNKS: tl.constexpr = 1, SPLIT_FLAT: tl.constexpr = False, PDL: tl.constexpr = False,
):
    pdl_start(PDL)
    pid = tl.program_id(0)
    pid_m, pid_n = _tile_ids(pid, M, N, BLOCK_M, BLOCK_N, GROUP)
    off_m = pid_m * BLOCK_M
    off_n = pid_n * BLOCK_N
    if (N_CHUNKS == 1) | SPLIT_FLAT:  # one chain, or the split weight's flat loop (see _linear_ptr_kernel)
        acc = _tma_chain(x_desc, w_desc, off_m, off_n, K, BLOCK_M, BLOCK_N, BLOCK_K, CHUNK_K, N_CHUNKS)
    else:  # split weight, large M (see _linear_ptr_kernel)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for c in range(N_CHUNKS):
            k_lo = c * CHUNK_K
            k_hi = tl.minimum(k_lo + CHUNK_K, K)
            part = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for k0 in range(k_lo, k_hi, BLOCK_K):
                a = x_desc.load([off_m, k0])
                b = w_desc.load([off_n, k0])
                part = tl.dot(a, b.T, part)
            acc = acc + part
    offs_n = off_n + tl.arange(0, BLOCK_N)
    acc = _bias_epilogue(acc, Bias, offs_n, N, HAS_BIAS)
    y_desc.store([off_m, off_n], acc.to(y_desc.dtype))


@triton.jit(do_not_specialize=["M"])
def _linear_tma_persistent_kernel(
    x_desc, w_desc, y_desc, Bias, M, N, K,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP: tl.constexpr,
    NUM_PROGRAMS: tl.constexpr,
    CHUNK_K: tl.constexpr = 0, N_CHUNKS: tl.constexpr = 1, PDL: tl.constexpr = False,
):
    """The TMA kernel's arithmetic, persistent: min(tiles, NUM_PROGRAMS) programs stride over the tiles
    in the grouped order, so the next tile's loads overlap this tile's epilogue (Triton 3.6's Hopper
    warp specialization was tried: it fails to compile at 4 warps and changes nothing at 8). Each tile
    is still one chain per chunk in increasing K order (split weight: the flat form, chunks in order)."""
    pdl_start(PDL)
    num_tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    for tile in tl.range(tl.program_id(0), num_tiles, NUM_PROGRAMS, flatten=True):
        pid_m, pid_n = _tile_ids(tile, M, N, BLOCK_M, BLOCK_N, GROUP)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = _tma_chain(x_desc, w_desc, off_m, off_n, K, BLOCK_M, BLOCK_N, BLOCK_K, CHUNK_K, N_CHUNKS)
        offs_n = off_n + tl.arange(0, BLOCK_N)
        acc = _bias_epilogue(acc, Bias, offs_n, N, HAS_BIAS)
        y_desc.store([off_m, off_n], acc.to(y_desc.dtype))


@triton.jit(do_not_specialize=["M"])
def _linear_partial_kernel(
    X, W, P, M, N, K, stride_xm, stride_wn,
    EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP: tl.constexpr, CHUNK_K: tl.constexpr,
    Bias=None, Y=None, stride_ym=0, CNT=None,
    HAS_BIAS: tl.constexpr = False, N_CHUNKS: tl.constexpr = 1, LAST_REDUCES: tl.constexpr = False,
    PDL: tl.constexpr = False, FIXED_TRIPS: tl.constexpr = False, MASK_K: tl.constexpr = True,
):
    """Split weight, small M: program (tile, c) writes chunk c's partial to P[c, M, N] (fp32).

    ``LAST_REDUCES``: the tile's last chunk program to finish (an atomic ticket in CNT[tile]) also
    runs the ordered reduction of :func:`_linear_reduce_kernel` for its tile -- the same additions
    in the same order, without a second launch -- and resets CNT[tile] to 0 for the next call."""
    pdl_start(PDL)
    c = tl.program_id(1)
    tile = tl.program_id(0)
    offs_m, offs_n, offs_k, m_ok, rn = _ptr_tile(tile, M, N, BLOCK_M, BLOCK_N, BLOCK_K, GROUP)
    k_lo = c * CHUNK_K
    k_hi = tl.minimum(k_lo + CHUNK_K, K)
    if FIXED_TRIPS:
        part = _chunk_chain_fixed(X + offs_m.to(tl.int64)[:, None] * stride_xm, W + rn[:, None] * stride_wn, m_ok,
                                  offs_k, k_lo, k_hi, MASK_K, BLOCK_M, BLOCK_N, BLOCK_K, CHUNK_K // BLOCK_K)
    else:
        part = _chunk_chain_ptr(X + offs_m.to(tl.int64)[:, None] * stride_xm, W + rn[:, None] * stride_wn, m_ok,
                                offs_k, k_lo, k_hi, K, EVEN_K, BLOCK_M, BLOCK_N, BLOCK_K)
    mn_ok = m_ok & (offs_n[None, :] < N)
    p_rows = offs_m.to(tl.int64)[:, None] * N + offs_n[None, :]
    tl.store(P + c.to(tl.int64) * M * N + p_rows, part, mask=mn_ok)
    if LAST_REDUCES:
        tl.debug_barrier()  # every thread's partial is stored before the ticket is taken (release)
        ticket = tl.atomic_add(CNT + tile, 1, sem="acq_rel", scope="gpu")
        if ticket == N_CHUNKS - 1:  # all chunks of this tile are in P (acquire): reduce in chunk order
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for cc in range(N_CHUNKS):
                acc = acc + tl.load(P + cc * M.to(tl.int64) * N + p_rows, mask=mn_ok, other=0.0,
                                    cache_modifier=".cg")
            acc = _bias_epilogue(acc, Bias, offs_n, N, HAS_BIAS)
            tl.store(Y + offs_m.to(tl.int64)[:, None] * stride_ym + offs_n[None, :], acc.to(Y.dtype.element_ty),
                     mask=mn_ok)
            tl.atomic_xchg(CNT + tile, 0, sem="relaxed", scope="gpu")


@triton.jit(do_not_specialize=["M"])
def _linear_reduce_kernel(P, Bias, Y, M, N, stride_ym, HAS_BIAS: tl.constexpr, N_CHUNKS: tl.constexpr,
                          BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    """acc = ((0 + P[0]) + P[1]) + ... in chunk order, then the epilogue: the large-M arithmetic."""
    pdl_start(PDL)
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < M * N
    m = offs // N
    n = offs % N
    mn = M.to(tl.int64) * N
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for c in range(N_CHUNKS):
        acc = acc + tl.load(P + c * mn + offs, mask=ok, other=0.0)
    acc = acc + 0.0
    if HAS_BIAS:
        acc = acc + tl.load(Bias + n, mask=ok, other=0.0).to(tl.float32)
    tl.store(Y + m * stride_ym + n, acc.to(Y.dtype.element_ty), mask=ok)


# ------------------------------------------------------------------------------------------------
# Configuration (free knob) and launcher
# ------------------------------------------------------------------------------------------------
_NUM_SMS: dict[int, int] = {}


def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 132
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _NUM_SMS:
        _NUM_SMS[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _NUM_SMS[idx]


def config_for(M: int, N: int, K: int, num_sms: int = 132, cpu: bool = False) -> dict:
    """Tile configuration for an [M, K] x [N, K]^T problem (a free knob: any result keeps the bits).

    Returns a dict with BLOCK_M, BLOCK_N, num_warps, num_stages, GROUP_M, tma (bool), name; for a shape in
    gemm_gluon's band (GLUON on) also ``gluon`` (gemm_gluon's plan: BLOCK_N, split, stages), the name of
    that kernel and ``fallback``, the name of the Triton configuration that the other keys describe. Memoized per shape (host overhead): a fresh
    dict each call.
    """
    cfg = dict(_config_for(M, N, K, num_sms, cpu))
    if GLUON and not cpu and _gluon().in_band(M):
        g = _gluon_config(M, N, K, num_sms, _gluon().module_knobs())
        if g:
            cfg.update(g, fallback=cfg["name"])
    return cfg


@functools.lru_cache(maxsize=None)
def _gluon():
    from . import gemm_gluon

    return gemm_gluon


@functools.lru_cache(maxsize=4096)
def _gluon_config(M: int, N: int, K: int, num_sms: int, knobs: tuple) -> dict:
    g = _gluon()
    if not g.takes(M, N, K):
        return {}
    p = g.plan(M, N, K, split_chunk(K), num_sms)
    if p["items"] < g.MIN_ITEMS_PER_SM * num_sms:   # too few 128-row tiles: the Triton mid-M rule's 64-row ones
        return {}
    return _gluon_cfg(p["BLOCK_N"], p["split"], p["stages"], p["halves"])


def _gluon_cfg(bn: int, split: int, stages: int, halves: int) -> dict:
    return {"gluon": {"BLOCK_N": bn, "split": split, "stages": stages, "halves": halves},
            "name": f"gluon_ws_m{64 * halves}_n{bn}_{'split' if split else 'fused'}_s{stages}"}


@functools.lru_cache(maxsize=4096)
def _config_for(M: int, N: int, K: int, num_sms: int, cpu: bool) -> dict:
    if cpu:
        bm = min(CPU_BLOCK[0], max(16, _next_pow2(max(M, 1))))
        bn = min(CPU_BLOCK[1], max(16, _next_pow2(max(N, 1))))
        split = "partial" if M <= SMALL_M_TIERS[-1][0] else "fused"
        return dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=4, num_stages=1, GROUP_M=GROUP_M, tma=False,
                    split=split, name=f"cpu_m{bm}_n{bn}_{split}")
    if M <= SMALL_M_TIERS[-1][0]:
        return _small_m_config(M, N, K, num_sms)
    split_weight = split_chunk(K) < K
    best, best_time = None, float("inf")
    for bm, bn, warps, stages, per_sm, speed in (LARGE_M_SPLIT_TILES if split_weight else LARGE_M_TILES):
        tiles = _cdiv(M, bm) * _cdiv(N, bn)
        waves = _cdiv(tiles, num_sms * per_sm)
        sharing = min(per_sm, _cdiv(tiles, num_sms))  # programs sharing one SM
        est = waves * bm * bn * sharing / speed             # relative time model
        if est < best_time * (1 - 1e-9):
            best, best_time = (bm, bn, warps, stages), est
    if MID_M and _cdiv(M, best[0]) * _cdiv(N, best[1]) < MID_M_MIN_PROGRAMS_PER_SM * num_sms:
        return _mid_m_config(M, N, K, num_sms)
    return _large_config(*best, split_weight=split_weight)


def _mid_m_config(M: int, N: int, K: int, num_sms: int) -> dict:
    """The mid-M rule (MID_M_*; see the comments there): decode-sized kernels over several row tiles."""
    want = MID_M_MIN_PROGRAMS_PER_SM * num_sms
    chunks = _cdiv(K, split_chunk(K))
    if chunks == 1:
        progs = lambda b: _cdiv(M, 64) * _cdiv(N, b)  # noqa: E731
        bn = next((b for b in MID_M_BLOCK_N if progs(b) >= want), MID_M_BLOCK_N[-1])
        return _small_config(64, bn, split="fused", warps=4, programs=progs(bn), num_sms=num_sms, tma=SMALL_M_TMA)
    progs = lambda t: _cdiv(M, t[0]) * _cdiv(N, t[1]) * chunks  # noqa: E731
    bm, bn, warps = next((t for t in MID_M_SPLIT_TILES if progs(t) >= want), MID_M_SPLIT_TILES[-1])
    return _small_config(bm, bn, split="partial", warps=warps, programs=progs((bm, bn)), num_sms=num_sms)


def _large_config(bm: int, bn: int, warps: int, stages: int, split_weight: bool = False, flat=None,
                  persistent=None) -> dict:
    flat = SPLIT_FLAT if flat is None else flat
    persistent = (LARGE_M_PERSISTENT and not split_weight) if persistent is None else persistent
    return dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=warps, num_stages=stages, GROUP_M=GROUP_M,
                tma=USE_TMA and bm >= TMA_MIN_BLOCK_M, split="fused", split_weight=split_weight, flat=flat,
                persistent=persistent,
                name=f"large_{'persistent_' if persistent else ''}{'split_' if split_weight else ''}"
                     f"{'flat_' if split_weight and flat else ''}m{bm}_n{bn}_w{warps}_s{stages}")


def _small_m_config(M: int, N: int, K: int, num_sms: int) -> dict:
    """The decode-sized rule (SMALL_M_TIERS, the SPLIT_FUSED_* knobs); see the comments there."""
    _, bm, bn_plain, min_plain, bn_split, min_split, warps_by_bn = next(t for t in SMALL_M_TIERS if M <= t[0])

    def widest(cands, programs, min_per_sm):
        return next((bn for bn in cands if programs(bn) >= min_per_sm * num_sms), cands[-1])

    chunks = _cdiv(K, split_chunk(K))
    if chunks == 1:
        bn = widest(bn_plain, lambda b: _cdiv(N, b), min_plain)
        return _small_config(bm, bn, split="fused", warps=dict(warps_by_bn)[bn], programs=_cdiv(N, bn),
                             num_sms=num_sms, tma=SMALL_M_TMA)
    if M > SPLIT_PARTIAL_MAX_M:
        bn = widest(bn_plain, lambda b: _cdiv(N, b), min_plain)
        return _small_config(bm, bn, split="fused", flat=True, programs=_cdiv(N, bn), num_sms=num_sms)
    if chunks <= SPLIT_FUSED_MAX_CHUNKS:
        bn = None
        if _cdiv(N, SPLIT_FUSED_BLOCK_N) >= SPLIT_FUSED_MIN_PROGRAMS_PER_SM * num_sms:
            bn = SPLIT_FUSED_BLOCK_N
        elif M >= SPLIT_FUSED_NARROW_MIN_M:
            bn = SPLIT_FUSED_NARROW_BLOCK_N
        if bn is not None:
            return _small_config(bm, bn, split="fused", flat=True, programs=_cdiv(N, bn), num_sms=num_sms)
    bn = widest(bn_split, lambda b: _cdiv(N, b) * chunks, min_split)
    return _small_config(bm, bn, split="partial", programs=_cdiv(N, bn) * chunks, num_sms=num_sms)


def _small_stages(bm: int, bn: int, programs: int, num_sms: int) -> int:
    """Pipeline depth: ~SMALL_M_INFLIGHT_BYTES of weights in flight per SM; when all programs fit in one
    wave at SMALL_M_MIN_STAGES, no deeper than keeps them all resident (many waves: the in-flight rule)."""
    w_bytes = bn * C.GEMM_BLOCK_K * 2
    stage_bytes = (bm + bn) * C.GEMM_BLOCK_K * 2
    if programs >= SMALL_M_MANY_WAVES * num_sms:
        stages = next((st for max_bm, st in SMALL_M_MANY_WAVES_STAGES if bm <= max_bm), SMALL_M_MIN_STAGES)
        return max(2, min(stages, SMALL_M_SMEM_PER_SM // stage_bytes))
    per_sm = programs / num_sms
    stages = 1 + int(SMALL_M_INFLIGHT_BYTES // (per_sm * w_bytes))
    stages = max(SMALL_M_MIN_STAGES, min(SMALL_M_MAX_STAGES, stages))
    resident = _cdiv(programs, num_sms)
    if resident * SMALL_M_MIN_STAGES * stage_bytes <= SMALL_M_SMEM_PER_SM:  # one wave can be resident: keep it so
        stages = min(stages, SMALL_M_SMEM_PER_SM // (resident * stage_bytes))
    return max(2, min(stages, SMALL_M_SMEM_PER_SM // stage_bytes))


def _small_config(bm: int, bn: int, split: str = "partial", flat=None, stages=None, warps=None, programs=None,
                  num_sms: int = 132, tma: bool = False) -> dict:
    """A decode-sized configuration. The name leaves out the stage count (a pure scheduling choice,
    computed per shape by _small_stages): one name per compiled kernel variant up to its pipeline depth."""
    flat = SPLIT_FLAT if flat is None else flat
    warps = SMALL_M_WARPS if warps is None else warps
    if stages is None:
        stages = _small_stages(bm, bn, programs or num_sms, num_sms)
    tma = tma and USE_TMA and bm >= TMA_MIN_BLOCK_M and bn >= SMALL_M_TMA_MIN_BLOCK_N
    tag = f"_w{warps}" + ("_tma" if tma else "") + ("" if split == "partial" else ("_fused_flat" if flat else "_fused"))
    return dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=warps, num_stages=stages, GROUP_M=1, tma=tma, split=split, flat=flat,
                name=f"small_m{bm}_n{bn}{tag}")


def all_configs() -> list[dict]:
    """Every GPU configuration :func:`config_for` can return, one per compiled variant (name), at a
    representative stage count (for the contract checks of free knobs)."""
    out, seen = [], set()

    def add(cfg):
        if cfg["name"] not in seen:
            seen.add(cfg["name"])
            out.append(cfg)

    for max_m, bm, bn_plain, _, bn_split, _, warps_by_bn in SMALL_M_TIERS:
        for bn in bn_plain:
            add(_small_config(bm, bn, split="fused", warps=dict(warps_by_bn)[bn], tma=SMALL_M_TMA))
        for bn in bn_split:
            add(_small_config(bm, bn, split="partial"))
        fused = {SPLIT_FUSED_BLOCK_N} | ({SPLIT_FUSED_NARROW_BLOCK_N} if max_m >= SPLIT_FUSED_NARROW_MIN_M else set())
        for bn in sorted(fused | (set(bn_plain) if max_m > SPLIT_PARTIAL_MAX_M else set())):
            add(_small_config(bm, bn, split="fused", flat=True))
    if MID_M:
        for bn in MID_M_BLOCK_N:
            add(_small_config(64, bn, split="fused", warps=4, tma=SMALL_M_TMA))
        for bm, bn, warps in MID_M_SPLIT_TILES:
            add(_small_config(bm, bn, split="partial", warps=warps))
    for bm, bn, w, st, _, _ in LARGE_M_TILES:
        add(_large_config(bm, bn, w, st))
        add(_large_config(bm, bn, w, st, persistent=False))
    for bm, bn, w, st, _, _ in LARGE_M_SPLIT_TILES:
        add(_large_config(bm, bn, w, st, split_weight=True))
    if GLUON:  # on top of a mid-M Triton configuration (the fallback where gemm_gluon does not apply)
        g = _gluon()
        base = _small_config(128, 128, split="partial", warps=8)
        for bn in g.BLOCK_NS:
            for split in (0, 1):
                for halves in (2, 1):
                    add(dict(base, tma=False, **_gluon_cfg(bn, split, g.STAGES[bn, halves], halves)))
    return out


def split_chunk(K: int) -> int:
    """K columns per chunk of a weight with reduction length K (contract.py, GEMM section); >= K means
    no split.

    A function of K only: every M, every N (fused or separate projections, column-parallel shards),
    every device and every path gets the same chunks."""
    bk = C.GEMM_BLOCK_K
    whole = _cdiv(K, bk) * bk
    if K < C.GEMM_SPLIT_MIN_K:
        return whole
    n = _cdiv(K, C.GEMM_SPLIT_CHUNK_MAX)
    if n <= 1:
        return whole
    return _cdiv(_cdiv(K, n), bk) * bk


REDUCE_BLOCK = 1024      # free: elements per program of the small-M split reduction
# free: the small-M split's chunk programs run CHUNK_K / BLOCK_K K steps each, a shorter last chunk on
# zero-filled tiles (see _chunk_chain_fixed): ptxas then pipelines the chain's wgmma at BLOCK_M 64 instead of
# serializing them (C7515 on every BLOCK_M 64 partial variant with the runtime trip count); BLOCK_M 16 / 32
# run mma.sync either way
SPLIT_PARTIAL_FIXED_TRIPS = True
# free: the small-M split's ordered reduction runs in the last chunk program of each tile (atomic
# ticket, no second launch) instead of in _linear_reduce_kernel; same additions, same order
SPLIT_REDUCE_IN_LAST = True


def _tile_counters(device: torch.device, n: int) -> torch.Tensor:
    """The tile tickets of the split reduce in the last program (shared buffer, see _rowops.tickets)."""
    return _tickets(device, n)


def _tma_ok(*tensors) -> bool:
    for t in tensors:
        if t.data_ptr() % 16 or t.stride(-1) != 1 or (t.stride(0) * t.element_size()) % 16:
            return False
    return True


def _launch_opts(cfg) -> dict:
    return _rowops_launch_opts(cfg["num_warps"], cfg["num_stages"])


def linear(x, weight, bias=None, config=None, out=None):
    """``x [M, K] @ weight[N, K]^T (+ bias[N])`` -> ``[M, N]`` in x.dtype (inputs validated by the op).

    ``config`` overrides the tile configuration (tests / contract checks); ``out`` an output buffer.
    """
    M, K = x.shape
    N = weight.shape[0]
    y = torch.empty((M, N), device=x.device, dtype=x.dtype) if out is None else out
    if M == 0:
        return y
    cfg = config or config_for(M, N, K, _num_sms(x.device), cpu=_interpreting())
    chunk = split_chunk(K)
    if cfg.get("gluon") and not _interpreting() and _gluon().applies(x, weight, y):
        return _gluon().linear(x, weight, bias, y, chunk, _num_sms(x.device), _gluon().config(**cfg["gluon"]))
    bm, bn, bk = cfg["BLOCK_M"], cfg["BLOCK_N"], C.GEMM_BLOCK_K
    n_chunks = _cdiv(K, chunk)
    grid = (_cdiv(M, bm) * _cdiv(N, bn),)
    has_bias = bias is not None
    b = bias if has_bias else y
    split = dict(CHUNK_K=chunk, N_CHUNKS=n_chunks, SPLIT_FLAT=bool(cfg.get("flat", SPLIT_FLAT))) if n_chunks > 1 else {}
    if n_chunks > 1 and cfg.get("split", "partial" if bm <= SMALL_M_TIERS[-1][1] else "fused") == "partial":
        # small M: chunk partials in separate programs (tiles x chunks), then the ordered reduction
        part = torch.empty((n_chunks, M, N), device=x.device, dtype=torch.float32)
        last = bool(cfg.get("reduce_in_last", SPLIT_REDUCE_IN_LAST))
        fused = dict(Bias=b, Y=y, stride_ym=y.stride(0), CNT=_tile_counters(x.device, grid[0]), HAS_BIAS=has_bias,
                     N_CHUNKS=n_chunks, LAST_REDUCES=True) if last else {}
        fixed = bool(cfg.get("fixed_trips", SPLIT_PARTIAL_FIXED_TRIPS))
        launch(_linear_partial_kernel, (grid[0], n_chunks),
            x, weight, part, M, N, K, x.stride(0), weight.stride(0),
            EVEN_K=(K % bk == 0), BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP=cfg["GROUP_M"], CHUNK_K=chunk,
            **fused, FIXED_TRIPS=fixed, MASK_K=(K % chunk != 0), **_launch_opts(cfg),
        )
        if not last:
            launch(_linear_reduce_kernel, (_cdiv(M * N, REDUCE_BLOCK),),
                part, b, y, M, N, y.stride(0), HAS_BIAS=has_bias, N_CHUNKS=n_chunks, BLOCK=REDUCE_BLOCK,
                **_launch_opts({"num_warps": 4, "num_stages": 1}),
            )
    elif cfg["tma"] and _tma_ok(x, weight, y):
        from triton.tools.tensor_descriptor import TensorDescriptor

        x_desc = TensorDescriptor(x, [M, K], [x.stride(0), 1], [bm, bk])
        w_desc = TensorDescriptor(weight, [N, K], [weight.stride(0), 1], [bn, bk])
        y_desc = TensorDescriptor(y, [M, N], [y.stride(0), 1], [bm, bn])
        if cfg.get("persistent", False):
            # the stride is a per-device constant (one compiled variant for every M); fewer tiles than
            # that launch one program per tile
            n_prog = _num_sms(x.device) * int(cfg.get("programs_per_sm", 1))
            split.pop("SPLIT_FLAT", None)
            launch(_linear_tma_persistent_kernel, (min(grid[0], n_prog),),
                x_desc, w_desc, y_desc, b, M, N, K,
                HAS_BIAS=has_bias, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP=cfg["GROUP_M"],
                NUM_PROGRAMS=n_prog, **split,
                **_launch_opts(cfg),
            )
        else:
            launch(_linear_tma_kernel, grid,
                x_desc, w_desc, y_desc, b, M, N, K,
                HAS_BIAS=has_bias, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP=cfg["GROUP_M"], **split,
                **_launch_opts(cfg),
            )
    else:
        launch(_linear_ptr_kernel, grid,
            x, weight, b, y, M, N, K, x.stride(0), weight.stride(0), y.stride(0),
            HAS_BIAS=has_bias, EVEN_K=(K % bk == 0),
            BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP=cfg["GROUP_M"], **split,
            **_launch_opts(cfg),
        )
    return y


def linear_backward(dy, x, weight, need_dx, need_dw, need_db):
    """dgrad / wgrad / bias grad with cuBLAS (no invariance requirement on the backward)."""
    dx = dw = db = None
    if need_dx:
        dx = torch.matmul(dy, weight)
    if need_dw:
        dw = torch.matmul(dy.t(), x)
    if need_db:
        db = dy.float().sum(0)
    return dx, dw, db
