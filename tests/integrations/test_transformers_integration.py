"""transformers integration (policy-update path): CPU tests under the Triton interpreter.

Two kinds of test, never mixed: bitwise (packed == separate == padded, cached decode == full
sequence, class-level == instance-level patching) on raw bits, and accuracy of the patched bf16
model (logits, gradients, a few optimizer steps) against an fp64 reference, with the unpatched bf16
model's own error as the yardstick.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

pytest.importorskip("transformers")

from areal_tik_plugin import ops  # noqa: E402
from areal_tik_plugin.integrations import logprobs as LP  # noqa: E402
from areal_tik_plugin.integrations import transformers as T  # noqa: E402
from areal_tik_plugin.verify import _cache_kw, _out_cache, build_model  # noqa: E402

FAMILIES = {"qwen2": "tiny-qwen2", "qwen3": "tiny-qwen3", "qwen3_moe": "tiny-qwen3-moe", "llama": "tiny-llama"}
LENS = (7, 1, 10)  # odd lengths, one single-token sequence


def bits(x):
    return x.contiguous().view({2: torch.int16, 4: torch.int32, 8: torch.int64}[x.element_size()])


def assert_bitwise(a, b, what=""):
    assert a.shape == b.shape, (what, a.shape, b.shape)
    assert torch.equal(bits(a), bits(b)), f"{what}: max |diff| {float((a.float() - b.float()).abs().max())}"


def rel_l2(x, ref):
    return float((x.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30))


def seqs_for(vocab, lens=LENS, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=g) for n in lens]


def packed_kwargs(seqs):
    n = [s.numel() for s in seqs]
    cu = torch.zeros(len(n) + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(torch.tensor(n), 0)
    return dict(input_ids=torch.cat(seqs)[None], position_ids=torch.cat([torch.arange(k) for k in n])[None],
                cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=max(n), max_length_k=max(n), use_cache=False)


def split_rows(t, seqs):
    return list(torch.split(t, [s.numel() for s in seqs]))


_CACHE = {}


def stock_model(family):
    """Unpatched tiny bf16 model (shared; never patched in place)."""
    if family not in _CACHE:
        _CACHE[family] = build_model(FAMILIES[family], seed=3)
    return _CACHE[family]


def fp64_reference(model):
    """fp64 copy of the unpatched model with eager attention (and eager experts for MoE)."""
    ref = copy.deepcopy(model).double()
    ref.set_attn_implementation("eager")
    if hasattr(ref, "set_experts_implementation") and getattr(ref.config, "num_experts", None):
        ref.set_experts_implementation("eager")
    return ref


def patched(family):
    return T.apply_to_model(copy.deepcopy(stock_model(family)))


# ------------------------------------------------------------------------------------------------
# accuracy of the patched forward (every family), against fp64
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", list(FAMILIES))
def test_forward_accuracy_vs_fp64(family):
    stock = stock_model(family)
    ref = fp64_reference(stock)
    m = patched(family)
    assert m.config._attn_implementation == T.TIK_ATTENTION
    seqs = seqs_for(stock.config.vocab_size)
    with torch.no_grad():
        ours = split_rows(m(**packed_kwargs(seqs)).logits[0], seqs)
        for s, o in zip(seqs, ours):
            r = ref(input_ids=s[None], use_cache=False).logits[0]
            st = stock(input_ids=s[None], use_cache=False).logits[0]
            assert o.dtype == torch.bfloat16 and torch.isfinite(o).all()
            err, err_stock = float((o.double() - r).abs().max()), float((st.double() - r).abs().max())
            # our error is of the order of stock bf16's (the ops round at the same points)
            assert err <= 2 * err_stock + 4e-3, (family, err, err_stock)
            assert rel_l2(o, r) < 2e-2


# ------------------------------------------------------------------------------------------------
# bitwise: layouts of the same tokens
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", ["qwen3", "qwen3_moe"])
def test_packed_separate_padded_bitwise(family):
    m = patched(family)
    seqs = seqs_for(m.config.vocab_size, lens=(5, 1, 8), seed=1)
    with torch.no_grad():
        packed = split_rows(m(**packed_kwargs(seqs)).logits[0], seqs)
        for i, s in enumerate(seqs):
            sep = m(input_ids=s[None], use_cache=False).logits[0]
            assert_bitwise(sep, packed[i], f"separate {i}")
        if family != "qwen3":
            return
        # AReaL's packed call for dense models: attention_mask as a dict of None (mask creation skipped)
        areal = m(**packed_kwargs(seqs), attention_mask={"full_attention": None, "sliding_attention": None}).logits
        for i, r in enumerate(split_rows(areal[0], seqs)):
            assert_bitwise(r, packed[i], f"AReaL mask dict {i}")
        # position_ids alone (HF flash-attention packing convention) == explicit cu_seq_lens
        kw = packed_kwargs(seqs)
        for k in ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k"):
            kw.pop(k)
        for i, r in enumerate(split_rows(m(**kw).logits[0], seqs)):
            assert_bitwise(r, packed[i], f"position_ids packing {i}")
        # a padded batch: row 0 left-padded, row 1 right-padded, row 2 full
        a, b, c = seqs[0], seqs[1], seqs[2]
        L = c.numel()
        ids = torch.zeros(3, L, dtype=torch.long)
        mask = torch.zeros(3, L, dtype=torch.long)
        where = [slice(L - a.numel(), L), slice(0, b.numel()), slice(0, L)]
        for i, (s, sl) in enumerate(zip((a, b, c), where)):
            ids[i, sl], mask[i, sl] = s, 1
        pos = (mask.cumsum(1) - 1).clamp(min=0)
        out = m(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False).logits
        for i, sl in enumerate(where):
            assert_bitwise(out[i, sl], packed[i], f"padded row {i}")


def test_cached_decode_matches_full_sequence_bitwise():
    """HF generate-style use (DynamicCache) of the patched model: prefill + decode == full forward."""
    m = patched("qwen3")
    seq = seqs_for(m.config.vocab_size, lens=(9,), seed=2)[0]
    P = 5
    with torch.no_grad():
        full = m(input_ids=seq[None], use_cache=False).logits[0]
        out = m(input_ids=seq[None, :P], use_cache=True)
        rows = [out.logits[0]]
        cache = _out_cache(out)
        kw = _cache_kw(m)
        # two tokens at once (extend over the cached prefix), then one by one (decode)
        out = m(input_ids=seq[None, P:P + 2], use_cache=True, **{kw: cache})
        rows.append(out.logits[0])
        for t in range(P + 2, seq.numel()):
            out = m(input_ids=seq[None, t:t + 1], use_cache=True, **{kw: cache})
            rows.append(out.logits[0])
    assert_bitwise(torch.cat(rows), full, "cached vs full")


def test_class_level_patch_equals_live_patch_and_reverts():
    live = patched("qwen3")
    seqs = seqs_for(live.config.vocab_size, seed=4)
    stock = stock_model("qwen3")
    with torch.no_grad():
        want = live(**packed_kwargs(seqs)).logits
        want_stock = stock(**packed_kwargs(seqs)).logits
    T.apply_tik_kernels_to_qwen3()
    try:
        m = build_model("tiny-qwen3", seed=3)
        assert m.config._attn_implementation == T.TIK_ATTENTION
        assert T.is_patched(m)
        with torch.no_grad():
            got = m(**packed_kwargs(seqs)).logits
        assert_bitwise(got, want, "class-level vs live patch")
    finally:
        T.revert_tik_kernels()
    m2 = build_model("tiny-qwen3", seed=3)
    assert not T.is_patched(m2) and m2.config._attn_implementation != T.TIK_ATTENTION
    with torch.no_grad():
        assert_bitwise(m2(**packed_kwargs(seqs)).logits, want_stock, "after revert_tik_kernels")
    T.revert(live)
    assert not T.is_patched(live) and live.config._attn_implementation == "sdpa"
    with torch.no_grad():
        assert_bitwise(live(**packed_kwargs(seqs)).logits, want_stock, "after revert")


def test_attention_interface_only_and_builtin_replacement():
    """An unpatched model using only our attention function: packed == separate, close to sdpa."""
    stock = stock_model("llama")
    m = copy.deepcopy(stock)
    T.register_attention()
    m.set_attn_implementation(T.TIK_ATTENTION)
    seqs = seqs_for(m.config.vocab_size, seed=5)
    with torch.no_grad():
        packed = split_rows(m(**packed_kwargs(seqs)).logits[0], seqs)
        for i, s in enumerate(seqs):
            sep = m(input_ids=s[None], use_cache=False).logits[0]
            assert_bitwise(sep, packed[i], "interface-only separate")
            st = stock(input_ids=s[None], use_cache=False).logits[0]
            assert rel_l2(sep, st) < 2e-2
        T.replace_builtin_attention(("sdpa",))
        try:
            m3 = copy.deepcopy(stock)
            assert m3.config._attn_implementation == "sdpa"
            got = m3(input_ids=seqs[0][None], use_cache=False).logits[0]
            assert_bitwise(got, packed[0], "sdpa name replaced by tik")
        finally:
            T.restore_builtin_attention()
        st = stock(input_ids=seqs[0][None], use_cache=False).logits[0]
        st2 = copy.deepcopy(stock)(input_ids=seqs[0][None], use_cache=False).logits[0]
        assert_bitwise(st, st2, "restored sdpa")


# ------------------------------------------------------------------------------------------------
# training: gradients and optimizer steps
# ------------------------------------------------------------------------------------------------
def _loss(model, seqs):
    out = model(**packed_kwargs(seqs))
    logits = out.logits[0].float()
    ids = torch.cat(seqs)
    n = [s.numel() for s in seqs]
    keep = torch.ones(ids.numel(), dtype=torch.bool)
    keep[torch.cumsum(torch.tensor(n), 0) - 1] = False  # last token of each sequence has no label
    labels = torch.roll(ids, -1)
    return torch.nn.functional.cross_entropy(logits[keep], labels[keep])


@pytest.mark.parametrize("family", ["qwen3", "qwen3_moe"])
def test_backward_gradients_close(family):
    stock = stock_model(family)
    ref = fp64_reference(stock)
    st = copy.deepcopy(stock)
    m = patched(family)
    seqs = seqs_for(stock.config.vocab_size, lens=(7, 4), seed=6)
    # the reference runs the sequences separately (stock eager has no packed varlen)
    ref_loss = sum(_loss(ref, [s]) * (s.numel() - 1) for s in seqs) / sum(s.numel() - 1 for s in seqs)
    ref_loss.backward()
    st_loss = sum(_loss(st, [s]) * (s.numel() - 1) for s in seqs) / sum(s.numel() - 1 for s in seqs)
    st_loss.backward()
    loss = _loss(m, seqs)
    loss.backward()
    assert abs(float(loss.detach()) - float(ref_loss.detach())) < 1e-2
    n_checked = 0
    for (name, p), (_, p_st), (_, p_ref) in zip(m.named_parameters(), st.named_parameters(), ref.named_parameters()):
        if p_ref.grad is None or float(p_ref.grad.norm()) == 0:
            continue
        assert p.grad is not None, f"{name}: no gradient through the patched model"
        assert torch.isfinite(p.grad).all(), name
        err, err_st = rel_l2(p.grad, p_ref.grad), rel_l2(p_st.grad, p_ref.grad)
        assert err <= 2 * err_st + 2e-2, (name, err, err_st)
        n_checked += 1
    assert n_checked >= 10


def test_gradient_checkpointing_gives_identical_gradients():
    """AReaL enables HF gradient checkpointing: the recomputed forward must give the same bits."""
    seqs = seqs_for(stock_model("qwen3").config.vocab_size, lens=(5, 4), seed=11)
    grads = []
    for ckpt in (False, True):
        m = patched("qwen3")
        m.train()
        if ckpt:
            with warnings.catch_warnings():  # renamed activation_checkpointing_enable in newer transformers
                warnings.simplefilter("ignore", FutureWarning)
                m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        _loss(m, seqs).backward()
        grads.append({n: p.grad for n, p in m.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and len(grads[0]) > 10
    for n in grads[0]:
        assert_bitwise(grads[0][n], grads[1][n], f"grad {n}")


def test_fsdp2_mixed_precision_fp32_master_like_areal(tmp_path):
    """AReaL's FSDP engine: fp32 master weights, FSDP2 with bf16 params, patched after sharding.
    Logits equal the plain bf16 patched model's bit for bit; backward reaches the sharded params."""
    import torch.distributed as dist
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    ref = patched("qwen3")
    m = copy.deepcopy(stock_model("qwen3")).float()  # bf16 values, exact in fp32
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for layer in m.model.layers:
            fully_shard(layer, mp_policy=mp)
        fully_shard(m, mp_policy=mp)
        T.apply_to_model(m)
        seqs = seqs_for(m.config.vocab_size, lens=(4, 5), seed=12)
        out = m(**packed_kwargs(seqs)).logits
        with torch.no_grad():
            want = ref(**packed_kwargs(seqs)).logits
        assert_bitwise(out.detach(), want, "FSDP2 bf16-param forward vs bf16 model")
        out.float().logsumexp(-1).sum().backward()
        w = m.model.layers[0].self_attn.q_proj.weight
        assert w.grad is not None and bool(torch.isfinite(w.grad.full_tensor()).all())
    finally:
        dist.destroy_process_group()


