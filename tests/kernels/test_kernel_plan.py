"""The AscendC plan / plan_dual_pointer / invalidate / reset kernels (CPU emulation backend)
against the reference, bit for bit: every output, the whole state tensor and the stats after
every step. The kernels are what ``torch.ops.avsg.*`` runs on CPU; the reference is called
directly on a cloned state.
"""
from __future__ import annotations

import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import avsg  # noqa: F401  (loads the op library)
from avsg import _ops, backend, reference
from avsg.backend import emulation, last_launch_counters
from avsg.buffer import lookup_split

# plan-only buffers hold no KV: track_copies=False keeps a plan's misses resident without
# a gather (what these tests specify); tests/ops/test_uncopied.py covers the tracking

from helpers.plan_cases import (I32, Twin, chunk_mix, colliding, draw, geometry,  # noqa: F401
                                idle_some, run_session, session, split_lookup, valid_lens_near)







def test_cpu_backend_is_the_kernel():
    for op in ("plan", "plan_dual_pointer", "invalidate", "reset", "resize"):
        assert _ops.CPU_BACKEND[op] == "kernel", op


def test_ub_plan_fits_and_covers_whole_sections_when_small():
    budget = 184 * 1024
    for T, K, S, H in [(1, 1, 1, 64), (4, 16, 64, 128), (1, 2048, 8192, 16384),
                       (4, 2048, 8192, 16384), (2, 4096, 8192, 8192), (4, 8192, 32768, 32768),
                       (1, 32768, 32768, 32768), (1, 100, 32768, 32768)]:
        for max_context in (0, 1, 32768, 1 << 20, 1 << 24):   # lifetime, then reuse
            total, fixed, *windows, slots = torch.ops.avsg.plan_ub_plan(T, K, S, H, max_context)
            assert total <= budget and fixed < total and all(w >= 256 for w in windows[:5])
            assert all(w >= 256 for w in windows[5:]) if max_context else windows[5:] == [0] * 3
            assert total == fixed + sum(windows)
    # bucket_slot: H int16 entries (H / 2 words, rounded up to 64)
    total, fixed, *windows, slots = torch.ops.avsg.plan_ub_plan(1, 64, 64, 128)
    assert windows == [128 * 2] + [64 * 4] * 4 + [0] * 3
    total, fixed, *windows, slots = torch.ops.avsg.plan_ub_plan(1, 64, 64, 64)
    assert windows[0] == 64 * 4, "a section is at least 64 words"
    total, fixed, *windows, slots = torch.ops.avsg.plan_ub_plan(1, 64, 64, 128, 4096)
    assert windows == [128 * 2] + [64 * 4] * 5 + [256 * 4, 64 * 4]   # G = 2H, B = 64
    # the fixed part holds the hit byte map (one byte per padded slot, whole 128-slot compares)
    # beside the hit bitmap: 4096 more slots cost 4096 + 512 bytes of it
    fixed4k = torch.ops.avsg.plan_ub_plan(1, 2048, 4096, 16384)[1]
    fixed8k = torch.ops.avsg.plan_ub_plan(1, 2048, 8192, 16384)[1]
    assert fixed8k - fixed4k == 4096 + 4096 // 8
    # S 8192: the lookup's and the insert's two sections (bucket_slot, slot_pos) stay whole for
    # the lifetime policy, and the row's slots stay in UB (slot_life's window gives way: the
    # step runs on its half copy); reuse has no room for them
    for T in (1, 2, 4):
        total, fixed, *windows, slots = torch.ops.avsg.plan_ub_plan(T, 2048, 8192, 16384)
        assert windows[0:2] == [16384 * 2, 8192 * 4] and slots == T * 2048 * 4
        assert windows[2] < 8192 * 4
        assert torch.ops.avsg.plan_ub_plan(T, 2048, 8192, 16384, 32768)[-1] == 0
    # where everything fits, the slots are resident beside whole sections, in whole chunks (the
    # kernels' 512 selections: Classify writes a chunk's every lane)
    total, fixed, *windows, slots = torch.ops.avsg.plan_ub_plan(1, 64, 64, 128)
    assert slots == 512 * 4
    # the reuse sections are sized by the buffer: the context changes no window
    for T, K, S, H in [(1, 2048, 8192, 16384), (4, 8192, 32768, 32768)]:
        plans = {tuple(torch.ops.avsg.plan_ub_plan(T, K, S, H, c)) for c in (1, 32768, 1 << 24)}
        assert len(plans) == 1




