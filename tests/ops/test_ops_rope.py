"""NeoX RoPE: CPU tests (interpreter). Bitwise invariance between our paths; accuracy vs fp64."""

from __future__ import annotations

import pytest
import torch

from areal_tik_plugin import ops

from tests.helpers.rowops_testutil import assert_bitwise, assert_close, rand

# one rounding of an fp32-accurate value (plus fp32 cos/sin error on |x|-sized terms -> atol)
TOL = {torch.bfloat16: (1e-5, 2 ** -8), torch.float16: (1e-5, 2 ** -10), torch.float32: (2e-6, 1e-6)}
TOL_GRAD = {torch.bfloat16: 1e-2, torch.float16: 2e-3, torch.float32: 1e-6}


def inv_freq(rotary_dim, theta=1e6):
    return 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float) / rotary_dim))


def ref_rope(x, pos, inv, scaling=1.0):
    """fp64 rotation by HF's fp32 angle (float32(pos) * inv_freq, one fp32 multiply)."""
    f = (pos.float()[:, None] * inv[None, :]).double()
    c, s = (f.cos() * scaling)[:, None, :], (f.sin() * scaling)[:, None, :]
    x = x.double()
    h = inv.numel()
    x1, x2 = x[..., :h], x[..., h:2 * h]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s, x[..., 2 * h:]], -1)


def qk(T, Hq, Hkv, D, dtype=torch.bfloat16, seed=0):
    return rand(T, Hq, D, dtype=dtype, seed=seed), rand(T, Hkv, D, dtype=dtype, seed=seed + 1)


# ---- accuracy -----------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("T,Hq,Hkv,D,R", [(1, 4, 2, 128, 128), (17, 3, 1, 64, 64), (33, 2, 2, 96, 48)])
def test_accuracy(dtype, T, Hq, Hkv, D, R):
    q, k = qk(T, Hq, Hkv, D, dtype, seed=T)
    pos = torch.randint(0, 40000, (T,), generator=torch.Generator().manual_seed(T))
    inv = inv_freq(R)
    qo, ko = ops.apply_rope(q, k, pos, inv)
    assert qo.dtype == dtype and qo.shape == q.shape and ko.shape == k.shape
    assert_close(qo, ref_rope(q, pos, inv), *TOL[dtype], "q")
    assert_close(ko, ref_rope(k, pos, inv), *TOL[dtype], "k")
    if R < D:  # pass-through dims are copied exactly
        assert_bitwise(qo[..., R:], q[..., R:], "pass-through")


def test_attention_scaling():
    q, k = qk(17, 2, 1, 64)
    pos = torch.arange(17)
    inv = inv_freq(64, 1e4)
    qo, ko = ops.apply_rope(q, k, pos, inv, attention_scaling=0.8)
    assert_close(qo, ref_rope(q, pos, inv, 0.8), *TOL[torch.bfloat16], "scaled q")
    assert_close(ko, ref_rope(k, pos, inv, 0.8), *TOL[torch.bfloat16], "scaled k")


def test_vs_hf_apply_rotary_pos_emb():
    """At least as accurate as HF (which rounds cos/sin and each product to bf16), and close to it."""
    tr = pytest.importorskip("transformers.models.qwen3.modeling_qwen3")
    from transformers import Qwen3Config

    T, Hq, Hkv, D = 33, 4, 2, 128
    cfg = Qwen3Config(hidden_size=Hq * D, num_attention_heads=Hq, num_key_value_heads=Hkv, head_dim=D,
                      rope_theta=1e6, max_position_embeddings=40960)
    rot = tr.Qwen3RotaryEmbedding(cfg)
    q, k = qk(T, Hq, Hkv, D, seed=3)
    pos = torch.cat([torch.arange(20), torch.arange(3000, 3013)])
    cos, sin = rot(q, pos[None])
    hq, hk = tr.apply_rotary_pos_emb(q, k, cos[0], sin[0], unsqueeze_dim=1)
    qo, ko = ops.apply_rope(q, k, pos, rot.inv_freq, rot.attention_scaling)
    for ours, hf, x in ((qo, hq, q), (ko, hk, k)):
        ref = ref_rope(x, pos, rot.inv_freq.float(), rot.attention_scaling)
        e_ours, e_hf = (ours.double() - ref).abs(), (hf.double() - ref).abs()
        assert float(e_ours.max()) <= float(e_hf.max())
        assert float(e_ours.mean()) <= float(e_hf.mean())
        assert_close(ours, hf, 2e-2, 2 ** -6, "ours vs HF")


