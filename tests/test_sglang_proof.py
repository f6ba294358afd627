"""Proof on a real SGLang 0.5.23 Engine (CPU): every log-prob SGLang returns with the ``tik`` backend is
bit-identical to the training-side log-prob of the same tokens (HF model patched by the plugin,
packed varlen forward in training mode, ``ops.token_logprobs``). The stock pair (SGLang
``torch_native`` vs HF ``sdpa``) is shown to differ, so the comparison can fail.

Each Engine runs in a child process (:func:`sglang_check.launch_worker`); one child per model runs
its engines one after the other. Requests: 4 prompts sharing a 16-token prefix, batched, greedy then
sampled with per-request temperatures (the second round hits the radix cache), chunked prefill with
chunk 16 (every prompt is prefilled in 2 chunks), 4 new tokens each (prefill + 3 decode steps).
"""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from tests.sglang_models import build_model

pytestmark = pytest.mark.slow

if importlib.util.find_spec("sglang") is None:
    if os.environ.get("CI"):
        raise RuntimeError("sglang is not installed: .ci/install_sglang.sh should have installed it")
    pytest.skip("sglang not installed (run .ci/install_sglang.sh VENV)", allow_module_level=True)

from areal_tik_plugin.integrations import sglang_check as SC  # noqa: E402

PREFIX = "the cat sat on the mat and then ran far up the hill to see the sun"  # 16 tokens
TAILS = ["one two three", "four five", "six", "seven eight nine ten"]
TEMPS = [1.0, 0.7, 1.0, 1.3]
NEW = 4


def _prompts(tok):
    return [tok(f"{PREFIX} {t}")["input_ids"] for t in TAILS]


def _jobs(ids, sampled=True):
    jobs = [{"input_ids": ids, "sampling_params": {"temperature": 0.0, "max_new_tokens": NEW, "ignore_eos": True}}]
    if sampled:
        jobs.append({"input_ids": ids, "sampling_params": [{"temperature": t, "max_new_tokens": NEW, "ignore_eos": True}
                                                           for t in TEMPS]})
    return jobs


def _run(tmp, kind, stock):
    from transformers import AutoTokenizer

    path = build_model(os.path.join(tmp, kind), kind)
    ids = _prompts(AutoTokenizer.from_pretrained(path))
    engines = [{"engine_kwargs": SC.default_engine_kwargs(path, "tik", "cpu", chunked_prefill_size=16),
                "jobs": _jobs(ids)}]
    if stock:
        engines.append({"engine_kwargs": SC.default_engine_kwargs(path, "torch_native", "cpu", chunked_prefill_size=16),
                        "jobs": _jobs(ids, sampled=False), "env": {"SGLANG_PLUGINS": "none"}})
    stats = os.path.join(tmp, f"stats-{kind}")
    res = SC.launch_worker({"engines": engines}, tmp, timeout=600, stats_dir=stats)
    return {"path": path, "ids": ids, "engines": res["engines"], "stats": SC.read_stats(stats)}


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    return _run(str(tmp_path_factory.mktemp("sgl_qwen3")), "qwen3", stock=True)


@pytest.fixture(scope="module")
def qwen3_moe(tmp_path_factory):
    return _run(str(tmp_path_factory.mktemp("sgl_moe")), "qwen3_moe", stock=False)


def _requests(ids, engine_out, temps_per_job):
    """[(prompt ids, output tokens, sglang logprobs, temperature, cached tokens)] over all jobs."""
    out = []
    for job, temps in zip(engine_out["jobs"], temps_per_job):
        for p, r, t in zip(ids, job["requests"], temps):
            assert len(r["tokens"]) == NEW
            out.append((p, r["tokens"], r["logprobs"], t, r["cached_tokens"]))
    return out


