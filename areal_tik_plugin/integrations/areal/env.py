"""Environment helpers for running AReaL (+ SGLang) on a CPU-only test machine."""

from __future__ import annotations

import importlib.util
import os

_HERE = os.path.dirname(os.path.abspath(__file__))


def areal_stub_path() -> str | None:
    """The swanlab/trackio stub folder, when either real package is absent (else None)."""
    if importlib.util.find_spec("swanlab") is None or importlib.util.find_spec("trackio") is None:
        return os.path.join(_HERE, "_cpu_stubs")
    return None


def cpu_stub_paths() -> list[str]:
    """Folders to put on PYTHONPATH so AReaL 1.0.4 and SGLang import on a CPU machine: only
    where the real packages (swanlab, trackio; torchvision, vllm) are absent."""
    paths = [p for p in [areal_stub_path()] if p]
    try:
        from areal_tik_plugin.integrations import sglang_env

        p = sglang_env.cpu_stub_path()
        if p:
            paths.append(p)
    except Exception:  # noqa: BLE001 -- the SGLang integration's helper is optional here
        sg = os.path.join(os.path.dirname(_HERE), "_cpu_stubs")
        if os.path.isdir(sg) and importlib.util.find_spec("torchvision") is None:
            paths.append(sg)
    return paths


def with_cpu_stubs(env: dict | None = None) -> dict:
    env = dict(os.environ if env is None else env)
    extra = [p for p in cpu_stub_paths() if p not in env.get("PYTHONPATH", "").split(os.pathsep)]
    if extra:
        env["PYTHONPATH"] = os.pathsep.join(extra + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env
