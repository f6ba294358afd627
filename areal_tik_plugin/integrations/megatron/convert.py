"""Hugging Face <-> megatron-core for the plugin's spec: config, model build and weight conversion.

The parameter names are the TransformerEngine spec's (what mbridge and AReaL's converters know):

=====================================================  ==================================================
Megatron (``decoder.layers.{i}.`` prefix)               Hugging Face (``model.layers.{L}.``)
=====================================================  ==================================================
``embedding.word_embeddings.weight``                   ``model.embed_tokens.weight``
``self_attention.linear_qkv.layer_norm_weight``        ``input_layernorm.weight``
``self_attention.linear_qkv.weight`` / ``.bias``       ``self_attn.{q,k,v}_proj.weight`` / ``.bias``,
                                                       interleaved per query group (below)
``self_attention.{q,k}_layernorm.weight``              ``self_attn.{q,k}_norm.weight``
``self_attention.linear_proj.weight``                  ``self_attn.o_proj.weight``
``mlp.linear_fc1.layer_norm_weight`` (dense)           ``post_attention_layernorm.weight``
``mlp.linear_fc1.weight`` (dense)                      ``cat(mlp.gate_proj.weight, mlp.up_proj.weight)``
``mlp.linear_fc2.weight`` (dense)                      ``mlp.down_proj.weight``
``pre_mlp_layernorm.weight`` (MoE)                     ``post_attention_layernorm.weight``
``mlp.router.weight`` (MoE)                            ``mlp.gate.weight``
``mlp.experts.linear_fc1.weight{j}`` (MoE)             ``mlp.experts.gate_up_proj[e]`` (transformers 5)
``mlp.experts.linear_fc2.weight{j}`` (MoE)             ``mlp.experts.down_proj[e]``
``decoder.final_layernorm.weight``                     ``model.norm.weight``
``output_layer.weight``                                ``lm_head.weight`` (tied: the embedding)
=====================================================  ==================================================

QKV layout: Megatron's fused weight holds, for each of the ``ng`` query groups in turn, that group's
``np / ng`` query heads, then its key head, then its value head (``[ng, (np/ng + 2) * hn, H]``).
Layer ``i`` of pipeline stage / virtual stage is global layer ``layer_offset + i``; expert ``j`` of
expert-parallel rank ``r`` is global expert ``r * E_local + j``. The conversion only moves and
concatenates tensors (no arithmetic): HF -> Megatron -> HF is exact.
"""

from __future__ import annotations

import torch

from .spec import FAMILIES, block_spec, finalize_model


def _head_dim(hf):
    return getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads


def _rope_theta(hf) -> float:
    rp = getattr(hf, "rope_parameters", None)
    if isinstance(rp, dict) and rp.get("rope_theta") is not None:
        return float(rp["rope_theta"])
    return float(getattr(hf, "rope_theta", 10000.0))


def check_hf_config(hf) -> None:
    mt = getattr(hf, "model_type", None)
    if mt not in FAMILIES:
        raise ValueError(f"model_type {mt!r}: the Megatron integration supports {list(FAMILIES)}")
    if mt == "qwen3_moe":
        if list(getattr(hf, "mlp_only_layers", None) or []) or int(getattr(hf, "decoder_sparse_step", 1) or 1) != 1:
            raise ValueError("qwen3_moe: mlp_only_layers / decoder_sparse_step != 1 (dense layers between MoE "
                             "layers) are not supported by the Megatron integration")
        if getattr(hf, "shared_expert_intermediate_size", 0):
            raise ValueError("qwen3_moe: shared experts are not supported")


