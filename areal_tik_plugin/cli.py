"""``tik`` command line. Each subcommand lives in a module with ``register(subparsers)``; heavy
imports happen inside the handlers."""

from __future__ import annotations

import argparse
import importlib
import json
import sys

# name -> module with register(subparsers); add a line when a subcommand lands.
SUBCOMMAND_MODULES = [
    "areal_tik_plugin.cli",  # evidence, kernels (below)
    "areal_tik_plugin.compare",  # compare: tik vs baseline AReaL runs -> report + plots
    "areal_tik_plugin.search.cli",  # search (kernel search: IR, evaluator, drivers)
    "areal_tik_plugin.verify",  # verify: Constraint (1) for a whole model
    "areal_tik_plugin.integrations.sglang.check",  # sglang-check: which ops SGLang ran through ours
    "areal_tik_plugin.qualify",  # qualify: contract suite + verify on this GPU -> user evidence
]


def _cmd_evidence(args) -> int:
    from areal_tik_plugin import evidence
    from areal_tik_plugin.runtime import loader

    impl = loader.load_implementation(loader.resolve_path(args.implementation or loader.selected_name("sm_90")))
    if args.source_hash is not None and not (len(args.source_hash) == 64
                                             and all(c in "0123456789abcdef" for c in args.source_hash)):
        raise ValueError(f"--source-hash: expected 64 lowercase hex digits, got {args.source_hash!r}")
    if args.update and not args.markdown:
        raise ValueError("--update README.md needs --markdown")
    if args.markdown:
        table = evidence.render_markdown(impl, args.evidence_dir, args.source_hash)
        if args.update:
            changed = evidence.update_readme(args.update, table)
            print(f"{args.update}: {'updated' if changed else 'already current'}", file=sys.stderr)
        else:
            print(table, end="")
        m = evidence.measured(impl, args.evidence_dir, args.source_hash)
        if m["awaiting"]:
            print(f"awaiting the GPU run: {', '.join(m['awaiting'])}", file=sys.stderr)
        for op, keys in m["unnamed"].items():
            print(f"{op}: timings without a baseline name, not in the table: {', '.join(keys)}", file=sys.stderr)
        return 0 if not args.strict or not (m["awaiting"] or m["failing"]) else 1
    s = evidence.summary(impl, args.evidence_dir)
    s["running_environment"] = loader.evidence_status(impl)  # this machine's Triton x torch x GPU
    if args.json:
        print(json.dumps(s, indent=2))
    else:
        print(f"implementation {s['implementation']}  source hash {s['source_hash'][:16]}")
        print(f"this machine: {s['running_environment']['message']}")
        print(f"{'op':<12}{'evidence':>9}{'passed':>8}{'failed':>8}  benchmarks (geomean ratio baseline/ours)")
        for op, v in s["ops"].items():
            b = ", ".join(f"{k} {x['geomean']:.2f}" for k, x in v["benchmarks"].items())
            print(f"{op:<12}{'yes' if v['evidence_matches_hash'] else 'NO':>9}{v['checks_passed']:>8}{v['checks_failed']:>8}  {b}")
        for m in s["models"]:
            state = "bit-identical" if m["plugin_bit_identical"] else "NOT bit-identical"
            lo, hi = m.get("response_len_min", m["response_len"]), m["response_len"]
            resp = f"{hi}" if lo == hi else f"{lo}..{hi}"
            print(f"model {m['model']} ({m['layers']} layers) on {m['gpu'] or m['device']}: {state}, batch {m['batch']}, "
                  f"prompt {m['prompt_len']}, response {resp}"
                  f"{'' if m['matches_hash'] else ' (older kernel hash)'}")
        integ = s["integrations"]
        for r in integ["layer_bench"]:
            print(f"layer bench ({r['file']}): baseline/plugin mean {r['mean_ratio']:.2f}, min {r['min_ratio']:.2f} "
                  f"over {r['n']} (model, R){'' if r['matches_hash'] else ' (older kernel hash)'}")
        for r in integ["sglang_gpu"]:
            state = "bit-identical" if r["bit_identical"] else "NOT bit-identical"
            print(f"SGLang Engine tik on {r['gpu'] or r['device']} ({r['file']}): {r['requests']} requests {state} "
                  f"vs the training path, ops through ours: {r['ops_through_ours']}"
                  + {True: ", CUDA graphs", False: ", eager", None: ""}[r.get("cuda_graphs")])
            tps = {k: v["greedy_tokens_per_s"] for k, v in r["backends"].items() if v.get("greedy_tokens_per_s")}
            if "tik" in tps and len(tps) > 1:
                print("  tokens/s (same workload): " + ", ".join(
                    f"{k} {v:.0f}" + ("" if k == "tik" else f" (tik {tps['tik'] / v:.2f}x)") for k, v in tps.items()))
        by_mode = {r["tik"]: r for r in integ["areal_recompute"]}
        if True in by_mode and False in by_mode:
            b, t = by_mode[False], by_mode[True]
            print(f"AReaL FSDP train step ({b['gpu']}): stock with recompute {b['step_with_recompute_s']:.2f} s, "
                  f"plugin without recompute {t['step_without_recompute_s']:.2f} s "
                  f"({b['step_with_recompute_s'] / t['step_without_recompute_s']:.2f}x)")
        for r in integ.get("areal_gsm8k", []):
            t, b = r["tik"], r["baseline"]
            mon = t.get("monitor") or {}
            print(f"AReaL GSM8K GRPO on the GPU ({r['file']}): tik {t['tokens_per_s']:.0f} tok/s vs baseline "
                  f"{b['tokens_per_s']:.0f} ({t['tokens_per_s'] / b['tokens_per_s']:.2f}x), step {t['step_s']:.1f} vs "
                  f"{b['step_s']:.1f} s over {t['measured_steps']} steps; tik monitor "
                  f"{int(mon.get('mismatched_tokens', 0))}/{int(mon.get('checked_tokens', 0))} tokens differ"
                  + (" -> FALLBACK to recompute" if t.get("fallback_active") else ""))
        for r in integ.get("areal_bits", []):
            print(f"AReaL FSDP actor vs plain patched HF ({r['file']}, {r['gpu']}): {r['mismatched_tokens']}/"
                  f"{r['tokens']} log-probs differ (max {r['max_abs_diff']:.3g})")
    return 0 if s["all_ok"] or not args.strict else 1


