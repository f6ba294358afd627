"""benchmarks/probes/ncu_probe.py on the CPU: its case grammar, and a clear refusal of bad cases or a missing GPU."""

from __future__ import annotations

import pytest

from tests.helpers.scripts import load_script


def test_parse_cases():
    probe = load_script("ncu_probe")
    assert probe.parse_cases("gemm:qwen3-4b:down:64,decode:1:8192,prefill:4:8192") == [
        ("gemm", "qwen3-4b:down", 64), ("decode", 1, 8192), ("prefill", 4, 8192)]
    for bad in ("", "gemm:qwen3-4b:down", "gemm:qwen3-4b:nope:64", "gemm:qwen3-4b:o:0", "decode:0:128",
                "decode:1:x", "decode:256:1000000", "attn:1:2", "prefill:1", "prefill:0:1024", "prefill:16:16384"):
        with pytest.raises(ValueError, match="--cases"):
            probe.parse_cases(bad)


def test_cli_refuses_bad_cases_and_needs_cuda(capsys):
    probe = load_script("ncu_probe")
    with pytest.raises(SystemExit) as e:
        probe.main(["--cases", "gemm:qwen3-4b:o:-1"])
    assert e.value.code == 2 and "gemm:<shape>:<M>" in capsys.readouterr().err
    import torch

    if not torch.cuda.is_available():
        assert probe.main(["--cases", "decode:1:128"]) == 2
        assert "needs a CUDA device" in capsys.readouterr().err
