"""The next device call's agent plans (benchmarks/search_plans/{h200_attention,h200_gemm}/next): the plan files are
what their gen_plan.py writes, the plan driver accepts them, their workloads are names of their spec, every step
has a branch for a verified regression (on_slower), and every step's edit chain applies to the plan's root
(attention: kernels/tik_v2, GEMM: kernels/tik_v1). Text only: no interpreter, no compiler."""

from __future__ import annotations

import importlib.util

import pytest
import yaml

from tests.helpers.scripts import ROOT

PLANS = ROOT / "benchmarks" / "search_plans"
CASES = [("h200_attention", "plan", "h200_attention", "tik_v2", "attention.py"),
         ("h200_attention", "cpu_plan", "cpu_attention_smoke", "tik_v2", "attention.py"),
         ("h200_gemm", "plan", "h200_gemm", "tik_v1", "gemm.py"),
         ("h200_gemm", "cpu_plan", "cpu_gemm_smoke", "tik_v1", "gemm.py")]


def _load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("folder,name,spec,root,src", CASES)
def test_next_plan_is_generated_valid_and_applies_to_its_root(tmp_path, folder, name, spec, root, src):
    from areal_tik_plugin.search.drivers.plan import PlanDriver

    here = PLANS / folder / "next"
    gen = _load(here / "gen_plan.py", f"_next_gen_{folder}")
    out = tmp_path / f"{name}.yaml"
    if folder == "h200_attention":
        gen.write(str(out), gen.H200_PREFILL + gen.H200_TRAIN if name == "plan" else gen.CPU_PREFILL)
    else:
        gen.write(str(out), gen.H200_TW if name == "plan" else {k: gen.CPU_TW for k in gen.H200_TW})
    assert out.read_text() == (here / f"{name}.yaml").read_text(), "re-run gen_plan.py"
    PlanDriver(str(here / f"{name}.yaml"))  # validates fields, keys, edit files, branch decisions
    plan = yaml.safe_load((here / f"{name}.yaml").read_text())
    sp = yaml.safe_load((ROOT / "search" / "specs" / f"{spec}.yaml").read_text())
    names, entries = {w["name"] for w in sp["workloads"]}, set(sp["entry_points"])
    opps = list(plan["initial"]["opportunities"])
    for s in plan["steps"]:
        assert {"on_promoted", "on_verified", "on_slower", "on_failed"} <= set(s), s["opportunity"]
        for b in ("on_promoted", "on_verified", "on_slower", "on_failed"):
            opps += s[b].get("opportunities") or []
    for o in opps:
        assert set(o["target_workloads"]) <= names and set(o["entry_points"]) <= entries, o["key"]
    if name == "cpu_plan":
        return  # the same edit chains as plan.yaml (one generator; the comparison above holds it)
    mat = _load(PLANS / "h200_attention" / "materialize.py", f"_next_mat_{folder}")
    mat.ROOT = str(ROOT / "kernels" / root)
    base = mat.build([])
    for chain in {tuple(mat.lineage(plan, s["opportunity"])) for s in plan["steps"]}:
        files = mat.build([str(here / e) for e in chain])
        assert files[src] != base[src] and set(files) == set(base), chain


@pytest.mark.parametrize("name,spec", [("plan", "h200_attention"), ("cpu_plan", "cpu_attention_smoke")])
def test_wsp_plan_is_generated_valid_and_builds_tik_v6(tmp_path, name, spec):
    """benchmarks/search_plans/h200_attention/wsp (root kernels/tik_v5): the edit files and plans are what
    gen_plan.py writes from the two folders, the driver accepts the plans, and the first step's tree is
    kernels/tik_v6's source byte for byte (every other step moves one knob of it)."""
    import re

    from areal_tik_plugin.search.drivers.plan import PlanDriver

    here = PLANS / "h200_attention" / "wsp"
    gen = _load(here / "gen_plan.py", "_wsp_gen")
    out = tmp_path / f"{name}.yaml"
    gen.write(str(out), gen.H200_PREFILL + gen.H200_TRAIN if name == "plan" else gen.CPU_PREFILL)
    assert out.read_text() == (here / f"{name}.yaml").read_text(), "re-run gen_plan.py"
    v5 = (ROOT / "kernels" / "tik_v5" / "attention_gluon.py").read_text()
    v6 = (ROOT / "kernels" / "tik_v6" / "attention_gluon.py").read_text()
    assert (here / "edits" / "wsp.edits").read_text() == gen.blocks(v5, v6) + gen.other_blocks(), "re-run gen_plan.py"
    PlanDriver(str(here / f"{name}.yaml"))
    plan = yaml.safe_load((here / f"{name}.yaml").read_text())
    sp = yaml.safe_load((ROOT / "search" / "specs" / f"{spec}.yaml").read_text())
    names = {w["name"] for w in sp["workloads"]}
    for s in plan["steps"]:
        for b in ("on_promoted", "on_verified", "on_slower", "on_failed"):
            for o in s[b].get("opportunities") or []:
                assert set(o["target_workloads"]) <= names, o["key"]
    mat = _load(PLANS / "h200_attention" / "materialize.py", "_wsp_mat")
    mat.ROOT = str(ROOT / "kernels" / "tik_v5")
    base = mat.build([])
    knobs = set()
    for s in plan["steps"]:
        files = mat.build([str(here / e) for e in mat.lineage(plan, s["opportunity"])])
        assert set(files) == set(base) and all(files[f] == base[f] for f in base
                                               if f not in ("attention_gluon.py", "attention.py"))
        assert files["attention.py"] == (ROOT / "kernels" / "tik_v6" / "attention.py").read_text()
        g = files["attention_gluon.py"]
        if s["opportunity"] == "wsp":
            assert g == v6
        knobs.add(tuple(re.findall(r"^(?:PERSIST|PP) = (\d)", g, re.M)))
    assert knobs == {("2", "1"), ("2", "0"), ("1", "0"), ("1", "1"), ("0", "1")}
