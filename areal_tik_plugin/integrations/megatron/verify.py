"""``tik verify --engine megatron``: Constraint (1) for a whole model built through megatron-core.

For a model (built-in config with random weights, or a local HF checkpoint) and a batch of prompt +
response sequences it builds the megatron-core GPTModel with the plugin's spec, loads the HF
weights into it (exact conversion), and compares bit for bit

* ``megatron-vs-rollout``: the **Megatron full-sequence forward** M_upd(p‖y) (THD-packed, as AReaL's
  Megatron engine runs it) vs the **rollout** M_pre(p) ‖ M_dec(y|p): prefill + paged decode replayed
  by ``areal_tik_plugin.verify.PagedRunner`` on the weights converted back from Megatron to HF
  (what AReaL hands to SGLang after a Megatron update);
* ``megatron-vs-hf``: Megatron vs the plugin-patched HF forward (packed, AReaL's FSDP layout);
* ``megatron-packed-vs-separate``: the packed Megatron forward vs one sequence per call;
* ``megatron-train-vs-eval``: the training forward (autograd on) vs the no-grad forward.

One process (gloo on CPU, NCCL on a GPU) with tensor/pipeline/context parallel 1; the parallel
layouts are covered by the tests (pipeline 2, expert parallel 2).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any


def ensure_model_parallel(pp: int = 1, ep: int = 1, seed: int = 0) -> None:
    """torch.distributed (one process when not launched by torchrun) + megatron-core parallel state."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        if "MASTER_PORT" not in os.environ:
            import socket

            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                os.environ["MASTER_PORT"] = str(s.getsockname()[1])
        rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo", rank=rank, world_size=world)
    if ps.model_parallel_is_initialized():
        if ps.get_pipeline_model_parallel_world_size() != pp or ps.get_expert_model_parallel_world_size() != ep:
            raise RuntimeError(f"megatron-core parallel state already initialized with pp="
                               f"{ps.get_pipeline_model_parallel_world_size()}, ep={ps.get_expert_model_parallel_world_size()}")
        return
    ps.initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=pp,
                                 expert_model_parallel_size=ep)
    if torch.cuda.is_available():
        # on a GPU megatron-core initializes its own weights (embedding, local-spec linears) under the
        # tensor-parallel RNG tracker, which exists only once seeded
        from megatron.core import tensor_parallel

        tensor_parallel.model_parallel_cuda_manual_seed(seed)


def packed_params(lengths: list[int], device):
    import torch
    from megatron.core.packed_seq_params import PackedSeqParams

    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32, device=device)
    cu[1:] = torch.cumsum(torch.tensor(lengths, device=device), 0)
    mx = max(lengths)
    return PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, cu_seqlens_q_padded=cu,
                           cu_seqlens_kv_padded=cu, max_seqlen_q=mx, max_seqlen_kv=mx)


def megatron_packed_logits(model, seqs: list, device) -> list:
    """Megatron forward of ``seqs`` packed THD into ``[1, total]`` (AReaL's Megatron layout) ->
    logits [n_i, V] per sequence."""
    import torch

    n = [int(s.numel()) for s in seqs]
    ids = torch.cat(seqs).to(device)[None]
    pos = torch.cat([torch.arange(k) for k in n]).to(device)[None]
    out = model(ids, pos, None, packed_seq_params=packed_params(n, device))
    return list(torch.split(out[0], n))


def megatron_model_from_hf(hf_model, dtype=None):
    """(GPTModel with the plugin spec holding ``hf_model``'s weights, HF state dict converted back)."""
    from . import convert as C

    model = C.build_model(hf_model.config, dtype=dtype or next(hf_model.parameters()).dtype)
    C.load_hf_into(model, hf_model, hf_model.config)
    back = C.mcore_to_hf([(dict(model.state_dict()), 0)], hf_model.config)
    return model, back


def spread(n: int, batch: int) -> list[int]:
    """``n`` indices spread over ``range(batch)``, first and last included (the shortest and longest
    sequence of a ``parse_lengths`` range)."""
    n = max(0, min(n, batch))
    if n <= 1:
        return list(range(n))
    return sorted({round(i * (batch - 1) / (n - 1)) for i in range(n)})


