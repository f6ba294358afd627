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
