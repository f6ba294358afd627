"""``tik qualify`` and evidence per (kernels x Triton x torch x GPU): the CPU refusal, the qualification
record (built by the same writer ``tik qualify`` uses, from a contract Recorder and a real ``tik verify``
report on CPU, with the environment they record standing for a GPU one), and its acceptance by the
evidence lookup, the loader and the AReaL plan."""

from __future__ import annotations

import pytest
import torch

from areal_tik_plugin import evidence, versions
from areal_tik_plugin.runtime import loader
from areal_tik_plugin.integrations.areal import config as C

from tests.integrations.test_areal_config import areal_cfg

GPU_ENV = {"python": "3.11", "torch": torch.__version__, "triton": __import__("triton").__version__,
           "gpu": "NVIDIA H200", "sm": "90", "sms": 132, "cuda": "12.8", "driver": "570"}


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without a GPU")
def test_qualify_refuses_without_gpu(tmp_path, capsys):
    from areal_tik_plugin.cli import main

    assert main(["qualify", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "tik qualify needs a CUDA GPU" in err and "torch.cuda.is_available() is False" in err
    assert not (tmp_path / "qualify").exists()


@pytest.fixture(scope="module")
def verify_report():
    """A real ``tik verify`` report (tiny Qwen3, one short sequence, CPU interpreter)."""
    from areal_tik_plugin.verify import run_verify

    mp = pytest.MonkeyPatch()
    mp.setattr(evidence, "environment", lambda: dict(GPU_ENV))
    try:
        rep = run_verify("tiny-qwen3", batch=1, prompt_len="5", response_len="3", single=0, stock=False)
    finally:
        mp.undo()
    assert rep["plugin_bit_identical"] and rep["env"] == GPU_ENV
    return rep


def _contract(impl, env, failing=False):
    """Contract-suite records as ``python -m areal_tik_plugin.contract`` builds them: a header from
    :func:`evidence.contract_record`, each declared op's Recorder JSON under ``ops``."""
    from areal_tik_plugin.contract.suite import Recorder

    rec = evidence.contract_record(impl, env, ["--no-bench"])
    for op in sorted({e.split(".")[0] for e in impl.manifest["entry_points"]}):
        r = Recorder(op)
        a = torch.arange(7, dtype=torch.float32)
        r.bitwise(f"{op}.same", a, a.clone())
        if failing and op == "attention":
            r.bitwise(f"{op}.differs", a, a + 1)
        rec["ops"][op] = r.to_json()
    return [rec]


@pytest.fixture
def roots(tmp_path, monkeypatch):
    user = tmp_path / "user"
    monkeypatch.setenv("TIK_USER_EVIDENCE_DIR", str(user))
    monkeypatch.setenv("TIK_EVIDENCE_DIR", str(tmp_path / "repo-empty"))
    monkeypatch.delenv("TIK_EVIDENCE_PATH", raising=False)
    return user


def test_qualification_record_accepted_only_for_its_environment(roots, verify_report):
    impl = loader.get_implementation()
    rec = evidence.qualification_record(impl, GPU_ENV, _contract(impl, GPU_ENV), [verify_report])
    assert rec["ok"], rec
    path = evidence.write_qualification(str(roots), rec)
    st = evidence.find_qualification(impl, env=GPU_ENV)
    assert st["covered"] and st["source"] == path
    for field, other in (("triton", "3.5.1" if GPU_ENV["triton"] != "3.5.1" else "3.6.0"),
                         ("torch", "2.9.1+cu128"), ("gpu", "NVIDIA A100-SXM4-80GB")):
        st = evidence.find_qualification(impl, env={**GPU_ENV, field: other})
        assert st["covered"] is False and "run `tik qualify`" in st["message"], st
        assert f"{field} {other}" in st["message"] or other in st["message"]
        assert GPU_ENV["triton"] in st["message"]  # names the environment evidence exists for


def test_failed_or_mismatched_inputs_never_qualify(roots, verify_report):
    impl = loader.get_implementation()
    bad = evidence.qualification_record(impl, GPU_ENV, _contract(impl, GPU_ENV, failing=True), [verify_report])
    assert not bad["ok"] and bad["ops_failed"] == {"attention": 1}
    not_bits = {**verify_report, "plugin_bit_identical": False}
    assert not evidence.qualification_record(impl, GPU_ENV, _contract(impl, GPU_ENV), [not_bits])["ok"]
    other = evidence.qualification_record(impl, {**GPU_ENV, "triton": "0.0"}, _contract(impl, GPU_ENV), [verify_report])
    assert not other["ok"] and any("another environment" in p for p in other["problems"])
    assert not evidence.qualification_record(impl, GPU_ENV, _contract(impl, GPU_ENV), [])["ok"]
    evidence.write_qualification(str(roots), bad)
    assert evidence.find_qualification(impl, env=GPU_ENV)["covered"] is False
    with pytest.raises(ValueError, match="qualification_record"):
        evidence.write_qualification(str(roots), {"schema": "x"})


def _as_gpu_process(monkeypatch, env):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(evidence, "environment", lambda: dict(env))
    loader._EVIDENCE_STATUS.clear()


def test_loader_and_areal_plan_accept_qualified_env(roots, verify_report, monkeypatch):
    impl = loader.get_implementation()
    rec = evidence.qualification_record(impl, GPU_ENV, _contract(impl, GPU_ENV), [verify_report])
    evidence.write_qualification(str(roots), rec)
    try:
        _as_gpu_process(monkeypatch, GPU_ENV)
        monkeypatch.setenv("TIK_REQUIRE_EVIDENCE", "1")
        loader._report_evidence(impl)  # covered: no error
        p = C.plan(areal_cfg(0), C.TikConfig(require_evidence=True), model_type="qwen3")
        assert any(n.startswith("evidence for kernels") for n in p.notes), p.notes

        _as_gpu_process(monkeypatch, {**GPU_ENV, "triton": "3.5.0"})
        with pytest.raises(loader.ImplementationError, match=r"no GPU evidence for kernels .* x triton 3\.5\.0"):
            loader._report_evidence(impl)
        with pytest.raises(C.TikConfigError, match="tik.require_evidence=true: no GPU evidence"):
            C.plan(areal_cfg(0), C.TikConfig(require_evidence=True), model_type="qwen3")
        p = C.plan(areal_cfg(0), C.TikConfig(), model_type="qwen3")  # not required: noted, not refused
        assert any("no GPU evidence" in n for n in p.notes)
        cfg = areal_cfg(0)
        C.apply(cfg, C.plan(cfg, C.TikConfig(), model_type="qwen3"), C.TikConfig(require_evidence=True))
        assert cfg.actor.scheduling_spec[0].env_vars["TIK_REQUIRE_EVIDENCE"] == "1"
        monkeypatch.setenv("TIK_REQUIRE_EVIDENCE", "0")
        with pytest.warns(RuntimeWarning, match="run `tik qualify`"):
            loader._report_evidence(impl)
        monkeypatch.setenv("TIK_REQUIRE_EVIDENCE", "yes")
        with pytest.raises(ValueError, match="TIK_REQUIRE_EVIDENCE='yes'"):
            loader._report_evidence(impl)
    finally:
        loader._EVIDENCE_STATUS.clear()


def test_version_checks_name_what_to_install(monkeypatch):
    monkeypatch.delenv(versions.ALLOW_ENV, raising=False)
    assert versions.check_triton("3.5.1") == "3.5" and versions.check_triton("3.6.0") == "3.6"
    with pytest.raises(versions.UnsupportedVersionError, match=r"Triton 3\.4\.0 is not supported.*torch==2\.9\.1"):
        versions.check_triton("3.4.0")
    with pytest.raises(versions.UnsupportedVersionError, match="torch>=2.9.1"):
        versions.check_torch("2.8.0+cu128")
    versions.check_torch("2.9.1+cu128")
    with pytest.raises(versions.UnsupportedVersionError, match="transformers 4.57.1 is older than 5.0"):
        versions.check_transformers("4.57.1")
    assert versions.sglang_mode("0.5.10.post1") == "launcher" and versions.sglang_mode("0.5.23") == "plugin"
    with pytest.raises(versions.UnsupportedVersionError, match=r"SGLang 0\.5\.9 is not supported.*0\.5\.10\.post1"):
        versions.sglang_mode("0.5.9")
    monkeypatch.setenv(versions.ALLOW_ENV, "1")
    with pytest.warns(RuntimeWarning, match="continuing untested"):
        versions.check_triton("3.7.0")
    monkeypatch.setenv(versions.ALLOW_ENV, "maybe")
    with pytest.raises(ValueError, match="TIK_ALLOW_UNTESTED='maybe'"):
        versions.check_triton("3.7.0")
    assert versions.fast_host_path("3.6.0") and not versions.fast_host_path("3.5.1")


def test_committed_evidence_covers_only_the_environment_it_was_produced_in():
    """The committed contract records for the selected kernels cover the (Triton, torch, GPU) recorded in
    them; AReaL 1.0.4's default stack (torch 2.9.1 / Triton 3.5.1) on the same GPU is not covered."""
    impl = loader.load_implementation(loader.resolve_path(loader.selected_name("sm_90")))
    recs = [r for r in evidence.load_all(impl.name) if r.get("source_hash") == impl.source_hash]
    assert recs, "no committed contract evidence for the selected kernels"
    # benchmark-only records (no checks, e.g. gpu_baselines.sh on another card) cover nothing: take a checking one's
    checked = [r for r in recs if any(c["passed"] for c in evidence._contract_counts([r]).values())]
    assert checked, "no committed contract checks for the selected kernels"
    env = checked[0]["env"]
    repo = [evidence.repo_evidence_dir()]
    assert evidence.find_qualification(impl, env=env, roots=repo)["covered"]
    st = evidence.find_qualification(impl, env={**env, "triton": "3.5.1", "torch": "2.9.1+cu128"}, roots=repo)
    assert st["covered"] is False and f"triton {env['triton']} x torch {env['torch']}" in st["message"]
