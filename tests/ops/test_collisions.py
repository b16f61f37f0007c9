"""Adversarial hashing: every selection shares one probe sequence, on full buffers.

Positions x0 + n*H*H have the same low and high hash limbs, hence identical probe sequences: at
most 4 of them fit in the table, the rest must go to the stash, and reservation must still
succeed with every invariant intact (docs/design.md §3, invariant 5).
"""
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
import torch

import avsg
from avsg import reference
from helpers.gather_cases import kv_zeros
from helpers.oracle import ContentOracle, PolicyModel
from helpers.oracle import check_index_consistent

# plan-only buffers hold no KV: track_copies=False keeps a plan's misses resident without
# a gather (what these tests specify); tests/ops/test_uncopied.py covers the tracking


def colliding_positions(buckets: int, count: int, offset: int = 0, base: int = 5):
    step = buckets * buckets
    pos = [base + (offset + n) * step for n in range(count)]
    assert pos[-1] < reference.MAX_POSITION
    return pos


def test_colliding_positions_share_one_probe_sequence():
    pos = torch.tensor(colliding_positions(64, 50), dtype=torch.int32)
    probes = reference.probe_buckets(pos, 64)
    assert (probes == probes[0]).all()
    assert probes[0].unique().numel() == reference.PROBES


@pytest.mark.parametrize("T,K,buckets", [(1, 64, 64), (2, 32, 64), (4, 16, 64), (1, 100, 128)])
def test_full_buffer_with_every_probe_colliding(T, K, buckets):
    S = T * K
    buf = avsg.SparseKVBuffer(policy="lifetime", rows=2, capacity=S, topk=K, queries_per_step=T, lifetime=2,
                              hash_buckets=buckets, track_copies=False)
    oracle, model = ContentOracle(2, S), PolicyModel(2, S, 2)
    seq = torch.full((2,), reference.MAX_POSITION, dtype=torch.int32)
    # a paged pool: position base + n*H*H lives in column n of the block table
    block_size = 4096
    pool = torch.randn(8, block_size, 2, dtype=torch.float64)
    columns = torch.arange(reference.MAX_POSITION // block_size)
    block_table = torch.stack([columns % 8, (columns + 3) % 8]).to(torch.int32)
    device_kv = kv_zeros(2, S, 2, dtype=torch.float64)
    for step, offset in enumerate([0, 0, S, 0, 3 * S // 2, 3 * S // 2]):
        # each query token takes its own slice; row 1 repeats row 0's first token in all tokens
        pos = torch.tensor(colliding_positions(buckets, S, offset), dtype=torch.int32)
        topk = torch.stack([pos.view(T, K), pos[:K].expand(T, K)])
        plan = buf.plan(topk, seq)
        for got, want in zip(plan[:4], model.plan(topk, seq)):
            assert torch.equal(got, want)
        oracle.step(topk, seq, plan)
        v = reference.view_state(buf.state, buf.layout)
        # every resident position collides: 4 are indexed by the table, the rest stashed
        for r in range(2):
            assert int(v.stash_count[r]) == len(buf.resident(r)) - reference.PROBES
        assert len(buf.resident(0)) == S
        if step == 1:
            assert int(plan.miss_counts.sum()) == 0, "resident colliding positions must hit"
        avsg.gather(plan, pool, device_kv, block_table=block_table, block_size=block_size)
        for r in range(2):
            for p, s in zip(topk[r].flatten().tolist(), plan.slots[r].flatten().tolist()):
                want = pool[int(block_table[r, p // block_size]), p % block_size]
                assert torch.equal(device_kv[r, s], want)


def test_stash_survives_invalidate_and_reset():
    buckets, K = 64, 64
    buf = avsg.SparseKVBuffer(policy="lifetime", rows=1, capacity=K, topk=K, lifetime=3, hash_buckets=buckets,
                              track_copies=False)
    model, oracle = PolicyModel(1, K, 3), ContentOracle(1, K)
    seq = torch.full((1,), reference.MAX_POSITION, dtype=torch.int32)
    pos = torch.tensor(colliding_positions(buckets, K), dtype=torch.int32).view(1, 1, K)
    cut = torch.tensor([int(pos[0, 0, K // 2])], dtype=torch.int32)
    for action in ["plan", "invalidate", "plan", "plan", "reset", "plan"]:
        if action == "plan":
            plan = buf.plan(pos, seq)
            for got, want in zip(plan[:4], model.plan(pos, seq)):
                assert torch.equal(got, want)
            oracle.step(pos, seq, plan)
        elif action == "invalidate":
            buf.invalidate(cut)
            model.invalidate(cut)
            oracle.invalidate(cut)
        else:
            buf.reset()
            model.reset([0])
            oracle.reset([0])
        assert buf.resident(0) == oracle.resident(0)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, 3), st.integers(1, 4), st.sampled_from([4, 8, 16]),
       st.sampled_from([1.0, 2.0]), st.integers(1, 6), st.integers(1, 3),
       st.lists(st.sampled_from(["plan"] * 5 + ["invalidate", "reset"]), min_size=2, max_size=14),
       st.integers(0, 2**31 - 1))
def test_random_sessions_in_few_collision_families(R, T, K, ratio, lifetime, families, ops, seed):
    """Positions from 1-3 families with identical probe sequences, so the stash is always busy,
    through invalidation (which leaves stale entries that a re-fetch could revive) and reset."""
    S = max(T * K, int(T * K * ratio))
    buckets = 64 if S <= 64 else 128
    gen = torch.Generator().manual_seed(seed)
    buf = avsg.SparseKVBuffer(policy="lifetime", rows=R, capacity=S, topk=K, queries_per_step=T, lifetime=lifetime,
                              hash_buckets=buckets, track_copies=False)
    oracle, model = ContentOracle(R, S), PolicyModel(R, S, lifetime)
    family = torch.tensor([colliding_positions(buckets, 3 * S, base=b) for b in (5, 9, 77)][:families])
    seq = torch.full((R,), reference.MAX_POSITION, dtype=torch.int32)
    for op in ops:
        if op == "plan":
            topk = torch.full((R, T, K), -1, dtype=torch.int32)
            for r in range(R):
                for t in range(T):
                    pick = torch.randperm(family.numel(), generator=gen)[:K]
                    topk[r, t] = family.flatten()[pick].to(torch.int32)
            plan = buf.plan(topk, seq)
            for got, want in zip(plan[:4], model.plan(topk, seq)):
                assert torch.equal(got, want)
            oracle.step(topk, seq, plan)
        elif op == "invalidate":
            cut = family.flatten()[torch.randint(0, family.numel(), (R,), generator=gen)]
            cut = cut.to(torch.int32)
            buf.invalidate(cut)
            model.invalidate(cut)
            oracle.invalidate(cut)
        else:
            buf.reset([0])
            model.reset([0])
            oracle.reset([0])
        check_index_consistent(buf, after_plan=(op == "plan"))
        for r in range(R):
            assert buf.resident(r) == oracle.resident(r)
            assert int(reference.view_state(buf.state, buf.layout).stash_count[r]) <= S
