// Host side of invalidate (kernel: op_kernel/invalidate_kernel.h): checks, tiling, launch and
// registration. Compiled into the CPU library (AVSG_CPU_EMULATION) and, when CANN is found, the
// NPU library (AVSG_WITH_NPU); kernel_launch.h is the launch of both.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "kernel_launch.h"
#include "state_host.h"

#ifdef AVSG_WITH_NPU
#include "aclrtlaunch_avsg_invalidate.h"
#endif

namespace avsg {
namespace {

void Invalidate(at::Tensor& state, const at::Tensor& valid_lens, int64_t capacity, int64_t buckets,
                int64_t max_context) {
    bool reuse = false;
    const int64_t R = CheckStateArgs("invalidate", state, valid_lens, "valid_lens", at::kInt, capacity, buckets,
                                     max_context, -1, &reuse);
    // invalidate only frees slots: any active capacity stays valid, so it is not checked
    CheckHeader(state, capacity, buckets, max_context, -1, -1, -1);
    const uint32_t blockDim = BlockDimFor(R);
    // lifetime 0: the invalidate kernel checks the header's magic, capacity, buckets and
    // max_context only (the reuse sections, read off the state's width, are all it needs)
    LaunchKernel("invalidate", AVSG_KERNEL(avsg_invalidate, invalidate), blockDim,
                 StateTiling(R, capacity, buckets, 0, reuse ? kPolicyReuse : kPolicyLifetime, max_context), state,
                 valid_lens);
}

}  // namespace
}  // namespace avsg

// The CPU library (_C, emulation) and the NPU library (_npu_ops) each register only their own
// dispatch key, so loading both never registers anything twice.
#ifdef AVSG_CPU_EMULATION
TORCH_LIBRARY_IMPL(avsg, CPU, m) {
    m.impl("invalidate", &avsg::Invalidate);
}
#else
TORCH_LIBRARY_IMPL(avsg, PrivateUse1, m) {
    m.impl("invalidate", &avsg::Invalidate);
}
#endif
