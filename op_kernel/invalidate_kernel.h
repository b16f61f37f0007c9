// invalidate_kernel.h: AscendC (Atlas A2 AIV) kernel of invalidate (reference.invalidate): every
// slot whose position is at or past the row's valid length is freed, and under the reuse policy
// its count and the ghosts of those positions go to 0. Tiling: PlanTiling (op_host/plan_tiling.h).
// UB: the tiling, fillChunk-element pos / life / keep / notKeep (and count) vectors, one mask,
// the header and a scalar. Entry: invalidate.cpp.
#pragma once
#include "kernel_tools.h"

namespace avsg_kernel {

// slot_pos >= limit -> slot_pos = -1, slot_life = -1, with limit = clamp(valid_len, -1, 2^24).
// int32 Compare is EQ only on A2, so the test runs in float on min(slot_pos, 2^24): exact, and
// equivalent to the int32 test whatever slot_pos holds (limit <= 2^24; values below -1 stay below
// -1 when rounded). The kept values are never rounded: the float test becomes an int32 lane mask
// (-1 keep, 0 drop) and the update is (x & keep) | ~keep on u16 lanes. Rows whose header does not
// match the geometry are left untouched.
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
        LocalTensor<int32_t> keep = keepBuf_.Get<int32_t>(), notKeep = notKeepBuf_.Get<int32_t>();
        LocalTensor<float> keepF = keep.ReinterpretCast<float>(), zeroF = notKeep.ReinterpretCast<float>();
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
            int32_t lim = sc.GetValue(0);
            if (lim < -1) lim = -1;
            if (lim > static_cast<int32_t>(avsg::kMaxPosition)) lim = static_cast<int32_t>(avsg::kMaxPosition);
            const float limit = static_cast<float>(lim);
            for (uint32_t off = 0; off < t_.capPad; off += t_.fillChunk) {
                const uint32_t n = MinU(t_.fillChunk, t_.capPad - off);
                const uint32_t real = off < t_.capacity ? MinU(n, t_.capacity - off) : 0;
                if (real == 0) break;
                Sync<HardEvent::MTE3_MTE2>();
                Sync<HardEvent::V_MTE2>();
                DataCopy(pos, stateGm_[base + t_.secOff[avsg::SEC_SP] + off], n);
                Sync<HardEvent::MTE2_V>();
                Mins(keep, pos, static_cast<int32_t>(avsg::kMaxPosition), n);
                PipeBarrier<PIPE_V>();
                Cast(keepF, keep, RoundMode::CAST_RINT, n);
                // Most passes drop nothing (every draft accepted, or one query token: the serving
                // manager invalidates every pass). The largest position held says so; then the
                // chunk's slot_life is not read and nothing is stored.
                if (!AnyAtLeast(keepF, life.ReinterpretCast<float>(), real, limit)) continue;
                Sync<HardEvent::V_MTE2>();        // ReduceMax's work area is life's buffer
                DataCopy(life, stateGm_[base + t_.secOff[avsg::SEC_SL] + off], n);
                if (reuse_) DataCopy(count, stateGm_[base + t_.secOff[avsg::SEC_SC] + off], n);
                Duplicate(zeroF, 0.0f, n);
                Sync<HardEvent::MTE2_V>();
                CompareScalar(drop, keepF, limit, CMPMODE::GE, n);
                PipeBarrier<PIPE_V>();
                Select(keepF, drop, zeroF, -1.0f, SELMODE::VSEL_TENSOR_SCALAR_MODE, n);   // drop ? 0 : -1
                PipeBarrier<PIPE_V>();
                Cast(keep, keepF, RoundMode::CAST_RINT, n);
                PipeBarrier<PIPE_V>();
                Not(notKeep.ReinterpretCast<uint16_t>(), keep.ReinterpretCast<uint16_t>(), 2 * n);
                And(pos.ReinterpretCast<uint16_t>(), pos.ReinterpretCast<uint16_t>(), keep.ReinterpretCast<uint16_t>(),
                    2 * n);
                And(life.ReinterpretCast<uint16_t>(), life.ReinterpretCast<uint16_t>(),
                    keep.ReinterpretCast<uint16_t>(), 2 * n);
                if (reuse_)   // a freed slot's count goes to 0
                    And(count.ReinterpretCast<uint16_t>(), count.ReinterpretCast<uint16_t>(),
                        keep.ReinterpretCast<uint16_t>(), 2 * n);
                PipeBarrier<PIPE_V>();
                Or(pos.ReinterpretCast<uint16_t>(), pos.ReinterpretCast<uint16_t>(), notKeep.ReinterpretCast<uint16_t>(),
                   2 * n);
                Or(life.ReinterpretCast<uint16_t>(), life.ReinterpretCast<uint16_t>(),
                   notKeep.ReinterpretCast<uint16_t>(), 2 * n);
                Sync<HardEvent::V_MTE3>();
                DataCopyExtParams p(1, real * 4, 0, 0, 0);
                DataCopyPad(stateGm_[base + t_.secOff[avsg::SEC_SP] + off], pos, p);
                DataCopyPad(stateGm_[base + t_.secOff[avsg::SEC_SL] + off], life, p);
                if (reuse_) DataCopyPad(stateGm_[base + t_.secOff[avsg::SEC_SC] + off], count, p);
                Sync<HardEvent::MTE3_V>();
            }
            if (reuse_) ZeroGhostsFrom(base, limit, pos, life, keep, notKeep, drop, count);
        }
        Sync<HardEvent::MTE3_MTE2>();
    }

