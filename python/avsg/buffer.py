"""The public API: ``SparseKVBuffer`` (plan / invalidate / reset / stats), ``Plan`` and ``gather``.

Everything here validates and then calls ``torch.ops.avsg.*``; the algorithm itself is specified in
``reference.py``. Errors are raised before any op runs, so a rejected call changes no state but
one: a refused ``gather`` drops what its plan reserved ("Plans not copied" below).

Two kinds of checks:
* structural (dtype, shape, device, contiguity, capacity): always, ``TypeError``/``ValueError``
  naming the argument and what was expected;
* values (positions against ``seq_lens``, duplicates within one query token's top-k, host rows
  inside the pool): when ``check=True``, the default on CPU. They read the data, which on an NPU
  means a host sync, so the NPU default is ``check=False``. Unchecked, an out-of-range position is
  treated as ``-1`` and a duplicate shares its slot; a miss whose host row lies outside the pool
  is not copied, yet its slot counts as resident (later plans hit its old bytes: an engine must
  not pass such a block table; docs/api.md, "Bad input"). Under ``torch.compile`` tracing the value checks are skipped (they would need
  the data, a graph break); the structural checks and the ops' own checks still run.

Whatever the state holds, the ops stay inside it (reference.py, "Whatever the state holds"): the
state's header ties it to the geometry it was built with, and every index read from it is
clamped. ``SparseKVBuffer.check_state`` validates the invariants on demand.

Threads and stale plans. One buffer must not be used from two threads at once (the ops release
the GIL and update the state in place). ``plan``/``invalidate``/``reset``/``resize``/
``check_state``, and ``gather``/``apply_moves`` of a plan the buffer made, take a per-buffer lock
without waiting and raise ``RuntimeError`` if another thread holds it (detected, not serialised);
distinct buffers are independent. Calls that interleave without overlapping are caught by the
buffer's *generation*, a Python int that ``plan``/``invalidate``/``reset``/``resize`` advance
(no device access: no host sync on an NPU). A ``Plan`` records its buffer (``source``) and the
generation it was made at, and ``gather``/``apply_moves`` raise ``ValueError`` naming ``plan``
for a plan that a later call of that buffer superseded; the same current plan may be gathered
any number of times, into any number of ``dst`` tensors.

Plans not copied. A plan records its misses as resident before any byte moves. Until a gather of
it succeeds (or ``mark_copied`` says the caller copied them), the buffer's next state change first
drops them, and a refused or failed gather drops them at once, so no later plan hits a slot no
copy filled (docs/api.md, "Plans not copied"; ``track_copies=False`` turns this off for buffers
that hold no KV).

Guaranteed, in eager mode, for plans made by ``SparseKVBuffer.plan``/``resize`` and used through
``gather``/``apply_moves``: a gather never applies a plan to a state that changed after the plan,
whichever thread made either call, and no position counts as resident unless a copy of it
succeeded. Not guaranteed:
* raw ``torch.ops.avsg.*`` calls: they take tensors and know nothing of plans or generations;
* a ``Plan`` built by hand, or with ``source=None`` (nothing to compare with);
* ``torch.compile``: a plan made while tracing records no source, and compiled calls neither take
  the lock nor advance the generation, so an eager plan made before a compiled call of the same
  buffer is not refused;
* the KV tensors: ``dst`` is not tied to the buffer, so gathering into another buffer's KV is not
  detected; and the device order of the launches is the stream's (one stream: call order).
"""
from __future__ import annotations

import os
import threading
import warnings
from typing import Callable, Dict, NamedTuple, Optional, Sequence, Tuple, Union

import torch

from . import _ops  # noqa: F401  (registers the ops)
from . import reference
from .validation import (check_selections, require_bool, require_device, require_fits,
                         require_int, require_real, require_tensor, tracing)

TensorList = Union[torch.Tensor, Sequence[torch.Tensor]]

DEFAULT_NUM_CORES = 40          # AIV cores of Ascend 910B3/B4; 910B1/B2 and A3 dies have 48


def _cores_from_environment():
    """``(cores, error)`` from ``AVSG_NUM_CORES``: parsed at import, but a bad value is raised
    only by the call that needs it (``get_num_cores``), not by every ``import avsg``."""
    text = os.environ.get("AVSG_NUM_CORES", "").strip()
    if not text:
        return DEFAULT_NUM_CORES, None
    if not (text.isascii() and text.isdecimal()) or int(text) < 1:
        return DEFAULT_NUM_CORES, (f"AVSG_NUM_CORES={text!r}: expected a whole number of cores "
                                   f">= 1 (unset it for the default, {DEFAULT_NUM_CORES})")
    return int(text), None


_num_cores, _num_cores_error = _cores_from_environment()


def set_num_cores(cores: int) -> None:
    """Default number of cores ``gather`` splits its work over (else ``AVSG_NUM_CORES``, else
    40)."""
    global _num_cores, _num_cores_error
    require_int("cores", cores, low=1)
    _num_cores, _num_cores_error = cores, None


def get_num_cores() -> int:
    """The default core count; a bad ``AVSG_NUM_CORES`` raises ``ValueError`` naming it here."""
    if _num_cores_error is not None:
        raise ValueError(_num_cores_error)
    return _num_cores


GRANULE_BYTES = 32   # the DMA granule no two cores may share in one launch (see kv_slots)


