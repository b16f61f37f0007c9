// Kernel entry of reset (AIV only): reset_kernel.h, tiling op_host/plan_tiling.h.
#include "reset_kernel.h"

extern "C" __global__ __aicore__ void avsg_reset(GM_ADDR state, GM_ADDR rowMask, GM_ADDR tiling) {
    KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_AIV_ONLY);
    AscendC::TPipe pipe;
    avsg_kernel::ResetKernel op;
    op.Init(&pipe, state, rowMask, tiling);
    op.Process();
}
