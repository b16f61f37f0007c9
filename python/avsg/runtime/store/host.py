"""What the two offloading stores share: the paged host pool, written by Offload and context fill."""
from __future__ import annotations

from typing import Tuple

import torch

from ..base import KVStore, StoreSpec
from ..pool import HostPool
from ..step import StepBatch


class HostPoolStore(KVStore):
    """A store whose KV lives in a ``HostPool``; subclasses say how ``retrieve`` reads it."""

    def __init__(self, spec: StoreSpec):
        super().__init__(spec)
        self.pool = HostPool(spec.layers, spec.rows, spec.max_len, spec.kv_format,
                             spec.block_size, compute_device=spec.device)
        # first position each row wrote in the previous pass, per layer: the "fresh" boundary
        self._previous_start = torch.zeros(spec.layers, spec.rows, dtype=torch.int32,
                                           device=spec.device)
        self._current_start = self._previous_start.clone()

    def admit(self, row: int, length: int) -> None:
        if length > self.spec.max_len:
            raise ValueError(f"length: a row holds at most max_len = {self.spec.max_len} "
                             f"positions, got {length}")
        self.pool.release(row)
        self.pool.admit(row, length)
        # nothing of the new request counts as fresh until its first pass has written
        self._current_start[:, row] = torch.iinfo(torch.int32).max
        super().admit(row, length)

    def release(self, row: int) -> None:
        self.pool.release(row)

    def offload(self, layer: int, batch: StepBatch, parts: Tuple[torch.Tensor, ...]) -> None:
        with self.timers("offload"):
            rows = torch.arange(batch.rows, device=batch.pos.device)[:, None].expand_as(batch.pos)
            active = batch.active[:, None].expand_as(batch.pos)
            self.pool.write(layer, rows[active], batch.pos[active],
                            [p[active] for p in parts])
            self._mark_fresh(layer, batch)

    def _mark_fresh(self, layer: int, batch: StepBatch) -> None:
        """This pass wrote from ``batch.pos[:, 0]`` on: move the "fresh" boundary."""
        self._previous_start[layer] = self._current_start[layer]
        self._current_start[layer] = torch.where(batch.active, batch.pos[:, 0],
                                                 self._current_start[layer])

    def fill(self, layer: int, row: int, start: int, parts: Tuple[torch.Tensor, ...]) -> None:
        n = parts[0].shape[0]
        pos = torch.arange(start, start + n, dtype=torch.int32)
        rows = torch.full_like(pos, row)
        self.pool.write(layer, rows, pos, parts)

    def _count_copies(self, layer: int, copied_pos: torch.Tensor, counts: torch.Tensor) -> None:
        """Account ``counts`` rows copied; ``copied_pos`` [R, N] (-1 padded) says which."""
        self._h2d_rows += counts.sum()
        fresh = (copied_pos >= self._previous_start[layer][:, None]) & (copied_pos >= 0)
        self._h2d_fresh_rows += fresh.sum()
