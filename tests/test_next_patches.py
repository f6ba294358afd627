"""The prepared, not landed kernel patches under docs/next/ still apply to this checkout (a patch that no
longer applies would be found only on the device, where time is scarce)."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PATCHES = sorted(glob.glob(os.path.join(ROOT, "docs", "next", "*.patch")))


@pytest.mark.skipif(shutil.which("git") is None or not os.path.isdir(os.path.join(ROOT, ".git")),
                    reason="needs git and a git checkout")
@pytest.mark.parametrize("patch", PATCHES, ids=[os.path.basename(p) for p in PATCHES])
def test_prepared_patch_applies(patch):
    r = subprocess.run(["git", "apply", "--check", patch], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, f"{os.path.basename(patch)} no longer applies to main: {r.stderr[:500]}"
