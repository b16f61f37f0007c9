"""Misuse that used to serve wrong KV with no error (a hostile review's findings): each call is
refused by name, with the state and the buffers untouched, where the old code went on."""
from __future__ import annotations

import pytest
import torch

import avsg
from avsg.cache import SparseOffloadManager

I32 = torch.int32


def _manager(max_rows=1, capacity=16, topk=4, **kwargs):
    return SparseOffloadManager(num_layers=1, max_rows=max_rows, capacity=capacity, topk=topk,
                                kv_format="fp32", resident_block_size=8, latent_dim=4, rope_dim=4,
                                **kwargs)


def _pool(blocks, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [tuple(torch.randn(blocks, 8, 1, 4, generator=gen) for _ in range(2))]


def _snapshot(mgr):
    return [buf.state.clone() for buf in mgr.buffers], [c.clone() for c in mgr.kv[0]]


def _unchanged(mgr, snap):
    states, kv = snap
    return all(torch.equal(b.state, s) for b, s in zip(mgr.buffers, states)) and \
        all(torch.equal(c, k) for c, k in zip(mgr.kv[0], kv))


def test_seq_lens_past_max_context_are_refused():
    """The buffers drop positions >= max_context: a checked step must refuse them, not return
    -1 slots for 3 of 4 selections."""
    mgr = _manager(max_context=8, check=True)
    mgr.register_host_kv(_pool(4))
    mgr.add(0)
    with pytest.raises(ValueError, match=r"seq_lens\[0\] = 12: expected <= max_context = 8"):
        mgr.begin_step(torch.tensor([0, 1], dtype=I32), torch.tensor([12], dtype=I32),
                       torch.tensor([[0, 1, 2, 3]], dtype=I32), 1)
    with pytest.raises(ValueError, match=r"seq_lens\[0\] = 12: expected <= max_context = 8"):
        mgr.begin_step_rtk(torch.tensor([12], dtype=I32), 1,
                           torch.tensor([[0, 1, 2, 3]], dtype=I32))
    meta = mgr.begin_step(torch.tensor([0, 1], dtype=I32), torch.tensor([8], dtype=I32),
                          torch.tensor([[0, 1, 2, 3]], dtype=I32), 1)
    out = mgr.retrieve(0, torch.tensor([[[3, 5, 6, 7]]], dtype=I32), meta)
    assert bool((out.slots >= 0).all())


def test_write_through_without_new_kv_is_refused():
    """With write-through the host write may land after the gather: a retrieve without this
    pass's KV would fetch stale host rows and keep serving them as hits."""
    mgr = _manager(capacity=8, topk=2, write_through=True)
    mgr.register_host_kv([tuple(torch.zeros(2, 8, 1, 4) for _ in range(2))])
    mgr.add(0)
    meta = mgr.begin_step(torch.tensor([0, 1], dtype=I32), torch.tensor([5], dtype=I32),
                          torch.tensor([[0, 1]], dtype=I32), 1)
    snap = _snapshot(mgr)
    with pytest.raises(ValueError, match="new_kv: write_through=True needs this pass's KV"):
        mgr.retrieve(0, torch.tensor([[[4, 1]]], dtype=I32), meta)
    assert _unchanged(mgr, snap)
    new = [torch.randn(1, 1, 4) for _ in range(2)]
    out = mgr.retrieve(0, torch.tensor([[[4, 1]]], dtype=I32), meta, new_kv=new)
    slot = int(out.plan.slots[0, 0, 0])
    assert torch.equal(mgr.kv[0][0][0, slot], new[0][0])


@pytest.mark.parametrize("lifecycle", ["swap_rows", "begin_step", "free"])
def test_a_superseded_step_meta_is_refused(lifecycle):
    """A StepMeta holds the batch -> state row mapping of its begin_step: after a lifecycle call
    or a later begin_step, each request would read the other's KV through it."""
    mgr = _manager(max_rows=2, capacity=8, topk=2)
    mgr.register_host_kv(_pool(4))
    mgr.add(0)
    mgr.add(1)
    qsl, seq = torch.tensor([0, 1, 2], dtype=I32), torch.tensor([9, 9], dtype=I32)
    table = torch.tensor([[0, 1], [2, 3]], dtype=I32)
    meta = mgr.begin_step(qsl, seq, table, 2)
    if lifecycle == "swap_rows":
        mgr.swap_rows(0, 1)
    elif lifecycle == "free":
        mgr.free(1)
    else:
        mgr.begin_step(qsl, seq, table, 2)
    snap = _snapshot(mgr)
    topk = torch.tensor([[[3, 5]], [[3, 5]]], dtype=I32)
    with pytest.raises(ValueError, match="meta: superseded"):
        mgr.retrieve(0, topk, meta)
    assert _unchanged(mgr, snap)
    if lifecycle == "free":
        return
    meta = mgr.begin_step(qsl, seq, table, 2)
    out = mgr.retrieve(0, topk, meta)
    host = mgr.host_kv[0][0]
    for token, blocks in enumerate(table.tolist()):     # each token reads its own request's KV
        state_row = mgr.state_row(token)
        for pos, slot in zip((3, 5), out.plan.slots[state_row, 0].tolist()):
            assert torch.equal(mgr.kv[0][0][state_row, slot], host[blocks[pos // 8], pos % 8])


def test_blocks_are_checked_when_the_pool_comes_after_begin_step():
    """begin_step cannot check a block table against a pool not yet registered: retrieve does,
    before it plans (the gather that follows reads the table unchecked)."""
    mgr = _manager(capacity=8, topk=2, check=True)
    mgr.add(0)
    meta = mgr.begin_step(torch.tensor([0, 1], dtype=I32), torch.tensor([12], dtype=I32),
                          torch.tensor([[0, -1]], dtype=I32), 1)
    mgr.register_host_kv(_pool(2))
    snap = _snapshot(mgr)
    with pytest.raises(ValueError, match=r"block_table\[0, 1\] = -1: expected a host block"):
        mgr.retrieve(0, torch.tensor([[[10, 1]]], dtype=I32), meta)
    assert _unchanged(mgr, snap)


def test_blocks_begin_step_checked_are_not_checked_again_per_layer(monkeypatch):
    """Checked in begin_step against the pool, a meta's blocks are not re-read (device reads, so
    host syncs on an NPU) by every layer's retrieve; a pool registered since is checked again."""
    mgr = _manager(capacity=8, topk=2, check=True)
    mgr.register_host_kv(_pool(2))
    mgr.add(0)
    calls = []
    real = type(mgr)._check_blocks
    monkeypatch.setattr(type(mgr), "_check_blocks",
                        lambda self, *a: (calls.append(1), real(self, *a))[1])
    meta = mgr.begin_step(torch.tensor([0, 1], dtype=I32), torch.tensor([12], dtype=I32),
                          torch.tensor([[0, 1]], dtype=I32), 1)
    assert len(calls) == 1
    for layer in range(len(mgr.buffers)):
        mgr.retrieve(layer, torch.tensor([[[10, 1]]], dtype=I32), meta)
    assert len(calls) == 1
    # a meta with other tensors than begin_step checked is checked again
    bad = meta._replace(block_table=torch.full_like(meta.block_table, 7))
    with pytest.raises(ValueError, match=r"block_table\[0, 0\] = 7: expected a host block"):
        mgr.retrieve(0, torch.tensor([[[10, 1]]], dtype=I32), bad)
    mgr.register_host_kv(_pool(1))          # one block: block 1 of the table is gone
    with pytest.raises(ValueError, match=r"block_table\[0, 1\] = 1: expected a host block"):
        mgr.retrieve(0, torch.tensor([[[10, 1]]], dtype=I32), meta)
    # begin_step unchecked: a checked retrieve checks the blocks itself
    mgr.register_host_kv(_pool(2))
    meta = mgr.begin_step(torch.tensor([0, 1], dtype=I32), torch.tensor([12], dtype=I32),
                          torch.tensor([[0, 5]], dtype=I32), 1, check=False)
    with pytest.raises(ValueError, match=r"block_table\[0, 1\] = 5: expected a host block"):
        mgr.retrieve(0, torch.tensor([[[10, 1]]], dtype=I32), meta, check=True)


def test_write_kv_refuses_negative_rows_other_than_padding():
    mgr = _manager(capacity=8, topk=2, check=True)
    host = [tuple(torch.zeros(2, 8, 1, 4) for _ in range(2))]
    mgr.register_host_kv(host)
    with pytest.raises(ValueError, match=r"slot_mapping\[0\] = -5: only -1 may be negative"):
        mgr.write_kv(0, torch.tensor([-5, 3]), [torch.ones(2, 1, 4) for _ in range(2)])
    assert all(not bool(c.any()) for c in host[0])
    mgr.write_kv(0, torch.tensor([-1, 3]), [torch.ones(2, 1, 4) for _ in range(2)])
    assert bool((host[0][0][0, 3] == 1).all()) and not bool(host[0][0][0, :3].any())


def test_fetch_plans_and_resize_moves_do_not_mix():
    """A plan's miss_pos are positions (host rows), a resize's are slots of the buffer: each
    taken by the other's copy would write wrong rows with no error."""
    length = 16
    host = torch.randn(1, length, 8)
    kv = torch.zeros(1, 8, 8)           # 32 B slots: any core count may gather them
    buf = avsg.SparseKVBuffer(rows=1, capacity=8, topk=2)
    seq = torch.tensor([length], dtype=I32)
    for pair in ([10, 11], [12, 13], [14, 15]):
        plan = buf.plan(torch.tensor([[pair]], dtype=I32), seq)
        avsg.gather(plan, host, kv)
    before = kv.clone()
    with pytest.raises(ValueError, match="moves: a plan of SparseKVBuffer.plan"):
        avsg.apply_moves(plan, [kv])
    moves = buf.resize(torch.tensor([0]), torch.tensor([2]))
    assert moves.moves and not plan.moves
    with pytest.raises(ValueError, match="plan: the moves of SparseKVBuffer.resize"):
        avsg.gather(moves, host, kv)
    assert torch.equal(kv, before)
    avsg.apply_moves(moves, [kv])
    assert all(torch.equal(kv[0, s], host[0, p]) for p, s in buf.resident(0).items())


def test_another_managers_step_meta_is_refused():
    """Issue 40, F2: two managers (one per microbatch) that have seen the same number of
    lifecycle calls have equal generations; B must still refuse A's meta, which maps batch rows
    to A's state rows, with the state untouched."""
    a, b = _manager(max_rows=2), _manager(max_rows=2)
    for mgr in (a, b):
        mgr.register_host_kv(_pool(4))
        mgr.add(0)
        mgr.add(1)
    b.swap_rows(0, 1)
    a.swap_rows(0, 1)
    args = (torch.tensor([0, 1, 2], dtype=I32), torch.tensor([8, 8], dtype=I32),
            torch.tensor([[0, 1], [2, 3]], dtype=I32), 2)
    meta_a, meta_b = a.begin_step(*args), b.begin_step(*args)
    assert meta_a.generation == meta_b.generation, "the case needs equal generations"
    topk = torch.tensor([[[0, 1, 2, 3]], [[4, 5, 6, 7]]], dtype=I32)
    snap = _snapshot(b)
    with pytest.raises(ValueError, match="meta: made by another SparseOffloadManager"):
        b.retrieve(0, topk, meta_a)
    assert _unchanged(b, snap)
    rtk = a.begin_step_rtk(torch.tensor([8, 8], dtype=I32), 1, args[2])
    with pytest.raises(ValueError, match="meta: made by another SparseOffloadManager"):
        b.step(0, topk.view(2, 1, 4), rtk)
    assert _unchanged(b, snap)
    b.retrieve(0, topk, meta_b)              # its own meta: fine


def test_begin_step_rtk_names_active_for_a_free_row():
    """Issue 40, U1: the fault is ``active`` (begin_step_rtk takes no query_start_loc)."""
    mgr = _manager(max_rows=2, check=True)
    mgr.register_host_kv(_pool(4))
    mgr.add(0)
    with pytest.raises(ValueError, match=r"^active\[1\]: batch row 1 is active but holds no "
                                         r"request"):
        mgr.begin_step_rtk(torch.tensor([8, 8], dtype=I32), 1,
                           torch.tensor([[0, 1], [2, 3]], dtype=I32))
    mgr.begin_step_rtk(torch.tensor([8, 8], dtype=I32), 1, torch.tensor([[0, 1], [2, 3]], dtype=I32),
                       active=torch.tensor([True, False]))


def test_another_host_pool_forgets_what_the_old_one_filled():
    """The host pool is the truth: a pool registered in place of another (other tensors, other
    bytes) makes every resident copy a copy of the old pool. They were kept, and a plan hit
    them; now every row starts cold (its request keeps it). The same tensors again keep it."""
    mgr = _manager(capacity=8, topk=2, check=True)
    mgr.register_host_kv(_pool(2, seed=0))
    mgr.add(0)
    table, topk = torch.tensor([[0, 1]], dtype=I32), torch.tensor([[[10, 1]]], dtype=I32)

    def retrieve():
        meta = mgr.begin_step(torch.tensor([0, 1], dtype=I32), torch.tensor([12], dtype=I32),
                              table, 1)
        out = mgr.retrieve(0, topk, meta)
        host = mgr.host_kv[0][0].view(-1, 4)
        for pos, slot in zip((10, 1), out.slots[0, 0].tolist()):
            row = int(table[0, pos // 8]) * 8 + pos % 8
            assert torch.equal(mgr.kv[0][0][0, slot, 0], host[row])
        return out

    retrieve()
    assert set(mgr.resident(0, 0)) == {1, 10}
    mgr.register_host_kv(mgr.host_kv)                 # the same tensors: residency kept
    assert int(retrieve().plan.miss_counts[0]) == 0
    mgr.register_host_kv(_pool(2, seed=1))            # another pool: its bytes are read
    assert int(retrieve().plan.miss_counts[0]) == 2 and mgr.holds_request(0)
