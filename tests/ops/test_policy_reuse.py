"""The reuse residency policy: its state, what invalidate does to it, the header
that ties a state to its policy, and the kernels against an independent sort-based model.

Bit-exactness of the kernels with the reference on random sessions, MTP, invalidate/reset,
collisions and the largest geometry is in test_kernel_plan.py (parametrised over the policy);
corrupted reuse state in test_state_safety.py.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import avsg
from avsg import reference
from avsg.backend import emulation
from helpers.plan_cases import Twin

# plan-only buffers hold no KV: track_copies=False keeps a plan's misses resident without
# a gather (what these tests specify); tests/ops/test_uncopied.py covers the tracking

I32 = torch.int32


def count_of(buf, pos, row=0):
    """A position's count: its slot's while resident, else its ghost's (0 when none)."""
    v = reference.view_state(buf.state, buf.layout)
    held = (v.slot_pos[row] == pos).nonzero()
    if held.numel():
        return int(v.slot_count[row, held[0, 0]])
    return int(reference.ghost_count(v.ghost[row:row + 1], torch.tensor([[pos]]), buf.layout))


def test_rejected_drafts_do_not_inflate_counts():
    """MTP: the drafts' own positions (>= the accepted length) are selected speculatively; after
    invalidate they are gone and count nothing, so the real token at that position starts from 0
    (a miss gains 2). Positions below the accepted length that rejected query tokens selected
    keep their count."""
    buf = avsg.SparseKVBuffer(rows=1, capacity=8, topk=2, queries_per_step=2, max_context=64,
                              policy="reuse", track_copies=False)
    seq = torch.tensor([42], dtype=I32)
    # token 0 selects {3, 40}, the draft token 1 selects {3, 41} (41: its own, speculative)
    buf.plan(torch.tensor([[[3, 40], [3, 41]]], dtype=I32), seq)
    assert count_of(buf, 3) == 2 and count_of(buf, 41) == 2     # one use per step, T shares
    buf.invalidate(torch.tensor([41], dtype=I32))               # the draft was rejected
    assert 41 not in buf.resident(0)
    assert count_of(buf, 41) == 0 and count_of(buf, 3) == 2 and count_of(buf, 40) == 2
    buf.check_state()
    buf.plan(torch.tensor([[[41, 3], [41, -1]]], dtype=I32), seq)
    assert count_of(buf, 41) == 2 and count_of(buf, 3) == 3     # 3 continues a streak


def test_invalidate_forgets_counts_of_evicted_speculative_positions():
    """A count left as a ghost (the position was evicted) is also dropped by invalidate."""
    buf = avsg.SparseKVBuffer(rows=1, capacity=2, topk=2, max_context=32, policy="reuse",
                              track_copies=False)
    seq = torch.tensor([32], dtype=I32)
    buf.plan(torch.tensor([[[20, 21]]], dtype=I32), seq)
    buf.plan(torch.tensor([[[20, 21]]], dtype=I32), seq)
    buf.plan(torch.tensor([[[1, 2]]], dtype=I32), seq)          # evicts 20, 21 (counts 3)
    assert count_of(buf, 20) == 3 and 20 not in buf.resident(0)
    buf.invalidate(torch.tensor([21], dtype=I32))
    assert count_of(buf, 20) == 3 and count_of(buf, 21) == 0
    buf.check_state()


def test_counts_survive_eviction_and_return():
    buf = avsg.SparseKVBuffer(rows=1, capacity=4, topk=4, max_context=100, policy="reuse",
                              track_copies=False)
    seq = torch.tensor([100], dtype=I32)
    for _ in range(3):
        buf.plan(torch.tensor([[[10, 11, 12, 13]]], dtype=I32), seq)
    buf.plan(torch.tensor([[[50, 51, 52, 53]]], dtype=I32), seq)
    assert count_of(buf, 10) == 4 and 10 not in buf.resident(0)   # 2 (miss) + 1 + 1 (streak)
    buf.plan(torch.tensor([[[10, 51, 52, 53]]], dtype=I32), seq)
    assert count_of(buf, 10) == 6                                  # back: a return gains 2


