"""Qwen3-MoE sparse block: routing + experts, token-invariant.

Semantics (transformers ``Qwen3MoeSparseMoeBlock``; weights in its fused 3-D layout)::

    router_logits = linear(x, router_weight)                        # [T, E], x.dtype
    p = softmax(float32(router_logits))                              # fp32
    topk_ids = top-k of p, descending, ties -> lower expert id      # int32 [T, k]
    topk_weights = p[topk_ids] (/ their sum, slot order, if norm_topk_prob)   # fp32 [T, k]
    for slot j: e = topk_ids[t, j]
        g, u = linear(x[t], w_gate_up[e][:I]), linear(x[t], w_gate_up[e][I:])
        y_j = linear(dtype(silu(g) * u), w_down[e])
    out[t] = dtype(sum_j topk_weights[t, j] * float32(y_j))         # fp32, slot order j = 0..k-1

Differences from the HF eager block, all on the accurate side: HF casts the routing weights to
bf16 and accumulates the expert outputs into a bf16 tensor expert by expert (index_add_); here the
weights stay fp32 and the k expert outputs are combined in fp32 with one final rounding, and
silu(g)*u is rounded once (HF rounds silu(g) and the product separately).

A token's output depends only on its own row (and the weights): not on T, on the other tokens, or
on how many of them chose the same experts. Backward (training) runs through torch/cuBLAS.
"""

from __future__ import annotations

import torch

from areal_tik_plugin.runtime import loader as _loader
from areal_tik_plugin.ops import _validate as V
from areal_tik_plugin.ops.linear import linear

MAX_TOP_K = 64


def _impl():
    return _loader.current_module("moe")


def _check_top_k(top_k, E):
    if isinstance(top_k, bool) or not isinstance(top_k, int):
        raise TypeError(f"top_k: expected an int, got {type(top_k).__name__}")
    if not 1 <= top_k <= min(E, MAX_TOP_K):
        raise ValueError(f"top_k: expected 1 <= top_k <= min(num_experts={E}, {MAX_TOP_K}), got {top_k}")


def _check_norm(norm_topk_prob):
    if not isinstance(norm_topk_prob, bool):
        raise TypeError(f"norm_topk_prob: expected a bool, got {type(norm_topk_prob).__name__}")


class _Route(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, top_k, norm):
        w, ids = _impl().route(logits, top_k, norm)
        ctx.save_for_backward(logits, ids)
        ctx.norm = norm
        ctx.mark_non_differentiable(ids)
        return w, ids

    @staticmethod
    def backward(ctx, dw, dids):  # noqa: ARG004
        logits, ids = ctx.saved_tensors
        if dw is None:
            return None, None, None
        with torch.enable_grad():
            lf = logits.detach().float().requires_grad_(True)
            p = torch.softmax(lf, dim=-1)
            w = p.gather(1, ids.long())
            if ctx.norm:
                w = w / w.sum(dim=-1, keepdim=True)
            (g,) = torch.autograd.grad(w, lf, dw.float())
        return g.to(logits.dtype), None, None


def moe_route(router_logits, top_k, norm_topk_prob):
    """Qwen3-MoE routing: fp32 softmax, top-k (ties -> lower expert id), optional renormalization.

    Parameters
    ----------
    router_logits : Tensor [T, E] bf16/fp16/fp32 (last dim contiguous), E <= 1024
    top_k : int, 1 <= top_k <= min(E, 64)
    norm_topk_prob : bool, divide the k weights by their sum (summed in slot order)

    Returns
    -------
    (topk_weights fp32 [T, k], topk_ids int32 [T, k]); slots in descending probability.
    ``topk_weights`` is differentiable w.r.t. ``router_logits``.
    """
    _MEMO_ROUTE.once((V.sig(router_logits), V.sig(top_k), V.sig(norm_topk_prob)), _check_route, router_logits, top_k,
                     norm_topk_prob)
    if torch.is_grad_enabled() and router_logits.requires_grad:
        return _Route.apply(router_logits, top_k, norm_topk_prob)
    return _impl().route(router_logits, top_k, norm_topk_prob)


