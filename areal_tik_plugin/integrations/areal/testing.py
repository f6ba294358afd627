"""Helpers for the CPU end-to-end tests (importable by AReaL's workers by dotted path)."""

from __future__ import annotations


def parity_reward_fn(prompt, completions, prompt_ids, completion_ids, answer=None, **kwargs) -> float:
    """1.0 when the completion's token ids sum to an odd number, else 0.0.

    A random tiny model scores 0 on GSM8K; this reward varies across samples of a group so that
    GRPO advantages (and so gradients and the policy update) are non-zero in 3-step CPU runs.
    """
    return float(sum(int(t) for t in completion_ids) % 2)
