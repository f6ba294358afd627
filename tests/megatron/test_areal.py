"""AReaL with ``actor.backend=megatron:...``: the plan accepts TP 1 and refuses what breaks the bits;
mbridge (PyPI 0.15.1) builds the model through the patched spec getter and loads / exports HF
checkpoints; AReaL's Megatron engine module runs its log-prob code on the plugin's op.

What does not run on CPU (and is not faked here): ``MegatronEngine.initialize()`` -- it calls
``current_platform.set_device(LOCAL_RANK)`` and builds the model through ``mbridge.Bridge.get_model``,
which moves every chunk to ``torch.cuda.current_device()``. The model creation inside it is the
patched ``LLMBridge._model_provider``, which the mbridge test below calls directly; the training
schedules run in test_spec.py / test_parallel.py.
"""

from __future__ import annotations

import sys
import types
from types import SimpleNamespace as NS

import pytest

from tests.megatron import _mg  # noqa: F401  (skips without megatron-core)
from tests.megatron._mg import bits_equal

pytest.importorskip("areal", reason="AReaL is not installed (.ci/install_areal.sh VENV)")

import torch  # noqa: E402

from areal_tik_plugin.integrations.areal import config as C  # noqa: E402


def megatron_cfg(backend="megatron:d2p2t1", **mg):
    from areal.api.cli_args import MegatronEngineConfig

    m = MegatronEngineConfig()
    for k, v in mg.items():
        setattr(m, k, v)
    spec = [NS(cmd="python3 -m areal.infra.rpc.rpc_server", env_vars={})]
    a = NS(backend=backend, path="Qwen/Qwen3-4B", temperature=1.0, dtype="bfloat16", recompute_logprob=True,
           use_decoupled_loss=True, prox_logp_method="recompute", rejection_sampling=None, scheduling_spec=spec,
           megatron=m, enable_tree_training=False)
    return NS(actor=a, gconfig=NS(temperature=1.0, greedy=False, top_p=1.0, top_k=int(1e8), frequency_penalty=0.0),
              rollout=NS(backend="sglang:d4p1t1", max_head_offpolicyness=0, scheduling_spec=spec),
              sglang=NS(kv_cache_dtype="auto", dtype="bfloat16"), ref=None, critic=None, teacher=None)


@pytest.mark.parametrize("backend", ["megatron:d4p1t1", "megatron:d2p2t1", "megatron:d2p1t1e2"])
def test_plan_accepts_megatron_tp1(backend):
    cfg, tik = megatron_cfg(backend), C.TikConfig()
    p = C.plan(cfg, tik, model_type="qwen3_moe")
    assert p.mode == "reuse" and not p.recompute_forward
    C.apply(cfg, p, tik)
    env = C.TikConfig.from_env(cfg.actor.scheduling_spec[0].env_vars["AREAL_TIK_CONFIG"])
    assert env.actor_engine == "megatron"


@pytest.mark.parametrize("backend,mg,extra,msg", [
    ("megatron:d2p1t2", {}, {}, "tensor parallel 2"),
    ("megatron:d2p1t1c2", {}, {}, "context parallel 2"),
    ("megatron:(attn:d2p1t1c1|ffn:d1p1t1e2)", {}, {}, "hybrid attention/FFN"),
    ("megatron:d2p1t1", {"fp8_config": NS(mode="e4m3")}, {}, "fp8_config"),
    ("megatron:d2p1t1", {"moe_permute_fusion": True}, {}, "moe_permute_fusion"),
    ("megatron:d2p1t1", {"bridge_type": "megatron-bridge"}, {}, "bridge_type='megatron-bridge'"),
    ("megatron:d2p1t1", {}, {"enable_tree_training": True}, "enable_tree_training"),
])
def test_plan_refuses_unsupported_megatron_settings(backend, mg, extra, msg):
    cfg = megatron_cfg(backend, **mg)
    for k, v in extra.items():
        setattr(cfg.actor, k, v)
    with pytest.raises(C.TikConfigError, match=msg):
        C.plan(cfg, C.TikConfig(), model_type="qwen3")


