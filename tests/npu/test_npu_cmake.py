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


@needs_cmake
def test_fast_emulation_arch_is_the_host_level_unless_told(tmp_path):
    out = cmake_script(tmp_path, """
avsg_fast_emulation_arch("auto" "x86-64-v4" a)
message("auto_v4=${a}")
avsg_fast_emulation_arch("auto" "" b)
message("auto_none=${b}")
avsg_fast_emulation_arch("generic" "x86-64-v4" c)
message("generic=${c}")
avsg_fast_emulation_arch("x86-64-v3" "x86-64-v4" d)
message("v3=${d}")""")
    assert out == {"auto_v4": "x86-64-v4", "auto_none": "", "generic": "", "v3": "x86-64-v3"}
    # -march reaches the fast copy only: the strict copy, whose counters price the NPU, is generic
    assert "target_compile_options(avsg_kernels_fast PRIVATE -march=${AVSG_FAST_MARCH})" in TOP_CMAKE
    assert [line for line in TOP_CMAKE.splitlines() if "-march=" in line and "PRIVATE" in line] == [
        "  target_compile_options(avsg_kernels_fast PRIVATE -march=${AVSG_FAST_MARCH})"]
    # no FMA contraction in either copy: the fast build is compared with the strict one bit for bit
    assert "target_compile_options(avsg_kernels_fast PRIVATE ${_avsg_exact_fp})" in TOP_CMAKE
    assert "target_compile_options(avsg_C PRIVATE ${_avsg_exact_fp})" in TOP_CMAKE


