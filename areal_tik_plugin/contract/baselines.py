"""The baselines a user would pick, named exactly, for every benchmark row (GPU side; importable without one).

Each op's ``run_bench`` builds its candidates with :func:`collect` from factories that either return the
call to time or raise :class:`Unavailable` with the reason (not installed, no GPU, switched off, API
missing); every skipped candidate is recorded in the bench table with that reason, never dropped silently.
:func:`compare` times ours and every candidate with the project's one timing function and builds the row
with :func:`build_row`: the strongest baseline per timing method (cold do_bench median, CUDA-graph replay)
by name, and the ratio against it. Weaker paths that are kept for context (eager HF) are labelled
``"vs_eager_hf (context)"`` and never enter a headline geomean (:func:`summarize`).

``--baselines-off`` (comma list of ``flashinfer``, ``liger``, ``compile``, ``areal``, ``cudnn``; a flag of
``python -m areal_tik_plugin.contract`` and ``benchmarks.layer_bench``, see :func:`add_arguments`) switches
families off for a shorter run; the rows then record "switched off by --baselines-off".
"""

from __future__ import annotations

import math
import os
from typing import Callable

FAMILIES = ("flashinfer", "liger", "compile", "areal", "cudnn")
CONTEXT_KEY = "vs_eager_hf (context)"
METHODS = (("cold", "cold_us"), ("graph", "graph_us"))
# distributions whose versions every evidence JSON records (importlib.metadata: nothing is imported)
VERSIONED = ("torch", "triton", "transformers", "flashinfer-python", "apache-tvm-ffi", "liger-kernel", "areal",
             "sglang", "megatron-core", "nvidia-cudnn-cu13", "nvidia-cudnn-cu12", "nvidia-cublas", "nvidia-cublas-cu12")


class Unavailable(Exception):
    """A baseline that cannot run here; the message is the reason recorded in the bench table."""


# the run's choices, set once from the command line by configure(); every benchmark reads them
OFF: frozenset = frozenset()  # families switched off (--baselines-off)
FI_FAILED: frozenset = frozenset()  # benchmarks/flashinfer_prebuild jobs that failed (--fi-failed)


def comma_set(raw: str, what: str, allowed=None) -> frozenset:
    if not isinstance(raw, str):
        raise TypeError(f"{what}: expected a comma list (str), got {type(raw).__name__}")
    got = frozenset(s.strip() for s in raw.split(",") if s.strip())
    bad = sorted(got - set(allowed)) if allowed is not None else []
    if bad:
        raise ValueError(f"{what}: expected names from {tuple(allowed)}, got {bad}")
    return got


def add_arguments(ap) -> None:
    """The flags that cut the baselines of a benchmark entry point (read back with :func:`configure`)."""
    ap.add_argument("--baselines-off", default="", metavar="LIST",
                    help=f"comma list of baseline families to switch off, from {list(FAMILIES)}")
    ap.add_argument("--fi-failed", default="", metavar="LIST",
                    help="comma list of benchmarks/flashinfer_prebuild jobs that failed (their FlashInfer "
                         "baselines are recorded as unavailable instead of JIT-compiling in a timed run)")


def configure(baselines_off: str = "", fi_failed: str = "") -> None:
    global OFF, FI_FAILED
    OFF = comma_set(baselines_off, "--baselines-off", FAMILIES)
    FI_FAILED = comma_set(fi_failed, "--fi-failed")


def switched_off(family: str, off: str | None = None) -> bool:
    """Whether ``family`` is switched off: by ``off`` (a comma list) when given, else by :func:`configure`."""
    if family not in FAMILIES:
        raise ValueError(f"baseline family: expected one of {FAMILIES}, got {family!r}")
    return family in (OFF if off is None else comma_set(off, "baselines off", FAMILIES))


def require(family: str) -> None:
    if switched_off(family):
        raise Unavailable(f"{family}: switched off by --baselines-off")


def versions() -> dict:
    """Versions of the stack the numbers were taken on: packages (None when absent), CUDA, cuDNN."""
    from importlib import metadata

    out = {}
    for dist in VERSIONED:
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    try:
        import torch

        out["torch_cuda"] = torch.version.cuda
        out["cudnn"] = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    except Exception as e:  # pragma: no cover - torch is a hard requirement
        out["torch_cuda"] = f"unknown ({type(e).__name__})"
    return out


