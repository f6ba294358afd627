"""Search, then train: export a verified implementation, load it, refuse it without evidence on a GPU,
select it for verify and for a recipe (``tik.implementation``) -- on the CPU toy spec."""

from __future__ import annotations

import json
import os

import pytest
import yaml

from areal_tik_plugin.runtime import loader
from areal_tik_plugin.cli import main
from areal_tik_plugin.search import SPECS_DIR, TESTDATA_DIR
from areal_tik_plugin.search.export import EVIDENCE_FILE, ExportError, export, require_evidence
from areal_tik_plugin.search.state import Run

TOY = os.path.join(TESTDATA_DIR, "toy_v1")


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory):
    """A toy run with one honest promoted offspring (ROW_BLOCK 1 -> 16) and a revoked one."""
    from areal_tik_plugin.search.evaluator import Evaluator

    tmp = str(tmp_path_factory.mktemp("export"))
    with open(os.path.join(SPECS_DIR, "cpu_toy.yaml")) as f:
        s = yaml.safe_load(f)
    s["workloads"] = s["workloads"][:2]
    s["max_slowdown"] = 3.0
    sp = os.path.join(tmp, "spec.yaml")
    with open(sp, "w") as f:
        yaml.safe_dump(s, f)
    run = Run.create(os.path.join(tmp, "run"), sp, TOY)
    ev = Evaluator()
    run.initialize(ev)
    run.decide(decision="CONTINUE", interpretation="root", rationale="r",
               new_opportunities=[{"mechanism": "ROW_BLOCK", "entry_points": ["toy.full"]},
                                  {"mechanism": "STEP_BLOCK", "entry_points": ["toy.step"]}])
    run.record_action(opportunity=run.state().pending[0], parents=["I0000"], kind="full_sequence",
                      edits=[{"file": "toy.py", "search": "ROW_BLOCK = 1 ", "replace": "ROW_BLOCK = 16 "}])
    a = run.audit(ev)
    assert a.promoted, a.timing.get("ab")
    run.decide(decision="ARCHIVE", interpretation="promoted", rationale="r")
    run.close()
    return os.path.join(tmp, "run"), tmp


def test_export_then_load_and_select(toy_run, monkeypatch):
    rdir, tmp = toy_run
    dest = os.path.join(tmp, "kernels")
    assert main(["search", "export", rdir, "--name", "toy_fast", "--dest", dest]) == 0
    path = os.path.join(dest, "toy_fast")
    man = loader.read_manifest(path)
    assert man["name"] == "toy_fast" and man["parent"].endswith("I0001") and man["search"]["implementation"] == "I0001"
    assert man["evidence_required"] == "search_audit"
    run = Run.open(rdir, lock=False)
    assert man["source_hash"] == run.impls["I0001"].source_hash == loader.compute_source_hash(path)
    with open(os.path.join(path, EVIDENCE_FILE)) as f:
        lines = [json.loads(x) for x in f]
    assert lines and lines[0]["audit"]["id"] == "E0001" and lines[0]["arch"] == "cpu" and lines[0]["status"] == "ok"
    # CPU: exempt, loads and runs
    impl = loader.load_implementation(path)
    import torch

    q = torch.randn(9, 16).to(torch.bfloat16).float()
    assert impl.entry("toy.full")(q, q, q).shape == (9, 16)
    # a GPU without a passing audit of these sources: refused unless forced
    with pytest.raises(loader.ImplementationError, match="no passing search audit .* on sm_90"):
        require_evidence(path, man, man["source_hash"], "sm_90")
    monkeypatch.setenv("TIK_FORCE_IMPLEMENTATION", "1")
    require_evidence(path, man, man["source_hash"], "sm_90")
    monkeypatch.delenv("TIK_FORCE_IMPLEMENTATION")
    # names are never reused; an unknown or unverified id is refused
    with pytest.raises(ExportError, match="already exists"):
        export(run, name="toy_fast", dest=dest)
    with pytest.raises(ExportError, match="expected a Python-identifier"):
        export(run, name="../x", dest=dest)
    # the recipe option: tik.implementation=PATH resolves, loads (evidence checked), selects
    from areal_tik_plugin.integrations.areal.config import TikConfig, TikConfigError

    cfg = TikConfig.from_overrides([f"tik.implementation={path}"])
    assert cfg.implementation == path
    monkeypatch.setenv("TIK_IMPLEMENTATION", "tik_v1")
    try:
        cfg.select_implementation()
        assert os.environ["TIK_IMPLEMENTATION"] == path and loader.get_implementation().name == "toy_fast"
    finally:
        loader.set_implementation(None)
    with pytest.raises(TikConfigError, match="tik.implementation"):
        TikConfig.from_overrides([f"tik.implementation={os.path.join(tmp, 'missing')}"])