# ---- bitwise invariance -------------------------------------------------------------------------
def test_tokens_invariant_packed_decode_shuffled():
    T, Hq, Hkv, D = 33, 4, 2, 128
    q, k = qk(T, Hq, Hkv, D, seed=5)
    pos = torch.cat([torch.arange(20), torch.arange(13)])  # two packed sequences
    inv = inv_freq(D)
    qo, ko = ops.apply_rope(q, k, pos, inv)
    for t in (0, 19, 20, 32):  # decode-sized calls
        a, b = ops.apply_rope(q[t:t + 1], k[t:t + 1], pos[t:t + 1], inv)
        assert_bitwise(a, qo[t:t + 1], f"q token {t} alone")
        assert_bitwise(b, ko[t:t + 1], f"k token {t} alone")
    perm = torch.randperm(T, generator=torch.Generator().manual_seed(1))[:17]
    a, b = ops.apply_rope(q[perm], k[perm], pos[perm], inv)
    assert_bitwise(a, qo[perm], "shuffled q")
    assert_bitwise(b, ko[perm], "shuffled k")
    # the second sequence alone (its own call) == its rows in the packed call
    a, b = ops.apply_rope(q[20:], k[20:], pos[20:].to(torch.int32), inv)
    assert_bitwise(a, qo[20:], "sequence 2 alone (int32 positions)")
    a, _ = ops.apply_rope(q, None, pos, inv)
    assert_bitwise(a, qo, "k=None")


def test_strided_views_of_qkv():
    T, Hq, Hkv, D = 17, 4, 2, 64
    qkv = rand(T, (Hq + 2 * Hkv) * D, seed=7)
    q = qkv[:, : Hq * D].view(T, Hq, D)
    k = qkv[:, Hq * D: (Hq + Hkv) * D].view(T, Hkv, D)
    pos = torch.arange(100, 100 + T)
    inv = inv_freq(D)
    qo, ko = ops.apply_rope(q, k, pos, inv)
    qc, kc = ops.apply_rope(q.contiguous(), k.contiguous(), pos, inv)
    assert_bitwise(qo, qc, "q view")
    assert_bitwise(ko, kc, "k view")


# ---- gradients ----------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("D,R", [(64, 64), (96, 48)])
def test_grad(dtype, D, R):
    T, Hq, Hkv = 17, 3, 1
    q, k = qk(T, Hq, Hkv, D, dtype, seed=9)
    q.requires_grad_()
    k.requires_grad_()
    pos = torch.randint(0, 5000, (T,), generator=torch.Generator().manual_seed(2))
    inv = inv_freq(R)
    gq, gk = rand(T, Hq, D, dtype=dtype, seed=11), rand(T, Hkv, D, dtype=dtype, seed=12)
    qo, ko = ops.apply_rope(q, k, pos, inv, 0.9)
    ((qo.float() * gq.float()).sum() + (ko.float() * gk.float()).sum()).backward()
    q64, k64 = q.detach().double().requires_grad_(), k.detach().double().requires_grad_()
    ((ref_rope(q64, pos, inv, 0.9) * gq.double()).sum() + (ref_rope(k64, pos, inv, 0.9) * gk.double()).sum()).backward()
    for out, ref in ((q.grad, q64.grad), (k.grad, k64.grad)):
        assert out.dtype == dtype
        rel = float((out.double() - ref).norm() / ref.norm())
        assert rel < TOL_GRAD[dtype], rel


