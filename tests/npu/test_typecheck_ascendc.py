"""The kernels and the NPU host code type-check against the real AscendC and torch-npu headers
(scripts/typecheck_ascendc.py), and the check rejects a wrong API call.

Needs the asc-devkit and asc-tools source trees in the third-party cache
($AVSG_THIRD_PARTY/<tree>/<commit>/, default ~/.cache/avsg/third_party; scripts/third_party.py,
docs/testing.md); skips naming the missing tree and folder without them. The host half also needs
the torch / torch-npu 2.14.0 wheels' headers, which `python scripts/typecheck_ascendc.py
--fetch-only` downloads into build/typecheck (.ci/run does when it finds the trees, and sets
AVSG_TYPECHECK_REQUIRED=1 so that a missing piece fails instead of skipping). This file is the
only place CI runs the check.
"""
import os
import re
import subprocess
import sys

import pytest

from helpers import third_party

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "typecheck_ascendc.py")
WORK = os.path.join(ROOT, "build", "typecheck")
FIXTURES = os.path.join(ROOT, "tests", "npu", "typecheck_fixtures")
REQUIRED_BY = "AVSG_TYPECHECK_REQUIRED"
REQUIRED = os.environ.get(REQUIRED_BY) == "1"

sys.path.insert(0, os.path.join(ROOT, "scripts"))
import typecheck_ascendc as tc  # noqa: E402



@pytest.fixture
def sdk_trees():
    """The script finds the trees itself ($AVSG_THIRD_PARTY is inherited); this only skips, or
    fails under AVSG_TYPECHECK_REQUIRED=1, when they are missing."""
    return third_party.require(*tc.SDK_TREES, required_by=REQUIRED_BY)


def run(*args):
    return subprocess.run([sys.executable, SCRIPT, "--work", WORK, *args], capture_output=True, text=True,
                          timeout=900)


def host_headers_present():
    return all(os.path.exists(os.path.join(WORK, "headers", d, ".unpacked"))
               for d in (f"torch-{tc.TORCH_VERSION}", f"torch-npu-{tc.TORCH_NPU_VERSION}"))


@pytest.mark.usefixtures("sdk_trees")
def test_kernels_and_npu_host_code_typecheck_clean_against_the_real_headers():
    """Every op_kernel/*.cpp for every targeted arch, ASCENDC_DUMP=1 and 0; and, when the
    wheels' headers are there, every NPU host source with -DAVSG_WITH_NPU=1 and C++20."""
    with_host = REQUIRED or host_headers_present()
    result = run() if with_host else run("--kernels-only")
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-8000:]
    assert "clean: 0 errors, 0 warnings in our files" in result.stdout
    for tu in tc.kernel_sources():
        for dump in tc.DUMP_MODES:
            assert f"kernel {os.path.relpath(tu, ROOT)} arch 2201 ASCENDC_DUMP={dump}: ok" in result.stdout
    if with_host:
        for src in tc.npu_host_sources():
            rel = re.escape(os.path.relpath(src, ROOT))
            assert re.search(rf"host {rel} \(torch [^)]*\): ok", result.stdout), out
            if tc.LAUNCH_CONFIG_MACRO in open(src).read():
                assert re.search(rf"host {rel} \(torch [^)]*\) without {tc.LAUNCH_CONFIG_MACRO}: ok", result.stdout), out
    else:
        pytest.skip("kernels clean; host half skipped: the torch/torch-npu 2.14.0 headers are not in "
                    f"{WORK} (python scripts/typecheck_ascendc.py --fetch-only)")


