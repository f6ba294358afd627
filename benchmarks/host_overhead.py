"""Host-side cost of the plugin's rollout layer (prefill) on the GPU: where the time goes when the
device is not the bottleneck.

``python -m benchmarks.host_overhead --out DIR [--model qwen3-4b] [--tokens 1024]``
writes ``host_overhead.json``: for one decoder layer's prefill (the layer bench's plugin prefill),
host issue time per call (no sync), wall time per call with a sync, device time per call
(events around a batch), the same per op, and the top functions of a cProfile over the calls.

``--stub-launch`` (any machine, no GPU needed): every Triton kernel launch is replaced by a no-op and
the layer runs on CPU tensors of ``--tokens`` (default 4) rows, so the time measured is the Python
host path of our ops and launchers alone (Triton's own launch path excluded). Use it to compare a
launcher change before a GPU run. ``--train-forward`` (with ``--stub-launch``) also times the
patched HF decoder layer's forward on the training path (grad enabled, AReaL's packed kwargs).
"""

from __future__ import annotations

import argparse
import cProfile
import copy
import io
import json
import os
import pstats
import sys
import time

from areal_tik_plugin import bench


def _host_and_wall(fn, n: int = 20) -> dict:
    import torch

    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    host = (time.perf_counter() - t0) / n
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) / n
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(n):
        fn()
    b.record()
    b.synchronize()
    return {"host_us": host * 1e6, "wall_us": wall * 1e6, "events_us": a.elapsed_time(b) * 1e3 / n}


def _layer(model: str, device, P: int):
    """One plugin-patched decoder layer of ``model`` and a prefill of P tokens over a KV pool, as the
    layer bench's plugin prefill runs it: returns (plug, parts dict, layer())."""
    import torch

    from areal_tik_plugin import ops
    from benchmarks.layer_bench import build_layer
    from areal_tik_plugin.integrations import transformers as T
    from areal_tik_plugin.verify import layer_step

    dev, dt = torch.device(device), torch.bfloat16
    cfg, base, rotary, _mod, _notes = build_layer(model, dt, dev)
    plug = T.apply_to_module(copy.deepcopy(base), cfg.model_type)
    inv, sc = T.rope_params(rotary, dev)
    Hkv, D = cfg.num_key_value_heads, base.self_attn.head_dim
    kpool = torch.randn(P + 1, Hkv, D, device=dev, dtype=dt)
    vpool = torch.randn_like(kpool)
    table = torch.arange(1, P + 1, dtype=torch.int32, device=dev)[None]
    rows = torch.zeros(1, dtype=torch.int32, device=dev)
    xp = torch.randn(P, cfg.hidden_size, device=dev, dtype=dt) * 0.5
    pos = torch.arange(P, device=dev)
    loc = table[0, :P].to(torch.int64)
    cu = torch.tensor([0, P], dtype=torch.int32, device=dev)
    zero = torch.zeros(1, dtype=torch.int32, device=dev)

    def attend(q, s):
        return ops.attention_extend(q, kpool, vpool, cu_seqlens_q=cu, prefix_lens=zero, kv_indices=table,
                                    table_rows=rows, max_extend_len=P, softmax_scale=s)

    def layer():
        with torch.no_grad():
            return layer_step(plug, xp, pos, inv, sc, kpool, vpool, loc, attend)

    parts = dict(xp=xp, pos=pos, inv=inv, sc=sc, kpool=kpool, vpool=vpool, loc=loc, attend=attend)
    return plug, parts, layer


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.host_overhead")
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="qwen3-4b")
    ap.add_argument("--tokens", type=int, default=None, help="prefill tokens (default 1024; 4 with --stub-launch)")
    ap.add_argument("--stub-launch", action="store_true", help="no-op kernel launches, CPU tensors: host Python only")
    ap.add_argument("--train-forward", action="store_true",
                    help="with --stub-launch: also time the patched HF decoder layer forward (training path: grad "
                         "enabled, packed cu_seq_lens kwargs)")
    args = ap.parse_args(argv)
    import torch

    if args.stub_launch:
        return _stub_main(args)

    from areal_tik_plugin import ops
    from areal_tik_plugin.integrations import transformers as T

    P = args.tokens or 1024
    plug, d, layer = _layer(args.model, "cuda", P)
    xp, pos, inv, sc, kpool, vpool, loc, attend = (d[k] for k in ("xp", "pos", "inv", "sc", "kpool", "vpool",
                                                                  "loc", "attend"))
    attn = plug.self_attn
    x = T.tik_rms_norm(xp, plug.input_layernorm)
    q, k, v = T.tik_qkv(attn, x, pos, inv, sc)
    o = attend(q, attn.scaling).reshape(P, -1)
    per_op = {
        "rms_norm": lambda: T.tik_rms_norm(xp, plug.input_layernorm),
        "qkv(+norm+rope)": lambda: T.tik_qkv(attn, x, pos, inv, sc),
        "kv_write": lambda: ops.kv_write(kpool, vpool, loc, k, v),
        "attention_extend": lambda: attend(q, attn.scaling),
        "o_proj": lambda: T.tik_linear(o, attn.o_proj),
        "ffn": lambda: T.tik_ffn(plug.mlp, x),
        "linear(raw op)": lambda: ops.linear(x, plug.mlp.up_proj.weight),
    }
    res = {"model": args.model, "tokens": P}
    with torch.no_grad():
        res["layer"] = _host_and_wall(layer)
        res["ops"] = {name: _host_and_wall(fn) for name, fn in per_op.items()}
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(20):
            layer()
        pr.disable()
        torch.cuda.synchronize()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(30)
    res["cprofile_tottime"] = s.getvalue()[-6000:]
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(45)
    res["cprofile_cumulative"] = s.getvalue()[-9000:]
    res["launches_per_layer"] = _count_launches(layer)
    # the same layer's Python alone on this machine's CPU (launches no-ops, CPU tensors of 4 rows):
    # host time per layer minus this is Triton's launch path + torch's own op dispatch on the GPU
    try:
        res["stub_launch_host_us_per_layer"] = _stub_host_us(args.model, 4)
    except Exception as e:  # noqa: BLE001 -- a GPU-only launcher path on CPU tensors: report, keep the rest
        res["stub_launch_error"] = f"{type(e).__name__}: {e}"[:500]
        res["stub_launch_host_us_per_layer"] = float("nan")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "host_overhead.json"), "w") as f:
        json.dump(res, f, indent=1)
    print(f"{args.model} layer prefill {P} tokens: " + json.dumps({k: round(v, 1) for k, v in res["layer"].items()}))
    for name, r in res["ops"].items():
        print(f"  {name:<20}" + "  ".join(f"{k} {v:8.1f}" for k, v in r.items()))
    print(f"  Triton launches per layer {res['launches_per_layer']}; our Python alone (launches stubbed, "
          f"this CPU) {res['stub_launch_host_us_per_layer']:.1f} us per layer")
    print("\n".join(res["cprofile_cumulative"].splitlines()[:50]))
    return 0


