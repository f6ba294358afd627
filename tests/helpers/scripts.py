"""Load or run a script of ``benchmarks/`` (run as ``python benchmarks/NAME.py``, not imported)."""

from __future__ import annotations

import importlib.util
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _path(name: str) -> pathlib.Path:
    for d in ("benchmarks", "benchmarks/probes"):
        p = ROOT / d / f"{name}.py"
        if p.is_file():
            return p
    raise FileNotFoundError(f"no benchmarks/{name}.py or benchmarks/probes/{name}.py")


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(name, _path(name))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def ptxas_available() -> bool:
    """Triton's bundled ptxas (the sm_90 compile scripts need it; no GPU needed)."""
    try:
        import triton

        return os.path.exists(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas"))
    except Exception:
        return False


def run_script(name: str, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """``python benchmarks/NAME.py ARGS`` compiling for the GPU (TRITON_INTERPRET removed), output captured."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run([sys.executable, str(_path(name)), *args], env=env,
                          capture_output=True, text=True, timeout=timeout)
