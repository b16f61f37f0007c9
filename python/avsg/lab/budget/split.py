"""Splitting a buffer budget between requests, and admitting them.

Every request ``i`` has a mandatory capacity ``m_i = T x K`` (a step's selections must all be
resident) and a utility curve ``u_i[j]``: expected hits per step at capacity ``m_i + j * granule``,
for ``j = 0 .. len(u_i) - 1`` (the last entry is the request's allocated maximum). Capacities move
in whole granules so the curves stay short.

* :func:`utility_split` -- greedy by marginal utility with lookahead (Qureshi and Patt's UCP): at
  each round every request offers the best *average* gain per granule over any extension that fits,
  which sees past the flat stretches of non-convex curves; the best offer is taken whole. Stops when
  the budget is spent or no extension gains anything.
* :func:`optimal_split` -- the exact optimum by dynamic programming (a multiple-choice knapsack),
  used to check the greedy one and to report its gap.
* :func:`admit` -- admission control: requests join in arrival order while every admitted request
  can keep its mandatory capacity.
"""
from __future__ import annotations

from typing import List, Sequence

import numpy as np

__all__ = ["utility_split", "optimal_split", "admit", "total_utility"]


def _check(mandatory: Sequence[int], curves: Sequence[np.ndarray], budget: int, granule: int):
    if granule < 1:
        raise ValueError(f"granule: expected >= 1, got {granule}")
    if len(mandatory) != len(curves):
        raise ValueError(f"curves: expected one per request ({len(mandatory)}), got {len(curves)}")
    for i, u in enumerate(curves):
        if np.asarray(u).ndim != 1 or len(u) < 1:
            raise ValueError(f"curves[{i}]: expected a non-empty 1-D utility curve")
    need = int(sum(mandatory))
    if need > budget:
        raise ValueError(f"budget: {budget} slots cannot hold the mandatory {need}")
    return (budget - need) // granule


def total_utility(curves: Sequence[np.ndarray], extra_granules: Sequence[int]) -> float:
    return float(sum(np.asarray(u, dtype=np.float64)[j] for u, j in zip(curves, extra_granules)))


def utility_split(mandatory: Sequence[int], curves: Sequence[np.ndarray], budget: int,
                  granule: int) -> List[int]:
    """Capacities (slots) per request by greedy marginal utility with lookahead."""
    left = _check(mandatory, curves, budget, granule)
    curves = [np.asarray(u, dtype=np.float64) for u in curves]
    extra = [0] * len(curves)

    def offer(i: int):
        """Request i's best average gain per granule over extensions that fit, and their length."""
        u, j = curves[i], extra[i]
        reach = min(len(u) - 1 - j, left)
        if reach <= 0:
            return 0.0, 0
        per = (u[j + 1:j + reach + 1] - u[j]) / np.arange(1, reach + 1)
        k = int(np.argmax(per)) + 1            # the first of equally good extensions: smallest
        return float(per[k - 1]), k

    offers = [offer(i) for i in range(len(curves))]
    while left > 0:
        best_i = max(range(len(curves)), key=lambda i: (offers[i][0], -i), default=-1)
        if best_i < 0 or offers[best_i][0] <= 0.0:
            break
        extra[best_i] += offers[best_i][1]
        left -= offers[best_i][1]
        # only the chosen request's offer changed, and offers that no longer fit the budget
        offers = [offer(i) if i == best_i or offers[i][1] > left else offers[i]
                  for i in range(len(curves))]
    return [int(m + j * granule) for m, j in zip(mandatory, extra)]


def optimal_split(mandatory: Sequence[int], curves: Sequence[np.ndarray], budget: int,
                  granule: int) -> List[int]:
    """The capacities that maximise total utility exactly (O(requests x granules^2))."""
    left = _check(mandatory, curves, budget, granule)
    n = len(curves)
    NEG = -np.inf
    best = np.zeros(left + 1)                      # best[b]: utility of requests so far with b granules
    choice = np.zeros((n, left + 1), dtype=np.int64)
    for i, u in enumerate(curves):
        u = np.asarray(u, dtype=np.float64)
        new = np.full(left + 1, NEG)
        for j in range(min(len(u), left + 1)):
            cand = np.full(left + 1, NEG)
            cand[j:] = best[:left + 1 - j] + u[j]
            better = cand > new
            new[better] = cand[better]
            choice[i, better] = j
        best = new
    b = int(np.argmax(best))
    extra = [0] * n
    for i in range(n - 1, -1, -1):
        extra[i] = int(choice[i, b])
        b -= extra[i]
    return [int(m + j * granule) for m, j in zip(mandatory, extra)]


def admit(running_mandatory: Sequence[int], waiting_mandatory: Sequence[int], budget: int,
          max_batch: int) -> int:
    """How many of the waiting requests (in arrival order) join: while all mandatories still fit."""
    used, batch, n = int(sum(running_mandatory)), len(running_mandatory), 0
    for m in waiting_mandatory:
        if batch + 1 > max_batch or used + m > budget:
            break
        used, batch, n = used + m, batch + 1, n + 1
    return n
