"""``tik qualify``: establish the bitwise contract on the user's own GPU environment.

The committed evidence covers the (kernels x Triton x torch x GPU) combinations it was produced on.
Bits are only ever compared within one environment, so a different Triton (e.g. 3.5.1, which AReaL
1.0.4's torch 2.9.1 brings), torch or GPU needs its own evidence. This command runs, on this machine's
GPU,

1. the contract suite (``python -m areal_tik_plugin.contract --no-bench``: every op's bitwise checks and
   accuracy checks against fp64 references), and
2. ``tik verify`` on the built-in tiny models (full-sequence training forward == prefill + decode, bit
   for bit),

each in its own process, then writes one qualification record
(:func:`areal_tik_plugin.evidence.qualification_record`) to ``--out`` (default: the user evidence dir,
``~/.cache/areal_tik_plugin/evidence``). The loader (first kernel load on a GPU) and the AReaL plan
look for that record; without one they say that nothing covers the running environment.
"""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import subprocess
import sys

DEFAULT_MODELS = ("tiny-qwen3", "tiny-qwen3-moe", "tiny-qwen2", "tiny-llama")


def contract_module() -> str:
    """The contract suite's module (``areal_tik_plugin.contract`` where present, else ``.gpu``)."""
    for name in ("areal_tik_plugin.contract", "areal_tik_plugin.contract"):
        try:
            if importlib.util.find_spec(name) is not None and \
                    importlib.util.find_spec(name + ".__main__") is not None:
                return name
        except ModuleNotFoundError:
            continue
    raise RuntimeError("areal_tik_plugin: no contract suite module found (areal_tik_plugin.contract / .gpu)")


class NoGPUError(RuntimeError):
    """Qualification needs the GPU the jobs run on."""


def require_gpu() -> None:
    import torch

    if not torch.cuda.is_available():
        raise NoGPUError("tik qualify needs a CUDA GPU (torch.cuda.is_available() is False): it runs the "
                         "contract suite and tik verify on the GPU your jobs use, and evidence is bound to "
                         "that GPU, Triton and torch; run it on the training / rollout machine. (Without a "
                         "GPU the kernels run in Triton's interpreter, which the CPU test suite covers.)")


def _run(cmd: list[str], log_path: str, timeout: float) -> int:
    # the steps produce the evidence: a refusal for want of it (TIK_REQUIRE_EVIDENCE=1) must not stop them
    env = {k: v for k, v in os.environ.items() if k != "TIK_REQUIRE_EVIDENCE"}
    with open(log_path, "w") as log:
        try:
            return subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=timeout, env=env).returncode
        except subprocess.TimeoutExpired:
            log.write(f"\ntimed out after {timeout:.0f} s\n")
            return 124


def qualify(out_dir: str, models=DEFAULT_MODELS, quick: bool = False, timeout: float = 3600,
            progress=print) -> tuple[str, dict]:
    """Run the contract suite and ``tik verify`` here; write and return (path, qualification record)."""
    from areal_tik_plugin import evidence
    from areal_tik_plugin.runtime import loader

    require_gpu()
    if not models:
        raise ValueError("tik qualify: expected at least one model for tik verify (e.g. tiny-qwen3)")
    impl = loader.load_implementation(loader.resolve_path(loader.selected_name()))  # no evidence check here
    env = evidence.environment()
    run_dir = os.path.join(out_dir, "runs", f"{impl.name}-{impl.source_hash[:12]}-"
                           + "-".join(str(env.get(k) or "none").replace(" ", "_") for k in ("triton", "torch", "gpu")))
    contract_dir = os.path.join(run_dir, "contract")
    verify_dir = os.path.join(run_dir, "verify")
    os.makedirs(contract_dir, exist_ok=True)
    os.makedirs(verify_dir, exist_ok=True)
    for p in glob.glob(os.path.join(contract_dir, "*.json")):  # a rerun never mixes in an older run's files
        os.remove(p)
    files: dict = {"contract": [], "verify": [], "logs": []}
    cmd = [sys.executable, "-m", contract_module(), "--out", contract_dir, "--no-bench"] + (["--quick"] if quick else [])
    progress(f"[tik qualify] contract suite: {' '.join(cmd[1:])}")
    log = os.path.join(run_dir, "contract.log")
    rc = _run(cmd, log, timeout)
    files["logs"].append(log)
    contract = []
    for p in sorted(glob.glob(os.path.join(contract_dir, "*.json"))):
        with open(p) as f:
            contract.append(json.load(f))
        files["contract"].append(p)
    progress(f"[tik qualify] contract suite rc={rc}, {len(contract)} record(s)")
    reports = []
    for m in models:
        out = os.path.join(verify_dir, f"{m.replace(os.sep, '_')}.json")
        if os.path.exists(out):
            os.remove(out)
        cmd = [sys.executable, "-m", "areal_tik_plugin.cli", "verify", "--model", m, "--out", out]
        log = os.path.join(verify_dir, f"{m.replace(os.sep, '_')}.log")
        rc = _run(cmd, log, timeout)
        files["logs"].append(log)
        if os.path.exists(out):
            with open(out) as f:
                reports.append(json.load(f))
            files["verify"].append(out)
        else:
            reports.append({"model": m, "plugin_bit_identical": False, "checks": [],
                            "implementation": {"name": impl.name, "source_hash": impl.source_hash},
                            "env": env, "error": f"tik verify rc={rc} wrote no report (log {log})"})
        progress(f"[tik qualify] tik verify {m}: rc={rc}")
    rec = evidence.qualification_record(impl, env, contract, reports, argv=sys.argv[1:], files=files)
    return evidence.write_qualification(out_dir, rec), rec


def _cmd_qualify(args) -> int:
    from areal_tik_plugin import evidence

    models = [m for m in args.models.split(",") if m]
    out = args.out or evidence.user_evidence_dir()
    try:
        path, rec = qualify(out, models=models, quick=args.quick, timeout=args.timeout)
    except NoGPUError as e:
        print(str(e), file=sys.stderr)
        return 2
    except ValueError as e:
        print(str(e), file=sys.stderr)
        return 2
    print(f"[tik qualify] {evidence.describe_env(rec['implementation'], rec['source_hash'], rec['env'])}")
    for op, c in sorted(rec["contract"].items()):
        print(f"  contract {op:<10} passed {c['passed']:>5}  failed {c['failed']:>4}")
    for m in rec["models"]:
        print(f"  verify   {m['model']:<16} {'bit-identical' if m['bit_identical'] else 'NOT bit-identical'}")
    for p in rec["problems"]:
        print(f"  problem: {p}")
    if rec["ops_missing"]:
        print(f"  ops without passing checks: {rec['ops_missing']}")
    print(("QUALIFIED" if rec["ok"] else "NOT QUALIFIED") + f": {path}")
    return 0 if rec["ok"] else 1


def register(sub) -> None:
    p = sub.add_parser("qualify", help="run the contract suite and tik verify on this GPU; record evidence "
                                       "for this kernels x Triton x torch x GPU", description=__doc__,
                       formatter_class=__import__("argparse").RawDescriptionHelpFormatter)
    p.add_argument("--out", default=None, help="evidence folder (default: $TIK_USER_EVIDENCE_DIR or "
                                               "~/.cache/areal_tik_plugin/evidence)")
    p.add_argument("--models", default=",".join(DEFAULT_MODELS), help="comma list for tik verify")
    p.add_argument("--quick", action="store_true", help="the contract suite's smaller grids")
    p.add_argument("--timeout", type=float, default=3600, help="seconds per step")
    p.set_defaults(func=_cmd_qualify)
