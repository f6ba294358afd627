"""sm_90 fused attention backward in Gluon, warp-specialized: two consumer warpgroups and a producer warp.

tik_v18's kernel (the same formulas, tiles and integer dQ; its docstring says why) runs its two warpgroups through
every phase of a tile pair in step, three CTA barriers a pair, the TMA issue and waits of the loads and of the dQ
reduce-add on the same warps: on an H100 it took ~4.7 us per tile pair on an SM, about three times the pair's MMA
time, and was no faster than tik_v13's split kernels (evidence/probes/attn_bwd_probe-tik_v18.json). Here:

* a producer warp loads K / V once and the Q / dO ring (the pair two ahead into a slot once both consumers are done
  with it: ``empty``), and sends each pair's dQ integers as a TMA reduce-add once both consumers wrote their halves
  (``dq_full``), handing the buffer back when the reduce has read it (``dq_empty``); the consumers never wait for a
  TMA operation they did not need the data of;
* consumer warpgroup C (the default partition and a worker, setmaxnreg 232 / 24 beside the producer) owns keys
  C * 64 .. + 64 of the block: S, dP, P (through its own shared tile), dV and dK of those keys, and head dims
  C * 64 .. + 64 of dQ = dS K over all 128 keys, which needs the other warpgroup's half of dS: the one cross-
  warpgroup wait of a pair (``ds_ready``, dS double-buffered by pair parity);
* the barriers that remain are per warpgroup (a tile written to shared memory before an MMA reads it), so one
  warpgroup's softmax or dQ conversion can run under the other's MMAs.

Values: tik_v18's formulas and scale (the int32 fixed point of ``attention._bwd_fx_preprocess``, SHIFT 31); the
gradients are not the bits of tik_v18's (no bit contract binds the backward) but repeat their own bits.

Gluon has no CPU interpreter: on the CPU ``attention.py``'s Triton kernels run, and this file is compiled for
sm_90 (``python benchmarks/compile_attention_bwd_gluon_sm90.py --impl kernels/tik_v19``). Not measured on a GPU
(its device call is ``bash benchmarks/gpu_bwd_gluon.sh --impl tik_v19``): kernels/selection.json selects this
folder for no GPU.
"""

from __future__ import annotations

import functools

import torch
from triton._C.libtriton import ir
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language._core import builtin
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma, warpgroup_mma, \
    warpgroup_mma_wait
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

HEAD_DIMS = (128,)
DTYPES = (torch.bfloat16, torch.float16)
BLOCK_N = 128   # keys per program: 64 per warpgroup (the MMA's M)
BLOCK_M = 64    # query rows per tile pair
WARPS = 4       # the default partition (consumer 0); a worker warpgroup (consumer 1) and a producer warp beside it
# setmaxnreg of the worker consumer warpgroup and of the producer warp; the default partition gets the rest
REGS_CONSUMER = gl.constexpr(232)
REGS_PRODUCER = gl.constexpr(24)


@builtin
def _tma_add(tensor_desc, coord, src, _semantic=None):
    """TMA bulk reduce-add of the shared tile ``src`` into the global box at ``coord`` (async; one bulk group,
    waited for with ``tma.store_wait``). Gluon 3.6 has the op in its builder but no Python wrapper."""
    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    _semantic.builder.create_async_tma_reduce(ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord, src.handle)


@gluon.jit
def _load_pair(q_desc, do_desc, row, col, bar, q_dst, do_dst, pred):
    mbarrier.expect(bar, q_desc.block_type.nbytes + do_desc.block_type.nbytes, pred=pred)
    tma.async_copy_global_to_shared(q_desc, [row, col], bar, q_dst, pred=pred)
    tma.async_copy_global_to_shared(do_desc, [row, col], bar, do_dst, pred=pred)


