"""KV-cache write (SGLang set_kv_buffer semantics): CPU tests (interpreter). Exact copies only."""

from __future__ import annotations

import pytest
import torch

from areal_tik_plugin import ops

from tests.helpers.rowops_testutil import assert_bitwise, bits, rand


def pool(slots, hkv, D, dtype=torch.bfloat16):
    return torch.full((slots, hkv, D), 7.0, dtype=dtype), torch.full((slots, hkv, D), -7.0, dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("T,hkv,D", [(1, 2, 128), (17, 1, 64), (33, 8, 96)])
def test_exact_copy(dtype, T, hkv, D):
    kc, vc = pool(64, hkv, D, dtype)
    k0, v0 = kc.clone(), vc.clone()
    k, v = rand(T, hkv, D, dtype=dtype, seed=T), rand(T, hkv, D, dtype=dtype, seed=T + 1)
    loc = torch.randperm(64, generator=torch.Generator().manual_seed(T))[:T]
    ops.kv_write(kc, vc, loc, k, v)
    ref_k, ref_v = k0.clone(), v0.clone()
    ref_k[loc], ref_v[loc] = k, v  # SGLang: k_buffer[layer][loc] = cache_k
    assert_bitwise(kc, ref_k, "k pool")
    assert_bitwise(vc, ref_v, "v pool")


def test_special_values_and_int32_loc():
    kc, vc = pool(8, 1, 16)
    specials = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 1e-40, 3.0, -2.5, 0.0] * 2)
    k = specials.view(1, 1, 16).bfloat16()
    raw = bits(k).clone()
    raw[0, 0, 0] = 0x7FC1  # a NaN with a payload
    k = raw.view(torch.bfloat16)
    ops.kv_write(kc, vc, torch.tensor([5], dtype=torch.int32), k, k)
    assert torch.equal(bits(kc[5:6]), raw) and torch.equal(bits(vc[5:6]), raw)


def test_strided_sources_and_sequential_calls():
    T, hq, hkv, D = 9, 4, 2, 64
    qkv = rand(T, (hq + 2 * hkv) * D, seed=3)
    k = qkv[:, hq * D:(hq + hkv) * D].view(T, hkv, D)
    v = qkv[:, (hq + hkv) * D:].view(T, hkv, D)
    kc, vc = pool(32, hkv, D)
    loc = torch.arange(10, 10 + T)
    ops.kv_write(kc, vc, loc, k, v)  # a prefill chunk
    kc2, vc2 = pool(32, hkv, D)
    for t in range(T):  # the same tokens written one decode step at a time
        ops.kv_write(kc2, vc2, loc[t:t + 1], k[t:t + 1], v[t:t + 1])
    assert_bitwise(kc, kc2, "chunk vs decode writes (k)")
    assert_bitwise(vc, vc2, "chunk vs decode writes (v)")
    assert_bitwise(kc[loc], k.contiguous(), "k rows")


def test_fp8_pool():
    kc = torch.zeros(16, 2, 32, dtype=torch.float8_e4m3fn)
    vc = torch.zeros_like(kc)
    k = rand(3, 2, 32, dtype=torch.float32, seed=4).to(torch.float8_e4m3fn)
    ops.kv_write(kc, vc, torch.tensor([1, 4, 9]), k, k)
    assert torch.equal(bits(kc[[1, 4, 9]]), bits(k))


def test_empty_is_noop():
    kc, vc = pool(8, 2, 64)
    k0 = kc.clone()
    ops.kv_write(kc, vc, torch.empty(0, dtype=torch.int64), torch.empty(0, 2, 64, dtype=torch.bfloat16),
                 torch.empty(0, 2, 64, dtype=torch.bfloat16))
    assert_bitwise(kc, k0)


def test_bad_inputs():
    kc, vc = pool(8, 2, 64)
    k = rand(3, 2, 64)
    loc = torch.tensor([0, 1, 2])
    with pytest.raises(TypeError):
        ops.kv_write(kc, vc, [0, 1, 2], k, k)
    with pytest.raises(ValueError, match="loc"):
        ops.kv_write(kc, vc, torch.tensor([0, 1, 8]), k, k)
    with pytest.raises(ValueError, match="loc"):
        ops.kv_write(kc, vc, torch.tensor([0, -1, 2]), k, k)
    with pytest.raises(ValueError, match="loc"):
        ops.kv_write(kc, vc, loc.float(), k, k)
    with pytest.raises(ValueError, match="loc"):
        ops.kv_write(kc, vc, loc[:2], k, k)
    with pytest.raises(ValueError, match="k"):
        ops.kv_write(kc, vc, loc, k.float(), k)
    with pytest.raises(ValueError, match="k"):
        ops.kv_write(kc, vc, loc, rand(3, 1, 64), k)
    with pytest.raises(ValueError, match="v"):
        ops.kv_write(kc, vc, loc, k, rand(2, 2, 64))
    with pytest.raises(ValueError, match="v_cache"):
        ops.kv_write(kc, vc[:4], loc, k, k)
    with pytest.raises(ValueError, match="k_cache"):
        ops.kv_write(kc.view(8, 128), vc, loc, k, k)
