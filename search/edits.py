"""Source edits of an implementation: SEARCH/REPLACE blocks, whole-file writes, knob moves.

An edit list is applied to an in-memory copy of the parent's files first (so a failure leaves nothing
on disk); the offspring folder is then written from that copy (see ``state.Run.record_action``).

Knobs (``discover_knobs``): an implementation module declares

    KNOBS = {"coupled": {"ATTN_KV_TILE": C.ATTN_KV_TILE, ...},        # names of contract constants
             "free": {"PREFILL_WARPS": (4, 8), ...}}                   # name -> allowed values

Coupled knobs are single constants in ``contract.py`` (their allowed values in its ``COUPLED``
dict), read by every path, so one edit moves them on every path at once. Free knobs are module
constants next to the kernels; a value may be a per-device dict (``{"gpu": 128, "cpu": 32}``), in
which case the knob is the entry for the spec's ``knob_key``. Everything is read with ``ast``
(no import, no side effects) and edited by replacing exactly the value's source segment.
"""

from __future__ import annotations

import ast
import difflib
import os
import re
from dataclasses import dataclass
from typing import Any

from areal_tik_plugin.runtime.loader import MANIFEST, source_files


class EditError(ValueError):
    """An edit cannot be parsed or applied."""


# ------------------------------------------------------------------------------------------------
# files of an implementation
# ------------------------------------------------------------------------------------------------
def read_files(path: str) -> dict[str, str]:
    """Relative path -> text of every hashed source file (the manifest excluded)."""
    out = {}
    for rel in source_files(path):
        with open(os.path.join(path, rel)) as f:
            out[rel] = f.read()
    return out


def _safe_rel(rel: str) -> str:
    if not isinstance(rel, str) or not rel or os.path.isabs(rel) or ".." in rel.replace("\\", "/").split("/"):
        raise EditError(f"file {rel!r}: expected a relative path inside the implementation")
    if rel == MANIFEST:
        raise EditError(f"{MANIFEST} is written by the search (name, parents, hash); do not edit it")
    return rel.replace("\\", "/")


def apply_edits(files: dict[str, str], edits: list[dict[str, Any]]) -> dict[str, str]:
    """Apply edits to a copy of ``files``. Each SEARCH text must occur exactly once."""
    out = dict(files)
    for i, e in enumerate(edits):
        op = e.get("op", "replace")
        rel = _safe_rel(e.get("file", ""))
        where = f"edit {i + 1} ({rel})"
        if op == "replace":
            if rel not in out:
                raise EditError(f"{where}: no such file; files are {sorted(out)}")
            search, repl = e.get("search"), e.get("replace")
            if not isinstance(search, str) or not isinstance(repl, str) or not search:
                raise EditError(f"{where}: expected non-empty 'search' and a 'replace' string")
            n = out[rel].count(search)
            if n == 0:
                hint = _closest(out[rel], search)
                raise EditError(f"{where}: SEARCH text not found{hint}")
            if n > 1:
                raise EditError(f"{where}: SEARCH text occurs {n} times; include more context to make it unique")
            out[rel] = out[rel].replace(search, repl, 1)
        elif op == "write":
            content = e.get("content")
            if not isinstance(content, str):
                raise EditError(f"{where}: expected 'content'")
            out[rel] = content
        elif op == "delete":
            if rel not in out:
                raise EditError(f"{where}: no such file")
            del out[rel]
        else:
            raise EditError(f"{where}: unknown op {op!r}; expected replace, write or delete")
    for rel, text in out.items():
        if rel.endswith(".py"):
            try:
                ast.parse(text, filename=rel)
            except SyntaxError as ex:  # refused before anything is written; the driver may retry
                raise EditError(f"{rel}: the edited file is not valid Python ({ex.msg} at line {ex.lineno})") from None
    return out


def _closest(text: str, search: str) -> str:
    first = search.strip().splitlines()[0].strip() if search.strip() else ""
    if not first:
        return ""
    lines = [ln.strip() for ln in text.splitlines()]
    m = difflib.get_close_matches(first, lines, n=1, cutoff=0.6)
    return f" (closest line to its first line: {m[0]!r})" if m else ""


def diff_files(old: dict[str, str], new: dict[str, str]) -> str:
    chunks = []
    for rel in sorted(set(old) | set(new)):
        a, b = old.get(rel), new.get(rel)
        if a == b:
            continue
        chunks.extend(difflib.unified_diff(
            (a or "").splitlines(keepends=True), (b or "").splitlines(keepends=True),
            fromfile=f"a/{rel}" if a is not None else "/dev/null", tofile=f"b/{rel}" if b is not None else "/dev/null"))
    return "".join(chunks)


def changed_files(old: dict[str, str], new: dict[str, str]) -> list[str]:
    return sorted(r for r in set(old) | set(new) if old.get(r) != new.get(r))


