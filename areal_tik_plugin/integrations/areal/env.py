"""Environment helpers for running AReaL (+ SGLang) on a CPU-only test machine."""

from __future__ import annotations

import importlib.util
import os


def areal_stub_path() -> str | None:
    """The swanlab/trackio stub folder (``devenv/areal_cpu_stubs``, source checkout only), when either
    real package is absent (else None)."""
    from areal_tik_plugin.runtime.source_checkout import devenv_dir

    stubs = devenv_dir("areal_cpu_stubs")

    def real(name: str) -> bool:
        # the stub itself on sys.path (put there by an earlier in-process caller) is not the package
        spec = importlib.util.find_spec(name)
        origin = os.path.abspath(spec.origin) if spec is not None and spec.origin else ""
        return spec is not None and not (stubs and origin.startswith(os.path.abspath(stubs) + os.sep))

    if not real("swanlab") or not real("trackio"):
        return stubs
    return None


def cpu_stub_paths() -> list[str]:
    """Folders to put on PYTHONPATH so AReaL 1.0.4 and SGLang import on a CPU machine: only
    where the real packages (swanlab, trackio; torchvision, vllm) are absent."""
    from areal_tik_plugin.runtime.source_checkout import devenv_dir

    paths = [p for p in [areal_stub_path()] if p]
    sg = devenv_dir("cpu_stubs")
    if sg and importlib.util.find_spec("torchvision") is None:
        paths.append(sg)
    return paths


def with_cpu_stubs(env: dict | None = None) -> dict:
    env = dict(os.environ if env is None else env)
    extra = [p for p in cpu_stub_paths() if p not in env.get("PYTHONPATH", "").split(os.pathsep)]
    if extra:
        env["PYTHONPATH"] = os.pathsep.join(extra + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env
