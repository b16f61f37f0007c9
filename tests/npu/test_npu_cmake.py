"""The NPU build's decisions (op_host/npu/avsg_build.cmake), run in CMake's script mode without
CANN, and how the CMakeLists use them; and the SoC check avsg.backend makes before loading the
NPU library."""
import os
import re
import shutil
import subprocess

import pytest

from avsg import backend

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD_CMAKE = os.path.join(ROOT, "op_host", "npu", "avsg_build.cmake")
NPU_CMAKE = open(os.path.join(ROOT, "op_host", "npu", "CMakeLists.txt")).read()
TOP_CMAKE = open(os.path.join(ROOT, "CMakeLists.txt")).read()

needs_cmake = pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake not installed")


def cmake_script(tmp_path, body):
    script = tmp_path / "drive.cmake"
    script.write_text(f'include("{BUILD_CMAKE}")\n{body}\n')
    result = subprocess.run(["cmake", "-P", str(script)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return dict(re.findall(r"^(\w+)=(.*)$", result.stderr, re.M))   # message() prints to stderr


@needs_cmake
def test_cxx_standard_is_20_from_torch_2_14_and_17_before(tmp_path):
    out = cmake_script(tmp_path, "\n".join(
        f'avsg_cxx_standard("{v}" s)\nmessage("v{v.replace(".", "_")}=${{s}}")'
        for v in ("2.13.0", "2.14.0", "2.15.1", "")))
    assert out == {"v2_13_0": "17", "v2_14_0": "20", "v2_15_1": "20", "v": "17"}
    assert 'avsg_cxx_standard("${Torch_VERSION}" AVSG_CXX_STANDARD)' in TOP_CMAKE
    assert "CXX_STANDARD ${AVSG_CXX_STANDARD}" in NPU_CMAKE


@needs_cmake
def test_release_kernels_are_built_without_the_dump(tmp_path):
    out = cmake_script(tmp_path, """
avsg_kernel_definitions("Release" OFF "" a)
message("release=${a}")
avsg_kernel_definitions("Debug" OFF "" b)
message("debug=${b}")
avsg_kernel_definitions("Release" ON "-DX=1" c)
message("dump=${c}")""")
    assert out["release"] == "-DAVSG_NPU_KERNEL=1;-DASCENDC_DUMP=0"
    assert out["debug"] == "-DAVSG_NPU_KERNEL=1;-DASCENDC_DUMP=1"
    assert out["dump"] == "-DAVSG_NPU_KERNEL=1;-DASCENDC_DUMP=1;-DX=1"
    assert "ascendc_compile_definitions(avsg_kernels PRIVATE ${_avsg_kernel_defs})" in NPU_CMAKE


@needs_cmake
def test_ascendc_cmake_is_found_in_the_per_architecture_tree_too(tmp_path):
    home = tmp_path / "cann"
    for d in ("aarch64-linux/tikcpp/ascendc_kernel_cmake", "x86_64-linux/tikcpp/ascendc_kernel_cmake"):
        (home / d).mkdir(parents=True)
        (home / d / "ascendc.cmake").write_text("")
    body = f"""
avsg_find_ascendc_cmake("{home}" "x86_64" a)
message("host=${{a}}")
avsg_find_ascendc_cmake("{home}" "riscv64" b)
message("other=${{b}}")
avsg_find_ascendc_cmake("{tmp_path}/none" "x86_64" c)
message("none=${{c}}")"""
    out = cmake_script(tmp_path, body)
    assert out["host"] == f"{home}/x86_64-linux/tikcpp/ascendc_kernel_cmake"
    assert out["other"] == f"{home}/aarch64-linux/tikcpp/ascendc_kernel_cmake"
    assert out["none"] == ""
    (home / "compiler/tikcpp/ascendc_kernel_cmake").mkdir(parents=True)
    (home / "compiler/tikcpp/ascendc_kernel_cmake/ascendc.cmake").write_text("")
    assert cmake_script(tmp_path, body)["host"] == f"{home}/compiler/tikcpp/ascendc_kernel_cmake"


@needs_cmake
def test_rpath_is_a_link_option_because_ascendc_cmake_skips_rpath(tmp_path):
    out = cmake_script(tmp_path, 'avsg_npu_rpath_option("/tnpu" "/cann" r)\nmessage("r=${r}")')
    assert out["r"] == "-Wl,-rpath,$ORIGIN:/tnpu/lib:/cann/lib64"
    assert 'target_link_options(avsg_npu PRIVATE "${_avsg_rpath}")' in NPU_CMAKE
    assert "BUILD_RPATH" not in NPU_CMAKE and "INSTALL_RPATH" not in NPU_CMAKE


def test_kernel_compile_options_hook_and_soc_tag_are_wired():
    assert "ascendc_compile_options(avsg_kernels PRIVATE ${AVSG_KERNEL_COMPILE_OPTIONS})" in NPU_CMAKE
    assert '$ENV{AVSG_KERNEL_COMPILE_OPTIONS}' in NPU_CMAKE
    assert 'AVSG_NPU_SOC_VERSION="${SOC_VERSION}"' in NPU_CMAKE


def test_soc_tag_is_read_from_the_file_and_a_mismatch_refuses_the_library(tmp_path):
    lib = tmp_path / "_npu_ops.so"
    lib.write_bytes(b"\x7fELF junk" + b"AVSG_NPU_SOC_VERSION=Ascend910B3\0more")
    assert backend.built_soc_version(str(lib)) == "Ascend910B3"
    assert backend.soc_mismatch("Ascend910B3", "Ascend910B3") is None
    why = backend.soc_mismatch("Ascend910B3", "Ascend910B1")
    assert "built for Ascend910B3" in why and "device 0 is Ascend910B1" in why and "--soc Ascend910B1" in why
    assert backend.soc_mismatch(None, "Ascend910B1") is None          # untagged (older) library
    lib.write_bytes(b"AVSG_NPU_SOC_VERSION=unknown\0")
    assert backend.built_soc_version(str(lib)) is None
    lib.write_bytes(b"no tag")
    assert backend.built_soc_version(str(lib)) is None
