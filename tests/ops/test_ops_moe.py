"""ops.moe_route / moe_experts / moe_block: bitwise token invariance (alone vs in batches, with and
without other tokens on the same experts, any tile config), routing semantics (ties, order,
renormalization), accuracy vs fp64 and vs transformers' Qwen3MoeSparseMoeBlock, gradients,
input validation. CPU: kernels run under TRITON_INTERPRET=1."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from areal_tik_plugin import ops
from areal_tik_plugin.runtime.loader import get_implementation

E, K_TOP, H, I = 8, 2, 64, 32  # small test config (Qwen3-30B-A3B: 128, 8, 2048, 768)
# |out - ref| <= atol + rtol * |ref| vs an fp64 evaluation of the same formula on the same routing.
# Intermediates (g, u, act, y_j) are rounded to the activation dtype like the kernels' contract.
TOL = {torch.bfloat16: (2e-2, 2e-2), torch.float16: (3e-3, 3e-3)}


def _bits(t):
    return t.contiguous().view({2: torch.int16, 4: torch.int32}[t.element_size()])


def _assert_bits(a, b, msg=""):
    assert a.shape == b.shape and a.dtype == b.dtype, msg
    assert torch.equal(_bits(a), _bits(b)), f"{msg}: max |diff| {(a.float() - b.float()).abs().max().item()}"


def _weights(dtype, seed=0, e=E, h=H, i=I):
    g = torch.Generator().manual_seed(seed)
    router = (torch.randn(e, h, generator=g) / h ** 0.5).to(dtype)
    wgu = (torch.randn(e, 2 * i, h, generator=g) / h ** 0.5).to(dtype)
    wd = (torch.randn(e, h, i, generator=g) / i ** 0.5).to(dtype)
    return router, wgu, wd


def _x(T, dtype, seed=1, h=H):
    return torch.randn(T, h, generator=torch.Generator().manual_seed(seed)).to(dtype)


# ------------------------------------------------------------------------------------------------
# routing
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("norm", (True, False))
@pytest.mark.parametrize("ldtype", (torch.bfloat16, torch.float32))
def test_route_matches_softmax_topk(norm, ldtype):
    logits = torch.randn(67, E, generator=torch.Generator().manual_seed(2)).to(ldtype)
    w, ids = ops.moe_route(logits, K_TOP, norm)
    assert w.dtype == torch.float32 and ids.dtype == torch.int32 and w.shape == ids.shape == (67, K_TOP)
    p = torch.softmax(logits.double(), -1)
    rv, ri = torch.topk(p, K_TOP)
    assert torch.equal(ids.long(), ri)
    if norm:
        rv = rv / rv.sum(-1, keepdim=True)
    torch.testing.assert_close(w.double(), rv, atol=1e-6, rtol=1e-5)
    assert bool((w[:, :-1] >= w[:, 1:]).all()), "slots in descending probability"


def test_route_ties_lower_id_first():
    logits = torch.zeros(3, E, dtype=torch.bfloat16)
    logits[1, 5] = logits[1, 2] = 1.0
    logits[2, :] = -1.0
    logits[2, 7] = 2.0
    w, ids = ops.moe_route(logits, 3, True)
    assert ids.tolist() == [[0, 1, 2], [2, 5, 0], [7, 0, 1]]
    torch.testing.assert_close(w.sum(-1), torch.ones(3), atol=1e-6, rtol=0)


def test_route_rows_invariant_and_large_e():
    logits = torch.randn(129, 128, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    w, ids = ops.moe_route(logits, 8, True)
    g = torch.Generator().manual_seed(4)
    for M in (1, 3, 17, 64):
        idx = torch.randperm(129, generator=g)[:M]
        w2, i2 = ops.moe_route(logits[idx].contiguous(), 8, True)
        _assert_bits(w2, w[idx], f"weights M={M}")
        assert torch.equal(i2, ids[idx])
    # bf16 logits tie often: reference = stable descending sort (ties -> lower expert id)
    ri = torch.sort(torch.softmax(logits.float(), -1), dim=-1, descending=True, stable=True).indices[:, :8]
    assert torch.equal(ids.long(), ri)


# ------------------------------------------------------------------------------------------------
# experts: token invariance
# ------------------------------------------------------------------------------------------------
def _route(x, router, norm=True):
    return ops.moe_route(ops.linear(x, router), K_TOP, norm)


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16))
def test_token_invariance_random_batches(dtype):
    router, wgu, wd = _weights(dtype)
    x = _x(129, dtype)
    out, logits = ops.moe_block(x, router, wgu, wd, K_TOP, True)
    g = torch.Generator().manual_seed(5)
    for M in (1, 3, 17, 64, 129):
        idx = torch.randperm(129, generator=g)[:M]
        o2, l2 = ops.moe_block(x[idx].contiguous(), router, wgu, wd, K_TOP, True)
        _assert_bits(o2, out[idx], f"out M={M}")
        _assert_bits(l2, logits[idx], f"logits M={M}")


def test_token_invariance_shared_vs_private_experts():
    """Token 0 alone == token 0 among tokens on the same experts == among tokens on other experts."""
    dtype = torch.bfloat16
    _, wgu, wd = _weights(dtype, seed=6)
    T = 40
    x = _x(T, dtype, seed=7)
    w = torch.rand(T, K_TOP, generator=torch.Generator().manual_seed(8))
    ids_same = torch.tensor([[3, 5]] * T, dtype=torch.int32)           # everybody on token 0's experts
    ids_other = torch.tensor([[3, 5]] + [[0, 1]] * (T - 1), dtype=torch.int32)  # nobody else there
    ids_mixed = torch.randint(0, E, (T, K_TOP), generator=torch.Generator().manual_seed(9)).to(torch.int32)
    ids_mixed[:, 1] = (ids_mixed[:, 0] + 1 + torch.arange(T) % (E - 1)) % E
    ids_mixed[0] = torch.tensor([3, 5])
    alone = ops.moe_experts(x[:1], wgu, wd, w[:1], ids_same[:1])
    for name, ids in (("same", ids_same), ("other", ids_other), ("mixed", ids_mixed)):
        out = ops.moe_experts(x, wgu, wd, w, ids)
        _assert_bits(out[:1], alone, name)
        perm = torch.randperm(T, generator=torch.Generator().manual_seed(10))
        outp = ops.moe_experts(x[perm].contiguous(), wgu, wd, w[perm].contiguous(), ids[perm].contiguous())
        _assert_bits(outp, out[perm], f"{name} permuted")
    # int64 ids, the same bits
    _assert_bits(ops.moe_experts(x, wgu, wd, w, ids_mixed.long()), ops.moe_experts(x, wgu, wd, w, ids_mixed), "int64")


def test_every_expert_config_same_bits():
    moe = get_implementation().module("moe")
    dtype = torch.bfloat16
    router, wgu, wd = _weights(dtype, seed=11, h=100, i=40)  # K tails in both grouped GEMMs
    x = _x(50, dtype, seed=12, h=100)
    w, ids = ops.moe_route(ops.linear(x, router), K_TOP, True)
    ref = moe.experts(x, wgu, wd, w, ids)
    for cfg in moe.all_configs():
        _assert_bits(moe.experts(x, wgu, wd, w, ids, config=cfg), ref, cfg["name"])


def test_grouping_table():
    moe = get_implementation().module("moe")
    ids = torch.tensor([5, 1, 5, 5, 0, 7, 5, 1, 5, 5], dtype=torch.int32)
    sorted_ids, counts, blk = moe.group_by_expert(ids, 8, 4)
    assert counts.tolist() == [1, 2, 0, 0, 0, 6, 0, 1]
    assert [int(ids[a]) for a in sorted_ids.tolist()] == sorted(ids.tolist())
    assert sorted(sorted_ids.tolist()) == list(range(10))
    used = blk[0] >= 0
    assert blk[0][used].tolist() == [0, 1, 5, 5, 7]
    assert blk[1][used].tolist() == [0, 1, 3, 7, 9]
    assert blk[2][used].tolist() == [1, 2, 4, 2, 1]


# ------------------------------------------------------------------------------------------------
# accuracy
# ------------------------------------------------------------------------------------------------
def _ref_experts(x, wgu, wd, w, ids, dtype):
    """fp64 evaluation of the contract formula, with the contract's rounding points."""
    rnd = lambda t: t.to(dtype).double()  # noqa: E731
    T = x.shape[0]
    out = torch.zeros(T, x.shape[1], dtype=torch.float64)
    for t in range(T):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            g = rnd(x[t].double() @ wgu[e, :I].double().t())
            u = rnd(x[t].double() @ wgu[e, I:].double().t())
            a = rnd(F.silu(g) * u)
            out[t] += w[t, j].double() * rnd(a @ wd[e].double().t())
    return out


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16))
def test_experts_accuracy_vs_fp64(dtype):
    router, wgu, wd = _weights(dtype, seed=13)
    x = _x(33, dtype, seed=14)
    w, ids = _route(x, router)
    out = ops.moe_experts(x, wgu, wd, w, ids)
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(out.double(), _ref_experts(x, wgu, wd, w, ids, dtype), atol=atol, rtol=rtol)


