"""`tik compare` on synthetic local runs (JSONL stats logs as the plugin writes them)."""

import json
import os

import pytest

from areal_tik_plugin import cli, compare


def write_run(root, cfg, mode, seed, tok_s, reward0, steps=12):
    d = os.path.join(root, cfg, f"{mode}-seed{seed}")
    os.makedirs(d)
    meta = {"experiment_name": cfg, "trial_name": f"{mode}-seed{seed}",
            "wandb": {"project": "p", "group": cfg, "name": f"{mode}-seed{seed}", "tags": [mode]},
            "recipe": {"model": "m", "algorithm": "grpo", "mode": mode}, "tik": {"enable": mode == "tik"}}
    with open(os.path.join(d, "tik_stats.jsonl"), "w") as f:
        f.write(json.dumps({"meta": meta}) + "\n")
        for s in range(steps):
            row = {"step": s, "tik/throughput/response_tokens": 100.0 * tok_s, "tik/throughput/step_wall_s": 100.0,
                   "ppo_actor/task_reward/avg": reward0 + 0.01 * s, "ppo_actor/update/actor_loss/avg": -0.1,
                   "ppo_actor/update/grad_norm": 0.5, "timeperf/train_step": 2.0,
                   "ppo_actor/update/importance_weight/min": 1.0 if mode == "tik" else 0.97,
                   "ppo_actor/update/importance_weight/max": 1.0 if mode == "tik" else 1.04,
                   "tik/mismatch/frac_mismatch": 0.0 if mode == "tik" else 0.8,
                   "tik/mismatch/max_abs_diff": 0.0 if mode == "tik" else 0.3}
            if mode == "baseline":
                row["timeperf/recompute_logp"] = 1.0
            f.write(json.dumps(row) + "\n")


def test_report_tables_and_plots(tmp_path):
    pytest.importorskip("matplotlib")
    for seed in (1, 2):
        write_run(tmp_path / "runs", "gsm8k-grpo-m-s0", "tik", seed, tok_s=3.0, reward0=0.50)
        write_run(tmp_path / "runs", "gsm8k-grpo-m-s0", "baseline", seed, tok_s=2.0, reward0=0.50)
    write_run(tmp_path / "runs", "gsm8k-ppo-m-s2", "tik", 1, tok_s=5.0, reward0=0.2)
    write_run(tmp_path / "runs", "gsm8k-ppo-m-s2", "baseline", 1, tok_s=4.0, reward0=0.4)
    out = tmp_path / "out"
    assert cli.main(["compare", str(tmp_path / "runs"), "-o", str(out), "--window", "3"]) == 0
    text = (out / "report.md").read_text()
    assert "| gsm8k-grpo-m-s0 | 2 | 3 | 1.500 |" in text  # baseline, tik tok/s, ratio tik/baseline
    assert "| gsm8k-ppo-m-s2 | 4 | 5 | 1.250 |" in text
    assert "| gsm8k-ppo-m-s2 | 0.455 | 0.255 | 0.560 |" in text  # mean reward per mode + ratio
    assert "recompute_logp" in text and "| 0.97 | 1.04 |" in text
    for png in ("throughput.png", "phases.png", "reward.png", "policy_loss.png", "grad_norm.png", "mismatch_frac.png"):
        assert (out / png).stat().st_size > 1000, png


def test_moving_average_and_errors(tmp_path):
    assert compare.moving_average([1, 2, 3, 4], 2) == [1, 1.5, 2.5, 3.5]
    with pytest.raises(FileNotFoundError):
        compare.load([str(tmp_path / "missing")])
    assert cli.main(["compare", str(tmp_path), "-o", str(tmp_path / "o")]) == 1  # no runs
