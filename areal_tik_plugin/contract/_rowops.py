"""Shared pieces of the GPU checks/benchmarks of the row-wise ops (rmsnorm, rope, swiglu, kv_write,
logprob): model shapes, token counts, timing wrapper, CUDA-graph replay check, baselines."""

from __future__ import annotations

import contextlib

import torch

from areal_tik_plugin import bench
from areal_tik_plugin.contract.suite import timed  # noqa: F401 -- re-exported to the row-op modules
from areal_tik_plugin.models import dims

DEV = "cuda"
HBM_TBPS = 4.8  # H200 datasheet HBM bandwidth: what the hbm_frac_* shares are set against (the spec)

# the row ops' models: their numbers from the one shape table (areal_tik_plugin.models)
MODELS = {name: dict(hidden=x.hidden, hq=x.hq, hkv=x.hkv, d=x.d, vocab=x.vocab, inter=x.inter, theta=x.theta,
                     eps=x.eps)
          for name, x in ((n, dims(n)) for n in ("qwen2.5-1.5b", "qwen3-4b", "qwen3-30b-a3b"))}
CHECK_T = (1, 7, 64, 257, 1024, 4096, 16384)
# 65536: one rollout prefill of 64 prompts x 1K tokens (the memory-bound ops' "large token count"; their
# T=4096 rows move 8-84 MB, where the launch's fixed cost is 7-45% of the time)
BENCH_T = (1, 64, 256, 1024, 4096, 16384, 65536)
QUICK_BENCH_T = (1, 256, 4096, 16384, 65536)
LARGE_T = 65536


def rand(*shape, dtype=torch.bfloat16, scale=1.0, seed=0):
    g = torch.Generator(device=DEV).manual_seed(seed)
    return (torch.randn(*shape, device=DEV, generator=g) * scale).to(dtype)


