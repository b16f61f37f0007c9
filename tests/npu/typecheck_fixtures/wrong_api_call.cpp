// Negative control for scripts/typecheck_ascendc.py: the good kernel with one wrong API call
// (DataCopyParams has no field blockSize; it is blockLen). The check must reject it.
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
    AscendC::DataCopyParams p;
    p.blockSize = 8;   // WRONG: the field is blockLen
    AscendC::DataCopy(v, in, p);
    AscendC::PipeBarrier<PIPE_ALL>();
    AscendC::Adds(v, v, static_cast<int32_t>(1), 64);
    AscendC::PipeBarrier<PIPE_ALL>();
    AscendC::DataCopy(out, v, 64);
}
