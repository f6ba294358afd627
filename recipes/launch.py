"""Launch one cell or the whole GSM8K recipe matrix (model x algorithm x staleness x mode) with seeds.

    python recipes/launch.py --model qwen3-4b --algorithm grpo --staleness 2 --mode tik --seeds 1 2 3
    python recipes/launch.py --all --seeds 1 2 3                 # 2 models x 2 algos x 3 s x 2 modes
    python recipes/launch.py --all --dry-run                     # print the commands
    python recipes/launch.py --model cpu-tiny --staleness 0 --mode tik --spmd -- cluster.fileroot=/tmp/x

Every run goes through ``python -m areal_tik_plugin.run recipes/gsm8k_rl.py --config
recipes/gsm8k/config.yaml model=... algorithm=... staleness=s.. mode=... seed=N``; W&B project
``areal-tik-gsm8k``, group ``gsm8k-<algo>-<model>-s<s>`` (tik and baseline side by side), name
``<mode>-seed<N>``, tags [gsm8k, algo, model, s<s>, mode]. Cells run one after another; anything
after ``--`` is passed on as AReaL overrides. ``tik compare`` reads the runs back.
"""

from __future__ import annotations

import argparse
import itertools
import os
import shlex
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIG = os.path.join(HERE, "gsm8k", "config.yaml")
ENTRY = os.path.join(HERE, "gsm8k_rl.py")
MODELS = ("qwen2.5-1.5b-instruct", "qwen3-4b")
ALGORITHMS = ("grpo", "ppo")
STALENESS = (0, 2, 4)
MODES = ("tik", "baseline")


def groups(kind: str) -> list[str]:
    d = os.path.join(HERE, "gsm8k", kind)
    return sorted(f[:-5] for f in os.listdir(d) if f.endswith(".yaml"))


def _seed(v: str) -> int:
    try:
        n = int(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer seed, got {v!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer seed, got {n}")
    return n


def cells(models, algorithms, staleness, modes, seeds):
    for m, a, s, mode, seed in itertools.product(models, algorithms, staleness, modes, seeds):
        yield {"model": m, "algorithm": a, "staleness": f"s{s}", "mode": mode, "seed": seed}


def command(cell: dict, extra: list[str], spmd: bool = False, python: str | None = None) -> list[str]:
    cmd = [python or sys.executable, "-m", "areal_tik_plugin.run"]
    if spmd:
        cmd.append("--spmd")
    cmd += [ENTRY, "--config", CONFIG, f"model={cell['model']}", f"algorithm={cell['algorithm']}",
            f"staleness={cell['staleness']}", f"mode={cell['mode']}", f"seed={cell['seed']}"]
    if spmd:
        cmd.append("scheduler.type=null")
    return cmd + list(extra)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--all", action="store_true", help="the whole matrix (models x algorithms x staleness x modes)")
    ap.add_argument("--model", nargs="+", default=None, choices=groups("model"))
    ap.add_argument("--algorithm", nargs="+", default=None, choices=groups("algorithm"))
    ap.add_argument("--staleness", nargs="+", type=int, default=None, choices=STALENESS)
    ap.add_argument("--mode", nargs="+", default=None, choices=groups("mode"))
    ap.add_argument("--seeds", nargs="+", type=_seed, default=[1])
    ap.add_argument("--spmd", action="store_true", help="SPMD mode (plugin starts SGLang, then torchrun)")
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--keep-going", action="store_true", help="continue the matrix after a failed cell")
    a = ap.parse_args(argv)
    if not a.all and not (a.model and a.algorithm and a.staleness is not None and a.mode):
        ap.error("give --all or every one of --model --algorithm --staleness --mode")
    todo = list(cells(a.model or MODELS, a.algorithm or ALGORITHMS,
                      a.staleness if a.staleness is not None else STALENESS, a.mode or MODES, a.seeds))
    rc = 0
    for i, cell in enumerate(todo):
        cmd = command(cell, extra, a.spmd)
        print(f"[{i + 1}/{len(todo)}] " + shlex.join(cmd), flush=True)
        if a.dry_run:
            continue
        r = subprocess.call(cmd)
        if r != 0:
            rc = r
            print(f"cell {cell} failed with exit code {r}", file=sys.stderr)
            if not a.keep_going:
                return r
    return rc


if __name__ == "__main__":
    sys.exit(main())
