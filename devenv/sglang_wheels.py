"""Wheels to carry SGLang 0.5.23 to a machine without network (the H200 box: Python 3.12, torch,
triton, transformers, aiohttp, uvloop, pillow, psutil... already there; no sglang, no sgl-kernel).

    python -m devenv.sglang_wheels .whl          # here (network), ~21 MB
    # there:
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
    PYTHONPATH=/tmp/site:$PWD/devenv/gpu_stubs SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1 \\
        python3 -m areal_tik_plugin.cli sglang-check --model M --device cuda

The sglang wheel (39 MB) is trimmed to what a text-only Engine / HTTP server imports: the optional
Rust extensions (HTTP/gRPC/bench/multimodal, loaded on demand), the diffusion runtime
(``multimodal_gen``) and vendored kernels for other GPUs go; ``rust_tree_core`` (radix tree) stays.
sgl-kernel (the CUDA kernel wheel, hundreds of MB) is not carried: with ``--attention-backend tik``
every hot op is ours; ``devenv/gpu_stubs/sgl_kernel`` satisfies SGLang's import-time references and raises
on any call, so a remaining dependency shows up as an error naming the function (never a silent
fallback).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import zipfile

SGLANG = "sglang==0.5.23"
# Not in the H200 image (KINDS.md list, 2026-11-17), needed by SGLang's Engine/HTTP import path;
# pinned to the versions the CPU CI uses, plus their own missing requirements.
DEPS = [
    "orjson==3.13.0", "pybase64==1.5.1", "msgspec==0.23.0", "pyzmq==27.3.0", "dill==0.4.1",
    "apache-tvm-ffi==0.1.11", "compressed-tensors==0.18.0", "gguf==0.19.0", "openai==3.57.0",
    "partial-json-parser==0.2.1.1.post7", "setproctitle==1.3.8", "xgrammar==0.2.7", "soundfile==0.14.0",
    "python-multipart==0.0.34", "fastapi==0.165.0", "starlette==1.10.0", "uvicorn==0.54.0",
    "pydantic==2.14.4", "pydantic-core", "annotated-types", "typing-inspection", "jiter", "distro", "sniffio",
    "cffi", "pycparser",
    "loguru==0.7.3", "opentelemetry-api==1.45.2", "httpx2==2.16.2", "httpcore2==2.16.2", "truststore==0.10.5",
    "ipython==9.18.1", "decorator", "jedi", "parso", "matplotlib-inline", "prompt-toolkit", "stack-data",
    "traitlets", "pexpect", "ptyprocess", "asttokens", "executing", "pure-eval", "wcwidth",
    "ipython-pygments-lexers",
]
PLATFORMS = ["manylinux_2_34_x86_64", "manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_26_x86_64",
             "manylinux_2_24_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64"]
DROP_PREFIXES = (
    "sglang/multimodal_gen/",
    "sglang/srt/rust_extensions/_server", "sglang/srt/rust_extensions/_bench",
    "sglang/srt/rust_extensions/_grpc", "sglang/srt/rust_extensions/_multimodal",
    "sglang/kernels/ops/attention/flash_attn/cute/",
    "sglang/kernels/ops/attention/dsv4/flydsl",
)


def download(reqs, dest, python_version="3.12"):
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
           "--python-version", python_version, "--implementation", "cp", "-d", dest]
    for p in PLATFORMS:
        cmd += ["--platform", p]
    subprocess.run(cmd + list(reqs), check=True)


def trim_wheel(path: str) -> tuple[int, int]:
    """Rewrite the sglang wheel in place without DROP_PREFIXES (RECORD lines dropped too)."""
    before = os.path.getsize(path)
    tmp = path + ".tmp"
    with zipfile.ZipFile(path) as zin, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zout:
        for item in zin.infolist():
            if item.filename.startswith(DROP_PREFIXES):
                continue
            data = zin.read(item.filename)
            if item.filename.endswith(".dist-info/RECORD"):
                lines = [ln for ln in data.decode().splitlines() if not ln.startswith(DROP_PREFIXES)]
                data = ("\n".join(lines) + "\n").encode()
            zout.writestr(item, data)
    os.replace(tmp, path)
    return before, os.path.getsize(path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m devenv.sglang_wheels")
    ap.add_argument("dest")
    ap.add_argument("--python-version", default="3.12")
    a = ap.parse_args(argv)
    os.makedirs(a.dest, exist_ok=True)
    with tempfile.TemporaryDirectory() as d:
        download([SGLANG], d, a.python_version)
        (whl,) = [f for f in os.listdir(d) if f.startswith("sglang-")]
        before, after = trim_wheel(os.path.join(d, whl))
        os.replace(os.path.join(d, whl), os.path.join(a.dest, whl))
    download(DEPS, a.dest, a.python_version)
    total = sum(os.path.getsize(os.path.join(a.dest, f)) for f in os.listdir(a.dest))
    print(f"sglang wheel {before / 2**20:.1f} MiB -> {after / 2**20:.1f} MiB trimmed; "
          f"{len(os.listdir(a.dest))} wheels, {total / 2**20:.1f} MiB in {a.dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
