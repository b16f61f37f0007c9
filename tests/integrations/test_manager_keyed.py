"""The manager driven by request keys (``begin_step(requests=...)``), as MindIE would drive it.

MindIE names a batch by sequence id each pass, in any order; no ``add`` / ``free`` / ``move_row``.
A random schedule (sequences arrive, leave, come back under the same id with new KV, reorder)
runs through a keyed manager, and after every layer every selection attention reads through the
returned slots equals the host pool's current bytes for that sequence and position. A sequence
that left (``release``) and came back starts cold, also when it comes back before the next pass
and with a prefix already in the host pool (a prefix-cache hit, so its first pass starts past
position 0). Mixing keys with batch-row lifecycle calls is refused.
"""
from __future__ import annotations

import random

import pytest
import torch

from avsg.cache import SparseOffloadManager

T, K, S, BS = 2, 4, 8, 8
HOST_BS, MAX_LEN, WIDTH, LAYERS, R = 8, 64, 4, 2, 3
I32 = torch.int32


class KeyedEngine:
    def __init__(self, policy, seed):
        self.rng = random.Random(seed)
        self.gen = torch.Generator().manual_seed(seed)
        self.mgr = SparseOffloadManager(
            num_layers=LAYERS, max_rows=R, capacity=S, topk=K, queries_per_step=T,
            kv_format="fp32", resident_block_size=BS, latent_dim=WIDTH, rope_dim=WIDTH,
            policy=policy, max_context=MAX_LEN, check=True)
        blocks = MAX_LEN // HOST_BS
        self.pool_blocks = 5 * blocks
        self.host = [tuple(torch.zeros(self.pool_blocks, HOST_BS, 1, WIDTH) for _ in range(2))
                     for _ in range(LAYERS)]
        self.mgr.register_host_kv(self.host)
        self.free_blocks = list(range(self.pool_blocks))
        self.seqs = {}                 # id -> (block list, computed length)
        self.reads = 0

    def admit(self, sid, prefix=None):
        """A sequence with new blocks; ``prefix`` positions of its KV are in the host pool
        already (a prefix-cache hit: its first pass through the manager starts past 0)."""
        blocks = [self.free_blocks.pop(self.rng.randrange(len(self.free_blocks)))
                  for _ in range(MAX_LEN // HOST_BS)]
        prefix = self.rng.choice((0, 8, 16)) if prefix is None else prefix
        self.seqs[sid] = [blocks, prefix]
        for layer in range(LAYERS):
            for part in self.host[layer]:
                flat = part.view(-1, 1, WIDTH)
                for pos in range(prefix):
                    flat[self.host_row(sid, pos)] = torch.randn(1, WIDTH, generator=self.gen)

    def leave(self, sid):
        """Finished or preempted: its blocks go back to the pool, and the manager hears of it
        (it may come back under the same id before the next pass)."""
        blocks, _ = self.seqs.pop(sid)
        self.free_blocks += blocks
        self.mgr.release([sid])

    def host_row(self, sid, pos):
        blocks = self.seqs[sid][0]
        return blocks[pos // HOST_BS] * HOST_BS + pos % HOST_BS

    def run_pass(self, order):
        q = 1
        seq_lens = torch.tensor([self.seqs[s][1] + q for s in order], dtype=I32)
        qsl = torch.arange(len(order) + 1, dtype=I32) * q
        table = torch.tensor([self.seqs[s][0] for s in order], dtype=I32)
        meta = self.mgr.begin_step(qsl, seq_lens, table, len(order) * q, requests=list(order))
        for layer in range(LAYERS):
            mapping = torch.tensor([self.host_row(s, self.seqs[s][1]) for s in order])
            new = [torch.randn(len(order), 1, WIDTH, generator=self.gen) for _ in range(2)]
            self.mgr.write_kv(layer, mapping, new)
            topk = torch.full((len(order), 1, K), -1, dtype=I32)
            for i, s in enumerate(order):
                length = self.seqs[s][1] + 1
                picks = self.rng.sample(range(max(0, length - 10), length), min(K, length))
                topk[i, 0, :len(picks)] = torch.tensor(picks, dtype=I32)
            out = self.mgr.retrieve(layer, topk, meta)
            for i, s in enumerate(order):
                valid = out.slots[i, 0][out.slots[i, 0] >= 0]
                picks = topk[i, 0][topk[i, 0] >= 0]
                assert valid.numel() == picks.numel()
                state_row = int(out.block_table[i, 0]) // (S // BS)
                for slot, pos in zip(valid.tolist(), picks.tolist()):
                    for c in range(2):
                        got = self.mgr.kv[layer][c][state_row, slot]
                        want = self.host[layer][c].view(-1, 1, WIDTH)[self.host_row(s, pos)]
                        assert torch.equal(got, want), f"sequence {s} pos {pos}: stale KV"
                        self.reads += 1
        for s in order:
            self.seqs[s][1] += 1


@pytest.mark.parametrize("policy", ["lifetime", "lru", "reuse"])
@pytest.mark.parametrize("seed", range(3))
def test_keyed_schedule_reads_the_hosts_bytes(policy, seed):
    engine = KeyedEngine(policy, seed)
    rng = engine.rng
    next_id = 0
    for _ in range(40):
        if len(engine.seqs) < R and rng.random() < 0.5:
            # a new id, or an id that left coming back with new KV (a resumed sequence)
            sid = rng.choice([next_id, next_id - 1]) if next_id else 0
            if sid in engine.seqs:
                sid = next_id
            engine.admit(sid)
            next_id = max(next_id, sid + 1)
        live = [s for s in engine.seqs if engine.seqs[s][1] < MAX_LEN - 1]
        for s in [s for s in engine.seqs if s not in live]:
            engine.leave(s)
        if live and rng.random() < 0.15:
            engine.leave(rng.choice(live))
            live = list(engine.seqs)
        if not live:
            continue
        rng.shuffle(live)                       # any batch order, any pass
        engine.run_pass(live)
    assert engine.reads > 0


def test_a_key_that_left_starts_cold():
    engine = KeyedEngine("lifetime", 0)
    engine.admit("a", prefix=0)
    for _ in range(6):
        engine.run_pass(["a"])
    row = engine.mgr.rows.row_of("a")
    assert engine.mgr.residency.resident(0, row)
    engine.leave("a")
    engine.admit("b", prefix=0)
    engine.run_pass(["b"])                      # "a" is absent: its row is freed
    assert engine.mgr.rows.row_of("a") is None
    engine.leave("b")
    engine.admit("a", prefix=4)                 # back, new blocks, its prefix in the host
    engine.run_pass(["a"])                      # (reads checked against the host's bytes)
    row = engine.mgr.rows.row_of("a")
    assert set(engine.mgr.residency.resident(0, row)) <= {0, 1, 2, 3, 4}


def test_keys_and_batch_rows_do_not_mix():
    engine = KeyedEngine("lifetime", 0)
    engine.admit(7)
    engine.run_pass([7])
    with pytest.raises(ValueError, match="add: this manager follows request keys"):
        engine.mgr.add(0)
    other = KeyedEngine("lifetime", 1)
    other.mgr.add(0)
    qsl = torch.tensor([0, 1], dtype=I32)
    with pytest.raises(ValueError, match="requests: this manager's rows are batch rows"):
        other.mgr.begin_step(qsl, torch.tensor([1], dtype=I32),
                             torch.zeros(1, 8, dtype=I32), 1, requests=["x"])
    with pytest.raises(ValueError, match="requests: a key appears twice"):
        engine.mgr.begin_step(torch.tensor([0, 1, 2], dtype=I32), torch.tensor([1, 1], dtype=I32),
                              torch.zeros(2, 8, dtype=I32), 2, requests=[7, 7])


def test_invalidate_after_release_reaches_the_requests_of_the_last_pass():
    """``invalidate`` takes the last pass's batch order. ``release`` of another key between the
    pass and the invalidate used to renumber the batch positions (as if no pass had run), so
    with ``auto_invalidate`` off the rejected draft of "a" was dropped from "b"'s row and "a"
    read the draft's old bytes in its next pass."""
    T2, rows = 2, 3
    mgr = SparseOffloadManager(num_layers=1, max_rows=rows, capacity=S, topk=K,
                               queries_per_step=T2, kv_format="fp32", resident_block_size=BS,
                               latent_dim=WIDTH, rope_dim=WIDTH, auto_invalidate=False, check=True)
    host = [tuple(torch.zeros(3 * 4, HOST_BS, 1, WIDTH) for _ in range(2))]
    mgr.register_host_kv(host)
    blocks = {key: [4 * i + b for b in range(4)] for i, key in enumerate("abc")}
    gen = torch.Generator().manual_seed(0)

    def host_row(key, pos):
        return blocks[key][pos // HOST_BS] * HOST_BS + pos % HOST_BS

    for key in blocks:                                   # a prompt of 10 positions each
        for pos in range(10):
            for part in host[0]:
                part.view(-1, 1, WIDTH)[host_row(key, pos)] = torch.randn(1, WIDTH, generator=gen)

    def run(order, start, q, picks):
        """One pass: ``q`` tokens of each key from ``start[key]``; token ``j`` selects the
        positions of ``picks[key]`` it can see. Every read is checked against the host."""
        seq = torch.tensor([start[k] + q for k in order], dtype=I32)
        qsl = torch.arange(len(order) + 1, dtype=I32) * q
        table = torch.tensor([blocks[k] for k in order], dtype=I32)
        meta = mgr.begin_step(qsl, seq, table, len(order) * q, requests=list(order))
        mapping = torch.tensor([host_row(k, start[k] + j) for k in order for j in range(q)])
        mgr.write_kv(0, mapping, [torch.randn(len(order) * q, 1, WIDTH, generator=gen)
                                  for _ in range(2)])
        topk = torch.full((len(order) * q, 1, K), -1, dtype=I32)
        for i, k in enumerate(order):
            for j in range(q):
                seen = [p for p in picks[k] if p <= start[k] + j]
                topk[i * q + j, 0, :len(seen)] = torch.tensor(seen, dtype=I32)
        out = mgr.retrieve(0, topk, meta)
        for t in range(len(order) * q):
            key, state_row = order[t // q], int(out.block_table[t // q, 0]) // (S // BS)
            slots, picked = out.slots[t, 0], topk[t, 0]
            for slot, pos in zip(slots[slots >= 0].tolist(), picked[picked >= 0].tolist()):
                for c in range(2):
                    want = host[0][c].view(-1, 1, WIDTH)[host_row(key, pos)]
                    assert torch.equal(mgr.kv[0][c][state_row, slot], want), \
                        f"{key} pos {pos}: stale KV"

    run(["a", "b", "c"], {k: 10 for k in "abc"}, 1, {"a": [1, 2], "b": [3], "c": [4]})
    # MTP: tokens at 11 and 12; 12 is a draft that the second token selects
    run(["b", "a", "c"], {k: 11 for k in "abc"}, T2, {"a": [12, 5], "b": [12, 6], "c": [7]})
    assert 12 in mgr.resident(0, 1)                      # "a" (batch position 1) holds it
    mgr.release(["c"])                                    # c finished
    # a's draft rejected, b's accepted: in the last pass's order (b, a, c)
    mgr.invalidate(torch.tensor([13, 12, 2 ** 24], dtype=I32))
    assert 12 not in mgr.resident(0, 1)
    run(["b", "a"], {"a": 12, "b": 13}, T2, {"a": [12, 5], "b": [13, 6]})


def test_a_keyed_pass_without_its_keys_is_refused():
    """Once the manager follows keys, a pass without them would map its batch positions to the
    last pass's rows: here "b" moved to position 0 and would have read "a"'s KV. Refused,
    naming ``requests`` (``begin_step_rtk``: itself), and nothing changes."""
    engine = KeyedEngine("lifetime", 0)
    engine.admit("a", prefix=8)
    engine.admit("b", prefix=8)
    engine.run_pass(["a", "b"])
    mgr = engine.mgr
    before = (mgr.rows.held(), mgr._generation, mgr.state_row_of_batch_row.clone(),
              [b.state.clone() for b in mgr.buffers])
    table = torch.tensor([engine.seqs[s][0] for s in ("b", "a")], dtype=I32)
    seq = torch.tensor([10, 10], dtype=I32)
    with pytest.raises(ValueError, match=r"^requests: this manager follows request keys"):
        mgr.begin_step(torch.tensor([0, 1, 2], dtype=I32), seq, table, 2)
    full = torch.zeros(R, MAX_LEN // HOST_BS, dtype=I32)
    with pytest.raises(ValueError, match=r"^begin_step_rtk: this manager follows request keys"):
        mgr.begin_step_rtk(torch.full((R,), 10, dtype=I32), 1, full)
    after = (mgr.rows.held(), mgr._generation, mgr.state_row_of_batch_row,
             [b.state for b in mgr.buffers])
    assert before[:2] == after[:2] and torch.equal(before[2], after[2])
    assert all(torch.equal(x, y) for x, y in zip(before[3], after[3]))
    engine.run_pass(["b", "a"])                  # with its keys: each reads its own KV


def test_a_refused_keyed_begin_step_changes_nothing():
    """The row table followed a pass's keys before its checks ran: a refused pass had already
    freed the rows of the keys absent from it and given (reset) rows to its new keys."""
    engine = KeyedEngine("lifetime", 0)
    for sid in ("a", "b"):
        engine.admit(sid, prefix=8)
    engine.run_pass(["a", "b"])
    engine.admit("c", prefix=8)
    mgr = engine.mgr
    before = (mgr.rows.held(), mgr.rows.free_rows(), mgr._generation,
              mgr.state_row_of_batch_row.clone(), [b.state.clone() for b in mgr.buffers])
    table = torch.tensor([engine.seqs[s][0] for s in ("c", "b")], dtype=I32)
    qsl = torch.tensor([0, 1, 2], dtype=I32)
    with pytest.raises(ValueError, match=r"^seq_lens\[1\] = -1"):
        mgr.begin_step(qsl, torch.tensor([9, -1], dtype=I32), table, 2, requests=["c", "b"])
    with pytest.raises(ValueError, match=r"^block_table\[0, 1\] = -1"):
        mgr.begin_step(qsl, torch.tensor([9, 10], dtype=I32),
                       torch.cat([table[:, :1], -torch.ones(2, 7, dtype=I32)], 1), 2,
                       requests=["c", "b"])
    after = (mgr.rows.held(), mgr.rows.free_rows(), mgr._generation,
             mgr.state_row_of_batch_row, [b.state for b in mgr.buffers])
    assert before[:3] == after[:3] and torch.equal(before[3], after[3])
    assert all(torch.equal(x, y) for x, y in zip(before[4], after[4]))
    engine.run_pass(["c", "b"])
    assert mgr.rows.row_of("a") is None
