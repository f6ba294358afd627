"""The package's requirements admit the versions AReaL 1.0.4's stack pins, and the runtime checks agree.

``AREAL_STACKS`` are the exact versions read from the wheels' metadata: ``areal[sglang]==1.0.4`` pins
``sglang==0.5.10.post1``, which pins ``torch==2.9.1`` and ``transformers==5.3.0``; torch 2.9.1 pins
``triton==3.5.1``. AReaL alone also admits torch 2.10 (which pins ``triton==3.6.0``) and transformers
5.0 ... 5.3. A requirement added to pyproject.toml that excludes one of them fails here.
"""

from __future__ import annotations

import pathlib
import tomllib

import pytest
from packaging.requirements import Requirement

from areal_tik_plugin import versions

ROOT = pathlib.Path(__file__).resolve().parents[2]

AREAL_STACKS = {
    "areal[sglang]==1.0.4": {"areal": "1.0.4", "sglang": "0.5.10.post1", "torch": "2.9.1", "triton": "3.5.1",
                             "transformers": "5.3.0"},
    "areal==1.0.4 + torch 2.10": {"areal": "1.0.4", "torch": "2.10.0", "triton": "3.6.0", "transformers": "5.0.0"},
}


def _requirements():
    proj = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(r) for r in proj["dependencies"]]
    for extra in ("areal", "hf", "sglang"):
        reqs += [Requirement(r) for r in proj["optional-dependencies"][extra]]
    return reqs


@pytest.mark.parametrize("stack", list(AREAL_STACKS))
def test_requirements_admit_areal_stack(stack):
    pins = AREAL_STACKS[stack]
    for r in _requirements():
        v = pins.get(r.name.lower())
        if v is not None:
            assert r.specifier.contains(v, prereleases=True), f"{r} excludes {r.name} {v} of {stack}"


@pytest.mark.parametrize("stack", list(AREAL_STACKS))
def test_runtime_checks_accept_areal_stack(stack, monkeypatch):
    monkeypatch.delenv(versions.ALLOW_ENV, raising=False)
    pins = AREAL_STACKS[stack]
    versions.check_torch(pins["torch"])
    versions.check_triton(pins["triton"])
    versions.check_transformers(pins["transformers"])
    if "sglang" in pins:
        assert versions.sglang_mode(pins["sglang"]) == "launcher"


def test_pyproject_triton_range_is_the_runtime_range():
    (tri,) = [r for r in _requirements() if r.name == "triton"]
    for mm in versions.TRITON_SUPPORTED:
        assert tri.specifier.contains(f"{mm}.0")
    assert not tri.specifier.contains("3.4.0") and not tri.specifier.contains("3.7.0")
