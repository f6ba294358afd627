"""The short table of a baselines run (benchmarks/gpu_baselines.sh): per op and row kind, ours vs the
strongest baseline (geomean of the per-row ratios, cold and CUDA-graph), which baseline was the strongest
how often, the skipped baselines with their reasons, and the layer bench totals.

    python -m benchmarks.baselines_table DIR
"""

from __future__ import annotations

import glob
import json
import os
import sys


def contract_lines(rec: dict) -> list[str]:
    lines = []
    for op, o in sorted(rec.get("ops", {}).items()):
        summ = o.get("bench_summary", {})
        for key in sorted(k for k in summ if k.endswith("vs_strongest_cold")):
            prefix = key[: -len("vs_strongest_cold")]
            c, g = summ.get(key), summ.get(prefix + "vs_strongest_graph")
            fmt = lambda s: f"{s['geomean']:.3f} [{s['min']:.2f}-{s['max']:.2f}] n={s['n']}" if s else "-"  # noqa: E731
            lines.append(f"{op:<10} {prefix or '(all)':<28} cold {fmt(c):<28} graph {fmt(g)}")
        for b in o.get("benchmarks", []):
            if b.get("name", "").endswith("strongest_baselines"):
                for m, counts in b.get("counts", {}).items():
                    top = ", ".join(f"{n} x{k}" for n, k in sorted(counts.items(), key=lambda x: -x[1])[:3])
                    lines.append(f"{'':<10} {b['name'][:-len('strongest_baselines')] or '(all)':<28} strongest {m}: {top}")
        skipped = {(b.get("baseline"), b.get("reason")) for b in o.get("benchmarks", []) if b.get("name") == "baseline_skipped"}
        for name, why in sorted(skipped):
            lines.append(f"{'':<10} skipped {name}: {why}"[:220])
        for e in o.get("errors", [])[:3]:
            lines.append(f"{'':<10} ERROR {e}"[:220])
    return lines


def layer_lines(rec: dict) -> list[str]:
    lines = []
    for m in rec.get("models", []):
        for row in m.get("results", []):
            p, b = row.get("plugin_us"), row.get("baseline_us")
            if not p or not b:
                lines.append(f"layer {m.get('model')} {row.get('batch', '')} R={row.get('decode')}: incomplete")
                continue
            phases = " ".join(f"{k}={b[k] / p[k]:.2f}" for k in ("prefill", "decode", "update_fwd", "update_bwd")
                              if p.get(k) and b.get(k) is not None)
            lines.append(f"layer {m.get('model'):<14} {str(row.get('batch', 'b1')):<6} R={row.get('decode'):<5} "
                         f"total {b['total'] / p['total']:.3f} ({phases})")
        for e in m.get("errors", [])[:3]:
            lines.append(f"layer {m.get('model')} ERROR {e}"[:220])
    return lines


def main(argv=None) -> int:
    d = (argv or sys.argv[1:] or ["."])[0]
    out = []
    for path in sorted(glob.glob(os.path.join(d, "*.json"))):
        try:
            rec = json.load(open(path))
        except Exception as e:
            out.append(f"{os.path.basename(path)}: unreadable ({type(e).__name__})")
            continue
        if "ops" in rec:
            out += contract_lines(rec)
        elif "models" in rec:
            out += layer_lines(rec)
        elif "jobs" in rec:
            out.append(f"flashinfer prebuild {rec.get('seconds')} s; failed: {','.join(rec.get('failed', [])) or 'none'}")
    print("\n".join(out) if out else f"no JSON under {d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
