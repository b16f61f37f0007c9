"""Buffer policies replayed on selection traces.

Every policy keeps, for each of ``rows`` independent buffers (one per trace layer, or one per
layer and query token for separate-buffer MTP replay), at most ``capacity`` resident token positions.
One small interface (:class:`Policy`) is driven by :func:`avsg.lab.traces.replay.replay`:

* ``prepare(sel_all)`` -- optional offline hook, sees the whole trace (only Belady uses it);
* ``step(s, inp) -> hits[rows]`` -- one decode step: ``inp.uniq`` holds each row's unique selected
  positions this step (``[rows, U]``, ascending, ``-1`` padding at the end), ``inp.counts`` their
  number, ``inp.raw`` the raw ``[rows, Tq, K]`` selections and ``inp.seq_lens`` the context length.
  The return value counts, per row, the unique selections that were resident *before* the step
  (hits). After the step every selection of the step is resident (except for ``setassoc-fifo``
  overflow, see there);
* ``invalidate(valid_lens)`` -- forget positions ``>= valid_lens[row]`` (MTP rejection);
* ``reset()`` -- empty every buffer.

All policies are demand-fetching: a position is fetched only in a step that selects it and is not
resident. They differ only in which resident, unselected entry they evict. The selections of the
current step are *pinned*: they are never evicted in the step that uses them (``capacity >= Tq*K``
is required, as for the operator).

Policies (names used by the CLI):

``lru``            exact LRU. Recency key = (last step used, position): within one step positions are
                   taken as used in ascending order, so ties go to the smaller position first.
``clock``          CLOCK (second chance) over the slot array. A hit sets the reference bit; a loaded
                   entry starts with its bit set (textbook CLOCK). For each miss the hand sweeps from
                   where it stopped: an empty slot or an unpinned slot with a clear bit is the victim;
                   an unpinned slot with its bit set has it cleared and is passed; pinned slots are
                   skipped untouched. Misses (ascending position) take victims in hand order.
``setassoc-fifo``  set-associative FIFO: ``sets = capacity // ways`` (``ways`` default 16),
                   ``set = pos mod sets``; a miss replaces the oldest-inserted unpinned way of its set
                   (hits do not refresh, FIFO). When more positions of one step map to a set than it
                   has ways, the excess is fetched into step-local staging only and not retained
                   (counted as a miss, and in ``bypassed``). This is the only policy that can violate
                   the all-selections-resident constraint; Belady's bound is therefore not a strict
                   bound for it when ``bypassed > 0``.
``bucketed-lru``   Spin's bucketed LRU: an entry's age ``s - last_use`` is quantized into ``buckets``
                   (default 64) buckets of ``bucket_width`` steps (default 1; ages beyond the last
                   bucket fall into it). Victims are taken in bulk from the oldest non-empty bucket,
                   in slot order, then from the next older bucket, and so on.
``prev-step``      only the previous step's selection is reusable (the buffer holds exactly the last
                   step's selections).
``freq-lifetime``  a frequency-aware lifetime (a candidate default, trace lab only). Per slot a life
                   in ``[-1, L]`` (``lifetime``, default 16; -1 free) and a use count (0..255); per
                   row a hand and a ghost table of ``G = 2H`` entries (``H = next_pow2(2 * capacity)``,
                   as the op's ``reuse``) holding the count an evicted position leaves, keyed by
                   ``pos mod G`` with tag ``pos // G`` (the later spill wins). Each step: every
                   resident slot with ``life > 0`` loses one when ``s mod 2**c == 0``, ``c =
                   min(floor(log2(1 + count)), classes)`` (``classes`` default 4: a used slot ages
                   up to 16x slower); every ``halve_every`` steps (default 128) all counts and
                   ghost counts halve. A hit adds one to the count and sets life ``L``; a miss
                   takes its ghost's count (0 if the tag differs) plus one and life
                   ``insert_life`` (default ``L``). Victims: the unpinned
                   slots in ``(life, (slot - hand) mod capacity)`` order (free first), and the hand
                   moves past the last victim. ``levels`` records, per row-step with misses, the
                   number of levels from -1 up to the last victim's (the level scan's passes).
``lifetime-hand``  the paper's lifetime with the same hand order among equal lives and no counts
                   (``freq-lifetime`` with ``classes = 0``), and the op's probation: a miss
                   starts at life ``L - min(4, L // 2)`` (``reference.first_life``), a hit at ``L``.
``belady``         Belady's offline optimum under the constraint that all of the current step's
                   selections are resident after the step: on a miss the resident unpinned entry whose
                   next use is farthest in the future is evicted (never-used-again entries first). With
                   demand fetching and pinned step sets, this farthest-next-use rule is optimal (the
                   classical exchange argument holds with steps as the time unit), so no demand policy
                   that keeps the constraint gets more hits.
``avsg``           the real :class:`avsg.SparseKVBuffer` (``plan`` op) with its ``reuse`` residency
                   policy (counts, log-recency, block heat; its state is sized by the buffer), one
                   buffer row per trace row; all rows are planned in one batched call per step.
                   hits = unique selections - ``plan.miss_counts``.
``avsg-lifetime``  the same op with the paper's lifetime policy, lifetime ``lifetime`` (default
                   ``reference.DEFAULT_LIFETIME``):
                   the buffer's default (``avsg.reference.DEFAULT_POLICY``).
``avsg-lru``       the same op with its ``lru`` policy (exact LRU at step granularity; ties within a
                   step go by slot, where ``lru`` breaks them by position).
"""
from __future__ import annotations

