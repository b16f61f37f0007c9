// Kernel entry of split_slots (AIV only): split_slots_kernel.h, tiling op_host/split_slots_tiling.h.
#include "split_slots_kernel.h"

extern "C" __global__ __aicore__ void avsg_split_slots(GM_ADDR slots, GM_ADDR missSlots, GM_ADDR missCounts,
                                                       GM_ADDR hits, GM_ADDR misses, GM_ADDR tiling) {
    KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_AIV_ONLY);
    AscendC::TPipe pipe;
    avsg_kernel::SplitSlotsKernel op;
    op.Init(&pipe, slots, missSlots, missCounts, hits, misses, tiling);
    op.Process();
}
