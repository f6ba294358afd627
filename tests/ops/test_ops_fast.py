"""The ops' internal entry points for the integrations (``_linear_fast``, ``_rms_norm_fast``, ...):
static checks memoized per argument signature. Bits equal to the public ops (odd shapes, grad on and
off), and a changed input after a memoized call (dtype, shape, device, strides, a replaced or
resized weight, a scalar of another type) is checked again and raises the public op's error.
CPU: kernels run under TRITON_INTERPRET=1."""

from __future__ import annotations

import importlib

import pytest
import torch

from areal_tik_plugin import ops
from areal_tik_plugin.ops import _validate as V

# the op modules (``ops.linear`` etc. are the public functions of the same names)
A, KW, L, N, R, S = (importlib.import_module(f"areal_tik_plugin.ops.{m}")
                     for m in ("attention", "kv_write", "linear", "norm", "rope", "swiglu"))

BF = torch.bfloat16
TOKENS = (1, 17, 129)


def bits(t):
    return t.contiguous().view({2: torch.int16, 4: torch.int32}[t.element_size()])


def assert_bits(a, b, what=""):
    if a is None or b is None:
        assert a is None and b is None, what
        return
    assert a.shape == b.shape and a.dtype == b.dtype, what
    assert torch.equal(bits(a), bits(b)), what


