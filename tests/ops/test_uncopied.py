"""No position is resident unless its bytes were copied (a plan's misses whose gather never ran).

``plan`` reserves a slot for every miss before any byte moves. Whatever the caller does next (a
refused gather, an exception and no gather at all, another plan, invalidate, reset, resize, a
second thread), no later plan may count those positions as hits unless a copy filled their
slots. Every step below checks what attention would read: ``kv[r, slots[r, t, k]]`` equals the
host's row of ``topk_pos[r, t, k]``, byte for byte.
"""
from __future__ import annotations

import random
import threading

import pytest
import torch

import avsg
from avsg import reference
from helpers.gather_cases import kv_zeros

I32 = torch.int32
R, T, K, S, D = 2, 2, 4, 16, 4
MAX_LEN = 64
POLICIES = ("lifetime", "reuse", "lru")


def make_buffer(policy, **kwargs):
    args = dict(rows=R, capacity=S, topk=K, queries_per_step=T, policy=policy)
    if policy == "reuse":
        args["max_context"] = MAX_LEN
    args.update(kwargs)
    return avsg.SparseKVBuffer(**args)


def selection(rng: random.Random, low: int = 0, high: int = 24):
    """[R, T, K] distinct positions per query token (a narrow window: plenty of reuse)."""
    rows = [[rng.sample(range(low, high), K) for _ in range(T)] for _ in range(R)]
    return torch.tensor(rows, dtype=I32), torch.full((R,), MAX_LEN, dtype=I32)


def assert_reads_host(plan, topk, host, kv, where=""):
    for r in range(R):
        for t in range(T):
            for k in range(K):
                pos = int(topk[r, t, k])
                if pos < 0:
                    continue
                slot = int(plan.slots[r, t, k])
                assert torch.equal(kv[r, slot], host[r, pos]), \
                    f"{where}: row {r} query {t} pos {pos} reads slot {slot}: stale bytes"


@pytest.mark.parametrize("policy", POLICIES)
def test_refused_gather_then_the_same_step_again_reads_exact_bytes(policy):
    """The review's one-thread reproducer: gather into a pool too short (a clear error), the
    user fixes the pool and plans the same selection again: it misses again and reads exact
    bytes (before: 0 misses, stale reads)."""
    buf = make_buffer(policy)
    host = torch.randn(R, MAX_LEN, D)
    kv = kv_zeros(R, S, D)
    topk, seq = selection(random.Random(1))
    plan = buf.plan(topk, seq)
    misses = plan.miss_counts.clone()
    with pytest.raises(ValueError, match=r"max_len.*; the buffer dropped this plan's misses"):
        avsg.gather(plan, host[:, :4].contiguous(), kv)
    again = buf.plan(topk, seq)
    assert torch.equal(again.miss_counts, misses), "the unfetched misses still counted as hits"
    avsg.gather(again, host, kv)
    assert_reads_host(again, topk, host, kv, "after the refusal")
    buf.check_state()


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("between", ["plan", "invalidate", "reset_other_row", "resize",
                                     "nothing_then_plan"])
def test_a_plan_never_gathered_is_dropped_by_the_next_call(policy, between):
    """An exception between plan and gather (or a caller that forgot it): whatever the buffer's
    next call is, the positions are not hits afterwards."""
    buf = make_buffer(policy)
    host = torch.randn(R, MAX_LEN, D)
    kv = kv_zeros(R, S, D)
    rng = random.Random(2)
    topk, seq = selection(rng)
    avsg.gather(buf.plan(topk, seq), host, kv)          # something resident and copied
    topk2, _ = selection(rng, 8, 32)
    lost = buf.plan(topk2, seq)                          # its gather never happens
    assert int(lost.miss_counts.sum()) > 0
    if between == "plan":
        avsg.gather(buf.plan(topk, seq), host, kv)
    elif between == "invalidate":
        buf.invalidate(torch.full((R,), MAX_LEN, dtype=I32))      # drops nothing by itself
    elif between == "reset_other_row":
        buf.reset(torch.tensor([False] * (R - 1) + [True]))
    elif between == "resize":
        avsg.apply_moves(buf.resize(torch.tensor([0]), torch.tensor([S])), kv)
    again = buf.plan(topk2, seq)
    avsg.gather(again, host, kv)
    assert_reads_host(again, topk2, host, kv, between)
    buf.check_state()


