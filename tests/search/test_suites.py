"""Suites derived from the contract, and the per-path instruction check: a decode-only exp2 -> exp
(in the split merge, reached only past ATTN_SPLIT_KV) passes the hand-written smoke suites but not
the contract-derived decode rows, and is refused statically by the instruction check."""

from __future__ import annotations

import os
import shutil
import types

import pytest

from areal_tik_plugin.runtime import loader
from areal_tik_plugin.contract.suite import Recorder
from areal_tik_plugin.search import SPECS_DIR, instructions as INS, spec as S
from areal_tik_plugin.search.runners import Context, attention as R

MERGE_E = '''@triton.jit
def _merge_e(M, L, ACC, m_s, l_s, acc_s):
    M_new = tl.maximum(M, m_s)
    M_safe = tl.where(M_new == float("-inf"), 0.0, M_new)
    a = tl.exp(M - M_safe)
    b = tl.exp(m_s - M_safe)
    L = L * a + l_s * b
    ACC = ACC * a[:, None] + acc_s * b[:, None]
    return M_new, L, ACC


@triton.jit
def _kv_offsets'''


def _copy(tmp, name, edit=None):
    root = loader.resolve_path("tik_v1")
    d = os.path.join(tmp, name)
    shutil.copytree(root, d, ignore=shutil.ignore_patterns("__pycache__"))
    if edit:
        p = os.path.join(d, "attention.py")
        with open(p) as f:
            t = f.read()
        t2 = edit(t)
        assert t2 != t
        with open(p, "w") as f:
            f.write(t2)
    man = loader.read_manifest(d)
    man["name"] = name
    import json

    with open(os.path.join(d, "manifest.json"), "w") as f:
        json.dump(man, f)
    loader.write_manifest_hash(d)
    return d


def _decode_only_exp(t):
    t = t.replace("        M, L, ACC = _merge(M, L, ACC, m_s, l_s, acc_s)\n    return ACC / L[:, None]",
                  "        M, L, ACC = _merge_e(M, L, ACC, m_s, l_s, acc_s)\n    return ACC / L[:, None]")
    return t.replace("@triton.jit\ndef _kv_offsets", MERGE_E, 1)


def _every_path_exp(t):
    return t.replace("tl.exp2(", "tl.exp(")


@pytest.fixture(scope="module")
def impls(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("suites"))
    return {"root": _copy(tmp, "tik_root"), "decode_exp": _copy(tmp, "tik_decode_exp", _decode_only_exp),
            "all_exp": _copy(tmp, "tik_all_exp", _every_path_exp)}


def _ctx(path):
    spec = S.freeze(S.load(os.path.join(SPECS_DIR, "cpu_attention_smoke.yaml")))
    return Context(loader.load_implementation(path), spec, "cpu", Recorder("t"))


def test_positions_come_from_the_contract():
    c = types.SimpleNamespace(COUPLED={"ATTN_KV_TILE": (32, 64), "ATTN_NEW_BLOCK": (48, 96), "GEMM_BLOCK_K": (32,)},
                              ATTN_KV_TILE=64, ATTN_NEW_BLOCK=96, GEMM_BLOCK_K=32)
    assert R.contract_positions(c) == {"ATTN_KV_TILE=64": [63, 64, 65, 129], "ATTN_NEW_BLOCK=96": [95, 96, 97, 193]}
    assert R.contract_positions(c, max_ctx=100) == {"ATTN_KV_TILE=64": [63, 64, 65], "ATTN_NEW_BLOCK=96": [95, 96, 97]}


def test_decode_only_exp_passes_smoke_rows_but_not_contract_rows(impls):
    suite = {"suite": "contract_decode", "page_sizes": [1], "max_ctx": 520}
    root = _ctx(impls["root"])
    R.bitwise_suite(root, suite)
    assert root.rec.checks and all(c["passed"] for c in root.rec.checks), root.rec.checks
    bad = _ctx(impls["decode_exp"])
    R.bitwise_suite(bad, {"suite": "prefix_decode", "prompt": 270, "answer": 5, "page_sizes": [1]})
    assert all(c["passed"] for c in bad.rec.checks), "the smoke rows (ctx <= 275) do not reach the split merge"
    R.bitwise_suite(bad, suite)
    assert not bad.rec.checks[-1]["passed"] and "ATTN_SPLIT_KV=512" in bad.rec.checks[-1]["name"]


def test_instruction_check_is_per_path(impls):
    man = loader.read_manifest(impls["root"])
    entries = ["attention.prefill", "attention.extend", "attention.decode"]
    ok, ev = INS.check(impls["root"], impls["root"], man["entry_points"], entries)
    assert ok == [] and ev["attention"]["attention.decode"] == ["exp2"]
    bad, ev = INS.check(impls["root"], impls["decode_exp"], man["entry_points"], entries)
    assert bad and all("attention.decode uses ['exp', 'exp2']" in b for b in bad)
    coupled, ev = INS.check(impls["root"], impls["all_exp"], man["entry_points"], entries)
    assert coupled == [] and ev["attention"]["attention.prefill"] == ["exp", "log2"]
