"""Token log-prob / entropy: CPU tests (interpreter). Bitwise invariance between our paths (batch
size, order, strides, per-row vs scalar temperature, with/without entropy or autograd); accuracy
and gradients against fp64."""

from __future__ import annotations

import pytest
import torch

from areal_tik_plugin import ops
from areal_tik_plugin.runtime.loader import get_implementation

from tests.helpers.rowops_testutil import assert_bitwise, assert_close, rand

# fp32 arithmetic over the vocab (chunked tree sums, fp32 exp/log): absolute error in nats
TOL = {"logp": (3e-5, 1e-5), "entropy": (3e-5, 1e-5)}
TOL_GRAD = {torch.bfloat16: 1e-2, torch.float16: 2e-3, torch.float32: 1e-5}


def ref(logits, tokens, temperature=1.0):
    t = temperature.double()[:, None] if isinstance(temperature, torch.Tensor) else temperature
    ls = torch.log_softmax(logits.double() / t, -1)
    logp = ls.gather(-1, tokens.long()[..., None])[..., 0]
    p = ls.exp()
    ent = -(p * torch.where(p > 0, ls, torch.zeros_like(ls))).sum(-1)
    return logp, ent


def make(T, V, dtype=torch.bfloat16, seed=0, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    return rand(T, V, dtype=dtype, scale=scale, seed=seed), torch.randint(0, V, (T,), generator=g)


def test_chunk_constant():
    C = get_implementation().contract
    assert C.LOGPROB_VOCAB_CHUNK == 8192  # the shapes below cover 1 chunk, 2 (9000, 10000), 3 and 19 chunks


# ---- accuracy -----------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("T,V,temp", [(1, 1000, 1.0), (17, 10000, 0.7), (2, 20000, 0.9), (3, 151936, 1.3)])
def test_accuracy(dtype, T, V, temp):
    x, tok = make(T, V, dtype, seed=T)
    logp, ent = ops.token_logprobs(x, tok, temp, return_entropy=True)
    assert logp.dtype == ent.dtype == torch.float32 and logp.shape == (T,)
    rl, re = ref(x, tok, temp)
    assert_close(logp, rl, *TOL["logp"], "logp")
    assert_close(ent, re, *TOL["entropy"], "entropy")


def test_accuracy_peaked_and_masked_rows():
    T, V = 5, 9000
    x, tok = make(T, V, torch.float32, seed=1)
    x[0, 123] = 60.0            # nearly one-hot row
    c = get_implementation().contract.LOGPROB_VOCAB_CHUNK
    x[1, :c] = -float("inf")  # a whole masked chunk (grammar/vocab mask)
    x[2, ::2] = -float("inf")
    tok[1], tok[2] = V - 1, 1
    logp, ent = ops.token_logprobs(x, tok, 1.0, return_entropy=True)
    rl, re = ref(x, tok)
    assert_close(logp, rl, *TOL["logp"], "logp")
    assert_close(ent, re, *TOL["entropy"], "entropy")


def test_per_row_temperature_accuracy():
    x, tok = make(17, 5000, seed=2)
    temps = torch.linspace(0.5, 1.5, 17)
    assert_close(ops.token_logprobs(x, tok, temps), ref(x, tok, temps)[0], *TOL["logp"], "per-row T")


# ---- bitwise invariance -------------------------------------------------------------------------
@pytest.mark.parametrize("V", [1000, 10000])
def test_rows_invariant(V):
    T = 33
    x, tok = make(T, V, seed=V)
    logp, ent = ops.token_logprobs(x, tok, 0.7, return_entropy=True)
    for i in (0, 16, 32):  # decode-sized calls (SGLang sampler: one row per request)
        a, b = ops.token_logprobs(x[i:i + 1], tok[i:i + 1], 0.7, return_entropy=True)
        assert_bitwise(a, logp[i:i + 1], f"row {i} alone")
        assert_bitwise(b, ent[i:i + 1], f"row {i} entropy alone")
    perm = torch.randperm(T, generator=torch.Generator().manual_seed(0))[:17]
    assert_bitwise(ops.token_logprobs(x[perm], tok[perm], 0.7), logp[perm], "shuffled 17 rows")
    padded = torch.zeros(T, V + 64, dtype=x.dtype)
    padded[:, :V] = x
    assert_bitwise(ops.token_logprobs(padded[:, :V], tok, 0.7), logp, "padded-vocab view")
    assert_bitwise(ops.token_logprobs(x[1::2], tok[1::2], 0.7), logp[1::2], "strided rows")
    assert_bitwise(ops.token_logprobs(x[:32].view(4, 8, V), tok[:32].view(4, 8), 0.7).view(-1), logp[:32],
                   "leading dims")
    assert_bitwise(ops.token_logprobs(x, tok, 0.7), logp, "without entropy")


def test_tensor_temperature_equals_float():
    """The sampler passes per-request temperatures as a tensor, the trainer a float: same bits."""
    x, tok = make(17, 5000, seed=3)
    for t in (1.0, 0.7, 1.3):
        assert_bitwise(ops.token_logprobs(x, tok, torch.full((17,), t)), ops.token_logprobs(x, tok, t), f"T={t}")
    temps = torch.tensor([0.7, 1.0, 1.3] * 5 + [0.7, 1.0])
    mixed = ops.token_logprobs(x, tok, temps)
    for i in (0, 1, 2, 16):
        assert_bitwise(mixed[i:i + 1], ops.token_logprobs(x[i:i + 1], tok[i:i + 1], float(temps[i])), f"row {i}")


def test_fp32_copy_of_bf16_logits_same_bits():
    """SGLang may hand the sampler an fp32 copy of the bf16 logits the trainer sees: same bits."""
    x, tok = make(17, 10000, seed=8)
    a, ea = ops.token_logprobs(x, tok, 0.7, return_entropy=True)
    b, eb = ops.token_logprobs(x.float(), tok, 0.7, return_entropy=True)
    assert_bitwise(b, a, "fp32 copy vs bf16 logp")
    assert_bitwise(eb, ea, "fp32 copy vs bf16 entropy")


def test_autograd_forward_equals_inference_forward():
    x, tok = make(17, 10000, seed=4)
    logp, ent = ops.token_logprobs(x, tok, 0.9, return_entropy=True)
    lg, eg = ops.token_logprobs(x.clone().requires_grad_(), tok, 0.9, return_entropy=True)
    assert_bitwise(lg.detach(), logp, "logp with autograd")
    assert_bitwise(eg.detach(), ent, "entropy with autograd")
    # without return_entropy the kernels skip the entropy sums: logp keeps its bits, with or without autograd
    assert_bitwise(ops.token_logprobs(x.clone().requires_grad_(), tok, 0.9).detach(), logp, "autograd, no entropy")
    assert_bitwise(ops.token_logprobs(x, tok, 0.9), logp, "inference, no entropy")


def test_evict_first_knob_same_bits():
    from areal_tik_plugin.runtime.loader import get_implementation

    m = get_implementation().module("logprob")
    x, tok = make(6, 5000, seed=13)
    ref = m.forward(x, tok, 0.8)
    saved = m.EVICT_FIRST
    try:
        m.EVICT_FIRST = True
        out = m.forward(x, tok, 0.8)
    finally:
        m.EVICT_FIRST = saved
    for a, b, name in zip(out, ref, ("logp", "entropy", "lse")):
        assert_bitwise(a, b, name)


def test_kernel_forward_without_entropy():
    """The implementation's forward(entropy=False): no entropy tensor, logp and lse the same bits."""
    from areal_tik_plugin.runtime.loader import get_implementation

    m = get_implementation().module("logprob")
    x, tok = make(9, 9000, seed=12)
    lp, ent, lse = m.forward(x, tok, 0.6)
    lp2, ent2, lse2 = m.forward(x, tok, 0.6, entropy=False)
    assert ent2 is None and ent is not None
    assert_bitwise(lp2, lp, "logp")
    assert_bitwise(lse2, lse, "lse")


# ---- gradients ----------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("with_entropy", [False, True])
def test_grad(dtype, with_entropy):
    T, V, temp = 5, 10000, 0.8
    x, tok = make(T, V, dtype, seed=5)
    x.requires_grad_()
    g1 = torch.randn(T, generator=torch.Generator().manual_seed(6))
    g2 = torch.randn(T, generator=torch.Generator().manual_seed(7))
    x64 = x.detach().double().requires_grad_()
    if with_entropy:
        logp, ent = ops.token_logprobs(x, tok, temp, return_entropy=True)
        (logp * g1).sum().add((ent * g2).sum()).backward()
        rl, re = ref(x64, tok, temp)
        (rl * g1.double()).sum().add((re * g2.double()).sum()).backward()
    else:
        (ops.token_logprobs(x, tok, temp) * g1).sum().backward()
        (ref(x64, tok, temp)[0] * g1.double()).sum().backward()
    assert x.grad.dtype == dtype
    rel = float((x.grad.double() - x64.grad).norm() / x64.grad.norm())
    assert rel < TOL_GRAD[dtype], rel


# ---- errors --------------------------------------------------------------------------------------
def test_bad_inputs():
    x, tok = make(4, 100)
    with pytest.raises(TypeError):
        ops.token_logprobs(x.tolist(), tok)
    with pytest.raises(ValueError, match="tokens"):
        ops.token_logprobs(x, tok[:3])
    with pytest.raises(ValueError, match="tokens"):
        ops.token_logprobs(x, tok.float())
    with pytest.raises(ValueError, match="tokens"):
        ops.token_logprobs(x, torch.tensor([0, 1, 2, 100]))
    with pytest.raises(ValueError, match="tokens"):
        ops.token_logprobs(x, torch.tensor([0, -1, 2, 3]))
    with pytest.raises(ValueError, match="temperature"):
        ops.token_logprobs(x, tok, 0.0)
    with pytest.raises(TypeError, match="temperature"):
        ops.token_logprobs(x, tok, "1.0")
    with pytest.raises(ValueError, match="temperature"):
        ops.token_logprobs(x, tok, torch.ones(3))
    with pytest.raises(ValueError, match="temperature"):
        ops.token_logprobs(x, tok, torch.ones(4, dtype=torch.float64))
    with pytest.raises(ValueError, match="temperature"):
        ops.token_logprobs(x, tok, torch.tensor([1.0, 0.0, 1.0, 1.0]))
    with pytest.raises(ValueError, match="logits"):
        ops.token_logprobs(x.to(torch.int32), tok)
    with pytest.raises(ValueError, match="contiguous"):
        ops.token_logprobs(rand(100, 4).t(), tok)
    with pytest.raises(TypeError, match="return_entropy"):
        ops.token_logprobs(x, tok, 1.0, return_entropy=1)


def test_empty():
    out = ops.token_logprobs(torch.empty(0, 100, dtype=torch.bfloat16), torch.empty(0, dtype=torch.int64))
    assert out.shape == (0,)


# ---- EXP2 (contract LOGPROB_EXP): the other form of the sums keeps the same invariance and accuracy --
_EXP2_CASES = {
    "accuracy": lambda: test_accuracy(torch.bfloat16, 17, 10000, 0.7),
    "accuracy_full_vocab": lambda: test_accuracy(torch.float32, 3, 151936, 1.3),
    "peaked_and_masked": lambda: test_accuracy_peaked_and_masked_rows(),
    "per_row_temperature": lambda: test_per_row_temperature_accuracy(),
    "rows_invariant": lambda: test_rows_invariant(10000),
    "tensor_temperature": lambda: test_tensor_temperature_equals_float(),
    "fp32_copy": lambda: test_fp32_copy_of_bf16_logits_same_bits(),
    "without_entropy": lambda: test_kernel_forward_without_entropy(),
    "grad": lambda: test_grad(torch.float32, True),
}


@pytest.mark.parametrize("case", list(_EXP2_CASES))
def test_exp2_knob(monkeypatch, case):
    """EXP2 flipped from the contract's value: the same invariance and accuracy as the default form."""
    m = get_implementation().module("logprob")
    monkeypatch.setattr(m, "EXP2", not m.EXP2)
    _EXP2_CASES[case]()


_SHIFT_CASES = ("accuracy", "accuracy_full_vocab", "peaked_and_masked", "rows_invariant", "fp32_copy",
                "without_entropy")


@pytest.mark.parametrize("case", _SHIFT_CASES)
def test_shift_fma_knob(monkeypatch, case):
    """SHIFT_FMA (contract LOGPROB_SHIFT) flipped from the contract's value: the same invariance and accuracy."""
    m = get_implementation().module("logprob")
    assert m.SHIFT_FMA is (get_implementation().contract.LOGPROB_SHIFT == "fma")
    monkeypatch.setattr(m, "SHIFT_FMA", not m.SHIFT_FMA)
    _EXP2_CASES[case]()


def _chunk_partials(x, temp, entropy=True, **knobs):
    """The partial kernel launched directly on x [T, V] (scalar temperature): its (T, chunks, 4) workspace of
    chunk partials (max, sum of exp, entropy sum). ``knobs``: FUSED_SUMS / SHIFT_FMA, else the module's."""
    import math

    m = get_implementation().module("logprob")
    C = get_implementation().contract
    chunk = C.LOGPROB_VOCAB_CHUNK
    T, V = x.shape
    nc = math.ceil(V / chunk)
    ws = torch.full((T, nc, 4), float("nan"))
    m._logprob_partial_kernel[(T, nc)](
        x, torch.empty(1), ws, T, x.stride(0), temp, V=V, NC=nc, CHUNK=chunk, VEC=1,
        GROUP=C.LOGPROB_LOAD_GROUP, PER_ROW_T=False, ENTROPY=entropy, EXP2=bool(m.EXP2),
        SELECT_FREE=bool(m.SELECT_FREE), FUSED_SUMS=knobs.get("FUSED_SUMS", False),
        SHIFT_FMA=knobs.get("SHIFT_FMA", bool(m.SHIFT_FMA)), INTERP=m.interpreting())
    return ws


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_shift_fma_chunk_max_same_bits(dtype):
    """The fma form takes the chunk max on float(x) and scales it once: fl(max(x) * inv) is max(fl(x * inv))
    bit for bit (rounding is monotonic, inv > 0), on rows with -inf logits, a wholly masked chunk, a partial last
    chunk and temperatures above and below 1; s - m then differs by at most one rounding, so the sums agree to
    fp32 rounding and the two forms' bits differ somewhere (the knob reaches the kernel). At the max itself the
    fma form keeps the rounding residual of fl(x * inv) (~1e-6 here) where the other form has 0: the entropy sum
    of the nearly one-hot row is that small instead of 0."""
    chunk = get_implementation().contract.LOGPROB_VOCAB_CHUNK
    T, V = 4, 2 * chunk + 333
    x, _ = make(T, V, dtype, seed=47)
    x[1, :chunk // 2] = -float("inf")
    x[2, chunk:2 * chunk] = -float("inf")
    x[3, 5] = 90.0
    for temp in (0.7, 1.3):
        out = {fma: _chunk_partials(x, temp, SHIFT_FMA=fma) for fma in (False, True)}
        assert_bitwise(out[True][..., 0], out[False][..., 0], f"chunk max T={temp}")
        assert torch.allclose(out[True][..., 1:3], out[False][..., 1:3], rtol=1e-5, atol=1e-5)
        assert not torch.equal(out[True][..., 1:3].view(torch.int32), out[False][..., 1:3].view(torch.int32))


def test_exp2_knob_changes_bits(monkeypatch):
    """The knob reaches the kernels: base-2 and natural sums round differently somewhere in a 10K vocab."""
    m = get_implementation().module("logprob")
    assert m.EXP2 is (get_implementation().contract.LOGPROB_EXP == "exp2")
    x, tok = make(17, 10000, seed=21)
    ref = m.forward(x, tok, 0.7)
    monkeypatch.setattr(m, "EXP2", not m.EXP2)
    out = m.forward(x, tok, 0.7)
    assert any(not torch.equal(a.view(torch.int32), b.view(torch.int32)) for a, b in zip(out, ref))


@pytest.mark.parametrize("exp2", [False, True])
def test_select_free_entropy_knob_same_bits(monkeypatch, exp2):
    """SELECT_FREE (free knob): the entropy sum as e * max(s - m, -FLT_MAX) instead of a select on e > 0.
    Same bits as the default on ordinary rows, rows with -inf logits, a wholly masked chunk and a
    nearly one-hot row (the -0.0 terms of masked logits never reach a stored value)."""
    m = get_implementation().module("logprob")
    monkeypatch.setattr(m, "EXP2", exp2)
    T, V = 6, 9000
    x, tok = make(T, V, torch.float32, seed=31)
    x[0, 123] = 60.0
    x[1, :get_implementation().contract.LOGPROB_VOCAB_CHUNK] = -float("inf")   # a whole masked chunk
    x[2, ::2] = -float("inf")
    x[3, :] = -float("inf")
    x[3, 8500] = 1.0
    tok[1], tok[2], tok[3] = V - 1, 1, 8500
    monkeypatch.setattr(m, "SELECT_FREE", False)
    ref = m.forward(x, tok, 0.8)
    monkeypatch.setattr(m, "SELECT_FREE", True)
    out = m.forward(x, tok, 0.8)
    for a, b, name in zip(out, ref, ("logp", "entropy", "lse")):
        assert_bitwise(a, b, name)


@pytest.mark.parametrize("entropy", [False, True])
def test_fused_sums_kernel_form(entropy):
    """FUSED_SUMS (compiled kernels; forward() keeps the two tl.sum under the interpreter, where a
    two-operand reduce is ~60x slower): the partial kernel with the fused form, launched directly, gives the
    chunk partials of the separate form (max exactly; sums to fp32 rounding: the interpreter's generic reduce
    adds in another order) on rows with -inf logits and a partial last chunk. Bits of the two forms are
    compared on the GPU (the GPU suite's free-knob checks)."""
    chunk = get_implementation().contract.LOGPROB_VOCAB_CHUNK
    T, V = 3, chunk + 700
    x, _ = make(T, V, torch.float32, seed=43)
    x[1, :chunk // 2] = -float("inf")
    out = {fused: _chunk_partials(x, 0.7, entropy, FUSED_SUMS=fused) for fused in (False, True)}
    n = 3 if entropy else 2
    assert_bitwise(out[True][..., 0], out[False][..., 0], "chunk max")
    assert torch.allclose(out[True][..., 1:n], out[False][..., 1:n], rtol=2e-4, atol=1e-5)  # sums of up to 8192 terms
    assert torch.isfinite(out[True][..., :n]).all()


@pytest.mark.parametrize("whole", [False, True])
def test_full_unmasked_knob_same_bits(monkeypatch, whole):
    """FULL_UNMASKED (free knob): whole chunks load without the mask; a partial last chunk (``whole`` False)
    keeps it. Same bits as the masked loads everywhere, with and without the entropy, on rows with -inf
    logits, a wholly -inf chunk and a nearly one-hot row."""
    m = get_implementation().module("logprob")
    chunk = get_implementation().contract.LOGPROB_VOCAB_CHUNK
    T, V = 4, 2 * chunk + (0 if whole else 333)
    x, tok = make(T, V, torch.bfloat16, seed=47)
    x[0, 17] = 50.0
    x[1, :chunk] = -float("inf")
    x[2, ::5] = -float("inf")
    tok[1], tok[2] = V - 1, 1
    for entropy in (False, True):
        monkeypatch.setattr(m, "FULL_UNMASKED", False)
        ref = m.forward(x, tok, 0.9, entropy=entropy)
        monkeypatch.setattr(m, "FULL_UNMASKED", True)
        out = m.forward(x, tok, 0.9, entropy=entropy)
        for a, b, name in zip(out, ref, ("logp", "entropy", "lse")):
            if b is not None:
                assert_bitwise(a, b, f"{name} entropy={entropy}")
