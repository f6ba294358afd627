"""GPU contract checks and benchmarks for NeoX RoPE at the head shapes of Qwen2.5-1.5B (12/2),
Qwen3-4B (32/8) and Qwen3-30B-A3B (32/4), head_dim 128, rope_theta 1e6.

Checks (bitwise): tokens of a 16384-token packed call (positions restart per sequence, up to 40960)
== the same tokens in calls of 1..4096 tokens and shuffled, int32 == int64 positions, k=None,
strided QKV views == contiguous, free launch knobs (heads per program, warps) do not change bits,
CUDA-graph replay == eager. Accuracy vs fp64 and not worse than HF's apply_rotary_pos_emb;
gradients. Benchmarks: vs the strongest of FlashInfer's RoPE (cos/sin cache in place; pos ids), Liger
and torch.compile of HF's rotary path (eager HF as context), TB/s and shares of spec / measured copy.
"""

from __future__ import annotations

import torch

from areal_tik_plugin.contract._rowops import (BENCH_T, DEV, MODELS, QUICK_BENCH_T, add_shares, copy_of, graph_vs_eager, knobs,
                                               rand, rel_l2, row_slices, shuffled_rows, streamed, tbps)
from areal_tik_plugin.contract import baselines as B
from areal_tik_plugin.ops import apply_rope, apply_rope_kv_write

N_FULL = 16384   # tokens of the full-sequence call
N_ACC = 4096     # tokens of the accuracy / free-knob checks
N_BWD = 1024     # tokens of the gradient checks
TOL = {torch.bfloat16: (1e-5, 2 ** -8), torch.float16: (1e-5, 2 ** -10), torch.float32: (5e-6, 2e-6)}
TOL_GRAD = {torch.bfloat16: 1e-2, torch.float32: 1e-6}


def _inv_freq(d, theta):
    return (1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float) / d))).to(DEV)


def _packed_positions(n, seed=0, max_pos=40960):
    g = torch.Generator(device="cpu").manual_seed(seed)
    pos, left = [], n
    while left > 0:
        L = min(left, int(torch.randint(1, 6000, (1,), generator=g)))
        start = int(torch.randint(0, max_pos - L, (1,), generator=g)) if len(pos) % 3 == 2 else 0
        pos.append(torch.arange(start, start + L))
        left -= L
    return torch.cat(pos).to(DEV)


def _ref(x, pos, inv, scaling=1.0):
    f = (pos.float()[:, None] * inv[None, :]).double()
    c, s = (f.cos() * scaling)[:, None, :], (f.sin() * scaling)[:, None, :]
    x = x.double()
    h = inv.numel()
    x1, x2 = x[..., :h], x[..., h:2 * h]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s, x[..., 2 * h:]], -1)


