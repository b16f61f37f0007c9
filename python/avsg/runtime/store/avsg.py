"""``avsg``: KV in the host pool, miss-only copies, through the serving core (``avsg.cache``).

One pass (who calls what)::

    begin_pass(batch)                  once per forward pass, before its layers (the model)
      -> manager.begin_step_rtk          the pass's StepMeta: rows, lengths, host block table
    offload(layer, batch, parts)       per layer
      -> manager.write_kv                this pass's KV into the paged host pool
    retrieve(layer, topk_pos, batch)   per layer, after that layer's offload
      -> manager.step                    one buffer call: drop + plan + gather
    invalidate(valid_lens, layers)     between passes (the engine: rejected drafts)
      -> manager.invalidate              recorded; each layer applies it in its next step

The store is a thin adapter: the manager owns one ``SparseKVBuffer`` per layer, the device buffers
(``[R, capacity, 1, width]`` per KV component) and the row tables, exactly as it would inside a
serving engine. The runtime's selections are ``[R, T, K]`` per batch row, which is what the
manager's ``step`` takes (rows never move, so batch row = state row), and it returns the slots in
the same layout and selection order: nothing is flattened, permuted or compacted on the way. An idle row (``batch.active`` False) has no tokens in the
pass: nothing of it is planned, invalidated or recorded, whether or not it holds a request.

Rows never move in the runtime's engine, so batch row = state row and ``Retrieved.view`` is the
buffer itself, ``[R, capacity, width]`` per component.

Lifecycle: ``admit`` adds the row to the manager (a reset on every layer), ``release`` frees it;
rejected MTP drafts are dropped with ``invalidate``. The manager also drops every position at or
after a pass's first one before it plans (``auto_invalidate``), in the same launch.

Split attention (``StoreSpec.split_attention``, off by default; ``"auto"``: where the manager's
split rule chooses it, ``StoreSpec.split_policy``): ``retrieve`` asks the manager
for the hit/miss split (``step(split=True)``: the copy on the manager's copy stream) and returns
it with the wait for the copies, and the algorithm's attention runs over the hits, waits, runs
over the misses and merges (docs/overlap.md). The plan, the copies and their counts are the same
either way.

Writes: a pass's KV goes to the paged host pool through the manager's ``write_kv`` (host rows
from the pool's block table). With ``StoreSpec.write_through`` the manager also copies a pass's
own newly written positions into their reserved slots on the device, so they are not fetched from
the host; off by default, a fresh position's first selection is a miss copied from the host, and
``h2d_fresh_rows()`` counts those copies.
"""
from __future__ import annotations

import contextlib
from typing import List, Optional, Sequence, Tuple

import torch

from ...buffer import SparseKVBuffer
from ...cache import RESIDENT_BLOCK_SIZE, SparseOffloadManager, StepMeta
from ..base import Retrieved, StoreSpec, register_store
from ..step import StepBatch
from .host import HostPoolStore


