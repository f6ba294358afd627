"""Proof on a real SGLang 0.5.23 Engine (CPU): every log-prob SGLang returns with the ``tik`` backend is
bit-identical to the training-side log-prob of the same tokens (HF model patched by the plugin,
packed varlen forward in training mode, ``ops.token_logprobs``). The stock pair (SGLang
``torch_native`` vs HF ``sdpa``) is shown to differ, so the comparison can fail.

The Engines run in one child process (:func:`sglang_check.launch_worker`), one after the other.
Requests (Qwen3): 4 prompts sharing a 60-token prefix, batched, greedy then sampled with per-request
temperatures (the second round hits the radix cache), 8 new tokens each (decode crosses the 64-key
attention tile), plus one 507-token prompt whose decode crosses the 512-key split; chunked prefill
with chunk 48 (not tile aligned). Qwen3-MoE: the two batched rounds on a 20-token prefix, 4 new tokens.
"""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from tests.helpers.sglang_models import build_model

pytestmark = pytest.mark.slow

if importlib.util.find_spec("sglang") is None:
    if os.environ.get("CI"):
        raise RuntimeError("sglang is not installed: .ci/install_sglang.sh should have installed it")
    pytest.skip("sglang not installed (run .ci/install_sglang.sh VENV)", allow_module_level=True)

from areal_tik_plugin.integrations.sglang import check as SC  # noqa: E402

from tests.helpers.sglang_models import WORDS  # noqa: E402

# 60-token shared prefix: the 4 requests cross the 64-key attention tile during decode
PREFIX = " ".join(WORDS[i % len(WORDS)] for i in range(60))
TAILS = ["one two three", "four five", "six", "seven eight nine ten"]
TEMPS = [1.0, 0.7, 1.0, 1.3]
NEW = 8
# one 507-token prompt: prefill crosses many tiles in 11 chunks, decode crosses the 512-key split
LONG = " ".join(WORDS[(7 * i) % len(WORDS)] for i in range(507))
CHUNK = 48  # chunked prefill; not a multiple of the 64-key tile


NEW_MOE, PREFIX_MOE = 4, 20  # MoE: the op coverage, short (the interpreter's MoE is the slow part)


def _prompts(tok, prefix_words=None):
    prefix = PREFIX if prefix_words is None else " ".join(PREFIX.split()[:prefix_words])
    return [tok(f"{prefix} {t}")["input_ids"] for t in TAILS]


