"""The manager never serves stale KV (issue 17, item 1).

A pass rewrites its own positions ``[seq_len - q_len, seq_len)`` in the host pool; a copy of one
of them still resident in a buffer from an earlier pass (a rejected MTP draft, typically) must
not be a hit afterwards, whether the rewriting pass went through the buffer (``q_len <= T``) or
bypassed it (``q_len > T``: a prefill chunk, or a verification longer than the buffer's T).

Every test drives the manager like an engine (``begin_step``, then per layer ``write_kv`` with
fresh random bytes and ``retrieve``) and checks, after every pass and for every planned token,
that the rows attention reads through the returned slots equal the host pool's rows at the
selected positions, bit for bit. The host pool is the truth: it holds the latest write of every
position.
"""
from __future__ import annotations

import random
from typing import List, Optional, Sequence

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from avsg.cache import SparseOffloadManager

POLICIES = ("reuse", "lifetime", "lru")
T, K, S, BS = 3, 4, 16, 8             # S >= T*K; the resident block size divides S
HOST_BS, MAX_LEN, WIDTH = 8, 128, 4


class Driver:
    """``rows`` requests in fixed batch rows, each with its own host blocks; ``computed[r]``
    positions of request ``r`` are final."""

    def __init__(self, policy: str, write_through: bool, rows: int = 2, layers: int = 2,
                 seed: int = 0, auto_invalidate: bool = True):
        self.R, self.L = rows, layers
        self.mgr = SparseOffloadManager(
            num_layers=layers, max_rows=rows, capacity=S, topk=K, queries_per_step=T,
            kv_format="fp32", resident_block_size=BS, latent_dim=WIDTH, rope_dim=WIDTH,
            write_through=write_through, policy=policy, max_context=MAX_LEN,
            auto_invalidate=auto_invalidate)
        self.gen = torch.Generator().manual_seed(seed)
        blocks_per_row = MAX_LEN // HOST_BS
        num_blocks = rows * blocks_per_row + 3
        order = torch.randperm(num_blocks, generator=self.gen)[:rows * blocks_per_row]
        self.block_table = order.view(rows, blocks_per_row).to(torch.int32).contiguous()
        self.host = [tuple(torch.zeros(num_blocks, HOST_BS, 1, c.width, dtype=c.dtype)
                           for c in self.mgr.kv_format.components) for _ in range(layers)]
        self.mgr.register_host_kv(self.host)
        for r in range(rows):
            self.mgr.add(r)
        self.computed = [0] * rows
        self.planned_reads = 0          # selections checked against the host pool

    def host_rows(self, r: int, pos: Sequence[int]) -> torch.Tensor:
        pos = torch.tensor(list(pos), dtype=torch.int64)
        return self.block_table[r, pos // HOST_BS].long() * HOST_BS + pos % HOST_BS

    def run_pass(self, q_lens: Sequence[int], selections, num_tokens: Optional[int] = None,
                 retrieve: bool = True, skip_layers: Sequence[int] = (),
                 retrieve_first: Sequence[int] = (), refused: Sequence[int] = ()):
        """One pass: request ``r`` writes ``q_lens[r]`` tokens at ``computed[r]...``;
        ``selections(r, pos, layer)`` gives a token's top-k (distinct, ``< pos + 1``).
        ``retrieve=False``: the engine only writes KV (a pass it runs on its prefill path);
        ``skip_layers``: layers whose KV the pass writes but which call no retrieve in it;
        ``retrieve_first``: layers that retrieve before they write the pass's KV (what their
        attention reads of the pass's own positions is then the engine's business: not
        checked in this pass, but every later pass must read the new bytes); ``refused``:
        layers whose retrieve is refused because another thread holds their buffer (the engine
        goes on with the pass without them)."""
        qsl = [0]
        for q in q_lens:
            qsl.append(qsl[-1] + q)
        N = qsl[-1] if num_tokens is None else num_tokens
        seq = [c + q for c, q in zip(self.computed, q_lens)]
        token_pos = [-1] * N
        token_row = [-1] * N
        for r, q in enumerate(q_lens):
            for j in range(q):
                token_pos[qsl[r] + j] = self.computed[r] + j
                token_row[qsl[r] + j] = r
        slot_mapping = torch.full((N,), -1, dtype=torch.int64)
        for t, (p, r) in enumerate(zip(token_pos, token_row)):
            if p >= 0:
                slot_mapping[t] = self.host_rows(r, [p])[0]
        meta = self.mgr.begin_step(torch.tensor(qsl, dtype=torch.int32),
                                   torch.tensor(seq, dtype=torch.int32), self.block_table, N)
        for layer in range(self.L):
            new = [torch.randn(N, 1, c.width, generator=self.gen).to(c.dtype)
                   for c in self.mgr.kv_format.components]
            late = layer in retrieve_first
            if not late:
                self.mgr.write_kv(layer, slot_mapping, new)
            if not retrieve or layer in skip_layers:
                if late:
                    self.mgr.write_kv(layer, slot_mapping, new)
                continue
            topk = torch.full((N, 1, K), -1, dtype=torch.int32)
            for t, (p, r) in enumerate(zip(token_pos, token_row)):
                if p >= 0:
                    picked = list(selections(r, p, layer))
                    topk[t, 0, :len(picked)] = torch.tensor(picked, dtype=torch.int32)
            if layer in refused:
                busy = self.mgr.buffers[layer]._busy
                busy.acquire()                        # another thread inside the buffer
                try:
                    with pytest.raises(RuntimeError, match="in use by another thread"):
                        self.mgr.retrieve(layer, topk, meta, new_kv=new)
                finally:
                    busy.release()
                continue
            out = self.mgr.retrieve(layer, topk, meta, new_kv=new)
            if late:
                self.mgr.write_kv(layer, slot_mapping, new)
            own = {r: self.computed[r] for r in range(self.R)} if late else None
            self.verify(layer, topk, out, token_pos, token_row, q_lens, own)
        return seq

    def verify(self, layer, topk, out, token_pos, token_row, q_lens, own=None) -> None:
        """``own``: per row, the first position this pass wrote after its retrieve (not
        checked: the engine let attention read before the write)."""
        for t, (p, r) in enumerate(zip(token_pos, token_row)):
            slots = out.slots[t, 0]
            if p < 0 or q_lens[r] > T:
                assert not bool(out.planned[t]) and bool((slots == -1).all())
                continue
            want_pos = [int(x) for x in topk[t, 0] if x >= 0]
            n = len(want_pos)
            got = slots[:n]
            assert bool((got >= 0).all()) and bool((slots[n:] == -1).all())
            pages = out.block_table[r, (got // BS).long()].long()
            rows = self.host_rows(r, want_pos)
            for c, pool in enumerate(self.host[layer]):
                read = out.kv[c][pages, (got % BS).long(), 0]
                want = pool.view(-1, pool.shape[-1])[rows]
                stale = [want_pos[i] for i in range(n) if not torch.equal(read[i], want[i])
                         and (own is None or want_pos[i] < own[r])]
                assert not stale, (f"layer {layer} row {r} token at pos {p}: positions {stale} "
                                   f"read bytes that are not the host pool's (stale KV)")
            self.planned_reads += n


@pytest.mark.parametrize("engine", ["retrieve-every-pass", "no-retrieve-on-bypass",
                                    "no-auto-invalidate"])
@pytest.mark.parametrize("write_through", [False, True], ids=["host-gather", "write-through"])
@pytest.mark.parametrize("policy", POLICIES)
def test_long_pass_after_rejected_drafts_is_not_stale(policy, write_through, engine):
    """The review's reproducer: MTP with T = 3. Pass 1 at length 40 selects its drafts 41 and
    42, which are then rejected; pass 2 writes 4 tokens at 41..44 (more than T: it bypasses the
    buffer); pass 3 selects 41 and 42 and must read pass 2's bytes. Also when the engine calls
    no retrieve for the bypassing pass, and with auto_invalidate off (the engine drops its
    rejected drafts itself, but not what a bypassing pass rewrites: that is the manager's)."""
    d = Driver(policy, write_through, rows=1, auto_invalidate=engine != "no-auto-invalidate")
    bypass_retrieves = engine != "no-retrieve-on-bypass"
    d.run_pass([40], lambda r, p, layer: [])              # prefill 0..39 (bypasses)
    d.computed = [40]
    d.run_pass([3], lambda r, p, layer: [q for q in (41, 42, 7, 3) if q <= p][:K])
    d.computed = [41]                                    # drafts 41 and 42 rejected
    assert {41, 42} <= set(d.mgr.buffers[0].resident(0))  # their old copies are resident
    d.run_pass([4], lambda r, p, layer: [], retrieve=bypass_retrieves)   # 41..44: q_len 4 > T
    d.computed = [45]
    d.run_pass([1], lambda r, p, layer: [41, 42, 7, 3])  # pass 3 at position 45
    assert d.planned_reads == 2 * (2 + 3 + 4) + 2 * 4


def _selector(rng: random.Random, first_new: List[int]):
    """Causal top-k biased toward the positions most recently rewritten (this pass's and the
    ones just before it: where a stale copy would show)."""
    def select(r: int, pos: int, layer: int) -> List[int]:
        visible = pos + 1
        recent = list(range(max(0, first_new[r] - 4), visible))
        rng.shuffle(recent)
        cands = recent[:3] + [rng.randrange(visible) for _ in range(K)]
        want = rng.randint(1, K)
        picked: List[int] = []
        for q in cands:
            if q not in picked and len(picked) < want:
                picked.append(q)
        return picked
    return select


PASS = st.tuples(
    st.lists(st.integers(0, T + 3), min_size=2, max_size=2),    # q_len per row (> T: bypass)
    st.lists(st.integers(0, 6), min_size=2, max_size=2),        # tokens accepted, clamped
    st.integers(0, 2 ** 16))                                     # selection seed


@pytest.mark.parametrize("write_through", [False, True], ids=["host-gather", "write-through"])
@pytest.mark.parametrize("policy", POLICIES)
@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(passes=st.lists(PASS, min_size=2, max_size=10))
def test_random_pass_lengths_never_read_stale_kv(policy, write_through, passes):
    """Random passes per row: decode/MTP (1..T tokens) and longer ones that bypass the buffer,
    each followed by a random acceptance (rejected drafts are rewritten by the next pass,
    whatever its length), some passes that plan nothing without a retrieve. Every selection of
    every pass reads the host pool's bytes."""
    d = Driver(policy, write_through)
    d.run_pass([12, 20], lambda r, p, layer: [])            # prefill
    d.computed = [12, 20]
    for q_lens, accepted, seed in passes + [([1, 1], [1, 1], 0)]:    # a decode pass to end
        q_lens = [min(q, MAX_LEN - c) for q, c in zip(q_lens, d.computed)]
        first_new = list(d.computed)
        # a pass with nothing to plan may run without retrieve (the engine's prefill path)
        nothing_planned = all(q == 0 or q > T for q in q_lens)
        d.run_pass(q_lens, _selector(random.Random(seed), first_new),
                   num_tokens=2 * (T + 3),                   # padded to a fixed count
                   retrieve=not (nothing_planned and seed % 2))
        for r, q in enumerate(q_lens):
            if q:
                d.computed[r] += max(1, min(accepted[r], q))
    assert d.planned_reads > 0


@pytest.mark.parametrize("write_through", [False, True], ids=["host-gather", "write-through"])
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("seed", range(3))
def test_layers_that_skip_a_retrieve_or_write_after_it_never_read_stale_kv(policy, write_through,
                                                                           seed):
    """Issue 40, U3 (and U2 with write-through): in random MTP passes with rejected drafts, some
    layers call no retrieve in a pass whose KV they write (the drops of that pass must wait for
    their next retrieve), and with write-through some write the pass's KV after their retrieve.
    Every checked read is the host's current bytes."""
    rng = random.Random(seed)
    d = Driver(policy, write_through, rows=2, layers=3, seed=seed)
    d.run_pass([12, 20], lambda r, p, layer: [])             # prefill
    d.computed = [12, 20]
    for i in range(24):
        q_lens = [min(rng.randint(1, T), MAX_LEN - c) for c in d.computed]
        first_new = list(d.computed)
        layers = list(range(3))
        # writing after the retrieve is refused without write-through (test below)
        late = rng.sample(layers, rng.randint(0, 2)) if write_through else ()
        d.run_pass(q_lens, _selector(random.Random(rng.randrange(2 ** 16)), first_new),
                   skip_layers=rng.sample(layers, rng.randint(0, 1)), retrieve_first=late)
        for r, q in enumerate(q_lens):
            d.computed[r] += rng.randint(1, q)               # the rest are rejected drafts
        if max(d.computed) >= MAX_LEN - T:
            break
    assert d.planned_reads > 100


@pytest.mark.parametrize("write_through", [False, True], ids=["host-gather", "write-through"])
@pytest.mark.parametrize("policy", POLICIES)
def test_a_refused_retrieve_keeps_the_drops_it_owed(policy, write_through):
    """A layer's retrieve refused before its launch (another thread holds the buffer) dropped
    nothing: the positions its pass rewrote (rejected drafts 41 and 42 here) must still wait for
    the layer's next plan. They were lost: the refused call counted as the layer's retrieve, so
    the end of the pass recorded nothing for it, and the next pass read the drafts' old bytes."""
    d = Driver(policy, write_through, rows=1)
    d.run_pass([40], lambda r, p, layer: [])              # prefill 0..39 (bypasses)
    d.computed = [40]
    d.run_pass([3], lambda r, p, layer: [q for q in (41, 42, 7, 3) if q <= p][:K])
    d.computed = [41]                                     # drafts 41 and 42 rejected
    assert {41, 42} <= set(d.mgr.resident(0, 0))
    d.run_pass([3], lambda r, p, layer: [q for q in (41, 42, 7) if q <= p], refused=[0])
    assert not {41, 42} & set(d.mgr.resident(0, 0))      # rewritten: no plan may hit them
    d.computed = [44]                                     # the engine went on
    d.run_pass([1], lambda r, p, layer: [41, 42, 7, 3])
    assert d.planned_reads == 2 * (2 + 3 + 4) + 1 * (2 + 3 + 3) + 2 * 4


@pytest.mark.parametrize("policy", POLICIES)
def test_write_kv_after_its_layers_retrieve_is_refused_without_write_through(policy):
    """Issue 40, U2: the gather read the pass's positions from the host before the write, so
    attention would read their old bytes: refused, naming the order to use, nothing written;
    another layer not yet retrieved still takes its write; the next pass starts afresh."""
    d = Driver(policy, write_through=False, rows=1)
    d.run_pass([12], lambda r, p, layer: [])
    d.computed = [12]
    meta = d.mgr.begin_step(torch.tensor([0, 1], dtype=torch.int32),
                            torch.tensor([13], dtype=torch.int32), d.block_table, 1)
    rows = d.host_rows(0, [12])
    new = [torch.randn(1, 1, c.width) for c in d.mgr.kv_format.components]
    d.mgr.write_kv(0, rows, new)
    d.mgr.retrieve(0, torch.tensor([[[12, 3, -1, -1]]], dtype=torch.int32), meta)
    host_before = [p.clone() for p in d.host[0]]
    with pytest.raises(ValueError, match=r"^write_kv: layer 0 was already retrieved in this pass"):
        d.mgr.write_kv(0, rows, new)
    assert all(torch.equal(a, b) for a, b in zip(d.host[0], host_before))
    d.mgr.write_kv(1, rows, new)                     # layer 1: not retrieved yet
    d.mgr.begin_step(torch.tensor([0, 1], dtype=torch.int32),
                     torch.tensor([14], dtype=torch.int32), d.block_table, 1)
    d.mgr.write_kv(0, d.host_rows(0, [13]), new)    # a new pass: in order again
