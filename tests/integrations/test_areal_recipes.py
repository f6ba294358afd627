"""Every recipe cell composes into a valid AReaL 1.0.4 config, and the plugin's plan for it is the
documented one (CPU; AReaL imported, nothing launched)."""

import itertools
import os
import sys

import pytest

# AReaL 1.0.4 imports swanlab/trackio unconditionally: put the plugin's import stubs on sys.path when
# the real packages are absent (only these two; SGLang's torchvision stub stays out of this process)
from areal_tik_plugin.integrations.areal.env import areal_stub_path  # noqa: E402

if areal_stub_path() and areal_stub_path() not in sys.path:
    sys.path.insert(0, areal_stub_path())

pytest.importorskip("areal")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "recipes"))
import launch  # noqa: E402  (recipes/launch.py)


def compose(cell, extra=()):
    """What the wrapper does before AReaL's dataclass merge -> (AReaL config, tik, recipe section)."""
    from areal.api.cli_args import GRPOConfig, parse_cli_args
    from omegaconf import OmegaConf

    import areal.api.cli_args as CA
    from areal_tik_plugin import run as R

    R._install_section_hook()
    R._CTX["sections"].clear()
    argv = launch.command(cell, list(extra))[4:]  # drop "python -m areal_tik_plugin.run ENTRY"
    cfg = OmegaConf.to_object(CA.to_structured_cfg(parse_cli_args(argv)[0], GRPOConfig))
    return cfg, R.resolved_tik(), R._CTX["sections"].get("recipe")


@pytest.mark.parametrize("model,algorithm,s,mode", list(itertools.product(
    launch.MODELS, launch.ALGORITHMS, launch.STALENESS, launch.groups("mode"))))
def test_cell_composes_and_plans(model, algorithm, s, mode):
    from areal_tik_plugin.integrations.areal import config as C

    cell = {"model": model, "algorithm": algorithm, "staleness": f"s{s}", "mode": mode, "seed": 3}
    cfg, tik, recipe = compose(cell)
    assert cfg.rollout.max_head_offpolicyness == s
    assert (cfg.critic is not None) == (algorithm == "ppo")
    assert cfg.seed == 3 and cfg.sglang.random_seed == 3
    w = cfg.stats_logger.wandb
    assert w.project == "areal-tik-gsm8k"
    assert w.group == f"gsm8k-{algorithm}-{recipe['model']}-s{s}" and w.name == f"{mode}-seed3"
    assert set(w.tags) == {"gsm8k", algorithm, recipe["model"], f"s{s}", mode}
    # AReaL's example hyperparameters
    assert cfg.actor.optimizer.lr == pytest.approx(1.7e-5) and cfg.actor.eps_clip == 0.4
    assert cfg.gconfig.n_samples == 4 and cfg.gconfig.max_new_tokens == 1024
    assert cfg.actor.recompute_logprob and cfg.actor.use_decoupled_loss  # before the plan
    p = C.plan(cfg, tik)
    C.apply(cfg, p, tik)
    if mode == "baseline":
        assert not p.enabled and p.recompute_forward and cfg.actor.recompute_logprob
    elif s == 0:
        assert p.mode == "reuse" and not p.recompute_forward
        assert not cfg.actor.recompute_logprob and not cfg.actor.use_decoupled_loss
        assert not cfg.actor.should_compute_prox_logp()
    elif mode == "tik-loglinear":
        assert p.mode == "loglinear" and not cfg.actor.should_compute_prox_logp()
        assert cfg.actor.use_decoupled_loss and cfg.actor.rejection_sampling is not None
    else:
        assert p.mode == "recompute-prox" and cfg.actor.should_compute_prox_logp()
    for spec in C.iter_scheduling_specs(cfg):
        assert "areal_tik_plugin.integrations.areal.worker" in spec.cmd
        assert C.TikConfig.from_env(spec.env_vars["AREAL_TIK_CONFIG"]) == tik


