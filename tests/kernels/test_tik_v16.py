"""kernels/tik_v16: tik_v13 whose attention backward runs cuDNN's fused backward on the GPU (attention.BACKWARD).
Selected nowhere: on the H100 that backward (torch 2.11, cuDNN 9.19, ragged layout) gave wrong, unrepeatable and
slow gradients (docs/performance.md); these tests keep the folder's CPU behaviour pinned.

The contract binds the forward only: rollout's rows equal the training forward's. Gradients have no bit contract,
only the tolerance table, so the training step may run the fastest correct backward a user has; given this
forward's O and LSE, cuDNN's backward is the gradient of this forward. tik_v13's Triton backward stays the
interpreter's path (cuDNN has no CPU kernels) and the knob's other value.

The CPU checks: only attention.py differs from tik_v13, its jit kernels are tik_v13's, and only the backward's
host code changed; under the interpreter the backward gives tik_v13's gradients bit for bit; the statistics handed
to cuDNN are the natural-log LSE of the scaled scores (against an fp64 reference of this forward's shapes); the
argument list fits aten's schema with an undefined bias; a refused cuDNN call raises an error naming the knob and
the implementation with the Triton backward."""

from __future__ import annotations

import math
import pathlib

import pytest
import torch

from areal_tik_plugin.runtime import loader
from tests.helpers.folders import assert_child, jit_functions

ROOT = pathlib.Path(__file__).resolve().parents[2]
V13, V16 = ROOT / "kernels" / "tik_v13", ROOT / "kernels" / "tik_v16"


def _att(folder):
    return loader.load_implementation(str(folder)).module("attention")


def _cu(lens):
    return torch.tensor([0] + [sum(lens[:i + 1]) for i in range(len(lens))], dtype=torch.int32)


def _inputs(lens, hq=4, hkv=2, d=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    t = sum(lens)
    q, k, v, do = (torch.randn(t, h, d, generator=g).bfloat16() for h in (hq, hkv, hkv, hq))
    return q, k, v, do


def test_tik_v16_changes_only_the_attention_backward():
    v13, v16 = assert_child(V13, V16, ["attention.py"])
    assert jit_functions(v13["attention.py"]) == jit_functions(v16["attention.py"])
    a16 = _att(V16)
    assert a16.BACKWARD == "cudnn" and a16.KNOBS["free"]["BACKWARD"] == ("triton", "cudnn")
    a13 = _att(V13)
    for name in ("prefill", "extend", "decode"):
        assert getattr(a16, name).__code__.co_code == getattr(a13, name).__code__.co_code, name


@pytest.mark.parametrize("lens", [[17, 70], [33]])
def test_interpreter_backward_is_tik_v13s(lens):
    a13, a16 = _att(V13), _att(V16)
    q, k, v, do = _inputs(lens, seed=len(lens))
    cu, n, scale = _cu(lens), max(lens), 32 ** -0.5
    o, lse = a16.prefill(q, k, v, cu, n, scale, return_lse=True)
    o13, lse13 = a13.prefill(q, k, v, cu, n, scale, return_lse=True)
    assert torch.equal(o.view(torch.int16), o13.view(torch.int16)) and torch.equal(lse.view(torch.int32),
                                                                                  lse13.view(torch.int32))
    got = a16.prefill_backward(do, q, k, v, o, lse, cu, n, scale)
    want = a13.prefill_backward(do, q, k, v, o, lse, cu, n, scale)
    for g, w in zip(got, want):
        assert torch.equal(g.view(torch.int16), w.view(torch.int16))


def test_cudnn_stats_are_the_natural_log_lse():
    a16 = _att(V16)
    lens, hq, hkv, d = [9, 40], 4, 2, 32
    q, k, v, _ = _inputs(lens, hq, hkv, d, seed=3)
    cu, scale = _cu(lens), d ** -0.5
    _, lse = a16.prefill(q, k, v, cu, max(lens), scale, return_lse=True)
    stats = a16.cudnn_stats(lse)
    assert stats.shape == (sum(lens), hq, 1) and stats.dtype == torch.float32 and stats.is_contiguous()
    ref = torch.empty(sum(lens), hq, dtype=torch.float64)
    s0 = 0
    for n in lens:
        qs = q[s0:s0 + n].double().transpose(0, 1)
        ks = k[s0:s0 + n].double().transpose(0, 1).repeat_interleave(hq // hkv, 0)
        sc = qs @ ks.transpose(1, 2) * scale
        sc = sc.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), -math.inf)
        ref[s0:s0 + n] = torch.logsumexp(sc, -1).transpose(0, 1)
        s0 += n
    # P is rounded to bf16 before its row sum (the contract), ~1e-3 here; log2 units would be off by 44 %
    assert (stats[..., 0].double() - ref).abs().max() < 5e-3


def test_refused_cudnn_call_names_the_way_out():
    a16 = _att(V16)
    lens = [5, 3]
    q, k, v, do = _inputs(lens)
    cu = _cu(lens)
    o, lse = a16.prefill(q, k, v, cu, 5, 32 ** -0.5, return_lse=True)
    with pytest.raises(RuntimeError, match=r"(?s)BACKWARD = 'cudnn'.*TIK_IMPLEMENTATION=tik_v13"):
        a16._cudnn_backward(do, q, k, v, o, lse, cu, 5, 32 ** -0.5)   # CPU tensors: cuDNN has no CPU kernel


def test_cudnn_backward_args_fit_the_schema_without_a_bias():
    """The call the GPU makes, checked against aten's schema here: a defined attn_bias (even empty) is indexed
    as a bias by torch's cuDNN backward (the IndexError of the first GPU run), so it must be None (undefined)."""
    a16 = _att(V16)
    lens = [7, 12]
    q, k, v, do = _inputs(lens)
    cu = _cu(lens).long()
    o, lse = a16.prefill(q, k, v, cu.int(), 12, 32 ** -0.5, return_lse=True)
    args = a16.cudnn_backward_args(do.transpose(0, 1).contiguous().transpose(0, 1), q, k, v, o, lse, cu, 12)
    schema = torch.ops.aten._cudnn_attention_backward.default._schema
    names = [a.name for a in schema.arguments if not a.kwarg_only]
    assert len(args) == len(names)
    by = dict(zip(names, args))
    assert by["attn_bias"] is None
    assert by["cum_seq_q"].dtype == torch.int32 and torch.equal(by["cum_seq_q"], cu.int())
    assert by["max_q"] == by["max_k"] == 12 and by["dropout_p"] == 0.0 and by["is_causal"] is True
    assert by["grad_out"].is_contiguous() and by["logsumexp"].shape == (sum(lens), 4, 1)
    assert [a.name for a in schema.arguments if a.kwarg_only] == ["scale"]
