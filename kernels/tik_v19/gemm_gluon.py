"""sm_90 dense linear in Gluon for mid-sized M: warp-specialized, persistent, TMA + wgmma.

The arithmetic is ``gemm.py``'s contract, instruction for instruction: every K chunk of
``gemm.split_chunk(K)`` columns is one chain of wgmma (k 16 per instruction, GEMM_BLOCK_K columns per
step, increasing K) into one fp32 accumulator from zero; chunk partials are added in chunk order
``((0 + part_0) + part_1) + ...``; then ``acc + 0.0``, the fp32 bias, one rounding to the activation
dtype. The chain gives the same bits for any tile shape, wgmma or mma.sync (H200, DESIGN.md), so the
outputs should be the bits of ``gemm.py``'s kernels at every M (the GPU decides: Status below). Gluon has no
CPU interpreter: on the CPU
``gemm.py``'s Triton kernels run, and this file is compiled for sm_90 (benchmarks/compile_gemm_gluon_sm90.py).

Why a second kernel: at M 65..1024 (prefill chunks, training micro-batches of a few sequences, the
large decode batches of rollout) the Triton kernels run one warpgroup's loads and MMAs in one
instruction stream and a launch per tile or per (tile, chunk); the H200 sweep left them at 0.69 of
cuBLAS at M = 256 (evidence/probes/gemm/gemm_sweep-split-h200.log). Here one program per SM walks its
work items; a producer warp keeps a ring of ``STAGES`` X / W tiles filled by TMA (the next item's tiles
load under the current item's last MMAs and epilogue) and two consumer warpgroups each run the wgmma
chain of one 64-row half of a 128-row tile over the same W tile (at decode-sized M, ``halves`` 1: one consumer
warpgroup on 64-row tiles and a deeper ring).

Work items (free knob, no bit depends on it):
* ``split`` 1 (a weight of several chunks): an item is (chunk, tile); its partial goes to an fp32
  workspace P[chunk, M, N] and the last of a tile half's chunk items to finish (a ticket per tile half)
  adds the partials in chunk order and writes the output: tiles x chunks items fill the SMs at M 256
  where 128-row tiles alone are 64 for a 4096-wide output;
* ``split`` 0: an item is a tile; the chunks run in one K loop and each finished chunk is added to a
  second accumulator in registers (the large-M form, no workspace).

Status: compiled for sm_90 here. tik_v12's kernel; the rule also hands it 64-row tiles at M 193..256 on the
o / down weights it took on 128-row ones there, and the narrow multi-chunk weights (N 1536..2048, K >= 4096) at
M 193..512 (HALVES_1_BANDS, NARROW_RULE). Which GPU runs this folder is kernels/selection.json's choice, made only
on the contract evidence for this folder's source hash (`tik evidence --implementation tik_v13`).
"""

from __future__ import annotations

import functools

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma, warpgroup_mma, \
    warpgroup_mma_wait

from . import _rowops as R
from . import contract as C

