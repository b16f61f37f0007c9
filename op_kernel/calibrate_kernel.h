// calibrate_kernel.h: the calibration microkernel (AscendC, Atlas A2 AIV, one block).
//
// The cost model (python/avsg/bench/hardware.py) turns the emulation's counted work into time
// with per-access and per-instruction constants that are assumptions until measured. This kernel
// repeats, `iters` times, exactly one operation of the plan kernel with the plan's call shape and
// dtypes (op_kernel/plan_kernel.h), each followed by what the plan puts after it, so that an NPU
// timing over several iters gives the cost of one iteration as a slope (launch overhead and the
// constant prologue fall into the intercept):
//   scalar      idx = table[idx] & (L-1); acc += idx          (LocalTensor::GetValue on UB)
//   gather      Gather(dst, table, offsets, 0, W) + PipeBarrier<PIPE_V>, W = kPlanProbes*kPlanChunk
//               int32 lanes (the plan's all-probe gather); dst becomes the next offsets
//   sort        Sort<float, true>(dst, concat, index, tmp, nc/32) + PipeBarrier<PIPE_V> (SortAscending)
//   gathermask  GatherMask(int32 dst, int32 src, uint32 pattern, true, nc, GatherMaskParams(1,1,8,0),
//               cnt) + PipeBarrier<PIPE_V> (Classify), the pattern alternating between two masks
// The scalar and gather loops are dependent chains (each step reads the previous result), so they
// measure latency, which is what the plan's scalar merge and chained lookups pay. Sort and
// GatherMask repeat on the same input; the barrier makes each wait for the previous one to
// retire, as in the plan. Every mode writes a checksum (calibrate_tiling.h) that a Python golden
// recomputes, so no iteration is dead and the emulation's result is checked.
// Table entries are used modulo L (L a power of two), so any input is safe: no value is checked
// on the host and no index leaves the table.
#pragma once
#include "kernel_operator.h"
#include "kernel_compat.h"
#include "calibrate_tiling.h"

namespace avsg_calib {
using namespace AscendC;
using avsg::CalibrateTiling;

template <HardEvent E>
__aicore__ inline void CalibSync() {
    TEventID id = GetTPipePtr()->FetchEventID(E);
    SetFlag<E>(id);
    WaitFlag<E>(id);
}

class CalibrateKernel {
public:
    __aicore__ inline CalibrateKernel() {}

    __aicore__ inline void Init(TPipe* pipe, GM_ADDR values, GM_ADDR out, GM_ADDR tiling) {
        // The tiling by DMA, not scalar GM reads (which go through the non-coherent DCache; the
        // plan kernel's LoadTiling explains why).
        constexpr uint32_t kWords = sizeof(CalibrateTiling) / 4;
        GlobalTensor<uint32_t> tg;
        tg.SetGlobalBuffer(reinterpret_cast<__gm__ uint32_t*>(tiling), kWords);
        pipe->InitBuffer(tilingBuf_, sizeof(CalibrateTiling));
        LocalTensor<uint32_t> tub = tilingBuf_.Get<uint32_t>();
        DataCopyPad(tub, tg, DataCopyExtParams(1, static_cast<uint32_t>(sizeof(CalibrateTiling)), 0, 0, 0),
                    DataCopyPadExtParams<uint32_t>(false, 0, 0, 0));
        CalibSync<HardEvent::MTE2_S>();
        uint32_t* dst = reinterpret_cast<uint32_t*>(&t_);
        for (uint32_t i = 0; i < kWords; ++i) dst[i] = tub.GetValue(i);
        ascendc_assert(t_.tableLen >= avsg::kCalibGatherLanes && t_.tableLen <= avsg::kCalibMaxTable &&
                       (t_.tableLen & (t_.tableLen - 1)) == 0);

        L_ = static_cast<uint32_t>(t_.tableLen);
        valuesGm_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(values), L_);
        outGm_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(out), avsg::kCalibOutLen);

