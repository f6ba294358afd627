"""The public ops' static checks run once per argument signature (``ops._validate.Memo``).

A memo hit skips the static checks (the point: a layer's repeated calls stay cheap); a changed input
after a memoized call (dtype, shape, device, strides, a replaced or resized weight, a scalar of another
type or value) misses and raises exactly the error a first call raises; value checks run on every call.
CPU: kernels run under TRITON_INTERPRET=1."""

from __future__ import annotations

import importlib

import pytest
import torch

from areal_tik_plugin import ops
from areal_tik_plugin.ops import _validate as V

# the op modules (``ops.linear`` etc. are the public functions of the same names)
A, KW, L, LP, MO, N, R, S = (importlib.import_module(f"areal_tik_plugin.ops.{m}")
                             for m in ("attention", "kv_write", "linear", "logprob", "moe", "norm", "rope", "swiglu"))

BF = torch.bfloat16


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


def same_error(first, second):
    """Both calls raise; same exception type and message."""
    with pytest.raises((TypeError, ValueError)) as e1:
        first()
    with pytest.raises((TypeError, ValueError)) as e2:
        second()
    assert type(e1.value) is type(e2.value), (e1.value, e2.value)
    assert str(e1.value) == str(e2.value)
    return str(e1.value)


def clear_memos():
    for mod in (A, KW, L, LP, MO, N, R, S):
        for v in vars(mod).values():
            if isinstance(v, V.Memo):
                v.clear()


def memo_vs_fresh(call):
    """``call`` raises the same error on a memo holding other (good) signatures as on empty memos."""
    def fresh():
        clear_memos()
        return call()

    return same_error(call, fresh)


# ------------------------------------------------------------------------------------------------
# a memo hit skips the static checks; the value checks still run
# ------------------------------------------------------------------------------------------------
def test_memo_hit_skips_static_checks(monkeypatch):
    x, w = rnd(5, 64, seed=1), rnd(24, 64, seed=2)
    g, u = rnd(3, 8), rnd(3, 8)
    xn, wn = rnd(3, 32), rnd(32)
    clear_memos()
    counts = {}

    def counting(mod, name):
        orig = getattr(mod, name)

        def f(*a, **k):
            counts[name] = counts.get(name, 0) + 1
            return orig(*a, **k)

        monkeypatch.setattr(mod, name, f)

    counting(L, "check_linear_args")
    counting(S, "_check")
    counting(N, "_check")
    with torch.no_grad():
        ref = [ops.linear(x, w), ops.swiglu(g, u), ops.rms_norm(xn, wn, 1e-6)]
        for _ in range(3):
            got = [ops.linear(x, w), ops.swiglu(g, u), ops.rms_norm(xn, wn, 1e-6)]
            for a, b in zip(got, ref):
                assert_bits(a, b)
        assert counts == {"check_linear_args": 1, "_check": 2}, counts  # swiglu's and norm's _check once each
        ops.linear(x[:4], w)  # another signature: checked
        assert counts["check_linear_args"] == 2


