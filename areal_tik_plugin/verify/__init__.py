"""``tik verify``: Constraint (1) for a whole model, at every position.

For a model (a built-in config with random weights, or a local Hugging Face checkpoint) and a batch
of prompt + response token sequences it compares

* the **policy-update forward** M_upd(p‖y): the tik-patched Hugging Face model over the whole
  sequences, packed into one row with AReaL's ``cu_seq_lens_q/k`` / per-sequence ``position_ids``
  (what AReaL's FSDP engine runs), with
* the **rollout** M_pre(p) ‖ M_dec(y|p): prefill of the prompts, then token-by-token decode against a
  paged KV cache, replayed inside the plugin by :class:`PagedRunner` (the same HF weights, layer by
  layer, on ``ops.attention_extend`` / ``attention_decode`` / ``kv_write`` and the same layer ops:
  a verifier, not a serving engine),

and also batched vs single decode, packed vs separate and padded vs packed full-sequence forwards,
and the training forward (autograd on) vs the no-grad forward. The same rollout-vs-update check runs
for the **stock** path (HF sdpa/eager full sequence vs HF cached decode with ``DynamicCache``) so the
mismatch the plugin removes is visible. Per check: max |Δlogit|, max |Δlogp| (log-prob of the next
token) and the share of bit-identical logit rows.

Exit code: 0 when every plugin check is bit-identical, 1 when one is not (or crashed), 2 for bad
arguments or a model the kernels do not support. On CPU the kernels run under Triton's interpreter
(``tik verify --model tiny-qwen3`` takes well under a minute); on a GPU, e.g.
``tik verify --model qwen3-4b --prompt-len 1024 --response-len 128..1024 --batch 64 --json``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from typing import Any

from areal_tik_plugin.models import MODELS, hf_config

BUILTIN_MODELS = MODELS  # the built-in configs (random weights) are the one table of areal_tik_plugin.models


def _hf_config(name_or_path: str, layers: int | None):
    from transformers import AutoConfig

    if name_or_path in BUILTIN_MODELS:
        return hf_config(name_or_path, layers), False
    if not os.path.isdir(name_or_path):
        raise ValueError(f"--model: expected one of {sorted(BUILTIN_MODELS)} or a local Hugging Face checkpoint "
                         f"folder, got {name_or_path!r}")
    cfg = AutoConfig.from_pretrained(name_or_path)
    if layers is not None:
        cfg.num_hidden_layers = layers
        if getattr(cfg, "layer_types", None):
            cfg.layer_types = cfg.layer_types[:layers]
    return cfg, True


def build_model(name_or_path: str, *, layers: int | None = None, dtype=None, device="cpu", seed: int = 0,
                attn_implementation: str = "sdpa"):
    """An unpatched HF causal LM in eval mode: random weights for a built-in config, else the checkpoint."""
    import torch
    from transformers import AutoModelForCausalLM

    dtype = dtype or torch.bfloat16
    cfg, is_ckpt = _hf_config(name_or_path, layers)
    torch.manual_seed(seed)
    if is_ckpt:
        model = AutoModelForCausalLM.from_pretrained(name_or_path, config=cfg, dtype=dtype,
                                                     attn_implementation=attn_implementation).to(device)
    else:
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation=attn_implementation)
    return model.eval()


# ------------------------------------------------------------------------------------------------
# rollout replay: prefill / extend / decode over a paged KV cache with the plugin's ops
# ------------------------------------------------------------------------------------------------
def layer_step(layer, h, positions, inv_freq, rope_scaling, k_cache, v_cache, loc, attend, residual=None,
               split_residual=False):
    """One HF decoder layer on the rollout path, laid out as SGLang runs it: h [T, H] -> [T, H].

    One GEMM for the fused QKV weight and one for the fused gate_up weight
    (:func:`~areal_tik_plugin.integrations.transformers.rollout_weights`), the residual adds fused into
    the RMSNorms (``ops.rms_norm_residual``), q/k norm in one launch and RoPE writing K/V of the T
    tokens at pool slots ``loc`` (``ops.qk_rms_norm``, ``ops.apply_rope_kv_write``), then
    ``attend(q, scale)`` (extend or decode over the pool) gives the attention output [T, Hq, D]. The
    ops are those of the tik-patched HF forward (separate projections and norms, RoPE, residual adds
    in torch); the contract makes both give the same bits. No gradients.

    ``split_residual=True`` is SGLang's layer convention: the layer returns ``(mlp_out, residual)``
    (their sum is the HF layer output) and the next layer takes them as ``h, residual``, adding them
    inside its input RMSNorm; ``residual=None`` means ``h`` is the whole hidden state (first layer).
    """
    from areal_tik_plugin.integrations import transformers as T

    attn = layer.self_attn
    fused = T.rollout_weights(layer, h.dtype)
    n = h.shape[0]
    if residual is None:
        residual = h
        x = T.tik_rms_norm(h, layer.input_layernorm)
    else:
        x, residual = T.tik_rms_norm_residual(h, residual, layer.input_layernorm)
    q = T.tik_qkv_rollout(attn, x, positions, inv_freq, rope_scaling, fused, k_cache, v_cache, loc)
    o = attend(q, attn.scaling)
    x, h = T.tik_rms_norm_residual(T.tik_linear(o.reshape(n, -1), attn.o_proj), residual,
                                   layer.post_attention_layernorm)
    out = T.tik_ffn_rollout(layer.mlp, x, fused)
    return (out, h) if split_residual else h + out


class PagedRunner:
    """Replays rollout on a HF causal LM's weights with the unified ops and a paged KV cache.

    The KV pool is SGLang's layout: per layer ``k[slots, Hkv, D]``, ``v[slots, Hkv, D]``; a page table
    ``table[request, page] -> page id`` (page 0 reserved), pages handed out in a random order so a
    request's cache is scattered. Layer math is :mod:`areal_tik_plugin.integrations.transformers`'
    (the functions the patched HF forwards call), so the two paths differ only where the contract
    says they may: how attention reads K/V.
    """

    def __init__(self, model, *, max_requests: int, max_context: int, page_size: int = 16, seed: int = 0):
        import torch

        from areal_tik_plugin.integrations import transformers as T

        T.check_config(model.config)
        T.require_ops(T._ops_for(model.config.model_type) + ("kv_write",))
        self.T = T
        self.model = model
        inner = model.get_decoder() if hasattr(model, "get_decoder") else model.model
        self.embed = inner.embed_tokens
        self.layers = list(inner.layers[: model.config.num_hidden_layers])
        self.norm = inner.norm
        self.head = model.get_output_embeddings()
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype
        self.inv_freq, self.rope_scaling = T.rope_params(inner.rotary_emb, self.device)
        a0 = self.layers[0].self_attn
        self.Hkv = model.config.num_key_value_heads
        self.D = a0.head_dim
        self.P = int(page_size)
        self.W = math.ceil(max_context / self.P)
        n_pages = max_requests * self.W + 1
        g = torch.Generator().manual_seed(seed)
        self._free = (torch.randperm(n_pages - 1, generator=g) + 1).tolist()
        self.table = torch.zeros(max_requests, self.W, dtype=torch.int32, device=self.device)
        self._pages = [0] * max_requests
        self.lens = [0] * max_requests
        shape = (n_pages * self.P, self.Hkv, self.D)
        self.k = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in self.layers]
        self.v = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in self.layers]

    # -- cache bookkeeping ------------------------------------------------------------------
    def _ensure(self, row: int, n: int) -> None:
        need = math.ceil(n / self.P)
        if need > self.W:
            raise ValueError(f"request {row}: context {n} exceeds the runner's max_context {self.W * self.P}")
        while self._pages[row] < need:
            self.table[row, self._pages[row]] = self._free.pop()
            self._pages[row] += 1

    def _slots(self, row: int, start: int, end: int):
        import torch

        pos = torch.arange(start, end, device=self.device)
        return self.table[row, pos // self.P].to(torch.int64) * self.P + pos % self.P

    # -- model ------------------------------------------------------------------------------
    def _forward(self, ids, positions, loc, attend):
        h, residual = self.embed(ids), None
        for i, layer in enumerate(self.layers):  # SGLang's convention: residual adds inside the next norm
            h, residual = layer_step(layer, h, positions, self.inv_freq, self.rope_scaling, self.k[i], self.v[i],
                                     loc, lambda q, scale, i=i: attend(i, q, scale), residual=residual,
                                     split_residual=True)
        x = self.T.tik_rms_norm_residual(h, residual, self.norm)[0] if residual is not None \
            else self.T.tik_rms_norm(h, self.norm)
        return self.T.tik_linear(x, self.head)

    def extend(self, rows: list[int], tokens: list):
        """New tokens for ``rows`` after their cached prefix (prefill when the prefix is empty).
        Returns one logits tensor [n_i, V] per row."""
        import torch

        from areal_tik_plugin import ops

        dev = self.device
        n = [int(t.numel()) for t in tokens]
        pre = [self.lens[r] for r in rows]
        for r, a, b in zip(rows, pre, n):
            self._ensure(r, a + b)
        ids = torch.cat([t.reshape(-1) for t in tokens]).to(dev)
        positions = torch.cat([torch.arange(a, a + b, device=dev) for a, b in zip(pre, n)])
        loc = torch.cat([self._slots(r, a, a + b) for r, a, b in zip(rows, pre, n)])
        cu = torch.zeros(len(rows) + 1, dtype=torch.int32, device=dev)
        cu[1:] = torch.cumsum(torch.tensor(n, device=dev), 0)
        prefix = torch.tensor(pre, dtype=torch.int32, device=dev)
        trows = torch.tensor(rows, dtype=torch.int32, device=dev)

        def attend(i, q, scale):
            return ops.attention_extend(q, self.k[i], self.v[i], cu_seqlens_q=cu, prefix_lens=prefix,
                                        kv_indices=self.table, table_rows=trows, max_extend_len=max(n),
                                        softmax_scale=scale, page_size=self.P)

        logits = self._forward(ids, positions, loc, attend)
        for r, b in zip(rows, n):
            self.lens[r] += b
        return list(torch.split(logits, n))

    def prefill(self, rows: list[int], prompts: list, chunk: int = 0, max_tokens: int | None = None):
        """Prompts of ``rows`` into an empty cache, whole (``chunk=0``) or in chunks of ``chunk`` tokens;
        each extend call holds at most ``max_tokens`` tokens (at least one request)."""
        import torch

        for r in rows:
            if self.lens[r]:
                raise ValueError(f"request row {r} is not empty")
        out = [[] for _ in rows]
        longest = max(int(p.numel()) for p in prompts)
        step = chunk or longest
        for s in range(0, longest, step):
            idx = [j for j, p in enumerate(prompts) if p.numel() > s]
            pieces = [prompts[j][s:s + step] for j in idx]
            for grp in packed_groups([int(p.numel()) for p in pieces], max_tokens or (1 << 62)):
                res = self.extend([rows[idx[g]] for g in grp], [pieces[g] for g in grp])
                for g, lg in zip(grp, res):
                    out[idx[g]].append(lg)
        return [o[0] if len(o) == 1 else torch.cat(o) for o in out]

    def decode(self, rows: list[int], tokens):
        """One token per row at its next position -> logits [len(rows), V]."""
        import torch

        from areal_tik_plugin import ops

        dev = self.device
        pos = [self.lens[r] for r in rows]
        for r, a in zip(rows, pos):
            self._ensure(r, a + 1)
        ids = torch.as_tensor(tokens, device=dev).reshape(-1)
        positions = torch.tensor(pos, device=dev)
        trows = torch.tensor(rows, dtype=torch.int32, device=dev)
        loc = self.table[trows.long(), positions // self.P].to(torch.int64) * self.P + positions % self.P
        seq = (positions + 1).to(torch.int32)

        def attend(i, q, scale):
            return ops.attention_decode(q, self.k[i], self.v[i], seq_lens=seq, kv_indices=self.table,
                                        table_rows=trows, softmax_scale=scale, page_size=self.P,
                                        max_context_len=self.W * self.P)

        logits = self._forward(ids, positions, loc, attend)
        for r in rows:
            self.lens[r] += 1
        return logits


# ------------------------------------------------------------------------------------------------
# comparisons
# ------------------------------------------------------------------------------------------------
class Check:
    """Row statistics of one comparison (logits rows A vs B, next-token log-probs)."""

    def __init__(self, path: str, name: str):
        self.path, self.name = path, name
        self.rows = self.identical = 0
        self.max_dlogit = self.max_dlogp = 0.0
        self.finite = True
        self.error: str | None = None

    def add(self, a, b, lp_a=None, lp_b=None, chunk: int = 256) -> None:
        import torch

        if a.shape != b.shape:
            raise ValueError(f"{self.name}: shapes differ {tuple(a.shape)} vs {tuple(b.shape)}")
        ib = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
        for s in range(0, a.shape[0], chunk):
            x, y = a[s:s + chunk], b[s:s + chunk].to(a.device)
            self.identical += int((x.contiguous().view(ib) == y.contiguous().view(ib)).all(-1).sum())
            self.rows += x.shape[0]
            d = (x.float() - y.float()).abs()
            self.finite &= bool(torch.isfinite(x).all()) and bool(torch.isfinite(y).all())
            if d.numel():
                self.max_dlogit = max(self.max_dlogit, float(d.max()))
        if lp_a is not None and lp_a.numel():
            self.max_dlogp = max(self.max_dlogp, float((lp_a.double() - lp_b.to(lp_a.device).double()).abs().max()))

    @property
    def bit_identical(self) -> bool:
        return self.error is None and self.finite and self.rows > 0 and self.identical == self.rows

    def to_json(self) -> dict[str, Any]:
        d = {"path": self.path, "check": self.name, "rows": self.rows, "identical_rows": self.identical,
             "share_identical": (self.identical / self.rows) if self.rows else 0.0,
             "max_abs_dlogit": self.max_dlogit, "max_abs_dlogp": self.max_dlogp, "finite": self.finite,
             "bit_identical": self.bit_identical}
        if self.error:
            d["error"] = self.error
        return d


def _plugin_logp(logits, labels, temperature):
    from areal_tik_plugin import ops

    return ops.token_logprobs(logits, labels, temperature=temperature)


def _stock_logp(logits, labels, temperature):
    import torch

    lp = torch.log_softmax(logits.float() / temperature, -1)
    return lp.gather(-1, labels.long().unsqueeze(-1)).squeeze(-1)


def _labels(seq, device):
    return seq[1:].to(device)


# ------------------------------------------------------------------------------------------------
# the two paths
# ------------------------------------------------------------------------------------------------
def packed_groups(lengths: list[int], max_tokens: int) -> list[list[int]]:
    """Indices grouped in order into micro-batches of at most ``max_tokens`` tokens (a longer item alone)."""
    groups, cur, tot = [], [], 0
    for i, n in enumerate(lengths):
        if cur and tot + n > max_tokens:
            groups.append(cur)
            cur, tot = [], 0
        cur.append(i)
        tot += n
    if cur:
        groups.append(cur)
    return groups


def hf_packed_logits(model, seqs: list, device) -> list:
    """Patched HF forward of ``seqs`` packed into one row, as AReaL's FSDP engine calls it."""
    import torch

    n = [int(s.numel()) for s in seqs]
    ids = torch.cat(seqs).to(device)[None]
    pos = torch.cat([torch.arange(k) for k in n]).to(device)[None]
    cu = torch.zeros(len(n) + 1, dtype=torch.int32, device=device)
    cu[1:] = torch.cumsum(torch.tensor(n, device=device), 0)
    out = model(input_ids=ids, position_ids=pos, cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=max(n),
                max_length_k=max(n), use_cache=False)
    return list(torch.split(out.logits[0], n))


