"""The SGLang server start of the AReaL launcher (``sglang_cmd.start_server``): a port another process took
between the launcher's free-port pick and the server's own bind is retried on a fresh port; any other exit is
not. A small HTTP server stands in for SGLang (the bind and the health check are the real ones)."""

import os
import socket
import sys

import pytest

from areal_tik_plugin.integrations.areal import sglang_cmd as S
from areal_tik_plugin.integrations.areal.config import TikConfig


# A stand-in for the SGLang server process that binds its port like SGLang's HTTP server: answers /health with
# 200, or fails to bind (a real bind error, "[Errno 98] Address already in use") when the port is taken.
HEALTH_SERVER = ("import http.server, sys\n"
                 "class H(http.server.BaseHTTPRequestHandler):\n"
                 "    def do_GET(self):\n"
                 "        self.send_response(200); self.end_headers()\n"
                 "    def log_message(self, *a): pass\n"
                 "http.server.HTTPServer(('127.0.0.1', int(sys.argv[1])), H).serve_forever()\n")


def test_server_start_retries_a_port_taken_before_its_bind(tmp_path, monkeypatch):
    monkeypatch.setattr(S, "build_command", lambda args, tik, python=None: (
        [sys.executable, "-c", HEALTH_SERVER, str(args["port"])], dict(os.environ)))
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    busy = taken.getsockname()[1]
    log = str(tmp_path / "sglang_0.log")
    try:
        with pytest.raises(S.PortInUse, match=str(busy)):
            S.start_server({"host": "127.0.0.1", "port": busy}, TikConfig(), log_path=log, timeout=30)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            free = s.getsockname()[1]
        ports = iter([busy, free])
        proc, port = S.start_server_on_free_port(lambda p: {"host": "127.0.0.1", "port": p}, lambda: next(ports),
                                                 TikConfig(), log_path=log, timeout=30)
        try:
            assert port == free and S.is_healthy("127.0.0.1", free)
        finally:
            S.stop_server(proc)
        # every try on a taken port: the last refusal is raised
        with pytest.raises(S.PortInUse):
            S.start_server_on_free_port(lambda p: {"host": "127.0.0.1", "port": p}, lambda: busy, TikConfig(),
                                        tries=2, log_path=log, timeout=30)
    finally:
        taken.close()
    # a server that exits for another reason is not retried
    monkeypatch.setattr(S, "build_command", lambda args, tik, python=None: (
        [sys.executable, "-c", "raise SystemExit(3)"], dict(os.environ)))
    with pytest.raises(RuntimeError, match="exited with code 3") as e:
        S.start_server_on_free_port(lambda p: {"host": "127.0.0.1", "port": p}, lambda: free, TikConfig(),
                                    log_path=str(tmp_path / "other.log"), timeout=30)
    assert not isinstance(e.value, S.PortInUse)
