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
* **baseline stack** (stock kernels): the HF layer's ops with cuDNN SDPA attention (``sdpa_kernel``;
  another SDPA backend only if cuDNN refuses the shape, recorded) and torch/HF ops (cuBLAS on the
  fused weights; MoE: transformers' ``grouped_mm`` experts when available); prefill = those ops over
  the prompt (causal SDPA), decode = the same on one token against a static KV buffer (graph
  replayed like ours); update = the HF layer's forward + backward, **plus the
  recompute forward** (no-grad) over the 1K+R tokens that a stock pipeline must run.

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
import math
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


def bench_model(name: str, quick: bool, decodes=DECODES, *, prompt: int = PROMPT, device: str = "cuda",
                ctx_points=None, profile: bool = False, decode_knobs=(), repeat: int = 1,
                pdl_probe: bool = False) -> dict[str, Any]:
    """Every phase of one model's layer; ``prompt``/``device``/``ctx_points`` exist for CPU smoke tests.
    ``profile``: also record the top kernels of the plugin's and the baseline's prefill and decode step.
    ``decode_knobs``: ``(warps, stages)`` pairs of the attention decode kernel to probe (see
    :func:`_probe_decode_knobs`). ``repeat``: decode steps timed that many times per context, the two
    stacks alternating, medians used (the samples are kept). ``pdl_probe``: the plugin decode step at
    the last context with programmatic dependent launch off and on (:func:`_probe_pdl`)."""
    import torch
    import torch.nn.functional as F

    from areal_tik_plugin import ops
    from areal_tik_plugin.integrations import transformers as T
    from areal_tik_plugin.verify import layer_step

    PROMPT = prompt  # noqa: N806
    dev = torch.device(device)
    dt = torch.bfloat16
    cfg, base, rotary, mod, notes = build_layer(name, dt, dev)
    plug = T.apply_to_module(copy.deepcopy(base), cfg.model_type)
    errors: list[str] = []
    H = cfg.hidden_size
    attn = base.self_attn
    Hq, Hkv, D = cfg.num_attention_heads, cfg.num_key_value_heads, attn.head_dim
    inv, sc = T.rope_params(rotary, dev)
    apply_rope_hf = mod.apply_rotary_pos_emb
    max_ctx = PROMPT + max(decodes)
    g = torch.Generator(device="cpu").manual_seed(1)
    # ---------------- KV pools -------------------------------------------------------------------
    slots = max_ctx + 1  # slot 0 reserved (SGLang)
    kpool = torch.randn(slots, Hkv, D, device=dev, dtype=dt)
    vpool = torch.randn(slots, Hkv, D, device=dev, dtype=dt)
    table = (torch.randperm(slots - 1, generator=g) + 1).to(torch.int32).to(dev)[None]  # page size 1
    rows = torch.zeros(1, dtype=torch.int32, device=dev)
    kbuf = torch.randn(1, Hkv, max_ctx, D, device=dev, dtype=dt)
    vbuf = torch.randn(1, Hkv, max_ctx, D, device=dev, dtype=dt)
    out: dict[str, Any] = {"model": name, "config": {k: getattr(cfg, k, None) for k in (
        "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
        "num_experts", "num_experts_per_tok", "moe_intermediate_size")}, "notes": notes, "errors": errors}

    with torch.no_grad():
        # ---------------- prefill ----------------------------------------------------------------
        xp = torch.randn(PROMPT, H, device=dev, dtype=dt) * 0.5
        pos_p = torch.arange(PROMPT, device=dev)
        loc_p = table[0, :PROMPT].to(torch.int64)
        cu_p = torch.tensor([0, PROMPT], dtype=torch.int32, device=dev)
        zero = torch.zeros(1, dtype=torch.int32, device=dev)

        # the plugin's rollout layer in SGLang's convention: (previous layer's output, residual) in, the
        # residual add inside the input RMSNorm (layer_step's split_residual); the baseline keeps HF's adds
        rp = torch.randn(PROMPT, H, device=dev, dtype=dt) * 0.5

        def plug_prefill():
            return layer_step(plug, xp, pos_p, inv, sc, kpool, vpool, loc_p, lambda q, s: ops.attention_extend(
                q, kpool, vpool, cu_seqlens_q=cu_p, prefix_lens=zero, kv_indices=table, table_rows=rows,
                max_extend_len=PROMPT, softmax_scale=s), residual=rp, split_residual=True)[0]

        cos_p, sin_p = rotary(xp[None], pos_p[None])
        # the baseline's rollout steps use the same fused QKV / gate_up weights as ours (SGLang's layout)
        fw = T.rollout_weights(base, dt)
        nq, nk = fw["q_size"], fw["kv_size"]
        q_norm = getattr(attn, "q_norm", None)
        dense = fw["gate_up"] is not None

        def base_rollout(h, cos, sin, kv):
            """The HF layer's ops in torch (cuDNN SDPA), fused projections; ``kv(k, v)`` -> keys/values
            the query attends to and whether the mask is causal."""
            n = h.shape[1]
            r = h
            h = base.input_layernorm(h)
            qkv = F.linear(h, fw["qkv"], fw["qkv_bias"])
            q = qkv[..., :nq].view(1, n, Hq, D)
            k = qkv[..., nq:nq + nk].view(1, n, Hkv, D)
            v = qkv[..., nq + nk:].view(1, n, Hkv, D)
            if q_norm is not None:
                q, k = attn.q_norm(q), attn.k_norm(k)
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            q, k = apply_rope_hf(q, k, cos, sin)
            ka, va, causal = kv(k, v)
            o = F.scaled_dot_product_attention(q, ka, va, scale=attn.scaling, is_causal=causal, enable_gqa=True)
            h = r + attn.o_proj(o.transpose(1, 2).reshape(1, n, Hq * D))
            r = h
            h = base.post_attention_layernorm(h)
            if dense:
                g, u = F.linear(h, fw["gate_up"]).chunk(2, dim=-1)
                m = base.mlp.down_proj(base.mlp.act_fn(g) * u)
            else:
                m = base.mlp(h)
                m = m[0] if isinstance(m, tuple) else m
            return r + m

        def base_prefill_fn(bk):
            return _with_backend(lambda: base_rollout(xp[None], cos_p, sin_p, lambda k, v: (k, v, True)), bk)

        # prefill is timed cold only (SGLang does not graph-replay prefill)
        t_pp = _time(plug_prefill, graph=False, errors=errors, tag="plugin.prefill")
        try:
            bp = _first_working(base_prefill_fn, "prefill", notes)
            t_bp = _time(bp, graph=False, errors=errors, tag="baseline.prefill")
        except Exception as e:
            errors.append(str(e)[:300])
            t_bp = None
        out["prefill"] = {"plugin": t_pp, "baseline": t_bp}
        if profile:
            out["profile"] = {"plugin.prefill": _profile(plug_prefill)}
            if t_bp is not None:
                out["profile"]["baseline.prefill"] = _profile(bp)

        # ---------------- decode step at sampled contexts ------------------------------------------
        x1 = torch.randn(1, H, device=dev, dtype=dt) * 0.5
        pos1 = torch.zeros(1, dtype=torch.int64, device=dev)
        loc1 = torch.zeros(1, dtype=torch.int64, device=dev)
        seq1 = torch.zeros(1, dtype=torch.int32, device=dev)
        cap = table.shape[1]

        r1 = torch.randn(1, H, device=dev, dtype=dt) * 0.5

        def plug_step():
            return layer_step(plug, x1, pos1, inv, sc, kpool, vpool, loc1, lambda q, s: ops.attention_decode(
                q, kpool, vpool, seq_lens=seq1, kv_indices=table, table_rows=rows, softmax_scale=s,
                max_context_len=cap), residual=r1, split_residual=True)[0]

        def base_step_fn(c, cos1, sin1, bk):
            def kv(k, v):
                kbuf[:, :, c - 1:c].copy_(k)
                vbuf[:, :, c - 1:c].copy_(v)
                return kbuf[:, :, :c], vbuf[:, :, :c], False

            return _with_backend(lambda: base_rollout(x1[None], cos1, sin1, kv), bk)

        points = ctx_points or (CTX_POINTS_QUICK if quick else CTX_POINTS)
        ctxs = sorted({PROMPT + p for p in points if p <= max(decodes)})
        dec_plugin, dec_base, dec_rows = {}, {}, []
        for c in ctxs:
            pos1.fill_(c - 1)
            loc1.copy_(table[0, c - 1:c].to(torch.int64))
            seq1.fill_(c)
            tps = [_time(plug_step, graph=True, errors=errors, tag=f"plugin.decode@{c}")]
            cos1, sin1 = rotary(x1[None], pos1[None])
            tbs = []
            try:
                bs = _first_working(lambda bk: base_step_fn(c, cos1, sin1, bk), f"decode@{c}", notes)
                tbs.append(_time(bs, graph=True, errors=errors, tag=f"baseline.decode@{c}"))
                for _ in range(repeat - 1):  # alternate the stacks: drift hits both alike
                    tps.append(_time(plug_step, graph=True, errors=errors, tag=f"plugin.decode@{c}"))
                    tbs.append(_time(bs, graph=True, errors=errors, tag=f"baseline.decode@{c}"))
            except Exception as e:
                errors.append(str(e)[:300])
            tp, tb = _median_time(tps), _median_time(tbs)
            dec_rows.append({"ctx": c, "plugin": tp, "baseline": tb})
            if repeat > 1:
                dec_rows[-1]["samples"] = {"plugin": tps, "baseline": tbs}
            a, b, how = _pick(tp, tb)
            if a is not None:
                dec_plugin[c], dec_base[c] = a, b
                dec_rows[-1]["method"] = how
        out["decode_steps"] = dec_rows
        if profile and ctxs:
            out["profile"]["plugin.decode"] = _profile(plug_step)  # at the last sampled context
            out["profile"]["baseline.decode"] = _profile(bs) if dec_base else []
        if decode_knobs and ctxs:
            out["decode_knobs"] = _probe_decode_knobs(plug_step, decode_knobs, errors)
        if pdl_probe and ctxs:
            out["pdl_probe"] = _probe_pdl(plug_step, errors, max(repeat, 3))

    # ---------------- policy update (training) ------------------------------------------------------
    params_p = [p for p in plug.parameters() if p.requires_grad]
    params_b = [p for p in base.parameters() if p.requires_grad]
    results = []
    for R in decodes:
        L = PROMPT + R
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

        def base_fwd_fn(bk):
            def f():
                o = base(x[None], attention_mask=None, position_ids=pos[None], position_embeddings=(cos, sin))
                return o[0] if isinstance(o, tuple) else o

            return _with_backend(f, bk)

        row: dict[str, Any] = {"decode": R, "L": L}
        try:
            bf = _first_working(base_fwd_fn, f"update@{L}", notes)

            def base_fb(bf=bf):
                return torch.autograd.grad(bf(), [x] + params_b, gout, allow_unused=True)

            def base_recompute(bf=bf):
                with torch.no_grad():
                    return bf()

            t = {
                "plugin_fwd": _time(plug_fwd, graph=False, errors=errors, tag=f"plugin.update_fwd@{L}"),
                "plugin_fb": _time(plug_fb, graph=False, errors=errors, tag=f"plugin.update_fb@{L}"),
                "baseline_fwd": _time(bf, graph=False, errors=errors, tag=f"baseline.update_fwd@{L}"),
                "baseline_fb": _time(base_fb, graph=False, errors=errors, tag=f"baseline.update_fb@{L}"),
                "baseline_recompute": _time(base_recompute, graph=False, errors=errors, tag=f"baseline.recompute@{L}"),
            }
            row["update"] = t
            if R == decodes[0]:  # sanity: both stacks compute the same layer
                with torch.no_grad():
                    a, b = plug_fwd().double(), bf().double()
                row["sanity_rel_l2_plugin_vs_baseline"] = float((a - b).norm() / b.norm())
        except Exception as e:
            errors.append(f"update@{L}: {type(e).__name__}: {e}"[:300])
            row["update"] = None
        # ---------------- totals ----------------------------------------------------------------
        try:
            pp, bp_, m_pre = _pick(out["prefill"]["plugin"], out["prefill"]["baseline"])
            dp = _decode_total(dec_plugin, R, PROMPT)
            db = _decode_total(dec_base, R, PROMPT)
            u = row["update"]
            pf, pfb = u["plugin_fwd"]["cold_us"], u["plugin_fb"]["cold_us"]
            bf_, bfb, brc = u["baseline_fwd"]["cold_us"], u["baseline_fb"]["cold_us"], u["baseline_recompute"]["cold_us"]
            plugin = {"prefill": pp, "decode": dp, "update_fwd": pf, "update_bwd": max(pfb - pf, 0.0)}
            baseline = {"prefill": bp_, "decode": db, "recompute_fwd": brc, "update_fwd": bf_,
                        "update_bwd": max(bfb - bf_, 0.0)}
            plugin["total"] = sum(plugin.values())
            baseline["total"] = sum(baseline.values())
            row["plugin_us"], row["baseline_us"] = plugin, baseline
            row["phase_ratio"] = {k: (baseline[k] / plugin[k]) if plugin.get(k) else None
                                  for k in ("prefill", "decode", "update_fwd", "update_bwd")}
            row["ratio"] = baseline["total"] / plugin["total"]
            row["method"] = {"prefill": m_pre, "decode": sorted({r.get("method") for r in dec_rows if r.get("method")}),
                             "update": "cold"}
        except Exception as e:
            errors.append(f"totals@{R}: {type(e).__name__}: {e}"[:300])
        results.append(row)
        torch.cuda.empty_cache()
    out["results"] = results
    return out


def _geomean(v):
    v = [x for x in v if x and x > 0]
    return math.exp(sum(math.log(x) for x in v) / len(v)) if v else None


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
    ap.add_argument("--pdl-probe", action="store_true",
                    help="re-time the plugin decode step at the last context with programmatic dependent launch "
                         "off and on (free knob; bits compared)")
    args = ap.parse_args(argv)

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
    impl = loader.get_implementation()
    rec = {"schema": "areal-tik-layer-bench/1", "implementation": impl.name, "source_hash": impl.source_hash,
           "env": evidence.environment(), "argv": sys.argv[1:] if argv is None else list(argv), "prompt": PROMPT,
           "decodes": list(decodes), "quick": args.quick,
           "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "models": []}
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"layer_bench-{impl.name}-{impl.source_hash[:12]}.json")
    for m in models:
        t0 = time.time()
        try:
            r = bench_model(m, args.quick, decodes, profile=args.profile, decode_knobs=knobs, repeat=args.repeat,
                            pdl_probe=args.pdl_probe)
        except Exception as e:
            r = {"model": m, "errors": [f"{type(e).__name__}: {e}"[:500]], "trace": traceback.format_exc()[-2000:],
                 "results": []}
        r["seconds"] = round(time.time() - t0, 1)
        rec["models"].append(r)
        with open(path + ".tmp", "w") as f:
            json.dump(rec, f, indent=1)
        os.replace(path + ".tmp", path)
        torch.cuda.empty_cache()
    ratios = [row["ratio"] for r in rec["models"] for row in r["results"] if row.get("ratio")]
    per_model = {r["model"]: _geomean([row.get("ratio") for row in r["results"]]) for r in rec["models"]}
    rec["summary"] = {"mean_ratio": (sum(ratios) / len(ratios)) if ratios else None, "geomean_ratio": _geomean(ratios),
                      "per_model_geomean": per_model, "n": len(ratios),
                      "min_ratio": min(ratios) if ratios else None}
    with open(path + ".tmp", "w") as f:
        json.dump(rec, f, indent=1)
    os.replace(path + ".tmp", path)

    print(f"\nlayer bench: {path}\nimplementation {impl.name} {impl.source_hash[:12]} on {rec['env'].get('gpu')}")
    print(f"{'model':<15}{'R':>6}  {'phase (us)':<14}{'plugin':>11}{'baseline':>11}{'ratio':>7}")
    for r in rec["models"]:
        for e in r.get("errors", []):
            print(f"  ERROR {r['model']}: {e}")
        for row in r["results"]:
            if "plugin_us" not in row:
                print(f"{r['model']:<15}{row['decode']:>6}  (incomplete)")
                continue
            p, b = row["plugin_us"], row["baseline_us"]
            for ph in ("prefill", "decode", "recompute_fwd", "update_fwd", "update_bwd", "total"):
                pv = p.get(ph, 0.0)
                ratio = f"{b[ph] / pv:>7.2f}" if pv else f"{'':>7}"
                print(f"{r['model']:<15}{row['decode']:>6}  {ph:<14}{pv:>11.0f}{b[ph]:>11.0f}{ratio}")
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
              + ", ".join(f"{k} {v:.3f}" for k, v in per_model.items() if v))
    errs = sum(len(r.get("errors", [])) for r in rec["models"])
    return 0 if s["n"] == len(models) * len(decodes) and errs == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
