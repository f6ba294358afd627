"""SGLang layer ops routed to the unified ops (rollout side of the bitwise contract).

What runs through ours once the ``tik`` attention backend is built in a scheduler process
(:func:`activate`):

=====================================  =================================================  ==========================
SGLang layer                           ours                                               mechanism
=====================================  =================================================  ==========================
``RMSNorm`` (hidden, fused residual)   ``ops.rms_norm`` / ``ops.rms_norm_residual``       ``BaseFusedOp`` plugin fwd
``apply_qk_norm`` (Qwen3 q/k norm)     ``ops.qk_rms_norm`` (one launch, in place)         HookRegistry REPLACE
``RotaryEmbedding`` (NeoX, default)    ``ops.apply_rope`` (fp32 inv_freq, HF formula)     ``BaseFusedOp`` plugin fwd
``SiluAndMul``                         ``ops.swiglu_fused``                               ``BaseFusedOp`` plugin fwd
``TopK`` (softmax, renormalize)        ``ops.moe_route``                                  ``BaseFusedOp`` plugin fwd
``UnquantizedFusedMoEMethod``          ``ops.moe_experts``                                ``BaseFusedOp`` plugin fwd
``UnquantizedLinearMethod.apply``      ``ops.linear``                                     HookRegistry AROUND
``LogitsProcessor._compute_lm_head``   ``ops.linear``                                     HookRegistry AROUND
``Sampler.forward`` returned logprob   ``ops.token_logprobs`` (log_softmax(logits/T))     HookRegistry AROUND
``SamplingBatchInfo.from_schedule_…``  a distinct seed per request without one            HookRegistry AROUND
``DualGemm`` (fused gate_up + SiLU)    off: MLP via ``ops.linear`` + ``swiglu_fused``    HookRegistry AROUND
attention + KV write                   ``attention_extend/decode``, ``kv_write``          ``tik`` attention backend
=====================================  =================================================  ==========================

"BaseFusedOp plugin fwd": the op class gets a ``forward_plugin`` (through HookRegistry) and declares
``KernelBackend.PLUGIN`` in its capabilities, and every instance of the live model is pinned to it
(``_forward_method``, the attribute BaseFusedOp documents for pinning), so the fused-op trace
labels those calls ``plugin``. Anything the unified ops do not cover (another RoPE variant, grouped
top-k, fp8 weights, TP > 1, ...) raises at activation: there is no silent fallback to SGLang's own
kernels once ``tik`` is selected. With another attention backend nothing here is active.

Counters (:data:`COUNTS`) record each routed call; with ``TIK_SGLANG_STATS=DIR`` every scheduler
process writes ``DIR/stats-<pid>.json`` (counters + SGLang's fused-op trace summary) from its sampler
calls: at once when an op or an op|backend pair is new, otherwise at most every ``STATS_INTERVAL_S``
seconds (the counts may lag by that much). ``tik sglang-check``, the proofs and the tests read it.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import time
import types

logger = logging.getLogger(__name__)

# Ops this integration needs from areal_tik_plugin.ops (checked at activation).
REQUIRED_OPS = ("rms_norm", "rms_norm_residual", "apply_rope", "swiglu_fused", "linear", "moe_route",
                "moe_experts", "kv_write", "attention_extend", "attention_decode", "token_logprobs")

COUNTS: collections.Counter = collections.Counter()
_STATE = {"active": False, "tp_size": 1, "stats_dir": None, "trace": False, "last_dump": 0.0, "dumped_keys": None}
# SGLang's fused-op trace, counted as ``op|backend`` while it is consumed (its list is cleared after each read)
_TRACE: collections.Counter = collections.Counter()
# seconds between two stats files of one process (TIK_SGLANG_STATS); a key that is new since the last file is
# written at once. A py-spy profile of SGLang's decode (qwen3-4b shape, batch 32, CUDA graphs):
# writing the file after every sampler call and re-counting the whole fused-op trace (~14K records) took 30%
# of the scheduler's CPU samples in its event loop, ~2.5 ms per sampler call against a ~5-9 ms decode step.
STATS_INTERVAL_S = 1.0


def is_active() -> bool:
    return _STATE["active"]


def _ops():
    from areal_tik_plugin import ops

    return ops


# ------------------------------------------------------------------------------------------------
# forward_plugin implementations (bound to the SGLang op instance as ``self``)
# ------------------------------------------------------------------------------------------------

def rmsnorm_forward_plugin(self, x, residual=None, post_residual_addition=None, quant_linear=None):
    ops = _ops()
    if post_residual_addition is not None:
        raise NotImplementedError("tik RMSNorm: post_residual_addition is not supported")
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    if residual is None:
        COUNTS["rms_norm"] += 1
        return ops.rms_norm(x2.contiguous(), self.weight, self.variance_epsilon).view(shape)
    COUNTS["rms_norm_residual"] += 1
    y, r = ops.rms_norm_residual(x2.contiguous(), residual.reshape(-1, shape[-1]).contiguous(), self.weight,
                                 self.variance_epsilon)
    return y.view(shape), r.view(residual.shape)


rmsnorm_forward_plugin.__name__ = "forward_plugin"


def _fused_kv_target(arg, t, hkv, head_size):
    """The KV-pool views and value rows of SGLang's ``FusedSetKVBufferArg`` (CUDA layout: ``value``
    [T, Hkv * D], ``k_buffer`` / ``v_buffer`` [slots, Hkv * D] views of the layer's pool, ``cache_loc``
    [T]); anything else is refused with what was expected."""
    if isinstance(arg, dict) or not all(hasattr(arg, a) for a in ("value", "k_buffer", "v_buffer", "cache_loc")):
        raise NotImplementedError(
            "tik RotaryEmbedding: fused_set_kv_buffer_arg must be SGLang's CUDA FusedSetKVBufferArg (value, "
            f"k_buffer, v_buffer, cache_loc); got {type(arg).__name__} (the ROCm dict layout is not supported)")
    kc, vc, v = arg.k_buffer, arg.v_buffer, arg.value
    for name, buf in (("k_buffer", kc), ("v_buffer", vc)):
        if buf.dim() != 2 or buf.shape[1] != hkv * head_size:
            raise ValueError(f"fused_set_kv_buffer_arg.{name}: expected [slots, {hkv * head_size}] "
                             f"(Hkv {hkv} x head {head_size}), got {tuple(buf.shape)}")
    return (kc.view(kc.shape[0], hkv, head_size), vc.view(vc.shape[0], hkv, head_size),
            _last_dim_contiguous(v.reshape(t, hkv, head_size)), arg.cache_loc)


def rope_forward_plugin(self, positions, query, key, offsets=None, fused_set_kv_buffer_arg=None):
    """SGLang ``RotaryEmbedding.forward`` through ``ops.apply_rope``. With ``fused_set_kv_buffer_arg``
    (SGLang passes it, and then ``save_kv_cache=False`` to attention, for e.g. Qwen3-MoE on CUDA with a
    bf16 pool) the rotated k rows and v are also written into the pool at ``cache_loc`` by
    ``ops.kv_write``: the rows the tik backend writes itself otherwise, so the bits do not depend on
    which of the two paths SGLang takes; the returned q and k are rotated, as SGLang's in-place kernel
    leaves them."""
    ops = _ops()
    if offsets is not None:
        positions = positions + offsets
    positions = positions.flatten()
    t = positions.shape[0]
    q = _last_dim_contiguous(query.reshape(t, -1, self.head_size))  # strided views of qkv are read in place
    k = _last_dim_contiguous(key.reshape(t, -1, self.head_size))
    inv_freq = self._tik_inv_freq
    if inv_freq.device != q.device:
        inv_freq = self._tik_inv_freq = inv_freq.to(q.device)
    COUNTS["apply_rope"] += 1
    qo, ko = ops.apply_rope(q, k, positions, inv_freq, 1.0)
    if fused_set_kv_buffer_arg is not None:
        kc, vc, v, loc = _fused_kv_target(fused_set_kv_buffer_arg, t, k.shape[1], self.head_size)
        COUNTS["rope_fused_kv_write"] += 1
        COUNTS["kv_write"] += 1
        ops.kv_write(kc, vc, loc, ko, v)
    return qo.reshape(query.shape), ko.reshape(key.shape)


rope_forward_plugin.__name__ = "forward_plugin"


def silu_and_mul_forward_plugin(self, x):
    COUNTS["swiglu_fused"] += 1
    shape = x.shape
    y = _ops().swiglu_fused(x.reshape(-1, shape[-1]).contiguous())
    return y.view(*shape[:-1], shape[-1] // 2)


silu_and_mul_forward_plugin.__name__ = "forward_plugin"


def topk_forward_plugin(self, hidden_states, router_logits, *, num_token_non_padded=None,
                        expert_location_dispatch_info=None, dynamic_expert_bias=None, router_logits_partials=None):
    from sglang.srt.layers.moe.topk import StandardTopKOutput

    if dynamic_expert_bias is not None or router_logits_partials is not None:
        raise NotImplementedError("tik TopK: dynamic expert bias / router logit partials are not supported")
    cfg = self.topk_config
    COUNTS["moe_route"] += 1
    w, ids = _ops().moe_route(router_logits.contiguous(), cfg.top_k, cfg.renormalize)
    return StandardTopKOutput(w, ids, router_logits)


topk_forward_plugin.__name__ = "forward_plugin"


def moe_experts_forward_plugin(self, layer, dispatch_output):
    from sglang.srt.layers.moe.token_dispatcher import StandardCombineInput

    x = dispatch_output.hidden_states
    topk = dispatch_output.topk_output
    topk_weights, topk_ids = topk.topk_weights, topk.topk_ids
    COUNTS["moe_experts"] += 1
    out = _ops().moe_experts(x.contiguous(), layer.w13_weight, layer.w2_weight, topk_weights, topk_ids)
    return StandardCombineInput(hidden_states=out)


moe_experts_forward_plugin.__name__ = "forward_plugin"

# SGLang class (dotted path) -> forward_plugin
FUSED_OP_FORWARDS = {
    "sglang.srt.layers.layernorm.RMSNorm": rmsnorm_forward_plugin,
    "sglang.srt.layers.rotary_embedding.base.RotaryEmbedding": rope_forward_plugin,
    "sglang.srt.layers.activation.SiluAndMul": silu_and_mul_forward_plugin,
    "sglang.srt.layers.moe.topk.TopK": topk_forward_plugin,
    "sglang.srt.layers.quantization.unquant.UnquantizedFusedMoEMethod": moe_experts_forward_plugin,
}


# ------------------------------------------------------------------------------------------------
# function hooks (HookRegistry AROUND / REPLACE); each is a no-op pass-through while inactive
# ------------------------------------------------------------------------------------------------

def linear_apply_hook(original, self, layer, x, bias=None):
    if not _STATE["active"]:
        return original(self, layer, x, bias)
    COUNTS["linear"] += 1
    shape = x.shape
    y = _ops().linear(x.reshape(-1, shape[-1]).contiguous(), layer.weight, bias)
    return y.view(*shape[:-1], y.shape[-1])


def lm_head_hook(original, self, hidden_states, lm_head, embedding_bias=None, **kwargs):
    if not _STATE["active"]:  # kwargs: ``out=`` in 0.5.2x, absent in 0.5.10
        return original(self, hidden_states, lm_head, embedding_bias, **kwargs)
    if hasattr(lm_head, "set_lora") or getattr(self, "use_fp32_lm_head", False):
        raise NotImplementedError("tik lm_head: LoRA-wrapped or fp32 lm_head is not supported")
    COUNTS["lm_head"] += 1
    return _ops().linear(hidden_states.contiguous(), lm_head.weight, embedding_bias)


def _last_dim_contiguous(x):
    return x if x.stride(-1) == 1 else x.contiguous()


def _adjacent_qk(q, k, head_dim):
    """q [T, Hq*D] and k [T, Hkv*D] as one [T, Hq + Hkv, D] view when k's columns directly follow q's
    in one buffer (SGLang's ``qkv.split``), else None."""
    import torch

    if q.dim() != 2 or k.dim() != 2 or q.shape[0] != k.shape[0] or q.dtype != k.dtype or q.device != k.device:
        return None
    if q.stride(1) != 1 or k.stride(1) != 1 or q.stride(0) != k.stride(0) or q.shape[1] % head_dim \
            or k.shape[1] % head_dim or q.untyped_storage().data_ptr() != k.untyped_storage().data_ptr() \
            or k.data_ptr() != q.data_ptr() + q.shape[1] * q.element_size() \
            or q.stride(0) < q.shape[1] + k.shape[1]:
        return None
    return torch.as_strided(q, (q.shape[0], (q.shape[1] + k.shape[1]) // head_dim, head_dim), (q.stride(0), head_dim, 1))


def qk_norm_hook(original, q, k, q_norm, k_norm, head_dim, *args, **kwargs):
    if not _STATE["active"]:
        return original(q, k, q_norm, k_norm, head_dim, *args, **kwargs)
    ops = _ops()
    qk = _adjacent_qk(q, k, head_dim) if q_norm.variance_epsilon == k_norm.variance_epsilon else None
    if qk is not None:  # one launch over the adjacent heads, read in place: the same bits as two norms
        COUNTS["qk_rms_norm"] += 1
        hq = q.shape[1] // head_dim
        y = ops.qk_rms_norm(qk, q_norm.weight, k_norm.weight, hq, q_norm.variance_epsilon)
        return y[:, :hq].reshape(q.shape), y[:, hq:].reshape(k.shape)
    COUNTS["rms_norm"] += 2
    qo = ops.rms_norm(q.reshape(-1, head_dim).contiguous(), q_norm.weight, q_norm.variance_epsilon)
    ko = ops.rms_norm(k.reshape(-1, head_dim).contiguous(), k_norm.weight, k_norm.variance_epsilon)
    return qo.view(q.shape), ko.view(k.shape)


def token_logprobs_rows(logits, tokens, temperatures):
    """``log_softmax(logits[i] / T_i)[tokens[i]]`` in fp32 through ``ops.token_logprobs``.

    ``temperatures``: a float, or an fp32 tensor with one value per row (the op divides row i by
    T_i exactly as it divides by a float T: the trainer's float and the sampler's per-row value agree
    bit for bit).
    """
    return _ops().token_logprobs(logits.contiguous(), tokens, temperature=temperatures)


def sampler_forward_hook(original, self, logits_output, sampling_info, return_logprob, *args, **kwargs):
    if not (_STATE["active"] and return_logprob):
        ids = original(self, logits_output, sampling_info, return_logprob, *args, **kwargs)
        _maybe_dump_stats()
        return ids
    import torch

    logits = logits_output.next_token_logits
    saved = logits.clone()  # SGLang divides / softmaxes the logits in place
    ids = original(self, logits_output, sampling_info, return_logprob, *args, **kwargs)
    if sampling_info.is_all_greedy:
        temps = 1.0
    else:  # per-row fp32 [B] (greedy rows carry 1.0, as in SGLang's own greedy log-prob)
        temps = sampling_info.temperatures.reshape(-1).to(torch.float32).contiguous()
    COUNTS["token_logprobs"] += 1
    logits_output.next_token_logprobs = token_logprobs_rows(saved, ids.to(saved.device), temps)
    _maybe_dump_stats()
    return ids


def request_seed(rid) -> int:
    """A per-request sampling seed derived from the request id (distinct per sample, reproducible
    for a given id; SGLang otherwise gives every seedless request seed 42 in deterministic mode)."""
    import hashlib

    return int.from_bytes(hashlib.blake2b(str(rid).encode(), digest_size=8).digest(), "little") >> 2


def sampling_info_hook(original, *args, **kwargs):
    if _STATE["active"]:
        batch = kwargs.get("batch", args[1] if len(args) > 1 else None)
        for req in getattr(batch, "reqs", None) or ():
            sp = req.sampling_params
            if sp.sampling_seed is None:
                sp.sampling_seed = request_seed(req.rid)
                COUNTS["seeded_requests"] += 1
    return original(*args, **kwargs)


def _tik_selected() -> bool:
    """Whether this SGLang process serves with the ``tik`` attention backend (usable before
    :func:`activate`, e.g. while the model is being built)."""
    if _STATE["active"]:
        return True
    try:
        from sglang.srt.runtime_context import attention_backends
    except ImportError:
        return False
    try:
        return "tik" in attention_backends()
    except (RuntimeError, ValueError):  # nothing published in this process (not a scheduler)
        return False


def dual_gemm_select_hook(original, self, *args, **kwargs):
    """SGLang's small-batch dual GEMM (a CuTe-DSL fused gate_up GEMM + SiLU, used by Qwen2/Qwen3 MLPs
    for decode on CUDA) bypasses ``ops.linear`` / ``ops.swiglu_fused``: off under tik. :func:`activate`
    refuses a model where a layer still has it on."""
    if _tik_selected():
        COUNTS["dual_gemm_off"] += 1
        return None
    return original(self, *args, **kwargs)


FUNCTION_HOOKS = {
    # target -> (hook, kind)
    "sglang.srt.layers.quantization.unquant.UnquantizedLinearMethod.apply": (linear_apply_hook, "around"),
    "sglang.srt.layers.logits_processor.LogitsProcessor._compute_lm_head": (lm_head_hook, "around"),
    "sglang.srt.models.utils.apply_qk_norm": (qk_norm_hook, "around"),
    "sglang.srt.layers.sampler.Sampler.forward": (sampler_forward_hook, "around"),
    "sglang.srt.sampling.sampling_batch_info.SamplingBatchInfo.from_schedule_batch": (sampling_info_hook, "around"),
    "sglang.srt.layers.dual_gemm.DualGemm._select_mode": (dual_gemm_select_hook, "around"),
}
# Targets that only some SGLang versions have (0.5.10 has no DualGemm): not having them is fine.
OPTIONAL_HOOK_TARGETS = {"sglang.srt.layers.dual_gemm.DualGemm._select_mode"}


# ------------------------------------------------------------------------------------------------
# activation (scheduler process, when the tik backend is built)
# ------------------------------------------------------------------------------------------------

def hf_default_inv_freq(base: float, rotary_dim: int):
    """Hugging Face's default RoPE ``inv_freq`` (computed on the CPU in fp32, as HF does)."""
    import torch

    return 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.int64).to(dtype=torch.float) / rotary_dim))