        constexpr uint32_t W = avsg::kCalibGatherLanes, nc = avsg::kCalibVectorLanes;
        pipe->InitBuffer(tableBuf_, avsg::kCalibMaxTable * 4);
        pipe->InitBuffer(vecABuf_, W * 4);
        pipe->InitBuffer(vecBBuf_, W * 4);
        pipe->InitBuffer(maskBuf_, 2 * avsg::RoundUp(nc / 8, 32));
        pipe->InitBuffer(hdrBuf_, avsg::kCalibHeaderWords * 4);
        // Sort32's alignment (dst 256 B, sources 128 B) is not promised by TPipe: cut the sort
        // region at the first 256 B boundary of a buffer with slack, as the plan kernel does.
        const uint32_t sortBytes = avsg::kPlanSortVectors * nc * 4;
        pipe->InitBuffer(sortBuf_, sortBytes + avsg::kPlanSortAlignSlack);
        const uint32_t pad = static_cast<uint32_t>(
            (avsg::kPlanSortAlign - avsg::UbAddr(sortBuf_.Get<uint8_t>()) % avsg::kPlanSortAlign) %
            avsg::kPlanSortAlign);
        LocalTensor<float> sb = sortBuf_.GetWithOffset<float>(avsg::kPlanSortVectors * nc, pad);
        sConcat_ = sb[0];
        sIdx_ = sb[nc].template ReinterpretCast<uint32_t>();
        sDst_ = sb[2 * nc];
        sTmp_ = sb[4 * nc];
        sOutV_ = sb[6 * nc];
        sOutI_ = sb[7 * nc].template ReinterpretCast<uint32_t>();
        sConcat_.SetSize(nc); sIdx_.SetSize(nc); sDst_.SetSize(2 * nc); sTmp_.SetSize(2 * nc);
        sOutV_.SetSize(nc); sOutI_.SetSize(nc);
        table_ = tableBuf_.Get<int32_t>();
        vecA_ = vecABuf_.Get<int32_t>();
        vecB_ = vecBBuf_.Get<int32_t>();
        LocalTensor<uint8_t> m = maskBuf_.Get<uint8_t>();
        mask0_ = m;
        mask1_ = m[avsg::RoundUp(nc / 8, 32)];
        hdr_ = hdrBuf_.Get<int32_t>();
    }

    __aicore__ inline void Process() {
        if (GetBlockIdx() != 0) return;   // one core: the per-iteration cost of one AIV
        uint32_t a = 0, b = 0;
        switch (t_.mode) {
            case avsg::kCalibScalar: Scalar(a, b); break;
            case avsg::kCalibGather: GatherChain(); break;
            case avsg::kCalibSort: SortRepeat(); break;
            case avsg::kCalibGatherMask: GatherMaskRepeat(a, b); break;
            default: ascendc_assert(false); return;
        }
        // The header last: its scalar writes wait for nothing the vector pipe still holds.
        hdr_.SetValue(0, static_cast<int32_t>(a));
        hdr_.SetValue(1, static_cast<int32_t>(b));
        hdr_.SetValue(2, static_cast<int32_t>(static_cast<uint32_t>(t_.iters)));
        hdr_.SetValue(3, static_cast<int32_t>(t_.mode));
        for (uint32_t i = 4; i < avsg::kCalibHeaderWords; ++i) hdr_.SetValue(i, 0);
        CalibSync<HardEvent::S_MTE3>();
        DataCopyPad(outGm_, hdr_, DataCopyExtParams(1, avsg::kCalibHeaderWords * 4, 0, 0, 0));
    }

