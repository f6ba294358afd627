"""GSM8K PPO/GRPO entry point for the recipes (AReaL 1.0.4's examples/math/gsm8k_rl.py, unchanged in
behaviour) plus two switches the CPU tests need:

- ``TIK_REWARD_FN``: dotted path of the reward function (default AReaL's math-verify GSM8K reward;
  a random tiny model always scores 0 there, so tests use a reward that varies);
- nothing else: a ``critic`` section in the config makes it PPO (GRPOConfig is PPOConfig).

Run it as AReaL runs its examples, or through the plugin wrapper::

    python recipes/gsm8k_rl.py --config CONFIG.yaml scheduler.type=local ...
    python -m areal_tik_plugin.run recipes/gsm8k_rl.py --config CONFIG.yaml ... tik.enable=true
"""

import os
import sys

from areal import PPOTrainer
from areal.api.cli_args import GRPOConfig, load_expr_config
from areal.dataset import get_custom_dataset
from areal.utils.hf_utils import load_hf_tokenizer


def main(args):
    config, _ = load_expr_config(args, GRPOConfig)
    tokenizer = load_hf_tokenizer(config.tokenizer_path)

    train_dataset = get_custom_dataset(split="train", dataset_config=config.train_dataset, tokenizer=tokenizer)
    valid_dataset = get_custom_dataset(split="test", dataset_config=config.valid_dataset, tokenizer=tokenizer)

    workflow_kwargs = dict(
        # an environment variable, not an option: the whole argv goes to AReaL's config loader, which takes
        # GRPOConfig keys only (and areal_tik_plugin.run removes the recipe section before it)
        reward_fn=os.environ.get("TIK_REWARD_FN", "areal.reward.gsm8k.gsm8k_reward_fn"),
        gconfig=config.gconfig,
        tokenizer=config.tokenizer_path,
        enable_thinking=False,
    )
    eval_workflow_kwargs = workflow_kwargs.copy()
    eval_workflow_kwargs["gconfig"] = config.gconfig.new(temperature=0.6)

    with PPOTrainer(config, train_dataset=train_dataset, valid_dataset=valid_dataset) as trainer:
        trainer.train(
            workflow="areal.workflow.rlvr.RLVRWorkflow",
            workflow_kwargs=workflow_kwargs,
            eval_workflow="areal.workflow.rlvr.RLVRWorkflow",
            eval_workflow_kwargs=eval_workflow_kwargs,
        )


if __name__ == "__main__":
    main(sys.argv[1:])
