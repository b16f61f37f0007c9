"""The lru residency policy (exact least recently used at step granularity, the reference point
for the others): hand-checked victims, and the kernel against an independent sort-based model.

Bit-exactness with the reference on random sessions, invalidate/reset and the largest geometry
is in test_kernel_plan.py; corrupted lru state in test_state_safety.py.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import avsg
from avsg.backend import emulation

# plan-only buffers hold no KV: track_copies=False keeps a plan's misses resident without
# a gather (what these tests specify); tests/ops/test_uncopied.py covers the tracking

I32 = torch.int32


def test_least_recently_used_goes_first_ties_by_slot():
    buf = avsg.SparseKVBuffer(rows=1, capacity=4, topk=2, policy="lru", track_copies=False)
    seq = torch.tensor([16], dtype=I32)

    def step(a, b):
        return buf.plan(torch.tensor([[[a, b]]], dtype=I32), seq)

    step(1, 2)                                   # slots 0, 1
    step(3, 4)                                   # free slots first: 2, 3
    plan = step(1, 5)                            # 2 (age 2) is older than 3, 4 (age 1)
    assert int(plan.slots[0, 0, 1]) == 1 and sorted(buf.resident(0)) == [1, 3, 4, 5]
    plan = step(3, 6)                            # 4 (age 2) goes; 1 and 5 were used later
    assert int(plan.slots[0, 0, 1]) == 3 and sorted(buf.resident(0)) == [1, 3, 5, 6]
    plan = step(7, 8)                            # 1 and 5 tie at age 2: both go, 7 -> slot 0
    assert plan.slots[0, 0].tolist() == [0, 1] and sorted(buf.resident(0)) == [3, 6, 7, 8]
    buf.check_state()


def test_lru_needs_no_context_and_rejects_a_reuse_state():
    buf = avsg.SparseKVBuffer(rows=1, capacity=8, topk=2, policy="lru", track_copies=False)
    assert buf.max_context is None
    other = avsg.SparseKVBuffer(rows=1, capacity=8, topk=2, policy="lifetime", track_copies=False)
    with pytest.raises(ValueError, match="policy"):
        torch.ops.avsg.plan(torch.zeros(1, 1, 2, dtype=I32), torch.tensor([4], dtype=I32),
                            other.state, other.stats_counts, 8, buf.hash_buckets, buf.lifetime, 2, 0)


def model_hits(sel: np.ndarray, capacity: int) -> np.ndarray:
    """Independent model: full sort of (last use step, slot), free slots first; misses ascending
    by position into the victims ascending by slot. Ages saturate at 1023 in the op; the slice
    below is shorter, so this model needs no saturation."""
    steps, K = sel.shape
    pos_slot = np.full(int(sel.max()) + 1, -1)
    slot_pos = np.full(capacity, -1)
    last = np.full(capacity, -(1 << 40), np.int64)
    hits = np.zeros(steps, np.int64)
    for t in range(steps):
        u = sel[t]
        s_of = pos_slot[u]
        hit = s_of >= 0
        hits[t] = hit.sum()
        last[s_of[hit]] = t
        miss = u[~hit]
        if miss.size:
            key = np.where(slot_pos < 0, -(1 << 50), last)
            key[s_of[hit]] = 1 << 50
            victims = np.sort(np.lexsort((np.arange(capacity), key))[:miss.size])
            old = slot_pos[victims]
            pos_slot[old[old >= 0]] = -1
            slot_pos[victims] = miss
            pos_slot[miss] = victims
            last[victims] = t
    return hits


@pytest.mark.parametrize("build", ["strict", "fast"])
def test_kernel_matches_an_independent_model_on_the_full_trace(build):
    from avsg.lab.traces.format import load_trace
    from avsg.lab.traces.lookup import shipped_trace
    trace = load_trace(shipped_trace("asyncio_32k"), check_values=False)
    sel = trace.sel[[16], :200].astype(np.int64)
    S, K = 2560, sel.shape[2]
    buf = avsg.SparseKVBuffer(rows=1, capacity=S, topk=K, policy="lru", check=False,
                              track_copies=False)
    got = []
    with emulation(build):
        for t in range(sel.shape[1]):
            plan = buf.plan(torch.from_numpy(sel[:, t]).to(I32).view(1, 1, K),
                            torch.tensor([trace.T], dtype=I32))
            got.append(K - int(plan.miss_counts[0]))
    assert np.array_equal(np.array(got), model_hits(sel[0], S))