def test_a_return_counts_double_a_streak_once():
    """Hand-checked: a hit one step after the last use gains 1, a hit after a gap gains 2, a
    miss (always a return) its spilled count + 2; with T query tokens a slot gains once."""
    buf = avsg.SparseKVBuffer(rows=1, capacity=4, topk=2, queries_per_step=2, max_context=64,
                              policy="reuse", track_copies=False)
    seq = torch.tensor([64], dtype=I32)

    def step(*tokens):
        buf.plan(torch.tensor([list(tokens)], dtype=I32), seq)

    step([7, 8], [7, -1])                 # both miss: 2 each (7 used by both tokens: once)
    assert (count_of(buf, 7), count_of(buf, 8)) == (2, 2)
    step([7, -1], [7, -1])                # 7 streak: +1
    assert (count_of(buf, 7), count_of(buf, 8)) == (3, 2)
    step([8, -1], [-1, -1])               # 8 away one step, then back: +2
    assert (count_of(buf, 7), count_of(buf, 8)) == (3, 4)
    step([8, 7], [-1, -1])                # 8 streak +1, 7 return +2
    assert (count_of(buf, 7), count_of(buf, 8)) == (5, 5)
    step([1, 2], [3, 4])                  # evicts 7 and 8: counts kept
    step([7, 1], [2, 3])                  # 7 misses: 5 + 2
    assert count_of(buf, 7) == 7 and count_of(buf, 8) == 5
    buf.check_state()


def test_counts_halve_every_256_steps():
    buf = avsg.SparseKVBuffer(rows=1, capacity=2, topk=1, max_context=8, policy="reuse",
                              track_copies=False)
    seq = torch.tensor([8], dtype=I32)
    for step in range(256):
        buf.plan(torch.tensor([[[5]]], dtype=I32), seq)
        if step == 254:
            assert count_of(buf, 5) == 255
    assert count_of(buf, 5) == 255 >> 1                          # saturated, then halved
    assert int(buf.state[0, reference.HEADER_STEP]) == 0


def test_selections_beyond_max_context_are_none():
    buf = avsg.SparseKVBuffer(rows=1, capacity=4, topk=2, max_context=10, policy="reuse",
                              track_copies=False)
    plan = buf.plan(torch.tensor([[[3, 9]]], dtype=I32), torch.tensor([10], dtype=I32))
    assert int(plan.miss_counts[0]) == 2
    with pytest.raises(ValueError, match="max_context"):
        buf.plan(torch.tensor([[[3, 12]]], dtype=I32), torch.tensor([13], dtype=I32))
    plan = buf.plan(torch.tensor([[[3, 12]]], dtype=I32), torch.tensor([13], dtype=I32),
                    check=False)
    assert int(plan.slots[0, 0, 1]) == -1 and int(plan.miss_counts[0]) == 0


def test_state_records_its_policy():
    """The header holds policy and max_context: an op called with others refuses the state (on
    CPU); without the host checks the kernel rejects the row as it does any geometry mismatch."""
    buf = avsg.SparseKVBuffer(rows=2, capacity=16, topk=4, max_context=64, policy="reuse",
                              track_copies=False)
    topk = torch.tensor([[[1, 2, 3, 4]]] * 2, dtype=I32)
    seq = torch.full((2,), 64, dtype=I32)
    with pytest.raises(ValueError, match="policy"):
        reference.check_header(buf.state, buf.layout, reference.DEFAULT_LIFETIME, "lifetime")
    with pytest.raises(ValueError, match="policy"):
        torch.ops.avsg.plan(topk, seq, buf.state, buf.stats_counts, 16, 64, buf.lifetime, 0, 64)
    with pytest.raises(ValueError, match="max_context"):
        torch.ops.avsg.plan(topk, seq, buf.state, buf.stats_counts, 16, 64, buf.lifetime, 1, 32)
    old = torch.ops.avsg._set_host_value_checks(False)
    try:
        state = buf.state.clone()
        state[1, reference.HEADER_POLICY] = 0
        before = state.clone()
        out = torch.ops.avsg.plan(topk, seq, state, buf.stats_counts.clone(), 16, 64, buf.lifetime, 1, 64)
        assert int(out[3][1]) == -1 and torch.equal(state[1], before[1])
        assert int(out[3][0]) == 4
    finally:
        torch.ops.avsg._set_host_value_checks(old)