def _resolve(dotted):
    import pkgutil

    return pkgutil.resolve_name(dotted)


def _check_instance(cls_path, m):
    """Raise for configurations the unified ops do not implement."""
    name = cls_path.rsplit(".", 1)[1]
    bad = None
    if name == "RMSNorm":
        if m.variance_size_override is not None or m.fp32_residual or m.override_orig_dtype is not None \
                or not m.has_weight:
            bad = "variance_size_override / fp32_residual / override_orig_dtype / no weight"
    elif name == "RotaryEmbedding":
        if type(m).__name__ != "RotaryEmbedding" or not m.is_neox_style or m.rotary_dim != m.head_size:
            bad = f"{type(m).__name__} (neox={m.is_neox_style}, rotary_dim={m.rotary_dim}, head={m.head_size}); " \
                  "only the default NeoX RoPE over the full head is unified"
        else:
            m._tik_inv_freq = hf_default_inv_freq(float(m.base), m.rotary_dim).to(m.cos_sin_cache.device)
    elif name == "TopK":
        c = m.topk_config
        if c.use_grouped_topk or c.correction_bias is not None or c.custom_routing_function is not None \
                or getattr(c, "num_shared_topk_slots", 0) or getattr(c, "num_fused_shared_experts", 0) \
                or (c.routed_scaling_factor not in (None, 1.0)) \
                or getattr(m, "enable_waterfill", False) or c.scoring_func != "softmax":
            bad = "grouped / biased / custom / scaled / shared-slot / non-softmax routing"
    elif name == "UnquantizedFusedMoEMethod":
        rc = getattr(m, "moe_runner_config", None)
        if rc is not None and (rc.activation not in (None, "silu") or rc.apply_router_weight_on_input
                               or rc.routed_scaling_factor not in (None, 1.0)
                               or getattr(rc, "gemm1_alpha", None) is not None):
            bad = f"activation={rc.activation} / router weight on input / routed scaling / gemm1_alpha"
        if getattr(m, "w13_swiglu_interleaved", False) or getattr(m, "load_up_proj_weight_first", False):
            bad = "interleaved or up-first w13 layout"
    if bad:
        raise NotImplementedError(f"tik: {name} with {bad} is not supported by the unified ops")


