"""Runtime mismatch monitor: recompute a few sequences through the training path and compare the
log-probs bit for bit with the values SGLang returned at rollout.

Alignment (AReaL's trajectory layout, batch dim 1): ``logprobs[t]`` is the rollout log-prob of
``input_ids[t]`` (0 on prompt tokens) and ``loss_mask[t]`` marks response tokens; the training
forward returns ``out[t] = log p(input_ids[t+1] | input_ids[:t+1])``. So ``out[t]`` pairs with
``logprobs[t+1]`` wherever ``loss_mask[t+1]`` is set -- AReaL's own ``torch.roll(..., -1)``.

On a mismatch (any bit differs) the monitor warns and, by ``tik.on_mismatch``, falls back to
recomputing for the rest of the run (``fallback``), raises (``raise``) or only logs (``warn``).
"""

from __future__ import annotations

import logging

import torch

logger = logging.getLogger("areal_tik_plugin.monitor")


class TikMismatchError(RuntimeError):
    """Rollout and training log-probs differ and ``tik.on_mismatch=raise``."""


def _flat(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1)


def aligned_pair(traj: dict, recomputed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(rollout, recomputed) fp32 log-probs of the response tokens of one trajectory."""
    lp = _flat(traj["logprobs"]).float()
    mask = _flat(traj["loss_mask"]).bool()
    n = lp.numel()
    out = _flat(recomputed).float()
    if out.numel() < n - 1:
        raise ValueError(f"recomputed log-probs: expected >= {n - 1} values, got {out.numel()}")
    sel = mask[1:n]
    return lp[1:n][sel], out[: n - 1][sel]


def compare(rollout: torch.Tensor, recomputed: torch.Tensor) -> dict[str, float]:
    """Bitwise comparison of two fp32 vectors -> tik/mismatch/* statistics."""
    if rollout.shape != recomputed.shape:
        raise ValueError(f"shapes differ: {tuple(rollout.shape)} vs {tuple(recomputed.shape)}")
    a = rollout.float().contiguous()
    b = recomputed.float().contiguous()
    n = a.numel()
    differ = a.view(torch.int32) != b.view(torch.int32)
    nd = int(differ.sum())
    max_abs = float((a.double() - b.double()).abs().max()) if n else 0.0
    return {"checked_tokens": float(n), "mismatched_tokens": float(nd),
            "frac_mismatch": nd / n if n else 0.0, "max_abs_diff": max_abs}


def plant_one_ulp(traj: dict) -> int:
    """Move the first response token's rollout log-prob by one ulp (in place); returns its index."""
    lp = traj["logprobs"]
    flat = lp.view(-1)
    idx = int(torch.nonzero(_flat(traj["loss_mask"]).bool())[0])
    v = flat[idx : idx + 1]
    flat[idx] = torch.nextafter(v, torch.full_like(v, float("inf")))[0]
    return idx


class MismatchMonitor:
    """State of the monitor in one training worker."""

    def __init__(self, every: int, samples: int, on_mismatch: str = "fallback", plant_drift_step: int = -1):
        self.every = int(every)
        self.samples = int(samples)
        self.on_mismatch = on_mismatch
        self.plant_drift_step = int(plant_drift_step)
        self.fallback = False
        self.events: list[dict] = []

    def due(self, step: int) -> bool:
        return (self.every > 0 and step % self.every == 0) or step == self.plant_drift_step

    def pick(self, n: int) -> list[int]:
        """Indices of the sequences to check: evenly spread over the batch, deterministic."""
        k = min(self.samples, n)
        return sorted({round(i * (n - 1) / max(k - 1, 1)) for i in range(k)}) if n else []

    def check(self, step: int, trajs: list[dict], recomputed: list[torch.Tensor]) -> dict[str, float]:
        """Compare and act; returns the stats (``tik/mismatch/`` prefix added by the caller)."""
        pairs = [aligned_pair(t, r) for t, r in zip(trajs, recomputed)]
        if pairs:
            st = compare(torch.cat([p[0] for p in pairs]), torch.cat([p[1] for p in pairs]))
        else:
            st = compare(torch.zeros(0), torch.zeros(0))
        st["sequences"] = float(len(pairs))
        if st["mismatched_tokens"] > 0:
            msg = (f"[tik] rollout/training log-prob MISMATCH at step {step}: "
                   f"{int(st['mismatched_tokens'])}/{int(st['checked_tokens'])} tokens differ, "
                   f"max |dlogp| = {st['max_abs_diff']:.3e}")
            self.events.append({"step": step, **st})
            if self.on_mismatch == "raise":
                raise TikMismatchError(msg + " (tik.on_mismatch=raise)")
            if self.on_mismatch == "fallback" and not self.fallback:
                self.fallback = True
                msg += "; falling back to recomputing log-probs for the rest of the run"
            print(msg, flush=True)
        return st
