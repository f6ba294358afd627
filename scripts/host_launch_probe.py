"""GPU probe: host time per call and do_bench "cold" time of ops.linear vs torch's F.linear at M=1
(Qwen3-4B qkv shape), fresh, again, after importing liger_kernel, after 20 CUDA-graph captures.

    PYTHONPATH=<liger site> python3 scripts/host_launch_probe.py

Session 15 ran it once (stdout only, no file): ours cold 64.8 / 63.9 / 39.6 / 42.8 us, host 79.5 / 78.8 /
59.0 / 60.0 us per call; cuBLAS cold 16.8-17.4 us, host 18.4-20.0 us per call. do_bench's L2 flush
(a 256 MB memset) hides a launch only while the host path is shorter than the memset, so a host path
of 60-80 us shows up in the cold time of a ~10 us kernel.
"""

import time

import torch
import triton

from areal_tik_plugin.ops import linear

x = torch.randn(1, 2560, device="cuda", dtype=torch.bfloat16)
w = torch.randn(6144, 2560, device="cuda", dtype=torch.bfloat16)


def cold(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3


def host(fn, n=2000):
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t) * 1e6 / n


def report(tag):
    f = lambda: linear(x, w)  # noqa: E731
    g = lambda: torch.nn.functional.linear(x, w)  # noqa: E731
    print(f"{tag:<22} ours cold {cold(f):6.1f} us host {host(f):5.1f} us/call | cuBLAS cold {cold(g):6.1f} "
          f"host {host(g):5.1f}", flush=True)


if __name__ == "__main__":
    report("fresh")
    report("fresh again")
    try:
        import liger_kernel.transformers.rms_norm  # noqa: F401
        import liger_kernel.transformers.rope  # noqa: F401
        report("after liger import")
    except ImportError:
        print("liger_kernel not importable: skipped")
    from areal_tik_plugin import bench

    for _ in range(20):
        bench.time_graph_us(lambda: linear(x, w))
    report("after 20 graphs")
