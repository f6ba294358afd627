"""Import-only stub of `trackio` for CPU tests: AReaL 1.0.4's stats logger imports it unconditionally and
calls init/log/finish even with logging to it disabled. Never on sys.path when the real package is
installed (see areal_tik_plugin.integrations.areal.env.cpu_stub_paths)."""

from _tik_noop_logger import __version__, finish, init, log, login  # noqa: F401
