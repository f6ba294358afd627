"""The baselines run's harness on CPU: the step script's structure, the prebuild's failure keys, the
table over a synthetic evidence folder."""

import json
import os
import subprocess
import sys

from areal_tik_plugin.contract import baselines as B
from areal_tik_plugin.contract.suite import Recorder

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_table_reports_strongest_skips_and_context_apart(tmp_path):
    from benchmarks import baselines_table

    rec = Recorder("rmsnorm")
    timer = lambda r, label, fn, graph: {"cold_us": {"ours": 2.0, "fi": 3.0, "eager_hf": 9.0}[label.split("/")[1]],  # noqa: E731
                                         "graph_us": 1.0}
    B.collect(rec, "rmsnorm", {"liger": lambda: (_ for _ in ()).throw(B.Unavailable("liger: not installed"))})
    rows = [B.compare(rec, "r", None, {"fi": None}, {"eager_hf": None}, timer=timer)]
    B.summarize(rec, rows)
    (tmp_path / "a.json").write_text(json.dumps({"ops": {"rmsnorm": rec.to_json()}}))
    (tmp_path / "p.json").write_text(json.dumps({"jobs": {}, "failed": ["prefill_fa3"], "seconds": 3}))
    lines = "\n".join(baselines_table.contract_lines(json.loads((tmp_path / "a.json").read_text())))
    assert "cold 1.500" in lines and "strongest cold: fi x1" in lines
    assert "skipped liger: liger: not installed" in lines and "eager_hf" not in lines.split("skipped")[0]
    r = subprocess.run([sys.executable, "-m", "benchmarks.baselines_table", str(tmp_path)], cwd=ROOT, capture_output=True,
                       text=True)
    assert "failed: prefill_fa3" in r.stdout


def test_prebuild_failed_keys():
    from benchmarks.flashinfer_prebuild import JOBS, failed_keys

    res = {"jobs": {"rowops": {"ok": True}, "prefill_fa3": {"ok": False, "error": "timed out"}, "decode": {}}}
    assert failed_keys(res) == ["decode", "prefill_fa3"]
    from benchmarks.flashinfer_prebuild import GROUPS, expand, max_jobs

    assert set(JOBS) - set(GROUPS["sglang"]) == {"rowops", "decode", "prefill_fa2", "prefill_fa3"}
    assert max_jobs(["rowops", "decode", "prefill_fa2", "prefill_fa3"], 18) == {
        "rowops": 2, "decode": 2, "prefill_fa2": 6, "prefill_fa3": 8}
    assert max_jobs(["rowops"], 4) == {"rowops": 4}
    assert expand("rowops,sglang") == ["rowops", "sgl_fa3", "sgl_fa2", "sgl_ops"]


def test_proof_starts_the_sglang_prebuild_and_collects_its_result(tmp_path):
    """benchmarks.sglang_gpu_proof's background build of the SGLang flashinfer modules: started as its own
    process group, waited for, its JSON folded in (on a machine without a GPU every sgl_* job fails and says why)."""
    from benchmarks import sglang_gpu_proof as P

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}
    res = P.wait_fi_prebuild(P.start_fi_prebuild(str(tmp_path), env, 120, 2), 180)
    assert res["rc"] == 0 and res["failed"] == ["sgl_fa2", "sgl_fa3", "sgl_ops"], res
    assert set(res["jobs"]["sgl_ops"]["modules"]) == {"sgl_cascade", "sgl_norm", "sgl_activation", "sgl_sampling"}
    assert res["waited_s"] >= 0 and "running_when_baseline_due" in res


def test_flashinfer_job_listed_as_failed_is_unavailable(monkeypatch):
    import pytest

    monkeypatch.setattr(B, "FI_FAILED", frozenset({"prefill_fa3"}))
    monkeypatch.setitem(B._MODS, "flashinfer", (object(), None))  # as if importable
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert B.flashinfer("rowops") is B._MODS["flashinfer"][0]
    with pytest.raises(B.Unavailable, match="prefill_fa3: JIT build failed"):
        B.flashinfer("prefill_fa3")


def test_gpu_script_parses_and_names_every_step():
    path = os.path.join(ROOT, "benchmarks", "gpu_baselines.sh")
    assert subprocess.run(["bash", "-n", path]).returncode == 0
    text = open(path).read()
    for piece in ("flashinfer_prebuild", "--ops \"$s\" --no-checks", "--ops attention --no-checks",
                  "benchmarks.layer_bench", "00-baselines.tgz", "--deadline-s", "baselines_table", "--fi-failed"):
        assert piece in text, piece


def test_e2e_step_uses_the_e2e_cell_and_falls_through_to_the_gsm8k_runner():
    path = os.path.join(ROOT, "benchmarks", "gpu_integrations.sh")
    assert subprocess.run(["bash", "-n", path]).returncode == 0
    text = open(path).read()
    e2e = text[text.index("    gsm8k-e2e)"):text.index("    gsm8k)")]
    assert "gpu-e2e-qwen3" in e2e and "actor.attn_impl=$e2e_attn_impl" in e2e and e2e.rstrip().endswith(";&")
    assert ".whl-fi" in text and "cli compare $runs" in text


def test_prebuild_orchestration_records_each_job(tmp_path):
    """On a machine without a GPU every job reports its failure (reason kept) and lands in ``failed``."""
    out = tmp_path / "fi.json"
    r = subprocess.run([sys.executable, "-m", "benchmarks.flashinfer_prebuild", "--out", str(out), "--only",
                        "rowops,decode", "--timeout", "120", "--jobs", "2"], cwd=ROOT, capture_output=True, text=True,
                       timeout=200)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(out.read_text())
    assert res["failed"] == ["decode", "rowops"] and res["max_jobs"] == {"rowops": 1, "decode": 1}
    import torch

    if not torch.cuda.is_available():
        err = res["jobs"]["rowops"]["modules"]["norm"]["error"]
        assert "Unavailable" in err and ("no CUDA GPU" in err or "not importable" in err), err
