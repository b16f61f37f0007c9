"""No silent wrong answers around the kernels (issue 17, items 2-5 and 7).

* interleaving: a plan superseded by a later plan/invalidate/reset/resize of its buffer is refused
  by gather and apply_moves, whichever thread made the calls; a current plan gathers any number
  of times;
* raw ops: a meta tensor among real ones is refused, naming the argument, by every op (the
  dispatcher would run the shape function only and return uninitialised outputs);
* all-or-nothing: every public method of SparseKVBuffer and SparseOffloadManager given one bad
  element among good ones raises and leaves everything as it was;
* every error names its argument and what was expected;
* resize takes int32 as well as int64.
"""
from __future__ import annotations

import re
import threading

import pytest
import torch

import avsg
from avsg.cache import SparseOffloadManager
from helpers.gather_cases import kv_zeros

I32, I64 = torch.int32, torch.int64
R, T, K, S, D = 2, 2, 4, 16, 4
MAX_LEN = 64


def make_buffer(policy="lru", **kwargs):
    args = dict(rows=R, capacity=S, topk=K, queries_per_step=T, policy=policy)
    if policy == "reuse":
        args["max_context"] = MAX_LEN
    args.update(kwargs)
    return avsg.SparseKVBuffer(**args)


def step_inputs(start: int, seq: int = 40):
    topk = (torch.arange(T * K, dtype=I32).view(1, T, K) + start).repeat(R, 1, 1)
    return topk.contiguous(), torch.full((R,), seq, dtype=I32)


def snapshot_buffer(buf):
    return buf.state.clone(), buf.stats_counts.clone()


def same_buffer(buf, snap) -> bool:
    return torch.equal(buf.state, snap[0]) and torch.equal(buf.stats_counts, snap[1])


# --------------------------------------------------------------------------- interleaving