def _training_logprobs(path, reqs):
    """Packed [1, total] training-mode forward of every prompt+response through the plugin-patched HF
    model (AReaL's layout: cu_seq_lens_q/k, max_length_q/k, per-sequence position_ids), then
    ``ops.token_logprobs`` at each response token with the request's temperature."""
    from transformers import AutoModelForCausalLM

    from areal_tik_plugin import ops
    from areal_tik_plugin.integrations.transformers import apply_to_model

    model = apply_to_model(AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16))
    model.train()
    seqs = [list(p) + list(toks) for p, toks, *_ in reqs]
    lens = torch.tensor([len(s) for s in seqs], dtype=torch.int32)
    cu = torch.zeros(len(seqs) + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(lens, 0)
    input_ids = torch.tensor([t for s in seqs for t in s]).unsqueeze(0)
    pos = torch.cat([torch.arange(n) for n in lens.tolist()]).unsqueeze(0)
    mx = int(lens.max())
    logits = model(input_ids=input_ids, position_ids=pos, cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=mx,
                   max_length_k=mx, use_cache=False).logits[0]
    out = []
    for (p, toks, _, t, _), start in zip(reqs, cu[:-1].tolist()):
        rows = torch.arange(start + len(p) - 1, start + len(p) - 1 + len(toks))
        lp = ops.token_logprobs(logits[rows].detach(), torch.tensor(toks), temperature=float(t))
        out.append(lp.detach())
    return out


def _bits(x):
    return torch.as_tensor(x, dtype=torch.float32).view(torch.int32)


def _assert_bitwise(reqs, train):
    bad = []
    for i, ((_, toks, lp, t, _), ours) in enumerate(zip(reqs, train)):
        if not torch.equal(_bits(lp), _bits(ours)):
            bad.append((i, t, lp, ours.tolist()))
    assert not bad, f"{len(bad)}/{len(reqs)} requests differ (first: {bad[0]})"


def _assert_through_ours(stats, moe):
    s = SC.summarize(stats, moe=moe)
    assert s["active"], s
    assert not s["missing"], f"ops that never ran through ours: {s['missing']}"
    assert not s["other_paths"], f"fused ops dispatched elsewhere: {s['other_paths']}"
    assert s["counts"]["attention_extend"] > 0 and s["counts"]["attention_decode"] > 0
    return s


def test_qwen3_rollout_logprobs_bitwise_equal_training(qwen3):
    eng = qwen3["engines"][0]
    reqs = _requests(qwen3["ids"], eng, [[1.0] * 4, TEMPS])
    assert min(c for *_, c in reqs[:4]) == 0, "first round must prefill from scratch"
    assert all(c >= 16 for *_, c in reqs[4:]), f"second round must hit the radix cache: {[r[-1] for r in reqs]}"
    _assert_through_ours(qwen3["stats"], moe=False)
    _assert_bitwise(reqs, _training_logprobs(qwen3["path"], reqs))


def test_qwen3_moe_rollout_logprobs_bitwise_equal_training(qwen3_moe):
    reqs = _requests(qwen3_moe["ids"], qwen3_moe["engines"][0], [[1.0] * 4, TEMPS])
    assert all(c >= 16 for *_, c in reqs[4:])
    s = _assert_through_ours(qwen3_moe["stats"], moe=True)
    assert s["counts"]["moe_route"] > 0 and s["counts"]["moe_experts"] > 0
    _assert_bitwise(reqs, _training_logprobs(qwen3_moe["path"], reqs))


def test_stock_pair_is_not_bitwise_equal(qwen3):
    """SGLang torch_native (bf16) vs HF sdpa on the same greedy tokens: close, not bit-identical."""
    from transformers import AutoModelForCausalLM

    stock_eng = qwen3["engines"][1]
    reqs = _requests(qwen3["ids"], stock_eng, [[1.0] * 4])
    model = AutoModelForCausalLM.from_pretrained(qwen3["path"], dtype=torch.bfloat16, attn_implementation="sdpa")
    model.train()
    n_equal = n_total = 0
    max_diff = 0.0
    for p, toks, lp, _, _ in reqs:
        ids = torch.tensor([list(p) + list(toks)])
        logits = model(input_ids=ids, use_cache=False).logits[0]
        rows = torch.arange(len(p) - 1, len(p) - 1 + len(toks))
        hf = torch.log_softmax(logits[rows].float(), -1).gather(-1, torch.tensor(toks)[:, None])[:, 0].detach()
        n_equal += int((_bits(lp) == _bits(hf)).sum())
        n_total += len(toks)
        max_diff = max(max_diff, float((torch.tensor(lp) - hf).abs().max()))
    assert max_diff < 0.1, f"stock SGLang and HF disagree beyond bf16 noise: {max_diff}"
    assert n_equal < n_total, "stock pair is bit-identical: the proof would not detect a mismatch"
    # and our rollout numbers are the same model (accuracy, not bits) as the stock ones
    tik = _requests(qwen3["ids"], qwen3["engines"][0], [[1.0] * 4])
    for (_, t_toks, t_lp, *_), (_, s_toks, s_lp, *_) in zip(tik, reqs):
        k = 0
        while k < len(t_toks) and t_toks[k] == s_toks[k]:
            k += 1
        if k:
            assert float((torch.tensor(t_lp[:k]) - torch.tensor(s_lp[:k])).abs().max()) < 0.1