def test_cpu_tiny_cell(tmp_path):
    cfg, tik, recipe = compose({"model": "cpu-tiny", "algorithm": "grpo", "staleness": "s0", "mode": "tik",
                                "seed": 1}, [f"cluster.fileroot={tmp_path}"])
    assert cfg.total_train_steps == 3 and cfg.actor.backend == "fsdp:d1p1t1" and tik.monitor_every == 1
    assert recipe == {"model": "cpu-tiny", "algorithm": "grpo", "mode": "tik"}


def test_gpu_random_cell(tmp_path):
    cfg, tik, recipe = compose({"model": "gpu-random-qwen3", "algorithm": "grpo", "staleness": "s0", "mode": "tik",
                                "seed": 1}, [f"cluster.fileroot={tmp_path}"])
    assert cfg.cluster.n_gpus_per_node == 2 and cfg.rollout.backend == "sglang:d1p1t1"
    assert cfg.actor.backend == "fsdp:d1p1t1" and cfg.total_train_steps == 4 and tik.model_type == "qwen3"
    assert recipe["model"] == "gpu-random-qwen3" and cfg.gconfig.max_new_tokens == 512
    # no flash-attn / sgl-kernel on the GPU box; weight updates through disk (xccl unchecked)
    assert cfg.actor.attn_impl == "sdpa" and cfg.actor.weight_update_mode == "disk"
    # SGLang refuses a context longer than the built model's max_position_embeddings (tiny.py: 1024)
    assert cfg.sglang.context_length <= 1024
    # the 32-row train split must hold every step in the configured epochs (else AReaL stops early)
    rows = sum(1 for _ in open(os.path.join(ROOT, "tests", "data", "gsm8k_tiny", "main", "train-00000-of-00001.jsonl")))
    assert cfg.total_train_epochs * (rows // cfg.train_dataset.batch_size) >= cfg.total_train_steps
    assert cfg.train_dataset.batch_size * cfg.gconfig.n_samples <= cfg.sglang.max_running_requests
    # the step script's model and data overrides reach every reader of them
    assert cfg.actor.path == "/tmp/tik-random-qwen3-1.7b" and cfg.train_dataset.path == "tests/data/gsm8k_tiny"
    cfg, _, _ = compose({"model": "gpu-random-qwen3", "algorithm": "grpo", "staleness": "s0", "mode": "tik", "seed": 1},
                        [f"cluster.fileroot={tmp_path}", f"actor.path={tmp_path}/m", f"train_dataset.path={tmp_path}/d"])
    assert cfg.actor.path == cfg.ref.path == cfg.tokenizer_path == cfg.sglang.model_path == f"{tmp_path}/m"
    assert cfg.train_dataset.path == cfg.valid_dataset.path == f"{tmp_path}/d"


def test_gpu_random_cell_sglang_command(tmp_path, monkeypatch):
    """The SGLang command for the GPU cell as the launcher builds it there (CUDA, sgl_kernel stub):
    flags the installed SGLang parses; baseline on Triton attention + torch-native ops, plugins off."""
    pytest.importorskip("sglang")
    from areal_tik_plugin.integrations.areal import config as C
    from areal_tik_plugin.integrations.areal import sglang_cmd as S

    monkeypatch.setattr(S, "real_sgl_kernel", lambda: False)
    monkeypatch.setattr(S, "has_flashinfer", lambda: False)
    for mode in ("baseline", "tik"):
        cfg, tik, _ = compose({"model": "gpu-random-qwen3", "algorithm": "grpo", "staleness": "s0", "mode": mode,
                               "seed": 1}, [f"cluster.fileroot={tmp_path}", "+tik.sglang_device=cuda"])
        C.apply(cfg, C.plan(cfg, tik, model_type="qwen3"), tik)
        cmd, env = S.build_command(S.server_args_from_areal(cfg, port=30000), tik)
        flags = dict(zip(cmd, cmd[1:]))
        assert flags["--device"] == "cuda" and flags["--context-length"] == "1024"
        assert flags["--sampling-backend"] == "pytorch" and flags["--grammar-backend"] == "none"
        assert flags["--max-running-requests"] == flags["--cuda-graph-max-bs-decode"] == "64"
        assert "--disable-cuda-graph" not in cmd and env["SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK"] == "1"
        if mode == "tik":
            assert flags["--attention-backend"] == "tik" and env["SGLANG_PLUGINS"] == "tik"
            assert "SGLANG_FORCE_FUSED_OP_BACKEND" not in env
        else:
            assert flags["--attention-backend"] == "triton" and env["SGLANG_PLUGINS"] == "none"
            assert env["SGLANG_FORCE_FUSED_OP_BACKEND"] == "torch"


def test_gpu_e2e_cell(tmp_path, monkeypatch):
    """The end-to-end GPU cell: NCCL weight updates, AReaL's default FSDP attention unless overridden (the
    step script's fallback), >= 20 measured steps after one warm-up that the data split can hold."""
    from areal.api.cli_args import TrainEngineConfig

    for mode in ("baseline", "tik"):
        cfg, tik, recipe = compose({"model": "gpu-e2e-qwen3", "algorithm": "grpo", "staleness": "s0", "mode": mode,
                                    "seed": 1}, [f"cluster.fileroot={tmp_path}"])
        assert recipe["model"] == "gpu-e2e-qwen3" and recipe["mode"] == mode
        assert cfg.actor.weight_update_mode == "xccl" and cfg.cluster.n_gpus_per_node == 2
        assert cfg.actor.attn_impl == TrainEngineConfig.__dataclass_fields__["attn_impl"].default == "flash_attention_2"
        assert cfg.total_train_steps - 1 >= 20
        # the GPU carry has no wandb: its stand-in (devenv/areal_gpu_stubs/wandb) serves the disabled mode only
        assert cfg.stats_logger.wandb.mode == "disabled"
        rows = sum(1 for _ in open(os.path.join(ROOT, "tests", "data", "gsm8k_tiny", "main", "train-00000-of-00001.jsonl")))
        assert cfg.total_train_epochs * (rows // cfg.train_dataset.batch_size) >= cfg.total_train_steps
    cfg, _, _ = compose({"model": "gpu-e2e-qwen3", "algorithm": "grpo", "staleness": "s0", "mode": "baseline",
                         "seed": 1}, [f"cluster.fileroot={tmp_path}", "actor.attn_impl=sdpa"])
    assert cfg.actor.attn_impl == cfg.ref.attn_impl == "sdpa"


def test_gpu_baseline_sglang_on_flashinfer_when_carried(tmp_path, monkeypatch):
    """With FlashInfer importable (the carried wheel), the baseline server is SGLang's flashinfer attention
    backend with sgl-kernel's fused ops served by FlashInfer (the stub's FlashInfer mode), not Triton +
    torch-native ops."""
    pytest.importorskip("sglang")
    from areal_tik_plugin.integrations.areal import config as C
    from areal_tik_plugin.integrations.areal import sglang_cmd as S

    monkeypatch.setattr(S, "real_sgl_kernel", lambda: False)
    monkeypatch.setattr(S, "has_flashinfer", lambda: True)
    monkeypatch.delenv("TIK_SGL_KERNEL_SHIM", raising=False)
    monkeypatch.delenv("SGLANG_FORCE_FUSED_OP_BACKEND", raising=False)
    cfg, tik, _ = compose({"model": "gpu-random-qwen3", "algorithm": "grpo", "staleness": "s0", "mode": "baseline",
                           "seed": 1}, [f"cluster.fileroot={tmp_path}", "+tik.sglang_device=cuda"])
    C.apply(cfg, C.plan(cfg, tik, model_type="qwen3"), tik)
    cmd, env = S.build_command(S.server_args_from_areal(cfg, port=30000), tik)
    flags = dict(zip(cmd, cmd[1:]))
    assert flags["--attention-backend"] == "flashinfer" and env["TIK_SGL_KERNEL_SHIM"] == "flashinfer"
    assert "SGLANG_FORCE_FUSED_OP_BACKEND" not in env and env["SGLANG_PLUGINS"] == "none"


def test_assign_gpus():
    from areal_tik_plugin.run import assign_gpus

    assert assign_gpus(1, 1, 1, visible=["0", "1"]) == (["0"], "1")
    assert assign_gpus(1, 1, 1, visible=["4", "6", "7"]) == (["4"], "6")
    assert assign_gpus(2, 2, 2, visible=[str(i) for i in range(8)]) == (["0,1", "2,3"], "4,5")
    assert assign_gpus(1, 1, 1, visible=["0"]) is None and assign_gpus(1, 1, 1, visible=[]) is None


def test_tiny_builder_shapes(tmp_path):
    from areal_tik_plugin import models

    assert models.checkpoint_kwargs("qwen3-1.7b") == ("qwen3", dict(
        vocab_size=151936, hidden_size=2048, num_layers=28, num_heads=16, num_kv_heads=8, head_dim=128,
        intermediate_size=6144, init_std=0.02))
    with pytest.raises(SystemExit):
        models.main([str(tmp_path / "m"), "qwen3", "--shape", "qwen3-70b"])  # unknown shape: argparse error


def test_matrix_dry_run(capsys):
    assert launch.main(["--all", "--seeds", "1", "2", "--dry-run"]) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("[")]
    assert len(lines) == 2 * 2 * 3 * 2 * 2 and lines[0].startswith("[1/48]")


@pytest.mark.parametrize("argv,msg", [(["--model", "qwen9"], "invalid choice"), (["--seeds", "x"], "non-negative"),
                                      (["--seeds", "-1"], "non-negative"), (["--model", "cpu-tiny"], "every one of"),
                                      (["--staleness", "3"], "invalid choice"), (["--mode", "fast"], "invalid choice")])
def test_launcher_refuses_bad_arguments(argv, msg, capsys):
    with pytest.raises(SystemExit) as e:
        launch.main(argv + ["--dry-run"])
    assert e.value.code == 2 and msg in capsys.readouterr().err


def test_summary_lines(tmp_path, capsys):
    """The gsm8k step's per-mode line: means over the steps after the warm-up, tik/baseline ratio."""
    import json

    from areal_tik_plugin.integrations.areal import summary

    def write(mode, walls, recompute):
        p = tmp_path / mode / "tik_stats.jsonl"
        p.parent.mkdir()
        rows = [{"meta": {"recipe": {"mode": mode}, "plan": {"enabled": mode == "tik", "mode": mode}}}]
        for i, w in enumerate(walls):
            r = {"step": i, "tik/throughput/response_tokens": 1000.0, "tik/throughput/step_wall_s": w,
                 "timeperf/rollout": w / 2, "timeperf/train_step": 1.0, "timeperf/update_weights": 0.5,
                 "ppo_actor/update/importance_weight/min": 1.0, "ppo_actor/update/importance_weight/max": 1.0}
            if recompute:
                r["timeperf/recompute_logp"] = 0.25
            rows.append(r)
        p.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
        return str(p)

    b, t = write("baseline", [30.0, 4.0, 4.0, 4.0], True), write("tik", [40.0, 2.0, 2.0, 2.0], False)
    out = tmp_path / "s.json"
    assert summary.main([b, t, "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "baseline: 3 steps (+1 warm-up 30.0 s) | 250 tok/s | step 4.00 s" in text and "recompute 0.250" in text
    assert "tik: 3 steps" in text and "500 tok/s" in text and "recompute 0.000" in text
    assert "throughput x2.000" in text
    res = json.loads(out.read_text())
    assert res["tik_over_baseline"]["step_s"] == 0.5 and res["tik"]["recompute_steps"] == 0
    assert summary.main([str(tmp_path / "missing.jsonl")]) == 1