def hf_padded_logits(model, seqs: list, device) -> list:
    """Patched HF forward of ``seqs`` as a left-padded batch with a 2-D attention mask."""
    import torch

    L = max(int(s.numel()) for s in seqs)
    ids = torch.zeros(len(seqs), L, dtype=torch.long)
    mask = torch.zeros(len(seqs), L, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, L - s.numel():] = s
        mask[i, L - s.numel():] = 1
    pos = (mask.cumsum(1) - 1).clamp(min=0)
    out = model(input_ids=ids.to(device), attention_mask=mask.to(device), position_ids=pos.to(device), use_cache=False)
    return [out.logits[i, L - s.numel():] for i, s in enumerate(seqs)]


def _cache_kw(model) -> str:
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _out_cache(out):
    c = getattr(out, "cache", None)
    return c if c is not None else getattr(out, "past_key_values", None)


def stock_rollout_logits(model, prompts, responses, device, store, max_tokens: int = 1 << 62):
    """HF cached decode (DynamicCache): sequences with equal prompt length batched together (at most
    ``max_tokens`` prompt tokens per batch), prefill then one token per step."""
    import torch

    kw = _cache_kw(model)
    by_len: dict[int, list[int]] = {}
    for i, p in enumerate(prompts):
        by_len.setdefault(int(p.numel()), []).append(i)
    for P, same in by_len.items():
        per = max(1, max_tokens // P)
        for s in range(0, len(same), per):
            idx = same[s:s + per]
            out = model(input_ids=torch.stack([prompts[i] for i in idx]).to(device), use_cache=True)
            cache = _out_cache(out)
            for j, i in enumerate(idx):
                store[i][:P] = out.logits[j]
            R = max(int(responses[i].numel()) for i in idx)
            for t in range(R):
                tok = torch.tensor([[int(responses[i][t]) if t < responses[i].numel() else 0] for i in idx],
                                   device=device)
                out = model(input_ids=tok, use_cache=True, **{kw: cache})
                cache = _out_cache(out)
                for j, i in enumerate(idx):
                    if t < responses[i].numel():
                        store[i][P + t] = out.logits[j, -1]
            del cache, out


def plugin_rollout_logits(model, prompts, responses, device, store, *, page_size, seed, chunk=0, greedy=False,
                          rows=None, max_tokens=None):
    """Rollout replay of ``rows`` (default all) in one batch: prefill, then decode step by step.
    With ``greedy`` the response tokens are replaced by the argmax of the runner's logits (a real
    greedy rollout)."""
    import torch

    rows = list(range(len(prompts))) if rows is None else list(rows)
    ctx = max(int(prompts[i].numel() + responses[i].numel()) for i in rows)
    run = PagedRunner(model, max_requests=len(rows), max_context=ctx, page_size=page_size, seed=seed)
    slots = list(range(len(rows)))
    first = run.prefill(slots, [prompts[i].to(device) for i in rows], chunk=chunk, max_tokens=max_tokens)
    last = {}
    for s, i in zip(slots, rows):
        P = prompts[i].numel()
        store[i][:P] = first[s]
        last[i] = first[s][-1]
    R = max(int(responses[i].numel()) for i in rows)
    for t in range(R):
        act = [(s, i) for s, i in zip(slots, rows) if t < responses[i].numel()]
        if greedy:
            for _, i in act:
                responses[i][t] = int(torch.argmax(last[i].float()))
        lg = run.decode([s for s, _ in act], [int(responses[i][t]) for _, i in act])
        for j, (_, i) in enumerate(act):
            store[i][prompts[i].numel() + t] = lg[j]
            last[i] = lg[j]
    del run


# ------------------------------------------------------------------------------------------------
# driver
# ------------------------------------------------------------------------------------------------
def parse_lengths(spec: str | int, batch: int, name: str) -> list[int]:
    """``"17"`` -> [17]*batch; ``"128..1024"`` -> batch lengths spread evenly over the range."""
    s = str(spec)
    try:
        if ".." in s:
            a, b = (int(x) for x in s.split("..", 1))
        else:
            a = b = int(s)
    except ValueError:
        raise ValueError(f"{name}: expected N or A..B, got {spec!r}") from None
    if a < 1 or b < a:
        raise ValueError(f"{name}: expected 1 <= A <= B, got {spec!r}")
    if batch == 1 or a == b:
        return [a] * batch
    return [round(a + (b - a) * i / (batch - 1)) for i in range(batch)]


def _read_prompt_file(path: str, model_path: str | None, vocab: int) -> list[list[int]]:
    lines = [ln.strip() for ln in open(path, encoding="utf-8") if ln.strip()]
    if not lines:
        raise ValueError(f"--prompt-file {path}: no prompts")
    out = []
    tok = None
    for ln in lines:
        parts = ln.split()
        if all(p.lstrip("-").isdigit() for p in parts):
            ids = [int(p) for p in parts]
        else:
            if tok is None:
                if not model_path:
                    raise ValueError("--prompt-file holds text: a built-in model has no tokenizer; give token ids "
                                     "(whitespace-separated integers, one prompt per line) or a checkpoint path")
                from transformers import AutoTokenizer

                tok = AutoTokenizer.from_pretrained(model_path)
            ids = tok(ln, add_special_tokens=False)["input_ids"]
        if not ids or min(ids) < 0 or max(ids) >= vocab:
            raise ValueError(f"--prompt-file: token ids must lie in [0, {vocab}), got line {ln[:60]!r}")
        out.append(ids)
    return out


def _alloc_store(lengths, V, dtype, device):
    import torch

    return [torch.empty(n, V, dtype=dtype, device=device) for n in lengths]


def _store_device(device, n_rows: int, V: int, dtype) -> Any:
    import torch

    if getattr(device, "type", str(device)) != "cuda":
        return device
    need = n_rows * V * torch.tensor([], dtype=dtype).element_size()
    free, _ = torch.cuda.mem_get_info(device)
    return device if need * 1.3 + (8 << 30) < free else torch.device("cpu")


def run_verify(model_name: str = "tiny-qwen3", *, layers: int | None = None, batch: int = 3,
               prompt_len: str = "11..17", response_len: str = "5..9", prompt_file: str | None = None,
               device: str | None = None, dtype: str = "bfloat16", seed: int = 0, page_size: int = 16,
               single: int = 1, prefill_chunk: int = 0, greedy: bool = False, temperature: float = 1.0,
               stock: bool = True, stock_attn: str = "sdpa", max_tokens_per_forward: int = 32768,
               progress=None) -> dict[str, Any]:
    """Run every check; returns the JSON-able report (see module docstring)."""
    from areal_tik_plugin.runtime import interp as _interp

    _interp.ensure_interpreter_if_no_gpu()
    import torch

    from areal_tik_plugin.runtime import loader
    from areal_tik_plugin.integrations import transformers as T

    t0 = time.time()
    say = progress or (lambda *_: None)
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dt = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}.get(dtype)
    if dt is None:
        raise ValueError(f"--dtype: expected bfloat16 or float16, got {dtype!r}")
    if batch < 1:
        raise ValueError(f"--batch: expected >= 1, got {batch}")
    if page_size < 1 or page_size & (page_size - 1):
        raise ValueError(f"--page-size: expected a power of two, got {page_size}")
    if layers is not None and layers < 1:
        raise ValueError(f"--layers: expected >= 1, got {layers}")
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"--device: expected cuda or cpu, got {dev}")
    if not (isinstance(temperature, (int, float)) and 0 < temperature < float("inf")):
        raise ValueError(f"--temperature: expected a finite float > 0, got {temperature!r}")
    if prefill_chunk < 0:
        raise ValueError(f"--prefill-chunk: expected >= 0 (0: whole prompt), got {prefill_chunk}")
    if single < 0:
        raise ValueError(f"--single: expected >= 0, got {single}")
    if max_tokens_per_forward < 1:
        raise ValueError(f"--max-tokens-per-forward: expected >= 1, got {max_tokens_per_forward}")
    T.require_ops(("kv_write", "token_logprobs") + T.MOE_OPS)

    if not prompt_file:  # bad lengths are refused before the model is built
        parse_lengths(prompt_len, batch, "--prompt-len")
    parse_lengths(response_len, batch, "--response-len")
    say(f"building {model_name} on {dev}")
    model = build_model(model_name, layers=layers, dtype=dt, device=dev, seed=seed, attn_implementation=stock_attn)
    cfg = model.config
    V = cfg.vocab_size
    g = torch.Generator().manual_seed(seed + 1)
    if prompt_file:
        ids = _read_prompt_file(prompt_file, model_name if model_name not in BUILTIN_MODELS else None, V)
        if batch > len(ids):
            ids = [ids[i % len(ids)] for i in range(batch)]
        prompts = [torch.tensor(x, dtype=torch.long) for x in ids[:batch]]
    else:
        prompts = [torch.randint(0, V, (n,), generator=g) for n in parse_lengths(prompt_len, batch, "--prompt-len")]
    rlens = parse_lengths(response_len, batch, "--response-len")
    responses = [torch.randint(0, V, (n,), generator=g) for n in rlens]
    B = len(prompts)
    lens = [int(p.numel() + r.numel()) for p, r in zip(prompts, responses)]
    n_single = max(0, min(single, B))
    checks: list[Check] = []

    def guarded(check: Check, fn):
        try:
            fn(check)
        except Exception as e:  # a crash is a failed check, reported
            check.error = f"{type(e).__name__}: {e}"[:500]
        checks.append(check)

    sdev = _store_device(dev, sum(lens), V, dt)

    with torch.no_grad():
        # ---------------- stock path (unpatched HF) --------------------------------------------
        if stock:
            say("stock: HF cached decode")

            def stock_main(c):
                store = _alloc_store(lens, V, dt, sdev)
                stock_rollout_logits(model, prompts, responses, dev, store, max_tokens_per_forward)
                for i in range(B):
                    seq = torch.cat([prompts[i], responses[i]])
                    full = model(input_ids=seq[None].to(dev), use_cache=False).logits[0]
                    lab = _labels(seq, dev)
                    c.add(full, store[i], _stock_logp(full[:-1], lab, temperature),
                          _stock_logp(store[i][:-1].to(dev), lab, temperature))

            guarded(Check("stock", f"full-seq ({stock_attn}) vs prefill+decode (DynamicCache)"), stock_main)

        # ---------------- plugin path ------------------------------------------------------------
        T.apply_to_model(model)
        say("plugin: rollout replay (paged KV)")
        store = _alloc_store(lens, V, dt, sdev)
        rollout_ok = [False]

        def rollout(c):
            plugin_rollout_logits(model, prompts, responses, dev, store, page_size=page_size, seed=seed,
                                  chunk=prefill_chunk, greedy=greedy, max_tokens=max_tokens_per_forward)
            rollout_ok[0] = True

        c_main = Check("plugin", "full-seq (packed) vs prefill+decode (paged KV)")
        try:
            rollout(c_main)
        except Exception as e:
            c_main.error = f"rollout: {type(e).__name__}: {e}"[:500]
        seqs = [torch.cat([p, r]) for p, r in zip(prompts, responses)]
        kept: dict[int, Any] = {}
        if rollout_ok[0]:
            say("plugin: full-sequence forward (packed)")
            try:
                for grp in packed_groups(lens, max_tokens_per_forward):
                    outs = hf_packed_logits(model, [seqs[i] for i in grp], dev)
                    for i, full in zip(grp, outs):
                        lab = _labels(seqs[i], dev)
                        c_main.add(full, store[i], _plugin_logp(full[:-1], lab, temperature),
                                   _plugin_logp(store[i][:-1].to(dev), lab, temperature))
                        if i < max(n_single, min(B, 3)):
                            kept[i] = full.clone()
                    del outs
            except Exception as e:
                c_main.error = f"full-seq: {type(e).__name__}: {e}"[:500]
        checks.append(c_main)

        if n_single and rollout_ok[0]:
            say("plugin: single-sequence rollouts")

            def batched_vs_single(c):
                for i in range(n_single):
                    one = {i: torch.empty(lens[i], V, dtype=dt, device=sdev)}
                    single_store = [one.get(j) for j in range(B)]
                    plugin_rollout_logits(model, prompts, responses, dev, single_store, page_size=page_size,
                                          seed=seed + 17 + i, chunk=prefill_chunk, rows=[i])
                    lab = _labels(seqs[i], dev)
                    c.add(store[i].to(dev), one[i].to(dev), _plugin_logp(store[i][:-1].to(dev), lab, temperature),
                          _plugin_logp(one[i][:-1].to(dev), lab, temperature))

            guarded(Check("plugin", "batched vs single decode"), batched_vs_single)

            def packed_vs_separate(c):
                for i in range(n_single):
                    full = model(input_ids=seqs[i][None].to(dev), use_cache=False).logits[0]
                    lab = _labels(seqs[i], dev)
                    c.add(kept[i], full, _plugin_logp(kept[i][:-1], lab, temperature),
                          _plugin_logp(full[:-1], lab, temperature))

            guarded(Check("plugin", "packed vs separate full-seq"), packed_vs_separate)

        if rollout_ok[0] and B > 1:
            def padded_vs_packed(c):
                idx = list(range(min(B, 3)))
                outs = hf_padded_logits(model, [seqs[i] for i in idx], dev)
                for i, o in zip(idx, outs):
                    c.add(kept[i], o)

            guarded(Check("plugin", "padded batch vs packed full-seq"), padded_vs_packed)

    if rollout_ok[0]:
        def train_vs_eval(c):
            idx = list(range(max(1, n_single)))
            with torch.enable_grad():
                model.train()
                try:
                    outs = hf_packed_logits(model, [seqs[i] for i in idx], dev)
                finally:
                    model.eval()
                outs = [o.detach() for o in outs]
            for i, o in zip(idx, outs):
                c.add(kept[i], o)

        guarded(Check("plugin", "training forward (autograd) vs no-grad"), train_vs_eval)
    T.revert(model)

    impl = loader.get_implementation()
    from areal_tik_plugin import evidence

    plugin_ok = all(c.bit_identical for c in checks if c.path == "plugin")
    return {
        "schema": "areal-tik-verify/1",
        "model": model_name,
        "config": {k: getattr(cfg, k, None) for k in ("model_type", "num_hidden_layers", "hidden_size",
                                                       "num_attention_heads", "num_key_value_heads", "head_dim",
                                                       "vocab_size", "num_experts", "num_experts_per_tok")},
        "device": str(dev), "dtype": str(dt).replace("torch.", ""), "batch": B,
        "prompt_lens": [int(p.numel()) for p in prompts], "response_lens": [int(r.numel()) for r in responses],
        "page_size": page_size, "prefill_chunk": prefill_chunk, "greedy": greedy, "temperature": temperature,
        "stock_attn": stock_attn, "seed": seed,
        "implementation": {"name": impl.name, "source_hash": impl.source_hash},
        "env": evidence.environment(),
        "checks": [c.to_json() for c in checks],
        "plugin_bit_identical": plugin_ok,
        "seconds": round(time.time() - t0, 2),
    }