@pytest.mark.parametrize("policy", POLICIES)
def test_unapplied_moves_are_dropped(policy):
    """resize's moves are the same hazard: the moved positions' new slots hold nothing until
    apply_moves copies them."""
    buf = make_buffer(policy, capacity=24)
    host = torch.randn(R, MAX_LEN, D)
    kv = kv_zeros(R, 24, D)
    rng = random.Random(3)
    for _ in range(6):                                   # fill the rows past slot 16
        topk, seq = selection(rng, 0, 40)
        avsg.gather(buf.plan(topk, seq), host, kv)
    moves = buf.resize(torch.tensor([0, 1]), torch.tensor([T * K, T * K]))
    assert int(moves.miss_counts.sum()) > 0, "the case needs moves"
    # apply_moves never runs; the next plans must not hit the moved positions
    for step in range(6):
        topk, seq = selection(rng, 0, 40)
        plan = buf.plan(topk, seq)
        avsg.gather(plan, host, kv)
        assert_reads_host(plan, topk, host, kv, f"step {step} after unapplied moves")
    buf.check_state()


@pytest.mark.parametrize("policy", POLICIES)
def test_refused_apply_moves_drops_the_moved_entries(policy):
    buf = make_buffer(policy, capacity=24)
    host = torch.randn(R, MAX_LEN, D)
    kv = kv_zeros(R, 24, D)
    rng = random.Random(4)
    for _ in range(6):
        topk, seq = selection(rng, 0, 40)
        avsg.gather(buf.plan(topk, seq), host, kv)
    moves = buf.resize(torch.tensor([0, 1]), torch.tensor([T * K, T * K]))
    held = [set(buf.resident(r)) for r in range(R)]
    with pytest.raises(ValueError, match="dropped this plan's moved entries"):
        avsg.apply_moves(moves, kv_zeros(R, 12, D))      # wrong shape: refused
    for r in range(R):
        moved_from = set(moves.miss_pos[r, :int(moves.miss_counts[r])].tolist())
        assert moved_from, "the case needs moves in every row"
        assert len(buf.resident(r)) == len(held[r]) - len(moved_from)
    buf.check_state()


@pytest.mark.parametrize("policy", POLICIES)
def test_a_plan_gathered_once_then_refused_for_other_tensors_is_dropped(policy):
    """k gathered, v refused: v's slots were never filled, so the plan's misses go."""
    buf = make_buffer(policy)
    host_k, host_v = torch.randn(R, MAX_LEN, D), torch.randn(R, MAX_LEN, D)
    kv_k, kv_v = kv_zeros(R, S, D), kv_zeros(R, S, D)
    rng = random.Random(5)
    topk, seq = selection(rng)
    plan = buf.plan(topk, seq)
    avsg.gather(plan, host_k, kv_k)
    with pytest.raises(ValueError, match="dropped this plan's misses"):
        avsg.gather(plan, host_v[:, :2].contiguous(), kv_v)
    again = buf.plan(topk, seq)
    assert torch.equal(again.miss_counts, plan.miss_counts)
    avsg.gather(again, [host_k, host_v], [kv_k, kv_v])
    assert_reads_host(again, topk, host_v, kv_v, "v after the refusal")


@pytest.mark.parametrize("policy", POLICIES)
def test_alternating_callers_never_read_stale_bytes(policy):
    """The review's two-thread reproducer, as a seeded schedule: two callers share one buffer,
    their calls never overlap, and one of them sometimes plans without gathering or gathers a
    plan another caller superseded. Every gather that succeeds leaves exact bytes."""
    buf = make_buffer(policy)
    host = torch.randn(R, MAX_LEN, D)
    kv = kv_zeros(R, S, D)
    rng = random.Random(6)
    plans = {}
    checked = refused = 0
    for step in range(300):
        caller = rng.choice("ab")
        action = rng.random()
        if action < 0.45 or caller not in plans:
            topk, seq = selection(rng, 0, 40)
            plans[caller] = (buf.plan(topk, seq), topk)
        elif action < 0.9:
            plan, topk = plans.pop(caller)
            try:
                avsg.gather(plan, host, kv)
            except ValueError as e:
                assert "superseded" in str(e) and "dropped" in str(e)
                refused += 1
                continue
            assert_reads_host(plan, topk, host, kv, f"step {step}")
            checked += 1
        else:
            host.add_(1.0)          # the host KV changes: whatever the buffer keeps must follow
            buf.reset()
    assert checked > 30 and refused > 10


