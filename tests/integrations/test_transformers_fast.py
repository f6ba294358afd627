"""The transformers integration on the public ops (static checks memoized per argument
signature): every piece bit-identical to the public op sequence, a replaced or resized module
weight checked again with the public op's error, the flat-positions cache of :class:`TikRotary`
recomputed when its input changes. CPU: kernels run under TRITON_INTERPRET=1."""

from __future__ import annotations

import copy

import pytest
import torch

from areal_tik_plugin import ops
from areal_tik_plugin.integrations import transformers as T
from tests.ops.test_memo import BF, assert_bits, rnd, same_error


# ------------------------------------------------------------------------------------------------
# integration layer on the memoized public ops
# ------------------------------------------------------------------------------------------------
def _tiny_layer():
    from areal_tik_plugin.verify import build_model

    model = build_model("tiny-qwen3", seed=3)
    inner = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    return model, inner


def test_integration_pieces_equal_public_ops_and_recheck_replaced_weights():
    model, inner = _tiny_layer()
    layer = T.apply_to_module(copy.deepcopy(inner.layers[0]), "qwen3")
    attn, mlp = layer.self_attn, layer.mlp
    inv, sc = T.rope_params(inner.rotary_emb, torch.device("cpu"))
    Tn = 17
    x = rnd(Tn, model.config.hidden_size, seed=20, scale=0.5)
    pos = torch.arange(Tn) + 2
    eps = attn.q_norm.variance_epsilon
    with torch.no_grad():
        h = T.tik_rms_norm(x, layer.input_layernorm)
        assert_bits(h, ops.rms_norm(x, layer.input_layernorm.weight, layer.input_layernorm.variance_epsilon))
        q, k, v = T.tik_qkv(attn, h, pos, inv, sc)
        D = attn.head_dim
        pq = ops.linear(h, attn.q_proj.weight).view(Tn, -1, D)
        pk = ops.linear(h, attn.k_proj.weight).view(Tn, -1, D)
        pv = ops.linear(h, attn.v_proj.weight).view(Tn, -1, D)
        pq, pk = ops.apply_rope(ops.rms_norm(pq, attn.q_norm.weight, eps), ops.rms_norm(pk, attn.k_norm.weight, eps),
                                pos, inv, sc)
        for a, b in ((q, pq), (k, pk), (v, pv)):
            assert_bits(a, b, "qkv")
        ref = ops.linear(ops.swiglu(ops.linear(h, mlp.gate_proj.weight), ops.linear(h, mlp.up_proj.weight)),
                         mlp.down_proj.weight)
        assert_bits(T.tik_mlp(mlp, h), ref, "mlp")
        assert_bits(T.tik_linear(h.view(1, Tn, -1), attn.q_proj), ops.linear(h, attn.q_proj.weight).view(1, Tn, -1),
                    "3-D x")
        # fp32 master weights: cast to the activation dtype where used
        mlp32 = copy.deepcopy(mlp).float()
        assert_bits(T.tik_linear(h, mlp32.up_proj), ops.linear(h, mlp32.up_proj.weight.to(BF)))
        # a replaced weight (new Parameter of another shape) and an in-place resize: checked again
        proj = copy.deepcopy(attn.o_proj)
        o = rnd(Tn, proj.in_features, seed=21)
        T.tik_linear(o, proj)
        proj.weight = torch.nn.Parameter(rnd(proj.out_features, proj.in_features + 1, seed=22))
        same_error(lambda: T.tik_linear(o, proj), lambda: ops.linear(o, proj.weight))
        proj.weight = torch.nn.Parameter(rnd(proj.out_features, proj.in_features, seed=22))
        T.tik_linear(o, proj)
        proj.weight.data = rnd(proj.in_features, proj.out_features, seed=23).t()  # same object, column-major
        same_error(lambda: T.tik_linear(o, proj), lambda: ops.linear(o, proj.weight))
        norm = copy.deepcopy(attn.q_norm)
        norm.weight.data = rnd(D + 2)
        same_error(lambda: T.tik_rms_norm(q, norm), lambda: ops.rms_norm(q, norm.weight, norm.variance_epsilon))


