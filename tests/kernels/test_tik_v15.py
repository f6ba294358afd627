"""kernels/tik_v15: tik_v13 with GEMM tiles whose width is not a power of two (gemm.WIDE_TILES).

Nsight Compute of tik_v13 beside cuBLAS on an H100 (evidence/probes/ncu/ncu_gemm{,256}-tik_v13.txt) shows cuBLAS
sizing its tiles to the SMs: Qwen3-4B qkv at M 256 on 96 x 128 tiles (128 CTAs, 17.8 us against tik_v13's 22.0
on 96 tiles of 128 x 128), Qwen3-30B-A3B qkv on 80 x 128 (14.1 against 17.0), Qwen3-4B down and o at M 1024 on
168 x 128 (128 CTAs; 68.8 / 31.9 us against 101.3 / 44.8 on 80 tiles of 128 x 256). A Triton tile must be a
power of two wide, so tik_v15's persistent TMA kernel runs a tile of BLOCK_N + BLOCK_N2 columns as two dots on
one x tile; each output column is still one chain per chunk over the same K pieces, so the bits are any tile
width's. config_for weighs these tiles with the power-of-two ones by the same wave model (their speeds are
the model's guesses until a GPU probe measures them).

The CPU checks: only gemm.py differs from tik_v13, and its other kernels are tik_v13's; under the interpreter the
wide tiles give the bits of the CPU path at odd shapes, with and without bias, on split weights, in fp16, and a
misaligned output runs the BLOCK_N tile alone; config_for equals tik_v13's with WIDE_TILES off and picks the
tile counts above with it on; the sm_90 compile of every wide variant has no spill and no serialized wgmma.
Not selected: no GPU evidence on its hash yet."""

from __future__ import annotations

import pathlib
import re

import pytest
import torch

from areal_tik_plugin.runtime import loader
from tests.helpers.folders import assert_child, jit_functions
from tests.helpers.native_build import needs_triton36
from tests.helpers.scripts import ptxas_available, run_script

ROOT = pathlib.Path(__file__).resolve().parents[2]
V13, V15 = ROOT / "kernels" / "tik_v13", ROOT / "kernels" / "tik_v15"
SHAPES = {"1p5b_qkv": (2048, 1536), "1p5b_o": (1536, 1536), "1p5b_gate_up": (17920, 1536), "1p5b_down": (1536, 8960),
          "4b_qkv": (6144, 2560), "4b_o": (2560, 4096), "4b_gate_up": (19456, 2560), "4b_down": (2560, 9728),
          "8b_qkv": (6144, 4096), "8b_o": (4096, 4096), "8b_gate_up": (24576, 4096), "8b_down": (4096, 12288),
          "30b_qkv": (5120, 2048), "30b_o": (2048, 4096), "4b_lm_head": (151936, 2560), "odd": (5121, 2049)}


def test_tik_v15_changes_only_gemm_and_one_kernel():
    v13, v15 = assert_child(V13, V15, ["gemm.py"])
    a, b = jit_functions(v13["gemm.py"]), jit_functions(v15["gemm.py"])
    assert set(b) - set(a) == {"_tma_chain2"} and set(a) <= set(b)
    assert [k for k in a if a[k] != b[k]] == ["_linear_tma_persistent_kernel"]


def _gemm():
    return loader.load_implementation(str(V15)).module("gemm")


@pytest.fixture
def launched(monkeypatch):
    """(kernel name, BLOCK_N2) of every launch gemm.linear makes."""
    g, seen = _gemm(), []
    real = g.launch

    def record(fn, grid, *a, **kw):
        seen.append((fn.__name__, kw.get("BLOCK_N2", 0)))
        return real(fn, grid, *a, **kw)

    monkeypatch.setattr(g, "launch", record)
    return seen


@pytest.mark.parametrize("M,N,K", [(130, 200, 192), (33, 168, 128), (63, 104, 4200)])
@pytest.mark.parametrize("bias", [False, True])
def test_wide_tiles_keep_the_bits(M, N, K, bias, launched):
    g = _gemm()
    torch.manual_seed(M * N + K)
    x = torch.randn(M, K).bfloat16()
    w = (torch.randn(N, K) / K ** 0.5).bfloat16()
    b = torch.randn(N).bfloat16() if bias else None
    want = g.linear(x, w, b)            # the CPU configuration: pointer loads, power-of-two tiles
    split = g.split_chunk(K) < K
    for cfg in (g._wide_config(32, 16, 16, 4, 2, split), g._wide_config(64, 32, 16, 4, 2, split)):
        launched.clear()
        got = g.linear(x, w, b, config=cfg)
        assert launched == [("_linear_tma_persistent_kernel", cfg["BLOCK_N2"])], launched
        assert torch.equal(got.view(torch.int16), want.view(torch.int16)), (cfg["name"], M, N, K)