def test_reuse_state_is_sized_by_the_buffer():
    """No max_context needed, and none changes the state: S + G + B int32 beyond the lifetime
    layout (H int16 buckets, S positions, S int16 lives, 2S stash; G = 2H ghosts, B = max(64,
    H / 16) heat blocks), whatever the context."""
    S, K = 8192, 2048
    buf = avsg.SparseKVBuffer(rows=4, capacity=S, topk=K, policy="reuse", track_copies=False)
    H = buf.hash_buckets
    assert buf.layout.width == reference.STATE_HEADER + H // 2 + S // 2 + 4 * S + 2 * H + H // 16
    assert buf.layout.width == avsg.SparseKVBuffer(rows=1, capacity=S, topk=K, policy="reuse",
                                                   max_context=1 << 24, track_copies=False).layout.width
    seq = torch.full((4,), 1 << 22, dtype=I32)
    topk = (torch.arange(K, dtype=I32) * 1999 % (1 << 22)).view(1, 1, K).repeat(4, 1, 1)
    assert int(buf.plan(topk, seq).miss_counts.sum()) == 4 * K
    buf.check_state()


def test_ghosts_collide_modulo_g():
    """Positions G apart share a ghost entry: the later eviction wins, and the earlier position
    returns as a stranger (count 0 + 2); an untouched ghost returns its count. Two slots and two
    selections per step: every step of new positions evicts both."""
    buf = avsg.SparseKVBuffer(rows=1, capacity=2, topk=2, policy="reuse", track_copies=False)
    G = buf.layout.ghosts
    seq = torch.tensor([4 * G], dtype=I32)

    def step(a, b):
        buf.plan(torch.tensor([[[a, b]]], dtype=I32), seq)

    for _ in range(3):
        step(5, 9)                                    # 2 (miss) + 1 + 1 (streak)
    step(5 + G, 7 + G)                                # evicts 5 and 9: their ghosts hold 4
    assert 5 not in buf.resident(0) and count_of(buf, 5) == 4 and count_of(buf, 9) == 4
    step(5 + G, 7 + G)
    step(20, 21)                                      # 5 + G leaves its 3 in 5's entry
    assert count_of(buf, 5 + G) == 3 and count_of(buf, 5) == 0 and count_of(buf, 9) == 4
    step(5, 9)
    assert count_of(buf, 5) == 2 and count_of(buf, 9) == 6
    buf.check_state()
    buf.invalidate(torch.tensor([G], dtype=I32))      # 5 + G's ghost names a position >= G
    assert count_of(buf, 5 + G) == 0 and count_of(buf, 20) == 2
    buf.check_state()


@pytest.mark.parametrize("policy", ["lifetime", "lru", "reuse"])
def test_max_context_is_a_check_for_every_policy(policy):
    buf = avsg.SparseKVBuffer(rows=1, capacity=4, topk=2, policy=policy, max_context=10,
                              track_copies=False)
    with pytest.raises(ValueError, match="max_context"):
        buf.plan(torch.tensor([[[3, 12]]], dtype=I32), torch.tensor([13], dtype=I32))
    plan = buf.plan(torch.tensor([[[3, 12]]], dtype=I32), torch.tensor([13], dtype=I32),
                    check=False)
    assert int(plan.slots[0, 0, 1]) == -1 and int(plan.miss_counts[0]) == 1
    assert int(buf.state[0, reference.HEADER_MAX_CONTEXT]) == 10


def test_lifetime_policy_state_is_unchanged():
    """The lifetime policy has no policy sections, words 4-5 zero."""
    buf = avsg.SparseKVBuffer(rows=1, capacity=64, topk=8, policy="lifetime", track_copies=False)
    assert buf.layout.width == reference.STATE_HEADER + 128 // 2 + 4 * 64   # 128 int16 buckets
    assert int(buf.state[0, 4]) == 0 and int(buf.state[0, 5]) == 0


