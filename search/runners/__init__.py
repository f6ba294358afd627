"""Workload runners: the spec-specific part of the evaluator, run inside the candidate's process.

A runner is a module named by the spec's ``runner`` key with these functions (``ctx`` is a
:class:`Context`):

``compile(ctx) -> dict``              import the candidate's modules, run every entry point once on a
                                      small input (JIT compile), return compiler evidence
``bitwise_suite(ctx, suite) -> None`` one bitwise suite of the spec (``ctx.rec.bitwise``)
``accuracy_case(ctx, case) -> None``  one accuracy case of the spec (``ctx.rec.close``)
``workload(ctx, w) -> fn``            a zero-argument callable running workload ``w`` (inputs allocated)
``dispatch(ctx, fn, w) -> dict``      optional: observed kernels of one call (profiler on GPU)

Runners must call the candidate only through ``ctx.entry(op)``: it counts calls, which is how the
worker checks that a workload really ran the candidate's own code.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from collections import Counter
from typing import Any, Callable


class Context:
    def __init__(self, impl, spec: dict[str, Any], device: str, rec):
        self.impl = impl
        self.spec = spec
        self.device = device
        self.rec = rec                      # areal_tik_plugin.contract.suite.Recorder
        self.calls: Counter = Counter()
        self._wrapped: dict[str, Callable] = {}

    def entry(self, op: str) -> Callable:
        """The candidate's entry point ``op`` (manifest name), wrapped to count calls."""
        if op not in self._wrapped:
            fn = self.impl.entry(op)
            mod_name = self.impl.manifest["entry_points"][op].split(":", 1)[0]
            mod = self.impl.module(mod_name)
            mfile = os.path.realpath(getattr(mod, "__file__", "") or "")
            if not mfile.startswith(os.path.realpath(self.impl.path) + os.sep):
                raise RuntimeError(f"entry point {op}: module {mod_name} was loaded from {mfile}, "
                                   f"not from the candidate folder {self.impl.path}")

            def counted(*a, _fn=fn, _op=op, **kw):
                self.calls[_op] += 1
                return _fn(*a, **kw)

            self._wrapped[op] = counted
        return self._wrapped[op]

    @property
    def model(self) -> dict[str, Any]:
        return self.spec.get("model", {})


def capture_graph(fn: Callable[[], Any]):
    """A CUDA graph of ``fn()`` after one warm-up call on a side stream (allocations inside the capture
    come from the graph's private pool)."""
    import torch

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g


def load_runner(name: str):
    """A runner module by dotted name (``areal_tik_plugin.search.runners.attention``)."""
    return importlib.import_module(name)


def runner_file(name: str) -> str:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.origin:
        raise ImportError(f"runner module {name!r} not found")
    return spec.origin

