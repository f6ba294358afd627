"""The plugin inside AReaL's Megatron engine (``actor.backend=megatron:...``).

Plan side (:func:`check_actor`, pure: imports neither AReaL nor megatron-core): which Megatron
actor settings keep the bits. Allowed: data parallel (``d``), pipeline parallel (``p``, virtual
stages included), expert parallel (``e``). Refused by name: tensor parallel > 1 (``t``), context
parallel > 1 (``c``), hybrid attention/FFN allocations, FP8 (``actor.megatron.fp8_config``),
TE-only fusions (``moe_permute_fusion``, ``moe_enable_deepep``, ``moe_shared_expert_overlap``),
tree training, and bridges other than mbridge (the spec is installed through mbridge).

Worker side (:func:`install`, in every AReaL process that builds the Megatron engine):

* ``mbridge.core.llm_bridge.LLMBridge._get_transformer_layer_spec`` returns the plugin's block spec
  (:func:`~areal_tik_plugin.integrations.megatron.spec.block_spec`) for the bridge's model family;
* ``LLMBridge._model_provider`` finalizes every model chunk it creates (RoPE from the HF config,
  ``output_layer`` on ``ops.linear``) and refuses a padded vocabulary;
* ``gather_logprobs`` / ``gather_logprobs_entropy`` bound by name in ``areal.engine.megatron_engine``
  (and wherever else AReaL imported them) become the plugin's (``ops.token_logprobs``);
* ``MegatronPPOActor.compute_advantages`` runs the mismatch monitor first (the FSDP actor's hook).
"""

from __future__ import annotations

import re

_TE_ONLY = ("moe_permute_fusion", "moe_enable_deepep", "moe_shared_expert_overlap")


def backend_dims(spec: str) -> dict[str, list[int]]:
    """All ``<letter><n>`` groups of a backend string, per letter (``megatron:d2p2t1e2`` ->
    ``{"d": [2], "p": [2], "t": [1], "e": [2]}``); hybrid ``(attn:...|ffn:...)`` lists both."""
    body = (spec or "").split(":", 1)[1] if ":" in (spec or "") else (spec or "")
    out: dict[str, list[int]] = {}
    for k, v in re.findall(r"([a-z])(\d+)", body):
        out.setdefault(k, []).append(int(v))
    return out


def check_actor(cfg) -> list[str]:
    """Reasons (strings) why this Megatron actor cannot keep the bits; empty when it can."""
    a = cfg.actor
    spec = getattr(a, "backend", "") or ""
    errs = []
    dims = backend_dims(spec)
    if "(" in spec or "|" in spec:
        errs.append(f"actor.backend {spec!r}: hybrid attention/FFN allocations are not supported by the plugin's "
                    f"Megatron spec; use megatron:d<N>p<N>t1[e<N>]")
    if max(dims.get("t", [1])) > 1:
        errs.append(f"actor.backend {spec!r}: tensor parallel {max(dims['t'])} > 1 is not supported by the "
                    f"plugin's Megatron spec (row splits change the GEMM reduction); use t1")
    if max(dims.get("c", [1])) > 1:
        errs.append(f"actor.backend {spec!r}: context parallel {max(dims['c'])} > 1 is not supported; use c1")
    mg = getattr(a, "megatron", None)
    if mg is not None:
        if getattr(mg, "fp8_config", None) is not None:
            errs.append("actor.megatron.fp8_config is set: FP8 training changes the logits; not supported")
        for name in _TE_ONLY:
            if getattr(mg, name, False):
                errs.append(f"actor.megatron.{name}=True: a TransformerEngine-only fusion; the plugin's MoE block "
                            f"does not permute or overlap (set it False)")
        bt = getattr(mg, "bridge_type", "mbridge")
        if bt != "mbridge":
            errs.append(f"actor.megatron.bridge_type={bt!r}: the plugin installs its spec through mbridge; use "
                        f"bridge_type=mbridge")
    if getattr(a, "enable_tree_training", False):
        errs.append("actor.enable_tree_training=True: tree-packed log-probs are not routed through the plugin")
    return errs


