"""Test-session setup shared by every test module.

Triton decides between its interpreter and compiled kernels when a ``@triton.jit`` function is
defined, including Triton's own ``tl.cdiv`` etc. at ``import triton``. Some test modules import
triton at collection time, so the interpreter must be switched on (no GPU) before any of them is
collected; otherwise an interpreted kernel that calls ``tl.cdiv`` fails depending on test order.
"""

from areal_tik_plugin._interp import ensure_interpreter_if_no_gpu

ensure_interpreter_if_no_gpu()