def run_verify_megatron(V, model_name: str = "tiny-qwen3", *, layers: int | None = None, batch: int = 3,
                        prompt_len: str = "9..23", response_len: str = "5..12", page_size: int = 16,
                        seed: int = 0, device: str | None = None, single: int | None = None,
                        max_tokens_per_forward: int = 32768) -> dict[str, Any]:
    """``V``: the :mod:`areal_tik_plugin.verify` module, whose HF model builder, rollout replay
    (:class:`PagedRunner`) and row checks this runner reuses; ``tik verify --engine megatron`` hands
    itself in (the verify CLI imports this module, so this module does not import it back).

    Every sequence is checked against the rollout and the HF forward, packed into micro-batches of at
    most ``max_tokens_per_forward`` tokens (logits of one micro-batch at a time; the rollout's logits
    stay on the GPU when they fit, else on the host). ``single`` sequences (default all), spread from
    the shortest to the longest, are also forwarded alone and through the training forward."""
    import torch

    from areal_tik_plugin.integrations import transformers as TT

    if batch < 1:
        raise ValueError(f"--batch: expected >= 1, got {batch}")
    if max_tokens_per_forward < 1:
        raise ValueError(f"--max-tokens-per-forward: expected >= 1, got {max_tokens_per_forward}")
    if single is not None and single < 1:
        raise ValueError(f"--single: expected >= 1 with --engine megatron, got {single}")
    P = V.parse_lengths(prompt_len, batch, "--prompt-len")
    R = V.parse_lengths(response_len, batch, "--response-len")
    t0 = time.time()
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    ensure_model_parallel(seed=seed)
    hf = V.build_model(model_name, layers=layers, device=dev, seed=seed)
    TT.check_config(hf.config)
    mg, back = megatron_model_from_hf(hf)
    mg = mg.to(dev).eval()
    hf.load_state_dict(back, strict=True)  # the HF side holds exactly what Megatron holds
    del back
    TT.apply_to_model(hf)
    g = torch.Generator().manual_seed(seed)
    V_ = hf.config.vocab_size
    prompts = [torch.randint(0, V_, (p,), generator=g) for p in P]
    responses = [torch.randint(0, V_, (r,), generator=g) for r in R]
    seqs = [torch.cat([p, r]) for p, r in zip(prompts, responses)]
    lens = [int(s.numel()) for s in seqs]
    sel = spread(batch if single is None else single, batch)
    dt = next(mg.parameters()).dtype
    names = ("megatron-vs-rollout", "megatron-vs-hf", "megatron-packed-vs-separate", "megatron-train-vs-eval")
    checks = {n: V.Check("megatron", n) for n in names}
    timings: dict[str, float] = {"build_s": time.time() - t0}

    def add(name, i, a, b, temperature=1.0):
        lab = seqs[i][1:].to(dev)
        checks[name].add(a, b, V._plugin_logp(a[:-1], lab, temperature),
                         V._plugin_logp(b[:-1].to(dev), lab, temperature))

    def guarded(name, fn):
        if checks[name].error is not None:
            return
        try:
            fn()
        except Exception as e:  # noqa: BLE001 -- reported as a failed check
            checks[name].error = f"{type(e).__name__}: {e}"[:500]

    kept: dict[int, Any] = {}
    with torch.no_grad():
        t = time.time()
        sdev = V._store_device(dev, sum(lens), V_, dt)
        store = V._alloc_store(lens, V_, dt, sdev)
        V.plugin_rollout_logits(hf, prompts, responses, dev, store, page_size=page_size, seed=seed,
                                max_tokens=max_tokens_per_forward)
        timings["rollout_s"] = time.time() - t
        t = time.time()
        for grp in V.packed_groups(lens, max_tokens_per_forward):
            mgl = megatron_packed_logits(mg, [seqs[i] for i in grp], dev)
            guarded("megatron-vs-rollout", lambda: [add("megatron-vs-rollout", i, a, store[i]) for i, a in zip(grp, mgl)])
            for i, a in zip(grp, mgl):
                store[i] = None  # compared: its memory goes back
                if i in sel:
                    kept[i] = a.clone()

            def vs_hf():
                for i, a, b in zip(grp, mgl, V.hf_packed_logits(hf, [seqs[i] for i in grp], dev)):
                    add("megatron-vs-hf", i, a, b)

            guarded("megatron-vs-hf", vs_hf)
            del mgl
        del store
        timings["packed_s"] = time.time() - t
        t = time.time()
        guarded("megatron-packed-vs-separate",
                lambda: [add("megatron-packed-vs-separate", i, kept[i], megatron_packed_logits(mg, [seqs[i]], dev)[0])
                         for i in sel])
        timings["separate_s"] = time.time() - t
    t = time.time()

    def train_vs_eval():
        mg.train()
        try:
            with torch.enable_grad():
                train = [x.detach() for x in megatron_packed_logits(mg, [seqs[i] for i in sel], dev)]
        finally:
            mg.eval()
        for i, a in zip(sel, train):
            add("megatron-train-vs-eval", i, a, kept[i])

    guarded("megatron-train-vs-eval", train_vs_eval)
    timings["train_s"] = time.time() - t
    checks_json = [c.to_json() for c in checks.values()]
    return {"model": model_name, "engine": "megatron", "model_type": hf.config.model_type,
            "layers": hf.config.num_hidden_layers, "device": str(dev), "dtype": str(dt).replace("torch.", ""),
            "batch": batch, "prompt_lens": P, "response_lens": R, "page_size": page_size,
            "single": sel, "max_tokens_per_forward": max_tokens_per_forward, "logits_store": str(sdev),
            "checks": checks_json, "bit_identical": all(c["bit_identical"] for c in checks_json),
            "timings": {k: round(v, 2) for k, v in timings.items()}, "seconds": round(time.time() - t0, 2),
            "versions": versions()}