DTYPES = (torch.bfloat16, torch.float16)
HALF_M = 64             # rows per consumer warpgroup (one wgmma M); a tile is one or two halves (``halves``)
SMALL_M_BOX = 32        # x's box rows on a single tile below M 64 (x_box_rows; 0: the 64-row box there too)
# Free knobs (no bit depends on them). BLOCK_N candidates and the ring depth per (BLOCK_N, halves) (shared
# memory: STAGES x (halves x 64 + BLOCK_N) x 64 x 2 bytes <= ~200 KB, one program per SM).
BLOCK_NS = (256, 128, 64)
STAGES = {(256, 2): 4, (128, 2): 6, (64, 2): 8, (256, 1): 5, (128, 1): 8, (64, 1): 12}
# 64-row tiles on one consumer warpgroup for M <= HALVES_1_MAX_M (decode-sized batches: the weights stream
# through a deeper ring, no warpgroup computes rows past M), 128-row tiles on two above. Up to M 128: at M 128
# the 64-row plan unsplit on BLOCK_N 64 (two row tiles) was the fastest plan on Qwen3-4B / 8B o and down, 0.88-1.0x
# cuBLAS where the 128-row plans were 0.55-0.74x (evidence/probes/gemm/gluon_gemm_probe-tik_v7.log, H100)
HALVES_1_MAX_M = 128
# Relative per-SM throughput of one tile step by BLOCK_N (wider wgmma reads the X tile once for more
# columns); the work-item rule below weighs waves x tile width / speed. A model until the probe measures it.
SPEED = {256: 1.0, 128: 0.95, 64: 0.8}
GROUP_M = 8             # grouped tile order: the row tiles of one column tile run side by side (L2 reuse of W)
PROGRAMS_PER_SM = 1
MIN_M = 65              # gemm.py's decode-sized kernels below (>= 1.0x cuBLAS there)
MAX_M = 1024            # gemm.py's large-M kernels above, until the probe weighs this kernel there
SPLIT_MIN_WAVES = 0.75  # split items when whole tiles fill fewer than this many waves of the SMs
MIN_ITEMS_PER_SM = 0.25  # the rule's shapes only: M = 64 on N 2560 is 40 tiles of 64 x 64, and won in the probe
SPLIT_ITEMS = False     # whole-tile items: unsplit BLOCK_N 64 beat the split plans at M = 256 in the probe
# The shapes this kernel takes (M bands, K, N): where the probe's plans beat gemm.py's Triton kernels. At M 65..128
# on an H100 (evidence/probes/gemm/gluon_gemm_probe-tik_v10.log) the 64-row plan was 1.32x tik_v9 at M 128 but
# 0.76x at 65, where the second row tile's X box was mostly past M: _box_row keeps every box on rows that exist
BANDS = ((33, 512),)
RULE_M = (33, 256)
RULE_MIN_K = 4096
RULE_N = (2560, 4096)
# 64-row tiles above HALVES_1_MAX_M too, in these M bands: M 193..256 is four 64-row tiles, as at M 256, where the
# 64-row plan plan() picks (BLOCK_N 128) beat the 128-row one on Qwen3-4B / 8B o and down: 15.6 / 33.2 / 20.0 / 48.1
# us against 15.9 / 34.1 / 20.2 / 54.9, with tik_v11's bits (evidence/probes/gemm/gluon_gemm_probe-large-tik_v12.json,
# H100); M 129..192 (three 64-row tiles) was not timed
HALVES_1_BANDS = ((193, 512),)
# The narrow weights of several chunks at M 193..512 (M band, min K, N range), on 64-row tiles: Qwen2.5-1.5B down
# and Qwen3-30B-A3B o, whose plan() choice took 22.7 / 12.9 us at M 256 (BLOCK_N 64) and 29.9 / 16.7 at M 512
# (BLOCK_N 128) against gemm.py's Triton kernels' 28.4 / 16.1 and 46.0 / 23.6 and cuBLAS's 18.8 / 12.0 and 31.2 /
# 18.2 (the same probe); at M 128 the 64-row plans lost to the Triton kernels on both
# (evidence/probes/gemm/gluon_gemm_probe-tik_v7.json), at M 1024 the 128-row plans tied them at best
NARROW_RULE = ((193, 512), 4096, (1536, 2048))
# The wide weights at M 65..128 (M band, min K, N range): qkv and gate_up of Qwen3-4B / 8B / 30B-A3B, whose best
# 64-row plan at M 128 (the one plan() picks there: BLOCK_N 128, or 64 on Qwen3-4B gate_up) was 1.10-1.29x tik_v6's
# Triton kernels and 0.84-1.0x cuBLAS (evidence/probes/gemm/gluon_gemm_probe-tik_v7.json, H100); N below 5120
# (Qwen2.5-1.5B, Qwen3-30B-A3B o) lost there, the vocabulary projection was not timed
WIDE_RULE = ((65, 128), 2048, (5120, 24576))
REGS_CONSUMER = gl.constexpr(232)
REGS_PRODUCER = gl.constexpr(24)
KNOBS = {"BLOCK_N": BLOCK_NS, "stages": tuple(range(2, 13)), "split": (0, 1), "group": (1, 4, 8, 16),
         "halves": (1, 2)}