def _jobs(ids, sampled=True, long_ids=None, new=NEW):
    jobs = [{"input_ids": ids, "sampling_params": {"temperature": 0.0, "max_new_tokens": new, "ignore_eos": True}}]
    if sampled:
        jobs.append({"input_ids": ids, "sampling_params": [{"temperature": t, "max_new_tokens": new, "ignore_eos": True}
                                                           for t in TEMPS]})
    if long_ids is not None:
        jobs.append({"input_ids": [long_ids], "sampling_params": {"temperature": 0.0, "max_new_tokens": NEW,
                                                                  "ignore_eos": True}})
    return jobs


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One child process runs the three Engines one after the other: tik Qwen3 (loaded through the
    ``sglang.srt.plugins`` entry point), tik Qwen3-MoE (entry point disabled: loaded in the scheduler
    by the launcher's spawn targets, the path for SGLang without plugins), stock torch_native Qwen3."""
    from transformers import AutoTokenizer

    tmp = str(tmp_path_factory.mktemp("sglang_proof"))
    # SGLang 0.5.10 with device="cpu" pads MoE intermediate sizes to a multiple of 64 (its CPU-engine
    # layout) but loads expert weights padded only under SGLANG_USE_CPU_ENGINE (a CPU sgl_kernel build):
    # an odd moe_intermediate_size fails to load there (on CUDA it pads nothing)
    moe_kw = {} if SC.plugin_system() else {"moe_intermediate_size": 64}
    models = {k: build_model(os.path.join(tmp, k), k, **(moe_kw if k == "qwen3_moe" else {}))
              for k in ("qwen3", "qwen3_moe")}
    tok = AutoTokenizer.from_pretrained(models["qwen3"])
    ids = _prompts(tok)
    moe_ids = _prompts(tok, PREFIX_MOE)
    long_ids = tok(LONG)["input_ids"]
    kw = dict(device="cpu", chunked_prefill_size=CHUNK)
    engines = [
        {"engine_kwargs": SC.default_engine_kwargs(models["qwen3"], "tik", **kw), "jobs": _jobs(ids, long_ids=long_ids),
         "env": {"TIK_SGLANG_STATS": os.path.join(tmp, "stats-qwen3")}},
        # launcher path (SGLang without plugins): entry point disabled, the spawn targets register
        {"engine_kwargs": SC.default_engine_kwargs(models["qwen3_moe"], "tik", **kw),
         "jobs": _jobs(moe_ids, new=NEW_MOE),
         # and SGLang's CUDA-only fused RoPE + set_kv_buffer path (what Qwen3-MoE takes on a CUDA bf16 pool)
         "env": {"TIK_SGLANG_STATS": os.path.join(tmp, "stats-qwen3_moe"), "SGLANG_PLUGINS": "none",
                 "TIK_SGLANG_EMULATE_FUSED_KV": "1"},
         "launcher": True},
        {"engine_kwargs": SC.default_engine_kwargs(models["qwen3"], "torch_native", **kw), "jobs": _jobs(ids, sampled=False),
         "env": {"SGLANG_PLUGINS": "none", "TIK_SGLANG_STATS": ""}},
    ]
    res = SC.launch_worker({"engines": engines}, tmp, timeout=900)
    out = {}
    for name, eng in zip(("qwen3", "qwen3_moe", "stock"), res["engines"]):
        kind = "qwen3" if name == "stock" else name
        out[name] = {"path": models[kind], "ids": moe_ids if name == "qwen3_moe" else ids, "long_ids": long_ids,
                     "engine": eng,
                     "stats": SC.read_stats(os.path.join(tmp, f"stats-{kind}")) if name != "stock" else []}
    return out


def _requests(ids_per_job, engine_out, temps_per_job, new=NEW):
    """[(prompt ids, output tokens, sglang logprobs, temperature, cached tokens)] over all jobs."""
    out = []
    for ids, job, temps in zip(ids_per_job, engine_out["jobs"], temps_per_job):
        for p, r, t in zip(ids, job["requests"], temps):
            assert len(r["tokens"]) == new
            out.append((p, r["tokens"], r["logprobs"], t, r["cached_tokens"]))
    return out


def _training_logprobs(path, reqs):
    """Packed training-mode forward through the plugin-patched HF model (see SC.training_logprobs)."""
    return SC.training_logprobs(path, [(p, toks, t) for p, toks, _, t, _ in reqs])


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


def test_qwen3_rollout_logprobs_bitwise_equal_training(runs):
    qwen3 = runs["qwen3"]
    eng = qwen3["engine"]
    ids = qwen3["ids"]
    reqs = _requests([ids, ids, [qwen3["long_ids"]]], eng, [[1.0] * 4, TEMPS, [1.0]])
    assert len(reqs[-1][0]) == 507 and len(reqs[-1][0]) + NEW > 512
    assert min(c for *_, c in reqs[:4]) == 0, "first round must prefill from scratch"
    assert all(c >= 60 for *_, c in reqs[4:8]), f"second round must hit the radix cache: {[r[-1] for r in reqs]}"
    _assert_through_ours(qwen3["stats"], moe=False)
    _assert_bitwise(reqs, _training_logprobs(qwen3["path"], reqs))


def test_qwen3_moe_rollout_logprobs_bitwise_equal_training(runs):
    qwen3_moe = runs["qwen3_moe"]
    ids = qwen3_moe["ids"]
    reqs = _requests([ids, ids], qwen3_moe["engine"], [[1.0] * 4, TEMPS], new=NEW_MOE)
    assert all(c >= PREFIX_MOE for *_, c in reqs[4:])
    s = _assert_through_ours(qwen3_moe["stats"], moe=True)
    assert s["counts"]["moe_route"] > 0 and s["counts"]["moe_experts"] > 0
    # SGLang's fused RoPE + set_kv_buffer path: every K/V row was written by the RoPE plugin
    assert s["counts"]["emulated_fused_kv_modules"] > 0, s["counts"]
    assert s["counts"]["rope_fused_kv_write"] == s["counts"]["kv_write"] > 0, s["counts"]
    _assert_bitwise(reqs, _training_logprobs(qwen3_moe["path"], reqs))


def test_stock_pair_is_not_bitwise_equal(runs):
    """SGLang torch_native (bf16) vs HF sdpa on the same greedy tokens: close, not bit-identical."""
    from transformers import AutoModelForCausalLM

    qwen3 = runs["qwen3"]
    stock_eng = runs["stock"]["engine"]
    reqs = _requests([qwen3["ids"]], stock_eng, [[1.0] * 4])
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
    tik = _requests([qwen3["ids"]], qwen3["engine"], [[1.0] * 4])
    for (_, t_toks, t_lp, *_), (_, s_toks, s_lp, *_) in zip(tik, reqs):
        k = 0
        while k < len(t_toks) and t_toks[k] == s_toks[k]:
            k += 1
        if k:
            assert float((torch.tensor(t_lp[:k]) - torch.tensor(s_lp[:k])).abs().max()) < 0.1


def test_gpu_proof_script_on_cpu_with_repeats(tmp_path):
    """The GPU proof script end to end on CPU (tiny Qwen3, real SGLang Engine in a child process): every
    rollout log-prob bit-identical to the training side, and ``--repeat`` times extra greedy jobs (radix-cached
    prompts) whose median is reported; ``--repeat 0`` is refused with what was expected."""
    import json
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "benchmarks.sglang_gpu_proof", "--out", str(tmp_path),
           "--device", "cpu", "--shape", "tiny", "--batch", "3", "--prefix", "12", "--new", "3", "--chunk", "48",
           "--baselines", "", "--timeout", "400", "--model-dir", str(tmp_path / "model")]
    bad = subprocess.run(cmd + ["--repeat", "0"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--repeat 0: expected a number of greedy jobs >= 1" in bad.stderr
    out = subprocess.run(cmd + ["--repeat", "2"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    rep = json.loads((tmp_path / "sglang_gpu_proof.json").read_text())
    assert rep["bitwise_mismatching_requests"] == [] and rep["requests"] == 6
    tik = rep["backends"]["tik"]
    assert len(tik["job_seconds"]) == 3 and tik["greedy_repeat_seconds"] == tik["job_seconds"][2:]
    assert tik["greedy_repeat_median_tokens_per_s"] == 3 * 3 / tik["greedy_repeat_seconds"][0]
    assert "repeats (cached prompts) median" in out.stdout
