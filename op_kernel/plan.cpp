// Kernel entries of plan, plan_dual_pointer, invalidate and reset (AIV only). The class bodies
// are in plan_kernel.h; the tiling struct in op_host/plan_tiling.h. On the host these compile
// against the CPU emulation (op_kernel/cpu) and run through avsg_emu::launch.
#include "plan_kernel.h"
#include "resize_kernel.h"

extern "C" __global__ __aicore__ void avsg_plan(GM_ADDR topk, GM_ADDR seq, GM_ADDR state, GM_ADDR stats,
                                                GM_ADDR slots, GM_ADDR missPos, GM_ADDR missSlots,
                                                GM_ADDR missCounts, GM_ADDR workspace, GM_ADDR tiling) {
    KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_AIV_ONLY);
    AscendC::TPipe pipe;
    avsg_kernel::PlanKernel<false> op;
    op.Init(&pipe, topk, seq, state, stats, slots, missPos, missSlots, missCounts, workspace, tiling);
    op.Process();
}

extern "C" __global__ __aicore__ void avsg_plan_dual_pointer(GM_ADDR topk, GM_ADDR seq, GM_ADDR state,
                                                             GM_ADDR stats, GM_ADDR slots, GM_ADDR missPos,
                                                             GM_ADDR missSlots, GM_ADDR missCounts,
                                                             GM_ADDR workspace, GM_ADDR tiling) {
    KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_AIV_ONLY);
    AscendC::TPipe pipe;
    avsg_kernel::PlanKernel<true> op;
    op.Init(&pipe, topk, seq, state, stats, slots, missPos, missSlots, missCounts, workspace, tiling);
    op.Process();
}

extern "C" __global__ __aicore__ void avsg_invalidate(GM_ADDR state, GM_ADDR validLens, GM_ADDR tiling) {
    KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_AIV_ONLY);
    AscendC::TPipe pipe;
    avsg_kernel::InvalidateKernel op;
    op.Init(&pipe, state, validLens, tiling);
    op.Process();
}

extern "C" __global__ __aicore__ void avsg_resize(GM_ADDR state, GM_ADDR target, GM_ADDR srcSlots,
                                                  GM_ADDR dstSlots, GM_ADDR moveCounts, GM_ADDR tiling) {
    KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_AIV_ONLY);
    AscendC::TPipe pipe;
    avsg_kernel::ResizeKernel op;
    op.Init(&pipe, state, target, srcSlots, dstSlots, moveCounts, tiling);
    op.Process();
}

extern "C" __global__ __aicore__ void avsg_reset(GM_ADDR state, GM_ADDR rowMask, GM_ADDR tiling) {
    KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_AIV_ONLY);
    AscendC::TPipe pipe;
    avsg_kernel::ResetKernel op;
    op.Init(&pipe, state, rowMask, tiling);
    op.Process();
}
