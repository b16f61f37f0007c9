"""Safe whatever the state holds (issue 8, item 0).

A corruption fuzzer: random and targeted values written into every section of one state row
(header, bucket_slot, slot_pos, slot_life, stash_key, stash_slot, stash_count, the
padding slots), then every kernel run on it: plan (hash and dual pointer), invalidate, reset, and
gather on corrupted plans. Every tensor an op writes sits between guard rows (the op gets the
middle of a bigger tensor), and the other rows of the batch are compared with a run on the
uncorrupted state. The allowed outcomes are:

* a clean error (``ValueError`` from a check, the state untouched), or
* in-bounds output: slots and miss slots in ``[-1, S)``, counts in ``[0, T*K]`` (``-1`` for a row
  a kernel rejected), only the corrupted row's own state changed, its geometry words kept,
  guard rows intact, and the kernels equal to the reference (which clamps the same way).

A ``RuntimeError`` from the CPU emulation is a failure: the emulation bounds-checks every GM and UB
access, and on an NPU that access would have gone through silently.

The host-side value checks of the CPU backend (state header, gather's plan indices) are switched
off in half of the cases, so the kernels' own header checks and clamps are what is tested: that is
all an NPU has.
"""
from __future__ import annotations

import contextlib
import threading

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import avsg
from avsg import reference
from helpers.gather_cases import kv_zeros
from helpers.plan_cases import split_lookup

I32 = torch.int32
GUARD_STATE = 0x5A5A5A5A          # int32 pattern of the guard rows around the state
GUARD_STATS = 0x0123456789ABCDEF
SECTIONS = ("header", "bucket_slot", "slot_pos", "slot_life", "stash_key",
            "stash_slot", "stash_count", "padding", "slot_count", "ghost", "block_heat",
            "step",              # the last four: reuse policy state (empty under lifetime)
            "active",            # the active capacity (resize)
            "hand")              # the lifetime policy's tie hand
FAST = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
SLOW = settings(max_examples=1500, deadline=None, suppress_health_check=list(HealthCheck))


@contextlib.contextmanager
def host_checks(enabled: bool):
    old = torch.ops.avsg._set_host_value_checks(enabled)
    try:
        yield
    finally:
        torch.ops.avsg._set_host_value_checks(old)


def guarded(t: torch.Tensor, fill) -> tuple:
    """``t`` copied into the middle of a tensor with one guard row on each side: (big, middle)."""
    big = torch.full((t.shape[0] + 2, *t.shape[1:]), fill, dtype=t.dtype)
    big[1:-1] = t
    return big, big[1:-1]


def guards_intact(big: torch.Tensor, fill) -> bool:
    return bool((big[0] == fill).all()) and bool((big[-1] == fill).all())


# ----------------------------------------------------------------------------- geometry + state

class Geometry:
    def __init__(self, R, T, K, S, H, L, C=0, policy=None):
        """``C``: max_context (a bound only); by default 0 is the lifetime policy, anything
        else the reuse policy (``policy`` overrides: reuse without a bound, lru, ...)."""
        self.R, self.T, self.K, self.S, self.H, self.L, self.C = R, T, K, S, H, L, C
        self.N = T * K
        self.policy = policy or ("reuse" if C else "lifetime")
        self.layout = reference.Layout(S, H, C, self.policy == "reuse")
        self.policy_id = reference.POLICY_IDS[self.policy]

    def section(self, name):
        """(offset, length) of a section of one row, padding included."""
        lay, Sp = self.layout, self.layout.padded_capacity
        return {"header": (0, reference.STATE_HEADER),
                "bucket_slot": (lay.bucket_slot, self.H),
                "slot_pos": (lay.slot_pos, Sp), "slot_life": (lay.slot_life, Sp),
                "stash_key": (lay.stash_key, Sp), "stash_slot": (lay.stash_slot, Sp),
                "stash_count": (reference.HEADER_STASH_COUNT, 1),
                "padding": (lay.slot_pos + self.S, Sp - self.S),
                "slot_count": (lay.slot_count, lay.ghost - lay.slot_count),
                "ghost": (lay.ghost, lay.ghosts),
                "block_heat": (lay.block_heat, lay.heat_blocks),
                "step": (reference.HEADER_STEP, 1 if self.policy == "reuse" else 0),
                "active": (reference.HEADER_ACTIVE, 1),
                "hand": (reference.HEADER_HAND, 1)}[name]

    def targeted(self):
        S, Sp, H, L = self.S, self.layout.padded_capacity, self.H, self.L
        return [-(1 << 31), -(1 << 24), -2, -1, 0, 1, S - 1, S, S + 1, Sp, H - 1, H, 2 * H, L - 1,
                L, L + 1, 255, 256, (1 << 24) - 1, 1 << 24, (1 << 24) + 1, (1 << 31) - 1,
                1023, 1024, self.C - 1, self.C, self.C + 1, 127, 128, self.N - 1, self.N,
                self.N + 1]


geometries = st.builds(
    lambda R, T, K, extra, H2, L, C: Geometry(R, T, K, T * K + extra,
                                              max(64, 1 << (T * K + extra - 1).bit_length()) * H2,
                                              L, max(C, 0) * (T * K + extra) // 4,
                                              "lru" if C < 0 else None),
    st.integers(2, 3), st.integers(1, 2), st.sampled_from([8, 16, 24]),
    st.sampled_from([0, 0, 5, 21, 40]), st.sampled_from([1, 2]), st.sampled_from([1, 3, 16, 255]),
    st.sampled_from([0, 0, 5, 13, 40, -1]))   # max_context in S/4 units: 0 lifetime, -1 lru


def selections(gen, g: Geometry, seq, hot=None):
    hot = hot or 2 * g.S
    out = torch.empty(g.R, g.T, g.K, dtype=I32)
    for r in range(g.R):
        n = int(seq[r])
        out[r] = torch.randint(max(0, n - hot), n, (g.T, g.K), generator=gen, dtype=I32)
    out[torch.rand(g.R, g.T, g.K, generator=gen) < 0.1] = -1
    return out


