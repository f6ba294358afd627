"""GPU contract suite + benchmarks: ``python -m areal_tik_plugin.contract --out DIR``.

Each op has a module here with ``run_checks(rec, quick)`` (bitwise contract + accuracy) and
``run_bench(rec, quick)`` (latency vs baselines, both timing methods). The runner writes one evidence
JSON bound to the implementation's source hash and the environment (see :mod:`areal_tik_plugin.evidence`).
"""

OP_MODULES = {
    "attention": "areal_tik_plugin.contract.attention",
    "rmsnorm": "areal_tik_plugin.contract.norm",
    "rope": "areal_tik_plugin.contract.rope",
    "swiglu": "areal_tik_plugin.contract.swiglu",
    "kv_write": "areal_tik_plugin.contract.kv_write",
    "logprob": "areal_tik_plugin.contract.logprob",
    "gemm": "areal_tik_plugin.contract.gemm",
    "moe": "areal_tik_plugin.contract.moe",
}