def test_mbridge_builds_the_plugin_spec_and_round_trips_hf_checkpoints(tmp_path):
    """PyPI mbridge 0.15.1 reads ``hf_config.rope_theta`` (gone in transformers 5: AReaL pins a newer
    mbridge that reads ``rope_parameters``) and initializes on CUDA unless told otherwise; the two
    attributes set below are those CPU/transformers-5 shims, nothing else is changed."""
    mbridge = pytest.importorskip("mbridge", reason="mbridge is not installed (.ci/install_megatron.sh VENV)")

    from areal_tik_plugin import verify as V
    from areal_tik_plugin.integrations.megatron import areal as MA
    from areal_tik_plugin.integrations.megatron import convert as Cv
    from areal_tik_plugin.integrations.megatron.spec import is_tik_model
    from areal_tik_plugin.integrations.megatron.verify import megatron_packed_logits

    _mg.setup()
    MA.patch_mbridge()
    hf = V.build_model("tiny-qwen3-moe", seed=3)
    hf.save_pretrained(str(tmp_path))
    bridge = mbridge.AutoBridge.from_pretrained(str(tmp_path))
    bridge.dtype = torch.bfloat16
    bridge.hf_config.rope_theta = Cv._rope_theta(bridge.hf_config)
    bridge.config.use_cpu_initialization = True
    model = bridge._model_provider([])(pre_process=True, post_process=True)
    assert is_tik_model(model)
    assert type(model.decoder.layers[0].self_attention).__name__ == "TikSelfAttention"
    bridge.load_weights([model], str(tmp_path))
    ref = Cv.build_model(hf.config)
    Cv.load_hf_into(ref, hf, hf.config)
    xs = _mg.seqs(hf.config.vocab_size, [6, 11])
    with torch.no_grad():
        for a, b in zip(megatron_packed_logits(model.eval(), xs, "cpu"), megatron_packed_logits(ref.eval(), xs, "cpu")):
            assert bits_equal(a, b)
    exported = dict(bridge.export_weights([model]))
    for k, v in hf.state_dict().items():
        if k.endswith("experts.gate_up_proj"):
            for e in range(v.shape[0]):
                p = k[: -len("gate_up_proj")] + f"{e}."
                assert bits_equal(torch.cat([exported[p + "gate_proj.weight"], exported[p + "up_proj.weight"]]), v[e])
        elif k.endswith("experts.down_proj"):
            for e in range(v.shape[0]):
                assert bits_equal(exported[k[: -len("down_proj")] + f"{e}.down_proj.weight"], v[e])
        else:
            assert bits_equal(exported[k], v), k


@pytest.fixture(scope="module")
def megatron_engine():
    pytest.importorskip("mbridge", reason="mbridge is not installed (.ci/install_megatron.sh VENV)")
    """``areal.engine.megatron_engine`` imported for real; only ``megatron.bridge`` (NVIDIA's
    Megatron-Bridge, not installable on CPU / Python 3.11, unused with bridge_type=mbridge) is an
    import-only stub whose classes raise."""
    try:
        import megatron.bridge  # noqa: F401
    except ImportError:
        class _Unavailable:
            def __init__(self, *a, **k):
                raise RuntimeError("megatron.bridge is a test import stub")

            @classmethod
            def from_hf_pretrained(cls, *a, **k):
                raise RuntimeError("megatron.bridge is a test import stub")

        for name, attrs in (("megatron.bridge", {"AutoBridge": _Unavailable}), ("megatron.bridge.peft", {}),
                            ("megatron.bridge.peft.lora", {"LoRA": _Unavailable})):
            mod = types.ModuleType(name)
            mod.__dict__.update(attrs)
            sys.modules.setdefault(name, mod)
    import areal.engine.megatron_engine as ME

    return ME


def test_install_routes_megatron_logprobs_through_the_plugin_op(megatron_engine):
    from areal_tik_plugin import ops
    from areal_tik_plugin.integrations import logprobs as LP
    from areal_tik_plugin.integrations.areal import hooks as H

    pytest.importorskip("mbridge", reason="mbridge is not installed (.ci/install_megatron.sh VENV)")
    ME = megatron_engine
    stock = ME.gather_logprobs
    H.install_worker(C.TikConfig(actor_engine="megatron"))
    assert ME.gather_logprobs is LP.gather_logprobs and ME.gather_logprobs_entropy is LP.gather_logprobs_entropy
    assert stock is not LP.gather_logprobs
    assert hasattr(ME.MegatronPPOActor.compute_advantages, "__wrapped__")  # the mismatch monitor
    from mbridge.core.llm_bridge import LLMBridge

    assert hasattr(LLMBridge._get_transformer_layer_spec, "__wrapped__")
    # AReaL's own forward-result code (labels = roll(input_ids), temperature from the config)
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(1, 13, 97, generator=g).to(torch.bfloat16)
    ids = torch.randint(0, 97, (1, 13), generator=g)
    engine = NS(config=NS(is_critic=False, temperature=0.7), enable_tree_training=False)
    got = ME.MegatronEngine._compute_forward_result(engine, logits, {"input_ids": ids})
    labels = torch.roll(ids, -1, -1).reshape(-1)
    want = ops.token_logprobs(logits.reshape(-1, 97), labels, temperature=0.7)
    assert bits_equal(got.reshape(-1), want)
    # the training loss path: log-probs and entropy handed to AReaL's loss function, with gradients
    seen = {}

    def loss_fn(logprobs, entropy, inputs, **kw):
        seen["lp"], seen["ent"] = logprobs, entropy
        return -logprobs.sum()

    leaf = logits.float().requires_grad_(True)
    loss = ME.MegatronEngine._compute_logprobs_and_loss(engine, leaf.to(torch.bfloat16), {"input_ids": ids}, loss_fn,
                                                        lambda _: torch.tensor(1.0), torch.tensor(1.0))
    loss.backward()
    lp, ent = ops.token_logprobs(logits.reshape(-1, 97), labels, temperature=0.7, return_entropy=True)
    assert bits_equal(seen["lp"].reshape(-1), lp) and bits_equal(seen["ent"].reshape(-1), ent)
    assert leaf.grad is not None and bool(torch.isfinite(leaf.grad).all())