def test_block_vs_transformers_qwen3_moe():
    transformers = pytest.importorskip("transformers")
    from transformers.models.qwen3_moe.configuration_qwen3_moe import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    del transformers
    dtype = torch.bfloat16
    router, wgu, wd = _weights(dtype, seed=15)
    cfg = Qwen3MoeConfig(hidden_size=H, num_experts=E, num_experts_per_tok=K_TOP, moe_intermediate_size=I,
                         norm_topk_prob=True, hidden_act="silu")
    blk = Qwen3MoeSparseMoeBlock(cfg).double()
    with torch.no_grad():
        blk.gate.weight.copy_(router.double())
        blk.experts.gate_up_proj.copy_(wgu.double())
        blk.experts.down_proj.copy_(wd.double())
    T = 45
    x = _x(T, dtype, seed=16)
    out, logits = ops.moe_block(x, router, wgu, wd, K_TOP, True)
    with torch.no_grad():
        ref_logits, ref_w, ref_ids = blk.gate(x.double())
        ref = blk(x.double().view(1, T, H)).view(T, H)
    torch.testing.assert_close(logits.double(), ref_logits, atol=1e-2, rtol=1e-2)
    # tokens whose k-th / (k+1)-th probabilities are well separated must pick HF's experts
    p = torch.softmax(ref_logits, -1).sort(-1, descending=True).values
    clear = (p[:, K_TOP - 1] - p[:, K_TOP]) > 2e-2
    assert int(clear.sum()) > T // 2
    _, ids = ops.moe_route(logits, K_TOP, True)
    assert torch.equal(ids[clear].long().sort(-1).values, ref_ids[clear].sort(-1).values)
    torch.testing.assert_close(out[clear].double(), ref[clear], atol=3e-2, rtol=3e-2)