def rnd(*shape, dtype=BF, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(dtype)


def same_error(fast, public):
    """Both calls raise; same exception type and message."""
    with pytest.raises((TypeError, ValueError)) as ef:
        fast()
    with pytest.raises((TypeError, ValueError)) as ep:
        public()
    assert type(ef.value) is type(ep.value), (ef.value, ep.value)
    assert str(ef.value) == str(ep.value)
    return str(ef.value)


def grads_of(fn, *ts):
    ts = [t.detach().clone().requires_grad_() for t in ts]
    out = fn(*ts)
    out = out[0] if isinstance(out, tuple) else out
    g = rnd(*out.shape, dtype=out.dtype, seed=99)
    out.backward(g)
    return out.detach(), [t.grad for t in ts]


# ------------------------------------------------------------------------------------------------
# bits: fast entry == public op
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("M", TOKENS)
@pytest.mark.parametrize("K,Nn", [(100, 47), (192, 80)])
def test_linear_fast_bits(M, K, Nn):
    x, w, b = rnd(M, K, seed=1), rnd(Nn, K, seed=2, scale=0.1), rnd(Nn, seed=3)
    with torch.no_grad():
        for bias in (None, b):
            assert_bits(L._linear_fast(x, w, bias), ops.linear(x, w, bias), f"M={M} bias={bias is not None}")
            x3 = x.view(1, M, K)
            assert_bits(L._linear_fast(x3, w, bias), ops.linear(x3, w, bias), "3-D x")
    yf, gf = grads_of(lambda x_, w_, b_: L._linear_fast(x_, w_, b_), x, w, b)
    yp, gp = grads_of(lambda x_, w_, b_: ops.linear(x_, w_, b_), x, w, b)
    assert_bits(yf, yp, "grad-enabled forward")
    for a, c in zip(gf, gp):
        assert_bits(a, c, "grads")


@pytest.mark.parametrize("T_", TOKENS)
def test_rms_norm_fast_bits(T_):
    H, NH, D = 96, 3, 32
    x = rnd(T_, H, seed=4)
    qkv = rnd(T_, 5 * D, seed=5)
    heads = qkv[:, : NH * D].view(T_, NH, D)  # strided per-head view of a fused output
    for w in (rnd(H, seed=6), rnd(H, dtype=torch.float32, seed=6)):
        with torch.no_grad():
            assert_bits(N._rms_norm_fast(x, w, 1e-6), ops.rms_norm(x, w, 1e-6), f"w {w.dtype}")
    wd = rnd(D, seed=7)
    with torch.no_grad():
        assert_bits(N._rms_norm_fast(heads, wd, 1e-6), ops.rms_norm(heads, wd, 1e-6), "per-head view")
    w = rnd(H, seed=6)
    yf, gf = grads_of(lambda x_, w_: N._rms_norm_fast(x_, w_, 1e-6), x, w)
    yp, gp = grads_of(lambda x_, w_: ops.rms_norm(x_, w_, 1e-6), x, w)
    assert_bits(yf, yp)
    for a, c in zip(gf, gp):
        assert_bits(a, c, "grads")


@pytest.mark.parametrize("T_", TOKENS)
def test_rope_swiglu_fast_bits(T_):
    Hq, Hkv, D = 4, 2, 32
    qkv = rnd(T_, (Hq + 2 * Hkv) * D, seed=8)
    q = qkv[:, : Hq * D].view(T_, Hq, D)
    k = qkv[:, Hq * D: (Hq + Hkv) * D].view(T_, Hkv, D)
    inv = 1.0 / (10000.0 ** (torch.arange(0, D, 2, dtype=torch.float32) / D))
    for pos in (torch.arange(T_) + 5, (torch.arange(T_, dtype=torch.int32) * 3)):
        with torch.no_grad():
            fq, fk = R._apply_rope_fast(q, k, pos, inv, 1.0)
            pq, pk = ops.apply_rope(q, k, pos, inv, 1.0)
            assert_bits(fq, pq)
            assert_bits(fk, pk)
            fq, fk = R._apply_rope_fast(q, None, pos, inv, 0.75)
            pq, pk = ops.apply_rope(q, None, pos, inv, 0.75)
            assert_bits(fq, pq)
            assert fk is None and pk is None
    I = 45
    gu = rnd(T_, 2 * I, seed=9)
    with torch.no_grad():
        assert_bits(S._swiglu_fast(gu[:, :I], gu[:, I:]), ops.swiglu(gu[:, :I], gu[:, I:]))
    yf, gf = grads_of(lambda a, b: S._swiglu_fast(a, b), gu[:, :I].contiguous(), gu[:, I:].contiguous())
    yp, gp = grads_of(lambda a, b: ops.swiglu(a, b), gu[:, :I].contiguous(), gu[:, I:].contiguous())
    assert_bits(yf, yp)
    for a, c in zip(gf, gp):
        assert_bits(a, c, "grads")


@pytest.mark.parametrize("T_", (1, 17))
def test_kv_write_and_attention_fast_bits(T_):
    Hq, Hkv, D, slots = 4, 2, 32, 40
    q, k, v = rnd(T_, Hq, D, seed=10), rnd(T_, Hkv, D, seed=11), rnd(T_, Hkv, D, seed=12)
    pools = [(rnd(slots, Hkv, D, seed=13), rnd(slots, Hkv, D, seed=14)) for _ in range(2)]
    loc = torch.randperm(slots - 1, generator=torch.Generator().manual_seed(1))[:T_] + 1
    KW._kv_write_fast(pools[0][0], pools[0][1], loc, k, v)
    ops.kv_write(pools[1][0], pools[1][1], loc, k, v)
    assert_bits(pools[0][0], pools[1][0])
    assert_bits(pools[0][1], pools[1][1])
    kc, vc = pools[0]
    table = torch.zeros(1, slots, dtype=torch.int32)
    table[0, :T_] = loc.to(torch.int32)
    cu = torch.tensor([0, T_], dtype=torch.int32)
    kw = dict(cu_seqlens_q=cu, prefix_lens=torch.zeros(1, dtype=torch.int32), kv_indices=table,
              table_rows=torch.zeros(1, dtype=torch.int32))
    for mx, scale in ((T_, 0.2), (None, None)):
        assert_bits(A._attention_extend_fast(q, kc, vc, max_extend_len=mx, softmax_scale=scale, **kw),
                    ops.attention_extend(q, kc, vc, max_extend_len=mx, softmax_scale=scale, **kw))
        assert_bits(A._attention_varlen_fast(q, k, v, cu, mx, scale), ops.attention_varlen(q, k, v, cu, mx, scale))
    yf, gf = grads_of(lambda a, b, c: A._attention_varlen_fast(a, b, c, cu, T_, None), q, k, v)
    yp, gp = grads_of(lambda a, b, c: ops.attention_varlen(a, b, c, cu, T_, None), q, k, v)
    assert_bits(yf, yp)
    for a, c in zip(gf, gp):
        assert_bits(a, c, "grads")


# ------------------------------------------------------------------------------------------------
# a changed input after a memoized call is checked again (the public op's error)
# ------------------------------------------------------------------------------------------------
def test_linear_memo_rechecks_changed_inputs():
    x, w = rnd(5, 64, seed=1), torch.nn.Parameter(rnd(24, 64, seed=2))
    with torch.no_grad():
        L._linear_fast(x, w)  # memoized
        assert (V.sig(x), V.sig(w), None) in L._MEMO
        cases = {
            "x dtype": (x.half(), w, None),
            "x shape (K)": (rnd(5, 48), w, None),
            "x device": (x.to("meta"), w, None),
            "x not contiguous": (rnd(64, 5).t(), w, None),
            "x not a tensor": (x.tolist(), w, None),
            "bias shape": (x, w, rnd(23)),
            "weight fp32": (x, w.float(), None),
            "weight column-major": (x, rnd(64, 24).t(), None),
        }
        for what, args in cases.items():
            msg = same_error(lambda: L._linear_fast(*args), lambda: ops.linear(*args))
            assert msg, what
        # the same Parameter object resized in place (id unchanged): checked again
        w.data = rnd(24, 48, seed=3)
        msg = same_error(lambda: L._linear_fast(x, w), lambda: ops.linear(x, w))
        assert "K=64" in msg


def test_rms_norm_rope_swiglu_memo_rechecks_changed_inputs():
    x, w = rnd(3, 32), rnd(32)
    with torch.no_grad():
        N._rms_norm_fast(x, w, 1)  # memoized with an int eps
        same_error(lambda: N._rms_norm_fast(x, w, True), lambda: ops.rms_norm(x, w, True))  # True == 1
        same_error(lambda: N._rms_norm_fast(x, rnd(31), 1), lambda: ops.rms_norm(x, rnd(31), 1))
        same_error(lambda: N._rms_norm_fast(x, w.double(), 1), lambda: ops.rms_norm(x, w.double(), 1))
        same_error(lambda: N._rms_norm_fast(x, w, -1.0), lambda: ops.rms_norm(x, w, -1.0))
        assert_bits(N._rms_norm_fast(x, w, 1), ops.rms_norm(x, w, 1.0))

        T_, D = 4, 16
        q, k = rnd(T_, 2, D), rnd(T_, 1, D)
        pos, inv = torch.arange(T_), torch.rand(D // 2)
        R._apply_rope_fast(q, k, pos, inv, 1.0)  # memoized
        same_error(lambda: R._apply_rope_fast(q, k, pos[:3], inv, 1.0), lambda: ops.apply_rope(q, k, pos[:3], inv, 1.0))
        same_error(lambda: R._apply_rope_fast(q, k, pos, inv.double(), 1.0),
                   lambda: ops.apply_rope(q, k, pos, inv.double(), 1.0))
        same_error(lambda: R._apply_rope_fast(q, k.half(), pos, inv, 1.0), lambda: ops.apply_rope(q, k.half(), pos, inv, 1.0))
        same_error(lambda: R._apply_rope_fast(q, k, pos, inv, 0.0), lambda: ops.apply_rope(q, k, pos, inv, 0.0))
        # value check on every call, memo hit or not (CPU): a position out of range
        bad = pos.clone()
        bad[1] = -1
        same_error(lambda: R._apply_rope_fast(q, k, bad, inv, 1.0), lambda: ops.apply_rope(q, k, bad, inv, 1.0))

        g, u = rnd(3, 8), rnd(3, 8)
        S._swiglu_fast(g, u)  # memoized
        same_error(lambda: S._swiglu_fast(g, rnd(3, 7)), lambda: ops.swiglu(g, rnd(3, 7)))
        same_error(lambda: S._swiglu_fast(g, u.half()), lambda: ops.swiglu(g, u.half()))
        same_error(lambda: S._swiglu_fast(g, rnd(8, 3).t()), lambda: ops.swiglu(g, rnd(8, 3).t()))


def test_kv_write_attention_memo_rechecks_changed_inputs():
    Hq, Hkv, D, slots, T_ = 4, 2, 32, 12, 3
    kc, vc = rnd(slots, Hkv, D), rnd(slots, Hkv, D)
    q, k, v = rnd(T_, Hq, D), rnd(T_, Hkv, D), rnd(T_, Hkv, D)
    loc = torch.tensor([3, 5, 7])
    KW._kv_write_fast(kc, vc, loc, k, v)  # memoized
    same_error(lambda: KW._kv_write_fast(kc, vc, loc, k.half(), v), lambda: ops.kv_write(kc, vc, loc, k.half(), v))
    same_error(lambda: KW._kv_write_fast(kc, vc, loc.float(), k, v), lambda: ops.kv_write(kc, vc, loc.float(), k, v))
    same_error(lambda: KW._kv_write_fast(kc, vc, loc, rnd(T_, 1, D), v), lambda: ops.kv_write(kc, vc, loc, rnd(T_, 1, D), v))
    bad = torch.tensor([3, 5, slots])  # value check on every call
    same_error(lambda: KW._kv_write_fast(kc, vc, bad, k, v), lambda: ops.kv_write(kc, vc, bad, k, v))

    cu = torch.tensor([0, T_], dtype=torch.int32)
    A._attention_varlen_fast(q, k, v, cu, T_, None)  # memoized
    same_error(lambda: A._attention_varlen_fast(q, k[:2], v[:2], cu, T_, None),
               lambda: ops.attention_varlen(q, k[:2], v[:2], cu, T_, None))
    same_error(lambda: A._attention_varlen_fast(q, k, v, cu.float(), T_, None),
               lambda: ops.attention_varlen(q, k, v, cu.float(), T_, None))
    same_error(lambda: A._attention_varlen_fast(q, k, v, cu, T_, -1.0), lambda: ops.attention_varlen(q, k, v, cu, T_, -1.0))
    same_error(lambda: A._attention_varlen_fast(q, k, v, cu, float(T_), None),
               lambda: ops.attention_varlen(q, k, v, cu, float(T_), None))
    same_error(lambda: A._attention_varlen_fast(q, rnd(T_, 3, D), rnd(T_, 3, D), cu, T_, None),
               lambda: ops.attention_varlen(q, rnd(T_, 3, D), rnd(T_, 3, D), cu, T_, None))

    table = torch.arange(slots, dtype=torch.int32)[None]
    kw = dict(cu_seqlens_q=cu, prefix_lens=torch.zeros(1, dtype=torch.int32), kv_indices=table,
              table_rows=torch.zeros(1, dtype=torch.int32), max_extend_len=T_)
    A._attention_extend_fast(q, kc, vc, **kw)  # memoized
    for change in (dict(page_size=True), dict(page_size=3), dict(kv_indices=table.float()),
                   dict(prefix_lens=torch.zeros(2, dtype=torch.int32)), dict(max_extend_len=1),
                   dict(table_rows=torch.ones(1, dtype=torch.int32))):
        kw2 = {**kw, **change}
        same_error(lambda: A._attention_extend_fast(q, kc, vc, **kw2), lambda: ops.attention_extend(q, kc, vc, **kw2))


def test_memo_is_bounded_and_skips_unhashable():
    m = V.Memo(limit=3)
    for i in range(5):
        m.add((i,))
    assert len(m) <= 3 and (4,) in m
    m.add(([1],))  # unhashable: never stored, never a hit
    assert ([1],) not in m
