"""SGLang's HTTP server started through the plugin's launcher, checked bit for bit against the training side.

    python tests/helpers/sglang_http_check.py WORKDIR PORT

Run with the Python of a venv holding the SGLang under test (tests/integrations/test_sglang010.py: 0.5.10.post1, which
AReaL starts as an HTTP server). Starts ``python -m areal_tik_plugin.integrations.sglang.launch ...`` (the
HTTP process; SGLang spawns the scheduler and detokenizer), sends a greedy and two sampled requests to
``/generate`` with ``return_logprob``, stops the server, then computes the training-side log-probs
(``sglang_check.training_logprobs``) and prints ``mismatching requests: [...] of N`` and ``ops ok: bool``.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before anything imports triton (no GPU on the test machine)

import json  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import urllib.request  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from areal_tik_plugin.integrations.sglang import check as SC  # noqa: E402
from tests.helpers.sglang_models import build_model  # noqa: E402

REQUESTS = (([5, 6, 7, 8, 9, 10, 11], 0.0), ([12, 13, 14], 1.0), ([20, 21, 22, 23, 24], 0.7))


def main(workdir: str, port: int) -> int:
    model = build_model(os.path.join(workdir, "qwen3"), "qwen3")
    stats = os.path.join(workdir, "stats")
    cmd = [sys.executable, "-m", "areal_tik_plugin.integrations.sglang.launch", "--model-path", model,
           "--host", "127.0.0.1", "--port", str(port), "--device", "cpu", "--attention-backend", "tik",
           "--sampling-backend", "pytorch", "--grammar-backend", "none", "--dtype", "bfloat16",
           "--mem-fraction-static", "0.4", "--max-total-tokens", "4096", "--max-running-requests", "8",
           "--disable-cuda-graph", "--skip-server-warmup", "--sleep-on-idle", "--log-level", "error"]
    if not SC.plugin_system():  # 0.5.10: no piecewise CUDA graphs on CPU (its later releases lack the flag)
        cmd.append("--disable-piecewise-cuda-graph")
    log = open(os.path.join(workdir, "server.log"), "w")
    p = subprocess.Popen(cmd, env=SC.child_env(stats), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    reqs = []
    try:
        t0 = time.time()
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5)
                break
            except Exception as e:  # noqa: BLE001 -- not up yet
                if p.poll() is not None or time.time() - t0 > 600:
                    print(f"server not healthy ({e!r}); log {log.name}", file=sys.stderr)
                    return 1
                time.sleep(2)
        for ids, t in REQUESTS:
            body = {"input_ids": ids, "return_logprob": True,
                    "sampling_params": {"temperature": t, "max_new_tokens": 5, "ignore_eos": True, "sampling_seed": 7}}
            req = urllib.request.Request(f"http://127.0.0.1:{port}/generate", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
            lp = json.load(urllib.request.urlopen(req, timeout=600))["meta_info"]["output_token_logprobs"]
            reqs.append((ids, [x[1] for x in lp], [x[0] for x in lp], t if t > 0 else 1.0))
    finally:
        try:  # the server's scheduler / detokenizer share its process group
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()
    train = SC.training_logprobs(model, [(a, b, t) for a, b, _, t in reqs])
    print(f"mismatching requests: {SC.bitwise_mismatches([lp for *_, lp, _ in reqs], train)} of {len(reqs)}")
    print(f"ops ok: {SC.summarize(SC.read_stats(stats), moe=False)['ok']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2])))
