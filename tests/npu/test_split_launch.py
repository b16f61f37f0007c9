"""The split plan's launch on the NPU (op_host/npu/split_launch.h), on CPU: the AVSG_NPU_SPLIT and
AVSG_NPU_SPLIT_TIMEOUT parsing, and the launch config (batch schedule mode, timeout) built against
the acl_rt.h of the torch-npu 2.14.0 wheel when build/typecheck has it (the type-check downloads
it; AVSG_TYPECHECK_REQUIRED=1 makes its absence a failure). Nothing here launches anything: the
config launch has never run on an NPU."""
import os
import re
import shutil
import subprocess

import pytest

from helpers import REPO as ROOT

CHECK = os.path.join(ROOT, "tests", "npu", "split_launch_check.cpp")
ACL_INCLUDE = os.path.join(ROOT, "build", "typecheck", "headers", "torch-npu-2.14.0", "torch_npu", "include")
REQUIRED = os.environ.get("AVSG_TYPECHECK_REQUIRED") == "1"

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")


def run_check(tmp_path, *flags):
    exe = tmp_path / "split_launch_check"
    build = subprocess.run(["g++", "-std=c++17", "-Wall", "-Wextra", "-Werror", f"-I{ROOT}/op_host", *flags,
                            CHECK, "-o", str(exe)], capture_output=True, text=True, timeout=120)
    assert build.returncode == 0, build.stderr[-4000:]
    res = subprocess.run([str(exe)], capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    return dict(re.findall(r"^(\w+)=(.*)$", res.stdout, re.M))


@needs_gxx
def test_split_switch_and_timeout_parsing(tmp_path):
    out = run_check(tmp_path)
    # AVSG_NPU_SPLIT: unset or empty is off in every build, 0 / 1 say it; anything else is an error
    # that names the variable and leaves the result alone
    assert out["switch_unset"] == "off" and out["switch_empty"] == "off"
    assert out["switch_zero"] == "off" and out["switch_one"] == "on"
    for case, value in (("yes_from_off", "yes"), ("yes_from_on", "yes"), ("space", " 1")):
        assert out[f"switch_{case}"] == (f"error AVSG_NPU_SPLIT: expected 0 (plan never splits its lookup) or 1 "
                                         f"(it may), got '{value}'|unchanged=1")
    # AVSG_NPU_SPLIT_TIMEOUT: whole seconds 0..65535 (0: no limit), default 30
    assert out["timeout_unset"] == "30" and out["timeout_empty"] == "30"
    assert out["timeout_zero"] == "0" and out["timeout_five"] == "5" and out["timeout_max"] == "65535"
    assert out["timeout_long"] == "1"
    for case, value in (("over", "65536"), ("negative", "-1"), ("fraction", "1.5"), ("word", "ten"),
                        ("space", " 5")):
        assert out[f"timeout_{case}"] == ("error AVSG_NPU_SPLIT_TIMEOUT: expected whole seconds in 0..65535 "
                                          f"(0: no limit; default 30), got '{value}'|unchanged=1"), case
    assert "cfg_attrs" not in out   # the CANN half is compiled only with AVSG_NPU_LAUNCH_CONFIG


@needs_gxx
def test_launch_config_is_batch_mode_and_the_timeout(tmp_path):
    if not os.path.exists(os.path.join(ACL_INCLUDE, "acl", "acl_rt.h")):
        if REQUIRED:
            pytest.fail(f"no acl/acl_rt.h under {ACL_INCLUDE}")
        pytest.skip(f"the torch-npu 2.14.0 headers are not in {ACL_INCLUDE} "
                    "(python scripts/typecheck_ascendc.py --fetch-only)")
    out = run_check(tmp_path, "-DAVSG_NPU_LAUNCH_CONFIG=1", "-isystem", ACL_INCLUDE)
    assert out["cfg_attrs"] == "2"
    # ids as acl_rt.h numbers them: SCHEM_MODE = 1, TIMEOUT = 7 (seconds; TIMEOUT_US = 8 is not set,
    # the runtime rejects both at once)
    assert out["cfg_schem_mode"] == "1 id=1"
    assert out["cfg_timeout"] == "45 id=7"
    assert "cfg_other" not in out
    assert out["cfg_attrs_inside"] == "1"
    assert out["args_bytes"] == str(11 * 8)
    # the binary is loaded as the ascendc_library stub loads an AIV-only kernel's ELF:
    # ACL_RT_BINARY_LOAD_OPT_MAGIC (2) = ACL_RT_BINARY_MAGIC_ELF_VECTOR_CORE
    assert out["load_options"] == "1 type=2 magic=0x41415246"


def test_the_split_args_follow_the_kernel_entry():
    """PlanSplitArgs is the argument block of avsg_plan: one pointer per parameter, in order."""
    entry = open(os.path.join(ROOT, "op_kernel", "plan.cpp")).read()
    params = re.search(r"void avsg_plan\(([^)]*)\)", entry).group(1)
    names = [p.split()[-1] for p in params.split(",")]
    header = open(os.path.join(ROOT, "op_host", "npu", "split_launch.h")).read()
    fields = re.findall(r"^\s+void\* (\w+);", re.search(r"struct PlanSplitArgs \{(.*?)\};", header, re.S).group(1),
                        re.M)
    assert fields == names
    host = open(os.path.join(ROOT, "op_host", "plan_host.cpp")).read()
    launch = re.search(r"npu::PlanSplitArgs args\{(.*?)\};", host, re.S).group(1)
    order = [re.match(r"\s*(\w+)\.data_ptr\(\)", a).group(1) for a in launch.split(",")]
    assert order == ["topk_pos", "seq_lens", "valid_lens", "state", "stats", "slots", "miss_pos", "miss_slots",
                     "miss_counts", "workspace", "tl"]
    # the stub launch (kernel_launch.h's LaunchKernel: tensors, then the tiling) passes the same
    # tensors in the same order
    stub = re.search(r"LaunchKernel\(op, .*?AVSG_KERNEL\(avsg_plan, plan\),\s*blockDim, tiling, (.*?)\);", host,
                     re.S).group(1)
    assert [a.strip() for a in stub.split(",")] + ["tl"] == order


def test_doctor_names_the_same_variables_and_default():
    from avsg.commands import doctor
    header = open(os.path.join(ROOT, "op_host", "npu", "split_launch.h")).read()
    assert int(re.search(r"kDefaultSplitTimeoutSeconds = (\d+);", header).group(1)) == doctor.DEFAULT_SPLIT_TIMEOUT
    assert f'kSplitEnv = "{doctor.SPLIT_ENV}"' in header
    assert f'kSplitTimeoutEnv = "{doctor.SPLIT_TIMEOUT_ENV}"' in header
