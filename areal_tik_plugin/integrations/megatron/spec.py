"""A megatron-core layer spec whose submodules are the plugin's unified ops.

The op sequence per decoder layer is the one the tik-patched Hugging Face forward runs
(:mod:`areal_tik_plugin.integrations.transformers`), so a GPTModel built with this spec gives the
patched HF model's logits bit for bit:

==============================================  ===============================================
Megatron submodule (TE-spec parameter names)    ours
==============================================  ===============================================
``self_attention.linear_qkv``                   ``ops.rms_norm`` (``layer_norm_weight``) then
(``weight``, ``layer_norm_weight``, ``bias``)   ``ops.linear`` on the per-query-group
                                                interleaved QKV weight (one GEMM)
``self_attention.q_layernorm/k_layernorm``      ``ops.rms_norm`` per head
RoPE (packed ``cu_seqlens`` or ``[s, b]``)      ``ops.apply_rope``: positions restart per
                                                sequence, fp32 ``inv_freq`` from the HF config
``self_attention.core_attention``               ``ops.attention_varlen`` (Megatron's
                                                CoreAttention protocol, THD and sbhd)
``self_attention.linear_proj``                  ``ops.linear``
residual adds (``*_bda``)                       ``residual + x`` in torch (no bias, no dropout)
``mlp.linear_fc1`` (``layer_norm_weight``)      ``ops.rms_norm`` + ``ops.linear`` on gate|up,
                                                ``ops.swiglu_fused``
``mlp.linear_fc2``                              ``ops.linear``
``pre_mlp_layernorm`` + ``mlp.router`` +        ``ops.rms_norm``; ``ops.moe_block`` (fp32
``mlp.experts.linear_fc1/2.weight{i}``          softmax, top-k ties -> lower id, renormalize,
                                                fixed fp32 combine order)
``decoder.final_layernorm``                     ``ops.rms_norm``
``output_layer``                                ``ops.linear`` (:func:`finalize_model`)
==============================================  ===============================================

Splitting the fused QKV / gate_up GEMM output gives the same bits per column as the separate HF
projections: ``ops.linear``'s reduction is a fixed chain over K, independent of N and of the rows.

Refused (``ValueError`` naming the setting): tensor parallel > 1, context parallel > 1, sequence
parallel, FP8/FP4, TransformerEngine-only fusions (``transformer_impl`` other than ``local``
with this spec is ignored: every submodule is ours), dropout, biases other than Qwen2's q/k/v
bias, fp32 residual connection, MoE settings outside Qwen3-MoE's routing (shared experts, group
routing, aux losses, score functions other than softmax, router scaling), and any model family
other than qwen2 / qwen3 / qwen3_moe / llama.

Hidden states are Megatron's ``[s, b, h]``; a packed THD batch is ``[t, 1, h]`` with
``PackedSeqParams(qkv_format="thd", cu_seqlens_q=...)``.
"""

from __future__ import annotations

from typing import Any

import torch

from areal_tik_plugin.ops import apply_rope, attention_varlen, linear, rms_norm, swiglu_fused

FAMILIES = ("qwen2", "qwen3", "qwen3_moe", "llama")


class TikMegatronConfigError(ValueError):
    """A megatron-core setting the plugin's spec does not keep bit-identical."""


# ------------------------------------------------------------------------------------------------
# config checks
# ------------------------------------------------------------------------------------------------
def _world(name: str) -> int:
    try:
        from megatron.core import parallel_state as ps

        if not ps.model_parallel_is_initialized():
            return 1
        return int(getattr(ps, f"get_{name}_world_size")())
    except (ImportError, AssertionError, AttributeError, RuntimeError):
        return 1


