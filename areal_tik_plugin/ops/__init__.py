"""Public, validated entry points of the unified ops.

Every op runs the kernels of the implementation selected by :mod:`areal_tik_plugin.runtime.loader` (hash
checked); bad input raises ``ValueError``/``TypeError`` naming the expected value; there is no
silent fallback to another kernel.

One entry point per op, for users and integrations alike. Its static checks (dtype, device, rank,
shape relations, strides, contiguity, scalar arguments) run once per argument signature
(:class:`areal_tik_plugin.ops._validate.Memo`): a repeated call with the same signature costs a set
lookup, a changed input misses and is checked again. Value checks (lengths, slots, positions, token
ids) run on every call where they need no GPU sync (see :func:`areal_tik_plugin.ops._validate.check_values`).
"""

from areal_tik_plugin.ops.attention import attention_decode, attention_extend, attention_varlen

__all__ = ["attention_varlen", "attention_extend", "attention_decode"]

from areal_tik_plugin.ops.kv_write import kv_write  # noqa: E402
from areal_tik_plugin.ops.logprob import token_logprobs  # noqa: E402
from areal_tik_plugin.ops.norm import qk_rms_norm, rms_norm, rms_norm_residual  # noqa: E402
from areal_tik_plugin.ops.rope import apply_rope, apply_rope_kv_write  # noqa: E402
from areal_tik_plugin.ops.swiglu import swiglu, swiglu_fused  # noqa: E402

__all__ += ["rms_norm", "rms_norm_residual", "qk_rms_norm", "apply_rope", "apply_rope_kv_write", "swiglu", "swiglu_fused",
            "kv_write", "token_logprobs"]

from areal_tik_plugin.ops.linear import linear  # noqa: E402
from areal_tik_plugin.ops.moe import moe_block, moe_experts, moe_route  # noqa: E402

__all__ += ["linear", "moe_route", "moe_experts", "moe_block"]
