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
# A program normalizes a tile of ROWS = max(1, RMSNORM_TILE_ELEMS // next_pow2(H)) rows; the tile
# shape and num_warps (rmsnorm.tile_config) are a function of H only, so the reduction tree of a
# row never depends on how many rows the call has. var = div_rn(sum, H); rstd = rsqrt(var + eps);
# the normalized row is rounded to the activation dtype before the weight product (HF order).
RMSNORM_TILE_ELEMS = 4096

# --- RoPE ------------------------------------------------------------------------------------
# NeoX rotate-half. freq = float32(pos) * inv_freq (one fp32 multiply, as HF); cos/sin in fp32
# (libdevice cosf/sinf on GPU) times attention_scaling; out = x1*cos - x2*sin, x2*cos + x1*sin in
# fp32 with contraction off, rounded once to the activation dtype. Elementwise: no reduction.
ROPE_MATH = "fp32"

# --- SwiGLU ----------------------------------------------------------------------------------
# out = dtype(silu(g) * u) in fp32 with silu(g) = g / (1 + exp(-g)); one rounding.
SWIGLU_MATH = "fp32"

# --- KV-cache write ----------------------------------------------------------------------------
# k_cache[loc[i]] = k[i], v_cache[loc[i]] = v[i]: a bit copy (integer views), no conversion.
KV_WRITE_EXACT = True


# --- GEMM ------------------------------------------------------------------------------------
# The K reduction is chunked in GEMM_BLOCK_K columns, accumulated in fp32 in increasing K order.
GEMM_BLOCK_K = 64
# Split-K with partials that do not depend on M: the split is a function of the reduction length K
# only (gemm.split_chunk), never of M, of N or of the device. Not of N because the two sides hold the
# same weights in different shapes: SGLang runs fused qkv_proj / gate_up_proj (and column-parallel
# shards of them) where HF runs q/k/v and gate/up separately -- only K is the same everywhere.
# A weight with K < GEMM_SPLIT_MIN_K is one chain; otherwise K is cut into n = ceil(K /
# GEMM_SPLIT_CHUNK_MAX) chunks of ceil(K / n / GEMM_BLOCK_K) * GEMM_BLOCK_K columns (the last one
# shorter). Qwen3-4B: o_proj (K 4096) 2 x 2048, down_proj (K 9728) 5 x 1984; K 2560 not split.
GEMM_SPLIT_MIN_K = 3072
GEMM_SPLIT_CHUNK_MAX = 2048
# A row is, per chunk c, one chain `part_c = tl.dot(x_chunk, w_chunk^T, part_c)` over its
# GEMM_BLOCK_K pieces from zero; without a split that chain is the row: acc = part_0; with a split
# acc = ((0 + part_0) + part_1) + ... in fp32, in chunk order (in registers for large M, through an
# fp32 workspace and an ordered reduction for small M: the same additions). Then acc + 0.0
# (signed-zero canonicalization); bias (if any) added in fp32; one rounding to the activation dtype.
# Tile shape, warps, stages, TMA vs pointer loads, registers vs workspace are free (gemm.config_for).

# --- MoE (Qwen3-MoE) ---------------------------------------------------------------------------
# Routing: p = softmax(float32(logits)) per row, computed by programs of MOE_ROUTE_BLOCK_T rows and
# MOE_ROUTE_WARPS warps for every T (the row-sum tree depends on both); p = div_rn(exp(l - max), sum).
# Top-k by repeated argmax, ties -> lower expert id; slots ordered by descending p. With
# norm_topk_prob: w_j = div_rn(p_j, ((p_0 + p_1) + ...) + p_{k-1}) (slot order).
MOE_ROUTE_BLOCK_T = 16
MOE_ROUTE_WARPS = 4
# Experts: gate/up/down rows are one GEMM chain (GEMM_BLOCK_K chunks, never split) on rows
# gathered per expert; g, u rounded to the activation dtype; act = dtype(silu(g) * u) in fp32 with
# silu(g) = div_rn(g, 1 + exp(-g)); expert output y_j rounded to the activation dtype; combine
# out = dtype(sum_j w_j * float32(y_j)) accumulated in slot order j = 0..k-1 (contraction off).
MOE_COMBINE_ORDER = "slot"


