"""megatron-core with the plugin's spec: bits against the patched HF model and the rollout replay,
packed THD vs per-sequence vs sbhd, a training step's gradients vs an fp32 reference, the exact
HF <-> Megatron weight round trip, and the refusals."""

from __future__ import annotations

import pytest

from tests.megatron import _mg  # noqa: F401  (skips the module without megatron-core)
from tests.megatron._mg import bits_equal, pair, seqs

import torch  # noqa: E402

LENS = [7, 1, 12]          # packed sequence lengths (odd, one single-token sequence)
PROMPTS, RESPONSES = [5, 9], [3, 4]


@pytest.fixture(scope="module", params=["tiny-qwen3", "tiny-qwen3-moe"])
def models(request):
    return pair(request.param)


def test_megatron_logits_equal_patched_hf_and_rollout(models):
    from areal_tik_plugin import verify as V
    from areal_tik_plugin.integrations.megatron.verify import megatron_packed_logits

    hf, mg = models
    V_ = hf.config.vocab_size
    prompts, responses = seqs(V_, PROMPTS, 2), seqs(V_, RESPONSES, 3)
    full = [torch.cat([p, r]) for p, r in zip(prompts, responses)]
    with torch.no_grad():
        mgl = megatron_packed_logits(mg, full, "cpu")
        hfl = V.hf_packed_logits(hf, full, "cpu")
        store = [torch.empty(int(s.numel()), V_, dtype=torch.bfloat16) for s in full]
        V.plugin_rollout_logits(hf, prompts, responses, "cpu", store, page_size=4, seed=0)
    for a, b, c in zip(mgl, hfl, store):
        assert bits_equal(a, b), "Megatron vs patched HF forward"
        assert bits_equal(a, c), "Megatron full-sequence forward vs prefill + paged decode"
    # the check can fail: one ulp on every element of one norm weight changes the logits
    with torch.no_grad():
        w = mg.decoder.layers[0].self_attention.linear_qkv.layer_norm_weight
        w.view(torch.int16).add_(1)
        try:
            assert not bits_equal(megatron_packed_logits(mg, full[:1], "cpu")[0], mgl[0])
        finally:
            w.view(torch.int16).sub_(1)


def test_packed_thd_equals_per_sequence_and_sbhd(models):
    from areal_tik_plugin.integrations.megatron.verify import megatron_packed_logits

    hf, mg = models
    xs = seqs(hf.config.vocab_size, LENS, 4)
    with torch.no_grad():
        packed = megatron_packed_logits(mg, xs, "cpu")
        for x, p in zip(xs, packed):
            assert bits_equal(megatron_packed_logits(mg, [x], "cpu")[0], p)
        # sbhd [s, b] without packed_seq_params (equal lengths, batch 2)
        two = seqs(hf.config.vocab_size, [9, 9], 5)
        ids = torch.stack(two)
        pos = torch.arange(9).expand(2, 9)
        sbhd = mg(ids, pos, None)
        ref = megatron_packed_logits(mg, two, "cpu")
    for i in range(2):
        assert bits_equal(sbhd[i], ref[i])


def _nll(logits, ids):
    return -torch.log_softmax(logits[:-1].float(), -1).gather(1, ids[1:, None]).sum()


def test_training_step_gradients_match_fp32_reference(models):
    """Megatron (bf16, plugin ops, autograd) vs the stock HF model in fp32 on the same weights."""
    from areal_tik_plugin import verify as V
    from areal_tik_plugin.integrations.megatron import convert as C
    from areal_tik_plugin.integrations.megatron.verify import megatron_packed_logits
    from tests.helpers.tolerances import GRAD_REL_TOL

    hf, mg = models
    xs = seqs(hf.config.vocab_size, LENS, 6)
    mg.train()
    mg.zero_grad(set_to_none=True)
    try:
        loss = sum(_nll(lg, x) for lg, x in zip(megatron_packed_logits(mg, xs, "cpu"), xs))
        loss.backward()
        grads = {k: p.grad for k, p in mg.named_parameters()}
    finally:
        mg.eval()
    assert all(g is not None for g in grads.values()), [k for k, g in grads.items() if g is None]
    hf_grads = C.mcore_to_hf([(grads, 0)], hf.config)
    ref = V.build_model("tiny-qwen3-moe" if hf.config.model_type == "qwen3_moe" else "tiny-qwen3",
                        dtype=torch.float32, attn_implementation="eager")
    ref.load_state_dict({k: v.float() for k, v in hf.state_dict().items()}, strict=True)
    ref.train()
    rloss = sum(_nll(ref(input_ids=x[None]).logits[0], x) for x in xs)
    rloss.backward()
    rtol = GRAD_REL_TOL[torch.bfloat16]
    assert abs(float(loss) - float(rloss)) <= rtol * abs(float(rloss))
    worst = {}
    for k, p in ref.named_parameters():
        g, r = hf_grads[k].float(), p.grad
        worst[k] = float((g - r).norm() / r.norm().clamp_min(1e-30))
    bad = {k: v for k, v in worst.items() if v > rtol}
    assert not bad, bad


