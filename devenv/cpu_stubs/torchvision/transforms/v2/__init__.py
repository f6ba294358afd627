from torchvision import _Placeholder
from torchvision.transforms import InterpolationMode  # noqa: F401


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return _Placeholder
