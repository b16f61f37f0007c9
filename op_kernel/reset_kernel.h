// reset_kernel.h: AscendC (Atlas A2 AIV) kernel of reset (reference.reset). Tiling: PlanTiling
// (op_host/plan_tiling.h). UB: the tiling, a -1 and a 0 fill vector, the row flag and the header
// it writes. Entry: reset.cpp.
#pragma once
#include "kernel_tools.h"

namespace avsg_kernel {

// Rows with row_mask set return to the empty state: -1 everywhere except bucket_slot, stash_slot
// and the header, which are 0, then the header's geometry words (reference.reset). Nothing is read
// from the row, so reset also repairs a corrupted one. Duplicate + DataCopy per section.
class ResetKernel {
public:
    __aicore__ inline ResetKernel() {}

    __aicore__ inline void Init(TPipe* pipe, GM_ADDR state, GM_ADDR rowMask, GM_ADDR tiling) {
        LoadTiling(pipe, tilingBuf_, t_, tiling);
        stateGm_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(state), static_cast<uint64_t>(t_.rows) * t_.width);
        maskGm_.SetGlobalBuffer(reinterpret_cast<__gm__ uint8_t*>(rowMask), t_.rows);
        pipe->InitBuffer(negBuf_, t_.fillChunk * 4);
        pipe->InitBuffer(zeroBuf_, t_.fillChunk * 4);
        pipe->InitBuffer(flagBuf_, 32);
        pipe->InitBuffer(headerBuf_, 32);
    }
    __aicore__ inline void Process() {
        const uint32_t blocks = static_cast<uint32_t>(GetBlockNum());
        LocalTensor<int32_t> neg = negBuf_.Get<int32_t>(), zero = zeroBuf_.Get<int32_t>();
        LocalTensor<uint8_t> flag = flagBuf_.Get<uint8_t>();
        LocalTensor<int32_t> hdr = headerBuf_.Get<int32_t>();
        Duplicate(neg, -1, t_.fillChunk);
        Duplicate(zero, 0, t_.fillChunk);
        Duplicate(hdr, 0, avsg::kHeaderWords);
        Sync<HardEvent::V_S>();
        hdr.SetValue(0, static_cast<int32_t>(avsg::kHeaderMagic));
        hdr.SetValue(avsg::kHeaderCapacity, static_cast<int32_t>(t_.capacity));
        hdr.SetValue(avsg::kHeaderBuckets, static_cast<int32_t>(t_.buckets));
        hdr.SetValue(avsg::kHeaderLifetime, static_cast<int32_t>(t_.lifetime));
        hdr.SetValue(avsg::kHeaderPolicy, static_cast<int32_t>(t_.policy));
        hdr.SetValue(avsg::kHeaderMaxContext, static_cast<int32_t>(t_.maxContext));
        hdr.SetValue(avsg::kHeaderActive, static_cast<int32_t>(t_.capacity));
        Sync<HardEvent::S_MTE3>();
        Sync<HardEvent::V_MTE3>();
        for (uint32_t r = static_cast<uint32_t>(GetBlockIdx()); r < t_.rows; r += blocks) {
            Sync<HardEvent::S_MTE2>();
            DataCopyPad(flag, maskGm_[r], DataCopyExtParams(1, 1, 0, 0, 0), DataCopyPadExtParams<uint8_t>(true, 0, 31, 0));
            Sync<HardEvent::MTE2_S>();
            if (flag.GetValue(0) == 0) continue;
            const uint64_t base = static_cast<uint64_t>(r) * t_.width;
            DataCopy(stateGm_[base], hdr, avsg::kHeaderWords);
            Fill(base + avsg::kHeaderWords, avsg::kStateHeaderLen - avsg::kHeaderWords, zero);
            Fill(base + t_.secOff[avsg::SEC_BS], t_.secLen[avsg::SEC_BS], neg);   // never used (int16 -1 pairs)
            Fill(base + t_.secOff[avsg::SEC_SP], t_.capPad, neg);
            Fill(base + t_.secOff[avsg::SEC_SL], t_.secLen[avsg::SEC_SL], neg);   // int16 -1 pairs
            Fill(base + t_.secOff[avsg::SEC_SK], t_.capPad, neg);
            Fill(base + t_.secOff[avsg::SEC_SS], t_.capPad, zero);
            for (uint32_t sec = avsg::SEC_SC; sec <= avsg::SEC_HT; ++sec)   // reuse policy state
                Fill(base + t_.secOff[sec], t_.secLen[sec], zero);
        }
        Sync<HardEvent::MTE3_MTE2>();
    }

private:
    __aicore__ inline void Fill(uint64_t off, uint32_t len, const LocalTensor<int32_t>& src) {
        for (uint32_t o = 0; o < len; o += t_.fillChunk) DataCopy(stateGm_[off + o], src, MinU(t_.fillChunk, len - o));
    }
    PlanTiling t_;
    GlobalTensor<int32_t> stateGm_;
    GlobalTensor<uint8_t> maskGm_;
    TBuf<TPosition::VECCALC> tilingBuf_, negBuf_, zeroBuf_, flagBuf_, headerBuf_;
};

}  // namespace avsg_kernel
