"""Adversarial random sessions of the split lookup, the plan's drop and plan_gather, against the
reference, on the CPU kernels (strict and fast emulation).

A session is one geometry (rows, T, K with 1 to 4 selection chunks of a row, S from a full
buffer up, a tight or default hash table, every policy) launched in one form of the lookup:
the split off, on with one core a row (no split), on with the row's own core looking up chunks
beside its helpers, on with a core beside one per chunk (the owner looks up none), and with
cores to spare. Every step drops (``valid_lens``) in some rows: to 0, to exactly a held
position, just past one, around the length (rejected drafts), no-ops and values far out either
way; some rows are idle; ``invalidate``, ``reset`` and ``resize`` come in between. Selections
mix held positions (hits), positions the step's drop frees (misses the helpers must not find),
positions that share probe buckets (the stash), the edges of the length and of the drop,
repeats across query tokens, -1 padding and junk.

After every call the kernel's outputs, whole state and statistics equal the reference's; every
valid selection's slot holds its position; the reference state passes ``check_state``; a strict
launch has the blocks ``buffer.lookup_split`` says (so a session that means to split did). With
``plan_gather`` the destination KV of every resident slot equals its position's host row after
every step, where a drop first rewrites the host rows of the positions it frees (as an engine
writes the accepted tokens' KV there): attention over any slot a plan names reads its
position's current KV.
"""
from __future__ import annotations

import contextlib

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from avsg import backend, reference
from avsg.backend import last_launch_counters
from avsg.buffer import PLAN_CHUNK, lookup_split
from helpers.gather_cases import padded_slots, random_bytes
from helpers.plan_cases import OUT_NAMES, split_lookup

I32, I64 = torch.int32, torch.int64
POLICIES = ("lifetime", "lru", "reuse")
FORMS = ("off", "unsplit", "owner", "no_owner", "spare", "crowded")
MAX_CORES = 40
WILD_LENS = (-(1 << 31), -7, -1, reference.MAX_POSITION, reference.MAX_POSITION + 5, (1 << 31) - 1)
FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))


# ------------------------------------------------------------------------------------ geometry

