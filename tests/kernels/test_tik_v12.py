"""kernels/tik_v12: tik_v11 with the Gluon GEMM also taking the wide weights (qkv, gate_up) at M 65..128.

The Gluon probe on an H100 (evidence/probes/gemm/gluon_gemm_probe-tik_v7.json) timed every plan at M 128: the
64-row plan that plan() picks for Qwen3-4B / 8B / 30B-A3B qkv and gate_up (BLOCK_N 128; 64 on Qwen3-4B gate_up)
took 16.3 / 44.9 / 24.0 / 78.6 / 12.2 us against tik_v6's Triton kernels' 17.9 / 51.1 / 30.4 / 90.4 / 13.7 (the
kernels tik_v11 runs there) and cuBLAS's 14.4 / 44.4 / 21.8 / 78.2 / 10.3, with tik_v6's bits. tik_v11's box
rule makes M 65..127 cost what M 128 costs on those tiles.

The CPU checks: only gemm_gluon.py's host rule differs from tik_v11 (every Gluon kernel function is the same
source, so the sm_90 compile is tik_v11's); config_for differs from tik_v11's only on those weights at M 65..128,
on the probe's plan with tik_v11's Triton choice as the fallback; it is selected for no GPU."""

from __future__ import annotations

import ast
import json
import pathlib

from areal_tik_plugin.runtime import loader
from tests.helpers.folders import assert_child
from tests.helpers.native_build import needs_triton36

ROOT = pathlib.Path(__file__).resolve().parents[2]
V11, V12 = ROOT / "kernels" / "tik_v11", ROOT / "kernels" / "tik_v12"
SHAPES = {"4b_qkv": (6144, 2560), "4b_o": (2560, 4096), "4b_gate_up": (19456, 2560), "4b_down": (2560, 9728),
          "8b_qkv": (6144, 4096), "8b_o": (4096, 4096), "8b_gate_up": (24576, 4096), "8b_down": (4096, 12288),
          "1p5b_qkv": (2048, 1536), "1p5b_down": (1536, 8960), "30b_o": (2048, 4096), "30b_qkv": (5120, 2048),
          "4b_lm_head": (151936, 2560), "odd": (5121, 2049)}
WIDE = {"4b_qkv": "gluon_ws_m64_n128_fused_s8", "4b_gate_up": "gluon_ws_m64_n64_fused_s12",
        "8b_qkv": "gluon_ws_m64_n128_fused_s8", "8b_gate_up": "gluon_ws_m64_n128_fused_s8",
        "30b_qkv": "gluon_ws_m64_n128_fused_s8", "odd": "gluon_ws_m64_n128_fused_s8"}


def _jit_sources(text: str) -> dict[str, str]:
    tree = ast.parse(text)
    return {n.name: ast.get_source_segment(text, n) for n in tree.body if isinstance(n, ast.FunctionDef)
            and any("jit" in ast.unparse(d) for d in n.decorator_list)}


def test_tik_v12_changes_only_the_gluon_rule():
    v11, v12 = assert_child(V11, V12, ["gemm_gluon.py"])
    a, b = _jit_sources(v11["gemm_gluon.py"]), _jit_sources(v12["gemm_gluon.py"])
    assert a and a == b                                   # the kernels are tik_v11's, instruction for instruction


def test_tik_v12_is_not_selected_without_its_gpu_run():
    sel = json.loads((ROOT / "kernels" / "selection.json").read_text())
    assert "tik_v12" not in sel.values()


@needs_triton36
def test_config_for_adds_only_the_wide_weights_at_m65_to_128():
    g11 = loader.load_implementation(str(V11)).module("gemm")
    g12 = loader.load_implementation(str(V12)).module("gemm")
    for M in (1, 33, 64, 65, 77, 96, 127, 128, 129, 200, 256, 1024):
        for k, (N, K) in SHAPES.items():
            c11, c12 = g11.config_for(M, N, K, 132), g12.config_for(M, N, K, 132)
            if k in WIDE and 65 <= M <= 128:
                assert "gluon" not in c11 and c12["name"] == WIDE[k], (k, M, c12["name"])
                assert c12["gluon"]["halves"] == 1 and c12["gluon"]["split"] == 0
                assert c12["fallback"] == c11["name"], (k, M)
            else:
                assert c12 == c11, (k, M)
    assert "gluon" not in g12.config_for(96, 6144, 2560, 132, cpu=True)   # the CPU runs gemm.py's kernels