@pytest.mark.parametrize("name", ["tiny-qwen2", "tiny-qwen3-moe", "tiny-llama"])
def test_hf_megatron_hf_round_trip_is_exact(name):
    from areal_tik_plugin import verify as V
    from areal_tik_plugin.integrations.megatron import convert as C

    _mg.setup()
    hf = V.build_model(name, seed=7)
    if name == "tiny-qwen2":
        assert any(k.endswith("q_proj.bias") for k in hf.state_dict())
    mg = C.build_model(hf.config)
    C.load_hf_into(mg, hf, hf.config)
    back = C.mcore_to_hf([(mg.state_dict(), 0)], hf.config)
    ref = hf.state_dict()
    assert sorted(back) == sorted(ref)
    for k in ref:
        assert bits_equal(back[k], ref[k]), k
    # the QKV interleave per query group: group 1's first row is query head npg's first row
    hd, ng, nh = hf.config.head_dim if name != "tiny-qwen2" else 16, hf.config.num_key_value_heads, hf.config.num_attention_heads
    qkv = mg.decoder.layers[0].self_attention.linear_qkv.weight
    q = hf.model.layers[0].self_attn.q_proj.weight
    k = hf.model.layers[0].self_attn.k_proj.weight
    npg = nh // ng
    assert bits_equal(qkv[(npg + 2) * hd], q[npg * hd])
    assert bits_equal(qkv[npg * hd], k[0])


def test_refusals():
    from areal_tik_plugin import verify as V
    from areal_tik_plugin.integrations.megatron import convert as C
    from areal_tik_plugin.integrations.megatron.spec import TikMegatronConfigError, check_config

    _mg.setup()
    hf = V.build_model("tiny-qwen3").config
    for kw, word in [({"tensor_model_parallel_size": 2}, "tensor_model_parallel_size=2"),
                     ({"context_parallel_size": 2}, "context_parallel_size=2"),
                     ({"sequence_parallel": True, "tensor_model_parallel_size": 2}, "sequence_parallel"),
                     ({"fp8": "hybrid"}, "fp8"),
                     ({"apply_rope_fusion": True}, "apply_rope_fusion"),
                     ({"hidden_dropout": 0.1}, "hidden_dropout")]:
        cfg = C.mcore_config(hf)
        for a, v in kw.items():
            setattr(cfg, a, v)
        with pytest.raises(TikMegatronConfigError, match=word):
            check_config(cfg, "qwen3")
    with pytest.raises(ValueError, match="mistral"):
        check_config(C.mcore_config(hf), "mistral")
    with pytest.raises(TikMegatronConfigError, match="qk_layernorm"):
        check_config(C.mcore_config(hf), "llama")
    bad = V.build_model("tiny-qwen3").config
    bad.model_type = "gemma"
    with pytest.raises(ValueError, match="gemma"):
        C.check_hf_config(bad)


def test_tied_embeddings_output_layer():
    """Qwen3-4B / Qwen2.5 tie lm_head to the embedding: the output layer reads the shared weight."""
    from transformers import AutoModelForCausalLM

    from areal_tik_plugin import verify as V
    from areal_tik_plugin.integrations import transformers as TT
    from areal_tik_plugin.integrations.megatron.verify import megatron_model_from_hf, megatron_packed_logits

    _mg.setup()
    cfg = _mg.pair_config("tiny-qwen3")
    cfg.tie_word_embeddings = True
    torch.manual_seed(5)
    hf = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
    mg, back = megatron_model_from_hf(hf)
    assert "output_layer.weight" not in mg.state_dict()
    assert sorted(back) == sorted(hf.state_dict())
    hf.load_state_dict(back, strict=True)
    TT.apply_to_model(hf)
    xs = seqs(cfg.vocab_size, [4, 9], 8)
    with torch.no_grad():
        for a, b in zip(megatron_packed_logits(mg.eval(), xs, "cpu"), V.hf_packed_logits(hf, xs, "cpu")):
            assert bits_equal(a, b)