@st.composite
def geometries(draw, max_chunks=4, max_capacity=8192):
    """(R, T, K, S, H, L, policy, form, cores): cores chosen so ``cores // R`` gives the form."""
    R = draw(st.integers(1, 4))
    T = draw(st.integers(1, 4))
    chunks = draw(st.sampled_from([c for c in (1, 2, 2, 3, 3, 4, 5, 6, 8) if c <= max_chunks]))
    short = draw(st.sampled_from([0, 1, 7, 64, 300, PLAN_CHUNK - 1]))   # the last chunk's gap
    K = max(1, -(-(chunks * PLAN_CHUNK - short) // T))
    N = T * K
    chunks = -(-N // PLAN_CHUNK)
    rooms = ["full", "full", "odd", "double"] + (["windows"] if max_capacity > 8192 else [])
    room = draw(st.sampled_from(rooms))
    # "windows": sections past what the Unified Buffer holds whole (S > 8192), paged in windows
    S = {"full": N, "double": 2 * N}.get(room, 0)
    if room == "odd":
        S = N + draw(st.integers(1, 63))
    elif room == "windows":
        S = draw(st.integers(8193, max_capacity))
    S = max(N, min(S, max_capacity))
    tight = draw(st.booleans())   # load factor near 1: probe buckets taken, the stash used
    H = max(64, 1 << (S - 1).bit_length()) if tight else reference.default_buckets(S)
    L = draw(st.sampled_from([1, 2, 3, 5, 8, reference.MAX_LIFETIME]))
    policy = draw(st.sampled_from(POLICIES))
    form = draw(st.sampled_from(FORMS))
    if form in ("owner", "no_owner", "spare") and chunks < 2:
        form = "unsplit"
    # "off": cores enough to split, the switch off (the launch must stay one block a row)
    per_row = {"off": chunks + 1, "unsplit": 1,
               "owner": draw(st.integers(2, chunks)) if chunks >= 2 else 1,
               "no_owner": chunks + 1, "spare": chunks + 1 + draw(st.integers(1, 4)),
               "crowded": 0}[form]
    per_row = min(per_row, MAX_CORES // R)
    if per_row == 0:   # fewer cores than rows: a core plans several rows, none splits
        cores = draw(st.integers(1, max(1, R - 1)))
    else:
        cores = min(MAX_CORES, R * per_row + draw(st.integers(0, R - 1)))
    return R, T, K, S, H, L, policy, form, cores


@contextlib.contextmanager
def launched_as(form, cores, build):
    """The emulation build, its core count and AVSG_NPU_SPLIT for one session (restored after)."""
    saved = backend.emulated_cores()
    backend.set_emulated_cores(cores)
    try:
        with backend.emulation(build), split_lookup(form != "off"):
            yield
    finally:
        backend.set_emulated_cores(saved)


def expected_blocks(form, cores, R, N, S):
    """Blocks of a plan launch: ``R * split`` where the lookup splits, else a core a row."""
    split = lookup_split(cores, R, N, S) if form != "off" else 1
    return R * split if split > 1 else min(R, cores)


def colliding_positions(H, limit, gen, count=48):
    """Positions below ``limit`` that pile onto few buckets: whole probe sequences shared
    (``p + n * H * H`` share every probe with ``p``), and first probes shared (a few target
    buckets, found among random candidates with ``reference.probe_buckets``)."""
    out = []
    if H * H < limit:
        base = int(torch.randint(0, H * H, (1,), generator=gen))
        out += [base + n * H * H for n in range(min(count // 2, (limit - 1 - base) // (H * H) + 1))]
    cand = torch.randint(0, max(1, limit), (1 << 14,), generator=gen, dtype=I64)
    first = reference.probe_buckets(cand, H)[:, 0]
    targets = first[:3]
    hit = (first[:, None] == targets[None, :]).any(1)
    out += cand[hit][:count].tolist()
    return torch.tensor(sorted(set(p for p in out if 0 <= p < limit)), dtype=I64)


# ----------------------------------------------------------------------------------- the draws

def held_positions(state, layout, r):
    pos = reference.view_state(state, layout).slot_pos[r]
    return pos[pos >= 0].to(I64)


def draw_lens(gen, seq, T, state, layout):
    """One valid length per row: none dropped, all, exactly a held position (it goes), just
    past one (it stays), around the length, or far out of range either way."""
    R = seq.shape[0]
    lens = torch.empty(R, dtype=I64)
    for r in range(R):
        held = held_positions(state, layout, r)
        kind = int(torch.randint(0, 8, (1,), generator=gen))
        pick = held[int(torch.randint(0, held.numel(), (1,), generator=gen))] if held.numel() else 0
        lens[r] = [int(seq[r]) + int(torch.randint(0, 3, (1,), generator=gen)),   # no-op
                   0,
                   int(pick),                                                     # drops it
                   int(pick) + 1,                                                 # keeps it
                   int(seq[r]) - int(torch.randint(0, T + 3, (1,), generator=gen)),
                   int(seq[r]) - int(torch.randint(0, T + 3, (1,), generator=gen)),
                   WILD_LENS[int(torch.randint(0, len(WILD_LENS), (1,), generator=gen))],
                   int(torch.randint(0, max(1, int(seq[r])), (1,), generator=gen))][kind]
    return lens.clamp(-(1 << 31), (1 << 31) - 1).to(I32)


def draw_topk(gen, T, K, seq, lens, state, layout, family, hot):
    """Selections per row: held positions (hits unless dropped), positions the step's drop frees
    (misses), the family of colliding positions, a hot window under the length, the edges
    (seq - 1, seq, seq + 1, 0, the drop's limit and the one below), repeats across query tokens,
    -1 padding and junk."""
    R = seq.shape[0]
    out = torch.empty(R, T, K, dtype=I64)
    for r in range(R):
        n = int(seq[r])
        top = max(1, min(n, reference.MAX_POSITION))
        held = held_positions(state, layout, r)
        limit = int(lens[r]) if lens is not None else n
        sources = [torch.randint(max(0, top - hot), top, (T * K,), generator=gen, dtype=I64)]
        if held.numel():
            sources.append(held[torch.randint(0, held.numel(), (T * K,), generator=gen)])
            sources.append(held[torch.randint(0, held.numel(), (T * K,), generator=gen)])
        dropped = held[held >= limit] if held.numel() else held
        if dropped.numel():
            sources.append(dropped[torch.randint(0, dropped.numel(), (T * K,), generator=gen)])
        if family.numel():
            sources.append(family[torch.randint(0, family.numel(), (T * K,), generator=gen)])
        edges = torch.tensor([n - 1, n, n + 1, 0, limit, limit - 1, reference.MAX_POSITION - 1],
                             dtype=I64)
        sources.append(edges[torch.randint(0, edges.numel(), (T * K,), generator=gen)])
        stack = torch.stack(sources)
        which = torch.randint(0, len(sources), (T * K,), generator=gen)
        # the edges are a small share
        which = torch.where((which == len(sources) - 1) & (torch.rand(T * K, generator=gen) < 0.8),
                            torch.zeros_like(which), which)
        row = stack.gather(0, which[None, :])[0].view(T, K)
        if T > 1:
            share = torch.rand(T, K, generator=gen) < 0.4
            row[1:] = torch.where(share[1:], row[:1].expand(T - 1, K), row[1:])
            shift = torch.rand(T, K, generator=gen) < 0.1   # the same position, other columns
            row[1:] = torch.where(shift[1:], row[:1].roll(1, 1).expand(T - 1, K), row[1:])
        out[r] = row
    out[torch.rand(R, T, K, generator=gen) < 0.05] = -1
    junk = torch.tensor([-(1 << 31), -2, reference.MAX_POSITION, (1 << 31) - 1], dtype=I64)
    wild = torch.rand(R, T, K, generator=gen) < 0.01
    out[wild] = junk[torch.randint(0, junk.numel(), (int(wild.sum()),), generator=gen)]
    return out.to(I32)


def draw_idle(gen, seq, share=0.2):
    idle = torch.rand(seq.shape[0], generator=gen) < share
    return torch.where(idle, torch.randint(-3, 1, seq.shape, generator=gen, dtype=I32), seq)


# ------------------------------------------------------------------------------------- drivers

class Session:
    """Three copies in lockstep: the kernel as launched (split or not), a second kernel copy and
    the reference. Without ``kv`` the second copy plans unsplit; with ``kv`` the plans are
    ``plan_gather`` into a destination KV buffer per copy, from one host pool, and the second
    copy runs plan, then gather."""

    def __init__(self, R, T, K, S, H, L, policy, C, gen, kv=None):
        self.R, self.T, self.K, self.S, self.H, self.L = R, T, K, S, H, L
        self.N = T * K
        self.policy, self.C = policy, C
        self.pid = reference.POLICY_IDS[policy]
        self.layout = reference.Layout(S, H, C, policy == "reuse")
        state = reference.new_state(R, self.layout, L, policy=policy)
        self.states = [state.clone(), state.clone(), state]       # kernel, ops in turn, reference
        self.stats = [torch.zeros(R, 4, dtype=I64) for _ in range(3)]
        self.kv = kv
        if kv is not None:
            max_len, width, self.partition, self.cores = kv
            self.src = random_bytes((R, max_len, width), torch.uint8, gen)
            dst = random_bytes((R, S, width), torch.uint8, gen)
            self.dst = [padded_slots(dst) for _ in range(3)]

    @property
    def ref_state(self):
        return self.states[2]

    def _args(self, i, topk, seq, lens):
        return (topk, seq, self.states[i], self.stats[i], self.S, self.H, self.L, self.pid, self.C,
                lens)

    def rewrite_host(self, lens, gen):
        """A drop means the engine rewrote the KV of every position at or past the limit."""
        if self.kv is None or lens is None:
            return
        limit = lens.to(I64).clamp(-1, reference.MAX_POSITION).clamp(min=0)
        for r in range(self.R):
            rest = self.src[r, int(limit[r]):]
            if rest.numel():
                rest.copy_(random_bytes(tuple(rest.shape), torch.uint8, gen))

    def plan(self, topk, seq, lens, blocks):
        if self.kv is None:
            got = torch.ops.avsg.plan(*self._args(0, topk, seq, lens))
            if blocks is not None:
                assert last_launch_counters().blocks == blocks, "the launch did not split as meant"
            with split_lookup(False):         # the same kernel, one block a row
                unsplit = torch.ops.avsg.plan(*self._args(1, topk, seq, lens))
            for name, a, b in zip(OUT_NAMES, got, unsplit):
                assert torch.equal(a, b), f"{name}: the split plan differs from the unsplit one"
            want = reference.plan(self.ref_state, self.stats[2], topk, seq, self.layout, self.L,
                                  policy=self.policy, valid_lens=lens)
            names = OUT_NAMES
        else:
            got = torch.ops.avsg.plan_gather(*self._args(0, topk, seq, lens), [self.src],
                                             [self.dst[0]], None, 0, self.partition, self.cores)
            if blocks is not None:
                assert last_launch_counters().blocks >= blocks, "the launch did not split as meant"
            planned = torch.ops.avsg.plan(*self._args(1, topk, seq, lens))
            copied = torch.ops.avsg.gather(planned[1], planned[2], planned[3], [self.src],
                                           [self.dst[1]], None, 0, self.partition, self.cores)
            want = reference.plan_gather(self.ref_state, self.stats[2], topk, seq, self.layout,
                                         self.L, [self.src], [self.dst[2]], None, None,
                                         self.partition, self.cores, policy=self.policy,
                                         valid_lens=lens)
            names = OUT_NAMES + ("copied",)
            for name, a, b in zip(names, got, (*planned, copied)):
                assert torch.equal(a, b), f"{name}: plan_gather differs from plan, then gather"
        for name, a, b in zip(names, got, want):
            assert a.dtype == b.dtype and torch.equal(a, b), f"{name} differs from the reference"
        self.check()
        self.check_reads(got[0], topk, seq)
        return got

    def invalidate(self, lens):
        for i in (0, 1):
            torch.ops.avsg.invalidate(self.states[i], lens, self.S, self.H, self.C)
        reference.invalidate(self.ref_state, self.layout, lens)
        self.check()

    def reset(self, mask):
        for i in (0, 1):
            torch.ops.avsg.reset(self.states[i], mask, self.S, self.H, self.L, self.pid, self.C)
        reference.reset(self.ref_state, self.layout, mask, self.L, self.policy)
        self.check()

    def resize(self, rows, caps):
        outs = [torch.ops.avsg.resize(self.states[i], rows, caps, self.S, self.H, self.L,
                                      self.pid, self.C, self.N) for i in (0, 1)]
        want = reference.resize(self.ref_state, self.layout, rows, caps, self.L, self.policy,
                                self.N)
        for got in outs:
            for name, a, b in zip(("src_slots", "dst_slots", "move_counts"), got, want):
                assert torch.equal(a, b), f"resize {name} differs from the reference"
        if self.kv is not None:      # the engine moves the KV of the moved slots
            src, dst, counts = want
            for d in self.dst:
                for r in range(self.R):
                    n = int(counts[r])
                    moved = d[r, src[r, :n].long()].clone()
                    d[r, dst[r, :n].long()] = moved
        self.check()

    def check(self):
        for i in (0, 1):
            if not torch.equal(self.states[i], self.ref_state):
                diff = (self.states[i] != self.ref_state).nonzero()[:8].tolist()
                raise AssertionError(f"state ({'kernel' if i == 0 else 'ops in turn'}) differs "
                                     f"from the reference at {diff}")
            assert torch.equal(self.stats[i], self.stats[2]), "stats differ from the reference"
        reference.check_state(self.ref_state, self.layout, self.L, self.policy, min_active=self.N)
        if self.kv is None:
            return
        for i in (0, 1):
            assert torch.equal(self.dst[i].view(torch.uint8), self.dst[2].view(torch.uint8)), \
                f"dst ({'kernel' if i == 0 else 'ops in turn'}) differs from the reference"
        # invariant 1: every resident slot holds its position's current host row
        pos = reference.view_state(self.states[0], self.layout).slot_pos.to(I64)
        rr, ss = (pos >= 0).nonzero(as_tuple=True)
        held = self.dst[0][rr, ss]
        host = self.src[rr, pos[rr, ss]]
        bad = (held != host).any(-1)
        if bool(bad.any()):
            i = int(bad.nonzero()[0, 0])
            raise AssertionError(f"row {int(rr[i])} slot {int(ss[i])} holds position "
                                 f"{int(pos[rr[i], ss[i]])} but not its current KV")

    def check_reads(self, slots, topk, seq):
        """Every valid selection's slot holds its position; every other one is -1."""
        bound = seq.to(I64).clamp(max=reference.MAX_POSITION)
        if self.C:
            bound = bound.clamp(max=self.C)
        valid = (topk >= 0) & (topk.to(I64) < bound[:, None, None])
        assert torch.equal(slots[~valid], torch.full_like(slots[~valid], -1)), \
            "an invalid selection was given a slot"
        pos = reference.view_state(self.states[0], self.layout).slot_pos
        rr, tt, kk = valid.nonzero(as_tuple=True)
        s = slots[rr, tt, kk].long()
        assert bool(((s >= 0) & (s < self.S)).all()), "a valid selection has no slot"
        assert torch.equal(pos[rr, s], topk[rr, tt, kk]), "a slot does not hold its selection"


def run(sess, ops, seed, form, cores, build, start):
    """Drive ``sess`` through ``ops``; ``start``: "small" / "mid" / "top" lengths."""
    gen = torch.Generator().manual_seed(seed)
    R, T, K, S, N = sess.R, sess.T, sess.K, sess.S, sess.N
    limit_top = sess.src.shape[1] if sess.kv is not None else reference.MAX_POSITION
    lo = {"small": N, "mid": 8 * S, "top": limit_top - 8 * T}[start]
    lo = max(1, min(lo, limit_top - 4 * T - 8))
    seq = torch.randint(lo, lo + 2 * T + 1, (R,), generator=gen, dtype=I32)
    family = colliding_positions(sess.H, int(seq.min()), gen)
    blocks = expected_blocks(form, cores, R, N, S) if build == "strict" else None
    if blocks is not None and sess.kv is not None:   # the fused launch adds the copy's blocks
        split = lookup_split(cores, R, N, S) if form != "off" else 1
        blocks = R * split if split > 1 else None
    previous = None
    for op in ops:
        if op == "plan":
            lens = draw_lens(gen, seq, T, sess.ref_state, sess.layout) \
                if torch.rand(1, generator=gen).item() < 0.8 else None
            seq = (seq + torch.randint(0, T + 1, (R,), generator=gen, dtype=I32)).clamp(
                max=limit_top)
            hot = int(torch.randint(1, 3 * S, (1,), generator=gen))
            fresh = draw_topk(gen, T, K, seq, lens, sess.ref_state, sess.layout, family, hot)
            if previous is not None and torch.rand(1, generator=gen).item() < 0.4:
                # steady decode: last step's selections, few or none changed, so whole chunks
                # (and whole rows) hit and groups close on chunks without a miss
                change = torch.rand(fresh.shape, generator=gen) < [0.0, 0.002, 0.02, 0.2][
                    int(torch.randint(0, 4, (1,), generator=gen))]
                fresh = torch.where(change, fresh, previous)
            topk = previous = fresh
            sess.rewrite_host(lens, gen)
            sess.plan(topk, draw_idle(gen, seq), lens, blocks)
        elif op == "invalidate":
            lens = draw_lens(gen, seq, T, sess.ref_state, sess.layout)
            sess.rewrite_host(lens, gen)
            sess.invalidate(lens)
        elif op == "reset":
            sess.reset(torch.rand(R, generator=gen) < 0.4)
        else:
            rows = torch.randperm(R, generator=gen)[:int(torch.randint(1, R + 1, (1,), generator=gen))]
            caps = torch.randint(N, S + 1, (rows.numel(),), generator=gen, dtype=I64)
            sess.resize(rows.to(I64), caps)


sessions = st.lists(st.sampled_from(["plan"] * 6 + ["invalidate", "reset", "resize"]),
                    min_size=2, max_size=8)


# --------------------------------------------------------------------------------------- tests

@FUZZ
@given(geometries(), sessions, st.integers(0, 2**31 - 1), st.sampled_from(["strict", "fast"]),
       st.sampled_from(["small", "mid", "top"]), st.sampled_from([0, 1, 2]))
def test_split_plan_sessions_bit_exact(geo, ops, seed, build, start, context):
    """plan (with drops), invalidate, reset and resize in every form of the lookup: outputs,
    state and stats as the reference's after every call, every selection reading its slot."""
    R, T, K, S, H, L, policy, form, cores = geo
    # reuse needs a context; the others take one too: none, a bound inside the lengths, 2**24
    C = [0, 1 << 24, 0][context] if policy != "reuse" else [1 << 24, 1 << 22, 12 * S][context]
    sess = Session(R, T, K, S, H, L, policy, C, torch.Generator().manual_seed(seed))
    with launched_as(form, cores, build):
        run(sess, ops, seed, form, cores, build, start)


@FUZZ
@given(geometries(max_chunks=3, max_capacity=3072), sessions, st.integers(0, 2**31 - 1),
       st.sampled_from(["strict", "fast"]), st.sampled_from(reference.PARTITIONS),
       st.integers(1, 8))
def test_split_plan_gather_sessions_read_current_kv(geo, ops, seed, build, partition, copiers):
    """plan_gather in every form of the lookup, as plan then gather and as the reference, and
    every resident slot's KV is its position's current host row after every call."""
    R, T, K, S, H, L, policy, form, cores = geo
    max_len = 4 * S + 64
    C = max_len if policy == "reuse" else 0
    gen = torch.Generator().manual_seed(seed)
    sess = Session(R, T, K, S, H, L, policy, C, gen,
                   kv=(max_len, 8, partition, min(copiers, cores)))
    with launched_as(form, cores, build):
        run(sess, ops, seed, form, cores, build, ["small", "mid", "top"][seed % 3])


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(geometries(max_chunks=8, max_capacity=24576), sessions, st.integers(0, 2**31 - 1),
       st.sampled_from(["strict", "fast"]), st.sampled_from(["small", "mid", "top"]))
def test_split_plan_sessions_with_windows(geo, ops, seed, build, start):
    """As test_split_plan_sessions_bit_exact, with up to 8 selection chunks a row (two lookup
    groups; an owner folding its helpers' parts in several copies) and buffers up to 24576
    slots: sections paged in windows, which the owner's drop may flush while its helpers read
    the index."""
    R, T, K, S, H, L, policy, form, cores = geo
    C = 1 << 24 if policy == "reuse" else 0
    sess = Session(R, T, K, S, H, L, policy, C, torch.Generator().manual_seed(seed))
    with launched_as(form, cores, build):
        run(sess, ops, seed, form, cores, build, start)
