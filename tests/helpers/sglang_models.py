"""Tiny random Qwen3 / Qwen3-MoE checkpoints for the SGLang proof tests (tests/integrations/test_sglang_*.py):
:func:`areal_tik_plugin.models.build_model` with the SGLang proofs' shape
(``tiny.SGLANG_TINY``: word-level tokenizer, head_dim 32, odd vocab / intermediate sizes, bf16).
"""

from __future__ import annotations

from areal_tik_plugin.models import SGLANG_TINY, WORDS  # noqa: F401
from areal_tik_plugin.models import build_model as _build_model


def build_model(path: str, kind: str = "qwen3", **kw) -> str:
    """Write a random ``kind`` ("qwen3" or "qwen3_moe") checkpoint + word tokenizer to ``path``."""
    return _build_model(path, kind, **{**SGLANG_TINY, **kw})


if __name__ == "__main__":
    import sys

    build_model(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "qwen3")
