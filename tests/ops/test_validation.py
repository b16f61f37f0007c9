"""Bad input: a clear error that names the argument, and no state change."""
from __future__ import annotations

import pytest
import torch

import avsg

# plan-only buffers hold no KV: track_copies=False keeps a plan's misses resident without
# a gather (what these tests specify); tests/ops/test_uncopied.py covers the tracking

R, T, K, S = 2, 2, 4, 16
I32 = torch.int32


def make_buffer():
    buf = avsg.SparseKVBuffer(policy="lifetime", rows=R, capacity=S, topk=K, queries_per_step=T,
                              track_copies=False)
    warm = torch.arange(R * T * K, dtype=I32).view(R, T, K) % 11
    warm[:, 1] = warm[:, 0] + 11
    buf.plan(warm, torch.full((R,), 40, dtype=I32))
    return buf


def good_pos():
    return torch.arange(R * T * K, dtype=I32).view(R, T, K)


SEQ = torch.full((R,), 40, dtype=I32)


@pytest.mark.parametrize("kwargs,error,needle", [
    (dict(rows=0), ValueError, "rows"),
    (dict(rows=2.0), TypeError, "rows"),
    (dict(topk=0), ValueError, "topk"),
    (dict(queries_per_step=0), ValueError, "queries_per_step"),
    (dict(capacity=7), ValueError, "capacity"),          # S < T*K
    (dict(capacity=1 << 16), ValueError, "capacity"),
    (dict(lifetime=0), ValueError, "lifetime"),
    (dict(lifetime=256), ValueError, "lifetime"),
    (dict(hash_buckets=96), ValueError, "hash_buckets"),  # not a power of two
    (dict(hash_buckets=8), ValueError, "hash_buckets"),   # below capacity / one repeat
    (dict(hash_buckets=1 << 16), ValueError, "hash_buckets"),
    (dict(policy="lru-ish"), ValueError, "policy"),
    (dict(policy=None), ValueError, "policy"),
    (dict(max_context=0), ValueError, "max_context"),
    (dict(max_context=(1 << 24) + 1), ValueError, "max_context"),
    (dict(max_context=1.5), TypeError, "max_context"),
    (dict(policy="lifetime", max_context=-3), ValueError, "max_context"),
])
def test_constructor_rejects(kwargs, error, needle):
    args = dict(rows=R, capacity=S, topk=K, queries_per_step=T, max_context=4096)
    args.update(kwargs)
    with pytest.raises(error, match=needle):
        avsg.SparseKVBuffer(**args)


def test_capacity_message_says_what_is_needed():
    with pytest.raises(ValueError, match=r"capacity: expected >= .*= 8"):
        avsg.SparseKVBuffer(policy="lifetime", rows=1, capacity=7, topk=4, queries_per_step=2,
                            track_copies=False)


def _bad_values(pos):
    pos = pos.clone()
    pos[1, 1, 2] = 40          # == seq_len: out of range
    return pos


def _below(pos):
    pos = pos.clone()
    pos[0, 1, 3] = -2
    return pos


def _repeat(pos):
    pos = pos.clone()
    pos[1, 0, 3] = pos[1, 0, 1]
    return pos