# ---- errors --------------------------------------------------------------------------------------
def test_bad_inputs():
    q, k = qk(5, 2, 1, 64)
    pos, inv = torch.arange(5), inv_freq(64)
    with pytest.raises(TypeError):
        ops.apply_rope("q", k, pos, inv)
    with pytest.raises(ValueError, match="q"):
        ops.apply_rope(q[0], k, pos, inv)
    with pytest.raises(ValueError, match="head_dim"):
        ops.apply_rope(rand(5, 2, 63), None, pos, inv_freq(62))
    with pytest.raises(ValueError, match="k"):
        ops.apply_rope(q, k.float(), pos, inv)
    with pytest.raises(ValueError, match="k"):
        ops.apply_rope(q, rand(4, 1, 64), pos, inv)
    with pytest.raises(ValueError, match="positions"):
        ops.apply_rope(q, k, pos[:4], inv)
    with pytest.raises(ValueError, match="positions"):
        ops.apply_rope(q, k, pos.float(), inv)
    with pytest.raises(ValueError, match="positions"):
        ops.apply_rope(q, k, pos - 3, inv)
    with pytest.raises(ValueError, match="inv_freq"):
        ops.apply_rope(q, k, pos, inv.double())
    with pytest.raises(ValueError, match="inv_freq"):
        ops.apply_rope(q, k, pos, inv_freq(128))
    with pytest.raises(ValueError, match="attention_scaling"):
        ops.apply_rope(q, k, pos, inv, attention_scaling=0.0)


# ---- RoPE + KV-pool write in one launch (rollout) -------------------------------------------------
def _fused_qkv_case(T, Hq, Hkv, D, dtype, seed):
    """q / k / v as strided views of one fused QKV output, positions, distinct pool slots (pool of 3T + 5) and
    the generator, for the pool contents the caller draws next."""
    qkv = rand(T, (Hq + 2 * Hkv) * D, dtype=dtype, seed=seed)
    q = qkv[:, :Hq * D].view(T, Hq, D)
    k = qkv[:, Hq * D:(Hq + Hkv) * D].view(T, Hkv, D)
    v = qkv[:, (Hq + Hkv) * D:].view(T, Hkv, D)
    g = torch.Generator().manual_seed(T)
    pos = torch.randint(0, 40000, (T,), generator=g)
    loc = torch.randperm(3 * T + 5, generator=g)[:T]
    return q, k, v, pos, loc, g


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("T,Hq,Hkv,D,R", [(1, 4, 2, 128, 128), (13, 5, 3, 64, 64), (9, 2, 2, 96, 48)])
def test_rope_kv_write_bitwise_equals_rope_then_kv_write(dtype, T, Hq, Hkv, D, R):
    q, k, v, pos, loc, g = _fused_qkv_case(T, Hq, Hkv, D, dtype, seed=T + D)
    inv = inv_freq(R)
    qr, kr = ops.apply_rope(q, k, pos, inv, 0.9)
    base = torch.randn(3 * T + 5, Hkv, D, generator=g).to(dtype)
    ref_k, ref_v = base.clone(), base * 2
    ops.kv_write(ref_k, ref_v, loc, kr, v)
    for i in range(2):  # the checked first call, then a memoized signature
        kc, vc = base.clone(), base * 2
        qo = ops.apply_rope_kv_write(q, k, v, pos, inv, 0.9, kc, vc, loc)
        assert qo.is_contiguous()
        assert_bitwise(qo, qr, f"q ({i})")
        assert_bitwise(kc, ref_k, f"k pool ({i})")  # written rows rotated, every other slot untouched
        assert_bitwise(vc, ref_v, f"v pool ({i})")


def test_rope_kv_write_bad_inputs():
    T, Hq, Hkv, D = 3, 4, 2, 64
    q, k = qk(T, Hq, Hkv, D)
    v = rand(T, Hkv, D)
    kc, vc = torch.zeros(8, Hkv, D, dtype=torch.bfloat16), torch.zeros(8, Hkv, D, dtype=torch.bfloat16)
    pos, loc, inv = torch.arange(T), torch.tensor([1, 2, 3]), inv_freq(D)
    fn = ops.apply_rope_kv_write
    for memoized in (False, True):  # after a good call of the same signature the errors are the same
        if memoized:
            fn(q, k, v, pos, inv, 1.0, kc, vc, loc)
        with pytest.raises(ValueError, match="k: expected a tensor"):
            fn(q, None, v, pos, inv, 1.0, kc, vc, loc)
        with pytest.raises(ValueError, match="loc"):
            fn(q, k, v, pos, inv, 1.0, kc, vc, torch.tensor([1, 2, 8]))
        with pytest.raises(ValueError, match="v"):
            fn(q, k, v[:, :1], pos, inv, 1.0, kc, vc, loc)
        with pytest.raises(ValueError, match="k: expected dtype"):  # caches in another dtype than q/k
            fn(q, k, v, pos, inv, 1.0, kc.float(), vc.float(), loc)
        with pytest.raises(ValueError, match="positions"):
            fn(q, k, v, pos - 5, inv, 1.0, kc, vc, loc)
        with pytest.raises(ValueError, match="grad"):
            fn(q.clone().requires_grad_(), k, v, pos, inv, 1.0, kc, vc, loc)


