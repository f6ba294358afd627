"""Qwen3-MoE routing and experts, token-invariant.

Routing (``route``): fp32 softmax of the router logits, top-k by repeated argmax (ties -> lower
expert id, slots in descending probability), optional renormalization summed in slot order. Rows
are processed in programs of a fixed shape (``MOE_ROUTE_BLOCK_T`` rows, ``MOE_ROUTE_WARPS`` warps)
for every T, so the softmax row-sum tree never depends on the batch.

Experts (``experts``): the T*k (token, slot) assignments are grouped by expert (``_moe_count`` +
``_moe_scatter``; the row order inside a group comes from atomics and is irrelevant, see below),
then two grouped GEMMs run over row blocks that each belong to one expert:

    gate/up  g = dtype(x[t] . Wg[e]^T), u = dtype(x[t] . Wu[e]^T)       (GEMM chain of gemm.py)
             a = dtype(silu(g) * u)  in fp32, silu(g) = div_rn(g, 1 + exp(-g))
    down     y[t, j] = dtype(a . Wd[e]^T)                               (same GEMM chain)
    combine  out[t] = dtype(sum_{j=0..k-1} w[t, j] * float32(y[t, j]))  (slot order, no FMA)

Every row's K reduction is the chunked chain ``acc = tl.dot(a, b, acc)`` over GEMM_BLOCK_K columns
in increasing order, the same for any tile shape, any group size and any position of the row in
its block. So a token's output depends only on its own x, its own top-k list and the weights --
not on how many tokens chose the same experts, nor on where its rows land inside the sorted
layout (which is why the non-deterministic order produced by the atomics is harmless).
Every launch grid depends only on (T, k, E, shapes): CUDA-graph capturable.
"""

from __future__ import annotations


import torch
import triton
import triton.language as tl

from ._rowops import (cdiv as _cdiv, interpreting as _rowops_interpreting, launch_opts, next_pow2 as _next_pow2,
                      pdl_start)
from ._rowops import launch

from . import contract as C

# ------------------------------------------------------------------------------------------------
# Free knobs (bits do not depend on them).
# ------------------------------------------------------------------------------------------------
# Grouped GEMM tiles chosen by the mean rows per expert r = T*k/E:
# (max_r, BLOCK_M, BLOCK_N gate/up, BLOCK_N down, num_warps, num_stages)
EXPERT_TABLE = (
    (16, 16, 32, 64, 4, 6),
    (32, 32, 64, 64, 4, 5),
    (96, 64, 64, 128, 4, 4),
    (1 << 62, 128, 128, 128, 8, 3),
)
SORT_BLOCK = 256
COMBINE_BLOCK_H = 1024
CPU_EXPERT_BLOCK = (32, 32)

KNOBS = {
    "coupled": {"GEMM_BLOCK_K": C.GEMM_BLOCK_K, "MOE_ROUTE_BLOCK_T": C.MOE_ROUTE_BLOCK_T,
                "MOE_ROUTE_WARPS": C.MOE_ROUTE_WARPS},
    "free": {"EXPERT_TABLE": EXPERT_TABLE, "SORT_BLOCK": (128, 256, 512, 1024),
             "COMBINE_BLOCK_H": (256, 512, 1024, 2048)},
}


def _interpreting() -> bool:
    return _rowops_interpreting()


def _opts(num_warps, num_stages=1) -> dict:
    return launch_opts(num_warps, num_stages)