# (module-level knobs the search may move: MIN_M, MAX_M, SPLIT_MIN_WAVES, MIN_ITEMS_PER_SM, SPLIT_ITEMS, SPEED,
# STAGES, HALVES_1_MAX_M, HALVES_1_BANDS, RULE_M, WIDE_RULE, NARROW_RULE)


@gluon.jit
def _item(w, n_m, n_n, GROUP: gl.constexpr, SPLIT: gl.constexpr):
    """Work item ``w`` -> (chunk, tile, row tile, column tile). Chunk-major under SPLIT: programs running
    side by side share the chunk's X columns; inside, GROUP row tiles per column tile (the same W tile).
    (This and _k_range are plain integer arithmetic: the CPU tests run them as Python over every item.)"""
    tiles = n_m * n_n
    if SPLIT:
        c = w // tiles
        t = w - c * tiles
    else:
        c = w * 0
        t = w
    per = GROUP * n_n
    first = (t // per) * GROUP
    size = min(n_m - first, GROUP)
    pid_m = first + (t % per) % size
    pid_n = (t % per) // size
    return c, t, pid_m, pid_n


@gluon.jit
def _k_range(c, K, CHUNK_K: gl.constexpr, BK: gl.constexpr, SPLIT: gl.constexpr):
    """First column and GEMM_BLOCK_K steps of an item: one chunk (SPLIT) or all of K."""
    if SPLIT:
        k_lo = c * CHUNK_K
        n_k = (min(K - k_lo, CHUNK_K) + BK - 1) // BK
    else:
        k_lo = c * 0
        n_k = (K + BK - 1) // BK
    return k_lo, n_k


@gluon.jit
def _box_row(base, M):
    """First row of the X box of the tile half whose rows start at ``base``: ``base``, or ``M - 64`` for a half
    that runs past M when M >= 64. The box then holds rows that exist, each in the same wgmma row chain as
    anywhere else (a row's bits do not depend on its place in the box); the consumer stores only rows from
    ``base`` up. A box mostly past M made the TMA zero-fill cost the tile up to 1.6x the time of a full one
    (evidence/probes/gemm/gluon_gemm_oob_probe-tik_v10.json, H100). Plain integer arithmetic (CPU tests)."""
    return max(min(base, M - 64), 0)


@gluon.jit
def _producer(x_desc, w_desc, x0_s, x1_s, w_s, ready, empty, M, K, n_m, n_n, n_items, CHUNK_K: gl.constexpr,
              GROUP: gl.constexpr, SPLIT: gl.constexpr, STAGES: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr,
              HALVES: gl.constexpr):
    """One warp: the TMA loads of this program's items in order, into ring slot cnt % STAGES once every
    consumer released it. Each half's X box starts at _box_row (no row past M from M 64 up); below M 64 X comes
    in two SMALL_M_BOX-row boxes, rows 0.. and M - SMALL_M_BOX.. (x_desc's box rows say which), so no box
    reaches past M either. Rows past N and columns past K are zero-filled by TMA."""
    XBOX: gl.constexpr = x_desc.block_type.shape[0]
    nbytes: gl.constexpr = HALVES * (64 // XBOX) * x_desc.block_type.nbytes + w_desc.block_type.nbytes
    cnt = 0
    for w in range(gl.program_id(0), n_items, gl.num_programs(0)):
        c, t, pid_m, pid_n = _item(w, n_m, n_n, GROUP, SPLIT)
        k_lo, n_k = _k_range(c, K, CHUNK_K, BK, SPLIT)
        row0 = _box_row(pid_m * (HALVES * 64), M)
        row1 = _box_row(pid_m * (HALVES * 64) + 64, M)
        for kk in range(n_k):
            st = cnt % STAGES
            mbarrier.wait(empty.index(st), ((cnt // STAGES) & 1) ^ 1)
            mbarrier.expect(ready.index(st), nbytes)
            col = k_lo + kk * BK
            if XBOX == 64:
                tma.async_copy_global_to_shared(x_desc, [row0, col], ready.index(st), x0_s.index(st))
            else:
                tma.async_copy_global_to_shared(x_desc, [0, col], ready.index(st), x0_s.index(st).slice(0, XBOX))
                tma.async_copy_global_to_shared(x_desc, [M - XBOX, col], ready.index(st),
                                                x0_s.index(st).slice(XBOX, XBOX))
            if HALVES == 2:
                tma.async_copy_global_to_shared(x_desc, [row1, col], ready.index(st), x1_s.index(st))
            tma.async_copy_global_to_shared(w_desc, [pid_n * BN, col], ready.index(st), w_s.index(st))
            cnt += 1


@gluon.jit
def _chain(x_s, w_s, ready, empty, cnt, n_k, acc, STAGES: gl.constexpr):
    """acc = wgmma chain over n_k ring slots from slot cnt, one MMA left in flight: the slot of step k - 1 is
    released once step k is issued and k - 1 retired. Returns (acc, cnt)."""
    for kk in range(n_k):
        st = cnt % STAGES
        mbarrier.wait(ready.index(st), (cnt // STAGES) & 1)
        acc = warpgroup_mma(x_s.index(st), w_s.index(st).permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma_wait(1, deps=[acc])
        if kk > 0:
            mbarrier.arrive(empty.index((cnt + STAGES - 1) % STAGES), count=1)
        cnt += 1
    acc = warpgroup_mma_wait(0, deps=[acc])
    mbarrier.arrive(empty.index((cnt + STAGES - 1) % STAGES), count=1)
    return acc, cnt


@gluon.jit
def _epilogue(acc, Y, Bias, rows, cols, mask, N, stride_ym, HAS_BIAS: gl.constexpr):
    """gemm.py's _bias_epilogue and store: +0.0 (a -0.0 sum -> +0.0), the fp32 bias, one rounding."""
    acc = acc + 0.0
    if HAS_BIAS:
        b = gl.load(Bias + cols, mask=cols < N, other=0.0).to(gl.float32)
        acc = acc + gl.expand_dims(b, 0)
    ptrs = Y + gl.expand_dims(rows.to(gl.int64) * stride_ym, 1) + gl.expand_dims(cols, 0)
    gl.store(ptrs, acc.to(Y.dtype.element_ty), mask=mask)


@gluon.jit
def _consumer(x_s, w_s, ready, empty, Y, P, Bias, CNT, M, N, K, stride_ym, n_m, n_n, n_items,
              HALF: gl.constexpr, CHUNK_K: gl.constexpr, N_CHUNKS: gl.constexpr, GROUP: gl.constexpr,
              SPLIT: gl.constexpr, HAS_BIAS: gl.constexpr, STAGES: gl.constexpr, BN: gl.constexpr,
              BK: gl.constexpr, HALVES: gl.constexpr, XBOX: gl.constexpr):
    """Consumer warpgroup HALF (0: the default partition, 1: a worker): rows HALF * 64 .. + 64 of every tile
    (XBOX < 64, one tile below M 64: its rows 0 .. XBOX - 1 and M - XBOX .., each stored once)."""
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 16])
    offs_r = gl.arange(0, 64, layout=gl.SliceLayout(1, mma))
    offs_c = gl.arange(0, BN, layout=gl.SliceLayout(0, mma))
    mn = M.to(gl.int64) * N
    cnt = 0
    for w in range(gl.program_id(0), n_items, gl.num_programs(0)):
        c, t, pid_m, pid_n = _item(w, n_m, n_n, GROUP, SPLIT)
        k_lo, n_k = _k_range(c, K, CHUNK_K, BK, SPLIT)
        if XBOX == 64:
            base = pid_m * (HALVES * 64) + HALF * 64
            rows = _box_row(base, M) + offs_r
            keep = rows >= base
        else:
            rows = gl.where(offs_r < XBOX, offs_r, offs_r + (M - 2 * XBOX))
            keep = (offs_r < XBOX) | (rows >= XBOX)
        cols = pid_n * BN + offs_c
        mask = gl.expand_dims(keep & (rows < M), 1) & gl.expand_dims(cols < N, 0)
        if SPLIT:
            # one chunk's partial into P[c]; the tile half's last chunk item adds them in chunk order
            part, cnt = _chain(x_s, w_s, ready, empty, cnt, n_k, gl.zeros([64, BN], gl.float32, mma), STAGES)
            prow = gl.expand_dims(rows.to(gl.int64) * N, 1) + gl.expand_dims(cols, 0)
            gl.store(P + c.to(gl.int64) * mn + prow, part, mask=mask)
            gl.thread_barrier()   # every thread's partial is stored before the ticket is taken (release)
            ticket = gl.atomic_add(CNT + (2 * t + HALF), 1, sem="acq_rel", scope="gpu")
            if ticket == N_CHUNKS - 1:
                acc = gl.zeros([64, BN], gl.float32, mma)
                # a runtime trip count (= N_CHUNKS): unrolled, every chunk's load is hoisted and the sum spills
                for cc in range(gl.cdiv(K, CHUNK_K)):
                    acc = acc + gl.load(P + cc * mn + prow, mask=mask, other=0.0, cache_modifier=".cg")
                _epilogue(acc, Y, Bias, rows, cols, mask, N, stride_ym, HAS_BIAS)
                gl.atomic_xchg(CNT + (2 * t + HALF), 0, sem="relaxed", scope="gpu")
        elif N_CHUNKS == 1:
            acc, cnt = _chain(x_s, w_s, ready, empty, cnt, n_k, gl.zeros([64, BN], gl.float32, mma), STAGES)
            _epilogue(acc, Y, Bias, rows, cols, mask, N, stride_ym, HAS_BIAS)
        else:
            # every chunk in turn; the finished chunk added to the running sum in registers, chunk order
            acc = gl.zeros([64, BN], gl.float32, mma)
            for cc in range(N_CHUNKS):
                _, n_kc = _k_range(cc, K, CHUNK_K, BK, True)
                part, cnt = _chain(x_s, w_s, ready, empty, cnt, n_kc, gl.zeros([64, BN], gl.float32, mma), STAGES)
                acc = acc + part
            _epilogue(acc, Y, Bias, rows, cols, mask, N, stride_ym, HAS_BIAS)


@gluon.jit
def _producer_entry(x_desc, w_desc, x0_s, x1_s, w_s, ready, empty, M, K, n_m, n_n, n_items, CHUNK_K: gl.constexpr,
                    GROUP: gl.constexpr, SPLIT: gl.constexpr, STAGES: gl.constexpr, BN: gl.constexpr,
                    BK: gl.constexpr, HALVES: gl.constexpr):
    _producer(x_desc, w_desc, x0_s, x1_s, w_s, ready, empty, M, K, n_m, n_n, n_items, CHUNK_K, GROUP, SPLIT, STAGES,
              BN, BK, HALVES)


@gluon.jit
def _linear_gluon_ws(x_desc, w_desc, Y, P, Bias, CNT, M, N, K, stride_ym, n_m, n_n, n_items,
                     CHUNK_K: gl.constexpr, N_CHUNKS: gl.constexpr, GROUP: gl.constexpr, SPLIT: gl.constexpr,
                     HAS_BIAS: gl.constexpr, STAGES: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr,
                     HALVES: gl.constexpr = 2):
    """``Y = X @ W^T (+ bias)`` over ``n_items`` work items (see the module docstring), dealt to the programs
    in rounds (item p, p + P, ...). x_desc: X [M, K] in [64, BK] boxes; w_desc: W [N, K] in [BN, BK] boxes.
    P: the fp32 workspace [N_CHUNKS, M, N] (SPLIT); CNT: 2 x tiles int32 tickets, 0 before and after.
    HALVES: 64-row consumer warpgroups per tile (2: 128-row tiles; 1: 64-row tiles for decode-sized M)."""
    dt: gl.constexpr = x_desc.dtype
    XBOX: gl.constexpr = x_desc.block_type.shape[0]
    x0_s = gl.allocate_shared_memory(dt, [STAGES, 64, BK], x_desc.layout)
    x1_s = gl.allocate_shared_memory(dt, [STAGES if HALVES == 2 else 1, 64, BK], x_desc.layout)
    w_s = gl.allocate_shared_memory(dt, [STAGES, BN, BK], w_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=HALVES)
    fence_async_shared()
    if HALVES == 2:
        gl.warp_specialize([
            (_consumer, (x0_s, w_s, ready, empty, Y, P, Bias, CNT, M, N, K, stride_ym, n_m, n_n, n_items, 0, CHUNK_K,
                         N_CHUNKS, GROUP, SPLIT, HAS_BIAS, STAGES, BN, BK, HALVES, XBOX)),
            (_consumer, (x1_s, w_s, ready, empty, Y, P, Bias, CNT, M, N, K, stride_ym, n_m, n_n, n_items, 1, CHUNK_K,
                         N_CHUNKS, GROUP, SPLIT, HAS_BIAS, STAGES, BN, BK, HALVES, XBOX)),
            (_producer_entry, (x_desc, w_desc, x0_s, x1_s, w_s, ready, empty, M, K, n_m, n_n, n_items, CHUNK_K, GROUP,
                               SPLIT, STAGES, BN, BK, HALVES)),
        ], [4, 1], [REGS_CONSUMER, REGS_PRODUCER])
    else:
        gl.warp_specialize([
            (_consumer, (x0_s, w_s, ready, empty, Y, P, Bias, CNT, M, N, K, stride_ym, n_m, n_n, n_items, 0, CHUNK_K,
                         N_CHUNKS, GROUP, SPLIT, HAS_BIAS, STAGES, BN, BK, HALVES, XBOX)),
            (_producer_entry, (x_desc, w_desc, x0_s, x1_s, w_s, ready, empty, M, K, n_m, n_n, n_items, CHUNK_K, GROUP,
                               SPLIT, STAGES, BN, BK, HALVES)),
        ], [1], [REGS_PRODUCER])


# ------------------------------------------------------------------------------------------------
# Host side
# ------------------------------------------------------------------------------------------------
def config(**over) -> dict:
    """The launch knobs (``None`` values ignored): BLOCK_N, stages, split, group, halves; refuses unknown ones."""
    cfg = {"BLOCK_N": None, "stages": None, "split": None, "group": GROUP_M, "halves": None}
    for k, v in over.items():
        if v is None:
            continue
        if k not in KNOBS:
            raise ValueError(f"gemm_gluon: unknown knob {k!r}; expected one of {sorted(KNOBS)}")
        if v not in KNOBS[k]:
            raise ValueError(f"gemm_gluon: {k}={v!r}; expected one of {KNOBS[k]}")
        cfg[k] = v
    return cfg


SMEM_RING_MAX = 200 * 1024   # the ring's share of the SM's 227 KB (the rest: barriers, the compiler's scratch)


def ring_bytes(bn: int, stages: int, halves: int = 2) -> int:
    """Shared memory of a ring of ``stages`` (``halves`` 64-row X tiles + one BLOCK_N-row W tile) x GEMM_BLOCK_K."""
    return stages * (halves * HALF_M + bn) * C.GEMM_BLOCK_K * 2


def x_box_rows(M: int, halves: int) -> int:
    """Rows of x's TMA box: HALF_M, or SMALL_M_BOX on one 64-row tile when SMALL_M_BOX < M < HALF_M (two boxes
    that lie inside x, where one 64-row box would run past M: its zero fill cost 9-17 % at M 33 on Qwen3-4B /
    8B o and down, evidence/probes/gemm/gluon_gemm_oob_probe-tik_v11.json, H100)."""
    return SMALL_M_BOX if SMALL_M_BOX and halves == 1 and SMALL_M_BOX < M < HALF_M else HALF_M


def in_band(M: int) -> bool:
    """Whether gemm.py may hand an M-row problem to this kernel (BANDS, a free knob)."""
    return any(lo <= M <= hi for lo, hi in BANDS)


def _rule(M: int, N: int, K: int, rule) -> bool:
    (lo, hi), min_k, (n_lo, n_hi) = rule
    return lo <= M <= hi and K >= min_k and n_lo <= N <= n_hi


def takes(M: int, N: int, K: int) -> bool:
    """Whether this kernel runs the problem: M in BANDS and the shape in the o / down rule (RULE_M, RULE_MIN_K,
    RULE_N), WIDE_RULE or NARROW_RULE (free knobs)."""
    return in_band(M) and (_rule(M, N, K, (RULE_M, RULE_MIN_K, RULE_N)) or _rule(M, N, K, WIDE_RULE)
                           or _rule(M, N, K, NARROW_RULE))


def halves_for(M: int) -> int:
    """Consumer warpgroups per tile by M: 1 (64-row tiles) up to HALVES_1_MAX_M and in HALVES_1_BANDS, else 2."""
    return 1 if M <= HALVES_1_MAX_M or any(lo <= M <= hi for lo, hi in HALVES_1_BANDS) else 2


def plan(M: int, N: int, K: int, chunk: int, sms: int, cfg: dict | None = None) -> dict:
    """Work items and grid for an [M, K] x [N, K]^T problem whose K chunks are ``chunk`` columns
    (gemm.split_chunk): BLOCK_N and split chosen by the wave model unless ``cfg`` fixes them.

    Items under split: chunks x tiles; the model weighs full waves (ceil(items / programs)) x per-item
    work (BLOCK_N x K steps) / SPEED, plus the workspace round trip as one extra step per chunk item.
    Memoized per (shape, knobs): a fresh dict each call."""
    cfg = cfg or config()
    return dict(_plan(M, N, K, chunk, sms, cfg["BLOCK_N"], cfg["split"], cfg["stages"], cfg["group"],
                      cfg.get("halves"), module_knobs()))


def module_knobs() -> tuple:
    """The module-level knobs plan() reads, read per call (a knob set on the module changes the plan)."""
    return (SPLIT_ITEMS, SPLIT_MIN_WAVES, PROGRAMS_PER_SM, MIN_ITEMS_PER_SM, tuple(SPEED.items()),
            tuple(STAGES.items()), HALVES_1_MAX_M, HALVES_1_BANDS, BANDS, RULE_M, RULE_MIN_K, RULE_N, WIDE_RULE,
            NARROW_RULE)


@functools.lru_cache(maxsize=4096)
def _plan(M: int, N: int, K: int, chunk: int, sms: int, block_n, split_knob, stages, group, halves,
          knobs: tuple) -> dict:
    n_chunks = -(-K // chunk)
    halves = halves or halves_for(M)
    n_m = -(-M // (halves * HALF_M))
    progs = sms * PROGRAMS_PER_SM
    best = None
    # BLOCK_N 256 keeps one accumulator only (two of 128 registers spill at 232 per thread): one-chunk weights
    for bn in ([block_n] if block_n else [b for b in BLOCK_NS if b < 256 or n_chunks == 1]):
        tiles = n_m * -(-N // bn)
        for split in ([split_knob] if split_knob is not None else ([0, 1] if SPLIT_ITEMS else [0])):
            split = int(split and n_chunks > 1)
            items = tiles * (n_chunks if split else 1)
            steps = -(-chunk // C.GEMM_BLOCK_K) + 1 if split else -(-K // C.GEMM_BLOCK_K)
            est = -(-items // progs) * bn * steps / SPEED[bn]
            if not split and split_knob is None and n_chunks > 1 and tiles < SPLIT_MIN_WAVES * progs:
                est *= 1.0 + 1e-9          # ties go to split when the tiles alone leave SMs idle
            key = (est, -bn)
            if best is None or key < best[0]:
                best = (key, bn, split, items, tiles)
    _, bn, split, items, tiles = best
    stages = stages or STAGES[bn, halves]
    if ring_bytes(bn, stages, halves) > SMEM_RING_MAX:
        raise ValueError(f"gemm_gluon: BLOCK_N={bn} with stages={stages} and halves={halves} needs "
                         f"{ring_bytes(bn, stages, halves)} bytes of shared memory for its ring; expected at most "
                         f"{SMEM_RING_MAX} (stages <= {SMEM_RING_MAX // ring_bytes(bn, 1, halves)} there)")
    return {"BLOCK_N": bn, "split": split, "stages": stages, "group": group, "halves": halves, "items": items,
            "tiles": tiles, "n_m": n_m, "n_n": -(-N // bn), "n_chunks": n_chunks, "chunk": chunk,
            "programs": min(items, progs)}


def _tma_ok(t: torch.Tensor) -> bool:
    return (t.dim() == 2 and t.stride(1) == 1 and t.data_ptr() % 16 == 0
            and (t.stride(0) * t.element_size()) % 16 == 0)


def applies(x: torch.Tensor, weight: torch.Tensor, y: torch.Tensor) -> bool:
    """Whether ``linear`` runs these tensors: an sm_90 device, bf16 / fp16 throughout, TMA-readable x and
    weight (unit inner stride, 16-byte aligned base and rows), y with unit inner stride. Otherwise gemm.py's
    Triton kernels run (the same bits)."""
    return (x.is_cuda and _capability(x.device.index) == (9, 0) and x.dtype in DTYPES
            and weight.dtype == x.dtype and y.dtype == x.dtype and y.stride(1) == 1
            and _tma_ok(x) and _tma_ok(weight))


@functools.lru_cache(maxsize=None)
def _capability(index: int | None) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def linear(x, weight, bias, y, chunk: int, sms: int, cfg: dict | None = None):
    """``y = x @ weight^T (+ bias)`` (x [M, K], weight [N, K], y [M, N]; ``applies`` holds); ``chunk`` is
    gemm.split_chunk(K). Descriptors and the launch go through attention_gluon's host helpers (memoized
    layouts, Triton's checks skipped where ``applies`` made them; the JIT's per-call work skipped, or the
    native launcher where the loader installed it). While the native host path records (``R._RECORDS``) the
    launch is Triton's own and is recorded with its compiled kernel, so that the path can learn the call's
    recipe (manifest ``linear_kernels``) and serve the public ``linear`` in one C call from then on."""
    from . import attention_gluon as AG

    M, K = x.shape
    N = weight.shape[0]
    p = plan(M, N, K, chunk, sms, cfg)
    bn, bk = p["BLOCK_N"], C.GEMM_BLOCK_K
    xbox = x_box_rows(M, p["halves"])
    xd = AG._descriptor(x, 1, K, (xbox, bk))        # [M, K] read as [rows, 1 x K]: x.shape[0], x.stride(0)
    wd = AG._descriptor(weight, 1, K, (bn, bk))
    if p["split"]:
        work = torch.empty((p["n_chunks"], M, N), device=x.device, dtype=torch.float32)
        cnt = R.tickets(x.device, 2 * p["tiles"])
    else:
        work, cnt = y, y                      # unread
    has_bias = bias is not None
    args = (xd, wd, y, work, bias if has_bias else y, cnt, M, N, K, y.stride(0), p["n_m"], p["n_n"], p["items"])
    kw = dict(CHUNK_K=chunk, N_CHUNKS=p["n_chunks"], GROUP=p["group"], SPLIT=bool(p["split"]), HAS_BIAS=has_bias,
              STAGES=p["stages"], BN=bn, BK=bk, HALVES=p["halves"], num_warps=4, enable_fp_fusion=False)
    grid = (p["programs"], 1, 1)
    if R._RECORDS:  # the native host path learns this kind of call: Triton's launch, recorded with its kernel
        R._RECORDS[-1].append((_linear_gluon_ws, grid, args, kw, _linear_gluon_ws[grid](*args, **kw)))
    else:
        AG._launch(_linear_gluon_ws, grid, args, kw)
    return y
