"""SGLang rollout integration: the ``tik`` attention backend, layer-op routing, the sampler's log-prob.

``plugin`` registers everything (SGLang's ``sglang.srt.plugins`` entry point, or ``launch`` for SGLang
without plugins); ``backend`` is the attention backend; ``layers`` routes RMSNorm / RoPE / SiluAndMul /
TopK / linear / lm_head to the plugin's ops; ``check`` starts SGLang with the plugin and reports which
ops ran through ours (``tik sglang-check``).
"""
