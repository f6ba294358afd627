"""Recorder used by the per-op GPU check/bench modules."""

from __future__ import annotations

import math
import time
import traceback
from typing import Any

import torch


def bits(x: torch.Tensor) -> torch.Tensor:
    """Raw storage bits of a float tensor as an integer view of the same width."""
    return x.contiguous().view({2: torch.int16, 4: torch.int32, 8: torch.int64}[x.element_size()])


def timed(rec, name, fn, graph=True):
    """``bench.time_both`` after one warm-up call; a failure is recorded in ``rec.errors``, never raised."""
    from areal_tik_plugin import bench

    try:
        fn()
        torch.cuda.synchronize()
        return bench.time_both(fn, graph=graph)
    except Exception as e:
        rec.errors.append(f"{name}: {type(e).__name__}: {e}"[:300])
        return None


class Recorder:
    def __init__(self, op: str):
        self.op = op
        self.checks: list[dict[str, Any]] = []
        self.benchmarks: list[dict[str, Any]] = []
        self.bench_summary: dict[str, Any] = {}
        self.errors: list[str] = []

    # ---- contract ---------------------------------------------------------------------------
    def check(self, name: str, passed: bool, **detail) -> bool:
        self.checks.append({"name": name, "passed": bool(passed), **detail})
        return bool(passed)

    def bitwise(self, name: str, a: torch.Tensor, b: torch.Tensor, **detail) -> bool:
        finite = bool(torch.isfinite(a).all()) and bool(torch.isfinite(b).all())
        same = a.shape == b.shape and a.dtype == b.dtype and torch.equal(bits(a), bits(b))
        extra = {}
        if not same and a.shape == b.shape:
            d = (a.float() - b.float()).abs()
            extra = {"max_abs_diff": float(d.max()), "rows_differing": int((d.reshape(d.shape[0], -1) > 0).any(1).sum())}
        return self.check(name, finite and same, kind="bitwise", finite=finite, **extra, **detail)

    def close(self, name: str, out: torch.Tensor, ref: torch.Tensor, *, atol: float, rtol: float, **detail) -> bool:
        out64, ref64 = out.double(), ref.double()
        finite = bool(torch.isfinite(out64).all())
        err = (out64 - ref64).abs()
        max_abs = float(err.max()) if err.numel() else 0.0
        rel = float(err.norm() / ref64.norm().clamp_min(1e-30))
        ok = finite and bool((err <= atol + rtol * ref64.abs()).all())
        return self.check(name, ok, kind="accuracy", max_abs=max_abs, rel_l2=rel, atol=atol, rtol=rtol, **detail)

    def run(self, name: str, fn, *args, **kw):
        """Run a check function; an exception is a failed check, never a crash of the suite."""
        try:
            return fn(*args, **kw)
        except Exception as e:
            self.errors.append(f"{name}: {type(e).__name__}: {e}")
            self.check(name, False, kind="error", error=f"{type(e).__name__}: {e}"[:500],
                       trace=traceback.format_exc()[-1500:])
            return None

    # ---- benchmarks ---------------------------------------------------------------------------
    def bench(self, name: str, **fields) -> None:
        self.benchmarks.append({"name": name, **fields})

    def summarize(self, key: str, values: list[float]) -> None:
        vals = [v for v in values if v is not None and v > 0 and math.isfinite(v)]
        if vals:
            self.bench_summary[key] = {
                "geomean": math.exp(sum(math.log(v) for v in vals) / len(vals)),
                "min": min(vals),
                "max": max(vals),
                "n": len(vals),
            }

    def to_json(self) -> dict[str, Any]:
        return {
            "checks": self.checks,
            "benchmarks": self.benchmarks,
            "bench_summary": self.bench_summary,
            "errors": self.errors,
            "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