def check_config(config, model_type: str) -> None:
    """Raise :class:`TikMegatronConfigError` for a TransformerConfig the spec does not cover."""
    if model_type not in FAMILIES:
        raise TikMegatronConfigError(f"model_type {model_type!r}: the Megatron spec supports {list(FAMILIES)}")
    errs = []

    def need(cond, msg):
        if not cond:
            errs.append(msg)

    c = config
    tp = max(int(c.tensor_model_parallel_size or 1), _world("tensor_model_parallel"))
    cp = max(int(c.context_parallel_size or 1), _world("context_parallel"))
    need(tp == 1, f"tensor_model_parallel_size={tp}: tensor parallel > 1 is not supported (row splits change "
                  "the GEMM reduction); use TP 1")
    need(cp == 1, f"context_parallel_size={cp}: context parallel > 1 is not supported; use CP 1")
    etp = getattr(c, "expert_tensor_parallel_size", None)
    need(etp in (None, 1), f"expert_tensor_parallel_size={etp}: expert tensor parallel is not supported; use 1")
    need(not c.sequence_parallel, "sequence_parallel=True: sequence parallel is not supported")
    need(not getattr(c, "fp8", None), f"fp8={c.fp8!r}: FP8 changes the logits; not supported")
    need(not getattr(c, "fp4", None), f"fp4={getattr(c, 'fp4', None)!r}: FP4 is not supported")
    need(c.normalization == "RMSNorm", f"normalization={c.normalization!r}: expected RMSNorm")
    need(c.gated_linear_unit, "gated_linear_unit=False: the unified MLP is SwiGLU")
    need(c.activation_func is torch.nn.functional.silu,
         f"activation_func={getattr(c.activation_func, '__name__', c.activation_func)}: expected F.silu (SwiGLU)")
    need(not c.add_bias_linear, "add_bias_linear=True: only Qwen2's q/k/v bias (add_qkv_bias) is supported")
    need(float(c.hidden_dropout) == 0.0, f"hidden_dropout={c.hidden_dropout}: dropout is not supported; use 0")
    need(float(c.attention_dropout) == 0.0, f"attention_dropout={c.attention_dropout}: dropout is not supported")
    need(not c.fp32_residual_connection, "fp32_residual_connection=True: residuals stay in the activation dtype")
    need(not getattr(c, "apply_residual_connection_post_layernorm", False),
         "apply_residual_connection_post_layernorm=True is not supported")
    need(not getattr(c, "layernorm_zero_centered_gamma", False), "layernorm_zero_centered_gamma=True is not supported")
    need(not getattr(c, "attention_output_gate", False), "attention_output_gate=True is not supported")
    need(not getattr(c, "multi_latent_attention", False), "multi_latent_attention=True is not supported")
    need(not getattr(c, "apply_rope_fusion", False), "apply_rope_fusion=True: a TE-only fusion; set False")
    need(not getattr(c, "rotary_interleaved", False), "rotary_interleaved=True: the unified RoPE is NeoX (rotate-half)")
    need(getattr(c, "mtp_num_layers", None) in (None, 0), "mtp_num_layers: multi-token prediction is not supported")
    need(not getattr(c, "tp_comm_overlap", False), "tp_comm_overlap=True: a TE-only fusion; not supported")
    need(getattr(c, "cuda_graph_impl", "none") in ("none", None),
         f"cuda_graph_impl={getattr(c, 'cuda_graph_impl', None)!r}: not supported with this spec")
    need(getattr(c, "recompute_granularity", None) in (None, "full"),
         f"recompute_granularity={c.recompute_granularity!r}: use None or 'full'")
    need(c.kv_channels in (16, 32, 64, 128, 256), f"kv_channels={c.kv_channels}: the unified attention supports "
                                                  "head dims 16, 32, 64, 128, 256")
    need(c.softmax_scale is None, f"softmax_scale={c.softmax_scale}: the scale is head_dim**-0.5 as in HF")
    qk_norm, qkv_bias = bool(c.qk_layernorm), bool(c.add_qkv_bias)
    moe = bool(c.num_moe_experts)
    if model_type in ("qwen3", "qwen3_moe"):
        need(qk_norm, f"{model_type}: expected qk_layernorm=True")
        need(not qkv_bias, f"{model_type}: expected add_qkv_bias=False")
    elif model_type == "qwen2":
        need(not qk_norm, "qwen2: expected qk_layernorm=False")
        need(qkv_bias, "qwen2: expected add_qkv_bias=True")
    else:
        need(not qk_norm and not qkv_bias, "llama: expected qk_layernorm=False and add_qkv_bias=False")
    need(moe == (model_type == "qwen3_moe"), f"{model_type}: num_moe_experts={c.num_moe_experts} does not match the family")
    if moe:
        need(getattr(c, "moe_shared_expert_intermediate_size", None) in (None, 0), "moe shared experts are not supported")
        need(getattr(c, "moe_router_score_function", "softmax") == "softmax",
             f"moe_router_score_function={c.moe_router_score_function!r}: expected 'softmax'")
        need(getattr(c, "moe_router_load_balancing_type", "none") in ("none", None),
             f"moe_router_load_balancing_type={c.moe_router_load_balancing_type!r}: expected 'none' (RL setting)")
        need(getattr(c, "moe_router_num_groups", None) in (None, 0, 1), "moe_router_num_groups: group routing is not supported")
        need(getattr(c, "moe_router_topk_scaling_factor", None) in (None, 1.0),
             "moe_router_topk_scaling_factor: not supported")
        need(not getattr(c, "moe_router_enable_expert_bias", False), "moe_router_enable_expert_bias=True is not supported")
        need(float(getattr(c, "moe_z_loss_coeff", 0.0) or 0.0) == 0.0, "moe_z_loss_coeff: not supported")
        need(float(getattr(c, "moe_input_jitter_eps", 0.0) or 0.0) == 0.0, "moe_input_jitter_eps: not supported")
        need(getattr(c, "moe_layer_freq", 1) == 1, f"moe_layer_freq={c.moe_layer_freq}: every layer must be MoE")
        need(getattr(c, "moe_ffn_hidden_size", None), "moe_ffn_hidden_size: required")
        need(1 <= int(c.moe_router_topk) <= min(int(c.num_moe_experts), 64),
             f"moe_router_topk={c.moe_router_topk}: expected 1..min(num_moe_experts, 64)")
        ep = max(int(getattr(c, "expert_model_parallel_size", 1) or 1), _world("expert_model_parallel"))
        need(c.num_moe_experts % ep == 0, f"num_moe_experts={c.num_moe_experts} not divisible by expert parallel {ep}")
    if errs:
        raise TikMegatronConfigError("areal-tik-plugin's Megatron spec refuses this configuration:\n  - "
                                     + "\n  - ".join(errs))