PLAN_CASES = [
    ("dtype", lambda p, s: (p.long(), s), TypeError, "topk_pos: expected dtype torch.int32"),
    ("shape", lambda p, s: (p[:, :1].contiguous(), s), ValueError, "topk_pos: expected shape"),
    ("layout", lambda p, s: (p.transpose(1, 2).contiguous().transpose(1, 2), s), ValueError,
     "topk_pos: expected shape|topk_pos: expected a contiguous"),
    ("noncontig", lambda p, s: (torch.zeros(R, T, 2 * K, dtype=I32)[:, :, ::2], s), ValueError,
     "topk_pos: expected a contiguous tensor"),
    ("not tensor", lambda p, s: (p.tolist(), s), TypeError, "topk_pos: expected a torch.Tensor"),
    ("seq dtype", lambda p, s: (p, s.long()), TypeError, "seq_lens: expected dtype"),
    ("seq shape", lambda p, s: (p, s[:1].contiguous()), ValueError, "seq_lens: expected shape"),
    ("beyond", lambda p, s: (_bad_values(p), s), ValueError,
     r"topk_pos\[row=1, query=1, index=2\] = 40 is out of range"),
    ("below", lambda p, s: (_below(p), s), ValueError,
     r"topk_pos\[row=0, query=1, index=3\] = -2"),
    ("repeat", lambda p, s: (_repeat(p), s), ValueError,
     r"topk_pos\[row=1, query=0\]: position \d+ is repeated at index 1 and index 3"),
    ("negative len", lambda p, s: (p, torch.tensor([40, -1], dtype=I32)), ValueError,
     r"seq_lens\[1\] = -1"),
    ("huge len", lambda p, s: (p, torch.tensor([1 << 25, 40], dtype=I32)), ValueError,
     r"seq_lens\[0\]"),
]


@pytest.mark.parametrize("name,mutate,error,needle", PLAN_CASES, ids=[c[0] for c in PLAN_CASES])
def test_plan_rejects_and_leaves_state_untouched(name, mutate, error, needle):
    buf = make_buffer()
    state, stats = buf.state.clone(), buf.stats_counts.clone()
    pos, seq = mutate(good_pos(), SEQ)
    with pytest.raises(error, match=needle):
        buf.plan(pos, seq)
    assert torch.equal(buf.state, state) and torch.equal(buf.stats_counts, stats)


def test_unchecked_values_are_handled_as_documented():
    """check=False: out of range and -2 act as -1; a repeat within a query shares its slot."""
    buf = make_buffer()
    pos = _repeat(_below(_bad_values(good_pos())))
    plan = buf.plan(pos, SEQ, check=False)
    assert plan.slots[1, 1, 2] == -1 and plan.slots[0, 1, 3] == -1
    assert plan.slots[1, 0, 3] == plan.slots[1, 0, 1] >= 0
    assert int(plan.miss_pos[1].eq(40).sum()) == 0


def test_matcher_name_is_checked():
    buf = make_buffer()
    with pytest.raises(ValueError, match="matcher"):
        buf.plan(good_pos(), SEQ, matcher="linear")


@pytest.mark.parametrize("bad,error,needle", [
    (torch.zeros(R, dtype=torch.int64), TypeError, "valid_lens: expected dtype torch.int32"),
    (torch.zeros(R + 1, dtype=I32), ValueError, "valid_lens: expected shape"),
])
def test_invalidate_rejects(bad, error, needle):
    buf = make_buffer()
    state = buf.state.clone()
    with pytest.raises(error, match=needle):
        buf.invalidate(bad)
    assert torch.equal(buf.state, state)


@pytest.mark.parametrize("rows,error,needle", [
    ([R], ValueError, "rows"), ([-1], ValueError, "rows"), (torch.ones(R + 1, dtype=torch.bool),
                                                          ValueError, "rows: expected shape"),
    (torch.ones(R, dtype=torch.float32), TypeError, "rows"), (["0"], TypeError, "rows"),
])
def test_reset_rejects(rows, error, needle):
    buf = make_buffer()
    state = buf.state.clone()
    with pytest.raises(error, match=needle):
        buf.reset(rows)
    assert torch.equal(buf.state, state)


def test_reset_accepts_every_row_form():
    for rows in (1, [1], torch.tensor([1]), torch.tensor([False, True])):
        buf = make_buffer()
        kept = buf.resident(0)
        buf.reset(rows)
        assert buf.resident(1) == {} and buf.resident(0) == kept and kept


def _gather_args():
    buf = make_buffer()
    plan = buf.plan(good_pos(), SEQ)
    host = torch.randn(R, 40, 8)
    dst = torch.zeros(R, S, 8)
    return buf, plan, host, dst


