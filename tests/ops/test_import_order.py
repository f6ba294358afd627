"""The order of imports does not matter on the CPU: importing triton (or doing meta-tensor arithmetic,
which makes torch import it) before the plugin used to leave Triton's own helpers (``tl.cdiv``,
``tl.max``...) compiled-mode, and every later interpreted kernel call failed with "Cannot call
@triton.jit'd outside of the scope of a kernel" (see ``areal_tik_plugin.runtime.interp``). Each order runs in
a fresh interpreter (the switch happens once per process); the results are compared bit for bit."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

_OPS = r'''
import sys
import torch
from areal_tik_plugin import ops
g = torch.Generator().manual_seed(0)
bf = torch.bfloat16
x, w = torch.randn(3, 40, generator=g).to(bf), torch.randn(40, generator=g).to(bf)
q = torch.randn(5, 4, 16, generator=g).to(bf)
kv = torch.randn(5, 2, 16, generator=g).to(bf)
logits = torch.randn(3, 37, generator=g)
inv = 1.0 / 10000.0 ** (torch.arange(0, 16, 2, dtype=torch.float32) / 16)
out = {
    "rms_norm": ops.rms_norm(x, w, 1e-6),
    "linear": ops.linear(x, torch.randn(7, 40, generator=g).to(bf)),
    "attention_varlen": ops.attention_varlen(q, kv, kv, torch.tensor([0, 2, 5], dtype=torch.int32)),
    "token_logprobs": ops.token_logprobs(logits, torch.tensor([0, 36, 5]), 0.7),
    "moe_route": ops.moe_route(logits[:, :8].contiguous(), 2, True)[0],
    "apply_rope": ops.apply_rope(q, kv, torch.arange(5), inv)[0],
}
torch.save(out, sys.argv[1])
'''

_FIRST = {
    "plugin first": "",
    "triton first": "import triton\nimport triton.language as tl\n",
    "meta arithmetic first": "import torch\n(torch.empty(3, 4, device='meta') + 1).sum()\n",
}


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU interpreter switch")
def test_import_order_does_not_matter(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # as a user's process starts
    res = {}
    for name, prelude in _FIRST.items():
        path = tmp_path / f"{name.replace(' ', '_')}.pt"
        p = subprocess.run([sys.executable, "-c", prelude + _OPS, str(path)], env=env, capture_output=True,
                           text=True, timeout=300)
        assert p.returncode == 0, f"{name}: {p.stderr[-3000:]}"
        res[name] = torch.load(path)
    ref = res.pop("plugin first")
    for name, got in res.items():
        for op, t in ref.items():
            assert torch.equal(t.view(torch.int16) if t.dtype == torch.bfloat16 else t.view(torch.int32),
                               got[op].view(torch.int16) if got[op].dtype == torch.bfloat16 else got[op].view(torch.int32)), \
                f"{name}: {op}"
