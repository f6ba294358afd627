"""kernels/tik_v17: tik_v13 with a fused attention backward whose dQ is accumulated in integer fixed point.

tik_v13's backward runs two kernels: dK / dV per key block, and dQ per query block, which recomputes QK^T and
dO V^T (7 matmuls per tile pair instead of 5). FA2 / FA3 / cuDNN avoid the recompute with fp32 atomics on dQ,
whose bits depend on the order the atomics land in. tik_v17 keeps one kernel and makes the atomics
order-free: each tile's dQ contribution is scaled by a per-row power of two (chosen from a bound on every
partial sum) and truncated to an integer, and integers add associatively.

The CPU checks (interpreter; the GPU's order-independence is the contract suite's ``grad_repeat`` on the
device): only attention.py differs from tik_v13 and its forward kernels and launchers are tik_v13's; gradients
meet the fp64 reference as closely as tik_v13's at odd lengths with GQA, with both accumulator widths and
several tiles; repeats give the same bits; inputs at the edges of the fixed-point range (tiny and large dO,
large K) stay accurate, so the bound holds; NaN inputs give NaN exactly where tik_v13's backward gives NaN
(a NaN row's scale is NaN, so it is not turned into a finite integer); bad configs raise."""

from __future__ import annotations

import pathlib

import pytest
import torch

from areal_tik_plugin.runtime import loader
from tests.helpers.folders import assert_child, jit_functions

ROOT = pathlib.Path(__file__).resolve().parents[2]
V13, V17 = ROOT / "kernels" / "tik_v13", ROOT / "kernels" / "tik_v17"
NEW_KERNELS = {"_bwd_kv_bound_kernel", "_bwd_fx_preprocess", "_bwd_fused_kernel", "_bwd_fx_finalize"}


def _att(folder):
    return loader.load_implementation(str(folder)).module("attention")


def _cu(lens):
    return torch.tensor([0] + [sum(lens[:i + 1]) for i in range(len(lens))], dtype=torch.int32)


