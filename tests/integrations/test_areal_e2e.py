"""Proof on CPU with real AReaL 1.0.4 + real SGLang 0.5.23: the GSM8K recipe (cpu-tiny cell) runs
AReaL's own PPOTrainer (FSDP2 on gloo) against an SGLang server, 3 GRPO steps, SPMD mode, through
``python -m areal_tik_plugin.run --spmd`` (SGLang started with the plugin, then torchrun).

* stock kernels, recompute off: importance_weight != 1 (the check can fail);
* plugin on, recompute off, staleness 0, AReaL's default packed micro-batches (tiny Qwen3; 2 steps of one
  prompt x 2 samples, both packed into one micro-batch -- interpreted kernels are slow):
  importance_weight min = max = 1.0 exactly, kl_div exactly 0, no recompute forward, the
  monitor sees 0 differing bits;
* plugin on, tiny Qwen3-MoE, a one-ulp drift planted at step 1: step 0 exact, the monitor flags
  exactly the planted token, the fallback recomputes from then on;
* ``tik compare`` renders a report from these runs.

Slow (a few minutes; the kernels run under the Triton interpreter). Needs .ci/install_areal.sh.
"""

import json
import os
import signal
import subprocess
import sys

import pytest

# AReaL 1.0.4 imports swanlab/trackio unconditionally: put the plugin's import stubs on sys.path when
# the real packages are absent (only these two; SGLang's torchvision stub stays out of this process)
from areal_tik_plugin.integrations.areal.env import areal_stub_path  # noqa: E402

if areal_stub_path() and areal_stub_path() not in sys.path:
    sys.path.insert(0, areal_stub_path())

pytest.importorskip("areal")
pytest.importorskip("sglang")
pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUNS: dict[str, str] = {}
IW = ("ppo_actor/update/importance_weight/min", "ppo_actor/update/importance_weight/max")
KL = [f"ppo_actor/update/compute_logp/kl_div_direct/{s}" for s in ("avg", "min", "max")]


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    from areal_tik_plugin.models import build_model

    d = tmp_path_factory.mktemp("areal_e2e")
    build_model(str(d / "qwen3"), "qwen3")
    build_model(str(d / "qwen3_moe"), "qwen3_moe")
    return d


def run_recipe(work, name, model, *overrides, batch=1, timeout=900):
    from areal_tik_plugin.integrations.areal.env import with_cpu_stubs

    out = work / name
    out.mkdir()
    env = with_cpu_stubs()
    env.update(TIK_REWARD_FN="areal_tik_plugin.integrations.areal.testing.parity_reward_fn",
               TRITON_INTERPRET="1", WANDB_MODE="offline", WANDB_SILENT="true")
    cmd = [sys.executable, "-m", "areal_tik_plugin.run", "--spmd", "--log-dir", str(out),
           os.path.join(ROOT, "recipes", "gsm8k_rl.py"), "--config", os.path.join(ROOT, "recipes", "gsm8k", "config.yaml"),
           "model=cpu-tiny", "algorithm=grpo", "staleness=s0", f"cluster.fileroot={out}/fr",
           f"cluster.name_resolve.nfs_record_root={out}/nr", f"train_dataset.batch_size={batch}",
           f"actor.path={work / model}", "train_dataset.path=" + os.path.join(ROOT, "tests", "data", "gsm8k_tiny"),
           "gconfig.max_new_tokens=8", f"trial_name={name}", *overrides]
    log = out / "run.log"
    with open(log, "w") as f:
        p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = p.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGTERM)
            p.wait(30)
            rc = "timeout"
    text = log.read_text()
    stats = [str(x) for x in out.rglob("tik_stats.jsonl")]
    assert rc == 0 and len(stats) == 1, f"run {name} failed (rc={rc}):\n{text[-6000:]}"
    rows = [json.loads(x) for x in open(stats[0]) if x.strip()]
    assert "meta" in rows[0]
    RUNS[name] = stats[0]
    return rows[0]["meta"], rows[1:], text