@pytest.mark.parametrize("policy", POLICIES)
def test_two_threads_refused_gathers_never_leave_stale_bytes(policy):
    """Real threads, calls never overlapping: the main thread hands each call to its thread and
    waits for it to finish. Per round thread A plans, thread B plans and gathers, then A gathers
    its superseded plan (refused). B's steps always read exact bytes."""
    buf = make_buffer(policy)
    host = torch.randn(R, MAX_LEN, D)
    kv = kv_zeros(R, S, D)
    errors, stale = [], []

    class Worker(threading.Thread):
        def __init__(self, name, seed):
            super().__init__(name=name, daemon=True)      # never holds up the interpreter
            self.rng, self.plan, self.topk = random.Random(seed), None, None
            self.go, self.done, self.action = threading.Event(), threading.Event(), None

        def call(self, action):
            self.action = action
            self.done.clear()
            self.go.set()
            assert self.done.wait(60), f"{self.name}: {action} did not finish"

        def run(self):
            while self.go.wait(120):
                self.go.clear()
                if self.action == "stop":
                    self.done.set()
                    return
                try:
                    if self.action in ("plan", "step"):
                        self.topk, seq = selection(self.rng, 0, 40)
                        self.plan = buf.plan(self.topk, seq)
                    if self.action in ("gather", "step"):
                        avsg.gather(self.plan, host, kv)
                        try:
                            assert_reads_host(self.plan, self.topk, host, kv, self.name)
                        except AssertionError as e:
                            stale.append(str(e))
                except ValueError as e:
                    errors.append((self.name, str(e)))
                finally:
                    self.done.set()

    a, b = Worker("a", 7), Worker("b", 8)
    a.start(), b.start()
    try:
        for _ in range(40):
            a.call("plan")
            b.call("step")
            a.call("gather")
    finally:
        for worker in (a, b):
            if worker.is_alive():
                worker.call("stop")
    assert not stale, stale[:3]
    assert len(errors) == 40 and all(name == "a" and "superseded" in e and "dropped" in e
                                     for name, e in errors)


@pytest.mark.parametrize("policy", POLICIES)
def test_mark_copied_keeps_what_the_caller_copied(policy):
    buf = make_buffer(policy)
    rng = random.Random(9)
    topk, seq = selection(rng)
    plan = buf.plan(topk, seq)
    buf.mark_copied(plan)                                # copied by the caller's own kernel
    again = buf.plan(topk, seq)
    assert int(again.miss_counts.sum()) == 0
    with pytest.raises(ValueError, match="plan: superseded"):
        buf.mark_copied(plan)
    with pytest.raises(ValueError, match="another buffer"):
        make_buffer(policy).mark_copied(again)
    with pytest.raises(TypeError, match="plan: expected avsg.Plan"):
        buf.mark_copied("plan")


def test_track_copies_off_keeps_the_misses_of_a_plan_never_gathered():
    """A buffer holding no KV (trace replays): residency from the plan on, as documented."""
    buf = make_buffer("lifetime", track_copies=False)
    topk, seq = selection(random.Random(10))
    buf.plan(topk, seq)
    assert int(buf.plan(topk, seq).miss_counts.sum()) == 0
    with pytest.raises(TypeError, match="track_copies"):
        make_buffer("lifetime", track_copies=1)