# ------------------------------------------------------------------------------------------------
# gradients
# ------------------------------------------------------------------------------------------------
def _ref_block(x, router, wgu, wd, ids, norm):
    logits = x @ router.t()
    p = torch.softmax(logits, -1)
    w = p.gather(1, ids.long())
    if norm:
        w = w / w.sum(-1, keepdim=True)
    out = torch.zeros_like(x)
    for j in range(ids.shape[1]):
        e = ids[:, j].long()
        gu = torch.einsum("th,tnh->tn", x, wgu[e])
        a = F.silu(gu[:, :I]) * gu[:, I:]
        out = out + w[:, j:j + 1] * torch.einsum("ti,thi->th", a, wd[e])
    return out


@pytest.mark.parametrize("norm,dtype", ((True, torch.bfloat16), (False, torch.bfloat16), (True, torch.float16)))
def test_block_gradients_vs_fp64(norm, dtype):
    """bf16: torch grouped-GEMM backward; fp16: the per-expert loop."""
    router, wgu, wd = _weights(dtype, seed=17)
    x = _x(29, dtype, seed=18)
    params = [t.clone().requires_grad_() for t in (x, router, wgu, wd)]
    out, _ = ops.moe_block(*params, K_TOP, norm)
    gy = torch.randn(out.shape, generator=torch.Generator().manual_seed(19)).to(dtype)
    grads = torch.autograd.grad(out, params, gy)
    _, ids = ops.moe_route(ops.linear(x, router), K_TOP, norm)
    ref_params = [t.detach().double().requires_grad_() for t in (x, router, wgu, wd)]
    ref_out = _ref_block(*ref_params, ids, norm)
    ref_grads = torch.autograd.grad(ref_out, ref_params, gy.double())
    for name, a, r in zip(("dx", "d_router", "d_gate_up", "d_down"), grads, ref_grads):
        assert a.dtype == dtype and a.shape == r.shape, name
        rel = ((a.double() - r).norm() / r.norm()).item()
        assert rel < 3e-2, f"{name}: rel l2 {rel}"


def test_experts_weight_grad_only():
    dtype = torch.bfloat16
    _, wgu, wd = _weights(dtype, seed=20)
    x = _x(7, dtype, seed=21)
    w = torch.rand(7, K_TOP, requires_grad=True)
    ids = torch.tensor([[0, 1], [1, 2], [2, 3], [3, 4], [4, 5], [5, 6], [6, 7]], dtype=torch.int32)
    out = ops.moe_experts(x, wgu, wd, w, ids)
    (dw,) = torch.autograd.grad(out.float().sum(), (w,))
    y = torch.stack([_ref_experts(x, wgu, wd, torch.eye(K_TOP)[j].expand(7, K_TOP), ids, dtype).sum(-1)
                     for j in range(K_TOP)], 1)
    torch.testing.assert_close(dw.double(), y, atol=5e-2, rtol=2e-2)


