"""Trace lab: format, policies (hand-checked), Belady optimality, avsg policy, synth, MTP, CLI."""
from __future__ import annotations

import functools
import itertools
import json
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from avsg.lab.traces.format import Trace, TraceFormatError, load_trace, save_trace, validate_trace
from avsg.lab.traces.lookup import shipped_trace
from avsg.lab.traces.policies import make_policy, policy_names
from avsg.lab.traces.replay import replay

REPO = Path(__file__).resolve().parents[2]


def _avsg_missing():
    try:
        import avsg
        avsg.SparseKVBuffer
        return None
    except Exception as e:  # not built / not importable
        return f"avsg.SparseKVBuffer is not importable (operator package not built: {e})"

# plan-only buffers hold no KV: track_copies=False keeps a plan's misses resident without
# a gather (what these tests specify); tests/ops/test_uncopied.py covers the tracking


AVSG_MISSING = _avsg_missing()
needs_avsg = pytest.mark.skipif(AVSG_MISSING is not None, reason=str(AVSG_MISSING))


def mk(steps_sets, k=None, T=None, dtype=np.int32):
    """Trace with one layer from a list of position sets (padded with -1 to k)."""
    k = k or max(len(s) for s in steps_sets)
    T = T or (max(max(s) for s in steps_sets if s) + 1)
    sel = np.full((1, len(steps_sets), k), -1, dtype)
    for i, s in enumerate(steps_sets):
        sel[0, i, :len(s)] = sorted(s)
    return Trace(sel, np.full(len(steps_sets), T - 1, np.int32), T=T, k=k)


def hits_per_step(tr, policy, capacity, **opts):
    r = replay(tr, policy, capacity, count_first_step=True, **opts)
    return list(r.hits[0]), r


# ------------------------------------------------------------------ hand-checked examples
# Trace A (k = 2, capacity 3):  s0 {0,1}  s1 {1,2}  s2 {0,3}  s3 {1,2}  s4 {0,2}  s5 {3,4}
TRACE_A = [{0, 1}, {1, 2}, {0, 3}, {1, 2}, {0, 2}, {3, 4}]


def test_lru_hand_example():
    # recency key = (last step, position); pinned = this step's selections
    # s0: miss 0,1                                      -> 0 hits, res {0,1}
    # s1: 1 hit; 2 into the free slot                   -> 1, res {0,1,2}
    # s2: 0 hit; 3 evicts LRU of {1@(1,1), 2@(1,2)} = 1 -> 1, res {0,2,3}
    # s3: 2 hit; 1 evicts LRU of {0@(2,0), 3@(2,3)} = 0 -> 1, res {1,2,3}
    # s4: 2 hit; 0 evicts LRU of {1@(3,1), 3@(2,3)} = 3 -> 1, res {0,1,2}
    # s5: {3,4} both miss                               -> 0
    h, _ = hits_per_step(mk(TRACE_A), "lru", 3)
    assert h == [0, 1, 1, 1, 1, 0]


def test_belady_hand_example():
    # s2: 3 must evict 1 or 2 (both next used at s3: a tie, same cost either way) -> say 1
    # s3: {1,2}: 2 hit; 1 evicts the farther of 0 (next s4) and 3 (next s5) = 3
    # s4: {0,2}: both hit;  s5: {3,4}: none.   Total 5 (LRU gets 4).
    h, _ = hits_per_step(mk(TRACE_A), "belady", 3)
    assert sum(h) == 5
    assert h[:3] == [0, 1, 1]


def test_prev_step_hand_example():
    # |S_s ∩ S_{s-1}|: -, {1}, {}, {}, {2}, {}
    h, _ = hits_per_step(mk(TRACE_A), "prev-step", 3)
    assert h == [0, 1, 0, 0, 1, 0]


def test_clock_hand_example():
    # 3 slots, hand at 0, loaded entries get ref=1, pinned slots skipped untouched
    # s0: slots 0,1 <- 0,1 (empty), hand 2.                  refs [1,1,0]
    # s1: 1 hit; 2 -> empty slot 2, hand 0.                  refs [1,1,1]
    # s2: 0 hit (slot 0 pinned); hand: skip 0, clear 1, clear 2, skip 0, slot 1 (pos 1) victim;
    #     hand 2. slots [0,3,2] refs [1,1,0]                 -> 1 hit
    # s3: {1,2}: 2 hit (slot 2 pinned, ref 1); hand 2: skip 2, clear 0, clear 1, skip 2,
    #     slot 0 (pos 0) victim; hand 1. slots [1,3,2]        -> 1 hit
    # s4: {0,2}: 2 hit; hand 1: slot 1 (pos 3) ref 0 -> victim; slots [1,0,2]  -> 1 hit
    # s5: {3,4}: 0 hits
    h, r = hits_per_step(mk(TRACE_A), "clock", 3)
    assert h == [0, 1, 1, 1, 1, 0]