def lived_in_state(g: Geometry, seed: int, steps: int = 4):
    """A state after a few real steps with heavy reuse, collisions (H small) and an invalidate,
    so every section holds live data and the stash is often in use."""
    gen = torch.Generator().manual_seed(seed)
    state = reference.new_state(g.R, g.layout, g.L, policy=g.policy)
    stats = torch.zeros(g.R, 4, dtype=torch.int64)
    seq = torch.full((g.R,), 3 * g.S, dtype=I32)
    for step in range(steps):
        reference.plan(state, stats, selections(gen, g, seq + step), seq + step, g.layout, g.L,
                       policy=g.policy)
        if step == 1:
            reference.invalidate(state, g.layout, seq - g.S // 3)
        if step == 2 and seed % 2:
            # half the states live at a shrunk active capacity (resize), some at T*K exactly
            caps = torch.randint(g.N, g.S + 1, (g.R,), generator=gen)
            caps[0] = g.N if seed % 4 == 1 else caps[0]
            reference.resize(state, g.layout, torch.arange(g.R), caps, g.L, g.policy, g.N)
    return state, stats, gen


corruptions = st.lists(st.tuples(st.sampled_from(SECTIONS), st.floats(0, 1, exclude_max=True),
                                 st.one_of(st.integers(-(1 << 31), (1 << 31) - 1),
                                           st.integers(0, 1 << 20).map(lambda i: -i - 1),
                                           st.integers(0, 63).map(lambda i: ("targeted", i)))),
                       min_size=1, max_size=8)


def corrupt(state: torch.Tensor, g: Geometry, row: int, edits, gen=None, whole=None) -> None:
    """Apply ``(section, where in [0, 1), value)`` edits to one row; ``whole`` fills a section
    with random int32 (or targeted values)."""
    targeted = g.targeted()
    for section, where, value in edits:
        off, length = g.section(section)
        if length == 0:
            continue
        if isinstance(value, tuple):
            value = targeted[value[1] % len(targeted)]
        state[row, off + int(where * length)] = value
    if whole is not None:
        off, length = g.section(whole)
        if length:
            state[row, off:off + length] = torch.randint(-(1 << 31), (1 << 31) - 1, (length,),
                                                         generator=gen, dtype=I32)


# ----------------------------------------------------------------------------------- the ops

def header_ok(state: torch.Tensor, g: Geometry, lifetime=True) -> torch.Tensor:
    """lifetime=False: the words invalidate checks (magic, S, H, max_context); else also the
    lifetime, the policy and the active capacity in [T*K, S] (plan, resize)."""
    h = state[:, :reference.HEADER_ACTIVE + 1]
    ok = (h[:, 0] == reference.HEADER_MAGIC) & (h[:, 1] == g.S) & (h[:, 2] == g.H)
    ok &= h[:, reference.HEADER_MAX_CONTEXT] == g.C
    active = h[:, reference.HEADER_ACTIVE]
    return ok & (h[:, 3] == g.L) & (h[:, reference.HEADER_POLICY] == g.policy_id) & \
        (active >= g.N) & (active <= g.S) if lifetime else ok


def run_plan(op, state, stats, topk, seq, g, lens=None):
    """The op on guarded copies: returns (outputs or the exception, state, stats)."""
    big_state, state_view = guarded(state, GUARD_STATE)
    big_stats, stats_view = guarded(stats, GUARD_STATS)
    try:
        out = op(topk, seq, state_view, stats_view, g.S, g.H, g.L, g.policy_id, g.C, lens)
    except (ValueError, TypeError) as e:
        out = e
    assert guards_intact(big_state, GUARD_STATE), "a write landed outside the state tensor"
    assert guards_intact(big_stats, GUARD_STATS), "a write landed outside the stats tensor"
    return out, state_view.clone(), stats_view.clone()


def expected_plan(state, stats, topk, seq, g, matcher, lens=None):
    """The reference on the rows whose header matches; the others rejected as the kernels do."""
    state, stats = state.clone(), stats.clone()
    ok = header_ok(state, g)
    out = [torch.full((g.R, g.T, g.K), -1, dtype=I32), torch.full((g.R, g.N), -1, dtype=I32),
           torch.full((g.R, g.N), -1, dtype=I32), torch.full((g.R,), -1, dtype=I32)]
    if bool(ok.any()):
        sub_state, sub_stats = state[ok], stats[ok]
        got = reference.plan(sub_state, sub_stats, topk[ok], seq[ok], g.layout, g.L, matcher,
                             g.policy, None if lens is None else lens[ok])
        for o, x in zip(out, got):
            o[ok] = x
        state[ok], stats[ok] = sub_state, sub_stats
    return out, state, stats


def slot_pos_has_repeats(state, g, row) -> bool:
    pos = reference.view_state(state, g.layout).slot_pos[row]
    pos = pos[(pos >= 0) & (pos < (1 << 24))]
    return pos.unique().numel() != pos.numel()


def check_plan_outcome(op, matcher, clean, dirty, stats, g, row, topk, seq, checked, lens=None):
    """Run ``op`` on the clean and the corrupted state; assert an allowed outcome."""
    clean_out, clean_state, clean_stats = run_plan(op, clean, stats, topk, seq, g, lens)
    assert not isinstance(clean_out, Exception), clean_out
    with host_checks(checked):
        out, state, new_stats = run_plan(op, dirty, stats, topk, seq, g, lens)
    if isinstance(out, Exception):
        assert isinstance(out, ValueError) and checked, out
        assert not bool(header_ok(dirty, g)[row]), f"rejected a row with a good header: {out}"
        assert torch.equal(state, dirty) and torch.equal(new_stats, stats), "a failed op wrote"
        return clean_state, state
    slots, miss_pos, miss_slots, miss_counts = out
    # in bounds
    assert int(slots.min()) >= -1 and int(slots.max()) < g.S, "slot outside [-1, S)"
    assert int(miss_slots.min()) >= -1 and int(miss_slots.max()) < g.S, "miss slot outside [-1, S)"
    assert int(miss_counts.min()) >= -1 and int(miss_counts.max()) <= g.N
    # the other rows: exactly what they get without the corruption
    others = torch.arange(g.R) != row
    for a, b in zip(out, clean_out):
        assert torch.equal(a[others], b[others]), "another row's output changed"
    assert torch.equal(state[others], clean_state[others]), "another row's state changed"
    assert torch.equal(new_stats[others], clean_stats[others]), "another row's stats changed"
    # the row's geometry words are never rewritten by plan
    assert torch.equal(state[row, :8], dirty[row, :8])
    assert torch.equal(state[row, 16:64], dirty[row, 16:64])
    if not bool(header_ok(dirty, g)[row]):
        assert int(miss_counts[row]) == -1 and torch.equal(state[row], dirty[row])
        assert bool((slots[row] == -1).all()) and bool((miss_slots[row] == -1).all())
    else:
        live = slots[row][slots[row] >= 0]
        assert int(miss_counts[row]) >= 0
        m = int(miss_counts[row])
        assert miss_slots[row, :m].unique().numel() == m, "two misses share a slot"
        assert live.numel() == 0 or int(live.max()) < g.S
    # the kernels are the reference, bit for bit (the dual pointer may pick another of two slots
    # holding one position)
    if matcher == "hash" or not slot_pos_has_repeats(dirty, g, row):
        want, want_state, want_stats = expected_plan(dirty, stats, topk, seq, g, matcher, lens)
        for name, a, b in zip(("slots", "miss_pos", "miss_slots", "miss_counts"), out, want):
            assert torch.equal(a, b), f"{name} differs from the reference"
        assert torch.equal(state, want_state), (state != want_state).nonzero()[:8].tolist()
        assert torch.equal(new_stats, want_stats)
    return clean_state, state


PLAN_OPS = {"hash": lambda: torch.ops.avsg.plan, "dual_pointer": lambda: torch.ops.avsg.plan_dual_pointer}


def fuzz_plan(g, seed, row, edits, whole, matcher, checked):
    clean, stats, gen = lived_in_state(g, seed)
    dirty = clean.clone()
    corrupt(dirty, g, row, edits, gen, whole)
    op = PLAN_OPS[matcher]()
    seq = torch.full((g.R,), 3 * g.S + 4, dtype=I32)
    clean, state = check_plan_outcome(op, matcher, clean, dirty, stats, g, row,
                                      selections(gen, g, seq), seq, checked)
    # the corruption persists: two more steps stay in bounds, then reset repairs the row
    for _ in range(2):
        nxt = selections(gen, g, seq)
        clean, state = check_plan_outcome(op, matcher, clean, state, stats, g, row, nxt, seq,
                                          checked)
    big, view = guarded(state, GUARD_STATE)
    torch.ops.avsg.reset(view, torch.arange(g.R) == row, g.S, g.H, g.L, g.policy_id, g.C)
    assert guards_intact(big, GUARD_STATE)
    reference.check_state(view, g.layout, g.L, g.policy)


@pytest.mark.parametrize("matcher", ["hash", "dual_pointer"])
@FAST
@given(g=geometries, seed=st.integers(0, 2**16), row=st.integers(0, 1), edits=corruptions,
       whole=st.one_of(st.none(), st.sampled_from(SECTIONS)), checked=st.booleans())
def test_plan_survives_corrupted_state(matcher, g, seed, row, edits, whole, checked):
    fuzz_plan(g, seed, row, edits, whole, matcher, checked)


@pytest.mark.parametrize("matcher", ["hash", "dual_pointer"])
@FAST
@given(g=geometries, seed=st.integers(0, 2**16), row=st.integers(0, 1), edits=corruptions,
       whole=st.one_of(st.none(), st.sampled_from(SECTIONS)), checked=st.booleans(),
       limit=st.sampled_from([-(1 << 31), -1, 0, 5, "held", (1 << 24) - 1, 1 << 24, (1 << 31) - 1]))
def test_idle_row_survives_corrupted_state(matcher, g, seed, row, edits, whole, checked, limit):
    """The corrupted row idle (seq_len 0) with a drop (valid_lens: out of range either way, at a
    position the row holds, or at 2**24 and past it, where the idle row is left whole), the
    other row planning with no drop: everything stays in bounds, the other row is what it is
    without the corruption, and the kernels are the reference."""
    clean, stats, gen = lived_in_state(g, seed)
    dirty = clean.clone()
    corrupt(dirty, g, row, edits, gen, whole)
    op = PLAN_OPS[matcher]()
    drawn = torch.full((g.R,), 3 * g.S + 4, dtype=I32)      # what the selections are drawn below
    seq = drawn.clone()
    seq[row] = 0
    lens = torch.full((g.R,), reference.MAX_POSITION, dtype=I32)
    if limit == "held":
        held = reference.view_state(clean, g.layout).slot_pos[row]
        held = held[(held >= 0) & (held < (1 << 24))]
        limit = int(held[0]) if held.numel() else 0
    lens[row] = limit
    for _ in range(2):
        clean, dirty = check_plan_outcome(op, matcher, clean, dirty, stats, g, row,
                                          selections(gen, g, drawn), seq, checked, lens)


@pytest.mark.slow
@pytest.mark.parametrize("matcher", ["hash", "dual_pointer"])
@SLOW
@given(g=geometries, seed=st.integers(0, 2**16), row=st.integers(0, 1), edits=corruptions,
       whole=st.one_of(st.none(), st.sampled_from(SECTIONS)), checked=st.booleans())
def test_plan_survives_corrupted_state_long(matcher, g, seed, row, edits, whole, checked):
    fuzz_plan(g, seed, row, edits, whole, matcher, checked)


split_geometries = st.builds(
    lambda T, K, extra, L, C: Geometry(2, T, K, T * K + extra, 1 << (T * K + extra - 1).bit_length(), L,
                                       max(C, 0) * (T * K + extra) // 4, "lru" if C < 0 else None),
    st.sampled_from([1, 2]), st.sampled_from([520, 700]), st.sampled_from([0, 40]),
    st.sampled_from([1, 16]), st.sampled_from([0, 13, -1]))


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(g=split_geometries, seed=st.integers(0, 2**16), row=st.integers(0, 1), edits=corruptions,
       whole=st.one_of(st.none(), st.sampled_from(SECTIONS)), checked=st.booleans())
def test_split_plan_survives_corrupted_state(g, seed, row, edits, whole, checked):
    """Two rows of more than one selection chunk: each row's lookup is split over up to 20
    cores, the helpers reading the corrupted row's state (and its header, to skip a rejected
    row) and writing only its outputs and its owner's workspace."""
    with split_lookup():
        fuzz_plan(g, seed, row, edits, whole, "hash", checked)


# --------------------------------------------------------------------------------- resize

def fuzz_resize(g, seed, row, edits, whole, shrink, checked):
    """resize on a corrupted row: a clean ValueError with the state untouched (a bad header,
    host checks on), the row rejected by the kernel (move_counts -1, row untouched: checks off),
    or the kernel equal to the reference, every write inside the resized row, the moves in
    bounds (sources in [c, S), destinations in [0, c)), the row's slots past c free and the
    other rows as on the clean state."""
    clean, _, gen = lived_in_state(g, seed)
    dirty = clean.clone()
    corrupt(dirty, g, row, edits, gen, whole)
    rows = torch.tensor([row], dtype=torch.int64)
    caps = torch.tensor([g.N + (g.S - g.N) * shrink // 4], dtype=torch.int64)
    outs = []
    for state in (clean, dirty):
        big, view = guarded(state, GUARD_STATE)
        try:
            with host_checks(checked if state is dirty else True):
                out = torch.ops.avsg.resize(view, rows, caps, g.S, g.H, g.L, g.policy_id, g.C,
                                            g.N)
        except ValueError as e:
            out = e
        assert guards_intact(big, GUARD_STATE), "resize wrote outside the state tensor"
        outs.append((out, view.clone()))
    (clean_out, clean_after), (out, after) = outs
    assert not isinstance(clean_out, Exception), clean_out
    if isinstance(out, Exception):
        assert checked and not bool(header_ok(dirty, g).all()), f"refused good headers: {out}"
        assert torch.equal(after, dirty), "a refused resize wrote"
        return
    others = torch.arange(g.R) != row
    assert torch.equal(after[others], dirty[others]), "resize changed another row"
    src, dst, counts = out
    if not bool(header_ok(dirty, g)[row]):
        assert int(counts[row]) == -1 and torch.equal(after, dirty), "a bad row was not rejected"
        assert bool((src[row] == -1).all() & (dst[row] == -1).all())
        return
    want_state = dirty.clone()
    want = reference.resize(want_state, g.layout, rows, caps, g.L, g.policy, g.N)
    for name, a, b in zip(("src_slots", "dst_slots", "move_counts"), out, want):
        assert torch.equal(a, b), f"{name} differs from the reference"
    assert torch.equal(after, want_state), (after != want_state).nonzero()[:8].tolist()
    c, n = int(caps[0]), int(counts[row])
    assert 0 <= n <= reference.resize_width(g.S) and int(counts[others].abs().sum()) == 0
    assert bool((src[row, :n] >= c).all() & (src[row, :n] < g.S).all())
    assert bool((dst[row, :n] >= 0).all() & (dst[row, :n] < c).all())
    assert bool((src[row, n:] == -1).all() & (dst[row, n:] == -1).all())
    assert int(after[row, reference.HEADER_ACTIVE]) == c
    assert torch.equal(after[row, :reference.HEADER_ACTIVE], dirty[row, :reference.HEADER_ACTIVE])
    v = reference.view_state(after, g.layout)
    if c < int(dirty[row, reference.HEADER_ACTIVE]):
        assert bool((v.slot_pos[row, c:] == -1).all()), "a slot past the new capacity is held"
    # the row goes on: plan keeps it in bounds, reset repairs it
    seq = torch.full((g.R,), 3 * g.S + 4, dtype=I32)
    with host_checks(False):
        check_plan_outcome(torch.ops.avsg.plan, "hash", clean_after, after,
                           torch.zeros(g.R, 4, dtype=torch.int64), g, row,
                           selections(gen, g, seq), seq, False)


@FAST
@given(g=geometries, seed=st.integers(0, 2**16), row=st.integers(0, 1), edits=corruptions,
       whole=st.one_of(st.none(), st.sampled_from(SECTIONS)), shrink=st.integers(0, 4),
       checked=st.booleans())
def test_resize_survives_corrupted_state(g, seed, row, edits, whole, shrink, checked):
    fuzz_resize(g, seed, row, edits, whole, shrink, checked)


@pytest.mark.slow
@SLOW
@given(g=geometries, seed=st.integers(0, 2**16), row=st.integers(0, 1), edits=corruptions,
       whole=st.one_of(st.none(), st.sampled_from(SECTIONS)), shrink=st.integers(0, 4),
       checked=st.booleans())
def test_resize_survives_corrupted_state_long(g, seed, row, edits, whole, shrink, checked):
    fuzz_resize(g, seed, row, edits, whole, shrink, checked)


# --------------------------------------------------------------------- invalidate and reset

def fuzz_state_op(g, seed, row, edits, whole, checked, valid_shift, reset_rows):
    clean, _, gen = lived_in_state(g, seed)
    dirty = clean.clone()
    corrupt(dirty, g, row, edits, gen, whole)
    valid = torch.full((g.R,), 3 * g.S - valid_shift, dtype=I32)
    valid[row] = int(torch.randint(-(1 << 31), (1 << 31) - 1, (1,), generator=gen)) \
        if valid_shift % 3 == 0 else valid[row]
    results = []
    for state in (clean, dirty):
        big, view = guarded(state, GUARD_STATE)
        with host_checks(checked if state is dirty else True):
            try:
                torch.ops.avsg.invalidate(view, valid, g.S, g.H, g.C)
                err = None
            except ValueError as e:
                err = e
        assert guards_intact(big, GUARD_STATE), "invalidate wrote outside the state tensor"
        results.append((err, view.clone()))
    (clean_err, clean_after), (err, after) = results
    assert clean_err is None
    others = torch.arange(g.R) != row
    if err is not None:
        assert checked and torch.equal(after, dirty)
    else:
        assert torch.equal(after[others], clean_after[others]), "invalidate changed another row"
        want = dirty.clone()
        ok = header_ok(want, g, lifetime=False)
        sub = want[ok]
        reference.invalidate(sub, g.layout, valid[ok])
        want[ok] = sub
        assert torch.equal(after, want), (after != want).nonzero()[:8].tolist()
    # reset repairs whatever the rows hold, and touches only the masked rows
    big, view = guarded(after, GUARD_STATE)
    mask = torch.tensor([bool(reset_rows >> r & 1) for r in range(g.R)])
    torch.ops.avsg.reset(view, mask, g.S, g.H, g.L, g.policy_id, g.C)
    assert guards_intact(big, GUARD_STATE), "reset wrote outside the state tensor"
    assert torch.equal(view[~mask], after[~mask])
    if bool(mask.any()):
        reference.check_state(view[mask], g.layout, g.L, g.policy)


@FAST
@given(g=geometries, seed=st.integers(0, 2**16), row=st.integers(0, 1), edits=corruptions,
       whole=st.one_of(st.none(), st.sampled_from(SECTIONS)), checked=st.booleans(),
       valid_shift=st.integers(-5, 60), reset_rows=st.integers(0, 7))
def test_invalidate_and_reset_survive_corrupted_state(g, seed, row, edits, whole, checked,
                                                      valid_shift, reset_rows):
    fuzz_state_op(g, seed, row, edits, whole, checked, valid_shift, reset_rows)


@pytest.mark.slow
@SLOW
@given(g=geometries, seed=st.integers(0, 2**16), row=st.integers(0, 1), edits=corruptions,
       whole=st.one_of(st.none(), st.sampled_from(SECTIONS)), checked=st.booleans(),
       valid_shift=st.integers(-5, 60), reset_rows=st.integers(0, 7))
def test_invalidate_and_reset_survive_corrupted_state_long(g, seed, row, edits, whole, checked,
                                                           valid_shift, reset_rows):
    fuzz_state_op(g, seed, row, edits, whole, checked, valid_shift, reset_rows)


# ----------------------------------------------------------------------------------- gather

def fuzz_gather(g, seed, edits, paged, checked, partition):
    state, stats, gen = lived_in_state(g, seed, steps=2)
    seq = torch.full((g.R,), 3 * g.S, dtype=I32)
    out = reference.plan(state, stats, selections(gen, g, seq), seq, g.layout, g.L,
                         policy=g.policy)
    miss_pos, miss_slots, miss_counts = (t.clone() for t in out[1:])
    tensors = {"miss_pos": miss_pos, "miss_slots": miss_slots, "miss_counts": miss_counts}
    D, block = 3, 8
    blocks = (3 * g.S + block - 1) // block
    block_table = torch.randperm(g.R * blocks, generator=gen).to(I32).view(g.R, blocks) if paged \
        else None
    if paged:
        tensors["block_table"] = block_table
    for name, where, value in edits:
        t = tensors[["miss_pos", "miss_slots", "miss_counts", "block_table"][
            SECTIONS.index(name) % len(tensors)]]
        if isinstance(value, tuple):
            value = g.targeted()[value[1] % len(g.targeted())]
        t.view(-1)[int(where * t.numel())] = value
    src = torch.randn(g.R * blocks, block, D) if paged else torch.randn(g.R, 3 * g.S, D)
    big_dst = kv_zeros(g.R + 2, g.S, D).fill_(float("nan"))   # guard rows, slots padded to 32 B
    dst = big_dst[1:-1]
    dst.zero_()
    before = dst.clone()
    counts = miss_counts.clamp(0, g.N)
    # distinct slots per row: the copy does not depend on the core order, so it is the reference's
    rows_distinct = all(
        (lambda s: s.unique().numel() == s.numel())(
            miss_slots[r, :int(counts[r])][(miss_slots[r, :int(counts[r])] >= 0)
                                          & (miss_slots[r, :int(counts[r])] < g.S)])
        for r in range(g.R))
    per_core = None
    with host_checks(checked):
        try:
            per_core = torch.ops.avsg.gather(miss_pos, miss_slots, miss_counts, [src], [dst],
                                             block_table, block if paged else 0, partition, 4)
        except ValueError:
            assert checked
            assert torch.equal(dst, before) and guards_intact(big_dst.isnan(), True)
            return
        except RuntimeError as e:
            # A plan naming one slot twice in a row (only corruption makes one) has two copies
            # racing for that slot: the emulation stops at the write-after-write (one core) or
            # at the granule two cores write (two). On an NPU the later copy wins in some order;
            # either way the writes stay inside the named slots, which is what is checked below.
            # Any other emulation error is a failure.
            racing = ("write-after-write", "written by block")
            if rows_distinct or not any(m in str(e) for m in racing):
                raise
    assert bool(big_dst[0].isnan().all()) and bool(big_dst[-1].isnan().all()), \
        "gather wrote outside dst"
    # only the rows' own planned slots changed
    allowed = torch.zeros(g.R, g.S, dtype=torch.bool)
    for r in range(g.R):
        s = miss_slots[r, :int(counts[r])]
        allowed[r, s[(s >= 0) & (s < g.S)].long()] = True
    changed = (dst != before).any(-1)
    assert not bool((changed & ~allowed).any()), "gather wrote a slot the plan did not name"
    if per_core is None:
        return
    assert int(per_core.min()) >= 0 and int(per_core.sum()) <= int(counts.sum())
    if rows_distinct:
        want = before.clone()
        want_counts = reference.gather(miss_pos, miss_slots, miss_counts, [src], [want],
                                       block_table, block if paged else None, partition, 4)
        assert torch.equal(dst, want) and torch.equal(per_core, want_counts)


@FAST
@given(g=geometries, seed=st.integers(0, 2**16), edits=corruptions, paged=st.booleans(),
       checked=st.booleans(), partition=st.sampled_from(reference.PARTITIONS))
def test_gather_survives_corrupted_plans(g, seed, edits, paged, checked, partition):
    fuzz_gather(g, seed, edits, paged, checked, partition)


@pytest.mark.slow
@SLOW
@given(g=geometries, seed=st.integers(0, 2**16), edits=corruptions, paged=st.booleans(),
       checked=st.booleans(), partition=st.sampled_from(reference.PARTITIONS))
def test_gather_survives_corrupted_plans_long(g, seed, edits, paged, checked, partition):
    fuzz_gather(g, seed, edits, paged, checked, partition)


# ------------------------------------------------------------------------- targeted cases

def test_issue_repro_smaller_lifetime_is_refused_and_clamped():
    """Issue 8: a lifetime-255 buffer of capacity 64 filled with two steps of 32, then planned
    with lifetime=4: refused (header) on CPU, rejected row-wise by the kernel without the host
    check, and bit-exact with the reference when slot_life simply holds values above L."""
    buf = avsg.SparseKVBuffer(policy="lifetime", rows=2, capacity=64, topk=32, lifetime=255)
    seq = torch.full((2,), 1000, dtype=I32)
    for step in range(2):
        buf.plan(torch.arange(32 * step, 32 * step + 32, dtype=I32).repeat(2, 1, 1), seq)
    new = torch.arange(100, 132, dtype=I32).repeat(2, 1, 1)
    before = buf.state.clone()
    with pytest.raises(ValueError, match="lifetime: the state was built with 255, got 4"):
        torch.ops.avsg.plan(new, seq, buf.state, buf.stats_counts, 64, buf.hash_buckets, 4)
    assert torch.equal(buf.state, before)
    with host_checks(False):
        out = torch.ops.avsg.plan(new, seq, buf.state, buf.stats_counts, 64, buf.hash_buckets, 4)
    assert out[3].tolist() == [-1, -1] and bool((out[0] == -1).all())
    assert torch.equal(buf.state, before)
    # lives of 255 under L = 4 (what a changed lifetime used to leave behind): clamped, no shortfall
    buf.state[:, reference.HEADER_LIFETIME] = 4
    ref_state, ref_stats = buf.state.clone(), buf.stats_counts.clone()
    out = torch.ops.avsg.plan(new, seq, buf.state, buf.stats_counts, 64, buf.hash_buckets, 4)
    want = reference.plan(ref_state, ref_stats, new, seq, buf.layout, 4)
    assert all(torch.equal(a, b) for a, b in zip(out, want))
    assert torch.equal(buf.state, ref_state)
    assert int(out[0].max()) < 64 and int(out[3].min()) == 32
    reference.check_state(buf.state, buf.layout, 4)


@pytest.mark.parametrize("name,value,needle", [
    ("capacity", 60, "capacity: the state was built with 64, got 60"),
    ("buckets", 256, "buckets: the state was built with 128, got 256"),
    ("lifetime", 7, f"lifetime: the state was built with {reference.DEFAULT_LIFETIME}, got 7"),
])
def test_geometry_mismatch_names_the_argument(name, value, needle):
    buf = avsg.SparseKVBuffer(policy="lifetime", rows=2, capacity=64, topk=16)
    args = {"capacity": 64, "buckets": 128, "lifetime": reference.DEFAULT_LIFETIME}
    args[name] = value
    if name == "buckets":      # same width needed to reach the header check: rebuild as 256
        buf = avsg.SparseKVBuffer(policy="lifetime", rows=2, capacity=64, topk=16, hash_buckets=128)
    before = buf.state.clone()
    topk = torch.arange(16, dtype=I32).repeat(2, 1, 1)
    seq = torch.full((2,), 64, dtype=I32)
    width_ok = reference.Layout(args["capacity"], args["buckets"]).width == buf.layout.width
    with pytest.raises(ValueError, match=needle if width_ok else "state: expected shape"):
        torch.ops.avsg.plan(topk, seq, buf.state, buf.stats_counts, args["capacity"],
                            args["buckets"], args["lifetime"])
    if name != "lifetime":
        with pytest.raises(ValueError, match=needle if width_ok else "state: expected shape"):
            torch.ops.avsg.invalidate(buf.state, seq, args["capacity"], args["buckets"])
    assert torch.equal(buf.state, before)
    buf.lifetime = 3           # an attribute changed behind the state's back
    with pytest.raises(ValueError, match=f"lifetime: the state was built with {reference.DEFAULT_LIFETIME}, got 3"):
        buf.plan(topk, seq)


def test_unbuilt_state_is_refused():
    layout = reference.Layout(16, 64)
    state = torch.zeros(2, layout.width, dtype=I32)
    with pytest.raises(ValueError, match="state: row 0 holds no AVSG state header"):
        torch.ops.avsg.plan(torch.zeros(2, 1, 16, dtype=I32), torch.full((2,), 20, dtype=I32),
                            state, torch.zeros(2, 4, dtype=torch.int64), 16, 64, 4)
    with pytest.raises(ValueError, match="holds no AVSG state header"):
        torch.ops.avsg.invalidate(state, torch.zeros(2, dtype=I32), 16, 64)


@pytest.mark.parametrize("max_context", [0, 1 << 22])
def test_large_geometry_corruption_windows(max_context):
    """At capacity 8192 the bucket and slot sections are paged through UB windows (the float
    blend of GatherVals): corrupted slots and keys in every window stay exact and in bounds.
    Under the reuse policy with a 4M context the counts and the heat are paged too."""
    g = Geometry(1, 1, 2048, 8192, 16384, 16, max_context)
    gen = torch.Generator().manual_seed(5)
    state = reference.new_state(1, g.layout, g.L, policy=g.policy)
    stats = torch.zeros(1, 4, dtype=torch.int64)
    seq = torch.full((1,), 20000, dtype=I32)
    for _ in range(4):
        reference.plan(state, stats, selections(gen, g, seq, hot=12000), seq, g.layout, g.L,
                       policy=g.policy)
    dirty = state.clone()
    edits = []
    for section in ("bucket_slot", "slot_pos", "slot_life", "stash_slot",
                    "slot_count", "ghost", "block_heat"):
        for i in range(24):
            value = g.targeted()[i % len(g.targeted())] if i % 2 else \
                int(torch.randint(-(1 << 31), (1 << 31) - 1, (1,), generator=gen))
            edits.append((section, (i + 0.5) / 24, value))
    edits.append(("stash_count", 0.0, 5000))
    corrupt(dirty, g, 0, edits)
    for matcher in ("hash", "dual_pointer"):
        check_plan_outcome(PLAN_OPS[matcher](), matcher, state, dirty, stats, g, 0,
                           selections(gen, g, seq, hot=12000), seq, False)


# ------------------------------------------------------------------------------ check_state

def test_check_state_accepts_every_state_the_ops_build():
    buf = avsg.SparseKVBuffer(policy="lifetime", rows=3, capacity=40, topk=16, queries_per_step=2, lifetime=3,
                              hash_buckets=64)
    gen = torch.Generator().manual_seed(1)
    seq = torch.full((3,), 120, dtype=I32)
    buf.check_state()
    for step in range(30):
        buf.plan(selections(gen, Geometry(3, 2, 16, 40, 64, 3), seq, hot=100), seq, check=False)
        if step % 7 == 3:
            buf.invalidate(seq - 10)
        if step % 11 == 5:
            buf.reset(step % 3)
        buf.check_state()
    assert int(reference.view_state(buf.state, buf.layout).stash_count.max()) >= 0


@pytest.mark.parametrize("section,value,needle", [
    ("stash_count", 41, "stash_count"),
    ("slot_life", 5, "slot_life"),          # L + 1 = 4 marks a fresh slot
    ("slot_life", -2, "slot_life"),
    ("slot_pos", 1 << 24, "slot_pos"),
    ("bucket_slot", 40, "bucket_slot"),
    ("padding", 3, "padding"),
    ("header", 0, "no AVSG state header"),
])
def test_check_state_names_what_is_broken(section, value, needle):
    buf = avsg.SparseKVBuffer(policy="lifetime", rows=2, capacity=40, topk=16, lifetime=3, hash_buckets=64)
    seq = torch.full((2,), 100, dtype=I32)
    buf.plan(torch.arange(16, dtype=I32).repeat(2, 1, 1), seq)
    g = Geometry(2, 1, 16, 40, 64, 3)
    corrupt(buf.state, g, 1, [(section, 0.0, value)])
    with pytest.raises(ValueError, match=needle):
        buf.check_state()
    buf.reset(1)
    buf.check_state()


@pytest.mark.parametrize("policy,hand,ok", [("lifetime", 39, True), ("lifetime", 40, False),
                                             ("lifetime", -1, False), ("lru", 1, False)])
def test_check_state_bounds_the_hand_word(policy, hand, ok):
    # the lifetime policy's hand lies in [0, S); no other policy moves it off 0
    buf = avsg.SparseKVBuffer(policy=policy, rows=2, capacity=40, topk=16, lifetime=3, hash_buckets=64)
    seq = torch.full((2,), 100, dtype=I32)
    buf.plan(torch.arange(16, dtype=I32).repeat(2, 1, 1), seq)
    buf.check_state()
    assert int(buf.state[0, reference.HEADER_HAND]) == (16 if policy == "lifetime" else 0)
    buf.state[1, reference.HEADER_HAND] = hand
    if ok:
        buf.check_state()
    else:
        with pytest.raises(ValueError, match="hand word"):
            buf.check_state()


def test_check_state_finds_a_lost_index_entry():
    buf = avsg.SparseKVBuffer(policy="lifetime", rows=1, capacity=40, topk=16, lifetime=3, hash_buckets=64)
    buf.plan(torch.arange(16, dtype=I32).view(1, 1, 16), torch.full((1,), 100, dtype=I32))
    v = reference.view_state(buf.state, buf.layout)
    free_slot = int((v.slot_pos[0] == -1).nonzero()[0])
    v.bucket_slot[0] = free_slot                   # every bucket names a free slot: all forgotten
    with pytest.raises(ValueError, match="not found at its slot by the hash index"):
        buf.check_state()


@pytest.mark.parametrize("policy", ["lifetime", "lru"])
def test_buckets_naming_one_slot_are_occupied_only_by_its_probes(policy):
    """A bucket keeps no key: it is occupied when the slot it names holds a position that probes
    it. With every bucket of a row naming one resident slot, that slot's position is still found
    (its own probes are occupied by it), every other bucket is free for the insert, and the
    kernel agrees with the reference, state included."""
    g = Geometry(2, 1, 16, 40, 64, 3, policy=policy)
    clean, stats, gen = lived_in_state(g, seed=5)
    dirty = clean.clone()
    v = reference.view_state(dirty, g.layout)
    slot = int((v.slot_pos[1] >= 0).nonzero()[0])
    held = v.slot_pos[1, slot].clone()
    v.bucket_slot[1] = slot
    every = torch.arange(g.H).expand(g.R, -1)
    occupied = reference.occupied_buckets(v, every, g.H)[1]
    assert set(occupied.nonzero().flatten().tolist()) == \
        set(reference.probe_buckets(held.view(1), g.H)[0].tolist())
    seq = torch.full((g.R,), 3 * g.S + 4, dtype=I32)
    topk = selections(gen, g, seq)
    topk[1, 0, 0] = held
    check_plan_outcome(torch.ops.avsg.plan, "hash", clean, dirty, stats, g, 1, topk, seq,
                       checked=False)
    got = torch.ops.avsg.plan(topk, seq, dirty.clone(), stats.clone(), g.S, g.H, g.L,
                              g.policy_id, g.C)[0]
    assert int(got[1, 0, 0]) == slot, "the resident position was not found at its slot"


def test_invalid_selection_never_matches_a_corrupt_slot():
    """Invalid lanes hash as position 0; a corrupted slot holding a negative value must not
    turn them into hits (the reference drops them before the lookup)."""
    g = Geometry(2, 1, 16, 40, 64, 3)
    clean, stats, gen = lived_in_state(g, seed=3)
    dirty = clean.clone()
    v = reference.view_state(dirty, g.layout)
    probes = reference.probe_buckets(torch.zeros(1, dtype=I32), g.H)[0]
    for value in (-1, -2):
        v.slot_pos[1, 7] = value
        v.bucket_slot[1, probes] = 7
        seq = torch.full((g.R,), 3 * g.S + 4, dtype=I32)
        topk = selections(gen, g, seq)
        topk[1, 0, :4] = torch.tensor([-1, -2, -7, int(seq[1]) + 3])   # padding, past the bound
        before = stats.clone()
        check_plan_outcome(torch.ops.avsg.plan, "hash", clean, dirty, stats, g, 1, topk, seq,
                           checked=False)
        got = torch.ops.avsg.plan(topk, seq, dirty.clone(), before, g.S, g.H, g.L, g.policy_id,
                                  g.C)[0]
        assert bool((got[1, 0, :4] == -1).all()), got[1, 0, :4]


# ---------------------------------------------------------------------------- public API

def test_meta_and_mixed_devices_are_rejected():
    buf = avsg.SparseKVBuffer(policy="lifetime", rows=2, capacity=32, topk=8)
    seq = torch.full((2,), 40, dtype=I32)
    plan = buf.plan(torch.arange(8, dtype=I32).repeat(2, 1, 1), seq)
    src, dst = torch.randn(2, 40, 4), kv_zeros(2, 32, 4)
    with pytest.raises(ValueError, match=r"src\[0\]: expected a tensor with data"):
        avsg.gather(plan, src.to("meta"), dst)
    with pytest.raises(ValueError, match=r"dst\[0\]"):
        avsg.gather(plan, src, dst.to("meta"))
    meta_plan = avsg.Plan(*(t.to("meta") for t in plan[:4]), plan.capacity)
    with pytest.raises(ValueError, match="plan.slots: expected a tensor with data"):
        avsg.gather(meta_plan, src, dst)
    mixed = plan._replace(miss_counts=plan.miss_counts.to("meta"))
    with pytest.raises(ValueError, match="plan.miss_counts"):
        avsg.gather(mixed, src, dst)
    with pytest.raises(ValueError, match="topk_pos"):
        buf.plan(torch.zeros(2, 1, 8, dtype=I32, device="meta"), seq)
    with pytest.raises(ValueError, match="valid_lens"):
        buf.invalidate(seq.to("meta"))
    with pytest.raises(ValueError, match="rows"):
        buf.reset(torch.zeros(2, dtype=torch.bool, device="meta"))
    with pytest.raises(ValueError, match="device"):
        avsg.SparseKVBuffer(policy="lifetime", rows=2, capacity=32, topk=8, device="meta")
    with pytest.raises(ValueError, match="block_table"):
        avsg.gather(plan, src.view(10, 8, 4), dst, block_table=torch.zeros(2, 5, dtype=I32,
                                                                           device="meta"),
                    block_size=8)


@pytest.mark.parametrize("rows", [True, False, 1.0, "0", {0: 1}])
def test_reset_rejects_non_index_rows(rows):
    buf = avsg.SparseKVBuffer(policy="lifetime", rows=2, capacity=32, topk=8)
    with pytest.raises(TypeError, match="rows"):
        buf.reset(rows)


def test_one_buffer_from_two_threads_raises():
    """The ops release the GIL: a second thread entering an op of the same buffer is detected
    (non-blocking per-buffer lock) and raises; the state stays that of the first thread's ops."""
    buf = avsg.SparseKVBuffer(policy="lifetime", rows=2, capacity=32, topk=8)
    seq = torch.full((2,), 40, dtype=I32)
    topk = torch.arange(8, dtype=I32).repeat(2, 1, 1)
    assert buf._busy.acquire(blocking=False)        # another thread is inside an op
    try:
        for call in (lambda: buf.plan(topk, seq), lambda: buf.invalidate(seq),
                     lambda: buf.reset(), buf.check_state):
            with pytest.raises(RuntimeError, match="in use by another thread"):
                call()
    finally:
        buf._busy.release()
    # real threads: every call either runs or raises, and what ran left a valid state
    errors, done, unexpected = [], [], []

    def worker(seed):
        gen = torch.Generator().manual_seed(seed)
        g = Geometry(2, 1, 8, 32, 64, 16)
        for _ in range(40):
            try:
                buf.plan(selections(gen, g, seq, hot=30), seq, check=False)
                done.append(seed)
            except RuntimeError as e:
                (errors if "in use by another thread" in str(e) else unexpected).append(e)
            except Exception as e:  # noqa: BLE001  (reported below, not lost in the thread)
                unexpected.append(e)
    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not unexpected, unexpected
    assert len(done) + len(errors) == 160 and done
    buf.check_state()
    # distinct buffers are independent
    other = avsg.SparseKVBuffer(policy="lifetime", rows=2, capacity=32, topk=8)
    assert buf._busy.acquire(blocking=False)
    try:
        other.plan(topk, seq)
    finally:
        buf._busy.release()
