"""The split_slots kernel (op_kernel/split_slots_kernel.h) against ``reference.split_slots``, bit for
bit, in both emulation builds.

* random inputs (hypothesis): slots drawn from ``[-3, S + 3)`` with -1 padding and repeats within
  and across query tokens (MTP), miss lists of slots in and out of range, stale entries past the
  count and counts from below 0 to past ``T*K``; several chunks per token (K past the kernel's
  1024-lane chunk);
* adversarial inputs by name: int32 extremes in every input, all hits, all misses, full buffers,
  capacity 1 and the largest capacity, rows over more cores than there are (R > cores), R = 1;
* a real buffer's plan outputs (rows padded to 32 B, counts at a stride of 8) through
  ``avsg.split_slots``, which is this one op and nothing else;
* bad arguments: the error names the argument.
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st

import avsg
from avsg import _ops, backend, reference
from helpers.plan_cases import draw

I32 = torch.int32
BUILDS = ("strict", "fast")
INT32_MIN, INT32_MAX = -2**31, 2**31 - 1
CHUNK = 1024          # op_host/split_slots_tiling.h: kSplitChunk (lanes per vector pass)
MAX_CAPACITY = 32768  # kSplitMaxCapacity


@pytest.fixture(autouse=True)
def strict_after_each_test():
    yield
    backend.set_emulation("strict")


def check(slots, miss_slots, miss_counts, capacity):
    """The op in each build against the reference; returns the reference's lists."""
    want = reference.split_slots(slots, miss_slots, miss_counts, capacity)
    for build in BUILDS:
        with backend.emulation(build):
            hits, misses = torch.ops.avsg.split_slots(slots, miss_slots, miss_counts, capacity)
        assert hits.dtype == I32 and misses.dtype == I32, build
        assert torch.equal(hits, want.hits), f"{build}: hits differ"
        assert torch.equal(misses, want.misses), f"{build}: misses differ"
    return want


def random_case(gen, R, T, K, S, count_lo, count_hi):
    N = T * K
    slots = torch.randint(-3, S + 3, (R, T, K), generator=gen, dtype=I32)
    slots[torch.rand(R, T, K, generator=gen) < 0.2] = -1
    # repeats: some token copies another token's selections (MTP), some lanes repeat a lane
    if T > 1:
        slots[:, 1] = torch.where(torch.rand(R, K, generator=gen) < 0.5, slots[:, 0], slots[:, 1])
    miss_slots = torch.randint(-2, S + 2, (R, N), generator=gen, dtype=I32)
    # mostly slots the selections use, so misses are common
    picks = slots.view(R, N).gather(1, torch.randint(0, N, (R, N), generator=gen))
    miss_slots = torch.where(torch.rand(R, N, generator=gen) < 0.6, picks, miss_slots)
    miss_counts = torch.randint(count_lo, count_hi + 1, (R,), generator=gen, dtype=I32)
    return slots, miss_slots, miss_counts


@settings(max_examples=30, deadline=None)
@given(R=st.integers(1, 4), T=st.integers(1, 4), K=st.sampled_from([1, 3, 8, 13, 64, 129, 1030]),
       S=st.sampled_from([1, 5, 16, 100, 2048]), seed=st.integers(0, 2**31 - 1))
def test_random_inputs_match_the_reference(R, T, K, S, seed):
    gen = torch.Generator().manual_seed(seed)
    check(*random_case(gen, R, T, K, S, -3, T * K + 3), S)


@pytest.mark.parametrize("K", [CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK + 5])
def test_tokens_over_several_chunks(K):
    """A token's runs continue across chunks at any offset (exact-byte stores after the last)."""
    gen = torch.Generator().manual_seed(K)
    slots, miss, counts = random_case(gen, 2, 2, K, 3 * K, 0, 2 * K)
    slots[:, :, -3:] = torch.tensor([1, 2, 3], dtype=I32)   # the last chunk's lanes hold both classes
    miss[miss == 3] = 2                                     # slot 3 is a hit, slot 2 a miss
    miss[:, 0], counts[:] = 2, torch.clamp(counts, min=1)
    want = check(slots, miss, counts, 3 * K)
    for lists, slot in ((want.hits, 3), (want.misses, 2)):     # found past the first chunk's runs
        assert bool(((lists == slot).sum(-1) >= 1).all())


def test_int32_extremes_stay_inside_the_row():
    """Slots and miss slots at the int32 extremes, counts at both extremes: nothing is marked or
    read outside [0, S) (the strict build would raise on an index outside its buffers)."""
    S = 8
    slots = torch.tensor([[[INT32_MIN, INT32_MAX, 0, 7, 8, -1, S, 3]],
                          [[2, 2, 2, INT32_MAX, -2, 5, 1, 0]]], dtype=I32)
    miss = torch.tensor([[INT32_MAX, INT32_MIN, 7, 8, -1, 3, 0, S],
                         [S, 2, -1, 1, INT32_MAX, 6, 6, 0]], dtype=I32)
    for counts in ([INT32_MAX, INT32_MIN], [INT32_MIN, INT32_MAX], [3, 2], [0, 8], [9, -1]):
        check(slots, miss, torch.tensor(counts, dtype=I32), S)


@pytest.mark.parametrize("S", [1, 2, MAX_CAPACITY])
def test_capacity_edges(S):
    gen = torch.Generator().manual_seed(S)
    slots, miss, counts = random_case(gen, 3, 2, 40, S, 0, 80)
    slots[0, 0, :4] = torch.tensor([S - 1, S, 0, -1], dtype=I32)
    miss[0, :3] = torch.tensor([S - 1, S, 0], dtype=I32)
    counts[0] = 3
    check(slots, miss, counts, S)


