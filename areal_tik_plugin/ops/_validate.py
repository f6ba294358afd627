"""Input validation shared by the public ops: clear ValueError/TypeError naming what was expected."""

from __future__ import annotations

import torch

FLOAT_DTYPES = (torch.bfloat16, torch.float16)
INDEX_DTYPES = (torch.int32, torch.int64)


def tensor(name: str, x, *, ndim: int | None = None, dtypes=None, device: torch.device | None = None,
           contiguous_last: bool = False, contiguous: bool = False, allow_empty: bool = False) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if device is None and x.device.type not in ("cpu", "cuda"):  # the op's first tensor: the others follow it
        raise ValueError(f"{name}: expected a CUDA tensor (or a CPU one under the Triton interpreter), got device "
                         f"{x.device}")
    if ndim is not None and x.dim() != ndim:
        raise ValueError(f"{name}: expected a {ndim}-D tensor, got shape {tuple(x.shape)}")
    if dtypes is not None and x.dtype not in dtypes:
        names = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise ValueError(f"{name}: expected dtype in ({names}), got {str(x.dtype).replace('torch.', '')}")
    if device is not None and x.device != device:
        raise ValueError(f"{name}: expected device {device}, got {x.device}")
    if not allow_empty and x.numel() == 0:
        raise ValueError(f"{name}: expected a non-empty tensor, got shape {tuple(x.shape)}")
    if contiguous and not x.is_contiguous():
        raise ValueError(f"{name}: expected a contiguous tensor (call .contiguous()), got strides {x.stride()}")
    if contiguous_last and x.dim() > 0 and x.stride(-1) != 1:
        raise ValueError(f"{name}: expected the last dimension to be contiguous (stride 1), got strides {x.stride()}")
    return x


def same_dtype(ref_name: str, ref: torch.Tensor, **others: torch.Tensor) -> None:
    for n, t in others.items():
        if t.dtype != ref.dtype:
            raise ValueError(f"{n}: expected dtype {ref.dtype} (same as {ref_name}), got {t.dtype}")


def positive_float(name: str, x) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise TypeError(f"{name}: expected a float, got {type(x).__name__}")
    x = float(x)
    if not (x > 0.0) or x != x or x == float("inf"):
        raise ValueError(f"{name}: expected a finite positive float, got {x}")
    return x


def power_of_two_head_dim(name: str, d: int, allowed=(16, 32, 64, 128, 256)) -> None:
    if d not in allowed:
        raise ValueError(f"{name}: expected head_dim in {allowed}, got {d}")


def check_values(device: torch.device) -> bool:
    """Whether to run checks that read tensor values (host sync): always on CPU, on GPU only with
    ``TIK_CHECK_VALUES=1`` (a CUDA-graph-captured decode must not sync)."""
    import os

    if device.type == "cpu":
        return True
    if os.environ.get("TIK_CHECK_VALUES", "0") in ("", "0"):
        return False
    return not torch.cuda.is_current_stream_capturing()


# ------------------------------------------------------------------------------------------------
# memoized static checks (every public op)
# ------------------------------------------------------------------------------------------------
def sig(t):
    """Everything the static checks of an op read from one argument, as a hashable key part.

    A tensor: ``(type, shape, strides, dtype, device)`` -- ndim, numel, contiguity and the stride checks
    all follow from shape and strides. ``None``: ``None``. A scalar: ``(type, value)`` (``True`` and
    ``1`` stay apart). Values of tensors are not in it: value checks (:func:`check_values`) run on
    every call.
    """
    if isinstance(t, torch.Tensor):
        return (type(t), t.shape, t.stride(), t.dtype, t.device)
    return None if t is None else (type(t), t)


class Memo:
    """Argument signatures (see :func:`sig`) that passed an op's static checks.

    Only a signature whose checks passed is added, so a call with any changed static property (shape,
    strides, dtype, device, tensor type, scalar value, kernel implementation) misses and is checked
    again, raising the public op's error. Bounded: cleared when full.
    """

    __slots__ = ("_seen", "_limit")

    def __init__(self, limit: int = 4096):
        self._seen: set = set()
        self._limit = limit

    def __contains__(self, key) -> bool:
        try:
            return key in self._seen
        except TypeError:  # an unhashable scalar: never memoized, always checked
            return False

    def add(self, key) -> None:
        try:
            hash(key)
        except TypeError:
            return
        if len(self._seen) >= self._limit:
            self._seen.clear()
        self._seen.add(key)

    def once(self, key, check, *args) -> None:
        """Run ``check(*args)`` unless ``key`` passed before; remember ``key`` once it has passed (a
        failing check raises and leaves the key out)."""
        if key not in self:
            check(*args)
            self.add(key)

    def clear(self) -> None:
        self._seen.clear()

    def __len__(self) -> int:
        return len(self._seen)
