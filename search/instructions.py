"""Per-path instruction evidence from the sources: which Triton math instructions each entry point's
kernels execute, and the contract rule that paths sharing numerics keep sharing them.

For every entry point the spec names, the host function (``module:function`` from the manifest) is
followed through the module-level functions it calls; every ``@triton.jit`` function it references
(launched with ``kernel[grid](...)`` or ``launch(kernel, ...)``) and, transitively, every jit helper
those call form the path's kernels. The path's instructions are the ``tl.*`` / ``libdevice`` calls
of the instruction families below: the families of the contract's coupled constants whose values are
instruction names (``LOGPROB_EXP: ("exp", "exp2")``, read from the candidate's ``contract.COUPLED``,
so a new instruction-valued constant is covered without an edit here) plus the fixed ones.

Rule (:func:`check`): two entry points of one module that use the same set of a family in the root
must use the same set in the candidate. A coupled change (every path exp2 -> exp) keeps the sets equal
and passes; an exp2 -> exp in the decode path only makes decode's set differ from prefill's and is a
``contract_violation`` before anything runs -- the sampled bitwise rows need not reach it.
"""

from __future__ import annotations

import ast
import os
from typing import Any

BASE_FAMILIES = {
    "exp": ("exp", "exp2"),
    "log": ("log", "log2", "log1p"),
    "sqrt": ("sqrt", "sqrt_rn", "rsqrt"),
    "div": ("div_rn", "fdiv", "div"),
    "fma": ("fma",),
}


def _jit(fn: ast.FunctionDef) -> bool:
    for d in fn.decorator_list:
        d = d.func if isinstance(d, ast.Call) else d
        if isinstance(d, ast.Attribute) and d.attr in ("jit", "autotune", "heuristics"):
            return True
        if isinstance(d, ast.Name) and d.id in ("jit",):
            return True
    return False


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _instr_calls(fn: ast.FunctionDef, instr: set[str]) -> set[str]:
    out = set()
    for n in ast.walk(fn):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in instr:
            out.add(n.func.attr)
    return out


def module_paths(text: str, entries: dict[str, str], instr: set[str]) -> dict[str, set[str]]:
    """entry point -> instructions executed by its kernels (within this module's source)."""
    tree = ast.parse(text)
    funcs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    jit = {k for k, f in funcs.items() if _jit(f)}

    def reach(start: set[str], through: set[str]) -> set[str]:
        seen, todo = set(), list(start)
        while todo:
            f = todo.pop()
            if f in seen or f not in funcs:
                continue
            seen.add(f)
            todo.extend(x for x in _names(funcs[f]) if x in through)
        return seen

    out = {}
    for op, fn in entries.items():
        host = reach({fn}, set(funcs) - jit)
        kernels = {x for h in host for x in _names(funcs[h]) if x in jit}
        all_k = reach(kernels, jit)
        ins: set[str] = set()
        for k in all_k:
            ins |= _instr_calls(funcs[k], instr)
        out[op] = ins
    return out


def families(contract_text: str | None) -> dict[str, tuple[str, ...]]:
    fam = dict(BASE_FAMILIES)
    if not contract_text:
        return fam
    try:
        tree = ast.parse(contract_text)
    except SyntaxError:
        return fam
    known = {x for v in BASE_FAMILIES.values() for x in v}
    for n in ast.walk(tree):
        if isinstance(n, ast.Dict):
            for k, v in zip(n.keys, n.values):
                if isinstance(k, ast.Constant) and isinstance(v, ast.Tuple) and v.elts and all(
                        isinstance(e, ast.Constant) and isinstance(e.value, str) for e in v.elts):
                    vals = tuple(e.value for e in v.elts)
                    if any(x in known for x in vals):  # an instruction-valued coupled constant
                        fam[f"contract:{k.value}"] = vals
    return fam


def path_instructions(impl_dir: str, entry_points: dict[str, str], spec_entries) -> dict[str, dict[str, set[str]]]:
    """module -> entry point -> instructions, for the spec's entry points."""
    by_mod: dict[str, dict[str, str]] = {}
    for op, target in entry_points.items():
        if op in spec_entries:
            mod, fn = target.split(":", 1)
            by_mod.setdefault(mod, {})[op] = fn
    contract = os.path.join(impl_dir, "contract.py")
    fam = families(open(contract).read() if os.path.isfile(contract) else None)
    instr = {x for v in fam.values() for x in v}
    out = {}
    for mod, entries in by_mod.items():
        p = os.path.join(impl_dir, *mod.split(".")) + ".py"
        if os.path.isfile(p):
            with open(p) as f:
                out[mod] = module_paths(f.read(), entries, instr)
    return out


def check(root_dir: str, cand_dir: str, entry_points: dict[str, str], spec_entries) -> tuple[list[str], dict[str, Any]]:
    """Findings (path-asymmetric instruction changes) and the evidence (instructions per path)."""
    contract = os.path.join(cand_dir, "contract.py")
    fam = families(open(contract).read() if os.path.isfile(contract) else None)
    r = path_instructions(root_dir, entry_points, spec_entries)
    c = path_instructions(cand_dir, entry_points, spec_entries)
    findings = []
    for mod, paths in r.items():
        cp = c.get(mod, {})
        ops = sorted(paths)
        for name, members in fam.items():
            ms = set(members)
            for i, a in enumerate(ops):
                for b in ops[i + 1:]:
                    if paths[a] & ms == paths[b] & ms and (cp.get(a, set()) & ms) != (cp.get(b, set()) & ms):
                        findings.append(f"{mod}: {a} uses {sorted(cp.get(a, set()) & ms)} but {b} uses "
                                        f"{sorted(cp.get(b, set()) & ms)} ({name} family; equal in the root)")
    evidence = {mod: {op: sorted(v) for op, v in paths.items()} for mod, paths in c.items()}
    return findings, evidence
