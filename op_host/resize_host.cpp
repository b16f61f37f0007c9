// Host side of resize (kernel: op_kernel/resize_kernel.h): checks, the per-row targets, the move
// lists, tiling, launch and registration, in the CPU and the NPU library (kernel_launch.h).
#include <ATen/ATen.h>
#include <torch/library.h>

#include <tuple>
#include <vector>

#include "kernel_launch.h"
#include "state_host.h"

#ifdef AVSG_WITH_NPU
#include "aclrtlaunch_avsg_resize.h"
#endif

namespace avsg {
namespace {

// resize: (rows, capacities) become one int32 target per row (-1: not listed) on the state's
// device, so the kernel needs no host sync; a shrink's moves come back as fixed-shape lists.
std::tuple<at::Tensor, at::Tensor, at::Tensor> Resize(at::Tensor& state, const at::Tensor& rows,
                                                      const at::Tensor& capacities, int64_t capacity, int64_t buckets,
                                                      int64_t lifetime, int64_t policy, int64_t max_context,
                                                      int64_t min_active) {
    TORCH_CHECK_TYPE(state.scalar_type() == at::kInt, "avsg.resize: state: expected dtype int32, got ",
                     c10::toString(state.scalar_type()));
    TORCH_CHECK_VALUE(state.dim() == 2 && state.size(0) >= 1, "avsg.resize: state: expected shape [R, width], got ",
                      state.sizes());
    const int64_t R = state.size(0);
    TORCH_CHECK_VALUE(min_active >= 1, "min_active: expected >= 1 (T*K), got ", min_active);
    CheckGeometry(capacity, buckets, lifetime, min_active);
    CheckPolicy(policy, max_context);
    CheckStateForPolicy(state, R, capacity, buckets, policy);
    TORCH_CHECK_VALUE(rows.dim() == 1, "rows: expected a 1-D tensor, got shape ", rows.sizes());
    CheckTensor(rows, "rows", at::kLong, {rows.size(0)});
    CheckTensor(capacities, "capacities", at::kLong, {rows.size(0)});
    const std::pair<const char*, const at::Tensor*> same_device[] = {{"rows", &rows}, {"capacities", &capacities}};
    for (const auto& [name, t] : same_device)
        TORCH_CHECK_VALUE(t->device() == state.device(), "avsg.resize: ", name, ": expected a tensor on ",
                          state.device(), " (the state's device), got one on ", t->device());
    if (state.device().is_cpu()) {
        // always checked on CPU: an index outside [0, R) would make the scatter below fault
        const int64_t* row = rows.data_ptr<int64_t>();
        const int64_t* cap = capacities.data_ptr<int64_t>();
        std::vector<bool> seen(static_cast<size_t>(R), false);
        for (int64_t i = 0; i < rows.size(0); ++i) {
            TORCH_CHECK_VALUE(row[i] >= 0 && row[i] < R, "rows[", i, "] = ", row[i], ": expected a row in [0, ", R, ")");
            TORCH_CHECK_VALUE(!seen[row[i]], "rows: row ", row[i], " is listed twice; each row takes one capacity");
            seen[row[i]] = true;
            TORCH_CHECK_VALUE(cap[i] >= min_active && cap[i] <= capacity, "capacities[", i, "] = ", cap[i],
                              ": expected a capacity in [", min_active, ", ", capacity,
                              "] (T*K .. S, the allocated slots)");
        }
    }
    CheckHeader(state, capacity, buckets, max_context, lifetime, policy, min_active);
    auto opts = state.options().dtype(at::kInt);
    at::Tensor target = at::full({R}, -1, opts);
    target.index_put_({rows}, capacities.to(at::kInt));
    const int64_t W = std::max<int64_t>(1, capacity / 2);
    // rows of the move lists and the counts padded to 32 B, as for plan's outputs; views returned
    const int64_t pitch = (W + 7) / 8 * 8;
    at::Tensor src_rows = at::empty({R, pitch}, opts), dst_rows = at::empty({R, pitch}, opts);
    at::Tensor count_rows = at::empty({R, static_cast<int64_t>(kPlanCountPitch)}, opts);
    ResizeTiling tiling{};
    tiling.plan = MakeTiling(static_cast<uint32_t>(R), static_cast<uint32_t>(min_active),
                             static_cast<uint32_t>(capacity), static_cast<uint32_t>(buckets),
                             static_cast<uint32_t>(lifetime), static_cast<uint32_t>(policy),
                             static_cast<uint32_t>(max_context));
    tiling.moveWidth = static_cast<uint32_t>(W);
    tiling.movePitch = static_cast<uint32_t>(pitch);
    const uint32_t blockDim = BlockDimFor(R);
    LaunchKernel("resize", AVSG_KERNEL(avsg_resize, resize), blockDim, tiling, state, target, src_rows, dst_rows,
                 count_rows);
    return {src_rows.narrow(1, 0, W), dst_rows.narrow(1, 0, W), count_rows.select(1, 0)};
}

}  // namespace
}  // namespace avsg

// The CPU library (_C, emulation) and the NPU library (_npu_ops) each register only their own
// dispatch key, so loading both never registers anything twice.
#ifdef AVSG_CPU_EMULATION
TORCH_LIBRARY_IMPL(avsg, CPU, m) {
    m.impl("resize", &avsg::Resize);
}
#else
TORCH_LIBRARY_IMPL(avsg, PrivateUse1, m) {
    m.impl("resize", &avsg::Resize);
}
#endif
