"""No kernel change lands without GPU evidence: the implementation selected for the H200 (sm_90) must
have committed evidence for its *current* source hash, with every contract check passing, for every op
its manifest declares. The README's Measured table is what ``tik evidence --markdown`` renders.

The renderer and summary tests build their evidence with the suite's own writer (``Recorder`` +
``evidence.record_header`` / ``write_record``) in a temporary evidence root, in the row format the
contract suite writes (unnamed legacy baseline keys and self-named baselines)."""

import json
import os

import pytest

from areal_tik_plugin import evidence
from areal_tik_plugin.runtime import loader

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENV = {"python": "3.12.3", "torch": "2.11.0+cu130", "triton": "3.6.0", "gpu": "NVIDIA H200", "sm": "90",
       "cuda": "13.0", "driver": "580.159.04"}


@pytest.fixture(scope="module")
def impl():
    return loader.load_implementation(loader.resolve_path(loader.selected_name("sm_90")))


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
    assert set(integ) == {"layer_bench", "sglang_gpu", "areal_recompute", "areal_gsm8k", "areal_bits",
                          "megatron_verify", "megatron_bench"}
    for r in integ["sglang_gpu"]:  # every committed SGLang GPU proof must hold
        assert r["bit_identical"] and r["ops_through_ours"], r
    for r in integ["megatron_verify"]:  # every committed Megatron proof must hold, every check row identical
        assert r["bit_identical"] and r["rows"] and all(a == b for a, b in r["rows"].values()), r
    for r in integ["megatron_bench"]:  # the plugin spec and at least one stock spec timed in the same process
        assert "tik" in r["tokens_per_s"] and set(r["tokens_per_s"]) - {"tik", "tik-thd"}, r
    for r in integ["layer_bench"]:
        assert r["n"] and r["mean_ratio"] > 0, r
    modes = {r["tik"] for r in integ["areal_recompute"]}
    assert not integ["areal_recompute"] or modes == {True, False}, "recompute bench: commit both modes together"
    for r in integ["areal_gsm8k"]:  # both modes measured; the monitor's counts are what the run logged
        assert r["tik"]["tokens_per_s"] > 0 and r["baseline"]["tokens_per_s"] > 0, r
    for r in integ["areal_bits"]:
        assert 0 <= r["mismatched_tokens"] <= r["tokens"], r


def _write(root, impl, ops: dict, *, source_hash=None, started="2026-01-01T00:00:00Z", tag=None):
    """One evidence JSON as ``python -m areal_tik_plugin.contract`` writes it; ``ops`` maps op -> a
    function filling a Recorder."""
    from areal_tik_plugin.contract.suite import Recorder

    rec = evidence.record_header(impl, ["--out", "x"], env=ENV)
    rec["started"] = started
    if source_hash:
        rec["source_hash"] = source_hash
    for op, fill in ops.items():
        r = Recorder(op)
        fill(r)
        rec["ops"][op] = r.to_json()
    d = os.path.join(str(root), impl.name)
    os.makedirs(d, exist_ok=True)
    path = evidence.record_path(d, impl, list(ops) + ([tag] if tag else []))
    if source_hash:
        path = path.replace(impl.source_hash[:12], source_hash[:12])
    evidence.write_record(path, rec)
    return path


def _attention(r):
    r.check("prefix_rows", True, kind="bitwise")
    t = lambda c, g: {"cold_us": c, "graph_us": g}  # noqa: E731
    # legacy keys: cudnn / fa2 named by KNOWN_BASELINES; decode's "paged" is ours, page16 / dense variants
    r.bench("prefill_b1_L17", kind="prefill", B=1, L=17, ours=t(10.0, 8.0), cudnn=t(5.0, 4.0), fa2=t(20.0, None))
    r.bench("prefill_b2_L129", kind="prefill", B=2, L=129, ours=t(40.0, 20.0), cudnn=t(80.0, 30.0),
            fa2=t(30.0, None))
    r.bench("decode_b1_ctx127", kind="decode", B=1, ctx=127, paged=t(4.0, 2.0), page16=t(1.0, 1.0),
            dense=t(1.0, 1.0), cudnn=t(8.0, 3.0))
    # a self-named baseline, faster than cuDNN on graph replay: it becomes the graph row's baseline
    r.bench("decode_b4_ctx129", kind="decode", B=4, ctx=129, paged=t(5.0, 2.0), cudnn=t(6.0, 3.0),
            flashinfer={"cold_us": 7.0, "graph_us": 1.0, "name": "FlashInfer 0.5.3 BatchDecodeWithPagedKVCache"})


