"""Helpers for the row-wise op tests (norm, rope, swiglu, kv_write, logprob)."""

from __future__ import annotations

import torch

DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def bits(x: torch.Tensor) -> torch.Tensor:
    """Raw storage bits as an integer view of the same width (for bitwise comparisons)."""
    return x.contiguous().view({1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[x.element_size()])


def assert_bitwise(a: torch.Tensor, b: torch.Tensor, what: str = "") -> None:
    assert a.shape == b.shape and a.dtype == b.dtype, f"{what}: {a.shape}/{a.dtype} vs {b.shape}/{b.dtype}"
    if not torch.equal(bits(a), bits(b)):
        d = (a.double() - b.double()).abs()
        raise AssertionError(f"{what}: not bit-identical ({int((bits(a) != bits(b)).sum())} elements differ, "
                             f"max abs diff {float(d.max()):.3g})")


def assert_close(out: torch.Tensor, ref: torch.Tensor, atol: float, rtol: float, what: str = "") -> None:
    """|out - ref| <= atol + rtol * |ref| elementwise (ref in fp64)."""
    out64, ref64 = out.double(), ref.double()
    assert torch.isfinite(out64).all(), f"{what}: non-finite values"
    err = (out64 - ref64).abs()
    bound = atol + rtol * ref64.abs()
    bad = err > bound
    if bad.any():
        i = int(bad.flatten().nonzero()[0])
        raise AssertionError(f"{what}: {int(bad.sum())}/{err.numel()} elements out of tolerance (atol {atol}, "
                             f"rtol {rtol}); max abs err {float(err.max()):.3g}; first at flat index {i}: "
                             f"out {float(out64.flatten()[i])} ref {float(ref64.flatten()[i])}")


def rand(*shape, dtype=torch.bfloat16, scale=1.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g, dtype=torch.float32) * scale).to(dtype)