def mcore_config(hf, *, dtype=torch.bfloat16, pp: int = 1, ep: int = 1, vpp: int | None = None, **overrides):
    """The megatron-core TransformerConfig for a HF config (the settings mbridge derives, minus the
    TE fusions, plus what the spec requires)."""
    from megatron.core.transformer import TransformerConfig

    check_hf_config(hf)
    mt = hf.model_type
    kw = dict(
        num_layers=hf.num_hidden_layers, hidden_size=hf.hidden_size, num_attention_heads=hf.num_attention_heads,
        num_query_groups=hf.num_key_value_heads, ffn_hidden_size=hf.intermediate_size, kv_channels=_head_dim(hf),
        layernorm_epsilon=float(hf.rms_norm_eps), normalization="RMSNorm", gated_linear_unit=True,
        activation_func=torch.nn.functional.silu, add_bias_linear=False, add_qkv_bias=(mt == "qwen2"),
        qk_layernorm=mt in ("qwen3", "qwen3_moe"), hidden_dropout=0.0, attention_dropout=0.0,
        params_dtype=dtype, pipeline_dtype=dtype, bf16=dtype is torch.bfloat16, fp16=dtype is torch.float16,
        tensor_model_parallel_size=1, pipeline_model_parallel_size=pp, expert_model_parallel_size=ep,
        virtual_pipeline_model_parallel_size=vpp, context_parallel_size=1, sequence_parallel=False,
        variable_seq_lengths=True, use_cpu_initialization=not torch.cuda.is_available(),
        bias_dropout_fusion=False, apply_rope_fusion=False, masked_softmax_fusion=False,
        gradient_accumulation_fusion=False, persist_layer_norm=False, moe_token_dispatcher_type="alltoall",
    )
    if mt == "qwen3_moe":
        kw.update(num_moe_experts=hf.num_experts, moe_ffn_hidden_size=hf.moe_intermediate_size,
                  moe_router_topk=hf.num_experts_per_tok, moe_router_pre_softmax=not bool(hf.norm_topk_prob),
                  moe_router_load_balancing_type="none", moe_aux_loss_coeff=0.0, moe_router_score_function="softmax")
    kw.update(overrides)
    return TransformerConfig(**kw)


def build_model(hf, config=None, *, pre_process: bool | None = None, post_process: bool | None = None,
                vp_stage: int | None = None, dtype=torch.bfloat16):
    """A megatron-core GPTModel with the plugin's spec for ``hf`` (this rank's pipeline stage),
    finalized (:func:`~areal_tik_plugin.integrations.megatron.spec.finalize_model`). Needs
    ``megatron.core.parallel_state`` initialized."""
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt.gpt_model import GPTModel

    config = config or mcore_config(hf, dtype=dtype, pp=ps.get_pipeline_model_parallel_world_size(),
                                    ep=ps.get_expert_model_parallel_world_size())
    if pre_process is None:
        pre_process = ps.is_pipeline_first_stage(ignore_virtual=vp_stage is None, vp_stage=vp_stage)
    if post_process is None:
        post_process = ps.is_pipeline_last_stage(ignore_virtual=vp_stage is None, vp_stage=vp_stage)
    model = GPTModel(config=config, transformer_layer_spec=block_spec(config, hf.model_type, vp_stage),
                     vocab_size=hf.vocab_size, max_sequence_length=hf.max_position_embeddings,
                     pre_process=pre_process, post_process=post_process,
                     share_embeddings_and_output_weights=bool(getattr(hf, "tie_word_embeddings", False)),
                     position_embedding_type="rope", rotary_base=_rope_theta(hf), vp_stage=vp_stage)
    return finalize_model(model, hf)


# ------------------------------------------------------------------------------------------------
# weights
# ------------------------------------------------------------------------------------------------
def _qkv_to_mcore(q, k, v, ng):
    tail = q.shape[1:]
    return torch.cat([q.reshape(ng, -1, *tail), k.reshape(ng, -1, *tail), v.reshape(ng, -1, *tail)], 1).reshape(-1, *tail)


def _qkv_to_hf(qkv, ng, npg, hn):
    g = qkv.reshape(ng, (npg + 2) * hn, *qkv.shape[1:])
    q, k, v = g.split([npg * hn, hn, hn], 1)
    return (t.reshape(-1, *qkv.shape[1:]).contiguous() for t in (q, k, v))


def stage_layers(config, vp_stage: int | None = None) -> tuple[int, int]:
    """(layer_offset, num_layers) of this rank's pipeline (virtual) stage."""
    from megatron.core.transformer.transformer_block import get_num_layers_to_build
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    return int(get_transformer_layer_offset(config, vp_stage=vp_stage)), int(get_num_layers_to_build(config, vp_stage=vp_stage))


