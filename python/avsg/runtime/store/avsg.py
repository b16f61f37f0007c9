"""``avsg``: KV in the host pool, one ``SparseKVBuffer`` per layer, miss-only copies.

Per layer the store owns a ``SparseKVBuffer`` (rows ``R``, ``capacity`` slots, ``T = 1 + n``
query tokens per step) and the device buffers it indexes, one per KV component
(``[R, capacity, width]``). Retrieve is ``plan`` (match the step's selections, reserve a slot per
miss) then ``gather`` (copy only the misses from the paged pool through the block table); attention
then reads the buffers through ``plan.slots``.

Lifecycle: a new request in a row is ``reset`` on every layer; rejected MTP drafts are dropped
with ``invalidate`` before their positions are written again. A pass with fewer query tokens
than the buffer's ``T`` (the MTP draft chain) pads its selections with ``-1``.

Fresh KV: a token's KV goes only to the host pool when it is produced, so the first selection
of a new position is a miss. ``h2d_fresh_rows()`` counts those copies: the traffic a write-through
of new KV into the buffer would save.
"""
from __future__ import annotations

from typing import List, Optional, Sequence

import torch

from ... import buffer as avsg_buffer
from ...buffer import SparseKVBuffer
from ..base import Retrieved, StoreSpec, register_store
from ..step import StepBatch
from .host import HostPoolStore


@register_store
class AVSGStore(HostPoolStore):
    name = "avsg"

    def __init__(self, spec: StoreSpec):
        super().__init__(spec)
        self.buffers: List[SparseKVBuffer] = [
            SparseKVBuffer(rows=spec.rows, capacity=spec.capacity, topk=spec.topk,
                           queries_per_step=spec.queries_per_step, lifetime=spec.lifetime,
                           max_context=spec.max_len, device=spec.device)
            for _ in range(spec.layers)]
        self.slot_kv = [tuple(torch.zeros(spec.rows, spec.capacity, c.width, dtype=c.dtype,
                                          device=spec.device)
                              for c in spec.kv_format.components)
                        for _ in range(spec.layers)]

    def retrieve(self, layer: int, topk_pos: torch.Tensor, batch: StepBatch) -> Retrieved:
        R, T, K = topk_pos.shape
        T_buffer = self.spec.queries_per_step
        if T < T_buffer:
            pad = torch.full((R, T_buffer - T, K), -1, dtype=topk_pos.dtype, device=topk_pos.device)
            topk_pos = torch.cat([topk_pos, pad], dim=1)
        with self.timers("plan"):
            # Selections come from our own algorithm, already causal and distinct per query
            # token: the value checks (a host sync) are skipped; the kernel treats anything out
            # of range as no selection.
            plan = self.buffers[layer].plan(topk_pos.contiguous(), batch.seq_lens, check=False)
        with self.timers("gather"):
            avsg_buffer.gather(plan, src=list(self.pool.layer(layer)), dst=list(self.slot_kv[layer]),
                               block_table=self.pool.block_table, block_size=self.pool.block_size,
                               check=False)
            self._count_copies(layer, plan.miss_pos, plan.miss_counts)
        return Retrieved(view=self.slot_kv[layer], index=plan.slots[:, :T])

    def invalidate(self, valid_lens: torch.Tensor, layers: Optional[Sequence[int]] = None) -> None:
        for layer in range(self.spec.layers) if layers is None else layers:
            self.buffers[layer].invalidate(valid_lens)

    def reset(self, rows: torch.Tensor) -> None:
        for buf in self.buffers:
            buf.reset(rows)

    def hit_rate(self) -> float:
        lookups = sum(b.stats()["lookups"] for b in self.buffers)
        hits = sum(b.stats()["hits"] for b in self.buffers)
        return hits / lookups if lookups else 0.0

    def reset_stats(self) -> None:
        for buf in self.buffers:
            buf.reset_stats()