# layer classes (by name, any SGLang version) that must be pinned to ours once tik is active
_ROUTED_NAMES = {"RMSNorm", "RotaryEmbedding", "SiluAndMul", "TopK", "UnquantizedFusedMoEMethod"}


def _hooked(target: str) -> bool:
    try:
        f = _resolve(target)
    except (ImportError, AttributeError):
        return False
    f = getattr(f, "__func__", f)
    return getattr(f, "__wrapped__", None) is not None


def _exists(target: str) -> bool:
    try:
        _resolve(target)
    except (ImportError, AttributeError):
        return False
    return True


def _is_pinned(m) -> bool:
    fm = m.__dict__.get("_forward_method")
    return getattr(fm, "__func__", None) is not None and getattr(fm.__func__, "__name__", "") == "forward_plugin"


def emulate_fused_kv_buffer() -> int:
    """Test hook, on when ``TIK_SGLANG_EMULATE_FUSED_KV=1``: SGLang's models take their CUDA-only fused
    RoPE + set_kv_buffer path (``FusedSetKVBufferArg`` to RoPE, ``save_kv_cache=False`` to attention)
    on any device, so the CPU engine tests run the path a CUDA bf16 pool takes (Qwen3-MoE). Patches
    ``enable_fused_set_kv_buffer`` in every imported ``sglang.srt.models`` module; returns how many."""
    import sys

    n = 0
    for name, mod in list(sys.modules.items()):
        if name.startswith("sglang.srt.models.") and hasattr(mod, "enable_fused_set_kv_buffer"):
            mod.enable_fused_set_kv_buffer = lambda forward_batch: True
            n += 1
    COUNTS["emulated_fused_kv_modules"] = n
    return n


