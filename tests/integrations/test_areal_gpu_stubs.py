"""The import-only ``ray`` and ``wandb`` stand-ins used to run AReaL on the GPU machine
(``devenv/areal_gpu_stubs``): imports work, nothing runs silently."""

from __future__ import annotations

import os
import subprocess
import sys

from areal_tik_plugin.runtime.source_checkout import devenv_dir

STUBS = devenv_dir("areal_gpu_stubs", required=True)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CHILD = r"""
import ray
assert ray.__file__.startswith(STUBS), ray.__file__
import ray.exceptions
from ray.util.placement_group import PlacementGroup, placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
from ray.runtime_env import RuntimeEnv
assert ray.is_initialized() is False
assert not isinstance(object(), ray.ObjectRef)

@ray.remote
class Store:
    pass

assert Store.__name__ == "Store"
annotation = ray.actor.ActorHandle  # used in dataclass annotations
for call in (lambda: ray.get([]), lambda: placement_group([]), lambda: ray.init()):
    try:
        call()
    except RuntimeError as e:
        assert "ray is not installed here" in str(e), e
    else:
        raise AssertionError("a ray stub call must raise")
try:
    raise ray.exceptions.RayActorError
except RuntimeError:
    pass  # the placeholder exception cannot even be built
print("RAY-STUB-OK")
"""


def test_ray_stub_imports_and_raises():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([STUBS, os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-c", f"STUBS = {STUBS!r}\n" + CHILD], env=env, capture_output=True,
                       text=True, timeout=60)
    assert "RAY-STUB-OK" in r.stdout, r.stdout + r.stderr


WANDB_CHILD = r"""
import os, tempfile
import wandb
assert wandb.__file__.startswith(STUBS), wandb.__file__

def raises(exc, call, text="wandb is not installed here"):
    try:
        call()
    except exc as e:
        assert text in str(e), e
    else:
        raise AssertionError(f"{call} must raise {exc.__name__}")

# everything that would log for real names the missing package
raises(RuntimeError, lambda: wandb.log({"a": 1.0}, step=0))  # before init
raises(RuntimeError, lambda: wandb.init(mode="offline", project="p"))
raises(RuntimeError, lambda: wandb.init(mode="online"))
raises(RuntimeError, lambda: wandb.init())  # WANDB_MODE unset: wandb's default is online
os.environ["WANDB_MODE"] = "offline"
raises(RuntimeError, lambda: wandb.init())
raises(RuntimeError, lambda: wandb.login())
raises(AttributeError, lambda: wandb.Table)
raises(ModuleNotFoundError, lambda: __import__("wandb.proto.wandb_internal_pb2"))
raises(ModuleNotFoundError, lambda: __import__("wandb.sdk.internal.datastore"))
assert wandb.run is None

# the disabled mode: the argument wins over WANDB_MODE, as in wandb; then log/finish record nothing
r = wandb.init(mode="disabled", project="p", name="n")
assert wandb.run is r and r.disabled and r.name == "n"
wandb.log({"a": 1.0}, step=3)
raises(TypeError, lambda: wandb.log([1.0]), "expects a dict")
wandb.finish()
assert wandb.run is None
raises(RuntimeError, lambda: wandb.log({"a": 1.0}))
os.environ["WANDB_MODE"] = "disabled"
wandb.init(); wandb.finish()

# AReaL 1.0.4's own stats logger, the module that imports wandb in the trainers, on the stand-in
from areal.api import FinetuneSpec
from areal.api.cli_args import BaseExperimentConfig
from areal.utils.stats_logger import StatsLogger

root = tempfile.mkdtemp()
cfg = BaseExperimentConfig(experiment_name="e", trial_name="t")
cfg.stats_logger.fileroot = root
cfg.stats_logger.experiment_name, cfg.stats_logger.trial_name = "e", "t"
assert cfg.stats_logger.wandb.mode == "disabled"
sl = StatsLogger(cfg, FinetuneSpec(total_train_epochs=1, dataset_size=4, train_batch_size=2))
sl.commit(0, 0, 0, {"ppo_actor/task_reward/avg": 0.5})
sl.close()
cfg.stats_logger.wandb.mode = "offline"
raises(RuntimeError, lambda: StatsLogger(cfg, FinetuneSpec(total_train_epochs=1, dataset_size=4, train_batch_size=2)))

# the gsm8k-e2e step's import chain on the stand-ins (ray's too, as on the GPU machine): the recipe's own
# imports, its workflow and reward, the plugin's wrapper, summary and `tik compare` on local JSONL runs
import json, runpy, sys
runpy.run_path(os.path.join(ROOT, "recipes", "gsm8k_rl.py"), run_name="imports_only")
import areal.reward.gsm8k, areal.trainer.rl_trainer, areal.workflow.rlvr  # noqa: E401
import areal_tik_plugin.integrations.areal.hooks, areal_tik_plugin.integrations.areal.summary  # noqa: E401
import areal_tik_plugin.run  # noqa: F401
from areal_tik_plugin import cli
runs = []
for mode in ("baseline", "tik"):
    runs.append(os.path.join(root, f"{mode}.jsonl"))
    with open(runs[-1], "w") as f:
        f.write(json.dumps({"meta": {"experiment_name": "c", "recipe": {"mode": mode}}}) + "\n")
        for step in range(3):
            f.write(json.dumps({"step": step, "tik/throughput/response_tokens": 100.0, "tik/throughput/step_wall_s": 1.0,
                                "ppo_actor/task_reward/avg": 0.5}) + "\n")
assert cli.main(["compare", *runs, "-o", os.path.join(root, "cmp")]) == 0
assert "| c |" in open(os.path.join(root, "cmp", "report.md")).read()
real = [m for m in sys.modules if m.split(".")[0] in ("wandb", "ray")
        and not (getattr(sys.modules[m], "__file__", None) or STUBS).startswith(STUBS)]
assert not real, real
print("WANDB-STUB-OK")
"""


def test_wandb_stub_disabled_mode_only_and_the_gsm8k_chain_runs_on_it():
    from areal_tik_plugin.integrations.areal.env import cpu_stub_paths

    # STUBS first: the CPU venv has the real wandb, which the stand-in must shadow here
    path = [STUBS, *cpu_stub_paths(), os.environ.get("PYTHONPATH", "")]
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in path if p)
    r = subprocess.run([sys.executable, "-c", f"STUBS, ROOT = {STUBS!r}, {ROOT!r}\n" + WANDB_CHILD], env=env,
                       capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert "WANDB-STUB-OK" in r.stdout, r.stdout + r.stderr
