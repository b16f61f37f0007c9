"""The NPU host code, compiled as the NPU library compiles it (AVSG_WITH_NPU, no emulation), against
declaration-only stand-ins for the CANN / torch_npu headers (tests/npu/npu_stubs, see its README).

What this catches without CANN: syntax and type errors in the NPU launch paths, and a translation
unit that would register CPU kernels or define schemas again in the NPU library; loading such a
library next to the CPU one aborts the process (double registration in a static initializer).
It cannot tell whether the real SDK declares these APIs this way.
"""
import os

import pytest

from helpers import REPO as ROOT
from helpers.npu import NPU_HOST_FILES, STUBS, compile_npu_unit  # noqa: F401


@pytest.mark.parametrize("path", NPU_HOST_FILES)
def test_npu_unit_compiles_and_registers_only_npu_kernels(path):
    result = compile_npu_unit(path, "-E")
    assert result.returncode == 0, result.stderr[-3000:]
    registrations = [line for line in result.stdout.splitlines() if "TORCH_LIBRARY" in line
                     or "static_init_avsg" in line]
    assert not any("static_init_avsg_CPU" in line for line in registrations), \
        f"{path} registers CPU kernels in the NPU library"
    assert "TORCH_LIBRARY_FRAGMENT_static_init_avsg" not in result.stdout or \
        path.endswith("host_pool.cpp"), f"{path} defines schemas in the NPU library"
    result = compile_npu_unit(path, "-fsyntax-only")
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.mark.parametrize("path", ["op_host/plan_host.cpp", "op_host/reset_host.cpp", "op_host/state_host.cpp",
                                  "op_host/calibrate_host.cpp", "op_host/plan_gather_host.cpp",
                                  "op_host/gather_host.cpp"])
def test_host_refuses_both_or_neither_backend(path):
    for flags in (["-UAVSG_WITH_NPU"], ["-DAVSG_CPU_EMULATION=1"]):
        result = compile_npu_unit(path, "-fsyntax-only", *flags)
        assert result.returncode != 0 and "exactly one of" in result.stderr


def test_every_kernel_entry_has_a_launch_stub_and_an_npu_launch():
    """The NPU build globs op_kernel/*.cpp, so a new kernel is compiled by ascendc_library without
    a CMake edit; its generated aclrtlaunch_<name>.h must then have a stand-in here and an
    including host file (else the NPU op library would not register it)."""
    import glob
    import re
    host = "".join(open(p).read() for p in glob.glob(os.path.join(ROOT, "op_host", "*.cpp")))
    entries = []
    for path in glob.glob(os.path.join(ROOT, "op_kernel", "*.cpp")):
        entries += re.findall(r'extern "C" __global__ __aicore__ void (\w+)\(', open(path).read())
    assert "avsg_calibrate" in entries
    # entries launched on the NPU only from a kernel binary of their own, with the batch
    # schedule mode (they wait across cores): npu/split_launch.h names them
    config_only = set(re.findall(r'constexpr const char\* k\w+Entry = "(\w+)"',
                                 open(os.path.join(ROOT, "op_host", "npu", "split_launch.h")).read()))
    assert "avsg_plan_gather" in config_only
    for name in entries:
        assert os.path.exists(os.path.join(STUBS, f"aclrtlaunch_{name}.h")), name
        # launched by kernel_launch.h's LaunchKernel in the CPU library, and the NPU library's
        assert f"AVSG_KERNEL({name}," in host, name
        assert f'#include "aclrtlaunch_{name}.h"' in host or name in config_only, name