_MODS: dict = {}


def _import(family: str, modname: str, need_cuda: bool = True):
    require(family)
    if need_cuda:
        import torch

        if not torch.cuda.is_available():
            raise Unavailable(f"{family}: no CUDA GPU")
    if modname not in _MODS:
        try:
            import importlib

            if modname == "flashinfer":
                # FlashInfer 0.7 prefers CuTe-DSL norm kernels when nvidia-cutlass-dsl is installed; the CUDA
                # JIT kernels are the ones sgl-kernel ships (and the only ones carried to the GPU machine)
                os.environ.setdefault("FLASHINFER_USE_CUDA_NORM", "1")
            _MODS[modname] = (importlib.import_module(modname), None)
        except Exception as e:
            _MODS[modname] = (None, f"{modname} not importable ({type(e).__name__}: {e})"[:240])
    mod, why = _MODS[modname]
    if mod is None:
        raise Unavailable(why)
    return mod


def flashinfer(job: str | None = None):
    """The flashinfer module; ``job``: the benchmarks/flashinfer_prebuild job that JIT-builds the kernels
    the caller needs -- listed in ``--fi-failed`` (the prebuild failed or timed out) it is Unavailable,
    so that no timed run compiles a kernel."""
    mod = _import("flashinfer", "flashinfer")
    if job is not None and job in FI_FAILED:
        raise Unavailable(f"flashinfer {job}: JIT build failed or timed out in benchmarks/flashinfer_prebuild "
                          "(--fi-failed; see fi_prebuild.json)")
    return mod


def flashinfer_or_none():
    try:
        return flashinfer()
    except Unavailable:
        return None


def liger():
    return _import("liger", "liger_kernel")


def compiled(fn: Callable, *, dynamic: bool | None = None) -> Callable:
    """``torch.compile(fn)`` (default mode, as a user would write it); compilation happens at the first
    call, which :func:`compare`'s warm-up makes outside the timed region."""
    require("compile")
    import torch

    if not torch.cuda.is_available():
        raise Unavailable("compile: no CUDA GPU (inductor's Triton kernels)")
    return torch.compile(fn, dynamic=dynamic)


def try_compiled(fn: Callable | None, what: str = "") -> Callable | Unavailable:
    """:func:`compiled` or the Unavailable saying why (``fn`` None: the module to compile was not built)."""
    if fn is None:
        return Unavailable(f"torch.compile({what}): the module to compile could not be built (see errors)")
    try:
        return compiled(fn)
    except Unavailable as e:
        return e


def call_or_raise(call):
    """Factory helper: ``call`` itself, or raise it when it is an Unavailable."""
    if isinstance(call, Unavailable):
        raise call
    return call


# ---------------------------------------------------------------------------------------------------
# collecting candidates, building and summarizing rows (pure where possible: tests/contract/)
# ---------------------------------------------------------------------------------------------------
def collect(rec, op: str, factories: dict) -> dict:
    """``{name: call}`` of the candidates whose factory succeeded; each Unavailable (or other failure) is
    recorded once per (op, name, reason) as a ``baseline_skipped`` bench entry."""
    seen = rec.__dict__.setdefault("_skipped_baselines", set())
    out = {}
    for name, factory in factories.items():
        try:
            out[name] = factory()
        except Unavailable as e:
            why = str(e)
        except Exception as e:  # a baseline's own set-up failing is a recorded skip, not a crash
            why = f"set-up failed: {type(e).__name__}: {e}"[:300]
        else:
            continue
        if (op, name, why) not in seen:
            seen.add((op, name, why))
            rec.bench("baseline_skipped", op=op, baseline=name, reason=why)
    return out


def best_of(timings: dict, key: str):
    """(name, timing) of the fastest timing under ``key`` (ties: the first named), or (None, None)."""
    best = (None, None)
    for name, t in timings.items():
        v = t.get(key) if isinstance(t, dict) else None
        if v is None or not (v > 0) or not math.isfinite(v):
            continue
        if best[1] is None or v < best[1][key]:
            best = (name, t)
    return best


