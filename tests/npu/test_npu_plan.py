"""The plan / plan_dual_pointer / invalidate / reset kernels built by CANN and run on an Ascend
NPU, against the reference on CPU: every output, the whole state and the stats after every step.
Same cases as tests/kernels/test_kernel_plan.py; skips, saying why, without torch_npu, without a visible
NPU, or when the NPU backend was not built (scripts/build_npu.sh).
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from avsg import reference

from helpers.npu import npu_skip_reason
from helpers.plan_cases import I32, Twin, colliding, draw, geometry, run_session, session

pytestmark = pytest.mark.npu
SKIP_REASON = npu_skip_reason()
if SKIP_REASON:
    pytest.skip(SKIP_REASON, allow_module_level=True)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(geometry, session, st.integers(0, 2**31 - 1), st.sampled_from(["hash", "dual_pointer"]))
def test_random_sessions_on_npu(geo, ops, seed, matcher):
    R, T, K, ratio, hmul, L = geo
    S = max(T * K, int(T * K * ratio))
    H = min(reference.MAX_BUCKETS, max(64, reference.default_buckets(S) * hmul // 2, S))
    run_session(Twin(R, S, H, L, matcher, device="npu"), ops, seed, R, T, K, S)


@pytest.mark.parametrize("matcher", ["hash", "dual_pointer"])
def test_collision_families_on_npu(matcher):
    T, K, H = 4, 16, 64
    S = T * K
    twin = Twin(2, S, H, 2, matcher, device="npu")
    seq = torch.full((2,), reference.MAX_POSITION, dtype=I32)
    fam = torch.tensor([colliding(H, 3 * S, base=b) for b in (5, 9)], dtype=I32).flatten()
    gen = torch.Generator().manual_seed(5)
    for step in range(8):
        twin.plan(torch.stack([fam[torch.randperm(fam.numel(), generator=gen)[:S]].view(T, K)
                               for _ in range(2)]), seq)
        if step % 3 == 2:
            twin.invalidate(fam[torch.randint(0, fam.numel(), (2,), generator=gen)])


@pytest.mark.parametrize("matcher", ["hash", "dual_pointer"])
def test_real_size_on_npu(matcher):
    R, T, K, S, H, L = 4, 1, 2048, 8192, 16384, 16
    twin = Twin(R, S, H, L, matcher, device="npu")
    gen = torch.Generator().manual_seed(11)
    seq = torch.full((R,), 32768, dtype=I32)
    for _ in range(6):
        twin.plan(draw(gen, R, T, K, seq, hot=3 * K, pad=0.0, repeat=0.0, wild=0.0), seq)
        seq += 1
