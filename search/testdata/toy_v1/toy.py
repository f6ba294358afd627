"""A small CPU-measurable "unified" op for search tests: causal Cauchy-kernel attention.

    w[i, j] = 1 / (1 + (q_i . k_j)^2)  for j <= i,     out[i] = sum_j w[i, j] v_j / sum_j w[i, j]

Two entry points that must agree bit for bit, like prefill and decode:

* ``full(q, k, v)``: every row of a sequence (q, k, v [T, D] float32 holding bf16 values);
* ``step(q, k, v, ctx)``: one query row per request against its cached prefix (q [B, D],
  k/v [B, S, D], ctx [B] context lengths including the current token).

Numerics: q . k is exact (bf16 values, fp64 products and sum, one rounding to fp32); everything else
is elementwise IEEE arithmetic (no exp, no reductions whose order could depend on the shape). Keys
are consumed one at a time inside chunks of ``contract.TOY_CHUNK`` absolute positions, and chunk
partial sums are merged left to right, on both paths. Masked keys add exact zeros, so the result
does not depend on how many rows or requests one call processes -- the free knobs ROW_BLOCK and
STEP_BLOCK only change speed.
"""

import torch

from . import contract as C

ROW_BLOCK = 1    # free: query rows per block in full()
STEP_BLOCK = 1   # free: requests per block in step()

KNOBS = {
    "coupled": {"TOY_CHUNK": C.TOY_CHUNK},
    "free": {"ROW_BLOCK": (1, 4, 16, 64), "STEP_BLOCK": (1, 4, 16)},
}


def _weights(q, k):
    """q [R, D], k [n, D] -> [R, n] float32; exact scores, then 1 / (1 + s*s)."""
    s = (q.double()[:, None, :] * k.double()[None, :, :]).sum(-1).float()
    return 1.0 / (1.0 + s * s)


def _reduce(w, v, hi):
    """Chunked sum over keys [0, hi): w [R, n] (zeros where masked), v [n, D] or [R, n, D]."""
    R = w.shape[0]
    D = v.shape[-1]
    acc = torch.zeros(R, D, dtype=torch.float32)
    den = torch.zeros(R, dtype=torch.float32)
    for c0 in range(0, hi, C.TOY_CHUNK):
        pa = torch.zeros(R, D, dtype=torch.float32)
        pd = torch.zeros(R, dtype=torch.float32)
        for j in range(c0, min(c0 + C.TOY_CHUNK, hi)):
            vj = v[j] if v.dim() == 2 else v[:, j]
            pa = pa + w[:, j:j + 1] * vj
            pd = pd + w[:, j]
        acc = acc + pa
        den = den + pd
    return acc / den[:, None]


def full(q, k, v):
    T = q.shape[0]
    out = torch.empty_like(q)
    pos = torch.arange(T)
    for r0 in range(0, T, ROW_BLOCK):
        r1 = min(r0 + ROW_BLOCK, T)
        w = _weights(q[r0:r1], k[:r1])
        w = torch.where(pos[None, :r1] <= pos[r0:r1, None], w, torch.zeros((), dtype=w.dtype))
        out[r0:r1] = _reduce(w, v[:r1], r1)
    return out


def step(q, k, v, ctx):
    B = q.shape[0]
    out = torch.empty_like(q)
    lens = [int(x) for x in ctx]
    for b0 in range(0, B, STEP_BLOCK):
        b1 = min(b0 + STEP_BLOCK, B)
        hi = max(lens[b0:b1])
        kk = k[b0:b1, :hi]
        w = (q[b0:b1].double()[:, None, :] * kk.double()).sum(-1).float()
        w = 1.0 / (1.0 + w * w)
        ok = torch.arange(hi)[None, :] < torch.tensor(lens[b0:b1])[:, None]
        w = torch.where(ok, w, torch.zeros((), dtype=w.dtype))
        out[b0:b1] = _reduce(w, v[b0:b1, :hi], hi)
    return out
