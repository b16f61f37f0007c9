"""Rotary position embedding of DeepSeek-V3.2: YaRN frequencies, the two rotation layouts, scales.

Frequencies. ``rope_frequencies(config)`` returns the per-pair inverse frequencies (fp32,
``qk_rope_head_dim / 2`` of them) and the factor the cos/sin tables are multiplied by. Without
scaling these are ``theta^(-2i/d)`` and 1. Under YaRN (factor s, original length L0, beta_fast,
beta_slow) a pair keeps its original frequency when it rotates more than ``beta_fast`` times over
L0, takes ``freq / s`` when it rotates fewer than ``beta_slow`` times, and blends linearly in
between (bounds floored/ceiled unless ``truncate`` is false); the cos/sin factor is
``m(s, mscale) / m(s, mscale_all_dim)`` with ``m(s, a) = 0.1 a ln s + 1`` (1 for DeepSeek-V3.2,
whose two mscales are equal), or ``m(s, 1)`` when the config lacks them.

Layouts. Both MLA and the indexer rotate with the same frequencies at the same positions:

    MLA        interleaved pairs ``(x0, x1), (x2, x3), ...`` over the 64 RoPE dims; the result
               stays interleaved (the layout of DeepSeek's reference and of vLLM's cache).
               transformers writes the rotated pairs de-interleaved (evens then odds): the same
               dot products, different cache bytes.
    indexer    half-split (neox) pairs ``(x_i, x_{i+d/2})`` over the first ``qk_rope_head_dim``
               dims of each 128-d index head/key; the rest passes through.

Scales. MLA's softmax scale is ``qk_head_dim^-0.5``, times ``m(s, mscale_all_dim)^2`` under YaRN
whenever ``mscale_all_dim`` is set (as transformers and vLLM do; DeepSeek's reference applies it
only when its max_seq_len exceeds L0). The indexer's scale is ``index_head_dim^-0.5`` without mscale.
"""
from __future__ import annotations

import math
from typing import Any, Dict, Optional, Tuple

import torch

from ..model_config import ModelConfig


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's attention-temperature correction ``0.1 * mscale * ln(factor) + 1`` (1 if no scaling)."""
    if factor <= 1:
        return 1.0
    return 0.1 * mscale * math.log(factor) + 1.0


def _correction_dim(rotations: float, dim: int, theta: float, original_len: int) -> float:
    """The (fractional) pair index whose wavelength fits ``rotations`` times into ``original_len``."""
    return dim * math.log(original_len / (rotations * 2 * math.pi)) / (2 * math.log(theta))


def rope_frequencies(dim: int, theta: float,
                     scaling: Optional[Dict[str, Any]] = None) -> Tuple[torch.Tensor, float]:
    """Inverse frequencies fp32 ``[dim // 2]`` and the cos/sin multiplier for a ``dim``-wide RoPE."""
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float32) / dim
    base_period = theta ** exponents                      # wavelength / 2pi of each pair
    if not scaling:
        return 1.0 / base_period, 1.0
    factor = float(scaling["factor"])
    original_len = scaling["original_max_position_embeddings"]
    beta_fast = scaling.get("beta_fast") or 32
    beta_slow = scaling.get("beta_slow") or 1
    mscale, mscale_all_dim = scaling.get("mscale"), scaling.get("mscale_all_dim")
    cos_sin_factor = scaling.get("attention_factor")
    if cos_sin_factor is None:
        if mscale and mscale_all_dim:
            cos_sin_factor = yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim)
        else:
            cos_sin_factor = yarn_mscale(factor)

    low = _correction_dim(beta_fast, dim, theta, original_len)
    high = _correction_dim(beta_slow, dim, theta, original_len)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001                                     # avoid a zero-width ramp
    # 0 below ``low`` (fast pairs: keep the original frequency), 1 above ``high`` (interpolate)
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    keep_original = 1 - ramp
    inv_freq = (1.0 / (factor * base_period)) * (1 - keep_original) + (1.0 / base_period) * keep_original
    return inv_freq, float(cos_sin_factor)


def mla_softmax_scale(config: ModelConfig) -> float:
    scale = config.qk_head_dim ** -0.5
    scaling = config.rope_scaling
    if scaling and scaling.get("mscale_all_dim"):
        scale *= yarn_mscale(float(scaling["factor"]), scaling["mscale_all_dim"]) ** 2
    return scale


def indexer_softmax_scale(config: ModelConfig) -> float:
    return config.index_head_dim ** -0.5


class RotaryEmbedding(torch.nn.Module):
    """cos/sin at given positions. Computed from the positions on each call (a multiply and two
    transcendental ops on ``[R, T, 32]``) rather than from a table, so a 160K-position model holds
    no table and the values are those of transformers' own computation bit for bit."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        inv_freq, self.cos_sin_factor = rope_frequencies(
            config.qk_rope_head_dim, config.rope_theta, config.rope_scaling)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, pos: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """``pos`` int ``[...]`` -> ``(cos, sin)`` fp32 ``[..., rope_dim // 2]``, one per pair."""
        angles = pos.to(torch.float32)[..., None] * self.inv_freq
        return angles.cos() * self.cos_sin_factor, angles.sin() * self.cos_sin_factor


def rope_interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs ``(x[2i], x[2i+1])``; ``cos``/``sin`` ``[..., d/2]`` broadcast against ``x``'s
    leading dims. The output keeps the interleaved layout."""
    even, odd = x[..., 0::2], x[..., 1::2]
    rotated = torch.stack((even * cos - odd * sin, odd * cos + even * sin), dim=-1)
    return rotated.flatten(-2)


def rope_half(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs ``(x[i], x[i + d/2])`` (neox layout) of the whole last dim of ``x``."""
    half = x.shape[-1] // 2
    first, second = x[..., :half], x[..., half:]
    return torch.cat((first * cos - second * sin, second * cos + first * sin), dim=-1)
