"""The one shape table (areal_tik_plugin.models): every derived view gives the real models' numbers
(their config.json), and unknown names are refused by name."""

import pytest

from areal_tik_plugin import models


def test_weight_shapes_are_the_real_models_dense_weights():
    assert models.weight_shapes("qwen2.5-1.5b") == {"qkv": (2048, 1536, True), "o": (1536, 1536, False),
                                                   "gate_up": (17920, 1536, False), "down": (1536, 8960, False),
                                                   "lm_head": (151936, 1536, False)}
    assert models.weight_shapes("qwen3-4b") == {"qkv": (6144, 2560, False), "o": (2560, 4096, False),
                                               "gate_up": (19456, 2560, False), "down": (2560, 9728, False),
                                               "lm_head": (151936, 2560, False)}
    assert models.weight_shapes("qwen3-30b-a3b") == {"qkv": (5120, 2048, False), "o": (2048, 4096, False),
                                                    "router": (128, 2048, False), "lm_head": (151936, 2048, False)}
    assert models.weight_shapes("qwen3-8b")["down"] == (4096, 12288, False)


def test_dims_moe_width_is_the_expert_width():
    d = models.dims("qwen3-30b-a3b")
    assert (d.hidden, d.hq, d.hkv, d.d, d.inter, d.experts, d.top_k) == (2048, 32, 4, 128, 768, 128, 8)
    q2 = models.dims("tiny-qwen2")
    assert q2.d == 64 // 4 and q2.qkv_bias


def test_hf_config_and_unknown_names():
    cfg = models.hf_config("tiny-qwen3-moe", layers=1)
    assert cfg.model_type == "qwen3_moe" and cfg.num_hidden_layers == 1 and cfg.num_experts == 8
    for fn in (models.dims, models.weight_shapes, models.hf_config, models.checkpoint_kwargs):
        with pytest.raises(ValueError, match="expected one of"):
            fn("qwen9-1t")
    with pytest.raises(ValueError, match="Qwen3"):
        models.checkpoint_kwargs("qwen2.5-1.5b")