def format_table(rep: dict[str, Any]) -> str:
    lines = [f"tik verify: {rep['model']} ({rep['config']['model_type']}, {rep['config']['num_hidden_layers']} layers) "
             f"on {rep['device']} {rep['dtype']}, batch {rep['batch']}, prompt {_rng(rep['prompt_lens'])}, "
             f"response {_rng(rep['response_lens'])}, page size {rep['page_size']}",
             f"{'path':<7} {'check':<52} {'rows':>7} {'bit-identical':>14} {'max|Δlogit|':>12} {'max|Δlogp|':>11}"]
    for c in rep["checks"]:
        share = f"{100 * c['share_identical']:.1f}%"
        lines.append(f"{c['path']:<7} {c['check']:<52} {c['rows']:>7} {share:>14} {c['max_abs_dlogit']:>12.3g} "
                     f"{c['max_abs_dlogp']:>11.3g}" + ("" if c["finite"] else "  NON-FINITE"))
        if c.get("error"):
            lines.append(f"        ERROR {c['error']}")
    verdict = "PASS: the plugin path is bit-identical" if rep["plugin_bit_identical"] else \
        "FAIL: the plugin path is NOT bit-identical"
    lines.append(f"{verdict} ({rep['seconds']} s; kernels {rep['implementation']['name']} "
                 f"{rep['implementation']['source_hash'][:12]})")
    return "\n".join(lines)


