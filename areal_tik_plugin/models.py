"""Model shapes, in one table, and random-weight builders (no hub access).

``MODELS`` holds the Hugging Face config of every model shape the project builds or benchmarks
(weights are always random): the tiny ones of the CPU tests and ``tik verify``, and the real shapes
(values from each model's ``config.json``) of the GPU contract suite, layer bench and proofs. Everything
else derives from it: :func:`hf_config` (a transformers config), :func:`dims` (the numbers an op
benchmark needs), :func:`weight_shapes` (the dense GEMM weights of one layer) and
:func:`checkpoint_kwargs` (:func:`build_model` arguments for a random checkpoint on disk).

:func:`build_model` writes a random Qwen3 / Qwen3-MoE checkpoint with a locally built tokenizer.
AReaL's RLVR workflow applies the tokenizer's chat template and decodes completions for the
reward, so its tokenizer must cover any text (byte-level BPE) and carry a Qwen-style template: the
default, used by the AReaL end-to-end tests and the ``cpu-tiny`` recipe model group. The SGLang
proofs use a word-level tokenizer and their own tiny shape (``SGLANG_TINY``)::

    python -m areal_tik_plugin.models OUT_DIR [qwen3|qwen3_moe]
    python -m areal_tik_plugin.models OUT_DIR qwen3 --shape qwen3-1.7b --device cuda

``--shape NAME`` takes a real shape of ``MODELS`` (e.g. ``qwen3-1.7b`` for the GPU cell of the GSM8K
recipe, ``model=gpu-random-qwen3``) with the same small BPE tokenizer.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, NamedTuple

_TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, max_position_embeddings=8192, rms_norm_eps=1e-6, rope_theta=1e6,
             tie_word_embeddings=False)
_QWEN3_MOE = dict(norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[])
# HF config kwargs (model_type first); real shapes from each model's config.json, weights random
MODELS: dict[str, dict[str, Any]] = {
    "tiny-qwen3": dict(model_type="qwen3", **_TINY),
    "tiny-qwen3-moe": dict(model_type="qwen3_moe", **_TINY, moe_intermediate_size=32, num_experts=8,
                           num_experts_per_tok=2, **_QWEN3_MOE),
    "tiny-qwen2": dict(model_type="qwen2", **{k: v for k, v in _TINY.items() if k != "head_dim"}),
    "tiny-llama": dict(model_type="llama", **_TINY),
    "qwen2.5-1.5b": dict(model_type="qwen2", vocab_size=151936, hidden_size=1536, intermediate_size=8960,
                         num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                         max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1e6, tie_word_embeddings=True,
                         use_sliding_window=False),
    "qwen3-1.7b": dict(model_type="qwen3", vocab_size=151936, hidden_size=2048, intermediate_size=6144,
                       num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                       max_position_embeddings=40960, rms_norm_eps=1e-6, rope_theta=1e6, tie_word_embeddings=True),
    "qwen3-4b": dict(model_type="qwen3", vocab_size=151936, hidden_size=2560, intermediate_size=9728,
                     num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                     max_position_embeddings=40960, rms_norm_eps=1e-6, rope_theta=1e6, tie_word_embeddings=True),
    "qwen3-8b": dict(model_type="qwen3", vocab_size=151936, hidden_size=4096, intermediate_size=12288,
                     num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                     max_position_embeddings=40960, rms_norm_eps=1e-6, rope_theta=1e6, tie_word_embeddings=False),
    "qwen3-30b-a3b": dict(model_type="qwen3_moe", vocab_size=151936, hidden_size=2048, intermediate_size=6144,
                          moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8, **_QWEN3_MOE,
                          num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
                          max_position_embeddings=40960, rms_norm_eps=1e-6, rope_theta=1e6, tie_word_embeddings=False),
}


def _entry(name: str) -> dict[str, Any]:
    if name not in MODELS:
        raise ValueError(f"model: expected one of {sorted(MODELS)}, got {name!r}")
    return MODELS[name]


def hf_config(name: str, layers: int | None = None):
    """The transformers config of a ``MODELS`` entry (``layers`` overrides the layer count)."""
    from transformers import AutoConfig

    kw = dict(_entry(name))
    mt = kw.pop("model_type")
    if layers is not None:
        kw["num_hidden_layers"] = layers
    theta = kw.pop("rope_theta", None)
    if theta is not None:  # transformers 5.x: rope_parameters; older: rope_theta
        kw["rope_parameters"] = {"rope_type": "default", "rope_theta": theta}
    try:
        return AutoConfig.for_model(mt, **kw)
    except TypeError:
        kw.pop("rope_parameters", None)
        return AutoConfig.for_model(mt, rope_theta=theta, **kw)


class Dims(NamedTuple):
    """The numbers an op needs of one model (``inter``: the MLP width one token sees, the expert width
    for a MoE model)."""

    hidden: int
    hq: int
    hkv: int
    d: int
    vocab: int
    inter: int
    theta: float
    eps: float
    experts: int
    top_k: int
    qkv_bias: bool


def dims(name: str) -> Dims:
    m = _entry(name)
    hq, hidden = m["num_attention_heads"], m["hidden_size"]
    moe = m["model_type"] == "qwen3_moe"
    return Dims(hidden=hidden, hq=hq, hkv=m["num_key_value_heads"], d=m.get("head_dim", hidden // hq),
                vocab=m["vocab_size"], inter=m["moe_intermediate_size"] if moe else m["intermediate_size"],
                theta=m["rope_theta"], eps=m["rms_norm_eps"], experts=m.get("num_experts", 0),
                top_k=m.get("num_experts_per_tok", 0), qkv_bias=m["model_type"] == "qwen2")


def weight_shapes(name: str) -> dict[str, tuple[int, int, bool]]:
    """Dense GEMM weights of one layer (+ lm_head): ``layer -> (N, K, has_bias)``. A MoE model's
    expert weights are grouped GEMMs (the MoE op), so it lists ``router`` instead of gate_up / down."""
    x = dims(name)
    out = {"qkv": ((x.hq + 2 * x.hkv) * x.d, x.hidden, x.qkv_bias), "o": (x.hidden, x.hq * x.d, False)}
    if x.experts:
        out["router"] = (x.experts, x.hidden, False)
    else:
        out["gate_up"] = (2 * x.inter, x.hidden, False)
        out["down"] = (x.hidden, x.inter, False)
    out["lm_head"] = (x.vocab, x.hidden, False)
    return out


def checkpoint_kwargs(name: str, *, layers: int | None = None) -> tuple[str, dict[str, Any]]:
    """``(kind, kwargs)`` for :func:`build_model`: a random checkpoint of a ``MODELS`` Qwen3 shape."""
    m = _entry(name)
    if m["model_type"] not in ("qwen3", "qwen3_moe"):
        raise ValueError(f"model: build_model writes Qwen3 / Qwen3-MoE checkpoints, {name!r} is {m['model_type']}")
    kw = dict(vocab_size=m["vocab_size"], hidden_size=m["hidden_size"],
              num_layers=m["num_hidden_layers"] if layers is None else layers,
              num_heads=m["num_attention_heads"], num_kv_heads=m["num_key_value_heads"], head_dim=m["head_dim"],
              intermediate_size=m["intermediate_size"], init_std=0.02)
    if m["model_type"] == "qwen3_moe":
        kw.update(num_experts=m["num_experts"], top_k=m["num_experts_per_tok"],
                  moe_intermediate_size=m["moe_intermediate_size"])
    return m["model_type"], kw

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


# a fixed corpus for the merges: GSM8K-style words, digits, the chat template's words
_CORPUS = (
    "user assistant system Please put your final answer within boxed . How many does have now ? "
    "buys bags with in each bag earns dollars per hour and works hours then spends are left "
    "A box holds They shared equally among friends get each friend apples pencils stickers marbles "
    "cookies books shells stamps The hold Left #### = + - * / 0 1 2 3 4 5 6 7 8 9 10 12 20 100 "
    "more gives away of Ana Ben Cleo Dev Emma Farid Gita Hugo Iris Jon Kai Lena Milo Nora Omar Pia "
    "<|im_start|>user\n <|im_end|>\n <|im_start|>assistant\n \\boxed{}. "
)


def build_tokenizer(path: str, vocab_size: int = 512):
    """Byte-level BPE (any text encodes) with ~130 merges learnt from a fixed GSM8K-style corpus, so
    prompts are short (interpreted Triton kernels on CPU pay per token), + specials."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - len(SPECIALS), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    tok.train_from_iterator([_CORPUS] * 8, trainer=trainer)
    tok.add_special_tokens(list(SPECIALS))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   bos_token=None, unk_token=None)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(path)
    return fast