@pytest.mark.usefixtures("sdk_trees")
def test_a_wrong_or_misspelt_api_call_fails_the_check():
    """The negative control: next to a good kernel, one with a wrong DataCopyParams field and one
    with a misspelt API. The misspelt name must not have been stubbed."""
    good, wrong, misspelt = (os.path.join(FIXTURES, f) for f in
                             ("good_kernel.cpp", "wrong_api_call.cpp", "misspelt_api.cpp"))
    result = run("--kernels-only", "--dump", "1", "--kernel-tu", good, "--kernel-tu", wrong,
                 "--kernel-tu", misspelt)
    out = result.stdout
    assert result.returncode == 1, result.stdout[-4000:] + result.stderr[-4000:]
    assert "kernel tests/npu/typecheck_fixtures/good_kernel.cpp arch 2201 ASCENDC_DUMP=1: ok" in out
    assert re.search(r"tests/npu/typecheck_fixtures/wrong_api_call\.cpp:\d+:\d+: error: .*blockSize", out), out
    assert re.search(r"tests/npu/typecheck_fixtures/misspelt_api\.cpp:\d+:\d+: error: .*PipeBarier", out), out
    assert "PipeBarier" not in open(os.path.join(WORK, "gen", "stub_fun.h")).read()


def test_launch_headers_follow_the_kernel_entries(tmp_path):
    """aclrtlaunch_<kernel>.h as ascendc_library generates it: numBlocks, stream, then every
    GM_ADDR as void*, one header per extern "C" entry of op_kernel/*.cpp."""
    names = tc.write_launch_headers(str(tmp_path))
    assert {"avsg_plan", "avsg_gather", "avsg_calibrate", "avsg_resize"} <= set(names)
    text = (tmp_path / "aclrtlaunch_avsg_gather.h").read_text()
    assert ("uint32_t aclrtlaunch_avsg_gather(uint32_t numBlocks, aclrtStream stream, void* missPos, "
            "void* missSlots, void* missCounts, void* blockTable, void* countOut, void* tiling);") in text
    assert tc.launch_param("__gm__ int32_t* x") == "void* x" and tc.launch_param("uint32_t n") == "uint32_t n"


def test_host_code_is_checked_with_the_config_launch_and_without(tmp_path):
    """torch-npu 2.14's acl_rt.h declares the split plan's config launch, so every NPU host source
    is checked as the configure check would build it there (AVSG_NPU_LAUNCH_CONFIG), and each
    file with a section for it once more as a CANN without it builds it."""
    class FakeSdk:
        devkit = str(tmp_path / "devkit")
    units = dict(tc.host_units(FakeSdk(), str(tmp_path), str(tmp_path / "t"), str(tmp_path / "n")))
    with_config = [cmd for cmd in units.values() if "-DAVSG_NPU_LAUNCH_CONFIG=1" in cmd]
    assert len(with_config) == len(tc.npu_host_sources())
    sections = [src for src in tc.npu_host_sources() if tc.LAUNCH_CONFIG_MACRO in open(src).read()]
    assert {os.path.relpath(s, ROOT) for s in sections} >= {"op_host/plan_host.cpp", "op_host/npu/split_launch.cpp"}
    without = [cmd[-1] for label, cmd in units.items() if label.endswith(f"without {tc.LAUNCH_CONFIG_MACRO}")]
    assert sorted(without) == sorted(sections)
    for label, cmd in units.items():
        assert ("-DAVSG_NPU_LAUNCH_CONFIG=1" in cmd) != label.endswith(f"without {tc.LAUNCH_CONFIG_MACRO}"), label


def test_without_the_trees_the_check_skips_naming_what_is_missing_and_where(tmp_path):
    nowhere = tmp_path / "nowhere"
    result = subprocess.run([sys.executable, SCRIPT, "--third-party", str(nowhere), "--work",
                             str(tmp_path / "w")], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("typecheck: skipped: the AscendC SDK is absent"), result.stdout
    for name in tc.SDK_TREES:
        assert third_party.tree_dir(name, str(nowhere)) in result.stdout
    assert "$AVSG_THIRD_PARTY" in result.stdout and "docs/testing.md" in result.stdout
    assert not (tmp_path / "w").exists()
