"""kernels/tik_v13: tik_v12 with the Gluon GEMM's rule widened where an H100 probe of tik_v12's plans timed them
against gemm.py's Triton kernels at M 256 and 512 (evidence/probes/gemm/gluon_gemm_probe-large-tik_v12.json, every
plan with tik_v11's bits):

* 64-row tiles at M 193..256 (four row tiles, as at M 256) on the o / down weights the rule already took there on
  128-row tiles: Qwen3-4B / 8B o and down 15.6 / 33.2 / 20.0 / 48.1 us against 15.9 / 34.1 / 20.2 / 54.9;
* the narrow weights of several chunks (N 1536..2048, K >= 4096: Qwen2.5-1.5B down, Qwen3-30B-A3B o) at M
  193..512 on 64-row tiles: 22.7 / 12.9 us at M 256 and 29.9 / 16.7 at M 512 against the Triton kernels' 28.4 /
  16.1 and 46.0 / 23.6.

The kernel itself is tik_v12's (its sm_90 compile check is test_tik_v12's); the CPU checks here: only
gemm_gluon.py differs, and only in the rule; config_for differs from tik_v12's exactly on those shapes and M,
with tik_v12's Triton or Gluon choice as the fallback / the other form, and is tik_v12's everywhere else.
It is selected for sm_90 on the records of its hash (H100): every contract check passes (evidence/tik_v13/), the
SGLang proof (evidence/sglang/sglang_gpu_proof-tik_v13-qwen3-4b-b48.json) and `tik verify`
(evidence/verify/verify-tik_v13-qwen3-4b-b48.json) are bit-identical."""

from __future__ import annotations

import pathlib

import pytest

from areal_tik_plugin.runtime import loader
from tests.helpers.folders import assert_child, jit_functions
from tests.helpers.native_build import needs_triton36

ROOT = pathlib.Path(__file__).resolve().parents[2]
V12, V13 = ROOT / "kernels" / "tik_v12", ROOT / "kernels" / "tik_v13"
SHAPES = {"1p5b_qkv": (2048, 1536), "1p5b_o": (1536, 1536), "1p5b_gate_up": (17920, 1536), "1p5b_down": (1536, 8960),
          "4b_qkv": (6144, 2560), "4b_o": (2560, 4096), "4b_gate_up": (19456, 2560), "4b_down": (2560, 9728),
          "8b_qkv": (6144, 4096), "8b_o": (4096, 4096), "8b_gate_up": (24576, 4096), "8b_down": (4096, 12288),
          "30b_qkv": (5120, 2048), "30b_o": (2048, 4096), "30b_router": (128, 2048), "4b_lm_head": (151936, 2560),
          "odd_narrow": (1537, 4097), "odd": (5121, 2049)}
O_DOWN = {"4b_o", "4b_down", "8b_o", "8b_down"}
NARROW = {"1p5b_down", "30b_o", "odd_narrow"}
# plan()'s BLOCK_N on 64-row tiles: the probe's fastest plan on every timed shape (M 256 / M 512)
NARROW_BN = {256: 64, 512: 128}


def test_tik_v13_is_the_sm90_selection():
    # that the selected folder's hash has passing contract records for every op is
    # tests/tools/test_evidence.py::test_selected_implementation_has_passing_gpu_evidence
    assert loader.selected_name("sm_90") == "tik_v13"


def test_tik_v13_changes_only_the_gluon_gemm_rule():
    v12, v13 = assert_child(V12, V13, ["gemm_gluon.py"])
    a, b = v12["gemm_gluon.py"], v13["gemm_gluon.py"]
    fa, fb = jit_functions(a, "gluon"), jit_functions(b, "gluon")
    assert fa and fa == fb     # the device code is tik_v12's
    assert "NARROW_RULE = ((193, 512), 4096, (1536, 2048))" in b and "HALVES_1_BANDS = ((193, 512),)" in b


@pytest.mark.parametrize("M,want", [(1, 1), (128, 1), (129, 2), (192, 2), (193, 1), (256, 1), (512, 1), (513, 2),
                                    (1024, 2)])
def test_halves_by_m(M, want):
    g = loader.load_implementation(str(V13)).module("gemm_gluon")
    assert g.halves_for(M) == want
    assert g.plan(M, 2560, 4096, 2048, 132)["halves"] == want


@needs_triton36
def test_config_for_differs_from_tik_v12_only_where_the_probe_timed_a_gain():
    g12 = loader.load_implementation(str(V12)).module("gemm")
    g13 = loader.load_implementation(str(V13)).module("gemm")
    changed = set()
    for M in (1, 33, 64, 65, 128, 129, 160, 192, 193, 200, 255, 256, 257, 300, 384, 511, 512, 513, 777, 1024, 4096):
        for k, (N, K) in SHAPES.items():
            c12, c13 = g12.config_for(M, N, K, 132), g13.config_for(M, N, K, 132)
            if k in O_DOWN and 193 <= M <= 256:
                assert c12["gluon"]["halves"] == 2 and c13["gluon"]["halves"] == 1, (k, M)
                assert c13["gluon"]["BLOCK_N"] == 128 and c13["gluon"]["split"] == 0, (k, M)
                assert c13["fallback"] == c12["fallback"], (k, M)
                changed.add((k, M))
            elif k in NARROW and 193 <= M <= 512:
                assert "gluon" not in c12 and c13["gluon"]["halves"] == 1 and c13["gluon"]["split"] == 0, (k, M)
                if M in NARROW_BN:
                    assert c13["gluon"]["BLOCK_N"] == NARROW_BN[M], (k, M, c13["name"])
                assert c13["fallback"] == c12["name"], (k, M)
                changed.add((k, M))
            else:
                assert c13 == c12, (k, M)
    assert len(changed) == 4 * 4 + 3 * 9   # M 193, 200, 255, 256; and 257, 300, 384, 511, 512
    assert "gluon" not in g13.config_for(256, 1536, 8960, 132, cpu=True)   # the CPU runs gemm.py's kernels
