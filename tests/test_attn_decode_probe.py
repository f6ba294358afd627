"""scripts/attn_decode_probe.py on the CPU: its variants are free attention knobs of the implementation, and
bad --cases / --rounds are refused with what was expected."""

from __future__ import annotations

import pytest

from areal_tik_plugin.loader import get_implementation

from ._scripts import load_script


def test_variants_are_free_knobs():
    probe = load_script("attn_decode_probe")
    att = get_implementation().module("attention")
    cfg = att._cfg()
    free = att.KNOBS["free"]
    names = {"dec_warps": "DECODE_WARPS", "dec_stages": "DECODE_STAGES", "merge_in_last": "DECODE_MERGE_IN_LAST"}
    assert probe.VARIANTS["default"] == {}
    for name, over in probe.VARIANTS.items():
        assert over.keys() <= names.keys(), name
        for k, v in over.items():
            assert k in cfg and v in free[names[k]], (name, k, v)


def test_bad_arguments(capsys):
    probe = load_script("attn_decode_probe")
    assert probe.parse_cases("1x8192,64x1024") == [(1, 8192), (64, 1024)]
    for bad in ("", "1x", "x8", "0x128", "1x0", "512x1", "64x65536", "1y8"):
        with pytest.raises(ValueError, match="--cases"):
            probe.parse_cases(bad)
    for argv in (["--out", "/tmp/x", "--cases", "2"], ["--out", "/tmp/x", "--rounds", "0"]):
        with pytest.raises(SystemExit) as e:
            probe.main(argv)
        assert e.value.code == 2
    assert "--cases" in capsys.readouterr().err
