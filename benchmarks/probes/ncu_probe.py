"""GPU probe target for Nsight Compute: our kernels and the baseline's on the same shapes, one launch each
inside a profiler window, so that ``ncu --profile-from-start off`` reports only those.

Cases (``--cases``, comma list):

* ``gemm:<shape>:<M>``: ``ops.linear`` with the implementation's own configuration, then cuBLAS
  ``F.linear`` on the same x / weight (the contract suite's GEMM shapes);
* ``decode:<B>:<ctx>``: paged decode attention (page size 1, Hq 32, Hkv 8, D 128: Qwen3-4B / 8B), then
  cuDNN SDPA on the same shape with a dense cache.
* ``prefill:<B>:<L>``: causal packed-varlen prefill of B sequences of L tokens (``attention_varlen``, same
  heads), then cuDNN SDPA (causal, GQA) on the same q / k / v as [B, H, L, D].

Each case runs twice before the window (compile, autotune-free warm-up) and once inside it. ncu's default
cache control flushes the caches before every replay pass, so the weights / KV come from HBM, as in decode.

    ncu --clock-control none --profile-from-start off --set full -o OUT/ncu_probe \\
        python benchmarks/probes/ncu_probe.py --cases gemm:qwen3-4b:down:64,decode:1:8192
    ncu --import OUT/ncu_probe.ncu-rep --page details > OUT/ncu_probe.txt

Without ncu the script still runs (the profiler window is a no-op) and prints the cases' kernel order.
"""

from __future__ import annotations

import argparse
import sys

from areal_tik_plugin.contract.gemm import named_shapes

GEMM_SHAPES = named_shapes()
MAX_DECODE_TOKENS = 1 << 21   # B * ctx: the dense + paged caches stay under ~4 GB each
MAX_PREFILL_TOKENS = 1 << 17  # B * L: q / k / v and the baseline's copies stay under ~2 GB
MAX_TOKENS = {"decode": MAX_DECODE_TOKENS, "prefill": MAX_PREFILL_TOKENS}


def parse_cases(text: str) -> list[tuple]:
    """``gemm:<shape>:<M>`` / ``decode:<B>:<ctx>`` / ``prefill:<B>:<L>`` → ("gemm", shape, M) /
    ("decode", B, ctx) / ("prefill", B, L)."""
    out = []
    for item in [s for s in text.split(",") if s]:
        parts = item.split(":")
        try:
            if parts[0] == "gemm" and len(parts) == 4:
                shape, m = f"{parts[1]}:{parts[2]}", int(parts[3])
                if shape not in GEMM_SHAPES or not 1 <= m <= 65536:
                    raise ValueError
                out.append(("gemm", shape, m))
                continue
            if parts[0] in MAX_TOKENS and len(parts) == 3:
                b, n = int(parts[1]), int(parts[2])
                if not (1 <= b <= 256 and 1 <= n and b * n <= MAX_TOKENS[parts[0]]):
                    raise ValueError
                out.append((parts[0], b, n))
                continue
        except ValueError:
            pass
        raise ValueError(f"--cases: {item!r} is not gemm:<shape>:<M> (shape one of {sorted(GEMM_SHAPES)}, "
                         f"1 <= M <= 65536), decode:<B>:<ctx> (1 <= B <= 256, B*ctx <= {MAX_DECODE_TOKENS}) or "
                         f"prefill:<B>:<L> (1 <= B <= 256, B*L <= {MAX_PREFILL_TOKENS})")
    if not out:
        raise ValueError("--cases: expected at least one case")
    return out


def build(case, torch, F):
    """Two callables (ours, baseline) for one case."""
    if case[0] == "gemm":
        from areal_tik_plugin.ops import linear

        N, K = GEMM_SHAPES[case[1]]
        w = (torch.randn(N, K, device="cuda") / K ** 0.5).to(torch.bfloat16)
        x = torch.randn(case[2], K, device="cuda", dtype=torch.bfloat16)
        return (lambda: linear(x, w)), (lambda: F.linear(x, w))
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from areal_tik_plugin.ops import attention_decode, attention_varlen

    Hq, Hkv, D = 32, 8, 128
    if case[0] == "prefill":
        B, n = case[1], case[2]
        q = torch.randn(B * n, Hq, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(B * n, Hkv, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(B * n, Hkv, D, device="cuda", dtype=torch.bfloat16)
        cu = torch.arange(0, B + 1, device="cuda", dtype=torch.int32) * n
        # the baseline's [B, H, L, D] copies are made here, outside the profiled launches
        q4, k4, v4 = (t.view(B, n, -1, D).transpose(1, 2).contiguous() for t in (q, k, v))

        def ours_p():
            return attention_varlen(q, k, v, cu, max_seqlen=n)

        def base_p():
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                return F.scaled_dot_product_attention(q4, k4, v4, is_causal=True, enable_gqa=True)

        return ours_p, base_p
    B, ctx = case[1], case[2]
    k = torch.randn(B, Hkv, ctx, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(B, Hkv, ctx, D, device="cuda", dtype=torch.bfloat16)
    # page size 1: token slot = b * ctx + t, the pool [B*ctx, Hkv, D], one table row per request
    k_pool = k.transpose(1, 2).reshape(B * ctx, Hkv, D).contiguous()
    v_pool = v.transpose(1, 2).reshape(B * ctx, Hkv, D).contiguous()
    table = torch.arange(B * ctx, device="cuda", dtype=torch.int32).view(B, ctx)
    rows = torch.arange(B, device="cuda", dtype=torch.int32)
    sl = torch.full((B,), ctx, device="cuda", dtype=torch.int32)
    q = torch.randn(B, Hq, D, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(q)
    q4 = q.unsqueeze(2)

    def ours():
        return attention_decode(q, k_pool, v_pool, seq_lens=sl, kv_indices=table, table_rows=rows,
                                max_context_len=ctx, out=out)

    def base():
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return F.scaled_dot_product_attention(q4, k, v, enable_gqa=True)

    return ours, base


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python benchmarks/probes/ncu_probe.py")
    ap.add_argument("--cases", default="gemm:qwen3-4b:down:64,gemm:qwen3-4b:o:64,gemm:qwen3-4b:down:1,decode:1:8192")
    args = ap.parse_args(argv)
    try:
        cases = parse_cases(args.cases)
    except ValueError as e:
        ap.error(str(e))
    import torch
    import torch.nn.functional as F

    if not torch.cuda.is_available():
        print("ncu_probe: needs a CUDA device", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    fns = []
    for case in cases:
        ours, base = build(case, torch, F)
        for _ in range(2):
            ours(), base()
        fns.append((case, ours, base))
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for case, ours, base in fns:
        torch.cuda.nvtx.range_push(f"{':'.join(map(str, case))}/ours")
        ours()
        torch.cuda.nvtx.range_pop()
        torch.cuda.nvtx.range_push(f"{':'.join(map(str, case))}/baseline")
        base()
        torch.cuda.nvtx.range_pop()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    for case, _, _ in fns:
        print("case", ":".join(map(str, case)), "-> ours, then baseline")
    return 0


if __name__ == "__main__":
    sys.exit(main())
