"""``tik verify --engine megatron`` end to end (one layer, CPU): every check bit-identical, exit 0."""

from __future__ import annotations

import json

from tests.megatron import _mg  # noqa: F401  (skips without megatron-core)


def test_tik_verify_engine_megatron(tmp_path, capsys):
    from areal_tik_plugin.verify import main

    out = tmp_path / "rep.json"
    rc = main(["--engine", "megatron", "--model", "tiny-qwen3", "--layers", "1", "--batch", "2",
               "--prompt-len", "3..6", "--response-len", "2..3", "--page-size", "2", "--out", str(out)])
    rep = json.loads(out.read_text())
    assert rc == 0, capsys.readouterr().out
    assert rep["engine"] == "megatron" and rep["bit_identical"]
    names = [c["check"] for c in rep["checks"]]
    assert names == ["megatron-vs-rollout", "megatron-vs-hf", "megatron-packed-vs-separate", "megatron-train-vs-eval"]
    assert all(c["rows"] == 3 + 2 + 6 + 3 for c in rep["checks"][:1])
    assert "PASS" in capsys.readouterr().out
