"""The command-line frame the GPU probe scripts share (``scripts/*_probe.py``): ``--out`` / ``--rounds``, the
argument checks, the CUDA requirement, and the result JSON whose mismatch count is the exit status."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Callable


def parser(prog: str, rounds: int) -> argparse.ArgumentParser:
    """``python scripts/PROG.py --out DIR [--rounds N]``; the script adds its own options."""
    ap = argparse.ArgumentParser(prog=f"python scripts/{prog}.py")
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=rounds, help="interleaved timing rounds (>= 1); medians reported")
    return ap


def parse(ap: argparse.ArgumentParser, argv, convert: Callable[[argparse.Namespace], object]):
    """``(args, convert(args))``; a ValueError from ``convert`` or ``--rounds`` < 1 exits with the usage error."""
    args = ap.parse_args(argv)
    try:
        extra = convert(args)
    except ValueError as e:
        ap.error(str(e))
    if args.rounds < 1:
        ap.error(f"--rounds {args.rounds}: expected >= 1")
    return args, extra


def cuda_missing(prog: str) -> bool:
    """True (and says so on stderr) when there is no CUDA device: the probe then exits with status 2."""
    import torch

    if torch.cuda.is_available():
        return False
    print(f"{prog}: needs a CUDA device", file=sys.stderr)
    return True


def new_result(impl) -> dict:
    return {"implementation": impl.name, "source_hash": impl.source_hash, "rows": [], "started": time.time()}


def write_result(res: dict, out_dir: str, filename: str, what: str) -> int:
    """Write ``res`` to OUT/filename and print the summary; exit status 1 when a row lists a mismatching variant."""
    res["seconds"] = time.time() - res["started"]
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, filename), "w") as f:
        json.dump(res, f, indent=1)
    bad = sum(len(r["mismatch"]) for r in res["rows"])
    print(f"{len(res['rows'])} {what}, {bad} mismatching variants, {res['seconds']:.0f} s")
    return 1 if bad else 0


def parse_list(text: str, what: str, allowed=None, lo=None, hi=None) -> list:
    """A comma list option: names out of ``allowed`` ('all' = every one), else integers in [lo, hi]; ValueError
    with what was expected otherwise."""
    items = [s for s in text.split(",") if s]
    if allowed is not None:
        if items == ["all"]:
            return list(allowed)
        bad = [s for s in items if s not in allowed]
        if bad or not items:
            raise ValueError(f"{what}: expected 'all' or a comma list of {sorted(allowed)}, got {text!r}")
        return items
    try:
        vals = [int(s) for s in items]
    except ValueError:
        vals = []
    if not vals or any(not lo <= v <= hi for v in vals):
        raise ValueError(f"{what}: expected a comma list of integers in [{lo}, {hi}], got {text!r}")
    return vals


def gemm_config_row(gemm, x, ws, cfgs: dict, rounds: int, label=None, time_fn=None, before_launch=None) -> dict:
    """One (weight, M) row of a GEMM configuration probe: every configuration of ``cfgs`` (name -> config dict,
    ``"default"`` first) computed once on ``ws[0]`` and compared bit for bit with the default's output, then
    the ones that ran timed over every weight copy in ``ws`` (one call per copy) together with cuBLAS
    ``F.linear``, interleaved over ``rounds``. A configuration that fails to compile or launch (e.g. out of
    shared memory) is listed under ``errors``, not hidden. ``label(cfg)``: the name recorded per configuration
    (default ``<name>_s<stages>``); ``time_fn(fns)``: µs per call of a list of callables (default graph replay,
    10 rounds); ``before_launch(name, label)``: called before each first launch (a probe that hangs then shows
    where). Returns ``{"configs", "mismatch", "errors", "us", "best"}``."""
    import torch
    import torch.nn.functional as F

    from areal_tik_plugin import bench
    from areal_tik_plugin.gpu.suite import bits

    label = label or (lambda c: f"{c['name']}_s{c['num_stages']}")
    time_fn = time_fn or (lambda fns: bench.time_graph_each_us(fns, rounds=10))
    row = {"configs": {}, "mismatch": [], "errors": {}, "us": {}}
    ref = bits(gemm.linear(x, ws[0], config=cfgs["default"]))
    timed = {}
    for v, c in cfgs.items():
        row["configs"][v] = label(c)
        if before_launch is not None:
            before_launch(v, row["configs"][v])
        try:
            y = gemm.linear(x, ws[0], config=c)
            if x.is_cuda:
                torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 (reported, not hidden)
            row["errors"][v] = f"{type(e).__name__}: {str(e)[:200]}"
            continue
        if not torch.equal(bits(y), ref):
            row["mismatch"].append(v)
        timed[v] = [lambda w=w, c=c: gemm.linear(x, w, config=c) for w in ws]
    timed["cublas"] = [lambda w=w: F.linear(x, w) for w in ws]
    row["us"], _ = bench.interleaved_medians(timed, time_fn, rounds)
    row["best"] = min((v for v in row["us"] if v != "cublas"), key=row["us"].get)
    return row


def geomean(vals) -> float:
    """Geometric mean (nan for no values)."""
    import math

    vals = list(vals)
    return math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else float("nan")


def gemm_row_line(head: str, row: dict) -> str:
    """The printed line of a :func:`gemm_config_row` row: default, best and cuBLAS, then every other
    configuration, mismatches and errors."""
    us, best = row["us"], row["best"]
    return (f"{head} default {us['default']:7.1f} ({row['configs']['default']})  best {best} {us[best]:7.1f}  "
            f"cublas {us['cublas']:7.1f}  | "
            + " ".join(f"{v} {u:.1f}" for v, u in us.items() if v not in ("default", "cublas"))
            + (f"  MISMATCH {row['mismatch']}" if row["mismatch"] else "")
            + (f"  errors {sorted(row['errors'])}" if row["errors"] else ""))
