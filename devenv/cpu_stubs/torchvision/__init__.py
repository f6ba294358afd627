"""Import-only stand-in for torchvision on a CPU test machine (see ../README.md). Any attribute is a
placeholder that raises if it is actually used."""

__version__ = "0.0.0+tikstub"


class _Placeholder:
    def __init__(self, *a, **k):
        pass

    def __call__(self, *a, **k):
        raise RuntimeError("torchvision stub: not available on this machine")

    def __getattr__(self, name):
        return _Placeholder()


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return _Placeholder