@settings(max_examples=120, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(geometry, session, st.integers(0, 2**31 - 1), st.sampled_from(["hash", "dual_pointer"]),
       st.sampled_from([0, 1, 64, 200, 1000, 5000, "lru"]))
def test_random_sessions_bit_exact(geo, ops, seed, matcher, max_context):
    """max_context 0: lifetime policy; "lru": the lru policy; else reuse, with contexts below,
    around and beyond the session's positions (selections at or beyond max_context are treated
    as -1)."""
    R, T, K, ratio, hmul, L = geo
    S = max(T * K, int(T * K * ratio))
    H = min(reference.MAX_BUCKETS, max(64, reference.default_buckets(S) * hmul // 2, S))
    policy = "lru" if max_context == "lru" else None
    twin = Twin(R, S, H, L, matcher, max_context=0 if policy else max_context, policy=policy)
    run_session(twin, ops, seed, R, T, K, S)






@pytest.mark.parametrize("matcher", ["hash", "dual_pointer"])
@pytest.mark.parametrize("T,K,H", [(1, 64, 64), (4, 16, 64), (2, 100, 256)])
def test_collision_families_full_buffer(T, K, H, matcher):
    """Every position shares one probe sequence: 4 fit in the table, the rest go to the stash;
    invalidation leaves stale stash entries that a re-fetch must not revive."""
    S = T * K
    twin = Twin(2, S, H, 2, matcher)
    seq = torch.full((2,), reference.MAX_POSITION, dtype=I32)
    fam = torch.tensor([colliding(H, 3 * S, base=b) for b in (5, 9)], dtype=I32).flatten()
    gen = torch.Generator().manual_seed(T * K + H)
    for step in range(8):
        topk = torch.stack([fam[torch.randperm(fam.numel(), generator=gen)[:S]].view(T, K)
                            for _ in range(2)])
        twin.plan(topk, seq)
        if step % 3 == 2:
            twin.invalidate(fam[torch.randint(0, fam.numel(), (2,), generator=gen)])
        if step == 5:
            twin.reset(torch.tensor([True, False]))
    v = reference.view_state(twin.state, twin.layout)
    assert int(v.stash_count.max()) > 0, "the stash path was not exercised"


@pytest.mark.parametrize("matcher", ["hash", "dual_pointer"])
def test_real_size_steps(matcher):
    """K=2048, MTP T=4, capacity 8192 (full), 16384 buckets: a few decode steps."""
    R, T, K, S, H, L = 2, 4, 2048, 8192, 16384, 4
    twin = Twin(R, S, H, L, matcher)
    gen = torch.Generator().manual_seed(11)
    seq = torch.full((R,), 20000, dtype=I32)
    for step in range(4):
        twin.plan(draw(gen, R, T, K, seq, hot=3 * K, pad=0.02, repeat=0.4, wild=0.01), seq)
        seq += T
        if step == 1:
            twin.invalidate(seq - 2)


@pytest.mark.parametrize("policy", ["lifetime", "lru"])
def test_few_and_many_misses_at_the_benchmark_geometry(policy):
    """S 8192, H 16384 (bucket_slot and slot_pos whole in UB; the row's slots resident under
    lifetime): steps with a few misses and steps with many equal the reference, state included."""
    R, T, K, S, H, L = 2, 1, 2048, 8192, 16384, 16
    assert torch.ops.avsg.plan_ub_plan(T, K, S, H)[2:4] == [H * 2, S * 4], "a section is paged"
    twin = Twin(R, S, H, L, policy=policy)
    gen = torch.Generator().manual_seed(21)
    seq = torch.full((R,), 30000, dtype=I32)
    topk = draw(gen, R, T, K, seq, hot=3 * S, pad=0.0, repeat=0.0, wild=0.0)
    counts = []
    for step in range(6):
        counts.append(twin.plan(topk, seq)[3].tolist())
        seq += 1
        fresh = 8 if step % 2 else 200                 # few misses, then many
        lanes = torch.randperm(K, generator=gen)[:fresh]
        topk = topk.clone()
        topk[:, 0, lanes] = seq[:, None] - 1 - torch.arange(fresh, dtype=I32)
    few = [c for row in counts[1:] for c in row if 0 < c <= 96]
    many = [c for row in counts for c in row if c > 96]
    assert few and many, counts


@pytest.mark.parametrize("build", ["strict", "fast"])
@pytest.mark.parametrize("policy", ["lifetime", "lru", "reuse"])
def test_insert_probe_stride_at_every_miss_count_boundary(build, policy):
    """The insert narrows its probe slices to the misses rounded up to 256 lanes when they fit
    one 512-lane chunk: miss counts on both sides of 256 and 512, some of them colliding (the
    rounds contend, the losers go to the stash), equal the reference, state included."""
    R, T, K, S, H, L = 2, 1, 1024, 2048, 2048, 8
    twin = Twin(R, S, H, L, policy=policy, max_context=1 << 24 if policy == "reuse" else 0)
    gen = torch.Generator().manual_seed(5)
    seq = torch.full((R,), 13_000_000, dtype=I32)
    topk = torch.stack([torch.randperm(1 << 18, generator=gen)[:K] for _ in range(R)]).to(I32)
    topk = topk.view(R, T, K)
    seen = set()
    with emulation(build):
        twin.plan(topk, seq)                                   # cold: two miss chunks
        for step, fresh in enumerate((1, 255, 256, 257, 511, 512, 513, 40)):
            topk = topk.clone()
            lanes = torch.randperm(K, generator=gen)[:fresh]
            new = (1 << 18) + step * K + torch.arange(fresh, dtype=I32)
            # (1 + n) * H^2 + base: the same first bucket and stride, below 2^24
            clash = torch.tensor(colliding(H, min(fresh, 3), base=5 + step, offset=1), dtype=I32)
            new[:clash.numel()] = clash                        # one probe family, contended
            topk[:, 0, lanes] = new
            seen.update(twin.plan(topk, seq)[3].view(-1).tolist())
    assert {1, 255, 256, 257, 511, 512, 513} <= seen, sorted(seen)


def test_dual_pointer_equals_hash():
    R, T, K, S, L = 3, 2, 64, 192, 3
    H = reference.default_buckets(S)
    a, b = Twin(R, S, H, L, "hash"), Twin(R, S, H, L, "dual_pointer")
    gen = torch.Generator().manual_seed(5)
    seq = torch.tensor([500, 300, 1000], dtype=I32)
    for _ in range(6):
        topk = draw(gen, R, T, K, seq, hot=3 * K)
        for x, y in zip(a.plan(topk, seq), b.plan(topk, seq)):
            assert torch.equal(x, y)
        assert torch.equal(a.state, b.state) and torch.equal(a.stats, b.stats)


@pytest.mark.parametrize("matcher,max_context", [("hash", 0), ("dual_pointer", 0),
                                                 ("hash", 1 << 20), ("dual_pointer", 200000),
                                                 ("hash", "lru")])
def test_largest_geometry(matcher, max_context):
    """capacity = buckets = 2**15 (every section windowed), T*K = capacity (full buffer); under
    the reuse policy the per-position counts and the heat are paged through windows too."""
    R, T, K, S, H, L = 1, 4, 8192, 32768, 32768, 3
    policy = "lru" if max_context == "lru" else None
    twin = Twin(R, S, H, L, matcher, max_context=0 if policy else max_context, policy=policy)
    gen = torch.Generator().manual_seed(2)
    seq = torch.full((R,), 100000, dtype=I32)
    for _ in range(3):
        twin.plan(draw(gen, R, T, K, seq, hot=2 * S, pad=0.01, repeat=0.3, wild=0.01), seq)
        seq += T
    twin.invalidate(seq - 3)
    twin.plan(draw(gen, R, T, K, seq, hot=2 * S), seq)


def test_largest_geometry_once_small_batch():
    """The largest allowed tables with a small step: windowed sections, default run."""
    R, T, K, S, H, L = 2, 2, 1000, 32768, 32768, 255
    twin = Twin(R, S, H, L)
    gen = torch.Generator().manual_seed(3)
    seq = torch.full((R,), 5000, dtype=I32)
    for _ in range(3):
        twin.plan(draw(gen, R, T, K, seq, hot=3000), seq)


@pytest.mark.parametrize("build", ["strict", "fast"])
@pytest.mark.parametrize("policy", ["lifetime", "lru", "reuse"])
@pytest.mark.parametrize("split", [False, True])
def test_idle_rows_are_left_out(build, policy, split):
    """A row with seq_len <= 0 (an engine's row without a request) keeps its state and stats byte
    for byte, lives and hand included, and gets -1 outputs and a 0 count; given a drop, the
    drop is all that changes (exactly invalidate's: no decay). Both builds, with and without the
    split lookup (the idle row's helpers skip it too), bit for bit with the reference; the
    strict build shows the idle row's block loading its header and seq_len only."""
    R, T, K, S = 4, 2, 600, 1400
    C = 4 * S if policy == "reuse" else 0
    gen = torch.Generator().manual_seed(31)
    with emulation(build), split_lookup(split):
        twin = Twin(R, S, 2048, 5, max_context=C, policy=None if policy == "reuse" else policy)
        seq = torch.full((R,), 3 * S, dtype=I32)
        for _ in range(3):
            twin.plan(draw(gen, R, T, K, seq, hot=2 * S), seq)
            seq += T
        before, stats_before = twin.state.clone(), twin.stats.clone()
        idle_seq = torch.tensor([int(seq[0]), 0, int(seq[2]), -5], dtype=I32)
        out = twin.plan(draw(gen, R, T, K, seq, hot=2 * S), idle_seq)
        for r in (1, 3):
            assert torch.equal(twin.state[r], before[r]) and torch.equal(twin.stats[r], stats_before[r])
            assert int(out[3][r]) == 0
            assert all(bool((o[r] == -1).all()) for o in out[:3])
        assert not torch.equal(twin.state[0], before[0])
        if build == "strict":
            work = last_launch_counters()
            blocks = R * lookup_split(40, R, T * K, S) if split else R
            assert work.blocks == blocks
            # row r's owner is block r; an idle row's helpers (blocks r + 4, ...) load its header too
            idle = [b for b in range(blocks) if b % R in (1, 3)]
            busy = [b for b in range(R) if b not in (1, 3)]
            assert max(int(work["mte2_bytes"][b]) for b in idle) <= 512
            assert min(int(work["mte2_bytes"][b]) for b in busy) > 16 * 1024
        # a drop to apply: the idle row applies it and nothing else (invalidate's result)
        lens = torch.tensor([reference.MAX_POSITION, (1 << 31) - 1, int(seq[2]), 2 * S], dtype=I32)
        held = twin.state.clone()
        twin.plan(draw(gen, R, T, K, seq, hot=2 * S), idle_seq, lens)
        assert torch.equal(twin.state[1], held[1])
        dropped = held[3:4].cpu().clone()
        reference.invalidate(dropped, twin.layout, lens[3:4])
        assert not torch.equal(dropped[0], held[3].cpu())
        assert torch.equal(twin.state[3].cpu(), dropped[0])


def test_more_rows_than_cores():
    """Rows are spread over cores (row r on core r mod blockDim); 45 rows > 40 cores."""
    R, T, K, S = 45, 1, 8, 16
    twin = Twin(R, S, 64, 3)
    gen = torch.Generator().manual_seed(9)
    seq = torch.randint(10, 60, (R,), generator=gen, dtype=I32)
    for _ in range(3):
        twin.plan(draw(gen, R, T, K, seq, hot=20), seq)


@pytest.mark.parametrize("build", ["strict", "fast"])
@pytest.mark.parametrize("policy", ["reuse", "lifetime", "lru"])
@pytest.mark.parametrize("R,T,K,S,H", [(1, 2, 2048, 8192, 8192), (3, 1, 1100, 1600, 2048),
                                       (8, 2, 640, 1400, 2048), (20, 1, 600, 640, 1024)])
def test_split_lookup_bit_exact(build, policy, R, T, K, S, H):
    """Few rows, several selection chunks: each row's lookup is spread over min(40 / R, chunks)
    cores (one SyncAll; buffer.lookup_split says how many). Buckets as few as slots, so the stash is in use and stash hits are
    folded with the helpers' hits; MTP repeats across tokens put one slot's hits on several
    cores; -1 and junk lanes; an invalidate. Every output, the state and the stats stay the
    reference's in both builds; the strict build also shows the split launch."""
    from avsg.backend import emulation, last_launch_counters
    C = {"reuse": 4 * S, "lifetime": 0, "lru": 0}[policy]
    gen = torch.Generator().manual_seed(R * 1000 + K)
    with emulation(build), split_lookup():
        twin = Twin(R, S, H, 5, max_context=C, policy=policy)
        seq = torch.randint(S, 3 * S, (R,), generator=gen, dtype=I32)
        for step in range(4):
            twin.plan(draw(gen, R, T, K, seq, hot=2 * S, pad=0.05, repeat=0.5, wild=0.02), seq)
            if build == "strict":   # the rule the decode model prices avsg's plan at
                assert last_launch_counters().blocks == R * lookup_split(40, R, T * K, S)
            seq += T
            if step == 1:
                twin.invalidate(seq - 3)


@pytest.mark.parametrize("capacity,active,freed", [
    (8256, None, False), (4096, 3072, False), (4096, None, True), (8256, None, True),
    (4096, 3072, True)])
def test_lifetime_level_scan_work_does_not_grow_with_the_lifetime(capacity, active, freed):
    """The level scan starts at the lowest life a candidate holds, whether the lives' half copy
    fits (4096) or not (8256: past it), and in a row resize shrank: a full buffer at L = 255
    holds no life near 0, so a scan from level 0 would pass hundreds of empty levels. With a few
    free slots (``freed``: an invalidate dropped some, as after rejected drafts) the scan takes
    them at level -1 and then continues at the lowest life held, not at level 0. Counted work,
    not time: the strict build's vector instructions of one plan at L = 255 stay within 1.5x of
    L = 16 on the same selections (a scan from 0 costs 10x and more)."""
    from avsg import backend
    K, steps = 512, 48

    def vector_instructions(lifetime):
        gen = torch.Generator().manual_seed(3)
        buf = avsg.SparseKVBuffer(rows=1, capacity=capacity, topk=K, lifetime=lifetime,
                                  track_copies=False)
        if active:
            buf.resize(torch.tensor([0]), torch.tensor([active]))
        seq = torch.full((1,), 4 * capacity, dtype=I32)
        with emulation("fast"):
            for _ in range(steps):
                buf.plan(draw(gen, 1, 1, K, seq, hot=2 * capacity, pad=0.0, repeat=0.0, wild=0.0), seq, check=False)
                seq += 1
        free = 0
        if freed:       # drop the newest few residents: fewer free slots than the next misses
            for back in range(1, 4 * capacity):
                free = sum(p >= int(seq) - back for p in buf.resident(0))
                if free >= 3:
                    break
            buf.invalidate(seq - back)
        life = reference.view_state(buf.state, buf.layout).slot_life[0, :active or capacity].clone()
        ref_state, ref_stats = buf.state.clone(), buf.stats_counts.clone()
        topk = draw(gen, 1, 1, K, seq, hot=2 * capacity, pad=0.0, repeat=0.0, wild=0.0)
        with emulation("strict"):
            plan = buf.plan(topk, seq, check=False)
            counted = int(backend.last_launch_counters()["vec_instrs"].max())
        # the jump past the empty levels picks the reference's victims, in its order
        want = reference.plan(ref_state, ref_stats, topk, seq, buf.layout, lifetime)
        for name, got, ref in zip(("slots", "miss_pos", "miss_slots", "miss_counts"),
                                  (plan.slots, plan.miss_pos, plan.miss_slots, plan.miss_counts), want):
            assert torch.equal(got, ref), name
        assert torch.equal(buf.state, ref_state) and torch.equal(buf.stats_counts, ref_stats)
        assert int((life == -1).sum()) == free
        assert not freed or 0 < free < int(plan.miss_counts[0]), (free, plan.miss_counts)
        return counted, int(life[life >= 0].min())

    short, _ = vector_instructions(16)
    long_, lowest = vector_instructions(255)
    assert lowest > 150, lowest                     # every life held is far from level 0
    assert long_ <= 1.5 * short, (long_, short)


@pytest.mark.parametrize("policy", ["lifetime", "reuse"])
def test_invalidate_stores_only_the_chunks_it_changes(policy):
    """The serving manager invalidates every pass, and most passes drop nothing: a chunk of slots
    (8192 per chunk) holding no position at or past the limit is neither read back nor stored.
    16384 slots fill in order (older, smaller positions in the low chunk); dropping the newest
    positions changes only the high chunk; a limit equal to the low chunk's largest position
    changes it too. Under reuse, evicted positions leave ghosts, which a limit below them
    clears. State and stats stay the reference's throughout."""
    from avsg import backend
    S, K = 16384, 2048
    buf = avsg.SparseKVBuffer(rows=1, capacity=S, topk=K, policy=policy, track_copies=False)
    seq = torch.tensor([90000], dtype=I32)
    for step in range(S // K):      # step i: positions [10000 i, 10000 i + K), one slot each
        topk = (torch.arange(K, dtype=I32) + 10000 * step).view(1, 1, K)
        buf.plan(topk, seq, check=False)
    held = buf.resident(0)
    assert len(held) == S and all(slot >= S // 2 for p, slot in held.items() if p >= 60000)

    def invalidate(limit):
        want = buf.state.clone()
        reference.invalidate(want, buf.layout, torch.tensor([limit], dtype=I32))
        with emulation("strict"):
            buf.invalidate(torch.tensor([limit], dtype=I32))
            counters = backend.last_launch_counters()
        assert torch.equal(buf.state, want)
        return int(counters["mte3_bytes"][0]), int(counters["mte2_bytes"][0])

    stored, loaded_none = invalidate(1 << 24)           # nothing to drop
    assert stored == 0
    stored, loaded = invalidate(60000)               # the newest positions, high chunk only
    assert len(buf.resident(0)) == 6 * K and loaded > loaded_none
    chunk = 4 * (S // 2)
    # pos (int32) and life (int16) of one chunk; under reuse also its counts, and the one chunk
    # of ghosts whose entries name positions >= 60000 (an empty ghost, tag 0, names its own entry
    # index)
    assert stored == chunk + chunk // 2 + (0 if policy == "lifetime" else 2 * chunk)
    low_top = max(p for p, slot in buf.resident(0).items() if slot < S // 2)
    stored, _ = invalidate(low_top)                  # a chunk whose largest position is the limit
    assert low_top not in buf.resident(0) and stored >= chunk + chunk // 2
    if policy == "reuse":           # evictions leave ghosts; a limit below them forgets them
        before = set(buf.resident(0))
        for step in range(6):       # 12288 new positions into about 8192 free slots
            topk = (torch.arange(K, dtype=I32) + 70000 + 3000 * step).view(1, 1, K)
            buf.plan(topk, seq, check=False)
        evicted = before - set(buf.resident(0))
        assert evicted
        ghosts = reference.view_state(buf.state, buf.layout).ghost.clone()
        invalidate(min(evicted))
        assert not torch.equal(reference.view_state(buf.state, buf.layout).ghost, ghosts)


@pytest.mark.parametrize("R,T,K,S,split", [(21, 1, 600, 640, 1), (1, 1, 500, 600, 1),
                                           (13, 1, 2048, 8192, 3), (10, 1, 2048, 8192, 4),
                                           (2, 4, 2048, 8192, 17), (8, 2, 640, 2048, 4),
                                           (20, 2, 640, 2048, 2)])
def test_lookup_split_is_the_ops(R, T, K, S, split):
    """buffer.lookup_split (what the decode model prices avsg's plan at) against the op's launch
    on 40 cores: too many rows for two cores each, or one chunk, and the plan does not split;
    as many cores as chunks and the owner looks up one; a core more and it looks up none
    (chunks + 1); a last chunk short of 512 selections is a chunk."""
    assert lookup_split(40, R, T * K, S) == split
    gen = torch.Generator().manual_seed(R)
    with emulation("strict"), split_lookup():
        twin = Twin(R, S, max(64, 1 << (S - 1).bit_length()), 4)
        seq = torch.randint(T * K, 2 * T * K, (R,), generator=gen, dtype=I32)
        twin.plan(draw(gen, R, T, K, seq, hot=S), seq)
        assert last_launch_counters().blocks == R * split


@pytest.mark.parametrize("build", ["strict", "fast"])
@pytest.mark.parametrize("policy", ["lifetime", "lru", "reuse"])
@pytest.mark.parametrize("S", [8192, 16384, 32768])
@pytest.mark.parametrize("per_row, split", [(4, 4), (6, 6), (40, 9)])
def test_both_forms_of_the_split_with_drops(build, policy, S, per_row, split):
    """2 rows of 2 x 2048 selections (8 chunks) on 4, 6 and 40 cores a row: the row's own core
    looking up chunks with its helpers (parts of two chunks each), or none (9 cores a row). The
    index and the lives whole in the Unified Buffer or in windows (S 16384, 32768); drops near
    the lengths, at held positions, far out, and a third of the buffer back; idle rows; padding,
    repeats across query tokens and junk. Bit for bit with the reference in both builds."""
    R, T, K = 2, 2, 2048
    H = reference.default_buckets(S)
    gen = torch.Generator().manual_seed(S + K + per_row)
    saved = backend.emulated_cores()
    backend.set_emulated_cores(R * per_row)
    try:
        assert lookup_split(R * per_row, R, T * K, S) == split
        with emulation(build), split_lookup():
            twin = Twin(R, S, H, 6, max_context=(1 << 22) if policy == "reuse" else 0,
                        policy=policy)
            seq = torch.full((R,), 3 * S, dtype=I32)
            for step in range(6):
                lens = None
                if step >= 2:
                    lens = (valid_lens_near(gen, seq, T, twin.ref_state, twin.layout) if step % 2
                            else seq - S // 3)
                seq = seq + T
                planned = idle_some(gen, seq) if step >= 2 else seq
                twin.plan(draw(gen, R, T, K, seq, hot=2 * S, pad=0.03, repeat=0.4, wild=0.01),
                          planned, lens)
                if build == "strict":
                    assert last_launch_counters().blocks == R * split
    finally:
        backend.set_emulated_cores(saved)


def test_split_lookup_off_by_default_and_switch_checked():
    """As on the NPU, a plan splits its lookup only with AVSG_NPU_SPLIT=1: unset or 0 runs one
    block per row, whatever cores are idle; any other value is refused, naming the variable, with
    the state untouched."""
    from avsg.backend import emulation, last_launch_counters
    R, T, K, S, H = 2, 1, 1500, 2048, 2048          # 3 selection chunks per row
    gen = torch.Generator().manual_seed(11)
    seq = torch.full((R,), 3000, dtype=I32)
    with emulation("strict"):
        twin = Twin(R, S, H, 4)
        for on, blocks in ((None, R), (False, R), (True, R * lookup_split(40, R, T * K, S))):
            with split_lookup(on):
                twin.plan(draw(gen, R, T, K, seq, hot=2500), seq)
            assert last_launch_counters().blocks == blocks
        before = twin.state.clone()
        with split_lookup():
            os.environ["AVSG_NPU_SPLIT"] = "yes"
            with pytest.raises(ValueError, match="AVSG_NPU_SPLIT: expected 0 .* or 1 .*, got 'yes'"):
                torch.ops.avsg.plan(draw(gen, R, T, K, seq, hot=2500), seq, twin.state, twin.stats,
                                    S, H, 4, 0, 0)
        assert torch.equal(twin.state, before)


def test_split_lookup_rejected_row():
    """A row whose header does not match is left alone by its owner and by its helpers (each
    checks the header itself) while the other row of the launch splits as usual."""
    from avsg.backend import emulation, last_launch_counters
    R, T, K, S, H = 2, 1, 1500, 2048, 2048
    twin = Twin(R, S, H, 4)
    gen = torch.Generator().manual_seed(4)
    seq = torch.full((R,), 3000, dtype=I32)
    twin.plan(draw(gen, R, T, K, seq, hot=2500), seq)
    twin.state[1, reference.HEADER_CAPACITY] += 1
    before = twin.state.clone()
    topk = draw(gen, R, T, K, seq, hot=2500)
    old = torch.ops.avsg._set_host_value_checks(False)       # the kernel's own check
    try:
        with split_lookup(), emulation("strict"):
            got = torch.ops.avsg.plan(topk, seq, twin.state, twin.stats, S, H, 4, 0, 0)
            assert last_launch_counters().blocks == R * lookup_split(40, R, T * K, S)
    finally:
        torch.ops.avsg._set_host_value_checks(old)
    assert int(got[3][1]) == -1 and bool((got[0][1] == -1).all())
    assert torch.equal(twin.state[1], before[1])
    ref_state, ref_stats = twin.ref_state[:1].clone(), twin.ref_stats[:1].clone()
    want = reference.plan(ref_state, ref_stats, topk[:1], seq[:1], twin.layout, 4)
    for a, b in zip(got, want):
        assert torch.equal(a[:1], b)
    assert torch.equal(twin.state[:1], ref_state) and torch.equal(twin.stats[:1], ref_stats)


# ---------------------------------------------------------------- input checks of the ops
def _args():
    layout = reference.Layout(16, 64)
    state = reference.new_state(2, layout, 4)
    stats = torch.zeros(2, 4, dtype=torch.int64)
    topk = torch.arange(16, dtype=I32).view(2, 2, 4)
    seq = torch.full((2,), 40, dtype=I32)
    return topk, seq, state, stats


@pytest.mark.parametrize("mutate,error,needle", [
    (lambda a: (a[0].long(),) + a[1:], TypeError, "topk_pos: expected dtype int32"),
    (lambda a: (a[0], a[1][:1].contiguous()) + a[2:], ValueError, "seq_lens: expected shape"),
    (lambda a: a[:2] + (a[2][:, :-8].contiguous(), a[3]), ValueError, "state: expected shape"),
    (lambda a: a[:3] + (a[3].int(),), TypeError, "stats: expected dtype"),
    (lambda a: (a[0].transpose(1, 2).contiguous().transpose(1, 2),) + a[1:], ValueError,
     "topk_pos: expected shape|contiguous"),
    (lambda a: (torch.zeros(2, 2, 8, dtype=I32)[:, :, ::2],) + a[1:], ValueError,
     "topk_pos: expected a contiguous"),
])
def test_op_rejects_bad_tensors_without_touching_state(mutate, error, needle):
    args = _args()
    topk, seq, state, stats = mutate(args)
    before, before_stats = args[2].clone(), args[3].clone()
    with pytest.raises(error, match=needle):
        torch.ops.avsg.plan(topk, seq, state, stats, 16, 64, 4)
    assert torch.equal(args[2], before) and torch.equal(args[3], before_stats)


def test_op_rejects_bad_geometry():
    topk, seq, state, stats = _args()
    with pytest.raises(ValueError, match="capacity: expected >= T\\*K"):
        torch.ops.avsg.plan(torch.zeros(2, 3, 8, dtype=I32), seq, state, stats, 16, 64, 4)
    with pytest.raises(ValueError, match="buckets"):
        torch.ops.avsg.plan(topk, seq, state, stats, 16, 96, 4)
    with pytest.raises(ValueError, match="lifetime"):
        torch.ops.avsg.plan(topk, seq, state, stats, 16, 64, 0)
    with pytest.raises(TypeError, match="valid_lens"):
        torch.ops.avsg.invalidate(state, seq.long(), 16, 64)
    with pytest.raises(TypeError, match="row_mask"):
        torch.ops.avsg.reset(state, seq, 16, 64, 4)


def stash_the_index(state, layout, gen, share=0.75, stale=400):
    """Move `share` of every row's resident positions from the hash table into the stash, in
    shuffled order, with `stale` entries (keys their slot does not hold) mixed in. The index
    stays valid: every resident position is still found at its slot."""
    v = reference.view_state(state, layout)
    S = layout.capacity
    every_bucket = torch.arange(layout.buckets).expand(state.shape[0], -1)
    occupied = reference.occupied_buckets(v, every_bucket, layout.buckets)
    for r in range(state.shape[0]):
        slots = (v.slot_pos[r] >= 0).nonzero().flatten()
        slots = slots[torch.randperm(slots.numel(), generator=gen)][:int(share * slots.numel())]
        keys = v.slot_pos[r, slots]
        owner = v.slot_pos[r, v.bucket_slot[r].clamp(0, S - 1).long()]
        moved = occupied[r] & torch.isin(owner, keys)
        v.bucket_slot[r][moved] = -1
        junk_slots = torch.randint(0, S, (stale,), generator=gen)
        junk_keys = v.slot_pos[r, junk_slots] + 1 + torch.randint(0, 50, (stale,), generator=gen,
                                                                  dtype=I32)
        all_keys = torch.cat([keys, junk_keys.to(I32)])
        all_slots = torch.cat([slots, junk_slots]).to(I32)
        order = torch.randperm(all_keys.numel(), generator=gen)[:S]
        n = order.numel()
        v.stash_key[r, :n] = all_keys[order]
        v.stash_slot[r, :n] = all_slots[order]
        v.stash_key[r, n:] = -1
        v.stash_slot[r, n:] = 0
        v.stash_count[r] = n
    return v


@pytest.mark.parametrize("matcher", ["hash", "dual_pointer"])
def test_stash_of_thousands(matcher):
    """buckets = capacity and an index that lives mostly in the stash: ~6,500 entries per row,
    stale ones among them, sorted in 13 runs and merged with the misses (the stash windows of
    the reuse policy hold 256 entries, so every sort run spans two windows). Hits found only in
    the stash must be pinned, counted and returned exactly as the reference does."""
    R, T, K, S, H, L, C = 2, 2, 2048, 8192, 8192, 4, 65536
    twin = Twin(R, S, H, L, matcher, max_context=C)
    gen = torch.Generator().manual_seed(17)
    seq = torch.full((R,), C, dtype=I32)
    for step in range(S // (T * K)):           # fill the buffer with distinct positions
        fill = torch.stack([torch.randperm(C, generator=gen)[:T * K] for _ in range(R)])
        twin.plan(fill.view(R, T, K).to(I32), seq)
    v = stash_the_index(twin.ref_state, twin.layout, gen)
    twin.state.copy_(twin.ref_state)
    assert int(v.stash_count.min()) > 6000
    for step in range(3):
        # half the selections are resident positions (most of them stashed), half new
        topk = torch.empty(R, T, K, dtype=I32)
        for r in range(R):
            resident = v.slot_pos[r][v.slot_pos[r] >= 0]
            old = resident[torch.randint(0, resident.numel(), (T * K // 2,), generator=gen)]
            new = torch.randint(0, C, (T * K - old.numel(),), generator=gen, dtype=I32)
            topk[r] = torch.cat([old, new])[torch.randperm(T * K, generator=gen)].view(T, K)
        before = twin.ref_stats[:, reference.STAT_HITS].clone()
        twin.plan(topk, seq)
        hits = twin.ref_stats[:, reference.STAT_HITS] - before
        assert int(hits.min()) > T * K // 4, "the stashed positions did not hit"
        v = reference.view_state(twin.ref_state, twin.layout)


def test_stash_first_entry_wins_across_runs():
    """A corrupted state holding one position in two slots, both stashed: the lookup returns the
    first stash entry's slot (the reference's rule), though the other entry sorts into an earlier
    run position and names the lower slot."""
    R, K, S, H, L = 1, 2048, 4096, 4096, 4
    twin = Twin(R, S, H, L, "hash")
    gen = torch.Generator().manual_seed(23)
    seq = torch.full((R,), 50000, dtype=I32)
    for step in range(S // K):
        twin.plan(torch.randperm(50000, generator=gen)[:K].view(1, 1, K).to(I32), seq)
    v = stash_the_index(twin.ref_state, twin.layout, gen, share=1.0, stale=0)
    n = int(v.stash_count[0])
    lo, hi = int(v.stash_slot[0, n - 1]), int(v.stash_slot[0, 3])
    lo, hi = min(lo, hi), max(lo, hi)
    p = int(v.slot_pos[0, lo])
    v.slot_pos[0, hi] = p                        # p is now held by both slots
    v.stash_key[0, 3], v.stash_slot[0, 3] = p, hi            # first entry: the higher slot
    v.stash_key[0, n - 1], v.stash_slot[0, n - 1] = p, lo    # last entry, last run
    twin.state.copy_(twin.ref_state)
    topk = torch.full((1, 1, K), -1, dtype=I32)
    topk[0, 0, 0] = p
    topk[0, 0, 1:100] = v.slot_pos[0, :99]
    slots, *_ = twin.plan(topk, seq)
    assert int(slots[0, 0, 0]) == hi


@pytest.mark.parametrize("policy", ["lifetime", "lru", "reuse"])
def test_a_later_token_without_misses_closes_the_open_run(policy):
    """One lookup group holds both query tokens (T 2, K 512: chunks 0 and 1, bucket_slot and
    slot_pos whole in UB). Token 0 misses a few positions, so its chunk opens a run; token 1 hits
    only, some slots token 0 did not hit: its chunk marks them from the sort region by scalar and
    then, ending the group, closes the open run with a sort into that region. The strict
    emulation raises on a missing S_V there (write-after-read); the results equal the reference."""
    R, T, K, S, H, L = 1, 2, 512, 2048, 4096, 8
    assert torch.ops.avsg.plan_ub_plan(T, K, S, H)[2] == H * 2, "bucket_slot is not whole in UB"
    twin = Twin(R, S, H, L, max_context=4096 if policy == "reuse" else 0, policy=policy)
    seq = torch.full((R,), 4000, dtype=I32)
    resident = torch.arange(0, 2 * K, dtype=I32)            # both tokens' positions, resident
    twin.plan(resident.view(1, T, K), seq)
    token0 = torch.cat([resident[:K - 16], torch.arange(3000, 3016, dtype=I32)])   # 16 misses
    token1 = resident[K // 2:K // 2 + K]                     # hits only, half of them fresh
    with emulation("strict"):
        twin.plan(torch.stack([token0, token1]).view(1, T, K), seq)
    assert twin.ref_stats[0, 2] == 2 * K + 16, "the second step missed other than token 0's 16"


# Steps by chunk kind (helpers.plan_cases.chunk_mix; chunk c of a row takes kinds[c % len]): misses
# in an early query token's chunks and hits only in later ones, none at all, miss counts around
# a staged run's 128, padding, repeats, stash pressure, with drops and an idle row between.
CHUNK_STEPS = (("new",), ("few", "hits", "fresh", "fresh"), ("hits",), ("hits", "few"),
               ("run_edge", "fresh", "pad", "few"), ("collide", "hits"), ("stashed", "few", "repeat"),
               ("some_pad", "junk", "new", "hits"), ("new",))


def run_chunk_steps(twin, gen, T, K, seq, steps=CHUNK_STEPS):
    """Drive ``twin`` through ``steps`` (chunk kinds each); from the fourth step on, every other
    step drops (valid_lens: near the lengths, at a held position, or a third of the buffer back)
    and one row may be idle."""
    for i, kinds in enumerate(steps):
        lens = None
        if i >= 3 and i % 2:
            lens = (valid_lens_near(gen, seq, T, twin.ref_state, twin.layout) if i % 4 == 1
                    else seq - twin.S // 3)
        topk = chunk_mix(gen, twin.ref_state, twin.layout, seq, T, K, kinds)
        twin.plan(topk, idle_some(gen, seq) if i >= 2 else seq, lens)
        seq = seq + T


def test_bucket_slot_whole_with_slot_pos_paged():
    """T 2, K 2048, capacity 16384, 16384 buckets: bucket_slot (int16 entries, 32 KB) stays whole
    in UB while slot_pos is paged, so the hash lookup takes one chunk at a time (no wide groups),
    gathering the buckets from one window and their slots from several, and the insert does the
    same. Steps chunk by chunk (CHUNK_STEPS) with drops and idle rows, bit for bit with the
    reference under the strict emulation's hazard checks."""
    R, T, K, S, H = 2, 2, 2048, 16384, 16384
    _, _, bs, sp, *_ = torch.ops.avsg.plan_ub_plan(T, K, S, H)
    assert bs == H * 2 and sp < S * 4, "bucket_slot is not whole, or slot_pos not paged"
    gen = torch.Generator().manual_seed(41)
    with emulation("strict"):
        twin = Twin(R, S, H, 6)
        run_chunk_steps(twin, gen, T, K, torch.full((R,), 3 * S, dtype=I32))


@pytest.mark.slow
@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("policy", ["lifetime", "lru", "reuse"])
@pytest.mark.parametrize("T,K,S,H", [
    (2, 512, 2048, 4096),      # wide lookup groups: one group of both tokens' chunks
    (3, 700, 4096, 8192),      # a group of 4 chunks and one of 1; chunks straddle query tokens
    (4, 1024, 4096, 4096),     # two groups, a full buffer, as many buckets as slots
    (4, 256, 1024, 1024),      # each chunk holds two query tokens; a full buffer
    (1, 2048, 8192, 8192),     # stash windows paged, the index whole
    (2, 512, 2048, 32768),     # a large index, whole (reuse: its ghosts and heat paged)
    (4, 2048, 8192, 16384),    # stash windows paged (reuse: its sections too)
    (2, 2048, 16384, 16384),   # bucket_slot whole, slot_pos paged: one chunk per lookup
    (4, 2048, 32768, 32768)])  # every section paged
def test_chunk_kinds_across_layouts(T, K, S, H, policy, split):
    """CHUNK_STEPS on every UB layout class the host picks (whole or paged bucket_slot /
    slot_pos / slot_life / stash windows), every policy, with and without the split lookup (2 rows
    on 2 + chunks cores: the owner looks up none), bit for bit with the reference under the
    strict emulation's hazard checks. The hazards it looks for hang on a layout and a per-chunk
    pattern together (a run left open by an early token's misses, closed by a later token's
    hits), which random selections over a few geometries rarely build."""
    R = 2
    chunks = -(-T * K // 512)
    gen = torch.Generator().manual_seed(T * K + S + H)
    saved = backend.emulated_cores()
    backend.set_emulated_cores(max(saved, R * (chunks + 1)))
    try:
        with emulation("strict"), split_lookup(split):
            twin = Twin(R, S, H, 6, max_context=(1 << 22) if policy == "reuse" else 0, policy=policy)
            seq = torch.full((R,), 3 * S, dtype=I32)
            for _ in range(S // (T * K) - 1):          # near full before the steps
                twin.plan(chunk_mix(gen, twin.ref_state, twin.layout, seq, T, K, ("new",)), seq)
            run_chunk_steps(twin, gen, T, K, seq)
    finally:
        backend.set_emulated_cores(saved)
