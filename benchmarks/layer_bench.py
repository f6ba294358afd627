"""Layer-level phase-time benchmark (the paper's Q2 / Fig. 9) on one GPU.

    python -m benchmarks.layer_bench --out DIR [--quick] [--models qwen3-4b,qwen3-8b,qwen3-30b-a3b]

For one transformer layer of each model (random bf16 weights, batch 1, 1K-token prompt) and each
response length R in 128 / 1K / 4K / 8K, the time of one RL step's work on that layer:

Both stacks run the rollout steps (prefill, decode) with SGLang's weight layout: one fused QKV and
one fused gate_up weight per layer (:func:`~areal_tik_plugin.integrations.transformers.rollout_weights`).

* **plugin stack** (what the plugin lets AReaL run): rollout prefill of the prompt
  (``ops.attention_extend`` over a paged KV cache + the layer ops of
  :func:`~areal_tik_plugin.verify.layer_step` in SGLang's residual convention: the residual add of the
  layer input fused into its RMSNorm), token-wise decode of the R
  response tokens (``ops.attention_decode``; the per-token step is CUDA-graph replayed), and the
  policy-update forward + backward over the 1K+R tokens (the tik-patched HF layer, packed varlen).
  The rollout log-probs are reused: no recompute forward.
* **baseline stack** (the stack a real user runs): the rollout as SGLang runs it with its flashinfer
  attention backend and sgl-kernel's fused ops (:class:`RolloutStack`): FlashInfer fused add+RMSNorm,
  per-head RMSNorm, RoPE from the fp32 cos/sin cache (in place), SiLU-and-mul; cuBLAS on the fused
  weights; K/V written to the paged pool (page size 1) by index; prefill = FlashInfer's ragged causal
  prefill (the faster of FA3 / FA2 and cuDNN / flash SDPA, per batch); decode = FlashInfer's paged
  decode wrapper in CUDA-graph mode (the faster of tensor cores on / off per context), graph replayed
  like ours. Without FlashInfer the same layer runs on torch / HF modules with SDPA (per sequence;
  decode per request over K/V gathered from the pool, SGLang's torch_native backend), every choice
  recorded by name in ``notes["baseline_rollout"]``. Update = AReaL's FSDP actor step on the HF layer
  with Liger-Kernel's RMSNorm / SwiGLU / RoPE where importable and the faster SDPA backend (cuDNN /
  flash) forward + backward, **plus the recompute forward** (no-grad) over the tokens.

Batches: 1 (one 1K-token prompt) and rollout-sized batches of mixed prompt lengths (``--batches``,
default 1,32,64; prompts uniform in [256, 1792]); a batch's update is each request's update interpolated
from the batch-1 update times (the same rule for both stacks; recorded as ``update_method``).

Decode is measured at a few context lengths per stack and integrated over the R steps (piecewise
linear in the context length). Every time comes from :func:`areal_tik_plugin.bench.time_both`
(cold-L2 ``do_bench`` median and warm CUDA-graph replay); a phase uses graph replay for both
stacks when both could be captured, cold otherwise (recorded per phase). Output: one JSON under
``--out`` with per-phase times, totals and ratios (baseline / plugin), plus a printed table.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
import traceback
from typing import Any

PROMPT = 1024
DECODES = (128, 1024, 4096, 8192)
MODELS = ("qwen3-4b", "qwen3-8b", "qwen3-30b-a3b")
CTX_POINTS = (1, 64, 128, 512, 1024, 2048, 4096, 6144, 8192)  # decode context = PROMPT + point
CTX_POINTS_QUICK = (1, 128, 1024, 4096, 8192)


def _sdpa_backends():
    from torch.nn.attention import SDPBackend

    return [("cudnn", [SDPBackend.CUDNN_ATTENTION]),
            ("flash", [SDPBackend.FLASH_ATTENTION]),
            ("default", [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                         SDPBackend.MATH])]


def _with_backend(fn, backends):
    from torch.nn.attention import sdpa_kernel

    def run():
        with sdpa_kernel(backends):
            return fn()

    return run


def _sync():
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _first_working(make, tag, notes):
    """``make(backends)`` -> fn; the first SDPA backend whose fn runs (cuDNN first)."""
    last = None
    for name, bk in _sdpa_backends():
        fn = make(bk)
        try:
            fn()
            _sync()
            notes.setdefault("attn_backend", {})[tag] = name
            return fn
        except Exception as e:  # record and try the next backend
            last = e
            notes.setdefault("attn_backend_errors", {})[f"{tag}:{name}"] = f"{type(e).__name__}: {e}"[:200]
    raise RuntimeError(f"{tag}: no SDPA backend ran ({last})")


def build_layer(name: str, dtype=None, device="cuda"):
    """(config, HF decoder layer with random weights, HF rotary embedding, modeling module)."""
    import torch

    from areal_tik_plugin.integrations import transformers as T
    from areal_tik_plugin.verify import _hf_config

    dtype = dtype or torch.bfloat16
    cfg, _ = _hf_config(name, 1)
    cfg._attn_implementation = "sdpa"
    notes = {}
    if getattr(cfg, "num_experts", None):
        try:
            from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

            if "grouped_mm" in ALL_EXPERTS_FUNCTIONS._global_mapping:
                cfg._experts_implementation = "grouped_mm"
        except Exception as e:
            notes["experts_impl_error"] = str(e)[:200]
        notes["experts_implementation"] = getattr(cfg, "_experts_implementation", None) or "eager"
    mod, prefix, _ = T._family(cfg.model_type)
    torch.manual_seed(0)
    with torch.device(device):
        layer = getattr(mod, f"{prefix}DecoderLayer")(cfg, 0).to(dtype)
        rotary = getattr(mod, f"{prefix}RotaryEmbedding")(cfg)
    with torch.no_grad():
        for pname, p in layer.named_parameters():
            if "norm" in pname:
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02)
    return cfg, layer, rotary, mod, notes


def _time(fn, *, graph: bool, errors: list, tag: str):
    from areal_tik_plugin import bench

    try:
        fn()
        _sync()
        return bench.time_both(fn, graph=graph)
    except Exception as e:
        errors.append(f"{tag}: {type(e).__name__}: {e}"[:300])
        return None


def _profile(fn, top: int = 15) -> list[dict[str, Any]]:
    """The ``top`` kernels / ops of one warm call of ``fn`` by self device time (CPU time without a GPU),
    from torch.profiler: where a phase's time goes (e.g. the plugin's prefill, by kernel)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    fn()
    _sync()
    with profile(activities=acts) as prof:
        fn()
        _sync()
    rows = []
    for e in prof.key_averages():
        dev = getattr(e, "self_device_time_total", None)
        if dev is None:
            dev = getattr(e, "self_cuda_time_total", 0)
        rows.append({"name": e.key[:160], "count": e.count, "self_device_us": float(dev or 0.0),
                     "self_cpu_us": float(e.self_cpu_time_total)})
    key = "self_device_us" if any(r["self_device_us"] for r in rows) else "self_cpu_us"
    rows.sort(key=lambda r: -r[key])
    return rows[:top]


