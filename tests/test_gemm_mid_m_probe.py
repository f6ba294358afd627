"""scripts/gemm_mid_m_probe.py on the CPU: its variants come from the implementation's own helpers (unsplit
weights: TMA / pointer / persistent tiles; split weights: the chunk-partial and fused flat paths), and bad
arguments are refused with what was expected."""

from __future__ import annotations

import pytest

from areal_tik_plugin.loader import get_implementation

from ._scripts import load_script


def test_variants():
    probe = load_script("gemm_mid_m_probe")
    gemm = get_implementation().module("gemm")
    plain = probe.variants(gemm, 256, *probe.SHAPES["qwen3-4b:qkv"], 132)
    assert plain["default"] == gemm.config_for(256, 6144, 2560, 132)
    assert plain["tma_m64_n64"]["tma"] and plain["tma_m64_n64"]["BLOCK_M"] == 64
    assert not plain["ptr_m64_n32"]["tma"] and plain["ptr_m64_n32"]["BLOCK_N"] == 32
    assert not any(c.get("split") == "partial" for c in plain.values())
    split = probe.variants(gemm, 256, *probe.SHAPES["qwen3-4b:down"], 132)
    parts = {k: c for k, c in split.items() if k.startswith("partial_")}
    assert len(parts) == 5 and all(c["split"] == "partial" for c in parts.values())
    assert split["flat_m64_n64"]["split"] == "fused" and split["flat_m64_n64"]["flat"]
    assert split["large_split_m64_n128"]["split_weight"]


def test_bad_arguments():
    probe = load_script("gemm_mid_m_probe")
    assert probe.parse_list("all", "--shapes", allowed=probe.SHAPES) == list(probe.SHAPES)
    assert probe.parse_list("128,1024", "--ms", lo=65, hi=16384) == [128, 1024]
    for text in ("", "64", "x", "128,99999"):
        with pytest.raises(ValueError, match="--ms"):
            probe.parse_list(text, "--ms", lo=65, hi=16384)
    with pytest.raises(ValueError, match="--shapes"):
        probe.parse_list("qwen3-4b:nope", "--shapes", allowed=probe.SHAPES)
    with pytest.raises(SystemExit) as e:
        probe.main(["--out", "/tmp/x", "--rounds", "0"])
    assert e.value.code == 2
