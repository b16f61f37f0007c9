"""vllm-ascend's fused path (``npu_fused_sparse_attention_overlap``, vllm-ascend PR #14278) as the
decode model needs it: a replay of its selection cache (which rows it copies) and a counted-work
model of its matching (what that costs). Both are read from its public kernel source at the PR
head (``op_kernel/arch22/fused_sparse_attention_overlap_service_vector_mla.h``, the A2 build);
no code is taken from it.

**The selection cache** (``ProcessSetResidentSelectionRow``). One row per query token of the
flattened batch (and KV head: DeepSeek's MLA has one), ``K`` slots (the top-k, 2048). Per step:

* a selection whose position the row holds is a hit and keeps its slot;
* the misses, in top-k order, take the slots whose position was not selected, in ascending slot
  order (``nextInsertSlot``), and are copied from the host's full KV cache;
* so after a step the row holds exactly its current top-k: an exact LRU of capacity K. Nothing
  is ever dropped for validity: a position rewritten after its copy (a rejected MTP draft) is a
  hit on the old bytes (``stale_hits`` counts them; the copies counted are the kernel's).

A row is a position in the flattened batch, so row ``j`` of a request is its ``j``-th query
token of the step (MTP: 1 + n rows per request).

**Matching paths** (which is taken decides the cost, not the result, for the inputs a DSA indexer
gives: unique positions, all valid once the context reaches K):

* same top-k in the same order as the slots: a 4-position probe, then a vector compare;
* context (``s2IdLimit``) <= 16,376: the INT16 token -> slot membership map, a vector gather;
* above: both the top-k and the resident tokens sorted (Cast, Concat, ``Sort``, Extract, Cast)
  and matched by a scalar two-pointer merge;
* then a scalar walk over the K positions assigns free slots to the misses. Up to 64 misses are
  copied synchronously in the matching phase (two DMAs per row, each waited for), except on the
  membership-map path with the map kept in UB ("sparse plan"); more than 64 go into the plan that
  ``MergeKv`` copies while attention runs.

``fused_counters`` prices this walk as the emulation prices avsg's own kernels (the same counter
fields, the same profile; ``Sort`` as the emulation counts avsg's Sort). ``SelectionCache``
replays the cache and gives the per-row-step quantities the walk needs (``summarize`` sorts them
by regime); for ``fused-4096`` the per-token LRU of :mod:`.traffic` gives the misses.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Dict, List, Optional

import numpy as np

MEMBERSHIP_MAX_TOKEN = 16376        # SELECTION_MEMBERSHIP_MAX_TOKEN: the direct map's reach
MEMBERSHIP_STRIDE_INT16 = 16400     # the map row: 16,376 entries, 8 control fields, alignment
SYNC_COPY_THRESHOLD = 64            # SELECTION_SYNC_COPY_THRESHOLD / _CAPACITY
UB_MAP_BYTES = 65536                # two 32 KB buffers hold the map plus four top-k arrays
REGIMES = ("same", "all_hit", "small", "large")


@dataclasses.dataclass
class RowSteps:
    """Per row-step quantities of one replay (flat arrays over rows x steps)."""
    misses: np.ndarray          # host copies
    merge_steps: np.ndarray     # iterations of the two-pointer merge (sorted path)
    scan: np.ndarray            # insertStatus reads of the free-slot walk (last free slot + 1)
    probe: np.ndarray           # positions the 4-position probe compared
    same: np.ndarray            # bool: the top-k equals the slots, position by position
    stale_hits: np.ndarray      # hits on a position rewritten after its copy


def merge_steps(cur: np.ndarray, status: np.ndarray) -> np.ndarray:
    """Iterations of ``FindSelectionTopkHit``'s two-pointer loop per row, over the descending
    sorted top-k ``cur`` int [rows, k] (valid, unique) and resident tokens ``status`` [rows, k]
    (-1 = empty): both pointers advance on a match, the larger side's otherwise; the loop ends
    at either end or at a -1 (one more iteration reads it and breaks). Closed form: with ``t``
    the larger of the two minima, the loop consumes every entry >= t of each side, a match
    consuming two; tests check it against the loop."""
    k = status.shape[1]
    valid = status >= 0
    nb = valid.sum(1)
    big = np.iinfo(np.int64).max
    b_min = np.where(valid, status, big).min(1)
    a_min = cur.min(1)
    t = np.maximum(a_min, b_min)
    hits = _row_isin(status, cur).sum(1)
    steps = (cur >= t[:, None]).sum(1) + (valid & (status >= t[:, None])).sum(1) - hits
    steps = steps + ((a_min < b_min) & (nb < k) & (nb > 0))
    return np.where(nb == 0, 1, steps)


def _row_isin(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a[r, i] in b[r]`` for every row (non-negative values; -1 in ``a`` is never in)."""
    rows = a.shape[0]
    span = int(max(a.max(initial=0), b.max(initial=0))) + 2
    off = (np.arange(rows, dtype=np.int64) * span)[:, None]
    return np.isin(a + off, b + off) & (a >= 0)


