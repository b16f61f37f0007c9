# Build decisions of the top-level and the NPU CMakeLists, as functions of their inputs only, so
# that tests/npu/test_npu_cmake.py can run them in CMake's script mode (cmake -P) without CANN.

# torch 2.14's headers require C++20; older ones build with C++17 (the CPU build against torch
# 2.13 stays on C++17).
function(avsg_cxx_standard torch_version out)
  if(torch_version AND torch_version VERSION_GREATER_EQUAL 2.14)
    set(${out} 20 PARENT_SCOPE)
  else()
    set(${out} 17 PARENT_SCOPE)
  endif()
endfunction()

# The instruction set the fast CPU emulation build is compiled for (-march; "" is the compiler's
# generic target). The fast build is what `avsg run` and the benchmarks time on CPU, and GCC's
# auto-vectoriser on the emulated vector APIs is most of its speed, so by default it targets the
# best x86-64 level the build machine runs (host_level: x86-64-v4, -v3, -v2, or "" when none or
# not x86). request: "auto" (that), "generic" (portable), or one x86-64-vN level. The strict build
# stays generic: it is the build whose counters price the NPU, and the fast build is tested against
# it bit for bit (floating-point contraction is off in both, so no FMA changes a result).
function(avsg_fast_emulation_arch request host_level out)
  if(request STREQUAL "auto")
    set(${out} "${host_level}" PARENT_SCOPE)
  elseif(request STREQUAL "generic")
    set(${out} "" PARENT_SCOPE)
  elseif(request MATCHES "^x86-64-v[234]$")
    set(${out} "${request}" PARENT_SCOPE)
  else()
    message(FATAL_ERROR "AVSG_FAST_ARCH: expected auto, generic, x86-64-v2, x86-64-v3 or x86-64-v4, got '${request}'")
  endif()
endfunction()

# The directory holding CANN's ascendc.cmake. Its location moved between CANN releases; the
# last candidates are the per-architecture trees (<arch>-linux/tikcpp/...), first the host's
# architecture, then any other one installed.
function(avsg_find_ascendc_cmake home processor out)
  set(_candidates
    "${home}/compiler/tikcpp/ascendc_kernel_cmake"
    "${home}/tools/tikcpp/ascendc_kernel_cmake"
    "${home}/ascendc_devkit/tikcpp/samples/cmake"
    "${home}/${processor}-linux/tikcpp/ascendc_kernel_cmake")
  file(GLOB _arch_dirs LIST_DIRECTORIES true "${home}/*-linux/tikcpp/ascendc_kernel_cmake")
  list(SORT _arch_dirs)
  list(APPEND _candidates ${_arch_dirs})
  set(${out} "" PARENT_SCOPE)
  foreach(_dir ${_candidates})
    if(EXISTS "${_dir}/ascendc.cmake")
      set(${out} "${_dir}" PARENT_SCOPE)
      return()
    endif()
  endforeach()
endfunction()

# Compile definitions of the AscendC kernels. ascendc_assert and printf stay live (and cost a dump
# workspace per launch) unless ASCENDC_DUMP=0: so 0 except in a Debug build or with
# AVSG_KERNEL_DUMP on. The extra definitions come last.
function(avsg_kernel_definitions build_type dump extra out)
  set(_defs -DAVSG_NPU_KERNEL=1)
  if(dump OR build_type STREQUAL "Debug")
    list(APPEND _defs -DASCENDC_DUMP=1)
  else()
    list(APPEND _defs -DASCENDC_DUMP=0)
  endif()
  list(APPEND _defs ${extra})
  set(${out} "${_defs}" PARENT_SCOPE)
endfunction()

# The run path of _npu_ops.so as a link option. ascendc.cmake sets CMAKE_SKIP_RPATH, which makes
# CMake drop BUILD_RPATH / INSTALL_RPATH; vllm-ascend passes -Wl,-rpath the same way.
function(avsg_npu_rpath_option torch_npu_path ascend_home out)
  set(${out} "-Wl,-rpath,$ORIGIN:${torch_npu_path}/lib:${ascend_home}/lib64" PARENT_SCOPE)
endfunction()