def _count_launches(layer) -> int:
    """Triton kernel launches in one call of ``layer`` (JITFunction.run calls; the implementation's short
    launch path, which skips ``run`` on a cache hit, is turned off while counting)."""
    import contextlib

    import torch
    import triton.runtime.jit as J

    from areal_tik_plugin.contract._rowops import knobs
    from areal_tik_plugin.runtime.loader import get_implementation

    rowops = get_implementation().module("_rowops")
    n = [0]
    run = J.JITFunction.run

    def counting(self, *a, **k):
        n[0] += 1
        return run(self, *a, **k)

    short = knobs(rowops, FAST_LAUNCH=False) if hasattr(rowops, "FAST_LAUNCH") else contextlib.nullcontext()
    J.JITFunction.run = counting
    try:
        with short, torch.no_grad():
            layer()
    finally:
        J.JITFunction.run = run
    return n[0]


def _stub_launches() -> None:
    """Every Triton kernel launch becomes a no-op and value checks are off (as on the GPU)."""
    import triton.runtime.jit as J
    from triton.runtime import interpreter as I

    from areal_tik_plugin.ops import _validate as V

    def noop(*a, **k):
        return None

    for cls in (J.JITFunction, getattr(I, "InterpretedFunction", None)):
        if cls is not None:
            cls.__getitem__ = lambda self, grid: noop
    V.check_values = lambda device: False  # as on the GPU (value checks need a host sync there)


def _stub_host_us(model: str, P: int) -> float:
    """Best-of-5 host Python time per layer prefill of P rows with launches stubbed (irreversible:
    call last)."""
    _stub_launches()
    _plug, _parts, layer = _layer(model, "cpu", P)
    return bench.host_us(layer)


def _train_forward(model: str, device, P: int):
    """The patched HF decoder layer's forward as AReaL's FSDP actor runs it: one packed sequence of P
    tokens (``cu_seq_lens_q/k``, ``max_length_q/k``, batch 1), grad enabled, parameters requiring grad."""
    import torch

    from benchmarks.layer_bench import build_layer
    from areal_tik_plugin.integrations import transformers as T

    dev, dt = torch.device(device), torch.bfloat16
    cfg, base, rotary, _mod, _notes = build_layer(model, dt, dev)
    plug = T.apply_to_module(copy.deepcopy(base), cfg.model_type)
    plug.train()
    inv, sc = T.rope_params(rotary, dev)
    pos = torch.arange(P, device=dev)[None]
    pe = T.TikRotary(pos, inv, sc)
    h = (torch.randn(1, P, cfg.hidden_size, device=dev, dtype=dt) * 0.5).requires_grad_()
    cu = torch.tensor([0, P], dtype=torch.int32, device=dev)
    kw = dict(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=P, max_length_k=P)

    def fwd():
        with torch.enable_grad():
            return plug(h, attention_mask=None, position_ids=pos, position_embeddings=pe, **kw)

    return fwd


def _stub_train_host_us(model: str, P: int) -> float:
    """Best-of-5 host Python time per patched HF decoder layer forward (training path), launches stubbed."""
    _stub_launches()
    return bench.host_us(_train_forward(model, "cpu", P))


def _stub_main(args) -> int:
    """Host Python time of one layer prefill with every Triton launch a no-op (see module doc)."""
    from areal_tik_plugin.runtime.loader import get_implementation

    get_implementation()  # the loader decides interpreter vs compiled before the kernels exist
    P = args.tokens or 4
    best = _stub_host_us(args.model, P)
    impl = get_implementation()
    res = {"model": args.model, "tokens": P, "stub_launch": True, "host_us_per_layer": best,
           "implementation": impl.name, "source_hash": impl.source_hash}
    if args.train_forward:
        res["train_forward_host_us_per_layer"] = _stub_train_host_us(args.model, P)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "host_overhead_stub.json"), "w") as f:
        json.dump(res, f, indent=1)
    print(f"{args.model} layer prefill, launches stubbed, {P} tokens: {best:.1f} us host Python per layer "
          f"(kernels {impl.name} {impl.source_hash[:12]})")
    if args.train_forward:
        print(f"{args.model} patched HF decoder layer forward (training path, grad on), launches stubbed, {P} tokens: "
              f"{res['train_forward_host_us_per_layer']:.1f} us host Python per layer")
    return 0


if __name__ == "__main__":
    sys.exit(main())
