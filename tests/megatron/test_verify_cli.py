"""``tik verify --engine megatron`` end to end (one layer, CPU): every check bit-identical, exit 0; the
packed forward split into micro-batches (``--max-tokens-per-forward``) and the ``--single`` selection
(shortest and longest sequence) as the GPU run uses them."""

from __future__ import annotations

import json

from tests.megatron import _mg  # noqa: F401  (skips without megatron-core)


def test_tik_verify_engine_megatron(tmp_path, capsys):
    from areal_tik_plugin.verify import main

    out = tmp_path / "rep.json"
    rc = main(["--engine", "megatron", "--model", "tiny-qwen3", "--layers", "1", "--batch", "3",
               "--prompt-len", "3..6", "--response-len", "2..3", "--page-size", "2", "--single", "2",
               "--max-tokens-per-forward", "12", "--out", str(out)])
    rep = json.loads(out.read_text())
    assert rc == 0, capsys.readouterr().out
    assert rep["engine"] == "megatron" and rep["bit_identical"]
    names = [c["check"] for c in rep["checks"]]
    assert names == ["megatron-vs-rollout", "megatron-vs-hf", "megatron-packed-vs-separate", "megatron-train-vs-eval"]
    lens = [p + r for p, r in zip(rep["prompt_lens"], rep["response_lens"])]
    assert lens == [5, 6, 9] and rep["single"] == [0, 2]  # groups of <= 12 tokens: [5, 6], [9]
    assert [c["rows"] for c in rep["checks"]] == [20, 20, 14, 14]
    assert rep["versions"]["megatron-core"] and rep["timings"]["rollout_s"] >= 0
    assert "PASS" in capsys.readouterr().out


def test_spread_picks_shortest_and_longest():
    from areal_tik_plugin.integrations.megatron.verify import spread

    assert spread(2, 64) == [0, 63] and spread(1, 5) == [0] and spread(3, 5) == [0, 2, 4] and spread(9, 2) == [0, 1]
