"""The tik section, refusals, recompute plan and the mismatch monitor (pure: no AReaL, no SGLang)."""

import copy
from types import SimpleNamespace as NS

import pytest
import torch

from areal_tik_plugin.integrations.areal import config as C
from areal_tik_plugin.integrations.areal.monitor import MismatchMonitor, TikMismatchError, compare, plant_one_ulp


def areal_cfg(s=0, **actor):
    a = dict(backend="fsdp:d4p1t1", path="Qwen/Qwen3-4B", temperature=1.0, dtype="bfloat16",
             recompute_logprob=True, use_decoupled_loss=True, prox_logp_method="recompute",
             rejection_sampling=NS(metric="ratio", upper=5.0), scheduling_spec=[
                 NS(cmd="python3 -m areal.infra.rpc.rpc_server", env_vars={})])
    a.update(actor)
    return NS(actor=NS(**a), gconfig=NS(temperature=1.0, greedy=False, top_p=1.0, top_k=int(1e8),
                                        frequency_penalty=0.0),
              rollout=NS(backend="sglang:d4p1t1", max_head_offpolicyness=s, scheduling_spec=a["scheduling_spec"]),
              sglang=NS(kv_cache_dtype="auto", dtype="bfloat16"), ref=None, critic=None, teacher=None)


def test_overrides_env_roundtrip():
    tik = C.TikConfig.from_overrides(["tik.enable=false", "+tik.monitor_every=3", "tik.verified_rollout_tp=[1,2]"],
                                     base={"prox_mode": "loglinear"})
    assert (tik.enable, tik.monitor_every, tik.verified_rollout_tp, tik.prox_mode) == (False, 3, [1, 2], "loglinear")
    env = tik.to_env()
    assert "," not in env and "=" not in env  # AReaL splits scheduling env vars on both
    assert C.TikConfig.from_env(env) == tik
    assert C.split_tik_overrides(["a=1", "tik.x=2", "+tik.y=3"]) == (["tik.x=2", "+tik.y=3"], ["a=1"])
    with pytest.raises(C.TikConfigError, match="unknown tik option"):
        C.TikConfig.from_overrides(["tik.nope=1"])
    with pytest.raises(C.TikConfigError, match="prox_mode"):
        C.TikConfig(prox_mode="maybe")
    assert C.check_section({"monitor": {"every": 2}}) == {"monitor_every": 2}


def test_plan_staleness0_reuses_rollout_logprobs():
    cfg, tik = areal_cfg(0), C.TikConfig()
    p = C.plan(cfg, tik, model_type="qwen3")
    assert p.mode == "reuse" and not p.recompute_forward
    assert p.changes == {"actor.recompute_logprob": (True, False), "actor.use_decoupled_loss": (True, False)}
    C.apply(cfg, p, tik)
    assert not cfg.actor.recompute_logprob and not cfg.actor.use_decoupled_loss
    spec = cfg.actor.scheduling_spec[0]
    assert spec.cmd == "python3 -m areal_tik_plugin.integrations.areal.worker"
    assert C.TikConfig.from_env(spec.env_vars["AREAL_TIK_CONFIG"]) == tik
    assert "recompute forward skipped" in p.describe()


def test_plan_staleness_positive():
    p = C.plan(areal_cfg(2), C.TikConfig(), model_type="qwen2")
    assert p.mode == "recompute-prox" and p.recompute_forward  # proximal term still needs the forward
    p = C.plan(areal_cfg(4), C.TikConfig(prox_mode="loglinear"), model_type="qwen2")
    assert p.mode == "loglinear" and not p.recompute_forward
    assert p.changes["actor.prox_logp_method"] == ("recompute", "loglinear")
    assert "behaviour importance weight applied" in p.describe()
    with pytest.raises(C.TikConfigError, match="drops the behaviour importance weight"):
        C.plan(areal_cfg(4, rejection_sampling=None), C.TikConfig(prox_mode="loglinear"), model_type="qwen2")
    p = C.plan(areal_cfg(2), C.TikConfig(enable=False), model_type="qwen2")
    assert p.mode == "baseline" and not p.changes and p.recompute_forward