def hf_to_mcore(hf_state: dict, hf, *, layer_offset: int = 0, num_layers: int | None = None,
                pre_process: bool = True, post_process: bool = True, ep_rank: int = 0, ep_size: int = 1) -> dict:
    """HF state dict (transformers 5 in-memory names) -> this stage's Megatron state dict."""
    check_hf_config(hf)
    n = hf.num_hidden_layers - layer_offset if num_layers is None else num_layers
    ng = hf.num_key_value_heads
    out = {}
    if pre_process:
        out["embedding.word_embeddings.weight"] = hf_state["model.embed_tokens.weight"]
    for i in range(n):
        hp, mp = f"model.layers.{layer_offset + i}.", f"decoder.layers.{i}."
        g = lambda k: hf_state[hp + k]  # noqa: E731
        out[mp + "self_attention.linear_qkv.layer_norm_weight"] = g("input_layernorm.weight")
        out[mp + "self_attention.linear_qkv.weight"] = _qkv_to_mcore(g("self_attn.q_proj.weight"),
                                                                     g("self_attn.k_proj.weight"),
                                                                     g("self_attn.v_proj.weight"), ng)
        if hp + "self_attn.q_proj.bias" in hf_state:
            out[mp + "self_attention.linear_qkv.bias"] = _qkv_to_mcore(g("self_attn.q_proj.bias"),
                                                                       g("self_attn.k_proj.bias"),
                                                                       g("self_attn.v_proj.bias"), ng)
        if hp + "self_attn.q_norm.weight" in hf_state:
            out[mp + "self_attention.q_layernorm.weight"] = g("self_attn.q_norm.weight")
            out[mp + "self_attention.k_layernorm.weight"] = g("self_attn.k_norm.weight")
        out[mp + "self_attention.linear_proj.weight"] = g("self_attn.o_proj.weight")
        if hf.model_type == "qwen3_moe":
            E = hf.num_experts
            if E % ep_size:
                raise ValueError(f"num_experts={E} not divisible by expert parallel {ep_size}")
            el = E // ep_size
            out[mp + "pre_mlp_layernorm.weight"] = g("post_attention_layernorm.weight")
            out[mp + "mlp.router.weight"] = g("mlp.gate.weight")
            gu, dn = g("mlp.experts.gate_up_proj"), g("mlp.experts.down_proj")
            for j in range(el):
                out[mp + f"mlp.experts.linear_fc1.weight{j}"] = gu[ep_rank * el + j]
                out[mp + f"mlp.experts.linear_fc2.weight{j}"] = dn[ep_rank * el + j]
        else:
            out[mp + "mlp.linear_fc1.layer_norm_weight"] = g("post_attention_layernorm.weight")
            out[mp + "mlp.linear_fc1.weight"] = torch.cat([g("mlp.gate_proj.weight"), g("mlp.up_proj.weight")], 0)
            out[mp + "mlp.linear_fc2.weight"] = g("mlp.down_proj.weight")
    if post_process:
        out["decoder.final_layernorm.weight"] = hf_state["model.norm.weight"]
        if not getattr(hf, "tie_word_embeddings", False):
            out["output_layer.weight"] = hf_state["lm_head.weight"]
    return {k: v.detach().clone() for k, v in out.items()}


