"""Token log-prob (and entropy) under temperature: ``log_softmax(logits.float() / T)[token]``.

The same op in the SGLang sampler (per-request temperatures as an fp32 tensor) and in the trainer
(a float): pass the same temperature value and the rows agree bit for bit, whatever the batch.
The vocab reduction is partitioned into fixed chunks merged left to right (see the kernel), so a
row's result never depends on how many rows the call holds.

Usage::

    logp = token_logprobs(logits, next_tokens, temperature=gconfig.temperature)
    logp, ent = token_logprobs(logits, next_tokens, 0.7, return_entropy=True)
"""

from __future__ import annotations

import torch

from areal_tik_plugin.ops import _validate as V

FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _impl():
    from areal_tik_plugin.runtime.loader import get_implementation

    return get_implementation().module("logprob")


class _TokenLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, tokens, temperature, temp_tensor, entropy):
        t = temp_tensor if temp_tensor is not None else temperature
        logp, ent, lse = _impl().forward(logits, tokens, t, entropy=entropy)
        ctx.save_for_backward(logits, tokens, lse, ent, temp_tensor)
        ctx.temperature = temperature
        ctx.entropy = entropy
        return (logp, ent) if entropy else logp

    @staticmethod
    def backward(ctx, g_logp, g_ent=None):
        logits, tokens, lse, ent, temp_tensor = ctx.saved_tensors
        t = temp_tensor if temp_tensor is not None else ctx.temperature
        dx = _impl().backward(logits, tokens, t, lse, ent, g_logp, g_ent if ctx.entropy else None)
        return dx, None, None, None, None


def token_logprobs(logits, tokens, temperature=1.0, return_entropy=False):
    """Log-probability of each row's token under ``softmax(logits.float() / temperature)``.

    Parameters
    ----------
    logits : Tensor [..., V] bf16/fp16/fp32, last dim contiguous
    tokens : int32/int64 Tensor [...] (the leading shape of logits), values in [0, V)
    temperature : float > 0, or an fp32 Tensor of per-row temperatures (shape of tokens)
    return_entropy : also return the entropy of each row's distribution

    Returns
    -------
    logp fp32 Tensor (shape of tokens), or (logp, entropy); differentiable w.r.t. logits.

    Value checks (0 <= tokens < V, per-row temperatures finite and > 0) read tensor values, a host sync:
    they run on CPU tensors always and on CUDA tensors only with ``TIK_CHECK_VALUES=1`` outside CUDA-
    graph capture (SGLang's decode is captured); a bad value on the GPU otherwise gives undefined rows.
    """
    key = (V.sig(logits), V.sig(tokens), V.sig(temperature), V.sig(return_entropy))
    _MEMO.once(key, _check, logits, tokens, temperature, return_entropy)
    Vn = logits.shape[-1]
    lead = tuple(logits.shape[:-1])
    temp_tensor = None
    if isinstance(temperature, torch.Tensor):
        temp_tensor = temperature.reshape(-1).contiguous()
        temperature = 1.0
        if temp_tensor.numel() and V.check_values(logits.device) and not bool(
                ((temp_tensor > 0) & torch.isfinite(temp_tensor)).all()):
            raise ValueError(f"temperature: expected finite positive values, got {temp_tensor.tolist()[:16]}")
    else:
        temperature = float(temperature)
    x = logits.reshape(-1, Vn)
    tok = tokens.reshape(-1).contiguous()
    if tok.numel() and V.check_values(logits.device):
        lo, hi = int(tok.min()), int(tok.max())
        if lo < 0 or hi >= Vn:
            raise ValueError(f"tokens: expected values in [0, {Vn}), got min {lo} max {hi}")
    # without return_entropy the kernels skip the entropy sums (logp keeps every bit)
    if torch.is_grad_enabled() and x.requires_grad:
        out = _TokenLogprobs.apply(x, tok, temperature, temp_tensor, return_entropy)
        logp, ent = out if return_entropy else (out, None)
    else:  # inference (SGLang sampler): the same kernels without autograd bookkeeping
        logp, ent, _ = _impl().forward(x, tok, temp_tensor if temp_tensor is not None else temperature,
                                       entropy=return_entropy)
    return (logp.view(lead), ent.view(lead)) if return_entropy else logp.view(lead)


def _check(logits, tokens, temperature, return_entropy):
    """Static checks of :func:`token_logprobs` (shapes, dtypes, devices, the scalar arguments)."""
    V.tensor("logits", logits, dtypes=FLOAT_DTYPES, contiguous_last=True, allow_empty=True)
    if logits.dim() < 1 or logits.shape[-1] < 1:
        raise ValueError(f"logits: expected a tensor [..., V] with V >= 1, got shape {tuple(logits.shape)}")
    lead = tuple(logits.shape[:-1])
    V.tensor("tokens", tokens, dtypes=V.INDEX_DTYPES, device=logits.device, allow_empty=True)
    if tuple(tokens.shape) != lead:
        raise ValueError(f"tokens: expected shape {lead} (the leading dims of logits), got {tuple(tokens.shape)}")
    if isinstance(temperature, torch.Tensor):
        V.tensor("temperature", temperature, dtypes=(torch.float32,), device=logits.device, allow_empty=True)
        if tuple(temperature.shape) != lead:
            raise ValueError(f"temperature: expected a float or an fp32 tensor of shape {lead}, "
                             f"got shape {tuple(temperature.shape)}")
    else:
        V.positive_float("temperature", temperature)
    if not isinstance(return_entropy, bool):
        raise TypeError(f"return_entropy: expected a bool, got {type(return_entropy).__name__}")


_MEMO = V.Memo()
