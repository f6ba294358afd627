"""kernels/tik_v11: tik_v10 with each Gluon GEMM tile half's X box kept inside rows of x that exist.

The OOB probe on an H100 (evidence/probes/gemm/gluon_gemm_oob_probe-tik_v10.json) timed tik_v10's Gluon GEMM at
ragged M on Qwen3-4B / 8B o and down with the x descriptor given M rows (boxes past M zero-filled by TMA) and
given the rows of a whole-tile buffer (boxes on real rows): 4B down at M 129 took 55.0 against 33.8 us, 8B
down at M 65 68.9 against 42.8, the same bits. tik_v11 starts the box of a half that runs past M at M - 64
(_box_row) and stores only the half's own rows.

The CPU checks: only gemm_gluon.py differs from tik_v10 (the box rows, the store mask, M passed to the
producer); the box rule, run as Python, stores every row below M once, from a box inside [0, M) from M 64 up;
config_for chooses what tik_v10 chooses. Its contract records (evidence/tik_v11/, H100) pass every check; its
descendant tik_v13 is the folder selected for sm_90, and the sm_90 compile is checked in its parent tik_v12."""

from __future__ import annotations

import pathlib

import pytest

from areal_tik_plugin.runtime import loader
from tests.helpers.folders import assert_child
from tests.helpers.native_build import needs_triton36

ROOT = pathlib.Path(__file__).resolve().parents[2]
V10, V11 = ROOT / "kernels" / "tik_v10", ROOT / "kernels" / "tik_v11"


def test_tik_v11_changes_only_the_gluon_gemm():
    v10, v11 = assert_child(V10, V11, ["gemm_gluon.py"])
    src = v11["gemm_gluon.py"]
    # the box rows reach both loads and the consumer's rows; the store keeps the half's own rows only
    assert src.count("_box_row(pid_m * (HALVES * 64)") == 2 and "rows = _box_row(base, M) + offs_r" in src
    assert "(rows >= base) & (rows < M)" in src


@pytest.mark.parametrize("M", [1, 33, 63, 64, 65, 77, 96, 127, 128, 129, 160, 200, 255, 256, 257, 1000])
@pytest.mark.parametrize("halves", [1, 2])
def test_box_rows_exist_and_every_row_is_stored_once(M, halves):
    g = loader.load_implementation(str(V11)).module("gemm_gluon")
    box_row = g._box_row.fn
    stored = []
    for pid_m in range(-(-M // (64 * halves))):
        for half in range(halves):
            base = pid_m * 64 * halves + half * 64
            start = box_row(base, M)
            if M >= 64:
                assert 0 <= start and start + 64 <= M, (M, base, start)   # no row past M: no zero fill
            else:
                assert start == 0
            if base + 64 <= M:
                assert start == base                                      # full halves keep their rows
            stored += [r for r in range(start, start + 64) if base <= r < M]
    assert stored == list(range(M))


@needs_triton36
def test_config_for_is_tik_v10s():
    g10 = loader.load_implementation(str(V10)).module("gemm")
    g11 = loader.load_implementation(str(V11)).module("gemm")
    for M in (1, 33, 64, 65, 96, 128, 129, 200, 256, 257, 1024, 4096):
        for N, K in ((2560, 4096), (2560, 9728), (4096, 12288), (6144, 2560), (333, 4100)):
            assert g11.config_for(M, N, K, 132) == g10.config_for(M, N, K, 132), (M, N, K)