def _rng(xs):
    return str(xs[0]) if min(xs) == max(xs) else f"{min(xs)}..{max(xs)}"


# ------------------------------------------------------------------------------------------------
# CLI
# ------------------------------------------------------------------------------------------------
def _cmd_verify(args) -> int:
    if getattr(args, "engine", "hf") == "megatron":
        return _cmd_verify_megatron(args)
    from areal_tik_plugin.runtime import loader

    prev = os.environ.get("TIK_IMPLEMENTATION")
    try:
        if args.implementation:  # e.g. a `tik search export`: its evidence is checked on load
            path = loader.resolve_path(args.implementation)
            loader.set_implementation(path)
            os.environ["TIK_IMPLEMENTATION"] = path
        rep = run_verify(args.model, layers=args.layers, batch=args.batch, prompt_len=args.prompt_len,
                         response_len=args.response_len, prompt_file=args.prompt_file, device=args.device,
                         dtype=args.dtype, seed=args.seed, page_size=args.page_size, single=args.single,
                         prefill_chunk=args.prefill_chunk, greedy=args.greedy, temperature=args.temperature,
                         stock=not args.no_stock, stock_attn=args.stock_attn,
                         max_tokens_per_forward=args.max_tokens_per_forward,
                         progress=None if args.json else (lambda m: print(f"... {m}", file=sys.stderr, flush=True)))
    except (ValueError, NotImplementedError, RuntimeError) as e:
        print(f"tik verify: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    finally:
        if args.implementation:  # the command's choice does not outlive it (in-process callers, tests)
            if prev is None:
                os.environ.pop("TIK_IMPLEMENTATION", None)
            else:
                os.environ["TIK_IMPLEMENTATION"] = prev
            loader.set_implementation(None)
    _emit(args, rep, format_table)
    return 0 if rep["plugin_bit_identical"] else 1


def _emit(args, rep: dict, fmt) -> None:
    """Write the report to ``--out`` and print it (JSON with ``--json``, else ``fmt(rep)``)."""
    text = json.dumps(rep, indent=1)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)) or ".", exist_ok=True)
        with open(args.out, "w") as f:
            f.write(text)
    print(text if args.json else fmt(rep))


