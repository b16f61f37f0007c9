"""The two plug-in points of the runtime, along Spin's five operations.

One forward pass (the model runs it; the engine runs one per verification, MTP catch-up, draft
and prefill)::

    store.begin_pass(batch)                once, before the layers
    per layer, in order:
        store.offload(layer, batch, parts)     this pass's KV
        algo.index(...), algo.select(...)      -> topk_pos [R, T, K]
        store.retrieve(layer, topk_pos, batch) (not in a prefill pass: it reads its own KV)
        algo.attention(...)
    between passes: store.invalidate / algo.invalidate (rejected drafts), reset, release

A **sparse-attention algorithm** supplies

    Index      ``index(layer, batch, attn, x, q_resid)``: keep whatever it needs to select later
               (DSA: the indexer-key cache, on the device);
    Select     ``select(layer, batch, attn, x, q_resid) -> topk_pos int32 [R, T, K]``, causal per
               query token (``< batch.causal_lens[r, t]``), ``-1`` padded;
    Attention  ``attention(layer, batch, attn, q_nope, q_pe, retrieved) -> [R, T, heads, v_dim]``.

A **KV store** supplies

    (pass)     ``begin_pass(batch)``: once per forward pass, before any layer's offload or
               retrieve (whatever the store computes once per pass instead of once per layer);
    Offload    ``offload(layer, batch, parts)``: this pass's new KV (``parts`` in the store's
               ``KVFormat``, each ``[R, T, width]``) written at ``batch.pos``;
    Retrieve   ``retrieve(layer, topk_pos, batch) -> Retrieved``: make the selected entries
               readable and say where they are.

``Retrieved.view`` is a tuple of component tensors ``[R, X, width]`` and ``Retrieved.index`` int32
``[R, T, K]`` says which ``X``-row holds each selection (``-1`` = none). Attention gathers the
``[R, T, K, width]`` rows in selection order before computing anything, so every store that returns
the same bytes yields bit-identical outputs.

Both also follow the request lifecycle: ``reset(rows)`` when a row gets a new request,
``invalidate(valid_lens)`` after MTP verification (positions ``>= valid_lens[r]`` are dropped and
will be written again), and ``fill(layer, row, start, parts)`` for a context produced outside the
decode loop. The engine only ever sees these methods and the registries ``ALGORITHMS`` and
``STORES``, so a new algorithm or store plugs in without touching it.
"""
from __future__ import annotations

import abc
import contextlib
import dataclasses
from typing import Callable, Dict, Iterator, Optional, Sequence, Tuple, Type, Union

import torch

from .. import reference
from ..cache.split_rule import SplitPolicy
from ..kvformat import KVFormat
from .step import NULL_TIMERS, StepBatch, Timers


@dataclasses.dataclass
class Retrieved:
    view: Tuple[torch.Tensor, ...]      # component tensors [R, X, width]
    index: torch.Tensor                 # int32 [R, T, K] into X, -1 = no selection
    # the hit/miss split of ``index`` (``avsg.split_slots``: (hits, misses), each [R, T, K],
    # valid first then -1), or None: attention over ``index`` in one pass
    split: Optional[Tuple[torch.Tensor, torch.Tensor]] = None
    # with a split: makes the current stream wait for the copies into the miss slots (a no-op
    # where they ran in order, as on CPU); None: nothing to wait for
    wait_copies: Optional[Callable[[], None]] = None


def auto_split_policy(config, device, gather_cores: Optional[int] = None) -> SplitPolicy:
    """The split rule's inputs for ``split_attention="auto"`` on ``device`` (the decode model's
    bundled profile with ``config``'s attention dimensions:
    ``avsg.lab.costmodel.projection.serving_split_policy``). On CPU, or without a measured
    overlap, the rule never splits: "auto" is then the one-pass path, bit for bit."""
    from ..lab.costmodel.projection import serving_split_policy
    return serving_split_policy(config, device, gather_cores=gather_cores)


# --split-attention's values (``avsg run``, ``avsg generate``): the flag alone is "on"
SPLIT_ATTENTION_CHOICES = {"on": True, "off": False, "auto": "auto"}


@dataclasses.dataclass
class StoreSpec:
    """Everything a store needs to size itself. ``layers`` counts every attention layer that keeps
    KV, MTP layers included; ``max_len`` is the longest KV a row may hold."""
    layers: int
    rows: int
    max_len: int
    topk: int
    queries_per_step: int
    kv_format: KVFormat
    device: torch.device
    capacity: int = 8192
    policy: str = reference.DEFAULT_POLICY   # avsg: the buffers' residency policy
    lifetime: int = reference.DEFAULT_LIFETIME   # avsg: the lifetime policy's L
    block_size: int = 128
    write_through: bool = False         # avsg: a pass's new KV into its reserved slots directly
    # avsg: attention over hits / misses, LSE-merged (overlap); "auto": where the split rule
    # (avsg.cache.split_rule) chooses it, with split_policy's inputs
    split_attention: Union[bool, str] = False
    split_policy: Optional[SplitPolicy] = None
    gather_cores: Optional[int] = None  # avsg: cores of the copy's gather (None: the default of
                                        # avsg.buffer.MissCopy / gather)
    timers: Timers = NULL_TIMERS