def test_clock_hand_state():
    p = make_policy("clock", 1, 3, 2, max_pos=8)
    tr = mk(TRACE_A, T=8)
    replay(tr, p)
    # after s5 ({3,4}, hand at 2, refs [1,1,1] slots [1,0,2] none pinned): full revolution clears
    # all bits, victims slot 2 then slot 0 -> slots [3,0,4]? No: misses ascending (3,4) take victims
    # in hand order (slot 2, slot 0): slot 2 <- 3, slot 0 <- 4; hand stops after slot 0 -> 1
    assert list(p.slot_pos[0]) == [4, 0, 3]
    assert int(p.hand[0]) == 1


def test_bucketed_lru_hand_example():
    # buckets=2, width=1: age 0 -> bucket 0, age >= 1 -> bucket 1 (oldest); victims in slot order
    # s0: slots 0,1 <- 0,1.  s1: 1 hit, 2 -> slot 2.
    # s2: 0 hit; 3: slots 1 (pos 1) and 2 (pos 2) both age 1 -> slot 1 (pos 1). slots [0,3,2]
    # s3: 2 hit; 1: slots 0 (pos 0, age 1) and 1 (pos 3, age 1) -> slot 0.     slots [1,3,2]
    # s4: 2 hit; 0: slot 0 (pos 1, age 1), slot 1 (pos 3, age 2): same bucket -> slot 0 (exact LRU
    #     would evict 3).                                                        slots [0,3,2]
    # s5: {3,4}: 3 hit -> 1 (exact LRU: 0)
    h, _ = hits_per_step(mk(TRACE_A), "bucketed-lru", 3, buckets=2)
    assert h == [0, 1, 1, 1, 1, 1]
    # with 64 buckets (ages 1 and 2 distinct) it behaves like exact LRU here
    h, _ = hits_per_step(mk(TRACE_A), "bucketed-lru", 3)
    assert h == [0, 1, 1, 1, 1, 0]


def test_setassoc_fifo_hand_example():
    # capacity 4, ways 2 -> 2 sets, set = pos % 2; FIFO (hits do not refresh)
    # s0 {0,2}: set 0 <- 0, 2.      s1 {1,4}: 1 -> set 1; 4 -> set 0 evicts oldest (0)
    # s2 {0,2}: 2 hit; 0 -> set 0 evicts 4 (2 pinned)         -> 1 hit (LRU with 4 entries: 2)
    # s3 {2,4}: 2 hit; 4 -> set 0 evicts 0                    -> 1 hit (LRU: 2)
    tr = mk([{0, 2}, {1, 4}, {0, 2}, {2, 4}])
    h, r = hits_per_step(tr, "setassoc-fifo", 4, ways=2)
    assert h == [0, 0, 1, 1] and r.bypassed == 0
    h, _ = hits_per_step(tr, "lru", 4)
    assert h == [0, 0, 2, 2]


def test_setassoc_fifo_overflow_bypasses():
    # k = 3 positions all in set 0 of 2 ways: 0 and 2 are kept, 4 is fetched but not retained
    tr = mk([{0, 2, 4}, {0, 2, 4}])
    h, r = hits_per_step(tr, "setassoc-fifo", 4, ways=2)
    assert h == [0, 2] and r.bypassed == 2


def test_replay_counting_rules():
    tr = mk(TRACE_A)
    r = replay(tr, "lru", 3)                   # step 0 only warms
    assert r.total_selections == 10 and r.total_hits == 4
    assert r.hit_rate == pytest.approx(0.4)
    r1 = replay(tr, "lru", 3, count_first_step=True)
    assert r1.total_selections == 12 and r1.total_hits == 4
    # bytes per step: misses per counted step x entry bytes
    assert r.misses_per_step == pytest.approx(6 / 5)
    assert r.bytes_per_step == pytest.approx(6 / 5 * 1152)


def test_padding_and_capacity_check():
    tr = mk([{0}, {0, 1}, {1}], k=2)           # rows padded with -1
    h, r = hits_per_step(tr, "lru", 2)
    assert h == [0, 1, 1] and r.total_selections == 4
    with pytest.raises(ValueError, match="capacity"):
        make_policy("lru", 1, 3, 2, queries=2)
    with pytest.raises(ValueError, match="policy"):
        make_policy("nope", 1, 3, 2)


