"""What one device call carries, against the device's 64 MiB limit: the working tree that travels
(tracked plus untracked-not-ignored files) and the ignored wheel folders named in ``carry``.

    python -m devenv.carry .whl .whl-areal .whl-fi     # here before the call, or there (gsm8k-e2e prints it)
    python -m devenv.carry --plan gsm8k-e2e            # the planned carry of a step, from the builders' lists

``--plan`` counts, in each folder, only the wheels its builder names (:data:`PLANS`), and fails naming
any that are missing or any extra wheel there (an extra wheel travels and is installed too: a stale
wandb in ``.whl-areal`` would both break the limit and replace the stand-in).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import zipfile

from devenv.megatron_wheels import _norm, parse_wheel_name

LIMIT_BYTES = 64 * 2**20
# what the e2e step should leave free: the tree grows with committed evidence between builds and calls
MARGIN_BYTES = 2 * 2**20


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def tree_files(root: str, exclude: tuple[str, ...] = ()) -> tuple[list[str], str]:
    """Files of the working tree that travel, relative to ``root``, and how they were found. With git:
    ``ls-files --cached --others --exclude-standard`` (what the device copies). Without (the device's copy
    has no .git): every file except .git, ``exclude``, ``__pycache__`` and ``*.egg-info``."""
    try:
        out = subprocess.run(["git", "-C", root, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                             capture_output=True, check=True).stdout
        names = [n for n in out.decode().split("\0") if n and os.path.isfile(os.path.join(root, n))]
        return sorted(set(names)), "git ls-files"
    except (OSError, subprocess.CalledProcessError):
        pass
    names = []
    skip = {".git", "__pycache__", *(e.strip("/") for e in exclude)}
    for d, dirs, files in os.walk(root):
        rel = os.path.relpath(d, root)
        dirs[:] = [x for x in dirs if x not in skip and not x.endswith(".egg-info")
                   and os.path.normpath(os.path.join(rel, x)) not in skip]
        names += [os.path.normpath(os.path.join(rel, f)) for f in files]
    return sorted(names), "walk (no git: without .git, __pycache__, *.egg-info)"


def folder_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def measure(root: str, folders: list[str]) -> dict:
    names, how = tree_files(root, tuple(folders))
    tree = sum(os.path.getsize(os.path.join(root, n)) for n in names)
    sizes = {f: folder_bytes(os.path.join(root, f)) for f in folders}
    total = tree + sum(sizes.values())
    return {"tree_bytes": tree, "tree_files": len(names), "tree_how": how, "folders": sizes,
            "total_bytes": total, "limit_bytes": LIMIT_BYTES, "headroom_bytes": LIMIT_BYTES - total}


# -- planned carries ------------------------------------------------------------------------------
def wheel_key(filename: str) -> tuple[str, str]:
    """(normalized name, version) of a wheel file name."""
    return parse_wheel_name(os.path.basename(filename))


def _sglang_set() -> list[str]:
    from devenv.sglang_wheels import DEPS, SGLANG

    return [SGLANG, *DEPS]


def _areal_trainer_set() -> list[str]:
    from devenv.areal_gpu_wheels import TRAINER_WHEELS, WHEELS

    return [*WHEELS, *TRAINER_WHEELS]


def _flashinfer_set() -> list[str]:
    from devenv.flashinfer_wheel import VERSION

    return [f"flashinfer-python=={VERSION}"]


# step -> [(folder, builder command, requirements the builder puts there)]
PLANS = {
    "gsm8k-e2e": [
        (".whl", "python -m devenv.sglang_wheels .whl", _sglang_set),
        (".whl-areal", "python -m devenv.areal_gpu_wheels .whl-areal --trainer", _areal_trainer_set),
        (".whl-fi", "python -m devenv.flashinfer_wheel .whl-fi --no-deps", _flashinfer_set),
    ],
}

# a wheel the builder trims: a member whose presence means the folder holds the untrimmed PyPI wheel
_UNTRIMMED_MARK = {"sglang": "sglang/multimodal_gen/", "flashinfer_python": "flashinfer/moe_ep/"}


def check_folder(path: str, reqs: list[str]) -> dict:
    """The wheels of ``path`` against a builder's requirement list: bytes of the matching ones, the
    requirements without a wheel, the wheels no requirement names, and untrimmed wheels."""
    files = sorted(f for f in os.listdir(path) if f.endswith(".whl")) if os.path.isdir(path) else []
    by_key = {wheel_key(f): f for f in files}
    used, missing, untrimmed, total = set(), [], [], 0
    for r in reqs:
        name, _, version = r.partition("==")
        hits = [f for (n, v), f in by_key.items() if n == _norm(name) and (not version or v == version)]
        if not hits:
            missing.append(r)
            continue
        f = hits[0]
        used.add(f)
        total += os.path.getsize(os.path.join(path, f))
        mark = _UNTRIMMED_MARK.get(_norm(name))
        if mark:
            with zipfile.ZipFile(os.path.join(path, f)) as z:
                if any(n.startswith(mark) for n in z.namelist()):
                    untrimmed.append(f)
    return {"bytes": total, "missing": missing, "extra": sorted(set(files) - used), "untrimmed": untrimmed}


def plan(step: str, root: str, wheel_dirs: list[str] = ()) -> dict:
    """The planned carry of ``step``: the tree here plus, per folder, the builder's wheels found in the
    first of ``root/FOLDER`` or ``DIR/FOLDER`` (each of ``wheel_dirs``) that holds the folder."""
    if step not in PLANS:
        raise ValueError(f"no carry plan for step {step!r}; expected one of {sorted(PLANS)}")
    names, how = tree_files(root, tuple(f for f, _, _ in PLANS[step]))
    tree = sum(os.path.getsize(os.path.join(root, n)) for n in names)
    folders, problems = {}, []
    for folder, builder, reqs in PLANS[step]:
        where = next((os.path.join(b, folder) for b in (root, *wheel_dirs) if os.path.isdir(os.path.join(b, folder))),
                     None)
        if where is None:
            problems.append(f"{folder}: not built (run `{builder}`)")
            continue
        c = check_folder(where, reqs())
        folders[folder] = dict(c, path=where, builder=builder)
        if c["missing"]:
            problems.append(f"{where}: missing {', '.join(c['missing'])} (run `{builder}`)")
        if c["extra"]:
            problems.append(f"{where}: wheels {builder!r} does not build (they would travel too): "
                            f"{', '.join(c['extra'])}")
        if c["untrimmed"]:
            problems.append(f"{where}: untrimmed {', '.join(c['untrimmed'])} (run `{builder}`)")
    total = tree + sum(f["bytes"] for f in folders.values())
    return {"step": step, "tree_bytes": tree, "tree_how": how, "folders": folders, "problems": problems,
            "total_bytes": total, "limit_bytes": LIMIT_BYTES, "headroom_bytes": LIMIT_BYTES - total}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m devenv.carry")
    ap.add_argument("folders", nargs="*", help="carried folders, relative to --root")
    ap.add_argument("--root", default=".")
    ap.add_argument("--plan", metavar="STEP", help=f"the planned carry of a step ({', '.join(PLANS)})")
    ap.add_argument("--wheel-dir", action="append", default=[],
                    help="with --plan: another folder holding built .whl* folders (searched after --root)")
    a = ap.parse_args(argv)
    if a.plan:
        p = plan(a.plan, a.root, a.wheel_dir)
        parts = [f"tree {_mib(p['tree_bytes'])} ({p['tree_how']})"] + \
            [f"{k} {_mib(v['bytes'])}" for k, v in p["folders"].items()]
        print(f"carry plan {a.plan}: {' + '.join(parts)} = {_mib(p['total_bytes'])} of {_mib(LIMIT_BYTES)} "
              f"({_mib(p['headroom_bytes'])} free)")
        for line in p["problems"]:
            print(f"  {line}", file=sys.stderr)
        return 1 if p["problems"] or p["headroom_bytes"] < MARGIN_BYTES else 0
    m = measure(a.root, a.folders)
    parts = [f"tree {_mib(m['tree_bytes'])} ({m['tree_files']} files, {m['tree_how']})"] + \
        [f"{k} {_mib(v)}" if os.path.isdir(os.path.join(a.root, k)) else f"{k} absent" for k, v in m["folders"].items()]
    print(f"carry: {' + '.join(parts)} = {_mib(m['total_bytes'])} of {_mib(LIMIT_BYTES)} "
          f"({_mib(m['headroom_bytes'])} free)")
    return 0 if m["headroom_bytes"] >= 0 else 1


if __name__ == "__main__":
    sys.exit(main())
