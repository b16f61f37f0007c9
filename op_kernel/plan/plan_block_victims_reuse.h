// plan_block_victims_reuse.h: the reuse policy's victim search (step 3), specialised on
// its policy type: the lowest (score, slot): scores to the workspace, an 8-ary threshold search,
// ties in slot order; then the ghosts. The ageing pass before it is plan_block_decay_reuse.h, what
// the searches share plan_block_victims.h; the kernel composes VictimSearch<Policy>
// (plan_kernel.h).
#pragma once
#include "plan_block_victims.h"

namespace avsg_kernel {

template <>
class VictimSearch<PolicyReuse> {
public:
    // every search gets the same pieces (the kernel builds whichever its policy names)
    __aicore__ inline explicit VictimSearch(PlanContext& ctx, PlanBlockProbe& probe, PlanBlockHeat& heat,
                                            PlanBlockVictims& victims)
        : ctx_(ctx), probe_(probe), heat_(heat), victims_(victims) {}
    // the m victims to miss_slots, then the misses installed with their ghosts
    __aicore__ inline void Assign(uint32_t r, uint32_t m) {
        AllocateByScore(r, m);
        ScatterVictimsReuse(r, m);
    }
    // After the miss lists are published: nothing (the ages live in their window, written back
    // with the row).
    __aicore__ inline void AfterPublish() {}