@gluon.jit
def _pair_coords(it, n_mb, start, start_n, h_kv, GROUP: gl.constexpr, D: gl.constexpr, BM: gl.constexpr):
    """Tile pair ``it`` of a program: query head g of the kv head's GROUP, query block from the key block on.
    (Plain integer arithmetic: the CPU tests run it as Python.)"""
    g = it // n_mb
    start_m = start_n + (it - g * n_mb) * BM
    h = h_kv * GROUP + g
    return h, start_m, start + start_m, h * D


@gluon.jit
def _row_vectors(LSE, DELTA, SCALE, base, start_m, seqlen, offs_m, offs_mq):
    """lse, delta (rows of S) and the dQ scale (rows of dQ) of the query block at start_m. A row past the sequence
    gets lse +inf (p = exp2(finite - inf) = 0), delta 0 and scale 0, so its ds and dQ integers are 0; a key past
    the sequence is after every row in it (causal), so no other mask is needed."""
    q_ok = start_m + offs_m < seqlen
    lse = gl.load(LSE + base + start_m + offs_m, mask=q_ok, other=float("inf"))
    delta = gl.load(DELTA + base + start_m + offs_m, mask=q_ok, other=0.0)
    sc = gl.load(SCALE + base + start_m + offs_mq, mask=start_m + offs_mq < seqlen, other=0.0)
    return lse, delta, sc


