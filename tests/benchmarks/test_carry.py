"""What one device call carries (devenv/carry.py): the gsm8k-e2e carry (.whl + .whl-areal --trainer +
.whl-fi --no-deps + the working tree) against the 64 MiB limit, from the wheels the builders name, where
they are built (CI builds none: skipped with the reason); and the folder check on synthetic wheels."""

import os
import zipfile

import pytest

from devenv import carry

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_planned_gsm8k_e2e_carry_is_under_the_device_limit_with_margin():
    # TIK_CARRY_WHEEL_DIRS: checkouts holding built .whl* folders besides this one (os.pathsep-separated)
    dirs = [d for d in os.environ.get("TIK_CARRY_WHEEL_DIRS", "").split(os.pathsep) if d]
    p = carry.plan("gsm8k-e2e", ROOT, dirs)
    unbuilt = [x for x in p["problems"] if "not built" in x or "missing" in x]
    if unbuilt:
        pytest.skip("gsm8k-e2e wheels not built here: " + "; ".join(unbuilt))
    assert not p["problems"], p["problems"]
    assert p["headroom_bytes"] >= carry.MARGIN_BYTES, (
        f"gsm8k-e2e carry {p['total_bytes'] / 2**20:.1f} MiB leaves {p['headroom_bytes'] / 2**20:.1f} MiB "
        f"of {carry.LIMIT_BYTES / 2**20:.0f} MiB: " +
        ", ".join(f"{k} {v['bytes'] / 2**20:.1f} MiB" for k, v in p["folders"].items()) +
        f", tree {p['tree_bytes'] / 2**20:.1f} MiB")
    areal = p["folders"][".whl-areal"]["path"]
    assert not [f for f in os.listdir(areal) if f.endswith(".whl") and carry.wheel_key(f)[0] == "wandb"]


def _wheel(path, members):
    with zipfile.ZipFile(path, "w") as z:
        for m in members:
            z.writestr(m, "x" * 100)
    return os.path.getsize(path)


def test_check_folder_counts_named_wheels_and_names_missing_extra_and_untrimmed(tmp_path):
    a = _wheel(tmp_path / "pydantic_core-2.50.5-cp312-cp312-manylinux2014_x86_64.whl", ["pydantic_core/a.py"])
    b = _wheel(tmp_path / "tensorboardx-2.6.5-py3-none-any.whl", ["tensorboardX/a.py"])
    _wheel(tmp_path / "wandb-0.31.0-py3-none-any.whl", ["wandb/a.py"])
    s = _wheel(tmp_path / "sglang-0.5.23-cp312-cp312-manylinux_2_34_x86_64.whl",
               ["sglang/a.py", "sglang/multimodal_gen/b.py"])
    c = carry.check_folder(str(tmp_path), ["pydantic-core", "tensorBoardX==2.6.5", "sglang==0.5.23", "dill==0.4.1"])
    assert c["bytes"] == a + b + s
    assert c["missing"] == ["dill==0.4.1"]
    assert c["extra"] == ["wandb-0.31.0-py3-none-any.whl"]
    assert c["untrimmed"] == ["sglang-0.5.23-cp312-cp312-manylinux_2_34_x86_64.whl"]
    c = carry.check_folder(str(tmp_path), ["tensorboardx==2.6.4"])  # another version is not the named wheel
    assert c["missing"] == ["tensorboardx==2.6.4"] and c["bytes"] == 0
    with pytest.raises(ValueError, match="no carry plan for step 'gsm8k'"):
        carry.plan("gsm8k", ROOT)


def test_measure_without_git_walks_the_tree_and_counts_carried_folders_apart(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_bytes(b"a" * 1000)
    (tmp_path / "pkg" / "__pycache__").mkdir()
    (tmp_path / "pkg" / "__pycache__" / "m.pyc").write_bytes(b"b" * 5000)
    (tmp_path / ".whl").mkdir()
    w = _wheel(tmp_path / ".whl" / "x-1-py3-none-any.whl", ["x/a.py"])
    m = carry.measure(str(tmp_path), [".whl"])
    assert m["tree_how"].startswith("walk") and m["tree_bytes"] == 1000 and m["tree_files"] == 1
    assert m["folders"] == {".whl": w} and m["total_bytes"] == 1000 + w
    assert m["headroom_bytes"] == carry.LIMIT_BYTES - 1000 - w
