"""Wheels to carry AReaL 1.0.4's FSDP engine (and Liger-Kernel, a benchmark baseline) to the offline
GPU machine, next to the SGLang set of :mod:`devenv.sglang_wheels` (which
already brings pydantic, openai, orjson, dill, ...)::

    python -m devenv.areal_gpu_wheels .whl-areal     # here (network), ~3.4 MB
    bash benchmarks/gpu_integrations.sh recompute liger                       # there (carry .whl, .whl-areal)

Only what ``areal.engine.fsdp_engine`` + ``areal.trainer.ppo.actor`` import is carried; ray (~70 MB)
is replaced by the import-only stub in ``devenv/areal_gpu_stubs`` and the trainers' own stack
(datasets, tensorboardX, ...) is not imported by ``recipes/bench_recompute.py`` where it is absent.
``--trainer`` adds that stack for the GSM8K recipe, without wandb (see :data:`TRAINER_WHEELS`).
"""

from __future__ import annotations

import argparse
import os
import sys

from devenv.sglang_wheels import download

WHEELS = [
    "areal==1.0.4", "hydra-core==1.4.0.dev1", "omegaconf==2.4.0.dev2", "antlr4-python3-runtime==4.13.2",
    "flask==3.1.3", "blinker==1.9.0", "itsdangerous==2.2.0", "colorlog==6.12.0", "jsonschema==4.26.0",
    "jsonschema-specifications==2025.9.1", "referencing==0.37.0", "rpds-py==2026.9.1", "lark==1.3.1",
    "tenacity==9.2.1", "torchdata==0.11.0", "liger-kernel==0.8.5",
]

# ``--trainer``: what AReaL's trainers (the GSM8K recipe) import on top, as installed in the CPU CI venv.
# Not wandb: its wheel (20 MiB, mostly the Go wandb-core service) would put the gsm8k-e2e carry
# (.whl + this + .whl-fi + the tree) over the device's 64 MiB, and the GPU recipe cells run with
# stats_logger.wandb.mode=disabled, where AReaL only imports it and calls init/log/finish: the
# import-only stand-in devenv/areal_gpu_stubs/wandb serves exactly that and raises on anything that
# would log (`python -m devenv.carry --plan gsm8k-e2e` gives the sizes).
TRAINER_WHEELS = [
    "datasets==5.2.0", "multiprocess==0.70.19", "tensorboardX==2.6.5", "math-verify==0.8.0",
    "latex2sympy2_extended==1.10.2", "platformdirs==4.14.8", "tzdata==2026.6",
]


# ``--import-deps``: what ``import areal`` (its compiled log-prob, ``areal.utils.functional``) needs from the
# SGLang set, at that set's versions, for a call that carries no SGLang (benchmarks/gpu_baselines.sh)
IMPORT_DEPS = ("orjson", "dill", "openai", "pydantic", "pydantic-core", "annotated-types", "typing-inspection",
               "jiter", "distro", "sniffio", "httpx2", "httpcore2", "truststore", "wcwidth")


def import_deps() -> list[str]:
    from devenv.sglang_wheels import DEPS

    pick = [d for d in DEPS if d.split("==")[0] in IMPORT_DEPS]
    missing = set(IMPORT_DEPS) - {d.split("==")[0] for d in pick}
    if missing:
        raise ValueError(f"IMPORT_DEPS not in devenv.sglang_wheels.DEPS: {sorted(missing)}")
    return pick


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m devenv.areal_gpu_wheels")
    ap.add_argument("dest")
    ap.add_argument("--python-version", default="3.12")
    ap.add_argument("--trainer", action="store_true", help="also the trainers' deps (the GSM8K recipe on the GPU)")
    ap.add_argument("--import-deps", action="store_true",
                    help="also what `import areal` takes from the SGLang set (a call that carries no .whl)")
    a = ap.parse_args(argv)
    os.makedirs(a.dest, exist_ok=True)
    reqs = WHEELS + (TRAINER_WHEELS if a.trainer else []) + (import_deps() if a.import_deps else [])
    download(reqs, a.dest, a.python_version)
    # a wheel of an earlier set left in dest (wandb) would travel and be installed on the device too
    from devenv.carry import check_folder

    for f in check_folder(a.dest, reqs)["extra"]:
        os.remove(os.path.join(a.dest, f))
        print(f"removed {f} from {a.dest}: not in this set")
    total = sum(os.path.getsize(os.path.join(a.dest, f)) for f in os.listdir(a.dest))
    print(f"{len(os.listdir(a.dest))} wheels, {total / 2**20:.1f} MiB in {a.dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
