"""Smoke run of the GPU layer benchmark's code paths on CPU (tiny dense / MoE layer, timing stubbed):
batch 1 and a mixed-length batch, the SGLang-like baseline rollout without FlashInfer (torch, named),
AReaL's update with the recompute forward, the probes."""

import pytest

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
