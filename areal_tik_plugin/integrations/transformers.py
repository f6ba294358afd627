"""Hugging Face transformers integration: the policy-update forward/backward on the unified ops.

AReaL's FSDP engine runs a Hugging Face ``*ForCausalLM``. This module routes every unified op of
Qwen2 / Qwen2.5, Qwen3, Qwen3-MoE and Llama models through :mod:`areal_tik_plugin.ops`:

============================  ================================================================
HF piece                      ours
============================  ================================================================
``*RMSNorm`` (+ q/k norm)     ``ops.rms_norm``
``*RotaryEmbedding``          returns :class:`TikRotary` (position_ids + fp32 inv_freq);
                              the attention applies ``ops.apply_rope``
``*Attention``                q/k/v/o via ``ops.linear``; ``ops.attention_varlen`` (training,
                              packed or padded), ``ops.attention_extend``/``attention_decode``
                              when a HF KV cache holds a prefix (``generate``)
``*MLP``                      ``ops.linear`` + ``ops.swiglu``
``Qwen3MoeSparseMoeBlock``    ``ops.moe_block`` (router + experts, transformers 5.x
                              ``Qwen3MoeExperts`` layout: ``gate_up_proj [E, 2I, H]``,
                              ``down_proj [E, H, I]``)
``lm_head``                   ``ops.linear``
embeddings, residual adds     unchanged (exact)
============================  ================================================================

Two ways to patch, as Liger-Kernel does:

* :func:`apply_to_model` patches a live model (instance-level ``forward`` bindings); :func:`revert`
  undoes it.
* ``apply_tik_kernels_to_qwen2/qwen3/qwen3_moe/llama()`` patch the module classes *before* the
  model is built (class ``forward`` attributes, plus a wrapper around ``*ForCausalLM.__init__`` /
  ``*Model.__init__`` that routes ``lm_head`` and selects our attention);
  :func:`revert_tik_kernels` restores the classes.

Attention name (AReaL validates ``actor.attn_impl`` with ``is_valid_attn_impl`` and rejects custom
names): our attention is registered in transformers' ``AttentionInterface`` *and*
``AttentionMaskInterface`` under :data:`TIK_ATTENTION` (``"tik_varlen"``), with the flash-attention
mask function, so the attention receives the raw 2-D padding mask (or ``None``) and AReaL's packed
kwargs ``cu_seq_lens_q/k``, ``max_length_q/k``, ``position_ids``. Patching (either way) switches the
model's ``config._attn_implementation`` to ``"tik_varlen"`` *after* it is built, so AReaL's config
keeps a name it accepts (``attn_impl: sdpa`` is the recommended one: it needs no flash-attn
install) and AReaL's validation never sees ours. For code that cannot be touched,
:func:`replace_builtin_attention` instead puts our function behind existing names
(e.g. ``"sdpa"``) in both interfaces, process-wide; :func:`restore_builtin_attention` undoes it.

Varlen layout, in this order: ``cu_seq_lens_q`` (AReaL packing, batch 1); a 2-D padding mask
(padded batch: valid tokens are gathered, pads get zeros); ``position_ids`` that restart inside a
row of batch 1 (HF flash-attention packing convention); otherwise one causal sequence per row.

Inputs must be bf16/fp16 activations (the kernels' dtypes). Parameters of another dtype (an fp32
master copy without FSDP mixed precision) are cast to the activation dtype where they are used,
so the update path uses the same bf16 weights as the rollout engine. Anything outside what the
kernels support (sliding window, attention dropout, dynamic RoPE, non-SiLU MLPs, 4-D masks) raises
instead of silently running a stock kernel.
"""

from __future__ import annotations

import functools
import importlib
import types
from typing import Any, Callable

import torch

# the public ops (their static checks run once per argument signature, so a layer's repeated calls stay
# cheap); availability of the ops is still checked at patch time (require_ops)
from areal_tik_plugin.ops import (apply_rope, apply_rope_kv_write, attention_varlen, linear, qk_rms_norm, rms_norm,
                                  rms_norm_residual, swiglu, swiglu_fused)

TIK_ATTENTION = "tik_varlen"

# model_type -> (modeling module, class-name prefix)
FAMILIES: dict[str, tuple[str, str]] = {
    "qwen2": ("transformers.models.qwen2.modeling_qwen2", "Qwen2"),
    "qwen3": ("transformers.models.qwen3.modeling_qwen3", "Qwen3"),
    "qwen3_moe": ("transformers.models.qwen3_moe.modeling_qwen3_moe", "Qwen3Moe"),
    "llama": ("transformers.models.llama.modeling_llama", "Llama"),
}

DENSE_OPS = ("linear", "rms_norm", "apply_rope", "swiglu", "attention_varlen", "attention_extend",
             "attention_decode")
MOE_OPS = DENSE_OPS + ("moe_block",)
_HEAD_DIMS = (16, 32, 64, 128, 256)


class TikOpUnavailableError(RuntimeError):
    """An op the integration needs is not in this build of :mod:`areal_tik_plugin.ops`."""


# ------------------------------------------------------------------------------------------------
# op access: no silent fallback
# ------------------------------------------------------------------------------------------------
def missing_ops(names=MOE_OPS) -> list[str]:
    from areal_tik_plugin import ops

    return [n for n in names if not callable(getattr(ops, n, None))]


def require_ops(names=MOE_OPS) -> None:
    miss = missing_ops(names)
    if miss:
        raise TikOpUnavailableError(
            "areal_tik_plugin.ops lacks " + ", ".join(miss) + " in this build; the transformers "
            "integration needs every unified op and never falls back to a stock kernel")


def _op(name: str) -> Callable:
    from areal_tik_plugin import ops

    fn = getattr(ops, name, None)
    if not callable(fn):
        raise TikOpUnavailableError(f"areal_tik_plugin.ops.{name} is not available in this build; the "
                                    "transformers integration never falls back to a stock kernel")
    return fn