def test_megatron_training_schedule_runs_the_spec(models):
    """megatron-core's own ``forward_backward_no_pipelining`` (what AReaL's engine calls for PP 1)
    over the plugin spec: the same gradients, bit for bit, as a direct backward."""
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from areal_tik_plugin.integrations.megatron.verify import megatron_packed_logits, packed_params

    hf, mg = models
    xs = seqs(hf.config.vocab_size, [5, 8], 11)
    n = [int(x.numel()) for x in xs]
    ids, pos = torch.cat(xs)[None], torch.cat([torch.arange(k) for k in n])[None]
    loss_of = lambda lg: -torch.log_softmax(lg.float(), -1).gather(1, torch.roll(ids[0], -1)[:, None]).sum()  # noqa: E731

    def step(it, model):
        b = next(it)
        out = model(b["ids"], b["pos"], None, packed_seq_params=packed_params(n, "cpu"))
        return out, lambda o: (loss_of(o[0]), {"loss": loss_of(o[0]).detach()})

    mg.train()
    try:
        mg.zero_grad(set_to_none=True)
        with _mg.CudaToCpu():
            res = get_forward_backward_func()(forward_step_func=step, data_iterator=iter([{"ids": ids, "pos": pos}]),
                                              model=[mg], num_microbatches=1, seq_length=sum(n), micro_batch_size=1,
                                              forward_only=False)
        sched = {k: p.grad.clone() for k, p in mg.named_parameters()}
        mg.zero_grad(set_to_none=True)
        direct = loss_of(torch.cat(megatron_packed_logits(mg, xs, "cpu")))
        direct.backward()
        assert bits_equal(res[0]["loss"], direct.detach())
        for k, p in mg.named_parameters():
            assert bits_equal(sched[k], p.grad), k
    finally:
        mg.zero_grad(set_to_none=True)
        mg.eval()


def test_core_attention_refuses_what_it_cannot_keep():
    from megatron.core.packed_seq_params import PackedSeqParams
    from megatron.core.transformer.enums import AttnMaskType

    from areal_tik_plugin.integrations.megatron import convert as C
    from areal_tik_plugin.integrations.megatron.spec import TikCoreAttention

    _mg.setup()
    cfg = C.mcore_config(_mg.pair_config("tiny-qwen3"))
    with pytest.raises(ValueError, match="attn_mask_type"):
        TikCoreAttention(config=cfg, layer_number=1, attn_mask_type=AttnMaskType.no_mask)
    ca = TikCoreAttention(config=cfg, layer_number=1, attn_mask_type=AttnMaskType.causal)
    q = torch.randn(7, 4, 16).to(torch.bfloat16)
    kv = torch.randn(7, 2, 16).to(torch.bfloat16)
    cu, padded = torch.tensor([0, 3, 7], dtype=torch.int32), torch.tensor([0, 4, 7], dtype=torch.int32)
    with pytest.raises(ValueError, match="cu_seqlens_q_padded"):
        ca(q, kv, kv, None, packed_seq_params=PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu,
                                                               cu_seqlens_q_padded=padded, max_seqlen_q=4))
    with pytest.raises(ValueError, match="attention_mask"):
        ca(q, kv, kv, torch.ones(1, 1, 7, 7, dtype=torch.bool))
    with pytest.raises(ValueError, match="from 0 to 7"):
        bad = torch.tensor([0, 3, 6], dtype=torch.int32)
        ca(q, kv, kv, None, packed_seq_params=PackedSeqParams(qkv_format="thd", cu_seqlens_q=bad, cu_seqlens_kv=bad))
    ok = ca(q, kv, kv, None, packed_seq_params=PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu))
    assert ok.shape == (7, 64)


def test_full_activation_recompute_same_gradients(models, monkeypatch):
    """AReaL's default ``recompute_granularity=full`` (uniform, 1 layer): the layers' forward runs
    again inside backward; same gradient bits. CPU shim: megatron-core's CheckpointFunction saves
    and restores the CUDA RNG state (irrelevant here: no dropout), mapped to the CPU generator."""
    from megatron.core.tensor_parallel import random as R

    from areal_tik_plugin.integrations.megatron import convert as C
    from areal_tik_plugin.integrations.megatron.verify import megatron_packed_logits

    monkeypatch.setattr(R, "_get_cuda_rng_state", lambda *a, **k: torch.get_rng_state())
    monkeypatch.setattr(R, "_set_cuda_rng_state", lambda *a, **k: None)
    hf, mg = models
    xs = seqs(hf.config.vocab_size, [5, 8], 12)
    ids = torch.cat(xs)

    def grads(m):
        m.train()
        m.zero_grad(set_to_none=True)
        lg = torch.cat(megatron_packed_logits(m, xs, "cpu"))
        (-torch.log_softmax(lg.float(), -1).gather(1, torch.roll(ids, -1)[:, None]).sum()).backward()
        out = {k: p.grad.clone() for k, p in m.named_parameters()}
        m.zero_grad(set_to_none=True)
        m.eval()
        return out

    cfg = C.mcore_config(hf.config, recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
    rec = C.build_model(hf.config, cfg)
    C.load_hf_into(rec, hf, hf.config)
    want, got = grads(mg), grads(rec)
    for k in want:
        assert bits_equal(got[k], want[k]), k
