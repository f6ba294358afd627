"""Token log-prob (and entropy) of ``log_softmax(logits.float() / T)`` gathered at the sampled token.

The one op that the SGLang sampler patch and the trainer both call. For a row x of V logits::

    inv = div_rn(1, T)                               # fp32, once per row
    s   = float(x) * inv                             # (x / T up to one rounding)
    for each chunk c of LOGPROB_VOCAB_CHUNK columns (absolute vocab index, fixed by V only):
        m_c = max(s), l_c = sum exp(s - m_c), a_c = sum exp(s - m_c) * (s - m_c)

With ``SHIFT_FMA`` (contract ``LOGPROB_SHIFT = "fma"``, coupled) a chunk takes m_c = fl(max(float(x)) * inv), which
is max(s) bit for bit (rounding is monotonic, inv > 0), and s - m_c as fma(float(x), inv, -m_c): one rounding, one
instruction per logit less. s itself is only formed at the sampled token (the merge kernel) and in the backward.
    (M, L, A) = _merge over c = 0, 1, ..., left to right
    lse  = M + log(L);  logp = s[token] - lse;  entropy = log(L) - A / L

With ``EXP2`` (contract ``LOGPROB_EXP = "exp2"``, coupled: the bits of every row on every path at once) the sums run
in base 2: inv = div_rn(1, T) * log2(e) (one more rounding), exp -> exp2, log -> log2, and
lse = (M + log2(L)) * ln 2, logp = (s[token] - (M + log2(L))) * ln 2, entropy = (log2(L) - A / L) * ln 2:
one multiply per element less (tl.exp is exp2 of x * log2(e) on the GPU).

Token invariance: the chunk partials are computed by one program per (row, chunk) with a fixed tile
(LOGPROB_VOCAB_CHUNK columns, LOGPROB_CHUNK_WARPS warps, loads of LOGPROB_LOAD_GROUP contiguous
columns whatever the logits dtype) and merged per row by an elementwise loop,
the same for every number of rows. ``entropy=False`` (the sampler's call, and the trainer's when it does
not ask for the entropy) leaves out the a_c sums and the entropy, about a third of the per-element
arithmetic; m_c, l_c, M, L, lse and logp are the same operations either way, so logp and lse keep every
bit. Row strides and counts are not specialized (``_rowops``).

Backward w.r.t. the logits (p = exp(s - lse))::

    dx_j = inv * (g_logp * ([j == token] - p_j) - g_ent * p_j * (s_j - lse + entropy))
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import contract as C
from ._rowops import (cdiv as _cdiv, next_pow2 as _next_pow2, aligned, fresh_copy, interpreting, launch_opts,
                      pdl_start, to_act, vec_for)
from ._rowops import launch

KNOBS = {
    "coupled": {"LOGPROB_VOCAB_CHUNK": C.LOGPROB_VOCAB_CHUNK, "LOGPROB_CHUNK_WARPS": C.LOGPROB_CHUNK_WARPS,
                "LOGPROB_EXP": C.LOGPROB_EXP, "LOGPROB_SHIFT": C.LOGPROB_SHIFT},
    "free": {"MERGE_ROWS": (32, 64, 128, 256), "BWD_WARPS": (4, 8), "EVICT_FIRST": (False, True),
             "SELECT_FREE": (False, True), "FUSED_SUMS": (False, True), "FULL_UNMASKED": (False, True)},
}
# base-2 sums (see the module docstring; contract LOGPROB_EXP): coupled, changes the bits of every row on
# every path at once. H200 probe (3 interleaved rounds, medians):
# share of HBM at T 1024 / 4096 / 16384 0.730 / 0.827 / 0.804 -> 0.806 / 0.907 / 0.888 (with the entropy 0.59-0.65
# -> 0.70-0.78); logp max |err| vs fp64 2.3-2.7e-6 -> 3.6-3.8e-6.
EXP2 = C.LOGPROB_EXP == "exp2"
# d = fma(float(x), inv, -m) with m = max(float(x)) * inv (contract LOGPROB_SHIFT "fma"; coupled, see contract.py).
# Under the Triton interpreter (whose tl.fma rounds twice) the fma is formed in fp64 (the product is exact there)
# and rounded to fp32: the CPU's bits are the GPU's except where that second rounding meets a tie.
SHIFT_FMA = C.LOGPROB_SHIFT == "fma"
# the entropy sum without the per-element select (free knob; see _logprob_partial_kernel). H200 probe
# (3 interleaved rounds, medians), share of HBM
# with the entropy at T 1024 / 4096 / 16384: 0.716 / 0.795 / 0.777 -> 0.740 / 0.821 / 0.780 (x1.03 / 1.03 /
# 1.00); the path without the entropy does not read it (x0.97-1.00, the spread of the rounds); same bits.
SELECT_FREE = True
MERGE_ROWS = 128
# the partial kernel reads each logit once: ask the L2 to evict those lines first (a cache hint; no value
# changes). H200 probe (no entropy, MERGE_ROWS 128): share of
# HBM at T 1024 / 4096 / 16384 0.701 / 0.832 / 0.855 -> 0.742 / 0.840 / 0.867.
EVICT_FIRST = True
BWD_WARPS = 4
# with the entropy: the chunk's sum of exp and its entropy sum in one two-operand tl.reduce (one shuffle and
# shared-memory pass, 8 -> 5 barriers per program on sm_90) instead of two tl.sum. Free knob on the GPU: each
# operand gets tl.sum's tree (the GPU suite flips it and compares bits). Compiled kernels only: the Triton
# interpreter runs a two-operand reduce ~60x slower than tl.sum and in another order, so under it forward()
# keeps the two tl.sum (tests/ops/test_ops_logprob.py runs the fused kernel directly once). H200 probe (4 interleaved rounds, medians), share of HBM with the entropy at T 1024 / 4096 / 16384: 0.744 /
# 0.828 / 0.808 -> 0.761 / 0.850 / 0.828; without the entropy (not used there) x0.99-1.00; bits equal.
FUSED_SUMS = True
# every whole chunk (all but a partial last one) loads without the mask and its -inf fill: a free knob (the
# loaded values are the same), ~64 fewer instructions per program on sm_90 (masked-load predicates and fill
# moves). H200 probe on the mul-sub kernels (4096-column chunks): x0.99-1.00. H200 probe on the
# fma form (3 interleaved rounds, medians), share
# of HBM with the entropy at T 1024 / 4096 / 16384: 0.834 / 0.926 / 0.907 -> 0.863 / 0.951 / 0.941 (x1.035 /
# 1.027 / 1.038); without the entropy x1.00; same bits.
FULL_UNMASKED = True


@triton.jit
def _inv_temperature(TEMP, row, row_ok, temp_scalar, PER_ROW_T: tl.constexpr, EXP2: tl.constexpr = False):
    if PER_ROW_T:
        t = tl.load(TEMP + row, mask=row_ok, other=1.0).to(tl.float32)
    else:
        t = temp_scalar + tl.zeros_like(row).to(tl.float32)
    inv = tl.math.div_rn(tl.full(t.shape, 1.0, tl.float32), t)
    if EXP2:
        inv = inv * 1.4426950408889634
    return inv


@triton.jit
def _exp(x, EXP2: tl.constexpr):
    if EXP2:
        return tl.exp2(x)
    else:
        return tl.exp(x)


@triton.jit
def _log(x, EXP2: tl.constexpr):
    if EXP2:
        return tl.log2(x)
    else:
        return tl.log(x)


@triton.jit
def _add_pair(l1, a1, l2, a2):
    return l1 + l2, a1 + a2


@triton.jit(do_not_specialize=["n_rows", "sx"])
def _logprob_partial_kernel(
    X, TEMP, WS, n_rows, sx, temp_scalar,
    V: tl.constexpr, NC: tl.constexpr, CHUNK: tl.constexpr, VEC: tl.constexpr, GROUP: tl.constexpr,
    PER_ROW_T: tl.constexpr, ENTROPY: tl.constexpr = True, EVICT: tl.constexpr = "", PDL: tl.constexpr = False,
    EXP2: tl.constexpr = False, SELECT_FREE: tl.constexpr = False, FUSED_SUMS: tl.constexpr = False,
    SHIFT_FMA: tl.constexpr = False, INTERP: tl.constexpr = False, FULL_UNMASKED: tl.constexpr = False,
):
    pdl_start(PDL)
    row = tl.program_id(0)
    c = tl.program_id(1)
    inv = _inv_temperature(TEMP, row + tl.zeros((1,), tl.int32), True, temp_scalar, PER_ROW_T, EXP2)
    j = tl.arange(0, CHUNK)
    # runs of GROUP contiguous columns: the compiler sees the same contiguity for bf16/fp16/fp32
    # logits, so the register layout and hence the sum tree of a chunk do not depend on the dtype
    # (SGLang may hand the sampler fp32 copies of the trainer's bf16 logits)
    cols = c * CHUNK + (j // GROUP) * GROUP + j % GROUP
    ok = cols < V
    ptrs = X + row.to(tl.int64) * (sx * VEC) + cols
    if FULL_UNMASKED and (c + 1) * CHUNK <= V:  # a whole chunk: no mask, no -inf fill (same values)
        x = tl.load(ptrs, eviction_policy=EVICT)
    else:
        x = tl.load(ptrs, mask=ok, other=float("-inf"), eviction_policy=EVICT)
    xf = x.to(tl.float32)
    if SHIFT_FMA:  # max(fl(x * inv)) == fl(max(x) * inv) for inv > 0; then d in one rounding
        inv0 = _inv_temperature(TEMP, row, True, temp_scalar, PER_ROW_T, EXP2)  # inv's bits, as a scalar
        m = tl.max(xf, 0) * inv0
        m_safe = tl.where(m == float("-inf"), 0.0, m)
        if INTERP:
            d = (xf.to(tl.float64) * inv0.to(tl.float64) - m_safe.to(tl.float64)).to(tl.float32)
        else:
            d = tl.fma(xf, inv0, -m_safe)
    else:
        s = xf * inv
        m = tl.max(s, 0)
        m_safe = tl.where(m == float("-inf"), 0.0, m)
        d = s - m_safe
    e = _exp(d, EXP2)
    base = (row.to(tl.int64) * NC + c) * 4
    if ENTROPY:
        if SELECT_FREE:  # -inf logits (e == 0) give 0 * -FLT_MAX = -0.0 instead of a select: same sums
            ea = e * tl.maximum(d, -3.4028234663852886e38)
        else:
            ea = e * tl.where(e > 0.0, d, 0.0)
        if FUSED_SUMS:  # both sums in one two-operand reduction: one shuffle / shared-memory pass
            l, a = tl.reduce((e, ea), 0, _add_pair)
        else:
            l = tl.sum(e, 0)
            a = tl.sum(ea, 0)
        tl.store(WS + base + 2, a)
    else:
        l = tl.sum(e, 0)
    tl.store(WS + base, m)
    tl.store(WS + base + 1, l)


@triton.jit
def _merge(M, L, A, m_c, l_c, a_c, ENTROPY: tl.constexpr = True, EXP2: tl.constexpr = False):
    """(M, L, A) <- (M, L, A) merged with chunk (m_c, l_c, a_c); A is relative to M. Elementwise.
    Without ENTROPY, A is passed through (M and L are the same operations)."""
    M_new = tl.maximum(M, m_c)
    M_safe = tl.where(M_new == float("-inf"), 0.0, M_new)
    alpha = _exp(M - M_safe, EXP2)
    beta = _exp(m_c - M_safe, EXP2)
    if ENTROPY:
        dM = tl.where(L > 0.0, M - M_safe, 0.0)      # 0 * -inf guards: an empty side adds nothing
        dm = tl.where(l_c > 0.0, m_c - M_safe, 0.0)
        A = alpha * (A + dM * L) + beta * (a_c + dm * l_c)
    L = alpha * L + beta * l_c
    return M_new, L, A


@triton.jit(do_not_specialize=["n_rows", "sx"])
def _logprob_merge_kernel(
    X, TOK, TEMP, WS, LOGP, ENT, LSE, n_rows, sx, temp_scalar,
    V: tl.constexpr, NC: tl.constexpr, VEC: tl.constexpr, BLOCK_R: tl.constexpr,
    PER_ROW_T: tl.constexpr, ENTROPY: tl.constexpr = True, PDL: tl.constexpr = False,
    EXP2: tl.constexpr = False,
):
    pdl_start(PDL)
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    ok = rows < n_rows
    r64 = rows.to(tl.int64)
    base = r64 * NC * 4
    M = tl.load(WS + base, mask=ok, other=0.0)
    L = tl.load(WS + base + 1, mask=ok, other=1.0)
    A = tl.zeros_like(M)
    if ENTROPY:
        A = tl.load(WS + base + 2, mask=ok, other=0.0)
    for c in range(1, NC):
        b = base + c * 4
        m_c = tl.load(WS + b, mask=ok, other=0.0)
        l_c = tl.load(WS + b + 1, mask=ok, other=1.0)
        a_c = A
        if ENTROPY:
            a_c = tl.load(WS + b + 2, mask=ok, other=0.0)
        M, L, A = _merge(M, L, A, m_c, l_c, a_c, ENTROPY, EXP2)
    log_l = _log(L, EXP2)
    lse = M + log_l
    inv = _inv_temperature(TEMP, rows, ok, temp_scalar, PER_ROW_T, EXP2)
    tok = tl.load(TOK + rows, mask=ok, other=0).to(tl.int64)
    tok_ok = (tok >= 0) & (tok < V)
    x_t = tl.load(X + r64 * (sx * VEC) + tok, mask=ok & tok_ok, other=0.0)
    logp = tl.where(tok_ok, x_t.to(tl.float32) * inv - lse, float("nan"))
    ent = log_l - A / L
    if EXP2:  # back to natural log units
        logp = logp * 0.6931471805599453
        ent = ent * 0.6931471805599453
        lse = lse * 0.6931471805599453
    tl.store(LOGP + rows, logp, mask=ok)
    if ENTROPY:
        tl.store(ENT + rows, ent, mask=ok)
    tl.store(LSE + rows, lse, mask=ok)


@triton.jit
def _logprob_bwd_kernel(
    X, TOK, TEMP, LSE, ENT, GLP, GENT, DX, sx, sdx, temp_scalar,
    V: tl.constexpr, CHUNK: tl.constexpr, PER_ROW_T: tl.constexpr, HAS_GENT: tl.constexpr,
    INTERP: tl.constexpr, PDL: tl.constexpr = False,
):
    pdl_start(PDL)
    row = tl.program_id(0)
    c = tl.program_id(1)
    inv = _inv_temperature(TEMP, row + tl.zeros((1,), tl.int32), True, temp_scalar, PER_ROW_T)
    cols = c * CHUNK + tl.arange(0, CHUNK)
    ok = cols < V
    r64 = row.to(tl.int64)
    x = tl.load(X + r64 * sx + cols, mask=ok, other=float("-inf"))
    s = x.to(tl.float32) * inv
    lse = tl.load(LSE + row)
    tok = tl.load(TOK + row).to(tl.int64)
    g = tl.load(GLP + row)
    logp = s - lse
    p = tl.exp(logp)
    d = tl.where(cols == tok, g, 0.0) - g * p
    if HAS_GENT:
        ge = tl.load(GENT + row)
        ent = tl.load(ENT + row)
        d -= ge * p * tl.where(p > 0.0, logp + ent, 0.0)
    tl.store(DX + r64 * sdx + cols, to_act(d * inv, DX.dtype.element_ty, INTERP), mask=ok)


# ------------------------------------------------------------------------------------------------
# Launchers (inputs validated by areal_tik_plugin.ops.logprob)
# ------------------------------------------------------------------------------------------------
def _temp_args(temperature, T, device):
    if isinstance(temperature, torch.Tensor):
        return temperature, 1.0, True
    return torch.empty(1, dtype=torch.float32, device=device), float(temperature), False


def forward(logits, tokens, temperature=1.0, entropy=True):
    """logits [T, V] (last dim contiguous), tokens int [T], temperature float or fp32 tensor [T].

    Returns (logp fp32 [T], entropy fp32 [T] or None when ``entropy`` is False, lse fp32 [T]); logp and
    lse are the same bits either way. A token outside [0, V) gives NaN.
    """
    T, V = logits.shape
    dev = logits.device
    logp = torch.empty(T, dtype=torch.float32, device=dev)
    ent = torch.empty(T, dtype=torch.float32, device=dev) if entropy else None
    lse = torch.empty(T, dtype=torch.float32, device=dev)
    if T == 0:
        return logp, ent, lse
    vec = vec_for(V, logits.element_size())
    x = logits
    if not aligned(x, vec, (x.stride(0),)):
        x = fresh_copy(x)
    chunk = C.LOGPROB_VOCAB_CHUNK
    nc = _cdiv(V, chunk)
    ws = torch.empty((T, nc, 4), dtype=torch.float32, device=dev)
    temp, t_scalar, per_row = _temp_args(temperature, T, dev)
    sx = x.stride(0) // vec
    launch(_logprob_partial_kernel, (T, nc),
        x, temp, ws, T, sx, t_scalar, V=V, NC=nc, CHUNK=chunk, VEC=vec, GROUP=C.LOGPROB_LOAD_GROUP,
        PER_ROW_T=per_row, ENTROPY=bool(entropy), EVICT="evict_first" if EVICT_FIRST else "", EXP2=bool(EXP2),
        SELECT_FREE=bool(SELECT_FREE), FUSED_SUMS=bool(FUSED_SUMS) and not interpreting(),
        SHIFT_FMA=bool(SHIFT_FMA), INTERP=interpreting(),
        FULL_UNMASKED=bool(FULL_UNMASKED), **launch_opts(C.LOGPROB_CHUNK_WARPS),
    )
    launch(_logprob_merge_kernel, (_cdiv(T, MERGE_ROWS),),
        x, tokens, temp, ws, logp, ent if entropy else lse, lse, T, sx, t_scalar,
        V=V, NC=nc, VEC=vec, BLOCK_R=MERGE_ROWS, PER_ROW_T=per_row, ENTROPY=bool(entropy), EXP2=bool(EXP2),
        **launch_opts(4),
    )
    return logp, ent, lse


def backward(logits, tokens, temperature, lse, entropy, grad_logp, grad_entropy=None):
    """d logits [T, V] (logits dtype, contiguous) from the gradients of logp (and entropy; ``entropy`` is
    None when the forward ran without it, and then ``grad_entropy`` must be None)."""
    T, V = logits.shape
    dx = torch.empty((T, V), dtype=logits.dtype, device=logits.device)
    if T == 0:
        return dx
    chunk = C.LOGPROB_VOCAB_CHUNK
    temp, t_scalar, per_row = _temp_args(temperature, T, logits.device)
    glp = grad_logp.to(torch.float32).contiguous() if grad_logp is not None else torch.zeros_like(lse)
    gent = grad_entropy.to(torch.float32).contiguous() if grad_entropy is not None else glp
    launch(_logprob_bwd_kernel, (T, _cdiv(V, chunk)),
        logits, tokens, temp, lse, entropy if entropy is not None else lse, glp, gent, dx,
        logits.stride(0), dx.stride(0), t_scalar,
        V=V, CHUNK=chunk, PER_ROW_T=per_row, HAS_GENT=grad_entropy is not None, INTERP=interpreting(),
        **launch_opts(BWD_WARPS),
    )
    return dx
