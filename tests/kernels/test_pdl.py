"""Programmatic dependent launch (kernels/tik_v1/_rowops.py, free knob PDL): every kernel that can be
launched with ``launch_pdl`` starts with ``pdl_start(PDL)`` -- it waits for the previous kernel before
touching memory -- and the launch keywords ask for PDL only on an sm_90+ GPU, never under the CPU
interpreter. A kernel launched with PDL but without that wait could read its inputs before they are
written, so this is checked statically for every kernel of the implementation."""

from __future__ import annotations

import ast
import inspect
import textwrap

import pytest

from triton.runtime.jit import KernelInterface

from areal_tik_plugin.runtime.loader import get_implementation

MODULES = ("attention", "gemm", "kv_write", "logprob", "moe", "rmsnorm", "rope", "swiglu")


def _launches(mod):
    """(kernel names launched as launch(NAME, grid, ...), names launched as NAME[grid](...))."""
    tree = ast.parse(inspect.getsource(mod))
    via_launch = {n.args[0].id for n in ast.walk(tree)
                  if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "launch" and n.args
                  and isinstance(n.args[0], ast.Name) and isinstance(getattr(mod, n.args[0].id, None), KernelInterface)}
    subscript = {n.value.id for n in ast.walk(tree)
                 if isinstance(n, ast.Subscript) and isinstance(n.value, ast.Name)
                 and isinstance(getattr(mod, n.value.id, None), KernelInterface)}
    return via_launch, subscript


def _kernels():
    impl = get_implementation()
    for name in MODULES:
        mod = impl.module(name)
        via_launch, subscript = _launches(mod)
        for k in sorted(via_launch | subscript):
            yield name, k, getattr(mod, k).fn


def test_every_launched_kernel_is_found():
    names = [k for _, k, _ in _kernels()]
    assert len(names) >= 27 and "_attn_decode_kernel" in names and "_linear_tma_persistent_kernel" in names, names


def test_every_launch_takes_the_launch_helper():
    """Each kernel is launched through _rowops.launch (the short host path, FAST_LAUNCH), never as
    NAME[grid](...) directly."""
    impl = get_implementation()
    direct = {name: sorted(_launches(impl.module(name))[1]) for name in MODULES}
    assert not any(direct.values()), direct


@pytest.mark.parametrize("mod,name,fn", list(_kernels()), ids=lambda x: x if isinstance(x, str) else "")
def test_kernel_waits_for_its_predecessor_first(mod, name, fn):
    f = ast.parse(textwrap.dedent(inspect.getsource(fn))).body[0]
    assert "PDL" in inspect.signature(fn).parameters, f"{mod}.{name}: no PDL parameter"
    body = f.body[1:] if isinstance(f.body[0], ast.Expr) and isinstance(f.body[0].value, ast.Constant) else f.body
    first = body[0]
    assert (isinstance(first, ast.Expr) and isinstance(first.value, ast.Call)
            and getattr(first.value.func, "id", None) == "pdl_start"
            and [getattr(a, "id", None) for a in first.value.args] == ["PDL"]), (
        f"{mod}.{name}: the first statement must be pdl_start(PDL), got {ast.unparse(first)}")


def test_launch_keywords(monkeypatch):
    ro = get_implementation().module("_rowops")
    assert ro.pdl_opts() == {} and "launch_pdl" not in ro.launch_opts(4)  # CPU interpreter
    import torch

    monkeypatch.setattr(ro, "_INTERPRETING", False)
    monkeypatch.setattr(ro, "_PDL_DEVICES", {})
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    for cap, want in (((9, 0), {"PDL": True, "launch_pdl": True}), ((8, 0), {})):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda idx, c=cap: c)
        ro._PDL_DEVICES.clear()
        assert ro.pdl_opts() == want
        assert {k: v for k, v in ro.launch_opts(4, 2).items() if k in ("PDL", "launch_pdl")} == want
    monkeypatch.setattr(ro, "PDL", False)
    ro._PDL_DEVICES.clear()
    assert ro.pdl_opts() == {}


@pytest.mark.parametrize("env,want", [(None, False), ("0", False), ("1", True), ("yes", "ValueError")])
def test_fast_launch_switch(env, want):
    """The package runs Triton's own launch path unless TIK_FAST_LAUNCH=1 (loader._apply_fast_launch: the
    short path's host-time gain did not hold up on a second device host); any other value than 0 / 1 is
    refused with what was expected."""
    import os
    import subprocess
    import sys

    e = {k: v for k, v in os.environ.items() if k != "TIK_FAST_LAUNCH"}
    if env is not None:
        e["TIK_FAST_LAUNCH"] = env
    code = ("from areal_tik_plugin.runtime.loader import get_implementation as g; "
            "print(g().module('_rowops').FAST_LAUNCH)")
    out = subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True, timeout=120)
    if want == "ValueError":
        assert out.returncode != 0 and "TIK_FAST_LAUNCH='yes': expected '1'" in out.stderr, out.stderr[-2000:]
        return
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == str(want)