# --- token log-prob --------------------------------------------------------------------------
# The vocab reduction (max, sum of exp) is partitioned into chunks of LOGPROB_VOCAB_CHUNK columns
# merged left to right, for every batch size. 8192: 64 logits per thread of
# the 4-warp chunk program and half the chunks to merge. H200 probe (3 interleaved rounds, medians): without / with the entropy, T 1 / 8 / 64 / 256 (the
# sampler's calls) x1.57 / 1.92 / 1.53 / 1.18 and x1.34 / 1.12 / 1.15 / 1.09, T 1024 / 4096 x1.03-1.08 and
# x1.07 (share of HBM with the entropy at T 4096 0.839 -> 0.899); 2048: x0.75-0.84.
LOGPROB_VOCAB_CHUNK = 8192
# Each chunk's (max, sum exp, sum exp*(s-max)) is reduced by one program of LOGPROB_CHUNK_WARPS warps
# (the tl.sum tree depends on it); s = float(logit) * div_rn(1, T); merged left to right by
# logprob._merge on every path.
LOGPROB_CHUNK_WARPS = 4
# Columns are loaded in runs of LOGPROB_LOAD_GROUP contiguous elements for every logits dtype, so a
# chunk's register layout (and sum tree) is the same for bf16 logits and their fp32 copy.
LOGPROB_LOAD_GROUP = 4
# The sums run in base 2: inv = div_rn(1, T) * log2(e), s = float(x) * inv, exp2 / log2 in the chunk sums and
# the merge, lse / logp / entropy multiplied by ln 2 at the end (logprob.py docstring). One multiply per
# element less than exp(x) = exp2(x * log2(e)); H200 probe: share of HBM 0.80-0.83 -> 0.89-0.91.
LOGPROB_EXP = "exp2"
# How a chunk program forms d = s - max(s): "mul_sub" rounds s = float(x) * inv, then
# s - m; "fma" takes the max on float(x) (m = max(float(x)) * inv is max(s) bit for bit: rounding is monotonic and
# inv > 0) and forms d = fma(float(x), inv, -m) in one rounding: one instruction per logit less (sm_90 SASS of the
# chunk program: 744 -> 680 without the entropy, 960 -> 896 with it). H200 probe (3 interleaved rounds, medians): share of HBM at T 1024 / 4096 / 16384 0.889 / 0.957 /
# 0.972 -> 0.911 / 0.973 / 0.983, with the entropy 0.802 / 0.908 / 0.927 -> 0.826 / 0.930 / 0.954; T <= 256 x0.96-1.03.
LOGPROB_SHIFT = "fma"

COUPLED = {
    "ATTN_KV_TILE": (32, 64, 128),
    "ATTN_SPLIT_KV": (256, 512, 1024, 2048),
    "GEMM_BLOCK_K": (32, 64, 128),
    "LOGPROB_VOCAB_CHUNK": (1024, 2048, 4096, 8192),
}

# Coupled knobs of MoE routing (the softmax row-sum tree).
COUPLED.update({
    "MOE_ROUTE_BLOCK_T": (8, 16, 32),
    "MOE_ROUTE_WARPS": (1, 2, 4, 8),
})

# Coupled knobs of the row-wise ops (rmsnorm, logprob): each changes the bits of every row at once.
COUPLED.update({
    "RMSNORM_TILE_ELEMS": (1024, 2048, 4096, 8192),
    "LOGPROB_CHUNK_WARPS": (2, 4, 8),
    "LOGPROB_LOAD_GROUP": (2, 4),
    "LOGPROB_EXP": ("exp", "exp2"),
    "LOGPROB_SHIFT": ("mul_sub", "fma"),
})
