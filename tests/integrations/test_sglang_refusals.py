"""Set-ups the tik SGLang backend cannot keep bit-identical are refused by name when it is built, before
any op is routed (no silent fallback to SGLang's own kernels). In a child process: importing SGLang
patches the process that imports it."""

import subprocess
import sys

import pytest

pytest.importorskip("sglang")

_CHILD = r"""
import os, types, torch
from areal_tik_plugin.integrations.sglang import layers as L

def runner(tp=1, compile=False, dtype=torch.bfloat16):
    sa = types.SimpleNamespace(tp_size=tp, enable_torch_compile=compile)
    return types.SimpleNamespace(server_args=sa, tp_size=tp, model=torch.nn.Linear(3, 5).to(dtype))

os.environ.pop("SGLANG_FORCE_FUSED_OP_BACKEND", None)
for kw, exc, msg in ((dict(tp=2), NotImplementedError, "tensor parallel size 2"),
                     (dict(compile=True), NotImplementedError, "enable-torch-compile"),
                     (dict(dtype=torch.float32), ValueError, "bfloat16 or float16")):
    try:
        L.activate(runner(**kw))
    except exc as e:
        assert msg in str(e), (kw, e)
    else:
        raise AssertionError(f"{kw}: not refused")
print("REFUSED-OK")
"""


def test_backend_refuses_unsupported_setups_by_name():
    from areal_tik_plugin.integrations.sglang import check as SC

    r = subprocess.run([sys.executable, "-c", _CHILD], env=SC.child_env(), capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0 and "REFUSED-OK" in r.stdout, (r.stdout[-2000:], r.stderr[-3000:])
