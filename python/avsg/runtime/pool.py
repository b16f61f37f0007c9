"""The paged host pool that holds every layer's MLA KV, and the block tables that map into it.

Layout (one pool per KV component, e.g. latent and RoPE key for bf16, one packed tensor for fp8)::

    pool[c]      [layers, num_blocks, block_size, width]   host memory (pinned where an NPU reads it)
    block_table  int32 [rows, max_blocks]                   shared by every layer

A request-relative position ``pos`` of row ``r`` lives at host row
``block_table[r, pos // block_size] * block_size + pos % block_size`` of every layer's pool; the
store's ``gather`` reads it through the same block table. Blocks come from one free list and are
handed out shuffled (seeded), so the block table is never the identity and the paged path is what
runs. A row's blocks are taken when its request is admitted (enough for the request's whole
lifetime) and returned when the row is released.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch

from ..kvformat import KVFormat


class HostPool:
    def __init__(self, layers: int, rows: int, max_len: int, kv_format: KVFormat,
                 block_size: int = 128, compute_device: Optional[torch.device] = None,
                 seed: int = 0):
        if block_size < 1:
            raise ValueError(f"block_size: expected >= 1, got {block_size}")
        self.layers, self.rows, self.block_size = layers, rows, block_size
        self.kv_format = kv_format
        self.max_blocks = -(-max_len // block_size)
        self.num_blocks = rows * self.max_blocks
        # the pools always live in host memory; the block table lives where gather runs
        self.device = torch.device("cpu") if compute_device is None else torch.device(compute_device)
        self.pools: Tuple[torch.Tensor, ...] = tuple(
            self._alloc((layers, self.num_blocks, block_size, c.width), c.dtype)
            for c in kv_format.components)
        self.block_table = torch.full((rows, self.max_blocks), -1, dtype=torch.int32,
                                      device=self.device)
        order = torch.randperm(self.num_blocks, generator=torch.Generator().manual_seed(seed))
        self._free: List[int] = order.tolist()
        self._owned: List[List[int]] = [[] for _ in range(rows)]

    def _alloc(self, shape, dtype) -> torch.Tensor:
        if self.device.type == "cpu":
            return torch.zeros(shape, dtype=dtype)     # host and "device" are the same memory
        # An NPU reads the pool through the mapping aclrtHostRegister makes: page-aligned pinned
        # memory registered once (see avsg.backend).
        from .. import backend
        pool = backend.alloc_host_pool(shape, dtype)
        backend.register_host_pool(pool)
        return pool

    @property
    def bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.pools)

    def layer(self, layer: int) -> Tuple[torch.Tensor, ...]:
        """The pools of one layer: ``[num_blocks, block_size, width]`` each (contiguous views)."""
        return tuple(p[layer] for p in self.pools)

    # ---------------------------------------------------------------------- block ownership
    def admit(self, row: int, length: int) -> None:
        """Give ``row`` blocks for positions ``0 .. length-1`` (it must own none)."""
        need = -(-length // self.block_size)
        if need > self.max_blocks:
            raise ValueError(f"length: {length} positions need {need} blocks of {self.block_size}, "
                             f"a row has {self.max_blocks}")
        if self._owned[row]:
            raise RuntimeError(f"row {row} still owns blocks; release it first")
        blocks = [self._free.pop() for _ in range(need)]
        self._owned[row] = blocks
        table = torch.full((self.max_blocks,), -1, dtype=torch.int32)
        table[:need] = torch.tensor(blocks, dtype=torch.int32)
        self.block_table[row] = table.to(self.device)

    def release(self, row: int) -> None:
        self._free.extend(reversed(self._owned[row]))
        self._owned[row] = []
        self.block_table[row] = -1

    # ------------------------------------------------------------------------ addressing
    def host_rows(self, rows: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Host rows (flat index into ``[num_blocks * block_size]``) of ``pos`` in ``rows``.
        ``rows`` and ``pos`` broadcast; ``pos`` must be valid (>= 0) where used."""
        safe_pos = pos.clamp_min(0).long()
        block = self.block_table[rows.long(), safe_pos // self.block_size].long()
        return block * self.block_size + safe_pos % self.block_size

    def write(self, layer: int, rows: torch.Tensor, pos: torch.Tensor,
              parts: Sequence[torch.Tensor]) -> None:
        """Write ``parts[c][i]`` (``[N, width]``) at position ``pos[i]`` of row ``rows[i]``."""
        host_rows = self.host_rows(rows.to(self.device), pos.to(self.device))
        for pool, part in zip(self.layer(layer), parts):
            pool.view(-1, pool.shape[-1]).index_copy_(0, host_rows.to(pool.device),
                                                      part.to(pool.device, pool.dtype))

    def read(self, layer: int, rows: torch.Tensor, pos: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        """The stored rows at ``pos`` of ``rows`` (same broadcast shape + ``[width]``)."""
        host_rows = self.host_rows(rows.to(self.device), pos.to(self.device)).cpu()
        return tuple(pool.view(-1, pool.shape[-1])[host_rows.reshape(-1)].reshape(
            *host_rows.shape, pool.shape[-1]) for pool in self.layer(layer))
