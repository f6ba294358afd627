"""Whole-model Constraint (1) with split-K in effect (CPU, Triton interpreter).

Tiny weights are too small for the production split rule, so the rule is replaced by one that cuts
every weight with K > 128 into 128-column chunks (two GEMM_BLOCK_K pieces each, so a chunk's own
chain rounds); the checkpoint is a tiny Qwen3 with intermediate size 320 (down_proj: 3 chunks).
Decode (M = batch, the workspace + ordered-reduce path) and the packed full-sequence forward
(M > 64, the register path) must still agree bit for bit. At these sizes a chunk's fp32 rounding
rarely survives the bf16 output, so this is the end-to-end wiring check (chunk bounds, masks, both
paths inside prefill / paged decode / packed training forward); the rounding-order sensitivity is
tested at the op level (tests/ops/test_ops_linear.py::test_split_differs_from_one_chain_and_is_accurate)."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from areal_tik_plugin import verify as V  # noqa: E402
from areal_tik_plugin.runtime.loader import get_implementation  # noqa: E402


def test_tiny_qwen3_bit_identical_with_split_weights(monkeypatch, tmp_path):
    from areal_tik_plugin.models import build_model

    path = build_model(str(tmp_path / "m"), "qwen3", intermediate_size=320, dtype="bfloat16")
    gemm = get_implementation().module("gemm")
    monkeypatch.setattr(gemm, "split_chunk", lambda K: 128 if K > 128 else -(-K // 64) * 64)
    gemm._config_for.cache_clear()
    try:
        rep = V.run_verify(path, batch=4, prompt_len="18..24", response_len="5..7", stock=False)
    finally:
        gemm._config_for.cache_clear()
    assert rep["plugin_bit_identical"], V.format_table(rep)
    main = [c for c in rep["checks"] if c["check"].startswith("full-seq")][0]
    assert main["rows"] > 64  # the packed forward took the large-M (register) path
