"""Checks shared by the tests of implementation folders made from a parent folder by a small edit."""

from __future__ import annotations

import json
import pathlib
import re

from areal_tik_plugin.runtime import loader
from areal_tik_plugin.search import edits as E


def assert_child(parent: pathlib.Path, child: pathlib.Path, changed: list[str]) -> tuple[dict, dict]:
    """``child`` is ``parent`` with only the Python files ``changed`` edited, its manifest the parent's but for
    name / parent / source_hash, and that hash the loader's. Returns both folders' files (path -> text)."""
    a, b = E.read_files(str(parent)), E.read_files(str(child))
    assert sorted(r for r in b if r.endswith(".py")) == sorted(r for r in a if r.endswith(".py"))
    assert [r for r in b if r.endswith(".py") and b[r] != a[r]] == changed
    ma, mb = (json.loads((p / "manifest.json").read_text()) for p in (parent, child))
    assert mb["name"] == child.name and mb["parent"] == parent.name
    keep = lambda m: {k: v for k, v in m.items() if k not in ("name", "parent", "source_hash")}  # noqa: E731
    assert keep(mb) == keep(ma)
    assert loader.load_implementation(str(child)).source_hash == mb["source_hash"]
    return a, b


def jit_functions(text: str, decorator: str = "triton") -> dict[str, str]:
    """A source file's ``@<decorator>.jit`` functions by name, whole (decorator to the next top-level statement)."""
    found = re.findall(rf"@{decorator}\.jit[^\n]*\n.*?(?=\n\S)", text, flags=re.S)
    return {re.search(r"def (\w+)", f).group(1): f for f in found}
