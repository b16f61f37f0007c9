// Negative-control baseline for scripts/typecheck_ascendc.py (tests/npu/test_typecheck_ascendc.py):
// a correct kernel, so that the two broken copies next to it fail for their one mistake only.
#include "kernel_operator.h"

extern "C" __global__ __aicore__ void avsg_fixture(GM_ADDR src, GM_ADDR dst) {
    KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_AIV_ONLY);
    AscendC::TPipe pipe;
    AscendC::TBuf<AscendC::TPosition::VECCALC> buf;
    pipe.InitBuffer(buf, 256);
    AscendC::GlobalTensor<int32_t> in, out;
    in.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(src), 64);
    out.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(dst), 64);
    AscendC::LocalTensor<int32_t> v = buf.Get<int32_t>();
    AscendC::DataCopy(v, in, 64);
    AscendC::PipeBarrier<PIPE_ALL>();
    AscendC::Adds(v, v, static_cast<int32_t>(1), 64);
    AscendC::PipeBarrier<PIPE_ALL>();
    AscendC::DataCopy(out, v, 64);
}
