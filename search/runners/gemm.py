"""Runner for the batch-invariant dense linear ``gemm.linear``, on a GPU or the Triton interpreter.

Entry point (manifest name) and its launcher signature (``kernels/tik_v1/gemm.py``)::

    gemm.linear(x, weight, bias=None, config=None, out=None)    x [M, K], weight [N, K] -> [M, N]

The contract: every output row is bit-identical whatever M (1..65536) and the row's position in the
batch; the tile configuration is a free knob, ``GEMM_BLOCK_K`` the coupled constant. The candidate is
called only through ``ctx.entry("gemm.linear")`` with ``config=None`` (its own per-M choice).

Inputs come from a seeded generator: x ~ N(0, 1), weight ~ N(0, 1) / sqrt(K), bias ~ N(0, 1), all
rounded to the activation dtype (spec ``model.dtype``, default bfloat16; a suite, case or workload may
override it with its own ``dtype``). Shapes are given per suite as ``N``, ``K`` and ``bias`` (bool,
default false).

Bitwise suites (raw bits, ``Recorder.bitwise``), spec ``bitwise[]``:

``rows_vs_m1``   ``{N, K, bias?, Ms: [...], probe?: [...], seed?}``: probe rows (0, 1, tile edges 7/8,
                 15/16, 31/32, 63/64, ..., the middle and the last row of every M) computed alone
                 (M = 1) == the same rows inside one call of each M in ``Ms`` (odd sizes welcome).
``positions``    ``{N, K, bias?, M, seed?}``: the M rows in reversed order, and scattered at random
                 positions among filler rows of a 2M+3-row batch, give the rows of the in-order call.
``strided_x``    ``{N, K, bias?, M, pads: [...]}``: x as a column slice of a wider buffer (row stride
                 K + 2*max(pads), column offset ``pad``; an odd pad misaligns TMA and takes the pointer
                 kernel) == contiguous x.
``zero_rows``    ``{N, K, M}``: all-zero (and -0.0) input rows against all-negative weights (every
                 product -0.0): alone == in the batch, and every output bit is +0.0.
``graph_replay`` ``{N, K, bias?, Ms: [...], replays?}``: CUDA graph captured (into a given ``out`` and
                 allocating), x changed in place, replayed == eager. On the CPU recorded as passed with
                 ``skipped`` (no CUDA graphs), as the attention runner does.

Accuracy (``Recorder.close``), spec ``accuracy[]``: ``vs_fp64`` ``{N, K, bias?, Ms: [...], atol,
rtol}`` against ``x.double() @ weight.double().T (+ bias)``.

Workloads, spec ``workloads[].shape``: ``{M, N, K, bias?, dtype?, weight_copies?}`` with entry
``gemm.linear`` (output buffer preallocated). On CUDA each call uses the next of ``weight_copies``
weight copies (default: enough to stream >= 256 MiB, at most 16), so a CUDA-graph replay of
back-to-back calls reads the weights from HBM as a model's layers do, instead of from the 50 MB L2.
Observed dispatch: the worker's default profiler check (own kernels ``_linear_ptr_kernel`` /
``_linear_tma_kernel``; a cuBLAS / ``gemm`` kernel would be foreign).
"""

from __future__ import annotations

import math
import zlib

import torch

from areal_tik_plugin.search.runners import capture_graph

ENTRY = "gemm.linear"
_DT = {"bfloat16": torch.bfloat16, "float16": torch.float16}
STREAM_BYTES = 256 << 20     # per-workload weight bytes cycled on CUDA (> 2x the H200's 50 MB L2)
MAX_COPIES = 16


def _dev(ctx) -> str:
    return "cuda" if ctx.device == "cuda" else "cpu"


def _dtype(ctx, d: dict) -> torch.dtype:
    name = d.get("dtype", ctx.model.get("dtype", "bfloat16"))
    if name not in _DT:
        raise ValueError(f"gemm runner: dtype {name!r}: expected one of {sorted(_DT)}")
    return _DT[name]


def _int(d: dict, key: str, where: str) -> int:
    v = d.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"gemm runner: {where}.{key}: expected a positive integer, got {v!r}")
    return v


