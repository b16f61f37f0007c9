"""``offload``: KV in the host pool, every step copies the union of each row's selections.

No reuse across steps: this is what an offloaded DSA deployment pays without AVSG. The union of a
row's ``T x K`` selections (MTP query tokens share entries) is copied with ``avsg.gather`` into a
scratch buffer ``[R, T*K, width]`` on the device, through a plan built here: ``miss_pos`` = the
union, ascending; ``slots`` = where each selection landed. Using the same gather kernel as the
``avsg`` store keeps the copy costs comparable.
"""
from __future__ import annotations

import torch

from ... import buffer as avsg_buffer
from ..base import Retrieved, StoreSpec, register_store
from ..step import StepBatch
from .host import HostPoolStore

_NONE = torch.iinfo(torch.int32).max     # sorts after every real position


def union_plan(topk_pos: torch.Tensor) -> avsg_buffer.Plan:
    """A gather plan that copies the union of each row's selections, fixed shapes, no host sync.

    ``topk_pos`` int32 ``[R, T, K]`` (-1 = none) -> ``Plan`` with capacity ``T*K``: union
    position j of row r goes to scratch row j, and ``slots[r, t, k]`` is the scratch row of
    ``topk_pos[r, t, k]``.
    """
    R, T, K = topk_pos.shape
    flat = topk_pos.reshape(R, T * K)
    keys = torch.where(flat >= 0, flat, torch.full_like(flat, _NONE))
    ordered = keys.sort(dim=1).values
    first = torch.ones_like(ordered, dtype=torch.bool)
    first[:, 1:] = ordered[:, 1:] != ordered[:, :-1]
    keep = first & (ordered != _NONE)
    union = torch.where(keep, ordered, torch.full_like(ordered, _NONE)).sort(dim=1).values
    counts = keep.sum(dim=1, dtype=torch.int32)
    union_pos = torch.where(union == _NONE, torch.full_like(union, -1), union).contiguous()
    scratch_rows = torch.arange(T * K, dtype=torch.int32, device=flat.device).expand(R, T * K)
    miss_slots = torch.where(union_pos >= 0, scratch_rows, torch.full_like(union_pos, -1))
    slots = torch.searchsorted(union, keys).to(torch.int32)
    slots = torch.where(flat >= 0, slots, torch.full_like(slots, -1)).reshape(R, T, K)
    return avsg_buffer.Plan(slots.contiguous(), union_pos, miss_slots.contiguous(), counts, T * K)


@register_store
class OffloadStore(HostPoolStore):
    name = "offload"

    def __init__(self, spec: StoreSpec):
        super().__init__(spec)
        self._scratch = {}
        self.scratch = self._scratch_for(spec.queries_per_step * spec.topk)

    def _scratch_for(self, width: int):
        """The scratch of ``width`` rows per request (one per query-token count seen), slots
        padded to 32 B so that gather may split a row over cores (avsg.buffer.kv_slots)."""
        if width not in self._scratch:
            rows = self.spec.rows
            self._scratch[width] = tuple(
                avsg_buffer.kv_slots(rows * width, (c.width,), c.dtype, self.spec.device)
                .view(rows, width, c.width) for c in self.spec.kv_format.components)
        return self._scratch[width]

    def retrieve(self, layer: int, topk_pos: torch.Tensor, batch: StepBatch) -> Retrieved:
        R, T, K = topk_pos.shape
        with self.timers("plan"):
            plan = union_plan(topk_pos)
        with self.timers("gather"):
            scratch = self._scratch_for(T * K)
            avsg_buffer.gather(plan, src=list(self.pool.layer(layer)), dst=list(scratch),
                               block_table=self.pool.block_table,
                               block_size=self.pool.block_size, check=False)
            self._count_copies(layer, plan.miss_pos, plan.miss_counts)
        return Retrieved(view=scratch, index=plan.slots)
