"""``Residency``: every layer's ``SparseKVBuffer`` and what each must drop before its next plan.

This is the serving core's device half. A decode layer makes one call, ``step``, which makes one
call into the op library (``SparseKVBuffer.step``: drop, plan, copy under one hold and one
generation). The copy is the caller's: the package's own ``gather`` for engines whose host pool
AVSG addresses (``PagedKV``), vllm-ascend's copy descriptors for the plugin.

Stale copies. A position must never be served from a slot after the host rewrote it: rejected MTP
drafts and a pass's own positions are written again. The engine says what is rewritten
(``record_drops``, per state row: the lowest position to drop) and the layer's next ``step``
drops it in the same launch as its plan; only a plan can read a resident copy, so a recorded drop
is as good as an applied one. ``step`` may also drop a pass's own positions
(``stable_lens``: everything at or past them is rewritten now).
"""
from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence

import torch

from .. import reference
from ..buffer import Plan, SparseKVBuffer
from ..validation import require_int

NO_LIMIT = reference.MAX_POSITION      # a drop limit that drops nothing


class Residency:
    """``num_layers`` buffers of ``rows`` state rows (see ``SparseKVBuffer`` for the rest)."""

    def __init__(self, num_layers: int, rows: int, capacity: int, topk: int,
                 queries_per_step: int = 1, policy: str = reference.DEFAULT_POLICY,
                 lifetime: int = reference.DEFAULT_LIFETIME, hash_buckets: Optional[int] = None,
                 max_context: Optional[int] = None, device="cpu", check: Optional[bool] = None):
        require_int("num_layers", num_layers, low=1)
        self.buffers: List[SparseKVBuffer] = [
            SparseKVBuffer(rows=rows, capacity=capacity, topk=topk,
                           queries_per_step=queries_per_step, lifetime=lifetime, device=device,
                           hash_buckets=hash_buckets, check=check, policy=policy,
                           max_context=max_context)
            for _ in range(num_layers)]
        first = self.buffers[0]
        self.num_layers, self.rows, self.capacity = num_layers, rows, capacity
        self.topk, self.queries_per_step = topk, queries_per_step
        self.device, self.max_context = first.device, first.max_context
        # per layer and state row: the lowest position to drop before the layer's next plan
        self._drop_from = torch.full((num_layers, rows), NO_LIMIT, dtype=torch.int32,
                                     device=self.device)

    def layer(self, layer: int) -> int:
        require_int("layer", layer, low=0, high=self.num_layers - 1)
        return layer

    # ------------------------------------------------------------------------ lifecycle
    def reset(self, rows: Sequence[int]) -> None:
        """State rows ``rows`` start a new request: forgotten on every layer, nothing to drop."""
        rows = list(rows)
        if not rows:
            return
        mask = torch.zeros(self.rows, dtype=torch.bool)
        mask[rows] = True
        mask = mask.to(self.device)
        for buf in self.buffers:
            buf.reset(mask)
        self._drop_from[:, mask] = NO_LIMIT

    def record_drops(self, limits: torch.Tensor, layers: Optional[Sequence[int]] = None) -> None:
        """Positions ``>= limits[s]`` (int32 ``[rows]``, state-row order) of ``layers`` (default:
        all) are rewritten: each of those layers drops them in its next ``step``."""
        if layers is None:
            torch.minimum(self._drop_from, limits[None, :], out=self._drop_from)
            return
        index = torch.tensor(sorted(set(layers)), dtype=torch.int64, device=self.device)
        if index.numel():
            pending = self._drop_from.index_select(0, index)
            self._drop_from.index_copy_(0, index, torch.minimum(pending, limits[None, :]))

    def resident(self, layer: int, row: int) -> Dict[int, int]:
        """``{pos: slot}`` a plan of ``layer`` can hit in state row ``row``: the buffer's residency
        less the drops still waiting (inspection and tests; syncs)."""
        limit = int(self._drop_from[self.layer(layer), row])
        return {pos: slot for pos, slot in self.buffers[layer].resident(row).items()
                if pos < limit}

    # ----------------------------------------------------------------------------- step
    def step(self, layer: int, topk_pos: torch.Tensor, seq_lens: torch.Tensor,
             copy: Callable[[Plan], object], stable_lens: Optional[torch.Tensor] = None) -> Plan:
        """One layer: drop what is recorded for it (and positions ``>= stable_lens[s]``, this
        pass's own), plan ``topk_pos`` int32 ``[rows, T, K]`` (state-row order), ``copy(plan)``.
        One buffer call (``SparseKVBuffer.step``)."""
        # this pass's own positions join the layer's record before the step runs and the record
        # is cleared only once the step succeeded: a step refused before its launch (another
        # thread holds the buffer, a check) leaves every drop it owed for the layer's next step
        # (one applied twice only costs misses)
        pending = self._drop_from[layer]
        if stable_lens is not None:
            torch.minimum(pending, stable_lens, out=pending)
        plan = self.buffers[layer].step(topk_pos, seq_lens, copy, drop_from=pending)
        pending.fill_(NO_LIMIT)
        return plan

    # ------------------------------------------------------------------------ statistics
    def hit_rate(self) -> float:
        lookups = sum(b.stats()["lookups"] for b in self.buffers)
        hits = sum(b.stats()["hits"] for b in self.buffers)
        return hits / lookups if lookups else 0.0

    def reset_stats(self) -> None:
        for buf in self.buffers:
            buf.reset_stats()

