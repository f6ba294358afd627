"""benchmarks/probes/gluon_prefill_probe.py on the CPU: knob sets parse, each gets its own name, a knob set
round-trips through the text its guard hands a child process, and the script refuses bad options with exit
2 and a message (the GPU runs are the probe's evidence; nothing here times or checks bits)."""

import os
import subprocess
import sys

import pytest

from tests.helpers.scripts import load_script

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def probe():
    m = load_script("gluon_prefill_probe")
    m.IMPL = "tik_v6"
    return m


def test_tik_v6_knob_sets_have_distinct_names_and_round_trip(probe):
    g = probe._mods()[1]
    text = "persist=2,pp=1;persist=1;persist=0,pp=0;k_stages=2;ws=0,order=0"
    sets = probe.parse_configs(text, g)
    names = [probe._name(kv, g) for kv in sets]
    assert names == ["ws-k3r-p2pp1", "ws-k3r-p1pp1", "ws-k3r-p0pp0", "ws-k2r-p2pp1", "w4k3v2o0r"]
    for kv in sets:
        assert probe.parse_configs(probe._config_text(kv), g) == [kv]
    assert probe.parse_configs("", g) == [{}] and probe._config_text({}) == ""
    with pytest.raises(ValueError, match="two knob sets name the same configuration"):
        probe.parse_configs("persist=2;pp=1", g)


def test_tik_v6_refuses_a_ws_set_without_fa3_order(probe):
    with pytest.raises(ValueError, match="ws=1 runs FA3's order"):
        probe.parse_configs("order=0", probe._mods()[1])


@pytest.mark.parametrize("args,msg", [(["--guard-s", "-1"], "--guard-s: expected >= 0"),
                                      (["--impl", "tik_v1"], "attention_gluon.py not found"),
                                      (["--configs", "pp=3"], "pp=3; expected one of")])
def test_bad_options_exit_2_with_a_message(args, msg):
    r = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "probes", "gluon_prefill_probe.py"),
                        "--impl", "tik_v6", *args], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 2 and msg in r.stderr, (r.stdout, r.stderr)
