"""No 32 B granule of any output is written by two cores in one launch.

Whether two AIV cores' byte-masked DMA writes to one 32 B GM granule are safe is undocumented, so
every output is laid out so that the question never arises:

* plan / plan_dual_pointer write each row of slots, miss_pos and miss_slots at a pitch of T*K
  rounded up to 8 int32, and miss_counts at a pitch of 8; resize does the same for its move lists
  and counts. The ops return views of that storage.
* gather splits a request's misses over cores, so it refuses a multi-core launch into a dst whose
  slots could share a granule, and ``avsg.kv_slots`` allocates slots padded to 32 B.

The strict emulation records which block wrote each GM granule between two SyncAlls and fails the
launch on a second writer (on by default): every kernel test therefore checks the layouts, and
the last test here shows the check catching a real kernel.
"""
from __future__ import annotations

import pytest
import torch

import avsg
from avsg import backend, reference
from helpers.gather_cases import make_case, padded_slots, pitched_like_plan, run_kernel, run_reference, same_bytes

# plan-only buffers hold no KV: track_copies=False keeps a plan's misses resident without
# a gather (what these tests specify); tests/ops/test_uncopied.py covers the tracking

I32 = torch.int32


@pytest.mark.parametrize("policy", ["lifetime", "lru", "reuse"])
@pytest.mark.parametrize("T,K", [(1, 5), (3, 5), (2, 8), (1, 13)])
def test_plan_rows_padded_and_exact(policy, T, K):
    """Rows on different cores: outputs equal the reference, rows start every roundup(T*K, 8)
    int32 and miss_counts every 8."""
    R, S = 3, 4 * T * K + 8
    buf = avsg.SparseKVBuffer(rows=R, capacity=S, topk=K, queries_per_step=T, policy=policy,
                              check=False, track_copies=False)    # random draws repeat positions: they share a slot
    gen = torch.Generator().manual_seed(T * 100 + K)
    layout = buf.layout
    ref_state, ref_stats = buf.state.clone(), buf.stats_counts.clone()
    pitch = -(-T * K // 8) * 8
    for step in range(6):
        topk = torch.randint(-1, 3 * S, (R, T, K), generator=gen, dtype=I32)
        seq = torch.full((R,), 3 * S, dtype=I32)
        plan = buf.plan(topk, seq)
        want = reference.plan(ref_state, ref_stats, topk, seq, layout, buf.lifetime, policy=buf.policy)
        for name, got, w in zip(("slots", "miss_pos", "miss_slots", "miss_counts"),
                                (plan.slots, plan.miss_pos, plan.miss_slots, plan.miss_counts), want):
            assert torch.equal(got, w), f"step {step}: {name}"
        assert torch.equal(buf.state, ref_state)
        assert plan.miss_counts.stride() == (8,)
        assert plan.miss_pos.stride() == (pitch, 1) and plan.miss_slots.stride() == (pitch, 1)
        assert plan.slots.stride() == (pitch, K, 1)
        assert plan.miss_pos.is_contiguous() == (T * K % 8 == 0)


def test_resize_outputs_padded():
    R, K, S = 3, 4, 20            # move lists of W = S / 2 = 10 entries: rows padded to 16
    buf = avsg.SparseKVBuffer(rows=R, capacity=S, topk=K, policy="lifetime", track_copies=False)
    gen = torch.Generator().manual_seed(3)
    for _ in range(4):
        buf.plan(torch.randint(0, 200, (R, 1, K), generator=gen, dtype=I32),
                 torch.full((R,), 200, dtype=I32))
    moves = buf.resize(torch.tensor([0, 2]), torch.tensor([K, K + 2]))
    assert moves.miss_counts.stride() == (8,)
    assert moves.miss_pos.stride(0) == 16 and moves.miss_pos.shape[1] == 10


def test_kv_slots_pitch():
    for dtype, row, pitch_bytes in [(torch.uint8, (656,), 672), (torch.uint8, (1, 656), 672),
                                    (torch.bfloat16, (512,), 1024), (torch.float32, (3,), 32),
                                    (torch.float16, (2, 3), 32), (torch.uint8, (1,), 32)]:
        t = avsg.kv_slots(5, row, dtype)
        item = t.element_size()
        assert t.shape == (5, *row) and t.dtype == dtype
        assert t.stride(0) * item == pitch_bytes and bool((t == 0).all())
        assert t.data_ptr() % 32 == 0
        t.view(5, 1, *row)                # views as [R, S, ...] without a copy
    with pytest.raises(ValueError, match="n"):
        avsg.kv_slots(-1, (4,), torch.uint8)


@pytest.mark.parametrize("partition", reference.ALL_PARTITIONS)
def test_gather_refuses_shared_granules(partition):
    """A 656 B contiguous dst: slots s and s+1 share a granule, so two cores could write it."""
    case = make_case(7, R=2, N=6, S=8, formats=[(torch.uint8, (656,))], paged=False,
                     partition=partition, cores=3)
    dst = torch.zeros(2, 8, 656, dtype=torch.uint8)
    if partition == "request":           # rows never share a core; a request's 8 x 656 B is aligned
        run_kernel(case, [dst])
    else:
        with pytest.raises(ValueError, match=r"dst\[0\]: its slot pitch of 656 B is not a multiple of 32 B"):
            run_kernel(case, [dst])
    odd = torch.zeros(2, 7, 656, dtype=torch.uint8)   # 7 x 656 B per request: rows meet mid-granule
    case = make_case(8, R=2, N=6, S=7, formats=[(torch.uint8, (656,))], paged=False,
                     partition="request", cores=2)
    with pytest.raises(ValueError, match=r"dst\[0\]: a request's 4592 B of slots"):
        run_kernel(case, [odd])
    case.cores = 1                       # one core writes everything: nothing to share
    run_kernel(case, [odd])
    misaligned = torch.zeros(2 * 8 * 672 + 16, dtype=torch.uint8)[16:].view(2, 8, 672)[..., :656]
    case = make_case(9, R=2, N=6, S=8, formats=[(torch.uint8, (656,))], paged=False,
                     partition="miss", cores=2)
    with pytest.raises(ValueError, match=r"dst\[0\]: its data does not start on a 32 B boundary"):
        run_kernel(case, [misaligned])


@pytest.mark.parametrize("partition", reference.ALL_PARTITIONS)
@pytest.mark.parametrize("seed", range(4))
def test_gather_pitched_inputs_exact(partition, seed):
    """Index tensors at a plan's pitches, dst slots padded: bytes and per-core counts equal the
    reference's."""
    case = make_case(seed, R=4, N=7, S=12, formats=[(torch.uint8, (656,)), (torch.float32, (3,))],
                     paged=seed % 2 == 1, partition=partition, cores=5, pitched=True)
    assert not case.miss_pos.is_contiguous() and case.miss_counts.stride() == (8,)
    got = [padded_slots(d) for d in case.dsts]
    want = [padded_slots(d) for d in case.dsts]
    assert torch.equal(run_kernel(case, got), run_reference(case, want))
    assert all(same_bytes(g, w) for g, w in zip(got, want))


def test_gather_rejects_unusable_strides():
    case = make_case(1, R=3, N=6, S=8, formats=[(torch.float32, (8,))], paged=False,
                     partition="miss", cores=2)
    transposed = case.miss_pos.t().contiguous().t()
    with pytest.raises(ValueError, match="miss_pos: expected rows of contiguous int32"):
        torch.ops.avsg.gather(transposed, case.miss_slots, case.miss_counts, case.srcs, case.dsts,
                              None, 0, "miss", 2)
    pos, slots, counts = pitched_like_plan(case.miss_pos, case.miss_slots, case.miss_counts)
    with pytest.raises(ValueError, match="miss_slots: expected the row pitch of miss_pos"):
        torch.ops.avsg.gather(pos, case.miss_slots, counts, case.srcs, case.dsts, None, 0, "miss", 2)
    gappy = padded_slots(case.dsts[0]).transpose(0, 1).contiguous().transpose(0, 1)
    with pytest.raises(ValueError, match=r"dst\[0\]: expected evenly spaced rows"):
        torch.ops.avsg.gather(pos, slots, counts, case.srcs, [gappy], None, 0, "miss", 2)


def test_emulation_catches_a_shared_granule_in_gather():
    """Negative control on a real kernel: with the host's checks off, a 656 B contiguous dst and
    two cores whose shares hold neighbouring slots make the strict emulation fail the launch."""
    pos = torch.tensor([[0, 1]], dtype=I32)
    slots = torch.tensor([[0, 1]], dtype=I32)          # slots 0 and 1 share bytes 640..671
    counts = torch.tensor([2], dtype=I32)
    src = torch.randint(0, 256, (1, 4, 656), dtype=torch.uint8)
    dst = torch.zeros(1, 2, 656, dtype=torch.uint8)
    old = torch.ops.avsg._set_host_value_checks(False)
    try:
        with backend.emulation("strict"):
            with pytest.raises(RuntimeError, match="32 B GM granule"):
                torch.ops.avsg.gather(pos, slots, counts, [src], [dst], None, 0, "miss", 2)
            padded = avsg.kv_slots(2, (656,), torch.uint8).view(1, 2, 656)
            torch.ops.avsg.gather(pos, slots, counts, [src], [padded], None, 0, "miss", 2)
            assert torch.equal(padded[0], src[0, :2])
    finally:
        torch.ops.avsg._set_host_value_checks(old)
