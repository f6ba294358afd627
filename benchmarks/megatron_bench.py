"""Megatron forward+backward time: the plugin's spec vs megatron-core's own local (TE-free) spec, same
model shape, same process (issue 32 step 5b)::

    python -m benchmarks.megatron_bench --out DIR [--model qwen3-4b --layers 8 --micro-batch 4 --seq-len 2048]

One step = a forward + backward of one micro-batch of ``--micro-batch`` sequences x ``--seq-len`` tokens
(random token ids, random weights) with a fixed random output gradient on the logits (no loss
computation: every variant does the same work after the output layer). Timed with a device
synchronize around each step; ``--warmup`` steps first (the plugin's Triton compile lands there),
then the median of ``--steps``; tokens/s = micro-batch tokens / median. Variants (``--specs``):

* ``tik`` -- the plugin's spec (:mod:`areal_tik_plugin.integrations.megatron.spec`), ``[s, b]`` input;
* ``tik-thd`` -- the same model with the micro-batch packed THD (``[t, 1]`` + ``PackedSeqParams``), the
  layout AReaL's Megatron engine feeds;
* ``local`` -- ``gpt_layer_specs.get_gpt_layer_local_spec(qk_layernorm=True, normalization="RMSNorm")``
  on the same TransformerConfig: Megatron's ColumnParallel/RowParallel linears, its torch-norm wrapper
  (no apex), DotProductAttention with the unfused softmax (``masked_softmax_fusion=False``; the local
  core attention takes no THD), unfused RoPE and bias-dropout-add (``apply_rope_fusion=False``,
  ``bias_dropout_fusion=False``), no gradient-accumulation fusion -- the options that run without
  TransformerEngine or apex, recorded in the JSON;
* ``hf`` -- the unpatched Hugging Face model with SDPA attention (the FSDP engine's stock forward).

``--layers`` cuts the model depth (the per-layer shapes stay the 4B model's); the JSON records it. With
``--deadline-s`` a variant that would start past the deadline is recorded as skipped, and the JSON is
rewritten after every variant, so a cut run keeps what it measured.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time

SPECS = ("tik", "tik-thd", "local", "hf")
LOCAL_OPTIONS = {"masked_softmax_fusion": False, "bias_dropout_fusion": False, "apply_rope_fusion": False,
                 "gradient_accumulation_fusion": False, "persist_layer_norm": False, "transformer_impl": "local"}


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.megatron_bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="folder for megatron_bench.json")
    ap.add_argument("--summary", metavar="DIR", help="only print the short table of DIR/megatron-verify.json "
                    "(tik verify --engine megatron) and DIR/megatron_bench.json, whichever exist")
    ap.add_argument("--model", default="qwen3-4b", help="a built-in config of areal_tik_plugin.models")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--specs", default=",".join(SPECS), help=f"comma list from {SPECS}")
    ap.add_argument("--device", default=None, help="cuda / cpu (default: cuda when available)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--deadline-s", type=float, default=None, help="seconds from start; later variants are skipped")
    return ap


def _sync(dev):
    import torch

    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _local_model(hf_cfg, dtype):
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel

    from areal_tik_plugin.integrations.megatron import convert as C

    cfg = C.mcore_config(hf_cfg, dtype=dtype)
    for k, v in LOCAL_OPTIONS.items():
        if k != "transformer_impl" and getattr(cfg, k) != v:
            raise ValueError(f"local spec: TransformerConfig.{k}={getattr(cfg, k)!r}, expected {v!r} (no TE/apex)")
    spec = get_gpt_layer_local_spec(qk_layernorm=cfg.qk_layernorm, normalization="RMSNorm")
    return GPTModel(config=cfg, transformer_layer_spec=spec, vocab_size=hf_cfg.vocab_size,
                    max_sequence_length=hf_cfg.max_position_embeddings, pre_process=True, post_process=True,
                    share_embeddings_and_output_weights=bool(getattr(hf_cfg, "tie_word_embeddings", False)),
                    position_embedding_type="rope", rotary_base=C._rope_theta(hf_cfg))


def build(spec: str, model_name: str, layers: int, dev, seed: int):
    """(model, forward(ids [b, s]) -> logits) for one variant, in training mode."""
    import torch

    from areal_tik_plugin import verify as V
    from areal_tik_plugin.integrations.megatron import convert as C
    from areal_tik_plugin.integrations.megatron.verify import ensure_model_parallel, packed_params

    torch.manual_seed(seed)
    if spec == "hf":
        model = V.build_model(model_name, layers=layers, device=dev, seed=seed, attn_implementation="sdpa").train()
        return model, lambda ids: model(input_ids=ids, use_cache=False).logits
    ensure_model_parallel(seed=seed)
    hf_cfg = V._hf_config(model_name, layers)[0]
    model = C.build_model(hf_cfg) if spec in ("tik", "tik-thd") else _local_model(hf_cfg, torch.bfloat16)
    model = model.to(dev).train()

    def fwd(ids):
        b, s = ids.shape
        pos = torch.arange(s, device=dev)[None].expand(b, s)
        if spec != "tik-thd":
            return model(ids, pos, None)
        out = model(ids.reshape(1, -1), pos.reshape(1, -1), None, packed_seq_params=packed_params([s] * b, dev))
        return out.view(b, s, -1)

    return model, fwd


def time_variant(spec: str, a, dev) -> dict:
    import torch

    rec: dict = {"spec": spec}
    t = time.time()
    model, fwd = build(spec, a.model, a.layers, dev, a.seed)
    rec["build_s"] = round(time.time() - t, 2)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    g = torch.Generator().manual_seed(a.seed + 1)
    vocab = model.config.vocab_size if spec == "hf" else model.vocab_size
    ids = torch.randint(0, vocab, (a.micro_batch, a.seq_len), generator=g).to(dev)
    grad = None
    times = []
    params = [p for p in model.parameters() if p.requires_grad]
    for i in range(a.warmup + a.steps):
        for p in params:
            p.grad = None
        _sync(dev)
        t = time.perf_counter()
        out = fwd(ids)
        if grad is None:  # one fixed output gradient for every step and variant shape
            # drawn on the device in the logits' dtype: [b, s, vocab] in fp32 on the host is ~5 GB and seconds
            gen = torch.Generator(device=dev).manual_seed(a.seed + 2)
            grad = torch.randn(out.shape, generator=gen, device=dev, dtype=out.dtype)
        out.backward(grad)
        _sync(dev)
        times.append(time.perf_counter() - t)
        if i == 0:
            rec["logits_dtype"] = str(out.dtype).replace("torch.", "")
            rec["finite"] = bool(torch.isfinite(out.detach()).all())
        del out
    meas = times[a.warmup:]
    rec.update(first_step_s=round(times[0], 4), times_s=[round(x, 5) for x in meas],
               median_s=statistics.median(meas), tokens_per_s=a.micro_batch * a.seq_len / statistics.median(meas),
               grads=sum(p.grad is not None for p in params), params=len(params),
               n_params=sum(p.numel() for p in params))
    if dev.type == "cuda":
        rec["peak_mem_gib"] = round(torch.cuda.max_memory_allocated(dev) / 2**30, 2)
    del model, fwd, params, grad, ids
    gc.collect()  # megatron-core modules hold reference cycles: free this variant before the next is built
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return rec


def run(a) -> dict:
    from areal_tik_plugin.runtime import interp as _interp

    _interp.ensure_interpreter_if_no_gpu()
    import torch

    from areal_tik_plugin.integrations.megatron.verify import versions

    t0 = time.time()
    specs = [s for s in a.specs.split(",") if s]
    bad = [s for s in specs if s not in SPECS]
    if bad or not specs:
        raise ValueError(f"--specs: expected a comma list from {SPECS}, got {a.specs!r}")
    for k in ("layers", "micro_batch", "seq_len", "steps"):
        if getattr(a, k) < 1:
            raise ValueError(f"--{k.replace('_', '-')}: expected >= 1, got {getattr(a, k)}")
    if a.warmup < 0:
        raise ValueError(f"--warmup: expected >= 0, got {a.warmup}")
    dev = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    rep = {"schema": "areal-tik-megatron-bench/1", "model": a.model, "layers": a.layers, "micro_batch": a.micro_batch,
           "seq_len": a.seq_len, "tokens_per_step": a.micro_batch * a.seq_len, "steps": a.steps, "warmup": a.warmup,
           "dtype": "bfloat16", "device": str(dev), "step": "forward + backward (fixed random dlogits)",
           "local_spec_options": LOCAL_OPTIONS, "versions": versions(), "variants": {}}
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, "megatron_bench.json")
    for spec in specs:
        left = None if a.deadline_s is None else a.deadline_s - (time.time() - t0)
        if left is not None and left <= 0:
            rep["variants"][spec] = {"spec": spec, "skipped": f"--deadline-s {a.deadline_s} reached"}
        else:
            try:
                rep["variants"][spec] = time_variant(spec, a, dev)
            except Exception as e:  # noqa: BLE001 -- a variant that fails is recorded, the others still run
                rep["variants"][spec] = {"spec": spec, "error": f"{type(e).__name__}: {e}"[:800]}
            if "error" in rep["variants"][spec]:  # out of the except block: its traceback held the model
                gc.collect()
                if dev.type == "cuda":
                    torch.cuda.empty_cache()
        rep["seconds"] = round(time.time() - t0, 2)
        with open(path, "w") as f:
            json.dump(rep, f, indent=1)
    return rep


def format_table(rep: dict) -> str:
    v = rep["variants"]
    base = v.get("tik", {}).get("median_s")  # '÷ tik': the variant's tokens/s over the plugin spec's
    lines = [f"megatron fwd+bwd: {rep['model']} x {rep['layers']} layers, micro-batch {rep['micro_batch']} x "
             f"{rep['seq_len']} tokens on {rep['device']} (median of {rep['steps']} after {rep['warmup']} warm-up)",
             f"{'variant':<8} {'median s':>9} {'tokens/s':>10} {'÷ tik':>7} {'peak GiB':>9} {'first s':>8}"]
    for name, r in v.items():
        if "median_s" not in r:
            lines.append(f"{name:<8} {r.get('error') or r.get('skipped')}")
            continue
        ratio = f"{base / r['median_s']:.2f}" if base else "-"
        lines.append(f"{name:<8} {r['median_s']:>9.4f} {r['tokens_per_s']:>10.0f} {ratio:>7} "
                     f"{r.get('peak_mem_gib', '-'):>9} {r['first_step_s']:>8.2f}")
    return "\n".join(lines)


def summary(d: str) -> str:
    """The device step's last table: the verify checks and the bench variants found in ``d``."""
    lines = []
    p = os.path.join(d, "megatron-verify.json")
    if os.path.exists(p):
        r = json.load(open(p))
        v = r.get("versions", {})
        lines.append(f"tik verify --engine megatron: {r['model']} x {r['layers']} layers, batch {r['batch']}, "
                     f"{sum(r['prompt_lens']) + sum(r['response_lens'])} tokens, megatron-core "
                     f"{v.get('megatron-core')}, {r['seconds']} s: {'BIT-IDENTICAL' if r['bit_identical'] else 'DIFFERS'}")
        for c in r["checks"]:
            lines.append(f"  {c['check']:<28} {c['identical_rows']:>7}/{c['rows']:<7} max|dlogit| {c['max_abs_dlogit']:.3g}"
                         + (f"  ERROR {c['error'][:200]}" if c.get("error") else ""))
    else:
        lines.append(f"tik verify --engine megatron: no {p}")
    p = os.path.join(d, "megatron_bench.json")
    lines.append(format_table(json.load(open(p))) if os.path.exists(p) else f"megatron bench: no {p}")
    return "\n".join(lines)


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    if a.summary:
        print(summary(a.summary))
        return 0
    if not a.out:
        print("megatron_bench: --out DIR is required (or --summary DIR)", file=sys.stderr)
        return 2
    try:
        rep = run(a)
    except ValueError as e:
        print(f"megatron_bench: {e}", file=sys.stderr)
        return 2
    print(format_table(rep))
    ok = all("median_s" in r for r in rep["variants"].values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
