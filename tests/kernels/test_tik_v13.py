"""kernels/tik_v13: tik_v11 with x read in two 32-row TMA boxes inside x on the Gluon GEMM's one tile below M 64.

tik_v11's OOB probe on an H100 (evidence/probes/gemm/gluon_gemm_oob_probe-tik_v11.json) still shows the zero fill
at M 33, where no 64-row box fits inside x: Qwen3-4B o 15.3 against 13.3 us with the descriptor over a whole-tile
buffer, 4B down 31.6 against 26.9, 8B o 17.7 / 16.2, 8B down 46.2 / 41.7, the same bits. tik_v13 loads rows
0..31 and M - 32..M - 1 into the two halves of the 64-row tile (x_box_rows) and stores each row once.

The CPU checks: only gemm_gluon.py differs from tik_v11; the box rule and the consumer's row map (the kernel's
expressions, run here as Python) store every row below M once from boxes inside x; config_for chooses what
tik_v11 chooses; the kernel compiles for sm_90 without spills with both box sizes, three TMA loads a stage with
32-row boxes; it is selected for no GPU."""

from __future__ import annotations

import json
import pathlib

import pytest

from areal_tik_plugin.runtime import loader
from tests.helpers.folders import assert_child
from tests.helpers.native_build import needs_triton36
from tests.helpers.scripts import ptxas_available, run_script

ROOT = pathlib.Path(__file__).resolve().parents[2]
V11, V13 = ROOT / "kernels" / "tik_v11", ROOT / "kernels" / "tik_v13"
# the consumer's row map for 32-row boxes, as the kernel writes it
ROW_MAP = "rows = gl.where(offs_r < XBOX, offs_r, offs_r + (M - 2 * XBOX))"
KEEP = "keep = (offs_r < XBOX) | (rows >= XBOX)"


def test_tik_v13_changes_only_the_gluon_gemm():
    v11, v13 = assert_child(V11, V13, ["gemm_gluon.py"])
    src = v13["gemm_gluon.py"]
    assert ROW_MAP in src and KEEP in src
    assert "[M - XBOX, col]" in src and "x0_s.index(st).slice(XBOX, XBOX)" in src


def test_tik_v13_is_not_selected_without_its_gpu_run():
    sel = json.loads((ROOT / "kernels" / "selection.json").read_text())
    assert "tik_v13" not in sel.values()


@pytest.mark.parametrize("M", [1, 32, 33, 40, 47, 63, 64, 65, 129])
@pytest.mark.parametrize("halves", [1, 2])
def test_box_rows(M, halves):
    g = loader.load_implementation(str(V13)).module("gemm_gluon")
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


@needs_triton36
def test_config_for_is_tik_v11s():
    g11 = loader.load_implementation(str(V11)).module("gemm")
    g13 = loader.load_implementation(str(V13)).module("gemm")
    for M in (1, 32, 33, 40, 63, 64, 65, 128, 129, 256, 1024):
        for N, K in ((2560, 4096), (2560, 9728), (4096, 12288), (6144, 2560), (333, 4100)):
            assert g13.config_for(M, N, K, 132) == g11.config_for(M, N, K, 132), (M, N, K)


@pytest.mark.skipif(not ptxas_available(), reason="triton's bundled ptxas not found")
def test_compiles_for_sm90_with_both_boxes(tmp_path):
    out = tmp_path / "gemm_gluon.json"
    r = run_script("compile_gemm_gluon_sm90", "--impl", str(V13), "--quick", "--json", str(out), timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    variants = json.loads(out.read_text())["variants"]
    assert {v["BLOCK_N"] for v in variants if v.get("xbox") == 32} == {256, 128, 64}
    for v in variants:
        assert v["spill_bytes"] == 0 and v["tma"] and v["wgmma"] == [f"m64n{v['BLOCK_N']}k16"], v
    # one more TMA copy per ring stage with 32-row boxes (two of x, one of w) than with the 64-row box
    key = lambda v: (v["BLOCK_N"], v["split"], v["chunks"], v["halves"])   # noqa: E731
    full = {key(v): v["tma_copies"] for v in variants if "xbox" not in v}
    assert all(v["tma_copies"] == full[key(v)] + 1 for v in variants if v.get("xbox") == 32)
