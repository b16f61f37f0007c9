// split_slots_kernel.h: AscendC (Atlas A2 AIV) kernel of split_slots (reference.split_slots): per
// query token, the slots of its hits (resident before the step's copy) and of its misses (filled
// by it), valid entries first in selection order, then -1. Tiling: SplitSlotsTiling
// (op_host/split_slots_tiling.h). UB: the tiling, a half slot map of S + 1 words, six chunk
// vectors, four lane masks and a scalar (budget in split_slots_tiling.h). Entry: split_slots.cpp.
#pragma once
#include "kernel_tools.h"
#include "split_slots_tiling.h"

namespace avsg_kernel {

// Rows over cores (one core writes a whole output row, whose pitch is a multiple of 32 B). Per
// row: the slot map marks miss_slots[0 : clamp(miss_counts, 0, N)] that lie in [0, S) (scalar,
// one store per miss; entry S stays 0 as the target of every out-of-range lane). Per query token,
// chunk by chunk: a lane is valid when its slot is in [0, S) (two float compares; a cast to float
// keeps the sign and the order against S <= 2^15); its mark is gathered from the map at the slot
// clamped to [0, S] (so no index leaves the map whatever the input holds); miss = valid & marked,
// hit = valid & !marked; GatherMask compacts each class in lane order and the run is stored after
// the token's previous ones with exact-byte DMA; the token's tails get -1.
class SplitSlotsKernel {
public:
    __aicore__ inline SplitSlotsKernel() {}

    __aicore__ inline void Init(TPipe* pipe, GM_ADDR slots, GM_ADDR missSlots, GM_ADDR missCounts, GM_ADDR hits,
                                GM_ADDR misses, GM_ADDR tiling) {
        LoadTiling(pipe, tilingBuf_, t_, tiling);
        const uint64_t last = static_cast<uint64_t>(t_.rows) - 1;
        slotsGm_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(slots), last * t_.slotsPitch + t_.entries);
        missGm_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(missSlots), last * t_.missPitch + t_.entries);
        countGm_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(missCounts), last * t_.countStride + 1);
        hitsGm_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(hits), static_cast<uint64_t>(t_.rows) * t_.outPitch);
        missesGm_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(misses), static_cast<uint64_t>(t_.rows) * t_.outPitch);
        constexpr uint32_t ch = avsg::kSplitChunk;
        pipe->InitBuffer(mapBuf_, t_.mapLen * 2);
        pipe->InitBuffer(selBuf_, ch * 4);
        pipe->InitBuffer(selFBuf_, ch * 4);
        pipe->InitBuffer(idxBuf_, ch * 4);
        pipe->InitBuffer(markBuf_, ch * 2);
        pipe->InitBuffer(hitBuf_, ch * 4);
        pipe->InitBuffer(missBuf_, ch * 4);
        pipe->InitBuffer(negBuf_, ch * 4);
        pipe->InitBuffer(validBuf_, ch / 8);
        pipe->InitBuffer(belowBuf_, ch / 8);
        pipe->InitBuffer(markedBuf_, ch / 8);
        pipe->InitBuffer(scalarBuf_, 32);
    }

    __aicore__ inline void Process() {
        const uint32_t blocks = static_cast<uint32_t>(GetBlockNum());
        // lanes past a token's last chunk hold -1 (invalid) before any load
        Duplicate(selBuf_.Get<int32_t>(), -1, static_cast<int32_t>(avsg::kSplitChunk));
        Duplicate(negBuf_.Get<int32_t>(), -1, static_cast<int32_t>(avsg::kSplitChunk));
        for (uint32_t r = static_cast<uint32_t>(GetBlockIdx()); r < t_.rows; r += blocks) {
            MarkMisses(r);
            for (uint32_t q = 0; q < t_.queries; ++q) SplitToken(r, q);
        }
        Sync<HardEvent::MTE3_MTE2>();
    }

