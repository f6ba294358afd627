"""benchmarks/megatron_bench.py on CPU at a tiny shape: every variant (the plugin's spec [s, b] and THD,
megatron-core's local spec, stock HF) builds, runs forward + backward, and records its timings, with
gradients on every parameter; bad flags are refused; the deadline skips what would start late. Bits
and speed are not checked here (the GPU run measures them)."""

from __future__ import annotations

import json

import pytest
import torch

from tests.megatron import _mg  # noqa: F401  (skips without megatron-core)

from benchmarks import megatron_bench as B


@pytest.fixture(autouse=True, scope="module")
def _own_process_group():
    """The bench initializes torch.distributed and megatron-core's parallel state in this process; later
    test modules (e.g. the FSDP tests) start their own default group, so what this module started ends
    with it."""
    import torch.distributed as dist

    was = dist.is_available() and dist.is_initialized()
    yield
    if not was and dist.is_initialized():
        from megatron.core import parallel_state as ps

        ps.destroy_model_parallel()
        dist.destroy_process_group()


@pytest.fixture
def cpu_local_spec(monkeypatch):
    """megatron-core's local spec on CPU: its rotary table goes to torch.cuda.current_device(), its
    unfused softmax builds the causal mask with device="cuda", and its attention forks the CUDA RNG
    tracker (seeded on a GPU by ensure_model_parallel; here the inference tracker, which needs no CUDA)."""
    from megatron.core import tensor_parallel
    from megatron.core.fusions import fused_softmax

    _mg.setup()
    tensor_parallel.model_parallel_cuda_manual_seed(0, inference_rng_tracker=True)

    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")
    monkeypatch.setattr(fused_softmax, "get_default_causal_mask",
                        lambda sq: torch.triu(torch.ones(sq, sq), diagonal=1).bool())


ARGS = ["--model", "tiny-qwen3", "--layers", "1", "--micro-batch", "2", "--seq-len", "7", "--steps", "2",
        "--warmup", "1"]


def test_every_variant_runs_forward_backward_and_is_timed(tmp_path, cpu_local_spec, capsys):
    assert B.main(["--out", str(tmp_path), *ARGS]) == 0, capsys.readouterr()
    rep = json.loads((tmp_path / "megatron_bench.json").read_text())
    assert list(rep["variants"]) == list(B.SPECS) and rep["tokens_per_step"] == 14
    for name, r in rep["variants"].items():
        assert "error" not in r, (name, r)
        assert len(r["times_s"]) == 2 and r["median_s"] > 0 and r["tokens_per_s"] == pytest.approx(14 / r["median_s"])
        assert r["grads"] == r["params"] > 0 and r["finite"], name
    # the same model shape in every variant (tied embeddings: one matrix)
    assert len({r["n_params"] for r in rep["variants"].values()}) == 1, {k: r["n_params"] for k, r in rep["variants"].items()}
    assert rep["versions"]["megatron-core"] and rep["local_spec_options"]["masked_softmax_fusion"] is False
    out = capsys.readouterr().out
    assert "tik-thd" in out and "local" in out and "tokens/s" in out
    table = B.summary(str(tmp_path))  # the device step's last table: no verify report here, the bench's rows
    assert "no " in table.splitlines()[0] and "megatron-verify.json" in table.splitlines()[0]
    assert all(name in table for name in B.SPECS)


def test_flags_refused_and_deadline_skips(tmp_path, capsys):
    assert B.main(["--out", str(tmp_path), "--specs", "tik,te"]) == 2
    assert "--specs: expected a comma list from" in capsys.readouterr().err
    assert B.main(["--out", str(tmp_path), "--micro-batch", "0"]) == 2
    assert "--micro-batch: expected >= 1" in capsys.readouterr().err
    assert B.main(["--out", str(tmp_path), *ARGS, "--specs", "hf,tik", "--deadline-s", "0"]) == 1
    rep = json.loads((tmp_path / "megatron_bench.json").read_text())
    assert all("skipped" in r for r in rep["variants"].values())