# ------------------------------------------------------------------------------------------------
# modules
# ------------------------------------------------------------------------------------------------
def _device(config):
    return torch.device("cpu") if config.use_cpu_initialization or not torch.cuda.is_available() \
        else torch.device("cuda", torch.cuda.current_device())


def _param(config, *shape, init=None, value=None, tp_dim=None):
    p = torch.nn.Parameter(torch.empty(*shape, dtype=config.params_dtype, device=_device(config)))
    with torch.no_grad():
        if value is not None:
            p.fill_(value)
        elif init is not None:
            init(p)
    if tp_dim is not None:
        from megatron.core.tensor_parallel.layers import set_tensor_model_parallel_attributes

        set_tensor_model_parallel_attributes(p, is_parallel=True, dim=tp_dim, stride=1)
    return p


def _as(t, dtype):
    return t if t is None or t.dtype == dtype else t.to(dtype)


def _rows(x):
    return x.reshape(-1, x.shape[-1])


class TikRMSNorm(torch.nn.Module):
    """RMSNorm (``weight``) on ``ops.rms_norm``: hidden (final / pre-MLP norm) or per head (q/k norm)."""

    def __init__(self, config=None, hidden_size: int = 0, eps: float = 1e-6, **_ignored):
        super().__init__()
        self.config, self.eps = config, float(eps)
        self.weight = _param(config, hidden_size, value=1.0)
        setattr(self.weight, "sequence_parallel", False)

    def forward(self, x):
        return rms_norm(x, _as(self.weight, x.dtype), self.eps)


class TikLinear(torch.nn.Module):
    """``linear_proj`` / ``linear_fc2`` / ``output_layer`` replacement: ``ops.linear``; returns
    ``(out, None)`` (Megatron's linear protocol; a bias is added inside the GEMM)."""

    def __init__(self, input_size, output_size, *, config, init_method=None, bias=False, is_expert=False,
                 input_is_parallel=True, skip_bias_add=True, tp_comm_buffer_name=None, tp_group=None, **_ignored):
        super().__init__()
        self.config = config
        self.weight = _param(config, output_size, input_size, init=init_method, tp_dim=1)
        self.bias = _param(config, output_size, value=0.0) if bias else None

    def forward(self, x):
        y = linear(_rows(x), _as(self.weight, x.dtype), _as(self.bias, x.dtype))
        return y.view(*x.shape[:-1], y.shape[-1]), None


