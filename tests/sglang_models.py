"""Tiny random Qwen3 / Qwen3-MoE checkpoints with a locally built tokenizer (no hub access).

Used by the SGLang proof tests (tests/test_sglang_*.py) and handy for ``tik sglang-check``.
Shapes are odd where the kernels allow it (vocab, intermediate sizes); head_dim must be a power of
two for the attention kernels.
"""

from __future__ import annotations

import json
import os

WORDS = ("the a one two three four five six seven eight nine ten cat dog sat on mat ran far and then "
         "red blue green big small fast slow up down left right sun moon star sky tree river hill "
         "what is plus minus times equals answer question think step so because if not yes no").split()


def build_tokenizer(path: str, n_extra: int = 0):
    """A WordLevel tokenizer over WORDS + digits + a few special tokens, saved under ``path``."""
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>"]
    vocab = {}
    for w in specials + [str(d) for d in range(10)] + list(WORDS) + [f"w{i}" for i in range(n_extra)]:
        vocab.setdefault(w, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>",
                                   unk_token="<unk>", bos_token=None)
    fast.save_pretrained(path)
    return fast


def build_model(path: str, kind: str = "qwen3", *, seed: int = 0, vocab_size: int = 301, hidden_size: int = 128,
                num_layers: int = 2, num_heads: int = 4, num_kv_heads: int = 2, head_dim: int = 32,
                intermediate_size: int = 176, num_experts: int = 5, top_k: int = 2, moe_intermediate_size: int = 48,
                dtype: str = "bfloat16", init_std: float = 0.1, device: str = "cpu") -> str:
    """Write a random ``kind`` ("qwen3" or "qwen3_moe") checkpoint + tokenizer to ``path``."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3MoeConfig

    os.makedirs(path, exist_ok=True)
    tok = build_tokenizer(path)
    assert len(tok) <= vocab_size, (len(tok), vocab_size)
    common = dict(vocab_size=vocab_size, hidden_size=hidden_size, num_hidden_layers=num_layers,
                  num_attention_heads=num_heads, num_key_value_heads=num_kv_heads, head_dim=head_dim,
                  max_position_embeddings=1024, rms_norm_eps=1e-6, tie_word_embeddings=False,
                  bos_token_id=None, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                  initializer_range=init_std, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                  torch_dtype=dtype)
    if kind == "qwen3":
        cfg = Qwen3Config(intermediate_size=intermediate_size, **common)
    elif kind == "qwen3_moe":
        cfg = Qwen3MoeConfig(intermediate_size=intermediate_size, moe_intermediate_size=moe_intermediate_size,
                             num_experts=num_experts, num_experts_per_tok=top_k, norm_topk_prob=True,
                             decoder_sparse_step=1, mlp_only_layers=[], **common)
    else:
        raise ValueError(f"kind: expected 'qwen3' or 'qwen3_moe', got {kind!r}")
    torch.manual_seed(seed)
    with torch.device(device):  # "cuda" builds multi-GB random models in seconds
        model = AutoModelForCausalLM.from_config(cfg, dtype=getattr(torch, dtype))
    with torch.no_grad():  # norms away from 1 so that their weights matter
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
    model.save_pretrained(path)
    with open(os.path.join(path, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id}, f)
    return path


if __name__ == "__main__":
    import sys

    build_model(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "qwen3")
