"""Summarize a py-spy ``record --format raw`` file (collapsed stacks, one ``frame;frame;... count`` per line):
per process, the samples (py-spy drops idle samples by default, so they count time on the CPU), the share
of samples whose stack passes through each package (this plugin, SGLang, torch, Triton), and the functions
with the most inclusive samples.

    python3 benchmarks/probes/pyspy_summary.py RAW [--top 25] [--json OUT]

Used by ``benchmarks/gpu_integrations.sh sglang-profile`` to see where the host time of SGLang's decode goes.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter, defaultdict

PACKAGES = (("areal_tik_plugin", ("areal_tik_plugin/", "kernels/tik_v1/")), ("sglang", ("sglang/",)),
            ("triton", ("triton/",)), ("torch", ("torch/",)))
_FRAME = re.compile(r"^(?P<fn>.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")


def parse(lines):
    """Yield (process, [frames], count). A frame is ``fn (file:line)``; a first frame naming a process
    (``process 123:"cmd"``) or a thread is taken as the stack's owner, not as a frame."""
    for raw in lines:
        raw = raw.rstrip("\n")
        if not raw or " " not in raw:
            continue
        stack, _, n = raw.rpartition(" ")
        try:
            count = int(n)
        except ValueError:
            continue
        frames = stack.split(";")
        proc = "?"
        while frames and (frames[0].startswith("process ") or frames[0].startswith("thread ")):
            head = frames.pop(0)
            if head.startswith("process "):
                proc = head[len("process "):][:160]
        yield proc, frames, count


def package(frame: str) -> str:
    m = _FRAME.match(frame)
    path = m.group("file") if m else frame
    for name, keys in PACKAGES:
        if any(k in path for k in keys):
            return name
    return "other"


def short(frame: str) -> str:
    m = _FRAME.match(frame)
    if not m:
        return frame[:120]
    f = m.group("file")
    for key in ("site-packages/", "/work/main/", "/root/"):
        if key in f:
            f = f.split(key, 1)[1]
    return f"{m.group('fn')} ({f}:{m.group('line') or '?'})"[:140]


def summarize(lines, top: int = 25) -> dict:
    procs: dict = defaultdict(lambda: {"samples": 0, "packages": Counter(), "inclusive": Counter(),
                                       "self": Counter()})
    for proc, frames, count in parse(lines):
        p = procs[proc]
        p["samples"] += count
        for pkg in {package(f) for f in frames}:
            p["packages"][pkg] += count
        for f in set(frames):
            p["inclusive"][short(f)] += count
        if frames:
            p["self"][short(frames[-1])] += count
    out = {}
    for proc, p in sorted(procs.items(), key=lambda kv: -kv[1]["samples"]):
        n = max(1, p["samples"])
        out[proc] = {"samples": p["samples"],
                     "share_through": {k: round(v / n, 4) for k, v in p["packages"].most_common()},
                     "inclusive_top": [(f, c, round(c / n, 4)) for f, c in p["inclusive"].most_common(top)],
                     "self_top": [(f, c, round(c / n, 4)) for f, c in p["self"].most_common(top)]}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python3 benchmarks/probes/pyspy_summary.py")
    ap.add_argument("raw")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    try:
        with open(a.raw) as f:
            res = summarize(f, a.top)
    except OSError as e:
        print(f"cannot read the py-spy raw file {a.raw!r}: {e}", file=sys.stderr)
        return 2
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    for proc, r in res.items():
        print(f"== {proc}: {r['samples']} samples; through " +
              ", ".join(f"{k} {v:.0%}" for k, v in r["share_through"].items()))
        if r["samples"] < 50:
            continue
        print("  inclusive:")
        for fr, c, s in r["inclusive_top"]:
            print(f"    {s:6.1%} {fr}")
        print("  self:")
        for fr, c, s in r["self_top"][:12]:
            print(f"    {s:6.1%} {fr}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
