// plan_block_victims.h: victims, the part every policy shares. One pass over slot_life decays or
// ages every slot and pins the hits (DecayAndPin), and leaves what the policy's search starts from
// (the half copy of the lives or ages where it fits, the lowest life, the oldest age, the free
// candidates). The m victims are then chosen by VictimSearch<Policy>, one specialisation per
// policy type in its own file: the lowest (life, slot - hand mod S) under lifetime
// (plan_block_victims_lifetime.h), the lowest (score, slot) under reuse (_reuse.h: scores to the
// workspace, an 8-ary threshold search, ties in slot order, then the ghosts) and the oldest (age,
// then slot order) under lru (_lru.h: a threshold search on the ages, from a half copy of them
// where it fits, whose first pass counts just below the oldest age). The policy is a type
// (plan_policy.h), so each kernel compiles only its own passes.
// UB: the slot_life / slot_pos / slot_count / ghost windows, hitBits_, V(0..6), wWin_/wIdx_/wSlot_
// and vT1_/vT2_/vKey_/vTmpF_ as scratch, for lru and lifetime also the sort region (idle here:
// the half copy of the ages or lives, or wTmp_/wKey_), for lru V(1) as eight wide masks; GM:
// miss_slots, the workspace's scores (reuse).
#pragma once
#include "plan_block_heat.h"

