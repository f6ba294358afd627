"""Integrations: transformers (FSDP policy update), SGLang (rollout), AReaL, Megatron."""