def _check_route(router_logits, top_k, norm_topk_prob):
    V.tensor("router_logits", router_logits, ndim=2, dtypes=V.FLOAT_DTYPES + (torch.float32,),
             contiguous_last=True, allow_empty=True)
    E = router_logits.shape[1]
    if not 1 <= E <= 1024:
        raise ValueError(f"router_logits: expected 1 <= num_experts <= 1024 columns, got {E}")
    _check_top_k(top_k, E)
    _check_norm(norm_topk_prob)


class _Experts(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w_gate_up, w_down, topk_weights, topk_ids):
        need = any(ctx.needs_input_grad[:4])
        res = _impl().experts(x, w_gate_up, w_down, topk_weights, topk_ids, return_intermediate=need)
        if not need:
            return res
        out, inter = res
        if inter is None:  # T == 0
            ctx.empty = True
            ctx.save_for_backward(x, w_gate_up, w_down, topk_weights)
            return out
        ctx.empty = False
        y, sorted_ids, counts = inter
        ctx.save_for_backward(x, w_gate_up, w_down, topk_weights, topk_ids, y, sorted_ids, counts)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        if ctx.empty:
            x, wgu, wd, tw = ctx.saved_tensors
            return (torch.zeros_like(x), torch.zeros_like(wgu), torch.zeros_like(wd), torch.zeros_like(tw), None)
        x, wgu, wd, tw, ids, y, sorted_ids, counts = ctx.saved_tensors
        nx, nwgu, nwd, nw = ctx.needs_input_grad[:4]
        dx, dwgu, dwd, dw = _impl().experts_backward(grad_out, x, wgu, wd, tw, ids, y, sorted_ids, counts,
                                                     nx, nwgu, nwd, nw)
        return dx, dwgu, dwd, dw, None


def _check_experts(x, w_gate_up, w_down, topk_weights, topk_ids):
    V.tensor("x", x, ndim=2, dtypes=V.FLOAT_DTYPES, contiguous_last=True, allow_empty=True)
    dev = x.device
    V.tensor("w_gate_up", w_gate_up, ndim=3, dtypes=(x.dtype,), device=dev, contiguous_last=True)
    V.tensor("w_down", w_down, ndim=3, dtypes=(x.dtype,), device=dev, contiguous_last=True)
    T, H = x.shape
    E, I2, H2 = w_gate_up.shape
    if H2 != H:
        raise ValueError(f"w_gate_up: expected shape [E, 2*I, H={H}], got {tuple(w_gate_up.shape)}")
    if I2 % 2:
        raise ValueError(f"w_gate_up: expected an even dim 1 (2 * moe_intermediate_size), got {I2}")
    I = I2 // 2
    if tuple(w_down.shape) != (E, H, I):
        raise ValueError(f"w_down: expected shape [E={E}, H={H}, I={I}], got {tuple(w_down.shape)}")
    for name, w in (("w_gate_up", w_gate_up), ("w_down", w_down)):
        if w.stride(1) < w.shape[2] or w.stride(0) < w.shape[1] * w.stride(1):
            raise ValueError(f"{name}: expected expert-major row-major storage, got strides {w.stride()}")
    V.tensor("topk_ids", topk_ids, ndim=2, dtypes=V.INDEX_DTYPES, device=dev, allow_empty=True)
    V.tensor("topk_weights", topk_weights, ndim=2, dtypes=(torch.float32,), device=dev, allow_empty=True)
    if topk_ids.shape[0] != T or topk_weights.shape != topk_ids.shape:
        raise ValueError(f"topk_ids / topk_weights: expected shape [T={T}, k] each, got "
                         f"{tuple(topk_ids.shape)} and {tuple(topk_weights.shape)}")
    k = topk_ids.shape[1]
    if not 1 <= k <= min(E, MAX_TOP_K):
        raise ValueError(f"topk_ids: expected 1 <= k <= min(num_experts={E}, {MAX_TOP_K}) columns, got {k}")


