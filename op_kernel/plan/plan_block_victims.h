// plan_block_victims.h: victims, the part every policy shares, and the declarations of the two
// per-policy blocks of step 3. PlanBlockDecay<Policy> (plan_block_decay_<policy>.h) makes one
// pass over slot_life that decays or ages every slot and pins the hits (DecayAndPin), and leaves
// here what the policy's search starts from (the half copy of the lives or ages where it fits,
// the lowest life, the oldest age, the free candidates). The m victims are then chosen by
// VictimSearch<Policy>, one specialisation per policy type in its own file: the lowest (life,
// slot - hand mod S) under lifetime (plan_block_victims_lifetime.h), the lowest (score, slot)
// under reuse (_reuse.h: scores to the workspace, an 8-ary threshold search, ties in slot order,
// then the ghosts) and the oldest (age, then slot order) under lru (_lru.h: a threshold search on
// the ages, from a half copy of them where it fits, whose first pass counts just below the oldest
// age). The policy is a type (plan_policy.h), so each kernel compiles only its own passes.
// Here: the half copy's test and write-back, the lru window sets, and the searches' bounds.
// UB: the slot_life / slot_pos / slot_count / ghost windows, hitBits_, V(0..6), wWin_/wIdx_/wSlot_
// and vT1_/vT2_/vKey_/vTmpF_ as scratch, for lru and lifetime also the sort region (idle here:
// the half copy of the ages or lives, or wTmp_/wKey_), for lru V(1) as eight wide masks; GM:
// miss_slots, the workspace's scores (reuse).
#pragma once
#include "plan_block_heat.h"

namespace avsg_kernel {

class PlanBlockVictims {
public:
    __aicore__ inline explicit PlanBlockVictims(PlanContext& ctx, PlanBlockProbe& probe) : ctx_(ctx), probe_(probe) {}
    // slot_life = the half copy (lives in [-1, L+1], ages in [-1, 1023]: exact in half), in
    // stretches of 2 * Wide() slots through wPair_, straight to GM: every entry is overwritten,
    // so the section moves in once (DecayInHalf) and out once, and its window stays empty.
    __aicore__ inline void WriteBackHalfCopy() {
        const Win& sl = ctx_.win_[avsg::SEC_SL];
        const LocalTensor<int32_t> stage = ctx_.wPair_;
        const LocalTensor<float> lifeF = stage.ReinterpretCast<float>();
        const uint32_t lanes = 2 * probe_.Wide();
        Sync<HardEvent::S_V>();                   // the installs' scalar writes of the half copy
        PipeBarrier<PIPE_V>();                    // and the search's vector readers of the wide vectors
        for (uint32_t base = 0; base < ctx_.t_.capPad; base += lanes) {
            const uint32_t n = MinU(lanes, ctx_.t_.capPad - base);
            if (base) Sync<HardEvent::MTE3_V>();  // the previous stretch's store reads the stage
            Cast(lifeF, ctx_.sHalf_[base], RoundMode::CAST_NONE, n);
            PipeBarrier<PIPE_V>();
            Cast(stage, lifeF, RoundMode::CAST_RINT, n);
            Sync<HardEvent::V_MTE3>();
            DataCopy(sl.gm[base], stage, n);
        }
        Sync<HardEvent::MTE3_V>();
        Sync<HardEvent::MTE3_S>();
        Sync<HardEvent::MTE3_MTE2>();
    }
    static constexpr uint32_t kLruThresholds = 8;          // per pass: V(1) holds 8 wide masks
    static constexpr int32_t kLruFreeKey = avsg::kReuseAgeMax + 1;
    // Sets of slot_life windows, one bit each, so that SelectLru loads only the windows that hold
    // a victim. 128 bits cover every geometry the ops accept (S <= 32768 in windows of >= 256
    // slots); a window past them is always a member (visited, never skipped).
    static constexpr uint32_t kLruWinWords = 4;
    // The half copy of the ages (lru) or lives (lifetime), written by DecayAndPin, fills the sort
    // region: every padded slot, rounded up to whole 256 B compares (128 half lanes), when that
    // fits; otherwise the searches read the slot_life windows. Its count passes work in chunks of
    // half a wide vector (sinks below).
    static constexpr uint32_t kHalfCopyLanes = 128;
    __aicore__ inline bool HalfCopyFits() const {
        return avsg::RoundUp(ctx_.t_.capPad, kHalfCopyLanes) <= 2 * avsg::kPlanSortVectors * ctx_.t_.nc;
    }
    __aicore__ static inline void WinSetClear(uint32_t* set, bool all) {
        for (uint32_t w = 0; w < kLruWinWords; ++w) set[w] = all ? ~0u : 0u;
    }
    __aicore__ static inline void WinSetCopy(uint32_t* dst, const uint32_t* src) {
        for (uint32_t w = 0; w < kLruWinWords; ++w) dst[w] = src[w];
    }
    __aicore__ static inline void WinSetAdd(uint32_t* set, uint32_t id) {
        if (id < kLruWinWords * 32) set[id >> 5] |= 1u << (id & 31);
    }
    __aicore__ static inline bool WinSetHas(const uint32_t* set, uint32_t id) {
        return id >= kLruWinWords * 32 || ((set[id >> 5] >> (id & 31)) & 1u) != 0;
    }

    uint32_t freeSlots_ = 0;                 // lru: the free candidates after DecayAndPin (below
                                             // the active capacity); else 0
    int32_t lowestLife_ = -1;                // lifetime without the half copy: the candidates'
                                             // lowest life after DecayAndPin (L: none)
    int32_t maxAge_ = -1;                    // lru: the largest age after DecayAndPin, any slot
    uint32_t lruFreeWins_[kLruWinWords] = {};   // lru: the windows with a free candidate

    // the context and the blocks this one calls
    PlanContext& ctx_;
    PlanBlockProbe& probe_;
};

// Step 3's first pass, one specialisation per policy type, each in its own file
// (plan_block_decay_lifetime.h, _lru.h, _reuse.h): DecayAndPin() decays or ages every slot, pins
// the hits and leaves in PlanBlockVictims what the policy's search starts from.
template <class Policy>
class PlanBlockDecay;

// Step 3's victim search, one specialisation per policy type, each in its own file
// (plan_block_victims_lifetime.h, _lru.h, _reuse.h): Assign(r, m) puts the m victims in miss_slots
// and installs the misses.
template <class Policy>
class VictimSearch;

}  // namespace avsg_kernel
