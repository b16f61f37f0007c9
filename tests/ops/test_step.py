"""``SparseKVBuffer.step``: one call per decode layer (drop + plan + the caller's copy).

* It is ``invalidate`` + ``plan`` + ``gather`` in one hold: on random and adversarial sequences
  (MTP with repeats, ``-1`` padding, drops at and below the selections, full buffers, every
  policy) two buffers, one driven by ``step`` and one by the three calls, keep the same state,
  statistics, plans and KV bytes, and every selection reads the host's bytes.
* A copy that raises leaves none of the plan's misses resident: a later step misses them again
  and reads exact bytes, and the error says what was dropped.
* Bad arguments name the argument and change nothing.
"""
from __future__ import annotations

import random

import pytest
import torch

import avsg
from avsg.buffer import copy_misses
from helpers.gather_cases import kv_zeros

I32 = torch.int32
R, T, K, S, D = 3, 2, 6, 16, 4
MAX_LEN = 48
POLICIES = ("lifetime", "reuse", "lru")


def make_buffer(policy):
    extra = {"max_context": MAX_LEN} if policy == "reuse" else {}
    return avsg.SparseKVBuffer(rows=R, capacity=S, topk=K, queries_per_step=T, policy=policy,
                               **extra)


def random_step(rng: random.Random, length: int):
    """[R, T, K] top-k (distinct per query token, -1 padded, repeats across the T tokens) and
    a drop limit per row (often none, sometimes inside the window)."""
    topk = torch.full((R, T, K), -1, dtype=I32)
    for r in range(R):
        for t in range(T):
            n = rng.randint(0, K)
            low = max(0, length - rng.choice((8, 16, 40)))
            picked = rng.sample(range(low, length), min(n, length - low))
            for k, pos in zip(rng.sample(range(K), len(picked)), picked):
                topk[r, t, k] = pos
    drop = torch.tensor([rng.choice((MAX_LEN, MAX_LEN, length - rng.randint(0, 6), 0))
                         for _ in range(R)], dtype=I32)
    return topk, torch.full((R,), length, dtype=I32), drop


def assert_reads_host(plan, topk, host, kv):
    for r, t, k in (topk >= 0).nonzero().tolist():
        slot = int(plan.slots[r, t, k])
        assert torch.equal(kv[r, slot], host[r, int(topk[r, t, k])]), (r, t, k)


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("seed", range(4))
def test_step_is_invalidate_plan_gather(policy, seed):
    rng = random.Random(seed)
    one, three = make_buffer(policy), make_buffer(policy)
    host = torch.randn(R, MAX_LEN, D)
    kv_one, kv_three = kv_zeros(R, S, D), kv_zeros(R, S, D)
    length = 12
    for step in range(30):
        length = min(MAX_LEN, length + rng.randint(0, 2))
        topk, seq, drop = random_step(rng, length)
        if step % 7 == 3:
            host[:, length - 3:length] = torch.randn(R, 3, D)   # rewritten: dropped below
            drop = torch.full((R,), length - 3, dtype=I32)
        plan = one.step(topk, seq, lambda p: copy_misses(p, host, kv_one), drop_from=drop)
        three.invalidate(drop)
        ref = three.plan(topk, seq)
        avsg.gather(ref, host, kv_three)
        for field in ("slots", "miss_pos", "miss_slots", "miss_counts"):
            assert torch.equal(getattr(plan, field), getattr(ref, field)), (step, field)
        assert torch.equal(one.state, three.state), step
        assert torch.equal(one.stats_counts, three.stats_counts), step
        assert torch.equal(kv_one, kv_three), step
        assert_reads_host(plan, topk, host, kv_one)
    one.check_state()