def activate(model_runner) -> dict:
    """Route the live model's layer ops to ours (called by the ``tik`` backend factory).

    Returns a summary {class name: instances pinned}.
    """
    import torch

    ops = _ops()
    missing = [n for n in REQUIRED_OPS if not hasattr(ops, n)]
    if missing:
        raise ImportError(f"tik SGLang backend: areal_tik_plugin.ops lacks {missing}; install a build that has them")
    from sglang.srt.layers.quantization.unquant import UnquantizedLinearMethod

    try:
        from sglang.kernels.fused_op import KernelBackend, get_fused_op_backend
    except ImportError:  # SGLang without BaseFusedOp (<= 0.5.10): instance pinning only
        KernelBackend, get_fused_op_backend = None, lambda: None
    if get_fused_op_backend() is not None:
        raise RuntimeError(f"tik: SGLANG_FORCE_FUSED_OP_BACKEND={get_fused_op_backend()} conflicts with the tik backend")
    sa = getattr(model_runner, "server_args", None)
    tp = getattr(model_runner, "tp_size", None) or getattr(sa, "tp_size", 1) or 1
    if tp != 1:
        raise NotImplementedError(f"tik: tensor parallel size {tp} splits GEMM reductions (not bitwise vs training); "
                                  "use tp_size=1 with data parallelism")
    if os.environ.get("TIK_SGLANG_EMULATE_FUSED_KV") == "1":
        emulate_fused_kv_buffer()
    if sa is not None and getattr(sa, "enable_torch_compile", False):
        raise NotImplementedError("tik: --enable-torch-compile swaps fused ops to forward_native; disable it")
    model = model_runner.model
    dtype = next(model.parameters()).dtype
    if dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"tik: model dtype must be bfloat16 or float16 (the unified kernels' dtypes), got {dtype}")

    classes = {}
    for path, fn in FUSED_OP_FORWARDS.items():
        try:
            cls = _resolve(path)
        except (ImportError, AttributeError):
            continue
        classes[path] = (cls, fn)
        if KernelBackend is not None:
            if getattr(cls, "forward_plugin", None) is None or "forward_plugin" not in cls.__dict__:
                cls.forward_plugin = fn  # SGLang without the plugin loader ran (launcher path)
            caps = dict(cls.capabilities)
            caps[KernelBackend.PLUGIN] = frozenset()
            cls.capabilities = caps
    pinned = collections.Counter()
    for mod in model.modules():
        for path, (cls, fn) in classes.items():
            if isinstance(mod, cls):
                _check_instance(path, mod)
                mod._forward_method = types.MethodType(cls.__dict__.get("forward_plugin", fn), mod)
                pinned[cls.__name__] += 1
        qm = getattr(mod, "quant_method", None)
        if qm is not None and hasattr(mod, "weight") and not isinstance(qm, UnquantizedLinearMethod) \
                and type(qm).__name__ not in ("UnquantizedEmbeddingMethod", "UnquantizedFusedMoEMethod"):
            raise NotImplementedError(f"tik: quantized layer {type(mod).__name__} ({type(qm).__name__}) is not supported")
    not_hooked = [t for t in FUNCTION_HOOKS if not _hooked(t) and not (t in OPTIONAL_HOOK_TARGETS and not _exists(t))]
    if not_hooked:
        raise RuntimeError(f"tik: hooks not applied to {not_hooked} (is the plugin registered in this process? "
                           "SGLang without plugins: use python -m areal_tik_plugin.integrations.sglang.launch)")
    fused_mlp = sorted({type(m).__name__ for m in model.modules()
                        if getattr(getattr(m, "dual_gemm", None), "mode", None) is not None})
    if fused_mlp:
        raise NotImplementedError(f"tik: SGLang's dual GEMM (fused gate_up + SiLU) is on in {fused_mlp}")
    unrouted = sorted({type(m).__name__ for m in model.modules()
                       if type(m).__name__ in _ROUTED_NAMES and not _is_pinned(m)})
    if unrouted:  # e.g. an SGLang version that moved a class: refuse rather than run SGLang's kernel
        raise NotImplementedError(f"tik: these layer ops would not run through areal_tik_plugin.ops: {unrouted}")
    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        raise RuntimeError("tik on a machine without CUDA: start SGLang with TRITON_INTERPRET=1 in the environment "
                           "(it must be set before Triton is imported; `tik sglang-check` does this)")
    _STATE.update(active=True, tp_size=tp, stats_dir=os.environ.get("TIK_SGLANG_STATS") or None)
    if _STATE["stats_dir"]:
        try:
            from sglang.kernels.fused_op import enable_fused_op_trace

            enable_fused_op_trace()
            _STATE["trace"] = True
        except ImportError:
            pass
    logger.info("tik: layer ops routed to areal_tik_plugin.ops: %s", dict(pinned))
    COUNTS.update({f"pinned:{k}": v for k, v in pinned.items()})
    return dict(pinned)


