"""Fixed shapes, no host sync: a decode step calling the ops traces with fullgraph=True and
matches eager execution step for step (invariant 7)."""
import pytest
import torch

import avsg
from avsg import reference
from helpers.gather_cases import kv_zeros

R, T, K, S, D = 2, 2, 8, 32, 4
BACKEND = "inductor"


def decode_step(buf, topk_pos, seq_lens, host, device_kv, valid_lens, check=False):
    plan = buf.plan(topk_pos, seq_lens, check=check)
    per_core = avsg.gather(plan, host, device_kv, num_cores=4, check=check)
    rows = torch.arange(R)[:, None, None]
    attended = device_kv[rows, plan.slots.clamp(min=0).long()]  # what attention would read
    buf.invalidate(valid_lens)
    return plan.slots, plan.miss_counts, per_core, attended


@pytest.mark.parametrize("check", [False, None, True], ids=["check=False", "default", "check=True"])
def test_compiled_decode_step_matches_eager(check):
    """The value checks (default on for CPU) are skipped while tracing: fullgraph still holds."""
    torch._dynamo.reset()
    eager_buf = avsg.SparseKVBuffer(rows=R, capacity=S, topk=K, queries_per_step=T, max_context=64)
    graph_buf = avsg.SparseKVBuffer(rows=R, capacity=S, topk=K, queries_per_step=T, max_context=64)
    host = torch.randn(R, 64, D)
    eager_kv, graph_kv = kv_zeros(R, S, D), kv_zeros(R, S, D)
    step = torch.compile(decode_step, fullgraph=True, backend=BACKEND)
    gen = torch.Generator().manual_seed(3)
    for i in range(4):
        seq = torch.full((R,), 40 + i, dtype=torch.int32)
        topk = torch.stack([torch.stack([torch.randperm(24, generator=gen)[:K] + 16 + i
                                         for _ in range(T)]) for _ in range(R)]).to(torch.int32)
        valid = seq - 1
        want = decode_step(eager_buf, topk, seq, host, eager_kv, valid, check)
        got = step(graph_buf, topk, seq, host, graph_kv, valid, check)
        for a, b in zip(want, got):
            assert torch.equal(a, b)
        assert torch.equal(eager_buf.state, graph_buf.state)
        assert torch.equal(eager_kv, graph_kv)
    assert int(graph_buf.stats_counts[:, 1].sum()) > 0, "the compiled steps must have hit"


def test_compiled_step_still_gets_the_ops_own_checks():
    """Skipped Python value checks do not open a hole: the op checks the state header itself."""
    torch._dynamo.reset()
    buf = avsg.SparseKVBuffer(rows=R, capacity=S, topk=K, queries_per_step=T, max_context=64)
    step = torch.compile(lambda b, t, s: b.plan(t, s).slots, fullgraph=True, backend=BACKEND)
    topk = torch.arange(T * K, dtype=torch.int32).view(1, T, K).repeat(R, 1, 1)
    seq = torch.full((R,), 64, dtype=torch.int32)
    step(buf, topk, seq)
    buf.lifetime = 3          # the state was built with the default
    with pytest.raises(Exception, match=f"lifetime: the state was built with {reference.DEFAULT_LIFETIME}, got 3"):
        step(buf, topk, seq)
