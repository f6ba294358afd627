"""The no-op logger API shared by the import-only `swanlab` and `trackio` stubs in this folder."""

__version__ = "0.0.0+tik-stub"


def login(*args, **kwargs):
    return None


def init(*args, **kwargs):
    return None


def log(*args, **kwargs):
    return None


def finish(*args, **kwargs):
    return None