def _hf_cos_sin(pos, inv, scaling, dtype):
    """HF Qwen3RotaryEmbedding.forward: fp32 freqs, cos/sin * attention_scaling, cast to x.dtype."""
    freqs = pos[:, None].float() * inv[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return (emb.cos() * scaling).to(dtype), (emb.sin() * scaling).to(dtype)


def _hf_apply():
    from transformers.models.qwen3.modeling_qwen3 import apply_rotary_pos_emb

    return apply_rotary_pos_emb


# ------------------------------------------------------------------------------------------------
# contract checks
# ------------------------------------------------------------------------------------------------
def _check_rows(rec, tag, hq, hkv, d, theta, dtype):
    q, k = rand(N_FULL, hq, d, dtype=dtype, seed=hq), rand(N_FULL, hkv, d, dtype=dtype, seed=hkv)
    pos = _packed_positions(N_FULL, seed=hq)
    inv = _inv_freq(d, theta)
    qo, ko = apply_rope(q, k, pos, inv)
    for t, sl in row_slices(N_FULL, (1, 7, 64, 257, 1024, 4096)):
        a, b = apply_rope(q[sl], k[sl], pos[sl], inv)
        rec.bitwise(f"q_tokens[{tag}/{t}]", a, qo[sl])
        rec.bitwise(f"k_tokens[{tag}/{t}]", b, ko[sl])
    idx = shuffled_rows(N_FULL, 1000)
    a, b = apply_rope(q[idx], k[idx], pos[idx], inv)
    rec.bitwise(f"q_shuffled[{tag}]", a, qo[idx])
    rec.bitwise(f"k_shuffled[{tag}]", b, ko[idx])
    a, b = apply_rope(q, k, pos.to(torch.int32), inv)
    rec.bitwise(f"int32_positions[{tag}]", a, qo)
    a, _ = apply_rope(q, None, pos, inv)
    rec.bitwise(f"k_none[{tag}]", a, qo)
    qkv = torch.cat([q.flatten(1), k.flatten(1), k.flatten(1)], 1)
    a, b = apply_rope(qkv[:, : hq * d].view(N_FULL, hq, d), qkv[:, hq * d:(hq + hkv) * d].view(N_FULL, hkv, d), pos, inv)
    rec.bitwise(f"qkv_views_q[{tag}]", a, qo)
    rec.bitwise(f"qkv_views_k[{tag}]", b, ko)
    qg = q[:257].clone().requires_grad_()
    rec.bitwise(f"autograd_forward_eq_inference[{tag}]", apply_rope(qg, k[:257], pos[:257], inv)[0].detach(), qo[:257])


def _check_free_knobs(rec, hq, hkv, d, theta):
    from areal_tik_plugin.runtime.loader import get_implementation

    rope = get_implementation().module("rope")
    q, k = rand(N_ACC, hq, d, seed=3), rand(N_ACC, hkv, d, seed=4)
    pos = _packed_positions(N_ACC, seed=5)
    inv = _inv_freq(d, theta)
    ref = rope.forward(q, k, pos, inv, 1.0)
    with knobs(rope, TOKEN_TILES_MIN_T=1, TOKEN_TILES=True, HEAD_GROUPS=False, HEAD_ELEMS=rope.HEAD_ELEMS,
               WARPS=rope.WARPS, TOKEN_TILE_ELEMS=rope.TOKEN_TILE_ELEMS, TOKEN_WARPS=rope.TOKEN_WARPS):
        # both launch layouts: (token, head block) programs and (token tile x all heads) programs, the
        # latter with padded head tiles and with power-of-two head groups
        for tiles, groups, he, w in ((False, False, 512, 1), (False, False, 1024, 2), (False, False, 4096, 4),
                                     (False, False, 8192, 8), (True, False, 2048, 4), (True, False, 8192, 4),
                                     (True, False, 16384, 8), (True, True, 2048, 2), (True, True, 4096, 4),
                                     (True, True, 8192, 8)):
            rope.TOKEN_TILES, rope.HEAD_GROUPS = tiles, groups
            if tiles:
                rope.TOKEN_TILE_ELEMS, rope.TOKEN_WARPS = he, w
            else:
                rope.HEAD_ELEMS, rope.WARPS = he, w
            o = rope.forward(q, k, pos, inv, 1.0)
            tag = f"h{hq}/{('groups' if groups else 'tok') if tiles else 'head'}/e{he}/w{w}"
            rec.bitwise(f"free_knobs_q[{tag}]", o[0], ref[0])
            rec.bitwise(f"free_knobs_k[{tag}]", o[1], ref[1])


def _check_graph(rec, hq, hkv, d, theta):
    B = 64
    q, k = rand(B, hq, d, seed=6), rand(B, hkv, d, seed=7)
    pos = torch.randint(0, 32768, (B,), device=DEV)
    inv = _inv_freq(d, theta)

    def refresh(i):
        q.copy_(rand(B, hq, d, seed=300 + i))
        k.copy_(rand(B, hkv, d, seed=400 + i))
        pos.copy_(torch.randint(0, 32768, (B,), device=DEV))

    graph_vs_eager(rec, f"graph_rope[{hq}/{hkv}]", lambda: apply_rope(q, k, pos, inv), refresh,
                   lambda: apply_rope(q, k, pos, inv))


def _check_accuracy(rec, hq, hkv, d, theta):
    inv = _inv_freq(d, theta)
    pos = _packed_positions(N_ACC, seed=8)
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        q, k = rand(N_ACC, hq, d, dtype=dtype, seed=9), rand(N_ACC, hkv, d, dtype=dtype, seed=10)
        qo, ko = apply_rope(q, k, pos, inv)
        tag = f"{hq}/{hkv}/{str(dtype)[6:]}"
        atol, rtol = TOL[dtype]
        rq, rk = _ref(q, pos, inv), _ref(k, pos, inv)
        rec.close(f"accuracy_q_vs_fp64[{tag}]", qo, rq, atol=atol, rtol=rtol)
        rec.close(f"accuracy_k_vs_fp64[{tag}]", ko, rk, atol=atol, rtol=rtol)
        if dtype != torch.float32:
            try:
                cos, sin = _hf_cos_sin(pos, inv, 1.0, dtype)
                hq_, hk_ = _hf_apply()(q, k, cos, sin, unsqueeze_dim=1)
                e_o = max(float((qo.double() - rq).abs().max()), float((ko.double() - rk).abs().max()))
                e_h = max(float((hq_.double() - rq).abs().max()), float((hk_.double() - rk).abs().max()))
                rec.check(f"error_not_worse_than_hf[{tag}]", e_o <= e_h, ours=e_o, hf=e_h)
            except ImportError as e:
                rec.check(f"error_not_worse_than_hf[{tag}]", True, skipped=f"transformers unavailable: {e}"[:200])
    # partial rotary (rotary_dim = d/2) and attention_scaling
    q = rand(N_BWD, hq, d, seed=11)
    inv2 = _inv_freq(d // 2, theta)
    qo, _ = apply_rope(q, None, pos[:N_BWD], inv2, attention_scaling=0.8)
    rec.close(f"accuracy_partial_rotary_scaled[{hq}]", qo, _ref(q, pos[:N_BWD], inv2, 0.8), atol=1e-5, rtol=2 ** -8)


def _check_backward(rec, hq, hkv, d, theta):
    inv = _inv_freq(d, theta)
    pos = _packed_positions(N_BWD, seed=12)
    for dtype in (torch.bfloat16, torch.float32):
        q = rand(N_BWD, hq, d, dtype=dtype, seed=13).requires_grad_()
        k = rand(N_BWD, hkv, d, dtype=dtype, seed=14).requires_grad_()
        gq, gk = rand(N_BWD, hq, d, dtype=dtype, seed=15), rand(N_BWD, hkv, d, dtype=dtype, seed=16)
        qo, ko = apply_rope(q, k, pos, inv)
        dq, dk = torch.autograd.grad((qo.float() * gq.float()).sum() + (ko.float() * gk.float()).sum(), (q, k))
        q64, k64 = q.detach().double().requires_grad_(), k.detach().double().requires_grad_()
        rq, rk = torch.autograd.grad((_ref(q64, pos, inv) * gq.double()).sum() + (_ref(k64, pos, inv) * gk.double()).sum(),
                                     (q64, k64))
        for name, a, b in (("dq", dq, rq), ("dk", dk, rk)):
            rel = rel_l2(a, b)
            rec.check(f"grad_{name}[{hq}/{hkv}/{str(dtype)[6:]}]", rel < TOL_GRAD[dtype], rel_l2=rel)


def _check_kv_write(rec, tag, hq, hkv, d, theta):
    """RoPE + KV-pool write in one launch (rollout) == apply_rope then kv_write, on strided views of a
    fused QKV output, scattered slots, odd token counts."""
    from areal_tik_plugin.ops import kv_write

    inv = _inv_freq(d, theta)
    for T in (1, 7, 1000):
        qkv = rand(T, (hq + 2 * hkv) * d, seed=T)
        q = qkv[:, :hq * d].view(T, hq, d)
        k = qkv[:, hq * d:(hq + hkv) * d].view(T, hkv, d)
        v = qkv[:, (hq + hkv) * d:].view(T, hkv, d)
        pos = _packed_positions(T, seed=T)
        slots = 2 * T + 3
        loc = torch.randperm(slots, device=DEV)[:T]
        base = rand(slots, hkv, d, seed=T + 1)
        rk, rv = base.clone(), base.clone()
        qr, kr = apply_rope(q, k, pos, inv)
        kv_write(rk, rv, loc, kr, v)
        kc, vc = base.clone(), base.clone()
        qo = apply_rope_kv_write(q, k, v, pos, inv, 1.0, kc, vc, loc)
        rec.bitwise(f"kv_write_q[{tag}/T{T}]", qo, qr)
        rec.bitwise(f"kv_write_kpool[{tag}/T{T}]", kc, rk)
        rec.bitwise(f"kv_write_vpool[{tag}/T{T}]", vc, rv)
        # both kernels at every T (free knob KV_TOKEN_TILES: the token-tile kernel, with and without head
        # groups, or one program per (token, head block))
        from areal_tik_plugin.runtime.loader import get_implementation

        rope = get_implementation().module("rope")
        for tiles, groups in ((True, False), (True, True), (False, True)):
            kc, vc = base.clone(), base.clone()
            with knobs(rope, KV_TOKEN_TILES=tiles, TOKEN_TILES=True, TOKEN_TILES_MIN_T=1, HEAD_GROUPS=groups):
                qo = apply_rope_kv_write(q, k, v, pos, inv, 1.0, kc, vc, loc)
            ktag = f"{tag}/T{T}/kv_token_tiles={tiles}{'/groups' if groups else ''}"
            rec.bitwise(f"kv_write_q[{ktag}]", qo, qr)
            rec.bitwise(f"kv_write_kpool[{ktag}]", kc, rk)
            rec.bitwise(f"kv_write_vpool[{ktag}]", vc, rv)


def run_checks(rec, quick: bool = False) -> None:
    torch.manual_seed(0)
    models = list(MODELS.items())[:1] if quick else list(MODELS.items())
    for name, cfg in models:
        hq, hkv, d, theta = cfg["hq"], cfg["hkv"], cfg["d"], cfg["theta"]
        rec.run(f"kv_write[{name}]", _check_kv_write, rec, name, hq, hkv, d, theta)
        for dtype in ((torch.bfloat16,) if quick else (torch.bfloat16, torch.float16)):
            rec.run(f"rows[{name}/{str(dtype)[6:]}]", _check_rows, rec, f"{name}/{str(dtype)[6:]}", hq, hkv, d, theta, dtype)
        rec.run(f"free_knobs[{name}]", _check_free_knobs, rec, hq, hkv, d, theta)
        rec.run(f"graph[{name}]", _check_graph, rec, hq, hkv, d, theta)
        rec.run(f"accuracy[{name}]", _check_accuracy, rec, hq, hkv, d, theta)
        rec.run(f"backward[{name}]", _check_backward, rec, hq, hkv, d, theta)


# ------------------------------------------------------------------------------------------------
# benchmarks
# ------------------------------------------------------------------------------------------------
def _liger_rope():
    try:
        from liger_kernel.transformers.rope import liger_rotary_pos_emb

        return liger_rotary_pos_emb
    except Exception:
        return None


MAX_POS = 32768


def _cos_sin_cache(inv):
    """SGLang's RotaryEmbedding cache: fp32 [max_pos, d], cos in the first half, sin in the second."""
    f = torch.arange(MAX_POS, device=DEV, dtype=torch.float32)[:, None] * inv[None, :]
    return torch.cat([f.cos(), f.sin()], -1).contiguous()


def run_bench(rec, quick: bool = False) -> None:
    """Ours (cos/sin from the positions in the kernel) vs the strongest of FlashInfer's two RoPE entry
    points (SGLang's fp32 cos/sin cache, in place; cos/sin computed in the kernel), Liger's RoPE (given
    HF's cos/sin, computed outside the timed call) and ``torch.compile`` of HF's rotary embedding +
    ``apply_rotary_pos_emb`` from the positions; eager HF (with and without cos/sin) as context."""
    torch.manual_seed(0)
    lg = _liger_rope()
    ratios, rows = {}, []
    try:
        hf_apply = _hf_apply()
    except Exception as e:
        rec.errors.append(f"hf baseline: {type(e).__name__}: {e}"[:300])
        hf_apply = None
    Ts = QUICK_BENCH_T if quick else BENCH_T
    for name, cfg in MODELS.items():
        hq, hkv, d, theta = cfg["hq"], cfg["hkv"], cfg["d"], cfg["theta"]
        inv = _inv_freq(d, theta)
        cache = _cos_sin_cache(inv)
        c_hf = B.try_compiled(
            (lambda q, k, pos: hf_apply(q, k, *_hf_cos_sin(pos, inv, 1.0, torch.bfloat16), unsqueeze_dim=1))
            if hf_apply else None, "HF rotary + apply_rotary_pos_emb")
        for T in Ts:
            q, k = rand(T, hq, d, seed=T), rand(T, hkv, d, seed=T + 1)
            pos = torch.randint(0, MAX_POS, (T,), device=DEV)
            pos32 = pos.to(torch.int32)
            cos, sin = _hf_cos_sin(pos, inv, 1.0, torch.bfloat16)
            qf, kf = q.reshape(T, hq * d).clone(), k.reshape(T, hkv * d).clone()  # in place: own buffers

            def fi_cache():
                fi = B.flashinfer("rowops")
                return lambda: fi.rope.apply_rope_with_cos_sin_cache_inplace(pos, qf, kf, d, cache, is_neox=True)

            def fi_pos_ids():
                fi = B.flashinfer("rowops")
                return lambda: fi.rope.apply_rope_pos_ids(q, k, pos32, rope_theta=theta)

            def liger_call():
                B.liger()
                if lg is None:
                    raise B.Unavailable("liger_kernel.transformers.rope.liger_rotary_pos_emb not importable")
                q4, k4 = q.view(1, T, hq, d).transpose(1, 2), k.view(1, T, hkv, d).transpose(1, 2)
                return lambda: lg(q4, k4, cos[None], sin[None])

            base = B.collect(rec, "rope", {
                "flashinfer.rope.apply_rope_with_cos_sin_cache_inplace (fp32 cos/sin cache)": fi_cache,
                "flashinfer.rope.apply_rope_pos_ids (cos/sin in kernel)": fi_pos_ids,
                "liger_kernel.transformers.rope.liger_rotary_pos_emb (cos/sin given)": liger_call,
                "torch.compile(transformers Qwen3 rotary cos/sin + apply_rotary_pos_emb)":
                    lambda: B.call_or_raise((lambda: c_hf(q, k, pos)) if callable(c_hf) else c_hf),
            })
            ctx = {} if hf_apply is None else {
                "eager_hf": lambda: hf_apply(q, k, *_hf_cos_sin(pos, inv, 1.0, torch.bfloat16), unsqueeze_dim=1),
                "eager_hf_apply_only": lambda: hf_apply(q, k, cos, sin, unsqueeze_dim=1)}
            nbytes = 2 * T * (hq + hkv) * d * 2 + T * 8
            row = B.compare(rec, f"rope[{name}/T{T}]", lambda: apply_rope(q, k, pos, inv), base, ctx, T=T,
                            heads=f"{hq}/{hkv}", bytes=nbytes)
            ours = row["ours"]
            if T >= 4096:
                streamed(rec, "rope/ours", ours, nbytes,
                         lambda i: (lambda q=copy_of(q, i), k=copy_of(k, i): apply_rope(q, k, pos, inv)))
            row["ours_bw"] = bw = tbps(nbytes, ours)
            if bw:
                row["ours_share"] = B.shares(bw.get("graph_tbps"), B.measured_copy_tbps())
            if T >= 4096:
                add_shares(ratios, bw, T)
            rows.append(row)
    B.summarize(rec, rows)
    for k, v in ratios.items():
        rec.summarize(k, v)
