"""One rank of the pipeline-parallel / expert-parallel tests (spawned by test_parallel.py): builds its
stage / expert shard of the tiny model, runs a packed forward + backward and saves logits and
gradients (as HF names) for the parent to compare with the one-process run."""

from __future__ import annotations

import os


def _send(t, dst):
    import torch.distributed as dist

    dist.send(t.contiguous().view(__import__("torch").int16), dst)


def _recv(like, src):
    import torch
    import torch.distributed as dist

    buf = torch.empty(like.shape, dtype=torch.int16)
    dist.recv(buf, src)
    return buf.view(like.dtype)


def run(rank: int, world: int, port: int, jobs: list, lens: list, out_dir: str) -> None:
    """``jobs``: [(mode "pp" | "ep", model name)], run in order in this process (one start-up)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    from areal_tik_plugin.runtime.interp import ensure_interpreter_if_no_gpu

    ensure_interpreter_if_no_gpu()
    import torch
    from megatron.core import parallel_state as ps

    for mode, name in jobs:
        _one(rank, mode, name, lens, out_dir)
        ps.destroy_model_parallel()
    torch.distributed.destroy_process_group()


def _one(rank: int, mode: str, name: str, lens: list, out_dir: str) -> None:
    import torch

    from areal_tik_plugin import verify as V
    from areal_tik_plugin.integrations.megatron import convert as C
    from areal_tik_plugin.integrations.megatron.verify import ensure_model_parallel, packed_params
    from tests.megatron._mg import seqs

    pp, ep = (2, 1) if mode == "pp" else (1, 2)
    ensure_model_parallel(pp=pp, ep=ep)
    hf = V.build_model(name, seed=0)
    model = C.build_model(hf.config)
    C.load_hf_into(model, hf, hf.config)
    off, _ = C.stage_layers(model.config)
    xs = seqs(hf.config.vocab_size, lens, 9)
    n = [int(x.numel()) for x in xs]
    ids, pos = torch.cat(xs)[None], torch.cat([torch.arange(k) for k in n])[None]
    p = packed_params(n, "cpu")
    model.train()
    H = hf.config.hidden_size
    if mode == "pp" and rank == 0:
        hidden = model(ids, pos, None, packed_seq_params=p)  # [t, 1, h]
        _send(hidden.detach(), 1)
        grad = _recv(hidden, 1)
        hidden.backward(grad)
        logits = None
    else:
        if mode == "pp":
            inp = _recv(torch.empty(sum(n), 1, H, dtype=torch.bfloat16), 0).requires_grad_(True)
            model.set_input_tensor(inp)
            logits = model(None, None, None, packed_seq_params=p)
        else:
            logits = model(ids, pos, None, packed_seq_params=p)
        lg = logits[0]
        loss = -torch.log_softmax(lg.float(), -1).gather(1, torch.roll(ids[0], -1)[:, None]).sum()
        loss.backward()
        if mode == "pp":
            _send(inp.grad, 0)
    grads = {k: prm.grad for k, prm in model.named_parameters() if prm.grad is not None}
    torch.save({"logits": None if logits is None else logits.detach()[0], "grads": grads, "layer_offset": off},
               os.path.join(out_dir, f"{mode}_rank{rank}.pt"))
