"""Token log-probs for the policy update, as drop-in replacements for AReaL's helpers.

AReaL 1.0.4 (``areal/utils/functional/vocab_parallel.py``, imported by name into
``areal.engine.fsdp_engine``)::

    gather_logprobs(logits, labels, temperature=1.0, tp_group=None, chunk_size=1024) -> logp
    gather_logprobs_entropy(logits, labels, temperature=1.0, tp_group=None, chunk_size=1024) -> (logp, entropy)

computes ``log_softmax(logits.float() / temperature)`` gathered at ``labels`` in chunks of
``chunk_size`` rows. These functions have the same signature and semantics but run
``areal_tik_plugin.ops.token_logprobs``, the op SGLang's sampler runs in the rollout, so the update
reproduces the rollout's log-probs bit for bit. The op is token-invariant, so chunking only bounds
memory and never changes a value. Vocab-parallel logits (``tp_group`` of size > 1) are not
supported and raise.
"""

from __future__ import annotations

import torch


def _token_logprobs():
    from areal_tik_plugin import ops

    fn = getattr(ops, "token_logprobs", None)
    if not callable(fn):
        from areal_tik_plugin.integrations.transformers import TikOpUnavailableError

        raise TikOpUnavailableError("areal_tik_plugin.ops.token_logprobs is not available in this build; "
                                    "the log-prob helpers never fall back to torch.log_softmax")
    return fn


def _check(logits, labels, temperature, tp_group, chunk_size):
    if not isinstance(logits, torch.Tensor) or not isinstance(labels, torch.Tensor):
        raise TypeError(f"logits, labels: expected torch.Tensor, got {type(logits).__name__}, {type(labels).__name__}")
    if logits.dim() < 1 or tuple(logits.shape[:-1]) != tuple(labels.shape):
        raise ValueError(f"labels: expected shape {tuple(logits.shape[:-1])} (logits.shape[:-1]), got {tuple(labels.shape)}")
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size: expected a positive int, got {chunk_size!r}")
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature > 0:
        raise ValueError(f"temperature: expected a positive float, got {temperature!r}")
    if tp_group is not None:
        import torch.distributed as dist

        if dist.get_world_size(tp_group) > 1:
            raise NotImplementedError("vocab-parallel logits (tp_group size > 1) are not supported by the tik log-prob op")


def _run(logits, labels, temperature, chunk_size, entropy):
    fn = _token_logprobs()
    V = logits.shape[-1]
    flat = logits.reshape(-1, V)
    lab = labels.reshape(-1)
    n = flat.shape[0]
    if n == 0:
        raise ValueError("logits: expected at least one row")
    outs, ents = [], []
    for i in range(0, n, chunk_size):
        r = fn(flat[i:i + chunk_size], lab[i:i + chunk_size], temperature=float(temperature), return_entropy=entropy)
        if entropy:
            outs.append(r[0])
            ents.append(r[1])
        else:
            outs.append(r)
    lp = (outs[0] if len(outs) == 1 else torch.cat(outs)).view(labels.shape)
    if not entropy:
        return lp
    return lp, (ents[0] if len(ents) == 1 else torch.cat(ents)).view(labels.shape)


def gather_logprobs(logits: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0, tp_group=None,
                    chunk_size: int = 1024) -> torch.Tensor:
    """log p(labels) under ``softmax(logits / temperature)``; logits [..., V], labels [...] -> fp32 [...]."""
    _check(logits, labels, temperature, tp_group, chunk_size)
    return _run(logits, labels, temperature, chunk_size, False)


def gather_logprobs_entropy(logits: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0, tp_group=None,
                            chunk_size: int = 1024) -> tuple[torch.Tensor, torch.Tensor]:
    """(log p(labels), entropy) under ``softmax(logits / temperature)``; both fp32 [...]."""
    _check(logits, labels, temperature, tp_group, chunk_size)
    return _run(logits, labels, temperature, chunk_size, True)


__all__ = ["gather_logprobs", "gather_logprobs_entropy"]
