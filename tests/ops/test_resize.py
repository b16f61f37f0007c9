"""Elastic buffers: ``SparseKVBuffer.resize`` (issue 13, item 1).

A row's active capacity ``A`` (header word 6) lies in ``[T*K, S]`` and every resident slot lies
below it. Sessions mixing plan / invalidate / reset / resize (MTP, -1 padding) are checked four
ways after every op: the API run (plan by the compiled kernels) against the reference called
directly (every output, the whole state), the ContentOracle (contract invariants, resize moves),
the PolicyModel (lifetime policy: exact outputs, an independent sequential resize), and the bytes
gathered into a device buffer (every selection reads its host row, also after apply_moves).
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import avsg
from avsg import _ops, reference
from helpers.gather_cases import kv_zeros
from helpers.oracle import ContentOracle, PolicyModel, brute_force_lookup

# plan-only buffers hold no KV: track_copies=False keeps a plan's misses resident without
# a gather (what these tests specify); tests/ops/test_uncopied.py covers the tracking

I64 = torch.int64
I32 = torch.int32
POLICIES = ("lifetime", "reuse", "lru")


def make(policy, R=2, T=1, K=4, S=16, L=4, **kw):
    return avsg.SparseKVBuffer(rows=R, capacity=S, topk=K, queries_per_step=T, lifetime=L,
                               policy=policy, max_context=4096 if policy == "reuse" else None, **kw,
                               track_copies=False)


def rows_caps(rows, caps):
    return torch.tensor(rows, dtype=I64), torch.tensor(caps, dtype=I64)


def check_index(buf):
    """The index finds exactly what slot_pos holds, and the stash holds no stale entry."""
    v = reference.view_state(buf.state, buf.layout)
    probe = v.slot_pos.clone()
    found = reference.index_lookup(v, probe, buf.hash_buckets)
    assert torch.equal(found, brute_force_lookup(v.slot_pos, probe))


# ------------------------------------------------------------------------------- unit cases

@pytest.mark.parametrize("policy", POLICIES)
def test_fresh_rows_are_fully_active_and_reset_restores_it(policy):
    buf = make(policy)
    assert buf.active_capacity().tolist() == [16, 16]
    buf.resize(*rows_caps([1], [5]))
    assert buf.active_capacity().tolist() == [16, 5]
    buf.check_state()
    buf.reset(1)
    assert buf.active_capacity().tolist() == [16, 16]
    buf.check_state()


@pytest.mark.parametrize("policy", POLICIES)
def test_shrink_moves_survivors_and_bytes_follow(policy):
    R, T, K, S = 1, 1, 4, 16
    buf = make(policy, R=R, T=T, K=K, S=S)
    host = torch.randn(R, 64, 2)
    kv = kv_zeros(R, S, 2).fill_(float("nan"))
    seq = torch.tensor([64], dtype=I32)
    for step in range(4):        # 16 distinct positions fill all 16 slots
        topk = torch.arange(step * 4, step * 4 + 4, dtype=I32).view(1, 1, 4)
        avsg.gather(buf.plan(topk, seq), host, kv)
    assert len(buf.resident(0)) == 16
    moves = buf.resize(*rows_caps([0], [6]))
    assert moves.miss_pos.shape == (1, S // 2) and moves.slots.shape == (1, 1, S // 2)
    avsg.apply_moves(moves, kv)
    held = buf.resident(0)
    assert len(held) == 6 and all(s < 6 for s in held.values())
    for p, s in held.items():
        assert torch.equal(kv[0, s], host[0, p]), f"pos {p} at slot {s} lost its bytes"
    buf.check_state()
    check_index(buf)
    # the survivors hit; the misses land below the active capacity
    survivors = sorted(held)[:4]
    plan = buf.plan(torch.tensor(survivors, dtype=I32).view(1, 1, 4), seq)
    assert int(plan.miss_counts[0]) == 0
    plan = buf.plan(torch.tensor([40, 41, 42, 43], dtype=I32).view(1, 1, 4), seq)
    assert int(plan.miss_counts[0]) == 4 and int(plan.miss_slots.max()) < 6
    buf.check_state()


def test_shrink_evicts_in_lifetime_order():
    buf = make("lifetime", R=1, K=2, S=8, L=4)
    seq = torch.tensor([100], dtype=I32)
    for step in range(4):        # positions 2*step, 2*step+1; older ones have lower lives
        buf.plan(torch.tensor([2 * step, 2 * step + 1], dtype=I32).view(1, 1, 2), seq)
    buf.resize(*rows_caps([0], [4]))
    assert sorted(buf.resident(0)) == [4, 5, 6, 7]


def test_shrink_evicts_in_lru_order_and_keeps_ages():
    buf = make("lru", R=1, K=2, S=8)
    seq = torch.tensor([100], dtype=I32)
    for p in ([0, 1], [2, 3], [4, 5], [6, 7], [0, 5]):
        buf.plan(torch.tensor(p, dtype=I32).view(1, 1, 2), seq)
    buf.resize(*rows_caps([0], [4]))
    assert sorted(buf.resident(0)) == [0, 5, 6, 7]     # 1, 2, 3, 4 were least recent
    v = reference.view_state(buf.state, buf.layout)
    age = {int(v.slot_pos[0, s]): int(v.slot_life[0, s]) for s in range(4)}
    assert age == {0: 0, 5: 0, 6: 1, 7: 1}


def test_reuse_shrink_spills_counts():
    buf = make("reuse", R=1, K=2, S=4)
    seq = torch.tensor([100], dtype=I32)
    for p in ([0, 1], [0, 1], [2, 3]):
        buf.plan(torch.tensor(p, dtype=I32).view(1, 1, 2), seq)
    v = reference.view_state(buf.state, buf.layout)
    counts = {int(v.slot_pos[0, s]): int(v.slot_count[0, s]) for s in range(4)}
    buf.resize(*rows_caps([0], [2]))
    held = buf.resident(0)
    for p in set(counts) - set(held):
        assert int(reference.ghost_count(v.ghost, torch.tensor([[p]]), buf.layout)) == counts[p], \
            "an evicted count must survive as a ghost"
    for p, s in held.items():
        assert int(v.slot_count[0, s]) == counts[p], "a survivor keeps its count"
    assert int(v.slot_count[0, 2:].abs().sum()) == 0
    buf.check_state()


@pytest.mark.parametrize("policy", POLICIES)
def test_grow_only_raises_the_limit(policy):
    buf = make(policy, R=1, K=2, S=8)
    seq = torch.tensor([100], dtype=I32)
    buf.resize(*rows_caps([0], [2]))
    buf.plan(torch.tensor([[[3, 4]]], dtype=I32), seq)
    before = buf.state.clone()
    moves = buf.resize(*rows_caps([0], [8]))
    assert int(moves.miss_counts[0]) == 0 and bool((moves.miss_pos == -1).all())
    changed = (buf.state != before).nonzero()[:, 1].unique().tolist()
    assert changed == [reference.HEADER_ACTIVE]
    plan = buf.plan(torch.tensor([[[5, 6]]], dtype=I32), seq)
    assert int(plan.miss_counts[0]) == 2 and sorted(plan.miss_slots[0].tolist()) == [2, 3]


def test_moves_reindex_through_the_stash():
    """H = 64 and colliding positions: moved positions whose buckets are taken go to the stash,
    and the index finds them at their new slots."""
    K, S = 16, 64
    buf = avsg.SparseKVBuffer(rows=1, capacity=S, topk=K, lifetime=8, policy="lifetime",
                              hash_buckets=64, track_copies=False)
    seq = torch.tensor([1 << 20], dtype=I32)
    for step in range(4):
        topk = (torch.arange(K, dtype=I32) * 64 + step).view(1, 1, K)   # one low limb per step
        buf.plan(topk, seq)
    assert int(buf.state[0, reference.HEADER_STASH_COUNT]) > 0
    buf.resize(*rows_caps([0], [20]))
    buf.check_state()
    check_index(buf)
    held = buf.resident(0)
    topk = torch.tensor(sorted(held)[:K], dtype=I32).view(1, 1, K)
    assert int(buf.plan(topk, seq).miss_counts[0]) == 0


# --------------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("rows, caps, error, needle", [
    (torch.tensor([0], dtype=torch.int16), torch.tensor([8], dtype=I64), TypeError, "rows"),
    (torch.tensor([0], dtype=I64), torch.tensor([8.0]), TypeError, "capacities"),
    (torch.tensor([0, 1], dtype=I64), torch.tensor([8], dtype=I64), ValueError, "capacities"),
    (torch.tensor([[0]], dtype=I64), torch.tensor([8], dtype=I64), ValueError, "rows"),
    (torch.tensor([0, 0], dtype=I64), torch.tensor([8, 9], dtype=I64), ValueError, "rows"),
    (torch.tensor([2], dtype=I64), torch.tensor([8], dtype=I64), ValueError, "rows"),
    (torch.tensor([-1], dtype=I64), torch.tensor([8], dtype=I64), ValueError, "rows"),
    (torch.tensor([0], dtype=I64), torch.tensor([3], dtype=I64), ValueError, "capacities"),
    (torch.tensor([0], dtype=I64), torch.tensor([17], dtype=I64), ValueError, "capacities"),
    (torch.tensor([0], dtype=I64, device="meta"), torch.tensor([8], dtype=I64), ValueError, "rows"),
    ([0], torch.tensor([8], dtype=I64), TypeError, "rows"),
])
def test_bad_input_names_the_argument_and_leaves_state(rows, caps, error, needle):
    buf = make("reuse", T=2, K=2, S=16)
    buf.plan(torch.tensor([[[1, 2], [3, 4]], [[5, 6], [7, 8]]], dtype=I32),
             torch.tensor([50, 50], dtype=I32))
    before = buf.state.clone()
    with pytest.raises(error, match=needle):
        buf.resize(rows, caps)
    assert torch.equal(buf.state, before)


def test_op_rejects_bad_values_without_touching_state():
    """The op itself (the reference on CPU) raises before any change, whoever calls it."""
    buf = make("lifetime", K=4, S=16)
    before = buf.state.clone()
    for rows, caps, needle in (([0, 0], [4, 4], "rows"), ([0], [3], "capacities"),
                               ([5], [8], "rows")):
        with pytest.raises(ValueError, match=needle):
            torch.ops.avsg.resize(buf.state, *rows_caps(rows, caps), 16, buf.hash_buckets, 4, 0,
                                  0, 4)
        assert torch.equal(buf.state, before)


@pytest.mark.parametrize("active", [-1, 0, 3, 17, 1 << 30])
def test_plan_refuses_an_active_capacity_outside_n_to_s(active):
    """CPU: a clean error naming the state, nothing changed; with the host checks off the
    kernel rejects the row (miss_counts -1), leaves it untouched and serves the others."""
    buf = make("lifetime", R=2, K=4, S=16)
    buf.state[1, reference.HEADER_ACTIVE] = active
    before = buf.state.clone()
    topk = torch.arange(8, dtype=I32).view(2, 1, 4)
    seq = torch.tensor([20, 20], dtype=I32)
    with pytest.raises(ValueError, match="active capacity"):
        buf.plan(topk, seq)
    assert torch.equal(buf.state, before)
    with pytest.raises(ValueError, match="active capacity"):
        buf.check_state()
    old = torch.ops.avsg._set_host_value_checks(False)
    try:
        plan = buf.plan(topk, seq, check=False)
    finally:
        torch.ops.avsg._set_host_value_checks(old)
    assert plan.miss_counts.tolist() == [4, -1]
    assert torch.equal(buf.state[1], before[1])
    # invalidate only frees slots: any active capacity is harmless to it
    buf.invalidate(torch.tensor([100, 100], dtype=I32))


def test_check_state_finds_a_slot_past_the_active_capacity():
    buf = make("lifetime", R=1, K=4, S=16)
    buf.plan(torch.arange(4, dtype=I32).view(1, 1, 4), torch.tensor([10], dtype=I32))
    buf.state[0, reference.HEADER_ACTIVE] = 4
    buf.check_state()
    buf.state[0, reference.HEADER_ACTIVE] = 5
    buf.resize(*rows_caps([0], [4]))
    buf.check_state()
    v = reference.view_state(buf.state, buf.layout)
    v.slot_pos[0, 6], v.slot_life[0, 6] = 9, 1
    with pytest.raises(ValueError, match="active capacity"):
        buf.check_state()


def test_resize_is_registered_with_a_fake_impl():
    assert "resize" in _ops.OP_NAMES
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        state = torch.empty(3, 1000, dtype=I32)
        src, dst, counts = torch.ops.avsg.resize(state, torch.empty(2, dtype=I64),
                                                 torch.empty(2, dtype=I64), 40, 128, 4, 0, 0, 8)
    assert src.shape == dst.shape == (3, 20) and counts.shape == (3,)
    assert src.dtype == dst.dtype == counts.dtype == I32


# ------------------------------------------------------------------------------ sessions

geometry = st.tuples(
    st.integers(1, 3),                               # R
    st.integers(1, 3),                               # T (MTP)
    st.sampled_from([1, 2, 3, 5, 8, 16]),            # K
    st.sampled_from([1.0, 1.5, 2.0, 4.0, 7.0]),      # S / (T*K)
    st.integers(1, 12),                              # L
)
session = st.lists(st.sampled_from(["plan"] * 5 + ["invalidate", "reset", "resize", "resize"]),
                   min_size=1, max_size=14)


def draw_topk(gen, R, T, K, seq, hot, pad_rate):
    """Distinct per query token, a hot window plus the whole context, MTP re-selections."""
    out = torch.full((R, T, K), -1, dtype=I32)
    for r in range(R):
        n = int(seq[r])
        for t in range(T):
            window = max(1, min(n, hot))
            near = torch.randperm(window, generator=gen)[:K] + (n - window)
            far = torch.randperm(n, generator=gen)[:K]
            take = min(near.numel(), far.numel())
            mix = torch.where(torch.rand(take, generator=gen) < 0.7, near[:take], far[:take])
            mix = torch.unique(mix)
            out[r, t, :mix.numel()] = mix[torch.randperm(mix.numel(), generator=gen)].to(I32)
        if T > 1:   # later tokens re-select the first token's positions (not twice in a token)
            for t in range(1, T):
                share = torch.rand(K, generator=gen) < 0.4
                row = torch.where(share, out[r, 0], out[r, t]).tolist()
                seen = set()
                out[r, t] = torch.tensor([p if p >= 0 and p not in seen and not seen.add(p)
                                          else -1 for p in row], dtype=I32)
    out[torch.rand(R, T, K, generator=gen) < pad_rate] = -1
    return out


def run_resize_session(policy, geo, ops, seed, pad_rate):
    R, T, K, ratio, L = geo
    N = T * K
    S = max(N, int(N * ratio))
    gen = torch.Generator().manual_seed(seed)
    max_len = 4 * S + 8
    C = max_len if policy == "reuse" else None
    buf = avsg.SparseKVBuffer(rows=R, capacity=S, topk=K, queries_per_step=T, lifetime=L,
                              policy=policy, max_context=C, track_copies=False)
    spec_state, spec_stats = buf.state.clone(), buf.stats_counts.clone()
    oracle = ContentOracle(R, S)
    model = PolicyModel(R, S, L) if policy == "lifetime" else None
    host = torch.randn(R, max_len, 3)
    kv = kv_zeros(R, S, 3).fill_(float("nan"))
    seq = torch.randint(1, max_len // 2, (R,), generator=gen, dtype=I32)
    for op in ops:
        if op == "plan":
            seq = torch.clamp(seq + torch.randint(0, T + 1, (R,), generator=gen, dtype=I32),
                              max=max_len)
            topk = draw_topk(gen, R, T, K, seq, 2 * N, pad_rate)
            plan = buf.plan(topk, seq)
            spec = reference.plan(spec_state, spec_stats, topk, seq, buf.layout, L,
                                  policy=policy)
            for name, got, want in zip(("slots", "miss_pos", "miss_slots", "miss_counts"),
                                       plan[:4], spec):
                assert torch.equal(got, want), f"{name}: kernel differs from the reference"
            if model is not None:
                for got, want in zip(plan[:4], model.plan(topk, seq)):
                    assert torch.equal(got, want), "plan differs from the policy model"
            oracle.step(topk, seq, plan)
            avsg.gather(plan, host, kv, num_cores=3)
            valid = plan.slots >= 0
            r_idx = torch.arange(R)[:, None, None].expand(R, T, K)[valid]
            assert torch.equal(kv[r_idx, plan.slots[valid].long()],
                               host[r_idx, topk[valid].long()]), "gathered bytes differ"
        elif op == "invalidate":
            valid_lens = (seq - torch.randint(0, T + 2, (R,), generator=gen, dtype=I32)).clamp(0)
            buf.invalidate(valid_lens)
            reference.invalidate(spec_state, buf.layout, valid_lens)
            oracle.invalidate(valid_lens)
            if model is not None:
                model.invalidate(valid_lens)
            seq = torch.maximum(valid_lens, torch.ones_like(valid_lens))
        elif op == "reset":
            rows = sorted(set(torch.randint(0, R, (2,), generator=gen).tolist()))
            buf.reset(rows)
            reference.reset(spec_state, buf.layout, torch.isin(torch.arange(R), torch.tensor(rows)),
                            L, policy)
            oracle.reset(rows)
            if model is not None:
                model.reset(rows)
        else:
            rows = torch.randperm(R, generator=gen)[:int(torch.randint(1, R + 1, (1,),
                                                                        generator=gen))]
            caps = torch.randint(N, S + 1, (rows.numel(),), generator=gen)
            caps = torch.where(torch.rand(rows.numel(), generator=gen) < 0.25,
                               torch.full_like(caps, N), caps)        # the mandatory minimum
            before = {r: buf.resident(r) for r in range(R)}
            moves = buf.resize(rows, caps)
            spec = reference.resize(spec_state, buf.layout, rows, caps, L, policy, N)
            for got, want in zip((moves.miss_pos, moves.miss_slots, moves.miss_counts), spec):
                assert torch.equal(got, want)
            oracle.resize(rows.tolist(), caps.tolist(), moves, T, K, buf.resident)
            if model is not None:
                expect = model.resize(rows.tolist(), caps.tolist())
                for r in range(R):
                    n = int(moves.miss_counts[r])
                    got = list(zip(moves.miss_pos[r, :n].tolist(), moves.miss_slots[r, :n].tolist()))
                    assert got == expect.get(r, []), "moves differ from the policy model"
            avsg.apply_moves(moves, kv, num_cores=3)
            for r in range(R):
                for p, s in buf.resident(r).items():
                    assert torch.equal(kv[r, s], host[r, p]), f"row {r} pos {p}: bytes lost"
                if r not in rows.tolist():
                    assert buf.resident(r) == before[r]
        assert torch.equal(spec_state, buf.state), f"{op}: state differs from the reference"
        assert torch.equal(spec_stats, buf.stats_counts)
        buf.check_state()
        check_index(buf)
        for r in range(R):
            assert buf.resident(r) == oracle.resident(r), "resident set differs from the oracle"
            if model is not None:
                assert model.active[r] == int(buf.active_capacity()[r])


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.sampled_from(POLICIES), geometry, session, st.integers(0, 2**31 - 1),
       st.sampled_from([0.0, 0.1, 0.5]))
def test_sessions_with_resizes(policy, geo, ops, seed, pad_rate):
    run_resize_session(policy, geo, ops, seed, pad_rate)


@pytest.mark.slow
@settings(max_examples=600, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.sampled_from(POLICIES), geometry, session, st.integers(0, 2**31 - 1),
       st.sampled_from([0.0, 0.1, 0.5]))
def test_sessions_with_resizes_long(policy, geo, ops, seed, pad_rate):
    run_resize_session(policy, geo, ops, seed, pad_rate)


# -------------------------------------------------------------------------------- the kernel

def test_cpu_resize_is_the_kernel():
    assert _ops.CPU_BACKEND["resize"] == "kernel"


@pytest.mark.parametrize("seed", [3, 11])
def test_fast_build_equals_strict(seed):
    """The same session under the fast emulation build (checks compiled out): same everything."""
    from avsg import backend
    with backend.emulation("fast"):
        for policy in POLICIES:
            run_resize_session(policy, (2, 2, 5, 4.0, 6),
                               ["plan", "plan", "resize", "plan", "resize", "invalidate", "plan",
                                "resize", "reset", "plan", "resize"], seed, 0.1)


@pytest.mark.parametrize("policy", POLICIES)
def test_largest_geometry_shrinks_to_the_minimum(policy):
    """S = H = 2^15 (every section paged through several windows, the longest move lists) and a
    reuse context of 2^20; a full row shrinks to T*K and the kernel equals the reference."""
    R, K, S = 2, 2048, 1 << 15
    C = 1 << 20 if policy == "reuse" else None
    buf = avsg.SparseKVBuffer(rows=R, capacity=S, topk=K, lifetime=9, policy=policy,
                              max_context=C, hash_buckets=S, track_copies=False)
    gen = torch.Generator().manual_seed(5)
    seq = torch.full((R,), 1 << 20, dtype=I32)
    for step in range(18):
        topk = torch.stack([torch.randperm(1 << 20, generator=gen)[:K] for _ in range(R)])
        buf.plan(topk.to(I32).view(R, 1, K), seq, check=False)
    spec = buf.state.clone()
    rows, caps = rows_caps([0, 1], [K, S // 2 + 17])
    moves = buf.resize(rows, caps)
    want = reference.resize(spec, buf.layout, rows, caps, 9, policy, K)
    for got, exp in zip((moves.miss_pos, moves.miss_slots, moves.miss_counts), want):
        assert torch.equal(got, exp)
    assert torch.equal(buf.state, spec)
    assert int(moves.miss_counts[0]) > 0
    buf.check_state()


def test_more_rows_than_cores():
    """Rows are strided over the cores: 7 rows on 3 emulated cores, every policy."""
    from avsg import backend
    old = backend.emulated_cores()
    backend.set_emulated_cores(3)
    try:
        for policy in POLICIES:
            run_resize_session(policy, (7, 1, 4, 4.0, 5),
                               ["plan", "plan", "plan", "resize", "plan", "resize", "resize"], 7,
                               0.1)
    finally:
        backend.set_emulated_cores(old)
