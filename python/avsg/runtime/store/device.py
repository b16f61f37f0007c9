"""``device``: all KV on the device, nothing copied; the reference the offloading stores match.

Per KV layer, each component of the KV format is one contiguous cache ``[rows, max_len, width]``
indexed by position. Offload writes a pass's KV at ``batch.pos`` (active rows only), fill writes a
context, and Retrieve hands attention the layer's cache itself with the selections as the index:
positions are rows of the view, so no copy and no plan. This is what a deployment that fits the
whole KV in device memory pays, and the floor of the ``offload`` and ``avsg`` modes' retrieve cost.
"""
from __future__ import annotations

from typing import Tuple

import torch

from ..base import KVStore, Retrieved, StoreSpec, register_store
from ..step import StepBatch


@register_store
class DeviceStore(KVStore):
    name = "device"

    def __init__(self, spec: StoreSpec):
        super().__init__(spec)
        # cache[layer][component] : [rows, max_len, width]
        self.cache = [tuple(torch.zeros(spec.rows, spec.max_len, c.width, dtype=c.dtype,
                                        device=spec.device)
                            for c in spec.kv_format.components)
                      for _ in range(spec.layers)]

    def admit(self, row: int, length: int) -> None:
        if length > self.spec.max_len:
            raise ValueError(f"length: a row holds at most max_len = {self.spec.max_len} "
                             f"positions, got {length}")
        super().admit(row, length)

    def offload(self, layer: int, batch: StepBatch, parts: Tuple[torch.Tensor, ...]) -> None:
        with self.timers("offload"):
            pos = batch.pos.to(torch.int64)
            row = torch.arange(batch.rows, device=pos.device)[:, None].expand_as(pos)
            active = batch.active[:, None, None]
            for cache, new in zip(self.cache[layer], parts):
                # an idle row's pos is 0, which may hold a filled context: write back what is there
                cache[row, pos] = torch.where(active, new.to(cache.dtype), cache[row, pos])

    def fill(self, layer: int, row: int, start: int, parts: Tuple[torch.Tensor, ...]) -> None:
        n = parts[0].shape[0]
        if start + n > self.spec.max_len:
            raise ValueError(f"device store: fill of {n} positions at {start} exceeds "
                             f"max_len {self.spec.max_len}")
        for cache, new in zip(self.cache[layer], parts):
            cache[row, start:start + n] = new.to(device=cache.device, dtype=cache.dtype)

    def retrieve(self, layer: int, topk_pos: torch.Tensor, batch: StepBatch) -> Retrieved:
        with self.timers("retrieve"):
            return Retrieved(view=self.cache[layer], index=topk_pos)
