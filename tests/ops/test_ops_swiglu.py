"""SwiGLU (separate and fused gate_up): CPU tests (interpreter)."""

from __future__ import annotations

import pytest
import torch

from areal_tik_plugin import ops

from tests.helpers.rowops_testutil import assert_bitwise, assert_close, rand

TOL = {torch.bfloat16: (1e-5, 2 ** -8), torch.float16: (1e-5, 2 ** -10), torch.float32: (1e-6, 1e-6)}
TOL_GRAD = {torch.bfloat16: 1e-2, torch.float16: 2e-3, torch.float32: 1e-5}


def ref(g, u):
    g = g.double()
    return g * torch.sigmoid(g) * u.double()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("M,I", [(1, 768), (17, 1000), (129, 96)])
def test_accuracy(dtype, M, I):
    g, u = rand(M, I, dtype=dtype, scale=3.0, seed=I), rand(M, I, dtype=dtype, seed=I + 1)
    out = ops.swiglu(g, u)
    assert out.dtype == dtype and out.shape == (M, I)
    assert_close(out, ref(g, u), *TOL[dtype], "swiglu")


@pytest.mark.filterwarnings("ignore:overflow encountered")
def test_extreme_gate_values():
    g = torch.tensor([[-200.0, -90.0, -20.0, -1e-3, 0.0, 1e-3, 20.0, 90.0, 200.0]]).bfloat16()
    u = torch.ones_like(g)
    assert_close(ops.swiglu(g, u), ref(g, u), *TOL[torch.bfloat16], "extremes")


def test_vs_hf_act_fn():
    """Close to HF's ``act_fn(gate) * up`` (HF rounds silu to bf16 first; we round once)."""
    act = pytest.importorskip("transformers.activations").ACT2FN["silu"]
    g, u = rand(17, 512, scale=3.0, seed=1), rand(17, 512, seed=2)
    hf = act(g) * u
    out = ops.swiglu(g, u)
    r = ref(g, u)
    assert float((out.double() - r).abs().max()) <= float((hf.double() - r).abs().max())
    assert_close(out, hf, 1e-3, 2 ** -7, "vs HF")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_fused_equals_separate_and_rows_invariant(dtype):
    M, I = 129, 1000
    gu = rand(M, 2 * I, dtype=dtype, scale=2.0, seed=3)
    fused = ops.swiglu_fused(gu)
    assert_bitwise(fused, ops.swiglu(gu[:, :I], gu[:, I:]), "fused vs separate views")
    assert_bitwise(fused, ops.swiglu(gu[:, :I].contiguous(), gu[:, I:].contiguous()), "fused vs separate copies")
    for i in (0, 64, 128):
        assert_bitwise(ops.swiglu_fused(gu[i:i + 1]), fused[i:i + 1], f"row {i} alone")
    perm = torch.randperm(M, generator=torch.Generator().manual_seed(0))[:17]
    assert_bitwise(ops.swiglu_fused(gu[perm]), fused[perm], "shuffled rows")
    assert_bitwise(ops.swiglu_fused(gu.view(3, 43, 2 * I)).view(M, I), fused, "leading dims")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_grad(dtype):
    M, I = 17, 300
    g = rand(M, I, dtype=dtype, scale=3.0, seed=4).requires_grad_()
    u = rand(M, I, dtype=dtype, seed=5).requires_grad_()
    dy = rand(M, I, dtype=dtype, seed=6)
    ops.swiglu(g, u).backward(dy)
    g64, u64 = g.detach().double().requires_grad_(), u.detach().double().requires_grad_()
    ref(g64, u64).backward(dy.double())
    for out, r in ((g.grad, g64.grad), (u.grad, u64.grad)):
        assert out.dtype == dtype
        assert float((out.double() - r).norm() / r.norm()) < TOL_GRAD[dtype]
    gu = torch.cat([g.detach(), u.detach()], -1).requires_grad_()
    ops.swiglu_fused(gu).backward(dy)
    assert_bitwise(gu.grad[:, :I], g.grad, "fused d_gate == separate d_gate")
    assert_bitwise(gu.grad[:, I:], u.grad, "fused d_up == separate d_up")


def test_bad_inputs():
    g = rand(4, 64)
    with pytest.raises(TypeError):
        ops.swiglu(g, None)
    with pytest.raises(ValueError, match="up"):
        ops.swiglu(g, rand(4, 32))
    with pytest.raises(ValueError, match="up"):
        ops.swiglu(g, g.float())
    with pytest.raises(ValueError, match="dtype"):
        ops.swiglu(g.to(torch.int32), g.to(torch.int32))
    with pytest.raises(ValueError, match="gate_up"):
        ops.swiglu_fused(rand(4, 63))
    with pytest.raises(ValueError, match="contiguous"):
        ops.swiglu_fused(rand(64, 4).t())


def test_empty():
    assert ops.swiglu_fused(torch.empty(0, 64, dtype=torch.bfloat16)).shape == (0, 32)