@pytest.mark.parametrize("T,Hq,Hkv,D,R", [(1, 12, 2, 128, 128), (13, 5, 3, 64, 64), (9, 2, 2, 96, 48), (33, 4, 0, 64, 64),
                                         (7, 12, 6, 64, 64)])
def test_token_tile_kernel_same_bits_as_head_block_kernel(monkeypatch, T, Hq, Hkv, D, R):
    """The launch layouts (free knobs TOKEN_TILES, HEAD_GROUPS) compute the same bits, forward and backward."""
    from areal_tik_plugin.runtime.loader import get_implementation

    rope = get_implementation().module("rope")
    q, k = qk(T, Hq, max(Hkv, 1), D, seed=T + Hq)
    k = k if Hkv else None
    pos = torch.randint(0, 40000, (T,), generator=torch.Generator().manual_seed(T))
    inv = inv_freq(R)
    out = {}
    monkeypatch.setattr(rope, "TOKEN_TILES_MIN_T", 1)  # token tiles at any T (default: from 1024 tokens)
    for tiles, groups in ((False, False), (True, False), (True, True)):
        monkeypatch.setattr(rope, "TOKEN_TILES", tiles)
        monkeypatch.setattr(rope, "HEAD_GROUPS", groups)
        out[tiles, groups] = (rope.forward(q, k, pos, inv, 0.8), rope.backward(q, k, pos, inv, 0.8))
    for variant in ((True, False), (True, True)):
        for (a, b), name in zip(zip(out[False, False], out[variant]), ("forward", "backward")):
            assert_bitwise(a[0], b[0], f"{name} q {variant}")
            if Hkv:
                assert_bitwise(a[1], b[1], f"{name} k {variant}")
            else:
                assert a[1] is None and b[1] is None


@pytest.mark.parametrize("T,Hq,Hkv,D,R", [(1, 12, 2, 128, 128), (13, 5, 3, 64, 64), (9, 2, 2, 96, 48),
                                         (33, 32, 8, 128, 128), (7, 12, 6, 64, 64), (20, 32, 4, 64, 32)])
def test_kv_token_tiles_same_bits_as_head_block_kernel(monkeypatch, T, Hq, Hkv, D, R):
    """RoPE + KV-pool write on the token-tile kernel (free knob KV_TOKEN_TILES, with and without head groups)
    == the head-block kernel: q out, every pool slot (written rows rotated / copied, the rest untouched)."""
    from areal_tik_plugin.runtime.loader import get_implementation

    rope = get_implementation().module("rope")
    q, k, v, pos, loc, g = _fused_qkv_case(T, Hq, Hkv, D, torch.bfloat16, seed=T + Hq)
    inv = inv_freq(R)
    base = torch.randn(3 * T + 5, Hkv, D, generator=g).to(torch.bfloat16)
    monkeypatch.setattr(rope, "TOKEN_TILES_MIN_T", 1)
    launched = []
    real_launch = rope.launch
    monkeypatch.setattr(rope, "launch", lambda fn, *a, **kw: (launched.append(fn), real_launch(fn, *a, **kw))[1])
    out = {}
    for tiles, groups in ((False, True), (True, False), (True, True)):
        monkeypatch.setattr(rope, "KV_TOKEN_TILES", tiles)
        monkeypatch.setattr(rope, "HEAD_GROUPS", groups)
        kc, vc = base.clone(), base * 2
        out[tiles, groups] = (rope.forward_kv_write(q, k, v, pos, inv, 0.8, kc, vc, loc), kc, vc)
        assert launched[-1] is (rope._rope_tokens_kernel if tiles else rope._rope_kernel)  # the knob took effect
    for variant in ((True, False), (True, True)):
        for a, b, name in zip(out[False, True], out[variant], ("q", "k pool", "v pool")):
            assert_bitwise(b, a, f"{name} {variant}")
