"""AReaL's RPC worker with the plugin installed (single-controller mode).

``python -m areal_tik_plugin.integrations.areal.worker <rpc_server args>`` reads the ``tik``
section from the ``AREAL_TIK_CONFIG`` environment variable (set by ``areal_tik_plugin.run`` in
every ``scheduling_spec.env_vars``), installs :func:`hooks.install_worker`, then runs
``areal.infra.rpc.rpc_server`` unchanged. AReaL imports engines by dotted class path inside this
process, after the patches are in place.
"""

from __future__ import annotations

import runpy


def main() -> None:
    from .config import TikConfig
    from .hooks import install_worker

    tik = TikConfig.from_env()
    if tik is not None:
        install_worker(tik)
    runpy.run_module("areal.infra.rpc.rpc_server", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
