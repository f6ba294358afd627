"""Train-step time with vs without the recompute forward, on AReaL's own FSDP engine, no SGLang.

Drives AReaL 1.0.4's ``FSDPPPOActor`` directly on synthetic rollout batches (GSM8K-like shapes:
prompt 256 + response 1024 tokens by default) for a randomly initialised model of a given shape
(default: Qwen2.5-1.5B's config), and times per step

  recompute  = actor.compute_logp (the forward the plugin removes)
  advantages = actor.compute_advantages
  update     = actor.ppo_update (forward + backward + optimizer, packed micro-batches)

so that ``step_with = recompute + advantages + update`` and ``step_without = advantages + update``.
``--tik`` patches the policy model and AReaL's log-prob helpers with the plugin first (as
``areal_tik_plugin.run`` does in every worker). Needs only AReaL's wheel (+ light deps) and
torch; one or more GPUs:

    torchrun --nproc-per-node 1 recipes/bench_recompute.py --out bench.json [--tik] [--batch 64]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

QWEN25_15B = dict(model_type="qwen2", vocab_size=151936, hidden_size=1536, intermediate_size=8960,
                  num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                  max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6,
                  tie_word_embeddings=True)


def make_model(path: str, shape: dict, layers: int | None) -> str:
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    from areal_tik_plugin.models import build_tokenizer

    if os.path.exists(os.path.join(path, "config.json")):
        return path
    os.makedirs(path, exist_ok=True)
    build_tokenizer(path)
    kw = {k: v for k, v in shape.items() if k != "model_type"}
    if layers:
        kw["num_hidden_layers"] = layers
    cfg = Qwen2Config(**kw, torch_dtype="bfloat16")
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.save_pretrained(path)
    return path


def synthetic_batch(n: int, prompt: int, response: int, vocab: int, seed: int):
    import torch

    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        r = response - int(torch.randint(0, response // 4, (1,), generator=g))  # ragged, like real rollouts
        L = prompt + r
        lp = torch.zeros(L)
        lp[prompt:] = -torch.rand(r, generator=g) * 4
        mask = torch.zeros(L, dtype=torch.int32)
        mask[prompt:] = 1
        out.append({
            "input_ids": torch.randint(0, vocab, (1, L), generator=g, dtype=torch.int32),
            "loss_mask": mask[None], "logprobs": lp[None], "versions": torch.zeros(1, L, dtype=torch.int32),
            "attention_mask": torch.ones(1, L, dtype=torch.bool),
            "rewards": torch.tensor([float(i % 2)]),
        })
    return out


def check_bits(actor, path: str, a, vocab: int) -> dict:
    """AReaL's FSDP actor (``compute_logp``: FSDP2 mixed precision, AReaL's packing/padding, the patched
    model and gather_logprobs) vs the plugin-patched plain HF model's packed forward on the same
    sequences: the training side of the contract on its own, no SGLang. AReaL's ``compute_logp`` puts
    the log-prob of token t+1 at position t; both alignments are reported."""
    import torch

    from areal_tik_plugin.integrations.sglang.check import training_logprobs

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    data = synthetic_batch(a.check_bits, a.prompt, a.response, vocab, seed=4242)
    if dev == "cuda":
        data = [{k: v.cuda() for k, v in d.items()} for d in data]
    got = actor.compute_logp(data)
    reqs = []
    for d in data:
        ids = d["input_ids"][0].tolist()
        reqs.append((ids[:a.prompt], ids[a.prompt:], 1.0))
    ref = training_logprobs(path, reqs, device=dev, max_tokens_per_forward=a.max_tokens_per_mb)
    out = {"sequences": len(reqs), "tokens": sum(len(r) for _, r, _ in reqs)}
    for name, off in (("shifted", a.prompt - 1), ("aligned", a.prompt)):
        n_diff, max_abs = 0, 0.0
        for g, r, (_, resp, _) in zip(got, ref, reqs):
            g = g.reshape(-1)[off:off + len(resp)].float().cpu()
            n = min(len(g), len(r))
            d = (g[:n] - r[:n]).abs()
            n_diff += int((g[:n].view(torch.int32) != r[:n].view(torch.int32)).sum()) + (len(r) - n)
            max_abs = max(max_abs, float(d.max()) if n else float("inf"))
        out[name] = {"mismatched_tokens": n_diff, "max_abs_diff": max_abs}
    print("check_bits (AReaL FSDP actor vs plain patched HF):", json.dumps(out), flush=True)
    if a.bisect or (out["shifted"]["mismatched_tokens"] and out["aligned"]["mismatched_tokens"]):
        out["bisect"] = bisect_modules(actor, path, data[0]["input_ids"][0].cpu(), dev)
        print("check_bits bisect:", json.dumps(out["bisect"]), flush=True)
    return out


def _plain_name(name: str) -> str:
    for w in ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod.", "base_model.model."):
        name = name.replace(w, "")
    return name


def _bits_equal(a, b) -> bool:
    import torch

    from areal_tik_plugin.contract.suite import bits

    return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(bits(a), bits(b)))


def bisect_modules(actor, path: str, seq, dev: str) -> dict:
    """Where the actor's model and the plain patched HF model part, on one packed sequence: parameters
    (bf16 view of the actor's, gathered when sharded), the RoPE buffer, then every module's output in
    execution order (first differing module, per-layer max |delta|), and the logits of the same packed
    forward through both (if those agree, the difference is in how AReaL prepares inputs or reads logits)."""
    import torch
    from transformers import AutoModelForCausalLM

    from areal_tik_plugin.integrations.transformers import apply_to_model, canonical_inv_freq
    from areal_tik_plugin.verify import hf_packed_logits

    mine = getattr(actor, "model", None)
    if mine is None:
        return {"error": "the actor has no .model"}
    ref = apply_to_model(AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).to(dev))
    res = {}
    ref_params = {_plain_name(n): p for n, p in ref.named_parameters()}
    bad, dtypes = [], set()
    for n, p in mine.named_parameters():
        t = p.full_tensor() if hasattr(p, "full_tensor") else p
        dtypes.add(str(t.dtype))
        r = ref_params.get(_plain_name(n))
        if r is None or not _bits_equal(t.detach().to(torch.bfloat16), r.detach()):
            bad.append(_plain_name(n))
    res["actor_param_dtypes"] = sorted(dtypes)
    res["params_differing"] = bad[:8]
    res["params_differing_count"] = len(bad)
    rot = [m for n, m in mine.named_modules() if n.endswith("rotary_emb")]
    if rot and hasattr(rot[0], "inv_freq"):
        buf = rot[0].inv_freq.detach().float().cpu()
        canon = canonical_inv_freq(rot[0]).float().cpu()
        res["rope_buffer_equals_cpu_formula"] = _bits_equal(buf, canon)
        res["rope_buffer_max_rel_diff"] = float(((buf - canon).abs() / canon.abs()).max())

    def run(model):
        names, outs, hooks = [], [], []
        for n, m in model.named_modules():
            if n == "":
                continue

            def hook(mod, args, o, n=_plain_name(n)):
                t = o[0] if isinstance(o, (tuple, list)) else getattr(o, "logits", o)
                if torch.is_tensor(t):
                    names.append(n)
                    outs.append(t.detach().float().cpu())
            hooks.append(m.register_forward_hook(hook))
        try:
            with torch.no_grad():
                logits = hf_packed_logits(model, [seq], dev)[0].detach().float().cpu()
        finally:
            for h in hooks:
                h.remove()
        return dict(zip(names, outs)), names, logits

    was_training = mine.training
    mine.eval()
    try:
        a_out, a_names, a_logits = run(mine)
    finally:
        mine.train(was_training)
    r_out, _, r_logits = run(ref)
    res["packed_logits_equal"] = _bits_equal(a_logits, r_logits)
    res["packed_logits_max_abs_diff"] = float((a_logits - r_logits).abs().max())
    first, layers = None, {}
    for n in a_names:
        r = r_out.get(n)
        if r is None or r.shape != a_out[n].shape:
            continue
        d = float((a_out[n] - r).abs().max())
        if d and first is None:
            first = {"module": n, "max_abs_diff": d}
        parts = n.split(".")
        if len(parts) >= 3 and parts[-2] == "layers" and parts[-1].isdigit():
            layers[int(parts[-1])] = d
    res["first_differing_module"] = first
    res["layer_output_max_abs_diff"] = [layers[k] for k in sorted(layers)]
    del ref
    return res


def _lean_trainer_package() -> None:
    """``FSDPPPOActor`` imports ``areal.trainer.ppo.actor``; the ``areal.trainer`` package's own
    ``__init__`` imports every trainer (datasets, wandb, tensorboardX, ... none used here). Where those
    are not installed (the GPU machine: AReaL's wheel is carried without them), register the package
    without running its ``__init__`` so that only the PPO actor's modules load."""
    import importlib.util
    import types

    if "areal.trainer" in sys.modules or importlib.util.find_spec("datasets") is not None:
        return
    spec = importlib.util.find_spec("areal")
    pkg = types.ModuleType("areal.trainer")
    pkg.__path__ = [os.path.join(os.path.dirname(spec.origin), "trainer")]
    sys.modules["areal.trainer"] = pkg


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", default=os.path.join(tempfile.gettempdir(), "tik-qwen2.5-1.5b-shape"))
    ap.add_argument("--layers", type=int, default=None, help="override the layer count (smoke tests)")
    ap.add_argument("--batch", type=int, default=64, help="sequences per step (AReaL example: 256 x 4 / DP)")
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--response", type=int, default=1024)
    ap.add_argument("--max-tokens-per-mb", type=int, default=10240)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--tik", action="store_true", help="patch the model and log-prob helpers with the plugin")
    ap.add_argument("--attn-impl", default="sdpa")
    ap.add_argument("--out", default=None)
    ap.add_argument("--check-bits", type=int, default=0, metavar="N",
                    help="first compare, bit for bit, the actor's compute_logp on N synthetic sequences with the "
                         "plugin-patched plain HF model's packed forward (sglang_check.training_logprobs); needs --tik")
    ap.add_argument("--bisect", action="store_true",
                    help="with --check-bits: always locate where the two models part (it runs by itself on a mismatch)")
    a = ap.parse_args(argv)
    if a.check_bits and not a.tik:
        ap.error("--check-bits compares the plugin's training paths: add --tik")

    import torch
    import torch.distributed as dist
    from areal.api import FinetuneSpec
    from areal.api.alloc_mode import ModelAllocation
    from areal.api.cli_args import MicroBatchSpec, OptimizerConfig, PPOActorConfig

    rank = int(os.environ.get("RANK", "0"))
    path = make_model(a.model_dir, QWEN25_15B, a.layers) if rank == 0 else a.model_dir
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        dist.barrier()
    if a.tik:
        from areal_tik_plugin.integrations.areal.config import TikConfig
        from areal_tik_plugin.integrations.areal.hooks import install_worker

        install_worker(TikConfig(enable=True, monitor_every=0))
    _lean_trainer_package()
    from areal.engine.fsdp_engine import FSDPPPOActor

    world = int(os.environ.get("WORLD_SIZE", "1"))
    cfg = PPOActorConfig(experiment_name="bench", trial_name="recompute", path=path, dtype="bfloat16",
                         attn_impl=a.attn_impl, gradient_checkpointing=True,
                         mb_spec=MicroBatchSpec(max_tokens_per_mb=a.max_tokens_per_mb),
                         optimizer=OptimizerConfig(lr=1.7e-5), recompute_logprob=True, use_decoupled_loss=False,
                         temperature=1.0, eps_clip=0.4, ppo_n_minibatches=1, kl_ctl=0.0)
    actor = FSDPPPOActor(config=cfg)
    actor.create_process_group(parallel_strategy=ModelAllocation.from_str(f"fsdp:d{world}", name="actor").parallel)
    actor.initialize(addr=None, ft_spec=FinetuneSpec(total_train_epochs=1, dataset_size=10**6, train_batch_size=a.batch))

    def sync():
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    with open(os.path.join(path, "config.json")) as f:
        vocab = int(json.load(f)["vocab_size"])
    check = check_bits(actor, path, a, vocab) if a.check_bits and rank == 0 else None

    rows = []
    for step in range(a.warmup + a.steps):
        data = synthetic_batch(a.batch // world, a.prompt, a.response, vocab, seed=step * 997 + rank)
        if torch.cuda.is_available():  # rollout batches reach the actor on its device (compute_logp's output is there)
            data = [{k: v.cuda() for k, v in d.items()} for d in data]
        sync()
        t0 = time.perf_counter()
        prox = actor.compute_logp(data)
        sync()
        t1 = time.perf_counter()
        for traj, lp in zip(data, prox):
            traj["prox_logp"] = lp
        adv = actor.compute_advantages(data)
        sync()
        t2 = time.perf_counter()
        actor.ppo_update(adv)
        actor.step_lr_scheduler()
        sync()
        t3 = time.perf_counter()
        if step >= a.warmup:
            rows.append({"recompute_s": t1 - t0, "advantages_s": t2 - t1, "update_s": t3 - t2,
                         "tokens": int(sum(int(d["attention_mask"].sum()) for d in data))})
    mean = {k: sum(r[k] for r in rows) / len(rows) for k in rows[0]}
    mean["step_with_recompute_s"] = mean["recompute_s"] + mean["advantages_s"] + mean["update_s"]
    mean["step_without_recompute_s"] = mean["advantages_s"] + mean["update_s"]
    mean["saving_fraction"] = mean["recompute_s"] / mean["step_with_recompute_s"]
    res = {"args": vars(a), "world_size": world, "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
           "torch": torch.__version__, "per_step": rows, "mean": mean, "check_bits": check}
    if rank == 0:
        print(json.dumps(res["mean"], indent=2))
        if a.out:
            with open(a.out, "w") as f:
                json.dump(res, f, indent=2)
    actor.destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main())