namespace avsg_kernel {

class PlanBlockVictims {
public:
    __aicore__ inline explicit PlanBlockVictims(PlanContext& ctx, PlanBlockProbe& probe, PlanBlockHeat& heat)
        : ctx_(ctx), probe_(probe), heat_(heat) {}
    // slot_life: clamp to [-1, L+1] (a no-op on states the ops built; on any other it keeps
    // every unpinned slot a victim candidate), decay (fresh L+1 -> first life - 1, other
    // life>0 -> life-1: all in [-1, L-1]), hit slots -> L (lru: ages, hits -> 0). Where the half
    // copy fits, lifetime and lru run DecayInHalf; otherwise (and for reuse) one vector pass per
    // window, which also leaves what the victim search starts from: lru the oldest age and the
    // free candidates, lifetime the candidates' lowest life (a lane-wise minimum).
    template <class Policy>
    __aicore__ inline void DecayAndPin() {
        if constexpr (!Policy::kReuse) {
            if (HalfCopyFits()) {
                DecayInHalf<Policy>();
                return;
            }
        }
        // Chunks of a whole window, up to the wide vectors' lanes (fewer instructions and
        // barriers per slot); reuse keeps nc lanes, as its CountHits works in the nc-lane scratch
        // (and reads the ages from vT2_).
        const uint32_t chunk = Policy::kReuse ? ctx_.t_.nc : probe_.Wide();
        const LocalTensor<int32_t> t1 = Policy::kReuse ? ctx_.vT1_ : ctx_.wWin_, t2 = Policy::kReuse ? ctx_.vT2_ : ctx_.wIdx_;
        const LocalTensor<int32_t> sink = Policy::kReuse ? ctx_.vKey_ : ctx_.wSlot_;
        const LocalTensor<float> lifeF = Policy::kReuse ? ctx_.vTmpF_ : ctx_.wWin_.ReinterpretCast<float>();
        Win& sl = ctx_.win_[avsg::SEC_SL];
        // lru: the ages' lane-wise max, lifetime: the candidates' lane-wise lowest life
        // (Allocate's first level), reduced below
        const LocalTensor<float> ageMax = ctx_.wTmp_.ReinterpretCast<float>(), lowestLife = ageMax;
        freeSlots_ = 0;
        if constexpr (Policy::kLru) WinSetClear(lruFreeWins_, false);
        Sync<HardEvent::S_V>();
        if constexpr (Policy::kLru) Duplicate(ageMax, -1.0f, probe_.Wide());
        else if constexpr (!Policy::kReuse) Duplicate(lowestLife, static_cast<float>(ctx_.t_.lifetime), probe_.Wide());
        // lifetime and reuse: last window first, so Allocate starts its slot-order scan in the
        // resident window 0; lru: first window first, its count passes (CountAgesAtLeast) start
        // from the resident window and end in window 0, where SelectLru starts
        for (uint32_t k = 0; k < sl.nwin; ++k) {
            const uint32_t id = Policy::kLru ? k : sl.nwin - 1 - k;
            ctx_.Ensure(sl, static_cast<int32_t>(id));
            const uint32_t cnt = WinCount(sl, static_cast<int32_t>(id));
            for (uint32_t off = 0; off < cnt; off += chunk) {
                const uint32_t n = MinU(chunk, cnt - off);
                LocalTensor<int32_t> life = sl.buf[off];
                if constexpr (Policy::kAged) {
                    // age: clamp to [-1, 1023], then min(age+1, 1023) + min(age, 0): one step
                    // older, free slots (-1) stay free
                    Maxs(t1, life, -1, n);
                    PipeBarrier<PIPE_V>();
                    Mins(t1, t1, avsg::kReuseAgeMax, n);
                    PipeBarrier<PIPE_V>();
                    Adds(t2, t1, 1, n);
                    PipeBarrier<PIPE_V>();
                    Mins(t1, t1, 0, n);
                    PipeBarrier<PIPE_V>();
                    Mins(t2, t2, avsg::kReuseAgeMax, n);
                    PipeBarrier<PIPE_V>();
                    Add(t2, t2, t1, n);
                    PipeBarrier<PIPE_V>();
                } else {
                    // clamp to [-1, L+1] first (life - 1 would wrap at INT32_MIN), then decay;
                    // a fresh slot decays to L here, mapped to its first life below
                    Maxs(t1, life, -1, n);
                    PipeBarrier<PIPE_V>();
                    Mins(t1, t1, static_cast<int32_t>(ctx_.t_.lifetime) + 1, n);
                    PipeBarrier<PIPE_V>();
                    Adds(t2, t1, -1, n);
                    PipeBarrier<PIPE_V>();
                    Mins(t1, t1, 0, n);
                    PipeBarrier<PIPE_V>();
                    Max(t2, t2, t1, n);                    // max(life-1, min(life,0))
                    PipeBarrier<PIPE_V>();
                }
                const uint32_t base = id * sl.wlen + off;
                uint64_t nFree = 0;
                Cast(lifeF, t2, RoundMode::CAST_RINT, n);
                Not(ctx_.U16(ctx_.mA_), ctx_.hitBits_.ReinterpretCast<uint16_t>()[base / 16], n / 16);
                PipeBarrier<PIPE_V>();
                if constexpr (!Policy::kAged) {
                    // only a fresh slot decays to L: its probation (reference.first_life)
                    const float lifeL = static_cast<float>(ctx_.t_.lifetime);
                    CompareScalar(ctx_.mC_, lifeF, lifeL, CMPMODE::NE, n);
                    PipeBarrier<PIPE_V>();
                    Select(lifeF, ctx_.mC_, lifeF, static_cast<float>(avsg::FirstLife(ctx_.t_.lifetime)) - 1.0f,
                           SELMODE::VSEL_TENSOR_SCALAR_MODE, n);
                    PipeBarrier<PIPE_V>();
                }
                Select(lifeF, ctx_.mA_, lifeF, Policy::kAged ? 0.0f : static_cast<float>(ctx_.t_.lifetime),
                       SELMODE::VSEL_TENSOR_SCALAR_MODE, n);
                PipeBarrier<PIPE_V>();
                if constexpr (!Policy::kAged) {
                    // candidates only: a slot past the active capacity (resize) is none
                    const uint32_t live = base < ctx_.activeCap_ ? MinU(n, ctx_.activeCap_ - base) : 0u;
                    if (live) Min(lowestLife, lowestLife, lifeF, live);
                }
                if constexpr (Policy::kLru) {
                    // the victim search's bounds: the oldest age, and the free slots among the
                    // candidates (below the active capacity), counted after the pins (a hit is
                    // never free, whatever its slot held)
                    Max(ageMax, ageMax, lifeF, n);
                    CompareScalar(ctx_.mB_, lifeF, -1.0f, CMPMODE::EQ, n);
                    PipeBarrier<PIPE_V>();
                    const uint32_t live = base < ctx_.activeCap_ ? MinU(n, ctx_.activeCap_ - base) : 0u;
                    if (live) GatherMask(sink, t2, ctx_.U32(ctx_.mB_), true, live, GatherMaskParams(1, 1, 8, 0), nFree);
                    if (nFree) WinSetAdd(lruFreeWins_, id);
                }
                freeSlots_ += static_cast<uint32_t>(nFree);
                Cast(life, lifeF, RoundMode::CAST_RINT, n);
                PipeBarrier<PIPE_V>();
                if constexpr (Policy::kReuse) heat_.CountHits(base, n);
            }
            sl.dirty = true;
        }
        if constexpr (Policy::kLru) {
            // ages are in [-1, 1023] here: exact in float
            const LocalTensor<float> top = ctx_.wIdx_.ReinterpretCast<float>();
            ReduceMax(top, ageMax, ctx_.wSlot_.ReinterpretCast<float>(), static_cast<int32_t>(probe_.Wide()));
        } else if constexpr (!Policy::kReuse) {
            PipeBarrier<PIPE_V>();
            ReduceMin(ctx_.wIdx_.ReinterpretCast<float>(), lowestLife, ctx_.wSlot_.ReinterpretCast<float>(),
                      static_cast<int32_t>(probe_.Wide()));
        }
        Sync<HardEvent::V_S>();
        if constexpr (Policy::kLru) {
            maxAge_ = static_cast<int32_t>(ctx_.wIdx_.ReinterpretCast<float>().GetValue(0));
        } else if constexpr (!Policy::kReuse) {
            lowestLife_ = static_cast<int32_t>(ctx_.wIdx_.ReinterpretCast<float>().GetValue(0));
        }
    }
    // lifetime and lru where the half copy fits: slot_life moves in as whole stretches of
    // 2 * Wide() slots (wPair_), not window by window, is clamped there (in float: exact at the
    // bounds, monotone elsewhere, so the same as clamping the int32), and the decay (ageing) and
    // the pins run Wide() lanes at a time (the masks' width; lru: at most a window, whose free
    // candidates it records) straight into the half copy. lifetime: the level scan reads and
    // installs into the half copy, and the section goes back from it once (WriteBackHalfCopy).
    // lru: the new ages go back from the stretch at once (the search's scratch covers the sort
    // region once it has counted), and the search loads the windows that hold its victims.
    // Either way the window is left empty here.
    template <class Policy>
    __aicore__ inline void DecayInHalf() {
        Win& sl = ctx_.win_[avsg::SEC_SL];
        const uint32_t lanes = 2 * probe_.Wide();
        const uint32_t sub = Policy::kLru ? MinU(probe_.Wide(), sl.wlen) : probe_.Wide();
        const LocalTensor<int32_t> stage = ctx_.wPair_, sink = ctx_.wSlot_;
        const LocalTensor<float> x = stage.ReinterpretCast<float>(), tmp = ctx_.wSlot_.ReinterpretCast<float>();
        const float lifeL = static_cast<float>(ctx_.t_.lifetime);
        const float hi = Policy::kLru ? static_cast<float>(avsg::kReuseAgeMax) : lifeL + 1.0f;
        freeSlots_ = 0;
        if constexpr (Policy::kLru) WinSetClear(lruFreeWins_, false);
        ctx_.Flush(sl);                           // a drop or a freed padding slot, written back
        sl.cur = -1;
        const uint32_t padded = avsg::RoundUp(ctx_.t_.capPad, kHalfCopyLanes);
        Sync<HardEvent::S_V>();
        // the copy's tail past the padded slots: free under lru (counted nowhere: past the active
        // capacity), pinned (L, no level's) under lifetime
        if (padded > ctx_.t_.capPad)
            Duplicate(ctx_.sHalf_[ctx_.t_.capPad], static_cast<half>(Policy::kLru ? -1.0f : lifeL), padded - ctx_.t_.capPad);
        for (uint32_t base = 0; base < ctx_.t_.capPad; base += lanes) {
            const uint32_t n = MinU(lanes, ctx_.t_.capPad - base);
            Sync<HardEvent::V_MTE2>();            // the previous stretch's (or step's) vector reads
            Sync<HardEvent::S_MTE2>();            // scalar reads / writes of the wide vectors
            if (Policy::kLru && base) Sync<HardEvent::MTE3_MTE2>();   // the previous stretch's store
            DataCopy(stage, sl.gm[base], n);
            Sync<HardEvent::MTE2_V>();
            Cast(x, stage, RoundMode::CAST_RINT, n);
            PipeBarrier<PIPE_V>();
            Maxs(x, x, -1.0f, n);
            PipeBarrier<PIPE_V>();
            Mins(x, x, hi, n);
            PipeBarrier<PIPE_V>();
            for (uint32_t off = 0; off < n; off += sub) {
                const uint32_t k = MinU(sub, n - off), at = base + off;
                const LocalTensor<float> life = x[off];
                Not(ctx_.U16(ctx_.mA_), ctx_.hitBits_.ReinterpretCast<uint16_t>()[at / 16], k / 16);
                if constexpr (Policy::kLru) {
                    // one step older: min(age + 1, 1023) + min(age, 0), free slots (-1) stay free
                    Adds(tmp, life, 1.0f, k);
                    Mins(life, life, 0.0f, k);
                    PipeBarrier<PIPE_V>();
                    Mins(tmp, tmp, static_cast<float>(avsg::kReuseAgeMax), k);
                    PipeBarrier<PIPE_V>();
                    Add(life, life, tmp, k);
                    PipeBarrier<PIPE_V>();
                    Select(life, ctx_.mA_, life, 0.0f, SELMODE::VSEL_TENSOR_SCALAR_MODE, k);   // hits: age 0
                    PipeBarrier<PIPE_V>();
                    // the free candidates (below the active capacity), counted after the pins
                    CompareScalar(ctx_.mB_, life, -1.0f, CMPMODE::EQ, k);
                    Cast(ctx_.sHalf_[at], life, RoundMode::CAST_NONE, k);   // [-1, 1023]: exact
                    PipeBarrier<PIPE_V>();
                    const uint32_t live = at < ctx_.activeCap_ ? MinU(k, ctx_.activeCap_ - at) : 0u;
                    uint64_t nFree = 0;
                    if (live) GatherMask(sink, stage[off], ctx_.U32(ctx_.mB_), true, live, GatherMaskParams(1, 1, 8, 0), nFree);
                    if (nFree) WinSetAdd(lruFreeWins_, at / sl.wlen);
                    freeSlots_ += static_cast<uint32_t>(nFree);
                } else {
                    // decay: max(life - 1, min(life, 0)); a fresh slot (L+1) decays to L
                    Adds(tmp, life, -1.0f, k);
                    Mins(life, life, 0.0f, k);
                    PipeBarrier<PIPE_V>();
                    Max(life, life, tmp, k);
                    PipeBarrier<PIPE_V>();
                    // only a fresh slot decays to L: its probation (reference.first_life)
                    CompareScalar(ctx_.mC_, life, lifeL, CMPMODE::NE, k);
                    PipeBarrier<PIPE_V>();
                    Select(life, ctx_.mC_, life, static_cast<float>(avsg::FirstLife(ctx_.t_.lifetime)) - 1.0f,
                           SELMODE::VSEL_TENSOR_SCALAR_MODE, k);
                    PipeBarrier<PIPE_V>();
                    Select(life, ctx_.mA_, life, lifeL, SELMODE::VSEL_TENSOR_SCALAR_MODE, k);   // hits -> L
                    PipeBarrier<PIPE_V>();
                    Cast(ctx_.sHalf_[at], life, RoundMode::CAST_NONE, k);   // [-1, L]: exact
                }
                PipeBarrier<PIPE_V>();            // the next part's temporaries and masks
            }
            if constexpr (Policy::kLru) {
                Cast(stage, x, RoundMode::CAST_RINT, n);   // ages in [-1, 1023]: exact
                Sync<HardEvent::V_MTE3>();
                DataCopy(sl.gm[base], stage, n);
            }
        }
        if constexpr (Policy::kLru) {
            Sync<HardEvent::MTE3_V>();            // the stores read the stage (wIdx_ below)
            Sync<HardEvent::MTE3_S>();
            Sync<HardEvent::MTE3_MTE2>();
            ReduceMax(ctx_.wIdx_.ReinterpretCast<half>(), ctx_.sHalf_, ctx_.wSlot_.ReinterpretCast<half>(),
                      static_cast<int32_t>(ctx_.t_.capPad));
            Sync<HardEvent::V_S>();
            maxAge_ = static_cast<int32_t>(static_cast<float>(ctx_.wIdx_.ReinterpretCast<half>().GetValue(0)));
        }
        Sync<HardEvent::V_S>();
    }
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
    // fits; otherwise the searches read the slot_life windows. Its count passes work in chunks of half a wide vector (sinks below).
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
    PlanBlockHeat& heat_;
};

// Step 3's victim search, one specialisation per policy type, each in its own file
// (plan_block_victims_lifetime.h, _lru.h, _reuse.h): Assign(r, m) puts the m victims in miss_slots
// and installs the misses.
template <class Policy>
class VictimSearch;

}  // namespace avsg_kernel