def _logprob_eager_only(r):
    r.check("logp_rows[T1@0]", True, kind="bitwise")
    r.bench("logprob[T17]", T=17, ours={"cold_us": 2.0, "graph_us": 1.0},
            areal_chunked={"cold_us": 9.0, "graph_us": 9.0},
            compiled={"cold_us": 3.0, "graph_us": 2.0, "name": "x", "context": True})


def _rmsnorm_failing(r):
    r.check("rows", False, kind="bitwise")
    r.bench("rmsnorm[m/T1]", T=1, ours={"cold_us": 1.0, "graph_us": 1.0}, liger={"cold_us": 2.0, "graph_us": 2.0})


def test_row_baselines_named_exactly_and_context_marked():
    row = {"name": "rope[m/T1]", "ours": {"cold_us": 1.0, "graph_us": 1.0},
           "liger": {"cold_us": 2.0, "graph_us": 1.5}, "hf_eager_apply": {"cold_us": 9.0, "graph_us": 9.0},
           "tc": {"cold_us": 3.0, "graph_us": 2.0}, "tc_name": "torch.compile (max-autotune-no-cudagraphs)",
           "baselines": {"fi": {"cold_us": 4.0, "graph_us": None, "name": "FlashInfer apply_rope_pos_ids"}},
           "variant": {"cold_us": 1.0, "graph_us": 1.0}, "liger_unavailable": "unavailable"}
    got = {b["key"]: (b["name"], b["context"]) for b in evidence.row_baselines(row, ENV)}
    assert got == {"liger": ("Liger liger_rotary_pos_emb", False),
                   "hf_eager_apply": ("transformers eager apply_rotary_pos_emb", True),
                   "tc": ("torch.compile (max-autotune-no-cudagraphs)", False),
                   "fi": ("FlashInfer apply_rope_pos_ids", False)}


def test_markdown_table_from_evidence(tmp_path, impl):
    tmp_path = tmp_path / "evidence"
    _write(tmp_path, impl, {"attention": _attention, "logprob": _logprob_eager_only, "rmsnorm": _rmsnorm_failing})
    m = evidence.measured(impl, str(tmp_path))
    rows = {(r["op"], r["group"], r["method"]): r for r in m["rows"]}
    # prefill cold: cuDNN (5) beats fa2 (20) on row 1, fa2 (30) beats cuDNN (80) on row 2 -> one row naming both
    pc = [r for r in m["rows"] if r["group"] == "prefill" and r["method"] == "cold"]
    assert [(r["baseline"], r["n"]) for r in pc] == [
        ("torch SDPA, FlashAttention-2 backend ×1, torch SDPA, cuDNN backend ×1", 2)]
    assert pc[0]["ratio_geomean"] == pytest.approx((0.5 * 0.75) ** 0.5)
    pg = rows[("attention", "prefill", "graph")]  # fa2 has no graph time: cuDNN on both rows
    assert pg["n"] == 2 and pg["ratio_geomean"] == pytest.approx((0.5 * 1.5) ** 0.5)
    dg = [r for r in m["rows"] if r["group"] == "decode" and r["method"] == "graph"]
    assert [(r["baseline"], r["ratio_min"], r["ratio_max"]) for r in dg] == [
        ("FlashInfer 0.5.3 BatchDecodeWithPagedKVCache ×1, torch SDPA, cuDNN backend ×1", 0.5, 1.5)]
    dc = [r for r in m["rows"] if r["group"] == "decode" and r["method"] == "cold"]
    assert [(r["n"], r["ours_us"]) for r in dc] == [(2, [4.0, 5.0])]  # ours = paged, never page16 / dense
    assert m["no_headline"] == ["logprob"] and m["failing"] == ["rmsnorm"]
    assert m["unnamed"] == {"attention": ["dense", "page16"]}  # variants of ours, listed, never baselines
    assert set(m["awaiting"]) == set(m["ops"]) - {"attention", "logprob", "rmsnorm"}
    md = evidence.render_markdown(impl, str(tmp_path))
    assert md.startswith(evidence.MEASURED_BEGIN) and md.rstrip().endswith(evidence.MEASURED_END)
    assert "FlashInfer 0.5.3 BatchDecodeWithPagedKVCache ×1, torch SDPA, cuDNN backend ×1 | 0.87 (0.50–1.50) | graph | [e1] |" in md
    assert "| logprob | — | — | only eager baselines recorded" in md and "areal" not in md.lower()
    assert "| rmsnorm | — | — | — | — | — | contract checks failing: no numbers |" in md
    assert "| gemm | — | — | — | — | — | awaiting GPU run |" in md
    assert "Measured on NVIDIA H200, torch 2.11.0+cu130, Triton 3.6.0" in md
    assert f"[e1]: evidence/{impl.name}/{impl.name}-{impl.source_hash[:12]}-" in md


