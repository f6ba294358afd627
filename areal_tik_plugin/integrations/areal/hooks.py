"""Patches installed into AReaL processes (the trainer in SPMD mode; every RPC worker and the
controller in single-controller mode). Each patch is idempotent and logs what it did.

Worker side (:func:`install_worker`):
  * FSDP engine: the policy model is patched right after it is built (``apply_to_model`` of the
    transformers integration) and AReaL's ``gather_logprobs`` / ``gather_logprobs_entropy`` --
    imported *by name* into ``areal.engine.fsdp_engine`` -- are replaced by the plugin's;
  * ``FSDPPPOActor.compute_advantages``: the runtime mismatch monitor and its fallback;
  * Megatron engine (``tik.actor_engine == "megatron"``, set from ``actor.backend``): the plugin's
    spec through mbridge, the log-prob helpers and the monitor
    (:mod:`areal_tik_plugin.integrations.megatron.areal`);
  * SGLang backend: a distinct ``sampling_seed`` per request, and ``launch_server`` building the
    SGLang command itself (AReaL 1.0.4's launcher targets SGLang 0.5.10).
Controller side (:func:`install_controller`): throughput, per-phase times and the JSONL stats log
(``StatsLogger.commit``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import time

from .config import Plan, TikConfig
from .monitor import MismatchMonitor, plant_one_ulp

logger = logging.getLogger("areal_tik_plugin.areal")
_DONE: set[str] = set()
_STATE: dict = {"tik": None, "plan": None}


def _say(msg: str) -> None:
    print(f"[tik] {msg}", flush=True)


def replace_everywhere(orig, new, prefix: str = "areal") -> int:
    """Rebind every module-level name bound to ``orig`` in modules under ``prefix`` to ``new``."""
    n = 0
    for name, mod in list(sys.modules.items()):
        if mod is None or not (name == prefix or name.startswith(prefix + ".")):
            continue
        d = getattr(mod, "__dict__", None)
        if not d:
            continue
        for k, v in list(d.items()):
            if v is orig:
                d[k] = new
                n += 1
    return n


# -- worker side ---------------------------------------------------------------------------------
def install_worker(tik: TikConfig, plan: Plan | None = None) -> None:
    _STATE["tik"], _STATE["plan"] = tik, plan or _STATE["plan"]
    tik.select_implementation()
    if tik.local_host:
        _pin_local_host()
    _patch_sglang_backend(tik)
    if tik.actor_engine == "megatron":
        _patch_megatron(tik)
        return
    _patch_actor(tik)
    if tik.enable:
        _patch_fsdp_engine(tik)


# -- Megatron engine (integrations/megatron/areal.py holds the patches) ---------------------------
def _patch_megatron(tik: TikConfig) -> None:
    from areal_tik_plugin.integrations.megatron import areal as MA

    monitor = lambda engine, data: _monitor_step(engine, data, tik)  # noqa: E731
    if tik.enable:
        _say(MA.install(tik, monitor, replace_everywhere))
    else:  # baseline: stock spec and log-probs, the monitor only observes
        MA.patch_engine_monitor_only(monitor)
# -- end Megatron


def _pin_local_host() -> None:
    if "local_host" in _DONE:
        return
    import areal.utils.network as N

    orig = N.gethostip

    def gethostip(*a, **k):
        return "127.0.0.1"

    N.gethostip = gethostip
    replace_everywhere(orig, gethostip)
    _DONE.add("local_host")


def _patch_fsdp_engine(tik: TikConfig) -> None:
    if "fsdp" in _DONE:
        return
    import areal.engine.fsdp_engine as FE
    from areal_tik_plugin.integrations import logprobs as LP
    from areal_tik_plugin.integrations import transformers as TT

    n1 = replace_everywhere(FE.gather_logprobs, LP.gather_logprobs)
    n2 = replace_everywhere(FE.gather_logprobs_entropy, LP.gather_logprobs_entropy)
    FE.gather_logprobs, FE.gather_logprobs_entropy = LP.gather_logprobs, LP.gather_logprobs_entropy

    orig_create = FE.FSDPEngine._create_llm_actor_or_critic

    def _create_llm_actor_or_critic(self):
        model = orig_create(self)
        if getattr(self.config, "is_critic", False):
            return model  # the critic's values are not part of the contract
        TT.apply_to_model(model)
        _say(f"patched {type(model).__name__} ({model.config.model_type}) with the unified kernels")
        return model

    FE.FSDPEngine._create_llm_actor_or_critic = _create_llm_actor_or_critic
    _DONE.add("fsdp")
    _say(f"FSDP engine: gather_logprobs/gather_logprobs_entropy replaced ({n1 + n2} bindings); "
         f"policy model patched on creation")


def _patch_actor(tik: TikConfig) -> None:
    if "actor" in _DONE:
        return
    import areal.engine.fsdp_engine as FE

    orig = FE.FSDPPPOActor.compute_advantages

    def compute_advantages(self, data, *args, **kwargs):
        _monitor_step(self, data, tik)
        return orig(self, data, *args, **kwargs)

    compute_advantages.__wrapped__ = orig
    FE.FSDPPPOActor.compute_advantages = compute_advantages
    _DONE.add("actor")


def _monitor_step(engine, data, tik: TikConfig) -> None:
    from areal.utils import stats_tracker

    mon = getattr(engine, "_tik_monitor", None)
    if mon is None:
        # baseline runs (plugin off) only observe: AReaL already recomputes there
        mon = MismatchMonitor(tik.monitor_every, tik.monitor_samples,
                              tik.on_mismatch if tik.enable else "warn", tik.plant_drift_step)
        engine._tik_monitor, engine._tik_step = mon, 0
    step = engine._tik_step
    engine._tik_step += 1
    if not isinstance(data, list) or not data:
        return
    stats: dict[str, float] = {}
    has_prox = data[0].get("prox_logp") is not None
    if mon.due(step) and not mon.fallback:
        idx = mon.pick(len(data))
        sample = [data[i] for i in idx]
        if tik.enable and step == tik.plant_drift_step:
            k = plant_one_ulp(sample[0])
            _say(f"planted a one-ulp drift in a rollout log-prob (step {step}, token {k})")
        t = time.perf_counter()
        rec = [data[i]["prox_logp"] for i in idx] if has_prox else engine.compute_logp(sample)
        st = mon.check(step, sample, rec)
        stats.update({f"tik/mismatch/{k}": v for k, v in st.items()})
        stats["tik/time/monitor_s"] = time.perf_counter() - t
    if mon.fallback and tik.enable:
        cfg = engine.actor.config
        if not has_prox:
            t = time.perf_counter()
            for traj, lp in zip(data, engine.compute_logp(data)):
                traj["prox_logp"] = lp
            stats["tik/time/fallback_recompute_s"] = time.perf_counter() - t
        if cfg.use_decoupled_loss:
            cfg.prox_logp_method = "recompute"
        else:
            cfg.recompute_logprob = True
    stats["tik/fallback_active"] = float(mon.fallback)
    stats_tracker.scalar(**stats)


def _patch_sglang_backend(tik: TikConfig) -> None:
    if "sglang" in _DONE:
        return
    import areal.engine.sglang_remote as SR

    B = SR.SGLangBackend
    if tik.enable and tik.seed_per_sample:
        orig_req = B.build_generation_request
        base = int(os.environ.get("AREAL_TIK_SEED", "0"))

        def build_generation_request(self, req, *args, **kwargs):
            http = orig_req(self, req, *args, **kwargs)
            sp = http.payload.setdefault("sampling_params", {})
            if sp.get("sampling_seed") is None:
                h = hashlib.sha256(f"{base}:{req.rid}".encode()).digest()
                sp["sampling_seed"] = int.from_bytes(h[:4], "little") & 0x7FFFFFFF
            return http

        B.build_generation_request = build_generation_request

    def launch_server(self, server_args):
        import subprocess

        from .sglang_cmd import build_command

        if tik.local_host:
            server_args["host"] = "127.0.0.1"
        cmd, env = build_command(server_args, tik)
        _say("launching SGLang: " + " ".join(cmd))
        return subprocess.Popen(cmd, env=env, stdout=sys.stdout, stderr=sys.stdout)

    B.launch_server = launch_server
    _DONE.add("sglang")


# -- controller side -----------------------------------------------------------------------------
class _Throughput:
    def __init__(self):
        self.t0 = None
        self.last = None
        self.tokens = 0.0


def install_controller(tik: TikConfig, plan: Plan | None, meta: dict | None = None) -> None:
    _STATE["tik"], _STATE["plan"] = tik, plan
    _STATE["meta"] = meta or {}
    tik.select_implementation()  # SGLang servers the controller starts inherit TIK_IMPLEMENTATION
    if tik.local_host:
        _pin_local_host()
    if "controller" in _DONE:
        return
    import areal.trainer.rl_trainer as RT
    from areal.utils.stats_logger import StatsLogger

    tp = _STATE["throughput"] = _Throughput()
    orig_train = RT.PPOTrainer.train

    def train(self, *args, **kwargs):
        tp.t0 = tp.last = time.perf_counter()
        return orig_train(self, *args, **kwargs)

    RT.PPOTrainer.train = train

    orig_commit = StatsLogger.commit

    def commit(self, epoch, step, global_step, data):
        import torch.distributed as dist

        if dist.is_initialized() and dist.get_rank() != 0:
            return orig_commit(self, epoch, step, global_step, data)
        items = [data] if isinstance(data, dict) else list(data)
        if items:
            now = time.perf_counter()
            item = items[0]
            t0 = tp.t0 if tp.t0 is not None else now
            wall = now - (tp.last if tp.last is not None else t0)
            tp.last = now
            toks = float(item.get("ppo_actor/n_valid_tokens", 0.0))
            tp.tokens += toks
            item["tik/throughput/response_tokens"] = toks
            item["tik/throughput/step_wall_s"] = wall
            item["tik/throughput/tokens_per_s"] = toks / wall if wall > 0 else 0.0
            item["tik/throughput/cum_tokens_per_s"] = tp.tokens / (now - t0) if now > t0 else 0.0
            item["tik/recompute_forward"] = float("timeperf/recompute_logp" in item)
            item["tik/enabled"] = float(bool(tik.enable))
            _write_jsonl(self, global_step, now - t0, item)
        return orig_commit(self, epoch, step, global_step, data)

    StatsLogger.commit = commit
    _DONE.add("controller")


def stats_path(stats_logger) -> str:
    tik = _STATE["tik"]
    if tik is not None and tik.stats_jsonl:
        return tik.stats_jsonl
    return os.path.join(stats_logger.get_log_path(stats_logger.config), "tik_stats.jsonl")


def _write_jsonl(stats_logger, global_step: int, elapsed: float, item: dict) -> None:
    path = stats_path(stats_logger)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    new = not os.path.exists(path)
    with open(path, "a") as f:
        if new:
            f.write(json.dumps({"meta": _meta(stats_logger)}) + "\n")
        row = {"step": int(global_step), "elapsed_s": float(elapsed)}
        for k, v in item.items():
            try:
                row[k] = float(v)
            except (TypeError, ValueError):
                continue
        f.write(json.dumps(row) + "\n")


def _meta(stats_logger) -> dict:
    import dataclasses

    tik, plan = _STATE["tik"], _STATE["plan"]
    c = stats_logger.config
    w = getattr(c, "wandb", None)
    return {
        "experiment_name": c.experiment_name, "trial_name": c.trial_name,
        "wandb": {"project": getattr(w, "project", None), "group": getattr(w, "group", None),
                  "name": getattr(w, "name", None), "tags": list(getattr(w, "tags", None) or [])},
        "tik": dataclasses.asdict(tik) if tik is not None else None,
        "plan": dataclasses.asdict(plan) if plan is not None else None,
        **_STATE.get("meta", {}),
    }
