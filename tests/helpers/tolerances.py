"""Accuracy tolerance table (atol, rtol) against fp64 references, per op and dtype.

bf16 has 8 significant bits (ulp 2^-8 at 1.0), fp16 11 bits (2^-11). Attention rounds P to the
input dtype before P@V (as FlashAttention does), so its error is a few output ulps.
"""

import torch

ATTN_TOL = {
    torch.bfloat16: (2e-2, 2e-2),
    torch.float16: (3e-3, 3e-3),
}

# relative L2 error of a training step's parameter gradients (bf16 forward + backward of a whole
# tiny model vs the same model in fp32): activations and weights rounded to bf16 in every layer
GRAD_REL_TOL = {
    torch.bfloat16: 3e-2,
}
