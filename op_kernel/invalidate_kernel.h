// invalidate_kernel.h: AscendC (Atlas A2 AIV) kernel of invalidate (reference.invalidate): every
// slot whose position is at or past the row's valid length is freed, and under the reuse policy
// its count and the ghosts of those positions go to 0 (the drop itself: drop_block.h, which the
// plan kernel runs too when it is given the valid lengths). Tiling: PlanTiling
// (op_host/plan_tiling.h). UB: the tiling, fillChunk-element pos / life / keep / notKeep (and
// count) vectors, one mask, the header and a scalar. Entry: invalidate.cpp.
#pragma once
#include "drop_block.h"

namespace avsg_kernel {

// Streams the row's slot_pos in fillChunk pieces; a piece holding a position at or past the
// limit has its slot_life (and counts) read, dropped and stored. Rows whose header does not match
// the geometry are left untouched.
class InvalidateKernel {
public:
    __aicore__ inline InvalidateKernel() {}

    __aicore__ inline void Init(TPipe* pipe, GM_ADDR state, GM_ADDR validLens, GM_ADDR tiling) {
        LoadTiling(pipe, tilingBuf_, t_, tiling);
        reuse_ = t_.secLen[avsg::SEC_SC] != 0;
        stateGm_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(state), static_cast<uint64_t>(t_.rows) * t_.width);
        lensGm_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(validLens), t_.rows);
        const uint32_t ch = t_.fillChunk;
        pipe->InitBuffer(posBuf_, ch * 4);
        pipe->InitBuffer(lifeBuf_, ch * 4);
        pipe->InitBuffer(life16Buf_, ch * 2);   // slot_life's int16 entries, widened in lifeBuf_
        state16Gm_.SetGlobalBuffer(reinterpret_cast<__gm__ int16_t*>(state), 2 * static_cast<uint64_t>(t_.rows) * t_.width);
        pipe->InitBuffer(keepBuf_, ch * 4);
        pipe->InitBuffer(notKeepBuf_, ch * 4);
        pipe->InitBuffer(maskBuf_, avsg::RoundUp(ch / 8, 32));
        pipe->InitBuffer(scalarBuf_, 32);
        pipe->InitBuffer(headerBuf_, 32);
        if (reuse_) pipe->InitBuffer(countBuf_, ch * 4);   // reuse: slot counts, ghosts
    }
    __aicore__ inline void Process() {
        const uint32_t blocks = static_cast<uint32_t>(GetBlockNum());
        LocalTensor<int32_t> pos = posBuf_.Get<int32_t>(), life = lifeBuf_.Get<int32_t>();
        const LocalTensor<int16_t> life16 = life16Buf_.Get<int16_t>();
        LocalTensor<int32_t> keep = keepBuf_.Get<int32_t>(), notKeep = notKeepBuf_.Get<int32_t>();
        const LocalTensor<float> top = scalarBuf_.Get<float>();   // DropTest's result (after the length's read)
        LocalTensor<uint8_t> drop = maskBuf_.Get<uint8_t>();
        LocalTensor<int32_t> sc = scalarBuf_.Get<int32_t>(), hdr = headerBuf_.Get<int32_t>();
        LocalTensor<int32_t> count;
        if (reuse_) count = countBuf_.Get<int32_t>();
        for (uint32_t r = static_cast<uint32_t>(GetBlockIdx()); r < t_.rows; r += blocks) {
            const uint64_t base = static_cast<uint64_t>(r) * t_.width;
            Sync<HardEvent::S_MTE2>();
            DataCopyPad(sc, lensGm_[r], DataCopyExtParams(1, 4, 0, 0, 0), DataCopyPadExtParams<int32_t>(true, 0, 7, 0));
            DataCopy(hdr, stateGm_[base], avsg::kHeaderWords);
            Sync<HardEvent::MTE2_S>();
            if (static_cast<uint32_t>(hdr.GetValue(0)) != avsg::kHeaderMagic ||
                static_cast<uint32_t>(hdr.GetValue(avsg::kHeaderCapacity)) != t_.capacity ||
                static_cast<uint32_t>(hdr.GetValue(avsg::kHeaderBuckets)) != t_.buckets ||
                static_cast<uint32_t>(hdr.GetValue(avsg::kHeaderMaxContext)) != t_.maxContext)
                continue;
            const float limit = DropLimit(sc.GetValue(0));
            for (uint32_t off = 0; off < t_.capPad; off += t_.fillChunk) {
                const uint32_t n = MinU(t_.fillChunk, t_.capPad - off);
                const uint32_t real = off < t_.capacity ? MinU(n, t_.capacity - off) : 0;
                if (real == 0) break;
                Sync<HardEvent::MTE3_MTE2>();
                Sync<HardEvent::V_MTE2>();
                DataCopy(pos, stateGm_[base + t_.secOff[avsg::SEC_SP] + off], n);
                Sync<HardEvent::MTE2_V>();
                // ReduceMax's work area is life's buffer, whose chunk is read only when needed
                if (!DropTest(pos, keep, life.ReinterpretCast<float>(), top, n, real, limit)) continue;
                Sync<HardEvent::V_MTE2>();
                const uint64_t life16Off = 2 * (base + t_.secOff[avsg::SEC_SL]) + off;   // int16 entries
                DataCopy(life16, state16Gm_[life16Off], n);   // after the chunk's first MTE3_MTE2
                if (reuse_) DataCopy(count, stateGm_[base + t_.secOff[avsg::SEC_SC] + off], n);
                Duplicate(notKeep.ReinterpretCast<float>(), 0.0f, n);
                Sync<HardEvent::MTE2_V>();
                Cast(life.ReinterpretCast<float>(), life16, RoundMode::CAST_NONE, n);   // exact
                PipeBarrier<PIPE_V>();
                Cast(life, life.ReinterpretCast<float>(), RoundMode::CAST_RINT, n);
                DropMask(keep, notKeep, drop, n, limit);
                DropClear(pos, keep, n);
                DropClear(life, keep, n);
                if (reuse_) DropClear(count, keep, n);   // a freed slot's count goes to 0
                PipeBarrier<PIPE_V>();
                DropFill(pos, notKeep, n);
                DropFill(life, notKeep, n);
                PipeBarrier<PIPE_V>();
                Cast(life16, life, RoundMode::CAST_NONE, n);   // int16 values, and -1: exact
                Sync<HardEvent::V_MTE3>();
                DataCopyExtParams p(1, real * 4, 0, 0, 0);
                DataCopyPad(stateGm_[base + t_.secOff[avsg::SEC_SP] + off], pos, p);
                DataCopyPad(state16Gm_[life16Off], life16, DataCopyExtParams(1, real * 2, 0, 0, 0));
                if (reuse_) DataCopyPad(stateGm_[base + t_.secOff[avsg::SEC_SC] + off], count, p);
                Sync<HardEvent::MTE3_V>();
            }
            if (reuse_) ZeroGhostsFrom(base, limit, pos, life, keep, notKeep, drop, count);
        }
        Sync<HardEvent::MTE3_MTE2>();
    }