private:
    __aicore__ inline void Load(const LocalTensor<int32_t>& dst, uint32_t n) {
        DataCopyPad(dst, valuesGm_, DataCopyExtParams(1, n * 4, 0, 0, 0),
                    DataCopyPadExtParams<int32_t>(false, 0, 0, 0));
    }
    __aicore__ inline void Store(uint32_t at, const LocalTensor<int32_t>& src, uint32_t n) {
        if (n == 0) return;
        DataCopyPad(outGm_[avsg::kCalibHeaderWords + at], src, DataCopyExtParams(1, n * 4, 0, 0, 0));
    }

    __aicore__ inline void Scalar(uint32_t& idx, uint32_t& acc) {
        Load(table_, L_);
        CalibSync<HardEvent::MTE2_S>();
        const uint32_t mask = L_ - 1;
        idx = 0;
        acc = 0;
        for (uint64_t i = 0; i < t_.iters; ++i) {
            idx = static_cast<uint32_t>(table_.GetValue(idx)) & mask;
            acc += idx;
        }
    }

    // table and start offsets (the table's first W entries), both as byte offsets modulo L.
    __aicore__ inline void GatherChain() {
        constexpr uint32_t W = avsg::kCalibGatherLanes;
        Load(table_, L_);
        Load(vecA_, W);
        CalibSync<HardEvent::MTE2_V>();
        // x mod L as u16 And against [L-1, 0] per int32 lane (And is 16-bit only on A2; plan AndMask)
        Duplicate(vecB_, static_cast<int32_t>(L_ - 1), W);
        PipeBarrier<PIPE_V>();
        for (uint32_t c = 0; c < L_; c += W)
            And(table_[c].ReinterpretCast<uint16_t>(), table_[c].ReinterpretCast<uint16_t>(),
                vecB_.ReinterpretCast<uint16_t>(), 2 * W);
        And(vecA_.ReinterpretCast<uint16_t>(), vecA_.ReinterpretCast<uint16_t>(), vecB_.ReinterpretCast<uint16_t>(),
            2 * W);
        PipeBarrier<PIPE_V>();
        ShiftLeft(table_, table_, static_cast<int32_t>(2), static_cast<int32_t>(L_));
        ShiftLeft(vecA_, vecA_, static_cast<int32_t>(2), static_cast<int32_t>(W));
        PipeBarrier<PIPE_V>();
        for (uint64_t i = 0; i < t_.iters; ++i) {
            const LocalTensor<int32_t>& from = (i & 1) == 0 ? vecA_ : vecB_;
            const LocalTensor<int32_t>& to = (i & 1) == 0 ? vecB_ : vecA_;
            Gather(to, table_, from.ReinterpretCast<uint32_t>(), 0u, W);
            PipeBarrier<PIPE_V>();
        }
        CalibSync<HardEvent::V_MTE3>();
        Store(0, (t_.iters & 1) == 0 ? vecA_ : vecB_, W);
    }

    // scores = float(values[0, nc)) (exact below 2^24), index = lane ids; the plan's sort region.
    __aicore__ inline void SortRepeat() {
        constexpr uint32_t nc = avsg::kCalibVectorLanes;
        Load(vecA_, nc);
        CalibSync<HardEvent::MTE2_V>();
        Cast(sConcat_, vecA_, RoundMode::CAST_RINT, nc);
        CreateVecIndex(sIdx_.template ReinterpretCast<int32_t>(), 0, nc);
        PipeBarrier<PIPE_V>();
        ascendc_assert(avsg::UbAddr(sConcat_) % 128 == 0 && avsg::UbAddr(sIdx_) % 128 == 0 &&
                       avsg::UbAddr(sDst_) % 256 == 0);
        for (uint64_t i = 0; i < t_.iters; ++i) {
            Sort<float, true>(sDst_, sConcat_, sIdx_, sTmp_, static_cast<int32_t>(nc / 32));
            PipeBarrier<PIPE_V>();
        }
        Extract(sOutV_, sOutI_, sDst_, static_cast<int32_t>(nc / 32));
        CalibSync<HardEvent::V_MTE3>();
        Store(0, sOutV_.template ReinterpretCast<int32_t>(), nc);
        Store(nc, sOutI_.template ReinterpretCast<int32_t>(), nc);
    }

    // src = values[0, nc); mask0 = lanes >= 0, mask1 = lanes < 0, used in turn.
    __aicore__ inline void GatherMaskRepeat(uint32_t& sum, uint32_t& last) {
        constexpr uint32_t nc = avsg::kCalibVectorLanes;
        Load(vecA_, nc);
        CalibSync<HardEvent::MTE2_V>();
        const LocalTensor<float> f = vecB_.ReinterpretCast<float>();
        Cast(f, vecA_, RoundMode::CAST_RINT, nc);
        PipeBarrier<PIPE_V>();
        avsg::CompareScalarAll(mask0_, f, 0.0f, CMPMODE::GE, nc);
        avsg::CompareScalarAll(mask1_, f, 0.0f, CMPMODE::LT, nc);
        PipeBarrier<PIPE_V>();
        const LocalTensor<int32_t> dst = vecB_[nc];
        sum = 0;
        last = 0;
        for (uint64_t i = 0; i < t_.iters; ++i) {
            uint64_t cnt = 0;
            GatherMask(dst, vecA_, ((i & 1) == 0 ? mask0_ : mask1_).ReinterpretCast<uint32_t>(), true, nc,
                       GatherMaskParams(1, 1, 8, 0), cnt);
            PipeBarrier<PIPE_V>();
            sum += static_cast<uint32_t>(cnt);
            last = static_cast<uint32_t>(cnt);
        }
        CalibSync<HardEvent::V_MTE3>();
        Store(0, dst, last);
    }

    CalibrateTiling t_;
    uint32_t L_ = 0;
    GlobalTensor<int32_t> valuesGm_, outGm_;
    TBuf<TPosition::VECCALC> tilingBuf_, tableBuf_, vecABuf_, vecBBuf_, maskBuf_, hdrBuf_, sortBuf_;
    LocalTensor<int32_t> table_, vecA_, vecB_, hdr_;
    LocalTensor<uint8_t> mask0_, mask1_;
    LocalTensor<float> sConcat_, sDst_, sTmp_, sOutV_;
    LocalTensor<uint32_t> sIdx_, sOutI_;
};

}  // namespace avsg_calib