def test_markdown_uses_current_hash_and_newest_file(tmp_path, impl):
    old = "0" * 64
    _write(tmp_path, impl, {"attention": _attention}, source_hash=old)
    md = evidence.render_markdown(impl, str(tmp_path))
    assert "| attention | — | — | — | — | — | awaiting GPU run |" in md
    assert "prefill" in evidence.render_markdown(impl, str(tmp_path), source_hash=old)

    def faster(r):
        r.check("prefix_rows", True, kind="bitwise")
        r.bench("prefill_b1_L17", kind="prefill", B=1, L=17, ours={"cold_us": 1.0, "graph_us": 1.0},
                cudnn={"cold_us": 3.0, "graph_us": 3.0})

    _write(tmp_path, impl, {"attention": _attention})
    _write(tmp_path, impl, {"attention": faster}, started="2026-02-01T00:00:00Z", tag="rerun")
    rows = evidence.measured(impl, str(tmp_path))["rows"]
    assert [(round(r["ratio_geomean"], 9), r["file"].endswith("-attention-rerun.json")) for r in rows] == [(3.0, True)] * 2


def test_cli_markdown_update_and_bad_hash(tmp_path, impl, capsys):
    from areal_tik_plugin.cli import main

    _write(tmp_path / "ev", impl, {"attention": _attention})
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\n{evidence.MEASURED_BEGIN}\nstale\n{evidence.MEASURED_END}\n\n## after\n")
    assert main(["evidence", "--markdown", "--evidence-dir", str(tmp_path / "ev"), "--update", str(readme)]) == 0
    text = readme.read_text()
    assert evidence.readme_table(text) == evidence.render_markdown(impl, str(tmp_path / "ev"))
    assert text.startswith("# x\n\n") and text.endswith("\n\n## after\n") and "stale" not in text
    assert main(["evidence", "--markdown", "--strict", "--evidence-dir", str(tmp_path / "ev")]) == 1  # awaiting ops
    assert main(["evidence", "--markdown", "--source-hash", "d23ee6c"]) == 2  # the message, not a traceback


def test_readme_measured_table_is_generated(impl):
    with open(os.path.join(REPO, "README.md")) as f:
        got = evidence.readme_table(f.read())
    assert got is not None, f"README.md lacks the {evidence.MEASURED_BEGIN} ... {evidence.MEASURED_END} block"
    want = evidence.render_markdown(impl)
    assert got == want, "README.md's Measured table is stale: run `tik evidence --markdown --update README.md`"


def test_readme_fits_15_kb():
    assert os.path.getsize(os.path.join(REPO, "README.md")) <= 15 * 1024, "README.md over 15 KB: move detail to docs/"