def _cmd_verify_megatron(args) -> int:
    # the Megatron runner lives with its integration; this is only the CLI hook
    from areal_tik_plugin.runtime import interp as _interp

    _interp.ensure_interpreter_if_no_gpu()
    try:
        from areal_tik_plugin.integrations.megatron import verify as MV

        rep = MV.run_verify_megatron(sys.modules[__name__], args.model, layers=args.layers, batch=args.batch,
                                     prompt_len=args.prompt_len, response_len=args.response_len,
                                     page_size=args.page_size, seed=args.seed, device=args.device,
                                     single=args.single, max_tokens_per_forward=args.max_tokens_per_forward)
    except ImportError as e:
        print(f"tik verify --engine megatron: needs megatron-core (pip install 'areal-tik-plugin[megatron]'): {e}",
              file=sys.stderr)
        return 2
    except (ValueError, NotImplementedError, RuntimeError) as e:
        print(f"tik verify: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    _emit(args, rep, MV.format_report)
    return 0 if rep["bit_identical"] else 1


def register(sub) -> None:
    p = sub.add_parser("verify", help="prove Constraint (1) for a model: full-sequence update forward == "
                                      "prefill + decode, bit for bit, at every position",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--implementation", default=None,
                   help="kernels to verify: a name under kernels/ or a folder (e.g. from `tik search export`)")
    p.add_argument("--engine", default="hf", choices=["hf", "megatron"],
                   help="policy-update forward: the patched HF model (FSDP engine) or megatron-core with the "
                        "plugin spec (Megatron engine)")
    p.add_argument("--model", default="tiny-qwen3",
                   help=f"built-in config ({', '.join(BUILTIN_MODELS)}) or a local HF checkpoint folder")
    p.add_argument("--layers", type=int, default=None, help="override the number of layers")
    p.add_argument("--batch", type=int, default=3)
    p.add_argument("--prompt-len", default="11..17", help="N or A..B (spread over the batch)")
    p.add_argument("--response-len", default="5..9", help="N or A..B (spread over the batch)")
    p.add_argument("--prompt-file", default=None,
                   help="one prompt per line: token ids (integers) or text (needs a checkpoint's tokenizer)")
    p.add_argument("--device", default=None, help="cuda / cpu (default: cuda when available)")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--single", type=int, default=1, help="sequences also replayed alone / forwarded separately")
    p.add_argument("--prefill-chunk", type=int, default=0, help="chunked prefill size (0: whole prompt)")
    p.add_argument("--greedy", action="store_true", help="responses = greedy rollout of the plugin runner")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--stock-attn", default="sdpa", choices=["sdpa", "eager"])
    p.add_argument("--no-stock", action="store_true", help="skip the stock-path comparison")
    p.add_argument("--max-tokens-per-forward", type=int, default=32768,
                   help="tokens per packed forward / prefill call / stock prefill batch (bounds logits memory)")
    p.add_argument("--json", action="store_true", help="print the JSON report instead of the table")
    p.add_argument("--out", default=None, help="also write the JSON report to this file")
    p.set_defaults(func=_cmd_verify)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="tik")
    register(ap.add_subparsers(dest="command"))
    args = ap.parse_args(["verify", *(sys.argv[1:] if argv is None else argv)])
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
