// Kernel entry of the gather op. Compiled twice from this one source:
//   CPU backend: by the host compiler against the AscendC emulation in emulation
//                (-DAVSG_CPU_EMULATION=1), launched by op_host/gather_host.cpp;
//   NPU backend: by CANN's AscendC toolchain (op_host/npu/CMakeLists.txt, ascendc_library), which
//                generates aclrtlaunch_avsg_gather.h for ACLRT_LAUNCH_KERNEL(avsg_gather).
// Arguments: miss_pos / miss_slots int32 [R, N], miss_counts int32 [R], block_table int32
// [R, max_blocks] (unused, may be null, for a contiguous pool), countOut int32 [numCores, 8],
// tiling: a device copy of avsg::GatherTiling (op_host/gather_tiling.h).
#include "kernel_operator.h"
#include "gather_kernel.h"

extern "C" __global__ __aicore__ void avsg_gather(GM_ADDR missPos, GM_ADDR missSlots, GM_ADDR missCounts,
                                                  GM_ADDR blockTable, GM_ADDR countOut, GM_ADDR tiling)
{
    KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_AIV_ONLY);
    AscendC::TPipe pipe;
    avsg::GatherKernel op;
    op.Init(missPos, missSlots, missCounts, blockTable, countOut, tiling, &pipe);
    op.Process();
}