def mcore_to_hf(stages: list[tuple[dict, int]], hf, *, ep_states: list[list[dict]] | None = None) -> dict:
    """Megatron state dicts -> one HF state dict.

    ``stages``: ``(state_dict, layer_offset)`` per pipeline (virtual) stage, any order. Expert
    parallel: pass ``ep_states[s]`` = the stage's state dicts of every EP rank in rank order (the
    non-expert tensors are taken from rank 0); else each stage's dict holds all experts."""
    check_hf_config(hf)
    ng, hn = hf.num_key_value_heads, _head_dim(hf)
    npg = hf.num_attention_heads // ng
    out = {}
    for s, (sd, off) in enumerate(stages):
        ranks = ep_states[s] if ep_states is not None else [sd]
        for k, v in sd.items():
            if k.endswith("._extra_state") or "rotary_pos_emb" in k:
                continue
            if k == "embedding.word_embeddings.weight":
                out["model.embed_tokens.weight"] = v
                continue
            if k == "decoder.final_layernorm.weight":
                out["model.norm.weight"] = v
                continue
            if k == "output_layer.weight":
                if not getattr(hf, "tie_word_embeddings", False):
                    out["lm_head.weight"] = v
                continue
            if not k.startswith("decoder.layers."):
                raise ValueError(f"unexpected Megatron parameter {k!r}")
            rest = k[len("decoder.layers."):]
            i, name = rest.split(".", 1)
            hp = f"model.layers.{off + int(i)}."
            if name == "self_attention.linear_qkv.layer_norm_weight":
                out[hp + "input_layernorm.weight"] = v
            elif name in ("self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias"):
                kind = name.rsplit(".", 1)[1]
                q, kk, vv = _qkv_to_hf(v, ng, npg, hn)
                out[hp + f"self_attn.q_proj.{kind}"], out[hp + f"self_attn.k_proj.{kind}"] = q, kk
                out[hp + f"self_attn.v_proj.{kind}"] = vv
            elif name == "self_attention.q_layernorm.weight":
                out[hp + "self_attn.q_norm.weight"] = v
            elif name == "self_attention.k_layernorm.weight":
                out[hp + "self_attn.k_norm.weight"] = v
            elif name == "self_attention.linear_proj.weight":
                out[hp + "self_attn.o_proj.weight"] = v
            elif name in ("mlp.linear_fc1.layer_norm_weight", "pre_mlp_layernorm.weight"):
                out[hp + "post_attention_layernorm.weight"] = v
            elif name == "mlp.linear_fc1.weight":
                gate, up = v.chunk(2, 0)
                out[hp + "mlp.gate_proj.weight"], out[hp + "mlp.up_proj.weight"] = gate.contiguous(), up.contiguous()
            elif name == "mlp.linear_fc2.weight":
                out[hp + "mlp.down_proj.weight"] = v
            elif name == "mlp.router.weight":
                out[hp + "mlp.gate.weight"] = v
            elif name.startswith("mlp.experts.linear_fc"):
                if name.endswith("weight0"):
                    fc = name.split(".")[2]
                    el = sum(1 for kk in sd if kk.startswith(f"decoder.layers.{i}.mlp.experts.{fc}.weight"))
                    ws = [r[f"decoder.layers.{i}.mlp.experts.{fc}.weight{j}"] for r in ranks for j in range(el)]
                    if len(ws) != hf.num_experts:
                        raise ValueError(f"layer {off + int(i)}: {len(ws)} experts found, expected {hf.num_experts}")
                    out[hp + ("mlp.experts.gate_up_proj" if fc == "linear_fc1" else "mlp.experts.down_proj")] = torch.stack(ws)
            else:
                raise ValueError(f"unexpected Megatron parameter {k!r}")
    if getattr(hf, "tie_word_embeddings", False) and "model.embed_tokens.weight" in out:
        out["lm_head.weight"] = out["model.embed_tokens.weight"]  # HF lists the tied head too
    return out


def load_hf_into(model, hf_model_or_state, hf, *, vp_stage: int | None = None) -> None:
    """Copy HF weights into this rank's Megatron model (its pipeline stage and expert shard), exactly."""
    from megatron.core import parallel_state as ps

    from .spec import finalize_model as _f

    m = _f(model, hf)
    state = hf_model_or_state.state_dict() if hasattr(hf_model_or_state, "state_dict") else hf_model_or_state
    off, n = stage_layers(m.config, vp_stage)
    sd = hf_to_mcore(state, hf, layer_offset=off, num_layers=n, pre_process=m.pre_process, post_process=m.post_process,
                     ep_rank=ps.get_expert_model_parallel_rank(), ep_size=ps.get_expert_model_parallel_world_size())
    own = {k: v for k, v in m.state_dict().items() if not k.endswith("._extra_state")}
    missing, extra = sorted(set(own) - set(sd)), sorted(set(sd) - set(own))
    if missing or extra:
        raise ValueError(f"HF -> Megatron names differ: missing {missing[:8]}, unexpected {extra[:8]}")
    with torch.no_grad():
        for k, t in own.items():
            if tuple(t.shape) != tuple(sd[k].shape):
                raise ValueError(f"{k}: shape {tuple(sd[k].shape)} from HF, {tuple(t.shape)} in the model")
            t.copy_(sd[k].to(t.dtype))


__all__ = ["mcore_config", "build_model", "hf_to_mcore", "mcore_to_hf", "load_hf_into", "stage_layers", "check_hf_config"]
