"""Probe: does issuing a tile's score MMA before the previous tile's softmax (FA3's intra-warpgroup
overlap) speed up the contract's tile loop on the H200, and does an explicit-wgmma kernel keep the bits
of Triton's ``tl.dot`` loop?

Triton 3.6 cannot express the overlap: its pipeliner waits (``pendings = 0``) right after any wgmma
that is not an accumulation chain, so a score dot issued one tile ahead is still waited for before the
softmax, and its Hopper automatic warp specialization fails on the prefill loop (an assertion in
``NVGPUWarpSpecialization`` at 4 warps; no partitions at 8). Gluon (``triton.experimental.gluon``)
issues ``warpgroup_mma(..., is_async=True)`` and ``warpgroup_mma_wait(num_outstanding, ...)`` by hand.

Both kernels compute the contract's unmasked prefill arithmetic (``kernels/tik_v2/attention.py``:
``_online_step`` per 64-key tile, a merge every ``ATTN_SPLIT_KV`` = 512 keys, ``dot(P, ones)`` row sums,
FP contraction off) for ``rows`` query rows of one head against ``keys`` keys, 64 rows x 4 warps per
program, K/V through TMA:

* ``triton``: the loop written with ``tl.dot``, as tik_v2's prefill writes it;
* ``gluon_serial``: the same loop with explicit wgmma, every MMA waited for at once (the Triton order);
* ``gluon_ahead``: S(t+1) = Q K(t+1)^T issued before the softmax of tile t and waited for after P(t) V(t)
  is issued, so the score MMA runs under the softmax;
* ``gluon_ahead_pv``: as ``gluon_ahead``, and P(t) V(t) is left in flight until the rescale of tile t + 1
  needs it (``warpgroup_mma_wait(1)``), so it would run under the next softmax too. ptxas serializes this
  form (C7514: the rescale reads an accumulator while an MMA of its stage is in flight).

Printed per kernel: time (CUDA events, median of ``--iters``), TFLOP/s (4 * rows * keys * D), and
whether its fp32 output and LSE are bit-identical to the ``triton`` kernel's. ``--json`` writes it all.
``--compile-only`` compiles the kernels for sm_90 (no GPU) and prints registers / spills /
shared memory from ptxas.

    python benchmarks/probes/wgmma_overlap_probe.py --json $OUT/wgmma_overlap_probe.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma, warpgroup_mma, \
    warpgroup_mma_init, warpgroup_mma_wait

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from benchmarks.compile_attention_sm90 import ptxas_v  # noqa: E402

D = 128
TILE = 64          # ATTN_KV_TILE
SPLIT = 512        # ATTN_SPLIT_KV
BM = 64            # query rows per program (one warpgroup)
KERNELS = ("triton", "gluon_serial", "gluon_ahead", "gluon_ahead_pv")
AHEAD = {"gluon_serial": 0, "gluon_ahead": 1, "gluon_ahead_pv": 2}


@triton.jit
def _tl_update(m_i, l_i, acc, s, v, qk_scale, ones):
    s = s * qk_scale
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(s - m_safe[:, None])
    alpha = tl.exp2(m_i - m_safe)
    pb = p.to(v.dtype)
    l_new = l_i * alpha + tl.max(tl.dot(pb, ones), 1)
    acc = acc * alpha[:, None] + tl.dot(pb, v)
    return m_new, l_new, acc


@triton.jit
def triton_loop(Q, K, V, O, LSE, n_splits, qk_scale, D: tl.constexpr, BM: tl.constexpr, TILE: tl.constexpr,
                TPS: tl.constexpr):
    pid = tl.program_id(0)
    offs_m = pid * BM + tl.arange(0, BM)
    offs_d = tl.arange(0, D)
    q = tl.load(Q + offs_m[:, None] * D + offs_d[None, :])
    ones = tl.full((TILE, 16), 1.0, tl.float32).to(q.dtype)
    M = tl.full((BM,), float("-inf"), tl.float32)
    L = tl.zeros((BM,), tl.float32)
    ACC = tl.zeros((BM, D), tl.float32)
    for s in range(0, n_splits):
        m_i = tl.full((BM,), float("-inf"), tl.float32)
        l_i = tl.zeros((BM,), tl.float32)
        acc = tl.zeros((BM, D), tl.float32)
        for t in range(0, TPS):
            k = K.load([(s * TPS + t) * TILE, 0])
            v = V.load([(s * TPS + t) * TILE, 0])
            m_i, l_i, acc = _tl_update(m_i, l_i, acc, tl.dot(q, tl.trans(k)), v, qk_scale, ones)
        M_new = tl.maximum(M, m_i)
        M_safe = tl.where(M_new == float("-inf"), 0.0, M_new)
        a = tl.exp2(M - M_safe)
        b = tl.exp2(m_i - M_safe)
        L = L * a + l_i * b
        ACC = ACC * a[:, None] + acc * b[:, None]
        M = M_new
    tl.store(O + offs_m[:, None] * D + offs_d[None, :], ACC / L[:, None])
    tl.store(LSE + offs_m, M + tl.log2(L))


@gluon.jit
def _g_softmax(m_i, s, qk_scale):
    s = s * qk_scale
    m_new = gl.maximum(m_i, gl.max(s, 1))
    m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
    p = gl.exp2(s - gl.expand_dims(m_safe, 1))
    alpha = gl.exp2(m_i - m_safe)
    return m_new, p.to(gl.bfloat16), alpha


@gluon.jit
def _g_merge(M, L, ACC, m_i, l_i, acc, row_o: gl.constexpr):
    mo = gl.convert_layout(m_i, row_o)
    lo = gl.convert_layout(l_i, row_o)
    M_new = gl.maximum(M, mo)
    M_safe = gl.where(M_new == float("-inf"), 0.0, M_new)
    a = gl.exp2(M - M_safe)
    b = gl.exp2(mo - M_safe)
    return M_new, L * a + lo * b, ACC * gl.expand_dims(a, 1) + acc * gl.expand_dims(b, 1)


@gluon.jit
def gluon_loop(q_desc, k_desc, v_desc, O, LSE, n_splits, qk_scale, D: gl.constexpr, BM: gl.constexpr,
               TILE: gl.constexpr, TPS: gl.constexpr, STAGES: gl.constexpr, AHEAD: gl.constexpr):
    # the MMA layouts Triton picks for this loop (instrShape n = 64 for S, 128 for P@V, 16 for the row sum)
    mma_s: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, TILE, 16])
    mma_o: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, D, 16])
    mma_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 16, 16])
    blk: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [1, 4], [1, 0])
    ones_l: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=32, element_bitwidth=16)
    row_s: gl.constexpr = gl.SliceLayout(1, mma_s)
    row_o: gl.constexpr = gl.SliceLayout(1, mma_o)
    row_l: gl.constexpr = gl.SliceLayout(1, mma_l)

    pid = gl.program_id(0)
    q_s = gl.allocate_shared_memory(gl.bfloat16, [BM, D], q_desc.layout)
    k_s = gl.allocate_shared_memory(gl.bfloat16, [STAGES, TILE, D], k_desc.layout)
    v_s = gl.allocate_shared_memory(gl.bfloat16, [STAGES, TILE, D], v_desc.layout)
    ones_s = gl.allocate_shared_memory(gl.bfloat16, [TILE, 16], ones_l,
                                       gl.full([TILE, 16], 1.0, gl.bfloat16, layout=blk))
    bar_q = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    bar_k = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    bar_v = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(bar_q.index(0), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(bar_k.index(i), count=1)
        mbarrier.init(bar_v.index(i), count=1)
    fence_async_shared()

    n = n_splits * TPS
    mbarrier.expect(bar_q.index(0), BM * D * 2)
    tma.async_copy_global_to_shared(q_desc, [pid * BM, 0], bar_q.index(0), q_s)
    for i in gl.static_range(STAGES):
        mbarrier.expect(bar_k.index(i), TILE * D * 2)
        tma.async_copy_global_to_shared(k_desc, [i * TILE, 0], bar_k.index(i), k_s.index(i))
        mbarrier.expect(bar_v.index(i), TILE * D * 2)
        tma.async_copy_global_to_shared(v_desc, [i * TILE, 0], bar_v.index(i), v_s.index(i))
    mbarrier.wait(bar_q.index(0), 0)

    zs = gl.zeros([BM, TILE], gl.float32, mma_s)
    zl = gl.zeros([BM, 16], gl.float32, mma_l)
    M = gl.full([BM], float("-inf"), gl.float32, row_o)
    L = gl.zeros([BM], gl.float32, row_o)
    ACC = gl.zeros([BM, D], gl.float32, mma_o)
    m_i = gl.full([BM], float("-inf"), gl.float32, row_s)
    l_i = gl.zeros([BM], gl.float32, row_l)
    acc = gl.zeros([BM, D], gl.float32, mma_o)

    mbarrier.wait(bar_k.index(0), 0)
    s = warpgroup_mma(q_s, k_s.index(0).permute((1, 0)), zs, use_acc=False)
    if AHEAD == 2:
        M, L, ACC = _g_loop_pv(q_s, k_s, v_s, ones_s, bar_k, bar_v, k_desc, v_desc, s, M, L, ACC, m_i, l_i, acc,
                               n, qk_scale, zs, zl, mma_o, mma_l, row_s, row_o, row_l, BM, D, TILE, TPS, STAGES)
    for t in range(0, n * (AHEAD < 2)):
        st = t % STAGES
        ph = (t // STAGES) & 1
        if AHEAD == 1:
            # K(t) was read by S(t), which is complete: its stage takes K(t + STAGES) now
            if t + STAGES < n:
                mbarrier.expect(bar_k.index(st), TILE * D * 2)
                tma.async_copy_global_to_shared(k_desc, [(t + STAGES) * TILE, 0], bar_k.index(st), k_s.index(st))
            t1 = gl.minimum(t + 1, n - 1)   # the last tile issues a score MMA it does not use
            mbarrier.wait(bar_k.index(t1 % STAGES), (t1 // STAGES) & 1)
            s_next = warpgroup_mma(q_s, k_s.index(t1 % STAGES).permute((1, 0)), zs, use_acc=False, is_async=True)
        m_new, pb, alpha = _g_softmax(m_i, s, qk_scale)
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, row_o), 1)
        r = warpgroup_mma(gl.convert_layout(pb, gl.DotOperandLayout(0, mma_l, 2)), ones_s, zl, use_acc=False,
                          is_async=True)
        mbarrier.wait(bar_v.index(st), ph)
        acc = warpgroup_mma(gl.convert_layout(pb, gl.DotOperandLayout(0, mma_o, 2)), v_s.index(st), acc,
                            is_async=True)
        if AHEAD == 1:
            s, r, acc = warpgroup_mma_wait(0, deps=[s_next, r, acc])
        else:
            r, acc = warpgroup_mma_wait(0, deps=[r, acc])
        # V(t) was read by P(t) V(t), complete: its stage takes V(t + STAGES)
        if t + STAGES < n:
            mbarrier.expect(bar_v.index(st), TILE * D * 2)
            tma.async_copy_global_to_shared(v_desc, [(t + STAGES) * TILE, 0], bar_v.index(st), v_s.index(st))
        l_i = l_i * gl.convert_layout(alpha, row_l) + gl.max(r, 1)
        m_i = m_new
        if AHEAD == 0:
            if t + STAGES < n:
                mbarrier.expect(bar_k.index(st), TILE * D * 2)
                tma.async_copy_global_to_shared(k_desc, [(t + STAGES) * TILE, 0], bar_k.index(st), k_s.index(st))
            t1 = gl.minimum(t + 1, n - 1)
            mbarrier.wait(bar_k.index(t1 % STAGES), (t1 // STAGES) & 1)
            s = warpgroup_mma(q_s, k_s.index(t1 % STAGES).permute((1, 0)), zs, use_acc=False)
        if (t + 1) % TPS == 0:
            M, L, ACC = _g_merge(M, L, ACC, m_i, l_i, acc, row_o)
            m_i = gl.full([BM], float("-inf"), gl.float32, row_s)
            l_i = gl.zeros([BM], gl.float32, row_l)
            acc = gl.zeros([BM, D], gl.float32, mma_o)

    mbarrier.invalidate(bar_q.index(0))
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(bar_k.index(i))
        mbarrier.invalidate(bar_v.index(i))
    offs_m = pid * BM + gl.arange(0, BM, layout=row_o)
    offs_d = gl.arange(0, D, layout=gl.SliceLayout(0, mma_o))
    gl.store(O + gl.expand_dims(offs_m, 1) * D + gl.expand_dims(offs_d, 0), ACC / gl.expand_dims(L, 1))
    gl.store(LSE + offs_m, M + gl.log2(L))


@gluon.jit
def _g_loop_pv(q_s, k_s, v_s, ones_s, bar_k, bar_v, k_desc, v_desc, s, M, L, ACC, m_i, l_i, acc, n, qk_scale, zs,
               zl, mma_o: gl.constexpr, mma_l: gl.constexpr, row_s: gl.constexpr, row_o: gl.constexpr,
               row_l: gl.constexpr, BM: gl.constexpr, D: gl.constexpr, TILE: gl.constexpr, TPS: gl.constexpr,
               STAGES: gl.constexpr):
    # wgmma groups complete in issue order: in iteration t the queue is [P(t-1) V(t-1), S(t+1)] before the
    # rescale and [S(t+1), row sum(t), P(t) V(t)] after the issue, so wait(1) retires all but the newest
    acc_t = warpgroup_mma_init(acc)
    for t in range(0, n):
        st = t % STAGES
        ph = (t // STAGES) & 1
        if t + STAGES < n:
            mbarrier.expect(bar_k.index(st), TILE * D * 2)
            tma.async_copy_global_to_shared(k_desc, [(t + STAGES) * TILE, 0], bar_k.index(st), k_s.index(st))
        t1 = gl.minimum(t + 1, n - 1)
        mbarrier.wait(bar_k.index(t1 % STAGES), (t1 // STAGES) & 1)
        s_next = warpgroup_mma(q_s, k_s.index(t1 % STAGES).permute((1, 0)), zs, use_acc=False, is_async=True)
        m_new, pb, alpha = _g_softmax(m_i, s, qk_scale)
        acc = warpgroup_mma_wait(1, deps=[acc_t])
        if t > 0:
            # V(t-1) was read by P(t-1) V(t-1), now complete
            tp = t - 1
            if tp + STAGES < n:
                mbarrier.expect(bar_v.index(tp % STAGES), TILE * D * 2)
                tma.async_copy_global_to_shared(v_desc, [(tp + STAGES) * TILE, 0], bar_v.index(tp % STAGES),
                                                v_s.index(tp % STAGES))
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, row_o), 1)
        r = warpgroup_mma(gl.convert_layout(pb, gl.DotOperandLayout(0, mma_l, 2)), ones_s, zl, use_acc=False,
                          is_async=True)
        mbarrier.wait(bar_v.index(st), ph)
        acc_t = warpgroup_mma(gl.convert_layout(pb, gl.DotOperandLayout(0, mma_o, 2)), v_s.index(st), acc,
                              is_async=True)
        s, r = warpgroup_mma_wait(1, deps=[s_next, r])
        l_i = l_i * gl.convert_layout(alpha, row_l) + gl.max(r, 1)
        m_i = m_new
        if (t + 1) % TPS == 0:
            acc = warpgroup_mma_wait(0, deps=[acc_t])
            M, L, ACC = _g_merge(M, L, ACC, m_i, l_i, acc, row_o)
            m_i = gl.full([BM], float("-inf"), gl.float32, row_s)
            l_i = gl.zeros([BM], gl.float32, row_l)
            acc_t = warpgroup_mma_init(gl.zeros([BM, D], gl.float32, mma_o))
    return M, L, ACC


# ------------------------------------------------------------------------------------------------ host
def _ptxas(ptx: str) -> dict:
    r = ptxas_v(ptx)
    if r["rc"]:
        raise RuntimeError(f"ptxas failed: {r['stderr'][-400:]}")
    return {"regs": r["regs"], "spill_bytes": r["spill_bytes"]}


def compile_only(stages: int) -> dict:
    """sm_90 compile facts of the kernels (no GPU)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    target = GPUTarget("cuda", 90, 32)
    opts = {"num_warps": 4, "enable_fp_fusion": False}
    out = {}
    tpu = SPLIT // TILE
    tdesc = "tensordesc<bf16[64,128]>"
    sig = {"Q": "*bf16", "K": tdesc, "V": tdesc, "O": "*fp32", "LSE": "*fp32", "n_splits": "i32",
           "qk_scale": "fp32", "D": "constexpr", "BM": "constexpr", "TILE": "constexpr", "TPS": "constexpr"}
    c = triton.compile(ASTSource(triton_loop, sig, constexprs={"D": D, "BM": BM, "TILE": TILE, "TPS": tpu}),
                       target=target, options={**opts, "num_stages": stages})
    out["triton"] = {**_ptxas(c.asm["ptx"]), "smem": int(c.metadata.shared)}
    from triton.experimental.gluon._runtime import GluonASTSource

    import torch
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GDesc
    from triton.runtime.jit import mangle_type

    lay = gl.NVMMASharedLayout.get_default_for([TILE, D], gl.bfloat16)
    # the signature Triton derives from a descriptor (a host tensor is enough to build one)
    gdesc = mangle_type(GDesc.from_tensor(torch.zeros(TILE, D, dtype=torch.bfloat16), [TILE, D], lay))
    for name, ahead in AHEAD.items():
        gsig = {"q_desc": gdesc, "k_desc": gdesc, "v_desc": gdesc, "O": "*fp32", "LSE": "*fp32", "n_splits": "i32",
                "qk_scale": "fp32", "D": "constexpr", "BM": "constexpr", "TILE": "constexpr", "TPS": "constexpr",
                "STAGES": "constexpr", "AHEAD": "constexpr"}
        src = GluonASTSource(gluon_loop, gsig, constexprs={"D": D, "BM": BM, "TILE": TILE, "TPS": tpu,
                                                            "STAGES": stages, "AHEAD": ahead})
        c = triton.compile(src, target=target, options=opts)
        out[name] = {**_ptxas(c.asm["ptx"]), "smem": int(c.metadata.shared),
                     "wgmma_wait_1": len(re.findall(r"wgmma\.wait_group\.sync\.aligned\s+1", c.asm["ptx"]))}
    return out


