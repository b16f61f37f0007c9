// Host side of plan_gather (kernel: op_kernel/plan_gather.cpp, which composes the plan kernel and
// the gather kernel with one SyncAll between them): the plan's checks and tiling (state_host.h,
// the same as plan's), the gather's (gather_host.h, the same as gather's, but for the miss lists'
// values, which this launch writes), the combined tiling (plan_gather_tiling.h), launch and
// registration. Every check runs before the launch, so a refused call leaves the state untouched.
// The launch waits across cores, so on the NPU it is the config launch with the batch schedule
// mode and a timeout (npu/split_launch.h), as the split plan's; kernel_launch.h's on the CPU.
// Compiled into the CPU library (AVSG_CPU_EMULATION) and, when CANN is found, the NPU library
// (AVSG_WITH_NPU).
#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <tuple>

#include "gather_host.h"
#include "kernel_launch.h"
#include "npu/split_launch.h"
#include "plan_gather_tiling.h"
#include "state_host.h"

#ifdef AVSG_WITH_NPU
#include "aclrtlaunch_avsg_gather.h"   // the pairs past kGatherMaxPairs: gather launches of their own
#endif

namespace avsg {
namespace {

using PlanGatherOut = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

void LaunchPlanGather(uint32_t blockDim, const PlanGatherTiling& tiling, const at::Tensor& topk_pos,
                      const at::Tensor& seq_lens, const at::Tensor& valid_lens, const at::Tensor& state,
                      const at::Tensor& stats, const PlanRows& rows, const at::Tensor& workspace,
                      const at::Tensor& block_table, const at::Tensor& count_out, const at::Tensor& sync) {
#ifdef AVSG_CPU_EMULATION
    LaunchKernel("plan_gather", AVSG_KERNEL(avsg_plan_gather, plan_gather), blockDim, tiling, topk_pos, seq_lens,
                 valid_lens, state, stats, rows.slots, rows.miss_pos, rows.miss_slots, rows.miss_counts, workspace,
                 block_table, count_out, sync);
#elif defined(AVSG_NPU_LAUNCH_CONFIG)
    // A kernel that waits across cores: batch schedule mode and a timeout, from the kernel binary
    // of op_kernel/plan_gather.cpp (npu/split_launch.h). Tensors are captured by value.
    c10::OptionalDeviceGuard guard(topk_pos.device());
    at::Tensor tl = npu::DeviceTiling(&tiling, sizeof(tiling), topk_pos.device());
    aclrtStream stream = npu::CurrentStream();
    uint16_t timeout = 0;
    const std::string bad = npu::ParseSplitTimeout(std::getenv(npu::kSplitTimeoutEnv), timeout);
    TORCH_CHECK_VALUE(bad.empty(), "avsg.plan_gather: ", bad);
    aclrtFuncHandle function = npu::PlanGatherFunction();
    at_npu::native::OpCommand::RunOpApi("plan_gather", [=]() -> int {
        npu::SplitLaunchConfig cfg(timeout);
        npu::PlanGatherArgs args{topk_pos.data_ptr(),      seq_lens.data_ptr(),       valid_lens.data_ptr(),
                                 state.data_ptr(),         stats.data_ptr(),          rows.slots.data_ptr(),
                                 rows.miss_pos.data_ptr(), rows.miss_slots.data_ptr(), rows.miss_counts.data_ptr(),
                                 workspace.data_ptr(),     block_table.data_ptr(),    count_out.data_ptr(),
                                 sync.data_ptr(),          tl.data_ptr()};
        const aclError err = aclrtLaunchKernelWithHostArgs(function, blockDim, stream, cfg.get(), &args, sizeof(args),
                                                           nullptr, 0);
        if (err != ACL_SUCCESS)   // maybe on the task-queue thread: say what failed; RunOpApi reports the status
            std::fprintf(stderr,
                         "avsg.plan_gather: the launch (aclrtLaunchKernelWithHostArgs, %u blocks, batch schedule "
                         "mode, timeout %u s) failed with aclError %d; plan then gather launch them apart\n",
                         blockDim, static_cast<unsigned>(timeout), static_cast<int>(err));
        return static_cast<int>(err);
    });
#else
    (void)blockDim; (void)tiling; (void)topk_pos; (void)seq_lens; (void)valid_lens; (void)state; (void)stats;
    (void)rows; (void)workspace; (void)block_table; (void)count_out; (void)sync;
    TORCH_CHECK(false, "avsg.plan_gather: this NPU library was built without the launch with the batch schedule "
                "mode (avsg.backend.backend_info()['npu_split_launch'] says why), which a kernel that waits across "
                "cores needs: use plan, then gather");
#endif
}

// plan(topk_pos, seq_lens, state, stats, ..., valid_lens), then gather(miss_pos, miss_slots,
// miss_counts, src, dst, block_table, block_size, partition, num_cores) of its outputs, in one
// launch of max(plan blocks, num_cores) blocks. Returns the plan's four outputs and the gather's.
PlanGatherOut PlanGather(const at::Tensor& topk_pos, const at::Tensor& seq_lens, at::Tensor& state,
                         at::Tensor& stats, int64_t capacity, int64_t buckets, int64_t lifetime, int64_t policy,
                         int64_t max_context, const std::optional<at::Tensor>& valid_lens, at::TensorList src,
                         at::TensorList dst, const c10::optional<at::Tensor>& block_table, int64_t block_size,
                         c10::string_view partition, int64_t num_cores) {
    using namespace gather_host;
    const PlanTiling planTiling = CheckPlan("plan_gather", true, topk_pos, seq_lens, state, stats, capacity, buckets,
                                            lifetime, policy, max_context, valid_lens);
    TORCH_CHECK_VALUE(partition != "selection", "avsg.plan_gather: partition: expected 'miss', 'request' or "
                      "'topk' (the 'selection' layout is rewritten from a plan's outputs by torch: plan, then gather)");
    const int64_t T = topk_pos.size(1), K = topk_pos.size(2);
    const PlanRows rows = AllocPlanRows(topk_pos, planTiling);
    const PlanOut views = PlanViews(rows, T, K);
    const at::Tensor& miss_pos = std::get<1>(views);
    const at::Tensor& miss_slots = std::get<2>(views);
    const at::Tensor& miss_counts = std::get<3>(views);
    const Args a = validate(miss_pos, miss_slots, miss_counts, src, dst, block_table, block_size, partition,
                            num_cores);
    TORCH_CHECK_VALUE(a.S == capacity, "avsg.plan_gather: dst[0]: expected ", capacity, " slots (capacity), got ",
                      dst[0].sizes());
    const Addresses addr = check_launch(a, miss_pos, miss_slots, miss_counts, src, dst, /*values=*/false);

    // The plan on max(its blocks, the copy's cores) blocks: a non-split plan spreads its rows over
    // all of them, a split plan's extra blocks only join its SyncAlls. The plan publishes each
    // row's miss count once its victims are chosen, and every block meets the others once all its
    // rows have published (at the last planned row's publish: plan_kernel.h, PlanRows), so the
    // copy runs beside the rows' ends: core c on block (rows + c) mod blocks, the blocks after the
    // rows' owners first. The launch takes the owners plus the copy's cores, as far as the device
    // has cores (else owners take copy shares after their rows). One workspace slice per block,
    // then the soft SyncAll counters (the split's and the one before the copy: one region).
    const int64_t cores = CoreCount();
    uint32_t blockDim = std::max<uint32_t>(PlanBlocks(planTiling), static_cast<uint32_t>(num_cores));
    blockDim = std::max<uint32_t>(blockDim, static_cast<uint32_t>(std::min<int64_t>(
                                                cores, static_cast<int64_t>(planTiling.rows) + num_cores)));
    // the kernel's SyncAll count rests on this: a split plan gives no block two (row, part)s
    TORCH_CHECK(planTiling.split <= 1 || blockDim >= planTiling.rows * planTiling.split,
                "avsg.plan_gather: internal: ", blockDim, " blocks for ", planTiling.rows, " rows x ",
                planTiling.split, " parts");
    const auto opts = topk_pos.options().dtype(at::kInt);
    const int64_t slices = static_cast<int64_t>(blockDim) * planTiling.wsPerCore;
    const int64_t syncWords = static_cast<int64_t>(blockDim) * kPlanSyncWords;
    at::Tensor workspace = PlanWorkspace(slices + syncWords, opts);
    at::Tensor sync = workspace.narrow(0, slices, syncWords);
    sync.zero_();
    at::Tensor out = at::zeros({num_cores, static_cast<int64_t>(kGatherCountSlot)}, opts);
    // without a block table the kernels never read it: any tensor of the call is a real address
    const at::Tensor& bt = block_table.has_value() ? *block_table : topk_pos;
    const at::Tensor& lens = valid_lens.has_value() ? *valid_lens : seq_lens;   // unread without dropPast

    PlanGatherTiling tiling;
    std::memset(&tiling, 0, sizeof(tiling));
    tiling.plan = planTiling;
    tiling.plan.publishSync = 1u;
    tiling.gather = make_tiling(a, 0, std::min<size_t>(kGatherMaxPairs, src.size()), addr.src, addr.dst);
    LaunchPlanGather(blockDim, tiling, topk_pos, seq_lens, lens, state, stats, rows, workspace, bt, out, sync);
    // More pairs than one tiling holds: the same miss lists, copied by gather launches of their own
    // (in stream order after the plan); their counts repeat the first launch's and are not kept.
    for (size_t first = kGatherMaxPairs; first < src.size(); first += kGatherMaxPairs) {
        const size_t count = std::min<size_t>(kGatherMaxPairs, src.size() - first);
        const GatherTiling t = make_tiling(a, first, count, addr.src, addr.dst);
        LaunchKernel("gather", AVSG_KERNEL(avsg_gather, gather), static_cast<uint32_t>(num_cores), t, miss_pos,
                     miss_slots, miss_counts, bt, at::zeros_like(out));
    }
    return {std::get<0>(views), miss_pos, miss_slots, miss_counts, out.select(1, 0).contiguous()};
}

}  // namespace
}  // namespace avsg

// The CPU library (_C, emulation) and the NPU library (_npu_ops) each register only their own
// dispatch key, so loading both never registers anything twice.
#ifdef AVSG_CPU_EMULATION
TORCH_LIBRARY_IMPL(avsg, CPU, m) {
    m.impl("plan_gather", &avsg::PlanGather);
}
#else
TORCH_LIBRARY_IMPL(avsg, PrivateUse1, m) {
    m.impl("plan_gather", &avsg::PlanGather);
}
#endif
