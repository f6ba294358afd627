"""kernels/tik_v8: the search run h200-gemm-rule's promoted implementation (tik_v7's Gluon GEMM, taken only on the
shapes where its probe beat tik_v6), exported with `tik search export`.

The CPU checks that the folder is that implementation and nothing else: its sources are tik_v7 + the plan's rule
edits, its hash is the one the run audited (the audit its loader gate reads), and every file the edits do not touch
is tik_v6's or tik_v7's. Which shapes the rule hands to Gluon: test_gluon_gemm_probe's rule-edit test; that a
Gluon configuration keeps tik_v6's bits where Gluon does not run: test_gluon_gemm.py."""

from __future__ import annotations

import json
import pathlib

from areal_tik_plugin.runtime import loader
from areal_tik_plugin.search import edits as E

ROOT = pathlib.Path(__file__).resolve().parents[2]
V8 = ROOT / "kernels" / "tik_v8"
RUN = ROOT / "evidence" / "search" / "h200-gemm-rule"


def test_tik_v8_is_tik_v7_with_the_rule_edits():
    v7 = E.read_files(str(ROOT / "kernels" / "tik_v7"))
    want = E.apply_edits(v7, E.parse_search_replace(
        (ROOT / "benchmarks" / "search_plans" / "h200_gemm" / "gluon" / "edits" / "rule.edits").read_text()))
    got = E.read_files(str(V8))
    assert sorted(E.changed_files(v7, want)) == ["gemm.py", "gemm_gluon.py"]
    for rel, text in want.items():
        if rel.endswith(".py"):
            assert got[rel] == text, rel
    assert sorted(r for r in got if r.endswith(".py")) == sorted(r for r in want if r.endswith(".py"))
    v6 = E.read_files(str(ROOT / "kernels" / "tik_v6"))
    assert sorted(r for r in v6 if r.endswith(".py") and v6[r] != got[r]) == ["gemm.py"]


def test_tik_v8_hash_is_the_audited_one():
    manifest = json.loads((V8 / "manifest.json").read_text())
    record = json.loads((RUN / "records" / "implementations" / "I0002.json").read_text())
    impl = loader.load_implementation(str(V8))
    assert impl.name == "tik_v8"
    assert impl.source_hash == manifest["source_hash"] == record["source_hash"]
    assert manifest["search"]["run"] == "evidence/search/h200-gemm-rule" and manifest["search"]["implementation"] == "I0002"
    audits = [json.loads(line) for line in (V8 / "search_evidence.jsonl").read_text().splitlines() if line.strip()]
    assert audits and all(a["source_hash"] == impl.source_hash and a["arch"] == "sm_90" and a["status"] == "ok"
                          for a in audits)
    assert manifest["search"]["best"] is True
