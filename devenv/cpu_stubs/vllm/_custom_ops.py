"""Import-only stand-in: SGLang's rotary embedding imports this on an unknown platform; never called
when the plugin routes RoPE to areal_tik_plugin.ops.apply_rope."""


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)

    def _missing(*a, **k):
        raise RuntimeError(f"vllm._custom_ops.{name}: stub, not available on this machine")

    return _missing