def _cmd_kernels(args) -> int:
    from areal_tik_plugin.runtime import loader

    if args.action == "list":
        for name in loader.list_implementations():
            path = loader.resolve_path(name)
            man = loader.read_manifest(path)
            actual = loader.compute_source_hash(path)
            state = "ok" if actual == man["source_hash"] else "HASH MISMATCH"
            print(f"{name:<20} {actual[:16]}  {state}  ops: {', '.join(sorted(man['entry_points']))}")
        sel = {a: loader.selected_name(a) for a in ("cpu", "sm_80", "sm_90")}
        print("selected:", sel)
        return 0
    if args.action == "rehash":
        if not args.name:
            print("tik kernels rehash NAME", file=sys.stderr)
            return 2
        print(loader.write_manifest_hash(loader.resolve_path(args.name)))
        return 0
    return 2


def register(sub) -> None:
    p = sub.add_parser("evidence", help="summary of committed GPU evidence for the selected implementation")
    p.add_argument("--json", action="store_true")
    p.add_argument("--implementation", default=None)
    p.add_argument("--strict", action="store_true", help="exit 1 unless every op has passing evidence")
    p.add_argument("--markdown", action="store_true",
                   help="the README's Measured table from the evidence of the current kernel hash")
    p.add_argument("--update", metavar="README", default=None,
                   help="with --markdown: rewrite the table between the measured markers of this file")
    p.add_argument("--source-hash", default=None,
                   help="with --markdown: render the evidence of this full source hash instead of the current one")
    p.add_argument("--evidence-dir", default=None, help="evidence root (default: the repository's evidence/)")
    p.set_defaults(func=_cmd_evidence)
    p = sub.add_parser("kernels", help="list implementations / recompute a manifest hash")
    p.add_argument("action", choices=["list", "rehash"])
    p.add_argument("name", nargs="?")
    p.set_defaults(func=_cmd_kernels)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="tik", description="areal-tik-plugin: unified bitwise kernels for AReaL")
    sub = ap.add_subparsers(dest="command", metavar="COMMAND")
    for modname in SUBCOMMAND_MODULES:
        mod = sys.modules[__name__] if modname == __name__ else importlib.import_module(modname)
        mod.register(sub)
    return ap


def main(argv=None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    if not getattr(args, "func", None):
        ap.print_help()
        return 0
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
