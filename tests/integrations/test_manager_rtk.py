"""The manager's ``[R, T, K]`` entries (``begin_step_rtk`` and the core's ``step``, by state row) against its TND
entries (``begin_step`` / ``retrieve``), and its recorded invalidation.

Two managers are driven through the same passes, one per entry pair, with rows swapped between
passes (batch row != state row), idle rows, rejected MTP drafts, passes that bypass the buffer and
explicit ``invalidate`` calls. After every layer of every pass the two have the same buffer state
and host-copy counts, the ``[R, q, K]`` slots are the TND slots before their valid-first
compaction, and every row read through them equals the host pool's row at the selected position
(the truth: it holds the latest write of every position), bit for bit.
"""
from __future__ import annotations

import random

import pytest
import torch

from avsg.cache import SparseOffloadManager

POLICIES = ("reuse", "lifetime", "lru")
R, T, K, S, BS = 3, 3, 4, 16, 8
HOST_BS, MAX_LEN, WIDTH, LAYERS = 8, 128, 4, 2
I32 = torch.int32


def _manager(policy, write_through, auto_invalidate):
    mgr = SparseOffloadManager(
        num_layers=LAYERS, max_rows=R, capacity=S, topk=K, queries_per_step=T, kv_format="fp32",
        resident_block_size=BS, latent_dim=WIDTH, rope_dim=WIDTH, write_through=write_through,
        policy=policy, max_context=MAX_LEN, auto_invalidate=auto_invalidate, check=True)
    blocks = R * (MAX_LEN // HOST_BS) + 2
    host = [tuple(torch.zeros(blocks, HOST_BS, 1, c.width, dtype=c.dtype)
                  for c in mgr.kv_format.components) for _ in range(LAYERS)]
    mgr.register_host_kv(host)
    for row in range(R):
        mgr.add(row)
    return mgr, host


class Twins:
    def __init__(self, policy, write_through, auto_invalidate, seed):
        self.rng = random.Random(seed)
        self.gen = torch.Generator().manual_seed(seed)
        self.rtk, self.host = _manager(policy, write_through, auto_invalidate)
        self.tnd, self.tnd_host = _manager(policy, write_through, auto_invalidate)
        order = torch.randperm(R * (MAX_LEN // HOST_BS), generator=self.gen)
        self.req_blocks = order.view(R, -1).to(I32)          # request -> its host blocks
        self.req_of_row = list(range(R))                     # batch row -> request
        self.computed = [self.rng.randrange(4, 20) for _ in range(R)]    # per request
        self.reads = 0

    def block_table(self):
        return self.req_blocks[self.req_of_row].contiguous()

    def host_row(self, req, pos):
        return int(self.req_blocks[req, pos // HOST_BS]) * HOST_BS + pos % HOST_BS

    def swap(self, a, b):
        for mgr in (self.rtk, self.tnd):
            mgr.swap_rows(a, b)
        self.req_of_row[a], self.req_of_row[b] = self.req_of_row[b], self.req_of_row[a]

    def select(self, pos):
        recent = list(range(max(0, pos - 5), pos + 1))
        cands = recent + [self.rng.randrange(pos + 1) for _ in range(K)]
        self.rng.shuffle(cands)
        picked = []
        for p in cands:
            if p not in picked and len(picked) < self.rng.randint(1, K):
                picked.append(p)
        return picked + [-1] * (K - len(picked))

    def run_pass(self, queries, active, retrieve=True):
        reqs = self.req_of_row
        seq = torch.tensor([self.computed[reqs[b]] + (queries if active[b] else 0)
                            for b in range(R)], dtype=I32)
        act = torch.tensor(active)
        q_len = [queries if a else 0 for a in active]
        qsl = torch.tensor([0] + list(torch.tensor(q_len).cumsum(0)), dtype=I32)
        table = self.block_table()
        meta_rtk = self.rtk.begin_step_rtk(seq, queries, table, active=act)
        meta_tnd = self.tnd.begin_step(qsl, seq, table, R * queries)
        # token (b, j): index b * queries + j in the rtk layout, qsl[b] + j packed
        packed = [[int(qsl[b]) + j if active[b] else None for j in range(queries)]
                  for b in range(R)]
        for layer in range(LAYERS):
            new = [torch.randn(R * queries, 1, WIDTH, generator=self.gen) for _ in range(2)]
            slot_rtk = torch.full((R * queries,), -1, dtype=torch.int64)
            slot_tnd = torch.full((R * queries,), -1, dtype=torch.int64)
            new_tnd = [torch.zeros_like(n) for n in new]
            topk = torch.full((R, queries, K), -1, dtype=I32)
            topk_tnd = torch.full((R * queries, 1, K), -1, dtype=I32)
            for b in range(R):
                for j in range(queries):
                    if not active[b]:
                        continue
                    pos = self.computed[reqs[b]] + j
                    t = packed[b][j]
                    slot_rtk[b * queries + j] = slot_tnd[t] = self.host_row(reqs[b], pos)
                    for n, nt in zip(new, new_tnd):
                        nt[t] = n[b * queries + j]
                    if queries <= T:
                        topk[b, j] = topk_tnd[t, 0] = torch.tensor(self.select(pos), dtype=I32)
            self.rtk.write_kv(layer, slot_rtk, new)
            self.tnd.write_kv(layer, slot_tnd, new_tnd)
            if retrieve and queries <= T:
                # the core's step takes and returns state-row order
                order = torch.tensor([self.rtk.state_row(b) for b in range(R)])
                by_state = torch.full_like(topk, -1)
                by_state[order] = topk
                out = self.rtk.step(layer, by_state, meta_rtk, new_kv=new)
                ref = self.tnd.retrieve(layer, topk_tnd, meta_tnd, new_kv=new_tnd)
                self.compare(layer, topk, out, ref, packed, active)

    def compare(self, layer, topk, out, ref, packed, active):
        assert torch.equal(self.rtk.buffers[layer].state, self.tnd.buffers[layer].state)
        assert int(self.rtk.h2d_rows) == int(self.tnd.h2d_rows)
        assert int(self.rtk.write_through_rows) == int(self.tnd.write_through_rows)
        copied_tnd = torch.where(ref.host_copied, ref.plan.miss_pos, -1)
        for b in range(R):
            state_row = self.rtk.state_row(b)
            assert torch.equal(out.host_pos[state_row], copied_tnd[state_row])
            assert int(out.host_counts[state_row]) == int(ref.host_copied[state_row].sum())
            for j in range(topk.shape[1]):
                slots = out.slots[state_row, j]
                assert torch.equal(slots >= 0, topk[b, j] >= 0)
                if not active[b]:
                    continue
                valid = slots[slots >= 0]
                tnd = ref.slots[packed[b][j], 0]
                assert torch.equal(tnd[:valid.numel()], valid)
                assert bool((tnd[valid.numel():] == -1).all())
                for k in range(K):
                    pos = int(topk[b, j, k])
                    if pos < 0:
                        continue
                    row = self.host_row(self.req_of_row[b], pos)
                    for kv, pool in zip(self.rtk.kv[layer], self.host[layer]):
                        read = kv[state_row, int(slots[k]), 0]
                        want = pool.view(-1, WIDTH)[row]
                        assert torch.equal(read, want), (layer, b, pos, "stale KV")
                    self.reads += 1

    def accept(self, queries, active):
        for b in range(R):
            if active[b]:
                req = self.req_of_row[b]
                # drafts past the accepted ones are rewritten by the next pass
                self.computed[req] += queries if queries > T else self.rng.randint(1, queries)


@pytest.mark.parametrize("auto_invalidate", [True, False], ids=["auto", "explicit"])
@pytest.mark.parametrize("write_through", [False, True], ids=["host-gather", "write-through"])
@pytest.mark.parametrize("policy", POLICIES)
def test_rtk_entries_match_tnd_entries(policy, write_through, auto_invalidate):
    for seed in range(3):
        twins = Twins(policy, write_through, auto_invalidate, seed)
        rng = twins.rng
        for _ in range(14):
            if rng.random() < 0.3:
                a, b = rng.sample(range(R), 2)
                twins.swap(a, b)
            active = [rng.random() < 0.8 for _ in range(R)]
            bypass = rng.random() < 0.15
            queries = T + rng.randint(1, 3) if bypass else rng.randint(1, T)
            if max(twins.computed) + queries >= MAX_LEN:
                break
            twins.run_pass(queries, active, retrieve=not bypass or rng.random() < 0.5)
            twins.accept(queries, active)
            if not auto_invalidate or rng.random() < 0.3:
                valid = torch.tensor([twins.computed[r] for r in twins.req_of_row], dtype=I32)
                for mgr in (twins.rtk, twins.tnd):
                    mgr.invalidate(valid)
        assert twins.reads > 0


def test_invalidate_is_recorded_and_applied_by_the_next_plan_once():
    twins = Twins("reuse", False, False, seed=7)
    mgr = twins.rtk
    for _ in range(3):
        twins.run_pass(T, [True] * R)
        twins.accept(T, [True] * R)
        valid = torch.tensor([twins.computed[r] for r in twins.req_of_row], dtype=I32)
        for twin in (mgr, twins.tnd):       # no auto_invalidate: the engine drops its drafts
            twin.invalidate(valid)
    launches = []       # (layer, its drop limit) per buffer call that may drop
    for layer, buf in enumerate(mgr.buffers):
        for name in ("invalidate", "step"):
            original = getattr(buf, name)

            def counted(*args, _o=original, _l=layer, **kwargs):
                limit = kwargs.get("drop_from")
                launches.append(_l if limit is None else (_l, int(limit[mgr.state_row(0)])))
                return _o(*args, **kwargs)
            setattr(buf, name, counted)
    held = {layer: mgr.buffers[layer].resident(mgr.state_row(0)) for layer in range(LAYERS)}
    limit = min(held[0]) + 1
    valid = torch.full((R,), MAX_LEN, dtype=I32)
    valid[0] = limit
    for twin in (mgr, twins.tnd):
        twin.invalidate(valid, layers=[0])
        twin.invalidate(valid + 1)          # drops accumulate: the lower limit wins
    assert launches == []
    assert mgr.buffers[0].resident(mgr.state_row(0)) == held[0]     # nothing launched yet
    assert mgr.resident(0, 0) == {p: s for p, s in held[0].items() if p < limit}
    assert mgr.resident(1, 0) == {p: s for p, s in held[1].items() if p < limit + 1}
    # the next pass rewrites limit + 1 (what both layers dropped), reads the rest from the host
    twins.computed[twins.req_of_row[0]] = limit + 1
    twins.run_pass(1, [True, False, False])
    # one buffer call per layer (its step), each dropping what was recorded for it
    assert launches == [(0, limit), (1, limit + 1)]
    for layer in range(LAYERS):
        assert all(p <= limit + 1 for p in mgr.buffers[layer].resident(mgr.state_row(0)))


def test_step_bad_input_names_the_argument_and_touches_nothing():
    mgr, _ = _manager("reuse", True, True)
    seq = torch.full((R,), 8, dtype=I32)
    table = torch.zeros(R, MAX_LEN // HOST_BS, dtype=I32)
    with pytest.raises(ValueError, match="seq_lens"):
        mgr.begin_step_rtk(seq[:2], 2, table)
    with pytest.raises(TypeError, match="active: expected dtype torch.bool"):
        mgr.begin_step_rtk(seq, 2, table, active=torch.ones(R, dtype=torch.int32))
    meta = mgr.begin_step_rtk(seq, 2, table)
    state = [buf.state.clone() for buf in mgr.buffers]
    good = torch.full((R, 2, K), -1, dtype=I32)
    for bad, match in ((torch.full((R, 2, K + 1), -1, dtype=I32), "topk_pos"),
                       (torch.full((R, T + 1, K), -1, dtype=I32), "topk_pos"),
                       (torch.full((R, 1, K), -1, dtype=I32), "meta")):
        with pytest.raises(ValueError, match=match):
            mgr.step(0, bad, meta)
    new = [torch.zeros(R * 2, c.width, dtype=c.dtype) for c in mgr.kv_format.components]
    with pytest.raises(ValueError, match=r"topk_pos\[0, 0, 0\] = 9 is out of range"):
        mgr.step(0, torch.full((R, 2, K), 9, dtype=I32), meta, new_kv=new)
    with pytest.raises(ValueError, match="new_kv"):
        mgr.step(0, good, meta, new_kv=[torch.zeros(R * 2, WIDTH)])
    with pytest.raises(ValueError, match="new_kv: write_through=True needs this pass's KV"):
        mgr.step(0, good, meta)
    assert all(torch.equal(buf.state, s) for buf, s in zip(mgr.buffers, state))


def test_a_row_without_a_request_keeps_its_state():
    """A state row whose request sits out passes (inactive in the pass) is idle in every layer's
    plan: its state, the lives and the hand included, stays byte for byte what its last planned
    pass left, however many passes go by; planned again, it serves what it held (the truth
    check of run_pass). A bypassing pass in between records a drop for every layer: the row's
    next (idle) plan applies that drop and nothing else, exactly as invalidate would."""
    from avsg import reference
    twins = Twins("lifetime", False, True, seed=3)
    for _ in range(2):
        twins.run_pass(T, [True] * R)
        twins.accept(T, [True] * R)
    row = twins.rtk.state_row(1)
    held = [buf.state[row].clone() for buf in twins.rtk.buffers]
    for _ in range(3):
        twins.run_pass(T, [True, False, True])
        twins.accept(T, [True, False, True])
    for buf, before in zip(twins.rtk.buffers, held):
        assert torch.equal(buf.state[row], before)
    # row 1 bypasses (a prefill-like pass rewriting its positions >= first_new): a drop, which
    # the drafts its last pass left resident make visible
    first_new = twins.computed[twins.req_of_row[1]]
    assert any(p >= first_new for p in twins.rtk.resident(0, 1))
    twins.run_pass(T + 1, [False, True, False], retrieve=False)
    twins.accept(T + 1, [False, True, False])
    twins.run_pass(T, [True, False, True])
    for buf, before in zip(twins.rtk.buffers, held):
        want = before[None].clone()
        reference.invalidate(want, buf.layout, torch.tensor([first_new], dtype=I32))
        assert not torch.equal(want[0], before)
        assert torch.equal(buf.state[row], want[0])
    reads = twins.reads
    twins.run_pass(T, [True] * R)
    assert twins.reads > reads