def kv_slots(n: int, row_shape: Sequence[int], dtype: torch.dtype,
             device: Optional[torch.device] = None) -> torch.Tensor:
    """Zeroed ``[n, *row_shape]`` slots for a device KV buffer, each slot starting on a 32 B
    boundary: a view of ``[n, pitch]`` storage whose pitch is one slot's bytes rounded up to 32 B
    (656 B FP8 rows: 672 B; 1024 B / 128 B BF16 rows are not padded). View the result as
    ``[R, S, *row_shape]`` for ``gather``'s ``dst``.

    Why: ``gather`` splits a row's misses over several cores, and a slot whose bytes are not a
    multiple of 32 shares a 32 B granule with its neighbour. Whether two cores' byte-masked DMA
    writes to one granule are safe is undocumented (one may be a read-modify-write of the whole
    granule, losing the other's bytes), so ``gather`` refuses a multi-core launch into such a layout.
    """
    require_int("n", n, low=0)
    elems = 1
    for d in row_shape:
        elems *= int(d)
    itemsize = torch.empty((), dtype=dtype).element_size()     # 1, 2, 4 or 8: divides 32
    pitch = -(-elems * itemsize // GRANULE_BYTES) * GRANULE_BYTES // itemsize
    storage = torch.zeros(n, pitch, dtype=dtype, device=device)
    return storage[:, :elems].view(n, *row_shape)


class Plan(NamedTuple):
    """Output of ``SparseKVBuffer.plan``; every field is a fixed-shape int32 tensor.

    slots        [R, T, K]  slot each selection is read from, -1 where the selection was -1
    miss_pos     [R, T*K]   positions to fetch, ascending, then -1
    miss_slots   [R, T*K]   slot each one goes to, then -1
    miss_counts  [R]        number of valid entries in miss_pos

    The op library writes each row of ``slots``, ``miss_pos`` and ``miss_slots`` at a pitch of T*K
    rounded up to 8 int32, and ``miss_counts`` at a pitch of 8, so that no 32 B granule holds two
    rows (two rows may be planned by two cores): the tensors are views of that storage.
    ``miss_counts`` is therefore never contiguous (stride 8) and the other three are contiguous
    exactly when T*K is a multiple of 8; call ``.contiguous()`` before passing them to a consumer
    that needs it. ``gather`` takes them as they are.
    capacity     int        slots per row of the buffer that made the plan
    source       the SparseKVBuffer that made it (None: built by hand or under tracing, unguarded)
    generation   the source's generation when it was made: ``gather`` refuses the plan once a
                 later ``plan``/``invalidate``/``reset``/``resize`` of the source has run
    moves        True for what ``resize`` returns (source and destination are slots):
                 ``apply_moves`` takes only these, ``gather`` only the others
    """

    slots: torch.Tensor
    miss_pos: torch.Tensor
    miss_slots: torch.Tensor
    miss_counts: torch.Tensor
    capacity: int
    source: Optional["SparseKVBuffer"] = None
    generation: int = 0
    moves: bool = False


def split_slots(plan: Plan) -> reference.SplitSlots:
    """Per query token, the slots of its hits and of its misses: ``SplitSlots(hits, misses)``,
    each int32 ``[R, T, K]``, valid entries first (in selection order), then ``-1``. Hits were
    resident before the plan's copy, so attention may read them while the misses are copied;
    misses are the slots the copy fills (the ``T`` tokens of a row share them). Fixed shape, no
    host sync; ``reference.split_slots`` specifies it. One launch of its own kernel
    (``torch.ops.avsg.split_slots``, op_kernel/split_slots_kernel.h) derives it from the plan's
    outputs, on the CPU emulation and the NPU alike; the plan kernel itself does not emit it. Like
    a plan's outputs, both lists are views of rows padded to 32 B."""
    if plan.moves:
        raise ValueError("plan: a resize's moves have no hits or misses (split_slots takes what "
                         "plan or step returned)")
    hits, misses = torch.ops.avsg.split_slots(plan.slots, plan.miss_slots, plan.miss_counts,
                                              plan.capacity)
    return reference.SplitSlots(hits, misses)


def copy_cores_beside_plan(cores: int, rows: int) -> int:
    """The cores ``plan_gather`` copies on by default: the ``cores - rows`` its plan leaves free
    when the rows take at most half of them, else all. There, each row's owner block finishes its
    row (insert, stash, slots, state) after publishing its misses while the copy already runs on
    the other blocks (op_kernel/plan_gather.cpp); a copy share on an owner would start only
    after that."""
    return cores - rows if 2 * rows <= cores else cores


#: selections per lookup chunk of the hash plan (op_host/plan_tiling.h kPlanChunk), probe
#: buckets per position (kPlanProbes) and the words of a lookup part's counts (kPlanPartHead):
#: what lookup_split reads
PLAN_CHUNK, PLAN_PROBES, PLAN_PART_HEAD = 512, 4, 4


def lookup_split(cores: int, rows: int, selections: int, capacity: int) -> int:
    """The cores each row takes in a hash ``plan`` or ``plan_gather`` launched with
    ``AVSG_NPU_SPLIT=1`` (op_host/state_host.cpp ApplySplit), its lookup spread over them:
    ``min(cores // rows, chunks)`` for ``selections = T * K`` in chunks of PLAN_CHUNK, and
    ``chunks + 1`` where a core is left beside one per chunk (the row's owner then looks up none
    and gets the rest of its row ready meanwhile); 1 (no split) where that minimum is below 2 or
    a part's counts and hit bitmap outgrow the owner's fold vector. Without the switch (every
    build's default) and for ``plan_dual_pointer`` it is 1. The decode model prices avsg's plan
    at this split (:mod:`avsg.lab.costmodel.projection`)."""
    per_row, chunks = cores // max(rows, 1), -(-selections // PLAN_CHUNK)
    round8 = lambda n: -(-n // 8) * 8  # noqa: E731
    part_words = round8(PLAN_PART_HEAD + chunks) + round8(-(-capacity // 64) * 64 // 32)
    if min(per_row, chunks) < 2 or part_words > PLAN_PROBES * PLAN_CHUNK:
        return 1
    return chunks + 1 if per_row > chunks else per_row


class MissCopy(NamedTuple):
    """The package's own copy of a plan's misses, as ``copy_misses(plan, src, dst, block_table,
    block_size, num_cores)`` makes it (balanced over cores), described instead of called: given
    to ``SparseKVBuffer.step`` as ``copy``, the plan and this copy run as ONE launch
    (``torch.ops.avsg.plan_gather``: the plan's work, a synchronisation of all cores, the
    gather's copy), with the results of the plan and then ``copy_misses``
    (``reference.plan_gather``). A caller that copies with its own descriptors passes a callable
    instead (two launches: the plan, then its copy)."""

    src: TensorList
    dst: TensorList
    block_table: Optional[torch.Tensor] = None
    block_size: Optional[int] = None
    num_cores: Optional[int] = None   # None: the cores the plan leaves (copy_cores_beside_plan)


# ---------------------------------------------------------------------------------- validation

def _check_positions(topk_pos: torch.Tensor, seq_lens: torch.Tensor) -> None:
    bad_len = (seq_lens < 0) | (seq_lens > reference.MAX_POSITION)
    if bool(bad_len.any()):
        r = int(bad_len.nonzero()[0, 0])
        raise ValueError(f"seq_lens[{r}] = {int(seq_lens[r])}: expected "
                         f"0 <= seq_len <= 2**24")
    R, T, K = topk_pos.shape

    def where(n, k=None):
        r, t = divmod(n, T)
        return f"topk_pos[row={r}, query={t}" + ("]" if k is None else f", index={k}]")

    check_selections(topk_pos.reshape(R * T, K), seq_lens.repeat_interleave(T), where,
                     limit_name=lambda n: f"seq_lens[{n // T}]",
                     repeat_hint="; a query token's top-k must be distinct (pass check=False "
                                 "to let repeats share one slot)")


# ------------------------------------------------------------------------------------ the buffer

class SparseKVBuffer:
    """A per-request device buffer of ``capacity`` KV slots for one layer (or indexer group).

    Each ``plan`` matches a step's top-k positions against what the buffer holds and reserves a
    slot for every miss; ``gather`` then copies only the misses. See ``reference.py`` for the
    algorithm and the state layout, and docs/api.md for the API and its contract.

    Args:
        rows: requests in the batch (``R``).
        capacity: slots per row (``S``); must be at least ``topk * queries_per_step``.
        topk: selections per query token (``K``).
        queries_per_step: query tokens per request per step (``T`` = 1 + MTP drafts).
        lifetime: steps an entry survives without a hit before it is reclaimable (1..255); an
            entry fetched on a miss gets 4 steps less (half of it, rounded up, below 8) until its
            first hit. The
            ``lifetime`` policy's parameter (kept in the header under any policy).
        policy: which resident entries a miss evicts. ``"lifetime"`` (default): the AVSG
            paper's (entries not hit for ``lifetime`` steps tie at 0), its ties taken in turns
            from a rotating hand, fetched entries on probation (4 steps short of a hit's life); at the
            default ``lifetime=255`` it hits more often than exact LRU (at 4K, 8K and 16K on the
            shared traces) and plans the cheapest, with the lowest modelled step cost (plan + copies) of the three on both
            shared traces. ``"reuse"``: the lowest
            predicted reuse, from how often a position was selected (its count survives
            eviction), how long ago it was last used, and how densely this step selected its
            64-position neighbourhood: the most hits (above exact LRU at every capacity measured),
            at 2.4-4.2x the lifetime plan's counted cost (T 4 to 1). ``"lru"``: exact least recently used
            at step granularity (ages saturate at 1023 steps; ties by slot), the reference point.
            ``reference.py`` specifies all three; ``docs/hit_rate.md`` compares them.
        max_context: optional, any policy: the longest context (positions ``< max_context``) of
            any request. Only a check, never storage: ``plan`` rejects ``seq_lens`` above it
            (when checking) and treats selections at or beyond it as ``-1``.
        device: where the state lives (and where the plan runs).
        hash_buckets: hash buckets per row, a power of two in [max(64, capacity), 2**15];
            default ``next_pow2(2 * capacity)``.
        check: default of ``plan``'s value checks; ``None`` means on for CPU, off elsewhere.
        track_copies: keep no position resident whose bytes were never copied (default). A
            ``plan``'s misses are reserved before any byte moves; until ``gather`` (or
            ``mark_copied``, for a caller that copies them by its own means) succeeds for that
            plan, the buffer's next ``plan``/``invalidate``/``reset``/``resize`` first drops them,
            and a refused ``gather`` drops them at once ("Plans not copied" in docs/api.md).
            ``False`` for a buffer that holds no KV (trace replays, plan benchmarks): a plan's
            misses are resident from the plan on, copied or not.
    """

    def __init__(self, rows: int, capacity: int, topk: int, queries_per_step: int = 1,
                 lifetime: int = reference.DEFAULT_LIFETIME, device: Union[str, torch.device] = "cpu",
                 hash_buckets: Optional[int] = None, check: Optional[bool] = None,
                 policy: str = reference.DEFAULT_POLICY, max_context: Optional[int] = None,
                 track_copies: bool = True):
        require_int("rows", rows, low=1)
        require_int("topk", topk, low=1)
        require_int("queries_per_step", queries_per_step, low=1)
        require_int("capacity", capacity, low=1, high=reference.MAX_BUCKETS)
        if capacity < topk * queries_per_step:
            raise ValueError(
                f"capacity: expected >= topk * queries_per_step = {topk} * {queries_per_step} = "
                f"{topk * queries_per_step} so every step's selections fit, got {capacity}")
        require_int("lifetime", lifetime, low=1, high=reference.MAX_LIFETIME)
        if hash_buckets is None:
            hash_buckets = reference.default_buckets(capacity)
        require_int("hash_buckets", hash_buckets, low=max(reference.VECTOR_INT32, capacity),
                     high=reference.MAX_BUCKETS)
        if hash_buckets & (hash_buckets - 1):
            raise ValueError(f"hash_buckets: expected a power of two, got {hash_buckets}")
        if not isinstance(policy, str) or policy not in reference.POLICY_IDS:
            raise ValueError(f"policy: expected one of {tuple(reference.POLICY_IDS)}, got {policy!r}")
        if max_context is not None:
            require_int("max_context", max_context, low=1, high=reference.MAX_POSITION)
        self.policy = policy
        self.max_context = max_context
        self._policy_id = reference.POLICY_IDS[policy]
        # the ops' max_context word: the bound recorded in the header (0: none), never a size
        self._state_context = max_context or 0
        self.rows, self.capacity, self.topk = rows, capacity, topk
        self.queries_per_step, self.lifetime = queries_per_step, lifetime
        self.hash_buckets = hash_buckets
        require_bool("check", check, optional=True)
        require_bool("track_copies", track_copies)
        self.track_copies = track_copies
        self.device = require_device("device", device)
        self.check = (self.device.type == "cpu") if check is None else check
        self.layout = reference.Layout(capacity, hash_buckets, self._state_context,
                                       policy == "reuse")
        row_bytes = 4 * self.layout.width + 8 * len(reference.STAT_NAMES)
        require_fits("rows", rows * row_bytes, self.device,
                      f"rows = {rows} x {row_bytes} B of state per row")
        self._busy = threading.Lock()
        self._generation = 0       # bumped by every op that changes residency (Plan.generation)
        # the latest plan (or resize) whose reserved entries no copy has filled yet:
        # (generation, slots [R, N], positions [R, N], the plan's miss lists); see _drop_uncopied
        self._uncopied: Optional[Tuple[int, torch.Tensor, torch.Tensor, Tuple]] = None
        self._dropped_in_a_row = 0       # plans dropped uncopied with no gather tried between
        self.state = torch.empty(rows, self.layout.width, dtype=torch.int32, device=self.device)
        self.stats_counts = torch.zeros(rows, len(reference.STAT_NAMES), dtype=torch.int64,
                                        device=self.device)
        self.reset()

    def __repr__(self) -> str:
        return (f"SparseKVBuffer(rows={self.rows}, capacity={self.capacity}, topk={self.topk}, "
                f"queries_per_step={self.queries_per_step}, lifetime={self.lifetime}, "
                f"policy='{self.policy}', max_context={self.max_context}, "
                f"hash_buckets={self.hash_buckets}, device='{self.device}')")

    # -------------------------------------------------------------------------------- ops
    def plan(self, topk_pos: torch.Tensor, seq_lens: torch.Tensor, check: Optional[bool] = None,
             matcher: str = "hash", valid_lens: Optional[torch.Tensor] = None) -> Plan:
        """Match ``topk_pos`` int32 ``[R, T, K]`` (-1 = none) against the buffer; ``seq_lens``
        int32 ``[R]`` (at most ``max_context``, when given, if checked). ``matcher="dual_pointer"`` runs the sort + merge baseline instead of the
        hash index (same results). ``valid_lens`` int32 ``[R]`` (optional): first drop every
        entry whose position is ``>= valid_lens[row]``, as ``invalidate(valid_lens)`` would, in
        the same launch (equal to ``invalidate`` then ``plan``)."""
        shape = (self.rows, self.queries_per_step, self.topk)
        require_tensor("topk_pos", topk_pos, torch.int32, shape, self.device)
        require_tensor("seq_lens", seq_lens, torch.int32, (self.rows,), self.device)
        if valid_lens is not None:
            require_tensor("valid_lens", valid_lens, torch.int32, (self.rows,), self.device)
        require_bool("check", check, optional=True)
        if matcher not in ("hash", "dual_pointer"):
            raise ValueError(f"matcher: expected 'hash' or 'dual_pointer', got {matcher!r}")
        op = torch.ops.avsg.plan if matcher == "hash" else torch.ops.avsg.plan_dual_pointer
        held = self._hold("plan")
        try:
            if (self.check if check is None else check) and not tracing():
                _check_positions(topk_pos, seq_lens)
                if self._state_context and bool((seq_lens > self._state_context).any()):
                    r = int((seq_lens > self._state_context).nonzero()[0, 0])
                    raise ValueError(f"seq_lens[{r}] = {int(seq_lens[r])}: expected <= "
                                     f"max_context = {self._state_context}")
            (slots, miss_pos, miss_slots, miss_counts), source, generation = self._apply(
                op, topk_pos, seq_lens, self.state, self.stats_counts, self.capacity,
                self.hash_buckets, self.lifetime, self._policy_id, self._state_context, valid_lens)
            self._expect_copies(generation, miss_slots, miss_pos,
                                (miss_pos, miss_slots, miss_counts))
        finally:
            self._release(held)
        return Plan(slots, miss_pos, miss_slots, miss_counts, self.capacity, source, generation)

    def step(self, topk_pos: torch.Tensor, seq_lens: torch.Tensor,
             copy: Callable[[Plan], object], drop_from: Optional[torch.Tensor] = None) -> Plan:
        """One decode layer's whole buffer work, under one hold and one generation: drop every
        entry whose position is ``>= drop_from[row]`` (int32 ``[R]``; rejected drafts and
        rewritten positions; ``None``: nothing), plan ``topk_pos`` against what is left (drop
        and plan are one launch: the plan's ``valid_lens``), and copy the plan's misses into
        their slots. ``copy`` is either a ``MissCopy`` (the package's own gather: plan and copy
        are then one launch too, ``plan_gather``, and the buffer's whole step is one launch) or a
        callable ``copy(plan)``: the caller's own copy (``copy_misses``, or its own kernel,
        launched after the plan). Only when the copy succeeds are the misses resident; if it
        raises, the plan's reservations are dropped before the error leaves (a later plan
        fetches them again); a ``MissCopy`` refused by a check changes nothing. No value checks
        (the serving path's callers check before, or not at all on an NPU; a miss whose host
        row lies outside the pool is not copied); the shapes are checked.

        Returns the plan (already copied: ``gather`` of it is refused as superseded only if
        the buffer ran another call since)."""
        shape = (self.rows, self.queries_per_step, self.topk)
        require_tensor("topk_pos", topk_pos, torch.int32, shape, self.device)
        require_tensor("seq_lens", seq_lens, torch.int32, (self.rows,), self.device)
        if drop_from is not None:
            require_tensor("drop_from", drop_from, torch.int32, (self.rows,), self.device)
        if isinstance(copy, MissCopy):
            return self._step_fused(topk_pos, seq_lens, copy, drop_from)
        if not callable(copy):
            raise TypeError(f"copy: expected an avsg.MissCopy or a callable plan -> None, got "
                            f"{type(copy).__name__}")
        held = self._hold("step")
        try:
            (slots, miss_pos, miss_slots, miss_counts), source, generation = self._apply(
                torch.ops.avsg.plan, topk_pos, seq_lens, self.state, self.stats_counts,
                self.capacity, self.hash_buckets, self.lifetime, self._policy_id,
                self._state_context, drop_from)
            self._expect_copies(generation, miss_slots, miss_pos,
                                (miss_pos, miss_slots, miss_counts))
            plan = Plan(slots, miss_pos, miss_slots, miss_counts, self.capacity, source,
                        generation)
            try:
                copy(plan)
            except BaseException as error:
                if not tracing():
                    error.add_note(f"SparseKVBuffer.step: {self._drop_refused(plan)}")
                raise
            self._dropped_in_a_row = 0
            if not tracing():
                self._uncopied = None
        finally:
            self._release(held)
        return plan

    def _step_fused(self, topk_pos: torch.Tensor, seq_lens: torch.Tensor, copy: MissCopy,
                    drop_from: Optional[torch.Tensor]) -> Plan:
        """``step`` with the package's own copy: one ``plan_gather`` launch. Every check runs
        before it (here and in the op), so a refused call changes nothing; a launch that fails
        after it started resets every row (``_apply``)."""
        srcs, dsts, cores, paged = _check_copy_args(
            self.device, self.rows, self.capacity, copy.src, copy.dst, copy.block_table,
            copy.block_size, "miss", copy.num_cores, ("copy", "copy.src", "copy.dst"))
        if copy.num_cores is None:
            cores = copy_cores_beside_plan(cores, self.rows)
        held = self._hold("step")
        try:
            (slots, miss_pos, miss_slots, miss_counts, _), source, generation = self._apply(
                torch.ops.avsg.plan_gather, topk_pos, seq_lens, self.state, self.stats_counts,
                self.capacity, self.hash_buckets, self.lifetime, self._policy_id,
                self._state_context, drop_from, srcs, dsts, copy.block_table,
                copy.block_size if paged else 0, "miss", cores)
            self._dropped_in_a_row = 0      # copied in the same launch: nothing is left uncopied
        finally:
            self._release(held)
        return Plan(slots, miss_pos, miss_slots, miss_counts, self.capacity, source, generation)

    def _hold(self, what: str) -> bool:
        """Take the buffer for one op. Another thread inside an op of this buffer is a bug in
        the caller (the result would depend on the interleaving), so this raises instead of
        waiting. Compiled graphs are not guarded (a lock cannot be traced): returns False."""
        if tracing():
            return False
        if not self._busy.acquire(blocking=False):
            raise RuntimeError(f"SparseKVBuffer.{what}: the buffer is in use by another thread; "
                               f"one buffer must be driven by one thread at a time")
        return True

    def _release(self, held: bool) -> None:
        if held:
            self._busy.release()

    def _apply(self, op, *args):
        """Run an op that changes the state (with the lock held) and supersede every earlier
        plan. An op refusing the call with a check (``ValueError``/``TypeError``, raised before
        it writes) supersedes nothing and changes nothing, but for the one repair every call
        starts with: the entries of a plan no copy filled are dropped first. Returns the op's
        outputs and what a plan made now records, ``source`` and ``generation``."""
        self._drop_uncopied()
        try:
            out = op(*args)
        except (ValueError, TypeError):
            raise
        except BaseException:
            # It may have written part of the state, reservations included, that no copy will
            # fill: forget every row (torch, not the op that just failed) rather than keep them.
            self._uncopied = None
            if not tracing():
                reference.reset(self.state, self.layout,
                                torch.ones(self.rows, dtype=torch.bool, device=self.device),
                                self.lifetime, self.policy)
            self._advance()
            raise
        return (out, *self._advance())

    # ------------------------------------------------------------------ plans not copied
    # A plan reserves a slot for each miss and records the position there before any byte moves.
    # Until a copy fills those slots, a later plan would count the positions as hits and
    # attention would read whatever the slots held. So the buffer remembers the latest plan no
    # copy has filled and drops its entries (by slot, on the device, no host sync) before its
    # next state change, or at once when a gather of it is refused.

    def _expect_copies(self, generation: int, slots: torch.Tensor, positions: torch.Tensor,
                       lists: Tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> None:
        """The op that made ``generation`` reserved ``slots`` [R, N] for ``positions`` and no
        byte of them is copied yet; ``lists``: the plan's own ``miss_pos``, ``miss_slots`` and
        ``miss_counts``, the only lists whose copy counts as this plan's."""
        if self.track_copies and generation:       # 0: made under tracing, not tracked
            self._uncopied = (generation, slots, positions, lists)

    def _drop_uncopied(self) -> None:
        if tracing() or self._uncopied is None:    # no guard on the record under tracing
            return
        _, slots, positions, _ = self._uncopied
        reference.drop_entries(self.state, self.layout, slots, positions)
        self._uncopied = None                      # only once the drop has run
        self._dropped_in_a_row += 1
        if self._dropped_in_a_row == 3:
            warnings.warn("SparseKVBuffer: 3 plans in a row were never copied (no gather or "
                          "mark_copied of them), so the buffer dropped their misses and hits "
                          "nothing: a caller that copies with raw torch.ops.avsg.gather or "
                          "under torch.compile calls buf.mark_copied(plan); one without KV "
                          "builds the buffer with track_copies=False", stacklevel=4)

    def _copied(self, plan: Plan) -> None:
        """A copy of ``plan``'s misses succeeded: its entries stay resident. Only a copy of the
        plan's own miss lists counts (a plan with replaced lists copied part of them, as the
        serving manager's write-through gather does: its caller says ``mark_copied``)."""
        self._dropped_in_a_row = 0
        record = self._uncopied
        if record is not None and record[0] == plan.generation and \
                all(a is b for a, b in zip(record[3], (plan.miss_pos, plan.miss_slots,
                                                       plan.miss_counts))):
            self._uncopied = None

    def _drop_refused(self, plan: Plan) -> str:
        """A copy of ``plan`` was refused or failed: whatever it reserved leaves the buffer (a
        later plan fetches it again). Its own record when it is the plan not yet copied, else
        its fields (a plan copied once into other tensors, or superseded); dropping an entry
        that was copied only costs a fetch. Returns what the error message adds."""
        self._dropped_in_a_row = 0
        if self._uncopied is not None and self._uncopied[0] == plan.generation:
            self._drop_uncopied()
            self._dropped_in_a_row = 0
        else:
            slots, positions = plan.miss_slots, None if plan.moves else plan.miss_pos
            shaped = all(isinstance(t, torch.Tensor) and t.dtype == torch.int32 and t.dim() == 2
                         and t.shape == slots.shape and t.shape[0] == self.rows
                         and t.device == self.device
                         for t in ((slots,) if positions is None else (slots, positions)))
            if not shaped:
                return "nothing was dropped (the plan's miss lists are not this buffer's shape)"
            reference.drop_entries(self.state, self.layout, slots, positions)
        what = "moved entries" if plan.moves else "misses"
        return (f"the buffer dropped this plan's {what} (none of them counts as resident any "
                f"more; a later plan fetches them again)")

    def mark_copied(self, plan: Plan) -> None:
        """Say that ``plan``'s misses were copied into their slots by the caller's own means
        (its own copy kernel, say), not by ``gather``: without it the buffer's next call drops
        them. Refuses (``ValueError`` naming ``plan``) a plan this buffer did not make or that a
        later call superseded."""
        if not isinstance(plan, Plan):
            raise TypeError(f"plan: expected avsg.Plan, got {type(plan).__name__}")
        if tracing():
            return
        held = self._hold("mark_copied")
        try:
            if plan.source is not self:
                raise ValueError("plan: made by another buffer (or by hand); mark_copied takes "
                                 "a plan of this buffer")
            if plan.generation != self._generation:
                raise ValueError(f"plan: superseded; the buffer ran "
                                 f"{self._generation - plan.generation} call(s) since it made "
                                 f"this plan and dropped its misses if nothing had copied them")
            self._dropped_in_a_row = 0
            self._uncopied = None
        finally:
            self._release(held)

    def discard(self, plan: Plan) -> None:
        """Say that a copy of ``plan``'s misses by the caller's own means failed, or was not
        made for every tensor it should fill: the buffer drops what the plan reserved (whether
        or not ``mark_copied`` said otherwise), so a later plan fetches those positions again.
        Takes a plan of this buffer, current or superseded (``ValueError`` naming ``plan``
        otherwise)."""
        if not isinstance(plan, Plan):
            raise TypeError(f"plan: expected avsg.Plan, got {type(plan).__name__}")
        if tracing():
            return
        held = self._hold("discard")
        try:
            if plan.source is not self:
                raise ValueError("plan: made by another buffer (or by hand); discard takes a plan "
                                 "of this buffer")
            self._drop_refused(plan)
        finally:
            self._release(held)

    def _advance(self):
        """Under tracing ``(None, 0)``: a compiled graph neither counts nor is guarded (reading
        a Python counter would be a guard, hence a recompile per step)."""
        if tracing():
            return None, 0
        self._generation += 1
        return self, self._generation

    def invalidate(self, valid_lens: torch.Tensor) -> None:
        """Drop every entry whose position is ``>= valid_lens[row]`` (int32 ``[R]``), e.g. the
        speculative positions of rejected MTP drafts."""
        require_tensor("valid_lens", valid_lens, torch.int32, (self.rows,), self.device)
        held = self._hold("invalidate")
        try:
            self._apply(torch.ops.avsg.invalidate, self.state, valid_lens, self.capacity,
                        self.hash_buckets, self._state_context)
        finally:
            self._release(held)

    def reset(self, rows=None) -> None:
        """Forget everything the given rows hold: ``None`` (all rows), a row index, a list of
        indices, an int tensor of indices, or a bool mask ``[R]``. Statistics are kept. A reset
        row's active capacity returns to ``capacity`` (reset reads nothing from the row, so it
        also repairs it): resize it again after a reset to keep it smaller."""
        mask = self._row_mask(rows)
        held = self._hold("reset")
        try:
            self._apply(torch.ops.avsg.reset, self.state, mask, self.capacity, self.hash_buckets,
                        self.lifetime, self._policy_id, self._state_context)
        finally:
            self._release(held)

    def resize(self, rows: torch.Tensor, capacities: torch.Tensor) -> Plan:
        """Set the active capacity of row ``rows[i]`` to ``capacities[i]`` (both ``[n]``, int32
        or int64, on the buffer's device; each capacity in ``[topk * queries_per_step,
        capacity]``). A row
        only ever occupies slots ``[0, active)``, so the slots past it can serve other requests.
        Call it between steps (after a step's gather, before the next plan): nothing is pinned
        then.

        Growing only raises the limit. Shrinking evicts by the policy's own order until the row
        holds at most the new capacity, then moves every survivor held past it into a free slot
        below it (reference.py, ``resize``). Returns the moves as a ``Plan`` whose ``miss_pos``
        are source slots and ``miss_slots`` destination slots (``[R, max(1, capacity // 2)]``,
        ``miss_counts`` moves per row, ``slots`` the destinations again as ``[R, 1, W]``): pass it
        to ``apply_moves`` with the buffer's KV tensors before anything reads them. Bad input
        raises ``TypeError``/``ValueError`` naming the argument, with the state untouched; the
        value checks (rows in range and distinct, capacities in range) always run outside
        ``torch.compile`` tracing, a host sync on an NPU (resize is not on the per-step path)."""
        require_tensor("rows", rows, ndim=1, device=self.device)
        require_tensor("capacities", capacities, shape=(rows.shape[0],), device=self.device)
        for name, t in (("rows", rows), ("capacities", capacities)):
            if t.dtype not in (torch.int32, torch.int64):
                raise TypeError(f"{name}: expected dtype torch.int32 or torch.int64, got {t.dtype}")
        if not tracing():
            self._check_resize(rows, capacities)
        held = self._hold("resize")
        try:
            (src, dst, counts), source, generation = self._apply(
                torch.ops.avsg.resize, self.state, rows.to(torch.int64),
                capacities.to(torch.int64), self.capacity, self.hash_buckets, self.lifetime,
                self._policy_id, self._state_context, self.topk * self.queries_per_step)
            # the moved positions, read where the moves put them: what is dropped if the moves
            # are never applied
            moved = torch.where(dst >= 0, reference.view_state(self.state, self.layout).slot_pos
                                .gather(1, dst.clamp(min=0).long()), torch.full_like(dst, -1))
            self._expect_copies(generation, dst, moved, (src, dst, counts))
        finally:
            self._release(held)
        return Plan(dst.view(self.rows, 1, -1), src, dst, counts, self.capacity, source,
                    generation, moves=True)

    def _check_resize(self, rows: torch.Tensor, capacities: torch.Tensor) -> None:
        low, high = self.topk * self.queries_per_step, self.capacity
        outside = (rows < 0) | (rows >= self.rows)
        if bool(outside.any()):
            i = int(outside.nonzero()[0, 0])
            raise ValueError(f"rows[{i}] = {int(rows[i])}: expected a row in [0, {self.rows})")
        if rows.unique().numel() != rows.numel():
            raise ValueError(f"rows: a row is listed twice ({rows.tolist()}); each row takes one "
                             f"capacity")
        bad = (capacities < low) | (capacities > high)
        if bool(bad.any()):
            i = int(bad.nonzero()[0, 0])
            raise ValueError(f"capacities[{i}] = {int(capacities[i])}: expected a capacity in "
                             f"[{low}, {high}] (topk * queries_per_step .. capacity)")

    def active_capacity(self) -> torch.Tensor:
        """Active capacity of every row (int64 ``[R]``, on the buffer's device)."""
        return self.state[:, reference.HEADER_ACTIVE].to(torch.int64)

    def check_state(self) -> None:
        """Validate the invariants of the state (header against this buffer's geometry and
        lifetime, value ranges, free slots, no position held twice, the index finding every
        resident position, the stash); raise ``ValueError`` naming row, section and entry.
        Cheap (a few vectorised passes; it syncs on an NPU). A failing row can be repaired with
        ``reset(row)``."""
        held = self._hold("check_state")
        try:
            reference.check_state(self.state.cpu(), self.layout, self.lifetime, self.policy,
                                  min_active=self.topk * self.queries_per_step)
        finally:
            self._release(held)

    def _row_mask(self, rows) -> torch.Tensor:
        if rows is None:
            return torch.ones(self.rows, dtype=torch.bool, device=self.device)
        if isinstance(rows, torch.Tensor) and rows.dtype == torch.bool:
            require_tensor("rows", rows, torch.bool, (self.rows,), self.device)
            return rows
        if isinstance(rows, bool) or not isinstance(rows, (int, list, tuple, range, torch.Tensor)):
            raise TypeError("rows: expected None, a row index, a list of indices, an int tensor of "
                            f"indices or a bool mask [R], got {type(rows).__name__}")
        if isinstance(rows, int):
            rows = [rows]
        if isinstance(rows, torch.Tensor):
            require_real("rows", rows)
            if rows.dtype not in (torch.int32, torch.int64) or rows.dim() != 1:
                raise TypeError("rows: expected a bool mask [R] or a 1-D int tensor of indices, "
                                f"got dtype {rows.dtype} shape {tuple(rows.shape)}")
            rows = rows.tolist()
        indices = list(rows)
        for i in indices:
            require_int("rows[...]", i, low=0, high=self.rows - 1)
        mask = torch.zeros(self.rows, dtype=torch.bool)
        mask[indices] = True
        return mask.to(self.device)

    # -------------------------------------------------------------------------- statistics
    def stats(self) -> Dict[str, object]:
        """Cumulative counts since creation (or ``reset_stats``): per row and in total.

        lookups: valid selections looked up; hits: selections resident before the step;
        misses: selections that were not (``lookups = hits + misses``); fetched: unique
        positions copied. ``hit_rate = hits / lookups``.
        """
        counts = self.stats_counts.cpu()
        out: Dict[str, object] = {"per_row": {name: counts[:, i].clone()
                                              for i, name in enumerate(reference.STAT_NAMES)}}
        for i, name in enumerate(reference.STAT_NAMES):
            out[name] = int(counts[:, i].sum())
        out["hit_rate"] = out["hits"] / out["lookups"] if out["lookups"] else 0.0
        return out

    def reset_stats(self) -> None:
        self.stats_counts.zero_()

    def resident(self, row: int) -> Dict[int, int]:
        """``{pos: slot}`` for what ``row`` holds now (for inspection and tests; syncs)."""
        require_int("row", row, low=0, high=self.rows - 1)
        slot_pos = reference.view_state(self.state, self.layout).slot_pos[row].cpu()
        return {int(p): s for s, p in enumerate(slot_pos.tolist()) if p >= 0}


# ----------------------------------------------------------------------------------- gather

def _as_list(name: str, tensors: TensorList):
    if isinstance(tensors, torch.Tensor):
        return [tensors]
    if not isinstance(tensors, (list, tuple)) or not tensors:
        raise TypeError(f"{name}: expected a tensor or a non-empty list of tensors")
    return list(tensors)


def gather(plan: Plan, src: TensorList, dst: TensorList,
           block_table: Optional[torch.Tensor] = None, block_size: Optional[int] = None,
           partition: str = "miss", num_cores: Optional[int] = None,
           check: Optional[bool] = None) -> torch.Tensor:
    """Copy the plan's misses from the host pool(s) ``src`` into the buffer(s) ``dst``.

    ``src[i]`` is a contiguous pool ``[R, max_len, ...]`` or, with ``block_table`` int32
    ``[R, max_blocks]``, a paged pool ``[num_blocks, block_size, ...]``; ``dst[i]`` is
    ``[R, capacity, ...]`` with the same trailing shape and dtype. Several pairs (a latent and a
    RoPE cache, say) share one plan. ``partition`` is ``"miss"`` (default, balanced chunks),
    ``"request"`` (S1), ``"selection"`` (the paper's S2: the selections split evenly over cores,
    hits no-ops; the plan is first rewritten into the selection layout by torch,
    ``reference.selection_layout``) or ``"topk"`` (an older baseline that splits the compacted
    miss list and so behaves like S1). Returns int32 ``[num_cores]``: entries each core
    copied. ``check`` (default: on when ``dst`` is on CPU) verifies host rows lie in the pool.
    """
    if not isinstance(plan, Plan):
        raise TypeError(f"plan: expected avsg.Plan, got {type(plan).__name__}")
    if plan.moves:      # its miss_pos are slots of the buffer, not host rows
        raise ValueError("plan: the moves of SparseKVBuffer.resize; copy them with "
                         "avsg.apply_moves(moves, buffers), not gather")
    return _gather(plan, src, dst, block_table, block_size, partition, num_cores, check)


def copy_misses(plan: Plan, src: TensorList, dst: TensorList,
                block_table: Optional[torch.Tensor] = None, block_size: Optional[int] = None,
                num_cores: Optional[int] = None, check: bool = False) -> torch.Tensor:
    """``gather``'s copy (balanced over cores) without its bookkeeping: for a ``copy`` given to
    ``SparseKVBuffer.step``, which holds the buffer and settles the plan itself. Elsewhere use
    ``gather``. Arguments and result as ``gather``'s."""
    if not isinstance(plan, Plan):
        raise TypeError(f"plan: expected avsg.Plan, got {type(plan).__name__}")
    return _copy(plan, src, dst, block_table, block_size, "miss", num_cores, check,
                 ("plan", "src", "dst"))


def _gather(plan: Plan, src: TensorList, dst: TensorList, block_table: Optional[torch.Tensor],
            block_size: Optional[int], partition: str, num_cores: Optional[int],
            check: Optional[bool], names: Tuple[str, str, str] = ("plan", "src", "dst")
            ) -> torch.Tensor:
    """``gather`` of any plan, fetches and moves alike (``apply_moves`` is the other caller).
    ``names``: what the caller calls the plan, the pools and the destinations, for messages.

    A plan of a buffer (``plan.source``) is checked and copied with that buffer held, and any
    refusal or failure drops what the plan reserved (``SparseKVBuffer._drop_refused``) before the
    error leaves: no later plan can hit a slot this copy did not fill."""
    pn = names[0]
    source = plan.source if isinstance(plan, Plan) else None
    guarded = source is not None and not tracing()
    if guarded and not isinstance(source, SparseKVBuffer):
        raise TypeError(f"{pn}.source: expected the SparseKVBuffer that made the plan or None, "
                        f"got {type(source).__name__}")
    # another thread inside this buffer: refused without touching it (its call, or the next
    # one, drops this plan's reservations unless a copy of the plan succeeds first)
    held = source._hold("gather") if guarded else False
    try:
        if guarded and plan.generation != source._generation:
            raise ValueError(
                f"{pn}: superseded; the buffer ran {source._generation - plan.generation} "
                f"plan/invalidate/reset/resize call(s) since it made this plan (generation "
                f"{plan.generation}, buffer at {source._generation}), so its slots no longer "
                f"describe the buffer: gather a plan before the buffer's next call")
        copied = _copy(plan, src, dst, block_table, block_size, partition, num_cores, check,
                       names)
    except BaseException as error:
        if not guarded:
            raise
        note = source._drop_refused(plan)
        if type(error) in (ValueError, TypeError, RuntimeError):
            raise type(error)(f"{error}; {note}").with_traceback(error.__traceback__) from None
        error.add_note(note)
        raise
    else:
        if guarded:
            source._copied(plan)
        return copied
    finally:
        if guarded:
            source._release(held)


def _copy(plan: Plan, src: TensorList, dst: TensorList, block_table: Optional[torch.Tensor],
          block_size: Optional[int], partition: str, num_cores: Optional[int],
          check: Optional[bool], names: Tuple[str, str, str]) -> torch.Tensor:
    """``_gather``'s checks and its one launch."""
    pn = names[0]
    device = plan.miss_pos.device
    for field in ("slots", "miss_pos", "miss_slots", "miss_counts"):
        t = getattr(plan, field)
        require_tensor(f"{pn}.{field}", t, torch.int32, contiguous=False)   # padded rows
        if t.device != device:
            raise ValueError(f"{pn}.{field}: expected a tensor on {device} (that of "
                             f"{pn}.miss_pos), got one on {t.device}")
    require_bool("check", check, optional=True)
    srcs, dsts, cores, paged = _check_copy_args(device, plan.miss_pos.shape[0], plan.capacity, src,
                                                dst, block_table, block_size, partition,
                                                num_cores, names)
    if ((dsts[0].device.type == "cpu") if check is None else check) and not tracing():
        _check_host_rows(plan, srcs[0], block_table, block_size)
    miss_pos, miss_slots = plan.miss_pos, plan.miss_slots
    if partition == reference.SELECTION_PARTITION:
        miss_pos, miss_slots = reference.selection_layout(plan.slots, plan.miss_pos,
                                                          plan.miss_slots, plan.miss_counts)
    return torch.ops.avsg.gather(miss_pos, miss_slots, plan.miss_counts, srcs, dsts,
                                 block_table, block_size if paged else 0, partition, cores)


def apply_moves(moves: Plan, buffers: TensorList, num_cores: Optional[int] = None) -> torch.Tensor:
    """Copy the KV rows ``SparseKVBuffer.resize`` moved: every ``buffers[i]`` (``[R, capacity,
    ...]``, the buffer's KV tensors) is both the pool (host row = source slot) and the
    destination of ``gather``. Safe in place: a move's source lies at or past the new capacity
    and its destination below it, so no copy reads a row another one writes. Returns what
    ``gather`` returns."""
    if not isinstance(moves, Plan):
        raise TypeError(f"moves: expected the avsg.Plan of SparseKVBuffer.resize, got "
                        f"{type(moves).__name__}")
    if not moves.moves:     # a fetch plan's miss_pos are positions: they would be read as slots
        raise ValueError("moves: a plan of SparseKVBuffer.plan (misses to fetch), not the moves "
                         "of SparseKVBuffer.resize; copy it with avsg.gather")
    tensors = _as_list("buffers", buffers)
    return _gather(moves, tensors, tensors, None, None, "miss", num_cores, None,
                   names=("moves", "buffers", "buffers"))


def _check_host_rows(plan: Plan, src: torch.Tensor, block_table, block_size) -> None:
    pos = plan.miss_pos
    if block_table is None:
        beyond = pos >= src.shape[1]
        if bool(beyond.any()):
            r, j = (int(i) for i in beyond.nonzero()[0])
            raise ValueError(f"src: miss_pos[{r}, {j}] = {int(pos[r, j])} lies beyond the pool's "
                             f"max_len = {src.shape[1]}")
        return
    block_index = torch.where(pos >= 0, pos // block_size, torch.zeros_like(pos))
    beyond = block_index >= block_table.shape[1]
    if bool(beyond.any()):
        r, j = (int(i) for i in beyond.nonzero()[0])
        raise ValueError(f"block_table: miss_pos[{r}, {j}] = {int(pos[r, j])} needs block "
                         f"{int(block_index[r, j])} but block_table.shape[1] = {block_table.shape[1]}")
    block = block_table.gather(1, block_index.long())
    bad = (pos >= 0) & ((block < 0) | (block >= src.shape[0]))
    if bool(bad.any()):
        r, j = (int(i) for i in bad.nonzero()[0])
        raise ValueError(f"block_table[{r}, {int(block_index[r, j])}] = {int(block[r, j])}: "
                         f"expected a block id in [0, {src.shape[0]})")


def _check_copy_args(device: torch.device, R: int, capacity: int, src: TensorList, dst: TensorList,
                     block_table: Optional[torch.Tensor], block_size: Optional[int],
                     partition: str, num_cores: Optional[int], names: Tuple[str, str, str]):
    """The structural checks of a copy of a plan of ``R`` rows of ``capacity`` slots on
    ``device`` (no value read): ``(srcs, dsts, cores, paged)``. ``gather``'s and ``step``'s
    (``MissCopy``) alike."""
    _, sn, dn = names
    srcs, dsts = _as_list(sn, src), _as_list(dn, dst)
    if len(srcs) != len(dsts):
        raise ValueError(f"{sn}/{dn}: expected the same number of tensors, got {len(srcs)} and "
                         f"{len(dsts)}")
    if partition not in reference.ALL_PARTITIONS:
        raise ValueError(f"partition: expected one of {reference.ALL_PARTITIONS}, got {partition!r}")
    cores = get_num_cores() if num_cores is None else num_cores
    require_int("num_cores", cores, low=1)
    paged = block_table is not None
    if paged:
        require_tensor("block_table", block_table, torch.int32, ndim=2, device=device)
        if block_table.shape[0] != R:
            raise ValueError(f"block_table: expected {R} rows (one per request), got "
                             f"{block_table.shape[0]}")
        require_int("block_size", block_size, low=1)
    elif block_size is not None:
        raise ValueError("block_size: only meaningful with a block_table (paged pool)")
    for i, (s, d) in enumerate(zip(srcs, dsts)):
        require_tensor(f"{dn}[{i}]", d, contiguous=False)   # slots may be padded (kv_slots)
        require_tensor(f"{sn}[{i}]", s, contiguous=False)   # rows may be padded
        if s.dtype != d.dtype:
            raise TypeError(f"{sn}[{i}]/{dn}[{i}]: the pool and the buffer need one dtype, got "
                            f"{s.dtype} and {d.dtype}")
        if s.device != device and s.device.type != "cpu":
            raise ValueError(f"{sn}[{i}]: expected a host (CPU) pool or a tensor on {device} (the "
                             f"plan's device), got one on {s.device}")
        if d.dim() < 2 or d.shape[0] != R or d.shape[1] != capacity:
            raise ValueError(f"{dn}[{i}]: expected shape [{R}, {capacity}, ...], got "
                             f"{tuple(d.shape)}")
        if d.device != device:
            raise ValueError(f"{dn}[{i}]: expected a tensor on {device} (the "
                             f"plan's device), got one on {d.device}")
        if s.dim() != d.dim() or s.shape[2:] != d.shape[2:]:
            raise ValueError(f"{sn}[{i}]: expected shape [*, *, {', '.join(map(str, d.shape[2:]))}]"
                             f" matching {dn}[{i}]'s row shape, got {tuple(s.shape)}")
        if paged and s.shape[1] != block_size:
            raise ValueError(f"{sn}[{i}]: a paged pool is [num_blocks, block_size={block_size}, "
                             f"...], got {tuple(s.shape)}")
        if not paged and s.shape[0] != R:
            raise ValueError(f"{sn}[{i}]: a contiguous pool is [{R}, max_len, ...], got "
                             f"{tuple(s.shape)}")
    if paged and any(s.shape[0] != srcs[0].shape[0] for s in srcs):
        raise ValueError(f"{sn}: paged pools sharing one block_table need the same num_blocks")
    if not paged and any(s.shape[1] != srcs[0].shape[1] for s in srcs):
        raise ValueError(f"{sn}: contiguous pools sharing one plan need the same max_len")
    return srcs, dsts, cores, paged
