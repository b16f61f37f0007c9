"""Gather: exact bytes for every pool layout, dtype and row width; the partitions' balance
(S1 request, S2 selection = the paper's, S3 miss, and the older topk list split)."""
from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import avsg
from avsg import reference
from helpers.gather_cases import kv_zeros
from helpers.oracle import host_row_values

I32 = torch.int32

# (dtype, trailing shapes of the tensors sharing one plan): a bf16 576-wide MLA row, the split
# 512 latent + 64 RoPE caches, a 656-byte FP8 row stored as uint8, and odd widths.
ROW_FORMATS = [
    (torch.bfloat16, [(576,)]),
    (torch.float16, [(512,), (64,)]),
    (torch.uint8, [(656,)]),
    (torch.float32, [(3,), (1, 5)]),
    (torch.uint8, [(1,)]),
]


def random_rows(shape, dtype, gen):
    if dtype == torch.uint8:
        return torch.randint(0, 256, shape, generator=gen, dtype=torch.uint8)
    return torch.randn(shape, generator=gen).to(dtype)


def run_steps(R, T, K, S, max_len, fmt, paged, partition, cores, steps, seed):
    dtype, widths = fmt
    gen = torch.Generator().manual_seed(seed)
    buf = avsg.SparseKVBuffer(rows=R, capacity=S, topk=K, queries_per_step=T, max_context=1 << 20)
    block_size = 16
    if paged:
        blocks_per_row = (max_len + block_size - 1) // block_size
        num_blocks = R * blocks_per_row + 3
        perm = torch.randperm(num_blocks, generator=gen)[:R * blocks_per_row]
        block_table = perm.view(R, blocks_per_row).to(I32)
        srcs = [random_rows((num_blocks, block_size, *w), dtype, gen) for w in widths]
    else:
        block_table = None
        srcs = [random_rows((R, max_len, *w), dtype, gen) for w in widths]
    dsts = [kv_zeros(R, S, *w, dtype=dtype) for w in widths]
    seq = torch.full((R,), max_len, dtype=I32)
    for _ in range(steps):
        topk = torch.stack([torch.stack([torch.randperm(max_len, generator=gen)[:K]
                                         for _ in range(T)]) for _ in range(R)]).to(I32)
        topk[torch.rand(R, T, K, generator=gen) < 0.1] = -1
        plan = buf.plan(topk, seq)
        per_core = avsg.gather(plan, srcs, dsts, block_table=block_table,
                               block_size=block_size if paged else None, partition=partition,
                               num_cores=cores)
        assert per_core.shape == (cores,) and per_core.dtype == I32
        assert int(per_core.sum()) == int(plan.miss_counts.sum())
        for r in range(R):
            for p, s in zip(topk[r].flatten().tolist(), plan.slots[r].flatten().tolist()):
                if p < 0:
                    continue
                for src, dst in zip(srcs, dsts):
                    want = host_row_values(src, r, p, block_table, block_size)
                    assert torch.equal(dst[r, s].view(torch.uint8), want.view(torch.uint8))
    return plan, per_core


@pytest.mark.parametrize("fmt", ROW_FORMATS, ids=lambda f: f"{f[0]}-{f[1]}")
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
@pytest.mark.parametrize("partition", reference.ALL_PARTITIONS)
def test_gather_exact_bytes(fmt, paged, partition):
    run_steps(R=3, T=2, K=8, S=32, max_len=70, fmt=fmt, paged=paged, partition=partition,
              cores=5, steps=3, seed=11)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(0, 40), min_size=1, max_size=9), st.integers(1, 48))
def test_partition_assignment(counts, cores):
    """miss: contiguous (row, pos)-ordered chunks differing by at most one; request: one core
    per row; topk: equal chunks of the fixed miss-list layout, padding doing nothing."""
    R, N = len(counts), 40
    miss_counts = torch.tensor(counts, dtype=I32)
    total = sum(counts)
    for partition in reference.PARTITIONS:
        core = reference.assign_cores(miss_counts, N, partition, cores)
        col = torch.arange(N).expand(R, N)
        assert bool(((core >= 0) == (col < miss_counts[:, None])).all())
        per_core = torch.bincount(core[core >= 0], minlength=cores)
        assert int(per_core.sum()) == total
        if partition == "miss":
            assert int(per_core.max() - per_core.min()) <= 1
            flat = core[core >= 0]            # row-major = (row, pos) order
            assert bool((flat[1:] >= flat[:-1]).all()), "chunks must be contiguous"
        elif partition == "request":
            for r in range(R):
                assert bool((core[r, :counts[r]] == r % cores).all())
        else:
            bounds = reference.chunk_bounds(R * N, cores)
            for r in range(R):
                for j in range(counts[r]):
                    c = int(core[r, j])
                    assert bounds[c] <= r * N + j < bounds[c + 1]