GATHER_CASES = [
    ("plan type", lambda p, h, d: ((tuple(p[:4]), h, d), {}), TypeError, "plan: expected"),
    ("count", lambda p, h, d: ((p, [h, h], [d]), {}), ValueError, "same number"),
    ("empty", lambda p, h, d: ((p, [], []), {}), TypeError, "src"),
    ("dtype", lambda p, h, d: ((p, h.double(), d), {}), TypeError,
     r"src\[0\]/dst\[0\]: the pool and the buffer need one dtype"),
    ("row shape", lambda p, h, d: ((p, h[..., :4].contiguous(), d), {}), ValueError,
     r"src\[0\]: expected shape"),
    ("dst rows", lambda p, h, d: ((p, h, d[:1].contiguous()), {}), ValueError, r"dst\[0\]"),
    ("dst slots", lambda p, h, d: ((p, h, torch.zeros(R, S - 1, 8)), {}), ValueError, r"dst\[0\]"),
    ("src rows", lambda p, h, d: ((p, h[:1].contiguous(), d), {}), ValueError, r"src\[0\]"),
    ("noncontig", lambda p, h, d: ((p, h.transpose(0, 1).contiguous().transpose(0, 1), d), {}),
     ValueError, r"src\[0\]: expected evenly spaced rows"),
    ("partition", lambda p, h, d: ((p, h, d), dict(partition="rows")), ValueError, "partition"),
    ("cores", lambda p, h, d: ((p, h, d), dict(num_cores=0)), ValueError, "num_cores"),
    ("short pool", lambda p, h, d: ((p, h[:, :10].contiguous(), d), {}), ValueError,
     "lies beyond the pool's max_len"),
    ("block size alone", lambda p, h, d: ((p, h, d), dict(block_size=4)), ValueError,
     "block_size"),
    ("table dtype", lambda p, h, d: ((p, h.view(-1, 8, 8), d),
                                     dict(block_table=torch.zeros(R, 5), block_size=8)),
     TypeError, "block_table: expected dtype"),
    ("table rows", lambda p, h, d: ((p, h.view(-1, 8, 8), d),
                                    dict(block_table=torch.zeros(R + 1, 5, dtype=I32),
                                         block_size=8)), ValueError, "block_table: expected 2"),
    ("block size", lambda p, h, d: ((p, h.view(-1, 8, 8), d),
                                    dict(block_table=torch.zeros(R, 5, dtype=I32), block_size=4)),
     ValueError, "block_size=4"),
    ("short table", lambda p, h, d: ((p, h.view(-1, 8, 8), d),
                                     dict(block_table=torch.zeros(R, 1, dtype=I32),
                                          block_size=8)), ValueError,
     r"needs block 1 but block_table.shape\[1\] = 1"),
    ("bad block id", lambda p, h, d: ((p, h.view(-1, 8, 8), d),
                                      dict(block_table=torch.full((R, 5), 10, dtype=I32),
                                           block_size=8)), ValueError, r"block id in \[0, 10\)"),
]


@pytest.mark.parametrize("name,build,error,needle", GATHER_CASES,
                         ids=[c[0] for c in GATHER_CASES])
def test_gather_rejects_and_copies_nothing(name, build, error, needle):
    buf, plan, host, dst = _gather_args()
    args, kwargs = build(plan, host, dst)
    before = dst.clone()
    with pytest.raises(error, match=needle):
        avsg.gather(*args, **kwargs)
    assert torch.equal(dst, before)


def test_unchecked_gather_skips_rows_outside_the_pool():
    buf, plan, host, dst = _gather_args()
    short = host[:, :10].contiguous()
    avsg.gather(plan, short, dst, check=False)
    for r in range(R):
        for p, s in zip(plan.miss_pos[r].tolist(), plan.miss_slots[r].tolist()):
            if 0 <= p < 10:
                assert torch.equal(dst[r, s], short[r, p])
            elif p >= 10:
                assert torch.equal(dst[r, s], torch.zeros(8))
