"""The GPU step scripts (benchmarks/gpu_*.sh) on CPU: they parse, refuse an unknown option with exit 2 and a
message, and gpu_integrations.sh / gpu_baselines.sh --dry-run print, with no option given, exactly the command
lines listed here (the evidence runs' command lines; the GSM8K steps name their model and data as the Hydra
overrides actor.path / train_dataset.path). Also the flags of the Python entry points the scripts pass (parse
only)."""

import argparse
import os
import shlex
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = ("gpu_integrations.sh", "gpu_baselines.sh", "gpu_search.sh", "gpu_verify.sh", "gpu_run.sh", "gpu_final.sh")


def sh(script, *args, out, **extra_env):
    env = {**os.environ, **extra_env, "OUT": str(out), "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]}
    return subprocess.run(["bash", os.path.join(ROOT, "benchmarks", script), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)


def dry(script, *args, out):
    """The '+ ' lines of a --dry-run, each split back into its words."""
    r = sh(script, "--dry-run", *args, out=out)
    assert r.returncode in (0, 2), r.stderr
    return r, [shlex.split(line[2:]) for line in r.stdout.splitlines() if line.startswith("+ ")]


@pytest.mark.parametrize("script", SCRIPTS)
def test_script_parses_and_refuses_an_unknown_option(script, tmp_path):
    assert subprocess.run(["bash", "-n", os.path.join(ROOT, "benchmarks", script)]).returncode == 0
    r = sh(script, "--no-such-option", out=tmp_path)
    assert r.returncode == 2 and "--no-such-option" in r.stderr, (r.stdout, r.stderr)
    assert f"benchmarks/{script}" in r.stderr  # the message names the header to read
    assert not os.path.exists(tmp_path / "pip.log") and not os.path.exists(tmp_path / "w" / "pip.log")


def test_integrations_refuses_options_after_steps_and_bad_numbers(tmp_path):
    r = sh("gpu_integrations.sh", "sglang", "--sgl-limit", "400", out=tmp_path)
    assert r.returncode == 2 and "options go first" in r.stderr
    r = sh("gpu_integrations.sh", "--sgl-limit", "4x", "sglang", out=tmp_path)
    assert r.returncode == 2 and "--sgl-limit: expected a whole number, got 4x" in r.stderr
    r = sh("gpu_integrations.sh", "--sgl-limit", out=tmp_path)
    assert r.returncode == 2 and "--sgl-limit needs a value" in r.stderr
    r = sh("gpu_verify.sh", "fast", out=tmp_path)
    assert r.returncode == 2 and "expected quick, full, verify or bench" in r.stderr
    r = sh("gpu_search.sh", "h200-knobs", "soon", out=tmp_path)
    assert r.returncode == 2 and "TIME_BUDGET_S: expected seconds" in r.stderr
    r = sh("gpu_search.sh", "h200-knobs", "60", out=tmp_path, IMPL="tik_v0_absent")
    assert r.returncode == 2 and "IMPL: expected a name under kernels/ or a folder, got tik_v0_absent" in r.stderr
    r = sh("gpu_search.sh", "h200-knobs", "60", out=tmp_path, QUICK="yes")
    assert r.returncode == 2 and "QUICK: expected 0 or 1, got yes" in r.stderr
    assert not os.path.exists(tmp_path / "pip.log")
    plan = "benchmarks/search_plans/h200_attention/next/plan.yaml"  # written for the root tik_v2
    r = sh("gpu_search.sh", "h200-knobs", "60", "--driver", "plan", "--plan", plan, out=tmp_path, IMPL="tik_v1")
    assert r.returncode == 2 and "written for the root tik_v2" in r.stderr
    (tmp_path / "p.yaml").write_text("root: tik_v0_absent\nsteps: []\n")  # IMPL unset: the plan's root is taken
    r = sh("gpu_search.sh", "h200-knobs", "60", "--driver", "plan", f"--plan={tmp_path / 'p.yaml'}", out=tmp_path)
    assert r.returncode == 2 and "got tik_v0_absent" in r.stderr
    assert not os.path.exists(tmp_path / "pip.log")


def _integrations_defaults(W):
    """What benchmarks/gpu_integrations.sh runs per step with no option given; flash_attn not importable,
    the GSM8K model absent."""
    proof = ["python3", "-m", "benchmarks.sglang_gpu_proof"]
    gsm8k = []
    for mode in ("baseline", "tik"):
        d = f"{W}/gsm8k-{mode}"
        gsm8k += [["timeout", "-k", "60", "540", "python3", "-m", "areal_tik_plugin.run", "--spmd", "--log-dir", d,
                   "recipes/gsm8k_rl.py", "--config", "recipes/gsm8k/config.yaml", "model=gpu-e2e-qwen3", "algorithm=grpo",
                   "staleness=s0", f"mode={mode}", f"cluster.fileroot=/tmp/gsm8k-{mode}/fr",
                   f"cluster.name_resolve.nfs_record_root=/tmp/gsm8k-{mode}/nr", f"trial_name=gpu-{mode}",
                   f"tik.stats_jsonl={d}/tik_stats.jsonl", "actor.path=/tmp/tik-random-qwen3-1.7b",
                   f"train_dataset.path={ROOT}/tests/data/gsm8k_tiny", "actor.attn_impl=sdpa"],
                  ["python3", "-m", "areal_tik_plugin.integrations.areal.summary", f"{d}/tik_stats.jsonl"]]
    runs = [f"{W}/gsm8k-baseline/tik_stats.jsonl", f"{W}/gsm8k-tik/tik_stats.jsonl"]
    verify = [["timeout", lim, "python3", "-m", "areal_tik_plugin.verify", "--model", *m, "--prompt-len", "1024",
               "--response-len", "128..1024", "--batch", "64", "--no-stock", "--out", f"{W}/verify-{m[0]}.json"]
              for lim, m in (("150", ["qwen2.5-1.5b"]), ("150", ["qwen3-4b"]), ("90", ["qwen3-30b-a3b", "--layers", "4"]))]
    return {
        "sglang": [["timeout", "170", *proof, "--out", f"{W}/tiny", "--stub-sgl-kernel", "--shape", "tiny", "--batch", "8",
                    "--new", "32", "--baselines", "", "--timeout", "150", "--engine-arg", "disable_cuda_graph=true"],
                   ["timeout", "390", *proof, "--out", W, "--stub-sgl-kernel", "--shape", "qwen3-4b", "--batch", "32",
                    "--new", "128", "--baselines", "flashinfer", "--repeat", "6", "--timeout", "370"]],
        "sglang-ab": [["timeout", "200", *proof, "--out", f"{W}/fast{fl}", "--stub-sgl-kernel", "--shape", "qwen3-4b",
                       "--batch", "32", "--new", "128", "--baselines", "", "--repeat", "3", "--timeout", "180"]
                      for fl in (1, 0)],
        "sglang-profile": [[*proof, "--out", f"{W}/prof", "--stub-sgl-kernel", "--shape", "qwen3-4b", "--batch", "32",
                            "--new", "128", "--baselines", "", "--repeat", "6", "--timeout", "180"],
                           ["py-spy", "record", "--subprocesses", "--nonblocking", "--rate", "100", "--format", "raw",
                            "-o", f"{W}/pyspy-raw.txt", "--pid", "PID"],
                           ["python3", "benchmarks/probes/pyspy_summary.py", f"{W}/pyspy-raw.txt", "--top", "30",
                            "--json", f"{W}/pyspy-summary.json"]],
        "liger": [["python3", "-m", "areal_tik_plugin.contract", "--out", W, "--ops", "rmsnorm,rope,swiglu", "--quick"]],
        "recompute": [["timeout", "280", "torchrun", "--nproc-per-node", "1", "recipes/bench_recompute.py", *flag,
                       "--batch", "64", "--steps", "3", "--out", f"{W}/recompute-{mode}.json"]
                      for mode, flag in (("baseline", []), ("tik", ["--tik"]))],
        "verify-full": verify,
        "layer-bench": [["timeout", "500", "python3", "-m", "benchmarks.layer_bench", "--out", W, "--quick"]],
        "gemm-sweep": [["timeout", "300", "python3", "-m", "benchmarks.gemm_sweep", "--out", W]],
        "ops-quick": [["timeout", "240", "python3", "-m", "areal_tik_plugin.contract", "--out", W, "--ops",
                       "rope,attention", "--quick"]],
        "host": [["timeout", "120", "python3", "-m", "benchmarks.host_overhead", "--out", W]],
        "search": [["bash", "benchmarks/gpu_search.sh", "h200-knobs", "300"]],
        "gsm8k-e2e": [["timeout", "200", "python3", "-m", "areal_tik_plugin.models", "/tmp/tik-random-qwen3-1.7b",
                       "qwen3", "--shape", "qwen3-1.7b", "--device", "cuda"], *gsm8k,
                      ["python3", "-m", "areal_tik_plugin.integrations.areal.summary", *runs, "--json",
                       f"{W}/gsm8k-summary.json"],
                      ["python3", "-m", "areal_tik_plugin.cli", "compare", *runs, "-o", f"{W}/gsm8k-compare"]],
        "areal-bits": [["timeout", "200", "python3", "-m", "areal_tik_plugin.models", "/tmp/tik-random-qwen3-1.7b",
                        "qwen3", "--shape", "qwen3-1.7b", "--device", "cuda"],
                       ["timeout", "220", *proof, "--out", f"{W}/bits-sglang", "--stub-sgl-kernel", "--model-dir",
                        "/tmp/tik-random-qwen3-1.7b", "--batch", "64", "--prefix", "300", "--new", "128", "--baselines", "",
                        "--timeout", "200", "--engine-arg", "chunked_prefill_size=-1", "--engine-arg",
                        "disable_radix_cache=true", "--engine-arg", "context_length=1024"],
                       ["timeout", "200", "torchrun", "--nproc-per-node", "1", "recipes/bench_recompute.py", "--tik",
                        "--model-dir", "/tmp/tik-random-qwen3-1.7b", "--check-bits", "16", "--batch", "16", "--prompt",
                        "36", "--response", "512", "--steps", "1", "--warmup", "0", "--out", f"{W}/bits-areal.json"]],
        "megatron": [["python3", "-c", "import megatron.core as m, torch; print('megatron-core', m.__version__, 'torch', "
                                       "torch.__version__)"],
                     ["timeout", "170", "python3", "-m", "areal_tik_plugin.verify", "--engine", "megatron", "--model",
                      "qwen3-4b", "--prompt-len", "1024", "--response-len", "128..1024", "--batch", "64", "--single", "2",
                      "--max-tokens-per-forward", "16384", "--out", f"{W}/megatron-verify.json"],
                     ["timeout", "110", "python3", "-m", "benchmarks.megatron_bench", "--out", W, "--model", "qwen3-4b",
                      "--layers", "8", "--micro-batch", "4", "--seq-len", "2048", "--steps", "5", "--warmup", "2",
                      "--deadline-s", "90"],
                     ["python3", "-m", "benchmarks.megatron_bench", "--summary", W]],
    }


def test_integrations_dry_run_defaults_are_the_old_command_lines(tmp_path):
    expected = _integrations_defaults(f"{tmp_path}/w")
    for step, lines in expected.items():  # one step per call: gsm8k-e2e's group would carry over to later steps
        r, got = dry("gpu_integrations.sh", step, out=tmp_path)
        assert r.returncode == 0, (step, r.stdout, r.stderr)
        assert got == lines, step
    assert not os.path.exists(tmp_path / "w")  # a dry run leaves nothing behind
    r, got = dry("gpu_integrations.sh", "gsm8k", out=tmp_path)
    assert "model=gpu-random-qwen3" in got[1] and got[1][3] == "240" and "actor.attn_impl=sdpa" not in got[1]


def test_integrations_options_reach_the_command_lines(tmp_path):
    W = f"{tmp_path}/w"
    _, got = dry("gpu_integrations.sh", "--sgl-limit", "400", "--sgl-repeat", "5", "--no-sgl-tiny", "--sgl-eager",
                 "--sgl-shape", "qwen3-30b-a3b", "--sgl-moe-layers", "2", "--sgl-baselines", "", "sglang", out=tmp_path)
    assert got == [["timeout", "400", "python3", "-m", "benchmarks.sglang_gpu_proof", "--out", W, "--stub-sgl-kernel",
                    "--shape", "qwen3-30b-a3b", "--batch", "32", "--new", "128", "--baselines", "", "--repeat", "5",
                    "--timeout", "380", "--engine-arg", "disable_cuda_graph=true", "--moe-layers", "2"]]
    _, got = dry("gpu_integrations.sh", "--no-sgl-tiny", "--no-sgl-fi-prebuild", "sglang", out=tmp_path)
    assert got == [["timeout", "390", "python3", "-m", "benchmarks.sglang_gpu_proof", "--out", W, "--stub-sgl-kernel",
                    "--shape", "qwen3-4b", "--batch", "32", "--new", "128", "--baselines", "flashinfer", "--repeat", "6",
                    "--timeout", "370", "--no-fi-prebuild"]]
    _, got = dry("gpu_integrations.sh", "--verify-models", "qwen3-4b", "--verify-limits", "60", "--verify-flags", "",
                 "--verify-batch", "8", "verify-full", out=tmp_path)
    assert got == [["timeout", "60", "python3", "-m", "areal_tik_plugin.verify", "--model", "qwen3-4b", "--prompt-len",
                    "1024", "--response-len", "128..1024", "--batch", "8", "--out", f"{W}/verify-qwen3-4b.json"]]
    _, got = dry("gpu_integrations.sh", "--deadline-s", "400", "--search-reserve-s", "100", "--search-name", "g",
                 "search", out=tmp_path)
    assert got[0][:3] == ["bash", "benchmarks/gpu_search.sh", "g"] and 255 <= int(got[0][3]) <= 260
    _, got = dry("gpu_integrations.sh", "--gpu-model", f"{tmp_path}/m", "--gsm8k-model-group", "cpu-tiny",
                 "--gsm8k-build", "", "--gsm8k-modes", "tik", "--gsm8k-data", f"{tmp_path}/d", "--gsm8k-args",
                 "seed=3 gconfig.max_new_tokens=8", "--gsm8k-limit", "100", "gsm8k", out=tmp_path)
    assert got[0] == ["timeout", "200", "python3", "-m", "areal_tik_plugin.models", f"{tmp_path}/m", "qwen3"]
    assert got[1][3] == "100" and "model=cpu-tiny" in got[1]
    assert got[1][-4:] == [f"actor.path={tmp_path}/m", f"train_dataset.path={tmp_path}/d", "seed=3",
                           "gconfig.max_new_tokens=8"]
    _, got = dry("gpu_integrations.sh", "--no-bits-sglang", "--ops", "gemm", "--ops-limit", "99", "areal-bits",
                 "ops-quick", out=tmp_path)
    assert [c[:3] for c in got] == [["timeout", "200", "python3"], ["timeout", "200", "torchrun"], ["timeout", "99", "python3"]]
    assert got[2][got[2].index("--ops") + 1] == "gemm"
    _, got = dry("gpu_integrations.sh", "--deadline-s", "200", "--mg-layers", "12", "--mg-batch", "8", "--mg-model",
                 "qwen2.5-1.5b", "--mg-bench-args", "--layers 2 --steps 3", "--mg-bench-reserve-s", "80", "megatron",
                 out=tmp_path)
    v, b = got[1], got[2]
    assert v[:2] == ["timeout", "120"] or v[:2] == ["timeout", "119"]  # 200 - elapsed - 80 s for the bench
    assert v[v.index("--model") + 1:v.index("--model") + 4] == ["qwen2.5-1.5b", "--layers", "12"]
    assert v[v.index("--batch") + 1] == "8"
    assert b[:2] == ["timeout", "110"] and b[b.index("--model") + 1:b.index("--deadline-s")] == [
        "qwen2.5-1.5b", "--layers", "2", "--steps", "3"] and b[-1] == "90"
    _, got = dry("gpu_integrations.sh", "--deadline-s", "100", "--mg-bench-reserve-s", "50", "megatron", out=tmp_path)
    assert got[1][1] in ("50", "49") and got[2][1] in ("90", "89") and int(got[2][-1]) == int(got[2][1]) - 20


BASELINE_DEFAULTS = [  # benchmarks/gpu_baselines.sh with no option given (FlashInfer carried)
    ["python3", "-m", "benchmarks.flashinfer_prebuild", "--out", "{W}/fi_prebuild.json", "--timeout", "240", "--jobs", "14"],
    *[["timeout", "200", "python3", "-m", "areal_tik_plugin.contract", "--out", "{W}", "--ops", s, "--no-checks"]
      for s in ("gemm", "moe", "logprob")],
    ["timeout", "200", "python3", "-m", "areal_tik_plugin.contract", "--out", "{W}", "--ops", "rmsnorm,rope,swiglu,kv_write",
     "--no-checks", "--quick-bench"],
    ["timeout", "200", "python3", "-m", "areal_tik_plugin.contract", "--out", "{W}", "--ops", "attention", "--no-checks"],
    ["timeout", "180", "python3", "-m", "benchmarks.layer_bench", "--out", "{W}", "--quick", "--models",
     "qwen3-4b,qwen3-30b-a3b", "--decode", "1024,4096"],
    ["python3", "-m", "benchmarks.baselines_table", "{W}"],
]


def test_baselines_dry_run_defaults_are_the_old_command_lines(tmp_path):
    r, got = dry("gpu_baselines.sh", out=tmp_path)
    assert r.returncode == 0, r.stderr
    assert got == [[a.replace("{W}", f"{tmp_path}/w") for a in c] for c in BASELINE_DEFAULTS]
    assert not os.path.exists(tmp_path / "w")


def test_baselines_options_reach_the_command_lines(tmp_path):
    W = f"{tmp_path}/w"
    _, got = dry("gpu_baselines.sh", "--steps", "gemm rowops attention layer", "--gemm-m", "1,8", "--baselines-off",
                 "flashinfer,liger", "--fi-prefill-backends", "fa2", "--rowops-full", "--layer-args", "--quick",
                 out=tmp_path)
    off = ["--baselines-off", "flashinfer,liger"]
    assert got == [  # flashinfer switched off: no prebuild
        ["timeout", "200", "python3", "-m", "areal_tik_plugin.contract", "--out", W, "--ops", "gemm", "--no-checks", *off,
         "--gemm-m", "1,8"],
        ["timeout", "200", "python3", "-m", "areal_tik_plugin.contract", "--out", W, "--ops", "rmsnorm,rope,swiglu,kv_write",
         "--no-checks", *off],
        ["timeout", "200", "python3", "-m", "areal_tik_plugin.contract", "--out", W, "--ops", "attention", "--no-checks",
         *off, "--fi-prefill-backends", "fa2"],
        ["timeout", "180", "python3", "-m", "benchmarks.layer_bench", "--out", W, "--quick", *off],
        ["python3", "-m", "benchmarks.baselines_table", W]]
    _, got = dry("gpu_baselines.sh", "--steps", "layer", "--fi-prebuild-s", "60", "--deadline-s", "100", out=tmp_path)
    assert got[0][got[0].index("--timeout") + 1] == "60" and got[1][0] == "timeout" and got[1][1] in ("89", "90")  # 100 - 10 s
    r = sh("gpu_baselines.sh", "--deadline-s", "soon", out=tmp_path)
    assert r.returncode == 2 and "--deadline-s: expected seconds" in r.stderr


def test_contract_flags_parse_and_configure():
    from areal_tik_plugin.contract import attention, baselines, gemm
    from areal_tik_plugin.contract.__main__ import build_parser, configure

    a = build_parser().parse_args(["--out", "x", "--gemm-m", "1,8", "--baselines-off", "liger,compile",
                                   "--fi-failed", "prefill_fa3", "--fi-prefill-backends", "fa2", "--gemm-skip-knobs"])
    try:
        configure(a)
        assert gemm.GEMM_M == (1, 8) and gemm.SKIP_KNOBS and attention._fi_prefill_backends() == ("fa2",)
        assert baselines.OFF == {"liger", "compile"} and baselines.FI_FAILED == {"prefill_fa3"}
        assert baselines.switched_off("liger") and not baselines.switched_off("flashinfer")
        with pytest.raises(ValueError, match="--gemm-m: expected a comma list of integers"):
            configure(build_parser().parse_args(["--out", "x", "--gemm-m", "1,b"]))
        with pytest.raises(ValueError, match="--baselines-off: expected names from"):
            configure(build_parser().parse_args(["--out", "x", "--baselines-off", "flash"]))
        with pytest.raises(ValueError, match="--fi-prefill-backends: expected names from"):
            configure(build_parser().parse_args(["--out", "x", "--fi-prefill-backends", "fa4"]))
        configure(build_parser().parse_args(["--out", "x", "--fi-prefill-backends", ""]))
        assert attention._fi_prefill_backends() == ()
    finally:  # the defaults: everything
        configure(build_parser().parse_args(["--out", "x"]))
    assert gemm.GEMM_M == () and not gemm.SKIP_KNOBS and attention._fi_prefill_backends() == ("fa2", "fa3")
    assert baselines.OFF == baselines.FI_FAILED == frozenset()


def test_layer_bench_and_proof_flags_parse():
    from areal_tik_plugin.contract import baselines
    from benchmarks import sglang_gpu_proof

    ap = argparse.ArgumentParser()
    baselines.add_arguments(ap)
    a = ap.parse_args(["--baselines-off", "cudnn", "--fi-failed", "decode,rowops"])
    assert (a.baselines_off, a.fi_failed) == ("cudnn", "decode,rowops")
    p = sglang_gpu_proof.build_parser()
    assert p.parse_args(["--out", "x"]).moe_layers == 4
    assert p.parse_args(["--out", "x", "--moe-layers", "2"]).moe_layers == 2
    assert p.parse_args(["--out", "x"]).fi_prebuild and not p.parse_args(["--out", "x", "--no-fi-prebuild"]).fi_prebuild
    with pytest.raises(SystemExit):
        p.parse_args(["--out", "x", "--moe-layers", "two"])