def test_miss_partition_balances_skewed_rows():
    """One heavy row: request binds it to one core; miss spreads it; topk follows the layout."""
    miss_counts = torch.tensor([400, 2, 0, 5], dtype=I32)

    def heaviest_core(partition):
        core = reference.assign_cores(miss_counts, 512, partition, 8)
        return int(torch.bincount(core[core >= 0], minlength=8).max())

    assert heaviest_core("miss") == -(-407 // 8)      # 407 misses over 8 cores
    assert heaviest_core("request") == 400            # row 0 alone on core 0
    assert heaviest_core("topk") == 2048 // 8         # row 0's misses fill chunks 0 and 1


def test_gather_returns_zero_work_when_everything_hits():
    buf = avsg.SparseKVBuffer(policy="lifetime", rows=1, capacity=8, topk=4)
    pos = torch.tensor([[[1, 2, 3, 4]]], dtype=I32)
    seq = torch.tensor([10], dtype=I32)
    host, dst = torch.randn(1, 10, 2), kv_zeros(1, 8, 2)
    avsg.gather(buf.plan(pos, seq), host, dst)
    before = dst.clone()
    counts = avsg.gather(buf.plan(pos, seq), host, dst, num_cores=4)
    assert counts.tolist() == [0, 0, 0, 0] and torch.equal(dst, before)


def test_selection_layout_marks_first_misses_in_selection_order():
    """selection_layout: a selection is a copy exactly when it is the row's first selection of a
    missed position; every miss appears once, with its plan slot."""
    gen = torch.Generator().manual_seed(5)
    R, T, K, S, max_len = 3, 2, 16, 64, 80
    buf = avsg.SparseKVBuffer(rows=R, capacity=S, topk=K, queries_per_step=T, max_context=1 << 20)
    seq = torch.full((R,), max_len, dtype=I32)
    for _ in range(4):
        topk = torch.stack([torch.stack([torch.randperm(max_len, generator=gen)[:K]
                                         for _ in range(T)]) for _ in range(R)]).to(I32)
        topk[torch.rand(R, T, K, generator=gen) < 0.1] = -1
        plan = buf.plan(topk, seq)
        pos, slot = reference.selection_layout(plan.slots, plan.miss_pos, plan.miss_slots,
                                               plan.miss_counts)
        flat = topk.view(R, T * K)
        for r in range(R):
            missed = dict(zip(plan.miss_pos[r, :int(plan.miss_counts[r])].tolist(),
                              plan.miss_slots[r, :int(plan.miss_counts[r])].tolist()))
            seen = set()
            for j, p in enumerate(flat[r].tolist()):
                if p in missed and p not in seen:
                    seen.add(p)
                    assert (int(pos[r, j]), int(slot[r, j])) == (p, missed[p])
                else:
                    assert (int(pos[r, j]), int(slot[r, j])) == (-1, -1)
            assert seen == set(missed)


def test_selection_partition_splits_selections_evenly():
    """The paper's S2: every core takes an equal share of the R*T*K selections; its copies are
    the misses among them (one heavy row lands on the cores that hold that row's selections)."""
    R, N, cores = 4, 512, 8
    pos = torch.full((R, N), -1, dtype=I32)
    pos[0, :400] = torch.arange(400, dtype=I32)   # row 0: 400 misses at the front of its selections
    pos[3, 100:105] = torch.arange(5, dtype=I32)
    core = reference.assign_cores(torch.zeros(R, dtype=I32), N, "selection", cores, pos)
    per_core = torch.bincount(core[core >= 0], minlength=cores)
    assert per_core.tolist() == [256, 144, 0, 0, 0, 0, 5, 0]