def test_summary_reads_every_result_kind(tmp_path, impl):
    """integration_summary / model_summary parse the JSON each producing command writes."""
    root = tmp_path / "evidence"
    w = lambda rel, obj: (os.makedirs(os.path.dirname(root / rel), exist_ok=True),  # noqa: E731
                          (root / rel).write_text(json.dumps(obj)))
    ih = {"name": impl.name, "source_hash": impl.source_hash}
    w("verify/v.json", {"schema": "areal-tik-verify/1", "model": "qwen3-4b", "implementation": ih,
                        "config": {"num_hidden_layers": 4}, "device": "cuda", "env": {"gpu": "NVIDIA H200"},
                        "batch": 64, "prompt_lens": [17, 129], "response_lens": [1, 127],
                        "plugin_bit_identical": True, "checks": [{}, {}]})
    w("layer_bench/l.json", {"schema": "areal-tik-layer-bench/1", "implementation": impl.name,
                             "source_hash": impl.source_hash, "env": {"gpu": "H200"}, "quick": True,
                             "summary": {"mean_ratio": 1.5, "geomean_ratio": 1.4, "min_ratio": 1.1, "n": 6}})
    w("sglang/s.json", {"bitwise_mismatching_requests": [], "requests": 128, "implementation": ih,
                        "ops": {"ok": True}, "engine_args": {"disable_cuda_graph": False},
                        "backends": {"tik": {"greedy_tokens_per_s": 900.0}, "triton": {"error": "x"}}})
    for tik in (True, False):
        w(f"areal/r-{tik}.json", {"args": {"tik": tik, "batch": 8}, "device": "H200",
                                  "mean": {"tokens": 4096, "step_with_recompute_s": 2.0,
                                           "step_without_recompute_s": 1.5, "saving_fraction": 0.25}})
    mode = {"tokens_per_s": 100.0, "step_s": 10.0, "measured_steps": 3, "fallback_active": False,
            "monitor": {"mismatched_tokens": 0, "checked_tokens": 7104}}
    w("areal/g/gsm8k-summary.json", {"tik": mode, "baseline": dict(mode, tokens_per_s=80.0)})
    w("areal/b/bits-areal.json", {"device": "H200", "args": {"model_dir": "m"},
                                  "check_bits": {"sequences": 8, "tokens": 7104,
                                                 "shifted": {"mismatched_tokens": 0, "max_abs_diff": 0.0}}})
    mv = {"megatron-core": "0.17.0", "implementation": ih, "env": {"gpu": "NVIDIA H200"}}
    w("megatron/v.json", {"engine": "megatron", "model": "qwen3-4b", "layers": 4, "device": "cuda", "batch": 2,
                          "prompt_lens": [17, 17], "response_lens": [3, 5], "bit_identical": True, "versions": mv,
                          "checks": [{"check": "megatron-vs-rollout", "rows": 9, "identical_rows": 9}]})
    w("megatron/b.json", {"model": "qwen3-4b", "layers": 2, "micro_batch": 1, "seq_len": 64, "versions": mv,
                          "variants": {"tik": {"tokens_per_s": 300.0}, "local": {"tokens_per_s": 100.0},
                                       "hf": {"error": "x"}}})
    s = evidence.summary(impl, str(root))
    assert [(m["model"], m["matches_hash"], m["response_len_min"], m["file"]) for m in s["models"]] == [
        ("qwen3-4b", True, 1, "evidence/verify/v.json")]
    integ = s["integrations"]
    assert [r["mean_ratio"] for r in integ["layer_bench"]] == [1.5]
    assert [(r["bit_identical"], r["ops_through_ours"], r["cuda_graphs"], r["backends"]) for r in integ["sglang_gpu"]] \
        == [(True, True, True, {"tik": {"greedy_tokens_per_s": 900.0, "repeat_tokens_per_s": None},
                                "triton": {"error": True}})]
    assert [(r["bit_identical"], r["rows"]) for r in integ["megatron_verify"]] == [(True, {"megatron-vs-rollout": [9, 9]})]
    assert [r["tokens_per_s"] for r in integ["megatron_bench"]] == [{"tik": 300.0, "local": 100.0}]
    rows = {r["what"]: r for r in evidence.integration_rows(impl, str(root))}
    assert rows["Megatron forward + backward, plugin spec"]["ratio"] == "3.00 vs local"
    assert rows["tik verify --engine megatron qwen3-4b (4 layers, megatron-core 0.17.0)"]["result"] == "bit-identical"
    # whole-model rows can come from another card than the op rows: each names its own
    assert rows["tik verify qwen3-4b"]["gpu"] == "NVIDIA H200" and rows["layer bench (rollout + update per layer)"]["gpu"] == "H200"
    assert "responses 1..127 (NVIDIA H200) | bit-identical" in evidence.render_markdown(impl, str(root))
    assert {r["tik"] for r in integ["areal_recompute"]} == {True, False}
    assert integ["areal_gsm8k"][0]["baseline"]["tokens_per_s"] == 80.0
    assert integ["areal_bits"][0]["mismatched_tokens"] == 0
    assert not s["all_ok"] and all(not v["evidence_matches_hash"] for v in s["ops"].values())


def test_newest_checking_run_decides_and_bench_only_runs_do_not(tmp_path, impl):
    """A failed run superseded by a newer passing one: the op is ok; a newer benchmark-only run (no
    checks) neither clears nor hides a failure; an op never checked is not ok."""
    def failing(r):
        r.check("rows", False, kind="bitwise")

    def passing(r):
        r.check("rows", True, kind="bitwise")

    def bench_only(r):
        r.bench("prefill_b1_L17", kind="prefill", B=1, L=17, ours={"cold_us": 1.0, "graph_us": 1.0})

    _write(tmp_path, impl, {"gemm": failing, "rope": passing}, started="2026-01-01T00:00:00Z", tag="a")
    _write(tmp_path, impl, {"gemm": passing, "moe": failing}, started="2026-01-02T00:00:00Z", tag="b")
    _write(tmp_path, impl, {"moe": bench_only, "kv_write": bench_only}, started="2026-01-03T00:00:00Z", tag="c")
    ops = evidence.summary(impl, root=str(tmp_path))["ops"]
    assert ops["gemm"]["ok"] and ops["gemm"]["checks_failed"] == 0 and ops["gemm"]["checks_file"].endswith(
        "-gemm-moe-b.json")
    assert ops["rope"]["ok"]
    assert not ops["moe"]["ok"] and ops["moe"]["checks_failed"] == 1
    assert not ops["kv_write"]["ok"] and ops["kv_write"]["evidence_matches_hash"]