def _as(t: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """Parameters in the activation dtype (differentiable cast; no copy when it already matches)."""
    if t is None or t.dtype == dtype:
        return t
    return t.to(dtype)


# ------------------------------------------------------------------------------------------------
# layer pieces shared by the patched forwards, the rollout replay in areal_tik_plugin.verify and
# the layer benchmark (one implementation -> the same op sequence on every path)
# ------------------------------------------------------------------------------------------------
def tik_linear(x: torch.Tensor, module) -> torch.Tensor:
    """``module`` (an ``nn.Linear``) applied with ``ops.linear``; x [..., K] -> [..., N]."""
    w, b = _as(module.weight, x.dtype), _as(module.bias, x.dtype)
    if x.dim() == 2:
        return linear(x, w, b)
    shp = x.shape
    y = linear(x.reshape(-1, shp[-1]), w, b)
    return y.view(*shp[:-1], y.shape[-1])


def _eps(norm) -> float:
    eps = getattr(norm, "variance_epsilon", None)
    if eps is None:
        eps = getattr(norm, "eps", None)
    if eps is None:
        raise ValueError(f"{type(norm).__name__}: expected a variance_epsilon or eps attribute")
    return float(eps)


def tik_rms_norm(x: torch.Tensor, norm) -> torch.Tensor:
    """HF RMSNorm module ``norm`` applied with ``ops.rms_norm`` over the last dim of x."""
    return rms_norm(x, _as(norm.weight, x.dtype), _eps(norm))


class TikRotary:
    """What the patched ``*RotaryEmbedding.forward`` returns instead of ``(cos, sin)``.

    The attention applies ``ops.apply_rope(q, k, positions, inv_freq, attention_scaling)``, so cos
    and sin are computed inside the kernel in fp32 from fp32 ``inv_freq``, identically in every
    path. An unpatched attention that tries ``cos, sin = position_embeddings`` fails loudly.
    """

    __slots__ = ("position_ids", "inv_freq", "attention_scaling", "_flat")

    def __init__(self, position_ids: torch.Tensor, inv_freq: torch.Tensor, attention_scaling: float):
        self.position_ids = position_ids
        self.inv_freq = inv_freq
        self.attention_scaling = float(attention_scaling)
        self._flat = None

    def positions(self, batch: int, seqlen: int, device: torch.device | None = None) -> torch.Tensor:
        """Flat positions [batch * seqlen] (int64), on ``device`` when given.

        One object serves every layer of a forward: the result is kept, keyed by the arguments and the
        identity and version (in-place writes) of ``position_ids``, so a changed input is recomputed
        (inference-mode tensors have no version: recomputed on every call)."""
        p = self.position_ids
        cacheable = isinstance(p, torch.Tensor) and not p.is_inference()
        key = (p._version, batch, seqlen, device) if cacheable else None
        flat = self._flat
        if key is not None and flat is not None and flat[0] is p and flat[1] == key:
            return flat[2]
        out = self._positions(batch, seqlen)
        if device is not None:
            out = out.to(device)
        if key is not None:
            self._flat = (p, key, out)
        return out

    def _positions(self, batch: int, seqlen: int) -> torch.Tensor:
        p = self.position_ids
        if p.dim() == 1:
            p = p.unsqueeze(0)
        if p.dim() != 2 or p.shape[-1] != seqlen or p.shape[0] not in (1, batch):
            raise ValueError(f"position_ids: expected shape [{batch} or 1, {seqlen}], got {tuple(self.position_ids.shape)}")
        return p.expand(batch, seqlen).reshape(-1).to(torch.int64)


_DYNAMIC_ROPE = ("dynamic", "longrope")
# HF computes these inv_freq / attention_scaling once from the config; ops.apply_rope applies them exactly
_STATIC_ROPE = ("default", "linear", "llama3", "yarn")


def _rope_type(config) -> str:
    rp = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    return (rp.get("rope_type") or rp.get("type") or "default") if isinstance(rp, dict) else "default"


def canonical_inv_freq(rotary) -> torch.Tensor:
    """The RoPE ``inv_freq`` of a HF rotary module as Hugging Face computes it *on the CPU* in fp32.

    Never the module's buffer: a model created directly on a GPU (AReaL's FSDP engine loads on
    ``cuda``) holds an ``inv_freq`` computed by CUDA's ``pow`` / division, which can differ from the CPU
    result in the last bit -- and then every cos/sin, hence every logit, differs from the rollout
    side, which computes the same formula on the CPU (``sglang_layers.hf_default_inv_freq``). Measured
    on the H200 before this rule: AReaL's actor vs the plain patched model, 7071 / 7104 log-probs differ
    (max 0.10), SGLang vs the plain patched model bit-identical.
    """
    rtype = getattr(rotary, "rope_type", "default")
    cpu = torch.device("cpu")
    if rtype == "default":
        fn = type(rotary).compute_default_rope_parameters
    else:
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        fn = ROPE_INIT_FUNCTIONS[rtype]
    return fn(rotary.config, device=cpu)[0].to(torch.float32).contiguous()


def rope_params(rotary, device: torch.device | None = None) -> tuple[torch.Tensor, float]:
    """(fp32 contiguous inv_freq on ``device``, attention_scaling) of a HF rotary embedding module.

    ``inv_freq`` is :func:`canonical_inv_freq` (computed once on the CPU, cached on the module with
    one copy per device), whatever the module's buffer holds (its device, its dtype after
    ``model.to(bf16)``).
    """
    rtype = getattr(rotary, "rope_type", "default")
    if rtype in _DYNAMIC_ROPE:
        raise NotImplementedError(f"rope_type {rtype!r}: inv_freq depends on the sequence length; "
                                  "the unified RoPE supports static inv_freq (default, linear, llama3, yarn)")
    per_device = getattr(rotary, "_tik_inv_freq_on", None)
    if per_device is None:
        per_device = rotary._tik_inv_freq_on = {"cpu": canonical_inv_freq(rotary)}
    dev = str(device if device is not None else rotary.inv_freq.device)
    inv = per_device.get(dev)
    if inv is None:
        inv = per_device[dev] = per_device["cpu"].to(dev)
    return inv, float(getattr(rotary, "attention_scaling", 1.0))


def tik_qkv(attn, x2d: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, attention_scaling: float):
    """Projections, per-head q/k RMSNorm (Qwen3) and RoPE. x2d [T, H] -> q [T, Hq, D], k, v [T, Hkv, D]."""
    T, D = x2d.shape[0], attn.head_dim
    q = tik_linear(x2d, attn.q_proj).view(T, -1, D)
    k = tik_linear(x2d, attn.k_proj).view(T, -1, D)
    v = tik_linear(x2d, attn.v_proj).view(T, -1, D)
    q_norm = getattr(attn, "q_norm", None)
    if q_norm is not None:
        q = tik_rms_norm(q, q_norm)
        k = tik_rms_norm(k, attn.k_norm)
    q, k = apply_rope(q, k, positions, inv_freq, attention_scaling)
    return q, k, v


def tik_mlp(mlp, x2d: torch.Tensor) -> torch.Tensor:
    """SwiGLU MLP: down(silu(gate(x)) * up(x))."""
    h = swiglu(tik_linear(x2d, mlp.gate_proj), tik_linear(x2d, mlp.up_proj))
    return tik_linear(h, mlp.down_proj)


def tik_moe(block, x2d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen3-MoE sparse block (router + top-k + experts) -> (out [T, H], router_logits [T, E])."""
    gate, experts = block.gate, block.experts
    dt = x2d.dtype
    if not (hasattr(experts, "gate_up_proj") and hasattr(experts, "down_proj")):
        raise NotImplementedError(f"{type(experts).__name__}: expected the transformers 5.x fused experts layout "
                                  "(gate_up_proj [E, 2I, H], down_proj [E, H, I])")
    return _op("moe_block")(x2d, _as(gate.weight, dt), _as(experts.gate_up_proj, dt), _as(experts.down_proj, dt),
                            int(gate.top_k), bool(gate.norm_topk_prob))


def tik_ffn(mlp, x2d: torch.Tensor) -> torch.Tensor:
    """Dense SwiGLU MLP or MoE block, whichever ``mlp`` is."""
    if hasattr(mlp, "experts"):
        return tik_moe(mlp, x2d)[0]
    return tik_mlp(mlp, x2d)


def tik_rms_norm_residual(x: torch.Tensor, residual: torch.Tensor, norm) -> tuple[torch.Tensor, torch.Tensor]:
    """``(norm(x + residual), x + residual)`` in one kernel (SGLang's fused add + RMSNorm); bitwise
    the same as ``h = residual + x`` in torch followed by :func:`tik_rms_norm` (``ops.rms_norm_residual``)."""
    return rms_norm_residual(x, residual, _as(norm.weight, x.dtype), _eps(norm))


# ------------------------------------------------------------------------------------------------
# rollout-engine weight layout: SGLang loads q/k/v into one QKVParallelLinear and gate/up into one
# MergedColumnParallelLinear, so a rollout step runs one GEMM for each. The split rule of
# ops.linear depends on K only, so the fused projections give the same bits per column as the
# separate ones the training forward runs (checked by the GPU contract suite, "fused vs separate").
# ------------------------------------------------------------------------------------------------
def rollout_weights(layer, dtype: torch.dtype) -> dict:
    """The layer's fused rollout weights in ``dtype``: ``qkv`` [(Hq + 2 Hkv) D, H] (+ ``qkv_bias``),
    ``gate_up`` [2I, H] for a dense MLP (None for MoE), and the split sizes. Built once and kept on
    the layer (rebuilt when a source parameter is replaced or updated in place) -- a copy, so those
    weights are held twice (SGLang holds only the fused ones); detached: the rollout path takes no
    gradients."""
    attn, mlp = layer.self_attn, layer.mlp
    projs = [attn.q_proj, attn.k_proj, attn.v_proj]
    dense = not hasattr(mlp, "experts")
    srcs = [p.weight for p in projs] + [p.bias for p in projs if p.bias is not None]
    if dense:
        srcs += [mlp.gate_proj.weight, mlp.up_proj.weight]
    key = (dtype,) + tuple((t.data_ptr(), t._version, tuple(t.shape)) for t in srcs)
    got = layer.__dict__.get("_tik_rollout")
    if got is not None and got["key"] == key:
        return got
    with torch.no_grad():
        cat = lambda ts: torch.cat([t.detach().to(dtype) for t in ts], 0).contiguous()  # noqa: E731
        biases = [p.bias for p in projs]
        got = {
            "key": key,
            "qkv": cat([p.weight for p in projs]),
            "qkv_bias": cat(biases) if all(b is not None for b in biases) else None,
            "q_size": projs[0].weight.shape[0], "kv_size": projs[1].weight.shape[0],
            "gate_up": cat([mlp.gate_proj.weight, mlp.up_proj.weight]) if dense else None,
        }
    if any(b is not None for b in biases) and got["qkv_bias"] is None:
        raise NotImplementedError("q/k/v projections with a bias on some but not all of them")
    layer.__dict__["_tik_rollout"] = got
    return got


def tik_qkv_rollout(attn, x2d: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor,
                    attention_scaling: float, fused: dict, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    loc: torch.Tensor) -> torch.Tensor:
    """:func:`tik_qkv` + ``ops.kv_write`` as the rollout engine runs them: one GEMM on the fused QKV
    weight of :func:`rollout_weights`, Qwen3's q_norm and k_norm in one launch over the adjacent q and
    k heads (``ops.qk_rms_norm``), RoPE with the rotated k and the v rows written to the KV pool at
    ``loc`` in one launch (``ops.apply_rope_kv_write``). Returns q [T, Hq, D]. The same bits as the
    separate ops (the contract suite checks each fusion)."""
    T, D = x2d.shape[0], attn.head_dim
    qkv = linear(x2d, fused["qkv"], fused["qkv_bias"])
    nq, nk = fused["q_size"], fused["kv_size"]
    hq = nq // D
    q = qkv[:, :nq].view(T, -1, D)
    k = qkv[:, nq:nq + nk].view(T, -1, D)
    v = qkv[:, nq + nk:].view(T, -1, D)
    q_norm = getattr(attn, "q_norm", None)
    if q_norm is not None:
        if _eps(q_norm) == _eps(attn.k_norm):
            qk = qk_rms_norm(qkv[:, :nq + nk].view(T, -1, D), _as(q_norm.weight, x2d.dtype),
                             _as(attn.k_norm.weight, x2d.dtype), hq, _eps(q_norm))
            q, k = qk[:, :hq], qk[:, hq:]
        else:  # two eps: the two launches (the same kernel and bits per head)
            q, k = tik_rms_norm(q, q_norm), tik_rms_norm(k, attn.k_norm)
    return apply_rope_kv_write(q, k, v, positions, inv_freq, attention_scaling, k_cache, v_cache, loc)


def tik_ffn_rollout(mlp, x2d: torch.Tensor, fused: dict) -> torch.Tensor:
    """:func:`tik_ffn` with the fused gate_up weight of :func:`rollout_weights` (one GEMM +
    ``ops.swiglu_fused``, SGLang's ``SiluAndMul`` layout); MoE blocks as in :func:`tik_ffn`."""
    if fused["gate_up"] is None:
        return tik_moe(mlp, x2d)[0]
    return tik_linear(swiglu_fused(linear(x2d, fused["gate_up"])), mlp.down_proj)


# ------------------------------------------------------------------------------------------------
# attention: varlen layout from AReaL's kwargs / padding mask / position_ids
# ------------------------------------------------------------------------------------------------
def _cu_from_lens(lens: torch.Tensor) -> torch.Tensor:
    cu = torch.zeros(lens.numel() + 1, dtype=torch.int32, device=lens.device)
    cu[1:] = torch.cumsum(lens, 0)
    return cu


def varlen_layout(batch: int, seqlen: int, attention_mask=None, position_ids=None, kwargs=None):
    """(cu_seqlens int32 [n+1], max_seqlen, gather_idx or None) for ``batch x seqlen`` tokens.

    ``gather_idx`` (int64 [n_valid]) selects the valid tokens of a padded batch, flattened row-major.
    """
    kwargs = kwargs or {}
    cu = kwargs.get("cu_seq_lens_q")
    if cu is not None:
        cuk = kwargs.get("cu_seq_lens_k")
        if cuk is not None and cuk is not cu and not torch.equal(cuk.to(cu.device, cu.dtype), cu):
            raise ValueError("cu_seq_lens_k: expected the same offsets as cu_seq_lens_q (causal self-attention, no KV prefix)")
        if batch != 1:
            raise ValueError(f"cu_seq_lens_q: packed inputs expect batch size 1 ([1, total_tokens]), got batch {batch}")
        if attention_mask is not None and not bool(attention_mask.all()):
            raise ValueError("attention_mask: expected None (or all ones) together with cu_seq_lens_q")
        if not isinstance(cu, torch.Tensor) or cu.dim() != 1:
            raise ValueError("cu_seq_lens_q: expected a 1-D int tensor [num_seqs + 1]")
        mx = kwargs.get("max_length_q")
        mx = int(mx) if mx is not None else None
        if cu.dtype != torch.int32:
            cu = cu.to(torch.int32)
        return cu.contiguous(), mx, None
    if attention_mask is not None:
        if not isinstance(attention_mask, torch.Tensor) or attention_mask.dim() != 2 or tuple(attention_mask.shape) != (batch, seqlen):
            shape = tuple(attention_mask.shape) if isinstance(attention_mask, torch.Tensor) else type(attention_mask).__name__
            raise ValueError(
                f"attention_mask: expected a 2-D padding mask [{batch}, {seqlen}] or None, got {shape}; a 4-D mask "
                f"means the model's attention implementation is not {TIK_ATTENTION!r} (use "
                "areal_tik_plugin.integrations.transformers.apply_to_model)")
        m = attention_mask.to(torch.bool)
        if not bool(m.all()):
            lens = m.sum(1, dtype=torch.int32)
            if bool((lens == 0).any()):
                raise ValueError("attention_mask: every row needs at least one valid token")
            idx = m.reshape(-1).nonzero().squeeze(1)
            return _cu_from_lens(lens), int(lens.max()), idx
    if position_ids is not None and batch == 1 and seqlen > 1:
        p = position_ids.reshape(-1)
        if p.numel() == seqlen:
            starts = (p[1:] != p[:-1] + 1).nonzero().squeeze(1) + 1
            if starts.numel():
                b = torch.cat([torch.zeros(1, dtype=starts.dtype, device=starts.device), starts,
                               torch.full((1,), seqlen, dtype=starts.dtype, device=starts.device)])
                lens = (b[1:] - b[:-1]).to(torch.int32)
                return _cu_from_lens(lens), int(lens.max()), None
    cu = torch.arange(batch + 1, dtype=torch.int32, device=position_ids.device if position_ids is not None else None) * seqlen
    return cu, seqlen, None


def attend_packed(q, k, v, *, batch, seqlen, softmax_scale, attention_mask=None, position_ids=None, kwargs=None):
    """Causal attention of ``batch x seqlen`` tokens (q [B*S, Hq, D], k/v [B*S, Hkv, D]) -> [B*S, Hq, D]."""
    cu, mx, idx = varlen_layout(batch, seqlen, attention_mask, position_ids, kwargs)
    if cu.device != q.device:
        cu = cu.to(q.device)
    if idx is None:
        return attention_varlen(q, k, v, cu, mx, softmax_scale)
    idx = idx.to(q.device)
    o = attention_varlen(q.index_select(0, idx), k.index_select(0, idx), v.index_select(0, idx), cu, mx,
                         softmax_scale)
    out = q.new_zeros(q.shape[0], q.shape[1], v.shape[2])
    return out.index_copy(0, idx, o)


def attend_prefix(q, k_all, v_all, *, prefix_len: int, softmax_scale, attention_mask=None):
    """New tokens after a cached prefix, equal lengths per row (HF ``generate`` with a KV cache).

    q [B, S, Hq, D]; k_all/v_all [B, L, Hkv, D] with L = prefix_len + S (the cache after its update).
    Uses ``attention_decode`` (dense cache) for one new token, ``attention_extend`` over a dense
    table otherwise. Returns [B, S, Hq, D].
    """
    if attention_mask is not None and not bool(attention_mask.all()):
        raise NotImplementedError("padded batches with a KV cache are not supported by the tik attention; "
                                  "decode unpadded (equal-length) batches or use areal_tik_plugin.verify's paged runner")
    B, S, Hq, D = q.shape
    L, Hkv = k_all.shape[1], k_all.shape[2]
    dev = q.device
    if S == 1:
        seq = torch.full((B,), L, dtype=torch.int32, device=dev)
        o = _op("attention_decode")(q.reshape(B, Hq, D).contiguous(), k_all.contiguous(), v_all.contiguous(),
                                    seq_lens=seq, softmax_scale=softmax_scale)
        return o.view(B, 1, Hq, D)
    kp = k_all.reshape(B * L, Hkv, D).contiguous()
    vp = v_all.reshape(B * L, Hkv, D).contiguous()
    table = torch.arange(B * L, dtype=torch.int32, device=dev).view(B, L)
    o = _op("attention_extend")(
        q.reshape(B * S, Hq, D).contiguous(), kp, vp,
        cu_seqlens_q=torch.arange(B + 1, dtype=torch.int32, device=dev) * S,
        prefix_lens=torch.full((B,), prefix_len, dtype=torch.int32, device=dev),
        kv_indices=table, table_rows=torch.arange(B, dtype=torch.int32, device=dev),
        max_extend_len=S, softmax_scale=softmax_scale)
    return o.view(B, S, Hq, D)


def _check_attention_kwargs(dropout: float, kwargs: dict) -> None:
    if dropout:
        raise NotImplementedError(f"attention dropout {dropout}: the tik attention has no dropout (set attention_dropout=0)")
    if kwargs.get("sliding_window"):
        raise NotImplementedError("sliding-window attention is not supported by the tik attention")
    if kwargs.get("softcap"):
        raise NotImplementedError("attention logit softcapping is not supported by the tik attention")
    if kwargs.get("output_attentions"):
        raise NotImplementedError("output_attentions: the tik attention returns no attention weights")


def tik_attention_function(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers ``AttentionInterface`` function (registered as :data:`TIK_ATTENTION`).

    query [B, Hq, S, D], key/value [B, Hkv, L, D] (L > S after a KV-cache update) ->
    (out [B, S, Hq, D], None). Used by attention modules this integration does not replace; the
    patched ``*Attention.forward`` calls the same layout helpers directly (token-major, no
    transposes).
    """
    _check_attention_kwargs(dropout, kwargs)
    B, Hq, S, D = query.shape
    L = key.shape[2]
    q = query.transpose(1, 2).contiguous()
    k = key.transpose(1, 2).contiguous()
    v = value.transpose(1, 2).contiguous()
    if L > S:
        return attend_prefix(q, k, v, prefix_len=L - S, softmax_scale=scaling, attention_mask=attention_mask), None
    o = attend_packed(q.view(B * S, Hq, D), k.view(B * S, -1, D), v.view(B * S, -1, D), batch=B, seqlen=S,
                      softmax_scale=scaling, attention_mask=attention_mask, position_ids=kwargs.get("position_ids"),
                      kwargs=kwargs)
    return o.view(B, S, Hq, D), None


def _flash_mask(*args, **kwargs):
    from transformers.masking_utils import flash_attention_mask

    return flash_attention_mask(*args, **kwargs)


def register_attention(name: str = TIK_ATTENTION) -> str:
    """Register :func:`tik_attention_function` (and the 2-D flash-style mask) under ``name``."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(name, tik_attention_function)
    AttentionMaskInterface.register(name, _flash_mask)
    return name


_BUILTIN_SAVED: dict[str, tuple[Any, Any]] = {}


def replace_builtin_attention(names=("sdpa",)) -> None:
    """Put the tik attention behind existing names (e.g. ``"sdpa"``, ``"flash_attention_2"``) in
    ``ALL_ATTENTION_FUNCTIONS`` and ``ALL_MASK_ATTENTION_FUNCTIONS``, process-wide (every model using
    that name). For callers that cannot switch a model to :data:`TIK_ATTENTION`. Note: building a
    model with ``"flash_attention_2"`` still needs the flash-attn package installed (transformers
    checks it before our function is looked up); ``"sdpa"`` needs nothing."""
    from transformers.masking_utils import AttentionMaskInterface
    from transformers.modeling_utils import AttentionInterface

    for n in names:
        if n not in _BUILTIN_SAVED:
            _BUILTIN_SAVED[n] = (AttentionInterface._global_mapping.get(n), AttentionMaskInterface._global_mapping.get(n))
        AttentionInterface._global_mapping[n] = tik_attention_function
        AttentionMaskInterface._global_mapping[n] = _flash_mask


def restore_builtin_attention() -> None:
    from transformers.masking_utils import AttentionMaskInterface
    from transformers.modeling_utils import AttentionInterface

    for n, (fa, fm) in list(_BUILTIN_SAVED.items()):
        for mapping, f in ((AttentionInterface._global_mapping, fa), (AttentionMaskInterface._global_mapping, fm)):
            if f is None:
                mapping.pop(n, None)
            else:
                mapping[n] = f
        del _BUILTIN_SAVED[n]


# ------------------------------------------------------------------------------------------------
# replacement forwards (bound per instance or set on the classes)
# ------------------------------------------------------------------------------------------------
def _rmsnorm_forward(self, hidden_states):
    return tik_rms_norm(hidden_states, self)


def _rotary_forward(self, x, position_ids):
    watch = self.__dict__.get("_tik_watch")
    if watch is not None and not torch.compiler.is_compiling():
        _check_forwards(watch)
    inv, scaling = rope_params(self, x.device)
    return TikRotary(position_ids, inv, scaling)


def _watch(root, model_type: str) -> None:
    """Give the rotary embeddings under ``root`` the list of modules the patch routes (name, module,
    forward): the rotary forward runs once per model forward and checks that every one of them still
    runs ours, so a forward rebound later (hub kernelization with a ``kernels`` release that ignores
    ``kernel_condition``, user code) is an error instead of a silent stock kernel."""
    _, _, table = _family(model_type)
    watch = []
    for name, m in root.named_modules():
        for cls, fn in table.items():
            if isinstance(m, cls):
                watch.append((name or type(m).__name__, m, fn))
                break
    for _, m, fn in watch:
        if fn is _rotary_forward:
            m.__dict__["_tik_watch"] = watch


def _check_forwards(watch) -> None:
    for name, m, fn in watch:
        f = m.__dict__.get("forward")
        got = getattr(f, "__func__", f) if f is not None else getattr(type(m), "forward", None)
        if got is not fn:
            raise RuntimeError(
                f"{name} ({type(m).__name__}): its forward was rebound after the tik patch and now runs "
                f"{getattr(got, '__qualname__', got)!r}, not the plugin's {fn.__name__}. Something rebinds module "
                "forwards after apply_to_model (transformers' hub kernelization does at train() / eval() while "
                "model.use_kernels is on); call apply_to_model(model) again after it")


def _mlp_forward(self, x):
    shp = x.shape
    return tik_mlp(self, x.reshape(-1, shp[-1])).view(*shp[:-1], -1)


def _moe_forward(self, hidden_states):
    shp = hidden_states.shape
    x2 = hidden_states.reshape(-1, shp[-1])
    out, router_logits = tik_moe(self, x2)
    hooks = getattr(self.gate, "_forward_hooks", None)
    if hooks:  # transformers' output capturing (output_router_logits) records the gate's output
        for hook in list(hooks.values()):
            hook(self.gate, (x2,), (router_logits, None, None))
    return out.view(shp)


def _lm_head_forward(self, x):
    return tik_linear(x, self)


def _get_cache(args, kwargs):
    cache = kwargs.pop("cache", None)
    legacy = kwargs.pop("past_key_values", None)
    if cache is None:
        cache = legacy
    if cache is None and args:
        cache = args[0]
    kwargs.pop("cache_position", None)
    return cache


def _attention_forward(self, hidden_states, position_embeddings=None, attention_mask=None, *args, **kwargs):
    cache = _get_cache(args, kwargs)
    if not isinstance(position_embeddings, TikRotary):
        raise TypeError(f"{type(self).__name__}: expected position_embeddings from the tik-patched rotary embedding "
                        f"(TikRotary), got {type(position_embeddings).__name__}; patch the whole model "
                        "(apply_to_model / apply_tik_kernels_to_*), not single modules")
    _check_attention_kwargs(0.0 if not self.training else float(self.attention_dropout), kwargs)
    if getattr(self, "sliding_window", None):
        raise NotImplementedError("sliding-window attention layers are not supported by the tik attention")
    B, S, _ = hidden_states.shape
    pos = position_embeddings.positions(B, S, hidden_states.device)
    x = hidden_states.reshape(B * S, -1)
    q, k, v = tik_qkv(self, x, pos, position_embeddings.inv_freq, position_embeddings.attention_scaling)
    Hq, Hkv, D = q.shape[1], k.shape[1], q.shape[2]
    if cache is not None:
        prefix = int(cache.get_seq_length(self.layer_idx))
        k_all, v_all = cache.update(k.view(B, S, Hkv, D).transpose(1, 2), v.view(B, S, Hkv, D).transpose(1, 2),
                                    self.layer_idx)
        if prefix > 0:
            o = attend_prefix(q.view(B, S, Hq, D), k_all.transpose(1, 2), v_all.transpose(1, 2), prefix_len=prefix,
                              softmax_scale=self.scaling, attention_mask=attention_mask).reshape(B * S, Hq, D)
            return tik_linear(o.reshape(B * S, Hq * D), self.o_proj).view(B, S, -1), None
        if attention_mask is not None and attention_mask.dim() == 2 and attention_mask.shape[1] != S:
            raise ValueError(f"attention_mask: expected {S} columns for an empty cache, got {attention_mask.shape[1]}")
    o = attend_packed(q, k, v, batch=B, seqlen=S, softmax_scale=self.scaling, attention_mask=attention_mask,
                      position_ids=position_embeddings.position_ids, kwargs=kwargs)
    return tik_linear(o.reshape(B * S, Hq * D), self.o_proj).view(B, S, -1), None


# ------------------------------------------------------------------------------------------------
# family tables, checks
# ------------------------------------------------------------------------------------------------
def _family(model_type: str):
    if model_type not in FAMILIES:
        raise ValueError(f"model_type {model_type!r}: expected one of {sorted(FAMILIES)}")
    modname, prefix = FAMILIES[model_type]
    mod = importlib.import_module(modname)
    forwards = {
        f"{prefix}RMSNorm": _rmsnorm_forward,
        f"{prefix}RotaryEmbedding": _rotary_forward,
        f"{prefix}Attention": _attention_forward,
        f"{prefix}MLP": _mlp_forward,
    }
    if model_type == "qwen3_moe":
        forwards[f"{prefix}SparseMoeBlock"] = _moe_forward
    table = {}
    for cname, fn in forwards.items():
        cls = getattr(mod, cname, None)
        if cls is None:
            raise NotImplementedError(f"{modname}.{cname} not found in this transformers version")
        table[cls] = fn
    return mod, prefix, table


# transformers' hub kernelization (the ``kernels`` package, a dependency of transformers 5.25 and of
# SGLang; on by default) rebinds the forward of every module whose class is marked with
# ``use_kernel_forward_from_hub`` (the RMSNorms): at ``from_pretrained`` and again at every
# ``train()`` / ``eval()`` switch, to a hub kernel where one loads, else by dropping the instance
# forward. Either way a bound tik forward would be gone -- after ``model.train()`` the stock RMSNorm
# ran the training forward, a few rows off the rollout's bits. So modules running our forwards are
# excluded through the class's ``kernel_condition`` (consulted by kernelize), and a patched model stops
# kernelizing (for ``kernels`` releases without conditions).
def _runs_tik(module) -> bool:
    return "_tik_patched" in module.__dict__ or bool(getattr(type(module), "_tik_class_patched", False))


def _exclude_from_hub_kernels(cls) -> None:
    if not hasattr(cls, "kernel_layer_name"):
        return
    prev = getattr(cls, "kernel_condition", None)
    if getattr(prev, "_tik_guard", False):
        return

    def kernel_condition(module, _prev=prev):
        return not _runs_tik(module) and (_prev is None or bool(_prev(module)))

    kernel_condition._tik_guard = True
    # a staticmethod, as kernels stores it: read through the class it takes the module only
    cls.kernel_condition = staticmethod(kernel_condition)


def _stop_kernelizing(model) -> None:
    """Turn transformers' hub kernelization off for ``model`` (its setter puts the torch forwards back
    and keeps ``train()`` / ``eval()`` from kernelizing again). Run before our forwards are bound."""
    if getattr(model, "use_kernels", False):
        model.use_kernels = False


def check_config(config) -> None:
    """Raise for model features the unified kernels do not cover."""
    mt = getattr(config, "model_type", None)
    if mt not in FAMILIES:
        raise ValueError(f"model_type {mt!r}: expected one of {sorted(FAMILIES)}")
    act = getattr(config, "hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise NotImplementedError(f"hidden_act {act!r}: the unified MLP is SwiGLU (silu)")
    rt = _rope_type(config)
    if rt in _DYNAMIC_ROPE:
        raise NotImplementedError(f"rope_type {rt!r} is not supported (inv_freq must not depend on the length)")
    if rt not in _STATIC_ROPE:
        raise NotImplementedError(f"rope_type {rt!r} is not supported: expected one of {_STATIC_ROPE}")
    if "sliding_attention" in (getattr(config, "layer_types", None) or []):
        raise NotImplementedError("sliding-window attention layers (use_sliding_window) are not supported")
    hd = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if hd not in _HEAD_DIMS:
        raise NotImplementedError(f"head_dim {hd}: the unified attention supports {_HEAD_DIMS}")
    rp = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    for prf in (getattr(config, "partial_rotary_factor", None), rp.get("partial_rotary_factor") if isinstance(rp, dict) else None):
        if float(prf or 1.0) != 1.0:
            raise NotImplementedError(f"partial_rotary_factor {prf} (!= 1) is not supported")


def _check_model(model, model_type: str | None = None) -> None:
    """``model`` is a live HF model (an ``nn.Module`` with a ``config``), of ``model_type`` when given."""
    if not isinstance(model, torch.nn.Module) or not hasattr(model, "config"):
        raise TypeError(f"model: expected a Hugging Face model (a torch.nn.Module with .config), got "
                        f"{type(model).__name__}")
    if model_type is not None and getattr(model.config, "model_type", None) != model_type:
        raise ValueError(f"model: expected a {model_type} model, got model_type "
                         f"{getattr(model.config, 'model_type', None)!r} (use apply_tik_kernels_to_<its family> "
                         f"or apply_to_model)")


def _ops_for(model_type: str):
    return MOE_OPS if model_type == "qwen3_moe" else DENSE_OPS


def _set_attn(model, name: str) -> None:
    register_attention()
    cfg = model.config
    if getattr(cfg, "_attn_implementation", None) == name:
        return
    setter = getattr(model, "set_attn_implementation", None)
    if setter is not None:
        try:
            setter(name)
        except Exception:  # older transformers: set the config attribute directly
            cfg._attn_implementation = name
    else:
        cfg._attn_implementation = name
    if getattr(cfg, "_attn_implementation", None) != name:
        cfg._attn_implementation = name


# ------------------------------------------------------------------------------------------------
# live model
# ------------------------------------------------------------------------------------------------
def _bind(root, model_type: str) -> int:
    _, _, table = _family(model_type)
    for cls in table:
        _exclude_from_hub_kernels(cls)
    n = 0
    for m in root.modules():
        for cls, fn in table.items():
            if isinstance(m, cls):
                bound = m.__dict__.get("forward")
                if getattr(bound, "__func__", None) is not fn:  # new, or rebound by someone else since
                    m.forward = types.MethodType(fn, m)
                    m._tik_patched = True
                n += 1
                break
    return n


def apply_to_module(module, model_type: str):
    """Patch the family's modules inside ``module`` (e.g. one decoder layer + a rotary embedding,
    for layer-level benchmarks); no lm_head, no attention-name switch. Undo with :func:`revert`."""
    require_ops(_ops_for(model_type))
    if _bind(module, model_type) == 0:
        raise ValueError(f"{type(module).__name__}: found no {model_type} modules to patch")
    return module


def apply_to_model(model):
    """Route every unified op of a live HF causal LM (Qwen2/Qwen3/Qwen3-MoE/Llama) through ours.

    Binds replacement ``forward`` methods on the model's RMSNorm, rotary, attention, MLP / MoE
    modules and ``lm_head`` and switches its attention implementation to :data:`TIK_ATTENTION`.
    Works after FSDP2 ``fully_shard`` as well. Turns transformers' hub kernelization off for the model
    (it would rebind the RMSNorms at the next ``train()`` / ``eval()``). Returns ``model``. Undo with
    :func:`revert`.
    """
    from areal_tik_plugin import versions

    versions.check_transformers()  # transformers >= 5.0: the modeling code these forwards replace
    _check_model(model)
    config = model.config
    check_config(config)
    require_ops(_ops_for(config.model_type))
    _stop_kernelizing(model)
    if _bind(model, config.model_type) == 0:
        raise ValueError(f"{type(model).__name__}: found no {config.model_type} modules to patch")
    _watch(model, config.model_type)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is not None and "_tik_patched" not in head.__dict__:
        head.forward = types.MethodType(_lm_head_forward, head)
        head._tik_patched = True
    if "_tik_prev_attn" not in model.__dict__:
        model._tik_prev_attn = getattr(config, "_attn_implementation", None)
    _set_attn(model, TIK_ATTENTION)
    return model


def revert(model):
    """Undo :func:`apply_to_model` (and the lm_head/attention switch of the class-level patches)."""
    for m in model.modules():
        m.__dict__.pop("_tik_watch", None)
        if m.__dict__.pop("_tik_patched", False):
            m.__dict__.pop("forward", None)
    prev = model.__dict__.pop("_tik_prev_attn", None)
    if prev is not None and prev != TIK_ATTENTION:
        try:
            model.set_attn_implementation(prev)
        except Exception:
            model.config._attn_implementation = prev
    return model


def is_patched(model) -> bool:
    return any("_tik_patched" in m.__dict__ for m in model.modules()) or any(
        getattr(type(m), "_tik_class_patched", False) for m in model.modules())


# ------------------------------------------------------------------------------------------------
# classes, before the model is built
# ------------------------------------------------------------------------------------------------
_CLASS_SAVED: dict[tuple[type, str], Any] = {}


def _save_and_set(cls, attr, value):
    key = (cls, attr)
    if key not in _CLASS_SAVED:
        _CLASS_SAVED[key] = cls.__dict__.get(attr, _MISSING)
    setattr(cls, attr, value)


_MISSING = object()


def _wrap_init(cls, head: bool, model_type: str):
    orig = cls.__dict__["__init__"] if (cls, "__init__") not in _CLASS_SAVED else _CLASS_SAVED[(cls, "__init__")]

    @functools.wraps(orig)
    def __init__(self, config, *args, **kwargs):
        orig(self, config, *args, **kwargs)
        if head:
            h = self.get_output_embeddings()
            if h is not None and "_tik_patched" not in h.__dict__:
                h.forward = types.MethodType(_lm_head_forward, h)
                h._tik_patched = True
        if "_tik_prev_attn" not in self.__dict__:
            self._tik_prev_attn = getattr(self.config, "_attn_implementation", None)
        _set_attn(self, TIK_ATTENTION)
        _watch(self, model_type)

    return __init__


def _apply_classes(model_type: str, model=None):
    if model is not None:
        _check_model(model, model_type)
        return apply_to_model(model)
    from areal_tik_plugin import versions

    versions.check_transformers()
    require_ops(_ops_for(model_type))
    register_attention()
    mod, prefix, table = _family(model_type)
    for cls, fn in table.items():
        _exclude_from_hub_kernels(cls)
        _save_and_set(cls, "forward", fn)
        _save_and_set(cls, "_tik_class_patched", True)
    for cname, head in ((f"{prefix}Model", False), (f"{prefix}ForCausalLM", True)):
        cls = getattr(mod, cname)
        _save_and_set(cls, "__init__", _wrap_init(cls, head, model_type))
    return None


def apply_tik_kernels_to_qwen2(model=None):
    """Patch Qwen2 / Qwen2.5 classes before the model is built (or a live ``model`` when given)."""
    return _apply_classes("qwen2", model)


def apply_tik_kernels_to_qwen3(model=None):
    """Patch Qwen3 classes before the model is built (or a live ``model`` when given)."""
    return _apply_classes("qwen3", model)


def apply_tik_kernels_to_qwen3_moe(model=None):
    """Patch Qwen3-MoE classes before the model is built (or a live ``model`` when given)."""
    return _apply_classes("qwen3_moe", model)


def apply_tik_kernels_to_llama(model=None):
    """Patch Llama classes before the model is built (or a live ``model`` when given)."""
    return _apply_classes("llama", model)


def revert_tik_kernels(model_type: str | None = None) -> None:
    """Restore the classes patched by ``apply_tik_kernels_to_*`` (all families when None).

    Models built while the classes were patched keep their bound ``lm_head`` and attention
    setting: call :func:`revert` on them as well.
    """
    prefixes = None
    if model_type is not None:
        mod, prefix, _ = _family(model_type)
        prefixes = (mod.__name__,)
    for (cls, attr), orig in list(_CLASS_SAVED.items()):
        if prefixes is not None and cls.__module__ not in prefixes:
            continue
        if orig is _MISSING:
            try:
                delattr(cls, attr)
            except AttributeError:
                pass
        else:
            setattr(cls, attr, orig)
        del _CLASS_SAVED[(cls, attr)]


__all__ = [
    "TIK_ATTENTION", "FAMILIES", "TikOpUnavailableError", "TikRotary",
    "apply_to_model", "apply_to_module", "revert", "is_patched",
    "apply_tik_kernels_to_qwen2", "apply_tik_kernels_to_qwen3", "apply_tik_kernels_to_qwen3_moe",
    "apply_tik_kernels_to_llama", "revert_tik_kernels",
    "register_attention", "replace_builtin_attention", "restore_builtin_attention", "tik_attention_function",
    "tik_linear", "tik_rms_norm", "tik_qkv", "tik_mlp", "tik_moe", "tik_ffn", "rope_params", "canonical_inv_freq",
    "varlen_layout", "attend_packed", "attend_prefix", "check_config", "require_ops", "missing_ops",
]