def edits_from_dirs(parent_files: dict[str, str], new_files: dict[str, str]) -> list[dict[str, Any]]:
    """Whole-file edits that turn ``parent_files`` into ``new_files`` (used by ``--from-dir``)."""
    edits = []
    for rel in changed_files(parent_files, new_files):
        if rel in new_files:
            edits.append({"op": "write", "file": rel, "content": new_files[rel]})
        else:
            edits.append({"op": "delete", "file": rel})
    return edits


# ------------------------------------------------------------------------------------------------
# SEARCH/REPLACE text format (LLM driver, agent edits files)
# ------------------------------------------------------------------------------------------------
_BLOCK = re.compile(
    r"^(?:FILE|File|file):\s*`?(?P<file>[^\n`]+?)`?\s*\n"
    r"(?:```[^\n]*\n)?"
    r"<<<<<<< SEARCH[ \t]*\n(?P<search>.*?)\n?=======[ \t]*\n(?P<replace>.*?)\n?>>>>>>> REPLACE[ \t]*$",
    re.S | re.M,
)


def parse_search_replace(text: str) -> list[dict[str, Any]]:
    """Parse blocks of the form::

        FILE: attention.py
        <<<<<<< SEARCH
        exact old lines
        =======
        new lines
        >>>>>>> REPLACE
    """
    edits = []
    for m in _BLOCK.finditer(text):
        search = m.group("search")
        repl = m.group("replace")
        edits.append({"op": "replace", "file": m.group("file").strip(), "search": search + "\n" if search else "",
                      "replace": repl + "\n" if repl else ""})
    n_markers = text.count("<<<<<<< SEARCH")
    if n_markers != len(edits):
        raise EditError(f"found {n_markers} '<<<<<<< SEARCH' markers but parsed {len(edits)} complete blocks; "
                        "every block needs 'FILE: <path>' on the line before it, then SEARCH, '=======', "
                        "REPLACE and '>>>>>>> REPLACE'")
    return edits


# ------------------------------------------------------------------------------------------------
# knobs
# ------------------------------------------------------------------------------------------------
@dataclass
class Knob:
    name: str
    coupled: bool
    file: str                  # file holding the constant
    choices: tuple             # allowed values, in order
    value: Any                 # current effective value
    dict_key: str | None       # per-device dict entry edited, if the constant is a dict


def _module_assigns(tree: ast.Module) -> dict[str, ast.Assign]:
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            out[node.targets[0].id] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            out[node.target.id] = node  # type: ignore[assignment]
    return out


def _literal(node: ast.AST | None) -> Any:
    try:
        return ast.literal_eval(node)  # type: ignore[arg-type]
    except Exception:
        return None


def _dict_entry(node: ast.AST, key: str) -> ast.AST | None:
    if isinstance(node, ast.Dict):
        for k, v in zip(node.keys, node.values):
            if isinstance(k, ast.Constant) and k.value == key:
                return v
    return None


def discover_knobs(files: dict[str, str], knob_key: str = "gpu", modules: list[str] | None = None) -> dict[str, Knob]:
    """Knobs declared by the implementation's modules (``KNOBS`` dicts) with current values.

    ``modules``: only these module files (e.g. ``["attention.py"]``, the modules behind the spec's
    entry points); default every module.
    """
    contract_rel = next((r for r in files if os.path.basename(r) == "contract.py"), None)
    contract_assigns: dict[str, ast.Assign] = {}
    coupled_choices: dict[str, tuple] = {}
    if contract_rel:
        ctree = ast.parse(files[contract_rel])
        contract_assigns = _module_assigns(ctree)
        if "COUPLED" in contract_assigns:
            lit = _literal(contract_assigns["COUPLED"].value)
            if isinstance(lit, dict):
                coupled_choices = {k: tuple(v) for k, v in lit.items()}
        for node in ctree.body:  # COUPLED.update({...}) sections
            if (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
                    and isinstance(node.value.func, ast.Attribute) and node.value.func.attr == "update"
                    and isinstance(node.value.func.value, ast.Name) and node.value.func.value.id == "COUPLED"
                    and node.value.args):
                lit = _literal(node.value.args[0])
                if isinstance(lit, dict):
                    coupled_choices.update({k: tuple(v) for k, v in lit.items()})
    knobs: dict[str, Knob] = {}
    for rel in sorted(files):
        if not rel.endswith(".py") or (modules is not None and rel not in modules):
            continue
        try:
            tree = ast.parse(files[rel])
        except SyntaxError:
            continue
        assigns = _module_assigns(tree)
        node = assigns.get("KNOBS")
        if node is None or not isinstance(node.value, ast.Dict):
            continue
        for k, v in zip(node.value.keys, node.value.values):
            if not isinstance(k, ast.Constant):
                continue
            if k.value == "coupled" and isinstance(v, ast.Dict):
                for ck, cv in zip(v.keys, v.values):
                    if not isinstance(ck, ast.Constant):
                        continue
                    name = ck.value
                    choices = coupled_choices.get(name)
                    if choices is None:
                        choices = _literal(cv) if isinstance(_literal(cv), (tuple, list)) else None
                    if choices is None or not contract_rel or name not in contract_assigns:
                        continue
                    value = _literal(contract_assigns[name].value)
                    knobs[name] = Knob(name, True, contract_rel, tuple(choices), value, None)
            elif k.value == "free" and isinstance(v, ast.Dict):
                for fk, fv in zip(v.keys, v.values):
                    if not isinstance(fk, ast.Constant):
                        continue
                    name = fk.value
                    choices = _literal(fv)
                    if not isinstance(choices, (tuple, list)) or name not in assigns:
                        continue
                    raw = assigns[name].value
                    dict_key = None
                    if isinstance(raw, ast.Dict):
                        if _dict_entry(raw, knob_key) is None:
                            continue
                        dict_key = knob_key
                        value = _literal(_dict_entry(raw, knob_key))
                    else:
                        value = _literal(raw)
                    knobs[name] = Knob(name, False, rel, tuple(choices), value, dict_key)
    return knobs