def row_slices(n_full, Ts=CHECK_T):
    """(tag, slice) pairs: for every T < n_full, a block at the start, in the middle (odd offset) and at
    the end of the full batch -- a decode-sized or chunk-sized call vs the full-sequence call."""
    out = []
    for T in Ts:
        if T > n_full:
            continue
        offs = sorted({0, max(0, (n_full - T) // 2 - 1), n_full - T})
        for o in offs:
            out.append((f"T{T}@{o}", slice(o, o + T)))
    return out


def shuffled_rows(n_full, n, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randperm(n_full, generator=g)[:n].to(DEV)




# HBM-share rows stream their data: one graph replay calls the op once on each of enough input copies
# to move STREAM_BYTES (METHOD.md: repeated runs over one buffer set that fits the 50 MB L2 measure the
# cache; Qwen2.5-1.5B RoPE at T=4096 moves 29 MB). ``graph_us`` stays the same-buffer replay that the
# baseline ratios use; ``graph_streamed_us`` is what the share of HBM bandwidth is computed from.
STREAM_BYTES = 256 << 20


@contextlib.contextmanager
def knobs(mod, **values):
    """Set module-level knobs (e.g. ``_rowops.PDL``, ``logprob.MERGE_ROWS``) for the ``with`` block and
    restore their previous values after it, also on an exception."""
    old = {k: getattr(mod, k) for k in values}
    try:
        for k, v in values.items():
            setattr(mod, k, v)
        yield mod
    finally:
        for k, v in old.items():
            setattr(mod, k, v)


def stream_copies(nbytes: int) -> int:
    """Input copies per streamed replay: STREAM_BYTES worth (at least 1, at most 16). The one rule for the
    GEMM bench and sweeps (weight copies) and the row ops' HBM-share rows (input copies)."""
    return max(1, min(16, STREAM_BYTES // max(1, nbytes)))


def streamed(rec, name, t, nbytes, make_call):
    """Add ``graph_streamed_us`` (and ``stream_copies``) to timing ``t``: ``make_call(i)`` returns the op
    call on input copy i (i = 0: the timed inputs). A failure is recorded in ``rec.errors``."""
    if not t:
        return t
    n = stream_copies(nbytes)
    t["stream_copies"] = n
    try:
        if n == 1:
            t["graph_streamed_us"] = t.get("graph_us")
        else:
            fns = [make_call(i) for i in range(n)]
            for f in fns:
                f()
            torch.cuda.synchronize()
            t["graph_streamed_us"] = bench.time_graph_each_us(fns)
            del fns
        t["copy_same_bytes_us"] = copy_same_bytes_us(nbytes)
    except Exception as e:
        rec.errors.append(f"{name} streamed: {type(e).__name__}: {e}"[:300])
    return t


_COPY_US: dict = {}


def copy_same_bytes_us(nbytes: int) -> float:
    """Graph time of a plain elementwise kernel (torch's ``bitwise_not`` on int16, ``out=``) moving the same
    bytes as an op's streamed row (nbytes / 2 read, nbytes / 2 written), streamed the same way
    (``stream_copies(nbytes)`` source / destination pairs, each once per replay): what a one-pass SM kernel
    of that size reaches, fixed per-launch cost included. Cached per size. Not ``dst.copy_(src)``: that is a
    memcpy node in the graph, measured at 2.2-4.2 TB/s at like sizes in one process (no ceiling; RMSNorm
    streamed 1.5x faster than it)."""
    if nbytes not in _COPY_US:
        n, elems = stream_copies(nbytes), max(1, nbytes // 4)  # int16: nbytes / 2 bytes each side
        pairs = [(torch.zeros(elems, dtype=torch.int16, device=DEV), torch.empty(elems, dtype=torch.int16, device=DEV))
                 for _ in range(n)]
        _COPY_US[nbytes] = bench.time_graph_each_us(
            [lambda s=s, d=d: torch.bitwise_not(s, out=d) for s, d in pairs])
    return _COPY_US[nbytes]


def add_shares(ratios: dict, bw, T: int = 0, copy_tbps: float | None = None) -> None:
    """Append one T >= 4096 row's shares to the op's summary lists: of the HBM spec bandwidth (cold,
    graph), of the device copy bandwidth measured in this process (``copy_tbps``; measured once when
    None and a GPU is present) and, where the row was streamed, of a same-size elementwise kernel's
    bandwidth (graph). Rows of T >= LARGE_T also go to the ``_T65536`` lists."""
    if not bw:
        return
    if copy_tbps is None and torch.cuda.is_available():
        from areal_tik_plugin.contract.baselines import measured_copy_tbps

        copy_tbps = measured_copy_tbps()
    tags = ("T4096plus",) + (("T65536",) if T >= LARGE_T else ())
    for tag in tags:
        ratios.setdefault(f"hbm_frac_{tag}", []).append(bw["cold_tbps"] / HBM_TBPS)
        if bw.get("graph_tbps"):
            ratios.setdefault(f"hbm_frac_{tag}_graph", []).append(bw["graph_tbps"] / HBM_TBPS)
        if copy_tbps:
            ratios.setdefault(f"measured_copy_frac_{tag}", []).append(bw["cold_tbps"] / copy_tbps)
            if bw.get("graph_tbps"):
                ratios.setdefault(f"measured_copy_frac_{tag}_graph", []).append(bw["graph_tbps"] / copy_tbps)
        if bw.get("vs_copy_same_bytes"):
            ratios.setdefault(f"vs_copy_same_bytes_{tag}_graph", []).append(bw["vs_copy_same_bytes"])


def copy_of(t, i):
    """Input copy i of a streamed timing (i = 0: the tensor itself)."""
    return t if i == 0 else t.clone()


def tbps(nbytes, t):
    """TB/s of a timing: cold (do_bench, L2 flushed) and graph; ``graph_tbps`` from the streamed replay
    when the row has one (``graph_basis`` says which)."""
    if not t or not t.get("cold_us"):
        return None
    out = {"cold_tbps": nbytes / (t["cold_us"] * 1e-6) / 1e12}
    g = t.get("graph_streamed_us") or t.get("graph_us")
    if g:
        out["graph_tbps"] = nbytes / (g * 1e-6) / 1e12
        out["graph_basis"] = "streamed" if t.get("graph_streamed_us") else "same_buffers"
    if t.get("graph_us") and t.get("graph_streamed_us"):
        out["graph_same_buffers_tbps"] = nbytes / (t["graph_us"] * 1e-6) / 1e12
    if t.get("copy_same_bytes_us") and t.get("graph_streamed_us"):
        out["copy_same_bytes_tbps"] = nbytes / (t["copy_same_bytes_us"] * 1e-6) / 1e12
        out["vs_copy_same_bytes"] = t["copy_same_bytes_us"] / t["graph_streamed_us"]
    return out


def graph_vs_eager(rec, name, step, refresh, eager, n=3):
    """Capture ``step()`` (writing into static outputs, returns them) in a CUDA graph; for n rounds
    ``refresh(i)`` new input values in place, replay, and compare bitwise with ``eager()``."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        outs = step()
    outs = outs if isinstance(outs, (tuple, list)) else (outs,)
    for i in range(n):
        refresh(i)
        g.replay()
        torch.cuda.synchronize()
        ref = eager()
        ref = ref if isinstance(ref, (tuple, list)) else (ref,)
        for j, (a, b) in enumerate(zip(outs, ref)):
            rec.bitwise(f"{name}[replay{i}/out{j}]", a.clone(), b)
    del g


_LIGER = {}


def liger(rec=None):
    """The liger_kernel module, or None (recorded once as 'unavailable' in the bench table)."""
    if "mod" not in _LIGER:
        try:
            import liger_kernel  # noqa: F401

            _LIGER["mod"] = liger_kernel
            _LIGER["why"] = None
        except Exception as e:
            _LIGER["mod"] = None
            _LIGER["why"] = f"unavailable ({type(e).__name__}: {e})"[:200]
    if rec is not None and _LIGER["mod"] is None:
        rec.bench("liger_kernel", status=_LIGER["why"])
    return _LIGER["mod"]


def ratio(base, ours, key):
    return bench.ratio(base, ours, key) if base and ours else None


def rel_l2(out, ref):
    return float((out.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30))


def check_native(rec, tag: str, public, python_path, *, n: int = 3, served: bool | None = True) -> None:
    """The native host path (areal_tik_plugin.runtime.native): ``public()`` (a public op call, served natively
    after its first call of a kind) gives the bits of ``python_path()`` (the kernel module's forward
    called directly: Triton's launch), eagerly and inside a CUDA graph, and the native path did serve
    the calls."""
    from areal_tik_plugin.runtime import native

    m = native.module()
    if m is None:
        rec.check(f"native_on[{tag}]", False, why="native host path off (TIK_NATIVE / build; see warnings)")
        return
    hits0 = m.stats()["hits"]
    outs = [public() for _ in range(n)]
    hits = m.stats()["hits"] - hits0
    refused = [p for p in m.stats()["plans"] if p["refused"]]
    if served is None:  # the path may leave this kind to Triton's launch (e.g. GEMM kernels with TMA descriptors)
        rec.check(f"native_served[{tag}]", True, hits=hits, calls=n, kind="info")
    else:
        rec.check(f"native_served[{tag}]", hits >= n - 1, hits=hits, calls=n, refused=refused[:4],
                  refused_kinds=[f"{e}: {why}" for e, why in list(native._REFUSED)[-4:]])
    ref = python_path()
    refs = ref if isinstance(ref, tuple) else (ref,)
    for i, o in enumerate(outs):
        for j, (a, b) in enumerate(zip(o if isinstance(o, tuple) else (o,), refs)):
            rec.bitwise(f"native_eager[{tag}/call{i}/out{j}]", a, b)
    # CUDA graph: the public call captured (native launch on the capture stream), replayed, compared
    hits0 = m.stats()["hits"]
    graph_vs_eager(rec, f"native_graph[{tag}]", public, lambda i: None, python_path, n=1)
    rec.check(f"native_graph_hits[{tag}]", True, hits=m.stats()["hits"] - hits0, kind="info")


def native_host_row(rec, name: str, public, python_path, hf=None) -> dict:
    """Host time per call (issue only, bench.host_us) of the public op (native path), the kernel module's
    forward (Triton's launch path) and the HF eager baseline, measured here in one process."""
    from areal_tik_plugin import bench

    public()
    row = {"native_host_us": bench.host_us(public), "python_host_us": bench.host_us(python_path)}
    if hf is not None:
        row["hf_host_us"] = bench.host_us(hf)
        row["native_vs_hf_host"] = row["hf_host_us"] / row["native_host_us"]
    row["native_vs_python_host"] = row["python_host_us"] / row["native_host_us"]
    rec.bench(f"native_host[{name}]", **row)
    return row


def check_native_autograd(rec, tag: str, make_inputs, op, must_serve: bool = True) -> None:
    """Training calls: ``op(*make_inputs())`` with inputs that require grad (autograd's forward, where the
    native host path serves the kernel call) gives the same outputs and gradients, bit for bit, as the same
    calls with the native path off, in this process."""
    from areal_tik_plugin.runtime import native

    m = native.module()
    if m is None:
        rec.check(f"native_autograd_on[{tag}]", False, why="native host path off")
        return

    def run():
        ins = make_inputs()
        out = op(*ins)
        outs = out if isinstance(out, tuple) else (out,)
        sum((o.float() * (j + 1)).sum() for j, o in enumerate(outs)).backward()
        return [o.detach() for o in outs], [t.grad for t in ins], all(o.grad_fn is not None for o in outs)

    run()  # the first call of a kind learns its plan
    hits0 = m.stats()["hits"]
    outs, grads, tracked = run()
    served = m.stats()["hits"] - hits0
    saved = native._MOD
    native._MOD = None
    try:
        routs, rgrads, _ = run()
    finally:
        native._MOD = saved
    rec.check(f"native_autograd_served[{tag}]", tracked and (served >= 1 or not must_serve), hits=served,
              graph_tracked=tracked)
    for j, (a, b) in enumerate(zip(outs, routs)):
        rec.bitwise(f"native_autograd_out[{tag}/out{j}]", a, b)
    for j, (a, b) in enumerate(zip(grads, rgrads)):
        rec.bitwise(f"native_autograd_grad[{tag}/in{j}]", a, b)
