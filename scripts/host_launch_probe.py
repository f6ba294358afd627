"""GPU probe: host time per call and do_bench "cold" time of ops.linear vs torch's F.linear at M=1
(Qwen3-4B qkv shape), fresh, again, after importing liger_kernel, after 20 CUDA-graph captures.

    PYTHONPATH=<liger site> python3 scripts/host_launch_probe.py [--breakdown]

``--breakdown``: host time per call of each layer of the call (ops.linear, the integrations' fast path,
the kernel module's linear with and without a given config, the bare Triton launch with the arguments
precomputed, F.linear), then a cProfile of ops.linear (top 25 by own time).

Session 15 ran it once (stdout only, no file): ours cold 64.8 / 63.9 / 39.6 / 42.8 us, host 79.5 / 78.8 /
59.0 / 60.0 us per call; cuBLAS cold 16.8-17.4 us, host 18.4-20.0 us per call. do_bench's L2 flush
(a 256 MB memset) hides a launch only while the host path is shorter than the memset, so a host path
of 60-80 us shows up in the cold time of a ~10 us kernel.
"""

import torch
import triton

from areal_tik_plugin import bench
from areal_tik_plugin.gpu._rowops import knobs
from areal_tik_plugin.ops import linear

x = torch.randn(1, 2560, device="cuda", dtype=torch.bfloat16)
w = torch.randn(6144, 2560, device="cuda", dtype=torch.bfloat16)


def cold(fn):
    return bench.time_cold_us(fn)


def host(fn, n=2000):
    return bench.host_us(fn, n=n, reps=1, warmup=0)


def report(tag):
    f = lambda: linear(x, w)  # noqa: E731
    g = lambda: torch.nn.functional.linear(x, w)  # noqa: E731
    print(f"{tag:<22} ours cold {cold(f):6.1f} us host {host(f):5.1f} us/call | cuBLAS cold {cold(g):6.1f} "
          f"host {host(g):5.1f}", flush=True)


def breakdown():
    import cProfile
    import pstats

    from areal_tik_plugin.loader import get_implementation

    gemm = get_implementation().module("gemm")
    M, K = x.shape
    N = w.shape[0]
    cfg = gemm.config_for(M, N, K, torch.cuda.get_device_properties(0).multi_processor_count)
    y = torch.empty(M, N, device="cuda", dtype=x.dtype)
    bm, bn = cfg["BLOCK_M"], cfg["BLOCK_N"]
    grid = (triton.cdiv(M, bm) * triton.cdiv(N, bn),)
    opts = gemm._launch_opts(cfg)

    def bare():
        gemm._linear_ptr_kernel[grid](x, w, y, y, M, N, K, x.stride(0), w.stride(0), y.stride(0), HAS_BIAS=False,
                                      EVEN_K=(K % 64 == 0), BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=64, GROUP=cfg["GROUP_M"],
                                      **opts)

    kw = dict(HAS_BIAS=False, EVEN_K=(K % 64 == 0), BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=64, GROUP=cfg["GROUP_M"], **opts)
    pos = (x, w, y, y, M, N, K, x.stride(0), w.stride(0), y.stride(0))
    jit = gemm._linear_ptr_kernel
    kernel = jit[grid](*pos, **kw)  # the CompiledKernel of this launch
    from triton.runtime.driver import driver

    dev = driver.active.get_current_device()
    binder = jit.device_caches[dev][4]
    vals = tuple(binder(*pos, **kw)[0].values())
    stream = torch.cuda.current_stream().cuda_stream

    def direct():  # the compiled kernel's launcher with the bound arguments precomputed
        kernel.run(grid[0], 1, 1, stream, kernel.function, kernel.packed_metadata, None, None, None, *vals)

    def direct_stream():  # ... looking the stream up per call
        kernel.run(grid[0], 1, 1, torch.cuda.current_stream().cuda_stream, kernel.function, kernel.packed_metadata,
                   None, None, None, *vals)

    print(f"config {cfg['name']} stages {cfg['num_stages']}", flush=True)
    for tag, fn in (("triton binder only", lambda: binder(*pos, **kw)), ("kernel.run direct", direct),
                    ("kernel.run + stream", direct_stream),
                    ("get_current_stream", lambda: driver.active.get_current_stream(dev))):
        fn()
        print(f"  host {tag:<22}{host(fn):6.1f} us/call", flush=True)
    ro = get_implementation().module("_rowops")
    for fast in (False, True):  # Triton's launch path (the package default), then the short one (TIK_FAST_LAUNCH=1)
        sfx = " [short]" if fast else ""
        with knobs(ro, FAST_LAUNCH=fast):
            for tag, fn in (("ops.linear", lambda: linear(x, w)),
                            ("gemm.linear", lambda: gemm.linear(x, w)),
                            ("gemm.linear(config)", lambda: gemm.linear(x, w, config=cfg))):
                fn()
                print(f"  host {tag + sfx:<30}{host(fn):6.1f} us/call", flush=True)
    for tag, fn in (("bare triton launch", bare), ("F.linear", lambda: torch.nn.functional.linear(x, w)),
                    ("torch.empty", lambda: torch.empty(M, N, device="cuda", dtype=x.dtype))):
        fn()
        print(f"  host {tag:<30}{host(fn):6.1f} us/call", flush=True)
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(2000):
        linear(x, w)
    pr.disable()
    torch.cuda.synchronize()
    pstats.Stats(pr).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    import sys

    if "--breakdown" in sys.argv:
        breakdown()
        sys.exit(0)
    report("fresh")
    report("fresh again")
    try:
        import liger_kernel.transformers.rms_norm  # noqa: F401
        import liger_kernel.transformers.rope  # noqa: F401
        report("after liger import")
    except ImportError:
        print("liger_kernel not importable: skipped")
    for _ in range(20):
        bench.time_graph_us(lambda: linear(x, w))
    report("after 20 graphs")
