"""Where a source checkout keeps its development shims (``devenv/`` at the repository root).

The import shims (CPU stand-ins for torchvision / vllm / swanlab / trackio, the offline GPU box's
``sgl_kernel`` and ``ray`` stand-ins) are not part of the installed package: a user's environment has
the real packages. In a source checkout (editable install, CI, the GPU box that receives the tree)
they live in ``devenv/``; this module finds them there and says so clearly when they are absent.
"""

from __future__ import annotations

import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NAMES = ("cpu_stubs", "gpu_stubs", "areal_cpu_stubs", "areal_gpu_stubs")


def devenv_dir(name: str, *, required: bool = False) -> str | None:
    """``<checkout>/devenv/<name>`` when this package runs from a source checkout, else None.

    ``required=True`` raises instead of returning None (a command that cannot run without the shim)."""
    if name not in NAMES:
        raise ValueError(f"devenv folder: expected one of {NAMES}, got {name!r}")
    path = os.path.join(ROOT, "devenv", name)
    if os.path.isdir(path):
        return path
    if required:
        raise FileNotFoundError(
            f"devenv/{name} not found next to the package ({ROOT}): these import shims exist only in a source "
            "checkout of areal-tik-plugin (git clone + pip install -e .); install the real packages instead")
    return None
