"""compile_sm90.json: sm_90 compile facts of the decode kernels (split kernel + merge) of the root kernels/tik_v2
and of every distinct tree a step of plan.yaml can build (its lineage of edit files), no GPU.

Cases at the spec's head shape (32 q heads, 8 kv heads, D 128, bf16), paged page 1 / 16: a large grid (B 4,
ctx 4096: 4 x 8 x 8 = 256 programs) and a small one (B 1, ctx 4096: 64 programs; the step that picks 4-tile
groups for grids of at most 132 programs compiles that variant here). Per kernel: registers, spills, shared
memory, CTAs per SM that registers and shared memory allow (65536 registers, 228 KiB), K/V bytes in flight per
program and per SM (tiles per iteration x 32 KiB), PTX facts (benchmarks/compile_attention_sm90.assemble).

Usage: ``python benchmarks/search_plans/h200_decode/compile_plan.py [--json OUT]`` (default: compile_sm90.json
beside this file); exit 1 on a compile error, a spill or more than 227 KiB of shared memory.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
ROOT = os.path.join(REPO, "kernels", "tik_v2")
SMEM_SM = 228 * 1024
TILE_BYTES = 64 * 128 * 2 * 2  # one K + V tile of 64 keys x D 128, bf16


def _materialize():
    """The attention plans' tree builder (benchmarks/search_plans/h200_attention/materialize.py)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "_tik_plan_materialize", os.path.join(HERE, "..", "h200_attention", "materialize.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def lineage(plan: dict, key: str) -> list[str]:
    return _materialize().lineage(plan, key)


def build(chain: list[str], dest: str) -> None:
    m = _materialize()
    m.write(m.build([os.path.join(HERE, p) for p in chain], root=ROOT), dest)


def compile_tree(impl: str) -> tuple[dict, list[str]]:
    import torch

    from benchmarks.compile_attention_sm90 import SMEM_LIMIT, assemble, compile_launch
    from benchmarks.compile_rowops_sm90 import Capture, load_impl_no_interp

    mod = load_impl_no_interp(impl)
    mod("_rowops")._PDL_DEVICES[-1] = True
    mod("_rowops").FAST_LAUNCH = False
    attn = mod("attention")
    bf16 = torch.bfloat16
    pool = torch.empty(4096 * 4 + 16, 8, 128, dtype=bf16)
    out, failures = {}, []
    for B in (4, 1):
        for page in (1, 16):
            q = torch.empty(B, 32, 128, dtype=bf16)
            lens = torch.full((B,), 4096, dtype=torch.int32)
            table = torch.zeros(B, 4096 // page, dtype=torch.int32)
            rows = torch.arange(B, dtype=torch.int32)
            with Capture() as cap:
                attn.decode(q, pool, pool, lens, table, rows, attn.default_scale(128), page, 4096)
            for kernel, a, kw in cap.records:
                name = f"decode page{page} B{B} ctx4096 ({B * 8 * 8} programs)/{kernel.fn.__name__}"
                tiles = int(kw.get("TILES", 1)) if kernel.fn.__name__ == "_attn_decode_kernel" else 0
                try:
                    facts = assemble(compile_launch(kernel, a, dict(kw)))
                except Exception as e:  # noqa: BLE001 -- a compile error is the finding
                    failures.append(f"{name}: {type(e).__name__}: {str(e)[:400]}")
                    continue
                threads = 32 * facts["num_warps"]
                regs_alloc = -(-max(facts["regs"], 1) // 8) * 8
                by_regs = 65536 // (regs_alloc * threads)
                by_smem = SMEM_SM // facts["smem"] if facts["smem"] else 32
                facts["ctas_per_sm"] = {"by_regs": by_regs, "by_smem": by_smem, "min": min(by_regs, by_smem)}
                if tiles:
                    facts["tiles_per_iter"] = tiles
                    facts["kv_in_flight_kib"] = {"per_program": tiles * TILE_BYTES // 1024,
                                                 "per_sm": min(by_regs, by_smem) * tiles * TILE_BYTES // 1024}
                ok = facts["ptxas_rc"] == 0 and facts["spill_bytes"] == 0 and facts["smem"] <= SMEM_LIMIT
                if not ok:
                    failures.append(f"{name}: ptxas rc {facts['ptxas_rc']}, spill {facts['spill_bytes']}, "
                                    f"smem {facts['smem']}")
                out[name] = facts
                print(f"{'ok  ' if ok else 'FAIL'} {name:<62} tiles {tiles or '-'} regs {facts['regs']:>3} spill "
                      f"{facts['spill_bytes']} smem {facts['smem']:>6} CTAs/SM {facts['ctas_per_sm']['min']} "
                      f"{facts['loads']} {facts['mma']} ptx {facts['ptx']}", flush=True)
    return out, failures


def main(argv=None) -> int:
    import yaml

    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=os.path.join(HERE, "compile_sm90.json"))
    ap.add_argument("--one", default="", help=argparse.SUPPRESS)  # compile one tree, facts as JSON on stdout
    args = ap.parse_args(argv)
    sys.path.insert(0, REPO)
    if args.one:  # one tree per process: the loader keeps one module per package name
        kernels, failures = compile_tree(args.one)
        print("JSON " + json.dumps({"kernels": kernels, "failures": failures}))
        return 0
    import subprocess

    import triton

    with open(os.path.join(HERE, "plan.yaml")) as f:
        plan = yaml.safe_load(f)
    chains = {(): "root"}
    for s in plan["steps"]:
        ch = tuple(lineage(plan, s["opportunity"]))
        chains.setdefault(ch, "+".join(os.path.basename(e)[:-len(".edits")] for e in ch))
    data = {"env": {"triton": triton.__version__, "target": "cuda sm_90 (ptxas -arch=sm_90a)"},
            "implementations": {}}
    bad = 0
    for ch, label in chains.items():
        print(f"== {label}", flush=True)
        tmp = tempfile.mkdtemp()
        try:
            if ch:
                build(list(ch), os.path.join(tmp, "impl"))
                impl = os.path.join(tmp, "impl")
            else:
                impl = ROOT
            r = subprocess.run([sys.executable, os.path.abspath(__file__), "--one", impl], capture_output=True,
                               text=True, cwd=REPO)
            lines = r.stdout.splitlines()
            print("\n".join(x for x in lines if not x.startswith("JSON ")), flush=True)
            got = [json.loads(x[5:]) for x in lines if x.startswith("JSON ")]
            if r.returncode or not got:
                got = [{"kernels": {}, "failures": [f"compile process rc {r.returncode}: {r.stderr[-600:]}"]}]
            kernels, failures = got[0]["kernels"], got[0]["failures"]
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        data["implementations"][label] = {"edits": list(ch), "kernels": kernels, "failures": failures}
        bad += len(failures)
        for f in failures:
            print("FAIL", f)
    with open(args.json, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
    print(f"{len(chains)} trees, {bad} failure(s) -> {args.json}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
