"""Build a candidate tree for the CPU checks of the plan: the root implementation folder with a chain of
SEARCH/REPLACE edit files applied in order (what the search builds for a chained plan step).

Usage:
  python benchmarks/search_plans/h200_attention/materialize.py OUT_DIR EDITS [EDITS ...]
  python benchmarks/search_plans/h200_attention/materialize.py OUT_DIR --step KEY [--plan plan.yaml]
(root: kernels/tik_v1, or the folder in $TIK_PLAN_ROOT, e.g. kernels/tik_v2 for next/plan.yaml; OUT_DIR is
replaced; --step applies the edits of KEY's lineage in the plan).
"""

from __future__ import annotations

import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.environ.get("TIK_PLAN_ROOT") or os.path.join(HERE, "..", "..", "..", "kernels", "tik_v1")


def lineage(plan: dict, key: str) -> list[str]:
    """Edit files (relative to the plan folder) from the root to step ``key``, parents first."""
    by_key = {s["opportunity"]: s for s in plan["steps"]}
    out = []
    while key != "root":
        s = by_key[key]
        out.append(s["edits"])
        (key,) = s["parents"]
    return out[::-1]


def build(chain: list[str], root: str | None = None) -> dict[str, str]:
    """The files of ``root`` (default ROOT) with the edit files of ``chain`` applied in order."""
    from areal_tik_plugin.search import edits as E

    files = E.read_files(root or ROOT)
    for p in chain:
        with open(p) as f:
            files = E.apply_edits(files, E.parse_search_replace(f.read()))
    return files


def write(files: dict[str, str], out: str) -> None:
    """``files`` as the tree ``out`` (replaced)."""
    shutil.rmtree(out, ignore_errors=True)
    for rel, text in files.items():
        dst = os.path.join(out, rel)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        with open(dst, "w") as f:
            f.write(text)


def main(argv: list[str]) -> int:
    out, rest = argv[0], argv[1:]
    if rest and rest[0] == "--step":
        import yaml

        plan_path = rest[3] if len(rest) > 3 and rest[2] == "--plan" else os.path.join(HERE, "plan.yaml")
        with open(plan_path) as f:
            plan = yaml.safe_load(f)
        rest = [os.path.join(os.path.dirname(plan_path), e) for e in lineage(plan, rest[1])]
    write(build(rest), out)
    print(f"{out}: root + {len(rest)} edit file(s): {', '.join(os.path.basename(r) for r in rest) or '-'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