@pytest.mark.parametrize("name", ["lru", "clock", "setassoc-fifo", "bucketed-lru", "belady"])
def test_policies_mtp_union_and_invalidate(name):
    # Tq = 2: {0,1} and {1,2} -> union {0,1,2}: 3 selections, 3 fetched
    sel = np.array([[[[0, 1], [1, 2]], [[1, 2], [2, 3]]]], np.int32)  # [1, 2 steps, 2, 2]
    tr = Trace(sel, np.array([[2, 3], [3, 4]], np.int32), T=8, k=2)
    validate_trace(tr)
    r = replay(tr, name, 4, count_first_step=True, ways=2)
    assert list(r.selections[0]) == [3, 3]
    assert r.hits[0, 1] == 2                   # {1,2} resident, 3 new
    if name != "belady":
        p = make_policy(name, 1, 4, 2, queries=2, max_pos=8, ways=2)
        from avsg.lab.traces.policies import StepInput, unique_rows
        raw = sel[:, 0].astype(np.int64)
        u, c = unique_rows(raw)
        p.step(0, StepInput(raw, u, c, np.array([4])))
        p.invalidate(np.array([2]))             # drop positions >= 2
        raw = np.array([[[0, 1], [1, 2]]], np.int64)
        u, c = unique_rows(raw)
        assert list(p.step(1, StepInput(raw, u, c, np.array([4])))) == [2]  # 0,1 hit; 2 gone


# ------------------------------------------------------------------ Belady: exact and an upper bound
def brute_force_optimum(sets, capacity):
    """Max hits (all steps counted) over every demand-eviction choice (exhaustive search)."""
    sets = [frozenset(s) for s in sets]

    @functools.lru_cache(maxsize=None)
    def best(i, res):
        if i == len(sets):
            return 0
        S = sets[i]
        h = len(S & res)
        miss = S - res
        need = max(0, len(res) + len(miss) - capacity)
        cand = sorted(res - S)
        return h + max(best(i + 1, (res - frozenset(ev)) | miss)
                       for ev in itertools.combinations(cand, need))
    return best(0, frozenset())


@st.composite
def small_trace(draw, max_steps=8, max_T=8):
    k = draw(st.integers(1, 3))
    T = draw(st.integers(k, max_T))
    steps = draw(st.integers(1, max_steps))
    sets = [draw(st.sets(st.integers(0, T - 1), min_size=1, max_size=k)) for _ in range(steps)]
    cap = draw(st.integers(k, 3 * k))
    return sets, k, T, cap


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_trace(max_steps=7, max_T=6))
def test_belady_is_exact(case):
    sets, k, T, cap = case
    h, _ = hits_per_step(mk(sets, k=k, T=T), "belady", cap)
    assert sum(h) == brute_force_optimum(sets, cap)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_trace(max_steps=12, max_T=10))
def test_belady_never_below_other_policies(case):
    sets, k, T, cap = case
    tr = mk(sets, k=k, T=T)
    bel = replay(tr, "belady", cap).total_hits
    for name in policy_names():
        if name in ("belady",) or (name == "avsg" and AVSG_MISSING):
            continue
        r = replay(tr, name, cap, ways=1)
        if name == "setassoc-fifo" and r.bypassed:
            continue  # may keep fewer than all selections: outside Belady's constraint
        assert r.total_hits <= bel, (name, sets, cap)


# ------------------------------------------------------------------ avsg: the real operator
@needs_avsg
def test_avsg_equals_prev_step_when_capacity_is_k():
    # capacity == k: only the current step fits, so hits = |S_s ∩ S_{s-1}|
    h, _ = hits_per_step(mk([{0, 1}, {1, 2}, {2, 3}, {0, 3}]), "avsg", 2)
    assert h == [0, 1, 1, 1]


@needs_avsg
@pytest.mark.parametrize("name,policy", [("avsg", "reuse"), ("avsg-lifetime", "lifetime"),
                                         ("avsg-lru", "lru")])