def knob_values(files: dict[str, str], knob_key: str = "gpu", modules: list[str] | None = None) -> dict[str, Any]:
    return {n: k.value for n, k in discover_knobs(files, knob_key, modules).items()}


def entry_modules(manifest: dict[str, Any], entry_points: list[str]) -> list[str]:
    """Module files behind the given entry points (``"attention.prefill": "attention:prefill"``)."""
    out = []
    for ep in entry_points:
        target = manifest.get("entry_points", {}).get(ep)
        if target:
            rel = target.split(":", 1)[0].replace(".", "/") + ".py"
            if rel not in out:
                out.append(rel)
    return out


def select_knobs(knobs: dict[str, Knob], spec: dict[str, Any]) -> dict[str, Knob]:
    """Apply the spec's ``knobs.include`` / ``knobs.exclude`` fnmatch patterns."""
    import fnmatch

    cfg = spec.get("knobs") or {}
    inc = cfg.get("include")
    exc = cfg.get("exclude") or []
    out = {}
    for n, k in knobs.items():
        if inc and not any(fnmatch.fnmatchcase(n, p) for p in inc):
            continue
        if any(fnmatch.fnmatchcase(n, p) for p in exc):
            continue
        out[n] = k
    return out


def knob_edit(files: dict[str, str], knob: Knob, value: Any) -> dict[str, Any]:
    """A SEARCH/REPLACE edit that sets ``knob`` to ``value`` (the whole statement is the SEARCH text)."""
    text = files[knob.file]
    tree = ast.parse(text)
    node = _module_assigns(tree).get(knob.name)
    if node is None:
        raise EditError(f"{knob.file}: no top-level assignment of {knob.name}")
    lines = text.splitlines(keepends=True)
    stmt = "".join(lines[node.lineno - 1: node.end_lineno])  # type: ignore[operator]
    target = node.value
    if knob.dict_key is not None:
        target = _dict_entry(node.value, knob.dict_key)
        if target is None:
            raise EditError(f"{knob.file}: {knob.name} has no entry {knob.dict_key!r}")
    seg = ast.get_source_segment(text, target)
    if seg is None:
        raise EditError(f"{knob.file}: cannot locate the value of {knob.name}")
    # offsets of the value inside the statement text
    stmt_start = sum(len(ln) for ln in lines[: node.lineno - 1])
    abs_start = sum(len(ln) for ln in lines[: target.lineno - 1]) + _col(lines[target.lineno - 1], target.col_offset)
    abs_end = sum(len(ln) for ln in lines[: target.end_lineno - 1]) + _col(lines[target.end_lineno - 1], target.end_col_offset)  # type: ignore[operator]
    new_stmt = stmt[: abs_start - stmt_start] + repr(value) + stmt[abs_end - stmt_start:]
    if text.count(stmt) != 1:
        raise EditError(f"{knob.file}: the statement setting {knob.name} is not unique")
    return {"op": "replace", "file": knob.file, "search": stmt, "replace": new_stmt}


def _col(line: str, byte_col: int) -> int:
    """ast column offsets are UTF-8 byte offsets; convert to a character offset."""
    return len(line.encode()[:byte_col].decode(errors="ignore"))


def knob_scope(name: str, coupled: bool, spec: dict[str, Any]) -> list[str]:
    """Entry points a knob can affect: every entry point for a coupled knob, else by the spec's
    ``knobs.scope`` prefix table (a knob without a matching prefix affects every entry point)."""
    eps = list(spec["entry_points"])
    if coupled:
        return eps
    scope = (spec.get("knobs") or {}).get("scope") or {}
    for prefix in sorted(scope, key=len, reverse=True):
        if name.startswith(prefix):
            return [e for e in scope[prefix] if e in spec["entry_points"]]
    return eps