def _ratio(base, ours, key):
    b = base.get(key) if isinstance(base, dict) else None
    o = ours.get(key) if isinstance(ours, dict) else None
    if b is None or o is None or not (o > 0):
        return None
    return b / o


def build_row(ours: dict | None, baselines: dict, context: dict | None = None) -> dict:
    """The comparison part of a bench row: every candidate's timing under its exact name, the strongest
    per method with its name and the ratio (baseline time / ours: > 1 means ours is faster), and the
    context ratios under CONTEXT_KEY."""
    row = {"ours": ours, "baselines": {n: (t if t else "failed (see errors)") for n, t in baselines.items()}}
    for m, key in METHODS:
        name, t = best_of(baselines, key)
        row[f"strongest_{m}"] = name
        row[f"vs_strongest_{m}"] = _ratio(t, ours, key) if name else None
    if context:
        row["context"] = {n: (t if t else "failed (see errors)") for n, t in context.items()}
        row[CONTEXT_KEY] = {n: {m: _ratio(t, ours, key) for m, key in METHODS} for n, t in context.items()}
    return row


def compare(rec, name: str, ours_fn, baselines: dict, context: dict | None = None, *, graph: bool = True,
            timer=None, **fields) -> dict:
    """Time ours, every baseline and every context call (``timer(rec, label, fn, graph)``, default
    ``suite.timed``: one warm-up call, then both methods); record the row and return the recorded dict
    (fields added to it later, e.g. bandwidth, land in the evidence too)."""
    if timer is None:
        from areal_tik_plugin.contract.suite import timed as timer
    ours = timer(rec, f"{name}/ours", ours_fn, graph)
    bt = {n: timer(rec, f"{name}/{n}", f, graph) for n, f in baselines.items()}
    ct = {n: timer(rec, f"{name}/{n}", f, graph) for n, f in (context or {}).items()}
    rec.bench(name, **fields, **build_row(ours, bt, ct))
    return rec.benchmarks[-1]


def summarize(rec, rows: list, prefix: str = "") -> None:
    """Headline geomeans against the strongest baseline only (``{prefix}vs_strongest_{cold,graph}``), the
    context geomeans under their label, and how often each baseline was the strongest."""
    for m, _ in METHODS:
        rec.summarize(f"{prefix}vs_strongest_{m}", [r.get(f"vs_strongest_{m}") for r in rows])
        names = sorted({n for r in rows for n in (r.get(CONTEXT_KEY) or {})})
        for n in names:
            rec.summarize(f"{prefix}{CONTEXT_KEY}[{n}]_{m}",
                          [(r.get(CONTEXT_KEY) or {}).get(n, {}).get(m) for r in rows])
    counts = {}
    for r in rows:
        for m, _ in METHODS:
            s = r.get(f"strongest_{m}")
            counts.setdefault(m, {}).setdefault(s or "none ran", 0)
            counts[m][s or "none ran"] += 1
    rec.bench(f"{prefix}strongest_baselines", counts=counts, rows=len(rows))


# ---------------------------------------------------------------------------------------------------
# bandwidth shares: against the vendor's spec and against the copy measured in this process
# ---------------------------------------------------------------------------------------------------
HBM_SPEC_TBPS = 4.8  # H200 datasheet


def shares(tbps: float | None, measured_copy_tbps: float | None) -> dict:
    """``{"of_spec": tbps / 4.8, "of_measured_copy": tbps / copy}`` (None where a side is missing)."""
    if tbps is None:
        return {"of_spec": None, "of_measured_copy": None}
    return {"of_spec": tbps / HBM_SPEC_TBPS,
            "of_measured_copy": (tbps / measured_copy_tbps) if measured_copy_tbps else None}


_COPY: dict = {}


def measured_copy_tbps(nbytes: int = 2 << 30) -> float:
    """Device-to-device copy bandwidth (``dst.copy_(src)``, ``nbytes`` read + written, cold do_bench
    median), measured once per process: the achievable ceiling the spec share is set against."""
    if nbytes not in _COPY:
        import torch

        from areal_tik_plugin import bench

        src = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)
        us = bench.time_cold_us(lambda: dst.copy_(src))
        _COPY[nbytes] = nbytes / (us * 1e-6) / 1e12
        del src, dst
    return _COPY[nbytes]