private:
    // The row's slot map: 1 at every slot the step's copy fills, 0 elsewhere (and at S).
    __aicore__ inline void MarkMisses(uint32_t r) {
        LocalTensor<int32_t> sc = scalarBuf_.Get<int32_t>(), ms = idxBuf_.Get<int32_t>();
        LocalTensor<half> map = mapBuf_.Get<half>();
        Sync<HardEvent::S_MTE2>();
        DataCopyPad(sc, countGm_[static_cast<uint64_t>(r) * t_.countStride], DataCopyExtParams(1, 4, 0, 0, 0),
                    DataCopyPadExtParams<int32_t>(true, 0, 7, 0));
        Sync<HardEvent::MTE2_S>();
        const int32_t raw = sc.GetValue(0);
        const uint32_t count = raw <= 0 ? 0u : MinU(static_cast<uint32_t>(raw), t_.entries);   // clamp(0, N)
        PipeBarrier<PIPE_V>();   // the previous row's Gathers read the map
        Duplicate(map, static_cast<half>(0.0f), static_cast<int32_t>(t_.mapLen));
        Sync<HardEvent::V_S>();
        const half one = static_cast<half>(1.0f);
        for (uint32_t off = 0; off < count; off += avsg::kSplitChunk) {
            const uint32_t n = MinU(avsg::kSplitChunk, count - off);
            Sync<HardEvent::S_MTE2>();
            Sync<HardEvent::V_MTE2>();   // ms is the offsets vector of the previous token's Gathers
            LoadInts(ms, missGm_[static_cast<uint64_t>(r) * t_.missPitch + off], n, -1);
            Sync<HardEvent::MTE2_S>();
            for (uint32_t i = 0; i < n; ++i) {
                const int32_t s = ms.GetValue(i);
                if (s >= 0 && static_cast<uint32_t>(s) < t_.capacity) map.SetValue(static_cast<uint32_t>(s), one);
            }
        }
        Sync<HardEvent::S_V>();
    }

    // Query token q of row r: its hit list and its miss list, K entries each.
    __aicore__ inline void SplitToken(uint32_t r, uint32_t q) {
        LocalTensor<int32_t> sel = selBuf_.Get<int32_t>(), idx = idxBuf_.Get<int32_t>();
        LocalTensor<float> selF = selFBuf_.Get<float>();
        LocalTensor<half> map = mapBuf_.Get<half>(), mark = markBuf_.Get<half>();
        LocalTensor<int32_t> hitOut = hitBuf_.Get<int32_t>(), missOut = missBuf_.Get<int32_t>();
        LocalTensor<uint8_t> valid = validBuf_.Get<uint8_t>(), below = belowBuf_.Get<uint8_t>();
        LocalTensor<uint8_t> marked = markedBuf_.Get<uint8_t>();
        const uint32_t K = t_.topk;
        const uint64_t in = static_cast<uint64_t>(r) * t_.slotsPitch + static_cast<uint64_t>(q) * K;
        const uint64_t out = static_cast<uint64_t>(r) * t_.outPitch + static_cast<uint64_t>(q) * K;
        const float capF = static_cast<float>(t_.capacity);
        uint32_t nHit = 0, nMiss = 0;
        for (uint32_t off = 0; off < K; off += avsg::kSplitChunk) {
            const uint32_t n = MinU(avsg::kSplitChunk, K - off);
            const uint32_t nr = avsg::RoundUp(n, 128);   // lanes the compares cover (256 B repeats)
            Sync<HardEvent::V_MTE2>();
            LoadInts(sel, slotsGm_[in + off], n, -1);
            Sync<HardEvent::MTE2_V>();
            Cast(selF, sel, RoundMode::CAST_RINT, nr);   // rounding is monotone: the sign and "< S" survive
            Maxs(idx, sel, 0, nr);
            PipeBarrier<PIPE_V>();
            avsg::CompareScalarAll(valid, selF, 0.0f, CMPMODE::GE, nr);
            avsg::CompareScalarAll(below, selF, capF, CMPMODE::LT, nr);
            Mins(idx, idx, static_cast<int32_t>(t_.capacity), nr);   // [0, S]: S is the map's 0 sentinel
            PipeBarrier<PIPE_V>();
            Muls(idx, idx, 2, nr);   // byte offsets of half words
            And(U16(below), U16(below), U16(valid), nr / 16);   // below := in [0, S)
            PipeBarrier<PIPE_V>();
            Gather(mark, map, idx.ReinterpretCast<uint32_t>(), 0u, nr);
            PipeBarrier<PIPE_V>();
            avsg::CompareScalarAll(marked, mark, static_cast<half>(0.0f), CMPMODE::GT, nr);
            PipeBarrier<PIPE_V>();
            And(U16(valid), U16(below), U16(marked), nr / 16);   // valid := miss
            Not(U16(marked), U16(marked), nr / 16);
            PipeBarrier<PIPE_V>();
            And(U16(below), U16(below), U16(marked), nr / 16);   // below := hit
            PipeBarrier<PIPE_V>();
            Sync<HardEvent::MTE3_V>();   // the previous chunk's runs are stored
            uint64_t h = 0, m = 0;
            GatherMask(hitOut, sel, below.ReinterpretCast<uint32_t>(), true, n, GatherMaskParams(1, 1, 8, 0), h);
            GatherMask(missOut, sel, valid.ReinterpretCast<uint32_t>(), true, n, GatherMaskParams(1, 1, 8, 0), m);
            Sync<HardEvent::V_S>();
            Sync<HardEvent::V_MTE3>();
            StoreInts(hitsGm_[out + nHit], hitOut, static_cast<uint32_t>(h));
            StoreInts(missesGm_[out + nMiss], missOut, static_cast<uint32_t>(m));
            nHit += static_cast<uint32_t>(h);
            nMiss += static_cast<uint32_t>(m);
        }
        FillNeg(hitsGm_, out + nHit, K - nHit);
        FillNeg(missesGm_, out + nMiss, K - nMiss);
    }

    // -1 over [at, at + len) of an output (negBuf_ was filled before the first store's V_MTE3).
    __aicore__ inline void FillNeg(const GlobalTensor<int32_t>& g, uint64_t at, uint32_t len) {
        const LocalTensor<int32_t> neg = negBuf_.Get<int32_t>();
        for (uint32_t o = 0; o < len; o += avsg::kSplitChunk) StoreInts(g[at + o], neg, MinU(avsg::kSplitChunk, len - o));
    }

    __aicore__ inline static LocalTensor<uint16_t> U16(const LocalTensor<uint8_t>& m) {
        return m.ReinterpretCast<uint16_t>();
    }

    avsg::SplitSlotsTiling t_;
    GlobalTensor<int32_t> slotsGm_, missGm_, countGm_, hitsGm_, missesGm_;
    TBuf<TPosition::VECCALC> tilingBuf_, mapBuf_, selBuf_, selFBuf_, idxBuf_, markBuf_, hitBuf_, missBuf_, negBuf_;
    TBuf<TPosition::VECCALC> validBuf_, belowBuf_, markedBuf_, scalarBuf_;
};

}  // namespace avsg_kernel
