"""The Gluon GEMM's device call (benchmarks/gpu_gemm_gluon.sh) and its probe's arguments, on the CPU."""

from __future__ import annotations

import os
import subprocess

import pytest

from areal_tik_plugin.runtime import loader
from tests.helpers.scripts import ROOT, load_script


def test_probe_arguments_and_plans():
    probe = load_script("gluon_gemm_probe")
    assert probe.parse_ms("65, 256,1024") == [65, 256, 1024]
    for bad in ("", "0", "12,x", "-3"):
        with pytest.raises(ValueError, match="comma list of positive integers"):
            probe.parse_ms(bad)
    g = loader.load_implementation(os.path.join(ROOT, "kernels", "tik_v7")).module("gemm_gluon")
    ps = probe.plans(g)
    assert len(ps) == 2 * len(g.BLOCK_NS) and len({(p["BLOCK_N"], p["split"]) for p in ps}) == len(ps)
    assert probe.plans(g, 64) == ps == probe.plans(g, 256)
    p128 = probe.plans(g, 128)   # 64-row tiles too, where 128-row ones leave SMs idle
    assert len(p128) == 2 * len(ps) and {p["halves"] for p in p128} == {None, 1}
    assert {probe.plan_name(g.plan(128, 4096, 12288, 2048, 132, dict(p))) for p in p128 if not p["split"]} >= {
        "m64_n64_fused_s12", "m128_n64_fused_s8"}
    assert probe.plan_config({"name": "x"}, p128[-1])["gluon"]["halves"] == 1
    assert probe.plans(g, 256, 256) == p128 != probe.plans(g, 257, 256)   # --halves-1-up-to widens the band
    names = {probe.plan_name(g.plan(256, 4096, 12288, 2048, 132, dict(p, BLOCK_N=min(p["BLOCK_N"], 128)))) for p in ps}
    assert names == {"m128_n128_split_s6", "m128_n128_fused_s6", "m128_n64_split_s8", "m128_n64_fused_s8"}
    assert probe.plan_name(g.plan(64, 4096, 12288, 2048, 132, g.config(BLOCK_N=64, split=1))) == "m64_n64_split_s12"