def model_hits(sel: np.ndarray, capacity: int, ghosts: int, heat_blocks: int) -> np.ndarray:
    """An independent model of the reuse policy: full sort of (score, slot), a dense position ->
    slot map, 'last use' steps instead of ages, a direct-mapped ghost table of (position, count)
    pairs and a heat per block modulo ``heat_blocks``. sel [steps, K] sorted unique positions."""
    def log8(x):
        return ((np.asarray(x, np.int64) + 1).astype(np.float32).view(np.int32) >> 20) - 1016

    def log4(x):
        return ((np.asarray(x, np.int64) + 1).astype(np.float32).view(np.int32) >> 21) - 508

    steps, K = sel.shape
    maxpos = int(sel.max()) + 1
    pos_slot = np.full(maxpos, -1)
    slot_pos = np.full(capacity, -1)
    last = np.zeros(capacity, np.int64)
    slot_count = np.zeros(capacity, np.int64)
    ghost_pos = np.full(ghosts, -1)
    ghost_cnt = np.zeros(ghosts, np.int64)
    heat = np.zeros(heat_blocks, np.int64)
    hits = np.zeros(steps, np.int64)
    for t in range(steps):
        u = sel[t]
        s_of = pos_slot[u]
        hit = s_of >= 0
        hits[t] = hit.sum()
        heat = np.minimum((heat >> 1) + np.bincount((u // 64) % heat_blocks, minlength=heat_blocks), 255)
        miss = u[~hit]
        if miss.size:
            score = log8(slot_count) + log4(heat[(np.maximum(slot_pos, 0) // 64) % heat_blocks]) \
                - log8(np.minimum(t - last, 1023))
            score[slot_pos < 0] = -128
            score[s_of[hit]] = 127
            victims = np.sort(np.argsort(score * capacity + np.arange(capacity))[:miss.size])
            old = slot_pos[victims]
            for p, c in zip(old[old >= 0], slot_count[victims[old >= 0]]):   # the last one wins
                ghost_pos[p % ghosts], ghost_cnt[p % ghosts] = p, c
            pos_slot[old[old >= 0]] = -1
            slot_pos[victims] = miss
            pos_slot[miss] = victims
            slot_count[victims] = np.where(ghost_pos[miss % ghosts] == miss, ghost_cnt[miss % ghosts], 0)
            last[victims] = -2                     # a miss is a return
        used = pos_slot[u]
        slot_count[used] = np.minimum(slot_count[used] + np.where(t - last[used] > 1, 2, 1), 255)
        last[used] = t
        if (t + 1) % 256 == 0:
            slot_count >>= 1
            ghost_cnt >>= 1
    return hits


def test_kernel_matches_an_independent_model_on_the_full_trace():
    from avsg.lab.traces.format import load_trace
    from avsg.lab.traces.lookup import shipped_trace
    trace = load_trace(shipped_trace("asyncio_32k"), check_values=False)
    sel = trace.sel[[16], :300].astype(np.int64)       # the hardest layer, past one halving
    S, K = 2560, sel.shape[2]
    buf = avsg.SparseKVBuffer(rows=1, capacity=S, topk=K, check=False,
                              policy="reuse", track_copies=False)   # no max_context needed
    got = []
    for t in range(sel.shape[1]):
        plan = buf.plan(torch.from_numpy(sel[:, t]).to(I32).view(1, 1, K),
                        torch.tensor([trace.T], dtype=I32))
        got.append(K - int(plan.miss_counts[0]))
    lay = buf.layout
    assert lay.ghosts < trace.T, "the trace must make ghosts collide"
    assert np.array_equal(np.array(got), model_hits(sel[0], S, lay.ghosts, lay.heat_blocks))


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.integers(1, 2), st.integers(1, 4), st.sampled_from([2, 5, 16]),
       st.sampled_from([1.0, 1.5, 3.0]), st.integers(0, 2**31 - 1),
       st.lists(st.integers(0, 3), min_size=4, max_size=24), st.sampled_from(["strict", "fast"]))
def test_mtp_sessions_with_rejected_drafts_bit_exact(R, T, K, ratio, seed, accepted, build):
    """MTP decode as served: T query tokens per step (the token and T - 1 drafts, each also
    selecting its own position), then the rejected drafts invalidated. Long enough for streaks,
    returns, evictions and spilled counts to mix; kernel state equals the reference's after
    every op, and no position at or beyond the accepted length keeps a count."""
    S = max(T * K, int(T * K * ratio))
    context = 4 * S + 64
    gen = torch.Generator().manual_seed(seed)
    with emulation(build):
        twin = Twin(R, S, reference.default_buckets(S), 16, max_context=context)
        seq = torch.randint(T + 1, 2 * S, (R,), generator=gen, dtype=I32)
        for n_ok in accepted:
            hot = torch.clamp(seq[:, None, None] - torch.randint(1, 3 * K, (R, T, K), generator=gen),
                              min=0).to(I32)
            own = (seq[:, None] + torch.arange(T, dtype=I32)[None, :] - 1).to(I32)
            hot[:, :, 0] = own                        # each token (draft) selects itself
            topk = torch.full_like(hot, -1)
            for r in range(R):                        # unique within each query token
                for q in range(T):
                    u = torch.unique(hot[r, q])
                    topk[r, q, :u.numel()] = u
            twin.plan(topk, seq + T - 1)
            keep = min(n_ok, T - 1)                   # accepted drafts
            if keep < T - 1:
                valid = (seq + keep).to(I32)
                twin.invalidate(valid)
                v = reference.view_state(twin.ref_state, twin.layout)
                named = reference.ghost_positions(v.ghost, twin.layout)
                for r in range(R):
                    assert not bool((v.ghost[r] & 255)[named[r] >= int(valid[r])].any())
                    held = v.slot_pos[r] >= 0
                    assert not bool((v.slot_pos[r][held] >= int(valid[r])).any())
            seq = (seq + keep + 1).to(I32)
        reference.check_state(twin.ref_state, twin.layout, 16, "reuse")


def _heat(state, layout, row=0):
    return reference.view_state(state, layout).block_heat[row]


@pytest.mark.parametrize("build", ["strict", "fast"])
def test_block_heat_runs_bit_exact(build):
    """The kernel adds each heated block's use count at once (run lengths of the sorted block
    ids), with the heat indexed modulo B (a 2**20-position context over B = 1024 blocks at this
    geometry: 16 blocks share each counter). Steps: every valid selection in one block (one run
    of 64 across both tokens, shared positions counted once); blocks on both sides of every
    wrap of the heat; unsorted selections spread over the whole context, so runs cross chunk
    boundaries and wrap; and a corrupted heat (out of range both ways) that the step must clamp
    before it adds."""
    S, K, T, C = 8192, 2048, 2, 1 << 20
    H = reference.default_buckets(S)
    assert reference.Layout(S, H, 0, True).heat_blocks * 64 < C   # the heat wraps
    gen = torch.Generator().manual_seed(7)
    seq = torch.tensor([C], dtype=I32)
    with emulation(build):
        twin = Twin(1, S, H, 16, max_context=C)
        block = 1000                                   # one heat block, hit and missed
        for step in range(3):
            topk = torch.full((1, T, K), -1, dtype=I32)
            topk[0, 0, :64] = block * 64 + torch.randperm(64, generator=gen).to(I32)
            topk[0, 1, :40] = block * 64 + torch.arange(24, 64, dtype=I32)
            twin.plan(topk, seq)
            # all 64 used once per step: (h >> 1) + 64, never past 191 from a clamped 255
            assert int(_heat(twin.ref_state, twin.layout)[block]) == [64, 96, 112][step]
        edges = torch.arange(1, C // 32768, dtype=I32) * 32768   # every second one a wrap
        near = torch.cat([edges - 1, edges, edges - 64, edges + 63, edges - 65, edges + 64])
        for step in range(3):
            spread = torch.randperm(C, generator=gen)[:K - near.numel()].to(I32)
            topk = torch.stack([torch.cat([near, spread])[torch.randperm(K, generator=gen)],
                                torch.cat([near[::2], spread, near[1::2]])])[None]
            twin.plan(topk.to(I32), seq)
        for state in (twin.state, twin.ref_state):
            heat = _heat(state, twin.layout)
            heat[block] = 10 ** 6
            heat[block + 1] = -7
            heat[0] = 255
        topk = torch.full((1, T, K), -1, dtype=I32)
        topk[0, 0, :128] = block * 64 + torch.arange(128, dtype=I32)
        topk[0, 1, :64] = torch.arange(64, dtype=I32)
        twin.plan(topk, seq)
        assert _heat(twin.ref_state, twin.layout)[[block, block + 1, 0]].tolist() == [191, 64, 191]