private:
    // Whether any of the first ``count`` values of ``vals`` (floats holding exact integers) is
    // >= limit: one ReduceMax (float only on A2) and a scalar read of its result.
    __aicore__ inline bool AnyAtLeast(const LocalTensor<float>& vals, const LocalTensor<float>& work,
                                      uint32_t count, float limit) {
        const LocalTensor<float> top = scalarBuf_.Get<float>();
        Sync<HardEvent::S_V>();                   // earlier scalar reads of this buffer (lens, top)
        PipeBarrier<PIPE_V>();                    // vals was just computed
        ReduceMax(top, vals, work, static_cast<int32_t>(count));
        Sync<HardEvent::V_S>();
        return top.GetValue(0) >= limit;
    }
    // Reuse policy: every ghost naming a position >= limit (tag * G + entry, reference.
    // ghost_positions) returns to 0, so a rejected draft's positions start from nothing when the
    // real tokens arrive. The name is formed in float: tag * G is exact (a power of two), the sum
    // rounds monotonically and every integer limit in [-1, 2^24] is exact, so the GE test is the
    // int64 one whatever the entry holds.
    __aicore__ inline void ZeroGhostsFrom(uint64_t base, float limit, const LocalTensor<int32_t>& tag,
                                          const LocalTensor<int32_t>& entry, const LocalTensor<int32_t>& keep,
                                          const LocalTensor<int32_t>& notKeep, const LocalTensor<uint8_t>& drop,
                                          const LocalTensor<int32_t>& ghost) {
        const uint32_t len = t_.secLen[avsg::SEC_PC];
        const LocalTensor<float> tagF = tag.ReinterpretCast<float>(), entryF = entry.ReinterpretCast<float>();
        const LocalTensor<float> keepF = keep.ReinterpretCast<float>(), zeroF = notKeep.ReinterpretCast<float>();
        const float entries = static_cast<float>(1u << t_.ghostLog);
        Sync<HardEvent::MTE3_V>();
        for (uint32_t o = 0; o < len; o += t_.fillChunk) {
            const uint32_t n = MinU(t_.fillChunk, len - o);
            Sync<HardEvent::MTE3_MTE2>();
            Sync<HardEvent::V_MTE2>();
            DataCopy(ghost, stateGm_[base + t_.secOff[avsg::SEC_PC] + o], n);
            Sync<HardEvent::MTE2_V>();
            Sync<HardEvent::V_S>();               // CreateVecIndex starts with scalar writes
            CreateVecIndex(entry, static_cast<int32_t>(o), n);
            ShiftRight(tag, ghost, avsg::kGhostCountBits, n);   // arithmetic: a negative word, a negative tag
            Duplicate(zeroF, 0.0f, n);
            PipeBarrier<PIPE_V>();
            Cast(entryF, entry, RoundMode::CAST_RINT, n);   // exact: < 2^15
            Cast(tagF, tag, RoundMode::CAST_RINT, n);       // exact: |tag| < 2^24
            PipeBarrier<PIPE_V>();
            Muls(tagF, tagF, entries, n);
            PipeBarrier<PIPE_V>();
            Add(tagF, tagF, entryF, n);
            if (!AnyAtLeast(tagF, keepF, n, limit)) continue;   // no ghost here to forget: no store
            CompareScalar(drop, tagF, limit, CMPMODE::GE, n);
            PipeBarrier<PIPE_V>();
            Select(keepF, drop, zeroF, -1.0f, SELMODE::VSEL_TENSOR_SCALAR_MODE, n);   // drop ? 0 : -1
            PipeBarrier<PIPE_V>();
            Cast(keep, keepF, RoundMode::CAST_RINT, n);
            PipeBarrier<PIPE_V>();
            And(ghost.ReinterpretCast<uint16_t>(), ghost.ReinterpretCast<uint16_t>(), keep.ReinterpretCast<uint16_t>(),
                2 * n);
            Sync<HardEvent::V_MTE3>();
            DataCopy(stateGm_[base + t_.secOff[avsg::SEC_PC] + o], ghost, n);
        }
        Sync<HardEvent::MTE3_V>();
    }
    bool reuse_ = false;
    PlanTiling t_;
    GlobalTensor<int32_t> stateGm_, lensGm_;
    TBuf<TPosition::VECCALC> tilingBuf_, posBuf_, lifeBuf_, keepBuf_, notKeepBuf_, maskBuf_, scalarBuf_, headerBuf_;
    TBuf<TPosition::VECCALC> countBuf_;
};

}  // namespace avsg_kernel