def test_value_checks_run_on_memo_hits():
    T_, D, slots = 4, 16, 12
    q, k = rnd(T_, 2, D), rnd(T_, 1, D)
    pos, inv = torch.arange(T_), torch.rand(D // 2)
    with torch.no_grad():
        ops.apply_rope(q, k, pos, inv, 1.0)
        bad = pos.clone()
        bad[1] = -1
        memo_vs_fresh(lambda: ops.apply_rope(q, k, bad, inv, 1.0))
        kc, vc = rnd(slots, 1, D), rnd(slots, 1, D)
        loc = torch.tensor([3, 5, 7, 9])
        ops.kv_write(kc, vc, loc, k, k)
        assert "loc" in memo_vs_fresh(lambda: ops.kv_write(kc, vc, torch.tensor([3, 5, 7, slots]), k, k))
        logits, tok = rnd(T_, 33, dtype=torch.float32), torch.tensor([0, 5, 32, 1])
        ops.token_logprobs(logits, tok)
        assert "tokens" in memo_vs_fresh(lambda: ops.token_logprobs(logits, torch.tensor([0, 5, 33, 1])))


# ------------------------------------------------------------------------------------------------
# a changed input after a memoized call is checked again (the first call's error)
# ------------------------------------------------------------------------------------------------
def test_linear_memo_rechecks_changed_inputs():
    x, w = rnd(5, 64, seed=1), torch.nn.Parameter(rnd(24, 64, seed=2))
    with torch.no_grad():
        ops.linear(x, w)  # memoized
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
            ops.linear(x, w)
            assert memo_vs_fresh(lambda: ops.linear(*args)), what
        # the same Parameter object resized in place (id unchanged): checked again
        ops.linear(x, w)
        w.data = rnd(24, 48, seed=3)
        assert "K=64" in memo_vs_fresh(lambda: ops.linear(x, w))


def test_rms_norm_rope_swiglu_memo_rechecks_changed_inputs():
    x, w = rnd(3, 32), rnd(32)
    with torch.no_grad():
        ops.rms_norm(x, w, 1)  # memoized with an int eps
        memo_vs_fresh(lambda: ops.rms_norm(x, w, True))  # True == 1 but not a float
        for bad in ((x, rnd(31), 1), (x, w.double(), 1), (x, w, -1.0)):
            ops.rms_norm(x, w, 1)
            memo_vs_fresh(lambda: ops.rms_norm(*bad))
        assert_bits(ops.rms_norm(x, w, 1), ops.rms_norm(x, w, 1.0))
        r = rnd(3, 32, seed=4)
        ops.rms_norm_residual(x, r, w, 1e-6)
        memo_vs_fresh(lambda: ops.rms_norm_residual(x, r.half(), w, 1e-6))

        T_, D = 4, 16
        q, k = rnd(T_, 2, D), rnd(T_, 1, D)
        pos, inv = torch.arange(T_), torch.rand(D // 2)
        for bad in ((q, k, pos[:3], inv, 1.0), (q, k, pos, inv.double(), 1.0), (q, k.half(), pos, inv, 1.0),
                    (q, k, pos, inv, 0.0)):
            ops.apply_rope(q, k, pos, inv, 1.0)
            memo_vs_fresh(lambda: ops.apply_rope(*bad))

        g, u = rnd(3, 8), rnd(3, 8)
        for bad in ((g, rnd(3, 7)), (g, u.half()), (g, rnd(8, 3).t())):
            ops.swiglu(g, u)
            memo_vs_fresh(lambda: ops.swiglu(*bad))
        ops.swiglu_fused(rnd(3, 8))
        memo_vs_fresh(lambda: ops.swiglu_fused(rnd(3, 7)))


def test_kv_write_attention_memo_rechecks_changed_inputs():
    Hq, Hkv, D, slots, T_ = 4, 2, 32, 12, 3
    kc, vc = rnd(slots, Hkv, D), rnd(slots, Hkv, D)
    q, k, v = rnd(T_, Hq, D), rnd(T_, Hkv, D), rnd(T_, Hkv, D)
    loc = torch.tensor([3, 5, 7])
    for bad in ((kc, vc, loc, k.half(), v), (kc, vc, loc.float(), k, v), (kc, vc, loc, rnd(T_, 1, D), v)):
        ops.kv_write(kc, vc, loc, k, v)
        memo_vs_fresh(lambda: ops.kv_write(*bad))

    cu = torch.tensor([0, T_], dtype=torch.int32)
    for bad in ((q, k[:2], v[:2], cu, T_, None), (q, k, v, cu.float(), T_, None), (q, k, v, cu, T_, -1.0),
                (q, k, v, cu, float(T_), None), (q, rnd(T_, 3, D), rnd(T_, 3, D), cu, T_, None)):
        ops.attention_varlen(q, k, v, cu, T_, None)
        memo_vs_fresh(lambda: ops.attention_varlen(*bad))

    table = torch.arange(slots, dtype=torch.int32)[None]
    kw = dict(cu_seqlens_q=cu, prefix_lens=torch.zeros(1, dtype=torch.int32), kv_indices=table,
              table_rows=torch.zeros(1, dtype=torch.int32), max_extend_len=T_)
    for change in (dict(page_size=True), dict(page_size=3), dict(kv_indices=table.float()),
                   dict(prefix_lens=torch.zeros(2, dtype=torch.int32)), dict(max_extend_len=1),
                   dict(table_rows=torch.ones(1, dtype=torch.int32))):
        ops.attention_extend(q, kc, vc, **kw)
        kw2 = {**kw, **change}
        memo_vs_fresh(lambda: ops.attention_extend(q, kc, vc, **kw2))

    qd = rnd(1, Hq, D)
    dkw = dict(seq_lens=torch.tensor([3], dtype=torch.int32), kv_indices=table, table_rows=torch.zeros(1, dtype=torch.int32))
    for change in (dict(max_context_len=0), dict(page_size=3), dict(out=rnd(2, Hq, D)),
                   dict(seq_lens=torch.tensor([slots + 1], dtype=torch.int32)), dict(table_rows=None)):
        ops.attention_decode(qd, kc, vc, **dkw)
        kw2 = {**dkw, **change}
        memo_vs_fresh(lambda: ops.attention_decode(qd, kc, vc, **kw2))


def test_moe_logprob_memo_rechecks_changed_inputs():
    T_, H, E, I, k = 3, 16, 4, 8, 2
    x, rw = rnd(T_, H), rnd(E, H, seed=1)
    wgu, wd = rnd(E, 2 * I, H, seed=2), rnd(E, H, I, seed=3)
    with torch.no_grad():
        for bad in ((x, rw, wgu, wd, E + 1, True), (x, rw, wgu, wd, k, 1), (x, rw[:3], wgu, wd, k, True),
                    (x, rw, wgu, wd[:, :, :5], k, True)):
            ops.moe_block(x, rw, wgu, wd, k, True)
            memo_vs_fresh(lambda: ops.moe_block(*bad))
        logits, tok = rnd(T_, 33, dtype=torch.float32), torch.tensor([0, 5, 32])
        for bad in ((logits, tok, 0.0), (logits, tok.float(), 1.0), (logits, tok, torch.ones(2)),
                    (logits, tok, 1.0, 1)):
            ops.token_logprobs(logits, tok, 1.0)
            memo_vs_fresh(lambda: ops.token_logprobs(*bad))


def test_memo_is_bounded_and_skips_unhashable():
    m = V.Memo(limit=3)
    for i in range(5):
        m.add((i,))
    assert len(m) <= 3 and (4,) in m
    m.add(([1],))  # unhashable: never stored, never a hit
    assert ([1],) not in m