@needs_cmake
@pytest.mark.parametrize("bad", ["native", "x86-64-v5", "avx2"])
def test_fast_emulation_arch_rejects_an_unknown_request_by_name(tmp_path, bad):
    script = tmp_path / "drive.cmake"
    script.write_text(f'include("{BUILD_CMAKE}")\navsg_fast_emulation_arch("{bad}" "x86-64-v4" a)\n')
    result = subprocess.run(["cmake", "-P", str(script)], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    said = " ".join(result.stderr.split())   # cmake wraps a long message
    assert f"AVSG_FAST_ARCH: expected auto, generic, x86-64-v2, x86-64-v3 or x86-64-v4, got '{bad}'" in said


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


# ---- the split plan's config launch: the configure check and the decision -------------------

ACL_INCLUDE = os.path.join(ROOT, "build", "typecheck", "headers", "torch-npu-2.14.0", "torch_npu", "include")

# A stand-in acl/acl_rt.h with exactly what the probe uses; drop_* variants lack one piece each.
FAKE_ACL_RT = """#pragma once
#include <stddef.h>
#include <stdint.h>
typedef int aclError;
typedef void* aclrtStream;
typedef void* aclrtBinHandle;
typedef void* aclrtFuncHandle;
#define ACL_RT_BINARY_MAGIC_ELF_VECTOR_CORE 0x41415246U
typedef enum { ACL_RT_BINARY_LOAD_OPT_MAGIC = 2 } aclrtBinaryLoadOptionType;
typedef union { uint32_t magic; uint32_t rsv[4]; } aclrtBinaryLoadOptionValue;
typedef struct { aclrtBinaryLoadOptionType type; aclrtBinaryLoadOptionValue value; } aclrtBinaryLoadOption;
typedef struct { aclrtBinaryLoadOption* options; size_t numOpt; } aclrtBinaryLoadOptions;
typedef struct { uint32_t addrOffset; uint32_t dataOffset; } aclrtPlaceHolderInfo;
typedef enum { ACL_RT_LAUNCH_KERNEL_ATTR_SCHEM_MODE = 1, /*TIMEOUT*/ } aclrtLaunchKernelAttrId;
typedef union { uint8_t schemMode; uint16_t timeout; uint32_t rsv[4]; } aclrtLaunchKernelAttrValue;
typedef struct { aclrtLaunchKernelAttrId id; aclrtLaunchKernelAttrValue value; } aclrtLaunchKernelAttr;
typedef struct { aclrtLaunchKernelAttr* attrs; size_t numAttrs; } aclrtLaunchKernelCfg;
#ifdef __cplusplus
extern "C" {
#endif
aclError aclrtBinaryLoadFromFile(const char*, aclrtBinaryLoadOptions*, aclrtBinHandle*);
aclError aclrtBinaryGetFunction(const aclrtBinHandle, const char*, aclrtFuncHandle*);
aclError aclrtBinaryUnLoad(aclrtBinHandle);
/*LAUNCH*/
#ifdef __cplusplus
}
#endif
"""
FAKE_LAUNCH = ("aclError aclrtLaunchKernelWithHostArgs(aclrtFuncHandle, uint32_t, aclrtStream, aclrtLaunchKernelCfg*, "
               "void*, size_t, aclrtPlaceHolderInfo*, size_t);")
RUNTIME_SYMBOLS = ("aclrtBinaryLoadFromFile", "aclrtBinaryGetFunction", "aclrtBinaryUnLoad",
                   "aclrtLaunchKernelWithHostArgs")


def fake_acl(root, timeout=True, launch=True):
    (root / "acl").mkdir(parents=True)
    text = FAKE_ACL_RT.replace("/*TIMEOUT*/", "ACL_RT_LAUNCH_KERNEL_ATTR_TIMEOUT = 7" if timeout else "")
    (root / "acl" / "acl_rt.h").write_text(text.replace("/*LAUNCH*/", FAKE_LAUNCH if launch else ""))
    return str(root)


def fake_runtime(root, symbols):
    """libascendcl.so defining only `symbols` (C linkage, any signature: only linking is checked)."""
    root.mkdir(parents=True)
    src = root / "rt.c"
    src.write_text("".join(f"int {s}(void) {{ return 0; }}\n" for s in symbols))
    res = subprocess.run(["gcc", "-shared", "-fPIC", str(src), "-o", str(root / "libascendcl.so")],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return str(root)


def configure_checks(tmp_path, cases):
    """Configure a throwaway project that runs avsg_check_launch_config once per (name, includes,
    link_dirs, libraries); returns {name: "1" or ""}."""
    src = tmp_path / "proj"
    src.mkdir()
    body = "".join(f'avsg_check_launch_config("{inc}" "{ld}" "{libs}" {name})\nmessage(STATUS "{name}=${{{name}}}")\n'
                   for name, inc, ld, libs in cases)
    (src / "CMakeLists.txt").write_text(
        f'cmake_minimum_required(VERSION 3.18)\nproject(probe LANGUAGES CXX)\ninclude("{BUILD_CMAKE}")\n{body}')
    res = subprocess.run(["cmake", "-S", str(src), "-B", str(tmp_path / "b")], capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    found = dict(re.findall(r"^-- (\w+)=(.*)$", res.stdout, re.M))
    return {name: found[name].strip() for name, *_ in cases}


@needs_cmake
@pytest.mark.skipif(shutil.which("g++") is None or shutil.which("gcc") is None, reason="no gcc / g++")
def test_launch_config_check_needs_every_declaration_and_every_runtime_symbol(tmp_path):
    full = fake_acl(tmp_path / "full")
    no_timeout = fake_acl(tmp_path / "no_timeout", timeout=False)
    no_launch = fake_acl(tmp_path / "no_launch", launch=False)
    rt_full = fake_runtime(tmp_path / "rt_full", RUNTIME_SYMBOLS)
    rt_old = fake_runtime(tmp_path / "rt_old", RUNTIME_SYMBOLS[:-1])
    cases = [("FULL", full, "", ""), ("NO_TIMEOUT", no_timeout, "", ""), ("NO_LAUNCH", no_launch, "", ""),
             ("NO_HEADER", str(tmp_path / "nowhere"), "", ""),
             ("LINKED", full, rt_full, "ascendcl"), ("OLD_RUNTIME", full, rt_old, "ascendcl"),
             ("NO_RUNTIME", full, str(tmp_path / "nowhere"), "ascendcl")]
    if os.path.exists(os.path.join(ACL_INCLUDE, "acl", "acl_rt.h")):
        cases.append(("TORCH_NPU", ACL_INCLUDE, "", ""))   # what scripts/typecheck_ascendc.py assumes
    out = configure_checks(tmp_path, cases)
    assert out["FULL"] == "1" and out["LINKED"] == "1", out
    for name in ("NO_TIMEOUT", "NO_LAUNCH", "NO_HEADER", "OLD_RUNTIME", "NO_RUNTIME"):
        assert out[name] == "", (name, out)
    if "TORCH_NPU" in out:
        assert out["TORCH_NPU"] == "1", out


@needs_cmake
def test_split_launch_is_batch_only_with_the_api_and_the_kernel_binary(tmp_path):
    out = cmake_script(tmp_path, """
avsg_split_launch_mode(TRUE TRUE m1 w1)
message("both=${m1}|${w1}")
avsg_split_launch_mode(FALSE TRUE m2 w2)
message("noapi=${m2}|${w2}")
avsg_split_launch_mode(TRUE FALSE m3 w3)
message("nofatbin=${m3}|${w3}")
avsg_split_launch_mode("" "" m4 w4)
message("none=${m4}|${w4}")""")
    assert out["both"].startswith("batch|aclrtLaunchKernelWithHostArgs with ACL_RT_LAUNCH_KERNEL_ATTR_SCHEM_MODE=1")
    assert out["noapi"].startswith("stub|the acl/acl_rt.h of CANN lacks")
    assert out["nofatbin"].startswith("stub|the ascendc.cmake of this CANN has no ascendc_fatbin_library")
    assert out["none"] == out["noapi"]
    for text in out.values():   # compiled into a -D string: no quote a shell would trip on
        assert "'" not in text and '"' not in text


def test_split_launch_is_wired_into_the_npu_build():
    # the check sees what the op library sees: the same headers first, linked against ascendcl
    assert ('avsg_check_launch_config("${AVSG_NPU_HOST_INCLUDES}" "${AVSG_NPU_LINK_DIRS}" ascendcl '
            'AVSG_HAVE_LAUNCH_CONFIG)') in NPU_CMAKE
    assert re.search(r"target_include_directories\(avsg_npu PRIVATE\s+\S+op_host\"\s+\S+avsg_kernels\"[^\n]*\n"
                     r"\s+\$\{AVSG_NPU_HOST_INCLUDES\}\)", NPU_CMAKE)
    assert "target_link_directories(avsg_npu PRIVATE ${AVSG_NPU_LINK_DIRS})" in NPU_CMAKE
    # one binary of plan.cpp, release definitions (the fatbin has no dump), copied next to _npu_ops.so
    assert 'ascendc_fatbin_library(avsg_plan_split "${AVSG_ROOT}/op_kernel/plan.cpp")' in NPU_CMAKE
    assert 'avsg_kernel_definitions("Release" OFF "${AVSG_NPU_KERNEL_DEFINITIONS}" _avsg_split_defs)' in NPU_CMAKE
    assert '"${CMAKE_LIBRARY_OUTPUT_DIRECTORY}/avsg_plan_split.o"' in NPU_CMAKE
    header = open(os.path.join(ROOT, "op_host", "npu", "split_launch.h")).read()
    assert 'kPlanSplitBinary = "avsg_plan_split.o"' in header
    # the macro only in the batch branch; the tag in both
    batch = re.search(r'if\(AVSG_SPLIT_LAUNCH STREQUAL "batch"\)\n(.*?)else\(\)\n(.*?)endif\(\)',
                      NPU_CMAKE[NPU_CMAKE.index("AVSG_NPU_SPLIT_LAUNCH: how"):], re.S)
    assert "AVSG_NPU_LAUNCH_CONFIG=1" in batch.group(1) and 'AVSG_NPU_SPLIT_LAUNCH="batch"' in batch.group(1)
    assert "AVSG_NPU_LAUNCH_CONFIG" not in batch.group(2) and "AVSG_NPU_SPLIT_LAUNCH=" in batch.group(2)


def test_split_launch_tag_is_read_from_the_file(tmp_path):
    lib = tmp_path / "_npu_ops.so"
    lib.write_bytes(b"\x7fELF" + b"AVSG_NPU_SPLIT_LAUNCH=batch\0" + b"AVSG_NPU_SOC_VERSION=Ascend910B3\0")
    assert backend.built_split_launch(str(lib)) == "batch"
    assert backend.built_soc_version(str(lib)) == "Ascend910B3"
    lib.write_bytes(b"AVSG_NPU_SPLIT_LAUNCH=stub: no API\0")
    assert backend.built_split_launch(str(lib)) == "stub: no API"
    lib.write_bytes(b"untagged")
    assert backend.built_split_launch(str(lib)) is None


FAKE_ASCENDC_CMAKE = r"""# stand-in for CANN's ascendc.cmake: the functions op_host/npu/CMakeLists.txt calls, recorded
file(WRITE "${CMAKE_BINARY_DIR}/fake_ascendc_empty.cpp" "")
function(ascendc_library name type)
  add_library(${name} STATIC "${CMAKE_BINARY_DIR}/fake_ascendc_empty.cpp")
endfunction()
function(ascendc_include_directories)
endfunction()
function(ascendc_compile_definitions name scope)
  message(STATUS "FAKE_DEFS_${name}=${ARGN}")
endfunction()
function(ascendc_compile_options)
endfunction()
if(NOT "$ENV{FAKE_NO_FATBIN}")
  function(ascendc_fatbin_library name)
    add_custom_target(${name}_fatbin_obj ALL)
    message(STATUS "FAKE_FATBIN=${name}|${ARGN}|${CMAKE_INSTALL_PREFIX}")
  endfunction()
endif()
"""


@needs_cmake
@pytest.mark.skipif(shutil.which("gcc") is None, reason="no gcc")
@pytest.mark.parametrize("variant", ["batch", "no_fatbin", "old_runtime"])
def test_npu_cmakelists_picks_the_split_launch_against_stand_ins(tmp_path, variant):
    """The NPU CMakeLists configured for real against a stand-in CANN (its ascendc.cmake records
    the calls; libascendcl defines the runtime's symbols or not) and torch_npu (the stand-in
    acl_rt.h): the config launch only with both the API and ascendc_fatbin_library, the binary
    of plan.cpp built with the release definitions under the build tree, the outcome tagged."""
    cann = tmp_path / "cann"
    (cann / "compiler/tikcpp/ascendc_kernel_cmake").mkdir(parents=True)
    (cann / "compiler/tikcpp/ascendc_kernel_cmake/ascendc.cmake").write_text(FAKE_ASCENDC_CMAKE)
    fake_runtime(cann / "lib64", RUNTIME_SYMBOLS[:-1] if variant == "old_runtime" else RUNTIME_SYMBOLS)
    tnpu = tmp_path / "torch_npu"
    fake_acl(tnpu / "include")
    import torch.utils
    env = dict(os.environ, ASCEND_HOME_PATH=str(cann), TORCH_NPU_PATH=str(tnpu))
    env.pop("AVSG_REQUIRE_NPU", None)
    if variant == "no_fatbin":
        env["FAKE_NO_FATBIN"] = "1"
    build = tmp_path / "b"
    res = subprocess.run(["cmake", "-S", ROOT, "-B", str(build), f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}",
                          f"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY={tmp_path / 'out'}"],
                         capture_output=True, text=True, env=env, timeout=300)
    log = res.stdout + res.stderr
    assert res.returncode == 0, log[-4000:]
    flags = (build / "op_host/npu/CMakeFiles/avsg_npu.dir/flags.make").read_text()
    if variant == "batch":
        assert "AVSG: split plan launch: batch schedule mode and a timeout" in log
        assert "-DAVSG_NPU_LAUNCH_CONFIG=1" in flags and re.search(r'AVSG_NPU_SPLIT_LAUNCH=\W*batch\W', flags)
        fatbin = re.search(r"FAKE_FATBIN=(.*)", log).group(1).split("|")
        assert fatbin == ["avsg_plan_split", os.path.join(ROOT, "op_kernel", "plan.cpp"),
                          str(build / "op_host" / "npu" / "split_kernel")]
        assert re.search(r"FAKE_DEFS_avsg_plan_split=-DAVSG_NPU_KERNEL=1;-DASCENDC_DUMP=0\n", log)
        makefile = (build / "op_host/npu/CMakeFiles/avsg_plan_split_copy.dir/build.make").read_text()
        assert f"{tmp_path / 'out'}/avsg_plan_split.o" in makefile
    else:
        why = ("the ascendc.cmake of this CANN has no ascendc_fatbin_library" if variant == "no_fatbin"
               else "the acl/acl_rt.h of CANN lacks")
        warning = " ".join(log.split())   # CMake wraps a warning's lines
        assert f"AVSG: split plan launch: ACLRT_LAUNCH_KERNEL (no batch schedule mode): {why}" in warning
        assert "AVSG_NPU_LAUNCH_CONFIG" not in flags and re.search(r'AVSG_NPU_SPLIT_LAUNCH=\W*stub: ', flags)
        assert "FAKE_FATBIN" not in log