from typing import Callable, Dict, NamedTuple

import numpy as np

__all__ = ["Policy", "StepInput", "POLICIES", "make_policy", "unique_rows", "policy_names",
           "LRU", "Clock", "SetAssocFIFO", "BucketedLRU", "PrevStep", "Belady", "AVSGPolicy",
           "AVSGLifetimePolicy", "FreqLifetime", "LifetimeHand"]

_INF = np.iinfo(np.int64).max // 4
_EMPTY = -_INF  # empty slots are always taken first


class StepInput(NamedTuple):
    raw: np.ndarray       # int64 [rows, Tq, K], -1 = none
    uniq: np.ndarray      # int64 [rows, U] unique valid positions ascending, then -1
    counts: np.ndarray    # int64 [rows]
    seq_lens: np.ndarray  # int64 [rows]


def unique_rows(raw: np.ndarray) -> "tuple[np.ndarray, np.ndarray]":
    """Per row, the sorted unique valid positions of ``raw`` ``[rows, Tq, K]`` (-1 = none).

    Returns ``(uniq [rows, U], counts [rows])`` with ``U = Tq*K``; valid entries first, then -1.
    Rows of a single query token are assumed sorted (trace format) and returned as is.
    """
    rows = raw.shape[0]
    flat = raw.reshape(rows, -1).astype(np.int64, copy=False)
    if raw.shape[1] == 1:
        # trace rows are sorted strictly ascending with -1 padding at the end
        return flat, (flat >= 0).sum(1)
    big = np.iinfo(np.int64).max
    a = np.sort(np.where(flat >= 0, flat, big), axis=1)
    dup = np.zeros_like(a, dtype=bool)
    dup[:, 1:] = a[:, 1:] == a[:, :-1]
    a[dup] = big
    a = np.sort(a, axis=1)
    invalid = a == big
    a[invalid] = -1
    return a, (~invalid).sum(1)


class Policy:
    """Base class. Subclasses implement :meth:`step`."""

    name = "base"
    honours_residency = True  # False for policies that may not keep all selections (setassoc-fifo)

    def __init__(self, rows: int, capacity: int, k: int, queries: int = 1, max_pos: int = 1 << 16):
        if capacity < queries * k:
            raise ValueError(f"capacity: expected >= queries*k = {queries}*{k} = {queries * k}, "
                             f"got {capacity}")
        self.rows, self.capacity, self.k, self.queries, self.max_pos = rows, capacity, k, queries, max_pos
        self.bypassed = 0

    def prepare(self, sel_all: np.ndarray) -> None:  # [rows, steps, Tq, K]
        pass

    def step(self, s: int, inp: StepInput) -> np.ndarray:
        raise NotImplementedError

    def invalidate(self, valid_lens: np.ndarray) -> None:
        raise NotImplementedError

    def reset(self) -> None:
        raise NotImplementedError

    def describe(self) -> str:
        return self.name


