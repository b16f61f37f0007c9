// Kernel entries of plan and plan_dual_pointer (AIV only). The kernel is plan_kernel.h (its
// blocks in plan/); the tiling struct is op_host/plan_tiling.h. On the host these compile
// against the CPU emulation (emulation) and run through avsg_emu::launch.
#include "plan_kernel.h"

// validLens: int32 [R] when the tiling's dropPast is set (plan(valid_lens=...)), else unread.
extern "C" __global__ __aicore__ void avsg_plan(GM_ADDR topk, GM_ADDR seq, GM_ADDR validLens, GM_ADDR state,
                                                GM_ADDR stats, GM_ADDR slots, GM_ADDR missPos, GM_ADDR missSlots,
                                                GM_ADDR missCounts, GM_ADDR workspace, GM_ADDR tiling) {
    KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_AIV_ONLY);
    avsg_kernel::RunPlan<avsg_kernel::MatchHash>(topk, seq, validLens, state, stats, slots, missPos, missSlots,
                                                 missCounts, workspace, tiling);
}

extern "C" __global__ __aicore__ void avsg_plan_dual_pointer(GM_ADDR topk, GM_ADDR seq, GM_ADDR validLens,
                                                             GM_ADDR state, GM_ADDR stats, GM_ADDR slots,
                                                             GM_ADDR missPos, GM_ADDR missSlots,
                                                             GM_ADDR missCounts, GM_ADDR workspace, GM_ADDR tiling) {
    KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_AIV_ONLY);
    avsg_kernel::RunPlan<avsg_kernel::MatchDualPointer>(topk, seq, validLens, state, stats, slots, missPos,
                                                        missSlots, missCounts, workspace, tiling);
}