class TikNormLinear(torch.nn.Module):
    """TE's ``LayerNormColumnParallelLinear`` shape (``weight``, ``layer_norm_weight``, ``bias``):
    ``ops.rms_norm`` then ``ops.linear``; returns ``(out, None)``."""

    def __init__(self, input_size, output_size, *, config, init_method=None, bias=False, gather_output=False,
                 skip_bias_add=False, is_expert=False, tp_comm_buffer_name=None, tp_group=None, **_ignored):
        super().__init__()
        self.config, self.eps = config, float(config.layernorm_epsilon)
        self.weight = _param(config, output_size, input_size, init=init_method, tp_dim=0)
        self.layer_norm_weight = _param(config, input_size, value=1.0)
        setattr(self.layer_norm_weight, "sequence_parallel", False)
        self.bias = _param(config, output_size, value=0.0, tp_dim=0) if bias else None

    def forward(self, x):
        h = rms_norm(_rows(x), _as(self.layer_norm_weight, x.dtype), self.eps)
        y = linear(h, _as(self.weight, x.dtype), _as(self.bias, x.dtype))
        return y.view(*x.shape[:-1], y.shape[-1]), None


def _positions(s: int, b: int, packed_seq_params, device) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(positions int64 [b*s] batch-major, cu_seqlens int32, max_seqlen) of ``s x b`` tokens."""
    if packed_seq_params is not None:
        # computed once per forward: every layer (attention and core attention) asks again
        cu = packed_seq_params.cu_seqlens_q
        key = (s, b, str(device), id(cu), cu.data_ptr(), None if cu.is_inference() else cu._version)
        got = getattr(packed_seq_params, "_tik_layout", None)
        if got is not None and got[0] == key:
            return got[1]
        res = _packed_positions(s, b, packed_seq_params, device)
        packed_seq_params._tik_layout = (key, res)
        return res
    pos = torch.arange(s, device=device, dtype=torch.int64).repeat(b)
    return pos, torch.arange(b + 1, dtype=torch.int32, device=device) * s, s


def _packed_positions(s, b, packed_seq_params, device):
    if packed_seq_params.qkv_format != "thd":
        raise ValueError(f"packed_seq_params.qkv_format={packed_seq_params.qkv_format!r}: expected 'thd'")
    if b != 1:
        raise ValueError(f"packed THD input: expected hidden states [t, 1, h], got batch {b}")
    cu = packed_seq_params.cu_seqlens_q
    for name in ("cu_seqlens_kv", "cu_seqlens_q_padded", "cu_seqlens_kv_padded"):
        other = getattr(packed_seq_params, name, None)
        if other is not None and other is not cu and not torch.equal(other.to(cu.device), cu):
            raise ValueError(f"packed_seq_params.{name}: expected the same offsets as cu_seqlens_q "
                             "(causal self-attention without padding between sequences)")
    cu = cu.to(device=device, dtype=torch.int32)
    if cu.dim() != 1 or int(cu[0]) != 0 or int(cu[-1]) != s:
        raise ValueError(f"packed_seq_params.cu_seqlens_q: expected 1-D offsets from 0 to {s}, got "
                         f"{cu.tolist() if cu.numel() < 16 else tuple(cu.shape)}")
    lens = (cu[1:] - cu[:-1]).to(torch.int64)
    starts = torch.repeat_interleave(cu[:-1].to(torch.int64), lens)
    pos = torch.arange(s, device=device, dtype=torch.int64) - starts
    mx = packed_seq_params.max_seqlen_q
    return pos, cu, int(mx) if mx is not None else int(lens.max())


class TikCoreAttention(torch.nn.Module):
    """Causal self-attention on ``ops.attention_varlen`` following Megatron's CoreAttention protocol.

    THD (``packed_seq_params.qkv_format == "thd"``): q [t, np, hn], k/v [t, ng, hn] -> [t, np*hn];
    sbhd: q [s, b, np, hn], k/v [s, b, ng, hn] -> [s, b, np*hn]. Scale ``hn ** -0.5`` (HF's).
    """

    def __init__(self, *, config, layer_number, attn_mask_type, attention_type="self", cp_comm_type=None,
                 softmax_scale=None, pg_collection=None, **_ignored):
        super().__init__()
        from megatron.core.transformer.enums import AttnMaskType

        if attention_type != "self":
            raise ValueError(f"attention_type={attention_type!r}: the tik core attention is causal self-attention")
        if attn_mask_type not in (AttnMaskType.causal, AttnMaskType.padding_causal):
            raise ValueError(f"attn_mask_type={attn_mask_type}: expected AttnMaskType.causal")
        self.config = config
        self.softmax_scale = float(softmax_scale) if softmax_scale is not None else config.kv_channels ** -0.5

    def forward(self, query, key, value, attention_mask=None, attn_mask_type=None, attention_bias=None,
                packed_seq_params=None, **_ignored):
        if attention_bias is not None:
            raise ValueError("attention_bias: the tik core attention takes no attention bias")
        if attention_mask is not None:
            raise ValueError("attention_mask: expected None (causal masking inside the kernel; packed sequences "
                             "through packed_seq_params)")
        if packed_seq_params is not None:
            _, cu, mx = _positions(query.shape[0], 1, packed_seq_params, query.device)
            o = attention_varlen(query.contiguous(), key.contiguous(), value.contiguous(), cu, mx,
                                       self.softmax_scale)
            return o.reshape(o.shape[0], -1)
        s, b = query.shape[:2]
        bm = lambda t: t.transpose(0, 1).reshape(b * s, *t.shape[2:]).contiguous()  # noqa: E731
        cu = torch.arange(b + 1, dtype=torch.int32, device=query.device) * s
        o = attention_varlen(bm(query), bm(key), bm(value), cu, s, self.softmax_scale)
        return o.view(b, s, -1).transpose(0, 1)


def _sbhd_tokens(x, b):
    """[s, b, ...] -> batch-major [b*s, ...] (a free view for b == 1)."""
    return x.reshape(x.shape[0] * b, *x.shape[2:]) if b == 1 else x.transpose(0, 1).reshape(-1, *x.shape[2:])


def _attention_class():
    from megatron.core.transformer.attention import SelfAttention

    class TikSelfAttention(SelfAttention):
        """Megatron's SelfAttention with the unified op sequence in ``forward`` (training/full-sequence
        forward only: no inference KV cache, which SGLang owns)."""

        def forward(self, hidden_states, attention_mask=None, key_value_states=None, inference_context=None,
                    rotary_pos_emb=None, rotary_pos_cos=None, rotary_pos_sin=None, rotary_pos_cos_sin=None,
                    attention_bias=None, packed_seq_params=None, sequence_len_offset=None, *,
                    inference_params=None, **_ignored):
            if inference_context is not None or inference_params is not None:
                raise ValueError("inference_context: the tik Megatron spec runs the full-sequence (training) "
                                 "forward only; rollout runs in SGLang")
            if key_value_states is not None:
                raise ValueError("key_value_states: cross-attention is not supported")
            rope = getattr(self, "_tik_rope", None)
            if rope is None:
                raise RuntimeError("TikSelfAttention: RoPE parameters not attached; build the model with "
                                   "areal_tik_plugin.integrations.megatron.build_model or call finalize_model(model, hf_config)")
            s, b, _ = hidden_states.shape
            hn = self.hidden_size_per_attention_head
            ng, npg = self.num_query_groups_per_partition, self.num_attention_heads_per_partition // self.num_query_groups_per_partition
            x = _sbhd_tokens(hidden_states, b)  # [b*s, h] batch-major
            T = x.shape[0]
            mixed, _ = self.linear_qkv(x)
            mixed = mixed.view(T, ng, (npg + 2) * hn)
            q = mixed[:, :, : npg * hn].reshape(T, ng * npg, hn)
            k = mixed[:, :, npg * hn: (npg + 1) * hn].contiguous()
            v = mixed[:, :, (npg + 1) * hn:].contiguous()
            if self.q_layernorm is not None:
                q = self.q_layernorm(q)
                k = self.k_layernorm(k)
            pos, cu, mx = _positions(s, b, packed_seq_params, x.device)
            inv, scaling = rope.get(x.device)
            q, k = apply_rope(q.contiguous(), k, pos, inv, scaling)
            if packed_seq_params is not None:
                o = self.core_attention(q, k, v, None, attn_mask_type=self.attn_mask_type,
                                        packed_seq_params=packed_seq_params)
                o = o.reshape(s, 1, -1)
            else:
                sb = lambda t: t.view(b, s, *t.shape[1:]).transpose(0, 1)  # noqa: E731
                o = self.core_attention(sb(q), sb(k), sb(v), None, attn_mask_type=self.attn_mask_type)
            return self.linear_proj(o)

    return TikSelfAttention


class TikMLP(torch.nn.Module):
    """Dense SwiGLU MLP: fused pre-MLP norm + ``linear_fc1`` (gate | up) -> ``ops.swiglu_fused`` ->
    ``linear_fc2``; returns ``(out, None)``."""

    def __init__(self, config, submodules=None, is_expert=False, input_size=None, ffn_hidden_size=None,
                 tp_group=None, **_ignored):
        super().__init__()
        self.config = config
        ffn = ffn_hidden_size or config.ffn_hidden_size
        self.linear_fc1 = TikNormLinear(input_size or config.hidden_size, 2 * ffn, config=config,
                                        init_method=config.init_method)
        self.linear_fc2 = TikLinear(ffn, config.hidden_size, config=config,
                                    init_method=config.output_layer_init_method)

    def forward(self, hidden_states, *args, **_ignored):
        gu, _ = self.linear_fc1(hidden_states)
        h = swiglu_fused(_rows(gu))
        return self.linear_fc2(h.view(*gu.shape[:-1], h.shape[-1]))


class _ExpertWeights(torch.nn.Module):
    """``weight0 .. weight{E_local-1}`` (TE GroupedLinear's names)."""

    def __init__(self, config, n: int, out_f: int, in_f: int, init):
        super().__init__()
        self.n = n
        for i in range(n):
            p = _param(config, out_f, in_f, init=init)
            p.allreduce = False  # expert parameters: reduced over the expert-data-parallel group
            self.register_parameter(f"weight{i}", p)

    def stacked(self, dtype):
        return torch.stack([_as(getattr(self, f"weight{i}"), dtype) for i in range(self.n)])

    def sharded_state_dict(self, prefix="", sharded_offsets=(), metadata=None):
        """Distributed-checkpoint entries keyed by the *global* expert id (``weight{ep_rank * E_local
        + i}``), replicated over the expert-data-parallel group only, so expert-parallel ranks
        never write the same key."""
        from megatron.core import parallel_state as ps
        from megatron.core.utils import make_sharded_tensor_for_checkpoint

        ep_rank = ps.get_expert_model_parallel_rank()
        replica = (0, 0, ps.get_expert_data_parallel_rank())
        return {f"{prefix}weight{i}": make_sharded_tensor_for_checkpoint(
                    getattr(self, f"weight{i}"), f"{prefix}weight{ep_rank * self.n + i}",
                    prepend_offsets=sharded_offsets, replica_id=replica)
                for i in range(self.n)}


def _children_sharded_state_dict(module, prefix="", sharded_offsets=(), metadata=None):
    """Distributed checkpoint of ``module`` = its children's (so :class:`_ExpertWeights` is reached)."""
    from megatron.core.transformer.utils import sharded_state_dict_default

    out = {}
    for name, child in module.named_children():
        out.update(sharded_state_dict_default(child, f"{prefix}{name}.", sharded_offsets, metadata))
    return out


class TikExperts(torch.nn.Module):
    sharded_state_dict = _children_sharded_state_dict

    def __init__(self, config, n_local: int):
        super().__init__()
        I, H = config.moe_ffn_hidden_size, config.hidden_size
        self.num_local_experts = n_local
        self.linear_fc1 = _ExpertWeights(config, n_local, 2 * I, H, config.init_method)
        self.linear_fc2 = _ExpertWeights(config, n_local, H, I, config.output_layer_init_method)


class TikRouter(torch.nn.Module):
    def __init__(self, config):
        super().__init__()
        self.weight = _param(config, config.num_moe_experts, config.hidden_size, init=config.init_method)
        setattr(self.weight, "sequence_parallel", False)


def _ep_group():
    try:
        from megatron.core import parallel_state as ps

        if ps.model_parallel_is_initialized() and ps.get_expert_model_parallel_world_size() > 1:
            return ps.get_expert_model_parallel_group()
    except (ImportError, AssertionError, AttributeError, RuntimeError):
        pass
    return None


def _gather_experts(w: torch.Tensor, group) -> torch.Tensor:
    """[E_local, ...] on every expert-parallel rank -> [E, ...] in global expert order (differentiable:
    backward sums the ranks' gradients into the owner's shard)."""
    if group is None:
        return w
    from torch.distributed.nn.functional import all_gather

    return torch.cat(all_gather(w.contiguous(), group=group), 0)


class TikMoE(torch.nn.Module):
    """Qwen3-MoE sparse block on ``ops.moe_block`` (router linear, fp32 softmax -> top-k -> renormalize
    when ``moe_router_pre_softmax`` is False, experts combined in fixed slot order); returns
    ``(out, None)``.

    Expert parallel: each rank holds ``E / ep`` experts (``weight{i}`` = global expert
    ``ep_rank * E_local + i``, mbridge's numbering); the forward all-gathers the expert weights over
    the expert-parallel group and runs the whole block locally, so every token's output is the same
    bits as with EP 1 (the weights are sharded, the expert compute is not).
    """

    def __init__(self, config, submodules=None, layer_number=None, pg_collection=None, **_ignored):
        super().__init__()
        self.config = config
        group = _ep_group()
        ep = group.size() if group is not None else 1
        self.router = TikRouter(config)
        self.experts = TikExperts(config, config.num_moe_experts // ep)
        self.top_k = int(config.moe_router_topk)
        self.norm_topk_prob = not bool(config.moe_router_pre_softmax)

    sharded_state_dict = _children_sharded_state_dict

    def set_layer_number(self, n):
        self.layer_number = n

    def forward(self, hidden_states, *args, padding_mask=None, **_ignored):
        from areal_tik_plugin import ops

        x = _rows(hidden_states)
        dt = x.dtype
        group = _ep_group()
        wgu = _gather_experts(self.experts.linear_fc1.stacked(dt), group)
        wd = _gather_experts(self.experts.linear_fc2.stacked(dt), group)
        out, _ = ops.moe_block(x, _as(self.router.weight, dt), wgu, wd, self.top_k, self.norm_topk_prob)
        return out.view(hidden_states.shape), None


def tik_bias_dropout_add(training, fused):
    """``self_attn_bda`` / ``mlp_bda``: ``residual + x`` (HF's order and rounding); bias and dropout refused."""

    def bda(x_with_bias, residual, prob):
        x, bias = x_with_bias
        if bias is not None:
            raise ValueError("tik spec: expected no bias from the attention/MLP output (add_bias_linear=False)")
        if training and prob:
            raise ValueError(f"tik spec: hidden_dropout={prob}: dropout is not supported")
        return residual + x

    return bda


# ------------------------------------------------------------------------------------------------
# specs
# ------------------------------------------------------------------------------------------------
def layer_spec(config, model_type: str):
    """The ModuleSpec of one decoder layer (after :func:`check_config`)."""
    from megatron.core.transformer.attention import SelfAttentionSubmodules
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.identity_op import IdentityOp
    from megatron.core.transformer.spec_utils import ModuleSpec
    from megatron.core.transformer.transformer_layer import TransformerLayer, TransformerLayerSubmodules

    check_config(config, model_type)
    qk = TikRMSNorm if config.qk_layernorm else None
    moe = bool(config.num_moe_experts)
    attn = ModuleSpec(module=_attention_class(), params={"attn_mask_type": AttnMaskType.causal},
                      submodules=SelfAttentionSubmodules(linear_qkv=TikNormLinear, core_attention=TikCoreAttention,
                                                         linear_proj=TikLinear, q_layernorm=qk, k_layernorm=qk))
    return ModuleSpec(module=TransformerLayer, submodules=TransformerLayerSubmodules(
        input_layernorm=IdentityOp, self_attention=attn, self_attn_bda=tik_bias_dropout_add,
        pre_mlp_layernorm=TikRMSNorm if moe else IdentityOp,
        mlp=ModuleSpec(module=TikMoE) if moe else ModuleSpec(module=TikMLP),
        mlp_bda=tik_bias_dropout_add))


def block_spec(config, model_type: str, vp_stage: int | None = None):
    """TransformerBlockSubmodules: this rank's layers (pipeline stage / virtual stage) + the final norm."""
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules, get_num_layers_to_build

    spec = layer_spec(config, model_type)
    try:
        n = get_num_layers_to_build(config, vp_stage=vp_stage)
    except TypeError:  # older megatron-core without vp_stage
        n = get_num_layers_to_build(config)
    return TransformerBlockSubmodules(layer_specs=[spec] * n, layer_norm=TikRMSNorm)


# ------------------------------------------------------------------------------------------------
# model-level pieces: RoPE parameters (from the HF config) and the output layer
# ------------------------------------------------------------------------------------------------
class _Rope:
    """fp32 inv_freq as Hugging Face computes it on the CPU (one copy per device) + attention_scaling."""

    def __init__(self, inv_freq_cpu: torch.Tensor, scaling: float):
        self.per_device = {"cpu": inv_freq_cpu.to(torch.float32).contiguous()}
        self.scaling = float(scaling)

    def get(self, device):
        dev = str(device)
        inv = self.per_device.get(dev)
        if inv is None:
            inv = self.per_device[dev] = self.per_device["cpu"].to(device)
        return inv, self.scaling


def hf_rope(hf_config) -> _Rope:
    """The RoPE parameters the patched HF model (and SGLang) use for ``hf_config``."""
    import importlib

    from areal_tik_plugin.integrations import transformers as TT

    TT.check_config(hf_config)
    rtype = TT._rope_type(hf_config)
    cpu = torch.device("cpu")
    if rtype == "default":
        modname, prefix = TT.FAMILIES[hf_config.model_type]
        fn = getattr(importlib.import_module(modname), f"{prefix}RotaryEmbedding").compute_default_rope_parameters
    else:
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        fn = ROPE_INIT_FUNCTIONS[rtype]
    inv, scaling = fn(hf_config, device=cpu)
    return _Rope(inv, scaling)


def _output_forward(self, input_, weight=None, runtime_gather_output=None):
    w = self.weight if weight is None else weight
    y = linear(_rows(input_), _as(w, input_.dtype), None)
    return y.view(*input_.shape[:-1], y.shape[-1]), None


def _no_rotary(self, *args, **kwargs):
    return None


def finalize_model(model, hf_config) -> Any:
    """Attach the HF RoPE parameters to every tik attention and route ``output_layer`` through
    ``ops.linear`` (GPTModel builds its output layer outside the spec). ``model``: a GPTModel (or a
    wrapper with ``.module`` chains) built with :func:`block_spec`. Returns the GPTModel."""
    import types

    m = model
    while not hasattr(m, "decoder") and hasattr(m, "module"):
        m = m.module
    if not hasattr(m, "decoder"):
        raise TypeError(f"{type(model).__name__}: expected a megatron-core GPTModel")
    rope = hf_rope(hf_config)
    n = 0
    for mod in m.modules():
        if type(mod).__name__ == "TikSelfAttention":
            mod._tik_rope = rope
            n += 1
        elif mod.__class__.__module__.startswith("megatron.core.transformer.attention"):
            raise ValueError(f"{type(mod).__name__}: the model was not built with the tik Megatron spec")
    if n == 0 and len(getattr(m.decoder, "layers", [])) > 0:
        raise ValueError("no TikSelfAttention found: build the GPTModel with areal_tik_plugin's block_spec")
    rot = getattr(m, "rotary_pos_emb", None)
    if rot is not None and "_tik_patched" not in rot.__dict__:
        # the tik attention applies RoPE inside ops.apply_rope from the HF inv_freq; Megatron's
        # cos/sin table (computed on the current CUDA device) is never read
        rot.forward = types.MethodType(_no_rotary, rot)
        rot._tik_patched = True
    if getattr(m, "post_process", False) and getattr(m, "output_layer", None) is not None:
        ol = m.output_layer
        if getattr(ol, "sequence_parallel", False):
            raise TikMegatronConfigError("output_layer.sequence_parallel=True: sequence parallel is not supported")
        if "_tik_patched" not in ol.__dict__:
            ol.forward = types.MethodType(_output_forward, ol)
            ol._tik_patched = True
    m._tik_model_type = hf_config.model_type
    return m


def is_tik_model(model) -> bool:
    m = model
    while not hasattr(m, "decoder") and hasattr(m, "module"):
        m = m.module
    return getattr(m, "_tik_model_type", None) is not None


__all__ = ["FAMILIES", "TikMegatronConfigError", "check_config", "layer_spec", "block_spec", "finalize_model",
           "hf_rope", "is_tik_model", "TikRMSNorm", "TikLinear", "TikNormLinear", "TikCoreAttention", "TikMLP",
           "TikMoE", "tik_bias_dropout_add"]
