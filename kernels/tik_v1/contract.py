"""The numerical contract of implementation ``tik_v1``, as data.

Every constant here is *coupled*: each path of an op (full-sequence / extend / decode, batched /
single, training / rollout) reads the same value, so changing it changes the bits of every path at
once and keeps them equal. Free knobs (tile heights, warps, stages) live next to the kernels and
may differ per path. The search reads :data:`COUPLED` and :data:`FREE` to know which is which.
"""

# --- attention -------------------------------------------------------------------------------
# Keys are processed in tiles of ATTN_KV_TILE absolute positions [t*W, (t+1)*W); the online-softmax
# rescale points and P@V accumulation chunks are these tiles on every path.
ATTN_KV_TILE = 64
# Keys are grouped into splits of ATTN_SPLIT_KV absolute positions. Each split produces a partial
# state (m, l, acc); splits are merged left to right with one fixed formula. Decode runs splits in
# parallel; full-sequence / extend run them in sequence in registers -- same bits.
ATTN_SPLIT_KV = 512
# Softmax uses exp2 with the scale pre-multiplied by log2(e) in fp32 on the host.
ATTN_EXP = "exp2"

# --- RMSNorm ---------------------------------------------------------------------------------
# Sum of squares over the hidden dim reduced in a fixed tree; fp32; eps added before rsqrt.
RMSNORM_BLOCK = 0  # 0 = one tile covering the whole row (next power of two)

# --- GEMM ------------------------------------------------------------------------------------
# The K reduction is chunked in GEMM_BLOCK_K columns, accumulated in fp32 in increasing K order,
# never split across programs (no split-K) for any M.
GEMM_BLOCK_K = 64

# --- token log-prob --------------------------------------------------------------------------
# The vocab reduction (max, sum of exp) is partitioned into chunks of LOGPROB_VOCAB_CHUNK columns
# merged left to right, for every batch size.
LOGPROB_VOCAB_CHUNK = 4096

COUPLED = {
    "ATTN_KV_TILE": (32, 64, 128),
    "ATTN_SPLIT_KV": (256, 512, 1024, 2048),
    "GEMM_BLOCK_K": (32, 64, 128),
    "LOGPROB_VOCAB_CHUNK": (1024, 2048, 4096, 8192),
}
