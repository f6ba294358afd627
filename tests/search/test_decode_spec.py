"""The decode-weighted spec (search/specs/h200_decode.yaml) and its CPU twin (cpu_decode_smoke.yaml): they load and
freeze, decode carries all of T (the prefill guards have weight 0 but the slowdown limit), the grid is
b{1,4,8,16,64} x ctx{128,1K,4K,8K} plus h200_attention's mixed-length cells unchanged, --quick drops exactly the two
slowest cells, and everything else (model, runner, suites, timing, search rules) is h200_attention's. Text only."""

from __future__ import annotations

import os

import yaml

from areal_tik_plugin.search import SPECS_DIR
from areal_tik_plugin.search import spec as S


def _raw(name):
    with open(os.path.join(SPECS_DIR, f"{name}.yaml")) as f:
        return yaml.safe_load(f)


def test_h200_decode_spec_is_decode_weighted_and_matches_h200_attention():
    dec, att = S.load(os.path.join(SPECS_DIR, "h200_decode.yaml")), _raw("h200_attention")
    full, quick = S.freeze(dec), S.freeze(dec, quick=True)
    grid = {f"decode_b{b}_ctx{c}" for b in (1, 4, 8, 16, 64) for c in (128, 1024, 4096, 8192)}
    names = {w["name"] for w in full["workloads"]}
    assert grid | {"decode_b64_mixed", "decode_b256_mixed"} <= names
    for w in full["workloads"]:
        if w["entry"] == "attention.decode":
            assert w["weight"] == 1.0 and w["max_slowdown"] == 1.05, w["name"]
        else:  # full-sequence guards: outside T, inside the limits
            assert w["entry"] == "attention.prefill" and w["weight"] == 0.0 and w["max_slowdown"] == 1.05, w["name"]
    att_mixed = {w["name"]: w for w in att["workloads"] if "mixed" in w["name"]}
    for w in dec["workloads"]:
        if w["name"] in att_mixed:
            assert w["shape"] == att_mixed[w["name"]]["shape"] and w["entry"] == att_mixed[w["name"]]["entry"]
    assert names - {w["name"] for w in quick["workloads"]} == {"decode_b64_ctx8192", "decode_b256_mixed"}
    for key in ("target", "runner", "model", "entry_points", "bitwise", "accuracy", "evaluation", "search", "knobs",
                "max_slowdown"):
        assert dec[key] == att[key], key


def test_cpu_decode_smoke_spec_is_decode_weighted():
    smoke = S.freeze(S.load(os.path.join(SPECS_DIR, "cpu_decode_smoke.yaml")))
    att = _raw("cpu_attention_smoke")
    assert smoke["runner"] == att["runner"] and smoke["model"] == att["model"] and smoke["target"] == att["target"]
    dec = [w for w in smoke["workloads"] if w["entry"] == "attention.decode"]
    assert len(dec) >= 3 and all(w["weight"] == 1.0 for w in dec)
    assert all(w["weight"] == 0.0 for w in smoke["workloads"] if w["entry"] != "attention.decode")
    assert {b["suite"] for b in smoke["bitwise"]} == {b["suite"] for b in att["bitwise"]}
    # a split boundary (two splits, the merge kernel) and a 4-tile group are among the timed cells
    assert max(w["shape"].get("ctx", w["shape"].get("ctx_max", 0)) for w in dec) > 512
