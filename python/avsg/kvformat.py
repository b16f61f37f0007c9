"""How one token's MLA KV is stored: a tuple of component tensors per token.

The MLA cache of a token is a latent ``c`` (after ``kv_a_layernorm``; 512-d in DeepSeek-V3.2) and a
RoPE key ``k_pe`` (64-d). Formats, with DeepSeek-V3.2's sizes:

    name   components (per token)                                   bytes
    bf16   latent bf16[512], pe bf16[64]                             1152   (default)
    fp8    packed uint8[656]: latent e4m3[512] | 4 fp32 tile scales |  656   (DeepSeek-V3.2 /
           pe bf16[64]                                                      FlashMLA sparse layout)
    fp32   latent fp32[512], pe fp32[64]                             2304   (parity tests)

Every store keeps the same format in host pool, device cache and buffer, and attention decodes
what it reads, so the three modes read identical bytes. ``encode`` and ``decode`` are exact
inverses on their image: ``encode(decode(x)) == x``.
"""
from __future__ import annotations

import dataclasses
from typing import Tuple

import torch

LATENT_DIM = 512                    # DeepSeek-V3.2's kv_lora_rank
ROPE_DIM = 64                       # and qk_rope_head_dim
FP8_TILE = 128                      # one fp32 scale per 128 latent values
FP8_MAX = 448.0                     # largest finite float8_e4m3fn


@dataclasses.dataclass(frozen=True)
class Component:
    name: str
    width: int
    dtype: torch.dtype

    @property
    def row_bytes(self) -> int:
        return self.width * torch.empty((), dtype=self.dtype).element_size()


@dataclasses.dataclass(frozen=True)
class KVFormat:
    name: str
    components: Tuple[Component, ...]
    latent_dim: int = LATENT_DIM
    rope_dim: int = ROPE_DIM

    @property
    def row_bytes(self) -> int:
        """Bytes one token's KV occupies (all components)."""
        return sum(c.row_bytes for c in self.components)

    def encode(self, latent: torch.Tensor, pe: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        """``latent [..., 512]``, ``pe [..., 64]`` (any float dtype) -> the stored components."""
        if self.name == "fp8":
            return (_fp8_pack(latent, pe, self.latent_dim),)
        dtype = self.components[0].dtype
        return (latent.to(dtype), pe.to(dtype))

    def decode(self, parts: Tuple[torch.Tensor, ...]) -> Tuple[torch.Tensor, torch.Tensor]:
        """Stored components ``[..., width]`` -> ``(latent fp32 [..., 512], pe fp32 [..., 64])``."""
        if self.name == "fp8":
            return _fp8_unpack(parts[0], self.latent_dim)
        return parts[0].float(), parts[1].float()


def _fp8_pack(latent: torch.Tensor, pe: torch.Tensor, latent_dim: int) -> torch.Tensor:
    lead = latent.shape[:-1]
    tiles = latent.float().reshape(*lead, latent_dim // FP8_TILE, FP8_TILE)
    scale = tiles.abs().amax(-1, keepdim=True).clamp_min(1e-12) / FP8_MAX
    quant = (tiles / scale).to(torch.float8_e4m3fn).reshape(*lead, latent_dim)
    return torch.cat([quant.view(torch.uint8),
                      scale.reshape(*lead, latent_dim // FP8_TILE).contiguous().view(torch.uint8),
                      pe.to(torch.bfloat16).contiguous().view(torch.uint8)], dim=-1)


def _fp8_unpack(packed: torch.Tensor, latent_dim: int) -> Tuple[torch.Tensor, torch.Tensor]:
    lead = packed.shape[:-1]
    n_scale = latent_dim // FP8_TILE
    quant = packed[..., :latent_dim].contiguous().view(torch.float8_e4m3fn).float()
    scale = packed[..., latent_dim:latent_dim + 4 * n_scale].contiguous().view(torch.float32)
    pe = packed[..., latent_dim + 4 * n_scale:].contiguous().view(torch.bfloat16).float()
    latent = (quant.reshape(*lead, n_scale, FP8_TILE) * scale[..., None]).reshape(*lead, latent_dim)
    return latent, pe


FORMAT_NAMES = ("bf16", "fp8", "fp32")


def get_format(name: str, latent_dim: int = LATENT_DIM, rope_dim: int = ROPE_DIM) -> KVFormat:
    """The format ``name`` for a model with the given latent (kv_lora_rank) and RoPE widths."""
    if name not in FORMAT_NAMES:
        raise ValueError(f"kv_format: expected one of {', '.join(FORMAT_NAMES)}, got {name!r}")
    if name == "fp8":
        if latent_dim % FP8_TILE:
            raise ValueError(f"kv_format: fp8 needs a latent width divisible by {FP8_TILE}, "
                             f"got kv_lora_rank = {latent_dim}")
        width = latent_dim + 4 * (latent_dim // FP8_TILE) + 2 * rope_dim
        return KVFormat(name, (Component("packed", width, torch.uint8),), latent_dim, rope_dim)
    dtype = torch.bfloat16 if name == "bf16" else torch.float32
    return KVFormat(name, (Component("latent", latent_dim, dtype), Component("pe", rope_dim, dtype)),
                    latent_dim, rope_dim)
