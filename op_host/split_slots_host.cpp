// Host side of split_slots (kernel: op_kernel/split_slots_kernel.h, tiling split_slots_tiling.h):
// checks, tiling, launch and registration. Compiled into the CPU library (AVSG_CPU_EMULATION) and,
// when CANN is found, the NPU library (AVSG_WITH_NPU); kernel_launch.h is the launch of both.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <cstdint>
#include <limits>
#include <tuple>

#include "kernel_launch.h"
#include "split_slots_tiling.h"
#include "state_host.h"

#ifdef AVSG_WITH_NPU
#include "aclrtlaunch_avsg_split_slots.h"
#endif

namespace avsg {
namespace {

constexpr int64_t kMaxPitch = std::numeric_limits<int32_t>::max();

void CheckInt32(const at::Tensor& t, const char* name, int64_t dim) {
    TORCH_CHECK_TYPE(t.scalar_type() == at::kInt, "avsg.split_slots: ", name, ": expected dtype torch.int32, got ",
                     c10::toString(t.scalar_type()));
    TORCH_CHECK_VALUE(t.dim() == dim, "avsg.split_slots: ", name, ": expected a ", dim, "-D tensor, got shape ",
                      t.sizes());
}

// int32 between rows of a tensor whose rows are each `elems` contiguous int32 (a plan's output
// rows are padded to 32 B; any contiguous tensor qualifies).
int64_t RowPitch(const at::Tensor& t, const char* name, int64_t elems) {
    const int64_t d = t.dim();
    bool rows_contiguous = true;
    int64_t expect = 1;
    for (int64_t k = d - 1; k >= 1; --k) {
        rows_contiguous = rows_contiguous && (t.size(k) <= 1 || t.stride(k) == expect);
        expect *= t.size(k);
    }
    const int64_t pitch = t.size(0) <= 1 ? elems : t.stride(0);
    TORCH_CHECK_VALUE(rows_contiguous && pitch >= elems && pitch <= kMaxPitch, "avsg.split_slots: ", name,
                      ": expected rows of contiguous int32 (a plan's output, or a contiguous tensor), got strides ",
                      t.strides());
    return pitch;
}

std::tuple<at::Tensor, at::Tensor> SplitSlots(const at::Tensor& slots, const at::Tensor& miss_slots,
                                              const at::Tensor& miss_counts, int64_t capacity) {
    CheckInt32(slots, "slots", 3);
    CheckInt32(miss_slots, "miss_slots", 2);
    CheckInt32(miss_counts, "miss_counts", 1);
    const int64_t R = slots.size(0), T = slots.size(1), K = slots.size(2), N = T * K;
    TORCH_CHECK_VALUE(R >= 1 && T >= 1 && K >= 1, "avsg.split_slots: slots: expected non-empty [R, T, K], got ",
                      slots.sizes());
    TORCH_CHECK_VALUE(N <= kMaxPitch, "avsg.split_slots: slots: T*K = ", N, " exceeds ", kMaxPitch);
    TORCH_CHECK_VALUE(miss_slots.size(0) == R && miss_slots.size(1) == N, "avsg.split_slots: miss_slots: expected "
                      "shape [", R, ", ", N, "] ([R, T*K] of slots ", slots.sizes(), "), got ", miss_slots.sizes());
    TORCH_CHECK_VALUE(miss_counts.size(0) == R, "avsg.split_slots: miss_counts: expected shape [", R, "], got ",
                      miss_counts.sizes());
    TORCH_CHECK_VALUE(capacity >= 1 && capacity <= kSplitMaxCapacity, "avsg.split_slots: capacity: expected 1..",
                      kSplitMaxCapacity, ", got ", capacity);
    const auto dev = slots.device();
    TORCH_CHECK_VALUE(miss_slots.device() == dev, "avsg.split_slots: miss_slots: expected a tensor on ", dev,
                      " like slots, got ", miss_slots.device());
    TORCH_CHECK_VALUE(miss_counts.device() == dev, "avsg.split_slots: miss_counts: expected a tensor on ", dev,
                      " like slots, got ", miss_counts.device());
    const int64_t countStride = R <= 1 ? 1 : miss_counts.stride(0);
    TORCH_CHECK_VALUE(countStride >= 1 && countStride <= kMaxPitch, "avsg.split_slots: miss_counts: expected a "
                      "positive stride, got ", miss_counts.strides());

    SplitSlotsTiling t{};
    t.rows = static_cast<uint32_t>(R);
    t.queries = static_cast<uint32_t>(T);
    t.topk = static_cast<uint32_t>(K);
    t.entries = static_cast<uint32_t>(N);
    t.capacity = static_cast<uint32_t>(capacity);
    t.mapLen = RoundUp(t.capacity + 1, 128);
    t.slotsPitch = static_cast<uint32_t>(RowPitch(slots, "slots", N));
    t.missPitch = static_cast<uint32_t>(RowPitch(miss_slots, "miss_slots", N));
    t.countStride = static_cast<uint32_t>(countStride);
    t.outPitch = RoundUp(t.entries, 8);
    // rows at a 32 B pitch (see SplitSlotsTiling::outPitch); the results are views, as a plan's are
    const auto opts = slots.options();
    at::Tensor hit_rows = at::empty({R, static_cast<int64_t>(t.outPitch)}, opts);
    at::Tensor miss_rows = at::empty({R, static_cast<int64_t>(t.outPitch)}, opts);
    LaunchKernel("split_slots", AVSG_KERNEL(avsg_split_slots, split_slots), BlockDimFor(R), t, slots, miss_slots,
                 miss_counts, hit_rows, miss_rows);
    return {hit_rows.narrow(1, 0, N).view({R, T, K}), miss_rows.narrow(1, 0, N).view({R, T, K})};
}

}  // namespace
}  // namespace avsg

// The CPU library (_C, emulation) and the NPU library (_npu_ops) each register only their own
// dispatch key, so loading both never registers anything twice.
#ifdef AVSG_CPU_EMULATION
TORCH_LIBRARY_IMPL(avsg, CPU, m) {
    m.impl("split_slots", &avsg::SplitSlots);
}
#else
TORCH_LIBRARY_IMPL(avsg, PrivateUse1, m) {
    m.impl("split_slots", &avsg::SplitSlots);
}
#endif
