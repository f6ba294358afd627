"""Shared set-up for the Megatron tests: megatron-core or a skip, one gloo process group per test
process, tiny HF models and their Megatron twins (the plugin's spec, weights converted exactly)."""

from __future__ import annotations

import pytest

pytest.importorskip("megatron.core", reason="megatron-core is not installed (.ci/install_megatron.sh VENV)")

import torch  # noqa: E402


def setup(pp: int = 1, ep: int = 1) -> None:
    from areal_tik_plugin.integrations.megatron.verify import ensure_model_parallel

    ensure_model_parallel(pp=pp, ep=ep)


def pair(name: str, seed: int = 0):
    """(patched HF model, Megatron model) holding the same bf16 weights, eval mode."""
    from areal_tik_plugin import verify as V
    from areal_tik_plugin.integrations import transformers as TT
    from areal_tik_plugin.integrations.megatron.verify import megatron_model_from_hf

    setup()
    hf = V.build_model(name, seed=seed)
    mg, back = megatron_model_from_hf(hf)
    hf.load_state_dict(back, strict=True)
    TT.apply_to_model(hf)
    return hf, mg.eval()


def pair_config(name: str):
    from areal_tik_plugin import verify as V

    return V._hf_config(name, None)[0]


def seqs(vocab: int, lengths, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=g) for n in lengths]


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    ib = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.contiguous().view(ib), b.contiguous().view(ib))


class CudaToCpu:
    """A TorchFunctionMode that turns ``device="cuda"`` arguments into ``"cpu"``: megatron-core's
    training schedules allocate their token counters with a hard-coded ``device="cuda"``; this runs
    them unchanged on the CPU (nothing else is intercepted)."""

    def __new__(cls):
        from torch.overrides import TorchFunctionMode

        class _Mode(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                kwargs = dict(kwargs or {})
                d = kwargs.get("device")
                if d == "cuda" or (isinstance(d, torch.device) and d.type == "cuda"):
                    kwargs["device"] = "cpu"
                return func(*args, **kwargs)

        return _Mode()