def test_layer_step_equals_public_op_sequence():
    from areal_tik_plugin.verify import layer_step

    model, inner = _tiny_layer()
    layer = T.apply_to_module(copy.deepcopy(inner.layers[0]), "qwen3")
    attn, mlp = layer.self_attn, layer.mlp
    inv, sc = T.rope_params(inner.rotary_emb, torch.device("cpu"))
    Tn, Hkv, D = 17, model.config.num_key_value_heads, attn.head_dim
    x = rnd(Tn, model.config.hidden_size, seed=30, scale=0.5)
    pos = torch.arange(Tn)
    loc = torch.arange(1, Tn + 1)
    table = torch.arange(0, Tn + 1, dtype=torch.int32)[None]
    pools = [(torch.zeros(Tn + 1, Hkv, D, dtype=BF), torch.zeros(Tn + 1, Hkv, D, dtype=BF)) for _ in range(2)]

    def attend_on(kc, vc):
        return lambda q, s: ops.attention_extend(
            q, kc, vc, cu_seqlens_q=torch.tensor([0, Tn], dtype=torch.int32),
            prefix_lens=torch.ones(1, dtype=torch.int32) * 0, kv_indices=table[:, 1:].contiguous(),
            table_rows=torch.zeros(1, dtype=torch.int32), max_extend_len=Tn, softmax_scale=s)

    with torch.no_grad():
        out = layer_step(layer, x, pos, inv, sc, *pools[0], loc, attend_on(*pools[0]))
        kc, vc = pools[1]
        w = lambda m: m.weight  # noqa: E731
        e = layer.input_layernorm.variance_epsilon
        h = ops.rms_norm(x, w(layer.input_layernorm), e)
        q = ops.rms_norm(ops.linear(h, w(attn.q_proj)).view(Tn, -1, D), w(attn.q_norm), e)
        k = ops.rms_norm(ops.linear(h, w(attn.k_proj)).view(Tn, -1, D), w(attn.k_norm), e)
        v = ops.linear(h, w(attn.v_proj)).view(Tn, -1, D)
        q, k = ops.apply_rope(q, k, pos, inv, sc)
        ops.kv_write(kc, vc, loc, k, v)
        r = x + ops.linear(attend_on(kc, vc)(q, attn.scaling).reshape(Tn, -1), w(attn.o_proj))
        h = ops.rms_norm(r, w(layer.post_attention_layernorm), e)
        ref = r + ops.linear(ops.swiglu(ops.linear(h, w(mlp.gate_proj)), ops.linear(h, w(mlp.up_proj))), w(mlp.down_proj))
    assert_bits(out, ref, "layer_step")
    assert_bits(pools[0][0], pools[1][0], "k pool")
    assert_bits(pools[0][1], pools[1][1], "v pool")
    # SGLang's convention: (previous output, residual) in, the add inside the input norm; (mlp_out,
    # residual) out, whose sum is the HF layer output -- the same bits as adding first
    d = rnd(Tn, model.config.hidden_size, seed=31, scale=0.5)
    with torch.no_grad():
        mlp_out, res = layer_step(layer, x - d, pos, inv, sc, *pools[0], loc, attend_on(*pools[0]), residual=d,
                                  split_residual=True)
        full = layer_step(layer, (x - d) + d, pos, inv, sc, *pools[1], loc, attend_on(*pools[1]))
    assert_bits(res + mlp_out, full, "layer_step split_residual")
    with torch.no_grad():  # the fused weights follow an in-place update of a source weight
        layer.self_attn.v_proj.weight.mul_(2)  # (k would be undone by k_norm)
        again = layer_step(layer, x, pos, inv, sc, *pools[0], loc, attend_on(*pools[0]))
    fw = T.rollout_weights(layer, BF)
    nq, nk = fw["q_size"], fw["kv_size"]
    assert torch.equal(fw["qkv"][nq + nk:], layer.self_attn.v_proj.weight.to(BF))
    assert not torch.equal(again, out)


def test_rotary_positions_cache_follows_changes():
    inv = torch.rand(4)
    p = torch.arange(6)[None]
    rot = T.TikRotary(p, inv, 1.0)
    a = rot.positions(1, 6)
    assert rot.positions(1, 6) is a  # kept for the next layer
    assert torch.equal(rot.positions(2, 6), torch.arange(6).repeat(2))  # another batch: recomputed
    p.add_(10)  # an in-place write bumps the version: recomputed
    assert torch.equal(rot.positions(1, 6), torch.arange(6) + 10)
    rot.position_ids = torch.arange(5)[None]  # replaced: recomputed (and checked)
    assert torch.equal(rot.positions(1, 5), torch.arange(5))
    with pytest.raises(ValueError, match="position_ids"):
        rot.positions(1, 6)
    with torch.inference_mode():
        ri = T.TikRotary(torch.arange(3)[None], inv, 1.0)
        assert torch.equal(ri.positions(1, 3), torch.arange(3))
        assert torch.equal(ri.positions(1, 3), torch.arange(3))
