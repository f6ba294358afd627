"""kernels/tik_v7: tik_v6 with the sm_90 mid-M GEMM in Gluon (gemm_gluon.py: a producer warp's TMA ring,
two consumer warpgroups' wgmma chains, persistent over (chunk, tile) or tile work items).

Gluon has no CPU interpreter, so the CPU checks what it can (the sm_90 compile of the selected descendant's
kernel: tests/kernels/test_tik_v12.py): the work items (the kernel's own integer functions, run as Python)
cover every (chunk, tile) once with the chunks of gemm.split_chunk; the plan rule and its refusals; and gemm.linear through a configuration marked for the
Gluon kernel keeps the parent's bits on the CPU (its Triton fallback). Bits on the GPU:
benchmarks/probes/gluon_gemm_probe.py."""

from __future__ import annotations

import itertools
import os

import pytest
import torch

from areal_tik_plugin.runtime import loader

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "kernels")
# (N, K) of the dense layers the probe times (gemm_sweep.SHAPES), plus odd ones
SHAPES = ((1536, 1536), (1536, 8960), (2560, 4096), (2560, 9728), (4096, 4096), (4096, 12288), (2048, 4096),
          (6144, 2560), (19456, 2560), (24576, 4096), (129, 3100), (80, 3200))


@pytest.fixture(scope="module")
def v7():
    impl = loader.load_implementation(os.path.join(ROOT, "tik_v7"))
    return impl.module("gemm"), impl.module("gemm_gluon")


@pytest.mark.parametrize("M", [1, 33, 64, 65, 128, 200, 256, 777, 1024])
def test_work_items_cover_every_chunk_of_every_tile_once(v7, M):
    gemm, g = v7
    bk = 64
    for (N, K), split in itertools.product(SHAPES, (0, 1)):
        chunk = gemm.split_chunk(K)
        p = g.plan(M, N, K, chunk, 132, g.config(split=split))
        seen = []
        for prog in range(p["programs"]):
            for w in range(prog, p["items"], p["programs"]):
                c, t, pm, pn = g._item.fn(w, p["n_m"], p["n_n"], p["group"], bool(p["split"]))
                assert 0 <= pm < p["n_m"] and 0 <= pn < p["n_n"] and t == w % p["tiles"]
                k_lo, n_k = g._k_range.fn(c, K, chunk, bk, bool(p["split"]))
                seen.append((c, pm, pn, k_lo, n_k))
        chunks = p["n_chunks"] if p["split"] else 1
        assert len(seen) == len(set(seen)) == p["tiles"] * chunks, (N, K, p)
        assert {(pm, pn) for _, pm, pn, _, _ in seen} == set(itertools.product(range(p["n_m"]), range(p["n_n"])))
        if p["split"]:  # chunk c covers columns [c * chunk, min(K, (c + 1) * chunk)) in GEMM_BLOCK_K steps
            for c, _, _, k_lo, n_k in seen:
                assert k_lo == c * chunk and n_k == -(-(min(K, k_lo + chunk) - k_lo) // bk)
        else:           # one item walks all of K; the consumer cuts it at the same chunk ends
            assert all(k_lo == 0 and n_k == -(-K // bk) for _, _, _, k_lo, n_k in seen)
            assert sum(g._k_range.fn(cc, K, chunk, bk, True)[1] for cc in range(p["n_chunks"])) == -(-K // bk)


def test_plan_rule(v7):
    gemm, g = v7
    for (N, K), M in itertools.product(SHAPES, (1, 64, 65, 128, 256, 512, 1024)):
        chunk = gemm.split_chunk(K)
        p = g.plan(M, N, K, chunk, 132)
        assert p["programs"] == min(p["items"], 132)
        assert p["split"] == 0 or p["n_chunks"] > 1          # one-chunk weights never go through the workspace
        assert p["BLOCK_N"] < 256 or p["n_chunks"] == 1       # two accumulators of 128 registers would spill
        assert g.ring_bytes(p["BLOCK_N"], p["stages"], p["halves"]) <= g.SMEM_RING_MAX
        assert p["halves"] == (1 if M <= g.HALVES_1_MAX_M else 2) and p["n_m"] == -(-M // (64 * p["halves"]))
    # Qwen3-8B down at M = 256: 64 tiles of 128 x 128 leave half the SMs idle -> 6 chunks x 64 tiles of items
    p = g.plan(256, 4096, 12288, gemm.split_chunk(12288), 132)
    assert (p["BLOCK_N"], p["split"], p["items"], p["programs"]) == (128, 1, 384, 132)
    # ... at M = 1024 the tiles alone fill the SMs: no workspace
    assert g.plan(1024, 4096, 12288, gemm.split_chunk(12288), 132)["split"] == 0


def test_knobs_are_checked(v7):
    gemm, g = v7
    with pytest.raises(ValueError, match="unknown knob 'warps'"):
        g.config(warps=8)
    with pytest.raises(ValueError, match=r"BLOCK_N=96; expected one of \(256, 128, 64\)"):
        g.config(BLOCK_N=96)
    with pytest.raises(ValueError, match="stages <= 4 there"):
        g.plan(256, 4096, 4096, 2048, 132, g.config(BLOCK_N=256, stages=6))
    with pytest.raises(ValueError, match="halves=2 needs 294912 bytes.*stages <= 8 there"):
        g.plan(64, 4096, 4096, 2048, 132, g.config(BLOCK_N=64, stages=12, halves=2))
    with pytest.raises(ValueError, match=r"halves=3; expected one of \(1, 2\)"):
        g.config(halves=3)


def test_config_for_marks_the_band_and_keeps_a_triton_fallback(v7):
    gemm, g = v7
    names = {c["name"] for c in gemm.all_configs()}
    cfg = gemm.config_for(256, 4096, 12288, 132)
    assert cfg["gluon"] == {"BLOCK_N": 128, "split": 1, "stages": g.STAGES[128, 2], "halves": 2} and cfg["name"] in names
    assert cfg["fallback"] in names and not cfg["fallback"].startswith("gluon")
    assert "gluon" not in gemm.config_for(64, 4096, 12288, 132)              # decode-sized: gemm.py's kernels
    assert "gluon" not in gemm.config_for(g.MAX_M + 1, 4096, 12288, 132)     # large M: gemm.py's kernels
    assert "gluon" not in gemm.config_for(256, 4096, 12288, 132, cpu=True)
    assert "gluon" not in gemm.config_for(1024, 128, 2048, 132)              # the router: 8 tiles, too few items


@pytest.mark.parametrize("M,N,K", [(67, 80, 3200), (131, 129, 1536)])
def test_a_gluon_configuration_keeps_the_parents_bits_on_the_cpu(v7, M, N, K):
    """On the CPU gemm_gluon does not apply, so a configuration marked for it runs its Triton keys: tik_v6's bits."""
    gemm, _ = v7
    v6 = loader.load_implementation(os.path.join(ROOT, "tik_v6")).module("gemm")
    g = torch.Generator().manual_seed(M + N)
    x = torch.randn(M, K, generator=g).to(torch.bfloat16)
    w = (torch.randn(N, K, generator=g) / K ** 0.5).to(torch.bfloat16)
    b = torch.randn(N, generator=g).to(torch.bfloat16)
    ref = v6.linear(x, w, b)
    for cfg in [c for c in gemm.all_configs() if "gluon" in c][:2]:
        got = gemm.linear(x, w, b, config=cfg)
        assert torch.equal(got.view(torch.int16), ref.view(torch.int16)), cfg["name"]