class _SlotPolicy(Policy):
    """Shared machinery: ``capacity`` slots per row, dense position->slot map, pinned step sets.

    Subclasses provide ``_choose(r, s, miss_pos, pinned_slots) -> slots`` (one slot per miss, or -1
    to bypass) and optional metadata hooks ``_on_hits`` / ``_on_install``.
    """

    def __init__(self, rows, capacity, k, queries=1, max_pos=1 << 16):
        super().__init__(rows, capacity, k, queries, max_pos)
        self._ridx = np.arange(rows)[:, None]
        self._slotidx = np.arange(capacity, dtype=np.int64)
        self.reset()

    def reset(self):
        self.pos_slot = np.full((self.rows, self.max_pos), -1, np.int64)
        self.slot_pos = np.full((self.rows, self.capacity), -1, np.int64)
        self._reset_meta()

    def _reset_meta(self):
        pass

    def _on_hits(self, s, inp, hit, slot_of):
        pass

    def _on_install(self, r, s, mp, slots, inp, missmask_r):
        pass

    def _on_evict(self, r, slots):
        pass

    def step(self, s, inp):
        u = inp.uniq
        valid = u >= 0
        uc = np.where(valid, u, 0)
        if uc.size and uc.max() >= self.max_pos:
            raise ValueError(f"position {int(uc.max())} >= max_pos {self.max_pos}")
        slot_of = self.pos_slot[self._ridx, uc]
        hit = valid & (slot_of >= 0)
        hits = hit.sum(1)
        self._on_hits(s, inp, hit, slot_of)
        miss = valid & ~hit
        for r in np.flatnonzero(miss.any(1)):
            mr = miss[r]
            mp = u[r][mr]
            slots = self._choose(r, s, mp, slot_of[r][hit[r]])
            keep = slots >= 0
            if not keep.all():
                self.bypassed += int((~keep).sum())
                mp, slots = mp[keep], slots[keep]
                mr = mr.copy()
                mr[np.flatnonzero(mr)[~keep]] = False
            old = self.slot_pos[r, slots]
            self.pos_slot[r, old[old >= 0]] = -1
            self.slot_pos[r, slots] = mp
            self.pos_slot[r, mp] = slots
            self._on_install(r, s, mp, slots, inp, mr)
        return hits

    def invalidate(self, valid_lens):
        valid_lens = np.asarray(valid_lens).reshape(-1)
        for r in range(self.rows):
            sp = self.slot_pos[r]
            drop = np.flatnonzero(sp >= valid_lens[r])
            if drop.size:
                self.pos_slot[r, sp[drop]] = -1
                sp[drop] = -1
                self._on_evict(r, drop)

    def _smallest(self, r, prio, n):
        """The ``n`` slots of row ``r`` with the smallest priority, in priority order. Empty slots
        come first (lowest slot first), whatever the subclass put there."""
        empty = self.slot_pos[r] < 0
        prio[empty] = _EMPTY + self._slotidx[empty]
        if n >= prio.size:
            return np.argsort(prio, kind="stable")[:n]
        idx = np.argpartition(prio, n - 1)[:n]
        return idx[np.argsort(prio[idx], kind="stable")]


class LRU(_SlotPolicy):
    name = "lru"

    def _reset_meta(self):
        self.key = np.full((self.rows, self.capacity), _EMPTY, np.int64)

    def _on_evict(self, r, slots):
        self.key[r, slots] = _EMPTY

    def _on_hits(self, s, inp, hit, slot_of):
        rr, cc = np.nonzero(hit)
        self.key[rr, slot_of[rr, cc]] = s * self.max_pos + inp.uniq[rr, cc]

    def _choose(self, r, s, mp, pinned):
        prio = self.key[r].copy()
        prio[pinned] = _INF
        return self._smallest(r, prio, mp.size)

    def _on_install(self, r, s, mp, slots, inp, mr):
        self.key[r, slots] = s * self.max_pos + mp


