"""Smoke run of the GPU layer benchmark's code paths on CPU (tiny dense / MoE layer, timing stubbed):
batch 1 and a mixed-length batch, the SGLang-like baseline rollout without FlashInfer (torch, named),
AReaL's update with the recompute forward, the probes."""

import pytest
import torch

from benchmarks import layer_bench as LB


@pytest.fixture
def fake_time(monkeypatch):
    def fake(fn, *, graph, errors, tag):
        fn()
        return {"cold_us": 10.0, "graph_us": 5.0 if graph else None}

    monkeypatch.setattr(LB, "_time", fake)


@pytest.mark.parametrize("model", ["tiny-qwen3-moe", "tiny-qwen3"])
def test_layer_bench_runs_every_phase_on_cpu(fake_time, model):
    knobs = ((4, 3), (8, 2)) if model == "tiny-qwen3" else ()
    r = LB.bench_model(model, True, (3,), prompt=6, device="cpu", ctx_points=(1, 3) if knobs else (3,), profile=bool(knobs),
                       decode_knobs=knobs, repeat=2 if knobs else 1, pdl_probe=bool(knobs), batches=(1, 3) if knobs else (1,))
    assert r["errors"] == [], r["errors"]
    names = r["notes"]["baseline_rollout"]
    assert names["norms"].startswith("transformers") and "flashinfer" in names  # fallback recorded by name
    if knobs:  # PDL off / on (a no-op under the interpreter), 3 alternations, bits compared
        pp = r["pdl_probe"]
        assert pp["same_bits"] and len(pp["samples"]["on"]) == 3 == len(pp["samples"]["off"]), pp
        assert all(len(d["samples"]["plugin"]) == 2 == len(d["samples"]["baseline"]) for d in r["decode_steps"])
        assert [(k["warps"], k["stages"]) for k in r["decode_knobs"]][1:] == list(knobs)
    assert not knobs or set(r["profile"]) == {"plugin.prefill", "baseline.prefill", "plugin.decode", "baseline.decode"}
    assert [d["ctx"] for d in r["decode_steps"]] == ([7, 9] if knobs else [9])
    b1 = r["results"][0]
    assert b1["batch"] == 1
    assert b1["ratio"] > 1.0 and b1["baseline_us"]["recompute_fwd"] == 10.0
    assert b1["sanity_rel_l2_plugin_vs_baseline"] < 2e-2
    assert b1["baseline_names"]["prefill_attention"].startswith("torch SDPA")
    if knobs:  # the mixed batch: its update interpolated per request, its decode on the torch_native fallback
        b3 = r["results"][1]
        assert b3["batch"] == 3 and b3["update_method"].startswith("per request, interpolated") and b3["ratio"] > 0
        mixed = r["batches"][1]
        assert len(mixed["prompt_lens"]) == 3 and mixed["decode_steps"][0]["mean_ctx"] > 1
        assert "gathered from the pool" in mixed["decode_steps"][0]["baseline_attention"]


def test_helpers():
    assert LB._decode_total({7: 1.0, 9: 3.0}, 3, 6) == 1.0 + 2.0 + 3.0
    assert LB._interp({10: 1.0, 20: 3.0}, 15) == 2.0 and LB._interp({10: 1.0, 20: 3.0}, 30) == 5.0
    assert LB._interp({10: 2.0}, 5) == 1.0
    lens = LB.mixed_prompts(64, 1024)
    assert len(lens) == 64 and min(lens) >= 256 and max(lens) <= 1792 and lens == LB.mixed_prompts(64, 1024)
    with pytest.raises(ValueError):
        LB.mixed_prompts(0, 1024)
    assert LB._median_time([{"a": 3.0, "b": None}, {"a": 1.0, "b": None}, None, {"a": 2.0, "b": None}]) == \
        {"a": 2.0, "b": None}


class _FakeFlashInfer:
    """FlashInfer's norm / RoPE / activation semantics in torch (in place where FlashInfer is), to check the
    baseline layer's data flow on the FlashInfer path against its torch path on CPU."""

    class norm:
        @staticmethod
        def rmsnorm(x, w, eps):
            xf = x.float()
            return (xf * (xf.pow(2).mean(-1, keepdim=True) + eps).rsqrt() * w.float()).to(x.dtype)

        @staticmethod
        def fused_add_rmsnorm(x, r, w, eps):
            r.add_(x)
            x.copy_(_FakeFlashInfer.norm.rmsnorm(r, w, eps))

    class rope:
        @staticmethod
        def apply_rope_with_cos_sin_cache_inplace(pos, q, k, D, cache, is_neox=True):
            assert is_neox and cache.dtype.is_floating_point
            cos, sin = cache[pos, : D // 2][:, None], cache[pos, D // 2:][:, None]
            for t in (q, k):
                x = t.view(t.shape[0], -1, D).float()
                x1, x2 = x[..., : D // 2], x[..., D // 2:]
                t.view(t.shape[0], -1, D).copy_(torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).to(t.dtype))

    class activation:
        @staticmethod
        def silu_and_mul(gu):
            g, u = gu.chunk(2, -1)
            return torch.nn.functional.silu(g) * u



def test_baseline_layer_flashinfer_path_matches_its_torch_path():
    from areal_tik_plugin.integrations import transformers as T

    cfg, base, rotary, mod, _ = LB.build_layer("tiny-qwen3", torch.float32, torch.device("cpu"))
    fw = T.rollout_weights(base, torch.float32)
    inv, _ = T.rope_params(rotary, torch.device("cpu"))
    ref = LB.RolloutStack(base, mod, fw, device="cpu", use_flashinfer=False)
    fi = LB.RolloutStack(base, mod, fw, device="cpu", use_flashinfer=False)
    fi.fi = _FakeFlashInfer
    fi.set_rope_cache(inv, 64, "cpu")
    n, H = 9, cfg.hidden_size
    g = torch.Generator().manual_seed(0)
    h, r = torch.randn(n, H, generator=g), torch.randn(n, H, generator=g)
    pos = torch.arange(3, 3 + n)
    cos, sin = rotary(h[None], pos[None])
    scale = base.self_attn.scaling

    def attend(q, k, v):
        o = torch.nn.functional.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                                                             v.transpose(0, 1)[None], scale=scale, is_causal=True,
                                                             enable_gqa=True)
        return o[0].transpose(0, 1)

    with torch.no_grad():
        m0, r0 = ref.layer(h.clone(), r.clone(), pos, (cos, sin), attend)
        m1, r1 = fi.layer(h.clone(), r.clone(), pos, None, attend)
    assert torch.allclose(r0, r1, atol=1e-5, rtol=1e-5)
    assert torch.allclose(m0, m1, atol=1e-4, rtol=1e-4), float((m0 - m1).abs().max())