class SelectionCache:
    """The fused kernel's selection cache for ``rows`` query-token rows of ``k`` slots."""

    def __init__(self, rows: int, k: int):
        self.k = k
        self.status = np.full((rows, k), -1, np.int64)          # position held per slot
        self.copied_at = np.full((rows, k), -1, np.int64)      # iteration of the slot's copy

    def step(self, topk: np.ndarray, last_write: Optional[np.ndarray] = None,
             iteration: int = 0) -> RowSteps:
        """One step: ``topk`` int [rows, k] (per row unique positions >= 0, as the indexer gives
        once the context reaches k). ``last_write`` int [positions]: the iteration that last
        wrote each position's KV (MTP rewrites rejected drafts' positions), to count hits on
        bytes older than that; the kernel ignores it."""
        topk = np.asarray(topk, dtype=np.int64)
        rows, k = topk.shape
        if k != self.k or rows != self.status.shape[0]:
            raise ValueError(f"topk: expected [{self.status.shape[0]}, {self.k}], got "
                             f"{tuple(topk.shape)}")
        if (topk < 0).any():
            raise ValueError("topk: expected positions >= 0 (the replay covers contexts >= k)")
        cur_sorted = np.sort(topk, axis=1)
        if (np.diff(cur_sorted, axis=1) == 0).any():
            raise ValueError("topk: expected unique positions per row (a top-k is a set)")
        st = self.status
        eq = topk[:, :4] == st[:, :4]
        probe = np.where(eq.all(1), eq.shape[1], eq.argmin(1) + 1)
        same = (topk == st).all(1)
        hit_slot = _row_isin(st, topk)
        miss = ~_row_isin(topk, st)
        free = ~hit_slot
        misses = miss.sum(1)
        steps = merge_steps(cur_sorted[:, ::-1], -np.sort(-st, axis=1))
        last_free = k - np.argmax(free[:, ::-1], axis=1)
        scan = np.where(misses > 0, last_free, 0)
        stale = np.zeros(rows, np.int64)
        if last_write is not None:
            held = np.clip(st, 0, None)
            stale = (hit_slot & (self.copied_at < last_write[held])).sum(1)
        # per row the free slots (ascending) and the misses (top-k order) are equally many:
        # row-major order pairs them row by row
        st[free] = topk[miss]
        self.copied_at[free] = iteration
        return RowSteps(misses=misses, merge_steps=steps, scan=scan, probe=probe, same=same,
                        stale_hits=stale)


def reference_step(status: List[int], topk: List[int]) -> Dict[str, object]:
    """The kernel's per-row semantics stated plainly (the tests' oracle): a position held is a
    hit in its slot; each miss, in top-k order, takes the lowest free slot (one whose position
    was not selected). ``status`` is updated in place; returns the misses and each selection's
    slot."""
    held = {p: s for s, p in enumerate(status) if p >= 0}
    wanted = set(topk)
    free = [s for s, p in enumerate(status) if p not in wanted]
    slots, misses = [], 0
    for p in topk:
        if p in held:
            slots.append(held[p])
        else:
            s = free.pop(0)
            status[s] = p
            slots.append(s)
            misses += 1
    return {"misses": misses, "slots": slots}


def summarize(steps: List[RowSteps]) -> Dict[str, Dict[str, float]]:
    """Per regime (``same``: identical top-k; ``all_hit``: no miss; ``small``: 1..64 misses;
    ``large``: more) its share of the row-steps and the mean of each quantity in it: enough for
    the mean cost, which is linear in them within a regime."""
    cat = {f.name: np.concatenate([getattr(s, f.name) for s in steps])
           for f in dataclasses.fields(RowSteps)}
    m = cat["misses"]
    masks = {"same": cat["same"], "all_hit": (m == 0) & ~cat["same"],
             "small": (m > 0) & (m <= SYNC_COPY_THRESHOLD), "large": m > SYNC_COPY_THRESHOLD}
    out = {}
    for name, mask in masks.items():
        n = int(mask.sum())
        out[name] = {"share": n / max(1, m.size),
                     **{f: float(cat[f][mask].mean()) if n else 0.0
                        for f in ("misses", "merge_steps", "scan", "probe", "stale_hits")}}
    return out


