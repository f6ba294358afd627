"""The package's layout: no import circle between its modules (function-level imports included), no
development shim in the built wheel, and ``import areal_tik_plugin`` pulls no heavy optional package."""

from __future__ import annotations

import ast
import json
import os
import pathlib
import subprocess
import sys
import zipfile

import pytest

from areal_tik_plugin.runtime import loader

ROOT = pathlib.Path(__file__).resolve().parents[2]
PKG = ROOT / "areal_tik_plugin"


def _module_name(path: pathlib.Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _graph() -> dict[str, set[str]]:
    mods = {_module_name(p): p for p in PKG.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    pkg = name.split(".") if is_pkg else name.split(".")[:-1]
                    pkg = pkg[: len(pkg) - node.level + 1]
                    base = ".".join(pkg + ([base] if base else []))
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            for t in targets:
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t and t != name and not name.startswith(t + "."):  # a package importing its own parent
                    graph[name].add(t)
    return graph


def _cycles(graph):
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_import_circle():
    assert _cycles(_graph()) == []


def test_runtime_loader_imports_nothing_built_on_it():
    deps = _graph()["areal_tik_plugin.runtime.loader"]
    assert not any(d.startswith(("areal_tik_plugin.runtime.native", "areal_tik_plugin.ops",
                                 "areal_tik_plugin.integrations")) for d in deps), deps


def test_import_pulls_no_optional_dependency():
    code = ("import sys, areal_tik_plugin, areal_tik_plugin.ops, areal_tik_plugin.models; "
            "bad = [m for m in ('sglang', 'areal', 'megatron', 'transformers', 'flashinfer', 'liger_kernel') "
            "if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd="/")
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.slow
def test_wheel_ships_no_shims(tmp_path):
    """``pip wheel .`` of a clean copy of the tree: the package, kernels and search are in it; devenv/,
    benchmarks/, tests/ are not."""
    import shutil

    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".git", ".venv*", "build", "*.egg-info", "__pycache__",
                                                             "evidence", ".whl*", "runs", "wandb"))
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                        str(tmp_path), str(src)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    (whl,) = tmp_path.glob("areal_tik_plugin-*.whl")
    names = zipfile.ZipFile(whl).namelist()
    assert "areal_tik_plugin/kernels/tik_v1/manifest.json" in names
    assert "areal_tik_plugin/kernels/selection.json" in names
    assert "areal_tik_plugin/search/specs/cpu_toy.yaml" in names
    assert "areal_tik_plugin/runtime/native/_tik_native.c" in names
    bad = [n for n in names if any(s in n for s in ("stubs", "devenv", "benchmarks/", "tests/", "wheels.py",
                                                    "sitecustomize", "torchvision", "vllm", "sgl_kernel",
                                                    "swanlab", "trackio", "ray/"))]
    assert bad == []
    assert not any(n.startswith(("benchmarks", "devenv", "tests")) for n in names)
    # the installed wheel (not the checkout) resolves the selection: sm_90 gets what selection.json says
    site = tmp_path / "site"
    zipfile.ZipFile(whl).extractall(site)
    code = ("from areal_tik_plugin.runtime import loader; "
            "print(loader.kernels_root()); print(loader.selected_name('sm_90'))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                       env={**os.environ, "PYTHONPATH": str(site)})
    assert r.returncode == 0, r.stderr
    root, name = r.stdout.split()
    assert root == str(site / "areal_tik_plugin" / "kernels")
    sel = json.loads((ROOT / "kernels" / "selection.json").read_text())
    assert name == sel.get(f"sm_90+triton{loader.triton_minor()}", sel["sm_90"])


def test_selection_per_triton_entry(tmp_path, monkeypatch):
    """``<arch>+triton<major.minor>`` wins over ``<arch>`` for that Triton only; TIK_IMPLEMENTATION over both."""
    (tmp_path / "selection.json").write_text(json.dumps(
        {"default": "a", "cpu": "a", "sm_90": "new", "sm_90+triton3.5": "old"}))
    monkeypatch.setattr(loader, "kernels_root", lambda: str(tmp_path))
    monkeypatch.delenv("TIK_IMPLEMENTATION", raising=False)
    assert loader.selected_name("sm_90", triton="3.5") == "old"
    assert loader.selected_name("sm_90", triton="3.6") == "new"
    assert loader.selected_name("sm_80", triton="3.5") == "a"
    assert loader.selected_name("sm_90") == ("old" if loader.triton_minor() == "3.5" else "new")
    monkeypatch.setenv("TIK_IMPLEMENTATION", "x")
    assert loader.selected_name("sm_90", triton="3.5") == "x"


def test_triton_minor_reads_the_installed_version():
    import triton

    assert loader.triton_minor() == ".".join(triton.__version__.split(".")[:2])


def test_repository_root_does_not_shadow_pypi_kernels():
    """``kernels/`` is data, not a package: Python started in the repository root (``python -m ...`` from
    a checkout) must still import transformers, whose hub integration imports the PyPI ``kernels``."""
    assert not (ROOT / "kernels" / "__init__.py").exists()
    pytest.importorskip("transformers")
    code = ("import importlib.util, transformers.modeling_utils; s = importlib.util.find_spec('kernels'); "
            "print(s.origin if s else None)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    assert not r.stdout.strip().startswith(str(ROOT / "kernels")), r.stdout