def versions() -> dict[str, Any]:
    """Versions of the stack a report was made with (megatron-core, torch, triton, transformers, the kernels)."""
    import importlib.metadata as md

    import torch

    out: dict[str, Any] = {}
    for dist in ("megatron-core", "mbridge", "torch", "triton", "transformers"):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            out[dist] = None
    out["python"] = sys.version.split()[0]
    try:
        from areal_tik_plugin import evidence

        out["env"] = evidence.environment()  # the GPU, driver, CUDA and library versions the HF verify records
    except Exception as e:  # noqa: BLE001
        out["env"] = f"unavailable: {type(e).__name__}: {e}"
    out["gpu"] = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    try:
        from areal_tik_plugin.runtime import loader

        impl = loader.get_implementation()
        out["implementation"] = {"name": impl.name, "source_hash": impl.source_hash}
    except Exception as e:  # noqa: BLE001 -- a report still says what it could not read
        out["implementation"] = f"unavailable: {type(e).__name__}: {e}"
    return out


def _span(xs):
    return str(xs[0]) if min(xs) == max(xs) else f"{min(xs)}..{max(xs)}"


def format_report(rep: dict[str, Any]) -> str:
    lines = [f"tik verify --engine megatron: {rep['model']} ({rep['model_type']}, {rep['layers']} layers) on "
             f"{rep['device']}, batch {rep['batch']}, prompt {_span(rep['prompt_lens'])}, response "
             f"{_span(rep['response_lens'])}, {sum(rep['prompt_lens']) + sum(rep['response_lens'])} tokens"]
    for c in rep["checks"]:
        ok = "bit-identical" if c["bit_identical"] else "DIFFERS"
        lines.append(f"  {c['check']:<30} {c['identical_rows']}/{c['rows']} rows identical, max|dlogit| "
                     f"{c['max_abs_dlogit']:.3g}, max|dlogp| {c['max_abs_dlogp']:.3g}  {ok}"
                     + (f"  ({c['error']})" if c.get("error") else ""))
    lines.append("PASS: Constraint (1) holds bit for bit for the Megatron forward" if rep["bit_identical"]
                 else "FAIL: a Megatron check is not bit-identical")
    lines[-1] += f" ({rep['seconds']} s: " + ", ".join(f"{k} {v}" for k, v in rep.get("timings", {}).items()) + ")"
    return "\n".join(lines)


__all__ = ["ensure_model_parallel", "packed_params", "spread", "megatron_packed_logits", "megatron_model_from_hf",
           "run_verify_megatron", "format_report", "versions"]
