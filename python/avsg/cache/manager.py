"""``SparseOffloadManager``: the AVSG buffers of a whole model, driven by an engine's batches.

The serving core composed for an engine whose host pool AVSG addresses (the runtime's ``avsg``
store, MindIE): the row table (``rows.RowTable``), every layer's buffers and drops
(``residency.Residency``), the device KV and its paged host pool with the package's own copy
(``paged.PagedKV``), and the TND adapter (``tokens``).

One forward pass, who calls what ("One pass" below has the details)::

    begin_step / begin_step_rtk    once per pass, before any layer      (the pass's StepMeta)
    write_kv                       per layer                            (host pool)
    step (or retrieve)             per layer, once                      (one buffer call: drop +
                                                                         plan + copy)
    invalidate                     between passes, as the engine needs  (records; launches nothing)

``step`` is the one per-layer entry: top-k ``[R, q, K]`` by state row in, slots by state row
out. ``retrieve`` wraps it for an engine's flattened TND batch (vLLM's and MindIE's: top-k
``[num_tokens, 1, K]``), returning sparse flash attention's inputs. ``begin_step_rtk`` starts a
uniform pass (the runtime: ``q`` tokens in every active row, rows that never move, so that batch
row = state row and ``step`` takes its ``[R, T, K]`` as it is).

Three index spaces are kept apart throughout (docs/design.md §2): a ``pos`` is a request-relative
token position (what the indexer selects), a *host row* is where that position lives in the
engine's paged host pool (``block_table[req, pos // bs] * bs + pos % bs``: vLLM's slot mapping),
and a ``slot`` is a row of a device buffer (what attention reads).

Batch rows and state rows
-------------------------
An engine keeps a persistent batch of ``max_rows`` rows; request ``i`` of a step's flattened
batch is batch row ``i`` (vLLM's ``InputBatch`` keeps the running requests in rows ``0..n-1``).
The manager owns ``max_rows`` *state rows*, each one request's residency: one row of every layer's
``SparseKVBuffer`` state and the same row of every layer's device KV buffers. The row table ties
the two: keyed by batch row (``add``, ``free``) or by the engine's request keys
(``begin_step(requests=...)``, ``release``); ``state_row_of_batch_row`` is its device copy for the
pass. Compaction (``move_row``, ``swap_rows``) permutes that
table and nothing else: a request keeps its state row, so it keeps every hit, and no byte of state
or KV moves. (Moving the data instead would copy ``capacity`` x 1152 B of KV per layer per moved
request, about 9.4 MB per layer at capacity 8192, for a change that attention never needs to see:
it already reads the buffer through a block table, which is where the permutation shows up.)

Device memory per layer (``R = max_rows``, ``S = capacity``, ``bs`` = resident block size, 128)::

    k_nope   [R, S, 1, 512] bf16     | or one packed fp8 row per token: kv [R, S, 1, 656] uint8
    k_pe     [R, S, 1, 64]  bf16     |   (512 e4m3, 4 fp32 tile scales, 64 bf16 rope)
    state    int32 [R, width]          the SparseKVBuffer's per-row hash index and slot lifetimes

Each KV buffer sits in storage with one spare row at the end (``R*S + 1`` rows): fixed-shape
scatters send the entries they must not write there instead of branching. Attention sees each
buffer as a paged cache ``[R*S/bs, bs, 1, width]`` (``resident_kv``) read through the *resident
block table* int32 ``[R, S/bs]``: batch row ``b`` lists the pages of its state row ``s``,
``[s*S/bs, (s+1)*S/bs)``. Slots run ``0..S-1``, so the kv length of every buffered request is ``S``.

One pass
--------
1. ``begin_step(query_start_loc, seq_lens, block_table, num_tokens)``, once per forward pass, for
   an engine with a flattened TND batch (vLLM's): maps every token to its request, its batch row,
   its state row and its query index ``j`` within the request, and reorders ``seq_lens`` and the
   host block table into state-row order. A request with ``1..T`` tokens (``T =
   queries_per_step = 1 + drafts``: decode, MTP verification, a short chunk) goes through the
   buffer; a longer one (a prefill chunk) bypasses it: its slots are ``-1`` and ``planned`` is
   False for its tokens, and the engine runs it on its own prefill path.
   ``begin_step_rtk(seq_lens, queries, block_table, active)`` is the same for an engine whose
   pass is uniform, ``queries`` tokens in every active batch row (the runtime's ``[R, T, K]``).
2. ``write_kv(layer, slot_mapping, kv)``: this pass's new KV goes to the host pool at the host
   rows the engine's slot mapping names (decode and prefill alike, in the engine's block layout).
3. ``retrieve(layer, topk_indices, meta, new_kv=...)``, per layer (``step`` takes the top-k as
   ``[R, q, K]`` by state row instead and returns the slots the same way, see 3e); one call into
   the buffer, ``SparseKVBuffer.step``, does a-d:

   a. the drop removes what the layer must not serve any more: the drops recorded
      for it since its last plan (``invalidate`` calls, bypassing passes) and, with
      ``auto_invalidate``, this pass's own positions ``>= seq_len - q_len`` (rewritten now:
      rejected MTP drafts of the previous step among them), as vllm-ascend's
      ``stable_prefix_lens`` does ("Stale copies" below);
   b. ``plan``: the ``[num_tokens, 1, K]`` top-k is scattered into ``[R, T, K]`` (all ``T`` query
      tokens of a request share its state row) and matched against the buffer;
   c. ``gather`` copies the misses host -> buffer through the host block table;
   d. with ``write_through`` (which then needs ``new_kv``), a miss on one of this pass's own
      positions is copied from ``new_kv`` (already on the device) into its reserved slot instead
      of from the host;
   e. ``retrieve`` returns the slots in TND layout ``[num_tokens, 1, K]``, valid entries first
      (order kept) and ``-1`` after, with the resident block table and the kv lengths (sparse
      flash attention's inputs); ``step`` returns them as ``[R, q, K]`` in selection order, by
      state row, with the positions it copied from the host (what a caller that gathers
      ``buffer[row, slot]`` itself reads), and compacts nothing.

Stale copies. The manager never serves a position's old bytes after a pass rewrote it. A pass
rewrites positions ``[seq_len - q_len, seq_len)`` of each of its requests. Drops wait in one table
(``Residency``: per layer and state row, the lowest position to drop) until the layer's next
step, which applies them with its plan (3a); only a plan can read a resident copy,
so a recorded drop is as good as an applied one, and no copy is ever read stale. ``invalidate``
records (the engine's rejected drafts, for the layers it names); so does ``begin_step`` for a
request that bypasses the buffer (``q_len > T``: it may still hold copies of positions it
rewrites, e.g. rejected drafts of its previous pass), for every layer, also when the engine calls
no ``retrieve`` for the bypassing pass and also with ``auto_invalidate`` off; with
``auto_invalidate``, a layer that ``write_kv`` wrote in a pass but that did not ``retrieve`` in it
records the pass's positions when the pass ends (the next ``begin_step`` or ``add``); ``add``
clears a row's record (its state is reset). ``write_kv`` after its layer's ``retrieve`` in the
same pass is refused when write-through is off: that gather read the pass's positions from the
host before the write.
``resident(layer, row)`` shows what a plan can still hit.

Ordering. Every step's host writes (step 2) must be visible to the host reads of a later gather:
on an NPU both are on the compute stream, so stream order suffices; a copy engine on another
stream needs an event. Within one pass, ``write_kv`` for a layer comes before ``retrieve`` for that
layer when write-through is off (the gather may fetch this pass's positions from the host; a
``write_kv`` after it is refused, outside tracing); with write-through those rows are never read
from the host, so the host write may overlap the gather.

Fixed shapes, no host sync: ``begin_step``, ``begin_step_rtk``, ``retrieve``, ``step`` and ``invalidate``
only launch fixed-shape tensor ops (with ``check=False``, the NPU default; ``check=True`` reads
values and raises ``ValueError`` naming the argument), so ``torch.compile(fullgraph=True)`` and
graph capture can take a layer step. Lifecycle calls (``add``, ``free``, ``move_row``,
``swap_rows``) run between steps on the host and update the device tables in place; each, like
a later ``begin_step``, supersedes the pass's ``StepMeta`` (``retrieve`` refuses it, outside
tracing). With ``check``, ``begin_step`` also refuses ``seq_lens`` past ``max_context`` and
``retrieve`` checks the host block table against the pool.
"""
from __future__ import annotations