def test_optimizer_steps_track_unpatched():
    stock = stock_model("qwen3")
    seqs = seqs_for(stock.config.vocab_size, lens=(6, 5), seed=7)
    losses = {}
    for kind in ("stock", "tik"):
        m = copy.deepcopy(stock)
        if kind == "tik":
            T.apply_to_model(m)
        m.train()
        opt = torch.optim.AdamW(m.parameters(), lr=3e-3, weight_decay=0.0)
        losses[kind] = []
        for _ in range(3):
            opt.zero_grad()
            loss = _loss(m, seqs)
            loss.backward()
            opt.step()
            losses[kind].append(loss.item())
    assert losses["tik"][-1] < losses["tik"][0]
    for a, b in zip(losses["tik"], losses["stock"]):
        assert abs(a - b) <= 2e-2 * abs(b), losses


# ------------------------------------------------------------------------------------------------
# log-prob helpers (AReaL signature)
# ------------------------------------------------------------------------------------------------
def test_gather_logprobs_matches_areal_semantics_and_chunking_is_bitwise():
    g = torch.Generator().manual_seed(8)
    logits = (torch.randn(37, 97, generator=g) * 3).to(torch.bfloat16)
    labels = torch.randint(0, 97, (37,), generator=g)
    for temp in (1.0, 0.7):
        lp = LP.gather_logprobs(logits, labels, temperature=temp)
        lp2, ent = LP.gather_logprobs_entropy(logits, labels, temperature=temp, chunk_size=5)
        ref = torch.log_softmax(logits.double() / temp, -1)
        assert lp.dtype == torch.float32 and lp.shape == labels.shape
        torch.testing.assert_close(lp.double(), ref.gather(-1, labels[:, None])[:, 0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ent.double(), -(ref.exp() * ref).sum(-1), atol=1e-5, rtol=1e-5)
        assert_bitwise(lp, lp2, "chunk_size 5 vs 1024")
        assert_bitwise(LP.gather_logprobs(logits, labels, temp, None, 1), lp, "chunk_size 1")
        assert_bitwise(lp, ops.token_logprobs(logits, labels, temperature=temp), "helper vs op")
    # leading dims [B, S, V] like the un-squeezed case
    lp3 = LP.gather_logprobs(logits[:36].view(4, 9, 97), labels[:36].view(4, 9))
    assert lp3.shape == (4, 9)
    assert_bitwise(lp3.reshape(-1), LP.gather_logprobs(logits, labels)[:36], "3-D input")


def test_gather_logprobs_backward():
    g = torch.Generator().manual_seed(9)
    x = (torch.randn(13, 31, generator=g)).to(torch.bfloat16).requires_grad_()
    labels = torch.randint(0, 31, (13,), generator=g)
    LP.gather_logprobs(x, labels, chunk_size=4).sum().backward()
    x64 = x.detach().double().requires_grad_()
    torch.log_softmax(x64, -1).gather(-1, labels[:, None]).sum().backward()
    assert x.grad is not None and rel_l2(x.grad, x64.grad) < 2e-2


def test_gather_logprobs_bad_inputs():
    x = torch.randn(4, 8, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="labels"):
        LP.gather_logprobs(x, torch.zeros(5, dtype=torch.long))
    with pytest.raises(ValueError, match="chunk_size"):
        LP.gather_logprobs(x, torch.zeros(4, dtype=torch.long), chunk_size=0)
    with pytest.raises(ValueError, match="temperature"):
        LP.gather_logprobs(x, torch.zeros(4, dtype=torch.long), temperature=0.0)
    with pytest.raises(TypeError):
        LP.gather_logprobs(x.tolist(), torch.zeros(4, dtype=torch.long))


# ------------------------------------------------------------------------------------------------
# bad inputs / unsupported models: clear errors, never a silent stock kernel
# ------------------------------------------------------------------------------------------------
def test_missing_op_raises_instead_of_falling_back(monkeypatch):
    monkeypatch.delattr(ops, "swiglu")
    m = copy.deepcopy(stock_model("qwen3"))
    with pytest.raises(T.TikOpUnavailableError, match="swiglu"):
        T.apply_to_model(m)
    assert not T.is_patched(m)
    with pytest.raises(T.TikOpUnavailableError, match="swiglu"):
        T.apply_tik_kernels_to_qwen3()
    assert T.missing_ops() == ["swiglu"]
    monkeypatch.delattr(ops, "token_logprobs")
    with pytest.raises(T.TikOpUnavailableError, match="token_logprobs"):
        LP.gather_logprobs(torch.zeros(2, 3, dtype=torch.bfloat16), torch.zeros(2, dtype=torch.long))


def test_bad_inputs_raise():
    m = patched("qwen3")
    seqs = seqs_for(m.config.vocab_size, lens=(5, 4), seed=10)
    kw = packed_kwargs(seqs)
    with torch.no_grad():
        with pytest.raises(ValueError, match="batch size 1"):  # packed kwargs with a batch of 2
            m(input_ids=torch.stack([seqs[0][:4], seqs[1]]), cu_seq_lens_q=kw["cu_seq_lens_q"], use_cache=False)
        bad = dict(kw, cu_seq_lens_k=kw["cu_seq_lens_q"] + 1)
        with pytest.raises(ValueError, match="cu_seq_lens_k"):
            m(**bad)
        with pytest.raises(ValueError, match="4-D|2-D"):  # a prepared 4-D mask means a wrong attn implementation
            m(input_ids=seqs[1][None], attention_mask=torch.ones(1, 1, 4, 4, dtype=torch.bool), use_cache=False)
        with pytest.raises(ValueError, match="cu_seqlens"):  # offsets that do not cover the tokens
            m(**dict(kw, cu_seq_lens_q=torch.tensor([0, 5, 8], dtype=torch.int32),
                     cu_seq_lens_k=torch.tensor([0, 5, 8], dtype=torch.int32), max_length_q=None))
        with pytest.raises(ValueError, match="dtype"):  # fp32 activations: the kernels are bf16/fp16
            m32 = T.apply_to_model(copy.deepcopy(stock_model("qwen3")).float())
            m32(input_ids=seqs[1][None], use_cache=False)
        with pytest.raises(ValueError, match="every row"):
            m(input_ids=seqs[1][None], attention_mask=torch.zeros(1, 4, dtype=torch.long), use_cache=False)
    m.train()
    m.model.layers[0].self_attn.attention_dropout = 0.1
    with pytest.raises(NotImplementedError, match="dropout"):
        m(input_ids=seqs[1][None], use_cache=False)


def test_unsupported_models_raise():
    from transformers import AutoConfig, AutoModelForCausalLM

    base = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                num_key_value_heads=1, head_dim=16)
    gelu = AutoModelForCausalLM.from_config(AutoConfig.for_model("qwen3", hidden_act="gelu", **base))
    with pytest.raises(NotImplementedError, match="hidden_act"):
        T.apply_to_model(gelu)
    hd = AutoModelForCausalLM.from_config(AutoConfig.for_model("qwen3", **dict(base, head_dim=24)))
    with pytest.raises(NotImplementedError, match="head_dim"):
        T.apply_to_model(hd)
    sw = AutoModelForCausalLM.from_config(AutoConfig.for_model(
        "qwen2", **{k: v for k, v in base.items() if k != "head_dim"}, use_sliding_window=True, sliding_window=8,
        max_window_layers=0))
    if "sliding_attention" in (getattr(sw.config, "layer_types", None) or []):
        with pytest.raises(NotImplementedError, match="sliding"):
            T.apply_to_model(sw)
    gpt2 = AutoModelForCausalLM.from_config(AutoConfig.for_model("gpt2", n_layer=1, n_embd=32, n_head=2,
                                                                 vocab_size=64))
    with pytest.raises(ValueError, match="model_type"):
        T.apply_to_model(gpt2)
    with pytest.raises(ValueError, match="model_type"):
        T._apply_classes("mistral")