def test_offspring_of_an_exported_root_is_audited_not_gated(toy_run, tmp_path, monkeypatch):
    """A run rooted at an export: the root keeps its evidence gate, an offspring (a new hash, audited by
    the step itself) drops it, so the evaluator can load it on a GPU."""
    rdir, tmp = toy_run
    dest = os.path.join(tmp, "kernels")
    path = os.path.join(dest, "toy_fast")
    if not os.path.isdir(path):
        assert main(["search", "export", rdir, "--name", "toy_fast", "--dest", dest]) == 0
    with open(os.path.join(SPECS_DIR, "cpu_toy.yaml")) as f:
        s = yaml.safe_load(f)
    s["workloads"] = s["workloads"][:2]
    sp = str(tmp_path / "spec.yaml")
    with open(sp, "w") as f:
        yaml.safe_dump(s, f)
    run = Run.create(str(tmp_path / "run2"), sp, path)
    try:
        assert loader.read_manifest(run.impl_dir("I0000"))["evidence_required"] == "search_audit"
        run.initialize(__import__("areal_tik_plugin.search.evaluator", fromlist=["Evaluator"]).Evaluator())
        run.decide(decision="CONTINUE", interpretation="root", rationale="r",
                   new_opportunities=[{"mechanism": "STEP_BLOCK", "entry_points": ["toy.step"]}])
        run.record_action(opportunity=run.state().pending[0], parents=["I0000"], kind="decode",
                          edits=[{"file": "toy.py", "search": "STEP_BLOCK = 1 ", "replace": "STEP_BLOCK = 4 "}])
        child = run.impl_dir("I0001")
    finally:
        run.close()
    man = loader.read_manifest(child)
    assert "evidence_required" not in man and man["parent"] == "toy_fast"
    assert not os.path.exists(os.path.join(child, EVIDENCE_FILE))
    assert man["source_hash"] == loader.compute_source_hash(child)
    # what the loader does on an H200 for this folder: no gate; the export itself stays gated there
    monkeypatch.setattr(loader, "device_arch", lambda: "sm_90")
    monkeypatch.delenv("TIK_FORCE_IMPLEMENTATION", raising=False)
    loader.load_implementation(child)
    with pytest.raises(loader.ImplementationError, match="no passing search audit .* on sm_90"):
        loader.load_implementation(path)


def test_export_refuses_revoked(toy_run):
    rdir, tmp = toy_run
    run = Run.open(rdir)
    try:
        run.record_action(opportunity=run.state().pending[0], parents=["I0000"], kind="decode",
                          edits=[{"file": "toy.py", "search": "STEP_BLOCK = 1 ", "replace": "STEP_BLOCK = 4 "}])
        from areal_tik_plugin.search.evaluator import Evaluator

        a = run.audit(Evaluator())
        assert a.status == "ok"
        run.decide(decision="ARCHIVE", interpretation="ok", rationale="r")
    finally:
        run.close()
    assert main(["search", "revoke", rdir, "--id", "I0002", "--reason", "held-out failure reported"]) == 0
    run = Run.open(rdir, lock=False)
    assert "I0002" in run.state().revoked
    with pytest.raises(ExportError, match="revoked"):
        export(run, name="toy_revoked", iid="I0002", dest=os.path.join(tmp, "kernels"))
    # a revocation needs a reason and a verified target; the report and status show it
    assert main(["search", "revoke", rdir, "--id", "I0000", "--reason", "x"]) == 2
    assert main(["search", "status", rdir]) == 0
    assert main(["search", "report", rdir]) == 0


def test_export_verify_on_real_kernels(tmp_path, private_tik_v1, monkeypatch):
    """search -> export -> tik verify with the exported folder: the root of a GEMM smoke run on a copy of
    tik_v1 (interpreter), exported and verified bit for bit on a one-layer tiny model."""
    from areal_tik_plugin.search.evaluator import Evaluator

    with open(os.path.join(SPECS_DIR, "cpu_gemm_smoke.yaml")) as f:
        s = yaml.safe_load(f)
    s["workloads"] = s["workloads"][:1]
    s["bitwise"] = s["bitwise"][:1]
    s["accuracy"] = s["accuracy"][:1]
    sp = str(tmp_path / "spec.yaml")
    with open(sp, "w") as f:
        yaml.safe_dump(s, f)
    run = Run.create(str(tmp_path / "run"), sp, private_tik_v1)
    run.initialize(Evaluator())
    out = export(run, name="tik_v1_searched", iid="I0000", dest=str(tmp_path / "kernels"))
    run.close()
    monkeypatch.delenv("TIK_IMPLEMENTATION", raising=False)  # restored after the test; verify sets it
    try:
        rc = main(["verify", "--implementation", out["path"], "--device", "cpu", "--batch", "1", "--prompt-len", "5",
                   "--response-len", "3", "--no-stock", "--layers", "1", "--json", "--out", str(tmp_path / "v.json")])
        with open(tmp_path / "v.json") as f:
            rep = json.load(f)
    finally:
        loader.set_implementation(None)
    assert rc == 0 and rep["plugin_bit_identical"]
    assert rep["implementation"] == {"name": "tik_v1_searched", "source_hash": out["source_hash"]}
