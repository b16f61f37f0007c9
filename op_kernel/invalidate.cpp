// Kernel entry of invalidate (AIV only): invalidate_kernel.h, tiling op_host/plan_tiling.h.
#include "invalidate_kernel.h"

extern "C" __global__ __aicore__ void avsg_invalidate(GM_ADDR state, GM_ADDR validLens, GM_ADDR tiling) {
    KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_AIV_ONLY);
    AscendC::TPipe pipe;
    avsg_kernel::InvalidateKernel op;
    op.Init(&pipe, state, validLens, tiling);
    op.Process();
}