def test_all_hits_all_misses_and_full_buffers():
    R, T, K = 2, 3, 16
    S = T * K                                          # full: every slot selected
    slots = torch.randperm(S, generator=torch.Generator().manual_seed(1)).to(I32).view(1, T, K)
    slots = slots.expand(R, T, K).contiguous()
    every = slots.view(R, T * K).clone()
    full = torch.full((R,), T * K, dtype=I32)
    none = torch.zeros(R, dtype=I32)
    want = check(slots, every, full, S)                # all misses
    assert bool((want.hits == -1).all()) and torch.equal(want.misses, slots)
    want = check(slots, every, none, S)                # all hits
    assert bool((want.misses == -1).all()) and torch.equal(want.hits, slots)
    want = check(slots, every, torch.tensor([S // 2, S - 1], dtype=I32), S)   # a mixture
    assert bool((want.hits >= 0).any()) and bool((want.misses >= 0).any())
    check(torch.full((R, T, K), -1, dtype=I32), every, full, S)    # -1 padding only


@pytest.mark.parametrize("R", [1, 7])
def test_rows_over_fewer_cores(R):
    """R = 1, and R > cores: a core loops over its rows, each row's map starts empty again."""
    old = backend.emulated_cores()
    backend.set_emulated_cores(3)
    try:
        gen = torch.Generator().manual_seed(R)
        slots, miss, counts = random_case(gen, R, 2, 24, 40, 0, 48)
        check(slots, miss, counts, 40)
    finally:
        backend.set_emulated_cores(old)


def test_plan_outputs_through_avsg_split_slots_in_one_op():
    """A real step's outputs (padded row views, counts at stride 8): ``avsg.split_slots`` is
    the op and no other torch op, so the split costs one launch."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(str(func.overloadpacket))
            return func(*args, **(kwargs or {}))

    R, T, K, S = 3, 2, 13, 40                          # T*K = 26: rows padded to 32
    buf = avsg.SparseKVBuffer(rows=R, capacity=S, topk=K, queries_per_step=T, check=False)
    gen = torch.Generator().manual_seed(5)
    seq = torch.full((R,), 90, dtype=I32)
    assert _ops.CPU_BACKEND["split_slots"] == "kernel"
    for build in BUILDS:
        with backend.emulation(build):
            for _ in range(4):
                plan = buf.step(draw(gen, R, T, K, seq, hot=2 * T * K), seq, copy=lambda p: None)
                assert not plan.slots.is_contiguous() and plan.miss_counts.stride(0) == 8
                with Ops() as ops:
                    split = avsg.split_slots(plan)
                assert ops.names == ["avsg.split_slots"], ops.names
                want = reference.split_slots(plan.slots, plan.miss_slots, plan.miss_counts, S)
                assert torch.equal(split.hits, want.hits) and torch.equal(split.misses, want.misses)
                assert split.hits.stride() == (32, K, 1)          # rows at a 32 B pitch
                seq = seq + 1


def test_meta_shapes_match_the_kernel():
    slots = torch.zeros(2, 3, 5, dtype=I32, device="meta")
    hits, misses = torch.ops.avsg.split_slots(slots, torch.zeros(2, 15, dtype=I32, device="meta"),
                                              torch.zeros(2, dtype=I32, device="meta"), 8)
    real = torch.ops.avsg.split_slots(torch.zeros(2, 3, 5, dtype=I32), torch.zeros(2, 15, dtype=I32),
                                      torch.zeros(2, dtype=I32), 8)
    for fake, got in zip((hits, misses), real):
        assert fake.shape == got.shape and fake.stride() == got.stride() and fake.dtype == got.dtype


def _args():
    return [torch.zeros(2, 2, 4, dtype=I32), torch.zeros(2, 8, dtype=I32), torch.zeros(2, dtype=I32), 8]


@pytest.mark.parametrize("index, value, match", [
    (0, torch.zeros(2, 2, 4, dtype=torch.int64), "slots: expected dtype torch.int32"),
    (0, torch.zeros(2, 8, dtype=I32), "slots: expected a 3-D tensor"),
    (0, torch.zeros(0, 2, 4, dtype=I32), "slots: expected non-empty"),
    (0, torch.zeros(2, 4, 2, dtype=I32).transpose(1, 2), "slots: expected rows of contiguous"),
    (1, torch.zeros(2, 8, dtype=torch.float32), "miss_slots: expected dtype torch.int32"),
    (1, torch.zeros(2, 7, dtype=I32), "miss_slots: expected shape"),
    (1, torch.zeros(8, 2, dtype=I32).t(), "miss_slots: expected rows of contiguous"),
    (2, torch.zeros(3, dtype=I32), "miss_counts: expected shape"),
    (2, torch.zeros(2, 1, dtype=I32), "miss_counts: expected a 1-D tensor"),
    (3, 0, "capacity: expected 1..32768"),
    (3, MAX_CAPACITY + 1, "capacity: expected 1..32768"),
])
def test_bad_arguments_name_the_argument(index, value, match):
    args = _args()
    args[index] = value
    with pytest.raises((ValueError, TypeError), match=match):
        torch.ops.avsg.split_slots(*args)


def test_a_meta_argument_among_cpu_tensors_is_named():
    args = _args()
    args[2] = torch.zeros(2, dtype=I32, device="meta")
    with pytest.raises(ValueError, match="miss_counts"):
        torch.ops.avsg.split_slots(*args)