def _pick(a: dict | None, b: dict | None) -> tuple[float | None, float | None, str]:
    """Same method for both stacks: graph replay when both have it, else cold."""
    if a is None or b is None:
        return None, None, "missing"
    if a.get("graph_us") and b.get("graph_us"):
        return a["graph_us"], b["graph_us"], "graph"
    return a["cold_us"], b["cold_us"], "cold"


def _decode_total(points: dict[int, float], R: int, prompt: int = PROMPT) -> float:
    """Sum of per-token step times for contexts prompt+1 .. prompt+R (piecewise linear)."""
    xs = sorted(points)
    total = 0.0
    for c in range(prompt + 1, prompt + R + 1):
        if c <= xs[0]:
            total += points[xs[0]]
            continue
        if c >= xs[-1]:
            total += points[xs[-1]]
            continue
        j = next(i for i in range(1, len(xs)) if xs[i] >= c)
        x0, x1 = xs[j - 1], xs[j]
        total += points[x0] + (points[x1] - points[x0]) * (c - x0) / (x1 - x0)
    return total


def _median_time(samples: list) -> dict | None:
    """Per key, the median of the timings that exist (None when there are none)."""
    samples = [t for t in samples if t]
    if not samples:
        return None
    out = {}
    for key in samples[0]:
        v = sorted(t[key] for t in samples if t.get(key) is not None)
        out[key] = v[len(v) // 2] if v else None
    return out


def _probe_decode_knobs(step, knobs, errors) -> list[dict[str, Any]]:
    """Re-time the plugin decode step (graph replay, last sampled context) with other free decode
    knobs ``(DECODE_WARPS, DECODE_STAGES)`` of the attention implementation; each output is compared
    bit for bit with the default knobs' (free knobs must not move a bit)."""
    import torch

    from areal_tik_plugin.runtime import loader
    from areal_tik_plugin.contract.suite import bits

    att = loader.current_module("attention")
    default = (att.DECODE_WARPS, att.DECODE_STAGES)
    ref = bits(step()).clone()
    rows = []
    try:
        for w, st in [default] + [k for k in knobs if k != default]:
            att.DECODE_WARPS, att.DECODE_STAGES = w, st
            same = bool(torch.equal(bits(step()), ref))
            rows.append({"warps": w, "stages": st, "same_bits": same,
                         "time": _time(step, graph=True, errors=errors, tag=f"plugin.decode[w{w},s{st}]")})
    finally:
        att.DECODE_WARPS, att.DECODE_STAGES = default
    return rows


def _probe_pdl(step, errors, repeat: int = 3) -> dict[str, Any]:
    """Re-time the plugin decode step (graph replay) with programmatic dependent launch off and on (the
    free knob ``_rowops.PDL``), alternating ``repeat`` times, medians; the outputs are compared bit for bit."""
    import torch

    from areal_tik_plugin.runtime import loader
    from areal_tik_plugin.contract.suite import bits

    ro = loader.current_module("_rowops")
    default = ro.PDL
    ref = bits(step()).clone()
    samples: dict[str, list] = {"on": [], "off": []}
    same = True
    try:
        for _ in range(repeat):
            for key, val in (("off", False), ("on", True)):
                ro.PDL = val
                same = same and bool(torch.equal(bits(step()), ref))
                samples[key].append(_time(step, graph=True, errors=errors, tag=f"plugin.decode[pdl {key}]"))
    finally:
        ro.PDL = default
    on, off = _median_time(samples["on"]), _median_time(samples["off"])
    out = {"default": default, "on": on, "off": off, "same_bits": same, "samples": samples}
    if on and off and on.get("graph_us") and off.get("graph_us"):
        out["speedup_graph"] = off["graph_us"] / on["graph_us"]
    return out


# ---------------------------------------------------------------------------------------------------
# the baseline stack: SGLang-like rollout (FlashInfer where importable, else torch / cuDNN, by name) and
# AReaL's FSDP update (HF layer + the faster SDPA backend + Liger's kernels where importable)
# ---------------------------------------------------------------------------------------------------
class RolloutStack:
    """The ops SGLang's flashinfer attention backend + sgl-kernel fused ops run for one Qwen3 layer, each
    from FlashInfer when importable; without it the same layer in torch (HF modules, cuDNN SDPA), the
    names recorded in ``names``."""

    def __init__(self, base, mod, fw, *, device, use_flashinfer: bool = True):
        import torch

        from areal_tik_plugin.contract import baselines as B

        self.base, self.mod, self.fw = base, mod, fw
        attn = base.self_attn
        self.Hq, self.Hkv = attn.config.num_attention_heads, attn.config.num_key_value_heads
        self.D = attn.head_dim
        self.eps = base.input_layernorm.variance_epsilon
        self.fi, self.why_not_fi = None, None
        if use_flashinfer:
            try:
                self.fi = B.flashinfer("rowops")
            except B.Unavailable as e:
                self.why_not_fi = str(e)
        else:
            self.why_not_fi = "switched off for this run"
        self.dense = fw["gate_up"] is not None
        self.names = {
            "norms": "flashinfer.norm.fused_add_rmsnorm / rmsnorm" if self.fi else "transformers Qwen3RMSNorm (torch)",
            "rope": ("flashinfer.rope.apply_rope_with_cos_sin_cache_inplace (fp32 cos/sin cache)" if self.fi
                     else "transformers apply_rotary_pos_emb (torch)"),
            "act": ("flashinfer.activation.silu_and_mul" if self.fi else "torch silu(gate) * up") if self.dense
            else "transformers Qwen3MoeSparseMoeBlock grouped_mm experts (SGLang's fused_moe Triton kernel not carried)",
            "linear": "torch.nn.functional.linear (cuBLAS) on the fused qkv / gate_up weights",
            "kv_write": "torch index_put (SGLang's set_kv_buffer: k_buffer[loc] = k)",
        }
        if self.why_not_fi:
            self.names["flashinfer"] = self.why_not_fi
        self.cache = None
        self._torch = torch

    def set_rope_cache(self, inv, max_pos, device):
        torch = self._torch
        f = torch.arange(max_pos, device=device, dtype=torch.float32)[:, None] * inv[None, :].float()
        self.cache = torch.cat([f.cos(), f.sin()], -1).contiguous()

    def layer(self, h, residual, pos, cos_sin, attend):
        """SGLang's layer convention: (h, residual) in (residual added inside the input norm), returns
        (mlp_out, residual); ``attend(q, k, v)`` writes the new K/V to the pool and attends."""
        F = self._torch.nn.functional
        base, fw, fi = self.base, self.fw, self.fi
        attn = base.self_attn
        n = h.shape[0]
        nq, nk = fw["q_size"], fw["kv_size"]
        if fi:
            fi.norm.fused_add_rmsnorm(h, residual, base.input_layernorm.weight, self.eps)
            x = h
        else:
            residual = h + residual
            x = base.input_layernorm(residual)
        qkv = F.linear(x, fw["qkv"], fw["qkv_bias"])
        q, k, v = qkv.split([nq, nk, nk], dim=-1)
        if getattr(attn, "q_norm", None) is not None:
            if fi:
                q = fi.norm.rmsnorm(q.reshape(-1, self.D), attn.q_norm.weight, self.eps).view(n, nq)
                k = fi.norm.rmsnorm(k.reshape(-1, self.D), attn.k_norm.weight, self.eps).view(n, nk)
            else:
                q = attn.q_norm(q.reshape(n, self.Hq, self.D)).reshape(n, nq)
                k = attn.k_norm(k.reshape(n, self.Hkv, self.D)).reshape(n, nk)
        else:
            q, k = q.contiguous(), k.contiguous()
        if fi:
            fi.rope.apply_rope_with_cos_sin_cache_inplace(pos, q, k, self.D, self.cache, is_neox=True)
        else:
            cos, sin = cos_sin
            qh, kh = q.view(1, n, self.Hq, self.D).transpose(1, 2), k.view(1, n, self.Hkv, self.D).transpose(1, 2)
            qh, kh = self.mod.apply_rotary_pos_emb(qh, kh, cos, sin)
            q, k = qh.transpose(1, 2).reshape(n, nq), kh.transpose(1, 2).reshape(n, nk)
        o = attend(q.view(n, self.Hq, self.D), k.view(n, self.Hkv, self.D), v.reshape(n, self.Hkv, self.D))
        o = F.linear(o.reshape(n, nq), attn.o_proj.weight)
        if fi:
            fi.norm.fused_add_rmsnorm(o, residual, base.post_attention_layernorm.weight, self.eps)
            x = o
        else:
            residual = o + residual
            x = base.post_attention_layernorm(residual)
        if self.dense:
            gu = F.linear(x, fw["gate_up"])
            a = fi.activation.silu_and_mul(gu) if fi else (lambda g, u: base.mlp.act_fn(g) * u)(*gu.chunk(2, -1))
            m = F.linear(a, base.mlp.down_proj.weight)
        else:
            m = base.mlp(x[None])
            m = (m[0] if isinstance(m, tuple) else m)[0]
        return m, residual


def _fi_prefill_attend(fi, backend, cu, Hq, Hkv, D, kpool, vpool, loc, scale):
    """SGLang's extend without a cached prefix: K/V written to the pool, ragged causal prefill over the
    new tokens (FlashInfer ``backend``), planned once outside the timed call."""
    import torch

    from areal_tik_plugin.contract.attention import _fi_ws

    w = fi.BatchPrefillWithRaggedKVCacheWrapper(_fi_ws(), "NHD", backend=backend)
    w.plan(cu, cu, Hq, Hkv, D, causal=True, sm_scale=scale, q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)

    def attend(q, k, v):
        kpool[loc] = k
        vpool[loc] = v
        return w.run(q, k, v)

    return attend


def _sdpa_prefill_attend(lens, kpool, vpool, loc, scale, backends):
    """The fallback: K/V written to the pool, per-sequence causal SDPA (``backends``) over the new tokens."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel

    offs = [0]
    for n in lens:
        offs.append(offs[-1] + n)

    def attend(q, k, v):
        kpool[loc] = k
        vpool[loc] = v
        outs = []
        with sdpa_kernel(backends):
            for a, b in zip(offs[:-1], offs[1:]):
                qs, ks, vs = (t[a:b].transpose(0, 1)[None] for t in (q, k, v))
                outs.append(F.scaled_dot_product_attention(qs, ks, vs, scale=scale, is_causal=True,
                                                           enable_gqa=True)[0].transpose(0, 1))
        return torch.cat(outs) if len(outs) > 1 else outs[0]

    return attend


def _fi_decode_attend(fi, tensor_cores, ctx, table, Hq, Hkv, D, kpool, vpool, loc, scale):
    """SGLang's decode step: K/V of the new token written to the pool (page size 1), FlashInfer's paged
    decode wrapper in CUDA-graph mode over each request's ``ctx`` slots (planned outside the graph, as
    SGLang plans on the host before each replay)."""
    import torch

    from areal_tik_plugin.contract.attention import _fi_ws

    dev = kpool.device
    indptr = torch.zeros(len(ctx) + 1, dtype=torch.int32)
    indptr[1:] = torch.cumsum(torch.tensor(ctx), 0)
    indices = torch.cat([table[b, :c].cpu() for b, c in enumerate(ctx)]).to(torch.int32)
    indptr, indices = indptr.to(dev), indices.to(dev)
    last = torch.ones(len(ctx), dtype=torch.int32, device=dev)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(
        _fi_ws(), "NHD", use_cuda_graph=True, use_tensor_cores=tensor_cores, paged_kv_indptr_buffer=indptr,
        paged_kv_indices_buffer=indices, paged_kv_last_page_len_buffer=last)
    w.plan(indptr, indices, last, Hq, Hkv, D, 1, sm_scale=scale, q_data_type=torch.bfloat16,
           kv_data_type=torch.bfloat16)
    kc, vc = kpool.view(-1, 1, Hkv, D), vpool.view(-1, 1, Hkv, D)
    out = torch.empty(len(ctx), Hq, D, device=dev, dtype=torch.bfloat16)

    def attend(q, k, v):
        kpool[loc] = k
        vpool[loc] = v
        return w.run(q, (kc, vc), out=out)

    return attend


def _gather_decode_attend(ctx, table, kpool, vpool, loc, scale, backends):
    """The fallback decode step for a batch (SGLang's torch_native attention backend): K/V of the new
    tokens written to the pool, then per request SDPA over its K/V gathered by slot index."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel

    idx = [table[b, :c].to(torch.int64) for b, c in enumerate(ctx)]

    def attend(q, k, v):
        kpool[loc] = k
        vpool[loc] = v
        outs = []
        with sdpa_kernel(backends):
            for b, ix in enumerate(idx):
                kb, vb = kpool[ix].transpose(0, 1)[None], vpool[ix].transpose(0, 1)[None]
                outs.append(F.scaled_dot_product_attention(q[b:b + 1].transpose(0, 1)[None], kb, vb, scale=scale,
                                                           enable_gqa=True)[0].transpose(0, 1))
        return torch.cat(outs)

    return attend


def _liger_layer(base, mod, notes):
    """A copy of the HF layer with Liger-Kernel's modules where AReaL's Liger option puts them (RMSNorms,
    SwiGLU MLP) and Liger's RoPE (returned, patched into the modeling module around each call); the
    unchanged copy and None when Liger is not importable (recorded)."""
    from areal_tik_plugin.contract import baselines as B

    layer = copy.deepcopy(base)
    try:
        B.liger()
        from liger_kernel.transformers.rms_norm import LigerRMSNorm
        from liger_kernel.transformers.rope import liger_rotary_pos_emb
        from liger_kernel.transformers.swiglu import LigerSwiGLUMLP
    except Exception as e:
        notes["update_liger"] = f"not used: {type(e).__name__}: {e}"[:240]
        return layer, None

    def swap(parent, name):
        m = getattr(parent, name, None)
        if m is None:
            return
        new = LigerRMSNorm(m.weight.shape[0], eps=m.variance_epsilon).to(m.weight.device, m.weight.dtype)
        new.weight.data.copy_(m.weight.data)
        setattr(parent, name, new)

    swap(layer, "input_layernorm")
    swap(layer, "post_attention_layernorm")
    swap(layer.self_attn, "q_norm")
    swap(layer.self_attn, "k_norm")
    if hasattr(layer.mlp, "gate_proj"):
        new = LigerSwiGLUMLP(base.self_attn.config).to(layer.mlp.gate_proj.weight.device, layer.mlp.gate_proj.weight.dtype)
        new.load_state_dict(layer.mlp.state_dict())
        layer.mlp = new
    notes["update_liger"] = "liger_kernel LigerRMSNorm + LigerSwiGLUMLP (dense) + liger_rotary_pos_emb"
    return layer, liger_rotary_pos_emb


def _patched_rope(mod, rope_fn, fn):
    """``fn`` with the modeling module's apply_rotary_pos_emb replaced by ``rope_fn`` during the call."""
    if rope_fn is None:
        return fn

    def run():
        saved = mod.apply_rotary_pos_emb
        mod.apply_rotary_pos_emb = rope_fn
        try:
            return fn()
        finally:
            mod.apply_rotary_pos_emb = saved

    return run


def _best_timed(cands: dict, *, graph, errors, tag, notes, key):
    """Time every candidate ``{name: fn}`` (skipping the ones that raise); ``(name, timing)`` of the fastest
    by graph time when all have it, else cold; every timing recorded in ``notes[key]``."""
    got = {}
    for name, fn in cands.items():
        t = _time(fn, graph=graph, errors=errors, tag=f"{tag}[{name}]")
        if t:
            got[name] = t
    notes.setdefault(key, {})[tag] = {n: {k: v for k, v in t.items() if k in ("cold_us", "graph_us")}
                                      for n, t in got.items()}
    if not got:
        return None, None
    m = "graph_us" if graph and all(t.get("graph_us") for t in got.values()) else "cold_us"
    name = min(got, key=lambda n: got[n][m])
    return name, got[name]


def _interp(points: dict, x: float) -> float | None:
    """Piecewise-linear value at ``x`` from ``{x_i: y_i}`` (linear extrapolation past the ends)."""
    xs = sorted(points)
    if not xs:
        return None
    if len(xs) == 1:
        return points[xs[0]] * x / xs[0]
    j = next((i for i in range(1, len(xs)) if xs[i] >= x), len(xs) - 1)
    x0, x1 = xs[j - 1], xs[j]
    return points[x0] + (points[x1] - points[x0]) * (x - x0) / (x1 - x0)


def mixed_prompts(batch: int, mean: int, seed: int = 0) -> list[int]:
    """Rollout-sized batch: ``batch`` prompt lengths uniform in [mean/4, 7 mean/4] (mean ``mean``)."""
    import random

    if batch < 1 or mean < 4:
        raise ValueError(f"mixed_prompts: expected batch >= 1 and mean >= 4, got {batch}, {mean}")
    rng = random.Random(seed)
    return [rng.randint(mean // 4, 7 * mean // 4) for _ in range(batch)]


def bench_model(name: str, quick: bool, decodes=DECODES, *, prompt: int = PROMPT, device: str = "cuda",
                ctx_points=None, profile: bool = False, decode_knobs=(), repeat: int = 1,
                pdl_probe: bool = False, batches=(1,), use_flashinfer: bool = True) -> dict[str, Any]:
    """Every phase of one model's layer for each batch size in ``batches`` (1: one ``prompt``-token
    request; B > 1: B requests of mixed prompt lengths, mean ``prompt``). ``prompt``/``device``/
    ``ctx_points`` exist for CPU smoke tests; ``profile``, ``decode_knobs``, ``pdl_probe`` apply to batch
    1 (see :func:`_probe_decode_knobs`, :func:`_probe_pdl`); ``repeat``: decode steps timed that many
    times per context, the stacks alternating, medians used."""
    import torch

    from areal_tik_plugin import ops
    from areal_tik_plugin.integrations import transformers as T
    from areal_tik_plugin.verify import layer_step

    dev = torch.device(device)
    dt = torch.bfloat16
    cfg, base, rotary, mod, notes = build_layer(name, dt, dev)
    plug = T.apply_to_module(copy.deepcopy(base), cfg.model_type)
    errors: list[str] = []
    H = cfg.hidden_size
    attn = base.self_attn
    Hq, Hkv, D = cfg.num_attention_heads, cfg.num_key_value_heads, attn.head_dim
    inv, sc = T.rope_params(rotary, dev)
    fw = T.rollout_weights(base, dt)
    stack = RolloutStack(base, mod, fw, device=dev, use_flashinfer=use_flashinfer and dev.type == "cuda")
    notes["baseline_rollout"] = stack.names
    out: dict[str, Any] = {"model": name, "config": {k: getattr(cfg, k, None) for k in (
        "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
        "num_experts", "num_experts_per_tok", "moe_intermediate_size")}, "notes": notes, "errors": errors}
    from torch.nn.attention import SDPBackend

    sdpa = {"cudnn": [SDPBackend.CUDNN_ATTENTION], "flash": [SDPBackend.FLASH_ATTENTION]}
    if dev.type != "cuda":
        sdpa = {"default": [SDPBackend.MATH, SDPBackend.EFFICIENT_ATTENTION]}
    upd_points: dict[str, dict[int, float]] = {"plugin": {}, "baseline": {}}  # L -> update phase us (batch 1)
    out["batches"] = []
    for Bn in batches:
        lens = [prompt] if Bn == 1 else mixed_prompts(Bn, prompt)
        rec = _bench_rollout(Bn, lens, decodes, quick, ctx_points, profile and Bn == 1,
                             decode_knobs if Bn == 1 else (), repeat, pdl_probe and Bn == 1, locals_=dict(
                                 plug=plug, stack=stack, inv=inv, sc=sc, rotary=rotary, Hq=Hq, Hkv=Hkv, D=D, H=H,
                                 dev=dev, dt=dt, ops=ops, layer_step=layer_step, attn=attn, sdpa=sdpa, notes=notes,
                                 errors=errors))
        if Bn == 1:
            out.update({k: rec[k] for k in rec if k != "rollout"})
            upd = _bench_update(cfg, base, plug, mod, rotary, inv, sc, lens[0], decodes, dev, dt, sdpa, notes, errors)
            out["update"] = upd
            for row in upd:
                if row.get("plugin_us") is not None:
                    upd_points["plugin"][row["L"]] = row["plugin_us"]
                    upd_points["baseline"][row["L"]] = row["baseline_us"]
        out["batches"].append({"batch": Bn, "prompt_lens": lens, **rec["rollout"]})
    out["results"] = _totals(out, decodes, upd_points, errors)
    return out


def _bench_rollout(Bn, lens, decodes, quick, ctx_points, profile, decode_knobs, repeat, pdl_probe, locals_):
    """Prefill of the ``lens`` prompts and decode steps at sampled contexts, both stacks."""
    import torch

    v = locals_
    plug, stack, dev, dt, ops, layer_step = v["plug"], v["stack"], v["dev"], v["dt"], v["ops"], v["layer_step"]
    Hq, Hkv, D, H, notes, errors, sdpa = v["Hq"], v["Hkv"], v["D"], v["H"], v["notes"], v["errors"], v["sdpa"]
    inv, sc, rotary, attn = v["inv"], v["sc"], v["rotary"], v["attn"]
    scale = attn.scaling
    g = torch.Generator(device="cpu").manual_seed(1)
    max_len = max(lens) + max(decodes)
    slots = sum(n + max(decodes) for n in lens) + 1  # slot 0 reserved (SGLang)
    perm = (torch.randperm(slots - 1, generator=g) + 1).to(torch.int32)
    table_cpu = torch.zeros(Bn, max_len, dtype=torch.int32)
    o = 0
    for b, n in enumerate(lens):
        w = n + max(decodes)
        table_cpu[b, :w] = perm[o:o + w]
        o += w
    table = table_cpu.to(dev)
    kpool = torch.randn(slots, Hkv, D, device=dev, dtype=dt)
    vpool = torch.randn(slots, Hkv, D, device=dev, dtype=dt)
    trows = torch.arange(Bn, dtype=torch.int32, device=dev)
    if stack.fi:
        stack.set_rope_cache(inv, max_len + 1, dev)
    res: dict = {"rollout": {}}
    tag = f"b{Bn}"
    # ---------------- prefill ----------------------------------------------------------------
    n_tok = sum(lens)
    xp = torch.randn(n_tok, H, device=dev, dtype=dt) * 0.5
    rp = torch.randn(n_tok, H, device=dev, dtype=dt) * 0.5
    pos_p = torch.cat([torch.arange(n, device=dev) for n in lens])
    loc_p = torch.cat([table[b, :n].to(torch.int64) for b, n in enumerate(lens)])
    cu_p = torch.zeros(Bn + 1, dtype=torch.int32)
    cu_p[1:] = torch.cumsum(torch.tensor(lens), 0)
    cu_p = cu_p.to(dev)
    zero = torch.zeros(Bn, dtype=torch.int32, device=dev)
    with torch.no_grad():
        def plug_prefill():
            return layer_step(plug, xp, pos_p, inv, sc, kpool, vpool, loc_p, lambda q, s: ops.attention_extend(
                q, kpool, vpool, cu_seqlens_q=cu_p, prefix_lens=zero, kv_indices=table, table_rows=trows,
                max_extend_len=max(lens), softmax_scale=s), residual=rp, split_residual=True)[0]

        xb, rb = xp.clone(), rp.clone()  # the baseline's fused norms work in place: its own buffers
        cos_p, sin_p = rotary(xp[None], pos_p[None])
        cands = {}
        if stack.fi:
            from areal_tik_plugin.contract import baselines as B

            for be in ("fa3", "fa2"):
                try:
                    fi = B.flashinfer(f"prefill_{be}")
                    att = _fi_prefill_attend(fi, be, cu_p, Hq, Hkv, D, kpool, vpool, loc_p, scale)
                    cands[f"flashinfer ragged prefill ({be})"] = (
                        lambda att=att: stack.layer(xb, rb, pos_p, None, att)[0])
                except Exception as e:
                    notes.setdefault("baseline_skipped", {})[f"prefill {be}"] = f"{type(e).__name__}: {e}"[:200]
        for sname, bk in sdpa.items():
            att = _sdpa_prefill_attend(lens, kpool, vpool, loc_p, scale, bk)
            cands[f"torch SDPA {sname} (per sequence)"] = (
                lambda att=att: stack.layer(xb, rb, pos_p, (cos_p, sin_p), att)[0])
        t_pp = _time(plug_prefill, graph=False, errors=errors, tag=f"plugin.prefill[{tag}]")
        bname, t_bp = _best_timed(cands, graph=False, errors=errors, tag=f"baseline.prefill[{tag}]", notes=notes,
                                  key="baseline_candidates")
        res["rollout"]["prefill"] = {"plugin": t_pp, "baseline": t_bp, "baseline_attention": bname}
        if Bn == 1:
            res["prefill"] = {"plugin": t_pp, "baseline": t_bp}
        if profile:
            res["profile"] = {"plugin.prefill": _profile(plug_prefill)}
            if bname:
                res["profile"]["baseline.prefill"] = _profile(cands[bname])
        # ---------------- decode step at sampled contexts ------------------------------------------
        x1 = torch.randn(Bn, H, device=dev, dtype=dt) * 0.5
        r1 = torch.randn(Bn, H, device=dev, dtype=dt) * 0.5
        xb1, rb1 = x1.clone(), r1.clone()
        pos1 = torch.zeros(Bn, dtype=torch.int64, device=dev)
        loc1 = torch.zeros(Bn, dtype=torch.int64, device=dev)
        seq1 = torch.zeros(Bn, dtype=torch.int32, device=dev)
        cap = table.shape[1]

        def plug_step():
            return layer_step(plug, x1, pos1, inv, sc, kpool, vpool, loc1, lambda q, s: ops.attention_decode(
                q, kpool, vpool, seq_lens=seq1, kv_indices=table, table_rows=trows, softmax_scale=s,
                max_context_len=cap), residual=r1, split_residual=True)[0]

        kbuf = vbuf = None
        if not stack.fi and Bn == 1:  # the fallback decode: SDPA over a static dense buffer (B = 1)
            kbuf = torch.randn(1, Hkv, max_len, D, device=dev, dtype=dt)
            vbuf = torch.randn(1, Hkv, max_len, D, device=dev, dtype=dt)

        def sdpa_step_attend(c, bk):
            import torch.nn.functional as F
            from torch.nn.attention import sdpa_kernel

            def attend(q, k, v):
                kbuf[:, :, c - 1:c].copy_(k.transpose(0, 1)[None])
                vbuf[:, :, c - 1:c].copy_(v.transpose(0, 1)[None])
                with sdpa_kernel(bk):
                    o = F.scaled_dot_product_attention(q.transpose(0, 1)[None], kbuf[:, :, :c], vbuf[:, :, :c],
                                                       scale=scale, enable_gqa=True)
                return o[0].transpose(0, 1)
            return attend

        points = ctx_points or (CTX_POINTS_QUICK if quick else CTX_POINTS)
        steps = sorted({p for p in points if p <= max(decodes)})
        dec_plugin, dec_base, dec_rows = {}, {}, []
        bs = None
        for t in steps:
            ctx = [n + t for n in lens]
            pos1.copy_(torch.tensor([c - 1 for c in ctx], device=dev))
            loc1.copy_(torch.stack([table[b, c - 1] for b, c in enumerate(ctx)]).to(torch.int64))
            seq1.copy_(torch.tensor(ctx, dtype=torch.int32, device=dev))
            cos1, sin1 = rotary(x1[None], pos1[None])
            cands = {}
            if stack.fi:
                from areal_tik_plugin.contract import baselines as B

                for tc in (False, True):
                    try:
                        fi = B.flashinfer("prefill_fa2" if tc else "decode")
                        att = _fi_decode_attend(fi, tc, ctx, table_cpu, Hq, Hkv, D, kpool, vpool, loc1, scale)
                        cands[f"flashinfer paged decode (use_tensor_cores={tc})"] = (
                            lambda att=att: stack.layer(xb1, rb1, pos1, None, att)[0])
                    except Exception as e:
                        notes.setdefault("baseline_skipped", {})[f"decode tc={tc}"] = f"{type(e).__name__}: {e}"[:200]
            elif kbuf is not None:
                for sname, bk in sdpa.items():
                    att = sdpa_step_attend(ctx[0], bk)
                    cands[f"torch SDPA {sname} (dense static buffer)"] = (
                        lambda att=att: stack.layer(xb1, rb1, pos1, (cos1, sin1), att)[0])
            else:  # SGLang's torch_native backend: per request, its K/V gathered from the pool, SDPA
                for sname, bk in sdpa.items():
                    att = _gather_decode_attend(ctx, table, kpool, vpool, loc1, scale, bk)
                    cands[f"torch SDPA {sname} (per request, K/V gathered from the pool)"] = (
                        lambda att=att: stack.layer(xb1, rb1, pos1, (cos1, sin1), att)[0])
            tps = [_time(plug_step, graph=True, errors=errors, tag=f"plugin.decode[{tag}]@{t}")]
            bname, tb0 = _best_timed(cands, graph=True, errors=errors, tag=f"baseline.decode[{tag}]@{t}",
                                     notes=notes, key="baseline_candidates")
            tbs = [tb0] if tb0 else []
            bs = cands.get(bname)
            for _ in range(repeat - 1):  # alternate the stacks: drift hits both alike
                tps.append(_time(plug_step, graph=True, errors=errors, tag=f"plugin.decode[{tag}]@{t}"))
                if bs is not None:
                    tbs.append(_time(bs, graph=True, errors=errors, tag=f"baseline.decode[{tag}]@{t}"))
            tp, tb = _median_time(tps), _median_time(tbs)
            row = {"ctx": ctx[0] if Bn == 1 else None, "step": t, "plugin": tp, "baseline": tb,
                   "baseline_attention": bname}
            if Bn > 1:
                row["mean_ctx"] = sum(ctx) / Bn
            if repeat > 1:
                row["samples"] = {"plugin": tps, "baseline": tbs}
            a, b, how = _pick(tp, tb)
            if a is not None:
                dec_plugin[t], dec_base[t] = a, b
                row["method"] = how
            dec_rows.append(row)
        res["rollout"]["decode_steps"] = dec_rows
        res["rollout"]["decode_points"] = {"plugin": dec_plugin, "baseline": dec_base}
        if Bn == 1:
            res["decode_steps"] = dec_rows
        if profile and steps:
            res["profile"]["plugin.decode"] = _profile(plug_step)
            res["profile"]["baseline.decode"] = _profile(bs) if bs is not None else []
        if decode_knobs and steps:
            res["decode_knobs"] = _probe_decode_knobs(plug_step, decode_knobs, errors)
        if pdl_probe and steps:
            res["pdl_probe"] = _probe_pdl(plug_step, errors, max(repeat, 3))
    return res


def _bench_update(cfg, base, plug, mod, rotary, inv, sc, prompt, decodes, dev, dt, sdpa, notes, errors):
    """Policy update over one packed sequence of prompt + R tokens: ours (tik-patched HF layer, no
    recompute) vs AReaL's FSDP actor (HF layer with Liger's kernels, the faster SDPA backend) plus the
    recompute forward (no grad) a stock pipeline runs."""
    import torch

    from areal_tik_plugin.integrations import transformers as T

    lig, rope_fn = _liger_layer(base, mod, notes)
    params_p = [p for p in plug.parameters() if p.requires_grad]
    params_b = [p for p in lig.parameters() if p.requires_grad]
    H = cfg.hidden_size
    rows = []
    for R in decodes:
        L = prompt + R
        x = (torch.randn(L, H, device=dev, dtype=dt) * 0.5).requires_grad_()
        gout = torch.randn(1, L, H, device=dev, dtype=dt) * 0.01
        pos = torch.arange(L, device=dev)
        cu = torch.tensor([0, L], dtype=torch.int32, device=dev)
        rot = T.TikRotary(pos[None], inv, sc)
        with torch.no_grad():
            cos, sin = rotary(x[None], pos[None])

        def plug_fwd():
            o = plug(x[None], attention_mask=None, position_ids=pos[None], position_embeddings=rot,
                     cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=L, max_length_k=L)
            return o[0] if isinstance(o, tuple) else o

        def plug_fb():
            return torch.autograd.grad(plug_fwd(), [x] + params_p, gout, allow_unused=True)

        def base_fwd(bk):
            def f():
                o = lig(x[None], attention_mask=None, position_ids=pos[None], position_embeddings=(cos, sin))
                return o[0] if isinstance(o, tuple) else o
            return _patched_rope(mod, rope_fn, _with_backend(f, bk))

        row: dict[str, Any] = {"decode": R, "L": L}
        try:
            fbs = {f"HF + Liger, SDPA {n}": (lambda bf=base_fwd(bk): torch.autograd.grad(bf(), [x] + params_b, gout,
                                                                                          allow_unused=True))
                   for n, bk in sdpa.items()}
            bname, t_bfb = _best_timed(fbs, graph=False, errors=errors, tag=f"baseline.update_fb@{L}", notes=notes,
                                       key="baseline_candidates")
            bk = sdpa[bname.rsplit(" ", 1)[1]] if bname else next(iter(sdpa.values()))
            bf = base_fwd(bk)

            def base_recompute():
                with torch.no_grad():
                    return bf()

            t = {"plugin_fwd": _time(plug_fwd, graph=False, errors=errors, tag=f"plugin.update_fwd@{L}"),
                 "plugin_fb": _time(plug_fb, graph=False, errors=errors, tag=f"plugin.update_fb@{L}"),
                 "baseline_fwd": _time(bf, graph=False, errors=errors, tag=f"baseline.update_fwd@{L}"),
                 "baseline_fb": t_bfb,
                 "baseline_recompute": _time(base_recompute, graph=False, errors=errors, tag=f"baseline.recompute@{L}")}
            row["times"], row["baseline_attention"] = t, bname
            if R == decodes[0]:  # sanity: both stacks compute the same layer
                with torch.no_grad():
                    a, b = plug_fwd().double(), bf().double()
                row["sanity_rel_l2_plugin_vs_baseline"] = float((a - b).norm() / b.norm())
            row["plugin_us"] = t["plugin_fb"]["cold_us"]
            row["baseline_us"] = t["baseline_fb"]["cold_us"] + t["baseline_recompute"]["cold_us"]
        except Exception as e:
            errors.append(f"update@{L}: {type(e).__name__}: {e}"[:300])
            row["times"] = None
        rows.append(row)
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def _totals(out, decodes, upd_points, errors):
    """Per (batch, R): phase times of both stacks and the ratios. Batch 1: the measured update at prompt + R;
    B > 1: each request's update interpolated (piecewise linear in its length) from the batch-1 times, the
    same rule for both stacks (``update_method``)."""
    results = []
    upd = {r["decode"]: r for r in out.get("update", [])}
    for brec in out["batches"]:
        Bn, lens = brec["batch"], brec["prompt_lens"]
        for R in decodes:
            row: dict[str, Any] = {"batch": Bn, "decode": R, "L": (lens[0] + R) if Bn == 1 else None}
            try:
                pp, bp_, m_pre = _pick(brec["prefill"]["plugin"], brec["prefill"]["baseline"])
                pts = brec["decode_points"]
                dp = _decode_total(pts["plugin"], R, 0)
                db = _decode_total(pts["baseline"], R, 0)
                if Bn == 1:
                    t = upd[R]["times"]
                    pf, pfb = t["plugin_fwd"]["cold_us"], t["plugin_fb"]["cold_us"]
                    bf_, bfb = t["baseline_fwd"]["cold_us"], t["baseline_fb"]["cold_us"]
                    brc = t["baseline_recompute"]["cold_us"]
                    plugin = {"prefill": pp, "decode": dp, "update_fwd": pf, "update_bwd": max(pfb - pf, 0.0)}
                    baseline = {"prefill": bp_, "decode": db, "recompute_fwd": brc, "update_fwd": bf_,
                                "update_bwd": max(bfb - bf_, 0.0)}
                    row["sanity_rel_l2_plugin_vs_baseline"] = upd[R].get("sanity_rel_l2_plugin_vs_baseline")
                    row["update_method"] = "measured (one packed sequence)"
                else:
                    pu = sum(_interp(upd_points["plugin"], n + R) for n in lens)
                    bu = sum(_interp(upd_points["baseline"], n + R) for n in lens)
                    plugin = {"prefill": pp, "decode": dp, "update": pu}
                    baseline = {"prefill": bp_, "decode": db, "update_and_recompute": bu}
                    row["update_method"] = "per request, interpolated from the batch-1 update times (both stacks)"
                plugin["total"] = sum(plugin.values())
                baseline["total"] = sum(baseline.values())
                row["plugin_us"], row["baseline_us"] = plugin, baseline
                row["phase_ratio"] = {k: (baseline[k] / plugin[k]) if plugin.get(k) and k in baseline else None
                                      for k in ("prefill", "decode", "update_fwd", "update_bwd")}
                row["ratio"] = baseline["total"] / plugin["total"]
                row["baseline_names"] = {"prefill_attention": brec["prefill"].get("baseline_attention"),
                                         "decode_attention": sorted({r.get("baseline_attention") or "none"
                                                                     for r in brec["decode_steps"]})}
                row["method"] = {"prefill": m_pre, "decode": sorted({r.get("method") for r in brec["decode_steps"]
                                                                      if r.get("method")}), "update": "cold"}
            except Exception as e:
                errors.append(f"totals@b{Bn}/R{R}: {type(e).__name__}: {e}"[:300])
            results.append(row)
    return results


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.layer_bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="folder for the JSON result")
    ap.add_argument("--quick", action="store_true", help="fewer decode context samples (GPU time < ~4 min)")
    ap.add_argument("--profile", action="store_true",
                    help="also record the top kernels (torch.profiler) of prefill and of a decode step per model")
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma list from {list(MODELS)}")
    ap.add_argument("--decode", default=",".join(str(d) for d in DECODES), help="response lengths")
    ap.add_argument("--repeat", type=int, default=1,
                    help="time each decode step N times, plugin and baseline alternating; medians are used")
    ap.add_argument("--decode-knobs", default="",
                    help="comma list of WARPSxSTAGES for the attention decode kernel, re-timed on the plugin "
                         "decode step at the last context (free knobs; bits compared), e.g. 4x3,8x3")
    ap.add_argument("--batches", default="1,32,64",
                    help="comma list of batch sizes: 1 (one --prompt-token request) and rollout-sized batches of "
                         "mixed prompt lengths (mean 1K)")
    ap.add_argument("--no-flashinfer", action="store_true",
                    help="the baseline rollout without FlashInfer (torch / cuDNN), recorded by name")
    ap.add_argument("--pdl-probe", action="store_true",
                    help="re-time the plugin decode step at the last context with programmatic dependent launch "
                         "off and on (free knob; bits compared)")
    from areal_tik_plugin.contract import baselines as B

    B.add_arguments(ap)
    args = ap.parse_args(argv)
    try:
        B.configure(args.baselines_off, args.fi_failed)
    except ValueError as e:
        ap.error(str(e))

    import torch

    from areal_tik_plugin import evidence
    from areal_tik_plugin.runtime import loader

    if not torch.cuda.is_available():
        print("the layer benchmark needs a CUDA GPU", file=sys.stderr)
        return 2
    decodes = tuple(int(x) for x in args.decode.split(",") if x)
    if args.repeat < 1:
        print(f"--repeat: expected an integer >= 1, got {args.repeat}", file=sys.stderr)
        return 2
    try:
        knobs = [tuple(int(v) for v in k.lower().split("x")) for k in args.decode_knobs.split(",") if k]
        if any(len(k) != 2 or min(k) < 1 for k in knobs):
            raise ValueError
    except ValueError:
        print(f"--decode-knobs: expected a comma list of WARPSxSTAGES (e.g. 4x3,8x3), got {args.decode_knobs!r}",
              file=sys.stderr)
        return 2
    models = [m for m in args.models.split(",") if m]
    try:
        batches = tuple(int(b) for b in args.batches.split(",") if b)
        if not batches or min(batches) < 1:
            raise ValueError
    except ValueError:
        print(f"--batches: expected a comma list of integers >= 1, got {args.batches!r}", file=sys.stderr)
        return 2
    impl = loader.get_implementation()
    rec = {"schema": "areal-tik-layer-bench/1", "implementation": impl.name, "source_hash": impl.source_hash,
           "env": evidence.environment(), "argv": sys.argv[1:] if argv is None else list(argv), "prompt": PROMPT,
           "decodes": list(decodes), "quick": args.quick, "batches": list(batches),
           "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "models": []}
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"layer_bench-{impl.name}-{impl.source_hash[:12]}.json")
    for m in models:
        t0 = time.time()
        try:
            r = bench_model(m, args.quick, decodes, profile=args.profile, decode_knobs=knobs, repeat=args.repeat,
                            pdl_probe=args.pdl_probe, batches=batches, use_flashinfer=not args.no_flashinfer)
        except Exception as e:
            r = {"model": m, "errors": [f"{type(e).__name__}: {e}"[:500]], "trace": traceback.format_exc()[-2000:],
                 "results": []}
        r["seconds"] = round(time.time() - t0, 1)
        rec["models"].append(r)
        with open(path + ".tmp", "w") as f:
            json.dump(rec, f, indent=1)
        os.replace(path + ".tmp", path)
        torch.cuda.empty_cache()
    rec["summary"] = evidence.layer_bench_summary(rec["models"])
    with open(path + ".tmp", "w") as f:
        json.dump(rec, f, indent=1)
    os.replace(path + ".tmp", path)

    print(f"\nlayer bench: {path}\nimplementation {impl.name} {impl.source_hash[:12]} on {rec['env'].get('gpu')}")
    print(f"{'model':<15}{'B':>4}{'R':>6}  {'phase (us)':<22}{'plugin':>11}{'baseline':>11}{'ratio':>7}")
    for r in rec["models"]:
        for e in r.get("errors", []):
            print(f"  ERROR {r['model']}: {e}")
        for row in r["results"]:
            if "plugin_us" not in row:
                print(f"{r['model']:<15}{row.get('batch', 1):>4}{row['decode']:>6}  (incomplete)")
                continue
            p, b = row["plugin_us"], row["baseline_us"]
            for ph in list(dict.fromkeys([k for k in b if k != "total"] + [k for k in p if k != "total"])) + ["total"]:
                pv, bv = p.get(ph), b.get(ph)
                ratio = f"{bv / pv:>7.2f}" if pv and bv is not None else f"{'':>7}"
                print(f"{r['model']:<15}{row.get('batch', 1):>4}{row['decode']:>6}  {ph:<22}"
                      f"{pv if pv is not None else 0.0:>11.0f}{bv if bv is not None else 0.0:>11.0f}{ratio}")
        names = r.get("notes", {}).get("baseline_rollout")
        if names:
            print(f"  baseline rollout {r['model']}: " + "; ".join(f"{k}: {v}" for k, v in names.items()))
    for r in rec["models"]:
        pp = r.get("pdl_probe")
        if pp:
            us = [(pp[k] or {}).get("graph_us") for k in ("off", "on")]
            print(f"pdl probe {r['model']}: decode step off {us[0]} us, on {us[1]} us, "
                  f"speedup {pp.get('speedup_graph')}, same bits {pp['same_bits']}")
    s = rec["summary"]
    if s["n"]:
        print(f"ratio baseline/plugin: mean {s['mean_ratio']:.3f}, geomean {s['geomean_ratio']:.3f}, "
              f"min {s['min_ratio']:.3f} over {s['n']} (model, R); per model "
              + ", ".join(f"{k} {v:.3f}" for k, v in s["per_model_geomean"].items() if v))
    errs = sum(len(r.get("errors", [])) for r in rec["models"])
    return 0 if s["n"] == len(models) * len(decodes) * len(batches) and errs == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
