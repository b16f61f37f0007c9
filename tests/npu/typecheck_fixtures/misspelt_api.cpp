// Negative control for scripts/typecheck_ascendc.py: the good kernel with one misspelt API
// (PipeBarier). Names undeclared in our files are never stubbed, so the check must reject it.
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
    PipeBarier<PIPE_ALL>();   // WRONG: misspelt
    AscendC::Adds(v, v, static_cast<int32_t>(1), 64);
    AscendC::PipeBarrier<PIPE_ALL>();
    AscendC::DataCopy(out, v, 64);
}
