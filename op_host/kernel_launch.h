// kernel_launch.h: the one launch function of the op host files. LaunchKernel runs a kernel entry
// on the caller's tensors (then the tiling): in the CPU library (AVSG_CPU_EMULATION) through the
// emulation build avsg.backend.set_emulation selected, on threads, here; in the NPU library
// (AVSG_WITH_NPU) on the caller's NPU stream, through OpCommand::RunOpApi and the entry's
// generated ACLRT_LAUNCH_KERNEL stub, the tiling uploaded once (npu/launch_util.h). A host file
// names an entry with AVSG_KERNEL(avsg_<name>, <KernelBuild field>) and includes its
// aclrtlaunch_avsg_<name>.h in the NPU build; everything else about a launch is the same for both.
// The only launch not made here is the split plan's config launch (plan_host.cpp).
#pragma once
#include <ATen/ATen.h>

#include <cstdint>

#if defined(AVSG_CPU_EMULATION) == defined(AVSG_WITH_NPU)
#error "op_host/kernel_launch.h: build with exactly one of AVSG_CPU_EMULATION (CPU library) or AVSG_WITH_NPU (NPU library)"
#endif

#ifdef AVSG_CPU_EMULATION
#include "cpu_kernels.h"  // the kernels, in the strict and the fast emulation build
#include "kernel_operator.h"
#define AVSG_KERNEL(entry, field) (&avsg_cpu::KernelBuild::field)
#endif

#ifdef AVSG_WITH_NPU
#include "acl/acl.h"
#include "npu/launch_util.h"
#include "torch_npu/csrc/core/npu/NPUStream.h"
#include "torch_npu/csrc/framework/OpCommand.h"
#define AVSG_KERNEL(entry, field) (ACLRT_LAUNCH_KERNEL(entry))
#endif

namespace avsg {

#ifdef AVSG_CPU_EMULATION
// `kernels` is fetched once per op call, so the launcher and the kernel come from one build.
template <class F>
void RunOnCpu(const char* op, const avsg_cpu::KernelBuild& kernels, uint32_t blockDim, F&& body) {
    try {
        kernels.launch(blockDim, body);
    } catch (const AscendC::EmuError& e) {
        TORCH_CHECK(false, "avsg.", op, ": AscendC kernel failed in the CPU emulation: ", e.what());
    }
}

inline avsg_cpu::GmAddr Addr(const at::Tensor& t) { return reinterpret_cast<avsg_cpu::GmAddr>(t.data_ptr()); }
#endif

// entry: AVSG_KERNEL(...); first: the tensor whose device runs the launch; tiling: a POD struct.
template <class Entry, class Tiling, class... Tensors>
void LaunchKernel(const char* op, Entry entry, uint32_t blockDim, const Tiling& tiling, const at::Tensor& first,
                  const Tensors&... rest) {
#ifdef AVSG_CPU_EMULATION
    const avsg_cpu::GmAddr tl = reinterpret_cast<avsg_cpu::GmAddr>(const_cast<Tiling*>(&tiling));
    const avsg_cpu::KernelBuild& k = avsg_cpu::selected_kernels();
    RunOnCpu(op, k, blockDim, [&] { (k.*entry)(Addr(first), Addr(rest)..., tl); });
#else
    c10::OptionalDeviceGuard guard(first.device());
    at::Tensor tl = npu::DeviceTiling(&tiling, sizeof(tiling), first.device());
    aclrtStream stream = npu::CurrentStream();
    // Tensors are captured by value: the task queue may run the lambda after this returns.
    at_npu::native::OpCommand::RunOpApi(op, [=]() -> int {
        return npu::LaunchStatus(entry(blockDim, stream, first.data_ptr(), rest.data_ptr()..., tl.data_ptr()));
    });
#endif
}

}  // namespace avsg
