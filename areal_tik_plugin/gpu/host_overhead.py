"""Host-side cost of the plugin's rollout layer (prefill) on the GPU: where the time goes when the
device is not the bottleneck.

``python -m areal_tik_plugin.gpu.host_overhead --out DIR [--model qwen3-4b] [--tokens 1024]``
writes ``host_overhead.json``: for one decoder layer's prefill (the layer bench's plugin prefill),
host issue time per call (no sync), wall time per call with a sync, device time per call
(events around a batch), the same per op, and the top functions of a cProfile over the calls.
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m areal_tik_plugin.gpu.host_overhead")
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="qwen3-4b")
    ap.add_argument("--tokens", type=int, default=1024)
    args = ap.parse_args(argv)
    import torch

    from areal_tik_plugin import ops
    from areal_tik_plugin.gpu.layer_bench import build_layer
    from areal_tik_plugin.integrations import transformers as T
    from areal_tik_plugin.verify import layer_step

    dev, dt, P = torch.device("cuda"), torch.bfloat16, args.tokens
    cfg, base, rotary, _mod, _notes = build_layer(args.model, dt, dev)
    plug = T.apply_to_module(copy.deepcopy(base), cfg.model_type)
    inv, sc = T.rope_params(rotary, dev)
    Hkv, D, H = cfg.num_key_value_heads, base.self_attn.head_dim, cfg.hidden_size
    slots = P + 1
    kpool = torch.randn(slots, Hkv, D, device=dev, dtype=dt)
    vpool = torch.randn_like(kpool)
    table = torch.arange(1, slots, dtype=torch.int32, device=dev)[None]
    rows = torch.zeros(1, dtype=torch.int32, device=dev)
    xp = torch.randn(P, H, device=dev, dtype=dt) * 0.5
    pos = torch.arange(P, device=dev)
    loc = table[0, :P].to(torch.int64)
    cu = torch.tensor([0, P], dtype=torch.int32, device=dev)
    zero = torch.zeros(1, dtype=torch.int32, device=dev)

    def attend(q, s):
        return ops.attention_extend(q, kpool, vpool, cu_seqlens_q=cu, prefix_lens=zero, kv_indices=table,
                                    table_rows=rows, max_extend_len=P, softmax_scale=s)

    def layer():
        return layer_step(plug, xp, pos, inv, sc, kpool, vpool, loc, attend)

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
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "host_overhead.json"), "w") as f:
        json.dump(res, f, indent=1)
    print(f"{args.model} layer prefill {P} tokens: " + json.dumps({k: round(v, 1) for k, v in res["layer"].items()}))
    for name, r in res["ops"].items():
        print(f"  {name:<20}" + "  ".join(f"{k} {v:8.1f}" for k, v in r.items()))
    print("\n".join(res["cprofile_tottime"].splitlines()[:40]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