private:
    // Reuse policy: every ghost naming a position >= limit returns to 0 (drop_block.h), so a
    // rejected draft's positions start from nothing when the real tokens arrive.
    __aicore__ inline void ZeroGhostsFrom(uint64_t base, float limit, const LocalTensor<int32_t>& tag,
                                          const LocalTensor<int32_t>& entry, const LocalTensor<int32_t>& keep,
                                          const LocalTensor<int32_t>& notKeep, const LocalTensor<uint8_t>& drop,
                                          const LocalTensor<int32_t>& ghost) {
        const uint32_t len = t_.secLen[avsg::SEC_PC];
        const LocalTensor<float> top = scalarBuf_.Get<float>();
        Sync<HardEvent::MTE3_V>();
        for (uint32_t o = 0; o < len; o += t_.fillChunk) {
            const uint32_t n = MinU(t_.fillChunk, len - o);
            Sync<HardEvent::MTE3_MTE2>();
            Sync<HardEvent::V_MTE2>();
            DataCopy(ghost, stateGm_[base + t_.secOff[avsg::SEC_PC] + o], n);
            Sync<HardEvent::MTE2_V>();
            if (!GhostDropTest(ghost, tag, entry, keep, notKeep, top, o, n, t_.ghostLog, limit))
                continue;   // no ghost here to forget: no store
            GhostDropApply(ghost, tag, keep, notKeep, drop, n, limit);
            Sync<HardEvent::V_MTE3>();
            DataCopy(stateGm_[base + t_.secOff[avsg::SEC_PC] + o], ghost, n);
        }
        Sync<HardEvent::MTE3_V>();
    }
    bool reuse_ = false;
    PlanTiling t_;
    GlobalTensor<int32_t> stateGm_, lensGm_;
    GlobalTensor<int16_t> state16Gm_;
    TBuf<TPosition::VECCALC> tilingBuf_, posBuf_, lifeBuf_, life16Buf_, keepBuf_, notKeepBuf_, maskBuf_, scalarBuf_, headerBuf_;
    TBuf<TPosition::VECCALC> countBuf_;
};

}  // namespace avsg_kernel
