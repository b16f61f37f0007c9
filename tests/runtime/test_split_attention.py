"""The runtime's split attention (hits, then misses, merged by log-sum-exp) against the one-pass
attention, within the bound docs/overlap.md derives; greedy tokens on the parity checkpoint in
tests/runtime/test_hf_parity.py; the unsplit switch bit-exact.

``split_tolerance`` is the derivation's bound, computed from the data (the score magnitudes,
``K``, ``C + P``), not a fitted number: a merge that drops or misweighs a part is off by O(V).
"""
from __future__ import annotations

import math

import pytest
import torch

from avsg import reference
from avsg.cache.overlap import merge_attention
from avsg.kvformat import get_format
from avsg.runtime.algo.dsa import sparse_mla_partial, split_mla_attention, sparse_mla_attention
from avsg.runtime.base import Retrieved

from helpers.split_bound import U_BF16, U_FP32, gamma


def split_tolerance(q_lat, q_pe, latent, k_pe, index, scale):
    """helpers.split_bound.fp32_bound vectorised over tokens and heads (docs/overlap.md):
    |split - unsplit| <= V (4 eps_s + (8K + 6 Lambda + 4 ln K + 20) u), with V = max |v_k|,
    eps_s = gamma_{C+P} max_k scale sum |q||k|, Lambda = 2 max |s_k| + ln K."""
    R, T, H, C = q_lat.shape
    K = index.shape[-1]
    row = torch.arange(R)[:, None, None]
    sel = index.clamp(min=0).long()
    lat = latent[row, sel]                          # [R, T, K, C]
    pe = k_pe[row, sel]
    valid = (index >= 0)[:, :, None, :]             # [R, T, 1, K]
    absdot = (torch.einsum("rthc,rtkc->rthk", q_lat.abs(), lat.abs())
              + torch.einsum("rthp,rtkp->rthk", q_pe.abs(), pe.abs())) * scale
    scores = (torch.einsum("rthc,rtkc->rthk", q_lat, lat)
              + torch.einsum("rthp,rtkp->rthk", q_pe, pe)) * scale
    eps_s = gamma(C + q_pe.shape[-1]) * torch.where(valid, absdot, 0).amax(-1)
    lam = 2 * torch.where(valid, scores.abs(), 0).amax(-1) + math.log(K)
    V = torch.where(valid[:, :, 0, :, None], lat.abs(), 0).amax((-1, -2))[:, :, None]
    return V * (4 * eps_s + (8 * K + 6 * lam + 4 * math.log(K) + 20) * U_FP32)


class Attn(torch.nn.Module):
    def __init__(self, H, C, Dv, scale, gen):
        super().__init__()
        self.softmax_scale = scale
        self._w = torch.randn(H, Dv, C, generator=gen) / math.sqrt(C)

    def w_uv(self):
        return self._w


def random_case(gen, R, T, K, S, H, C, P, spread, fmt_name):
    fmt = get_format(fmt_name, C, P)
    dtype = torch.bfloat16 if fmt_name == "bf16" else torch.float32
    latent = (torch.randn(R, S, C, generator=gen) * spread).to(dtype)
    k_pe = (torch.randn(R, S, P, generator=gen) * spread).to(dtype)
    q_lat = torch.randn(R, T, H, C, generator=gen)
    q_pe = torch.randn(R, T, H, P, generator=gen)
    index = torch.stack([torch.stack([torch.randperm(S, generator=gen)[:K]
                                      for _ in range(T)]) for _ in range(R)]).to(torch.int32)
    index[torch.rand(R, T, K, generator=gen) < 0.2] = -1
    index[0, 0] = -1                                      # a query with nothing selected
    # a random subset of the slots is "missed": the split of every token by that set
    missed = torch.rand(R, S, generator=gen) < 0.3
    sel = index.clamp(min=0).long()
    is_miss = missed.gather(1, sel.view(R, -1)).view(R, T, K) & (index >= 0)
    hits = reference.compact_valid_first(index, (index >= 0) & ~is_miss)
    misses = reference.compact_valid_first(index, is_miss)
    return fmt, (latent, k_pe), q_lat, q_pe, index, (hits, misses)