# ---- the split plan's config launch (op_host/npu/split_launch.h) ---------------------------
# A split plan syncs across cores, so it is launched with the batch schedule mode and a timeout
# (launch attributes ACLRT_LAUNCH_KERNEL cannot pass). That needs, from CANN's acl_rt.h, the
# calls and types below, each as split_launch.h / split_launch.cpp / plan_host.cpp use them.
function(avsg_launch_config_probe_source out)
  set(${out} [=[
#include <cstddef>
#include <cstdint>
#include "acl/acl_rt.h"
// Taken by address with the exact signatures the host code calls them with, so a declaration
// that differs fails here; linking (when libraries are given) proves the runtime has them.
aclError (*const avsg_load)(const char*, aclrtBinaryLoadOptions*, aclrtBinHandle*) = aclrtBinaryLoadFromFile;
aclError (*const avsg_get)(const aclrtBinHandle, const char*, aclrtFuncHandle*) = aclrtBinaryGetFunction;
aclError (*const avsg_unload)(aclrtBinHandle) = aclrtBinaryUnLoad;
aclError (*const avsg_launch)(aclrtFuncHandle, uint32_t, aclrtStream, aclrtLaunchKernelCfg*, void*, size_t,
                              aclrtPlaceHolderInfo*, size_t) = aclrtLaunchKernelWithHostArgs;
int main() {
  aclrtBinaryLoadOption option = {};
  option.type = ACL_RT_BINARY_LOAD_OPT_MAGIC;
  option.value.magic = ACL_RT_BINARY_MAGIC_ELF_VECTOR_CORE;
  aclrtLaunchKernelAttr attrs[2] = {};
  attrs[0].id = ACL_RT_LAUNCH_KERNEL_ATTR_SCHEM_MODE;
  attrs[0].value.schemMode = static_cast<uint8_t>(1);
  attrs[1].id = ACL_RT_LAUNCH_KERNEL_ATTR_TIMEOUT;
  attrs[1].value.timeout = static_cast<uint16_t>(30);
  aclrtLaunchKernelCfg cfg{};
  cfg.attrs = attrs;
  cfg.numAttrs = 2;
  return (avsg_load && avsg_get && avsg_unload && avsg_launch && cfg.numAttrs == 2 && option.value.magic) ? 0 : 1;
}
]=] PARENT_SCOPE)
endfunction()

# Sets result (a cache variable, re-checked on every configure) to TRUE when the probe compiles
# against include_dirs and, when libraries is not empty, links against them from link_dirs (only
# the probe's own references must resolve). Needs a project (try_compile), not cmake -P.
function(avsg_check_launch_config include_dirs link_dirs libraries result)
  include(CheckCXXSourceCompiles)
  avsg_launch_config_probe_source(_src)
  set(CMAKE_REQUIRED_INCLUDES ${include_dirs})
  set(CMAKE_REQUIRED_QUIET ON)
  if(libraries)
    set(CMAKE_REQUIRED_LIBRARIES ${libraries})
    set(_link_options "-Wl,--allow-shlib-undefined")
    foreach(_dir ${link_dirs})
      list(APPEND _link_options "-L${_dir}")
    endforeach()
    set(CMAKE_REQUIRED_LINK_OPTIONS ${_link_options})
  else()
    set(CMAKE_TRY_COMPILE_TARGET_TYPE STATIC_LIBRARY)   # compile only: nothing to link against
  endif()
  unset(${result} CACHE)
  check_cxx_source_compiles("${_src}" ${result})
  set(${result} "${${result}}" PARENT_SCOPE)
endfunction()

# How a split plan is launched: mode "batch" (the config launch, from the kernel binary that
# ascendc_fatbin_library makes) when the API is there (avsg_check_launch_config) and the binary
# can be built; otherwise "stub" (ACLRT_LAUNCH_KERNEL). Either way the split stays off unless
# AVSG_NPU_SPLIT=1. why: one line for the configure log and the library's tag.
function(avsg_split_launch_mode have_api have_fatbin mode why)
  if(have_api AND have_fatbin)
    set(${mode} "batch" PARENT_SCOPE)
    set(${why} "aclrtLaunchKernelWithHostArgs with ACL_RT_LAUNCH_KERNEL_ATTR_SCHEM_MODE=1 (batch) and ACL_RT_LAUNCH_KERNEL_ATTR_TIMEOUT, kernel binary from ascendc_fatbin_library" PARENT_SCOPE)
  elseif(NOT have_api)
    set(${mode} "stub" PARENT_SCOPE)
    set(${why} "the acl/acl_rt.h of CANN lacks aclrtBinaryLoadFromFile (with the magic load option), aclrtBinaryGetFunction, aclrtLaunchKernelWithHostArgs or the SCHEM_MODE / TIMEOUT launch attributes (or libascendcl does not define them)" PARENT_SCOPE)
  else()
    set(${mode} "stub" PARENT_SCOPE)
    set(${why} "the ascendc.cmake of this CANN has no ascendc_fatbin_library (or it made no avsg_plan_split_fatbin_obj target) to build the kernel binary of the split plan" PARENT_SCOPE)
  endif()
endfunction()
