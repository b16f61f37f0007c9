"""The hit/miss split of a plan (``reference.split_slots``, ``avsg.split_slots``).

* Against a plain-Python oracle of the rule (a valid selection is a miss exactly when its slot is
  one of its row's miss slots; valid entries first, in selection order, then -1) on plans of the
  op library on random and adversarial sessions: MTP repeats across and within query tokens, -1
  padding, out-of-range junk, drops, full buffers, all three policies.
* Against what the split means: a selection is a hit exactly when its position was resident
  (``SparseKVBuffer.resident``) before the step, and then it reads that slot; a miss's slot is
  filled by the step's copy (the row's miss list).
* The edge cases by name: all hits (the same top-k twice), all misses (a fresh row), a full
  buffer, an MTP position missed by token 0 and selected by token 1 (a miss for both).
* Hand-made outputs (stale entries past miss_counts, slots out of range) mark nothing.
"""
from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings, strategies as st

import avsg
from avsg import reference
from helpers.plan_cases import draw

I32 = torch.int32
POLICIES = ("lifetime", "reuse", "lru")


def oracle(slots, miss_slots, miss_counts, capacity):
    """The rule, one selection at a time."""
    R, T, K = slots.shape
    hits = [[[-1] * K for _ in range(T)] for _ in range(R)]
    misses = [[[-1] * K for _ in range(T)] for _ in range(R)]
    for r in range(R):
        n = min(max(int(miss_counts[r]), 0), miss_slots.shape[1])
        filled = {int(s) for s in miss_slots[r, :n].tolist() if 0 <= s < capacity}
        for t in range(T):
            h = [s for s in slots[r, t].tolist() if 0 <= s < capacity and s not in filled]
            m = [s for s in slots[r, t].tolist() if 0 <= s < capacity and s in filled]
            hits[r][t][:len(h)] = h
            misses[r][t][:len(m)] = m
    return torch.tensor(hits, dtype=I32), torch.tensor(misses, dtype=I32)


def check_step(buf, topk, seq, drop_from=None):
    """One ``step``; the split against the oracle and against residency before the step."""
    R, T, K = topk.shape
    bound = seq.clamp(max=buf.max_context or reference.MAX_POSITION)
    before = []
    for r in range(R):
        held = buf.resident(r)
        if drop_from is not None:
            held = {p: s for p, s in held.items() if p < int(drop_from[r])}
        before.append(held)
    plan = buf.step(topk, seq, copy=lambda p: None, drop_from=drop_from)
    split = avsg.split_slots(plan)
    want_h, want_m = oracle(plan.slots, plan.miss_slots, plan.miss_counts, buf.capacity)
    assert split.hits.dtype == I32 and split.misses.dtype == I32
    assert torch.equal(split.hits, want_h) and torch.equal(split.misses, want_m)
    # what it means
    for r in range(R):
        filled = set(plan.miss_slots[r, :int(plan.miss_counts[r])].tolist())
        for t in range(T):
            h, m = [], []
            for k in range(K):
                p = int(topk[r, t, k])
                if not 0 <= p < int(bound[r]):
                    continue
                if p in before[r]:
                    h.append(before[r][p])
                    assert int(plan.slots[r, t, k]) == before[r][p]
                else:
                    m.append(int(plan.slots[r, t, k]))
                    assert m[-1] in filled
            assert split.hits[r, t, :len(h)].tolist() == h
            assert split.misses[r, t, :len(m)].tolist() == m
            assert bool((split.hits[r, t, len(h):] == -1).all())
            assert bool((split.misses[r, t, len(m):] == -1).all())
    return plan, split


@settings(max_examples=25, deadline=None)
@given(R=st.integers(1, 3), T=st.integers(1, 4), K=st.sampled_from([1, 3, 8, 13, 32]),
       fill=st.sampled_from([1.0, 1.0, 1.5, 3.0]), policy=st.sampled_from(POLICIES),
       seed=st.integers(0, 2**31 - 1))
def test_split_matches_oracle_on_random_sessions(R, T, K, fill, policy, seed):
    S = max(T * K, int(T * K * fill))
    extra = {"max_context": 8 * S + 64} if policy == "reuse" else {}
    buf = avsg.SparseKVBuffer(rows=R, capacity=S, topk=K, queries_per_step=T, policy=policy,
                              check=False, **extra)
    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    seq = torch.randint(1, 4 * S + 8, (R,), generator=gen, dtype=I32)
    for _ in range(5):
        seq = seq + torch.randint(0, T + 1, (R,), generator=gen, dtype=I32)
        topk = draw(gen, R, T, K, seq, hot=2 * T * K)
        drop = None
        if rng.random() < 0.3:
            drop = (seq - torch.randint(-2, T + 3, (R,), generator=gen, dtype=I32)).clamp(min=0)
        check_step(buf, topk, seq, drop)