@pytest.mark.parametrize("fmt_name", ["fp32", "bf16"])
@pytest.mark.parametrize("seed,spread", [(0, 1.0), (1, 4.0), (2, 0.05)])
def test_split_latent_within_the_derived_bound(fmt_name, seed, spread):
    """The merged latent output against the one-pass attention's, per element (fp32 arithmetic
    in both; bf16 KV is widened exactly). Also: each part alone is far off, so the bound is not
    vacuous (the merge's weights matter)."""
    gen = torch.Generator().manual_seed(seed)
    R, T, K, S, H, C, P = 2, 2, 64, 160, 4, 64, 16
    fmt, view, q_lat, q_pe, index, (hits, misses) = random_case(gen, R, T, K, S, H, C, P, spread,
                                                                fmt_name)
    scale = 1 / math.sqrt(C + P)
    attn = Attn(H, C, 8, scale, gen)
    full, full_lse = sparse_mla_partial(attn, q_lat, q_pe, view, index, fmt)
    a, lse_a = sparse_mla_partial(attn, q_lat, q_pe, view, hits, fmt)
    b, lse_b = sparse_mla_partial(attn, q_lat, q_pe, view, misses, fmt)
    merged, lse = merge_attention(a, lse_a, b, lse_b)
    tol = split_tolerance(q_lat, q_pe, view[0].float(), view[1].float(), index, scale)
    err = (merged - full).abs().amax(-1)
    assert bool((err <= tol).all()), float((err / tol.clamp(min=1e-30)).max())
    assert bool((lse[0, 0] == float("-inf")).all()) and bool((merged[0, 0] == 0).all())
    assert torch.allclose(lse[:, 1:], full_lse[:, 1:], rtol=0, atol=1e-4)
    # not vacuous: the hits alone are far outside the bound somewhere
    assert bool(((a - full).abs().amax(-1) > 100 * tol).any())
    # the one-pass path through W_uv is today's sparse_mla_attention, bit for bit
    ref = sparse_mla_attention(attn, q_lat, q_pe, Retrieved(view=view, index=index), fmt)
    through = split_mla_attention(attn, q_lat, q_pe,
                                  Retrieved(view=view, index=index, split=(hits, misses)), fmt)
    row_sum = attn.w_uv().abs().sum(-1)                     # [H, Dv]
    bound = (tol[..., None] * row_sum
             + 2 * gamma(C) * torch.einsum("hvc,rthc->rthv", attn.w_uv().abs(), full.abs()))
    assert bool(((through - ref).abs() <= bound + 1e-30).all())


@pytest.mark.parametrize("seed", [0, 1])
def test_bf16_outputs_within_the_bf16_bound(seed):
    """An NPU kernel returns BF16 partial outputs (LSE in fp32): rounding each part and the
    result to BF16 stays within 3 u_bf16 V of the one-pass BF16 output, plus the fp32 term."""
    gen = torch.Generator().manual_seed(seed)
    R, T, K, S, H, C, P = 2, 2, 64, 160, 4, 64, 16
    fmt, view, q_lat, q_pe, index, (hits, misses) = random_case(gen, R, T, K, S, H, C, P, 1.0,
                                                                "bf16")
    scale = 1 / math.sqrt(C + P)
    attn = Attn(H, C, 8, scale, gen)
    full, _ = sparse_mla_partial(attn, q_lat, q_pe, view, index, fmt)
    a, lse_a = sparse_mla_partial(attn, q_lat, q_pe, view, hits, fmt)
    b, lse_b = sparse_mla_partial(attn, q_lat, q_pe, view, misses, fmt)
    merged, _ = merge_attention(a.bfloat16(), lse_a, b.bfloat16(), lse_b)
    tol = split_tolerance(q_lat, q_pe, view[0].float(), view[1].float(), index, scale)
    V = view[0].float().abs().amax()
    err = (merged.float() - full.bfloat16().float()).abs().amax(-1)
    assert bool((err <= tol + 3 * U_BF16 * V).all())


def test_unsplit_is_the_default_and_bit_exact(hf_checkpoint_small):
    """StoreSpec's default is one pass: avsg's logits equal device-resident KV's bit for bit, and
    so do "auto"'s on CPU; with the split the greedy tokens are the same and the logits within
    the parity tolerance."""
    from avsg import backend
    from avsg.commands.generate import generate
    from avsg.runtime.base import StoreSpec
    assert StoreSpec.__dataclass_fields__["split_attention"].default is False
    model, prompts, hf_tokens, hf_logits = hf_checkpoint_small
    with backend.emulation("fast"):
        dev_out, dev_logits = generate(model, prompts, 24, mode="device", kv_format_name="fp32",
                                       record_logits=True)
        out, logits = generate(model, prompts, 24, mode="avsg", kv_format_name="fp32",
                               capacity=16, record_logits=True)
        split_out, split_logits = generate(model, prompts, 24, mode="avsg",
                                           kv_format_name="fp32", capacity=16,
                                           record_logits=True, split_attention=True)
        # "auto" on CPU: no overlap to establish, so the rule never splits: the one-pass path
        auto_out, auto_logits = generate(model, prompts, 24, mode="avsg", kv_format_name="fp32",
                                         capacity=16, record_logits=True,
                                         split_attention="auto")
    assert out == dev_out == split_out == auto_out == hf_tokens.tolist()
    for i in range(len(prompts)):
        for a, b, c, d in zip(dev_logits[i], logits[i], split_logits[i], auto_logits[i]):
            assert torch.equal(a, b) and torch.equal(a, d)
            torch.testing.assert_close(c, a, rtol=1e-5, atol=1e-5)
    ours = torch.stack([torch.cat(split_logits[i]) for i in range(len(prompts))])
    torch.testing.assert_close(ours, hf_logits[:, 1:], rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module")
def hf_checkpoint_small(tmp_path_factory):
    """The parity checkpoint of test_hf_parity (transformers' DeepseekV32, tiny, random)."""
    pytest.importorskip("transformers")
    import test_hf_parity as parity
    from avsg.model_config import from_hf_config
    from avsg.runtime.model import DeepseekV32
    from avsg.runtime.weights import load_safetensors
    path, prompt, tokens, logits = parity.hf_checkpoint.__wrapped__(tmp_path_factory)
    model = DeepseekV32(from_hf_config(str(path)))
    load_safetensors(model, str(path))
    return model, prompt.tolist(), tokens, logits