def test_interleaved_threads_cannot_gather_a_stale_plan():
    """The review's reproducer: thread A plans, thread B plans and gathers, then thread A
    gathers its stale plan. The calls never overlap, so the lock alone cannot see it; the
    plan's generation does, and the buffer's KV stays what B's plan says."""
    buf = make_buffer()
    host = torch.randn(R, MAX_LEN, D)
    kv = kv_zeros(R, S, D)
    planned_a, done_b = threading.Event(), threading.Event()
    result = {}

    def thread_a():
        topk, seq = step_inputs(0)
        plan = buf.plan(topk, seq)
        planned_a.set()
        done_b.wait(30)
        try:
            avsg.gather(plan, host, kv)
            result["a"] = "gathered"
        except ValueError as e:
            result["a"] = str(e)

    def thread_b():
        planned_a.wait(30)
        topk, seq = step_inputs(20)
        plan = buf.plan(topk, seq)
        avsg.gather(plan, host, kv)
        result["b"] = plan
        done_b.set()

    threads = [threading.Thread(target=thread_a), threading.Thread(target=thread_b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert result["a"].startswith("plan: superseded"), result["a"]
    plan_b = result["b"]
    topk_b, _ = step_inputs(20)
    for r in range(R):                  # what B's plan promised is still true
        for pos, slot in zip(topk_b[r].reshape(-1).tolist(), plan_b.slots[r].reshape(-1).tolist()):
            assert torch.equal(kv[r, slot], host[r, pos])
    buf.check_state()


@pytest.mark.parametrize("later", ["plan", "invalidate", "reset", "resize"])
def test_every_state_change_supersedes_earlier_plans(later):
    buf = make_buffer(capacity=2 * S)
    host = torch.randn(R, MAX_LEN, D)
    kv, kv2 = kv_zeros(R, 2 * S, D), kv_zeros(R, 2 * S, D)
    plan = buf.plan(*step_inputs(0))
    avsg.gather(plan, host, kv)          # the same current plan, twice and into two buffers
    avsg.gather(plan, [host, host], [kv, kv2])
    assert torch.equal(kv, kv2)
    if later == "plan":
        buf.plan(*step_inputs(8))
    elif later == "invalidate":
        buf.invalidate(torch.full((R,), 3, dtype=I32))
    elif later == "reset":
        buf.reset(0)
    else:
        buf.resize(torch.tensor([1]), torch.tensor([S]))
    before = kv.clone()
    with pytest.raises(ValueError, match=r"plan: superseded; the buffer ran 1 "
                                         r"plan/invalidate/reset/resize call"):
        avsg.gather(plan, host, kv)
    assert torch.equal(kv, before)


def test_apply_moves_refuses_superseded_moves():
    buf = make_buffer(capacity=2 * S)
    kv = kv_zeros(R, 2 * S, D).normal_()
    for start in (0, 8, 16):
        buf.plan(*step_inputs(start))
    moves = buf.resize(torch.tensor([0, 1]), torch.tensor([S, S]))
    buf.plan(*step_inputs(30))
    with pytest.raises(ValueError, match="moves: superseded"):
        avsg.apply_moves(moves, kv)
    with pytest.raises(ValueError, match=r"buffers\[0\]: expected shape"):   # named as apply_moves names it
        avsg.apply_moves(buf.resize(torch.tensor([0]), torch.tensor([S])), kv[:, :S])
    fresh = buf.resize(torch.tensor([0]), torch.tensor([2 * S]))
    avsg.apply_moves(fresh, kv)          # current: fine


def test_a_rejected_call_supersedes_nothing():
    buf = make_buffer()
    host, kv = torch.randn(R, MAX_LEN, D), kv_zeros(R, S, D)
    plan = buf.plan(*step_inputs(0))
    topk, seq = step_inputs(0)
    topk[1, 0, 2] = 99                   # beyond seq_len
    with pytest.raises(ValueError, match=r"topk_pos\[row=1, query=0, index=2\]"):
        buf.plan(topk, seq)
    with pytest.raises(ValueError, match="rows"):
        buf.reset([0, 7])
    avsg.gather(plan, host, kv)


# ------------------------------------------------------------------------- raw ops, meta

def _raw_calls(buf):
    """Every state-changing op and gather as (name, tensor argument names, call(tensors))."""
    topk, seq = step_inputs(0)
    plan = buf.plan(topk, seq)
    geo = (buf.capacity, buf.hash_buckets)
    ctx = buf._state_context
    host, kv = torch.randn(R, MAX_LEN, D), kv_zeros(R, S, D)
    ops = torch.ops.avsg
    return [
        ("plan", dict(topk_pos=topk, seq_lens=seq, state=buf.state, stats=buf.stats_counts),
         lambda a: ops.plan(a["topk_pos"], a["seq_lens"], a["state"], a["stats"], *geo,
                            buf.lifetime, buf._policy_id, ctx)),
        ("plan_dual_pointer", dict(topk_pos=topk, seq_lens=seq, state=buf.state,
                                   stats=buf.stats_counts),
         lambda a: ops.plan_dual_pointer(a["topk_pos"], a["seq_lens"], a["state"], a["stats"],
                                         *geo, buf.lifetime, buf._policy_id, ctx)),
        ("invalidate", dict(state=buf.state, valid_lens=seq - 3),
         lambda a: ops.invalidate(a["state"], a["valid_lens"], *geo, ctx)),
        ("reset", dict(state=buf.state, row_mask=torch.tensor([True, False])),
         lambda a: ops.reset(a["state"], a["row_mask"], *geo, buf.lifetime, buf._policy_id,
                             ctx)),
        ("resize", dict(state=buf.state, rows=torch.tensor([1]), capacities=torch.tensor([T * K])),
         lambda a: ops.resize(a["state"], a["rows"], a["capacities"], *geo, buf.lifetime,
                              buf._policy_id, ctx, T * K)),
        ("gather", {"miss_pos": plan.miss_pos, "miss_slots": plan.miss_slots,
                    "miss_counts": plan.miss_counts, "src[0]": host, "dst[0]": kv},
         lambda a: ops.gather(a["miss_pos"], a["miss_slots"], a["miss_counts"], [a["src[0]"]],
                              [a["dst[0]"]], None, 0, "miss", 4)),
    ]


@pytest.mark.parametrize("op_index", range(6),
                         ids=["plan", "plan_dual_pointer", "invalidate", "reset", "resize",
                              "gather"])
def test_raw_ops_refuse_one_meta_tensor_among_cpu_tensors(op_index):
    buf = make_buffer()
    name, tensors, call = _raw_calls(buf)[op_index]
    for arg in tensors:
        snap = snapshot_buffer(buf)
        kv_before = tensors.get("dst[0]", torch.zeros(0)).clone()
        mixed = dict(tensors, **{arg: tensors[arg].to("meta")})
        with pytest.raises(ValueError, match=rf"avsg\.{name}: {re.escape(arg)}: expected a "
                                             rf"tensor on cpu like"):
            call(mixed)
        assert same_buffer(buf, snap), f"{name} with {arg} on meta changed the state"
        if "dst[0]" in tensors:
            assert torch.equal(tensors["dst[0]"], kv_before)
    if len(tensors) > 2:                 # one CPU tensor among meta ones: the CPU one is named
        arg = next(iter(tensors))
        mixed = {a: (t if a == arg else t.to("meta")) for a, t in tensors.items()}
        with pytest.raises(ValueError, match=rf"avsg\.{name}: {arg}: expected a tensor on meta"):
            call(mixed)
    outs = call({a: t.to("meta") for a, t in tensors.items()})    # all meta: the shape function
    for out in (outs if isinstance(outs, tuple) else [outs]):
        assert out is None or out.device.type == "meta"


# ------------------------------------------------------------------------ all-or-nothing

def test_buffer_methods_change_nothing_when_they_raise():
    buf = make_buffer(policy="reuse", capacity=2 * S)
    for start in (0, 6, 12):
        buf.plan(*step_inputs(start))
    snap = snapshot_buffer(buf)
    topk, seq = step_inputs(20)
    bad_topk = topk.clone()
    bad_topk[1, 1, 3] = -5
    bad_seq = seq.clone()
    bad_seq[1] = MAX_LEN + 1             # beyond max_context
    I = torch.tensor
    calls = [
        (lambda: buf.plan(bad_topk, seq), r"topk_pos\[row=1, query=1, index=3\] = -5"),
        (lambda: buf.plan(topk, bad_seq), r"seq_lens\[1\] = 65: expected <= max_context = 64"),
        (lambda: buf.plan(topk, seq, check="yes"), r"check: expected None, True or False"),
        (lambda: buf.invalidate(I([3, 4], dtype=I64)), "valid_lens: expected dtype"),
        (lambda: buf.reset([0, 2]), r"rows\[\.\.\.\]: expected <= 1, got 2"),
        (lambda: buf.reset(I([0, -1])), r"rows\[\.\.\.\]: expected >= 0, got -1"),
        (lambda: buf.resize(I([0, 2]), I([S, S])), r"rows\[1\] = 2: expected a row in \[0, 2\)"),
        (lambda: buf.resize(I([0, 1]), I([S, 3])), r"capacities\[1\] = 3: expected a capacity"),
        (lambda: buf.resize(I([0, 0]), I([S, S])), "rows: a row is listed twice"),
        (lambda: buf.resize(I([0, 1], dtype=I32), I([S, S], dtype=torch.int16)),
         "capacities: expected dtype torch.int32 or torch.int64"),
        (lambda: buf.resident(2), "row: expected <= 1, got 2"),
    ]
    for call, needle in calls:
        generation = buf._generation
        with pytest.raises((ValueError, TypeError), match=needle):
            call()
        assert same_buffer(buf, snap), needle
        assert buf._generation == generation, needle


def make_manager(**kwargs):
    args = dict(num_layers=2, max_rows=3, capacity=16, topk=4, queries_per_step=2,
                kv_format="fp32", resident_block_size=8, latent_dim=4, rope_dim=4,
                max_context=64)
    args.update(kwargs)
    mgr = SparseOffloadManager(**args)
    gen = torch.Generator().manual_seed(0)
    host = [tuple(torch.randn(24, 8, 1, c.width, generator=gen) for c in mgr.kv_format.components)
            for _ in range(2)]
    mgr.register_host_kv(host)
    return mgr, host


def manager_snapshot(mgr):
    tensors = [mgr.state_row_of_batch_row, mgr.occupied, mgr.resident_block_table, mgr.h2d_rows,
               mgr.write_through_rows, mgr.residency._drop_from]
    for buf in mgr.buffers:
        tensors += [buf.state, buf.stats_counts]
    for layer in mgr.paged._storage:
        tensors += list(layer)
    for layer in mgr.host_kv:
        tensors += list(layer)
    return ([t.clone() for t in tensors], list(mgr._state_row_host), sorted(mgr.rows.keys()),
            [buf._generation for buf in mgr.buffers], mgr.host_kv)


def same_manager(mgr, snap) -> bool:
    now = manager_snapshot(mgr)
    return (all(torch.equal(a, b) for a, b in zip(now[0], snap[0])) and now[1:4] == snap[1:4]
            and now[4] is snap[4])


def test_manager_methods_change_nothing_when_they_raise():
    mgr, host = make_manager()
    mgr.add(0)
    mgr.add(1)
    bt = (torch.arange(3 * 8, dtype=I32).view(3, 8)) % 24
    qsl = torch.tensor([0, 2, 4], dtype=I32)
    seq = torch.tensor([20, 30], dtype=I32)
    topk = torch.tensor([[[3, 18, -1, -1]], [[19, 2, 1, -1]], [[28, 29, -1, 5]], [[29, 7, 8, 9]]],
                        dtype=I32)
    meta = mgr.begin_step(qsl, seq, bt, 4)
    for layer in range(2):
        mgr.retrieve(layer, topk, meta)
    snap = manager_snapshot(mgr)
    valid = torch.full((3,), 1 << 24, dtype=I32)
    bad_seq = seq.clone()
    bad_seq[1] = -3
    bad_topk = topk.clone()
    bad_topk[3, 0, 2] = 30               # beyond its request's seq_len
    new = [torch.randn(4, 1, 4) for _ in range(2)]
    bad_slots = torch.tensor([5, 6, 24 * 8, 7])
    good_host = [tuple(h.clone() for h in layer) for layer in host]
    calls = [
        (lambda: mgr.invalidate(valid - 25, layers=[0, 5]), r"layers\[1\]: expected <= 1, got 5"),
        (lambda: mgr.invalidate(valid - 25, layers=[1, -1]), r"layers\[1\]: expected >= 0"),
        (lambda: mgr.invalidate(valid - 25, layers=0), "layers: expected None or a list"),
        (lambda: mgr.add(3), "row: expected <= 2, got 3"),
        (lambda: mgr.add(1), "row: batch row 1 already holds a request"),
        (lambda: mgr.free(2), "row: batch row 2 holds no request"),
        (lambda: mgr.move_row(0, 3), "dst: expected <= 2, got 3"),
        (lambda: mgr.swap_rows(1, -1), "b: expected >= 0, got -1"),
        (lambda: mgr.begin_step(qsl, bad_seq, bt, 4), r"seq_lens\[1\] = -3"),
        (lambda: mgr.begin_step(qsl, seq, bt, 2 ** 40), "num_tokens: expected <= 2147483647"),
        (lambda: mgr.retrieve(1, bad_topk, meta), r"topk_indices\[token=3, 0, index=2\] = 30"),
        (lambda: mgr.retrieve(1, topk, meta._replace(seq_lens=seq)),
         r"meta.seq_lens: expected shape \(3,\)"),
        (lambda: mgr.retrieve(2, topk, meta), "layer: expected <= 1, got 2"),
        (lambda: mgr.write_kv(0, bad_slots, new), r"slot_mapping\[2\] = 192: beyond"),
        (lambda: mgr.write_kv(0, bad_slots[:3], new), r"kv\[0\]: expected \[num_tokens = 3"),
        (lambda: mgr.register_host_kv([good_host[0], good_host[1][:1]]),
         r"host_kv\[1\]: expected 2 components"),
        (lambda: mgr.resident_kv(-1), "layer: expected >= 0, got -1"),
    ]
    for call, needle in calls:
        with pytest.raises((ValueError, TypeError), match=needle):
            call()
        assert same_manager(mgr, snap), needle


def test_write_through_manager_retrieve_with_a_bad_new_kv_changes_nothing():
    mgr, _ = make_manager(write_through=True)
    mgr.add(0)
    bt = (torch.arange(3 * 8, dtype=I32).view(3, 8)) % 24
    meta = mgr.begin_step(torch.tensor([0, 2], dtype=I32), torch.tensor([20], dtype=I32), bt, 2)
    topk = torch.tensor([[[3, 18, -1, -1]], [[19, 2, 1, -1]]], dtype=I32)
    snap = manager_snapshot(mgr)
    with pytest.raises(TypeError, match=r"new_kv\[1\]: expected dtype torch.float32"):
        mgr.retrieve(0, topk, meta, new_kv=[torch.randn(2, 1, 4),
                                            torch.randn(2, 1, 4, dtype=torch.float64)])
    assert same_manager(mgr, snap)


# --------------------------------------------------------------------- errors name their argument

@pytest.mark.parametrize("kwargs, error, needle", [
    (dict(device="cuda"), ValueError, r"device: 'cuda' is not available here|device: expected"),
    (dict(device="bogus"), ValueError, r"device: expected a device such as 'cpu' or 'npu:0', "
                                       r"got 'bogus'"),
    (dict(device=3.5), TypeError, "device: expected a device"),
    (dict(device="meta"), ValueError, "device: a buffer needs real memory"),
    (dict(rows=10 ** 6, capacity=2048, topk=64), ValueError,
     r"rows: rows = 1000000 x \d+ B of state per row needs [\d.]+ GiB on cpu, more than"),
    (dict(check="yes"), TypeError, "check: expected None, True or False, got 'yes'"),
])
def test_buffer_constructor_errors_name_the_argument(kwargs, error, needle):
    args = dict(rows=R, capacity=S, topk=K, queries_per_step=T, policy="lifetime")
    args.update(kwargs)
    with pytest.raises(error, match=needle):
        avsg.SparseKVBuffer(**args)


@pytest.mark.parametrize("kwargs, error, needle", [
    (dict(latent_dim=-16), ValueError, "latent_dim: expected >= 1, got -16"),
    (dict(latent_dim=0), ValueError, "latent_dim: expected >= 1, got 0"),
    (dict(rope_dim=0), ValueError, "rope_dim: expected >= 1, got 0"),
    (dict(latent_dim=2 ** 40), ValueError, "latent_dim: expected <= 65536"),
    (dict(check="yes"), TypeError, "check: expected None, True or False, got 'yes'"),
    (dict(write_through="no"), TypeError, "write_through: expected True or False"),
    (dict(auto_invalidate=1), TypeError, "auto_invalidate: expected True or False"),
    (dict(timers=3), TypeError, "timers: expected None or a callable"),
    (dict(kv_format=7), TypeError, "kv_format: expected a format name"),
    (dict(device="bogus"), ValueError, "device: expected a device such as"),
    (dict(topk=0), ValueError, "topk: expected >= 1, got 0"),
    (dict(capacity=2 ** 20), ValueError, "capacity: expected <= 32768"),
    (dict(max_rows=10 ** 6, capacity=8192, topk=64), ValueError,
     r"max_rows: the device KV of num_layers = 2 x max_rows = 1000000 x capacity = 8192 rows "
     r"of fp32 needs [\d.]+ GiB"),
])
def test_manager_constructor_errors_name_the_argument(kwargs, error, needle):
    with pytest.raises(error, match=needle):
        make_manager(**kwargs)


def test_begin_step_refuses_a_pass_too_big_for_memory():
    mgr, _ = make_manager()
    mgr.add(0)
    bt = torch.zeros(1, 8, dtype=I32)
    qsl, seq = torch.tensor([0, 1], dtype=I32), torch.tensor([5], dtype=I32)
    with pytest.raises(ValueError, match="num_tokens: expected <= 2147483647, got 1099511627776"):
        mgr.begin_step(qsl, seq, bt, 2 ** 40)
    with pytest.raises(ValueError, match=r"num_tokens: a pass of num_tokens = 2147483647 needs "
                                         r"[\d.]+ GiB on cpu"):
        mgr.begin_step(qsl, seq, bt, 2 ** 31 - 1)


# ----------------------------------------------------------------------------- resize dtypes

def test_resize_takes_int32_and_int64_alike():
    bufs = [make_buffer(capacity=2 * S) for _ in range(2)]
    for buf in bufs:
        for start in (0, 8, 16):
            buf.plan(*step_inputs(start))
    moves = [buf.resize(torch.tensor([0, 1], dtype=dtype), torch.tensor([S, T * K], dtype=dtype))
             for buf, dtype in zip(bufs, (I32, I64))]
    assert torch.equal(bufs[0].state, bufs[1].state)
    for a, b in zip(moves[0][:4], moves[1][:4]):
        assert torch.equal(a, b)
    assert bufs[0].active_capacity().tolist() == [S, T * K]
    with pytest.raises(ValueError, match=r"capacities\[0\] = 3"):
        bufs[0].resize(torch.tensor([0], dtype=I32), torch.tensor([3], dtype=I32))
