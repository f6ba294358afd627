"""Load or run a file of ``scripts/`` (they are run as ``python scripts/NAME.py``, not imported)."""

from __future__ import annotations

import importlib.util
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
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
    """``python scripts/NAME.py ARGS`` compiling for the GPU (TRITON_INTERPRET removed), output captured."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run([sys.executable, str(ROOT / "scripts" / f"{name}.py"), *args], env=env,
                          capture_output=True, text=True, timeout=timeout)