class KVStore(abc.ABC):
    """Where the MLA KV lives and how attention gets to read the selected entries."""

    name: str = "?"

    def __init__(self, spec: StoreSpec):
        self.spec = spec
        self.timers = spec.timers
        # Host -> device traffic of retrieve, cumulative. Kept in tensors so that counting costs
        # no host sync in the decode step; read with h2d_bytes() / h2d_rows().
        self._h2d_rows = torch.zeros((), dtype=torch.int64, device=spec.device)
        self._h2d_fresh_rows = torch.zeros((), dtype=torch.int64, device=spec.device)

    def begin_pass(self, batch: StepBatch) -> None:
        """A forward pass over ``batch`` starts: called once, before its layers."""

    @abc.abstractmethod
    def offload(self, layer: int, batch: StepBatch, parts: Tuple[torch.Tensor, ...]) -> None: ...

    @abc.abstractmethod
    def fill(self, layer: int, row: int, start: int, parts: Tuple[torch.Tensor, ...]) -> None:
        """Write ``parts`` (each ``[N, width]``) at positions ``start .. start+N-1`` of ``row``."""

    @abc.abstractmethod
    def retrieve(self, layer: int, topk_pos: torch.Tensor, batch: StepBatch) -> Retrieved: ...

    def invalidate(self, valid_lens: torch.Tensor, layers: Optional[Sequence[int]] = None) -> None:
        """Positions ``>= valid_lens[r]`` of ``layers`` (default: all) will be written again:
        forget any copy of them."""

    def reset(self, rows: torch.Tensor) -> None:
        """``rows`` bool [R]: these rows start a new request."""

    def admit(self, row: int, length: int) -> None:
        """``row`` gets a new request that will hold at most ``length`` positions."""
        mask = torch.zeros(self.spec.rows, dtype=torch.bool, device=self.spec.device)
        mask[row] = True
        self.reset(mask)

    def release(self, row: int) -> None:
        """``row``'s request finished."""

    def h2d_rows(self) -> int:
        """Token rows copied host -> device by retrieve so far (syncs)."""
        return int(self._h2d_rows)

    def h2d_fresh_rows(self) -> int:
        """Of those, rows of positions written by this pass or the one before it: what keeping
        freshly produced KV on the device would save."""
        return int(self._h2d_fresh_rows)

    def h2d_bytes(self) -> int:
        return self.h2d_rows() * self.spec.kv_format.row_bytes

    def hit_rate(self) -> Optional[float]:
        """Fraction of selections served without a copy, when the store reuses anything."""
        return None


class SparseAlgorithm(abc.ABC):
    """Index / Select / Attention. ``attn`` is the layer's attention module (its weights)."""

    name: str = "?"

    @abc.abstractmethod
    def index(self, layer: int, batch: StepBatch, attn: torch.nn.Module, x: torch.Tensor,
              q_resid: torch.Tensor) -> None: ...

    @abc.abstractmethod
    def select(self, layer: int, batch: StepBatch, attn: torch.nn.Module, x: torch.Tensor,
               q_resid: torch.Tensor) -> torch.Tensor: ...

    @abc.abstractmethod
    def attention(self, layer: int, batch: StepBatch, attn: torch.nn.Module, q_nope: torch.Tensor,
                  q_pe: torch.Tensor, retrieved: Retrieved) -> torch.Tensor: ...

    def fill(self, layer: int, row: int, start: int, index_keys: torch.Tensor) -> None:
        """Context fill: index keys ``[N, index_head_dim]`` at ``start .. start+N-1``."""

    def invalidate(self, valid_lens: torch.Tensor, layers: Optional[Sequence[int]] = None) -> None:
        """As ``KVStore.invalidate``, for whatever the algorithm keeps per position."""

    def reset(self, rows: torch.Tensor) -> None: ...


@dataclasses.dataclass
class ForwardContext:
    """What a forward pass runs with (passed down explicitly: no globals). An engine keeps one:
    its algorithm and store live here and nowhere else, so swapping the store is one assignment.

    ``prefill`` and ``recorder`` describe the pass being run (``settings``). ``prefill=True``
    means the pass holds whole prompts from position 0: attention then reads the pass's own
    freshly computed KV instead of calling ``store.retrieve``. ``recorder(layer, topk_pos)`` taps
    the pass's selections.
    """
    algo: SparseAlgorithm
    store: KVStore
    kv_format: KVFormat
    timers: Timers = NULL_TIMERS
    prefill: bool = False
    recorder: Optional[Callable[[int, torch.Tensor], None]] = None   # (layer, topk_pos) tap

    @contextlib.contextmanager
    def settings(self, prefill: bool = False,
                 recorder: Optional[Callable[[int, torch.Tensor], None]] = None
                 ) -> Iterator["ForwardContext"]:
        """The passes run inside use ``prefill`` and ``recorder``; the previous ones return
        after."""
        saved = self.prefill, self.recorder
        self.prefill, self.recorder = prefill, recorder
        try:
            yield self
        finally:
            self.prefill, self.recorder = saved


STORES: Dict[str, Type[KVStore]] = {}
ALGORITHMS: Dict[str, Type[SparseAlgorithm]] = {}


def register_store(cls: Type[KVStore]) -> Type[KVStore]:
    STORES[cls.name] = cls
    return cls


def register_algorithm(cls: Type[SparseAlgorithm]) -> Type[SparseAlgorithm]:
    ALGORITHMS[cls.name] = cls
    return cls
