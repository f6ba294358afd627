"""GPU contract checks and benchmarks for the Qwen3-MoE block (Qwen3-30B-A3B shapes on H200).

Checks: a token alone (T=1) == the same token inside T in {8, 64, 1024, 4096, 16384}; a token alone
== inside a batch where every other token picks the same experts / none of its experts; every
grouped-GEMM configuration gives the same bits; CUDA-graph replay == eager; accuracy vs
transformers' Qwen3MoeSparseMoeBlock in fp32; gradients vs an fp32 reference. Benchmarks: the
whole block vs the HF block (eager experts loop and HF's grouped_mm experts) at T in
{1, 64, 1024, 4096}.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from areal_tik_plugin import bench
from areal_tik_plugin.contract import baselines as B
from areal_tik_plugin.contract.suite import timed as _time
from areal_tik_plugin.ops import linear, moe_block, moe_experts, moe_route

DEV = "cuda"
E, TOP_K, H, I = 128, 8, 2048, 768  # Qwen3-30B-A3B
BENCH_T = (1, 64, 1024, 4096)


def _moe():
    from areal_tik_plugin.runtime.loader import get_implementation

    return get_implementation().module("moe")


def _weights(e=None, h=None, i=None, dtype=torch.bfloat16, seed=0):
    e, h, i = e or E, h or H, i or I
    g = torch.Generator(device=DEV).manual_seed(seed)
    router = (torch.randn(e, h, device=DEV, generator=g) * 0.02).to(dtype)
    wgu = (torch.randn(e, 2 * i, h, device=DEV, generator=g) * 0.02).to(dtype)
    wd = (torch.randn(e, h, i, device=DEV, generator=g) * 0.02).to(dtype)
    return router, wgu, wd


def _x(T, h=None, dtype=torch.bfloat16, seed=1):
    h = h or H
    g = torch.Generator(device=DEV).manual_seed(seed)
    return torch.randn(T, h, device=DEV, generator=g).to(dtype)


def _hf_block(router, wgu, wd, impl, dtype):
    from transformers.models.qwen3_moe.configuration_qwen3_moe import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    e, h = router.shape
    cfg = Qwen3MoeConfig(hidden_size=h, num_experts=e, num_experts_per_tok=TOP_K, moe_intermediate_size=wd.shape[2],
                         norm_topk_prob=True, hidden_act="silu", experts_implementation=impl)
    blk = Qwen3MoeSparseMoeBlock(cfg).to(device=DEV, dtype=dtype)
    with torch.no_grad():
        blk.gate.weight.copy_(router)
        blk.experts.gate_up_proj.copy_(wgu)
        blk.experts.down_proj.copy_(wd)
    return blk


# ------------------------------------------------------------------------------------------------
# contract checks
# ------------------------------------------------------------------------------------------------
def _check_token_invariance(rec, Ts):
    router, wgu, wd = _weights()
    Tmax = max(Ts)
    x = _x(Tmax)
    probe = sorted(i for i in {0, 1, 7, 63, 64, 1023, 4095, Tmax - 1, 3333 % Tmax, 9999 % Tmax} if i < Tmax)
    single = {i: moe_block(x[i:i + 1], router, wgu, wd, TOP_K, True) for i in probe}
    moe = _moe()
    for T in Ts:
        rows = [i for i in probe if i < T]
        out, logits = moe_block(x[:T], router, wgu, wd, TOP_K, True)
        cfg = moe.config_for(T * TOP_K, E)["name"]
        rec.bitwise(f"token_vs_alone[T={T}]", out[rows], torch.cat([single[i][0] for i in rows]), config=cfg)
        rec.bitwise(f"router_logits_vs_alone[T={T}]", logits[rows], torch.cat([single[i][1] for i in rows]))
    # position: reversed batch
    T = min(513, Tmax)
    idx = torch.arange(T - 1, -1, -1, device=DEV)
    fwd, _ = moe_block(x[:T], router, wgu, wd, TOP_K, True)
    rev, _ = moe_block(x[:T][idx].contiguous(), router, wgu, wd, TOP_K, True)
    rec.bitwise("token_position", rev[idx.argsort()], fwd)


def _check_shared_experts(rec, T=2048):
    """Token 0 alone == among T-1 tokens on the same k experts == among tokens on other experts."""
    _, wgu, wd = _weights(seed=2)
    x = _x(T, seed=3)
    w = torch.rand(T, TOP_K, device=DEV)
    w = w / w.sum(-1, keepdim=True)
    stride = E // TOP_K
    mine = torch.arange(TOP_K, dtype=torch.int32, device=DEV) * stride + stride // 2
    ids_same = mine.expand(T, TOP_K).contiguous()
    other = torch.tensor([e for e in range(E) if e not in mine.tolist()][:TOP_K], dtype=torch.int32, device=DEV)
    ids_other = other.expand(T, TOP_K).contiguous()
    ids_other[0] = mine
    alone = moe_experts(x[:1], wgu, wd, w[:1], ids_same[:1])
    for name, ids in (("same_experts", ids_same), ("other_experts", ids_other)):
        out = moe_experts(x, wgu, wd, w, ids)
        rec.bitwise(f"shared_vs_alone[{name}]", out[:1], alone)
    # random routing, the token at several positions
    ids_rand = torch.stack([torch.randperm(E, device=DEV)[:TOP_K] for _ in range(T)]).to(torch.int32)
    ids_rand[0] = mine
    out = moe_experts(x, wgu, wd, w, ids_rand)
    rec.bitwise("shared_vs_alone[random]", out[:1], alone)


def _check_all_configs(rec, T=300):
    moe = _moe()
    router, wgu, wd = _weights(seed=4)
    x = _x(T, seed=5)
    wts, ids = moe_route(linear(x, router), TOP_K, True)
    ref = moe.experts(x, wgu, wd, wts, ids)
    for cfg in moe.all_configs():
        rec.bitwise(f"config[{cfg['name']}]", moe.experts(x, wgu, wd, wts, ids, config=cfg), ref)
    # the grouped-GEMM configuration is a function of (T*k, E) only
    rec.check("config_table", True,
              chosen={T: moe.config_for(T * TOP_K, E)["name"] for T in (1, 8, 64, 256, 1024, 4096, 16384)})


def _check_graph(rec):
    router, wgu, wd = _weights(seed=6)
    for T in (1, 64):
        x = _x(T, seed=7 + T)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            moe_block(x, router, wgu, wd, TOP_K, True)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out_s, logits_s = moe_block(x, router, wgu, wd, TOP_K, True)
        for it in range(2):
            x.copy_(torch.randn_like(x))
            g.replay()
            torch.cuda.synchronize()
            out_e, logits_e = moe_block(x, router, wgu, wd, TOP_K, True)
            rec.bitwise(f"graph_replay_vs_eager[T={T}/{it}]", out_s.clone(), out_e)
            rec.bitwise(f"graph_replay_logits[T={T}/{it}]", logits_s.clone(), logits_e)


def _check_vs_hf(rec, T=512):
    try:
        import transformers  # noqa: F401
    except Exception as e:
        rec.check("accuracy_vs_hf", True, skipped=f"transformers unavailable: {e}"[:200])
        return
    router, wgu, wd = _weights(seed=8)
    x = _x(T, seed=9)
    out, logits = moe_block(x, router, wgu, wd, TOP_K, True)
    ref_blk = _hf_block(router.float(), wgu.float(), wd.float(), "eager", torch.float32)
    hf16 = _hf_block(router, wgu, wd, "eager", torch.bfloat16)
    with torch.no_grad():
        ref_logits, _, ref_ids = ref_blk.gate(x.float())
        ref = ref_blk(x.float().view(1, T, H)).view(T, H)
        hf_out = hf16(x.view(1, T, H)).view(T, H)
    rec.close("router_logits_vs_hf_fp32", logits, ref_logits, atol=1e-2, rtol=1e-2)
    p = torch.softmax(ref_logits, -1).sort(-1, descending=True).values
    clear = (p[:, TOP_K - 1] - p[:, TOP_K]) > 1e-3
    _, ids = moe_route(logits, TOP_K, True)
    same = (ids[clear].long().sort(-1).values == ref_ids[clear].sort(-1).values).all(-1)
    rec.check("expert_choice_vs_hf_fp32", bool(same.all()), tokens_checked=int(clear.sum()),
              mismatched=int((~same).sum()))
    rec.close("output_vs_hf_fp32", out[clear], ref[clear], atol=1e-2, rtol=2e-2, tokens=int(clear.sum()))
    e_ours = float((out[clear].double() - ref[clear].double()).abs().max())
    e_hf = float((hf_out[clear].double() - ref[clear].double()).abs().max())
    rec.check("error_not_worse_than_hf_bf16", e_ours <= 1.5 * e_hf + 1e-6, ours=e_ours, hf_bf16=e_hf)


def _check_backward(rec, e=16, k=4, h=256, i=128, T=257):
    router, wgu, wd = _weights(e, h, i, seed=10)
    x = _x(T, h, seed=11)
    params = [t.clone().requires_grad_() for t in (x, router, wgu, wd)]
    out, _ = moe_block(*params, k, True)
    gy = torch.randn_like(out)
    grads = torch.autograd.grad(out, params, gy)
    _, ids = moe_route(linear(x, router), k, True)
    ref_p = [t.detach().float().requires_grad_() for t in (x, router, wgu, wd)]
    xr, rr, gur, dr = ref_p
    p = torch.softmax(xr @ rr.t(), -1)
    w = p.gather(1, ids.long())
    w = w / w.sum(-1, keepdim=True)
    ref = torch.zeros_like(xr)
    for j in range(k):
        ej = ids[:, j].long()
        gu = torch.einsum("th,tnh->tn", xr, gur[ej])
        a = F.silu(gu[:, :i]) * gu[:, i:]
        ref = ref + w[:, j:j + 1] * torch.einsum("ti,thi->th", a, dr[ej])
    refs = torch.autograd.grad(ref, ref_p, gy.float())
    for name, a, r in zip(("dx", "d_router", "d_gate_up", "d_down"), grads, refs):
        rel = float((a.double() - r.double()).norm() / r.double().norm())
        rec.check(f"grad_{name}", rel < 3e-2, rel_l2=rel)


def run_checks(rec, quick: bool = False) -> None:
    torch.manual_seed(0)
    rec.run("token_invariance", _check_token_invariance, rec, (8, 64, 1024) if quick else (8, 64, 1024, 4096, 16384))
    rec.run("shared_experts", _check_shared_experts, rec)
    rec.run("all_configs", _check_all_configs, rec)
    rec.run("cuda_graph", _check_graph, rec)
    rec.run("accuracy_vs_hf", _check_vs_hf, rec)
    rec.run("backward", _check_backward, rec)


# ------------------------------------------------------------------------------------------------
# benchmarks
# ------------------------------------------------------------------------------------------------


GMM_NAME = "transformers Qwen3MoeSparseMoeBlock, experts_implementation='grouped_mm' (torch._grouped_mm)"


def _need(block, x3):
    if block is None:
        raise B.Unavailable("transformers Qwen3MoeSparseMoeBlock (grouped_mm) could not be built (see errors)")
    return lambda: block(x3)


def _fi_moe_unavailable():
    B.flashinfer()
    raise B.Unavailable("flashinfer fused MoE: its CUTLASS / TRT-LLM MoE sources are not in the carried trimmed "
                        "wheel (devenv/flashinfer_wheel.py keeps attention, norm, RoPE, activation only)")


def run_bench(rec, quick: bool = False) -> None:
    """Ours (whole block) vs the fastest grouped-GEMM path available: HF's block on ``torch._grouped_mm``
    experts (one grouped GEMM per projection); HF's per-expert loop as context."""
    torch.manual_seed(0)
    router, wgu, wd = _weights(seed=12)
    try:
        hf_eager = _hf_block(router, wgu, wd, "eager", torch.bfloat16)
        hf_gmm = _hf_block(router, wgu, wd, "grouped_mm", torch.bfloat16)
    except Exception as e:
        rec.errors.append(f"HF Qwen3MoeSparseMoeBlock unavailable: {type(e).__name__}: {e}"[:300])
        hf_eager = hf_gmm = None
    moe = _moe()
    rows = []
    for T in (BENCH_T if not quick else (1, 1024)):
        x = _x(T, seed=13)
        x3 = x.view(1, T, H)
        base = B.collect(rec, "moe", {
            GMM_NAME: lambda: _need(hf_gmm, x3),
            "flashinfer.fused_moe (cutlass_fused_moe / trtllm_bf16_moe)": _fi_moe_unavailable,
        })
        _, ids = moe_route(linear(x, router), TOP_K, True)
        active = int(torch.unique(ids).numel())
        flops = 2.0 * T * TOP_K * 3 * H * I + 2.0 * T * H * E
        wbytes = 2.0 * active * 3 * H * I + 2.0 * E * H
        # eager HF (per-expert loop) is context only and not graph-captured (host-synchronizing loop)
        row = B.compare(rec, f"moe_block_T{T}", lambda: moe_block(x, router, wgu, wd, TOP_K, True), base, None,
                        T=T, config=moe.config_for(T * TOP_K, E)["name"], active_experts=active)
        ours = row["ours"]
        ev = _time(rec, f"hf eager T={T}", lambda: hf_eager(x3), graph=False) if hf_eager is not None else None
        row["context"] = {"eager_hf": ev or "unavailable"}
        row[B.CONTEXT_KEY] = {"eager_hf": {"cold": bench.ratio(ev, ours, "cold_us") if ev and ours else None,
                                           "graph": None}}
        rows.append(row)
        if ours:
            for key in ("cold_us", "graph_us"):
                if ours.get(key):
                    row[f"ours_tflops_{key[:-3]}"] = flops / (ours[key] * 1e-6) / 1e12
                    row[f"ours_weight_tbps_{key[:-3]}"] = wbytes / (ours[key] * 1e-6) / 1e12
    # training step of the block (forward + backward), informative
    if not quick and hf_gmm is not None:
        T = 4096
        x = _x(T, seed=14).requires_grad_()
        params = [router.clone().requires_grad_(), wgu.clone().requires_grad_(), wd.clone().requires_grad_()]
        gy = torch.randn(T, H, device=DEV, dtype=torch.bfloat16)

        def ours_fb():
            out, _ = moe_block(x, *params, TOP_K, True)
            return torch.autograd.grad(out, [x] + params, gy)

        hf_gmm.requires_grad_(True)

        def hf_fb():
            out = hf_gmm(x.view(1, T, H)).view(T, H)
            return torch.autograd.grad(out, [x] + list(hf_gmm.parameters()), gy)

        a = _time(rec, "ours fwd+bwd", ours_fb, graph=False)
        b = _time(rec, "hf grouped_mm fwd+bwd", hf_fb, graph=False)
        rec.bench(f"moe_block_fwd_bwd_T{T}", **B.build_row(a, {GMM_NAME: b}))
    B.summarize(rec, rows)
