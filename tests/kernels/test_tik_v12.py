"""kernels/tik_v12: tik_v11 with two Gluon GEMM changes measured only in probes, on disjoint shapes:

* the wide weights (qkv, gate_up) at M 65..128 (WIDE_RULE). The Gluon probe on an H100
  (evidence/probes/gemm/gluon_gemm_probe-tik_v7.json) timed every plan at M 128: the 64-row plan that plan() picks
  for Qwen3-4B / 8B / 30B-A3B qkv and gate_up (BLOCK_N 128; 64 on Qwen3-4B gate_up) took 16.3 / 44.9 / 24.0 /
  78.6 / 12.2 us against tik_v6's Triton kernels' 17.9 / 51.1 / 30.4 / 90.4 / 13.7 (the kernels tik_v11 runs
  there) and cuBLAS's 14.4 / 44.4 / 21.8 / 78.2 / 10.3, with tik_v6's bits;
* x in two 32-row TMA boxes inside x on the one tile below M 64 (x_box_rows). tik_v11's OOB probe
  (evidence/probes/gemm/gluon_gemm_oob_probe-tik_v11.json) still shows the zero fill at M 33, where no 64-row
  box fits inside x: Qwen3-4B o 15.3 against 13.3 us with the descriptor over a whole-tile buffer, 4B down 31.6 /
  26.9, 8B o 17.7 / 16.2, 8B down 46.2 / 41.7, the same bits.

The CPU checks: only gemm_gluon.py differs from tik_v11; config_for differs from tik_v11's only on the wide
weights at M 65..128, on the probe's plan with tik_v11's Triton choice as the fallback; the box rule and the
consumer's row map (the kernel's expressions, run here as Python) store every row below M once from boxes inside
x; the kernel compiles for sm_90 without spills with both box sizes, one more TMA copy a stage with 32-row boxes.
Its contract records (evidence/tik_v12/, H100: every check passes) and the probes
evidence/probes/gemm/gluon_gemm_{oob_,}probe-tik_v12.json (the same bits as tik_v11 at M 33..128) carry over to its
child tik_v13, the sm_90 selection, whose kernel functions are these."""

from __future__ import annotations

import json
import pathlib

import pytest

from areal_tik_plugin.runtime import loader
from tests.helpers.folders import assert_child
from tests.helpers.native_build import needs_triton36
from tests.helpers.scripts import ptxas_available, run_script

ROOT = pathlib.Path(__file__).resolve().parents[2]
V11, V12 = ROOT / "kernels" / "tik_v11", ROOT / "kernels" / "tik_v12"
SHAPES = {"4b_qkv": (6144, 2560), "4b_o": (2560, 4096), "4b_gate_up": (19456, 2560), "4b_down": (2560, 9728),
          "8b_qkv": (6144, 4096), "8b_o": (4096, 4096), "8b_gate_up": (24576, 4096), "8b_down": (4096, 12288),
          "1p5b_qkv": (2048, 1536), "1p5b_down": (1536, 8960), "30b_o": (2048, 4096), "30b_qkv": (5120, 2048),
          "4b_lm_head": (151936, 2560), "odd": (5121, 2049)}
WIDE = {"4b_qkv": "gluon_ws_m64_n128_fused_s8", "4b_gate_up": "gluon_ws_m64_n64_fused_s12",
        "8b_qkv": "gluon_ws_m64_n128_fused_s8", "8b_gate_up": "gluon_ws_m64_n128_fused_s8",
        "30b_qkv": "gluon_ws_m64_n128_fused_s8", "odd": "gluon_ws_m64_n128_fused_s8"}
# the consumer's row map for 32-row boxes, as the kernel writes it
ROW_MAP = "rows = gl.where(offs_r < XBOX, offs_r, offs_r + (M - 2 * XBOX))"
KEEP = "keep = (offs_r < XBOX) | (rows >= XBOX)"


def test_tik_v12_changes_only_the_gluon_gemm():
    _, v12 = assert_child(V11, V12, ["gemm_gluon.py"])
    src = v12["gemm_gluon.py"]
    assert ROW_MAP in src and KEEP in src
    assert "[M - XBOX, col]" in src and "x0_s.index(st).slice(XBOX, XBOX)" in src


