"""Wheels to carry megatron-core as AReaL 1.0.4 pins it (its ``megatron`` extra: megatron-core 0.17.0,
Python >= 3.12) and mbridge to the offline GPU machine::

    python -m devenv.megatron_wheels .whl-mcore     # here (network), ~1.9 MB, writes .whl-mcore/manifest.json
    bash benchmarks/gpu_integrations.sh megatron    # there (carry .whl-mcore)

megatron-core's runtime requirements (torch, numpy, packaging) and what its attention and mbridge import
(einops, transformers, safetensors) are on the H200 image (:data:`ON_IMAGE`, from the image's package
list), so only :data:`WHEELS` are carried. TransformerEngine and apex are not carried: the plugin's
spec needs neither and the comparison spec is Megatron's local (TE-free) one. The megatron-core wheel
holds one compiled module (``megatron/core/datasets/helpers_cpp``, the data-set index builder), which
neither the spec nor the benchmark imports.

:func:`manifest` checks a folder against :data:`WHEELS` (each exactly once, nothing else, under
:data:`LIMIT_MIB`) and is what the device step and the test read.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys

WHEELS = ["megatron-core==0.17.0", "mbridge==0.15.1"]
ON_IMAGE = ["torch", "numpy", "packaging", "einops", "transformers", "safetensors"]
LIMIT_MIB = 20.0
PLATFORM = "manylinux_2_28_x86_64"


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def parse_wheel_name(filename: str) -> tuple[str, str]:
    """(normalized distribution, version) of a wheel file name; ValueError for anything else."""
    m = re.fullmatch(r"([A-Za-z0-9_.]+)-([0-9][^-]*)(-[0-9][^-]*)?-([^-]+)-([^-]+)-([^-]+)\.whl", filename)
    if not m:
        raise ValueError(f"{filename!r}: expected a wheel file name DIST-VERSION-PY-ABI-PLATFORM.whl")
    return _norm(m.group(1)), m.group(2)


def manifest(dest: str, wheels=WHEELS, limit_mib: float = LIMIT_MIB) -> dict:
    """What ``dest`` carries: one entry per wheel (file, version, size, sha256), checked against
    ``wheels`` (``name==version`` each present once, no other wheel) and the size limit; ValueError
    naming what is wrong."""
    want = {}
    for w in wheels:
        name, sep, ver = w.partition("==")
        if not sep or not ver:
            raise ValueError(f"{w!r}: expected NAME==VERSION")
        want[_norm(name)] = (name, ver)
    got: dict[str, list] = {}
    for f in sorted(os.listdir(dest)):
        if f.endswith(".whl"):
            name, ver = parse_wheel_name(f)
            got.setdefault(name, []).append((f, ver))
    errs = []
    for k, (name, ver) in want.items():
        files = got.get(k, [])
        if len(files) != 1:
            errs.append(f"{name}=={ver}: expected one wheel, found {[f for f, _ in files] or 'none'}")
        elif files[0][1] != ver:
            errs.append(f"{name}: expected version {ver}, found {files[0][0]}")
    extra = sorted(f for k, fs in got.items() if k not in want for f, _ in fs)
    if extra:
        errs.append(f"wheels not in the list: {extra}")
    entries = []
    for k, fs in sorted(got.items()):
        for f, ver in fs:
            p = os.path.join(dest, f)
            with open(p, "rb") as fh:
                digest = hashlib.sha256(fh.read()).hexdigest()
            entries.append({"file": f, "name": k, "version": ver, "bytes": os.path.getsize(p), "sha256": digest})
    total = sum(e["bytes"] for e in entries)
    if total > limit_mib * 2**20:
        errs.append(f"{total / 2**20:.1f} MiB: over the {limit_mib} MiB carry budget")
    if errs:
        raise ValueError(f"{dest}: " + "; ".join(errs))
    return {"wheels": entries, "total_bytes": total, "on_image": list(ON_IMAGE), "platform": PLATFORM}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m devenv.megatron_wheels")
    ap.add_argument("dest")
    ap.add_argument("--python-version", default="3.12")
    a = ap.parse_args(argv)
    import subprocess

    os.makedirs(a.dest, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    "--python-version", a.python_version, "--implementation", "cp", "--platform", PLATFORM,
                    "-d", a.dest, *WHEELS], check=True)
    m = manifest(a.dest)
    with open(os.path.join(a.dest, "manifest.json"), "w") as f:
        json.dump(m, f, indent=1)
    print(f"{len(m['wheels'])} wheels, {m['total_bytes'] / 2**20:.2f} MiB in {a.dest} "
          f"(on the image, not carried: {', '.join(ON_IMAGE)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