@pytest.mark.parametrize("policy", POLICIES)
def test_full_buffer_every_slot_replaced(policy):
    """Each step selects T*K positions none of which is resident: every slot is a miss."""
    buf = make_buffer(policy)
    host = torch.randn(R, MAX_LEN, D)
    kv = kv_zeros(R, S, D)
    seq = torch.full((R,), MAX_LEN, dtype=I32)
    for step in range(MAX_LEN // (T * K)):
        topk = (torch.arange(T * K, dtype=I32) + step * T * K).view(1, T, K).repeat(R, 1, 1)
        plan = buf.step(topk, seq, lambda p: copy_misses(p, host, kv))
        assert int(plan.miss_counts.sum()) == R * T * K
        assert_reads_host(plan, topk, host, kv)


@pytest.mark.parametrize("policy", POLICIES)
def test_a_failed_copy_drops_the_plan(policy):
    buf = make_buffer(policy)
    host = torch.randn(R, MAX_LEN, D)
    kv = kv_zeros(R, S, D)
    rng = random.Random(5)
    topk, seq, _ = random_step(rng, 30)
    topk[0, 0, 0] = 29                       # at least one miss

    def broken(plan):
        raise RuntimeError("copy engine fault")
    with pytest.raises(RuntimeError, match="copy engine fault") as caught:
        buf.step(topk, seq, broken)
    assert any("dropped this plan's misses" in note for note in caught.value.__notes__)
    assert all(not buf.resident(r) for r in range(R)), "a reserved, never copied slot stayed"
    plan = buf.step(topk, seq, lambda p: copy_misses(p, host, kv))
    # nothing was resident: every distinct position of a row is a miss again
    distinct = [len({p for p in topk[r].flatten().tolist() if p >= 0}) for r in range(R)]
    assert plan.miss_counts.tolist() == distinct
    assert_reads_host(plan, topk, host, kv)
    buf.check_state()


def test_bad_arguments_name_themselves_and_touch_nothing():
    buf = make_buffer("lifetime")
    host = torch.randn(R, MAX_LEN, D)
    kv = kv_zeros(R, S, D)
    topk, seq, drop = random_step(random.Random(2), 20)
    buf.step(topk, seq, lambda p: copy_misses(p, host, kv))
    state, generation = buf.state.clone(), buf._generation
    cases = ((dict(topk_pos=topk[:, :1]), ValueError, "topk_pos"),
             (dict(seq_lens=seq.long()), TypeError, "seq_lens"),
             (dict(drop_from=drop[:2]), ValueError, "drop_from"),
             (dict(copy=None), TypeError, "copy"))
    for change, error, name in cases:
        args = dict(topk_pos=topk, seq_lens=seq, copy=lambda p: copy_misses(p, host, kv),
                    drop_from=drop)
        args.update(change)
        with pytest.raises(error, match=name):
            buf.step(**args)
        assert torch.equal(buf.state, state) and buf._generation == generation, name


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("seed", range(2))
def test_step_with_the_packages_own_copy_is_one_launch_of_the_same_result(policy, seed):
    """``copy=avsg.MissCopy(...)``: the plan and the copy in one ``plan_gather`` launch, with the
    state, statistics, plans and KV bytes of ``step`` with ``copy_misses`` as its copy."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.namespace == "avsg":
                self.names.append(func._schema.name.split("::")[1])
            return func(*args, **(kwargs or {}))

    rng = random.Random(50 + seed)
    fused, apart = make_buffer(policy), make_buffer(policy)
    host = torch.randn(R, MAX_LEN, D)
    kv_fused, kv_apart = kv_zeros(R, S, D), kv_zeros(R, S, D)
    length = 12
    for step in range(20):
        length = min(MAX_LEN, length + rng.randint(0, 2))
        topk, seq, drop = random_step(rng, length)
        with Ops() as ops:
            plan = fused.step(topk, seq, avsg.MissCopy(host, kv_fused, num_cores=1 + step % 4),
                              drop_from=drop)
        assert ops.names == ["plan_gather"]
        ops.names.clear()
        ref = apart.step(topk, seq, lambda p: copy_misses(p, host, kv_apart, num_cores=2),
                         drop_from=drop)
        for field in ("slots", "miss_pos", "miss_slots", "miss_counts"):
            assert torch.equal(getattr(plan, field), getattr(ref, field)), (step, field)
        assert torch.equal(fused.state, apart.state), step
        assert torch.equal(fused.stats_counts, apart.stats_counts), step
        assert torch.equal(kv_fused, kv_apart), step
        assert_reads_host(plan, topk, host, kv_fused)
    assert fused._uncopied is None          # copied in its own launch: nothing left to drop
    fused.check_state()


def test_a_bad_miss_copy_names_itself_and_touches_nothing():
    buf = make_buffer("lifetime")
    host = torch.randn(R, MAX_LEN, D)
    kv = kv_zeros(R, S, D)
    topk, seq, drop = random_step(random.Random(3), 20)
    buf.step(topk, seq, avsg.MissCopy(host, kv))
    state, generation, before = buf.state.clone(), buf._generation, kv.clone()
    cases = ((avsg.MissCopy(host, kv_zeros(R, S + 1, D)), ValueError, r"copy\.dst\[0\]"),
             (avsg.MissCopy(host.double(), kv), TypeError, r"copy\.src\[0\]"),
             (avsg.MissCopy([host, host], kv), ValueError, "copy.src/copy.dst"),
             (avsg.MissCopy(host, kv, num_cores=0), ValueError, "num_cores"),
             (avsg.MissCopy(host, kv, block_size=4), ValueError, "block_size"))
    for copy, error, name in cases:
        with pytest.raises(error, match=name):
            buf.step(topk, seq, copy, drop_from=drop)
        assert torch.equal(buf.state, state) and buf._generation == generation, name
        assert torch.equal(kv, before), name


def test_plan_gather_copies_beside_the_rows_owners_by_default():
    """MissCopy without num_cores: the fused step copies on the cores its plan leaves while the
    rows take at most half of them (their owners finish the rows meanwhile), else on all."""
    from avsg.buffer import copy_cores_beside_plan
    assert [copy_cores_beside_plan(40, rows) for rows in (1, 8, 20, 21, 64)] == [39, 32, 20, 40, 40]
