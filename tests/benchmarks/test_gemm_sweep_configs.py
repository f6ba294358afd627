"""benchmarks/gemm_sweep.py's candidate lists on the CPU: every mid-M chunk-partial candidate it would time on a
split weight runs through the public linear with the bits of config_for's own choice (free knobs keep the
bits; on the GPU the sweep checks the same before it times a candidate)."""

import torch

from areal_tik_plugin.runtime import loader
from tests.helpers.scripts import load_script


def test_mid_m_partial_candidates_keep_the_bits():
    sweep = load_script("gemm_sweep")
    gemm = loader.load_implementation(loader.resolve_path("tik_v2")).module("gemm")
    M, N, K = 80, 96, 3200   # K >= GEMM_SPLIT_MIN_K: two chunks of 1600
    assert gemm.split_chunk(K) < K
    cands = [c for c in sweep.split_configs(256) if c["split"] == "partial"]
    assert {(c["BLOCK_M"], c["BLOCK_N"]) for c in cands} == {t[:2] for t in sweep.SPLIT_MID_PARTIAL}
    assert not [c for c in sweep.split_configs(sweep.SPLIT_MID_MAX_M + 1) if c["split"] == "partial"]
    torch.manual_seed(0)
    x = torch.randn(M, K, dtype=torch.bfloat16)
    w = (torch.randn(N, K) / K ** 0.5).to(torch.bfloat16)
    ref = gemm.linear(x, w).view(torch.int16)
    for c in cands:
        if c["num_stages"] == sweep.SPLIT_MID_STAGES[0]:   # stages change no bit; one per tile
            assert torch.equal(gemm.linear(x, w, config=c).view(torch.int16), ref), c["name"]