class SlotMapFIFO(LRU):
    """SGLang's Ascend position -> slot map: oldest fill first (no recency update on a hit). The
    decode model's ``slotmap-device`` peer (``costmodel.traffic``)."""
    name = "slotmap-fifo"

    def _on_hits(self, s, inp, hit, slot_of):
        pass


class BucketedLRU(_SlotPolicy):
    name = "bucketed-lru"

    def __init__(self, rows, capacity, k, queries=1, max_pos=1 << 16, buckets=64, bucket_width=1):
        self.buckets, self.bucket_width = int(buckets), int(bucket_width)
        super().__init__(rows, capacity, k, queries, max_pos)

    def describe(self):
        return f"{self.name}(buckets={self.buckets}, width={self.bucket_width})"

    def _reset_meta(self):
        self.last = np.full((self.rows, self.capacity), -1, np.int64)

    def _on_evict(self, r, slots):
        self.last[r, slots] = -1

    def _on_hits(self, s, inp, hit, slot_of):
        rr, cc = np.nonzero(hit)
        self.last[rr, slot_of[rr, cc]] = s

    def _choose(self, r, s, mp, pinned):
        last = self.last[r]
        bucket = np.minimum((s - last) // self.bucket_width, self.buckets - 1)
        prio = (self.buckets - 1 - bucket) * self.capacity + self._slotidx
        prio[pinned] = _INF
        return self._smallest(r, prio, mp.size)

    def _on_install(self, r, s, mp, slots, inp, mr):
        self.last[r, slots] = s


class Clock(_SlotPolicy):
    name = "clock"

    def _reset_meta(self):
        self.ref = np.zeros((self.rows, self.capacity), bool)
        self.hand = np.zeros(self.rows, np.int64)
        self._ar = np.arange(self.capacity, dtype=np.int64)

    def _on_evict(self, r, slots):
        self.ref[r, slots] = False

    def _on_hits(self, s, inp, hit, slot_of):
        rr, cc = np.nonzero(hit)
        self.ref[rr, slot_of[rr, cc]] = True

    def _choose(self, r, s, mp, pinned):
        C, n = self.capacity, mp.size
        h = int(self.hand[r])
        order = self._ar + h
        order[order >= C] -= C
        pin = np.zeros(C, bool)
        pin[pinned] = True
        refb = self.ref[r]
        o_pin = pin[order]
        o_free = ~o_pin & ((self.slot_pos[r][order] < 0) | ~refb[order])
        c1 = np.flatnonzero(o_free)
        if c1.size >= n:
            vo = c1[:n]
            stop = int(vo[-1]) + 1
            seg = order[:stop]
            refb[seg[~o_pin[:stop]]] = False  # second chance given to the passed entries
            victims = order[vo]
        else:
            c2 = np.flatnonzero(~o_pin & ~o_free)[: n - c1.size]
            refb[order[~o_pin]] = False  # one full revolution clears every unpinned bit
            victims = np.concatenate([order[c1], order[c2]])
            stop = int(c2[-1]) + 1
        self.hand[r] = (h + stop) % C
        return victims

    def _on_install(self, r, s, mp, slots, inp, mr):
        self.ref[r, slots] = True


class SetAssocFIFO(_SlotPolicy):
    name = "setassoc-fifo"
    honours_residency = False

    def __init__(self, rows, capacity, k, queries=1, max_pos=1 << 16, ways=16):
        self.ways = int(ways)
        if self.ways <= 0 or capacity % self.ways:
            raise ValueError(f"ways: expected a positive divisor of capacity {capacity}, got {ways}")
        self.sets = capacity // self.ways
        super().__init__(rows, capacity, k, queries, max_pos)

    def describe(self):
        return f"{self.name}(ways={self.ways}, sets={self.sets})"

    def _reset_meta(self):
        self.key = np.full((self.rows, self.capacity), _EMPTY, np.int64)

    def _on_evict(self, r, slots):
        self.key[r, slots] = _EMPTY

    def _choose(self, r, s, mp, pinned):
        W = self.ways
        mset = mp % self.sets
        o = np.argsort(mset, kind="stable")  # mp ascending, so (set, pos) order
        ms = mset[o]
        first = np.searchsorted(ms, ms, "left")
        rank = np.arange(ms.size) - first
        useds, inv = np.unique(ms, return_inverse=True)
        prio = self.key[r].copy()
        prio[pinned] = _INF
        P = prio.reshape(self.sets, W)[useds]           # [used sets, W]
        ordw = np.argsort(P, axis=1, kind="stable")     # oldest (or empty) way first
        avail = (P != _INF).sum(1)
        ok = rank < avail[inv]
        way = ordw[inv, np.minimum(rank, W - 1)]
        slots_sorted = np.where(ok, ms * W + way, -1)
        slots = np.empty_like(slots_sorted)
        slots[o] = slots_sorted
        return slots

    def _on_install(self, r, s, mp, slots, inp, mr):
        self.key[r, slots] = s * self.max_pos + mp


class Belady(_SlotPolicy):
    name = "belady"

    def prepare(self, sel_all):
        rows, steps = sel_all.shape[:2]
        U = sel_all.shape[2] * sel_all.shape[3]
        self.nxt = np.empty((rows, steps, U), np.int32)
        last_seen = np.full((rows, self.max_pos + 1), np.iinfo(np.int32).max, np.int32)
        ridx = np.arange(rows)[:, None]
        for s in range(steps - 1, -1, -1):
            u, _ = unique_rows(sel_all[:, s].astype(np.int64))
            uc = np.where(u >= 0, u, self.max_pos)  # padding goes to a dummy column
            self.nxt[:, s] = last_seen[ridx, uc]
            last_seen[ridx, uc] = s
            last_seen[:, self.max_pos] = np.iinfo(np.int32).max

    def _reset_meta(self):
        self.nu = np.full((self.rows, self.capacity), 0, np.int64)

    def _on_evict(self, r, slots):
        pass  # emptiness is read from slot_pos

    def _on_hits(self, s, inp, hit, slot_of):
        rr, cc = np.nonzero(hit)
        self.nu[rr, slot_of[rr, cc]] = self.nxt[rr, s, cc]

    def _choose(self, r, s, mp, pinned):
        prio = -self.nu[r]
        prio[pinned] = _INF
        return self._smallest(r, prio, mp.size)

    def _on_install(self, r, s, mp, slots, inp, mr):
        self.nu[r, slots] = self.nxt[r, s, :mr.size][mr]

    def step(self, s, inp):
        if not hasattr(self, "nxt"):
            raise RuntimeError("belady: prepare(sel_all) must be called before step (offline policy)")
        return super().step(s, inp)


class FreqLifetime(_SlotPolicy):
    name = "freq-lifetime"

    def __init__(self, rows, capacity, k, queries=1, max_pos=1 << 16, lifetime=16, classes=4,
                 halve_every=128, insert_life=None):
        self.lifetime, self.classes, self.halve_every = int(lifetime), int(classes), int(halve_every)
        self.insert_life = self.lifetime if insert_life is None else int(insert_life)
        buckets = 64
        while buckets < 2 * capacity:
            buckets *= 2
        self.ghosts = 2 * buckets
        super().__init__(rows, capacity, k, queries, max_pos)

    def describe(self):
        return f"{self.name}(L={self.lifetime}, classes={self.classes}, halve={self.halve_every})"

    def _reset_meta(self):
        R, S = self.rows, self.capacity
        self.life = np.full((R, S), -1, np.int64)
        self.count = np.zeros((R, S), np.int64)
        self.hand = np.zeros(R, np.int64)
        self.ghost_tag = np.full((R, self.ghosts), -1, np.int64)
        self.ghost_count = np.zeros((R, self.ghosts), np.int64)
        self.levels = []

    def step(self, s, inp):
        cls = np.minimum(np.log2(1 + self.count).astype(np.int64), self.classes)
        due = (s & ((1 << cls) - 1)) == 0
        self.life -= (self.life > 0) & due
        if self.halve_every and s > 0 and s % self.halve_every == 0:
            self.count >>= 1
            self.ghost_count >>= 1
        return super().step(s, inp)

    def _on_hits(self, s, inp, hit, slot_of):
        rr, cc = np.nonzero(hit)
        sl = slot_of[rr, cc]
        self.count[rr, sl] = np.minimum(self.count[rr, sl] + 1, 255)
        self.life[rr, sl] = self.lifetime

    def _choose(self, r, s, mp, pinned):
        S = self.capacity
        life = self.life[r]
        prio = (life + 1) * S + (self._slotidx - self.hand[r]) % S
        prio[pinned] = _INF
        n = mp.size
        idx = np.argpartition(prio, n - 1)[:n] if n < S else np.arange(S)
        victims = idx[np.argsort(prio[idx], kind="stable")]
        self.hand[r] = (victims[-1] + 1) % S
        self.levels.append(int(life[victims[-1]]) + 2)
        old = self.slot_pos[r, victims]
        ev = old >= 0
        entry = old[ev] % self.ghosts
        self.ghost_tag[r, entry] = old[ev] // self.ghosts
        self.ghost_count[r, entry] = self.count[r, victims[ev]]
        return victims

    def _on_install(self, r, s, mp, slots, inp, mr):
        entry = mp % self.ghosts
        mine = self.ghost_tag[r, entry] == mp // self.ghosts
        self.count[r, slots] = np.minimum(np.where(mine, self.ghost_count[r, entry], 0) + 1, 255)
        self.life[r, slots] = self.insert_life

    def _on_evict(self, r, slots):
        self.life[r, slots] = -1
        self.count[r, slots] = 0


class LifetimeHand(FreqLifetime):
    name = "lifetime-hand"

    def __init__(self, rows, capacity, k, queries=1, max_pos=1 << 16, lifetime=None):
        if lifetime is None:              # the op's default (reference imports torch: only then)
            from ...reference import DEFAULT_LIFETIME as lifetime
        # written from the rule, not from reference.first_life, so the test comparing the two
        # checks the op against an independent statement of it
        super().__init__(rows, capacity, k, queries, max_pos, lifetime, classes=0,
                         insert_life=int(lifetime) - min(4, int(lifetime) // 2))

    def describe(self):
        return f"{self.name}(L={self.lifetime})"


class PrevStep(Policy):
    name = "prev-step"

    def __init__(self, rows, capacity, k, queries=1, max_pos=1 << 16):
        super().__init__(rows, capacity, k, queries, max_pos)
        self._ridx = np.arange(rows)[:, None]
        self.reset()

    def reset(self):
        self.res = np.zeros((self.rows, self.max_pos + 1), bool)
        self.prev = None

    def step(self, s, inp):
        u = inp.uniq
        uc = np.where(u >= 0, u, self.max_pos)
        hit = self.res[self._ridx, uc] & (u >= 0)
        if self.prev is not None:
            self.res[self._ridx, self.prev] = False
        self.res[self._ridx, uc] = True
        self.res[:, self.max_pos] = False
        self.prev = uc
        return hit.sum(1)

    def invalidate(self, valid_lens):
        valid_lens = np.asarray(valid_lens).reshape(-1)
        for r in range(self.rows):
            self.res[r, valid_lens[r]:] = False


class AVSGPolicy(Policy):
    """Drives the real :class:`avsg.SparseKVBuffer` (no re-implementation)."""

    name = "avsg"
    policy = "reuse"

    def __init__(self, rows, capacity, k, queries=1, max_pos=1 << 16, lifetime=None, cost_every=0):
        super().__init__(rows, capacity, k, queries, max_pos)
        # cost_every > 0: every cost_every-th step runs in the strict emulation, which counts the
        # plan's work; its per-core estimates (one row per core) are the plan cost samples
        self.cost_every = int(cost_every)
        self.cost_samples = []
        try:
            import torch
            import avsg
            self._cls = avsg.SparseKVBuffer
        except (ImportError, AttributeError) as e:
            raise RuntimeError(
                "policy 'avsg' needs the avsg operator package (avsg.SparseKVBuffer); install it with "
                f"`pip install --no-build-isolation -e .` in the repository ({e})") from e
        self._torch = torch
        self.lifetime = int(avsg.reference.DEFAULT_LIFETIME if lifetime is None else lifetime)
        self.reset()

    def describe(self):
        if self.policy == "lifetime":
            return f"{self.name}(lifetime={self.lifetime})"
        return f"{self.name}({self.policy})"

    def reset(self):
        self.buf = self._cls(rows=self.rows, capacity=self.capacity, topk=self.k,
                             queries_per_step=self.queries, lifetime=self.lifetime, device="cpu",
                             policy=self.policy, max_context=self.max_pos,   # a bound, no storage
                             track_copies=False)   # a replay holds no KV: misses count as fetched
        self.last_plan = None

    def step(self, s, inp):
        torch = self._torch
        pos = torch.from_numpy(np.ascontiguousarray(inp.raw, dtype=np.int32))
        sl = torch.from_numpy(np.ascontiguousarray(inp.seq_lens, dtype=np.int32))
        if self.cost_every and s > 0 and s % self.cost_every == 0:
            from ... import backend
            # one emulated core per row: with idle cores (and AVSG_NPU_SPLIT=1) the plan would
            # split a row's lookup over helpers, and the per-block costs would be parts of rows
            cores = backend.emulated_cores()
            backend.set_emulated_cores(self.rows)
            try:
                with backend.emulation("strict"):
                    plan = self.buf.plan(pos, sl)
                self.cost_samples.append(backend.last_launch_counters())
            finally:
                backend.set_emulated_cores(cores)
        else:
            plan = self.buf.plan(pos, sl)
        self.last_plan = plan
        misses = plan.miss_counts.numpy().astype(np.int64)
        return inp.counts - misses

    def invalidate(self, valid_lens):
        torch = self._torch
        self.buf.invalidate(torch.from_numpy(np.ascontiguousarray(valid_lens, dtype=np.int32)))


class AVSGLifetimePolicy(AVSGPolicy):
    """The real op with the AVSG paper's lifetime policy."""

    name = "avsg-lifetime"
    policy = "lifetime"


class AVSGLruPolicy(AVSGPolicy):
    """The real op with its lru policy (ties within a step by slot, where ``lru`` breaks them by
    position: the two may differ by a few hits)."""

    name = "avsg-lru"
    policy = "lru"


POLICIES: Dict[str, Callable[..., Policy]] = {
    "lru": LRU,
    "clock": Clock,
    "setassoc-fifo": SetAssocFIFO,
    "bucketed-lru": BucketedLRU,
    "prev-step": PrevStep,
    "belady": Belady,
    "freq-lifetime": FreqLifetime,
    "lifetime-hand": LifetimeHand,
    "avsg": AVSGPolicy,
    "avsg-lifetime": AVSGLifetimePolicy,
    "avsg-lru": AVSGLruPolicy,
}

#: the trace policy that drives the op with each of its residency policies
OP_POLICY = {"reuse": "avsg", "lifetime": "avsg-lifetime", "lru": "avsg-lru"}

# options each policy accepts (from the CLI / make_policy(**opts)); others are ignored
_POLICY_OPTS = {
    "setassoc-fifo": ("ways",),
    "bucketed-lru": ("buckets", "bucket_width"),
    "avsg": ("lifetime", "cost_every"),
    "avsg-lifetime": ("lifetime", "cost_every"),
    "avsg-lru": ("cost_every",),
    "freq-lifetime": ("lifetime",),
    "lifetime-hand": ("lifetime",),
}


def policy_names():
    return list(POLICIES)


def make_policy(name: str, rows: int, capacity: int, k: int, queries: int = 1,
                max_pos: int = 1 << 16, **opts) -> Policy:
    """Build policy ``name``; ``opts`` may hold ways / buckets / bucket_width / lifetime (the ones a
    policy does not take are ignored, and ``None`` values mean the default)."""
    if name not in POLICIES:
        raise ValueError(f"policy: expected one of {policy_names()}, got {name!r}")
    kw = {key: v for key, v in opts.items() if key in _POLICY_OPTS.get(name, ()) and v is not None}
    return POLICIES[name](rows, capacity, k, queries, max_pos, **kw)
