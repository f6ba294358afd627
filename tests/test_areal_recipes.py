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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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
    assert cfg.actor.backend == "fsdp:d1p1t1" and cfg.total_train_steps == 5 and tik.model_type == "qwen3"
    assert recipe["model"] == "gpu-random-qwen3" and cfg.gconfig.max_new_tokens == 512


def test_tiny_builder_shapes(tmp_path):
    from areal_tik_plugin.integrations.areal import tiny

    assert tiny.SHAPES["qwen3-1.7b"]["num_layers"] == 28
    with pytest.raises(SystemExit):
        tiny.main([str(tmp_path / "m"), "qwen3", "--shape", "qwen3-70b"])  # unknown shape: argparse error


def test_matrix_dry_run(capsys):
    assert launch.main(["--all", "--seeds", "1", "2", "--dry-run"]) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("[")]
    assert len(lines) == 2 * 2 * 3 * 2 * 2 and lines[0].startswith("[1/48]")
