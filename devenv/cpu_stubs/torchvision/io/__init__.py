from enum import Enum

from torchvision import _Placeholder


class ImageReadMode(Enum):
    UNCHANGED = 0
    GRAY = 1
    GRAY_ALPHA = 2
    RGB = 3
    RGB_ALPHA = 4


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return _Placeholder
