"""The agent plan for the H200 attention search (benchmarks/search_plans/h200_attention): the plan files
are what gen_plan.py writes, the plan driver accepts them, every step's workloads are names of its spec,
every step's edit chain applies to the root, and the TMA candidate compiles for sm_90 without spills."""

from __future__ import annotations

import importlib.util
import os

import pytest
import yaml

from tests.helpers.scripts import ROOT, ptxas_available, run_script

PLAN_DIR = ROOT / "benchmarks" / "search_plans" / "h200_attention"


def _load(name):
    spec = importlib.util.spec_from_file_location(f"_plan_{name}", PLAN_DIR / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _plan(name):
    with open(PLAN_DIR / f"{name}.yaml") as f:
        return yaml.safe_load(f)


def _opps(plan):
    yield from plan["initial"]["opportunities"]
    for s in plan["steps"]:
        for b in ("on_promoted", "on_verified", "on_failed"):
            yield from s.get(b, {}).get("opportunities") or []


@pytest.mark.parametrize("name,spec,first", [("plan", "h200_attention", "tma"),
                                              ("cpu_plan", "cpu_attention_smoke", "tma"),
                                              ("cpu_plan_tma2d", "cpu_attention_smoke", "tma2d")])
def test_plan_is_generated_valid_and_names_spec_workloads(tmp_path, name, spec, first):
    from areal_tik_plugin.search.drivers.plan import PlanDriver

    gen = _load("gen_plan")
    out = tmp_path / f"{name}.yaml"
    gen.write(str(out), gen.H200_PREFILL + gen.H200_TRAIN if name == "plan" else gen.CPU_PREFILL, first=first)
    assert out.read_text() == (PLAN_DIR / f"{name}.yaml").read_text(), "re-run gen_plan.py"
    PlanDriver(str(PLAN_DIR / f"{name}.yaml"))  # validates fields, keys, edit files, branch decisions
    with open(ROOT / "search" / "specs" / f"{spec}.yaml") as f:
        sp = yaml.safe_load(f)
    names, entries = {w["name"] for w in sp["workloads"]}, set(sp["entry_points"])
    for o in _opps(_plan(name)):
        assert set(o["target_workloads"]) <= names and set(o["entry_points"]) <= entries, o["key"]


def test_every_step_edit_chain_applies_to_the_root():
    mat, plan = _load("materialize"), _plan("plan")
    root = mat.build([])
    for s in plan["steps"]:
        chain = mat.lineage(plan, s["opportunity"])
        files = mat.build([str(PLAN_DIR / e) for e in chain])
        assert files["attention.py"] != root["attention.py"], s["opportunity"]
        assert set(files) == set(root)  # no file added or removed
    # no step of the plan keeps the root's pointer loads in prefill (those trees spill: compile_sm90.json)
    assert all(mat.lineage(plan, s["opportunity"])[0].startswith(("edits/tma_kv", "edits/tma2d_kv"))
               for s in plan["steps"])


@pytest.mark.skipif(not ptxas_available(), reason="triton's bundled ptxas not found")
def test_tma_candidate_prefill_compiles_for_sm90_without_spills(tmp_path):
    mat = _load("materialize")
    assert mat.main([str(tmp_path / "tma"), str(PLAN_DIR / "edits" / "tma_kv.edits")]) == 0
    r = run_script("compile_attention_sm90", "--impl", str(tmp_path / "tma"), "--only", "prefill",
                   "--json", str(tmp_path / "c.json"), timeout=900)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    import json

    k = json.load(open(tmp_path / "c.json"))["implementations"][str(tmp_path / "tma")]["kernels"]
    facts = k["prefill/_attn_fwd_kernel"]
    assert facts["loads"] == "tma" and facts["spill_bytes"] == 0 and facts["mma"] == "wgmma"