# ------------------------------------------------------------------------------------------------
# Routing
# ------------------------------------------------------------------------------------------------
@triton.jit(do_not_specialize=["T", "stride_l"])  # one compiled variant per E: fixed row-sum tree
def _moe_route_kernel(
    Logits, W_out, I_out, T, stride_l,
    E: tl.constexpr, E_PAD: tl.constexpr, TOP_K: tl.constexpr, K_PAD: tl.constexpr,
    NORM: tl.constexpr, BLOCK_T: tl.constexpr, PDL: tl.constexpr = False,
):
    pdl_start(PDL)
    pid = tl.program_id(0)
    rows = pid * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = tl.arange(0, E_PAD)
    kcols = tl.arange(0, K_PAD)
    row_ok = rows < T
    col_ok = cols < E
    rr = tl.where(row_ok, rows, 0).to(tl.int64)  # rows past T re-read row 0 (never stored)
    x = tl.load(Logits + rr[:, None] * stride_l + cols[None, :], mask=col_ok[None, :],
                other=float("-inf")).to(tl.float32)
    m = tl.max(x, 1)
    m = tl.where(m == float("-inf"), 0.0, m)
    e = tl.exp(x - m[:, None])
    s = tl.sum(e, 1)
    p = tl.div_rn(e, s[:, None])

    taken = (cols[None, :] >= E) | (rows[:, None] < 0)  # [BLOCK_T, E_PAD]
    w_tile = tl.zeros((BLOCK_T, K_PAD), dtype=tl.float32)
    i_tile = tl.zeros((BLOCK_T, K_PAD), dtype=tl.int32)
    wsum = tl.zeros((BLOCK_T,), dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        pm = tl.where(taken, -1.0, p)
        mj = tl.max(pm, 1)
        cand = tl.where((pm == mj[:, None]) & (~taken), cols[None, :], E_PAD)
        idx = tl.min(cand, 1)
        first_free = tl.min(tl.where(taken, E_PAD, cols[None, :]), 1)
        idx = tl.where(idx < E_PAD, idx, first_free)  # NaN rows: still k distinct valid ids
        hit = cols[None, :] == idx[:, None]
        wj = tl.sum(tl.where(hit, p, 0.0), 1)  # exactly p[idx] (one non-zero term)
        taken = taken | hit
        w_tile = tl.where(kcols[None, :] == j, wj[:, None], w_tile)
        i_tile = tl.where(kcols[None, :] == j, idx[:, None], i_tile)
        wsum = wsum + wj
    if NORM:
        w_tile = tl.div_rn(w_tile, wsum[:, None])
    out_off = rows.to(tl.int64)[:, None] * TOP_K + kcols[None, :]
    omask = row_ok[:, None] & (kcols[None, :] < TOP_K)
    tl.store(W_out + out_off, w_tile, mask=omask)
    tl.store(I_out + out_off, i_tile, mask=omask)


def route(router_logits, top_k, norm_topk_prob):
    """(topk_weights fp32 [T, k], topk_ids int32 [T, k]) from logits [T, E] (validated by the op)."""
    T, E = router_logits.shape
    w = torch.empty((T, top_k), device=router_logits.device, dtype=torch.float32)
    ids = torch.empty((T, top_k), device=router_logits.device, dtype=torch.int32)
    if T == 0:
        return w, ids
    if router_logits.data_ptr() % 16:  # pointer alignment is specialized: keep one kernel variant
        router_logits = router_logits.clone()
    bt = C.MOE_ROUTE_BLOCK_T
    launch(_moe_route_kernel, (_cdiv(T, bt),),
        router_logits, w, ids, T, router_logits.stride(0),
        E=E, E_PAD=max(16, _next_pow2(E)), TOP_K=top_k,
        K_PAD=max(2, _next_pow2(top_k)), NORM=bool(norm_topk_prob), BLOCK_T=bt,
        **_opts(C.MOE_ROUTE_WARPS),
    )
    return w, ids


# ------------------------------------------------------------------------------------------------
# Grouping assignments by expert
# ------------------------------------------------------------------------------------------------
@triton.jit
def _moe_count_kernel(Ids, Counts, Rank, n, E: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    pdl_start(PDL)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    e = tl.load(Ids + offs, mask=ok, other=0)
    ok = ok & (e >= 0) & (e < E)  # never write outside Counts, even for unchecked bad ids
    r = tl.atomic_add(Counts + e, tl.full((BLOCK,), 1, tl.int32), mask=ok)
    tl.store(Rank + offs, r, mask=ok)


@triton.jit
def _moe_scatter_kernel(
    Ids, Counts, Rank, Sorted, BlkExpert, BlkRow0, BlkRows, n, n_blocks,
    E: tl.constexpr, E_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = False,
):
    pdl_start(PDL)
    pid = tl.program_id(0)
    ecols = tl.arange(0, E_PAD)
    counts = tl.load(Counts + ecols, mask=ecols < E, other=0)
    start = tl.cumsum(counts, 0) - counts
    # sorted position of each assignment = start[expert] + rank within the expert
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    e = tl.load(Ids + offs, mask=ok, other=0)
    ok = ok & (e >= 0) & (e < E)
    r = tl.load(Rank + offs, mask=ok, other=0)
    st = tl.sum(tl.where(e[:, None] == ecols[None, :], start[None, :], 0), 1)
    tl.store(Sorted + st + r, offs, mask=ok)
    # row-block table: block b -> (expert, first sorted row, number of rows); -1 = unused block
    nblk = (counts + BLOCK_M - 1) // BLOCK_M
    blk_end = tl.cumsum(nblk, 0)
    blk_start = blk_end - nblk
    b = pid * BLOCK + tl.arange(0, BLOCK)
    b_ok = b < n_blocks
    eb = tl.sum((b[:, None] >= blk_end[None, :]).to(tl.int32), 1)
    valid = eb < E
    sel = ecols[None, :] == eb[:, None]
    bs = tl.sum(tl.where(sel, blk_start[None, :], 0), 1)
    gs = tl.sum(tl.where(sel, start[None, :], 0), 1)
    cnt = tl.sum(tl.where(sel, counts[None, :], 0), 1)
    row0 = gs + (b - bs) * BLOCK_M
    nrows = tl.minimum(gs + cnt - row0, BLOCK_M)
    tl.store(BlkExpert + b, tl.where(valid, eb, -1), mask=b_ok)
    tl.store(BlkRow0 + b, tl.where(valid, row0, 0), mask=b_ok)
    tl.store(BlkRows + b, tl.where(valid, nrows, 0), mask=b_ok)


# ------------------------------------------------------------------------------------------------
# Grouped GEMMs
# ------------------------------------------------------------------------------------------------
@triton.jit
def _moe_gate_up_kernel(
    X, Wgu, Act, Sorted, BlkExpert, BlkRow0, BlkRows,
    H, I, stride_xt, stride_we, stride_wn, stride_act,
    TOP_K: tl.constexpr, EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr = False,
):
    pdl_start(PDL)
    blk = tl.program_id(0)
    pid_n = tl.program_id(1)
    e = tl.load(BlkExpert + blk)
    if e < 0:
        return
    row0 = tl.load(BlkRow0 + blk)
    nrows = tl.load(BlkRows + blk)
    offs_r = tl.arange(0, BLOCK_M)
    r_ok = offs_r < nrows
    a_idx = tl.load(Sorted + row0 + offs_r, mask=r_ok, other=0)
    tok = (a_idx // TOP_K).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rn = tl.where(offs_n < I, offs_n, 0).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)
    x_ptrs = X + tok[:, None] * stride_xt + offs_k[None, :]
    w_base = Wgu + e.to(tl.int64) * stride_we
    wg_ptrs = w_base + rn[:, None] * stride_wn + offs_k[None, :]        # gate rows [0, I)
    wu_ptrs = w_base + (rn + I)[:, None] * stride_wn + offs_k[None, :]  # up rows [I, 2I)
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, H, BLOCK_K):
        if EVEN_K:
            a = tl.load(x_ptrs)
            bg = tl.load(wg_ptrs)
            bu = tl.load(wu_ptrs)
        else:
            kmask = offs_k[None, :] < H - k0
            a = tl.load(x_ptrs, mask=kmask, other=0.0)
            bg = tl.load(wg_ptrs, mask=kmask, other=0.0)
            bu = tl.load(wu_ptrs, mask=kmask, other=0.0)
        acc_g = tl.dot(a, tl.trans(bg), acc_g)
        acc_u = tl.dot(a, tl.trans(bu), acc_u)
        x_ptrs += BLOCK_K
        wg_ptrs += BLOCK_K
        wu_ptrs += BLOCK_K
    dt = Act.dtype.element_ty
    g = (acc_g + 0.0).to(dt).to(tl.float32)  # + 0.0: signed-zero canonicalization, see gemm.py
    u = (acc_u + 0.0).to(dt).to(tl.float32)
    act = tl.div_rn(g, 1.0 + tl.exp(-g)) * u
    rows = (row0 + offs_r).to(tl.int64)
    tl.store(Act + rows[:, None] * stride_act + offs_n[None, :], act.to(dt),
             mask=r_ok[:, None] & (offs_n[None, :] < I))


@triton.jit
def _moe_down_kernel(
    Act, Wd, Y, Sorted, BlkExpert, BlkRow0, BlkRows,
    H, I, stride_act, stride_we, stride_wn, stride_y,
    EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    PDL: tl.constexpr = False,
):
    pdl_start(PDL)
    blk = tl.program_id(0)
    pid_n = tl.program_id(1)
    e = tl.load(BlkExpert + blk)
    if e < 0:
        return
    row0 = tl.load(BlkRow0 + blk)
    nrows = tl.load(BlkRows + blk)
    offs_r = tl.arange(0, BLOCK_M)
    r_ok = offs_r < nrows
    rows = (row0 + tl.where(r_ok, offs_r, 0)).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rn = tl.where(offs_n < H, offs_n, 0).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = Act + rows[:, None] * stride_act + offs_k[None, :]
    w_ptrs = Wd + e.to(tl.int64) * stride_we + rn[:, None] * stride_wn + offs_k[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, I, BLOCK_K):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(w_ptrs)
        else:
            kmask = offs_k[None, :] < I - k0
            a = tl.load(a_ptrs, mask=kmask, other=0.0)
            b = tl.load(w_ptrs, mask=kmask, other=0.0)
        acc = tl.dot(a, tl.trans(b), acc)
        a_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    a_idx = tl.load(Sorted + row0 + offs_r, mask=r_ok, other=0).to(tl.int64)
    tl.store(Y + a_idx[:, None] * stride_y + offs_n[None, :], (acc + 0.0).to(Y.dtype.element_ty),
             mask=r_ok[:, None] & (offs_n[None, :] < H))


@triton.jit
def _moe_combine_kernel(Y, Wt, Out, H, stride_y, stride_o, TOP_K: tl.constexpr, BLOCK_H: tl.constexpr,
                        PDL: tl.constexpr = False):
    pdl_start(PDL)
    t = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    ok = offs < H
    acc = tl.zeros((BLOCK_H,), dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        w = tl.load(Wt + t * TOP_K + j)
        y = tl.load(Y + (t * TOP_K + j) * stride_y + offs, mask=ok, other=0.0).to(tl.float32)
        acc = acc + w * y
    tl.store(Out + t * stride_o + offs, acc.to(Out.dtype.element_ty), mask=ok)


# ------------------------------------------------------------------------------------------------
# Launchers
# ------------------------------------------------------------------------------------------------
def config_for(n_assign: int, E: int, cpu: bool = False) -> dict:
    """Grouped-GEMM tiles from the mean rows per expert (a free knob)."""
    if cpu:
        return dict(BLOCK_M=CPU_EXPERT_BLOCK[0], BLOCK_N1=CPU_EXPERT_BLOCK[1], BLOCK_N2=CPU_EXPERT_BLOCK[1],
                    num_warps=4, num_stages=1, name="cpu")
    r = n_assign / max(E, 1)
    for max_r, bm, bn1, bn2, warps, stages in EXPERT_TABLE:
        if r <= max_r:
            break
    return dict(BLOCK_M=bm, BLOCK_N1=bn1, BLOCK_N2=bn2, num_warps=warps, num_stages=stages,
                name=f"experts_m{bm}")


def all_configs() -> list[dict]:
    return [dict(BLOCK_M=bm, BLOCK_N1=bn1, BLOCK_N2=bn2, num_warps=w, num_stages=s, name=f"experts_m{bm}")
            for _, bm, bn1, bn2, w, s in EXPERT_TABLE]


def group_by_expert(ids_flat, E, block_m):
    """Assignment grouping: (sorted assignment ids [n], counts [E], blk_expert, blk_row0, blk_rows)."""
    n = ids_flat.numel()
    dev = ids_flat.device
    n_blocks = _cdiv(n, block_m) + min(E, n)
    counts = torch.zeros(E, device=dev, dtype=torch.int32)
    rank = torch.empty(n, device=dev, dtype=torch.int32)
    sorted_ids = torch.empty(n, device=dev, dtype=torch.int32)
    blk = torch.empty((3, n_blocks), device=dev, dtype=torch.int32)
    launch(_moe_count_kernel, (_cdiv(n, SORT_BLOCK),), ids_flat, counts, rank, n, E=E, BLOCK=SORT_BLOCK, **_opts(4))
    e_pad = max(16, _next_pow2(E))
    sb = max(16, min(SORT_BLOCK, 8192 // e_pad))
    grid = (max(_cdiv(n, sb), _cdiv(n_blocks, sb)),)
    launch(_moe_scatter_kernel, grid, ids_flat, counts, rank, sorted_ids, blk[0], blk[1], blk[2], n, n_blocks,
           E=E, E_PAD=e_pad, BLOCK_M=block_m, BLOCK=sb, **_opts(4))
    return sorted_ids, counts, blk


def experts(x, w_gate_up, w_down, topk_weights, topk_ids, config=None, return_intermediate=False):
    """Token-invariant MoE experts. x [T, H]; w_gate_up [E, 2I, H]; w_down [E, H, I];
    topk_weights fp32 [T, k]; topk_ids int32 [T, k] (validated by the op). Returns out [T, H]
    (and, with ``return_intermediate``, (y [T*k, H], sorted assignment ids [T*k], counts [E]))."""
    T, H = x.shape
    E, I2, _ = w_gate_up.shape
    I = I2 // 2
    k = topk_ids.shape[1]
    n = T * k
    out = torch.empty((T, H), device=x.device, dtype=x.dtype)
    if T == 0:
        return (out, None) if return_intermediate else out
    cfg = config or config_for(n, E, cpu=_interpreting())
    bm, bk = cfg["BLOCK_M"], C.GEMM_BLOCK_K
    ids_flat = topk_ids.reshape(-1)
    if ids_flat.dtype != torch.int32:
        ids_flat = ids_flat.to(torch.int32)
    sorted_ids, counts, blk = group_by_expert(ids_flat.contiguous(), E, bm)
    n_blocks = blk.shape[1]
    act = torch.empty((n, I), device=x.device, dtype=x.dtype)
    y = torch.empty((n, H), device=x.device, dtype=x.dtype)
    opts = _opts(cfg["num_warps"], cfg["num_stages"])
    launch(_moe_gate_up_kernel, (n_blocks, _cdiv(I, cfg["BLOCK_N1"])),
        x, w_gate_up, act, sorted_ids, blk[0], blk[1], blk[2],
        H, I, x.stride(0), w_gate_up.stride(0), w_gate_up.stride(1), act.stride(0),
        TOP_K=k, EVEN_K=(H % bk == 0), BLOCK_M=bm, BLOCK_N=cfg["BLOCK_N1"], BLOCK_K=bk, **opts,
    )
    launch(_moe_down_kernel, (n_blocks, _cdiv(H, cfg["BLOCK_N2"])),
        act, w_down, y, sorted_ids, blk[0], blk[1], blk[2],
        H, I, act.stride(0), w_down.stride(0), w_down.stride(1), y.stride(0),
        EVEN_K=(I % bk == 0), BLOCK_M=bm, BLOCK_N=cfg["BLOCK_N2"], BLOCK_K=bk, **opts,
    )
    wt = topk_weights if topk_weights.is_contiguous() else topk_weights.contiguous()
    bh = min(COMBINE_BLOCK_H, max(16, _next_pow2(H)))
    launch(_moe_combine_kernel, (T, _cdiv(H, bh)), y, wt, out, H, y.stride(0), out.stride(0),
                                                 TOP_K=k, BLOCK_H=bh, **_opts(4))
    if return_intermediate:
        return out, (y, sorted_ids, counts)
    return out


def _grouped_mm_ok(t) -> bool:
    """torch's grouped GEMM (bf16; CUDA sm80+ or CPU) for the backward."""
    import torch.nn.functional as F

    if not hasattr(F, "grouped_mm") or t.dtype != torch.bfloat16:
        return False
    return t.device.type == "cpu" or torch.cuda.get_device_capability(t.device) >= (8, 0)


def experts_backward(grad_out, x, w_gate_up, w_down, topk_weights, topk_ids, y, sorted_ids, counts,
                     need_dx, need_dwgu, need_dwd, need_dw):
    """Backward of :func:`experts` with torch ops; no invariance requirement.

    bf16: torch grouped GEMMs over the expert-sorted rows (no host sync); otherwise a loop over the
    experts that received rows (one host sync for the counts). dx is summed over the k slots in
    slot order (deterministic)."""
    T, H = x.shape
    E, I2, _ = w_gate_up.shape
    I = I2 // 2
    k = topk_ids.shape[1]
    n = T * k
    dt = x.dtype
    go = grad_out.float()
    d_w = None
    if need_dw:
        d_w = torch.einsum("th,tkh->tk", go, y.view(T, k, H).float())
    dx = dwgu = dwd = None
    if not (need_dx or need_dwgu or need_dwd):
        return dx, dwgu, dwd, d_w
    dy = (topk_weights.float().unsqueeze(-1) * go.unsqueeze(1)).to(dt).view(n, H)
    if _grouped_mm_ok(x):
        try:
            return _experts_backward_grouped(x, w_gate_up, w_down, dy, sorted_ids, counts, k,
                                             need_dx, need_dwgu, need_dwd) + (d_w,)
        except RuntimeError as e:  # a layout/alignment torch's grouped GEMM refuses: loop instead
            import warnings

            warnings.warn(f"moe backward: torch grouped_mm failed ({e}); using the per-expert loop")
    return _experts_backward_loop(x, w_gate_up, w_down, dy, sorted_ids, counts, k,
                                  need_dx, need_dwgu, need_dwd) + (d_w,)


def _experts_backward_loop(x, w_gate_up, w_down, dy, sorted_ids, counts, k, need_dx, need_dwgu, need_dwd):
    T, H = x.shape
    E, I2, _ = w_gate_up.shape
    I = I2 // 2
    n = T * k
    dxa = torch.zeros((n, H), device=x.device, dtype=torch.float32) if need_dx else None
    dwgu = torch.zeros_like(w_gate_up) if need_dwgu else None
    dwd = torch.zeros_like(w_down) if need_dwd else None
    cnt = counts.tolist()
    start = 0
    sorted_long = sorted_ids.long()
    for e in range(E):
        c = cnt[e]
        if c == 0:
            continue
        a = sorted_long[start:start + c]
        start += c
        xe = x[a // k]
        dye = dy[a]
        gu = xe @ w_gate_up[e].t()
        dact = dye @ w_down[e] if (need_dx or need_dwgu) else None
        act, dgu = _silu_mul_grad(gu, dact, I)
        if need_dwd:
            dwd[e] = dye.t() @ act
        if need_dwgu:
            dwgu[e] = dgu.t() @ xe
        if need_dx:
            dxa[a] = (dgu @ w_gate_up[e]).float()
    dx = dxa.view(T, k, H).sum(1).to(x.dtype) if need_dx else None
    return dx, dwgu, dwd


def _silu_mul_grad(gu, dact, I):
    """act = silu(g) * u (fp32 math): returns (act in gu.dtype, d[g, u] in gu.dtype)."""
    g, u = gu[:, :I].float(), gu[:, I:].float()
    sg = torch.sigmoid(g)
    silu = g * sg
    act = (silu * u).to(gu.dtype)
    if dact is None:
        return act, None
    dact = dact.float()
    dgu = torch.cat([dact * u * sg * (1.0 + g * (1.0 - sg)), dact * silu], dim=1).to(gu.dtype)
    return act, dgu


def _experts_backward_grouped(x, w_gate_up, w_down, dy, sorted_ids, counts, k, need_dx, need_dwgu, need_dwd):
    import torch.nn.functional as F

    T, H = x.shape
    E, I2, _ = w_gate_up.shape
    I = I2 // 2
    n = T * k
    offs = torch.cumsum(counts, 0, dtype=torch.int32)
    s = sorted_ids.long()
    xs = x[s // k]
    dys = dy[s]
    gu = F.grouped_mm(xs, w_gate_up.transpose(1, 2), offs=offs)           # [n, 2I]
    empty = (counts == 0).view(E, 1, 1)
    dwd = dwgu = dx = None
    need_dgu = need_dx or need_dwgu
    dact = F.grouped_mm(dys, w_down, offs=offs) if need_dgu else None       # [n, I]
    act, dgu = _silu_mul_grad(gu, dact, I)
    if need_dwd:
        dwd = F.grouped_mm(dys.t(), act, offs=offs).masked_fill_(empty, 0).to(w_down.dtype)      # [E, H, I]
    if need_dwgu:
        dwgu = F.grouped_mm(dgu.t(), xs, offs=offs).masked_fill_(empty, 0).to(w_gate_up.dtype)   # [E, 2I, H]
    if need_dx:
        dxs = F.grouped_mm(dgu, w_gate_up, offs=offs)                       # [n, H]
        dxa = torch.empty((n, H), device=x.device, dtype=dxs.dtype)
        dxa[s] = dxs
        dx = dxa.view(T, k, H).float().sum(1).to(x.dtype)
    return dx, dwgu, dwd