# ------------------------------------------------------------------------------------------------
# worker side
# ------------------------------------------------------------------------------------------------
_DONE: set[str] = set()


def patch_mbridge() -> None:
    """Route mbridge's model creation through the plugin's spec (idempotent)."""
    if "mbridge" in _DONE:
        return
    from mbridge.core.llm_bridge import LLMBridge

    from .spec import TikMegatronConfigError, block_spec, finalize_model

    orig_spec, orig_provider = LLMBridge._get_transformer_layer_spec, LLMBridge._model_provider

    def _get_transformer_layer_spec(self, vp_stage=None):
        self.has_vp_stage = True  # read by mbridge's provider: our block spec takes vp_stage
        return block_spec(self.config, self.hf_config.model_type, vp_stage)

    def _model_provider(self, post_model_creation_callbacks):
        def finalize(model, **_kw):
            if self.padded_vocab_size != self.vocab_size:
                raise TikMegatronConfigError(
                    f"make_vocab_size_divisible_by={self.make_vocab_size_divisible_by}: a padded vocabulary "
                    f"({self.padded_vocab_size} vs {self.vocab_size}) adds logit columns SGLang does not have")
            finalize_model(model, self.hf_config)

        return orig_provider(self, [finalize, *list(post_model_creation_callbacks or [])])

    _get_transformer_layer_spec.__wrapped__ = orig_spec
    _model_provider.__wrapped__ = orig_provider
    LLMBridge._get_transformer_layer_spec = _get_transformer_layer_spec
    LLMBridge._model_provider = _model_provider
    _DONE.add("mbridge")


def patch_engine_monitor_only(monitor_step) -> None:
    """``MegatronPPOActor.compute_advantages`` runs ``monitor_step(engine, data)`` first (idempotent)."""
    if "monitor" in _DONE:
        return
    import areal.engine.megatron_engine as ME

    orig = ME.MegatronPPOActor.compute_advantages

    def compute_advantages(self, data, *args, **kwargs):
        monitor_step(self, data)
        return orig(self, data, *args, **kwargs)

    compute_advantages.__wrapped__ = orig
    ME.MegatronPPOActor.compute_advantages = compute_advantages
    _DONE.add("monitor")


def patch_engine(monitor_step, rebind) -> int:
    """AReaL's Megatron engine: log-prob helpers -> the plugin's; the actor's monitor hook.
    ``rebind(orig, new)`` rebinds every module-level name bound to ``orig`` under ``areal``
    (:func:`areal_tik_plugin.integrations.areal.hooks.replace_everywhere`). Returns how many name
    bindings were replaced."""
    if "engine" in _DONE:
        return 0
    import areal.engine.megatron_engine as ME

    from areal_tik_plugin.integrations import logprobs as LP

    n = rebind(ME.gather_logprobs, LP.gather_logprobs)
    n += rebind(ME.gather_logprobs_entropy, LP.gather_logprobs_entropy)
    ME.gather_logprobs, ME.gather_logprobs_entropy = LP.gather_logprobs, LP.gather_logprobs_entropy
    patch_engine_monitor_only(monitor_step)
    _DONE.add("engine")
    return n


def install(tik, monitor_step, rebind) -> str:
    """Everything above, in this process; returns a one-line summary."""
    patch_mbridge()
    n = patch_engine(monitor_step, rebind)
    return (f"Megatron engine: mbridge spec getter -> the plugin's block spec, model chunks finalized; "
            f"gather_logprobs/gather_logprobs_entropy replaced ({n} bindings); mismatch monitor on "
            f"MegatronPPOActor")


__all__ = ["backend_dims", "check_actor", "patch_mbridge", "patch_engine", "patch_engine_monitor_only", "install"]