def test_stock_kernels_recompute_off_importance_weight_not_one(work):
    meta, rows, _ = run_recipe(work, "stock-off", "qwen3", "mode=baseline", "actor.recompute_logprob=false",
                               "actor.use_decoupled_loss=false", batch=2)
    assert meta["plan"]["mode"] == "baseline" and not meta["plan"]["recompute_forward"]
    assert len(rows) == 3
    assert all("timeperf/recompute_logp" not in r for r in rows)
    assert any(r[IW[0]] != 1.0 or r[IW[1]] != 1.0 for r in rows), [(r[IW[0]], r[IW[1]]) for r in rows]
    # the (observing) monitor sees the stock rollout/training mismatch
    assert any(r["tik/mismatch/mismatched_tokens"] > 0 for r in rows)
    assert all(r["tik/throughput/tokens_per_s"] > 0 for r in rows)


def test_plugin_reuse_is_bitwise_exact_qwen3(work):
    # 2 steps: step 1 rolls out on the weights step 0's update synced, and the monitor skips it
    meta, rows, log = run_recipe(work, "tik-qwen3", "qwen3", "mode=tik", "tik.monitor_every=2",
                                 "total_train_steps=2", batch=1)
    plan = meta["plan"]
    assert plan["enabled"] and plan["mode"] == "reuse" and not plan["recompute_forward"]
    assert "patched Qwen3ForCausalLM" in log and "replaced" in log
    assert len(rows) == 2
    for r in rows:
        assert r[IW[0]] == 1.0 and r[IW[1]] == 1.0, (r["step"], r[IW[0]], r[IW[1]])
        assert all(r[k] == 0.0 for k in KL), [r[k] for k in KL]
        assert "timeperf/recompute_logp" not in r and "tik/time/fallback_recompute_s" not in r
        assert r["tik/fallback_active"] == 0.0
        # AReaL's default packing: several sequences per micro-batch
        assert r["ppo_actor/n_seqs"] > r["ppo_actor/update/num_micro_batches"] == 1.0
    checked = [r for r in rows if "tik/mismatch/checked_tokens" in r]
    assert [r["step"] for r in checked] == [0]
    assert all(r["tik/mismatch/checked_tokens"] > 0 and r["tik/mismatch/mismatched_tokens"] == 0 for r in checked)


def test_plugin_moe_monitor_catches_planted_drift_and_falls_back(work):
    # one prompt x 2 samples is 80-88 tokens: a 128-token micro-batch instead of AReaL's 256-token page
    # alignment halves the interpreted forward / backward work (the bits do not depend on the padding)
    meta, rows, log = run_recipe(work, "tik-moe-drift", "qwen3_moe", "mode=tik", "tik.monitor_every=1",
                                 "tik.plant_drift_step=1", "+actor.pad_to_maximum=true",
                                 "actor.mb_spec.max_tokens_per_mb=128")
    assert "patched Qwen3MoeForCausalLM" in log
    r0, r1, r2 = rows
    assert r0[IW[0]] == r0[IW[1]] == 1.0 and r0["tik/mismatch/mismatched_tokens"] == 0
    assert r0["tik/fallback_active"] == 0.0
    assert "planted a one-ulp drift" in log and "falling back to recomputing" in log
    assert r1["tik/mismatch/mismatched_tokens"] == 1.0 and 0 < r1["tik/mismatch/max_abs_diff"] < 1e-6
    # step 1: the worker hook recomputes the batch; from step 2 on AReaL's own recompute phase runs
    # (SPMD: the trainer shares the actor config the fallback switched to recompute_logprob=true)
    assert r1["tik/fallback_active"] == 1.0 and r1["tik/time/fallback_recompute_s"] > 0
    assert r2["tik/fallback_active"] == 1.0 and (r2["tik/recompute_forward"] == 1.0 or "tik/time/fallback_recompute_s" in r2)
    for r in (r1, r2):
        assert r[IW[0]] == r[IW[1]] == 1.0  # recomputed old log-probs, same kernels
    assert "tik/mismatch/checked_tokens" not in r2  # no more checks once recomputing


def test_compare_renders_report_from_the_runs(work, tmp_path):
    if len(RUNS) < 2:
        pytest.skip("needs the runs above")
    from areal_tik_plugin import cli

    out = tmp_path / "report"
    assert cli.main(["compare", *RUNS.values(), "-o", str(out)]) == 0
    text = (out / "report.md").read_text()
    assert "## Throughput" in text and "baseline" in text and "| tik" in text
    assert (out / "throughput.png").exists() and (out / "reward.png").exists()