def test_rope_uses_the_cpu_formula_not_the_modules_buffer():
    """AReaL's FSDP engine builds the model on the GPU, where HF's ``inv_freq`` buffer is computed by
    CUDA's pow/division and can differ from the CPU result in the last bit; the rollout side computes
    the CPU formula. The patched forward must therefore ignore the buffer: a changed buffer (here
    every entry x 1.001, and one ulp) gives the same logits, bit for bit."""
    from areal_tik_plugin.integrations.sglang.layers import hf_default_inv_freq

    m = patched("qwen3")
    rot = m.model.rotary_emb
    seqs = seqs_for(m.config.vocab_size, lens=(9, 4), seed=2)
    cpu = T.canonical_inv_freq(rot)
    head_dim = m.config.head_dim
    assert torch.equal(cpu, hf_default_inv_freq(float(m.config.rope_parameters["rope_theta"]), head_dim))
    with torch.no_grad():
        ref = m(**packed_kwargs(seqs)).logits
        for changed in (rot.inv_freq * 1.001, torch.nextafter(rot.inv_freq, torch.full_like(rot.inv_freq, 2.0))):
            rot.inv_freq.copy_(changed)
            rot.__dict__.pop("_tik_inv_freq_on", None)
            assert torch.equal(T.rope_params(rot)[0], cpu)
            assert_bitwise(m(**packed_kwargs(seqs)).logits, ref, "inv_freq buffer changed")
