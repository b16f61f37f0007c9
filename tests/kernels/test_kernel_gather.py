"""The gather kernel (op_kernel/gather.cpp through the AscendC CPU emulation) against the reference.

``torch.ops.avsg.gather`` on CPU is the AscendC kernel; ``avsg.reference.gather`` is the
specification. Both run on clones of the same destination buffers and must agree on every byte
of every destination (touched and untouched slots) and on the per-core copy counts, for random
miss lists: every partition, 1..40 cores, contiguous and paged pools, several (src, dst) pairs of
different dtypes and row widths, entries outside the pool, garbage in the padding. The emulation
counters must account for exactly the bytes copied.
"""
from __future__ import annotations

from typing import List, Tuple

import pytest
import torch
from hypothesis import HealthCheck, given, settings

import avsg  # noqa: F401  (loads the op library)
from avsg import _ops, backend, reference

from helpers.gather_cases import (padded_slots, COPY_BUFFERS, COPY_BYTES_MAX, COUNT_SLOT_BYTES, I32,  # noqa: F401
                                  ROW_MENU, TILING_BYTES, Case, cases, make_case, random_bytes,
                                  run_kernel, run_reference, same_bytes)


# (dtype, trailing row shape): 1, 2, 3, 12, 20, 64, 128, 512, 656, 1024 and 1152 bytes per row.














def check_against_reference(case: Case) -> Tuple[torch.Tensor, List[torch.Tensor]]:
    want_dst = [padded_slots(d) for d in case.dsts]
    got_dst = [padded_slots(d) for d in case.dsts]
    want = run_reference(case, want_dst)
    got = run_kernel(case, got_dst)
    assert got.dtype == I32 and got.shape == (case.cores,)
    assert torch.equal(got, want), f"per-core counts {got.tolist()} != reference {want.tolist()}"
    for i, (g, w) in enumerate(zip(got_dst, want_dst)):
        assert same_bytes(g, w), f"dst[{i}] differs from the reference"
    return got, got_dst


