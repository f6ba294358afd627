"""kernels/tik_v3: tik_v2 with a rewritten attention backward (flat head x query-block loop, mask-free
blocks off the diagonal, optional one-query-head dK/dV programs with an ordered fp32 group sum). Not
selected for any GPU; on the CPU (interpreter) its gradients are checked against an fp64 reference in
both dK/dV modes and for run-to-run bits, and its forward must be tik_v2's bit for bit."""

from __future__ import annotations

import os

import pytest
import torch

from areal_tik_plugin.runtime import loader

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "kernels")


@pytest.fixture(scope="module")
def mods():
    return (loader.load_implementation(os.path.join(ROOT, "tik_v3")).module("attention"),
            loader.load_implementation(os.path.join(ROOT, "tik_v2")).module("attention"))


def _ref(q, k, v, lens, scale):
    out, s, g = [], 0, q.shape[1] // k.shape[1]
    for n in lens:
        qq = q[s:s + n].transpose(0, 1)
        kk, vv = (x[s:s + n].transpose(0, 1).repeat_interleave(g, 0) for x in (k, v))
        a = (qq @ kk.transpose(1, 2)) * scale
        a = a.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf")).softmax(-1)
        out.append((a @ vv).transpose(0, 1))
        s += n
    return torch.cat(out)


def _bits(t):
    return t.view(torch.int16)


@pytest.mark.parametrize("lens,hq,hkv,d,cfg", [
    ([17, 61, 1, 40], 4, 2, 64, {"per_head": False}),
    ([17, 61, 1, 40], 4, 2, 64, {"per_head": True}),
    ([37, 5], 4, 1, 32, None),
    ([33, 20], 4, 2, 16, {"kv_n": 32, "kv_m": 32, "q_m": 16, "q_n": 32}),
])
def test_backward_vs_fp64_and_deterministic(mods, lens, hq, hkv, d, cfg):
    A, A2 = mods
    g = torch.Generator().manual_seed(sum(lens) * d)
    T = sum(lens)
    q, do = (torch.randn(T, hq, d, generator=g).to(torch.bfloat16) for _ in range(2))
    k, v = (torch.randn(T, hkv, d, generator=g).to(torch.bfloat16) for _ in range(2))
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32)
    sc = d ** -0.5
    o, lse = A.prefill(q, k, v, cu, max(lens), sc, return_lse=True)
    o2, lse2 = A2.prefill(q, k, v, cu, max(lens), sc, return_lse=True)
    assert torch.equal(_bits(o), _bits(o2)) and torch.equal(lse.view(torch.int32), lse2.view(torch.int32))
    kw = {"config": cfg} if cfg else {}
    g1 = A.prefill_backward(do, q, k, v, o, lse, cu, max(lens), sc, **kw)
    g2 = A.prefill_backward(do, q, k, v, o, lse, cu, max(lens), sc, **kw)
    assert all(torch.equal(_bits(a), _bits(b)) for a, b in zip(g1, g2))
    qr, kr, vr = (x.double().requires_grad_() for x in (q, k, v))
    ref = torch.autograd.grad(_ref(qr, kr, vr, lens, sc), (qr, kr, vr), do.double())
    for name, a, b in zip(("dq", "dk", "dv"), g1, ref):
        rel = float((a.double() - b).norm() / b.norm())
        assert rel < 1e-2, (name, rel)


def test_unknown_backward_knob_is_refused(mods):
    A, _ = mods
    q = torch.zeros(8, 2, 16, dtype=torch.bfloat16)
    k = torch.zeros(8, 1, 16, dtype=torch.bfloat16)
    cu = torch.tensor([0, 8], dtype=torch.int32)
    o, lse = A.prefill(q, k, k, cu, 8, 0.25, return_lse=True)
    with pytest.raises(ValueError, match="unknown backward knobs \\['block'\\]"):
        A.prefill_backward(q, q, k, k, o, lse, cu, 8, 0.25, config={"block": 64})


def test_not_selected():
    import json

    with open(os.path.join(ROOT, "selection.json")) as f:
        assert "tik_v3" not in json.load(f).values()