def _ints(d: dict, key: str, where: str) -> list[int]:
    v = d.get(key)
    if not isinstance(v, list) or not v or any(isinstance(m, bool) or not isinstance(m, int) or m < 1 for m in v):
        raise ValueError(f"gemm runner: {where}.{key}: expected a non-empty list of positive integers, got {v!r}")
    return v


def _nk(d: dict, where: str) -> tuple[int, int, bool]:
    return _int(d, "N", where), _int(d, "K", where), bool(d.get("bias", False))


def _tag(N: int, K: int, bias: bool, dt: torch.dtype) -> str:
    return f"{N}x{K}" + ("+bias" if bias else "") + ("/fp16" if dt == torch.float16 else "")


def _gen(ctx, seed: int) -> torch.Generator:
    return torch.Generator(device=_dev(ctx)).manual_seed(int(seed))


def _x(ctx, g, M, K, dt):
    return torch.randn(M, K, device=_dev(ctx), generator=g).to(dt)


def _w(ctx, g, N, K, dt):
    return (torch.randn(N, K, device=_dev(ctx), generator=g) / math.sqrt(K)).to(dt)


def _b(ctx, g, N, dt, bias):
    return torch.randn(N, device=_dev(ctx), generator=g).to(dt) if bias else None


def _operands(ctx, s, where, M, seed):
    """x [M, K], w [N, K], bias (or None) of suite ``s`` from its seeded generator, and its tag."""
    N, K, bias = _nk(s, where)
    dt = _dtype(ctx, s)
    g = _gen(ctx, s.get("seed", seed))
    x, w, b = _x(ctx, g, M, K, dt), _w(ctx, g, N, K, dt), _b(ctx, g, N, dt, bias)
    return x, w, b, g, _tag(N, K, bias, dt)


def _linear(ctx, x, w, b=None, out=None):
    return ctx.entry(ENTRY)(x, w, b, None, out)


# ------------------------------------------------------------------------------------------------
# compile
# ------------------------------------------------------------------------------------------------
def compile(ctx) -> dict:
    dt = _dtype(ctx, {})
    g = _gen(ctx, 0)
    shapes = []
    for M, N, K, bias in ((3, 80, 192, False), (130, 144, 256, True)):  # small-M and large-M paths
        x, w, b = _x(ctx, g, M, K, dt), _w(ctx, g, N, K, dt), _b(ctx, g, N, dt, bias)
        y = _linear(ctx, x, w, b)
        if tuple(y.shape) != (M, N) or y.dtype != dt:
            raise RuntimeError(f"gemm.linear returned {tuple(y.shape)} {y.dtype}, expected ({M}, {N}) {dt}")
        shapes.append(f"M={M},N={N},K={K},bias={bias}")
    return {"entry_points": sorted(e for e in ctx.impl.manifest["entry_points"] if e.startswith("gemm.")),
            "compiled": shapes}


