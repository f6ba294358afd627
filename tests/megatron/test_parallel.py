"""Pipeline parallel 2 and (Qwen3-MoE) expert parallel 2 in two gloo processes give the bits of the
one-process model: logits and every parameter gradient of a training step.

Pipeline: each stage is a GPTModel built by the plugin (``pre_process`` / ``post_process`` per stage,
layers by megatron-core's offsets), trained through megatron-core's own pipeline schedule (1F1B,
p2p over gloo); CPU shims in the ranks only: ``torch.cuda.current_device`` -> "cpu" (p2p buffers),
``torch.cuda.synchronize`` a no-op, ``device="cuda"`` factory arguments -> cpu (token counters). Expert parallel: each rank holds half the experts
(``weight{j}`` = expert ``rank * E/2 + j``) and both run the same tokens, so an expert's gradient is
exactly twice the one-process gradient (the all-gather's backward sums the two ranks').
"""

from __future__ import annotations

import os
import socket

import pytest

from tests.megatron import _mg  # noqa: F401
from tests.megatron._mg import bits_equal

import torch  # noqa: E402

LENS = [6, 1, 10]


def _port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    """Both set-ups in one pair of spawned processes (start-up dominates the cost)."""
    import torch.multiprocessing as mp

    from tests.megatron import _parallel_worker as W

    os.environ.setdefault("TRITON_INTERPRET", "1")  # spawned ranks inherit it
    d = str(tmp_path_factory.mktemp("parallel"))
    jobs = [("pp", "tiny-qwen3"), ("ep", "tiny-qwen3-moe")]
    mp.start_processes(W.run, args=(2, _port(), jobs, LENS, d), nprocs=2, join=True, start_method="spawn")
    return {m: [torch.load(os.path.join(d, f"{m}_rank{r}.pt")) for r in range(2)] for m, _ in jobs}


def _reference(name):
    """Logits and HF-named gradients of the same step in this process (PP 1, EP 1)."""
    from areal_tik_plugin.integrations.megatron import convert as C
    from areal_tik_plugin.integrations.megatron.verify import megatron_packed_logits

    hf, mg = _mg.pair(name)
    xs = _mg.seqs(hf.config.vocab_size, LENS, 9)
    mg.train()
    mg.zero_grad(set_to_none=True)
    lg = torch.cat(megatron_packed_logits(mg, xs, "cpu"))
    ids = torch.cat(xs)
    (-torch.log_softmax(lg.float(), -1).gather(1, torch.roll(ids, -1)[:, None]).sum()).backward()
    mg.eval()
    return lg.detach(), C.mcore_to_hf([({k: p.grad for k, p in mg.named_parameters()}, 0)], hf.config)


def test_pipeline_parallel_2_same_bits_as_1(ranks):
    ref_logits, ref_grads = _reference("tiny-qwen3")
    r0, r1 = ranks["pp"]
    from areal_tik_plugin.integrations.megatron import convert as C

    assert r0["layer_offset"] == 0 and r1["layer_offset"] == 1
    assert bits_equal(r1["logits"], ref_logits)
    got = C.mcore_to_hf([(r0["grads"], 0), (r1["grads"], 1)], _mg.pair_config("tiny-qwen3"))
    assert sorted(got) == sorted(ref_grads)
    for k, g in ref_grads.items():
        assert bits_equal(got[k], g), k


def test_expert_parallel_2_same_bits_as_1(ranks):
    ref_logits, ref_grads = _reference("tiny-qwen3-moe")
    from areal_tik_plugin.integrations.megatron import convert as C

    r0, r1 = ranks["ep"]
    for r in (r0, r1):
        assert bits_equal(r["logits"], ref_logits)
    g0, g1 = r0["grads"], r1["grads"]
    assert sum(".mlp.experts.linear_fc1.weight" in k for k in g0) == 2 * 4  # 2 layers x 8 / 2 experts
    got = C.mcore_to_hf([(g0, 0)], _mg.pair_config("tiny-qwen3-moe"), ep_states=[[g0, g1]])
    for k, g in ref_grads.items():
        if ".mlp.experts." in k:
            assert bits_equal(got[k], g * 2), k
        else:
            assert bits_equal(got[k], g), k
    for k in g0:
        if ".mlp.experts." not in k:
            assert bits_equal(g1[k], g0[k]), k
    # distributed checkpoint: expert entries keyed by the global expert id, disjoint across EP ranks
    e0 = {key for key, _ in r0["ckpt_keys"].values() if ".experts." in key}
    e1 = {key for key, _ in r1["ckpt_keys"].values() if ".experts." in key}
    # (the layer index is megatron-core's prepended offset axis, not part of the key)
    assert not e0 & e1 and len(e0) == len(e1) == 2 * 4 and len(e0 | e1) == 2 * 8  # fc1 + fc2, 8 experts
    assert "decoder.layers.mlp.experts.linear_fc1.weight7" in e1
