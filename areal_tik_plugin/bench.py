"""The project's one timing function (GPU only).

Two methods side by side, as DESIGN.md asks:
* ``cold``: ``triton.testing.do_bench`` median (it flushes L2 between repetitions);
* ``graph``: warm CUDA-graph replay of ``n_inner`` back-to-back calls (the AReaL-TIK evaluator's
  method), median over rounds, divided by ``n_inner``.
Ratios are always computed against baselines timed by this same function in the same process.
"""

from __future__ import annotations

import statistics
from typing import Callable


def spread(samples_us) -> dict:
    """``{"median": .., "min": .., "max": .., "n": ..}`` of per-repetition times (us)."""
    v = [float(x) for x in samples_us]
    if not v:
        raise ValueError("spread: expected at least one sample")
    return {"median": float(statistics.median(v)), "min": min(v), "max": max(v), "n": len(v)}


def time_cold_us(fn: Callable[[], object], *, warmup_ms: float = 25, rep_ms: float = 100) -> float:
    import triton

    return float(triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median")) * 1e3


def time_cold_spread(fn: Callable[[], object], *, warmup_ms: float = 25, rep_ms: float = 100) -> dict:
    """:func:`spread` of do_bench's repetitions (L2 flushed before each), in us."""
    import triton

    return spread([t * 1e3 for t in triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="all")])


def time_graph_us(fn: Callable[[], object], *, n_inner: int = 10, rounds: int = 15) -> float:
    return time_graph_spread(fn, n_inner=n_inner, rounds=rounds)["median"]


def time_graph_spread(fn: Callable[[], object], *, n_inner: int = 10, rounds: int = 15) -> dict:
    """:func:`spread` over the replay rounds (each round's time divided by ``n_inner``), in us."""
    import torch

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(n_inner):
            fn()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / n_inner)
    del g
    return spread(times)


def time_graph_each_us(fns, *, rounds: int = 15) -> float:
    """Graph replay that calls each of ``fns`` once (e.g. one op call per input copy, so that data larger
    than the L2 streams from HBM); returns the time per call."""
    fns = list(fns)

    def run():
        for f in fns:
            f()

    return time_graph_us(run, n_inner=1, rounds=rounds) / len(fns)


def time_both(fn: Callable[[], object], *, graph: bool = True, **kw) -> dict:
    """``{"cold_us": median, "cold_min_us", "cold_max_us", "graph_us": median, "graph_min_us",
    "graph_max_us"}`` (min / max over the repetitions / replay rounds); ``graph_us`` is None when
    ``graph=False`` or capture fails."""
    c = time_cold_spread(fn)
    out = {"cold_us": c["median"], "cold_min_us": c["min"], "cold_max_us": c["max"], "cold_n": c["n"]}
    out["graph_us"] = None
    if graph:
        try:
            g = time_graph_spread(fn, **kw)
            out.update(graph_us=g["median"], graph_min_us=g["min"], graph_max_us=g["max"], graph_rounds=g["n"])
        except Exception as e:  # a baseline that cannot be captured is reported, not hidden
            out["graph_error"] = f"{type(e).__name__}: {e}"[:200]
    return out


def host_us(fn: Callable[[], object], *, n: int = 200, reps: int = 5, warmup: int = 20) -> float:
    """Host time per call: the best of ``reps`` rounds of ``n`` calls, issue only (no sync inside a round).
    When CUDA is in use the device is synchronized before each round and after the last, so every round
    starts with an empty launch queue. Works without a GPU (e.g. with launches stubbed)."""
    import time

    import torch

    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    for _ in range(warmup):
        fn()
    best = float("inf")
    for _ in range(reps):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
    if cuda:
        torch.cuda.synchronize()
    return best


def ratio(baseline: dict, ours: dict, key: str) -> float | None:
    b, o = baseline.get(key), ours.get(key)
    if b is None or o is None or o <= 0:
        return None
    return b / o


def interleaved_medians(fns: dict, time_fn: Callable[[object], float], rounds: int) -> tuple[dict, dict]:
    """Time every entry of ``fns`` (name -> what ``time_fn`` takes) once per round, the names in order within a
    round, for ``rounds`` rounds (so slow drift of clocks or temperature spreads over every variant alike).
    Returns ``({name: median}, {name: [sample per round]})``."""
    if rounds < 1:
        raise ValueError(f"rounds: expected >= 1, got {rounds}")
    samples = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            samples[name].append(time_fn(fn))
    return {name: statistics.median(s) for name, s in samples.items()}, samples
