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
