"""benchmarks/probes/wgmma_overlap_probe.py on the CPU: its kernels compile for sm_90 without spills, the
FA3-order form keeps one wgmma in flight (``wgmma.wait_group 1``), bad arguments are refused."""

from __future__ import annotations

import json

import pytest

from tests.helpers.scripts import load_script, ptxas_available, run_script


@pytest.mark.skipif(not ptxas_available(), reason="triton's bundled ptxas not found")
def test_probe_kernels_compile_for_sm90(tmp_path):
    out = tmp_path / "c.json"
    r = run_script("wgmma_overlap_probe", "--compile-only", "--json", str(out), timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    c = json.loads(out.read_text())["compile_sm90"]
    assert set(c) == {"triton", "gluon_serial", "gluon_ahead", "gluon_ahead_pv"}
    for name, facts in c.items():
        assert facts["spill_bytes"] == 0 and 0 < facts["regs"] <= 255, (name, facts)
    # the serial forms wait for every MMA at once; the FA3 order leaves P@V in flight across the softmax
    assert c["gluon_serial"]["wgmma_wait_1"] == 0 and c["gluon_ahead_pv"]["wgmma_wait_1"] >= 1


@pytest.mark.parametrize("args, msg", [(["--rows", "100"], "--rows"), (["--keys", "1000"], "--keys"),
                                       (["--iters", "0"], "--iters")])
def test_bad_arguments_are_refused(args, msg, capsys):
    probe = load_script("wgmma_overlap_probe")
    with pytest.raises(SystemExit) as e:
        probe.main(args)
    assert e.value.code == 2 and msg in capsys.readouterr().err