WORDS = ("the a one two three four five six seven eight nine ten cat dog sat on mat ran far and then "
         "red blue green big small fast slow up down left right sun moon star sky tree river hill "
         "what is plus minus times equals answer question think step so because if not yes no").split()


def build_word_tokenizer(path: str, n_extra: int = 0):
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


# the SGLang proofs' tiny shape (head_dim 32, odd vocab / intermediate sizes, bf16, word tokenizer)
SGLANG_TINY = dict(vocab_size=301, hidden_size=128, head_dim=32, intermediate_size=176, moe_intermediate_size=48,
                   dtype="bfloat16", tokenizer="words")


def build_model(path: str, kind: str = "qwen3", *, seed: int = 0, vocab_size: int = 517, hidden_size: int = 64,
                num_layers: int = 2, num_heads: int = 4, num_kv_heads: int = 2, head_dim: int = 16,
                intermediate_size: int = 88, num_experts: int = 5, top_k: int = 2, moe_intermediate_size: int = 24,
                dtype: str = "float32", init_std: float = 0.1, device: str = "cpu", tokenizer: str = "bpe") -> str:
    """Write a random ``kind`` ("qwen3" or "qwen3_moe") checkpoint + tokenizer to ``path``.

    ``tokenizer``: "bpe" (:func:`build_tokenizer`, any text, chat template) or "words"
    (:func:`build_word_tokenizer`, one token per word: the SGLang proofs). ``device="cuda"`` builds
    multi-GB random models in seconds."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3MoeConfig

    if tokenizer not in ("bpe", "words"):
        raise ValueError(f"tokenizer: expected 'bpe' or 'words', got {tokenizer!r}")
    os.makedirs(path, exist_ok=True)
    tok = build_tokenizer(path) if tokenizer == "bpe" else build_word_tokenizer(path)
    if len(tok) > vocab_size:
        raise ValueError(f"vocab_size: expected >= {len(tok)}, got {vocab_size}")
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
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=getattr(torch, dtype))
    with torch.no_grad():  # norms away from 1 so that their weights matter
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
    model.save_pretrained(path)
    with open(os.path.join(path, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id}, f)
    return path


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m areal_tik_plugin.models", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir")
    ap.add_argument("kind", nargs="?", default="qwen3", choices=["qwen3", "qwen3_moe"])
    real = sorted(k for k, v in MODELS.items() if not k.startswith("tiny") and v["model_type"].startswith("qwen3"))
    ap.add_argument("--shape", default=None, choices=real, help="a real shape of MODELS, bf16 (default: tiny)")
    ap.add_argument("--device", default="cpu", help="where to initialize the weights (cuda: seconds for GBs)")
    a = ap.parse_args(argv)
    kind, kw = a.kind, {}
    if a.shape:
        kind, kw = checkpoint_kwargs(a.shape)
        kw["dtype"] = "bfloat16"
    print(build_model(a.out_dir, kind, device=a.device, **kw))
    return 0


if __name__ == "__main__":
    sys.exit(main())
