"""The gather kernel built by CANN and run on an Ascend NPU, against the reference on CPU.

Same cases as tests/kernels/test_kernel_gather.py (every partition, core counts, contiguous and paged
pools, dtypes, row widths, several pairs, entries outside the pool), with the plan and the buffers
on the NPU and the host pool either registered host memory (aclrtHostRegister, the product's
setting) or a device tensor. Skips, saying why, without torch_npu, without a visible NPU, or when
the NPU backend was not built (scripts/build_npu.sh).
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings

from avsg import backend, reference

from helpers.gather_cases import ROW_MENU, Case, cases, make_case, run_reference, same_bytes
from helpers.npu import npu_skip_reason

pytestmark = pytest.mark.npu


SKIP_REASON = npu_skip_reason()
if SKIP_REASON:
    pytest.skip(SKIP_REASON, allow_module_level=True)

DEVICE = "npu"
_registered = []   # host pools registered by this module (kept alive until the end)


def host_pool_copy(t: torch.Tensor) -> torch.Tensor:
    pool = backend.alloc_host_pool(t.shape, t.dtype)
    pool.copy_(t)
    backend.register_host_pool(pool)
    _registered.append(pool)
    return pool


@pytest.fixture(scope="module", autouse=True)
def _unregister_pools():
    yield
    torch.npu.synchronize()
    for pool in _registered:
        backend.unregister_host_pool(pool)
    _registered.clear()


def run_npu(case: Case, src_kind: str):
    """The case on the NPU; returns (per-core counts, destination buffers) back on the CPU."""
    to = lambda t: None if t is None else t.to(DEVICE)  # noqa: E731
    if src_kind == "host":
        srcs = [host_pool_copy(s) for s in case.srcs]
    else:
        srcs = [s.to(DEVICE) for s in case.srcs]
    dsts = [d.to(DEVICE) for d in case.dsts]
    counts = torch.ops.avsg.gather(to(case.miss_pos), to(case.miss_slots), to(case.miss_counts),
                                   srcs, dsts, to(case.block_table), case.block_size,
                                   case.partition, case.cores)
    torch.npu.synchronize()
    return counts.cpu(), [d.cpu() for d in dsts]


def check_on_npu(case: Case, src_kind: str):
    want_dst = [d.clone() for d in case.dsts]
    want = run_reference(case, want_dst)
    got, got_dst = run_npu(case, src_kind)
    assert torch.equal(got, want), f"per-core counts {got.tolist()} != reference {want.tolist()}"
    for i, (g, w) in enumerate(zip(got_dst, want_dst)):
        assert same_bytes(g, w), f"dst[{i}] differs from the reference"


@pytest.mark.parametrize("src_kind", ["host", "device"])
@pytest.mark.parametrize("partition", reference.PARTITIONS)
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_mla_row_formats_on_npu(src_kind, partition, paged):
    formats = [(torch.bfloat16, (576,)), (torch.bfloat16, (512,)), (torch.bfloat16, (64,)),
               (torch.uint8, (656,))]
    case = make_case(7, R=4, N=2 * 16, S=40, formats=formats, paged=paged, partition=partition,
                     cores=40, max_len=64, block_size=16)   # 910B3/B4: 40 AIV cores
    check_on_npu(case, src_kind)


@pytest.mark.parametrize("fmt", ROW_MENU, ids=lambda f: f"{f[0]}-{f[1]}")
def test_row_widths_on_npu(fmt):
    case = make_case(31, R=3, N=12, S=16, formats=[fmt], paged=True, partition="miss", cores=8)
    check_on_npu(case, "host")


@pytest.mark.parametrize("cores", [1, 2, 7, 20, 40])
@pytest.mark.parametrize("partition", reference.PARTITIONS)
def test_core_counts_on_npu(cores, partition):
    case = make_case(37, R=5, N=24, S=30, formats=[(torch.float16, (8,)), (torch.uint8, (3,))],
                     paged=False, partition=partition, cores=cores)
    check_on_npu(case, "host")


def test_wide_rows_and_many_pairs_on_npu():
    case = make_case(3, R=2, N=4, S=6, formats=[(torch.float32, (20000,))] + ROW_MENU[:8],
                     paged=False, partition="miss", cores=3, max_len=8)
    check_on_npu(case, "host")


def test_unregistered_host_pool_is_rejected():
    case = make_case(41, R=2, N=4, S=6, formats=[(torch.float32, (4,))], paged=False,
                     partition="miss", cores=2)
    dsts = [d.to(DEVICE) for d in case.dsts]
    with pytest.raises(ValueError, match="register_host_pool"):
        torch.ops.avsg.gather(case.miss_pos.to(DEVICE), case.miss_slots.to(DEVICE),
                              case.miss_counts.to(DEVICE), case.srcs, dsts, None, 0, "miss", 2)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_npu_matches_reference_hypothesis(case):
    check_on_npu(case, "host")
