// Host side of plan and plan_dual_pointer (kernel: op_kernel/plan_kernel.h, one entry file
// op_kernel/plan.cpp for both matchers): input checks, the launch's outputs and workspace, launch
// and registration. The checks and tiling every state op shares are state_host.h; the launch is
// kernel_launch.h's, but for the split plan's config launch in the NPU library (npu/split_launch.h,
// where the build has it). Compiled into the CPU library (AVSG_CPU_EMULATION) and, when CANN is
// found, the NPU library (AVSG_WITH_NPU).
#include <ATen/ATen.h>
#include <torch/library.h>

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "kernel_launch.h"
#include "npu/split_launch.h"  // the split's switches; with CANN, its config launch
#include "state_host.h"

#ifdef AVSG_WITH_NPU
#include "aclrtlaunch_avsg_plan.h"
#include "aclrtlaunch_avsg_plan_dual_pointer.h"
#endif

namespace avsg {
namespace {

// valid_lens: the tensor the kernel reads when tiling.dropPast is set; otherwise any tensor of the
// call (the kernel never reads it), so every parameter is a real device address.
void LaunchPlan(bool dual, uint32_t blockDim, const PlanTiling& tiling, const at::Tensor& topk_pos,
                const at::Tensor& seq_lens, const at::Tensor& valid_lens, const at::Tensor& state,
                const at::Tensor& stats, const at::Tensor& slots, const at::Tensor& miss_pos,
                const at::Tensor& miss_slots, const at::Tensor& miss_counts, const at::Tensor& workspace) {
    const char* op = dual ? "plan_dual_pointer" : "plan";
#ifdef AVSG_NPU_LAUNCH_CONFIG
    // The only launch that syncs across cores, and the only one not made by LaunchKernel: batch
    // schedule mode and a timeout (npu/split_launch.h). Tensors are captured by value.
    if (tiling.split > 1) {
        TORCH_CHECK(!dual, "avsg.plan_dual_pointer: the dual-pointer plan never splits its lookup");
        c10::OptionalDeviceGuard guard(topk_pos.device());
        at::Tensor tl = npu::DeviceTiling(&tiling, sizeof(tiling), topk_pos.device());
        aclrtStream stream = npu::CurrentStream();
        uint16_t timeout = 0;
        const std::string bad = npu::ParseSplitTimeout(std::getenv(npu::kSplitTimeoutEnv), timeout);
        TORCH_CHECK_VALUE(bad.empty(), "avsg.plan: ", bad);
        aclrtFuncHandle function = npu::PlanSplitFunction();
        at_npu::native::OpCommand::RunOpApi(op, [=]() -> int {
            npu::SplitLaunchConfig cfg(timeout);
            npu::PlanSplitArgs args{topk_pos.data_ptr(),  seq_lens.data_ptr(),   valid_lens.data_ptr(),
                                    state.data_ptr(),     stats.data_ptr(),      slots.data_ptr(),
                                    miss_pos.data_ptr(),  miss_slots.data_ptr(), miss_counts.data_ptr(),
                                    workspace.data_ptr(), tl.data_ptr()};
            const aclError err = aclrtLaunchKernelWithHostArgs(function, blockDim, stream, cfg.get(), &args,
                                                               sizeof(args), nullptr, 0);
            if (err != ACL_SUCCESS)   // maybe on the task-queue thread: say what failed; RunOpApi reports the status
                std::fprintf(stderr,
                             "avsg.plan: the split plan's launch (aclrtLaunchKernelWithHostArgs, %u blocks, batch "
                             "schedule mode, timeout %u s) failed with aclError %d; %s=0 runs plan without the split\n",
                             blockDim, static_cast<unsigned>(timeout), static_cast<int>(err), npu::kSplitEnv);
            return static_cast<int>(err);
        });
        return;
    }
#endif
    LaunchKernel(op, dual ? AVSG_KERNEL(avsg_plan_dual_pointer, plan_dual_pointer) : AVSG_KERNEL(avsg_plan, plan),
                 blockDim, tiling, topk_pos, seq_lens, valid_lens, state, stats, slots, miss_pos, miss_slots,
                 miss_counts, workspace);
}

}  // namespace

// The plan's scratch in GM: every word the kernel reads it wrote earlier in the same launch (the
// sync counters are zeroed by the caller). On the NPU the caching allocator recycles it. On the
// CPU a fresh allocation of several hundred KB would be new pages every call, which the operating
// system zeroes on the kernel's first writes (7% of a fast-build plan's profile at 16K slots), so
// each thread keeps one buffer, grown to the largest plan it ran and held until the thread ends.
// A plan launch finishes before its op returns, so one buffer per thread is never in use twice.
at::Tensor PlanWorkspace(int64_t words, const at::TensorOptions& opts) {
#ifdef AVSG_CPU_EMULATION
    thread_local at::Tensor cached;
    if (!cached.defined() || cached.numel() < words) cached = at::empty({words}, opts);
    return cached.narrow(0, 0, words);
#else
    return at::empty({words}, opts);
#endif
}

PlanTiling CheckPlan(const char* op, bool split, const at::Tensor& topk_pos, const at::Tensor& seq_lens,
                     const at::Tensor& state, const at::Tensor& stats, int64_t capacity, int64_t buckets,
                     int64_t lifetime, int64_t policy, int64_t max_context, const std::optional<at::Tensor>& valid_lens) {
    TORCH_CHECK_TYPE(topk_pos.scalar_type() == at::kInt, "topk_pos: expected dtype int32, got ",
                     c10::toString(topk_pos.scalar_type()));
    TORCH_CHECK_VALUE(topk_pos.dim() == 3, "topk_pos: expected shape [R, T, K], got ", topk_pos.sizes());
    const int64_t R = topk_pos.size(0), T = topk_pos.size(1), K = topk_pos.size(2);
    TORCH_CHECK_VALUE(R >= 1 && T >= 1 && K >= 1, "topk_pos: expected non-empty [R, T, K], got ", topk_pos.sizes());
    CheckGeometry(capacity, buckets, lifetime, T * K);
    CheckPolicy(policy, max_context);
    CheckTensor(topk_pos, "topk_pos", at::kInt, {R, T, K});
    CheckTensor(seq_lens, "seq_lens", at::kInt, {R});
    CheckStateForPolicy(state, R, capacity, buckets, policy);
    CheckTensor(stats, "stats", at::kLong, {R, 4});
    const bool drop = valid_lens.has_value();
    if (drop) CheckTensor(*valid_lens, "valid_lens", at::kInt, {R});
    const at::Tensor& lens = drop ? *valid_lens : seq_lens;
    const std::pair<const char*, const at::Tensor*> same_device[] = {
        {"seq_lens", &seq_lens}, {"valid_lens", &lens}, {"state", &state}, {"stats", &stats}};
    for (const auto& [name, t] : same_device)
        TORCH_CHECK_VALUE(t->device() == topk_pos.device(), "avsg.", op, ": ", name, ": expected a tensor on ",
                          topk_pos.device(), " (that of topk_pos), got one on ", t->device());
    CheckHeader(state, capacity, buckets, max_context, lifetime, policy, T * K);

    PlanTiling tiling = MakeTiling(static_cast<uint32_t>(R), static_cast<uint32_t>(T * K),
                                   static_cast<uint32_t>(capacity), static_cast<uint32_t>(buckets),
                                   static_cast<uint32_t>(lifetime), static_cast<uint32_t>(policy),
                                   static_cast<uint32_t>(max_context));
    tiling.dropPast = drop ? 1u : 0u;
    tiling.topk = static_cast<uint32_t>(K);
    if (split) ApplySplit(tiling, R);
    return tiling;
}

uint32_t PlanBlocks(const PlanTiling& tiling) {
    return tiling.split > 1 ? tiling.rows * tiling.split : BlockDimFor(tiling.rows);
}

PlanRows AllocPlanRows(const at::Tensor& topk_pos, const PlanTiling& tiling) {
    const int64_t R = topk_pos.size(0);
    auto opts = topk_pos.options().dtype(at::kInt);
    // Two rows may be planned by two cores, so every output row gets 32 B granules of its own:
    // rows of tiling.outPitch int32 (T*K rounded up to 8) and miss_counts at a pitch of
    // kPlanCountPitch. The caller gets views of the first T*K columns (contiguous whenever T*K is a
    // multiple of 8) and of miss_counts' first column.
    const int64_t pitch = tiling.outPitch;
    PlanRows out;
    out.slots = at::empty({R, pitch}, opts);
    out.miss_pos = at::empty({R, pitch}, opts);
    out.miss_slots = at::empty({R, pitch}, opts);
    out.miss_counts = at::empty({R, static_cast<int64_t>(kPlanCountPitch)}, opts);
#ifdef AVSG_CPU_EMULATION
    // Under the emulation the outputs start poisoned, not as whatever memory held: every list
    // entry 0 and every count the most a row can have. plan_gather's copy reading a row's lists
    // before its plan wrote them (its SyncAll in the wrong place) then copies host position 0
    // into slot 0, over and over, which every test against the reference sees.
    out.slots.zero_();
    out.miss_pos.zero_();
    out.miss_slots.zero_();
    out.miss_counts.fill_(static_cast<int32_t>(pitch));
#endif
    return out;
}

PlanOut PlanViews(const PlanRows& rows, int64_t T, int64_t K) {
    const int64_t R = rows.slots.size(0);
    return {rows.slots.narrow(1, 0, T * K).view({R, T, K}), rows.miss_pos.narrow(1, 0, T * K),
            rows.miss_slots.narrow(1, 0, T * K), rows.miss_counts.select(1, 0)};
}

namespace {

// valid_lens (optional, int32 [R]): the plan first drops what invalidate(valid_lens) would, in the
// same launch (reference.plan).
PlanOut PlanImpl(bool dual, const at::Tensor& topk_pos, const at::Tensor& seq_lens, const at::Tensor& state,
                 const at::Tensor& stats, int64_t capacity, int64_t buckets, int64_t lifetime, int64_t policy,
                 int64_t max_context, const std::optional<at::Tensor>& valid_lens) {
    const char* op = dual ? "plan_dual_pointer" : "plan";
    const PlanTiling tiling = CheckPlan(op, !dual, topk_pos, seq_lens, state, stats, capacity, buckets, lifetime,
                                        policy, max_context, valid_lens);
    const at::Tensor& lens = valid_lens.has_value() ? *valid_lens : seq_lens;   // unread without dropPast
    const uint32_t blockDim = PlanBlocks(tiling);
    const PlanRows rows = AllocPlanRows(topk_pos, tiling);
    const int64_t slices = static_cast<int64_t>(blockDim) * tiling.wsPerCore;
    const int64_t syncWords = tiling.split > 1 ? static_cast<int64_t>(blockDim) * kPlanSyncWords : 0;
    at::Tensor workspace = PlanWorkspace(slices + syncWords, topk_pos.options().dtype(at::kInt));
    if (syncWords) workspace.narrow(0, slices, syncWords).zero_();   // soft SyncAll counters
    LaunchPlan(dual, blockDim, tiling, topk_pos, seq_lens, lens, state, stats, rows.slots, rows.miss_pos,
               rows.miss_slots, rows.miss_counts, workspace);
    return PlanViews(rows, topk_pos.size(1), topk_pos.size(2));
}

PlanOut Plan(const at::Tensor& topk_pos, const at::Tensor& seq_lens, at::Tensor& state, at::Tensor& stats,
             int64_t capacity, int64_t buckets, int64_t lifetime, int64_t policy, int64_t max_context,
             const std::optional<at::Tensor>& valid_lens) {
    return PlanImpl(false, topk_pos, seq_lens, state, stats, capacity, buckets, lifetime, policy, max_context,
                    valid_lens);
}
PlanOut PlanDualPointer(const at::Tensor& topk_pos, const at::Tensor& seq_lens, at::Tensor& state,
                        at::Tensor& stats, int64_t capacity, int64_t buckets, int64_t lifetime, int64_t policy,
                        int64_t max_context, const std::optional<at::Tensor>& valid_lens) {
    return PlanImpl(true, topk_pos, seq_lens, state, stats, capacity, buckets, lifetime, policy, max_context,
                    valid_lens);
}

}  // namespace

#ifdef AVSG_CPU_EMULATION
// For tests and benchmarks: the UB plan chosen for a geometry.
std::vector<int64_t> PlanUbPlan(int64_t T, int64_t K, int64_t capacity, int64_t buckets, int64_t max_context) {
    CheckGeometry(capacity, buckets, 1, T * K);
    const int64_t policy = max_context ? kPolicyReuse : kPolicyLifetime;
    CheckPolicy(policy, max_context);
    PlanTiling t = MakeTiling(1, static_cast<uint32_t>(T * K), static_cast<uint32_t>(capacity),
                              static_cast<uint32_t>(buckets), 1, static_cast<uint32_t>(policy),
                              static_cast<uint32_t>(max_context));
    const PlanUbLayout ub = MakePlanUbLayout(t);
    std::vector<int64_t> out{t.ubBytes, ub.fixed};
    for (uint32_t s = 0; s < SEC_COUNT; ++s) out.push_back(static_cast<int64_t>(t.winLen[s]) * 4);
    out.push_back(ub.slots);   // the resident slots' bytes (part of fixed; 0: stored per chunk)
    return out;
}
#endif

}  // namespace avsg

// The CPU library (_C, emulation) and the NPU library (_npu_ops) each register only their own
// dispatch key, so loading both never registers anything twice.
#ifdef AVSG_CPU_EMULATION
TORCH_LIBRARY_FRAGMENT(avsg, m) {
    // [total UB bytes, fixed bytes, window bytes of bucket_slot, slot_pos, slot_life,
    //  stash_key, stash_slot, slot_count, pos_count, block_heat]; max_context > 0: reuse policy
    m.def("plan_ub_plan(int T, int K, int capacity, int buckets, int max_context=0) -> int[]", &avsg::PlanUbPlan);
}

TORCH_LIBRARY_IMPL(avsg, CPU, m) {
    m.impl("plan", &avsg::Plan);
    m.impl("plan_dual_pointer", &avsg::PlanDualPointer);
}
#else
TORCH_LIBRARY_IMPL(avsg, PrivateUse1, m) {
    m.impl("plan", &avsg::Plan);
    m.impl("plan_dual_pointer", &avsg::PlanDualPointer);
}
#endif