# ------------------------------------------------------------------------------------------------
# bitwise suites
# ------------------------------------------------------------------------------------------------
def _probe_rows(Ms: list[int], extra=None) -> list[int]:
    Mmax = max(Ms)
    probe = {0, 1, 7, 8, 15, 16, 31, 32, 63, 64, 127, 128, 255, 1023, 4095, 16383, 65535,
             Mmax // 2, 777 % Mmax, 12345 % Mmax}
    probe |= {M - 1 for M in Ms}
    probe |= set(extra or ())
    return sorted(i for i in probe if 0 <= i < Mmax)


def _rows_vs_m1(ctx, s):
    where = "bitwise.rows_vs_m1"
    N, K, bias = _nk(s, where)
    Ms = _ints(s, "Ms", where)
    dt = _dtype(ctx, s)
    g = _gen(ctx, s.get("seed", N + K))
    Mmax = max(Ms)
    x, w, b = _x(ctx, g, Mmax, K, dt), _w(ctx, g, N, K, dt), _b(ctx, g, N, dt, bias)
    probe = _probe_rows(Ms, s.get("probe"))
    single = {i: _linear(ctx, x[i:i + 1], w, b) for i in probe}
    tag = _tag(N, K, bias, dt)
    for M in Ms:
        rows = [i for i in probe if i < M]
        y = _linear(ctx, x[:M], w, b)
        ctx.rec.bitwise(f"rows_vs_m1[{tag}/M={M}]", y[rows], torch.cat([single[i] for i in rows]), rows=len(rows))
        del y


def _positions(ctx, s):
    where = "bitwise.positions"
    M = _int(s, "M", where)
    x, w, b, g, tag = _operands(ctx, s, where, M, 1)
    K, dt = x.shape[1], x.dtype
    y = _linear(ctx, x, w, b)
    rev = _linear(ctx, x.flip(0).contiguous(), w, b)
    ctx.rec.bitwise(f"positions_reversed[{tag}/M={M}]", rev.flip(0), y)
    Mb = 2 * M + 3
    xb = _x(ctx, g, Mb, K, dt)
    pos = torch.randperm(Mb, generator=torch.Generator().manual_seed(int(s.get("seed", 1))))[:M].to(_dev(ctx))
    xb[pos] = x
    yb = _linear(ctx, xb, w, b)
    ctx.rec.bitwise(f"positions_scattered[{tag}/M={M}->{Mb}]", yb[pos], y)


def _strided_x(ctx, s):
    where = "bitwise.strided_x"
    M = _int(s, "M", where)
    pads = _ints(s, "pads", where)
    x, w, b, _g, tag = _operands(ctx, s, where, M, 2)
    K, dt = x.shape[1], x.dtype
    ref = _linear(ctx, x, w, b)
    width = K + 2 * max(pads)
    for pad in pads:
        wide = torch.zeros(M, width, device=_dev(ctx), dtype=dt)
        wide[:, pad:pad + K] = x
        ctx.rec.bitwise(f"strided_x[{tag}/M={M}/pad={pad}]", _linear(ctx, wide[:, pad:pad + K], w, b), ref)


def _zero_rows(ctx, s):
    where = "bitwise.zero_rows"
    N, K, _ = _nk(s, where)
    M = _int(s, "M", where)
    if M < 3:
        raise ValueError(f"gemm runner: {where}.M: expected >= 3, got {M}")
    dt = _dtype(ctx, s)
    g = _gen(ctx, s.get("seed", 3))
    x = _x(ctx, g, M, K, dt)
    zero = sorted({0, M // 2, M - 1})
    x[zero] = 0.0
    x[1] = -0.0
    zero = sorted(set(zero) | {1})
    w = -(torch.rand(N, K, device=_dev(ctx), generator=g) + 0.01).to(dt)
    full = _linear(ctx, x, w)
    for i in zero:
        ctx.rec.bitwise(f"zero_row_vs_m1[{N}x{K}/M={M}/row={i}]", full[i:i + 1], _linear(ctx, x[i:i + 1], w))
    ctx.rec.bitwise(f"zero_rows_are_plus_zero[{N}x{K}/M={M}]", full[zero], torch.zeros_like(full[zero]))


def _graph_replay(ctx, s):
    if ctx.device != "cuda":
        ctx.rec.check("graph_replay", True, kind="bitwise", skipped="no CUDA graphs on the CPU")
        return
    where = "bitwise.graph_replay"
    N, K, bias = _nk(s, where)
    Ms = _ints(s, "Ms", where)
    dt = _dtype(ctx, s)
    tag = _tag(N, K, bias, dt)
    g = _gen(ctx, s.get("seed", 4))
    w, b = _w(ctx, g, N, K, dt), _b(ctx, g, N, dt, bias)
    for M in Ms:
        x = _x(ctx, g, M, K, dt)
        out = torch.empty(M, N, device="cuda", dtype=dt)
        holder = {}

        def into_out():
            _linear(ctx, x, w, b, out)

        def allocating():
            holder["y"] = _linear(ctx, x, w, b)

        g_out, g_alloc = capture_graph(into_out), capture_graph(allocating)
        for it in range(int(s.get("replays", 2))):
            x.copy_(_x(ctx, g, M, K, dt))
            g_out.replay()
            g_alloc.replay()
            torch.cuda.synchronize()
            eager = _linear(ctx, x, w, b)
            ctx.rec.bitwise(f"graph_replay_vs_eager[{tag}/M={M}/{it}]", out.clone(), eager)
            ctx.rec.bitwise(f"graph_alloc_vs_eager[{tag}/M={M}/{it}]", holder["y"].clone(), eager)
        del g_out, g_alloc


BITWISE_SUITES = {"rows_vs_m1": _rows_vs_m1, "positions": _positions, "strided_x": _strided_x,
                  "zero_rows": _zero_rows, "graph_replay": _graph_replay}


def bitwise_suite(ctx, suite: dict) -> None:
    fn = BITWISE_SUITES.get(suite["suite"])
    if fn is None:
        raise ValueError(f"gemm runner: unknown bitwise suite {suite['suite']!r}; expected one of "
                         f"{sorted(BITWISE_SUITES)}")
    fn(ctx, suite)


# ------------------------------------------------------------------------------------------------
# accuracy
# ------------------------------------------------------------------------------------------------
ACCURACY_CASES = ("vs_fp64",)


def accuracy_case(ctx, case: dict) -> None:
    if case["suite"] not in ACCURACY_CASES:
        raise ValueError(f"gemm runner: unknown accuracy case {case['suite']!r}; expected one of "
                         f"{list(ACCURACY_CASES)}")
    where = "accuracy.vs_fp64"
    N, K, bias = _nk(case, where)
    Ms = _ints(case, "Ms", where)
    atol, rtol = float(case["atol"]), float(case["rtol"])
    dt = _dtype(ctx, case)
    g = _gen(ctx, case.get("seed", 5))
    w, b = _w(ctx, g, N, K, dt), _b(ctx, g, N, dt, bias)
    tag = _tag(N, K, bias, dt)
    for M in Ms:
        x = _x(ctx, g, M, K, dt)
        y = _linear(ctx, x, w, b)
        ref = x.double() @ w.double().t()
        if b is not None:
            ref = ref + b.double()
        ctx.rec.close(f"vs_fp64[{tag}/M={M}]", y, ref, atol=atol, rtol=rtol)


# ------------------------------------------------------------------------------------------------
# workloads
# ------------------------------------------------------------------------------------------------
def _build(ctx, w: dict, seed: int | None = None):
    if w["entry"] != ENTRY:
        raise ValueError(f"gemm runner: unknown entry {w['entry']!r}; expected {ENTRY!r}")
    sh = w["shape"]
    where = f"workloads[{w['name']}].shape"
    M, (N, K, bias) = _int(sh, "M", where), _nk(sh, where)
    dt = _dtype(ctx, sh)
    g = _gen(ctx, zlib.crc32(w["name"].encode()) + (0 if seed is None else 7919 * (seed + 1)))
    if ctx.device == "cuda":
        n = sh.get("weight_copies", max(1, min(MAX_COPIES, STREAM_BYTES // (N * K * torch.finfo(dt).bits // 8))))
    else:
        n = 1
    n = _int({"weight_copies": n}, "weight_copies", where)
    ws = [_w(ctx, g, N, K, dt) for _ in range(n)]
    x, b = _x(ctx, g, M, K, dt), _b(ctx, g, N, dt, bias)
    out = torch.empty(M, N, device=_dev(ctx), dtype=dt)
    f = ctx.entry(ENTRY)
    nxt = [0]

    def run():
        i = nxt[0]
        nxt[0] = (i + 1) % n
        return f(x, ws[i], b, None, out)

    def ref():  # the weight copy of the last call
        r = x.double() @ ws[(nxt[0] - 1) % n].double().t()
        return r + b.double() if b is not None else r

    return run, ref


def workload(ctx, w: dict):
    return _build(ctx, w)[0]


def workload_case(ctx, w: dict, seed: int):
    """Fresh operands of ``w``'s shape per ``seed``; the timed call's output against fp64 under the
    spec's first ``vs_fp64`` tolerance."""
    call, ref = _build(ctx, w, seed)
    acc = [c for c in ctx.spec.get("accuracy", []) if c.get("suite") == "vs_fp64"]
    atol, rtol = (float(acc[0]["atol"]), float(acc[0]["rtol"])) if acc else (0.01, 0.01)

    def check(out):
        ctx.rec.close(f"timed[{w['name']}][seed={seed}]:vs_fp64", out, ref(), atol=atol, rtol=rtol)

    return call, check
