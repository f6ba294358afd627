"""The agent plans for the decode spec (benchmarks/search_plans/h200_decode and its par/, tp/ and prefetch/ plans): the plan files are what gen_plan.py
writes, the plan driver accepts them, every opportunity names workloads of the run's (quick) spec and the decode
entry point, every step has a branch for each outcome, every step's edit chain applies to kernels/tik_v2 and
changes attention.py only, and no chain touches what prefill / extend compile or the shared softmax / merge
helpers (the steps are decode-only by construction). Text only; the interpreter bit checks are bits_vs_root.py
(cpu_checks.log), the sm_90 compile is compile_plan.py (compile_sm90.json)."""

from __future__ import annotations

import ast
import importlib.util

import pytest
import yaml

from tests.helpers.scripts import ROOT

BASE = ROOT / "benchmarks" / "search_plans" / "h200_decode"
# plan folder -> functions of attention.py its steps must leave as they are in tik_v2. The par/ and tp/ steps
# split _online_step's body into a callee (_online_update / _tile_p) that their decode paths also call, so
# _online_step's source changes there while prefill / extend inline the same instructions (bits_vs_root.py
# and the GPU suites check the bits).
SHARED = ("_online_step", "_merge", "_kv_offsets", "_fwd_tiles", "_attn_fwd_kernel", "_ws_state", "_merge_splits",
          "_attn_decode_merge_kernel", "_fwd", "prefill", "extend")
DIRS = {"": SHARED, "par": SHARED[1:], "tp": SHARED[1:], "prefetch": SHARED}
CASES = [(d, n, s) for d in DIRS for n, s in (("plan", "h200_decode"), ("cpu_plan", "cpu_decode_smoke"))]


def _gen(here):
    spec = importlib.util.spec_from_file_location(f"_decode_gen_plan_{here.name}", here / "gen_plan.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _lineage(plan, key):
    spec = importlib.util.spec_from_file_location("_decode_mat", BASE.parent / "h200_attention" / "materialize.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.lineage(plan, key)


def _functions(src):
    tree = ast.parse(src)
    return {n.name: ast.get_source_segment(src, n) for n in tree.body if isinstance(n, ast.FunctionDef)}


@pytest.mark.parametrize("folder,name,spec", CASES)
def test_decode_plan_is_generated_valid_and_names_its_spec(tmp_path, folder, name, spec):
    from areal_tik_plugin.search import spec as S
    from areal_tik_plugin.search.drivers.plan import PlanDriver

    HERE = BASE / folder
    gen = _gen(HERE)
    out = tmp_path / f"{name}.yaml"
    gen.write(str(out), gen.H200_TW if name == "plan" else gen.CPU_TW)
    assert out.read_text() == (HERE / f"{name}.yaml").read_text(), "re-run gen_plan.py"
    PlanDriver(str(HERE / f"{name}.yaml"))  # fields, keys, edit files, branch decisions
    plan = yaml.safe_load((HERE / f"{name}.yaml").read_text())
    assert plan["root"] == "tik_v2"
    frozen = S.freeze(S.load(str(ROOT / "search" / "specs" / f"{spec}.yaml")), quick=True)
    names = {w["name"] for w in frozen["workloads"]}
    opps = list(plan["initial"]["opportunities"])
    for s in plan["steps"]:
        assert {"on_promoted", "on_verified", "on_slower", "on_failed"} <= set(s), s["opportunity"]
        assert s["kind"] == "decode"
        for b in ("on_promoted", "on_verified", "on_slower", "on_failed"):
            opps += s[b].get("opportunities") or []
    for o in opps:
        assert set(o["target_workloads"]) <= names and o["entry_points"] == ["attention.decode"], o["key"]


@pytest.mark.parametrize("folder", list(DIRS))
def test_decode_plan_chains_apply_to_tik_v2_and_change_decode_only(folder):
    from areal_tik_plugin.search import edits as E

    HERE = BASE / folder
    plan = yaml.safe_load((HERE / "plan.yaml").read_text())
    base = E.read_files(str(ROOT / "kernels" / "tik_v2"))
    base_fns = _functions(base["attention.py"])
    for chain in {tuple(_lineage(plan, s["opportunity"])) for s in plan["steps"]}:
        files = dict(base)
        for e in chain:
            files = E.apply_edits(files, E.parse_search_replace((HERE / e).read_text()))
        assert set(files) == set(base) and [f for f in files if files[f] != base[f]] == ["attention.py"], chain
        fns = _functions(files["attention.py"])
        for f in DIRS[folder]:
            assert fns[f] == base_fns[f], (chain, f)
        assert fns["_attn_decode_kernel"] != base_fns["_attn_decode_kernel"] or fns["decode"] != base_fns["decode"]