def test_avsg_replay_equals_stepping_buffer_directly(name, policy):
    import torch
    import avsg
    rng = np.random.default_rng(3)
    L, N, K, T, C = 3, 20, 16, 64, 48
    sel = np.stack([np.stack([np.sort(rng.choice(T, K, replace=False)) for _ in range(N)])
                    for _ in range(L)]).astype(np.int32)
    tr = Trace(sel, np.full(N, T - 1, np.int32), T=T, k=K)
    r = replay(tr, name, C, count_first_step=True, lifetime=4)
    buf = avsg.SparseKVBuffer(policy=policy, rows=L, capacity=C, topk=K, queries_per_step=1,
                              lifetime=4, device="cpu",
                              max_context=T if policy == "reuse" else None, track_copies=False)
    hits = np.zeros((L, N), np.int64)
    for s in range(N):
        plan = buf.plan(torch.from_numpy(sel[:, s][:, None, :].copy()), torch.full((L,), T, dtype=torch.int32))
        hits[:, s] = K - plan.miss_counts.numpy()
    np.testing.assert_array_equal(r.hits, hits)
    st_ = buf.stats()                          # the operator's own counters agree (Tq = 1)
    assert st_["hits"] == r.total_hits and st_["lookups"] == r.total_selections == L * N * K


@needs_avsg
@pytest.mark.parametrize("capacity", [24, 40])
def test_avsg_lifetime_equals_the_lab_hand_model(capacity):
    """The op's lifetime policy and the lab's ``lifetime-hand`` (numpy, written separately) are
    one policy: hits agree step by step, so the hand order (ties from the slot after the last
    victim) is what the kernel runs. Few recurring positions make many equal lives tie."""
    rng = np.random.default_rng(11)
    L, N, K, T = 2, 80, 16, 96
    pool = rng.choice(T, 64, replace=False)
    sel = np.stack([np.stack([np.sort(rng.choice(pool, K, replace=False)) for _ in range(N)])
                    for _ in range(L)]).astype(np.int32)
    tr = Trace(sel, np.full(N, T - 1, np.int32), T=T, k=K)
    op = replay(tr, "avsg-lifetime", capacity, count_first_step=True, lifetime=3)
    lab = replay(tr, "lifetime-hand", capacity, count_first_step=True, lifetime=3)
    np.testing.assert_array_equal(op.hits, lab.hits)
    assert 0 < op.total_hits < op.total_selections

    from avsg.lab.traces.policies import LifetimeHand

    class SlotOrder(LifetimeHand):             # the paper's ties: always from slot 0
        def _choose(self, r, s, mp, pinned):
            victims = super()._choose(r, s, mp, pinned)
            self.hand[r] = 0
            return victims

    plain = replay(tr, SlotOrder(L, capacity, K, max_pos=T, lifetime=3), count_first_step=True)
    assert not np.array_equal(plain.hits, op.hits)   # the data make the tie order matter