@pytest.mark.parametrize("policy", POLICIES)
def test_all_misses_then_all_hits_on_a_full_buffer(policy):
    R, T, K = 2, 2, 8
    S = T * K                                                 # full: every slot is used
    extra = {"max_context": 1024} if policy == "reuse" else {}
    buf = avsg.SparseKVBuffer(rows=R, capacity=S, topk=K, queries_per_step=T, policy=policy,
                              **extra)
    topk = torch.arange(R * T * K, dtype=I32).view(R, T, K) + 3
    seq = torch.full((R,), 200, dtype=I32)
    _, split = check_step(buf, topk, seq)
    assert bool((split.hits == -1).all())                     # a fresh row: all misses
    assert torch.equal(split.misses.sort(-1).values, _plan_slots(buf, topk).sort(-1).values)
    _, split = check_step(buf, topk, seq)
    assert bool((split.misses == -1).all())                   # the same top-k: all hits
    assert bool((split.hits >= 0).all())


def _plan_slots(buf, topk):
    return torch.tensor([[[buf.resident(r)[int(p)] for p in topk[r, t]]
                          for t in range(topk.shape[1])] for r in range(topk.shape[0])], dtype=I32)


def test_mtp_tokens_share_their_misses():
    """Position 40 is missed for token 0 and selected again by token 1: a miss for both (token
    1 cannot read it before the copy either); position 7 was resident: a hit for both."""
    buf = avsg.SparseKVBuffer(rows=1, capacity=8, topk=3, queries_per_step=2)
    seq = torch.tensor([64], dtype=I32)
    check_step(buf, torch.tensor([[[7, -1, -1], [-1, -1, -1]]], dtype=I32), seq)
    plan, split = check_step(buf, torch.tensor([[[7, 40, -1], [40, 7, 41]]], dtype=I32), seq)
    s7, s40, s41 = (int(plan.slots[0, 0, 0]), int(plan.slots[0, 0, 1]), int(plan.slots[0, 1, 2]))
    assert split.hits.tolist() == [[[s7, -1, -1], [s7, -1, -1]]]
    assert split.misses.tolist() == [[[s40, -1, -1], [s40, s41, -1]]]


def test_hand_made_outputs_mark_only_the_counted_misses():
    """Stale entries past miss_counts, negative or out-of-range slots mark nothing; a slot out
    of range in ``slots`` is neither a hit nor a miss."""
    slots = torch.tensor([[[0, 1, 2, 3, 9, -1]]], dtype=I32)
    miss_slots = torch.tensor([[1, 3, 2, 9, -4, 0]], dtype=I32)
    for count, want_m in [(2, [1, 3]), (0, []), (-3, []), (99, [0, 1, 2, 3])]:
        split = reference.split_slots(slots, miss_slots, torch.tensor([count], dtype=I32), 4)
        want_h = [s for s in [0, 1, 2, 3] if s not in want_m]
        assert split.misses[0, 0].tolist() == want_m + [-1] * (6 - len(want_m))
        assert split.hits[0, 0].tolist() == want_h + [-1] * (6 - len(want_h))
        got = oracle(slots, miss_slots, torch.tensor([count], dtype=I32), 4)
        assert torch.equal(split.hits, got[0]) and torch.equal(split.misses, got[1])


def test_split_of_moves_is_refused():
    buf = avsg.SparseKVBuffer(rows=1, capacity=8, topk=2)
    moves = buf.resize(torch.tensor([0]), torch.tensor([4]))
    with pytest.raises(ValueError, match="plan"):
        avsg.split_slots(moves)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_split_is_traceable_without_host_sync():
    """Fixed shapes and no data-dependent Python: torch.jit.trace of the split replays on other
    outputs of the same shape."""
    slots = torch.tensor([[[0, 1, 2], [2, 3, -1]]], dtype=I32)
    miss = torch.tensor([[2, 3, -1, -1, -1, -1]], dtype=I32)
    fn = torch.jit.trace(lambda a, b, c: tuple(reference.split_slots(a, b, c, 4)),
                         (slots, miss, torch.tensor([2], dtype=I32)), check_trace=False)
    other = torch.tensor([[[3, 0, -1], [1, 0, 2]]], dtype=I32)
    miss2 = torch.tensor([[0, -1, -1, -1, -1, -1]], dtype=I32)
    got = fn(other, miss2, torch.tensor([1], dtype=I32))
    want = oracle(other, miss2, torch.tensor([1], dtype=I32), 4)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
