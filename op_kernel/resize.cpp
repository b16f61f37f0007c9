// Kernel entry of resize (AIV only): resize_kernel.h, tiling ResizeTiling in op_host/plan_tiling.h.
#include "resize_kernel.h"

extern "C" __global__ __aicore__ void avsg_resize(GM_ADDR state, GM_ADDR target, GM_ADDR srcSlots,
                                                  GM_ADDR dstSlots, GM_ADDR moveCounts, GM_ADDR tiling) {
    KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_AIV_ONLY);
    AscendC::TPipe pipe;
    avsg_kernel::ResizeKernel op;
    op.Init(&pipe, state, target, srcSlots, dstSlots, moveCounts, tiling);
    op.Process();
}
