"""How one token's MLA KV is stored: a tuple of component tensors per token.

The MLA cache of a token is a 512-d latent ``c`` (after ``kv_a_layernorm``) and a 64-d RoPE key
``k_pe``. Formats:

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
from typing import Dict, Tuple

import torch

LATENT_DIM = 512
ROPE_DIM = 64
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

    @property
    def row_bytes(self) -> int:
        """Bytes one token's KV occupies (all components)."""
        return sum(c.row_bytes for c in self.components)

    def encode(self, latent: torch.Tensor, pe: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        """``latent [..., 512]``, ``pe [..., 64]`` (any float dtype) -> the stored components."""
        if self.name == "fp8":
            return (_fp8_pack(latent, pe),)
        dtype = self.components[0].dtype
        return (latent.to(dtype), pe.to(dtype))

    def decode(self, parts: Tuple[torch.Tensor, ...]) -> Tuple[torch.Tensor, torch.Tensor]:
        """Stored components ``[..., width]`` -> ``(latent fp32 [..., 512], pe fp32 [..., 64])``."""
        if self.name == "fp8":
            return _fp8_unpack(parts[0])
        return parts[0].float(), parts[1].float()


def _fp8_pack(latent: torch.Tensor, pe: torch.Tensor) -> torch.Tensor:
    lead = latent.shape[:-1]
    tiles = latent.float().reshape(*lead, LATENT_DIM // FP8_TILE, FP8_TILE)
    scale = tiles.abs().amax(-1, keepdim=True).clamp_min(1e-12) / FP8_MAX
    quant = (tiles / scale).to(torch.float8_e4m3fn).reshape(*lead, LATENT_DIM)
    return torch.cat([quant.view(torch.uint8),
                      scale.reshape(*lead, LATENT_DIM // FP8_TILE).contiguous().view(torch.uint8),
                      pe.to(torch.bfloat16).contiguous().view(torch.uint8)], dim=-1)


def _fp8_unpack(packed: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    lead = packed.shape[:-1]
    n_scale = LATENT_DIM // FP8_TILE
    quant = packed[..., :LATENT_DIM].contiguous().view(torch.float8_e4m3fn).float()
    scale = packed[..., LATENT_DIM:LATENT_DIM + 4 * n_scale].contiguous().view(torch.float32)
    pe = packed[..., LATENT_DIM + 4 * n_scale:].contiguous().view(torch.bfloat16).float()
    latent = (quant.reshape(*lead, n_scale, FP8_TILE) * scale[..., None]).reshape(*lead, LATENT_DIM)
    return latent, pe


FORMATS: Dict[str, KVFormat] = {
    "bf16": KVFormat("bf16", (Component("latent", LATENT_DIM, torch.bfloat16),
                              Component("pe", ROPE_DIM, torch.bfloat16))),
    "fp8": KVFormat("fp8", (Component("packed", LATENT_DIM + 4 * (LATENT_DIM // FP8_TILE)
                                      + 2 * ROPE_DIM, torch.uint8),)),
    "fp32": KVFormat("fp32", (Component("latent", LATENT_DIM, torch.float32),
                              Component("pe", ROPE_DIM, torch.float32))),
}


def get_format(name: str) -> KVFormat:
    if name not in FORMATS:
        raise ValueError(f"kv_format: expected one of {sorted(FORMATS)}, got {name!r}")
    return FORMATS[name]
