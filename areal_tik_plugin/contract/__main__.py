"""Run the GPU contract suite and benchmarks; write evidence JSON; print a short table last."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import signal
import sys
import time


def add_arguments(ap) -> None:
    """The flags that cut a run's grids and baselines (GPU-time savers; defaults: everything)."""
    from areal_tik_plugin.contract import baselines

    baselines.add_arguments(ap)
    ap.add_argument("--gemm-m", default="", metavar="LIST", help="comma list of M values for the GEMM grid "
                    "(default: the full grid)")
    ap.add_argument("--gemm-skip-knobs", action="store_true",
                    help="GEMM: skip the free-knob alternatives (TMA off, other stage counts)")
    ap.add_argument("--fi-prefill-backends", default=None, metavar="LIST",
                    help="comma list of FlashInfer prefill backends timed against attention (default fa2,fa3)")


def configure(args) -> None:
    """Apply the parsed flags of :func:`add_arguments`; a bad value raises ValueError before any GPU work."""
    from areal_tik_plugin.contract import attention, baselines, gemm

    baselines.configure(args.baselines_off, args.fi_failed)
    gemm.configure(args.gemm_m, args.gemm_skip_knobs)
    attention.configure(args.fi_prefill_backends)


def build_parser() -> argparse.ArgumentParser:
    from areal_tik_plugin.contract import OP_MODULES

    ap = argparse.ArgumentParser(prog="python -m areal_tik_plugin.contract")
    ap.add_argument("--out", required=True, help="folder for the evidence JSON")
    ap.add_argument("--ops", default=",".join(OP_MODULES), help=f"comma list from {list(OP_MODULES)}")
    ap.add_argument("--quick", action="store_true", help="smaller grids (smoke run)")
    ap.add_argument("--quick-bench", action="store_true", help="smaller benchmark grids, full contract checks")
    ap.add_argument("--no-bench", action="store_true")
    ap.add_argument("--no-checks", action="store_true")
    add_arguments(ap)
    return ap


class Terminated(BaseException):
    """SIGTERM arrived (the call's time limit)."""


def _terminate(signum, frame):
    raise Terminated()


def _write_op(evidence, path, record, op, rec, t0, complete: bool = True, phase: str = "") -> None:
    """The op's record so far. ``complete: false`` (with ``phase``): the checks of an unfinished run never
    make an op pass (evidence.summary), though a failure in them still counts."""
    record["ops"][op] = rec.to_json()
    record["ops"][op]["seconds"] = round(time.time() - t0, 1)
    if not complete:
        record["ops"][op]["complete"] = False
        record["ops"][op]["phase"] = phase
    evidence.write_record(path, record)


def main(argv=None) -> int:
    from areal_tik_plugin import evidence
    from areal_tik_plugin.runtime import loader
    from areal_tik_plugin.contract import OP_MODULES
    from areal_tik_plugin.contract.suite import Recorder

    ap = build_parser()
    args = ap.parse_args(argv)
    try:
        configure(args)
    except ValueError as e:
        ap.error(str(e))

    import torch

    if not torch.cuda.is_available():
        print("the GPU suite needs a CUDA GPU", file=sys.stderr)
        return 2
    impl = loader.get_implementation()
    ops = [o for o in args.ops.split(",") if o]
    unknown = [o for o in ops if o not in OP_MODULES]
    if unknown:
        print(f"unknown ops {unknown}; expected from {list(OP_MODULES)}", file=sys.stderr)
        return 2
    record = evidence.record_header(impl, sys.argv[1:] if argv is None else list(argv))
    os.makedirs(args.out, exist_ok=True)
    path = evidence.record_path(args.out, impl, ops)
    table = []
    # a device call ends with SIGTERM (timeout): what ran so far is written, marked incomplete, instead of
    # nothing; BaseException, so the recorder's per-check `except Exception` does not swallow it
    signal.signal(signal.SIGTERM, _terminate)
    for op in ops:
        mod = importlib.import_module(OP_MODULES[op])
        rec = Recorder(op)
        t0 = time.time()
        phase = f"{op}.checks"
        try:
            if not args.no_checks:
                rec.run(phase, mod.run_checks, rec, args.quick)
                _write_op(evidence, path, record, op, rec, t0, complete=False, phase="checks done")
            phase = f"{op}.bench"
            if not args.no_bench:
                rec.run(phase, mod.run_bench, rec, args.quick or args.quick_bench)
        except Terminated:
            _write_op(evidence, path, record, op, rec, t0, complete=False, phase=f"terminated during {phase}")
            print(f"terminated during {phase}: partial evidence in {path}", file=sys.stderr)
            return 124
        _write_op(evidence, path, record, op, rec, t0)  # after each op: keep results if a later op dies
        npass = sum(c["passed"] for c in rec.checks)
        table.append((op, npass, len(rec.checks) - npass, rec.bench_summary, round(time.time() - t0, 1)))
        for e in rec.errors:
            print("ERROR", e)
        for c in rec.checks:
            if not c["passed"]:
                print("FAIL", json.dumps(c)[:400])
    try:  # the two bandwidth ceilings every share in this file is set against
        from areal_tik_plugin.contract import baselines

        record["hbm"] = {"spec_tbps": baselines.HBM_SPEC_TBPS, "measured_copy_tbps": baselines.measured_copy_tbps()}
        with open(path, "w") as f:
            json.dump(record, f, indent=1)
    except Exception as e:
        print("ERROR measuring the copy bandwidth:", type(e).__name__, e)
    print(f"\nevidence: {path}")
    print(f"implementation {impl.name} {impl.source_hash[:12]} on {record['env'].get('gpu')}")
    print(f"{'op':<12}{'pass':>6}{'fail':>6}{'sec':>7}  bench geomeans")
    for op, p, f, bs, sec in table:
        b = " ".join(f"{k}={v['geomean']:.3f}" for k, v in bs.items())
        print(f"{op:<12}{p:>6}{f:>6}{sec:>7}  {b}")
    return 0 if all(f == 0 for _, _, f, _, _ in table) else 1


if __name__ == "__main__":
    sys.exit(main())
