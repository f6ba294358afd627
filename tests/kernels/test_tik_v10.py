"""kernels/tik_v10: tik_v9 with its Gluon GEMM band widened to M 65..128 on 64-row tiles.

The Gluon probe on an H100 (evidence/probes/gemm/gluon_gemm_probe-tik_v7.log) timed every plan at M 128: on
Qwen3-4B / 8B o and down (the shapes tik_v9's rule hands to Gluon) the 64-row plan unsplit on BLOCK_N 64 took
12.8 / 27.2 / 16.6 / 42.8 us against cuBLAS's 11.3 / 27.2 / 15.1 / 41.7 and tik_v6's (tik_v9's Triton kernels
there) 16.2 / 34.9 / 19.4 / 66.5, with tik_v6's bits. tik_v9 runs those Triton kernels at M 65..128.

The CPU checks: tik_v10 differs from tik_v9 in two knobs of gemm_gluon.py only (no instruction of any kernel), so
every bit is a bit of a kernel tik_v9 already ran; config_for hands Gluon exactly tik_v9's shapes plus the rule's
shapes at M 65..128, on the measured plan; everywhere else tik_v10 chooses what tik_v9 chooses."""

from __future__ import annotations

import json
import pathlib

from areal_tik_plugin.runtime import loader
from tests.helpers.folders import assert_child
from tests.helpers.native_build import needs_triton36

ROOT = pathlib.Path(__file__).resolve().parents[2]
V9, V10 = ROOT / "kernels" / "tik_v9", ROOT / "kernels" / "tik_v10"
SHAPES = {"4b_qkv": (6144, 2560), "4b_o": (2560, 4096), "4b_gate_up": (19456, 2560), "4b_down": (2560, 9728),
          "8b_qkv": (6144, 4096), "8b_o": (4096, 4096), "8b_gate_up": (24576, 4096), "8b_down": (4096, 12288),
          "1p5b_down": (1536, 8960), "30b_o": (2048, 4096), "30b_qkv": (5120, 2048), "odd": (333, 4100)}
RULE = ("4b_o", "4b_down", "8b_o", "8b_down")


def _code(text: str) -> list[str]:
    """The lines that are not comments, without the module docstring's Status paragraph (which says where the
    file has run); every other docstring line stays."""
    head, sep, rest = text.partition("\nStatus:")
    text = head + rest[rest.index('"""'):] if sep else text
    return [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]


def test_tik_v10_is_tik_v9_with_the_band_widened():
    v9, v10 = assert_child(V9, V10, ["gemm_gluon.py"])
    a, b = _code(v9["gemm_gluon.py"]), _code(v10["gemm_gluon.py"])
    assert len(a) == len(b)
    changed = [(x, y) for x, y in zip(a, b) if x != y]
    assert changed == [("HALVES_1_MAX_M = 64", "HALVES_1_MAX_M = 128"),
                       ("BANDS = ((33, 64), (129, 256))", "BANDS = ((33, 256),)")]


def test_tik_v10_is_not_selected_without_its_gpu_run():
    sel = json.loads((ROOT / "kernels" / "selection.json").read_text())
    assert "tik_v10" not in sel.values()


@needs_triton36
def test_config_for_widens_only_the_rule_band():
    g9 = loader.load_implementation(str(V9)).module("gemm")
    g10 = loader.load_implementation(str(V10)).module("gemm")
    for M in (1, 8, 32, 33, 64, 65, 77, 96, 127, 128, 129, 200, 256, 257, 1024, 4096):
        for k, (N, K) in SHAPES.items():
            c9, c10 = g9.config_for(M, N, K, 132), g10.config_for(M, N, K, 132)
            if k in RULE and 65 <= M <= 128:
                # the probe's plan at M 128, with tik_v9's Triton choice kept as the fallback
                assert c10["name"] == "gluon_ws_m64_n64_fused_s12", (k, M, c10["name"])
                assert c10["gluon"] == {"BLOCK_N": 64, "split": 0, "stages": 12, "halves": 1}
                assert "gluon" not in c9 and c10["fallback"] == c9["name"], (k, M)
            else:
                assert c10 == c9, (k, M)


@needs_triton36
def test_plan_at_m128_fills_the_sms_with_two_row_tiles():
    gl = loader.load_implementation(str(V10)).module("gemm_gluon")
    gemm = loader.load_implementation(str(V10)).module("gemm")
    for k in RULE:
        N, K = SHAPES[k]
        for M in (65, 128):
            p = gl.plan(M, N, K, gemm.split_chunk(K), 132)
            assert (p["halves"], p["n_m"], p["BLOCK_N"], p["split"]) == (1, 2, 64, 0), (k, M, p)
            assert p["items"] == 2 * N // 64 and p["programs"] == min(p["items"], 132)
            assert gl.ring_bytes(64, p["stages"], 1) <= gl.SMEM_RING_MAX
