"""The seven invariants of the operator contract on random multi-step sequences.

Hypothesis draws the geometry and the shape of a session (which steps plan, invalidate or reset);
a seeded generator draws the positions, with reuse across steps, repeats across the T query tokens,
-1 padding, and (unchecked) repeats within one query token and out-of-range positions.
Each step is checked three ways: the independent ContentOracle (invariants), the PolicyModel (exact
outputs), and the gathered bytes (exactness). The dual-pointer matcher runs in lockstep and must
leave the same outputs and the same state.
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import avsg
from avsg import reference
from helpers.gather_cases import kv_zeros
from helpers.oracle import ContentOracle, PolicyModel, check_index_consistent

# plan-only buffers hold no KV: track_copies=False keeps a plan's misses resident without
# a gather (what these tests specify); tests/ops/test_uncopied.py covers the tracking

SETTINGS = dict(max_examples=40, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def draw_selection(gen: torch.Generator, R: int, T: int, K: int, seq_lens, hot: int,
                   pad_rate: float, repeat_rate: float, wild_rate: float) -> torch.Tensor:
    """Positions from a hot window (reuse) and the whole context, distinct per query token unless
    repeat_rate > 0; wild_rate puts values out of range (for check=False runs)."""
    out = torch.full((R, T, K), -1, dtype=torch.int32)
    for r in range(R):
        n = int(seq_lens[r])
        for t in range(T):
            if n == 0:
                continue
            window = max(1, min(n, hot))
            start = n - window
            take = min(K, n)
            near = torch.randperm(window, generator=gen)[:take] + start
            far = torch.randperm(n, generator=gen)[:take]
            mix = torch.where(torch.rand(take, generator=gen) < 0.7, near, far)
            mix = torch.unique(mix)[:take]
            row = torch.full((K,), -1, dtype=torch.int64)
            row[:mix.numel()] = mix[torch.randperm(mix.numel(), generator=gen)]
            out[r, t] = row.to(torch.int32)
        # MTP: later query tokens re-select what earlier ones chose
        if T > 1:
            share = torch.rand(T, K, generator=gen) < 0.4
            out[r, 1:] = torch.where(share[1:], out[r, 0:1].expand(T - 1, K), out[r, 1:])
            if repeat_rate == 0:  # keep each query token's top-k distinct
                for t in range(1, T):
                    row = out[r, t].tolist()
                    seen = set()
                    out[r, t] = torch.tensor([p if p < 0 or p not in seen and not seen.add(p)
                                              else -1 for p in row], dtype=torch.int32)
    pad = torch.rand(R, T, K, generator=gen) < pad_rate
    out[pad] = -1
    if repeat_rate > 0:
        rep = torch.rand(R, T, K, generator=gen) < repeat_rate
        out = torch.where(rep, out.roll(1, dims=2), out)
    if wild_rate > 0:
        wild = torch.rand(R, T, K, generator=gen) < wild_rate
        junk = torch.randint(-5, 1 << 25, (R, T, K), generator=gen, dtype=torch.int32)
        out = torch.where(wild, junk, out)
    return out


geometry = st.tuples(
    st.integers(1, 3),                       # R
    st.integers(1, 4),                       # T
    st.sampled_from([1, 2, 3, 5, 8, 16, 31, 64]),  # K
    st.sampled_from([1.0, 1.0, 1.5, 2.0, 4.0]),    # S / (T*K): full buffers are common
    st.integers(1, 20),                      # lifetime
)
session = st.lists(st.sampled_from(["plan"] * 6 + ["invalidate", "reset"]), min_size=1,
                   max_size=12)


@settings(**SETTINGS)
@given(geometry, session, st.integers(0, 2**31 - 1), st.sampled_from([0.0, 0.1, 0.5]),
       st.booleans())
def test_invariants_on_random_sessions(geo, ops, seed, pad_rate, unchecked):
    R, T, K, ratio, lifetime = geo
    S = max(T * K, int(T * K * ratio))
    gen = torch.Generator().manual_seed(seed)
    buf = avsg.SparseKVBuffer(policy="lifetime", rows=R, capacity=S, topk=K, queries_per_step=T, lifetime=lifetime,
                              track_copies=False)
    dual = avsg.SparseKVBuffer(policy="lifetime", rows=R, capacity=S, topk=K, queries_per_step=T, lifetime=lifetime,
                               track_copies=False)
    # the specification itself, called directly (the ops may be served by compiled kernels)
    spec_state, spec_stats = buf.state.clone(), buf.stats_counts.clone()
    oracle, model = ContentOracle(R, S), PolicyModel(R, S, lifetime)
    max_len = 4 * S + 8
    host = torch.randn(R, max_len, 3)
    device_kv = kv_zeros(R, S, 3).fill_(float("nan"))
    seq_lens = torch.randint(1, max_len, (R,), generator=gen, dtype=torch.int32)
    for op in ops:
        if op == "plan":
            seq_lens = torch.clamp(seq_lens + torch.randint(0, T + 1, (R,), generator=gen,
                                                            dtype=torch.int32), max=max_len)
            topk = draw_selection(gen, R, T, K, seq_lens, hot=2 * T * K, pad_rate=pad_rate,
                                  repeat_rate=0.1 if unchecked else 0.0,
                                  wild_rate=0.05 if unchecked else 0.0)
            plan = buf.plan(topk, seq_lens, check=not unchecked)
            twin = dual.plan(topk, seq_lens, check=not unchecked, matcher="dual_pointer")
            expect = model.plan(topk, seq_lens)
            for name, got, want in zip(("slots", "miss_pos", "miss_slots", "miss_counts"),
                                       plan[:4], expect):
                assert torch.equal(got, want), f"{name} differs from the policy model"
            for got, other in zip(plan[:4], twin[:4]):
                assert torch.equal(got, other), "dual-pointer plan differs from hash plan"
            assert torch.equal(buf.state, dual.state)
            spec = reference.plan(spec_state, spec_stats, topk, seq_lens, buf.layout, lifetime)
            for got, want in zip(spec, expect):
                assert torch.equal(got, want), "the reference differs from the policy model"
            assert torch.equal(spec_state, buf.state) and torch.equal(spec_stats, buf.stats_counts)
            oracle.step(topk, seq_lens, plan)
            avsg.gather(plan, host, device_kv, num_cores=3)
            valid = plan.slots >= 0
            r_idx = torch.arange(R)[:, None, None].expand(R, T, K)[valid]
            got = device_kv[r_idx, plan.slots[valid].long()]
            assert torch.equal(got, host[r_idx, topk[valid].long()]), "gathered bytes differ"
        elif op == "invalidate":
            valid_lens = (seq_lens - torch.randint(0, T + 2, (R,), generator=gen,
                                                   dtype=torch.int32)).clamp(min=0)
            buf.invalidate(valid_lens)
            dual.invalidate(valid_lens)
            reference.invalidate(spec_state, buf.layout, valid_lens)
            oracle.invalidate(valid_lens)
            model.invalidate(valid_lens)
            seq_lens = torch.maximum(valid_lens, torch.ones_like(valid_lens))
        else:
            rows = sorted(set(torch.randint(0, R, (2,), generator=gen).tolist()))
            buf.reset(rows)
            dual.reset(rows)
            reference.reset(spec_state, buf.layout, torch.isin(torch.arange(R), torch.tensor(rows)),
                            lifetime)
            oracle.reset(rows)
            model.reset(rows)
        check_index_consistent(buf, after_plan=(op == "plan"))
        for r in range(R):
            assert buf.resident(r) == oracle.resident(r), "resident set differs from the oracle"


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from([(1, 2048, 1.0), (4, 512, 1.0), (2, 2048, 2.0), (1, 2048, 4.0)]),
       st.integers(0, 2**31 - 1))
def test_full_size_topk_against_policy_model(geo, seed):
    """K up to 2048 and T up to 4 at real sizes, a few steps of a growing context."""
    T, K, ratio = geo
    R, S, lifetime = 2, int(T * K * ratio), 4
    gen = torch.Generator().manual_seed(seed)
    buf = avsg.SparseKVBuffer(policy="lifetime", rows=R, capacity=S, topk=K, queries_per_step=T, lifetime=lifetime,
                              track_copies=False)
    oracle, model = ContentOracle(R, S), PolicyModel(R, S, lifetime)
    seq_lens = torch.full((R,), 3 * S, dtype=torch.int32)
    for _ in range(4):
        topk = draw_selection(gen, R, T, K, seq_lens, hot=2 * K, pad_rate=0.02,
                              repeat_rate=0.0, wild_rate=0.0)
        plan = buf.plan(topk, seq_lens)
        for got, want in zip(plan[:4], model.plan(topk, seq_lens)):
            assert torch.equal(got, want)
        oracle.step(topk, seq_lens, plan)
        seq_lens += T
    check_index_consistent(buf)


def test_deterministic_replay():
    """Same inputs and state give the same outputs and state (invariant 6)."""
    gen = torch.Generator().manual_seed(7)
    a = avsg.SparseKVBuffer(policy="lifetime", rows=3, capacity=96, topk=16, queries_per_step=3,
                            track_copies=False)
    b = avsg.SparseKVBuffer(policy="lifetime", rows=3, capacity=96, topk=16, queries_per_step=3,
                            track_copies=False)
    seq = torch.tensor([200, 90, 33], dtype=torch.int32)
    for _ in range(10):
        topk = draw_selection(gen, 3, 3, 16, seq, 40, 0.1, 0.0, 0.0)
        pa, pb = a.plan(topk, seq), b.plan(topk.clone(), seq.clone())
        for x, y in zip(pa[:4], pb[:4]):
            assert torch.equal(x, y)
        assert torch.equal(a.state, b.state)


def run_mtp_decode(steps: int, seed: int, R=3, T=3, K=24, S=96, lifetime=6):
    """A decode loop as MTP serving runs it: every step plans 1+2 query tokens whose drafts are
    the next positions, verifies a random accepted length, invalidates the rejected speculative
    positions, and now and then replaces a finished request (reset). Checked every step by the
    oracle, the policy model, the reference (called directly) and the gathered bytes."""
    gen = torch.Generator().manual_seed(seed)
    buf = avsg.SparseKVBuffer(policy="lifetime", rows=R, capacity=S, topk=K, queries_per_step=T, lifetime=lifetime,
                              track_copies=False)
    oracle, model = ContentOracle(R, S), PolicyModel(R, S, lifetime)
    spec_state, spec_stats = buf.state.clone(), buf.stats_counts.clone()
    max_len = 64 + steps * T + 8
    host = torch.randn(R, max_len, 2)
    device_kv = kv_zeros(R, S, 2)
    lens = torch.full((R,), 64, dtype=torch.int32)
    for step in range(steps):
        seq = lens + T   # the drafts' positions are visible to the step that verifies them
        topk = draw_selection(gen, R, T, K, seq, hot=3 * K, pad_rate=0.05, repeat_rate=0.0,
                              wild_rate=0.0)
        plan = buf.plan(topk, seq)
        expect = model.plan(topk, seq)
        for got, want in zip(plan[:4], expect):
            assert torch.equal(got, want)
        spec = reference.plan(spec_state, spec_stats, topk, seq, buf.layout, lifetime)
        for got, want in zip(spec, expect):
            assert torch.equal(got, want)
        oracle.step(topk, seq, plan)
        avsg.gather(plan, host, device_kv)
        valid = plan.slots >= 0
        rows = torch.arange(R)[:, None, None].expand(R, T, K)[valid]
        assert torch.equal(device_kv[rows, plan.slots[valid].long()],
                           host[rows, topk[valid].long()])
        accepted = torch.randint(1, T + 1, (R,), generator=gen, dtype=torch.int32)
        lens = lens + accepted
        buf.invalidate(lens)
        model.invalidate(lens)
        oracle.invalidate(lens)
        reference.invalidate(spec_state, buf.layout, lens)
        if step % 17 == 16:
            row = int(torch.randint(0, R, (1,), generator=gen))
            buf.reset([row])
            model.reset([row])
            oracle.reset([row])
            reference.reset(spec_state, buf.layout, torch.arange(R) == row, lifetime)
            lens[row] = 64
        assert torch.equal(spec_state, buf.state)
        for r in range(R):
            assert buf.resident(r) == oracle.resident(r)
    stats = buf.stats()
    assert stats["hits"] > 0 and stats["fetched"] < stats["lookups"]


def test_long_mtp_decode_session():
    run_mtp_decode(steps=60, seed=1)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(4))
def test_mtp_decode_soak(seed):
    run_mtp_decode(steps=600, seed=100 + seed)