import contextlib
import itertools
import os
from typing import (Callable, ContextManager, Dict, List, NamedTuple, Optional, Sequence,
                    Tuple, Union)

import torch

from .. import reference
from ..buffer import Plan, SparseKVBuffer, split_slots
from ..reference import SplitSlots
from ..kvformat import KVFormat, get_format
from ..validation import (check_selections, require_bool, require_device, require_fits,
                          require_int, require_tensor, tracing)
from . import tokens as token_layout
from .overlap import CopyStream
from .paged import PagedKV
from .residency import NO_LIMIT, Residency
from .rows import RowTable
from .split_rule import SPLIT_LAUNCHES, SplitPolicy

RESIDENT_BLOCK_SIZE = 128         # the page size sparse flash attention reads (PA_BSND)
# The avsg kernels one layer of a serving pass launches (``step`` / ``retrieve``), in order. By
# default the copy is the package's own gather of every miss, so SparseKVBuffer.step runs the
# drop (the plan's valid_lens), the plan and the copy as one launch (plan_gather, PagedKV.miss_copy).
# With write-through (the host copy stops short of a pass's own positions) or the split (the copy
# on its own stream, beside attention over the hits) the plan and PagedKV.copy's gather are two.
# The decode model prices launches from SERVING_LAUNCHES, the runtime's default
# (avsg.lab.costmodel.projection.launches_per_layer); tests/integrations/test_serving_launches.py
# counts the avsg ops a layer step dispatches and holds them equal to serving_launches(): change
# both together.
SERVING_LAUNCHES = ("plan_gather",)
SERVING_LAUNCHES_APART = ("plan", "gather")


def serving_launches(write_through: bool = False, split: bool = False,
                     fused: bool = True) -> Tuple[str, ...]:
    """The avsg kernels one layer's step launches: ``SERVING_LAUNCHES`` when the plan and the
    copy are one launch (``fused``: the manager's ``fuse_copy``), else the two apart."""
    return SERVING_LAUNCHES if fused and not write_through and not split \
        else SERVING_LAUNCHES_APART


def split_added_launches(fused: bool = True) -> int:
    """The launches a layer's step adds when it splits: the split's own (``SPLIT_LAUNCHES``),
    plus the copy's own launch where the unsplit step fuses it into the plan's (the split's copy
    runs on its own stream). The decode model and ``step(split="auto")`` price the split with it."""
    return (len(serving_launches(split=True)) - len(serving_launches(fused=fused))
            + len(SPLIT_LAUNCHES))
_MAX_WIDTH = 1 << 16                  # latent / RoPE widths: DeepSeek's are 512 and 64
_MAX_TOKENS = (1 << 31) - 1           # query_start_loc is int32
_TOKEN_BYTES = 64                     # what begin_step and retrieve allocate per token, about
_SERIALS = itertools.count(1)         # one per manager: StepMeta.manager names the one that made it


def default_fuse_copy(device: torch.device) -> bool:
    """Whether the serving core fuses plan and copy by default on ``device``: always on CPU. On an
    NPU the fused launch waits across cores, like the split plan: only where the library launches
    such a kernel with the batch schedule mode and ``AVSG_NPU_SPLIT=1`` says that wait was
    verified on this device (``avsg doctor``; docs/npu.md)."""
    if device.type == "cpu":
        return True
    from .. import backend
    return backend.backend_info().get("npu_split_launch") == "batch" and \
        os.environ.get("AVSG_NPU_SPLIT") == "1"


class StepMeta(NamedTuple):
    """Per-pass mapping shared by every layer (``begin_step``); fixed-shape device tensors.

    Token fields are ``[num_tokens]``; state fields are ``[max_rows]`` in state-row order.
    """
    num_tokens: int
    num_reqs: int
    planned: torch.Tensor            # bool  [N]  token goes through the buffer
    plan_index: torch.Tensor         # int64 [N]  state_row * T + j, or R * T (a discarded row)
    token_seq_lens: torch.Tensor     # int32 [N]  seq_len of the token's request
    seq_lens: torch.Tensor           # int32 [R]  per state row; 0 where no buffered request
    stable_lens: torch.Tensor        # int32 [R]  seq_len - q_len: positions below are final
    token_base: torch.Tensor         # int64 [R]  token index of this pass's position p = p + base
    block_table: torch.Tensor        # int32 [R, max_blocks] host block table, state-row order
    kv_lens: torch.Tensor            # int32 [Q]  resident kv length per request (S or 0)
    query_start_loc: torch.Tensor    # int32 [Q + 1] as given (begin_step_rtk: arange * queries)
    buffered: torch.Tensor           # bool  [R]  per state row: a request planned this pass
    # the manager's generation when it was made: retrieve refuses the meta once a later
    # begin_step or a lifecycle call (add, free, move_row, swap_rows) has run (0: made under
    # tracing, unguarded, as a Plan's)
    generation: int = 0
    # the serial number of the manager whose begin_step made it: another manager refuses it
    # (outside tracing, as the generation), since it maps batch rows to that manager's state rows
    manager: int = 0


class SparseAttentionInputs(NamedTuple):
    """What one layer's sparse flash attention reads (``retrieve``)."""
    slots: torch.Tensor              # int32 [N, 1, K]  sparse_indices: valid first, then -1
    block_table: torch.Tensor        # int32 [Q, S/bs]  resident block table, batch order
    kv_lens: torch.Tensor            # int32 [Q]        actual_seq_lengths_kv
    kv: Tuple[torch.Tensor, ...]     # resident paged caches [R*S/bs, bs, 1, width]
    planned: torch.Tensor            # bool  [N]        False: bypassed (prefill) or padding
    plan: Plan                       # the layer's plan, state-row order (accounting, tests)
    host_copied: torch.Tensor        # bool  [R, T*K]   miss entries fetched from the host


class RowSlots(NamedTuple):
    """What ``step`` returns, by state row: what a caller with ``[R, q, K]`` selections reads,
    nothing compacted."""
    slots: torch.Tensor              # int32 [R, q, K]  slot of each selection (selection order)
    host_pos: torch.Tensor           # int32 [R, T*K]   positions copied from the host, -1 after
    host_counts: torch.Tensor        # int32 [R]        how many (the valid prefix of host_pos)
    plan: Plan                       # the layer's plan, state-row order (accounting, tests)
    # step(split=True): the hit/miss split of ``slots`` (``avsg.split_slots``), [R, q, K] each;
    # the copies then ran on ``copy_stream`` (wait before reading a miss slot or host_pos)
    split: Optional[SplitSlots] = None


