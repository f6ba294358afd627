"""Public, validated entry points of the unified ops.

Every op runs the kernels of the implementation selected by :mod:`areal_tik_plugin.loader` (hash
checked); bad input raises ``ValueError``/``TypeError`` naming the expected value; there is no
silent fallback to another kernel.
"""

from areal_tik_plugin.ops.attention import attention_decode, attention_extend, attention_varlen

__all__ = ["attention_varlen", "attention_extend", "attention_decode"]

from areal_tik_plugin.ops.linear import linear  # noqa: E402
from areal_tik_plugin.ops.moe import moe_block, moe_experts, moe_route  # noqa: E402

__all__ += ["linear", "moe_route", "moe_experts", "moe_block"]