def test_device_script_steps_and_refusals():
    sh = os.path.join(ROOT, "benchmarks", "gpu_gemm_gluon.sh")
    r = subprocess.run(["bash", sh, "--dry-run", "--impl", "tik_v7", "--probe-s", "90", "--contract-s", "260"],
                       capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 3 and "--guard-s 120" in lines[0] and lines[0].startswith("+ timeout 90 env TIK_IMPLEMENTATION=tik_v7 python3 -m "
                                                   "benchmarks.probes.gluon_gemm_probe")
    assert "--ops gemm --no-bench" in lines[1] and "tma_host_probe --only attention" in lines[2]
    r = subprocess.run(["bash", sh, "--dry-run"], capture_output=True, text=True, cwd=ROOT, timeout=60)
    lines = r.stdout.splitlines()   # the contract step only when asked for
    assert len(lines) == 2 and lines[0].startswith("+ timeout 300 ") and "tma_host_probe" in lines[1]
    for args, msg in ((["--bogus"], "unknown option --bogus"), (["--probe-s", "1m"], "whole seconds"),
                      (["--impl"], "--impl needs a value")):
        r = subprocess.run(["bash", sh, *args], capture_output=True, text=True, cwd=ROOT, timeout=60)
        assert r.returncode == 2 and msg in r.stderr, (args, r.stderr)


@pytest.mark.parametrize("name,spec", [("plan", "h200_gemm"), ("cpu_plan", "cpu_gemm_smoke"),
                                       ("rule_plan", "h200_gemm"), ("cpu_rule_plan", "cpu_gemm_smoke")])
def test_search_plan_is_generated_valid_and_builds_tik_v7(tmp_path, name, spec):
    """benchmarks/search_plans/h200_gemm/gluon: the plan files are what gen_plan.py writes, the plan driver accepts
    them, their workloads are names of their spec, the first step's tree is kernels/tik_v7's source and each knob
    edit applies to it (one line of gemm_gluon.py)."""
    import importlib.util
    import pathlib

    import yaml

    from areal_tik_plugin.search import edits as E
    from areal_tik_plugin.search.drivers.plan import PlanDriver

    here = pathlib.Path(ROOT) / "benchmarks" / "search_plans" / "h200_gemm" / "gluon"
    spec_ = importlib.util.spec_from_file_location("_gluon_gemm_gen_plan", here / "gen_plan.py")
    gen = importlib.util.module_from_spec(spec_)
    spec_.loader.exec_module(gen)
    out = tmp_path / f"{name}.yaml"
    gen.write(str(out), gen.CPU_TW if name.startswith("cpu") else gen.H200_TW + gen.SMALL_TW,
              gen.rule_plan if "rule" in name else gen.plan)
    assert out.read_text() == (here / f"{name}.yaml").read_text(), "re-run gen_plan.py"
    PlanDriver(str(here / f"{name}.yaml"))
    plan = yaml.safe_load((here / f"{name}.yaml").read_text())
    sp = yaml.safe_load((pathlib.Path(ROOT) / "search" / "specs" / f"{spec}.yaml").read_text())
    names = {w["name"] for w in sp["workloads"]}
    opps = list(plan["initial"]["opportunities"])
    for s in plan["steps"]:
        for b in ("on_promoted", "on_verified", "on_slower", "on_failed"):
            opps += s[b].get("opportunities") or []
    assert all(set(o["target_workloads"]) <= names for o in opps)
    assert plan["root"] == "tik_v6"
    v6 = E.read_files(os.path.join(ROOT, "kernels", "tik_v6"))
    v7 = E.read_files(os.path.join(ROOT, "kernels", "tik_v7"))
    first = plan["steps"][0]
    tree = E.read_files(str(here / first["from_dir"]))
    assert tree == v7 and E.apply_edits(v6, E.edits_from_dirs(v6, tree)) == v7
    for s in plan["steps"][1:]:
        with open(here / s["edits"]) as f:
            files = E.apply_edits(v7, E.parse_search_replace(f.read()))
        diff = sorted(r for r in files if files[r] != v7[r])
        assert diff == (["gemm.py", "gemm_gluon.py"] if "rule" in name else ["gemm_gluon.py"]), s["opportunity"]


def test_rule_edit_hands_the_gluon_kernel_only_the_shapes_it_won(tmp_path):
    """The rule step's tree (tik_v7 + edits/rule.edits): config_for marks Gluon exactly the probe's winning shapes
    (Qwen3-4B / 8B o and down, K >= 4096, at M 33..64 on 64-row tiles and 129..256 on 128-row ones, unsplit
    BLOCK_N 64), every other shape keeps its Triton configuration."""
    import pathlib
    import shutil

    from areal_tik_plugin.search import edits as E

    here = pathlib.Path(ROOT) / "benchmarks" / "search_plans" / "h200_gemm" / "gluon"
    src = os.path.join(ROOT, "kernels", "tik_v7")
    v7 = E.read_files(src)
    files = E.apply_edits(v7, E.parse_search_replace((here / "edits" / "rule.edits").read_text()))
    tree = tmp_path / "tik_rule"
    shutil.copytree(src, tree)
    for rel in E.changed_files(v7, files):
        (tree / rel).write_text(files[rel])
    loader.write_manifest_hash(str(tree))   # as the search stamps a materialized candidate
    gemm = loader.load_implementation(str(tree)).module("gemm")
    shapes = {"4b_qkv": (6144, 2560), "4b_o": (2560, 4096), "4b_gate_up": (19456, 2560), "4b_down": (2560, 9728),
              "8b_qkv": (6144, 4096), "8b_o": (4096, 4096), "8b_gate_up": (24576, 4096), "8b_down": (4096, 12288),
              "1p5b_down": (1536, 8960), "30b_o": (2048, 4096)}
    for M in (1, 32, 33, 64, 65, 128, 129, 256, 257, 1024):
        got = {k: c["name"] for k, (N, K) in shapes.items() if "gluon" in (c := gemm.config_for(M, N, K, 132))}
        rows = 64 if M <= 64 else 128
        want = ({k: f"gluon_ws_m{rows}_n64_fused_s{12 if rows == 64 else 8}" for k in ("4b_o", "4b_down", "8b_o",
                                                                                        "8b_down")}
                if 33 <= M <= 64 or 129 <= M <= 256 else {})
        assert got == want, M


def test_oob_probe_pads_to_whole_tiles_and_refuses_bad_input(capsys):
    """The ragged-M probe (benchmarks/probes/gluon_gemm_oob_probe.py): its descriptor rows are whole tiles of the
    plan's rows covering M, and a bad --m / --shapes is refused with what was expected (before any GPU work)."""
    import pytest

    from benchmarks.probes import gluon_gemm_oob_probe as P

    assert [P.padded_rows(M, 1) for M in (1, 33, 64, 65, 96, 128)] == [64, 64, 64, 128, 128, 128]
    assert [P.padded_rows(M, 2) for M in (129, 160, 200, 255, 256)] == [256] * 5
    for argv, msg in ((["--out", "x", "--m", "0"], "--m: expected a comma list of positive integers"),
                      (["--out", "x", "--shapes", "qwen3-4b:nope"], "--shapes: expected model:layer from")):
        with pytest.raises(SystemExit):
            P.main(argv)
        assert msg in capsys.readouterr().err
