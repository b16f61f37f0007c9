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
