"""GPU probe: the GEMM between the decode-sized rule and the large-M tiles (64 < M <= 1024).

Session 20's full benchmark grid (``python3 -m areal_tik_plugin.gpu --ops gemm --no-checks``, kernels 3285341)
found M=256 at 0.635x cuBLAS (geomean over 13 shapes, weights streamed) and the narrow split weights at
M=1024 at 0.70-0.79x: there ``config_for`` picks a 128-row large-M tile, so e.g. Qwen3-4B ``o`` at M=256
runs 2 x 20 = 40 programs on 132 SMs, and the 128-column router at M=1024 runs 8. This probe times, per
(shape, M), the current choice against smaller tiles on the same kernels (every configuration gives the
same bits: the K partition is fixed by ``split_chunk(K)``; each variant's output is compared bit for bit
with the default's):

* unsplit weights: the decode-sized TMA kernel with 64-row tiles over M/64 row tiles (``tma_m64_n*``), and
  the large-M persistent kernel at 64 x 64 / 64 x 128 / 128 x 64;
* split weights: the chunk-partial path with 64- or 128-row tiles (``partial_m*_n*``: tiles x chunks
  programs, the ordered reduce in each tile's last program), the fused flat path at 64 rows
  (``flat_m64_n*``), and the large split tile at 64 x 128.

    python scripts/gemm_mid_m_probe.py --out DIR [--ms 128,256,512,1024] [--shapes all|name,...] [--rounds 2]
"""

from __future__ import annotations

import sys

from areal_tik_plugin.gpu import probe
from areal_tik_plugin.gpu.probe import parse_list
from areal_tik_plugin.gpu.gemm import SHAPES as _BENCH_SHAPES, named_shapes

# the benchmark grid's weights without the lm_heads (their large tile already fills the GPU at M=128)
SHAPES = {k: v for k, v in named_shapes().items() if tuple(k.split(":")) in _BENCH_SHAPES and not k.endswith(":lm_head")}


def variants(gemm, M: int, N: int, K: int, n_sms: int) -> dict:
    """name -> configuration, built with the implementation's own helpers."""
    cdiv = gemm._cdiv
    out = {"default": gemm.config_for(M, N, K, n_sms)}
    chunks = cdiv(K, gemm.split_chunk(K))
    if chunks == 1:
        for bn in (64, 128):
            out[f"tma_m64_n{bn}"] = gemm._small_config(64, bn, split="fused", warps=4, tma=True,
                                                       programs=cdiv(M, 64) * cdiv(N, bn), num_sms=n_sms)
        out["ptr_m64_n32"] = gemm._small_config(64, 32, split="fused", warps=4, tma=False,
                                                programs=cdiv(M, 64) * cdiv(N, 32), num_sms=n_sms)
        for bm, bn in ((64, 64), (64, 128), (128, 64)):
            out[f"large_m{bm}_n{bn}"] = gemm._large_config(bm, bn, 4, 4)
    else:
        for bm, bn, warps in ((64, 32, 4), (64, 64, 4), (64, 128, 4), (128, 64, 4), (128, 128, 8)):
            out[f"partial_m{bm}_n{bn}_w{warps}"] = gemm._small_config(
                bm, bn, split="partial", warps=warps, programs=cdiv(M, bm) * cdiv(N, bn) * chunks, num_sms=n_sms)
        for bn in (64, 128):
            out[f"flat_m64_n{bn}"] = gemm._small_config(64, bn, split="fused", flat=True,
                                                        programs=cdiv(M, 64) * cdiv(N, bn), num_sms=n_sms)
        out["large_split_m64_n128"] = gemm._large_config(64, 128, 4, 4, split_weight=True)
    return out


def main(argv=None) -> int:
    ap = probe.parser("gemm_mid_m_probe", rounds=2)
    ap.add_argument("--ms", default="128,256,512,1024")
    ap.add_argument("--shapes", default="all")
    args, (ms, shapes) = probe.parse(ap, argv, lambda a: (parse_list(a.ms, "--ms", lo=65, hi=16384),
                                                          parse_list(a.shapes, "--shapes", allowed=SHAPES)))
    if probe.cuda_missing("gemm_mid_m_probe"):
        return 2
    import torch

    from areal_tik_plugin.gpu.gemm import _weight_copies
    from areal_tik_plugin.loader import get_implementation

    impl = get_implementation()
    gemm = impl.module("gemm")
    n_sms = torch.cuda.get_device_properties(0).multi_processor_count
    res = probe.new_result(impl)
    for name in shapes:
        N, K = SHAPES[name]
        ws, _ = _weight_copies(N, K, False, seed=N + K)
        for M in ms:
            x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
            row = {"shape": name, "M": M, "N": N, "K": K,
                   **probe.gemm_config_row(gemm, x, ws, variants(gemm, M, N, K, n_sms), args.rounds)}
            res["rows"].append(row)
            print(probe.gemm_row_line(f"{name:<22} M={M:<5}", row), flush=True)
        del ws
        torch.cuda.empty_cache()
    for M in ms:
        rows = [r for r in res["rows"] if r["M"] == M]
        print(f"M={M}: vs cuBLAS default {probe.geomean([r['us']['cublas'] / r['us']['default'] for r in rows]):.3f}, "
              f"best per shape {probe.geomean([r['us']['cublas'] / r['us'][r['best']] for r in rows]):.3f}")
    return probe.write_result(res, args.out, "gemm_mid_m_probe.json", "rows")


if __name__ == "__main__":
    sys.exit(main())