    // x (int32 >= 0, n lanes) -> log8(x) (shift 20) or log4(x) (shift 21) from float32 bits
    __aicore__ inline void LogBits(const LocalTensor<int32_t>& x, const LocalTensor<float>& tmp, int32_t shift,
                                   uint32_t n) {
        Adds(x, x, 1, n);
        PipeBarrier<PIPE_V>();
        Cast(tmp, x, RoundMode::CAST_RINT, n);   // exact: x + 1 <= 2^24
        PipeBarrier<PIPE_V>();
        ShiftRight(x, tmp.ReinterpretCast<int32_t>(), shift, n);
        PipeBarrier<PIPE_V>();
        Adds(x, x, -(127 << (23 - shift)), n);
        PipeBarrier<PIPE_V>();
    }
    // Scores of slots [base, base+n) into the workspace (float; the Sp - S padding slots are
    // left out: the passes read them back as SCORE_PINNED).
    __aicore__ inline void ScoreChunk(uint32_t base, uint32_t n) {
        const uint32_t W = probe_.Wide();
        const LocalTensor<int32_t> a = ctx_.V(0), b = ctx_.V(5);
        const LocalTensor<float> fa = ctx_.VF(1), fb = ctx_.VF(4);
        Sync<HardEvent::S_V>();                   // scalar writes of the windows
        PipeBarrier<PIPE_V>();
        // heat of each slot's block: an all-probe gather with the block ids in the first nc lanes
        Duplicate(ctx_.wIdx_, 0, W);
        PipeBarrier<PIPE_V>();
        Adds(ctx_.wIdx_, ctx_.ChunkOf(ctx_.win_[avsg::SEC_SP], base), 0, n);
        PipeBarrier<PIPE_V>();
        Maxs(ctx_.wIdx_, ctx_.wIdx_, 0, n);
        PipeBarrier<PIPE_V>();
        heat_.HeatEntry(ctx_.wIdx_, n);
        probe_.SplitIdx(ctx_.win_[avsg::SEC_HT], ctx_.wIdx_);
        probe_.GatherVals(ctx_.win_[avsg::SEC_HT], ctx_.wSlot_, 0, avsg::kReuseHeatMax);
        Adds(a, ctx_.wSlot_, 0, n);
        PipeBarrier<PIPE_V>();
        LogBits(a, fa, 21, n);                                    // log4(heat)
        Adds(b, ctx_.ChunkOf(ctx_.win_[avsg::SEC_SC], base), 0, n);
        PipeBarrier<PIPE_V>();
        ctx_.ClampInts(b, 0, avsg::kReuseCountMax, n);
        LogBits(b, fb, 20, n);                                    // log8(count)
        Add(a, a, b, n);
        PipeBarrier<PIPE_V>();
        const LocalTensor<int32_t> age = ctx_.ChunkOf(ctx_.win_[avsg::SEC_SL], base);
        Maxs(b, age, 0, n);
        PipeBarrier<PIPE_V>();
        LogBits(b, fb, 20, n);                                    // log8(age)
        Sub(a, a, b, n);
        PipeBarrier<PIPE_V>();
        Cast(fa, a, RoundMode::CAST_RINT, n);
        Cast(fb, age, RoundMode::CAST_RINT, n);                   // age in [-1, 1023]: exact
        PipeBarrier<PIPE_V>();
        avsg::CompareScalarAll(ctx_.mA_, fb, 0.0f, CMPMODE::NE, n);             // used this step: pinned
        PipeBarrier<PIPE_V>();
        Select(fa, ctx_.mA_, fa, static_cast<float>(avsg::kScorePinned), SELMODE::VSEL_TENSOR_SCALAR_MODE, n);
        PipeBarrier<PIPE_V>();
        avsg::CompareScalarAll(ctx_.mA_, fb, -1.0f, CMPMODE::NE, n);            // free: first
        PipeBarrier<PIPE_V>();
        Select(fa, ctx_.mA_, fa, static_cast<float>(avsg::kScoreFree), SELMODE::VSEL_TENSOR_SCALAR_MODE, n);
        Sync<HardEvent::V_MTE3>();
        StoreInts(ctx_.wsGm_[ctx_.t_.wsScoreOff + base], fa.ReinterpretCast<int32_t>(),
                  MinU(n, ctx_.t_.capacity - base));
        Sync<HardEvent::MTE3_V>();
    }
    // scores of slots [base, base+n) back into V(1) (float), padding slots and slots past the
    // active capacity (resize) as SCORE_PINNED: never victims
    __aicore__ inline LocalTensor<float> LoadScores(uint32_t base, uint32_t n) {
        const LocalTensor<float> sc = ctx_.VF(1);
        Sync<HardEvent::S_V>();
        PipeBarrier<PIPE_V>();                    // the previous chunk's readers of sc
        Duplicate(sc, static_cast<float>(avsg::kScorePinned), ctx_.t_.nc);
        Sync<HardEvent::V_MTE2>();
        Sync<HardEvent::S_MTE2>();
        Sync<HardEvent::MTE3_MTE2>();
        LoadInts(sc.ReinterpretCast<int32_t>(), ctx_.wsGm_[ctx_.t_.wsScoreOff + base],
                 base < ctx_.activeCap_ ? MinU(n, ctx_.activeCap_ - base) : 0u,
                 0x42FE0000);   // float bits of 127.0 (SCORE_PINNED)
        Sync<HardEvent::MTE2_V>();
        return sc;
    }
    static constexpr uint32_t kThresholdsPerPass = 7;
    // counts[i] = count(score <= theta[i]) for k <= 7 thresholds in one pass over the scores: each
    // chunk is loaded once for all of them (the loads and their syncs, not the compares, are what
    // a pass costs)
    __aicore__ inline void CountAtMost(const int32_t* theta, uint32_t k, uint32_t* counts) {
        for (uint32_t i = 0; i < k; ++i) counts[i] = 0;
        for (uint32_t base = 0; base < ctx_.activeCap_; base += ctx_.t_.nc) {   // the rest is pinned
            const uint32_t n = MinU(ctx_.t_.nc, ctx_.t_.capPad - base);
            const LocalTensor<float> sc = LoadScores(base, n);
            uint64_t got[kThresholdsPerPass] = {};
            for (uint32_t i = 0; i < k; ++i) {
                avsg::CompareScalarAll(ctx_.mA_, sc, static_cast<float>(theta[i]), CMPMODE::LE, n);
                PipeBarrier<PIPE_V>();
                GatherMask(ctx_.V(5), sc.ReinterpretCast<int32_t>(), ctx_.U32(ctx_.mA_), true, n,
                           GatherMaskParams(1, 1, 8, 0), got[i]);
                PipeBarrier<PIPE_V>();
            }
            Sync<HardEvent::V_S>();
            for (uint32_t i = 0; i < k; ++i) counts[i] += static_cast<uint32_t>(got[i]);
        }
    }
    // Victims: the m slots with the lowest (score, slot), in ascending slot order -> miss_slots.
    // Threshold theta (the smallest with count(score <= theta) >= m) by an 8-ary search: each pass
    // counts 7 thresholds spread over (lo, hi) (3 passes over the scores, where a binary search
    // takes 8), then every slot below it and the first (m - count below) ties, found by a running
    // tie count. The reuse policy's; lru searches its ages without scores (AllocateLru).
    __aicore__ inline void AllocateByScore(uint32_t r, uint32_t m) {
        if (m == 0) return;
        ctx_.missChunk_ = -1;                     // vWant_ / vMS_ are scratch below
        const uint32_t nc = ctx_.t_.nc;
        const uint64_t rowN = static_cast<uint64_t>(r) * ctx_.t_.outPitch;
        for (uint32_t base = 0; base < ctx_.t_.capPad; base += nc) ScoreChunk(base, MinU(nc, ctx_.t_.capPad - base));
        int32_t lo = avsg::kScoreFree - 1, hi = avsg::kScorePinned;
        uint32_t below = 0;                       // count(score <= lo) < m <= count(score <= hi)
        while (hi - lo > 1) {
            const int32_t span = hi - lo;
            const uint32_t k = MinU(kThresholdsPerPass, static_cast<uint32_t>(span - 1));
            int32_t theta[kThresholdsPerPass];
            uint32_t cnt[kThresholdsPerPass];
            for (uint32_t i = 0; i < k; ++i)      // strictly increasing inside (lo, hi): span > k
                theta[i] = lo + static_cast<int32_t>(static_cast<uint32_t>(span) * (i + 1) / (k + 1));
            CountAtMost(theta, k, cnt);
            for (uint32_t i = 0; i < k; ++i) {
                if (cnt[i] >= m) {
                    hi = theta[i];
                    break;
                }
                lo = theta[i];
                below = cnt[i];
            }
        }
        const float theta = static_cast<float>(hi);
        uint32_t ties = m - below, have = 0;       // ties still to take, victims stored
        const LocalTensor<int32_t> ids = ctx_.V(0), tieIds = ctx_.V(5), out = ctx_.V(6);
        const LocalTensor<float> idsF = ctx_.VF(4);
        for (uint32_t base = 0; base < ctx_.activeCap_ && have < m; base += nc) {
            const uint32_t n = MinU(nc, ctx_.t_.capPad - base);
            const LocalTensor<float> sc = LoadScores(base, n);
            avsg::CompareScalarAll(ctx_.mA_, sc, theta, CMPMODE::LT, n);
            avsg::CompareScalarAll(ctx_.mB_, sc, theta, CMPMODE::EQ, n);
            Adds(ids, ctx_.vLane_, static_cast<int32_t>(base), n);
            PipeBarrier<PIPE_V>();
            uint64_t e = 0;
            GatherMask(tieIds, ids, ctx_.U32(ctx_.mB_), true, n, GatherMaskParams(1, 1, 8, 0), e);
            Sync<HardEvent::V_S>();
            if (static_cast<uint32_t>(e) > ties) {   // the tie boundary lies in this chunk
                const float last = ties == 0 ? -1.0f : static_cast<float>(tieIds.GetValue(ties - 1));
                Sync<HardEvent::S_V>();
                Cast(idsF, ids, RoundMode::CAST_RINT, n);
                PipeBarrier<PIPE_V>();
                avsg::CompareScalarAll(ctx_.mC_, idsF, last, CMPMODE::LE, n);
                PipeBarrier<PIPE_V>();
                And(ctx_.U16(ctx_.mB_), ctx_.U16(ctx_.mB_), ctx_.U16(ctx_.mC_), n / 16);
                PipeBarrier<PIPE_V>();
                ties = 0;
            } else {
                ties -= static_cast<uint32_t>(e);
            }
            Or(ctx_.U16(ctx_.mA_), ctx_.U16(ctx_.mA_), ctx_.U16(ctx_.mB_), n / 16);
            PipeBarrier<PIPE_V>();
            uint64_t got = 0;
            GatherMask(out, ids, ctx_.U32(ctx_.mA_), true, n, GatherMaskParams(1, 1, 8, 0), got);
            Sync<HardEvent::V_S>();
            const uint32_t take = MinU(static_cast<uint32_t>(got), m - have);
            if (take) {
                Sync<HardEvent::V_MTE3>();
                StoreInts(ctx_.missSlotsGm_[rowN + have], out, take);
                Sync<HardEvent::MTE3_V>();
                have += take;
            }
        }
        Sync<HardEvent::MTE3_S>();
        ctx_.missChunk_ = -1;                          // vWant_ / vMS_ were used as scratch
    }
    // Evicted positions leave their counts as ghosts (entry p mod G, tag p >> log2 G), then each miss
    // takes its own back (when the tag is its own) + the return gain: all spills before any reload,
    // in miss order (reference: _reuse_install).
    __aicore__ inline void ScatterVictimsReuse(uint32_t r, uint32_t m) {
        Win& sp = ctx_.win_[avsg::SEC_SP];
        Win& sc = ctx_.win_[avsg::SEC_SC];
        Win& pc = ctx_.win_[avsg::SEC_PC];
        for (uint32_t j0 = 0; j0 < m; j0 += ctx_.t_.nc) {
            const uint32_t n = ctx_.LoadMisses(r, j0, m);
            for (uint32_t q = 0; q < n; ++q) {
                const uint32_t s = static_cast<uint32_t>(ctx_.vMS_.GetValue(q));
                const int32_t old = ctx_.Get(sp, s);
                if (old >= 0) {   // the evicted position's ghost: its tag and its count
                    const int32_t evicted =
                        heat_.GhostTag(old) << avsg::kGhostCountBits | heat_.ClampCount(ctx_.Get(sc, s));
                    ctx_.Put(pc, heat_.GhostEntry(old), evicted);
                }
            }
        }
        for (uint32_t j0 = 0; j0 < m; j0 += ctx_.t_.nc) {
            const uint32_t n = ctx_.LoadMisses(r, j0, m);
            for (uint32_t q = 0; q < n; ++q) {
                const uint32_t s = static_cast<uint32_t>(ctx_.vMS_.GetValue(q));
                const int32_t pos = ctx_.vWant_.GetValue(q);
                const int32_t ghost = ctx_.Get(pc, heat_.GhostEntry(pos));
                const bool known = (ghost >> avsg::kGhostCountBits) == heat_.GhostTag(pos);
                const int32_t c = (known ? ghost & avsg::kGhostCountMask : 0) + avsg::kReuseGainReturn;
                ctx_.Put(sc, s, c < avsg::kReuseCountMax ? c : avsg::kReuseCountMax);   // a miss is a return
                ctx_.Put(sp, s, pos);
                ctx_.Put(ctx_.win_[avsg::SEC_SL], s, 0);
            }
        }
    }

    // the context and the blocks this one calls
    PlanContext& ctx_;
    PlanBlockProbe& probe_;
    PlanBlockHeat& heat_;
    PlanBlockVictims& victims_;
};

}  // namespace avsg_kernel
