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
import time
from typing import Any


def ensure_model_parallel(pp: int = 1, ep: int = 1) -> None:
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
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo", rank=rank, world_size=world)
    if ps.model_parallel_is_initialized():
        if ps.get_pipeline_model_parallel_world_size() != pp or ps.get_expert_model_parallel_world_size() != ep:
            raise RuntimeError(f"megatron-core parallel state already initialized with pp="
                               f"{ps.get_pipeline_model_parallel_world_size()}, ep={ps.get_expert_model_parallel_world_size()}")
        return
    ps.initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=pp,
                                 expert_model_parallel_size=ep)


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


def run_verify_megatron(V, model_name: str = "tiny-qwen3", *, layers: int | None = None, batch: int = 3,
                        prompt_len: str = "9..23", response_len: str = "5..12", page_size: int = 16,
                        seed: int = 0, device: str | None = None) -> dict[str, Any]:
    """``V``: the :mod:`areal_tik_plugin.verify` module, whose HF model builder, rollout replay
    (:class:`PagedRunner`) and row checks this runner reuses; ``tik verify --engine megatron`` hands
    itself in (the verify CLI imports this module, so this module does not import it back)."""
    import torch

    from areal_tik_plugin.integrations import transformers as TT

    t0 = time.time()
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    ensure_model_parallel()
    hf = V.build_model(model_name, layers=layers, device=dev, seed=seed)
    TT.check_config(hf.config)
    mg, back = megatron_model_from_hf(hf)
    mg = mg.to(dev).eval()
    hf.load_state_dict(back, strict=True)  # the HF side holds exactly what Megatron holds
    TT.apply_to_model(hf)
    g = torch.Generator().manual_seed(seed)
    V_ = hf.config.vocab_size
    P = V.parse_lengths(prompt_len, batch, "--prompt-len")
    R = V.parse_lengths(response_len, batch, "--response-len")
    prompts = [torch.randint(0, V_, (p,), generator=g) for p in P]
    responses = [torch.randint(0, V_, (r,), generator=g) for r in R]
    seqs = [torch.cat([p, r]) for p, r in zip(prompts, responses)]
    checks: list = []

    def cmp(name, a_list, b_list, temperature=1.0):
        c = V.Check("megatron", name)
        try:
            for s, a, b in zip(seqs, a_list, b_list):
                lab = s[1:].to(dev)
                c.add(a, b, V._plugin_logp(a[:-1], lab, temperature), V._plugin_logp(b[:-1].to(dev), lab, temperature))
        except Exception as e:  # noqa: BLE001 -- reported as a failed check
            c.error = f"{type(e).__name__}: {e}"
        checks.append(c)

    with torch.no_grad():
        mg_logits = megatron_packed_logits(mg, seqs, dev)
        store = [torch.empty(int(s.numel()), V_, dtype=mg_logits[0].dtype, device=dev) for s in seqs]
        V.plugin_rollout_logits(hf, prompts, responses, dev, store, page_size=page_size, seed=seed)
        cmp("megatron-vs-rollout", mg_logits, store)
        cmp("megatron-vs-hf", mg_logits, V.hf_packed_logits(hf, seqs, dev))
        cmp("megatron-packed-vs-separate", mg_logits, [megatron_packed_logits(mg, [s], dev)[0] for s in seqs])
    mg.train()
    with torch.enable_grad():
        train = [t.detach() for t in megatron_packed_logits(mg, seqs, dev)]
    mg.eval()
    cmp("megatron-train-vs-eval", train, mg_logits)
    return {"model": model_name, "engine": "megatron", "model_type": hf.config.model_type,
            "layers": hf.config.num_hidden_layers, "device": str(dev), "batch": batch,
            "prompt_lens": P, "response_lens": R, "page_size": page_size,
            "checks": [c.to_json() for c in checks],
            "bit_identical": all(c.bit_identical for c in checks), "seconds": time.time() - t0}


def format_report(rep: dict[str, Any]) -> str:
    lines = [f"tik verify --engine megatron: {rep['model']} ({rep['model_type']}, {rep['layers']} layers) on "
             f"{rep['device']}, batch {rep['batch']}"]
    for c in rep["checks"]:
        ok = "bit-identical" if c["bit_identical"] else "DIFFERS"
        lines.append(f"  {c['check']:<30} {c['identical_rows']}/{c['rows']} rows identical, max|dlogit| "
                     f"{c['max_abs_dlogit']:.3g}, max|dlogp| {c['max_abs_dlogp']:.3g}  {ok}"
                     + (f"  ({c['error']})" if c.get("error") else ""))
    lines.append("PASS: Constraint (1) holds bit for bit for the Megatron forward" if rep["bit_identical"]
                 else "FAIL: a Megatron check is not bit-identical")
    return "\n".join(lines)


__all__ = ["ensure_model_parallel", "packed_params", "megatron_packed_logits", "megatron_model_from_hf",
           "run_verify_megatron", "format_report"]
