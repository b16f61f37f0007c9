// Kernel entry of the calibration microkernel (AIV only, launched on one block). Compiled like
// the other kernels: against the CPU emulation (strict and fast) into the CPU op library, and by
// CANN's ascendc_library (op_host/npu/CMakeLists.txt) into the NPU one. Arguments: values int32
// [L], out int32 [kCalibOutLen], tiling: a device copy of avsg::CalibrateTiling
// (op_host/calibrate_tiling.h). The kernel body is in calibrate_kernel.h.
#include "kernel_operator.h"
#include "calibrate_kernel.h"

extern "C" __global__ __aicore__ void avsg_calibrate(GM_ADDR values, GM_ADDR out, GM_ADDR tiling) {
    KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_AIV_ONLY);
    AscendC::TPipe pipe;
    avsg_calib::CalibrateKernel op;
    op.Init(&pipe, values, out, tiling);
    op.Process();
}
