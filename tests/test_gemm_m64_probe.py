"""scripts/gemm_m64_probe.py on the CPU: its variants come from the implementation's own configuration rule
(no GPU needed to build them), and bad --shapes are refused with what was expected."""

from __future__ import annotations

import re

import pytest

from areal_tik_plugin.loader import get_implementation

from ._scripts import load_script


def _probe():
    return load_script("gemm_m64_probe")


def test_variants_follow_the_rule():
    probe = _probe()
    gemm = get_implementation().module("gemm")
    N, K = probe.SHAPES["qwen3-4b:o"]
    v = probe.variants(gemm, N, K, 132)
    assert v["m64"] == (64, gemm.config_for(64, N, K, 132))
    assert v["m1_in_m64_tile"][1] == v["m64"][1] and v["m1_in_m64_tile"][0] == 1  # same tile, no x rows
    assert v["m16_in_m64_tile"] == (16, v["m64"][1])
    assert v["m64_as_m16_tiles"][1]["BLOCK_M"] == 16 and v["m64_as_m32_tiles"][1]["BLOCK_M"] == 32
    assert v["m64"][1]["BLOCK_M"] == 64
    widths = {k: c for k, (m, c) in v.items() if k.startswith(("m64_partial_", "m64_fused_"))}
    assert v["m64_partial_n32_w4_runtime_trips"][1]["fixed_trips"] is False
    # Qwen3-4B o at M=64 runs the chunk-partial path since session 20 (SPLIT_FUSED_NARROW_MIN_M off)
    assert v["m64"][1]["split"] == "partial" and v["m64_runtime_trips"][1]["fixed_trips"] is False
    down = probe.variants(gemm, *probe.SHAPES["qwen3-4b:down"], 132)
    assert down["m64"][1]["split"] == "partial" and down["m64_runtime_trips"][1]["fixed_trips"] is False
    widths = {k: c for k, c in widths.items() if "runtime_trips" not in k and not re.search(r"_s\d+$", k)}
    assert len(widths) == 12 and all(c["BLOCK_M"] == 64 for c in widths.values())
    assert v["m64_partial_n128_w8"][1]["BLOCK_N"] == 128 and v["m64_partial_n128_w8"][1]["num_warps"] == 8
    assert v["m64_fused_n64_tma"][1]["tma"] and v["m64_fused_n64_tma"][1]["split"] == "fused"
    assert v["m64_partial_n16_w4"][1]["split"] == "partial"
    assert v["m64_fused_n32_w2"][1]["num_warps"] == 2 and v["m64_fused_n32_w2"][1]["split"] == "fused"


def test_bad_arguments():
    probe = _probe()
    with pytest.raises(ValueError, match="comma list of"):
        probe.parse_shapes("qwen3-4b:o,nope")
    with pytest.raises(ValueError):
        probe.parse_shapes("")
    with pytest.raises(SystemExit):
        probe.main(["--out", "/tmp/unused", "--rounds", "0"])


def test_stage_variants():
    probe = _probe()
    gemm = get_implementation().module("gemm")
    v = probe.variants(gemm, *probe.SHAPES["qwen3-4b:down"], 132)
    base = v["m64_partial_n32_w4"][1]
    stages = {k: c for k, (m, c) in v.items() if k.startswith("m64_partial_n32_w4_s")}
    assert stages and all(c["num_stages"] != base["num_stages"] for c in stages.values())
    assert all(dict(c, num_stages=base["num_stages"]) == base for c in stages.values())
