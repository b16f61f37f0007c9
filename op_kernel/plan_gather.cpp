// Kernel entry of plan_gather (AIV only): the hash plan and the gather of its misses as one
// launch, composed of the two kernels as their own launches run them; nothing of either is
// reimplemented here. Tiling: op_host/plan_gather_tiling.h (the plan's tiling, then the
// gather's); host: op_host/plan_gather_host.cpp. Specification: reference.plan_gather (= plan, then
// gather of its outputs).
//   1. the plan (plan_kernel.h, PlanOnPipe) on every block: rows r = block, block + blocks, ...
//      or, with the split lookup, one (row, part) per block; blocks past the plan's only join the
//      SyncAlls. It writes slots, miss_pos, miss_slots, miss_counts (-1 for a rejected
//      row) and the state, all by DMA.
//   2. one soft SyncAll over every block (counters `sync`, int32 [blocks, 8], zeroed by the host
//      per launch; the host passes the split lookup's counters, which follow the workspace slices,
//      so a split plan's blocks call SyncAll twice on one region, as the soft form counts: each
//      block's counter is the number of its calls): the copy below reads every row's miss lists,
//      which other blocks wrote. The SyncAll starts with PipeBarrier<PIPE_ALL>, so a block's
//      own output DMAs are complete before it arrives. The plan itself calls it (tiling
//      publishSync, always set by the host) once every row of the block has its miss lists final
//      (after the victims, miss_counts out: PlanBlockOutput::PublishMisses): a block of several
//      rows plans its idle rows first and meets the others at the publish of its last other row
//      (PlanKernel::PlanRows); that row's owner then finishes it (lives, insert, stash, slots,
//      state) while the other blocks already copy. The copy reads only the counts, the first count
//      entries of each miss list, host rows and the block table; the rest of the plan writes the
//      slots output, the lists' -1 tails past the count (exact-byte stores), the stats and the
//      state: nothing one side writes after the SyncAll, the other reads. (A tiling without
//      publishSync, which no host makes, would meet the blocks here, after the whole plan.)
//   3. the gather (gather_kernel.h) of the miss lists the plan wrote, on a reset pipe (the plan
//      held all of UB), by numCores of its own tiling's cores: core c on block (rows + c) mod
//      blocks, so the copy starts on the blocks past the rows' owners (the host sizes the launch
//      for them: op_host/plan_gather_host.cpp). It clamps miss_counts
//      to [0, N], so a rejected row (-1) copies nothing, and copies a row's misses only, so no
//      slot the plan did not reserve for a position this step is written.
// Launched with the batch schedule mode on the NPU (it waits across cores: op_host/npu/split_launch.h).
#include "kernel_operator.h"
#include "plan_kernel.h"
#include "gather_kernel.h"
#include "plan_gather_tiling.h"

extern "C" __global__ __aicore__ void avsg_plan_gather(GM_ADDR topk, GM_ADDR seq, GM_ADDR validLens, GM_ADDR state,
                                                       GM_ADDR stats, GM_ADDR slots, GM_ADDR missPos,
                                                       GM_ADDR missSlots, GM_ADDR missCounts, GM_ADDR workspace,
                                                       GM_ADDR blockTable, GM_ADDR countOut, GM_ADDR sync,
                                                       GM_ADDR tiling) {
    KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_AIV_ONLY);
    AscendC::TPipe pipe;
    const uint32_t owners = avsg_kernel::PlanOnPipe<avsg_kernel::MatchHash>(
        &pipe, topk, seq, validLens, state, stats, slots, missPos, missSlots, missCounts, workspace, tiling);
    // Every pipe idle before the plan's buffers are given up. TPipe::Reset returns the pipe to its
    // initial state, buffers and event ids free (A2 supported: asc-devkit 82b89a15f,
    // docs/zh/api/SIMD-API/基础API/资源管理/TPipe/Reset.md; include/basic_api/kernel_tpipe.h:278,
    // impl/basic_api/kernel_tpipe_impl.h:606 first waits for the buffers' pending free events).
    AscendC::PipeBarrier<PIPE_ALL>();
    pipe.Reset();
    if (owners == 0) {                            // the plan has not met the other blocks yet
        const uint32_t blocks = static_cast<uint32_t>(AscendC::GetBlockNum());
        AscendC::TBuf<AscendC::TPosition::VECCALC> syncBuf;
        pipe.InitBuffer(syncBuf, blocks * avsg::kPlanSyncWords * sizeof(int32_t));
        AscendC::GlobalTensor<int32_t> counters;
        counters.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(sync), blocks * avsg::kPlanSyncWords);
        AscendC::SyncAll(counters, syncBuf.Get<int32_t>(), 0);
    }
    pipe.Reset();
    avsg::GatherKernel copy;
    copy.Init(missPos, missSlots, missCounts, blockTable, countOut, tiling + avsg::kPlanGatherGatherOffset, &pipe,
              owners);
    copy.Process();
}