@register_store
class AVSGStore(HostPoolStore):
    name = "avsg"

    def __init__(self, spec: StoreSpec):
        super().__init__(spec)
        # vllm-ascend's resident pages are 128 tokens; a buffer that is not a whole number of
        # them (the small test models) is one page per row
        page = RESIDENT_BLOCK_SIZE if spec.capacity % RESIDENT_BLOCK_SIZE == 0 else spec.capacity
        self.manager = SparseOffloadManager(
            num_layers=spec.layers, max_rows=spec.rows, capacity=spec.capacity, topk=spec.topk,
            queries_per_step=spec.queries_per_step, kv_format=spec.kv_format,
            policy=spec.policy, lifetime=spec.lifetime, max_context=spec.max_len,
            resident_block_size=page,
            device=spec.device,
            host_kv=[self.pool.layer(layer) for layer in range(spec.layers)],
            write_through=spec.write_through, timers=spec.timers, gather_cores=spec.gather_cores,
            split_policy=spec.split_policy,
            # our own algorithm selects causal, distinct positions: value checks would only
            # cost host syncs
            check=False)
        # the current pass (begin_pass): its batch, its StepMeta, and each layer's new KV
        self._batch: Optional[StepBatch] = None
        self._meta: Optional[StepMeta] = None
        self._pass_kv: List[Optional[Tuple[torch.Tensor, ...]]] = [None] * spec.layers

    @property
    def buffers(self) -> List[SparseKVBuffer]:
        return self.manager.buffers

    def reset(self, rows: torch.Tensor) -> None:
        for row in rows.nonzero().flatten().tolist():
            if self.manager.holds_request(row):
                self.manager.free(row)
            self.manager.add(row)

    def release(self, row: int) -> None:
        super().release(row)
        if self.manager.holds_request(row):
            self.manager.free(row)

    # ------------------------------------------------------------------------------ pass
    def begin_pass(self, batch: StepBatch) -> None:
        with self.timers("plan"):
            self._meta = self.manager.begin_step_rtk(
                batch.seq_lens, batch.queries, self.pool.block_table.to(batch.pos.device),
                active=batch.active, check=False)
        self._batch = batch
        self._pass_kv = [None] * self.spec.layers

    # --------------------------------------------------------------------------- writes
    def offload(self, layer: int, batch: StepBatch, parts: Tuple[torch.Tensor, ...]) -> None:
        with self.timers("offload"):
            R, T = batch.pos.shape
            rows = torch.arange(R, device=batch.pos.device)[:, None].expand(R, T)
            # idle rows own no blocks: their tokens are skipped (slot mapping -1)
            host_rows = torch.where(batch.active[:, None], self.pool.host_rows(rows, batch.pos),
                                    torch.full_like(batch.pos, -1, dtype=torch.int64))
            flat = tuple(p.reshape(R * T, p.shape[-1]).contiguous() for p in parts)
            self.manager.write_kv(layer, host_rows.reshape(-1), flat, check=False)
            self._pass_kv[layer] = flat
            self._mark_fresh(layer, batch)

    def fill(self, layer: int, row: int, start: int, parts: Tuple[torch.Tensor, ...]) -> None:
        n = parts[0].shape[0]
        pos = torch.arange(start, start + n, dtype=torch.int32, device=self.pool.device)
        host_rows = self.pool.host_rows(torch.full_like(pos, row), pos)
        self.manager.write_kv(layer, host_rows, tuple(p.contiguous() for p in parts), check=False)

    # ------------------------------------------------------------------------- retrieve
    def retrieve(self, layer: int, topk_pos: torch.Tensor, batch: StepBatch) -> Retrieved:
        if batch is not self._batch:
            # another pass's StepMeta would plan with the wrong lengths: refuse
            raise RuntimeError("avsg store: retrieve for a batch that begin_pass did not start "
                               "(the pass calls store.begin_pass(batch) once before its layers)")
        # the manager times its "plan" and "gather" phases itself
        # rows never move here (no move_row / swap_rows): batch row = state row, so the
        # selections go to the manager's one per-layer call as they are
        out = self.manager.step(layer, topk_pos, self._meta, new_kv=self._pass_kv[layer],
                                check=False, split=self.spec.split_attention)
        split = out.split is not None            # "auto": what the manager's rule chose
        streams = self.manager.copy_stream
        # with the split the copy's counts are the copy stream's: counted there, after it
        with streams.copying() if split else contextlib.nullcontext():
            self._count_copies(layer, out.host_pos, out.host_counts)
        view = tuple(kv.view(self.spec.rows, self.spec.capacity, kv.shape[-1])
                     for kv in self.manager.kv[layer])
        if not split:
            return Retrieved(view=view, index=out.slots)
        return Retrieved(view=view, index=out.slots, split=tuple(out.split),
                         wait_copies=streams.wait)

    def invalidate(self, valid_lens: torch.Tensor, layers: Optional[Sequence[int]] = None) -> None:
        self.manager.invalidate(valid_lens, layers)

    def hit_rate(self) -> float:
        return self.manager.hit_rate()

    def reset_stats(self) -> None:
        self.manager.reset_stats()
