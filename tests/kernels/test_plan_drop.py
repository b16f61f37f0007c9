"""The drop folded into the plan (``plan(..., valid_lens=...)``, issue 43 item 3).

The reference specifies it as invalidate's drop at the start of the step; here that is checked
to equal ``invalidate`` then ``plan`` (the serving path's two launches before) on random and
adversarial sessions, under all three policies and both matchers, and both kernel builds are
checked bit for bit against the reference, with the split lookup on and off and with paged
section windows. The split-lookup case matters: the owner drops while helper cores read slot_pos
from GM, and their lookup ignores what the drop frees.
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from avsg import backend, reference
from helpers.plan_cases import I32, Twin, colliding, draw, idle_some, split_lookup, valid_lens_near

POLICIES = ("lifetime", "lru", "reuse")


def _layout(S, H, policy, max_context):
    return reference.Layout(S, H, max_context, policy == "reuse")


class RefPair:
    """Two reference states driven in lockstep: one by invalidate then plan, one by the fused plan."""

    def __init__(self, R, S, H, L, policy, matcher, max_context):
        self.layout = _layout(S, H, policy, max_context)
        self.L, self.policy, self.matcher = L, policy, matcher
        self.state = {k: reference.new_state(R, self.layout, L, policy=policy) for k in ("two", "one")}
        self.stats = {k: torch.zeros(R, 4, dtype=torch.int64) for k in ("two", "one")}

    def step(self, topk, seq, lens):
        reference.invalidate(self.state["two"], self.layout, lens)
        two = reference.plan(self.state["two"], self.stats["two"], topk, seq, self.layout, self.L,
                             matcher=self.matcher, policy=self.policy)
        one = reference.plan(self.state["one"], self.stats["one"], topk, seq, self.layout, self.L,
                             matcher=self.matcher, policy=self.policy, valid_lens=lens)
        for name, a, b in zip(("slots", "miss_pos", "miss_slots", "miss_counts"), two, one):
            assert torch.equal(a, b), f"{name}: fused plan differs from invalidate + plan"
        assert torch.equal(self.state["two"], self.state["one"]), "state differs"
        assert torch.equal(self.stats["two"], self.stats["one"]), "stats differ"
        reference.check_state(self.state["one"], self.layout, self.L, self.policy)

    def reset(self, mask):
        for k in self.state:
            reference.reset(self.state[k], self.layout, mask, self.L, self.policy)


drop_geometry = st.tuples(
    st.integers(1, 3),                                   # R
    st.integers(1, 4),                                   # T (MTP)
    st.sampled_from([1, 3, 8, 16, 31, 64]),              # K
    st.sampled_from([1.0, 1.0, 1.3, 2.0]),               # S / (T*K): full buffers are common
    st.sampled_from([1, 2]),                             # H / default (1: more collisions)
    st.integers(1, 20),                                  # L
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(drop_geometry, st.sampled_from(POLICIES), st.sampled_from(["hash", "dual_pointer"]),
       st.integers(0, 2**31 - 1), st.integers(6, 14))
def test_reference_fused_equals_invalidate_then_plan(geo, policy, matcher, seed, steps):
    """MTP repeats, -1 padding and junk (draw), full buffers, small tables (collisions), small
    ghost tables under reuse (a short max_context bound keeps positions in few ghost entries),
    limits exactly at held positions, and far out of range; idle rows (seq_len <= 0: the drop
    alone, no decay, whether it comes in the plan or before it)."""
    R, T, K, ratio, hdiv, L = geo
    S = max(T * K, int(T * K * ratio))
    H = max(64, reference.default_buckets(S) // hdiv)
    C = 1 << 20 if policy == "reuse" else 0
    pair = RefPair(R, S, H, L, policy, matcher, C)
    gen = torch.Generator().manual_seed(seed)
    seq = torch.randint(T * K, 6 * S + 8, (R,), generator=gen, dtype=I32)
    for _ in range(steps):
        lens = valid_lens_near(gen, seq, T, pair.state["one"], pair.layout)
        seq = seq + torch.randint(0, T + 1, (R,), generator=gen, dtype=I32)
        pair.step(draw(gen, R, T, K, seq, hot=2 * T * K), idle_some(gen, seq), lens)
        if torch.rand(1, generator=gen) < 0.1:
            pair.reset(torch.rand(R, generator=gen) < 0.5)


@pytest.mark.parametrize("policy", POLICIES)
def test_reference_fused_with_colliding_positions(policy):
    """Positions sharing one probe sequence (stash in use), the limit among them."""
    R, T, K, S, H, L = 1, 2, 8, 16, 64, 5
    pair = RefPair(R, S, H, L, policy, "hash", (1 << 24) if policy == "reuse" else 0)
    family = torch.tensor(colliding(H, 24, base=3), dtype=I32)
    seq = torch.tensor([int(family.max()) + 8], dtype=I32)
    for step in range(8):
        picked = family[torch.randperm(24, generator=torch.Generator().manual_seed(step))[:T * K]]
        lens = torch.tensor([int(family[(5 * step) % 24])], dtype=I32)   # exactly a held position
        pair.step(picked.view(1, T, K), seq, lens)


# ------------------------------------------------------------------------------ kernels

@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(drop_geometry, st.sampled_from(POLICIES), st.sampled_from(["hash", "dual_pointer"]),
       st.integers(0, 2**31 - 1), st.sampled_from(["strict", "fast"]), st.booleans())
def test_kernel_fused_sessions_bit_exact(geo, policy, matcher, seed, build, split):
    R, T, K, ratio, hdiv, L = geo
    S = max(T * K, int(T * K * ratio))
    H = max(64, reference.default_buckets(S) // hdiv)
    twin = Twin(R, S, H, L, matcher, max_context=(1 << 20) if policy == "reuse" else 0, policy=policy)
    gen = torch.Generator().manual_seed(seed)
    seq = torch.randint(T * K, 6 * S + 8, (R,), generator=gen, dtype=I32)
    with backend.emulation(build), split_lookup(split):
        for step in range(8):
            lens = valid_lens_near(gen, seq, T, twin.ref_state, twin.layout) if step % 3 else None
            seq = seq + torch.randint(0, T + 1, (R,), generator=gen, dtype=I32)
            twin.plan(draw(gen, R, T, K, seq, hot=2 * T * K), idle_some(gen, seq), lens)


@pytest.mark.parametrize("build", ["strict", "fast"])
@pytest.mark.parametrize("policy, R, T, K, S, split", [
    ("lifetime", 1, 2, 2048, 8192, True),    # split lookup, sections whole in UB
    ("reuse", 1, 1, 2048, 8192, True),
    ("lru", 2, 2, 1024, 8192, False),
    ("lifetime", 1, 1, 2048, 32768, True),   # paged windows (slot_life 256-entry windows) + split
    ("reuse", 1, 1, 2048, 32768, False),     # paged slot_pos / slot_count / ghost windows
])
def test_kernel_fused_real_sizes(build, policy, R, T, K, S, split):
    """Rows kept full over several steps, then the drop of a few drafts per step (MTP) and, once,
    of half the row (a limit in the middle of the resident positions)."""
    H = reference.default_buckets(S)
    twin = Twin(R, S, H, 30, max_context=(1 << 22) if policy == "reuse" else 0, policy=policy)
    gen = torch.Generator().manual_seed(S + K)
    seq = torch.full((R,), 3 * S, dtype=I32)
    with backend.emulation(build), split_lookup(split):
        for step in range(6):
            lens = seq - (T + 1) if step != 3 else seq - S // 3
            seq = seq + T
            twin.plan(draw(gen, R, T, K, seq, hot=2 * S, pad=0.02, repeat=0.4, wild=0.01), seq, lens)


@pytest.mark.parametrize("build", ["strict", "fast"])
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("slot", [0, 2047, 2048, 6143, 6144, 8191])
def test_kernel_drop_finds_one_position_anywhere(build, policy, slot):
    """Where slot_pos is whole in UB the kernel first asks, in one pass over wide chunks of the
    section, whether anything is at or past the limit, and skips the drop if not: a single such
    position, in any chunk (first, last, either side of a chunk boundary), is still dropped."""
    S, K = 8192, 2048
    twin = Twin(1, S, reference.default_buckets(S), 30,
                max_context=(1 << 22) if policy == "reuse" else 0, policy=policy)
    seq = torch.full((1,), 4 * S, dtype=I32)
    with backend.emulation(build):
        for step in range(4):                    # every slot filled, positions below S
            twin.plan(torch.arange(step * K, (step + 1) * K, dtype=I32).view(1, 1, K), seq)
        far = 10 * S                             # the only position at or past the limit
        for state, layout in ((twin.state, twin.layout), (twin.ref_state, twin.layout)):
            reference.view_state(state, layout).slot_pos[0, slot] = far
        twin.plan(torch.arange(K, dtype=I32).view(1, 1, K), seq,
                  torch.full((1,), far, dtype=I32))
        assert reference.view_state(twin.state, twin.layout).slot_pos[0, slot] != far


def test_fused_plan_rejects_bad_valid_lens_untouched():
    """A bad valid_lens is refused naming it, with the state and stats untouched."""
    R, T, K, S = 2, 1, 8, 32
    H = reference.default_buckets(S)
    twin = Twin(R, S, H, 5)
    seq = torch.tensor([40, 50], dtype=I32)
    twin.plan(draw(torch.Generator().manual_seed(1), R, T, K, seq, hot=16), seq)
    before, stats = twin.state.clone(), twin.stats.clone()
    topk = draw(torch.Generator().manual_seed(2), R, T, K, seq, hot=16)
    for bad, error in [(torch.zeros(R, dtype=torch.int64), TypeError), (torch.zeros(R + 1, dtype=I32), ValueError),
                       (torch.zeros(R, 2, dtype=I32), ValueError)]:
        with pytest.raises(error, match="valid_lens"):
            torch.ops.avsg.plan(topk, seq, twin.state, twin.stats, S, H, 5, 0, 0, bad)
        assert torch.equal(twin.state, before) and torch.equal(twin.stats, stats)


def test_fused_plan_header_mismatch_leaves_the_row_alone():
    """Without host checks (as on an NPU) a row whose header fails plan's check is left whole:
    not dropped either (invalidate alone, which checks less, would have dropped it)."""
    R, T, K, S, L = 2, 1, 8, 32, 5
    H = reference.default_buckets(S)
    twin = Twin(R, S, H, L)
    seq = torch.tensor([40, 50], dtype=I32)
    twin.plan(draw(torch.Generator().manual_seed(1), R, T, K, seq, hot=16), seq)
    twin.state[1, reference.HEADER_LIFETIME] = L + 1          # row 1 built for another lifetime
    before = twin.state.clone()
    saved = torch.ops.avsg._set_host_value_checks(False)
    try:
        topk = draw(torch.Generator().manual_seed(2), R, T, K, seq, hot=16)
        out = torch.ops.avsg.plan(topk, seq, twin.state, twin.stats, S, H, L, 0, 0, torch.zeros(R, dtype=I32))
    finally:
        torch.ops.avsg._set_host_value_checks(saved)
    assert int(out[3][1]) == -1 and torch.equal(twin.state[1], before[1])
    # row 0 (valid header) was dropped to empty first: every selection of the step misses
    selected = topk[0][(topk[0] >= 0) & (topk[0] < seq[0])].unique()
    assert int(out[3][0]) == selected.numel() > 0


# ------------------------------------------------------------------------------ the buffer

@pytest.mark.parametrize("policy", POLICIES)
def test_buffer_plan_with_valid_lens_equals_invalidate_then_plan(policy):
    """Two buffers, one driven by invalidate + plan and one by plan(valid_lens), with plans left
    uncopied in between (the buffer drops those first, before either): same plans, same state."""
    import avsg
    R, T, K, S = 2, 2, 16, 64
    extra = {"max_context": 1 << 20} if policy == "reuse" else {}
    two, one = (avsg.SparseKVBuffer(rows=R, capacity=S, topk=K, queries_per_step=T, policy=policy, **extra)
                for _ in range(2))
    pool = torch.arange(R * 4096 * 8, dtype=torch.float32).view(R, 4096, 8)   # 32 B rows
    dst = {id(b): torch.zeros(R, S, 8) for b in (two, one)}
    gen = torch.Generator().manual_seed(5)
    seq = torch.tensor([200, 300], dtype=I32)
    for step in range(10):
        lens = seq - torch.randint(0, T + 2, (R,), generator=gen, dtype=I32)
        seq = seq + T
        topk = draw(gen, R, T, K, seq, hot=3 * K, wild=0.0)
        topk = torch.where(topk >= 0, topk, -1)
        two.invalidate(lens)
        plans = [two.plan(topk, seq, check=False), one.plan(topk, seq, check=False, valid_lens=lens)]
        for a, b in zip(plans[0][:4], plans[1][:4]):
            assert torch.equal(a, b)
        assert torch.equal(two.state, one.state)
        if step % 3 != 2:                       # every third plan is never copied
            for buf, plan in zip((two, one), plans):
                avsg.gather(plan, src=[pool], dst=[dst[id(buf)]])
    assert torch.equal(two.stats_counts, one.stats_counts)
    assert torch.equal(dst[id(two)], dst[id(one)])


def test_buffer_plan_rejects_bad_valid_lens_untouched():
    import avsg
    buf = avsg.SparseKVBuffer(rows=2, capacity=32, topk=8, track_copies=False)
    seq = torch.tensor([40, 50], dtype=I32)
    topk = torch.arange(16, dtype=I32).view(2, 1, 8)
    buf.plan(topk, seq)
    before = buf.state.clone()
    for bad, error in [(torch.zeros(2, dtype=torch.int64), TypeError), (torch.zeros(3, dtype=I32), ValueError),
                       ([40, 50], TypeError), (torch.zeros(2, dtype=I32, device="meta"), ValueError)]:
        with pytest.raises(error, match="valid_lens"):
            buf.plan(topk, seq, valid_lens=bad)
        assert torch.equal(buf.state, before)