def test_cli_bad_input_is_a_message_and_exit_2(capsys, tmp_path):
    """Bad arguments to the tik commands: exit 2 with the expectation named, never a traceback."""
    from areal_tik_plugin.cli import main

    assert main(["evidence", "--markdown", "--source-hash", "abc"]) == 2
    assert "64 lowercase hex" in capsys.readouterr().err
    assert main(["sglang-check", "--model", str(tmp_path / "none")]) == 2
    assert "checkpoint folder (with config.json)" in capsys.readouterr().err
    assert main(["compare", str(tmp_path / "missing")]) == 2
    assert "no such run source" in capsys.readouterr().err


def test_an_unfinished_run_never_passes_an_op_but_its_failures_count(tmp_path, impl):
    """The contract suite cut by its call's time limit writes what ran, ``complete: false``: passing
    checks of such a run do not supersede an older failure or make an unchecked op pass; a failure in it
    still fails the op."""
    def passing(r):
        r.check("rows", True, kind="bitwise")

    def failing(r):
        r.check("rows", False, kind="bitwise")

    _write(tmp_path, impl, {"gemm": failing}, started="2026-01-01T00:00:00Z", tag="a")
    for tag, ops, when in (("b", {"gemm": passing, "rope": passing}, "2026-01-02T00:00:00Z"),
                           ("c", {"moe": failing}, "2026-01-03T00:00:00Z")):
        p = _write(tmp_path, impl, ops, started=when, tag=tag)
        with open(p) as f:
            rec = json.load(f)
        for op in rec["ops"]:
            rec["ops"][op].update(complete=False, phase="terminated during checks")
        evidence.write_record(p, rec)
    ops = evidence.summary(impl, root=str(tmp_path))["ops"]
    assert not ops["gemm"]["ok"] and ops["gemm"]["checks_file"].endswith("-gemm-a.json")
    assert not ops["rope"]["ok"] and ops["rope"]["checks_file"] is None
    assert not ops["moe"]["ok"] and ops["moe"]["checks_failed"] == 1


def test_the_suite_writes_what_ran_when_terminated():
    """SIGTERM (the device call's limit) is a BaseException: the recorder's per-check guard does not
    swallow it, so the suite's handler writes the partial record."""
    import pytest

    from areal_tik_plugin.contract import __main__ as M
    from areal_tik_plugin.contract.suite import Recorder

    rec = Recorder("attention")
    with pytest.raises(M.Terminated):
        rec.run("attention.checks", M._terminate, 15, None)
    assert rec.checks == []


def test_layer_bench_record_cut_before_its_summary(tmp_path, impl):
    """A layer bench killed by its time limit leaves the models it finished (the JSON is rewritten after
    each): the row summarizes those and says the run was cut; a record with no finished cell gives no row."""
    root = tmp_path / "evidence"
    os.makedirs(root / "layer_bench")
    rec = {"schema": "areal-tik-layer-bench/1", "implementation": impl.name, "source_hash": impl.source_hash,
           "env": {"gpu": "H100"}, "quick": True,
           "models": [{"model": "qwen3-4b", "results": [{"ratio": 2.0}, {"ratio": 0.5}, {"ratio": None}]},
                      {"model": "qwen3-8b", "results": [{"ratio": 1.0}]}]}
    (root / "layer_bench" / "a.json").write_text(json.dumps(rec))
    (root / "layer_bench" / "b.json").write_text(json.dumps(dict(rec, models=[{"model": "m", "results": []}])))
    lb = evidence.integration_summary(impl, str(root))["layer_bench"]
    assert [(r["partial"], r["n"], r["min_ratio"]) for r in lb] == [(True, 3, 0.5), (True, None, None)]
    assert lb[0]["geomean_ratio"] == pytest.approx(1.0) and lb[0]["per_model_geomean"] == {"qwen3-4b": 1.0,
                                                                                           "qwen3-8b": 1.0}
    rows = [r for r in evidence.integration_rows(impl, str(root)) if r["what"].startswith("layer bench")]
    assert len(rows) == 1 and rows[0]["file"].endswith("a.json") and rows[0]["ratio"] == "1.00 (min 0.50)"
    assert rows[0]["workload"] == "3 (model, batch, length) cells: qwen3-4b 1.00, qwen3-8b 1.00 (run cut: the models it finished)"
