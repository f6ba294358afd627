"""One rank of the pipeline-parallel / expert-parallel tests (spawned by test_parallel.py): builds its
stage / expert shard of the tiny model, runs a packed forward + backward (pipeline: through
megatron-core's own schedule) and saves logits and gradients for the parent to compare with the
one-process run."""

from __future__ import annotations

import os


def run(rank: int, world: int, port: int, jobs: list, lens: list, out_dir: str) -> None:
    """``jobs``: [(mode "pp" | "ep", model name)], run in order in this process (one start-up)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    from areal_tik_plugin.runtime.interp import ensure_interpreter_if_no_gpu

    ensure_interpreter_if_no_gpu()
    import torch
    from megatron.core import parallel_state as ps

    # megatron-core's p2p communication allocates its buffers on torch.cuda.current_device() and
    # may synchronize the CUDA stream; in these CPU-only ranks the buffers go to the CPU (gloo)
    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.synchronize = lambda *a, **k: None

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
    loss_of = lambda lg: -torch.log_softmax(lg.float(), -1).gather(1, torch.roll(ids[0], -1)[:, None]).sum()  # noqa: E731
    if mode == "pp":
        # megatron-core's own 1F1B schedule: stage 0 sends the activation, stage 1 the gradient back
        from megatron.core.pipeline_parallel import get_forward_backward_func

        from tests.megatron._mg import CudaToCpu

        seen = {}

        def step(it, m):
            b = next(it)
            out = m(b["ids"], b["pos"], None, packed_seq_params=p)

            def loss_func(o):
                seen["logits"] = o.detach()
                return loss_of(o[0]), {}

            return out, loss_func

        with CudaToCpu():
            get_forward_backward_func()(forward_step_func=step, data_iterator=iter([{"ids": ids, "pos": pos}]),
                                        model=[model], num_microbatches=1, seq_length=sum(n), micro_batch_size=1,
                                        forward_only=False)
        logits = seen.get("logits")
    else:
        logits = model(ids, pos, None, packed_seq_params=p)
        loss_of(logits[0]).backward()
    grads = {k: prm.grad for k, prm in model.named_parameters() if prm.grad is not None}
    ckpt = {k: (v.key, v.replica_id) for k, v in model.sharded_state_dict().items() if hasattr(v, "key")}
    torch.save({"logits": None if logits is None else logits.detach()[0], "grads": grads, "layer_offset": off,
                "ckpt_keys": ckpt},
               os.path.join(out_dir, f"{mode}_rank{rank}.pt"))
