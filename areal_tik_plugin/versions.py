"""Which versions of Triton, torch, transformers and SGLang the plugin runs with, and the checks that
refuse the others with a message saying what to change.

AReaL 1.0.4 (``pip install 'areal[cuda]'``) resolves to torch 2.9.1 (SGLang 0.5.10.post1 pins it),
which pins Triton 3.5.1; torch 2.10 pins Triton 3.6.0; AReaL pins transformers to 5.0 ... 5.3. The
plugin's kernels, interpreter shims and launch path run on Triton 3.5.x and 3.6.x; the short launch
path and the native host path need 3.6 (on 3.5 the ops take Triton's own launch path: same kernels,
slower host side). Bits are compared within one environment only: GPU evidence is bound to the
(kernels x Triton x torch x GPU) it was produced on (:mod:`areal_tik_plugin.evidence`).

``TIK_ALLOW_UNTESTED=1`` turns the refusals for an untested Triton / transformers / SGLang into
warnings (the evidence check still reports that nothing covers the environment).
"""

from __future__ import annotations

import os
import re
import warnings

# major.minor of the Triton releases the kernels and shims are tested with
TRITON_SUPPORTED = ("3.5", "3.6")
# Triton with the short launch path and the native host path (compiled-kernel ABI they read)
TRITON_FAST_HOST = "3.6"
TORCH_MIN = (2, 9, 1)  # AReaL 1.0.4's lower bound
TRANSFORMERS_MIN = (5, 0, 0)
# transformers releases the HF integration is tested with: AReaL's range and the current release
TRANSFORMERS_TESTED = ("5.3.0", "5.24.0")
SGLANG_LAUNCHER = ("0.5.10.post1",)  # no plugin system: areal_tik_plugin.integrations.sglang.launch
SGLANG_PLUGIN_MIN = (0, 5, 23)  # sglang.srt.plugins entry point
ALLOW_ENV = "TIK_ALLOW_UNTESTED"

UPGRADE_HINT = {
    "3.5": "torch 2.9.x (what AReaL 1.0.4 with SGLang 0.5.10.post1 installs) brings triton==3.5.1",
    "3.6": "torch 2.10.x brings triton==3.6.0",
}


class UnsupportedVersionError(RuntimeError):
    """An installed package's version is outside what the plugin runs with."""


def parse(version: str) -> tuple[int, ...]:
    """Numeric release part of a version string (``"2.9.1+cu128"`` -> ``(2, 9, 1)``)."""
    m = re.match(r"(\d+(?:\.\d+)*)", str(version))
    if not m:
        raise ValueError(f"cannot read a version number from {version!r}")
    return tuple(int(x) for x in m.group(1).split("."))


def installed(dist: str) -> str | None:
    import importlib.metadata as md

    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def _allowed() -> bool:
    v = os.environ.get(ALLOW_ENV, "")
    if v not in ("", "0", "1"):
        raise ValueError(f"{ALLOW_ENV}={v!r}: expected '1' (warn instead of refusing) or '0' / unset")
    return v == "1"


def _refuse(msg: str) -> None:
    if _allowed():
        warnings.warn(f"areal_tik_plugin: {msg} ({ALLOW_ENV}=1: continuing untested)", RuntimeWarning, stacklevel=3)
        return
    raise UnsupportedVersionError(f"areal_tik_plugin: {msg} (set {ALLOW_ENV}=1 to run untested anyway)")


def check_triton(version: str | None = None) -> str:
    """Refuse a Triton outside :data:`TRITON_SUPPORTED`. Returns its major.minor."""
    if version is None:
        import triton

        version = triton.__version__
    mm = ".".join(str(x) for x in parse(version)[:2])
    if mm not in TRITON_SUPPORTED:
        _refuse(f"Triton {version} is not supported; the kernels are tested with Triton "
                f"{' and '.join(v + '.x' for v in TRITON_SUPPORTED)} ({UPGRADE_HINT['3.5']}; "
                f"{UPGRADE_HINT['3.6']}): install the torch of AReaL's range with its own Triton, e.g. "
                f"`pip install torch==2.10.0` (triton 3.6.0) or `pip install torch==2.9.1` (triton 3.5.1)")
    return mm


def check_torch(version: str | None = None) -> None:
    if version is None:
        import torch

        version = torch.__version__
    if parse(version)[:3] < TORCH_MIN:
        _refuse(f"torch {version} is older than {'.'.join(map(str, TORCH_MIN))} (AReaL 1.0.4's lower bound); "
                f"install torch>=2.9.1")


def check_transformers(version: str | None = None) -> None:
    """transformers >= 5.0 (the HF integration patches the v5 modeling code)."""
    version = version if version is not None else installed("transformers")
    if version is None:
        raise UnsupportedVersionError("areal_tik_plugin: the HF integration needs transformers (pip install "
                                      "'transformers>=5.0,<=5.3' for AReaL 1.0.4)")
    if parse(version)[:3] < TRANSFORMERS_MIN:
        _refuse(f"transformers {version} is older than 5.0; the HF integration patches transformers 5's "
                f"modeling code (AReaL 1.0.4 needs 'transformers>=5.0,<=5.3')")


def sglang_mode(version: str | None = None) -> str:
    """How the plugin enters SGLang ``version``: ``"plugin"`` (entry point, SGLang >= 0.5.23) or
    ``"launcher"`` (0.5.10.post1: ``python -m areal_tik_plugin.integrations.sglang.launch``); others are
    refused."""
    version = version if version is not None else installed("sglang")
    if version is None:
        raise UnsupportedVersionError("areal_tik_plugin: SGLang is not installed (AReaL 1.0.4 pins "
                                      "sglang==0.5.10.post1)")
    if version in SGLANG_LAUNCHER:
        return "launcher"
    if parse(version)[:3] >= SGLANG_PLUGIN_MIN:
        return "plugin"
    _refuse(f"SGLang {version} is not supported: the plugin is tested with SGLang "
            f"{', '.join(SGLANG_LAUNCHER)} (AReaL 1.0.4's pin; through the launcher) and "
            f">= {'.'.join(map(str, SGLANG_PLUGIN_MIN))} (plugin entry point); install sglang==0.5.10.post1")
    return "launcher"


def fast_host_path(version: str | None = None) -> bool:
    """Whether the short launch path / native host path can run on this Triton (3.6 only)."""
    if version is None:
        import triton

        version = triton.__version__
    return ".".join(str(x) for x in parse(version)[:2]) == TRITON_FAST_HOST


def report() -> dict:
    """Installed versions of the packages that matter, and whether each is in the supported range."""
    out = {}
    for dist in ("torch", "triton", "transformers", "sglang", "areal"):
        out[dist] = installed(dist)
    return out
