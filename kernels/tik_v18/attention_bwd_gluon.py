"""sm_90 fused attention backward in Gluon: five wgmma per tile pair, dQ added as integers by TMA bulk reduce-adds
that run behind the next tile pair's matmuls.

The backward has no bit contract (docs/numerics.md): its gradients meet the tolerance table and repeat their bits
call after call. tik_v17 made dQ's accumulation order-free (each tile's dQ contribution scaled by a per-row power
of two and truncated to an integer; integers add associatively), which let one kernel do the 5 matmuls FA2 / FA3 /
cuDNN do instead of the split kernels' 7. In Triton it was slower than the split kernels (7.46 against 5.12 ms at
b4 L4224 on an H100, evidence/probes/attn_bwd_probe-tik_v17-warps4.json): the integer tiles' reduce traffic ran
one after the other with the matmuls (Triton waits for each descriptor reduce before the next tile), and its
64-key tiles doubled that traffic. Here:

* a program is 128 keys of one kv head of one sequence on two warpgroups (8 warps, one program per SM); S = Q K^T
  and dP = dO V^T put the 64 query rows on the MMA's M and split the keys over the warpgroups, so the per-row lse
  and delta take two registers; P and dS go to shared memory (the input dtype), where dV += P^T dO and
  dK += dS^T Q read them transposed (each warpgroup its 64 keys) and dQ = dS K reads dS (each warpgroup 64 head
  dims); dK / dV stay in registers;
* the integer dQ tile is written to shared memory and sent with a TMA bulk reduce-add (``_tma_add``: the
  GluonOpBuilder op Triton's descriptor ``atomic_add`` lowers to); the next tile pair's loads and matmuls run while
  it is in flight, and the buffer is written again after ``store_wait(0)`` there;
* Q / dO come through TMA into a ring of two slots, loaded two tile pairs ahead.

128 keys per program halve the reduce bytes of tik_v17's 64-key default (one [64, D] int32 tile per 128 keys).
Values: the same formulas as tik_v17's ``_bwd_fused_kernel`` (p = exp2(s * scale - lse), 0 where the key is after
the row; ds = p (dp - delta) in fp32, rounded to the input dtype for the matmuls; dK scaled by the softmax scale at
the end), with int32 accumulation at the scale of ``attention._bwd_fx_preprocess`` (SHIFT 31). Rows of a tile past
the sequence's end read the next sequence's rows (or TMA's zero fill) and get lse +inf, so p is 0 there and their
dQ integers are 0.

Measured on an H100 (evidence/tik_v18/, evidence/probes/attn_bwd_probe-tik_v18.json): every backward check of the
contract suite passes (tolerance table, repeat bits), and it is no faster than tik_v13's split kernels: 5.38
against 5.23 ms at b4 L4224, 16.7 against 17.5 at b1 L16512, 334 against 237 us at b1 L1152. That is ~4.7 us per
tile pair on an SM, about three times the pair's MMA time: both warpgroups run every phase in step (three CTA
barriers per pair), so the tensor cores wait during the softmax, the shared-memory stores and the dQ conversion
(ptxas: 255 registers, 216 bytes spilled). tik_v19 warp-specializes it.

Gluon has no CPU interpreter: on the CPU ``attention.py``'s Triton kernels run, and this file is compiled for
sm_90 (``python benchmarks/compile_attention_bwd_gluon_sm90.py``). attention.py takes it where ``BWD_DQ`` is
"gluon" and ``applies`` holds; kernels/selection.json selects this folder for no GPU.
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
WARPS = 8


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
def _attn_bwd_gluon(q_desc, do_desc, k_desc, v_desc, dq_desc, LSE, DELTA, SCALE, DK, DV, cu,
                    stride_dt, stride_dh, total, qk_scale, sm_scale,
                    GROUP: gl.constexpr, D: gl.constexpr, BN: gl.constexpr, BM: gl.constexpr):
    """Program (key block of BN rows, sequence, kv head): dK / dV of the block over the GROUP query heads and every
    query block from the key block on; each tile pair's dQ contribution scaled by its rows' SCALE, truncated to
    int32 and reduce-added into dq_desc's [T, Hq * D] accumulator."""
    NW: gl.constexpr = gl.num_warps()
    # S, dP and dQ: BM query rows on one warpgroup's M, the columns split over the warpgroups; dK / dV: the BN
    # key rows split over the warpgroups (64 each)
    mma_s: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, NW // 4],
                                                    instr_shape=[16, BN // (NW // 4), 16])
    mma_q: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, NW // 4],
                                                    instr_shape=[16, D // (NW // 4), 16])
    mma_kv: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1], instr_shape=[16, D, 16])
    row_s: gl.constexpr = gl.SliceLayout(1, mma_s)
    col_s: gl.constexpr = gl.SliceLayout(0, mma_s)
    row_q: gl.constexpr = gl.SliceLayout(1, mma_q)
    dt: gl.constexpr = q_desc.dtype
    ps_l: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, BN], dt)

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
        p_s = gl.allocate_shared_memory(dt, [BM, BN], ps_l)
        ds_s = gl.allocate_shared_memory(dt, [BM, BN], ps_l)
        dq_s = gl.allocate_shared_memory(gl.int32, [BM, D], dq_desc.layout)
        bar_kv = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
        bar_q = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        mbarrier.init(bar_kv.index(0), count=1)
        for i in gl.static_range(2):
            mbarrier.init(bar_q.index(i), count=1)
        fence_async_shared()

        kv_col = h_kv * D
        mbarrier.expect(bar_kv.index(0), k_desc.block_type.nbytes + v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [start + start_n, kv_col], bar_kv.index(0), k_s)
        tma.async_copy_global_to_shared(v_desc, [start + start_n, kv_col], bar_kv.index(0), v_s)
        for i in gl.static_range(2):
            _, _, row, col = _pair_coords(i, n_mb, start, start_n, h_kv, GROUP, D, BM)
            _load_pair(q_desc, do_desc, row, col, bar_q.index(i), q_s.index(i), do_s.index(i), i < n_it)

        zs = gl.zeros([BM, BN], gl.float32, mma_s)
        zq = gl.zeros([BM, D], gl.float32, mma_q)
        dk = gl.zeros([BN, D], gl.float32, mma_kv)
        dv = gl.zeros([BN, D], gl.float32, mma_kv)
        offs_m = gl.arange(0, BM, layout=row_s)
        offs_mq = gl.arange(0, BM, layout=row_q)
        h, start_m, row, col = _pair_coords(0, n_mb, start, start_n, h_kv, GROUP, D, BM)
        lse, delta, sc = _row_vectors(LSE, DELTA, SCALE, h * total + start, start_m, seqlen, offs_m, offs_mq)
        mbarrier.wait(bar_kv.index(0), 0)

        for it in range(0, n_it):
            sl = it % 2
            # the next pair's row vectors load under this pair's matmuls (past the last pair: all masked)
            h1, start_m1, row1, col1 = _pair_coords(it + 1, n_mb, start, start_n, h_kv, GROUP, D, BM)
            lse1, delta1, sc1 = _row_vectors(LSE, DELTA, SCALE, h1 * total + start, start_m1,
                                             gl.where(it + 1 < n_it, seqlen, 0), offs_m, offs_mq)
            mbarrier.wait(bar_q.index(sl), (it // 2) & 1)
            s = warpgroup_mma(q_s.index(sl), k_s.permute((1, 0)), zs, use_acc=False, is_async=True)
            dp = warpgroup_mma(do_s.index(sl), v_s.permute((1, 0)), zs, use_acc=False, is_async=True)
            s = warpgroup_mma_wait(1, deps=[s])
            p = gl.exp2(s * qk_scale - gl.expand_dims(lse, 1))
            if start_m < start_n + BN:   # the diagonal pairs: keys after the row are masked
                keys = start_n + gl.arange(0, BN, layout=col_s)
                p = gl.where(gl.expand_dims(keys, 0) <= gl.expand_dims(start_m + offs_m, 1), p, 0.0)
            dp = warpgroup_mma_wait(0, deps=[dp])
            ds = p * (dp - gl.expand_dims(delta, 1))
            # the previous pair's MMAs, which read p_s / ds_s, were waited for before its last barrier
            p_s.store(p.to(dt))
            ds_s.store(ds.to(dt))
            fence_async_shared()
            gl.thread_barrier()
            dv = warpgroup_mma(p_s.permute((1, 0)), do_s.index(sl), dv, is_async=True)
            dk = warpgroup_mma(ds_s.permute((1, 0)), q_s.index(sl), dk, is_async=True)
            dq = warpgroup_mma(ds_s, k_s, zq, use_acc=False, is_async=True)
            dv, dk, dq = warpgroup_mma_wait(0, deps=[dv, dk, dq])
            # the previous pair's reduce has read dq_s (it had this pair's matmuls to finish in); after the
            # barrier both warpgroups are done with slot sl, which takes the pair two ahead, and with dq_s
            tma.store_wait(0)
            gl.thread_barrier()
            _, _, row2, col2 = _pair_coords(it + 2, n_mb, start, start_n, h_kv, GROUP, D, BM)
            _load_pair(q_desc, do_desc, row2, col2, bar_q.index(sl), q_s.index(sl), do_s.index(sl), it + 2 < n_it)
            dq_s.store((dq * gl.expand_dims(sc, 1)).to(gl.int32))
            fence_async_shared()
            gl.thread_barrier()
            _tma_add(dq_desc, [row, col], dq_s)
            h, start_m, row, col = h1, start_m1, row1, col1
            lse, delta, sc = lse1, delta1, sc1

        tma.store_wait(0)
        mbarrier.invalidate(bar_kv.index(0))
        for i in gl.static_range(2):
            mbarrier.invalidate(bar_q.index(i))
        rows_kv = gl.arange(0, BN, layout=gl.SliceLayout(1, mma_kv))
        offs_d = gl.arange(0, D, layout=gl.SliceLayout(0, mma_kv))
        kv_ok = gl.expand_dims(start_n + rows_kv < seqlen, 1)
        base = (start + start_n).to(gl.int64) * stride_dt + h_kv * stride_dh
        ptr = gl.expand_dims(rows_kv * stride_dt, 1) + gl.expand_dims(offs_d, 0)
        gl.store(DK + base + ptr, (dk * sm_scale).to(DK.dtype.element_ty), mask=kv_ok)
        gl.store(DV + base + ptr, dv.to(DV.dtype.element_ty), mask=kv_ok)


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
