// Host side of reset (kernel: op_kernel/reset_kernel.h): checks, tiling, launch and registration,
// in the CPU and the NPU library (kernel_launch.h).
#include <ATen/ATen.h>
#include <torch/library.h>

#include "kernel_launch.h"
#include "state_host.h"

#ifdef AVSG_WITH_NPU
#include "aclrtlaunch_avsg_reset.h"
#endif

namespace avsg {
namespace {

// Reset reads nothing from the rows it rewrites (header included): it is also how a corrupted row
// is repaired.
void Reset(at::Tensor& state, const at::Tensor& row_mask, int64_t capacity, int64_t buckets, int64_t lifetime,
           int64_t policy, int64_t max_context) {
    CheckGeometry(capacity, buckets, lifetime, 1);
    CheckPolicy(policy, max_context);
    const int64_t R = CheckStateArgs("reset", state, row_mask, "row_mask", at::kBool, capacity, buckets, max_context,
                                     policy == kPolicyReuse ? 1 : 0);
    const uint32_t blockDim = BlockDimFor(R);
    LaunchKernel("reset", AVSG_KERNEL(avsg_reset, reset), blockDim,
                 StateTiling(R, capacity, buckets, lifetime, policy, max_context), state, row_mask);
}

}  // namespace
}  // namespace avsg

// The CPU library (_C, emulation) and the NPU library (_npu_ops) each register only their own
// dispatch key, so loading both never registers anything twice.
#ifdef AVSG_CPU_EMULATION
TORCH_LIBRARY_IMPL(avsg, CPU, m) {
    m.impl("reset", &avsg::Reset);
}
#else
TORCH_LIBRARY_IMPL(avsg, PrivateUse1, m) {
    m.impl("reset", &avsg::Reset);
}
#endif