@pytest.mark.parametrize("mutate,msg", [
    (lambda c: setattr(c.actor, "temperature", 0.7), "temperature differs"),
    (lambda c: setattr(c.gconfig, "greedy", True) or setattr(c.actor, "temperature", 0.6), "temperature differs"),
    (lambda c: setattr(c.gconfig, "top_p", 0.9), "renormalized"),
    (lambda c: setattr(c.gconfig, "top_k", 50), "renormalized"),
    (lambda c: setattr(c.gconfig, "frequency_penalty", 0.5), "penalized"),
    (lambda c: setattr(c.sglang, "kv_cache_dtype", "fp8_e4m3"), "quantized KV cache"),
    (lambda c: setattr(c.sglang, "dtype", "float16"), "sglang.dtype"),
    (lambda c: setattr(c.rollout, "backend", "sglang:d2p1t2"), "rollout TP 2"),
    (lambda c: setattr(c.rollout, "backend", "vllm:d4p1t1"), "SGLang only"),
    (lambda c: setattr(c.actor, "backend", "megatron:d4p1t2"), "tensor parallel 2"),
    (lambda c: setattr(c.actor, "backend", "archon:d4p1t1"), "FSDP and Megatron engines only"),
])
def test_refusals(mutate, msg):
    cfg = areal_cfg(0)
    mutate(cfg)
    with pytest.raises(C.TikConfigError, match=msg):
        C.plan(cfg, C.TikConfig(), model_type="qwen3")


def test_refuses_unpatched_family_and_unknown_model():
    with pytest.raises(C.TikConfigError, match="'gemma3' is not patched"):
        C.plan(areal_cfg(0), C.TikConfig(), model_type="gemma3")
    with pytest.raises(C.TikConfigError, match="cannot tell the model family"):
        C.plan(areal_cfg(0, path="/nonexistent/model"), C.TikConfig(), model_type=None)
    # a verified TP can be declared
    cfg = areal_cfg(0)
    cfg.rollout.backend = "sglang:d2p1t2"
    assert C.plan(cfg, C.TikConfig(verified_rollout_tp=[1, 2]), model_type="qwen3").mode == "reuse"


def test_worker_cmd():
    assert C.worker_cmd("python -m areal.infra.rpc.rpc_server") == "python -m areal_tik_plugin.integrations.areal.worker"
    with pytest.raises(C.TikConfigError, match="not AReaL's default worker"):
        C.worker_cmd("bash my_worker.sh")


def _traj(n_prompt=5, n_resp=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    L = n_prompt + n_resp
    lp = torch.zeros(1, L)
    lp[0, n_prompt:] = -torch.rand(n_resp, generator=g) * 5
    mask = torch.zeros(1, L, dtype=torch.int32)
    mask[0, n_prompt:] = 1
    # the training path: out[t] = logp(token t+1); pad one trailing value like AReaL's output
    out = torch.cat([lp[0, 1:], torch.zeros(1)])
    return {"logprobs": lp, "loss_mask": mask}, out


def test_monitor_exact_then_planted_one_ulp_fallback():
    mon = MismatchMonitor(every=1, samples=2, on_mismatch="fallback")
    trajs, outs = zip(*[_traj(seed=i) for i in range(3)])
    st = mon.check(0, list(trajs), list(outs))
    assert st["mismatched_tokens"] == 0 and st["max_abs_diff"] == 0 and st["checked_tokens"] == 21 and not mon.fallback
    planted = copy.deepcopy(trajs[1])
    k = plant_one_ulp(planted)
    assert k == 5 and planted["logprobs"][0, 5] != trajs[1]["logprobs"][0, 5]
    d = abs(float(planted["logprobs"][0, 5]) - float(trajs[1]["logprobs"][0, 5]))
    assert 0 < d <= 4.8e-7  # one fp32 ulp at |x| < 8
    st = mon.check(1, [trajs[0], planted], [outs[0], outs[1]])
    assert st["mismatched_tokens"] == 1 and st["max_abs_diff"] == pytest.approx(d) and mon.fallback
    assert mon.events and mon.events[0]["step"] == 1
    with pytest.raises(TikMismatchError):
        MismatchMonitor(1, 2, on_mismatch="raise").check(0, [planted], [outs[1]])
    warn = MismatchMonitor(1, 2, on_mismatch="warn")
    warn.check(0, [planted], [outs[1]])
    assert not warn.fallback


def test_compare_is_bitwise():
    a = torch.tensor([-1.0, -2.0, 0.0])
    b = torch.tensor([-1.0, -2.0, -0.0])  # equal as numbers, different bits
    assert compare(a, b)["mismatched_tokens"] == 1
    assert MismatchMonitor(5, 3).pick(10) == [0, 4, 9] and MismatchMonitor(5, 1).due(10)