@pytest.mark.parametrize("policy", POLICIES)
def test_drop_entries_frees_exactly_the_named_entries_still_held(policy):
    buf = make_buffer(policy, track_copies=False)
    topk, seq = selection(random.Random(11))
    plan = buf.plan(topk, seq)
    before = {r: buf.resident(r) for r in range(R)}
    slots = plan.miss_slots.clone()
    positions = plan.miss_pos.clone()
    positions[0, 0] += 1                          # no longer what slot miss_slots[0, 0] holds
    slots[1, 1] = S + 5                           # names nothing
    reference.drop_entries(buf.state, buf.layout, slots, positions)
    for r in range(R):
        n = int(plan.miss_counts[r])
        gone = {int(p) for j, p in enumerate(plan.miss_pos[r, :n].tolist())
                if not (r == 0 and j == 0) and not (r == 1 and j == 1)}
        assert set(buf.resident(r)) == set(before[r]) - gone
    buf.check_state()


def test_a_copy_of_replaced_miss_lists_does_not_count_as_the_plans():
    """A gather of ``plan._replace(miss_counts=fewer)`` copied part of the misses: the plan stays
    uncopied (its next call drops it) until mark_copied says the rest was copied."""
    buf = make_buffer("lifetime")
    host = torch.randn(R, MAX_LEN, D)
    kv = kv_zeros(R, S, D)
    topk, seq = selection(random.Random(12))
    plan = buf.plan(topk, seq)
    avsg.gather(plan._replace(miss_counts=plan.miss_counts - 1), host, kv)
    again = buf.plan(topk, seq)
    assert torch.equal(again.miss_counts, plan.miss_counts), "a partial copy counted as whole"
    avsg.gather(again._replace(miss_counts=again.miss_counts.clone()), host, kv)
    buf.mark_copied(again)
    assert int(buf.plan(topk, seq).miss_counts.sum()) == 0


def test_plans_never_copied_warn_once():
    buf = make_buffer("lru")
    topk, seq = selection(random.Random(13))
    with pytest.warns(UserWarning, match="3 plans in a row were never copied"):
        for _ in range(6):
            buf.plan(topk, seq)


def test_an_op_that_fails_after_writing_forgets_every_row():
    """An op that fails past its argument checks may have reserved slots no copy will fill:
    the buffer resets every row rather than keep them."""
    buf = make_buffer("lifetime", track_copies=False)
    topk, seq = selection(random.Random(14))
    buf.plan(topk, seq)
    assert buf.resident(0)

    def fails_midway(*args):
        raise RuntimeError("device error")

    with pytest.raises(RuntimeError, match="device error"):
        buf._apply(fails_midway)
    assert not buf.resident(0) and not buf.resident(1)
    buf.check_state()


def test_num_cores_from_the_environment_is_checked_where_used(monkeypatch):
    from avsg import buffer
    for text in ("abc", "0", "\u00b2", "-3"):
        monkeypatch.setenv("AVSG_NUM_CORES", text)
        cores, error = buffer._cores_from_environment()
        assert cores == buffer.DEFAULT_NUM_CORES and error.startswith(f"AVSG_NUM_CORES={text!r}")
    monkeypatch.setenv("AVSG_NUM_CORES", " 12 ")
    assert buffer._cores_from_environment() == (12, None)
    monkeypatch.setattr(buffer, "_num_cores_error", "AVSG_NUM_CORES='abc': expected")
    with pytest.raises(ValueError, match="AVSG_NUM_CORES='abc'"):
        avsg.get_num_cores()


@pytest.mark.parametrize("policy", POLICIES)
def test_discard_drops_a_plan_the_callers_copy_failed(policy):
    """A caller with its own copy kernel marks a plan copied per tensor it fills; when a later
    copy of the same plan (another layer's buffer, say) fails, discard drops it again."""
    buf = make_buffer(policy)
    topk, seq = selection(random.Random(15))
    plan = buf.plan(topk, seq)
    buf.mark_copied(plan)                     # the first tensor's copy
    buf.discard(plan)                         # the second one failed
    again = buf.plan(topk, seq)
    assert torch.equal(again.miss_counts, plan.miss_counts)
    buf.discard(plan)                         # superseded: still drops by (slot, position)
    with pytest.raises(ValueError, match="another buffer"):
        make_buffer(policy).discard(again)
    buf.check_state()
