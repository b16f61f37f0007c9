"""``PagedKV``: the device KV buffers behind the state rows, the engine's paged host pool, and
the package's own copy between them (``gather``, with write-through of a pass's new KV; without
it, ``miss_copy``: the plan and the copy as one launch, ``plan_gather``).

For engines whose host pool AVSG addresses itself (the runtime, MindIE). The vllm-ascend plugin
keeps vllm-ascend's buffers and copies with its descriptors instead.

Device memory per layer (``R`` state rows, ``S`` = capacity, ``bs`` = resident page size)::

    k_nope   [R, S, 1, 512] bf16     | or one packed fp8 row per token: kv [R, S, 1, 656] uint8
    k_pe     [R, S, 1, 64]  bf16     |   (512 e4m3, 4 fp32 tile scales, 64 bf16 rope)

Each sits in storage with one spare row at the end (``R*S + 1`` rows): fixed-shape scatters send
the entries they must not write there instead of branching. Attention sees each buffer as a paged
cache ``[R*S/bs, bs, 1, width]`` (``resident_kv``).

The host pool (``register_host_kv``) is per layer and component ``[num_blocks, block_size, (1,)
width]``; a token's *host row* is ``block * block_size + offset`` (vLLM's slot mapping).
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch

from .. import buffer as avsg_buffer
from ..buffer import MissCopy, Plan
from ..kvformat import KVFormat
from ..validation import require_fits, require_tensor


class PagedKV:
    def __init__(self, num_layers: int, rows: int, capacity: int, kv_format: KVFormat,
                 resident_block_size: int, device: torch.device,
                 gather_cores: Optional[int] = None):
        kv_bytes = num_layers * (rows * capacity + 1) * sum(
            c.width * torch.empty((), dtype=c.dtype).element_size() for c in kv_format.components)
        require_fits("max_rows", kv_bytes, device,
                      f"the device KV of num_layers = {num_layers} x max_rows = {rows} x "
                      f"capacity = {capacity} rows of {kv_format.name}")
        self.num_layers, self.rows, self.capacity = num_layers, rows, capacity
        self.kv_format, self.device = kv_format, device
        # cores the copy's gather launch takes (None: avsg.get_num_cores(), in plan_gather the
        # cores its plan leaves: avsg.buffer.copy_cores_beside_plan); a copy that should
        # overlap attention leaves the attention kernel its cores (docs/overlap.md)
        self.gather_cores = gather_cores
        self.resident_block_size = resident_block_size
        self.pages_per_row = capacity // resident_block_size
        R, S = rows, capacity
        # (slots padded to 32 B where a row is not a multiple of it: avsg.buffer.kv_slots)
        self._storage = [tuple(avsg_buffer.kv_slots(R * S + 1, (1, c.width), c.dtype, device)
                               for c in kv_format.components) for _ in range(num_layers)]
        self.kv = [tuple(s[:R * S].view(R, S, 1, s.shape[-1]) for s in layer)
                   for layer in self._storage]
        self.host_kv: Optional[List[Tuple[torch.Tensor, ...]]] = None
        self.block_size = self.num_host_blocks = 0

    # ------------------------------------------------------------------------- host pool
    def register_host_kv(self, host_kv: Sequence[Sequence[torch.Tensor]]) -> None:
        """Per layer, the host pool's components ``[num_blocks, block_size, (1,) width]``."""
        if not isinstance(host_kv, (list, tuple)):
            raise TypeError(f"host_kv: expected a list with one entry per layer, got "
                            f"{type(host_kv).__name__}")
        if len(host_kv) != self.num_layers:
            raise ValueError(f"host_kv: expected {self.num_layers} layers (num_layers), got "
                             f"{len(host_kv)}")
        comps = self.kv_format.components
        layers = []
        for layer, parts in enumerate(host_kv):
            parts = (parts,) if isinstance(parts, torch.Tensor) else tuple(parts)
            if len(parts) != len(comps):
                raise ValueError(f"host_kv[{layer}]: expected {len(comps)} components "
                                 f"({', '.join(c.name for c in comps)}), got {len(parts)}")
            for c, (comp, pool) in enumerate(zip(comps, parts)):
                name = f"host_kv[{layer}][{c}]"
                require_tensor(name, pool, comp.dtype)
                if pool.dim() not in (3, 4) or pool.shape[-1] != comp.width or \
                        (pool.dim() == 4 and pool.shape[2] != 1):
                    raise ValueError(f"{name}: expected [num_blocks, block_size, (1,) "
                                     f"{comp.width}], got {tuple(pool.shape)}")
                if pool.shape[:2] != parts[0].shape[:2]:
                    raise ValueError(f"{name}: expected the block layout of component 0, "
                                     f"{tuple(parts[0].shape[:2])}, got {tuple(pool.shape[:2])}")
            if parts[0].shape[:2] != (layers[0][0].shape[:2] if layers else parts[0].shape[:2]):
                raise ValueError(f"host_kv[{layer}]: every layer needs the same blocks; got "
                                 f"{tuple(parts[0].shape[:2])} after "
                                 f"{tuple(layers[0][0].shape[:2])}")
            layers.append(parts)
        self.host_kv = layers
        self.block_size = int(layers[0][0].shape[1])
        self.num_host_blocks = int(layers[0][0].shape[0])

    def host(self, layer: int) -> Tuple[torch.Tensor, ...]:
        if self.host_kv is None:
            raise RuntimeError("host_kv: no host pool registered (register_host_kv)")
        return self.host_kv[layer]

    def resident_kv(self, layer: int) -> Tuple[torch.Tensor, ...]:
        """The layer's buffers as paged caches ``[R*S/bs, bs, 1, width]`` (PA_BSND)."""
        bs = self.resident_block_size
        return tuple(kv.view(self.rows * self.pages_per_row, bs, 1, kv.shape[-1])
                     for kv in self.kv[layer])

    def token_rows(self, name: str, part: torch.Tensor, N: int, comp) -> torch.Tensor:
        """``part`` ``[N, (1,) width]`` of component ``comp`` as ``[N, width]``."""
        require_tensor(name, part, comp.dtype, device=self.device)
        if part.shape[0] != N or part.numel() != N * comp.width:
            raise ValueError(f"{name}: expected [num_tokens = {N}, (1,) {comp.width}], got "
                             f"{tuple(part.shape)}")
        return part.view(N, comp.width)

    # ------------------------------------------------------------------------ host write
    def write(self, layer: int, rows: torch.Tensor, parts: Sequence[torch.Tensor]) -> None:
        """Token ``i``'s ``parts[c][i]`` to host row ``rows[i]`` (int64; outside the pool =
        skipped). Fixed shape: skipped entries repeat the first valid entry, index and bytes
        alike, so the scatter writes identical bytes twice rather than anything outside the
        valid rows; with no valid entry they rewrite host row 0 with its own content."""
        host = self.host(layer)
        pool_rows = self.num_host_blocks * self.block_size
        valid = (rows >= 0) & (rows < pool_rows)
        any_valid = valid.any()
        first = valid.to(torch.int32).argmax().view(1)    # a tensor index: no host sync
        fallback_row = torch.where(any_valid, rows.index_select(0, first), 0)
        target = torch.where(valid, rows, fallback_row)
        for pool, part in zip(host, parts):
            flat = pool.view(pool_rows, pool.shape[-1])
            values = part.to(pool.device)
            fallback = torch.where(any_valid, values.index_select(0, first), flat[:1])
            flat.index_copy_(0, target, torch.where(valid[:, None], values, fallback))

    # ------------------------------------------------------------------------------ copy
    def copy(self, layer: int, plan: Plan, block_table: torch.Tensor,
             fresh: Optional[torch.Tensor] = None, token_base: Optional[torch.Tensor] = None,
             new_kv: Optional[Sequence[torch.Tensor]] = None) -> torch.Tensor:
        """The plan's misses into the layer's buffers: from the host pool through
        ``block_table`` (int32 ``[R, blocks]``, state-row order), except the entries ``fresh``
        (bool like ``plan.miss_pos``), which are this pass's own positions and are copied from
        ``new_kv`` (per component ``[N, width]``, token ``pos + token_base[row]``) instead.
        Returns the rows copied from the host per state row, int32 ``[R]``. For
        ``SparseKVBuffer.step``: no bookkeeping of the plan here."""
        host_counts = plan.miss_counts
        if fresh is not None:
            # this pass's own positions are the largest a row selects and miss_pos ascends:
            # the fresh misses are the tail of each row's miss list, so the host gather stops
            # early
            host_counts = plan.miss_counts - fresh.sum(1, dtype=torch.int32)
        own = self.miss_copy(layer, block_table)
        avsg_buffer.copy_misses(plan._replace(miss_counts=host_counts), own.src, own.dst,
                                block_table=block_table, block_size=self.block_size,
                                num_cores=self.gather_cores)
        if fresh is not None:
            self._write_through(layer, plan, fresh, token_base, new_kv)
        return host_counts

    def miss_copy(self, layer: int, block_table: torch.Tensor) -> MissCopy:
        """The copy of ``copy`` (no write-through) as a ``MissCopy``: given to
        ``SparseKVBuffer.step``, the layer's plan and this copy are one launch (``plan_gather``);
        every miss of a plan is copied from the host pool through ``block_table``, so a plan's
        rows copied from the host are its ``miss_counts``."""
        host = self.host(layer)
        views = [kv if pool.dim() == 4 else kv.view(self.rows, self.capacity, kv.shape[-1])
                 for kv, pool in zip(self.kv[layer], host)]
        return MissCopy(list(host), views, block_table, self.block_size, self.gather_cores)

    def _write_through(self, layer: int, plan: Plan, fresh: torch.Tensor,
                       token_base: torch.Tensor, new_kv: Sequence[torch.Tensor]) -> None:
        """Each fresh miss's slot gets its token's row of ``new_kv``; every other entry writes
        the spare row (fixed shape, no branch)."""
        R, S = self.rows, self.capacity
        N = new_kv[0].shape[0]
        if N == 0:
            return                  # a pass with no tokens has nothing fresh (and no rows)
        state_row = torch.arange(R, device=self.device)[:, None]
        target = torch.where(fresh, state_row * S + plan.miss_slots.clamp(0, S - 1).long(),
                             torch.full_like(plan.miss_pos, R * S, dtype=torch.int64))
        token = (plan.miss_pos.long() + token_base[:, None]).clamp(0, max(N - 1, 0))
        for storage, rows in zip(self._storage[layer], new_kv):
            flat = storage.view(R * S + 1, storage.shape[-1])
            flat.index_copy_(0, target.reshape(-1), rows.index_select(0, token.reshape(-1)))