@gluon.jit
def _consumer(q_s, do_s, k_s, v_s, p_s, ds_s, dq_s, bar_kv, full, empty, ds_ready, dq_full, dq_empty,
              LSE, DELTA, SCALE, DK, DV, start, seqlen, start_n, h_kv, n_mb, n_it, stride_dt, stride_dh, total,
              qk_scale, sm_scale, C: gl.constexpr, GROUP: gl.constexpr, D: gl.constexpr, BN: gl.constexpr,
              BM: gl.constexpr):
    """Consumer warpgroup C: keys start_n + C * 64 .. + 64 of the block (S, dP, dV, dK of those keys) and head dims
    C * 64 .. + 64 of every pair's dQ (over all BN keys: both halves of dS, through ds_s)."""
    HK: gl.constexpr = BN // 2
    HD: gl.constexpr = D // 2
    mma_s: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HK, 16])
    mma_q: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HD, 16])
    mma_kv: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, D, 16])
    row_s: gl.constexpr = gl.SliceLayout(1, mma_s)
    row_q: gl.constexpr = gl.SliceLayout(1, mma_q)
    dt: gl.constexpr = p_s.dtype
    k_c = k_s.slice(C * HK, HK, dim=0)
    v_c = v_s.slice(C * HK, HK, dim=0)
    k_d = k_s.slice(C * HD, HD, dim=1)
    dq_c = dq_s.slice(C * HD, HD, dim=1)
    zs = gl.zeros([BM, HK], gl.float32, mma_s)
    zq = gl.zeros([BM, HD], gl.float32, mma_q)
    dk = gl.zeros([HK, D], gl.float32, mma_kv)
    dv = gl.zeros([HK, D], gl.float32, mma_kv)
    offs_m = gl.arange(0, BM, layout=row_s)
    offs_mq = gl.arange(0, BM, layout=row_q)
    keys = start_n + C * HK + gl.arange(0, HK, layout=gl.SliceLayout(0, mma_s))
    h, start_m, row, col = _pair_coords(0, n_mb, start, start_n, h_kv, GROUP, D, BM)
    lse, delta, sc = _row_vectors(LSE, DELTA, SCALE, h * total + start, start_m, seqlen, offs_m, offs_mq)
    mbarrier.wait(bar_kv, 0)
    for it in range(0, n_it):
        sl = it % 2
        # the next pair's row vectors load under this pair's matmuls (past the last pair: all masked)
        h1, start_m1, row1, col1 = _pair_coords(it + 1, n_mb, start, start_n, h_kv, GROUP, D, BM)
        lse1, delta1, sc1 = _row_vectors(LSE, DELTA, SCALE, h1 * total + start, start_m1,
                                         gl.where(it + 1 < n_it, seqlen, 0), offs_m, offs_mq)
        mbarrier.wait(full.index(sl), (it // 2) & 1)
        s = warpgroup_mma(q_s.index(sl), k_c.permute((1, 0)), zs, use_acc=False, is_async=True)
        dp = warpgroup_mma(do_s.index(sl), v_c.permute((1, 0)), zs, use_acc=False, is_async=True)
        s = warpgroup_mma_wait(1, deps=[s])
        p = gl.exp2(s * qk_scale - gl.expand_dims(lse, 1))
        if start_m < start_n + BN:   # the diagonal pairs: keys after the row are masked
            p = gl.where(gl.expand_dims(keys, 0) <= gl.expand_dims(start_m + offs_m, 1), p, 0.0)
        # this warpgroup's dV MMA of the previous pair, the one reader of p_s.index(C), was waited for
        p_s.index(C).store(p.to(dt))
        fence_async_shared()
        gl.thread_barrier()
        dv = warpgroup_mma(p_s.index(C).permute((1, 0)), do_s.index(sl), dv, is_async=True)
        dp = warpgroup_mma_wait(1, deps=[dp])
        ds = p * (dp - gl.expand_dims(delta, 1))
        # ds_s.index(sl) was last read by both warpgroups' dQ MMAs two pairs ago, waited for before each one
        # arrived on ds_ready of the previous pair, which this warpgroup waited for
        ds_c = ds_s.index(sl).slice(C * HK, HK, dim=1)
        ds_c.store(ds.to(dt))
        fence_async_shared()
        gl.thread_barrier()
        mbarrier.arrive(ds_ready.index(sl), count=1)
        dk = warpgroup_mma(ds_c.permute((1, 0)), q_s.index(sl), dk, is_async=True)
        mbarrier.wait(ds_ready.index(sl), (it // 2) & 1)
        dq = warpgroup_mma(ds_s.index(sl), k_d, zq, use_acc=False, is_async=True)
        dv, dk, dq = warpgroup_mma_wait(0, deps=[dv, dk, dq])
        mbarrier.arrive(empty.index(sl), count=1)
        mbarrier.wait(dq_empty, (it & 1) ^ 1)
        dq_c.store((dq * gl.expand_dims(sc, 1)).to(gl.int32))
        fence_async_shared()
        gl.thread_barrier()
        mbarrier.arrive(dq_full, count=1)
        h, start_m, row, col = h1, start_m1, row1, col1
        lse, delta, sc = lse1, delta1, sc1
    rows_kv = gl.arange(0, HK, layout=gl.SliceLayout(1, mma_kv))
    offs_d = gl.arange(0, D, layout=gl.SliceLayout(0, mma_kv))
    kv_ok = gl.expand_dims(start_n + C * HK + rows_kv < seqlen, 1)
    base = (start + start_n + C * HK).to(gl.int64) * stride_dt + h_kv * stride_dh
    ptr = gl.expand_dims(rows_kv * stride_dt, 1) + gl.expand_dims(offs_d, 0)
    gl.store(DK + base + ptr, (dk * sm_scale).to(DK.dtype.element_ty), mask=kv_ok)
    gl.store(DV + base + ptr, dv.to(DV.dtype.element_ty), mask=kv_ok)


@gluon.jit
def _producer(q_desc, do_desc, k_desc, v_desc, dq_desc, q_s, do_s, k_s, v_s, dq_s, bar_kv, full, empty, dq_full,
              dq_empty, start, start_n, h_kv, n_mb, n_it, GROUP: gl.constexpr, D: gl.constexpr, BM: gl.constexpr):
    """One warp: K / V once, the Q / dO ring (pair it + 2 into a slot once both consumers are done with pair it),
    and each pair's dQ integers as a TMA reduce-add once both consumers wrote their halves; dq_s is handed back
    when the reduce has read it."""
    mbarrier.expect(bar_kv, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(k_desc, [start + start_n, h_kv * D], bar_kv, k_s)
    tma.async_copy_global_to_shared(v_desc, [start + start_n, h_kv * D], bar_kv, v_s)
    for i in gl.static_range(2):
        _, _, row, col = _pair_coords(i, n_mb, start, start_n, h_kv, GROUP, D, BM)
        _load_pair(q_desc, do_desc, row, col, full.index(i), q_s.index(i), do_s.index(i), i < n_it)
    for it in range(0, n_it):
        sl = it % 2
        _, _, row, col = _pair_coords(it, n_mb, start, start_n, h_kv, GROUP, D, BM)
        mbarrier.wait(dq_full, it & 1)
        _tma_add(dq_desc, [row, col], dq_s)
        if it + 2 < n_it:
            mbarrier.wait(empty.index(sl), (it // 2) & 1)
            _, _, row2, col2 = _pair_coords(it + 2, n_mb, start, start_n, h_kv, GROUP, D, BM)
            _load_pair(q_desc, do_desc, row2, col2, full.index(sl), q_s.index(sl), do_s.index(sl), True)
        tma.store_wait(0)
        mbarrier.arrive(dq_empty, count=1)


@gluon.jit
def _attn_bwd_gluon(q_desc, do_desc, k_desc, v_desc, dq_desc, LSE, DELTA, SCALE, DK, DV, cu,
                    stride_dt, stride_dh, total, qk_scale, sm_scale,
                    GROUP: gl.constexpr, D: gl.constexpr, BN: gl.constexpr, BM: gl.constexpr):
    """Program (key block of BN rows, sequence, kv head): dK / dV of the block over the GROUP query heads and every
    query block from the key block on; each tile pair's dQ contribution scaled by its rows' SCALE, truncated to
    int32 and reduce-added into dq_desc's [T, Hq * D] accumulator. Warp-specialized: two consumer warpgroups (the
    default partition and a worker; 64 keys and 64 head dims of dQ each) and a producer warp (loads, reduce-adds)."""
    dt: gl.constexpr = q_desc.dtype
    p_l: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, BN // 2], dt)
    ds_l: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, BN], dt)
    pid_n = gl.program_id(0)
    b = gl.program_id(1)
    h_kv = gl.program_id(2)
    start = gl.load(cu + b)
    seqlen = gl.load(cu + b + 1) - start
    start_n = pid_n * BN
    if start_n < seqlen:
        n_mb = gl.cdiv(seqlen - start_n, BM)
        n_it = GROUP * n_mb
        k_s = gl.allocate_shared_memory(dt, [BN, D], k_desc.layout)
        v_s = gl.allocate_shared_memory(dt, [BN, D], v_desc.layout)
        q_s = gl.allocate_shared_memory(dt, [2, BM, D], q_desc.layout)
        do_s = gl.allocate_shared_memory(dt, [2, BM, D], do_desc.layout)
        p_s = gl.allocate_shared_memory(dt, [2, BM, BN // 2], p_l)
        ds_s = gl.allocate_shared_memory(dt, [2, BM, BN], ds_l)
        dq_s = gl.allocate_shared_memory(gl.int32, [BM, D], dq_desc.layout)
        bar_kv = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
        full = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        ds_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        dq_full = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
        dq_empty = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
        mbarrier.init(bar_kv.index(0), count=1)
        mbarrier.init(dq_full.index(0), count=2)
        mbarrier.init(dq_empty.index(0), count=1)
        for i in gl.static_range(2):
            mbarrier.init(full.index(i), count=1)
            mbarrier.init(empty.index(i), count=2)
            mbarrier.init(ds_ready.index(i), count=2)
        fence_async_shared()
        gl.warp_specialize([
            (_consumer, (q_s, do_s, k_s, v_s, p_s, ds_s, dq_s, bar_kv.index(0), full, empty, ds_ready, dq_full.index(0),
                         dq_empty.index(0), LSE, DELTA, SCALE, DK, DV, start, seqlen, start_n, h_kv, n_mb, n_it,
                         stride_dt, stride_dh, total, qk_scale, sm_scale, 0, GROUP, D, BN, BM)),
            (_consumer, (q_s, do_s, k_s, v_s, p_s, ds_s, dq_s, bar_kv.index(0), full, empty, ds_ready, dq_full.index(0),
                         dq_empty.index(0), LSE, DELTA, SCALE, DK, DV, start, seqlen, start_n, h_kv, n_mb, n_it,
                         stride_dt, stride_dh, total, qk_scale, sm_scale, 1, GROUP, D, BN, BM)),
            (_producer, (q_desc, do_desc, k_desc, v_desc, dq_desc, q_s, do_s, k_s, v_s, dq_s, bar_kv.index(0), full,
                         empty, dq_full.index(0), dq_empty.index(0), start, start_n, h_kv, n_mb, n_it, GROUP, D, BM)),
        ], [4, 1], [REGS_CONSUMER, REGS_PRODUCER])


def _desc_ok(x: torch.Tensor) -> bool:
    """x [T, H, D] readable as a 2-D [T, H * D] TMA tensor: heads contiguous, 16-byte aligned rows."""
    es = x.element_size()
    return (x.dim() == 3 and x.shape[0] > 0 and x.stride(2) == 1 and x.stride(1) == x.shape[2]
            and x.data_ptr() % 16 == 0 and (x.stride(0) * es) % 16 == 0)


def applies(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor) -> bool:
    """Whether ``backward`` runs these tensors: an sm_90 device, bf16 / fp16, D 128, TMA-readable q / k / v / dO.
    Otherwise attention.py's Triton kernels run (the same formulas; no bit contract binds the backward)."""
    return (q.is_cuda and _capability(q.device.index) == (9, 0) and q.dtype in DTYPES
            and all(x.dtype == q.dtype for x in (k, v, do)) and q.shape[2] in HEAD_DIMS
            and all(_desc_ok(x) for x in (q, k, v, do)))


@functools.lru_cache(maxsize=None)
def _capability(index: int | None) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


@functools.lru_cache(maxsize=None)
def _smem_layout(block: tuple, dtype: torch.dtype):
    gdt = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}.get(dtype)
    if gdt is None:   # the int32 dQ accumulator: rows of 512 bytes, no swizzle (TMA's 128-byte swizzle spans less)
        return gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)
    return gl.NVMMASharedLayout.get_default_for(list(block), gdt)


def _descriptor(x: torch.Tensor, block: tuple) -> TensorDescriptor:
    """x [T, H, D] as a 2-D [T, H * D] TMA descriptor with [block] boxes."""
    return TensorDescriptor(x, [x.shape[0], x.shape[1] * x.shape[2]], [x.stride(0), 1], list(block),
                            _smem_layout(block, x.dtype))


def backward(q, k, v, do, lse, delta, scale, acc, dk, dv, cu_seqlens, max_seqlen, softmax_scale, qk_scale):
    """dK / dV into ``dk`` / ``dv`` and dQ's integers added into ``acc`` (int32 [T, Hq, D], zero before the call)
    for the packed causal attention of ``cu_seqlens``; ``lse`` / ``delta`` / ``scale`` [Hq, T] from the forward
    and attention._bwd_fx_preprocess (SHIFT 31)."""
    T, Hq, D = q.shape
    Hkv = k.shape[1]
    B = cu_seqlens.numel() - 1
    qd = _descriptor(q, (BLOCK_M, D))
    dod = _descriptor(do, (BLOCK_M, D))
    kd = _descriptor(k, (BLOCK_N, D))
    vd = _descriptor(v, (BLOCK_N, D))
    ad = _descriptor(acc, (BLOCK_M, D))
    grid = (-(-max(int(max_seqlen), 1) // BLOCK_N), B, Hkv)
    _attn_bwd_gluon[grid](qd, dod, kd, vd, ad, lse, delta, scale, dk, dv, cu_seqlens, dk.stride(0), dk.stride(1),
                          T, qk_scale, softmax_scale, GROUP=Hq // Hkv, D=D, BN=BLOCK_N, BM=BLOCK_M,
                          num_warps=WARPS)
