"""``tik`` attention backend for SGLang: extend (prefill, chunked prefill, radix-cache hits) and decode
over ``MHATokenToKVPool`` through the unified attention ops, K/V written with ``ops.kv_write``.

SGLang's ``req_to_token`` table holds one KV slot per token position whatever the page size, so the
unified ops are always called with ``page_size=1`` on it (see ``areal_tik_plugin.ops.attention``).
Per-batch metadata (``cu_seqlens_q`` and the longest extend run) is built once in
:meth:`TikAttnBackend.init_forward_metadata_out_graph`; decode needs none (``max_context_len`` is the
table width, a shape), so a captured decode graph reads ``seq_lens`` / ``req_pool_indices`` from the
graph runner's static buffers and is replay-safe.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from areal_tik_plugin.integrations.sglang import layers as L

try:  # importable without SGLang (the class is only defined when SGLang is there)
    from sglang.srt.layers.attention.base_attn_backend import AttentionBackend as _Base
except Exception:  # noqa: BLE001 - sglang absent or broken: the backend cannot be built
    _Base = object


@dataclass
class TikForwardMetadata:
    cu_seqlens_q: Optional[torch.Tensor] = None  # int32 [B+1] (extend only)
    max_extend_len: int = 0


class TikAttnBackend(_Base):
    """Attention through ``areal_tik_plugin.ops`` (bitwise equal to the training-side varlen path)."""

    def __init__(self, model_runner):
        super().__init__()
        from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

        self.device = model_runner.device
        self.req_to_token_pool = model_runner.req_to_token_pool
        self.token_to_kv_pool = model_runner.token_to_kv_pool
        pool = self.token_to_kv_pool
        if type(pool) is not MHATokenToKVPool:
            raise NotImplementedError(f"tik attention: KV pool {type(pool).__name__} is not supported "
                                      "(MHATokenToKVPool only: no MLA, sliding-window or hybrid pools)")
        model_dtype = model_runner.model_config.dtype
        if pool.dtype != model_dtype or pool.store_dtype != model_dtype:
            raise NotImplementedError(f"tik attention: KV cache dtype {pool.dtype} must equal the model dtype "
                                      f"{model_dtype} (no fp8 KV cache)")
        self.forward_metadata = TikForwardMetadata()
        self._checked_layers = set()

    # --- metadata ------------------------------------------------------------------------------
    def init_forward_metadata(self, forward_batch):
        self.init_forward_metadata_out_graph(forward_batch)
        self.init_forward_metadata_in_graph(forward_batch)

    def init_forward_metadata_out_graph(self, forward_batch, in_capture: bool = False):
        mode = forward_batch.forward_mode
        if mode.is_decode_or_idle():
            self.forward_metadata = TikForwardMetadata()
            return
        if not (mode.is_extend() and mode.is_extend_or_draft_extend_or_mixed()):
            raise NotImplementedError(f"tik attention: forward mode {mode.name} is not supported "
                                      "(extend, mixed and decode only: no speculative / dLLM modes)")
        lens = forward_batch.extend_seq_lens
        cu = torch.zeros(lens.numel() + 1, dtype=torch.int32, device=lens.device)
        torch.cumsum(lens, 0, out=cu[1:])
        cpu = forward_batch.extend_seq_lens_cpu
        max_len = max(cpu) if cpu is not None and len(cpu) else int(lens.max())
        self.forward_metadata = TikForwardMetadata(cu_seqlens_q=cu, max_extend_len=int(max_len))

    def init_forward_metadata_in_graph(self, forward_batch):
        return None

    # --- CUDA-graph hooks (decode graphs) -----------------------------------------------------------
    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int):
        self.cuda_graph_max_bs = max_bs  # decode needs no per-graph buffers

    def get_cuda_graph_seq_len_fill_value(self):
        return 1  # a padded row reads one (padding) slot

    # SGLang <= 0.5.1x decode-graph hooks (removed from the ABC later): decode needs no metadata
    def init_forward_metadata_capture_cuda_graph(self, bs, num_tokens, req_pool_indices, seq_lens, encoder_lens,
                                                 forward_mode, spec_info=None):
        if not forward_mode.is_decode_or_idle():
            raise NotImplementedError(f"tik attention: CUDA-graph capture of {forward_mode.name} is not supported")
        self.forward_metadata = TikForwardMetadata()

    def init_forward_metadata_replay_cuda_graph(self, bs, req_pool_indices, seq_lens, seq_lens_sum, encoder_lens,
                                                forward_mode, spec_info=None, seq_lens_cpu=None, **kwargs):
        self.forward_metadata = TikForwardMetadata()

    # --- forward ---------------------------------------------------------------------------------
    def _check_layer(self, layer):
        if layer.layer_id in self._checked_layers:
            return
        why = None
        if layer.qk_head_dim != layer.v_head_dim:
            why = f"qk_head_dim {layer.qk_head_dim} != v_head_dim {layer.v_head_dim}"
        elif getattr(layer, "is_cross_attention", False):
            why = "cross attention"
        elif getattr(layer, "sliding_window_size", None) not in (None, -1):
            why = f"sliding window {layer.sliding_window_size}"
        elif getattr(layer, "logit_cap", 0) not in (None, 0, 0.0):
            why = f"logit cap {layer.logit_cap}"
        elif getattr(layer, "attn_type", None) is not None and getattr(layer.attn_type, "name", "DECODER") != "DECODER":
            why = f"attention type {layer.attn_type}"
        if why:
            raise NotImplementedError(f"tik attention, layer {layer.layer_id}: {why} is not supported")
        self._checked_layers.add(layer.layer_id)

    def _write_kv(self, layer, forward_batch, k, v):
        kb = self.token_to_kv_pool.get_key_buffer(layer.layer_id)
        vb = self.token_to_kv_pool.get_value_buffer(layer.layer_id)
        L.COUNTS["kv_write"] += 1
        L._ops().kv_write(kb, vb, forward_batch.out_cache_loc,
                          k.reshape(-1, layer.tp_k_head_num, layer.qk_head_dim),
                          v.reshape(-1, layer.tp_v_head_num, layer.v_head_dim))
        return kb, vb

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
        self._check_layer(layer)
        if save_kv_cache and k is not None and v is not None:
            kb, vb = self._write_kv(layer, forward_batch, k, v)
        else:
            kb = self.token_to_kv_pool.get_key_buffer(layer.layer_id)
            vb = self.token_to_kv_pool.get_value_buffer(layer.layer_id)
        md = self.forward_metadata
        L.COUNTS["attention_extend"] += 1
        o = L._ops().attention_extend(
            q.reshape(-1, layer.tp_q_head_num, layer.qk_head_dim), kb, vb,
            cu_seqlens_q=md.cu_seqlens_q, prefix_lens=forward_batch.extend_prefix_lens,
            kv_indices=self.req_to_token_pool.req_to_token, table_rows=forward_batch.req_pool_indices,
            max_extend_len=md.max_extend_len, softmax_scale=layer.scaling)
        return o.reshape(-1, layer.tp_q_head_num * layer.v_head_dim)

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
        self._check_layer(layer)
        if save_kv_cache and k is not None and v is not None:
            kb, vb = self._write_kv(layer, forward_batch, k, v)
        else:
            kb = self.token_to_kv_pool.get_key_buffer(layer.layer_id)
            vb = self.token_to_kv_pool.get_value_buffer(layer.layer_id)
        table = self.req_to_token_pool.req_to_token
        L.COUNTS["attention_decode"] += 1
        o = L._ops().attention_decode(
            q.reshape(-1, layer.tp_q_head_num, layer.qk_head_dim), kb, vb,
            seq_lens=forward_batch.seq_lens, kv_indices=table, table_rows=forward_batch.req_pool_indices,
            softmax_scale=layer.scaling, max_context_len=table.shape[1])
        return o.reshape(-1, layer.tp_q_head_num * layer.v_head_dim)

    def support_triton(self):
        return True


def create_tik_backend(model_runner):
    """Factory registered in SGLang's attention registry under ``tik``; also activates the layer-op
    routing of :mod:`areal_tik_plugin.integrations.sglang.layers` for this model runner."""
    if _Base is object:
        raise ImportError("tik attention backend needs SGLang (sglang.srt.layers.attention.base_attn_backend)")
    backend = TikAttnBackend(model_runner)
    L.activate(model_runner)
    return backend