def deferred_misses(summary: Dict[str, Dict[str, float]], context: int, k: int) -> float:
    """Mean rows per row-step that ``MergeKv`` copies while attention runs (the rest are copied
    synchronously while matching)."""
    sparse = _map_kept(context, k)
    return sum(summary[g]["share"] * summary[g]["misses"] for g in ("small", "large")
               if g == "large" or sparse)


def _map_kept(context: int, k: int) -> bool:
    """The membership map path with the map kept in UB (``membershipMapLocalPreserved``)."""
    n_align = -(-context // 16) * 16
    return (context <= MEMBERSHIP_MAX_TOKEN and n_align + k <= MEMBERSHIP_MAX_TOKEN
            and n_align * 2 + -(-k // 8) * 8 * 16 <= UB_MAP_BYTES)


# ---------------------------------------------------------------- counted work

_FIELDS = ("scalar_ub_reads", "scalar_ub_writes", "scalar_gm_reads", "scalar_gm_writes",
           "vec_instrs", "vec_repeats", "mte2_copies", "mte2_bytes", "mte3_copies", "mte3_bytes",
           "pipe_barriers", "set_flags", "wait_flags", "queue_syncs", "sync_alls", "dcci")


def _reps(nbytes: float) -> float:
    return math.ceil(nbytes / 256)


class _Work(dict):
    """Counters shaped like the emulation's (one block), accumulated by the walk below."""

    def __init__(self):
        super().__init__({f: 0.0 for f in _FIELDS})

    def vec(self, nbytes: float, n: float = 1.0, repeats: Optional[float] = None):
        self["vec_instrs"] += n
        self["vec_repeats"] += n * (_reps(nbytes) if repeats is None else repeats)
        self["pipe_barriers"] += n

    def dma_in(self, nbytes: float, n: float = 1.0):
        self["mte2_copies"] += n
        self["mte2_bytes"] += n * nbytes

    def dma_out(self, nbytes: float, n: float = 1.0):
        self["mte3_copies"] += n
        self["mte3_bytes"] += n * nbytes

    def flag(self, n: float = 1.0):
        self["set_flags"] += n
        self["wait_flags"] += n

    def sort(self, n: int):
        """SortSelectionTopk on n int32: Cast, Concat, Sort, Extract, two Casts; Sort and Extract
        counted as the emulation counts them (op_kernel/cpu/emu_vector.h)."""
        self.vec(4 * n, 3)                                      # Cast in, Cast out x2
        self.vec(4 * n)                                         # Concat
        self.vec(0, repeats=2 * _reps(8 * n))                   # Sort<float, true>
        self.vec(0, repeats=2 * _reps(8 * n))                   # Extract

    def __getitem__(self, k):
        import torch
        return torch.tensor([dict.__getitem__(self, k)], dtype=torch.float64)


def fused_counters(regime: str, q: Dict[str, float], context: int, k: int, slots: int,
                   row_bytes: int = 1152, latent_bytes: int = 1024):
    """Counted work of one row-step of the fused kernel's selection update (its
    ``RunAllCoreSelectionUpdate`` share for one query-token row) in ``regime`` with the mean
    quantities ``q`` (``summarize``), at ``context`` tokens, top-k ``k``, ``slots`` resident
    entries per row (k for the merged kernel). Returns ``(counters, sync_copies)``: the counters
    (priced by ``hardware.launch_estimate``) and the rows copied synchronously, each waiting for
    its host read (the caller adds their latency)."""
    w = _Work()
    m = q["misses"]
    status_bytes = 4 * (slots + 1)
    w.dma_in(status_bytes)                                      # resident status row
    w.flag()
    w["scalar_ub_reads"] += 2 * q["probe"] + 1                  # probe + previous valid count
    if regime == "same":
        w.vec(4 * k, 5)                                         # 2 Cast, Sub, Abs, ReduceMax
        w.flag()
        w.dma_in(16)                                            # map control: ready?
        w["scalar_ub_reads"] += 2
        w["scalar_gm_writes"] += 2                              # clear plan marker, kv length
        return w, 0.0
    direct = context <= MEMBERSHIP_MAX_TOKEN
    kept = _map_kept(context, k)
    if direct:
        w.dma_in(16)                                            # map control
        w.flag()
        w["scalar_ub_reads"] += 1
        w.dma_in(2 * (-(-context // 16) * 16))                  # the map, context int16
        w.flag()
        w.vec(4 * k, 4)                                         # Muls, Gather, Cast, ReduceMin
        w.flag()
        w["scalar_ub_reads"] += 1
        if regime == "all_hit":
            w["scalar_gm_writes"] += 2
            return w, 0.0
        w.vec(4 * k)                                            # Cast to int32
        w.vec(4 * k, 2)                                         # BuildDense: two Duplicates
        w.flag()
        w["scalar_ub_reads"] += k
        w["scalar_ub_writes"] += 2 * (k - m)
    else:
        w.vec(4 * k, 3)                                         # ArithProgression, 2 Duplicates
        w.sort(k)                                               # the top-k
        w.sort(slots)                                           # the resident tokens
        w.flag()
        w["scalar_ub_reads"] += 2 * q["merge_steps"] + 2 * (k - m)
        w["scalar_ub_writes"] += 2 * (k - m)
    # the walk over the k positions: a read each; per miss the free-slot scan, the token, the
    # stale token (twice), two writes, three small-plan writes (first 64), two map writes (kept)
    w["scalar_ub_reads"] += k + q["scan"] + 3 * m
    w["scalar_ub_writes"] += 2 * m + 3 * min(m, SYNC_COPY_THRESHOLD) + (2 * m if kept else 0)
    if regime == "large":
        w.vec(2 * k)                                            # compact plan: Duplicate
        w.flag()
        w["scalar_ub_writes"] += k
    if m > 0:
        w.flag()
        w.dma_out(status_bytes)
    sync_copies = 0.0
    if regime == "small" and kept:                              # sparse plan: copied in MergeKv
        w.vec(256)
        w.flag()
        w["scalar_ub_writes"] += 2 * m + 5
        w["scalar_gm_writes"] += 2 * m
        w.vec(16)
        w.dma_out(256)
        w.dma_out(16)
        w.flag(2)
    elif regime == "small":                                     # copied here, one row at a time
        sync_copies = m
        w["scalar_gm_reads"] += 2 * m                           # the two block tables
        w.dma_in(latent_bytes, m)
        w.dma_in(row_bytes - latent_bytes, m)
        w.dma_out(latent_bytes, m)
        w.dma_out(row_bytes - latent_bytes, m)
        w.flag(2 * m + 1)
        if kept:
            w["scalar_gm_writes"] += 2 * m + 1
        elif direct:                                            # republish the whole map
            w.vec(2 * MEMBERSHIP_STRIDE_INT16)
            w.flag()
            w["scalar_ub_writes"] += k + 1
            w.dma_out(2 * MEMBERSHIP_STRIDE_INT16)
            w.flag()
        else:                                                   # mark the map unused
            w.vec(16)
            w["scalar_ub_writes"] += 1
            w.dma_out(16)
            w.flag(2)
    else:                                                       # the plan MergeKv copies
        w.vec(16)
        w.flag()
        w["scalar_ub_writes"] += 5
        w.dma_out(2 * k)
        w.dma_out(16)
        w.flag(2)
    w["scalar_gm_writes"] += 1                                  # selection kv length
    return w, float(sync_copies)


def matching_us(summary: Dict[str, Dict[str, float]], hw, context: int, k: int, slots: int,
                row_bytes: int = 1152, latent_bytes: int = 1024) -> Dict[str, float]:
    """Mean modelled us of one row-step's selection update (serial-pipe, as avsg's plan is
    priced) plus the host latency of its synchronous copies (one read in flight per row: each
    copy is waited for before the next), and the SyncAll that ends the phase; and the mean rows
    ``MergeKv`` copies during attention."""
    from . import hardware
    us, sync_rows = 0.0, 0.0
    for regime in REGIMES:
        q = summary[regime]
        if q["share"] == 0:
            continue
        work, sync = fused_counters(regime, q, context, k, slots, row_bytes, latent_bytes)
        t = hardware.launch_estimate(work, hw)["serial_pipe_us"] + sync * hw[
            "host_dma_latency_s"] * 1e6
        us += q["share"] * t
        sync_rows += q["share"] * sync
    us += hw["sync_all_cycles"] / (hw["clock_ghz"] * 1e3)
    return {"us_per_row": us, "sync_rows": sync_rows,
            "deferred_rows": deferred_misses(summary, context, k)}
