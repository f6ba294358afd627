"""The megatron-core carry folder's manifest (devenv/megatron_wheels.py): each listed wheel once at its
version, nothing else, under the size budget; the list is the version AReaL 1.0.4's megatron extra pins."""

import pytest

from devenv import megatron_wheels as mw


def _touch(d, name, size=10):
    (d / name).write_bytes(b"x" * size)


MC = "megatron_core-0.17.0-cp312-cp312-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl"
MB = "mbridge-0.15.1-py3-none-any.whl"


def test_manifest_lists_each_wheel_with_size_and_hash(tmp_path):
    _touch(tmp_path, MC, 30)
    _touch(tmp_path, MB, 7)
    (tmp_path / "manifest.json").write_text("{}")  # not a wheel: ignored
    m = mw.manifest(str(tmp_path))
    assert [(e["name"], e["version"], e["bytes"]) for e in m["wheels"]] == [("mbridge", "0.15.1", 7),
                                                                           ("megatron_core", "0.17.0", 30)]
    assert m["total_bytes"] == 37 and len(m["wheels"][0]["sha256"]) == 64 and "torch" in m["on_image"]


@pytest.mark.parametrize("files, match", [
    ([MB], r"megatron-core==0.17.0: expected one wheel, found none"),
    ([MC.replace("0.17.0", "0.16.1"), MB], r"megatron-core: expected version 0.17.0"),
    ([MC, MB, "einops-0.8.2-py3-none-any.whl"], r"wheels not in the list: \['einops-0.8.2-py3-none-any.whl'\]"),
    ([MC, MB, "mbridge-0.15.2-py3-none-any.whl"], r"mbridge==0.15.1: expected one wheel, found"),
])
def test_manifest_refuses_missing_wrong_and_extra_wheels(tmp_path, files, match):
    for f in files:
        _touch(tmp_path, f)
    with pytest.raises(ValueError, match=match):
        mw.manifest(str(tmp_path))


def test_manifest_refuses_over_budget_and_bad_names(tmp_path):
    _touch(tmp_path, MC, 2048)
    _touch(tmp_path, MB)
    with pytest.raises(ValueError, match="over the 0.001 MiB carry budget"):
        mw.manifest(str(tmp_path), limit_mib=0.001)
    with pytest.raises(ValueError, match="expected NAME==VERSION"):
        mw.manifest(str(tmp_path), wheels=["megatron-core"])
    with pytest.raises(ValueError, match="expected a wheel file name"):
        mw.parse_wheel_name("megatron.whl")


def test_pins_follow_areal():
    assert "megatron-core==0.17.0" in mw.WHEELS and mw.LIMIT_MIB <= 20