class SparseOffloadManager:
    """One per model: per layer a ``SparseKVBuffer`` and device KV buffers, plus the row tables.

    Args:
        num_layers: attention layers that keep KV (MTP layers included).
        max_rows: rows of the engine's persistent batch (``max_num_seqs``). Every layer's launch
            takes every row; a row without a request is idle (``reference.idle_rows``): the plan
            reads its header, writes ``-1`` outputs and leaves its state as it is (counted
            serial-pipe model, K 2048, S 8192: about 1.3 us at T = 1 and 3.2 at T = 4, against
            21.5 and 42.1 for an active row, README's plan table).
            More rows than cores means waves (a core plans its idle rows, then its others),
            and the copy then takes every core (docs/decode-model.md, "Left out").
        capacity: buffer slots per request (``S``), a multiple of ``resident_block_size`` and at
            least ``topk * queries_per_step``.
        topk: selections per query token (``K``, 2048 for DeepSeek-V3.2).
        queries_per_step: ``T = 1 + num_speculative_tokens``; requests with more tokens in a pass
            bypass the buffer.
        kv_format: ``"bf16"`` (k_nope 512 + k_pe 64), ``"fp8"`` (one packed 656-byte row),
            ``"fp32"`` (tests), or a ``KVFormat``.
        policy, max_context, lifetime, hash_buckets: the buffers' residency policy and its
            parameters (``SparseKVBuffer``); ``max_context`` is optional (a check on the
            context, e.g. ``max_model_len``, never storage).
        resident_block_size: page size of the resident block table (128).
        host_kv: per layer, the host pool's components ``[num_blocks, block_size, (1,) width]``
            in the order of ``kv_format``; may be given later with ``register_host_kv``.
        write_through: copy a pass's own newly written positions into their reserved slots from
            the device instead of fetching them from the host (needs ``new_kv`` at ``retrieve``).
        auto_invalidate: drop positions ``>= seq_len - q_len`` before each plan (see module doc);
            requests that bypass the buffer are always dropped ("Stale copies").
        check: value checks (default: on for CPU, off elsewhere, where they would sync).
        timers: optional ``timers(phase) -> context manager`` wrapped around the ``"plan"`` and
            ``"gather"`` phases of ``begin_step`` / ``retrieve`` (not while tracing); where plan
            and copy are one launch (``fuse_copy``) that launch is one phase, ``"plan_gather"``.
        gather_cores: cores the copy's gather launch takes (``avsg.gather``'s ``num_cores``;
            default ``avsg.get_num_cores()``, or in the one-launch ``plan_gather`` the cores its
            plan leaves, ``avsg.buffer.copy_cores_beside_plan``): fewer leave cores to an
            attention kernel that should run beside the copy (``step(split=True)``,
            docs/overlap.md).
        fuse_copy: run a layer's plan and its copy as one launch (``plan_gather``) wherever the
            copy is the package's own gather of every miss (not with write-through, nor
            ``step(split=True)``). Default: on CPU; on an NPU only where the plan's split may run
            (``default_fuse_copy``), since the fused launch waits across cores as it does.
        split_policy: the split rule's inputs (``avsg.cache.split_rule.SplitPolicy``: its
            profile, the launch cost, whether the overlap is established on this card, the
            expected misses) for ``step(split="auto")``; None: "auto" is refused.
    """

    def __init__(self, num_layers: int, max_rows: int, capacity: int, topk: int,
                 queries_per_step: int = 1, kv_format: Union[str, KVFormat] = "bf16",
                 lifetime: int = reference.DEFAULT_LIFETIME, hash_buckets: Optional[int] = None,
                 resident_block_size: int = RESIDENT_BLOCK_SIZE,
                 device: Union[str, torch.device] = "cpu",
                 host_kv: Optional[Sequence[Sequence[torch.Tensor]]] = None,
                 write_through: bool = False, auto_invalidate: bool = True,
                 check: Optional[bool] = None, latent_dim: int = 512, rope_dim: int = 64,
                 timers: Optional[Callable[[str], ContextManager]] = None,
                 policy: str = reference.DEFAULT_POLICY, max_context: Optional[int] = None,
                 gather_cores: Optional[int] = None, fuse_copy: Optional[bool] = None,
                 split_policy: Optional[SplitPolicy] = None):
        require_int("num_layers", num_layers, low=1)
        require_bool("fuse_copy", fuse_copy, optional=True)
        if split_policy is not None and not isinstance(split_policy, SplitPolicy):
            raise TypeError(f"split_policy: expected None or a SplitPolicy, got "
                            f"{type(split_policy).__name__}")
        if gather_cores is not None:
            require_int("gather_cores", gather_cores, low=1)
        require_int("max_rows", max_rows, low=1)
        require_int("resident_block_size", resident_block_size, low=1)
        require_int("capacity", capacity, low=1, high=reference.MAX_BUCKETS)
        require_int("topk", topk, low=1)
        require_int("queries_per_step", queries_per_step, low=1)
        if capacity % resident_block_size:
            raise ValueError(f"capacity: expected a multiple of resident_block_size = "
                             f"{resident_block_size} (a row owns whole pages), got {capacity}")
        require_int("latent_dim", latent_dim, low=1, high=_MAX_WIDTH)
        require_int("rope_dim", rope_dim, low=1, high=_MAX_WIDTH)
        require_bool("write_through", write_through)
        require_bool("auto_invalidate", auto_invalidate)
        require_bool("check", check, optional=True)
        if timers is not None and not callable(timers):
            raise TypeError(f"timers: expected None or a callable phase -> context manager, got "
                            f"{type(timers).__name__}")
        if not isinstance(kv_format, (str, KVFormat)):
            raise TypeError(f"kv_format: expected a format name or a KVFormat, got "
                            f"{type(kv_format).__name__}")
        self.kv_format = kv_format if isinstance(kv_format, KVFormat) else \
            get_format(kv_format, latent_dim, rope_dim)
        self.device = require_device("device", device)
        self.num_layers, self.max_rows, self.capacity = num_layers, max_rows, capacity
        self.topk, self.queries_per_step = topk, queries_per_step
        self.resident_block_size = resident_block_size
        self.pages_per_row = capacity // resident_block_size
        self.write_through, self.auto_invalidate = write_through, auto_invalidate
        self.check = (self.device.type == "cpu") if check is None else check
        self.fuse_copy = default_fuse_copy(self.device) if fuse_copy is None else fuse_copy
        self._timers = timers
        # the three parts: which request holds which state row (keyed by batch row), every
        # layer's buffers and drops, and the device KV with the host pool it is copied from
        self.rows = RowTable(max_rows)
        self.paged = PagedKV(num_layers, max_rows, capacity, self.kv_format, resident_block_size,
                             self.device, gather_cores)
        self.residency = Residency(num_layers, max_rows, capacity, topk, queries_per_step,
                                   policy=policy, lifetime=lifetime, hash_buckets=hash_buckets,
                                   max_context=max_context, device=self.device, check=self.check)
        self.buffers: List[SparseKVBuffer] = self.residency.buffers
        self.kv = self.paged.kv
        # device copies of the row table, what the steps read (updated in place: compiled
        # graphs keep pointing at them)
        R = max_rows
        self.state_row_of_batch_row = torch.arange(R, dtype=torch.int64, device=self.device)
        self.occupied = torch.zeros(R, dtype=torch.bool, device=self.device)
        self.resident_block_table = torch.empty(R, self.pages_per_row, dtype=torch.int32,
                                                device=self.device)
        self._state_row_host = list(range(R))
        self._occupied_host = [False] * R
        # None until the first lifecycle call or begin_step(requests=...) says which: rows by
        # batch row (add, free, move_row, swap_rows) or by request key
        self._keyed: Optional[bool] = None
        # bumped by every begin_step and every lifecycle call (StepMeta.generation)
        self._generation = 0
        self._serial = next(_SERIALS)
        # the pass begin_step mapped last, until the next begin_step or add: its generation and
        # its stable_lens (positions at or past them are rewritten by the pass); per layer, the
        # generation of the last pass that retrieved it (write_kv after that, write-through
        # off, is refused) and that wrote it (written, not retrieved: its drops are recorded
        # when the pass ends)
        self._pass: Optional[Tuple[int, torch.Tensor]] = None
        self._retrieved_in = [0] * num_layers
        self._written_in = [0] * num_layers
        # the StepMeta whose host blocks begin_step checked against the pool (its generation and
        # its block_table, seq_lens and buffered tensors; None: none), so that retrieve checks
        # them only where begin_step could not: a meta with other tensors, or another
        # manager's, is checked
        self._blocks_checked: Optional[Tuple[int, torch.Tensor, torch.Tensor, torch.Tensor]] = None
        self._sync_tables()
        self.h2d_rows = torch.zeros((), dtype=torch.int64, device=self.device)
        # where step(split=True) queues its copies (docs/overlap.md); no-ops on CPU
        self.copy_stream = CopyStream(self.device)
        self.split_policy = split_policy
        self.write_through_rows = torch.zeros((), dtype=torch.int64, device=self.device)
        if host_kv is not None:
            self.register_host_kv(host_kv)

    def __repr__(self) -> str:
        return (f"SparseOffloadManager(num_layers={self.num_layers}, max_rows={self.max_rows}, "
                f"capacity={self.capacity}, topk={self.topk}, "
                f"queries_per_step={self.queries_per_step}, kv_format='{self.kv_format.name}')")

    # ------------------------------------------------------------------------- host pool
    def register_host_kv(self, host_kv: Sequence[Sequence[torch.Tensor]]) -> None:
        """Per layer, the host pool's components ``[num_blocks, block_size, (1,) width]``.
        Another pool than the one registered forgets every row's residency (the rows stay
        with their requests): each resident copy was read from the old pool."""
        previous = self.paged.host_kv
        self.paged.register_host_kv(host_kv)
        self._blocks_checked = None          # checked against another pool, or not at all
        if previous is not None and not all(
                a is b for old, new in zip(previous, self.paged.host_kv)
                for a, b in zip(old, new)):
            self.residency.reset(range(self.max_rows))

    @property
    def host_kv(self) -> Optional[List[Tuple[torch.Tensor, ...]]]:
        return self.paged.host_kv

    @property
    def block_size(self) -> int:
        return self.paged.block_size

    @property
    def num_host_blocks(self) -> int:
        return self.paged.num_host_blocks

    def resident_kv(self, layer: int) -> Tuple[torch.Tensor, ...]:
        """The layer's buffers as paged caches ``[R*S/bs, bs, 1, width]`` (PA_BSND)."""
        return self.paged.resident_kv(self._layer(layer))

    # ------------------------------------------------------------------------- lifecycle
    def _row(self, name: str, row: int) -> int:
        require_int(name, row, low=0, high=self.max_rows - 1)
        return row

    def _batch_rows(self, call: str) -> None:
        """A lifecycle call by batch row: refused once the engine names requests by key."""
        if self._keyed:
            raise ValueError(f"{call}: this manager follows request keys (begin_step's "
                             f"requests); an engine uses either batch rows or request keys")
        self._keyed = False

    def _sync_tables(self, positions: Optional[Sequence] = None) -> None:
        """The row table -> the device tensors the steps read (in place: compiled graphs keep
        pointing at them). Every earlier StepMeta is superseded: its rows no longer match.

        ``positions``: the key in each batch position (``begin_step(requests=...)``); default:
        batch row ``b`` is key ``b`` (``add`` and the other lifecycle calls). Every batch row has
        a state row: its request's, or for a free batch row one of the free state rows (in
        order; nothing is planned for it, and ``add`` resets it)."""
        self._generation += 1
        R = self.max_rows
        if positions is None:
            positions = list(range(R))
        positions = list(positions) + [None] * (R - len(positions))
        self._positions = positions
        state_of = {b: self.rows.row_of(k) for b, k in enumerate(positions)
                    if k is not None and k in self.rows}
        free_batch = [b for b in range(R) if b not in state_of]
        state_of.update(zip(free_batch, sorted(set(range(R)) - set(state_of.values()))))
        self._state_row_host = [state_of[b] for b in range(R)]
        self._occupied_host = [b not in free_batch for b in range(R)]
        state_rows = torch.tensor(self._state_row_host, dtype=torch.int64)
        self.state_row_of_batch_row.copy_(state_rows)
        self.occupied.copy_(torch.tensor(self._occupied_host, dtype=torch.bool))
        token_layout.resident_pages(state_rows, self.pages_per_row,
                                    out=self.resident_block_table)

    def add(self, row: int) -> None:
        """A new request takes batch row ``row`` (which must be free): its state row is reset on
        every layer (a cold start, also for a resumed preempted request)."""
        self._batch_rows("add")
        self._row("row", row)
        if row in self.rows:
            raise ValueError(f"row: batch row {row} already holds a request; free it first")
        # an admission ends the pass: what it left to drop is recorded now, and a later write_kv
        # (the new request's prefill) writes only this, freshly reset, row
        self._close_pass()
        self._pass = None
        state_row = self.rows.admit(row, self._state_row_host[row])
        self.residency.reset([state_row])
        self._sync_tables()

    def free(self, row: int) -> None:
        """The request in ``row`` finished or was preempted. Its residency is forgotten when the
        row is next added (nothing is read from a free row meanwhile)."""
        self._batch_rows("free")
        self._row("row", row)
        if row not in self.rows:
            raise ValueError(f"row: batch row {row} holds no request")
        self.rows.release([row])
        self._sync_tables()

    def move_row(self, src: int, dst: int) -> None:
        """Compaction: the request in ``src`` now sits in the free row ``dst`` (vLLM's
        ``InputBatch.condense``). It keeps its state row, hence its hits; no data moves."""
        self._batch_rows("move_row")
        self._row("src", src)
        self._row("dst", dst)
        if src not in self.rows:
            raise ValueError(f"src: batch row {src} holds no request to move")
        if dst in self.rows:
            raise ValueError(f"dst: batch row {dst} holds a request; move into a free row or "
                             f"use swap_rows")
        self.rows.rekey(src, dst)
        self._sync_tables()

    def swap_rows(self, a: int, b: int) -> None:
        """Reordering: batch rows ``a`` and ``b`` exchange their requests (vLLM's
        ``InputBatch.swap_states``); either may be free."""
        self._batch_rows("swap_rows")
        self._row("a", a)
        self._row("b", b)
        self.rows.swap(a, b)
        self._sync_tables()

    def holds_request(self, row: int) -> bool:
        return self._occupied_host[self._row("row", row)]

    def state_row(self, row: int) -> int:
        """The state row behind batch row ``row`` (inspection, tests)."""
        return self._state_row_host[self._row("row", row)]

    def invalidate(self, valid_lens: torch.Tensor, layers: Optional[Sequence[int]] = None) -> None:
        """Positions ``>= valid_lens[b]`` (int32 ``[max_rows]``, batch order) of ``layers``
        (default: all) will be written again, e.g. rejected drafts: each of those layers drops
        them in its next step, in the same launch as its plan. Nothing is launched here: only a
        plan reads a resident copy ("Stale copies"). Free rows should pass ``2**24`` (or
        anything). A manager that follows request keys takes ``valid_lens`` in the order of the
        last ``begin_step``'s ``requests`` (``release`` keeps it)."""
        require_tensor("valid_lens", valid_lens, torch.int32, (self.max_rows,), self.device)
        if layers is not None:
            if not isinstance(layers, (list, tuple, range)):
                raise TypeError(f"layers: expected None or a list of layer indices, got "
                                f"{type(layers).__name__}")
            for i, layer in enumerate(layers):       # every layer checked before any is touched
                require_int(f"layers[{i}]", layer, low=0, high=self.num_layers - 1)
            if list(layers) == list(range(self.num_layers)):
                layers = None
        state_order = torch.empty_like(valid_lens)
        state_order.index_copy_(0, self.state_row_of_batch_row, valid_lens)
        self.residency.record_drops(state_order, layers)

    def resident(self, layer: int, row: int) -> Dict[int, int]:
        """``{pos: slot}`` that a plan of ``layer`` can hit for batch row ``row``: the buffer's
        residency less the drops still waiting for that plan (inspection and tests; syncs)."""
        return self.residency.resident(self._layer(layer), self.state_row(row))

    def _phase(self, name: str) -> ContextManager:
        if self._timers is None or tracing():
            return contextlib.nullcontext()
        return self._timers(name)

    def _layer(self, layer: int) -> int:
        require_int("layer", layer, low=0, high=self.num_layers - 1)
        return layer

    # ------------------------------------------------------------------------------ step
    def begin_step(self, query_start_loc: torch.Tensor, seq_lens: torch.Tensor,
                   block_table: torch.Tensor, num_tokens: int,
                   check: Optional[bool] = None,
                   requests: Optional[Sequence] = None) -> StepMeta:
        """Map a pass's flattened tokens onto state rows (once per pass, shared by the layers).

        ``query_start_loc`` int32 ``[Q + 1]`` (request ``i`` = batch row ``i`` owns tokens
        ``[qsl[i], qsl[i+1])``; tokens past ``qsl[Q]`` are padding), ``seq_lens`` int32 ``[>= Q]``
        (KV length after this pass), ``block_table`` int32 ``[>= Q, max_blocks]`` (the host
        pool's), ``num_tokens`` the padded token count of the pass.

        ``requests``: for an engine that names its requests rather than keeping them in batch
        rows (MindIE's sequence ids): the key of request ``i``, ``Q`` of them (``None``: an
        empty position). The manager's row table then follows the keys: a key not seen before
        gets a reset row, a key absent from the pass loses its row (its hits must not outlive
        it), and ``release(keys)`` frees the rows of requests whose KV is gone or replaced.
        Such an engine calls no ``add`` / ``free`` / ``move_row`` / ``swap_rows``.
        """
        R = self.max_rows
        keys = None
        if requests is not None:
            keys = self._request_keys(requests, query_start_loc)
        elif self._keyed:
            # only the keys say which row a batch position reads: the last pass's mapping
            # would give a request whose position changed another request's KV
            raise ValueError("requests: this manager follows request keys (an earlier "
                             "begin_step's requests); give every pass its keys, in batch order")
        require_int("num_tokens", num_tokens, low=0, high=_MAX_TOKENS)
        require_bool("check", check, optional=True)
        require_fits("num_tokens", num_tokens * (_TOKEN_BYTES + 4 * self.topk), self.device,
                      f"a pass of num_tokens = {num_tokens}")
        require_tensor("query_start_loc", query_start_loc, torch.int32, ndim=1, device=self.device)
        Q = query_start_loc.shape[0] - 1
        if not 1 <= Q <= R:
            raise ValueError(f"query_start_loc: expected [num_reqs + 1] with 1 <= num_reqs <= "
                             f"max_rows = {R}, got shape {tuple(query_start_loc.shape)}")
        require_tensor("seq_lens", seq_lens, torch.int32, ndim=1, device=self.device)
        if seq_lens.shape[0] < Q:
            raise ValueError(f"seq_lens: expected at least num_reqs = {Q} entries, got "
                             f"{seq_lens.shape[0]}")
        require_tensor("block_table", block_table, torch.int32, ndim=2, device=self.device)
        if block_table.shape[0] < Q:
            raise ValueError(f"block_table: expected at least num_reqs = {Q} rows, got "
                             f"{block_table.shape[0]}")
        seq_lens, block_table = seq_lens[:Q], block_table[:Q]
        checked = (self.check if check is None else check) and not tracing()
        if checked:
            # keyed: every key of the pass holds a row once the table follows them
            self._check_step(query_start_loc, seq_lens, block_table, num_tokens,
                             occupied=None if keys is None else [k is not None for k in keys])
        if keys is not None:
            self._follow_requests(keys)      # every check passed: the row table changes now

        qsl = query_start_loc.to(torch.int64)
        req, j, live = token_layout.requests_of_tokens(query_start_loc, num_tokens)
        return self._step_meta(qsl[:-1], qsl[1:] - qsl[:-1], seq_lens, block_table, req, j, live,
                               query_start_loc, checked)

    def _request_keys(self, requests: Sequence, query_start_loc: torch.Tensor) -> List:
        """``begin_step``'s ``requests`` checked (nothing changes here): the keys, a list."""
        if not isinstance(requests, (list, tuple)):
            raise TypeError(f"requests: expected a list of request keys in batch order, got "
                            f"{type(requests).__name__}")
        if self._keyed is False:
            raise ValueError("requests: this manager's rows are batch rows (add / free were "
                             "called); an engine uses either batch rows or request keys")
        if not isinstance(query_start_loc, torch.Tensor) or \
                len(requests) != query_start_loc.shape[0] - 1:
            raise ValueError(f"requests: expected one key per request of query_start_loc, got "
                             f"{len(requests)}")
        keys = list(requests)
        if len({k for k in keys if k is not None}) != sum(k is not None for k in keys):
            raise ValueError("requests: a key appears twice in one pass")
        return keys

    def _follow_requests(self, keys: List) -> None:
        """The row table follows a pass's keys (checked by ``_request_keys``)."""
        self._keyed = True
        state_rows, fresh = self.rows.assign(keys)
        if fresh:
            # what the last pass left to drop is recorded before the rows are reset
            self._close_pass()
            self._pass = None
            self.residency.reset(fresh)
        self._sync_tables(positions=[k if r >= 0 else None for k, r in zip(keys, state_rows)])

    def release(self, requests: Sequence) -> None:
        """For an engine that names requests by key (``begin_step(requests=...)``): the KV of
        ``requests`` is gone or replaced (finished, preempted, recomputed into new blocks).
        Their rows are freed now and reset before any request gets them, the same key
        included: a key that comes back reads nothing of its old residency. (A key that is
        simply absent from a pass loses its row too; this call is what covers a key that leaves
        and comes back between two passes, which the keys alone cannot show.)"""
        if not isinstance(requests, (list, tuple, set)):
            raise TypeError(f"requests: expected a list of request keys, got "
                            f"{type(requests).__name__}")
        if self._keyed is False:
            raise ValueError("requests: this manager's rows are batch rows (add / free were "
                             "called); use free(row)")
        self._keyed = True
        if self.rows.release(list(requests)):
            # a StepMeta made before is superseded; every other request keeps the batch
            # position of the last pass, the order invalidate's valid_lens are in until the next
            # begin_step (the released ones leave theirs free)
            self._sync_tables(positions=self._positions)

    def begin_step_rtk(self, seq_lens: torch.Tensor, queries: int, block_table: torch.Tensor,
                       active: Optional[torch.Tensor] = None,
                       check: Optional[bool] = None) -> StepMeta:
        """``begin_step`` for a uniform pass (once per pass, shared by the layers): every batch
        row ``b`` with ``active[b]`` (default: all) has ``queries`` query tokens, at positions
        ``[seq_lens[b] - queries, seq_lens[b])``; an inactive row has none (nothing of it is
        planned, invalidated or recorded). ``seq_lens`` int32 ``[max_rows]`` (KV length after this
        pass), ``block_table`` int32 ``[max_rows, max_blocks]`` (the host pool's). Token ``j`` of
        row ``b`` is token ``b * queries + j`` of the pass (``new_kv``, the TND fields of the
        meta). ``queries > T`` bypasses the buffer (a prefill: no ``retrieve``, its rewrites are
        recorded)."""
        R = self.max_rows
        if self._keyed:
            raise ValueError("begin_step_rtk: this manager follows request keys (begin_step's "
                             "requests), so a batch row is not a state row; call "
                             "begin_step(..., requests=...) for every pass")
        require_int("queries", queries, low=1, high=_MAX_TOKENS // R)
        require_bool("check", check, optional=True)
        num_tokens = R * queries
        require_fits("queries", num_tokens * (_TOKEN_BYTES + 4 * self.topk), self.device,
                      f"a pass of max_rows = {R} x queries = {queries} tokens")
        require_tensor("seq_lens", seq_lens, torch.int32, (R,), self.device)
        require_tensor("block_table", block_table, torch.int32, ndim=2, device=self.device)
        if block_table.shape[0] != R:
            raise ValueError(f"block_table: expected max_rows = {R} rows, got "
                             f"{tuple(block_table.shape)}")
        if active is None:
            active = torch.ones(R, dtype=torch.bool, device=self.device)
        require_tensor("active", active, torch.bool, (R,), self.device)
        q_len = torch.where(active, queries, 0).to(torch.int64)
        start = torch.arange(R, dtype=torch.int64, device=self.device) * queries
        query_start_loc = torch.arange(R + 1, dtype=torch.int32, device=self.device) * queries
        checked = (self.check if check is None else check) and not tracing()
        if checked:
            qsl = torch.cat([torch.zeros(1, dtype=torch.int64, device=self.device),
                             q_len.cumsum(0)]).to(torch.int32)
            self._check_step(qsl, seq_lens, block_table, num_tokens, rows_from="active")
        token = torch.arange(num_tokens, dtype=torch.int64, device=self.device)
        req = token // queries
        j = token - req * queries
        return self._step_meta(start, q_len, seq_lens, block_table, req, j, active[req],
                               query_start_loc, checked)

    def _step_meta(self, start: torch.Tensor, q_len: torch.Tensor, seq_lens: torch.Tensor,
                   block_table: torch.Tensor, req: torch.Tensor, j: torch.Tensor,
                   live: torch.Tensor, query_start_loc: torch.Tensor,
                   checked: bool = False) -> StepMeta:
        """Both entries' common part. Per batch row (``[Q]``): ``start`` int64 its first token,
        ``q_len`` int64 its token count, ``seq_lens``, ``block_table``; per token (``[N]``):
        ``req`` int64 its request, ``j`` int64 its index in it, ``live`` bool not padding;
        ``checked``: the entry ran ``_check_step`` on them."""
        R, T, S = self.max_rows, self.queries_per_step, self.capacity
        Q, N = q_len.shape[0], req.shape[0]
        seq = seq_lens.to(torch.int64)
        buffered = (q_len > 0) & (q_len <= T) & self.occupied[:Q]
        state_rows = self.state_row_of_batch_row[:Q]
        tokens = token_layout.token_rows(req, j, live, torch.where(buffered, state_rows, -1),
                                         R, T)
        first_new = (seq - q_len).clamp(0, NO_LIMIT)

        def by_state_row(values: torch.Tensor, fill) -> torch.Tensor:
            out = torch.full((R, *values.shape[1:]), fill, dtype=values.dtype, device=self.device)
            return out.index_copy_(0, state_rows, values)   # state rows are distinct: exact

        seq_state = by_state_row(torch.where(buffered, seq, 0).to(torch.int32), 0)
        stable = by_state_row(torch.where(buffered, first_new, NO_LIMIT).to(torch.int32),
                              NO_LIMIT)
        # a bypassing request rewrites its positions >= first_new with no plan of its own: every
        # layer drops them before its next plan (retrieve), whatever the engine calls meanwhile
        self.residency.record_drops(by_state_row(torch.where(q_len > T, first_new, NO_LIMIT)
                                        .to(torch.int32), NO_LIMIT))
        base = by_state_row(start - first_new, 0)
        table = by_state_row(block_table, -1)
        kv_lens = torch.where(buffered, S, 0).to(torch.int32)
        generation = 0
        if not tracing():
            self._close_pass()
            self._generation += 1
            generation = self._generation
            self._pass = (generation, stable)
        buffered_state = by_state_row(buffered, False)
        if generation:
            # _check_step checked the blocks only against a pool already registered
            self._blocks_checked = ((generation, table, seq_state, buffered_state)
                                    if checked and self.host_kv is not None else None)
        return StepMeta(N, Q, tokens.planned, tokens.plan_index, seq_lens.index_select(0, req),
                        seq_state,
                        stable, base, table, kv_lens, query_start_loc, buffered_state, generation,
                        self._serial)

    def _close_pass(self) -> None:
        """The last pass is over (a new one begins). A layer it wrote (``write_kv``) but did not
        retrieve never dropped the positions the pass rewrote (``auto_invalidate`` drops them at
        the retrieve): they wait for that layer's next plan."""
        if self._pass is None or not self.auto_invalidate:
            return
        done = self._pass[0]
        # a layer never retrieved outside tracing is retrieved by a compiled graph, which keeps
        # no record: it is left out rather than made to drop every pass
        layers = [layer for layer in range(self.num_layers)
                  if self._written_in[layer] == done and self._retrieved_in[layer] not in (0, done)]
        if layers:
            self.residency.record_drops(self._pass[1], layers)

    def _check_step(self, qsl, seq_lens, block_table, num_tokens,
                    rows_from: str = "query_start_loc",
                    occupied: Optional[Sequence[bool]] = None) -> None:
        """``rows_from``: the argument that says which batch rows have tokens (the caller's:
        ``query_start_loc``, or ``active`` for ``begin_step_rtk``), named when one of them
        holds no request. ``occupied``: which batch rows hold a request (default: the row
        table's now)."""
        if occupied is None:
            occupied = self._occupied_host
        q = qsl.tolist()
        if q[0] != 0:
            raise ValueError(f"query_start_loc[0] = {q[0]}: expected 0")
        for i in range(len(q) - 1):
            if q[i + 1] < q[i]:
                raise ValueError(f"query_start_loc[{i + 1}] = {q[i + 1]} < query_start_loc[{i}] "
                                 f"= {q[i]}: expected non-decreasing offsets")
        if q[-1] > num_tokens:
            raise ValueError(f"query_start_loc[-1] = {q[-1]}: more tokens than num_tokens = "
                             f"{num_tokens}")
        seq = seq_lens.tolist()
        limit = self.buffers[0].max_context
        buffered = []
        for i, length in enumerate(seq):
            q_len = q[i + 1] - q[i]
            if not 0 <= length <= reference.MAX_POSITION:
                raise ValueError(f"seq_lens[{i}] = {length}: expected 0 <= seq_len <= 2**24")
            buffered.append(0 < q_len <= self.queries_per_step)
            if q_len == 0:
                continue
            if not occupied[i]:
                if rows_from == "active":
                    raise ValueError(f"active[{i}]: batch row {i} is active but holds no request "
                                     f"(add(row) first, or pass active[{i}] = False)")
                raise ValueError(f"query_start_loc: request {i} has {q_len} token(s) but batch row "
                                 f"{i} holds no request (add(row) first)")
            if q_len > length:
                raise ValueError(f"seq_lens[{i}] = {length}: less than the request's {q_len} "
                                 f"tokens in this pass (seq_lens count them)")
            if limit is not None and length > limit:
                raise ValueError(f"seq_lens[{i}] = {length}: expected <= max_context = {limit} "
                                 f"(the buffers would drop the positions past it)")
        if self.host_kv is not None:    # else retrieve checks them, once the pool is known
            # a bypassing request's blocks are the engine's business: only buffered rows
            self._check_blocks(seq_lens, block_table,
                               torch.tensor(buffered, dtype=torch.bool, device=self.device),
                               lambda i: i)

    def _check_blocks(self, seq_lens: torch.Tensor, block_table: torch.Tensor,
                      buffered: torch.Tensor, batch_row: Callable[[int], int]) -> None:
        """Every host block a buffered row's ``seq_len`` needs is a block of the pool: the
        gather that follows reads them unchecked. ``batch_row(i)``: row ``i``'s batch row."""
        bs = self.block_size
        need = torch.where(buffered, (seq_lens.to(torch.int64) + bs - 1) // bs, 0)
        short = need > block_table.shape[1]
        if bool(short.any()):
            i = int(short.nonzero()[0, 0])
            raise ValueError(f"block_table: request {batch_row(i)} has seq_len {int(seq_lens[i])}, "
                             f"which needs {int(need[i])} blocks of {bs}, but block_table has "
                             f"{block_table.shape[1]} columns")
        column = torch.arange(block_table.shape[1], device=block_table.device)
        bad = (column[None, :] < need[:, None]) & ((block_table < 0)
                                                   | (block_table >= self.num_host_blocks))
        if bool(bad.any()):
            i, col = (int(x) for x in bad.nonzero()[0])
            raise ValueError(f"block_table[{batch_row(i)}, {col}] = {int(block_table[i, col])}: "
                             f"expected a host block in [0, {self.num_host_blocks}) for seq_len "
                             f"{int(seq_lens[i])}")

    def retrieve(self, layer: int, topk_indices: torch.Tensor, meta: StepMeta,
                 new_kv: Optional[Sequence[torch.Tensor]] = None,
                 check: Optional[bool] = None) -> SparseAttentionInputs:
        """One layer of a TND pass (``begin_step``): ``topk_indices`` int32 ``[num_tokens, 1, K]``
        (request-relative positions, ``-1`` = none) to state rows, ``step``, and the slots back
        per token -> sparse flash attention's inputs. ``new_kv``: this pass's KV per component
        ``[num_tokens, (1,) width]`` in the buffer dtype, for write-through."""
        self._layer(layer)
        self._check_meta(meta)
        N = meta.num_tokens
        require_tensor("topk_indices", topk_indices, torch.int32, (N, 1, self.topk), self.device)
        require_bool("check", check, optional=True)
        if (self.check if check is None else check) and not tracing():
            def where(t, k=None):
                return f"topk_indices[token={t}]" if k is None else \
                    f"topk_indices[token={t}, 0, index={k}]"
            check_selections(topk_indices[:, 0, :], meta.token_seq_lens, where, meta.planned,
                             limit_name=lambda t: "its request's seq_len")
        T = self.queries_per_step
        tokens = token_layout.TokenRows(meta.planned, meta.plan_index, meta.plan_index // T,
                                        meta.plan_index % T)
        by_state = token_layout.to_rows(topk_indices, tokens, self.max_rows, self.queries_per_step)
        out = self.step(layer, by_state, meta, new_kv, check=check, checked_topk=True)
        column = torch.arange(self.queries_per_step * self.topk, device=self.device)[None, :]
        return SparseAttentionInputs(
            slots=token_layout.to_tokens(out.plan.slots, tokens).view(N, 1, self.topk),
            block_table=self.resident_block_table[:meta.num_reqs], kv_lens=meta.kv_lens,
            kv=self.resident_kv(layer), planned=meta.planned, plan=out.plan,
            host_copied=column < out.host_counts[:, None])

    def step(self, layer: int, topk_pos: torch.Tensor, meta: StepMeta,
             new_kv: Optional[Sequence[torch.Tensor]] = None, check: Optional[bool] = None,
             checked_topk: bool = False, split: Union[bool, str] = False) -> RowSlots:
        """One layer: drop, plan and copy for ``topk_pos`` int32 ``[max_rows, q, K]`` **by state
        row** (``q`` = ``1..T``; request-relative positions, ``-1`` = none) -> ``RowSlots``: the
        slot of every selection, ``[max_rows, q, K]`` in the same order, which the layer's buffer
        ``kv[layer][c][state_row]`` holds after this call (a row that plans nothing gets ``-1``),
        and the positions copied from the host. One call into the buffer
        (``SparseKVBuffer.step``). An engine whose rows never move (the runtime) has state row =
        batch row; others map with ``state_row`` or call ``retrieve``. ``new_kv``: this pass's KV
        per component ``[num_tokens, (1,) width]``, for write-through.

        ``split=True``: the copy is queued on ``copy_stream`` (a side stream on an NPU, in order
        on CPU) so that attention over the hits need not wait for it, and ``RowSlots.split``
        says which slots are which; the caller runs ``copy_stream.wait()`` before anything
        reads a miss slot, ``host_pos`` or ``host_counts`` (docs/overlap.md). ``split="auto"``:
        split exactly where the split rule (``avsg.cache.split_rule.choose_split``, the one the
        decode model prices with) chooses it for this step's requests and query tokens, with
        the manager's ``split_policy`` (decided on the host: no device read; without an
        established overlap it never splits); ``RowSlots.split`` says which was done."""
        self._layer(layer)
        auto = isinstance(split, str) and split == "auto"
        if not auto:
            require_bool("split", split)
        elif self.split_policy is None:
            raise ValueError("split: 'auto' needs the manager's split_policy (the split rule's "
                             "profile, launch cost and overlap); pass True or False otherwise")
        R, T, K = self.max_rows, self.queries_per_step, self.topk
        self._check_meta(meta)
        require_tensor("topk_pos", topk_pos, torch.int32, ndim=3, device=self.device)
        q = topk_pos.shape[1]
        if topk_pos.shape[0] != R or topk_pos.shape[2] != K or not 1 <= q <= T:
            raise ValueError(f"topk_pos: expected [max_rows = {R}, 1..T = {T}, topk = {K}], got "
                             f"{tuple(topk_pos.shape)} (a pass of more than T queries bypasses "
                             f"the buffer: no step)")
        if not checked_topk and (meta.num_tokens != R * q
                                 or meta.query_start_loc.shape[0] != R + 1):
            raise ValueError(f"meta: expected the StepMeta of begin_step_rtk with queries = {q} "
                             f"(num_tokens = {R * q}), got num_tokens = {meta.num_tokens} (a "
                             f"TND pass's layers go through retrieve)")
        require_bool("check", check, optional=True)
        self.paged.host(layer)                   # a pool to copy from, before anything runs
        news = self._new_kv_rows(new_kv, meta.num_tokens)
        if (self.check if check is None else check) and not tracing():
            if not self._blocks_checked_for(meta):
                self._check_blocks(meta.seq_lens, meta.block_table, meta.buffered,
                                   self._state_row_host.index)
            if not checked_topk:
                def where(n, k=None):
                    r, t = divmod(n, q)
                    return f"topk_pos[{r}, {t}" + ("]" if k is None else f", {k}]")
                check_selections(topk_pos.reshape(R * q, K), meta.seq_lens.repeat_interleave(q),
                                 where, meta.buffered.repeat_interleave(q),
                                 limit_name=lambda n: "its request's seq_len")
        if auto:
            # the requests this step plans, from the host's row table (no device read)
            rows = min(meta.num_reqs, sum(self._occupied_host))
            split = self.split_policy.choose(
                rows, q, K, launches=split_added_launches(self.fuse_copy and not self.write_through))
        if q < T:
            topk_pos = torch.cat([topk_pos, topk_pos.new_full((R, T - q, K), -1)], dim=1)
        # a row with no request planned this pass plans nothing
        topk_pos = torch.where(meta.buffered[:, None, None], topk_pos,
                               torch.full_like(topk_pos, -1))
        if not tracing() and meta.generation:     # no guard on the int under tracing
            self._retrieved_in[layer] = meta.generation
        host_counts = []
        # the plan phase ends where the copy starts (timed eagerly only: a compiled graph has
        # no phases)
        plan_phase = contextlib.ExitStack() if self._timers is not None and not tracing() \
            else None

        def settle(plan: Plan, counts: torch.Tensor) -> None:
            self.h2d_rows += counts.sum()
            column = torch.arange(T * K, device=self.device)[None, :]
            host_counts.append((counts, torch.where(column < counts[:, None], plan.miss_pos,
                                                    torch.full_like(plan.miss_pos, -1))))

        def copy(plan: Plan) -> None:
            if plan_phase is not None:
                plan_phase.close()
            # with the split the copy (and what reads its counts) goes to the copy stream; every
            # tensor of the caller's stream it reads is marked in use there, the write-through's
            # new KV too (the caller may free it as soon as step returns)
            stream = self.copy_stream.copying(plan.miss_pos, plan.miss_slots, plan.miss_counts,
                                              meta.block_table, meta.stable_lens,
                                              meta.token_base, *(news or ())) if split \
                else contextlib.nullcontext()
            with self._phase("gather"), stream:
                fresh = None
                if news is not None:
                    fresh = (plan.miss_pos >= 0) & (plan.miss_pos >= meta.stable_lens[:, None])
                counts = self.paged.copy(layer, plan, meta.block_table, fresh, meta.token_base,
                                         news)
                if fresh is not None:
                    self.write_through_rows += fresh.sum()
                settle(plan, counts)

        # the package's own copy of every miss: plan and copy in one launch, one phase
        fused = serving_launches(news is not None, split, self.fuse_copy) == SERVING_LAUNCHES
        if fused:
            copy = self.paged.miss_copy(layer, meta.block_table)
        stable = meta.stable_lens if self.auto_invalidate else None
        if plan_phase is None:
            plan = self.residency.step(layer, topk_pos, meta.seq_lens, copy, stable)
        else:
            with plan_phase:
                plan_phase.enter_context(self._timers("plan_gather" if fused else "plan"))
                plan = self.residency.step(layer, topk_pos, meta.seq_lens, copy, stable)
        if fused:
            settle(plan, plan.miss_counts)
        counts, host_pos = host_counts[0]
        parts = None
        if split:
            hits, misses = split_slots(plan)
            parts = SplitSlots(hits[:, :q], misses[:, :q])
        return RowSlots(slots=plan.slots[:, :q], host_pos=host_pos, host_counts=counts,
                        plan=plan, split=parts)

    def _new_kv_rows(self, new_kv, N: int) -> Optional[List[torch.Tensor]]:
        """``new_kv`` as ``[N, width]`` per component when write-through uses it, else None."""
        if not self.write_through:
            return None
        if new_kv is None:
            raise ValueError("new_kv: write_through=True needs this pass's KV (the host write "
                             "may come after the gather, so this pass's positions cannot be read "
                             "from the host)")
        comps = self.kv_format.components
        if not isinstance(new_kv, (list, tuple)) or len(new_kv) != len(comps):
            raise ValueError(f"new_kv: expected {len(comps)} components "
                             f"({', '.join(c.name for c in comps)})")
        return [self.paged.token_rows(f"new_kv[{c}]", part, N, comp)
                for c, (part, comp) in enumerate(zip(new_kv, comps))]

    def _check_meta(self, meta) -> None:
        """Structure only (no data read): everything ``retrieve`` does after its checks, the
        invalidate and the plan included, must then run through."""
        if not isinstance(meta, StepMeta):
            raise TypeError(f"meta: expected the StepMeta of this pass's begin_step, got "
                            f"{type(meta).__name__}")
        require_int("meta.num_tokens", meta.num_tokens, low=0, high=_MAX_TOKENS)
        N, R = meta.num_tokens, self.max_rows
        for field, dtype, shape in (
                ("planned", torch.bool, (N,)), ("plan_index", torch.int64, (N,)),
                ("token_seq_lens", torch.int32, (N,)), ("seq_lens", torch.int32, (R,)),
                ("stable_lens", torch.int32, (R,)), ("token_base", torch.int64, (R,)),
                ("buffered", torch.bool, (R,))):
            require_tensor(f"meta.{field}", getattr(meta, field), dtype, shape, self.device)
        require_tensor("meta.block_table", meta.block_table, torch.int32, ndim=2,
                        device=self.device)
        if meta.block_table.shape[0] != R:
            raise ValueError(f"meta.block_table: expected {R} rows (max_rows), got "
                             f"{tuple(meta.block_table.shape)}: a StepMeta of another manager?")
        if tracing():
            # not checked under torch.compile: Dynamo would guard on the int and recompile the
            # graph at every step
            return
        require_int("meta.generation", meta.generation, low=0)
        if meta.manager != self._serial:
            raise ValueError("meta: made by another SparseOffloadManager's begin_step (its batch "
                             "rows map to that manager's state rows); call this manager's "
                             "begin_step for its own passes")
        if meta.generation and meta.generation != self._generation:
            raise ValueError("meta: superseded; begin_step or a lifecycle call (add, free, "
                             "move_row, swap_rows) ran since this StepMeta was made. The manager "
                             "serves one pass at a time (begin_step records its pass's dropped "
                             "positions, a lifecycle call moves rows): call begin_step for this "
                             "pass again")

    def _blocks_checked_for(self, meta: StepMeta) -> bool:
        """begin_step checked this very meta's blocks against the pool registered now."""
        done = self._blocks_checked
        return bool(meta.generation) and done is not None and done[0] == meta.generation and \
            done[1] is meta.block_table and done[2] is meta.seq_lens and done[3] is meta.buffered

    # ------------------------------------------------------------------------ write path
    def write_kv(self, layer: int, slot_mapping: torch.Tensor, kv: Sequence[torch.Tensor],
                 check: Optional[bool] = None) -> None:
        """Write this pass's KV to the host pool: token ``i``'s components ``kv[c][i]`` go to host
        row ``slot_mapping[i]`` (``block * block_size + offset``, the engine's slot mapping;
        ``-1`` = padding, skipped). Decode and prefill tokens alike."""
        self._layer(layer)
        host = self.paged.host(layer)
        require_bool("check", check, optional=True)
        require_tensor("slot_mapping", slot_mapping, ndim=1)
        if slot_mapping.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"slot_mapping: expected an int32 or int64 tensor, got "
                            f"{slot_mapping.dtype}")
        N = slot_mapping.shape[0]
        if not isinstance(kv, (list, tuple)) or len(kv) != len(host):
            raise ValueError(f"kv: expected {len(host)} components, got "
                             f"{len(kv) if isinstance(kv, (list, tuple)) else type(kv).__name__}")
        parts = [self.paged.token_rows(f"kv[{c}]", part, N, comp)
                 for c, (part, comp) in enumerate(zip(kv, self.kv_format.components))]
        pool_rows = self.num_host_blocks * self.block_size
        rows = slot_mapping.to(host[0].device, torch.int64)
        if (self.check if check is None else check) and not tracing():
            bad = rows >= pool_rows
            if bool(bad.any()):
                i = int(bad.nonzero()[0, 0])
                raise ValueError(f"slot_mapping[{i}] = {int(rows[i])}: beyond the host pool's "
                                 f"{pool_rows} rows")
            below = rows < -1
            if bool(below.any()):
                i = int(below.nonzero()[0, 0])
                raise ValueError(f"slot_mapping[{i}] = {int(rows[i])}: only -1 may be negative "
                                 f"(it means padding)")
        if not tracing() and self._pass is not None:     # (add ends a pass: _pass is None)
            if not self.write_through and self._retrieved_in[layer] == self._pass[0]:
                # the layer's retrieve of this pass has run: its gather read this pass's
                # positions from the host before this write, and attention would read their
                # old bytes (now and, while resident, later)
                raise ValueError(
                    f"write_kv: layer {layer} was already retrieved in this pass, and with "
                    f"write_through off its gather read this pass's positions from the host "
                    f"before this write (attention would read their old bytes): write a layer's "
                    f"KV before its retrieve, or build the manager with write_through=True")
            self._written_in[layer] = self._pass[0]
        self.paged.write(layer, rows, parts)

    # ------------------------------------------------------------------------ statistics
    def hit_rate(self) -> float:
        return self.residency.hit_rate()

    def reset_stats(self) -> None:
        self.residency.reset_stats()
        self.h2d_rows.zero_()
        self.write_through_rows.zero_()
