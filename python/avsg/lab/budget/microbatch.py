"""Two decode micro-batches: balanced by context (CMR), overlapped on two resources (OFMS).

A decode step runs, per layer and micro-batch ``b``, three tasks:

* ``pre[b]``    on the AI cores: the indexer scan (grows with the micro-batch's total context) and
  plan;
* ``gather[b]`` on the host link: the missed KV rows, host -> device;
* ``post[b]``   on the AI cores: sparse MLA, then the dense/MoE layer (weights read once per
  micro-batch).

``pre`` of a layer needs ``post`` of the previous layer (the hidden state), ``gather`` needs
``pre`` (the selection and plan) and ``post`` needs ``gather``. With one batch nothing overlaps.
With two, one micro-batch's gather can run while the other computes.

* :func:`cmr_split` -- KARAT's context-balanced split: requests sorted by context, descending,
  each to the micro-batch with the smaller total context so far.
* :func:`schedule` -- the step's makespan on the two resources. ``order="static"`` runs each
  resource's tasks in a fixed order (layer by layer, A before B; pre before post on the cores);
  ``order="ofms"`` starts, whenever a resource is free, the first task in that order that is ready,
  and falls back to waiting for the static order's next task only when none is.
"""
from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

__all__ = ["cmr_split", "arrival_split", "schedule"]


def cmr_split(contexts: Sequence[int]) -> Tuple[List[int], List[int]]:
    """Indices of the two micro-batches, balanced by aggregate context."""
    order = sorted(range(len(contexts)), key=lambda i: (-contexts[i], i))
    parts: Tuple[List[int], List[int]] = ([], [])
    load = [0, 0]
    for i in order:
        b = 0 if load[0] <= load[1] else 1
        parts[b].append(i)
        load[b] += contexts[i]
    return sorted(parts[0]), sorted(parts[1])


def arrival_split(n: int) -> Tuple[List[int], List[int]]:
    """The naive split: first half and second half of the batch, in arrival order."""
    return list(range((n + 1) // 2)), list(range((n + 1) // 2, n))


def schedule(layers: int, pre: Sequence[float], gather: Sequence[float], post: Sequence[float],
             order: str = "ofms") -> float:
    """Makespan of ``layers`` layers of one step for 1 or 2 micro-batches (per-layer task times)."""
    nb = len(pre)
    if not (nb == len(gather) == len(post)) or nb not in (1, 2):
        raise ValueError("pre, gather, post: expected one time per micro-batch, 1 or 2 of them")
    if order not in ("static", "ofms"):
        raise ValueError(f"order: expected 'static' or 'ofms', got {order!r}")
    # Tasks as (layer, kind, batch); each resource has its static order.
    core_seq = [(l, k, b) for l in range(layers) for k in ("pre", "post") for b in range(nb)]
    link_seq = [(l, "gather", b) for l in range(layers) for b in range(nb)]
    duration = {"pre": pre, "gather": gather, "post": post}
    done: Dict[Tuple[int, str, int], float] = {}

    def ready_at(task) -> float:
        """When the task's inputs are done (inf while a dependency has not been scheduled)."""
        l, kind, b = task
        dep = {"pre": (l - 1, "post", b), "gather": (l, "pre", b), "post": (l, "gather", b)}[kind]
        if dep[0] < 0:
            return 0.0
        return done.get(dep, float("inf"))

    queues = {"core": core_seq, "link": link_seq}
    free = {"core": 0.0, "link": 0.0}
    while queues["core"] or queues["link"]:
        # pick the resource/task that can start earliest under the chosen rule
        best = None
        for res, seq in queues.items():
            if not seq:
                continue
            if order == "static":
                candidates = seq[:1]
            else:
                # OFMS: the first task that is ready when the resource frees; else the static next
                # (later layers cannot be ready before this one's tasks: look at the head only)
                ready = [t for t in seq[:3 * nb] if ready_at(t) <= free[res]]
                candidates = ready[:1] or seq[:1]
            task = candidates[0]
            start = max(free[res], ready_at(task))
            if start == float("inf"):
                continue
            if best is None or start < best[0]:
                best = (start, res, task)
        if best is None:
            raise RuntimeError("schedule: dependency cycle (a bug)")
        start, res, task = best
        end = start + duration[task[1]][task[2]]
        done[task] = end
        free[res] = end
        queues[res].remove(task)
    return max(done.values()) if done else 0.0