def run(rows: int, keys: int, iters: int, stages: int, seed: int) -> dict:
    import torch
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GDesc
    from triton.tools.tensor_descriptor import TensorDescriptor

    torch.manual_seed(seed)
    q = torch.randn(rows, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(keys, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(keys, D, device="cuda", dtype=torch.bfloat16)
    scale = D ** -0.5 * 1.4426950408889634
    n_splits = keys // SPLIT
    grid = (rows // BM,)
    lay = gl.NVMMASharedLayout.get_default_for([TILE, D], gl.bfloat16)
    qd, kd, vd = (GDesc.from_tensor(t, [BM if t is q else TILE, D], lay) for t in (q, k, v))
    kt, vt = (TensorDescriptor(t, list(t.shape), list(t.stride()), [TILE, D]) for t in (k, v))
    outs = {}

    def call(name, o, lse):
        if name == "triton":
            triton_loop[grid](q, kt, vt, o, lse, n_splits, scale, D=D, BM=BM, TILE=TILE, TPS=SPLIT // TILE,
                              num_warps=4, num_stages=stages, enable_fp_fusion=False)
        else:
            gluon_loop[grid](qd, kd, vd, o, lse, n_splits, scale, D=D, BM=BM, TILE=TILE, TPS=SPLIT // TILE,
                             STAGES=stages, AHEAD=AHEAD[name], num_warps=4, enable_fp_fusion=False)

    res = {}
    for name in KERNELS:
        o = torch.empty(rows, D, device="cuda", dtype=torch.float32)
        lse = torch.empty(rows, device="cuda", dtype=torch.float32)
        call(name, o, lse)
        torch.cuda.synchronize()
        outs[name] = (o.clone(), lse.clone())
        times = []
        for _ in range(iters):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            call(name, o, lse)
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b) * 1e3)
        times.sort()
        us = times[len(times) // 2]
        ref_o, ref_l = outs["triton"]
        res[name] = {"us": round(us, 2), "tflops": round(4 * rows * keys * D / us / 1e6, 1),
                     "bits_equal_out": bool(torch.equal(outs[name][0].view(torch.int32), ref_o.view(torch.int32))),
                     "bits_equal_lse": bool(torch.equal(outs[name][1].view(torch.int32), ref_l.view(torch.int32))),
                     "max_abs_diff_out": float((outs[name][0] - ref_o).abs().max())}
    # fp64 reference of the softmax attention: the loop is attention, not just a loop with equal bits
    qf, kf, vf = q.double(), k.double(), v.double()
    p = torch.softmax((qf @ kf.T) * D ** -0.5, dim=-1)
    ref = p @ vf
    res["fp64_max_abs_err_triton"] = float((outs["triton"][0].double() - ref).abs().max())
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python benchmarks/probes/wgmma_overlap_probe.py")
    ap.add_argument("--rows", type=int, default=BM * 132 * 2, help="query rows (a multiple of 64)")
    ap.add_argument("--keys", type=int, default=8192, help="keys (a multiple of 512)")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--stages", type=int, default=2, choices=(2, 3))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--compile-only", action="store_true", help="sm_90 registers / spills / smem, no GPU")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.rows <= 0 or args.rows % BM:
        ap.error(f"--rows: expected a positive multiple of {BM}, got {args.rows}")
    if args.keys <= 0 or args.keys % SPLIT:
        ap.error(f"--keys: expected a positive multiple of {SPLIT}, got {args.keys}")
    if args.iters < 1:
        ap.error(f"--iters: expected >= 1, got {args.iters}")
    if args.compile_only:
        res = {"compile_sm90": compile_only(args.stages), "stages": args.stages}
    else:
        import torch

        if not torch.cuda.is_available():
            print("wgmma_overlap_probe: needs a CUDA device (or --compile-only)", file=sys.stderr)
            return 2
        res = {"rows": args.rows, "keys": args.keys, "stages": args.stages, "iters": args.iters,
               "device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
               "compile_sm90": compile_only(args.stages), "kernels": run(args.rows, args.keys, args.iters,
                                                                        args.stages, args.seed)}
    text = json.dumps(res, indent=1)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    print(text)
    if "kernels" in res:
        print(f"{'kernel':14s} {'us':>9s} {'TFLOP/s':>8s}  bits==triton (out, lse)")
        for name in KERNELS:
            r = res["kernels"][name]
            print(f"{name:14s} {r['us']:9.2f} {r['tflops']:8.1f}  {r['bits_equal_out']}, {r['bits_equal_lse']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