def test_wide_tiles_fp16_and_a_misaligned_output(launched):
    g = _gemm()
    torch.manual_seed(7)
    M, N, K = 77, 99, 320
    x, w = torch.randn(M, K).half(), (torch.randn(N, K) / K ** 0.5).half()
    cfg = g._wide_config(32, 32, 16, 4, 2, False)
    want = g.linear(x, w)
    assert torch.equal(g.linear(x, w, config=cfg).view(torch.int16), want.view(torch.int16))
    # an output whose row stride is not 16-byte aligned: no TMA, the BLOCK_N tile alone on the pointer kernel
    launched.clear()
    out = torch.empty(M, N + 1, dtype=x.dtype)[:, :N]
    got = g.linear(x, w, config=cfg, out=out)
    assert launched == [("_linear_ptr_kernel", 0)]
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))


@needs_triton36
def test_config_for_is_tik_v13s_with_wide_tiles_off(monkeypatch):
    g13 = loader.load_implementation(str(V13)).module("gemm")
    g15 = _gemm()
    monkeypatch.setattr(g15, "WIDE_TILES", False)
    g15._config_for.cache_clear()
    try:
        for M in (1, 64, 65, 128, 200, 256, 512, 777, 1024, 2048, 4096, 16384):
            for k, (N, K) in SHAPES.items():
                assert g15.config_for(M, N, K, 132) == g13.config_for(M, N, K, 132), (k, M)
    finally:
        g15._config_for.cache_clear()


@needs_triton36
@pytest.mark.parametrize("shape,M,want,tiles", [
    ("4b_qkv", 256, (64, 32), 128),        # cuBLAS: 96 x 128 tiles, 128 CTAs
    ("30b_qkv", 256, (64, 16), 128),       # cuBLAS: 80 x 128
    ("4b_down", 1024, (128, 32), 128),     # cuBLAS: 168 x 128, 128 CTAs
    ("4b_o", 1024, (128, 32), 128),
    ("4b_gate_up", 256, (128, 32), 244),   # two full waves of 160-wide tiles (cuBLAS: 320 x 128, persistent)
])
def test_config_for_sizes_tiles_to_the_sms(shape, M, want, tiles):
    g = _gemm()
    N, K = SHAPES[shape]
    cfg = g.config_for(M, N, K, 132)
    assert (cfg["BLOCK_N"], cfg.get("BLOCK_N2")) == want and cfg["persistent"] and cfg["tma"], cfg["name"]
    assert -(-M // cfg["BLOCK_M"]) * -(-N // (cfg["BLOCK_N"] + cfg["BLOCK_N2"])) == tiles
    assert "BLOCK_N2" not in g.config_for(M, N, K, 132, cpu=True)   # the CPU runs power-of-two tiles


def test_every_wide_configuration_is_listed():
    g = _gemm()
    names = {c["name"] for c in g.all_configs()}
    for bm, bn, bn2, w, st, _, _ in g.LARGE_M_WIDE_TILES:
        assert g._wide_config(bm, bn, bn2, w, st, False)["name"] in names
    for bm, bn, bn2, w, st, _, _ in g.LARGE_M_SPLIT_WIDE_TILES:
        assert g._wide_config(bm, bn, bn2, w, st, True)["name"] in names


@pytest.mark.skipif(not ptxas_available(), reason="triton's bundled ptxas not found")
def test_wide_tiles_compile_for_sm90_without_spills_or_serialized_wgmma():
    r = run_script("compile_gemm_moe_sm90", "--impl", str(V15), "--only", "linear_tma_persistent/bf16", timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    wide = [ln for ln in r.stdout.splitlines() if re.search(r"_n\d+p\d+_", ln)]
    assert len(wide) == 2 * len(_gemm().LARGE_M_WIDE_TILES) + 4 * len(_gemm().LARGE_M_SPLIT_WIDE_TILES)
    for ln in wide:
        assert ln.startswith("ok") and "spill    0" in ln and "wgmma" in ln and "serial" not in ln, ln