def test_backward_grouped_matches_loop_with_empty_experts():
    moe = get_implementation().module("moe")
    dtype = torch.bfloat16
    _, wgu, wd = _weights(dtype, seed=22)
    T = 9
    x = _x(T, dtype, seed=23)
    ids = torch.tensor([[1, 4], [4, 1]] * 4 + [[4, 6]], dtype=torch.int32)  # experts 0, 2, 3, 5, 7 empty
    w = torch.rand(T, K_TOP)
    out, (y, sorted_ids, counts) = moe.experts(x, wgu, wd, w, ids, return_intermediate=True)
    gy = torch.randn(T, H).to(dtype)
    dy = (w.unsqueeze(-1) * gy.float().unsqueeze(1)).to(dtype).view(-1, H)
    got = moe._experts_backward_grouped(x, wgu, wd, dy, sorted_ids, counts, K_TOP, True, True, True)
    ref = moe._experts_backward_loop(x, wgu, wd, dy, sorted_ids, counts, K_TOP, True, True, True)
    for name, a, r in zip(("dx", "d_gate_up", "d_down"), got, ref):
        assert a.shape == r.shape and a.dtype == r.dtype, name
        torch.testing.assert_close(a.float(), r.float(), atol=2e-2, rtol=2e-2)
    for e in (0, 2, 3, 5, 7):
        assert not got[1][e].any() and not got[2][e].any(), f"expert {e} received no rows: zero grads"


# ------------------------------------------------------------------------------------------------
# validation and edge cases
# ------------------------------------------------------------------------------------------------
def test_empty_tokens():
    router, wgu, wd = _weights(torch.bfloat16)
    out, logits = ops.moe_block(torch.empty(0, H, dtype=torch.bfloat16), router, wgu, wd, K_TOP, True)
    assert out.shape == (0, H) and logits.shape == (0, E)


def test_bad_inputs():
    dtype = torch.bfloat16
    router, wgu, wd = _weights(dtype)
    x = _x(4, dtype)
    logits = torch.randn(4, E)
    w = torch.rand(4, K_TOP)
    ids = torch.zeros(4, K_TOP, dtype=torch.int32)
    ids[:, 1] = 1
    with pytest.raises(TypeError):
        ops.moe_route(logits, 2.0, True)
    with pytest.raises(TypeError):
        ops.moe_route(logits, 2, 1)
    with pytest.raises(ValueError, match="top_k"):
        ops.moe_route(logits, E + 1, True)
    with pytest.raises(ValueError, match="top_k"):
        ops.moe_route(logits, 0, True)
    with pytest.raises(ValueError, match="2-D"):
        ops.moe_route(logits[0], 2, True)
    with pytest.raises(ValueError, match="dtype"):
        ops.moe_route(logits.double(), 2, True)
    with pytest.raises(TypeError):
        ops.moe_experts(x.tolist(), wgu, wd, w, ids)
    with pytest.raises(ValueError, match="expert ids"):
        ops.moe_experts(x, wgu, wd, w, ids + E - 1)
    with pytest.raises(ValueError, match="expert ids"):
        ops.moe_experts(x, wgu, wd, w, ids - 1)
    with pytest.raises(ValueError, match="w_down"):
        ops.moe_experts(x, wgu, wd[:, :, :-1], w, ids)
    with pytest.raises(ValueError, match="w_gate_up"):
        ops.moe_experts(x, wgu[:, :, :-1], wd, w, ids)
    with pytest.raises(ValueError, match="dtype"):
        ops.moe_experts(x, wgu.half(), wd, w, ids)
    with pytest.raises(ValueError, match="dtype"):
        ops.moe_experts(x, wgu, wd, w.to(dtype), ids)
    with pytest.raises(ValueError, match="dtype"):
        ops.moe_experts(x, wgu, wd, w, ids.float())
    with pytest.raises(ValueError, match="shape"):
        ops.moe_experts(x, wgu, wd, w[:3], ids[:3])
    with pytest.raises(ValueError, match="router_weight"):
        ops.moe_block(x, router[:, :-1], wgu, wd, K_TOP, True)
    with pytest.raises(ValueError, match="experts"):
        ops.moe_block(x, router[:-1], wgu, wd, K_TOP, True)