def _inputs(lens, hq=4, hkv=2, d=32, seed=0, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    t = sum(lens)
    return tuple(torch.randn(t, h, d, generator=g).to(dtype) for h in (hq, hkv, hkv, hq))


def _reference(q, k, v, do, lens, scale):
    """fp64 autograd of causal GQA attention per sequence: (dq, dk, dv)."""
    hq, hkv = q.shape[1], k.shape[1]
    outs = [torch.zeros(x.shape, dtype=torch.float64) for x in (q, k, v)]
    s0 = 0
    for n in lens:
        qq, kk, vv = (x[s0:s0 + n].double().requires_grad_() for x in (q, k, v))
        kr, vr = kk.repeat_interleave(hq // hkv, 1), vv.repeat_interleave(hq // hkv, 1)
        s = torch.einsum("thd,shd->hts", qq, kr) * scale
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        o = torch.einsum("hts,shd->thd", s.softmax(-1), vr)
        for out, g in zip(outs, torch.autograd.grad(o, (qq, kk, vv), do[s0:s0 + n].double())):
            out[s0:s0 + n] = g
        s0 += n
    return outs


def _rel(a, b):
    return float((a.double() - b).norm() / b.norm())


def test_tik_v17_changes_only_the_attention_backward():
    v13, v17 = assert_child(V13, V17, ["attention.py"])
    j13, j17 = jit_functions(v13["attention.py"]), jit_functions(v17["attention.py"])
    assert set(j17) - set(j13) == NEW_KERNELS and set(j13) <= set(j17)
    assert all(j17[name] == j13[name] for name in j13)
    a13, a17 = _att(V13), _att(V17)
    for name in ("prefill", "extend", "decode"):
        assert getattr(a17, name).__code__.co_code == getattr(a13, name).__code__.co_code, name
    assert a17.BWD_DQ == "int64" and a17.KNOBS["free"]["BWD_DQ"] == ("int64", "int32", "split")


@pytest.mark.parametrize("config", [None, {"dq": "int32"}, {"block_m": 32, "block_n": 16}, {"block_m": 16, "block_n": 64}])
def test_fused_backward_is_as_accurate_as_tik_v13s_and_repeats(config):
    lens = [17, 70, 45]
    a13, a17 = _att(V13), _att(V17)
    q, k, v, do = _inputs(lens, seed=1)
    cu, n, scale = _cu(lens), max(lens), 32 ** -0.5
    o, lse = a17.prefill(q, k, v, cu, n, scale, return_lse=True)
    ref = _reference(q, k, v, do, lens, scale)
    got = a17.prefill_backward(do, q, k, v, o, lse, cu, n, scale, config=config)
    base = a13.prefill_backward(do, q, k, v, o, lse, cu, n, scale)
    for name, g, b, r in zip(("dq", "dk", "dv"), got, base, ref):
        assert g.dtype == b.dtype and g.shape == b.shape
        # tik_v13 is at bf16's rounding (~3e-3 here); the fixed point adds nothing measurable on top
        assert _rel(g, r) <= 1.02 * _rel(b, r) + 1e-4, (name, _rel(g, r), _rel(b, r))
    again = a17.prefill_backward(do, q, k, v, o, lse, cu, n, scale, config=config)
    for g, h in zip(got, again):
        assert torch.equal(g.view(torch.int16), h.view(torch.int16))


V19 = ROOT / "kernels" / "tik_v19"   # its fixed point bounds the norms by powers of two (no sqrt)


@pytest.mark.parametrize("folder,dq", [(V17, "int32"), (V17, "int64"), (V19, "int32")])
@pytest.mark.parametrize("do_scale,k_scale", [(1e-20, 1.0), (1e15, 1.0), (1.0, 40.0)])
def test_fixed_point_range_holds_at_the_edges(folder, dq, do_scale, k_scale):
    """Tiny dO (scale clamps at 2^125), huge dO (exponent near fp32's top) and large K (peaked softmax, the
    bound's K and V factors large): no overflow, no lost precision, dq as accurate as tik_v13's split kernels."""
    lens = [33, 9]
    att = _att(folder)
    q, k, v, do = _inputs(lens, seed=5, dtype=torch.float32)
    do, k = (do * do_scale).bfloat16(), (k * k_scale).bfloat16()
    q, v = q.bfloat16(), v.bfloat16()
    cu, n, scale = _cu(lens), max(lens), 32 ** -0.5
    o, lse = att.prefill(q, k, v, cu, n, scale, return_lse=True)
    ref = _reference(q, k, v, do, lens, scale)
    got = att.prefill_backward(do, q, k, v, o, lse, cu, n, scale, config={"dq": dq})
    split = att.prefill_backward(do, q, k, v, o, lse, cu, n, scale, config={"dq": "split"})
    assert torch.isfinite(got[0]).all()
    assert _rel(got[0], ref[0]) <= 1.02 * _rel(split[0], ref[0]) + 1e-4


@pytest.mark.parametrize("dq", ["int32", "int64"])
@pytest.mark.parametrize("mag", [1.0, 2.0 ** 18, 2.0 ** -27])
def test_the_bound_is_reached_without_overflow(dq, mag):
    """The case where dQ meets the bound: keys K and -K with q orthogonal to both (equal weight 1/2), values V
    and -V along dO (delta 0). Row 1's dq is then exactly max|K| ||dO|| ||V||, half of the preprocess's doubled
    bound, the largest integer sum the scale allows; any larger scale would wrap the int32 accumulator."""
    a17 = _att(V17)
    d, c = 32, 2.0 ** 3
    q = torch.zeros(2, 1, d)
    q[:, 0, 0], q[:, 0, 1] = 1.0, -1.0
    k = torch.zeros(2, 1, d)
    k[0, 0, :] = mag
    k[1, 0, :] = -mag
    v = torch.zeros(2, 1, d)
    v[0, 0, 2], v[1, 0, 2] = c, -c
    do = torch.zeros(2, 1, d)
    do[:, 0, 2] = c
    q, k, v, do = (x.bfloat16() for x in (q, k, v, do))
    cu, scale = _cu([2]), d ** -0.5
    o, lse = a17.prefill(q, k, v, cu, 2, scale, return_lse=True)
    dq, _, _ = a17.prefill_backward(do, q, k, v, o, lse, cu, 2, scale, config={"dq": dq})
    want = _reference(q, k, v, do, [2], scale)[0]
    assert float(want[1].abs().max()) == pytest.approx(mag * c * c * scale, rel=1e-6)
    assert torch.equal(dq[1].float(), want[1].to(torch.bfloat16).float()) and not dq[0].any()


@pytest.mark.parametrize("folder", [V17, V19])
def test_nan_inputs_give_nan_where_the_split_backward_does(folder):
    lens = [20, 12]
    att = _att(folder)
    q, k, v, do = _inputs(lens, seed=7)
    q[25, 1, 3] = float("nan")
    cu, n, scale = _cu(lens), max(lens), 32 ** -0.5
    o, lse = att.prefill(q, k, v, cu, n, scale, return_lse=True)
    got = att.prefill_backward(do, q, k, v, o, lse, cu, n, scale)
    split = att.prefill_backward(do, q, k, v, o, lse, cu, n, scale, config={"dq": "split"})
    for g, s in zip(got, split):
        assert s.isnan().any() and torch.equal(g.isnan(), s.isnan())


@pytest.mark.parametrize("config,match", [
    ({"dq": "fp32"}, "dq must be 'int64', 'int32' or 'split'"),
    ({"blockm": 64}, r"unknown keys \['blockm'\]"),
    ({"block_m": 48}, "block_m must be a power of two >= 16"),
    ({"block_n": 8}, "block_n must be a power of two >= 16"),
])
def test_bad_backward_config_is_refused(config, match):
    a17 = _att(V17)
    lens = [5]
    q, k, v, do = _inputs(lens)
    o, lse = a17.prefill(q, k, v, _cu(lens), 5, 32 ** -0.5, return_lse=True)
    with pytest.raises(ValueError, match=match):
        a17.prefill_backward(do, q, k, v, o, lse, _cu(lens), 5, 32 ** -0.5, config=config)