def _experts_values(x, w_gate_up, topk_ids):
    """Value check of :func:`moe_experts` (a host sync: CPU always, GPU with ``TIK_CHECK_VALUES=1``)."""
    T, E = x.shape[0], w_gate_up.shape[0]
    if T and V.check_values(x.device):
        lo, hi = int(topk_ids.min()), int(topk_ids.max())
        if lo < 0 or hi >= E:
            raise ValueError(f"topk_ids: expected expert ids in [0, {E}), got values in [{lo}, {hi}]")


def moe_experts(x, w_gate_up, w_down, topk_weights, topk_ids):
    """Expert SwiGLU FFNs of the chosen experts, combined with the routing weights.

    Parameters
    ----------
    x : Tensor [T, H] bf16/fp16
    w_gate_up : Tensor [E, 2*I, H] (transformers 5 ``experts.gate_up_proj``: gate rows then up rows)
    w_down : Tensor [E, H, I] (``experts.down_proj``)
    topk_weights : fp32 Tensor [T, k]
    topk_ids : int32/int64 Tensor [T, k], values in [0, E)

    Returns
    -------
    Tensor [T, H] in x.dtype; differentiable w.r.t. x, w_gate_up, w_down and topk_weights.

    Value checks (0 <= topk_ids < E) read tensor values, a host sync: they run on CPU tensors always and
    on CUDA tensors only with ``TIK_CHECK_VALUES=1`` outside CUDA-graph capture (SGLang's decode is
    captured); a bad value on the GPU otherwise gives undefined rows.
    """
    key = (V.sig(x), V.sig(w_gate_up), V.sig(w_down), V.sig(topk_weights), V.sig(topk_ids))
    _MEMO_EXPERTS.once(key, _check_experts, x, w_gate_up, w_down, topk_weights, topk_ids)
    _experts_values(x, w_gate_up, topk_ids)
    if topk_weights.stride(-1) != 1 or topk_weights.stride(0) != topk_weights.shape[1]:
        topk_weights = topk_weights.contiguous()
    if torch.is_grad_enabled() and any(t.requires_grad for t in (x, w_gate_up, w_down, topk_weights)):
        return _Experts.apply(x, w_gate_up, w_down, topk_weights, topk_ids)
    return _impl().experts(x, w_gate_up, w_down, topk_weights, topk_ids)


def moe_block(x, router_weight, w_gate_up, w_down, top_k, norm_topk_prob):
    """Whole Qwen3-MoE sparse block: router linear -> :func:`moe_route` -> :func:`moe_experts`.

    Parameters
    ----------
    x : Tensor [T, H] bf16/fp16
    router_weight : Tensor [E, H] (``gate.weight``)
    w_gate_up, w_down : see :func:`moe_experts`
    top_k : int (``num_experts_per_tok``); norm_topk_prob : bool

    Returns
    -------
    (out [T, H] x.dtype, router_logits [T, E] x.dtype)
    """
    _MEMO_BLOCK.once((V.sig(x), V.sig(router_weight), V.sig(w_gate_up)), _check_block, x, router_weight, w_gate_up)
    logits = linear(x, router_weight)
    weights, ids = moe_route(logits, top_k, norm_topk_prob)
    out = moe_experts(x, w_gate_up, w_down, weights, ids)
    return out, logits


def _check_block(x, router_weight, w_gate_up):
    """Static checks of :func:`moe_block` that its parts do not make (the router's expert count)."""
    V.tensor("x", x, ndim=2, dtypes=V.FLOAT_DTYPES, contiguous_last=True, allow_empty=True)
    V.tensor("router_weight", router_weight, ndim=2, dtypes=(x.dtype,), device=x.device, contiguous_last=True)
    if router_weight.shape[1] != x.shape[1]:
        raise ValueError(f"router_weight: expected shape [E, H={x.shape[1]}], got {tuple(router_weight.shape)}")
    if isinstance(w_gate_up, torch.Tensor) and w_gate_up.dim() == 3 and w_gate_up.shape[0] != router_weight.shape[0]:
        raise ValueError(f"w_gate_up: expected {router_weight.shape[0]} experts (router_weight rows), "
                         f"got {w_gate_up.shape[0]}")


_MEMO_ROUTE, _MEMO_EXPERTS, _MEMO_BLOCK = V.Memo(), V.Memo(), V.Memo()
