"""No kernel change lands without GPU evidence: the implementation selected for the H200 (sm_90) must
have committed evidence for its *current* source hash, with every contract check passing, for every op
its manifest declares."""

from areal_tik_plugin import evidence
from areal_tik_plugin.runtime import loader


def test_manifest_hash_matches_sources():
    for name in loader.list_implementations():
        path = loader.resolve_path(name)
        man = loader.read_manifest(path)
        assert man["source_hash"] == loader.compute_source_hash(path), (
            f"{name}: manifest hash is stale; kernels changed without `tik kernels rehash` + GPU evidence")


def test_selected_implementation_has_passing_gpu_evidence():
    impl = loader.load_implementation(loader.resolve_path(loader.selected_name("sm_90")))
    s = evidence.summary(impl)
    missing = [op for op, v in s["ops"].items() if not v["evidence_matches_hash"]]
    failing = {op: v["checks_failed"] for op, v in s["ops"].items() if v["checks_failed"]}
    empty = [op for op, v in s["ops"].items() if v["evidence_matches_hash"] and v["checks_passed"] == 0]
    assert not missing, f"no GPU evidence for source hash {impl.source_hash[:12]} of ops {missing}"
    assert not failing, f"GPU contract checks failing: {failing}"
    assert not empty, f"evidence without any passing check for {empty}"


def test_loader_refuses_edited_implementation(tmp_path):
    import shutil

    import pytest

    src = loader.resolve_path(loader.selected_name("cpu"))
    dst = tmp_path / "edited"
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
    with open(dst / "contract.py", "a") as f:
        f.write("\n# edited\n")
    with pytest.raises(loader.ImplementationError, match="does not match"):
        loader.load_implementation(str(dst))


def test_integration_results_are_summarized():
    impl = loader.load_implementation(loader.resolve_path(loader.selected_name("sm_90")))
    integ = evidence.summary(impl)["integrations"]
    assert set(integ) == {"layer_bench", "sglang_gpu", "areal_recompute", "areal_gsm8k", "areal_bits"}
    for r in integ["sglang_gpu"]:  # every committed SGLang GPU proof must hold
        assert r["bit_identical"] and r["ops_through_ours"], r
    for r in integ["layer_bench"]:
        assert r["n"] and r["mean_ratio"] > 0, r
    modes = {r["tik"] for r in integ["areal_recompute"]}
    assert not integ["areal_recompute"] or modes == {True, False}, "recompute bench: commit both modes together"
    for r in integ["areal_gsm8k"]:  # both modes measured; the monitor's counts are what the run logged
        assert r["tik"]["tokens_per_s"] > 0 and r["baseline"]["tokens_per_s"] > 0, r
    for r in integ["areal_bits"]:
        assert 0 <= r["mismatched_tokens"] <= r["tokens"], r
