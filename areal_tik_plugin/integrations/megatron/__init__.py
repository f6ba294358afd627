"""megatron-core integration: the policy-update forward/backward on the plugin's unified ops.

* :mod:`.spec` -- the layer / block spec (TE-spec parameter names) and :func:`finalize_model`;
* :mod:`.convert` -- HF <-> Megatron config, model build and exact weight conversion;
* :mod:`.areal` -- installation into AReaL's Megatron engine (mbridge spec getter, log-probs);
* :mod:`.verify` -- ``tik verify --engine megatron``.

Importing this package does not import megatron-core; its modules do.
"""

from __future__ import annotations

_LAZY = {
    "check_config": "spec", "layer_spec": "spec", "block_spec": "spec", "finalize_model": "spec",
    "TikMegatronConfigError": "spec", "FAMILIES": "spec",
    "mcore_config": "convert", "build_model": "convert", "hf_to_mcore": "convert", "mcore_to_hf": "convert",
    "load_hf_into": "convert",
}


def __getattr__(name):
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"{__name__}.{mod}"), name)


__all__ = sorted(_LAZY)
