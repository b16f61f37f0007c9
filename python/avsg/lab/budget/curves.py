"""Miss curves: how many of a request's selections a buffer of ``c`` slots would hit, for every c.

Two sources, both over one request's selection stream (one trace row: ``[steps, K]`` positions,
``-1`` padding):

* :func:`stack_distances` -- exact. Per step, the LRU stack distance of every selected position
  before the step: how many distinct positions were used more recently (ties within a step go to
  the smaller position first, as the trace lab's exact LRU). A selection hits an LRU buffer whose
  resident set is the top ``P`` of the recency stack iff its distance is ``< P``.
* :class:`SampledCurve` -- online, cheap (UMON-style sampled ghost tags): only positions whose hash
  falls in one of ``1/rate`` classes are tracked, in a shadow recency stack of tags without data;
  a sampled distance ``d`` stands for ``d / rate`` real positions. The histogram of scaled distances
  gives the hit rate at any capacity. Counts are halved every ``half_life`` steps so the curve
  follows a request's phases. With ``rate = 1`` it is exact.

:class:`ElasticLRU` runs an LRU buffer whose capacity changes between steps from the exact
distances alone. The resident set of LRU is always a prefix of the recency stack (hits move an
entry to the top, misses enter at the top, eviction and shrinking take the bottom), so one integer
``P`` (the prefix length) is the whole state: before a step ``P = min(P, capacity)``, a selection
hits iff its distance is ``< P``, and after it ``P = min(capacity, P + misses)``.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

__all__ = ["stack_distances", "ElasticLRU", "SampledCurve", "lru_hits_at"]

NEVER = np.iinfo(np.int32).max  # distance of a position never used before


def _valid_sorted(step_sel: np.ndarray) -> np.ndarray:
    p = np.asarray(step_sel, dtype=np.int64)
    return np.unique(p[p >= 0])


def stack_distances(sel: np.ndarray, context: int) -> list:
    """Per step, the sorted LRU stack distances of its unique selections (``NEVER`` = first use).

    ``sel`` is ``[steps, K]`` (or ``[steps, Tq, K]``, query tokens merged), positions in
    ``[0, context)``. Returns a list of int32 arrays, one per step, ascending.
    """
    sel = np.asarray(sel)
    if sel.ndim == 3:
        sel = sel.reshape(sel.shape[0], -1)
    if sel.ndim != 2:
        raise ValueError(f"sel: expected [steps, K] or [steps, Tq, K], got shape {tuple(sel.shape)}")
    # Recency key: (last step used, position); larger = more recent. -1 = never used.
    key = np.full(context, -1, dtype=np.int64)
    out = []
    for s in range(sel.shape[0]):
        pos = _valid_sorted(sel[s])
        if pos.size and (pos[0] < 0 or pos[-1] >= context):
            raise ValueError(f"sel: step {s} selects a position outside [0, {context})")
        seen = np.sort(key[key >= 0])
        k = key[pos]
        dist = np.full(pos.size, NEVER, dtype=np.int64)
        used = k >= 0
        # distance = how many seen keys are larger than this position's key
        dist[used] = seen.size - np.searchsorted(seen, k[used], side="right")
        out.append(np.sort(dist).astype(np.int32))
        key[pos] = s * context + pos
    return out


def lru_hits_at(distances: Sequence[np.ndarray], capacity: int) -> np.ndarray:
    """Hits per step of a fixed-capacity LRU buffer that starts empty (the trace lab's exact LRU)."""
    lru = ElasticLRU()
    return np.array([lru.step(d, capacity) for d in distances], dtype=np.int64)


class ElasticLRU:
    """An LRU buffer whose capacity may change before any step; the state is the resident prefix."""

    def __init__(self) -> None:
        self.prefix = 0

    def step(self, distances: np.ndarray, capacity: int) -> int:
        """One step at ``capacity`` (>= the step's selections); returns its hits."""
        if capacity < distances.size:
            raise ValueError(f"capacity: {capacity} is below the step's {distances.size} selections")
        self.prefix = min(self.prefix, capacity)        # shrinking evicts the least recent
        hits = int(np.searchsorted(distances, self.prefix, side="left"))
        self.prefix = min(capacity, self.prefix + distances.size - hits)
        return hits


class SampledCurve:
    """Online hit-rate estimate at many capacities from sampled ghost tags (see module docstring).

    ``update(step_positions)`` once per decode step; ``hit_rate(capacities)`` at any time.
    """

    def __init__(self, context: int, rate: float = 1 / 16, max_capacity: int = 65536,
                 half_life: int = 256, seed: int = 0x9E3779B1) -> None:
        if not 0 < rate <= 1:
            raise ValueError(f"rate: expected in (0, 1], got {rate}")
        # one position in `period` is tracked, so the rate actually sampled is 1 / period
        period = max(1, int(round(1.0 / rate)))
        self.rate = 1.0 / period
        # Set sampling by a multiplicative hash of the position: the same positions are always
        # tracked, so their recency is exact among themselves.
        pos = np.arange(context, dtype=np.uint64)
        h = (pos * np.uint64(seed)) & np.uint64(0xFFFFFFFF)
        self.sampled = (h % np.uint64(period)) == 0 if period > 1 else np.ones(context, bool)
        self.key = np.full(context, -1, dtype=np.int64)
        self.context = context
        self.bins = np.zeros(int(np.ceil(max_capacity * self.rate)) + 2, dtype=np.float64)
        self.lookups = 0.0
        self.half_life = half_life
        self.steps = 0

    def update(self, step_positions: np.ndarray) -> None:
        pos = _valid_sorted(step_positions)
        pos = pos[self.sampled[pos]]
        seen = np.sort(self.key[self.key >= 0])
        k = self.key[pos]
        used = k >= 0
        d = seen.size - np.searchsorted(seen, k[used], side="right")
        # A sampled distance beyond the tracked range lands in the last bin (never a hit).
        np.add.at(self.bins, np.minimum(d, self.bins.size - 1), 1.0)
        self.bins[-1] += np.count_nonzero(~used)
        self.lookups += pos.size
        self.key[pos] = self.steps * self.context + pos
        self.steps += 1
        if self.half_life and self.steps % self.half_life == 0:
            self.bins *= 0.5
            self.lookups *= 0.5

    def hit_rate(self, capacities: Sequence[int]) -> np.ndarray:
        """Estimated steady-state LRU hit rate at each capacity (0 before any lookup)."""
        caps = np.asarray(capacities, dtype=np.float64)
        if self.lookups <= 0:
            return np.zeros(caps.shape)
        cum = np.concatenate([[0.0], np.cumsum(self.bins[:-1])])
        # a sampled distance d hits capacity c iff d < c * rate
        idx = np.clip(np.ceil(caps * self.rate).astype(np.int64), 0, cum.size - 1)
        return cum[idx] / self.lookups