def check_counters(case: Case, per_core: torch.Tensor) -> None:
    """MTE3 carries exactly the copied rows plus each core's 32 B count, in at most one DMA per
    row piece (runs contiguous in host row and slot share one); MTE2 at least the rows; no more
    reads in flight than the copy queue has buffers (plus the index loads)."""
    c = backend.last_launch_counters()
    assert c.blocks == case.cores
    row = sum(case.row_bytes)
    pieces = sum(-(-b // COPY_BYTES_MAX) if b else 0 for b in case.row_bytes)
    want_mte3 = per_core.to(torch.int64) * row + COUNT_SLOT_BYTES
    assert torch.equal(c["mte3_bytes"], want_mte3), (c["mte3_bytes"].tolist(), want_mte3.tolist())
    copied = per_core.to(torch.int64)
    assert bool((c["mte3_copies"] <= copied * pieces + 1).all())
    assert bool((c["mte3_copies"] >= (copied > 0).to(torch.int64) * pieces + 1).all())
    assert bool((c["mte2_inflight_max"] <= COPY_BUFFERS + 2).all())
    assert bool((c["mte2_bytes"] >= per_core.to(torch.int64) * row + TILING_BYTES).all())
    assert int(c["vec_instrs"].sum()) == 0, "a pure copy kernel issues no vector instructions"
    assert bool((c["set_flags"] == c["wait_flags"]).all())


# --------------------------------------------------------------------- hypothesis sweep



@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_kernel_matches_reference_bit_for_bit(case):
    per_core, _ = check_against_reference(case)
    check_counters(case, per_core)


# ------------------------------------------------------------------ targeted cases

@pytest.mark.parametrize("partition", reference.ALL_PARTITIONS)
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_mla_row_formats(partition, paged):
    """576 x bf16 rows, the split 512 + 64 caches sharing one plan, 656-byte FP8 rows."""
    formats = [(torch.bfloat16, (576,)), (torch.bfloat16, (512,)), (torch.bfloat16, (64,)),
               (torch.uint8, (656,))]
    case = make_case(7, R=4, N=2 * 16, S=40, formats=formats, paged=paged, partition=partition,
                     cores=40, max_len=64, block_size=16)
    per_core, _ = check_against_reference(case)
    check_counters(case, per_core)
    assert int(per_core.sum()) > 0


def adjacent_rows_case(formats, paged: bool, partition: str, cores: int) -> Case:
    """Runs of ADJACENT host rows whose bytes are not a multiple of 32: one multi-row DataCopyPad
    per read, its rows at UbRowPitch (row bytes rounded up to 32) in UB, written back from there
    (op_kernel/gather_kernel.h). Row 0 misses positions 5..100, row 1 positions 40..135; slots
    partly consecutive (one write per read), partly pairwise swapped and descending (one write per
    row). Paged: blocks of 16 positions in ascending blocks with a hole between pairs of blocks,
    so runs break at every other block edge."""
    R, N, S, L = 2, 96, 130, 160
    gen = torch.Generator().manual_seed(29)
    miss_pos = torch.stack([torch.arange(5, 5 + N), torch.arange(40, 40 + N)]).to(I32)
    row0 = list(range(40)) + [40 + (i ^ 1) for i in range(32)] + list(range(129, 129 - 24, -1))
    miss_slots = torch.tensor([row0, list(range(S - 1, S - 1 - N, -1))], dtype=I32)
    miss_counts = torch.full((R,), N, dtype=I32)
    if paged:
        bs = 16
        blocks = L // bs
        table = torch.stack([torch.tensor([2 * r * blocks + b + b // 2 for b in range(blocks)])
                             for r in range(R)]).to(I32)
        pool_lead = (int(table.max()) + 1, bs)
    else:
        bs, table, pool_lead = 0, None, (R, L)
    srcs = [random_bytes((*pool_lead, *shape), dtype, gen) for dtype, shape in formats]
    dsts = [padded_slots(random_bytes((R, S, *shape), dtype, gen)) for dtype, shape in formats]
    return Case(miss_pos, miss_slots, miss_counts, srcs, dsts, table, bs, partition, cores)


@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
@pytest.mark.parametrize("partition", ["miss", "request", "topk"])
def test_adjacent_odd_sized_rows(partition, paged):
    """656 B FP8 rows, 20 B and 6 B rows (UB pitches 672, 32, 32), runs of adjacent positions over
    several cores, bit for bit; and the runs really were read many rows per DataCopyPad."""
    formats = [(torch.uint8, (656,)), (torch.float32, (5,)), (torch.bfloat16, (3,))]
    case = adjacent_rows_case(formats, paged, partition, cores=3)
    assert all(b % 32 for b in case.row_bytes)
    per_core, _ = check_against_reference(case)
    check_counters(case, per_core)
    copied = int(per_core.sum())
    assert copied == 2 * 96
    reads = int(backend.last_launch_counters()["mte2_copies"].sum())
    # per pair at most one read per 32 adjacent rows (+ block edges when paged) + index loads;
    # row by row it would be copied * pairs = 576
    assert reads < copied * len(formats) // 6, reads


def test_rows_wider_than_a_ub_buffer_are_split():
    """An 80 KB row does not fit one 32 KB copy buffer: three pieces per row, same bytes (and
    no merged reads: one row per read when a row is wider than a buffer)."""
    formats = [(torch.float32, (20000,)), (torch.uint8, (3,))]
    case = make_case(3, R=2, N=4, S=6, formats=formats, paged=False, partition="miss", cores=3,
                     max_len=8)
    per_core, _ = check_against_reference(case)
    check_counters(case, per_core)
    c = backend.last_launch_counters()
    assert torch.equal(c["mte3_copies"], per_core.to(torch.int64) * (3 + 1) + 1)


def test_more_pairs_than_one_launch_holds():
    """Nine (src, dst) pairs: two launches of the kernel (8 + 1 pairs), one result."""
    formats = [ROW_MENU[i % len(ROW_MENU)] for i in range(9)]
    case = make_case(5, R=3, N=6, S=9, formats=formats, paged=True, partition="topk", cores=7)
    check_against_reference(case)


@pytest.mark.parametrize("partition", reference.ALL_PARTITIONS)
def test_index_windows_larger_than_ub(partition):
    """Past the UB windows of the kernel: rows with more than 2048 misses (index chunks), more
    than 4096 rows (miss_counts chunks), block tables wider than 2048 entries (block-table
    windows)."""
    wide_rows = make_case(43, R=2, N=3000, S=3100, formats=[(torch.uint8, (1,))], paged=False,
                          partition=partition, cores=5, max_len=3500)
    wide_rows.miss_counts.fill_(3000)
    wide_rows.miss_slots[:] = torch.stack([torch.randperm(3100)[:3000] for _ in range(2)]).to(I32)
    check_against_reference(wide_rows)
    many_rows = make_case(47, R=5000, N=1, S=1, formats=[(torch.uint8, (2,))], paged=False,
                          partition=partition, cores=40, max_len=2)
    check_against_reference(many_rows)
    wide_table = make_case(53, R=2, N=300, S=300, formats=[(torch.float16, (3,))], paged=True,
                           partition=partition, cores=6, max_len=5000, block_size=1)
    check_against_reference(wide_table)


@pytest.mark.slow
@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_kernel_matches_reference_long_sweep(case):
    per_core, _ = check_against_reference(case)
    check_counters(case, per_core)


def test_exact_mte2_accounting_for_the_miss_partition():
    """miss partition, contiguous pool: every core loads the tiling and all of miss_counts, then
    the indices of its chunk (8 B per entry) and the rows it copies; nothing else."""
    formats = [(torch.bfloat16, (576,))]
    case = make_case(11, R=5, N=24, S=30, formats=formats, paged=False, partition="miss", cores=9,
                     max_len=40)
    per_core, _ = check_against_reference(case)
    c = backend.last_launch_counters()
    R, C = case.miss_pos.shape[0], case.cores
    assigned = int(case.miss_counts.sum())
    copied = int(per_core.sum())
    want = copied * 1152 + C * (TILING_BYTES + 4 * R) + 8 * assigned
    assert int(c["mte2_bytes"].sum()) == want


def test_every_core_count_up_to_the_configured_limit():
    case = make_case(13, R=3, N=10, S=12, formats=[(torch.float16, (8,))], paged=False,
                     partition="miss", cores=1)
    for cores in range(1, 41):
        case.cores = cores
        for partition in reference.PARTITIONS:
            case.partition = partition
            check_against_reference(case)


def test_more_cores_than_emulated_is_a_clear_error():
    case = make_case(17, R=2, N=4, S=4, formats=[(torch.float32, (2,))], paged=False,
                     partition="miss", cores=41)
    before = [padded_slots(d) for d in case.dsts]
    assert backend.emulated_cores() == 40
    with pytest.raises(ValueError, match="exceeds the emulated AIV core count 40"):
        run_kernel(case)
    assert all(torch.equal(a, b) for a, b in zip(case.dsts, before))
    case.cores = 48
    backend.set_emulated_cores(48)
    try:
        check_against_reference(case)
        assert backend.last_launch_counters().blocks == 48
    finally:
        backend.set_emulated_cores(40)
    with pytest.raises(ValueError, match="exceeds the emulated AIV core count 40"):
        run_kernel(case)


def test_no_misses_copies_nothing():
    case = make_case(19, R=3, N=5, S=5, formats=[(torch.uint8, (3,))], paged=True,
                     partition="request", cores=4)
    case.miss_counts.zero_()
    before = [padded_slots(d) for d in case.dsts]
    assert run_kernel(case).tolist() == [0, 0, 0, 0]
    assert all(same_bytes(a, b) for a, b in zip(case.dsts, before))


def test_avsg_gather_is_served_by_the_kernel():
    assert _ops.CPU_BACKEND["gather"] == "kernel"
    assert backend.backend_info()["cpu"]["gather"] == "kernel"


# ------------------------------------------------------------------ argument checks in the op

def _small_case():
    return make_case(23, R=2, N=4, S=6, formats=[(torch.float32, (2,))], paged=False,
                     partition="miss", cores=2)


BAD_ARGS = [
    ("partition", lambda c: c.__setattr__("partition", "rows"), ValueError, "partition"),
    ("cores", lambda c: c.__setattr__("cores", 0), ValueError, "num_cores"),
    ("pos dtype", lambda c: c.__setattr__("miss_pos", c.miss_pos.long()), TypeError, "miss_pos"),
    ("slots shape", lambda c: c.__setattr__("miss_slots", c.miss_slots[:, :2].contiguous()),
     ValueError, "miss_slots"),
    ("count range", lambda c: c.miss_counts.__setitem__(0, 5), ValueError, r"miss_counts\[0\] = 5"),
    ("slot range", lambda c: (c.miss_counts.__setitem__(1, 1), c.miss_slots.__setitem__((1, 0), 6)),
     ValueError, r"miss_slots\[1, 0\] = 6"),
    ("slot repeat", lambda c: (c.miss_counts.__setitem__(0, 2),
                               c.miss_slots.__setitem__((0, 1), int(c.miss_slots[0, 0]))),
     ValueError, "distinct slots"),
    ("src dtype", lambda c: c.srcs.__setitem__(0, c.srcs[0].double()), TypeError, r"src\[0\]"),
    ("row shape", lambda c: c.srcs.__setitem__(0, c.srcs[0][..., :1].contiguous()), ValueError,
     r"src\[0\]"),
    ("dst layout", lambda c: c.dsts.__setitem__(0, c.dsts[0].transpose(0, 1).contiguous()
                                                .transpose(0, 1)), ValueError, r"dst\[0\]"),
    ("pairs", lambda c: c.srcs.append(c.srcs[0]), ValueError, "same number"),
    ("block_size", lambda c: c.__setattr__("block_size", 4), ValueError, "block_size"),
]


@pytest.mark.parametrize("name,mutate,error,needle", BAD_ARGS, ids=[b[0] for b in BAD_ARGS])
def test_op_rejects_bad_arguments_before_copying(name, mutate, error, needle):
    case = _small_case()
    mutate(case)
    before = [padded_slots(d) for d in case.dsts]
    with pytest.raises(error, match=needle):
        run_kernel(case)
    assert all(same_bytes(a, b) for a, b in zip(case.dsts, before))


# ------------------------------------------------------------------ counters and cost model

def test_counters_and_npu_time_estimate():
    case = make_case(29, R=4, N=16, S=20, formats=[(torch.bfloat16, (576,))], paged=False,
                     partition="miss", cores=8, max_len=32)
    per_core, _ = check_against_reference(case)
    c = backend.last_launch_counters()
    assert c.fields == backend.counter_fields() and "mte2_bytes" in c.fields
    total = c.total()
    assert total["mte2_copies"] > 0 and total["scalar_ub_reads"] > 0 and total["queue_syncs"] > 0
    assert c.block(0)["mte3_bytes"] == int(per_core[0]) * 1152 + COUNT_SLOT_BYTES
    est = backend.estimate_cost(c)
    assert len(est) == 8 and all(b["serial_ns"] >= b["overlap_ns"] > 0 for b in est)
    serial, overlap = backend.estimate_npu_time_us(c), backend.estimate_npu_time_us(c, "overlap")
    assert serial >= overlap > 0
    assert serial == max(b["serial_ns"] for b in est) / 1000
    model = backend.cost_model()
    assert model["clock_ghz"] > 0 and model["mte_bytes_per_cycle"] > 0
    # more work, more estimated time
    case.miss_counts.fill_(16)
    for r in range(4):
        case.miss_slots[r] = torch.randperm(20)[:16].to(I32)
    case.miss_pos.clamp_(min=0, max=31)
    run_kernel(case)
    assert backend.estimate_npu_time_us() > serial