def _consume_trace() -> None:
    """Count SGLang's new fused-op trace records into _TRACE as ``op|backend`` and clear its list (which
    otherwise grows by every fused-op call: a reader re-counting all of it each step is quadratic)."""
    if _STATE["trace"]:
        from sglang.kernels.fused_op import clear_fused_op_trace, get_fused_op_trace

        new = get_fused_op_trace()
        clear_fused_op_trace()
        _TRACE.update(f"{r.op}|{r.backend}" for r in new)


def stats() -> dict:
    """This process's op counters and SGLang's fused-op trace aggregated as ``op|backend`` counts."""
    _consume_trace()
    return {"pid": os.getpid(), "active": _STATE["active"], "counts": dict(COUNTS),
            "fused_op_trace": dict(_TRACE) if _STATE["trace"] else {}}


def _maybe_dump_stats(force: bool = False):
    """Write this process's stats file (``TIK_SGLANG_STATS``): at once when an op counter or an
    ``op|backend`` pair of the fused-op trace is new since the last file (so every op and every backend that
    ran is in it), otherwise at most every STATS_INTERVAL_S seconds (the counts may lag by that much)."""
    d = _STATE["stats_dir"]
    if not d:
        return
    _consume_trace()
    now = time.monotonic()
    keys = (len(COUNTS), len(_TRACE))
    if not force and now - _STATE["last_dump"] < STATS_INTERVAL_S and _STATE["dumped_keys"] == keys:
        return
    _STATE["last_dump"], _STATE["dumped_keys"] = now, keys
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, f"stats-{os.getpid()}.json")
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(stats(), f)
    os.replace(tmp, path)