@needs_triton36
def test_config_for_adds_only_the_wide_weights_at_m65_to_128():
    g11 = loader.load_implementation(str(V11)).module("gemm")
    g12 = loader.load_implementation(str(V12)).module("gemm")
    for M in (1, 32, 33, 40, 63, 64, 65, 77, 96, 127, 128, 129, 200, 256, 1024):
        for k, (N, K) in SHAPES.items():
            c11, c12 = g11.config_for(M, N, K, 132), g12.config_for(M, N, K, 132)
            if k in WIDE and 65 <= M <= 128:
                assert "gluon" not in c11 and c12["name"] == WIDE[k], (k, M, c12["name"])
                assert c12["gluon"]["halves"] == 1 and c12["gluon"]["split"] == 0
                assert c12["fallback"] == c11["name"], (k, M)
            else:
                assert c12 == c11, (k, M)
    assert "gluon" not in g12.config_for(96, 6144, 2560, 132, cpu=True)   # the CPU runs gemm.py's kernels


@pytest.mark.parametrize("M", [1, 32, 33, 40, 47, 63, 64, 65, 129])
@pytest.mark.parametrize("halves", [1, 2])
def test_box_rows(M, halves):
    g = loader.load_implementation(str(V12)).module("gemm_gluon")
    want = 32 if halves == 1 and 32 < M < 64 else 64
    assert g.x_box_rows(M, halves) == want


@pytest.mark.parametrize("M", range(33, 64))
def test_two_boxes_store_every_row_once_from_rows_of_x(M):
    XBOX = 32
    boxes = [(0, XBOX), (M - XBOX, XBOX)]                      # the producer's two loads
    assert all(0 <= r0 and r0 + n <= M for r0, n in boxes)    # inside x: nothing zero-filled
    stored = []
    for r in range(64):                                        # the consumer's map of its 64 accumulator rows
        row = r if r < XBOX else r + (M - 2 * XBOX)
        keep = r < XBOX or row >= XBOX
        # smem row r holds x row r (first box) or x row M - XBOX + (r - XBOX) (second): the same row as `row`
        assert row == (r if r < XBOX else boxes[1][0] + r - XBOX)
        if keep and row < M:
            stored.append(row)
    assert sorted(stored) == list(range(M)) and len(stored) == M


@pytest.mark.skipif(not ptxas_available(), reason="triton's bundled ptxas not found")
def test_compiles_for_sm90_with_both_boxes(tmp_path):
    out = tmp_path / "gemm_gluon.json"
    r = run_script("compile_gemm_gluon_sm90", "--impl", str(V12), "--quick", "--json", str(out), timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    variants = json.loads(out.read_text())["variants"]
    # every form plan() can choose, on 128-row tiles (two consumer warpgroups) and 64-row ones (one): 256 fused on
    # one chunk, 128 / 64 fused and split
    assert {(v["BLOCK_N"], v["split"], v["chunks"], v["halves"]) for v in variants if "xbox" not in v} == {
        (bn, s, c, h) for h in (1, 2) for bn, s, c in ((256, 0, 1), (128, 0, 1), (128, 1, 6), (64, 0, 1), (64, 1, 6))}
    assert {v["BLOCK_N"] for v in variants if v.get("xbox") == 32} == {256, 128, 64}
    for v in variants:
        assert v["spill_bytes"] == 0 and v["tma"] and v["wgmma"] == [f"m64n{v['BLOCK_N']}k16"], v
        assert not v["serialized_wgmma"] and v["fma_f32"] == 0, v
    # one more TMA copy per ring stage with 32-row boxes (two of x, one of w) than with the 64-row box
    key = lambda v: (v["BLOCK_N"], v["split"], v["chunks"], v["halves"])   # noqa: E731
    full = {key(v): v["tma_copies"] for v in variants if "xbox" not in v}
    assert all(v["tma_copies"] == full[key(v)] + 1 for v in variants if v.get("xbox") == 32)