@needs_avsg
@pytest.mark.parametrize("lifetime", [12, 255])
def test_avsg_lifetime_probation_equals_the_lab(lifetime):
    """Where ``L - 4`` and half a life differ (``L >= 10``; 255 is the default), the op's start
    life for a fetched position is the lab's ``L - min(4, L // 2)``, step by step, and the data
    make the probation's length matter (a lab with half a life gets other hits)."""
    from avsg import reference
    from avsg.lab.traces.policies import FreqLifetime
    rng = np.random.default_rng(5)
    L, N, K, T = 2, 96, 16, 160
    pool = rng.choice(T, 96, replace=False)
    sel = np.stack([np.stack([np.sort(rng.choice(pool[: 40 + (s * 7) % 56], K, replace=False))
                              for s in range(N)]) for _ in range(L)]).astype(np.int32)
    tr = Trace(sel, np.full(N, T - 1, np.int32), T=T, k=K)
    capacity = 40
    op = replay(tr, "avsg-lifetime", capacity, count_first_step=True, lifetime=lifetime)
    lab = replay(tr, "lifetime-hand", capacity, count_first_step=True, lifetime=lifetime)
    np.testing.assert_array_equal(op.hits, lab.hits)
    assert reference.first_life(lifetime) == lifetime - 4
    half = FreqLifetime(L, capacity, K, max_pos=T, lifetime=lifetime, classes=0,
                        insert_life=(lifetime + 1) // 2)
    assert not np.array_equal(replay(tr, half, count_first_step=True).hits, op.hits)
    if lifetime == 255:
        assert reference.DEFAULT_LIFETIME == 255
        assert np.array_equal(replay(tr, "avsg-lifetime", capacity, count_first_step=True).hits,
                              op.hits)


@needs_avsg
def test_avsg_replay_reports_the_modelled_step_cost():
    """Sampled steps run in the strict build (same hits as the fast one); their counted plan
    launches become the plan us per row-step, the misses the link us, and the batch-64 step
    pays two waves of plans (40 cores) and 64 rows' misses on the link."""
    from avsg.lab.costmodel import hardware
    from avsg.lab.costmodel.plan_cost import replay_step_cost
    rng = np.random.default_rng(5)
    L, N, K, T, C = 2, 12, 64, 4096, 128
    sel = np.stack([np.stack([np.sort(rng.choice(T, K, replace=False)) for _ in range(N)])
                    for _ in range(L)]).astype(np.int32)
    tr = Trace(sel, np.full(N, T - 1, np.int32), T=T, k=K)
    hw = hardware.load_profile()
    plain = replay(tr, "avsg", C)
    assert replay_step_cost(plain, hw) is None and not plain.cost_counters
    r = replay(tr, "avsg", C, cost_every=4)
    np.testing.assert_array_equal(r.hits, plain.hits)
    assert len(r.cost_counters) == 2                          # steps 4 and 8
    c = replay_step_cost(r, hw)
    assert c["plan_samples"] == 2 * L and c["plan_us_serial"] >= c["plan_us_overlapped"] > 0
    assert all(counters.blocks == L for counters in r.cost_counters)   # one core per row, no split
    misses = (r.total_selections - r.total_hits) / (L * (N - 1))
    assert c["misses_per_row_step"] == pytest.approx(misses)
    link1 = 1e6 * hardware.link_time_s(hw, misses, r.entry_bytes)
    assert c["step_us_batch1"] == pytest.approx(c["plan_us_serial"] + link1)
    link64 = 1e6 * hardware.link_time_s(hw, 64 * misses, r.entry_bytes)
    assert c["step_us_batch64"] == pytest.approx(2 * c["plan_us_serial"] + link64)


# ------------------------------------------------------------------ synthetic generator
@pytest.mark.parametrize("gamma", [0.5, 0.7, 0.9])
@pytest.mark.parametrize("mu", [0.5, 0.9])
def test_synth_statistics(gamma, mu):
    from avsg.lab.traces.synth import generate, measure_gamma, measure_recall
    tr = generate(steps=120, layers=2, k=256, max_len=4096, gamma=gamma, mu_hist=mu, seed=7)
    validate_trace(tr)
    assert tr.sel.shape == (2, 120, 256)
    g = measure_gamma(tr.sel)
    assert np.all(g == round(gamma * 256) / 256)  # exact by construction
    r = measure_recall(tr.sel, window=8)
    # recall per step is round(r_s * m) / m with r_s ~ N(mu, 0.01^2): mean within 0.005,
    # spread ~ 0.01 plus rounding (m = 26..128 here)
    assert abs(np.nanmean(r) - mu) < 0.006
    assert np.nanstd(r) < 0.03
    # step by step, the measured recall is the drawn one rounded to whole positions
    m = 256 - round(gamma * 256)
    drawn = tr.extra["synth_recall_drawn"][:, 9:]  # measure_recall starts at step window + 1
    np.testing.assert_allclose(r, np.round(drawn * m) / m, atol=1e-12)
    # context growth: selectable range grows by one per step, positions = last selectable
    pos = tr.positions
    assert np.all(np.diff(pos) == 1) and pos[-1] == 4095
    assert np.all(tr.sel.max(-1) <= pos[None, :])


def test_synth_is_seeded_and_paper_size():
    from avsg.lab.traces.synth import generate
    a = generate(steps=6, layers=1, seed=1)
    b = generate(steps=6, layers=1, seed=1)
    c = generate(steps=6, layers=1, seed=2)
    assert a.sel.shape == (1, 6, 2048) and a.T == 16384 and a.k == 2048
    assert np.array_equal(a.sel, b.sel) and not np.array_equal(a.sel, c.sel)
    with pytest.raises(ValueError, match="gamma"):
        generate(steps=4, gamma=1.5)


# ------------------------------------------------------------------ format: good and malformed
def _write(tmp_path, **arrays):
    p = tmp_path / "t.npz"
    np.savez(p, **arrays)
    return p


def _good(**over):
    d = dict(sel=np.array([[[0, 2, 3], [1, 2, 4]]], np.uint16), positions=np.array([3, 4], np.int32),
             T=np.int32(8), k=np.int32(3), model=np.str_("m"), rule=np.str_("r"))
    d.update(over)
    return d


def test_roundtrip(tmp_path):
    p = _write(tmp_path, **_good())
    tr = load_trace(p)
    assert tr.layers == 1 and tr.steps == 2 and tr.k == 3 and tr.T == 8 and tr.model == "m"
    save_trace(tmp_path / "u.npz", tr)
    tr2 = load_trace(tmp_path / "u.npz")
    assert np.array_equal(tr.sel, tr2.sel) and tr2.rule == "r"


@pytest.mark.parametrize("over,match", [
    (dict(sel=np.array([[[0, 2, 3], [1, 2, 4]]], np.float32)), r"'sel'.*integer dtype.*float32"),
    (dict(sel=np.array([[[0, 3, 2], [1, 2, 4]]], np.uint16)), r"'sel'.*sorted strictly ascending.*3 then 2.*step 0"),
    (dict(sel=np.array([[[0, 2, 2], [1, 2, 4]]], np.uint16)), r"'sel'.*sorted strictly ascending"),
    (dict(sel=np.array([[[0, 2, 3], [1, 2, 9]]], np.uint16), positions=np.array([3, 7], np.int32)),
     r"'sel'.*< T=8.*got 9.*step 1, index 2"),
    (dict(sel=np.array([[[0, 2, 3], [1, 2, 5]]], np.uint16)), r"'sel'.*causal.*got 5"),
    (dict(sel=np.array([[[0, -1, 3], [1, 2, 4]]], np.int32)), r"'sel'.*-1 padding only at the end"),
    (dict(sel=np.array([[0, 2, 3], [1, 2, 4]], np.uint16)), r"'sel'.*3 dims"),
    (dict(k=np.int32(4)), r"'k'.*last axis"),
    (dict(T=np.float32(8)), r"'T'.*scalar integer"),
    (dict(positions=np.array([3, 4, 5], np.int32)), r"'positions'.*shape"),
])
def test_malformed_rejected(tmp_path, over, match):
    p = _write(tmp_path, **_good(**over))
    with pytest.raises(TraceFormatError, match=match):
        load_trace(p)


@pytest.mark.parametrize("key", ["sel", "positions", "T", "k"])
def test_missing_key_rejected(tmp_path, key):
    d = _good()
    del d[key]
    with pytest.raises(TraceFormatError, match=rf"missing trace key\(s\) \['{key}'\]"):
        load_trace(_write(tmp_path, **d))


def test_not_an_npz(tmp_path):
    p = tmp_path / "x.npz"
    p.write_bytes(b"garbage")
    with pytest.raises(TraceFormatError, match="not a readable"):
        load_trace(p)


def test_mtp_axis_accepted(tmp_path):
    sel = np.array([[[[0, 1], [1, 2]], [[1, 2], [2, 3]]]], np.int32)
    p = _write(tmp_path, **_good(sel=sel, positions=np.array([[1, 2], [2, 3]], np.int32), k=np.int32(2)))
    tr = load_trace(p)
    assert tr.queries == 2 and tr.has_mtp_axis


def test_full_trace_loads():
    tr = load_trace(shipped_trace("asyncio_32k"))
    assert tr.sel.shape == (24, 1024, 2048) and tr.sel.dtype == np.uint16
    assert tr.T == 32768 and tr.k == 2048 and tr.positions[0] == 31744
    # a quick replay on a slice keeps the ordering Belady >= LRU >= prev-step
    sub = tr.subset(layers=[0, 5], steps=slice(0, 64))
    res = {p: replay(sub, p, 4096).hit_rate for p in ("belady", "lru", "prev-step")}
    assert res["belady"] >= res["lru"] >= res["prev-step"]


# ------------------------------------------------------------------ MTP replay
def test_acceptance_models():
    from avsg.lab.traces.mtp import acceptance_probability, draw_accepted
    p = acceptance_probability(3, 1.44)
    assert p + p ** 2 + p ** 3 == pytest.approx(1.44, abs=1e-9)
    a = draw_accepted(20000, 3, 1.44, "geometric", seed=0)
    assert a.min() >= 0 and a.max() <= 3 and abs(a.mean() - 1.44) < 0.03
    f = draw_accepted(100, 3, 1.44, "fixed")
    assert f.sum() == 144 and set(f) <= {1, 2}


def test_mtp_replay_hand_example():
    from avsg.lab.traces.mtp import mtp_replay
    # drafts=1 (Tq=2), fixed acceptance mean 1 -> every iteration accepts its draft, advances 2 steps
    # steps: s0 {0,1} s1 {1,2} | s2 {2,3} s3 {3,4} | s4 {4,5} s5 {5,6}
    tr = mk([{0, 1}, {1, 2}, {2, 3}, {3, 4}, {4, 5}, {5, 6}], T=8)
    tr.positions = np.arange(6, dtype=np.int32) + 1
    res = mtp_replay(tr, "lru", capacity=4, drafts=1, accept_mean=1.0, accept_model="fixed",
                     count_first_step=True)
    m = res["modes"]
    assert res["iterations"] == 3 and res["emitted_tokens"] == 6 and res["demanded"] == 12
    assert m["offload"]["fetched"] == 12
    assert m["cold"]["fetched"] == 9            # unions {0,1,2} {2,3,4} {4,5,6}
    assert m["shared"]["fetched"] == 7          # 3, then 3,4 (2 hit), then 5,6 (4 hit)
    # separate: buffer 0 sees {0,1},{2,3},{4,5}; buffer 1 sees {1,2},{3,4},{5,6}: no repeats
    assert m["separate"]["fetched"] == 12


# ------------------------------------------------------------------ CLI end to end
def test_cli_synth_info_replay(tmp_path, capsys):
    from avsg.cli import main as avsg_main

    def main(argv):
        return avsg_main(["trace", *argv])
    out = tmp_path / "s.npz"
    assert main(["synth", str(out), "--steps", "30", "--layers", "2", "--k", "64", "--max-len",
                 "1024", "--gamma", "0.7", "--mu-hist", "0.9", "--seed", "1"]) == 0
    assert main(["info", str(out), "--stats"]) == 0
    pols = ["lru", "clock", "setassoc-fifo", "bucketed-lru", "prev-step", "belady"]
    assert main(["replay", str(out), "--capacity", "64", "128", "--policy", *pols, "--ways", "4",
                 "--out", str(tmp_path / "res"), "--markdown"]) == 0
    text = capsys.readouterr().out
    assert "measured 0.7031" in text and "per-layer spread" in text and "| policy |" in text
    rep = json.loads((tmp_path / "res" / "s_replay.json").read_text())
    assert {(r["policy"], r["capacity"]) for r in rep["results"]} == {(p, c) for p in pols for c in (64, 128)}
    bel = {r["capacity"]: r["hits"] for r in rep["results"] if r["policy"] == "belady"}
    for r in rep["results"]:
        assert r["hits"] <= bel[r["capacity"]] or r["bypassed"] > 0
        assert len(r["per_layer"]) == 2
    try:
        import matplotlib  # noqa: F401
        assert (tmp_path / "res" / "s_replay.png").stat().st_size > 1000
    except ImportError:
        pass
    assert main(["mtp", str(out), "--capacity", "256", "--drafts", "2", "--accept-mean", "1.0"]) == 0
    assert "shared" in capsys.readouterr().out


def test_cli_replay_gap_table(tmp_path):
    """--tables: one row per capacity, the gap closed computed from the same replay's hit rates."""
    from avsg.cli import main as avsg_main

    def main(argv):
        return avsg_main(["trace", *argv])
    from avsg.lab.traces.format import load_trace
    from avsg.lab.traces.replay import replay
    out = tmp_path / "g.npz"
    assert main(["synth", str(out), "--steps", "24", "--layers", "2", "--k", "64", "--max-len",
                 "1024", "--seed", "2"]) == 0
    table = tmp_path / "t.md"
    assert main(["replay", str(out), "--capacity", "96", "160", "--policy", "avsg", "lru", "belady",
                 "--out", str(tmp_path / "res"), "--no-plot", "--tables", str(table)]) == 0
    text = table.read_text()
    rows = [line for line in text.splitlines() if line.startswith("| 96 |") or line.startswith("| 160 |")]
    assert len(rows) == 2 and "<!-- results:hit-rate-g -->" in text
    tr = load_trace(out)
    lru, ours, bel = (replay(tr, p, 96) for p in ("lru", "avsg", "belady"))
    gap = 100 * (ours.hit_rate - lru.hit_rate) / (bel.hit_rate - lru.hit_rate)
    assert rows[0].split(" | ")[4] == f"{gap:.1f}%"
    assert main(["replay", str(out), "--capacity", "96", "--policy", "lru", "--tables", str(table)]) == 2
    assert main(["replay", str(out), "--capacity", "96", "--policy", "avsg", "lru", "belady",
                 "--tables", "/proc/no/such/t.md"]) == 2


def test_cli_synth_grid(tmp_path):
    from avsg.commands import build_parser
    args = build_parser().parse_args(["trace", "synth", str(tmp_path / "g"), "--steps", "12", "--k", "32",
                           "--max-len", "512", "--gamma", "0.5", "0.9", "--mu-hist", "0.7"])
    assert args.func(args) == 0
    assert sorted(os.listdir(tmp_path / "g")) == ["synth_g0.5_m0.7.npz", "synth_g0.9_m0.7.npz"]


def test_cli_reports_bad_trace(tmp_path, capsys):
    from avsg.cli import main as avsg_main

    def main(argv):
        return avsg_main(["trace", *argv])
    p = _write(tmp_path, **_good(sel=np.array([[[0, 3, 2], [1, 2, 4]]], np.uint16)))
    assert main(["info", str(p)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "sorted" in err[0]


# ------------------------------------------------------------------ slow: the full trace in full
@pytest.mark.slow
def test_full_trace_reference_figures():
    tr = load_trace(shipped_trace("asyncio_32k"))
    assert replay(tr, "prev-step", 8192).hit_rate == pytest.approx(0.696, abs=0.001)
    assert replay(tr, "lru", 8192).hit_rate == pytest.approx(0.943, abs=0.001)
    assert replay(tr, "belady", 8192).hit_rate == pytest.approx(0.970, abs=0.001)


def _brute_freq_lifetime(sets, capacity, lifetime=16, classes=4, halve_every=128, insert_life=16):
    """The freq-lifetime rules written out slot by slot (dicts, no numpy): hits per step."""
    life, count, pos_at = [-1] * capacity, [0] * capacity, [-1] * capacity
    ghosts, hand, out = {}, 0, []
    G = 2 * max(64, 1 << (2 * capacity - 1).bit_length())
    for s, sel in enumerate(sets):
        for j in range(capacity):
            c = min(int(np.log2(1 + count[j])), classes)
            if life[j] > 0 and s % (1 << c) == 0:
                life[j] -= 1
        if halve_every and s > 0 and s % halve_every == 0:
            count = [c >> 1 for c in count]
            ghosts = {e: (t, c >> 1) for e, (t, c) in ghosts.items()}
        where = {p: j for j, p in enumerate(pos_at) if p >= 0}
        hit = [p for p in sel if p in where]
        for p in hit:
            count[where[p]] = min(count[where[p]] + 1, 255)
            life[where[p]] = lifetime
        pinned = {where[p] for p in hit}
        misses = sorted(p for p in sel if p not in where)
        order = sorted((j for j in range(capacity) if j not in pinned),
                       key=lambda j: (life[j], (j - hand) % capacity))
        for p, j in zip(misses, order):
            if pos_at[j] >= 0:
                ghosts[pos_at[j] % G] = (pos_at[j] // G, count[j])
            tag, c = ghosts.get(p % G, (-1, 0))
            pos_at[j], life[j] = p, insert_life
            count[j] = min((c if tag == p // G else 0) + 1, 255)
        if misses:
            hand = (order[len(misses) - 1] + 1) % capacity
        out.append(len(hit))
    return out


@pytest.mark.parametrize("name,classes,lifetime,insert_life", [("freq-lifetime", 4, 16, 16),
                                                              ("lifetime-hand", 0, 16, 12),
                                                              ("lifetime-hand", 0, 5, 3)])
def test_freq_lifetime_matches_brute_force_and_keeps_selections(name, classes, lifetime,
                                                                insert_life):
    # few positions recurring at mixed gaps, small buffer: ages, class-scaled decay, ghosts
    # (positions G apart share an entry: context 2G), halving (every 8) and the hand all act
    rng = np.random.default_rng(7)
    k, capacity, steps = 4, 8, 60
    G = 2 * 64
    pool = np.array([0, 1, 2, 3, 5, 9, G + 1, G + 2, 40, 41, 2 * G - 1, 77])
    sets = [sorted(rng.choice(pool, k, replace=False).tolist()) for _ in range(steps)]
    tr = mk(sets, k=k, T=2 * G)
    pol = make_policy(name, 1, capacity, k, max_pos=tr.T, lifetime=lifetime)
    pol.halve_every = 8
    res = replay(tr, pol, count_first_step=True)
    want = _brute_freq_lifetime(sets, capacity, lifetime=lifetime, classes=classes, halve_every=8,
                                insert_life=insert_life)
    assert res.hits[0].tolist() == want
    assert sum(want) > 0 and sum(want) < steps * k
    # every selection resident after its step, the maps consistent
    pol.reset()
    for s, sel in enumerate(sets):
        u = np.array([sel], np.int64)
        from avsg.lab.traces.policies import StepInput
        pol.step(s, StepInput(u[:, None], u, np.array([k]), np.array([tr.T])))
        assert (pol.pos_slot[0, sel] >= 0).all()
        assert (pol.slot_pos[0, pol.pos_slot[0, sel]] == sel).all()
    assert len(pol.levels) > 0 and min(pol.levels) >= 1
