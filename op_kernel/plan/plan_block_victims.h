// plan_block_victims.h: victims. One pass over slot_life decays or ages every slot and pins
// the hits (DecayAndPin); the m victims are then the lowest (life, slot - hand mod S) under the
// lifetime policy (Allocate), the lowest (score, slot) under reuse (AllocateByScore: scores to the
// workspace, an 8-ary threshold search, ties in slot order) and the oldest (age, then slot
// order) under lru (AllocateLru: a threshold search on the ages, from a half copy of them where
// it fits, whose first pass counts just below the oldest age); each miss is installed in its
// victim (by Allocate and SelectLru as they find them, ScatterVictimsReuse with ghosts for
// reuse). The policy is a tag (plan_policy.h), so each kernel compiles only its own passes.
// UB: the slot_life / slot_pos / slot_count / ghost windows, hitBits_, V(0..6), wWin_/wIdx_/wSlot_
// and vT1_/vT2_/vKey_/vTmpF_ as scratch, for lru and lifetime also the sort region (idle here:
// the half copy of the ages or lives, or wTmp_/wKey_), for lru V(1) as eight wide masks; GM:
// miss_slots, the workspace's scores (reuse).
#pragma once
#include "plan_block_heat.h"

namespace avsg_kernel {

class PlanBlockVictims : public PlanBlockHeat {
protected:
    // slot_life: clamp to [-1, L+1] (a no-op on states the ops built; on any other it keeps
    // every unpinned slot a victim candidate), decay (fresh L+1 -> first life - 1, other
    // life>0 -> life-1: all in [-1, L-1]), hit slots -> L, one vector pass per window. Also
    // what the victim search starts from: lru the oldest age and the free candidates, lifetime
    // the lowest life (the half copy's, or a lane-wise minimum).
    template <class Policy>
    __aicore__ inline void DecayAndPin() {
        // Chunks of a whole window, up to the wide vectors' lanes (fewer instructions and
        // barriers per slot); reuse keeps nc lanes, as its CountHits works in the nc-lane scratch
        // (and reads the ages from vT2_).
        const uint32_t chunk = Policy::kReuse ? t_.nc : Wide();
        const LocalTensor<int32_t> t1 = Policy::kReuse ? vT1_ : wWin_, t2 = Policy::kReuse ? vT2_ : wIdx_;
        const LocalTensor<int32_t> sink = Policy::kReuse ? vKey_ : wSlot_;
        const LocalTensor<float> lifeF = Policy::kReuse ? vTmpF_ : wWin_.ReinterpretCast<float>();
        Win& sl = win_[avsg::SEC_SL];
        // lru and lifetime: the new ages / lives as half (the sort region is idle here) where
        // that copy fits; otherwise lru the ages' lane-wise max, lifetime the candidates'
        // lane-wise lowest life (Allocate's first level), reduced below
        const LocalTensor<float> ageMax = wTmp_.ReinterpretCast<float>(), lowestLife = ageMax;
        const bool compact = !Policy::kReuse && HalfCopyFits();
        // lifetime with the half copy: the new lives stay there until Allocate's installs are in
        // and WriteBackLives stores them (this pass loads slot_life and stores nothing)
        const bool livesInHalf = !Policy::kAged && compact;
        freeSlots_ = 0;
        if constexpr (Policy::kLru) WinSetClear(lruFreeWins_, false);
        Sync<HardEvent::S_V>();
        if constexpr (!Policy::kReuse) {
            // the copy's tail past the padded slots: free under lru (counted nowhere: past the
            // active capacity), pinned (L, no level's) under lifetime
            const uint32_t padded = avsg::RoundUp(t_.capPad, kHalfCopyLanes);
            const float tail = Policy::kLru ? -1.0f : static_cast<float>(t_.lifetime);
            if (Policy::kLru && !compact) Duplicate(ageMax, -1.0f, Wide());
            else if (!compact) Duplicate(lowestLife, static_cast<float>(t_.lifetime), Wide());
            else if (compact && padded > t_.capPad) Duplicate(sHalf_[t_.capPad], static_cast<half>(tail), padded - t_.capPad);
        }
        // lifetime and reuse: last window first, so Allocate starts its slot-order scan in the
        // resident window 0; lru: first window first, its count passes (CountAgesAtLeast) start
        // from the resident window and end in window 0, where SelectLru starts
        for (uint32_t k = 0; k < sl.nwin; ++k) {
            const uint32_t id = Policy::kLru ? k : sl.nwin - 1 - k;
            Ensure(sl, static_cast<int32_t>(id));
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
                    Mins(t1, t1, static_cast<int32_t>(t_.lifetime) + 1, n);
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
                Not(U16(mA_), hitBits_.ReinterpretCast<uint16_t>()[base / 16], n / 16);
                PipeBarrier<PIPE_V>();
                if constexpr (!Policy::kAged) {
                    // only a fresh slot decays to L: its probation (reference.first_life)
                    const float lifeL = static_cast<float>(t_.lifetime);
                    CompareScalar(mC_, lifeF, lifeL, CMPMODE::NE, n);
                    PipeBarrier<PIPE_V>();
                    Select(lifeF, mC_, lifeF, static_cast<float>(avsg::FirstLife(t_.lifetime)) - 1.0f,
                           SELMODE::VSEL_TENSOR_SCALAR_MODE, n);
                    PipeBarrier<PIPE_V>();
                }
                Select(lifeF, mA_, lifeF, Policy::kAged ? 0.0f : static_cast<float>(t_.lifetime),
                       SELMODE::VSEL_TENSOR_SCALAR_MODE, n);
                PipeBarrier<PIPE_V>();
                if constexpr (!Policy::kAged) {
                    if (compact) {
                        Cast(sHalf_[base], lifeF, RoundMode::CAST_NONE, n);   // [-1, 255]: exact
                    } else {
                        // candidates only: a slot past the active capacity (resize) is none
                        const uint32_t live = base < activeCap_ ? MinU(n, activeCap_ - base) : 0u;
                        if (live) Min(lowestLife, lowestLife, lifeF, live);
                    }
                }
                if constexpr (Policy::kLru) {
                    // the victim search's bounds: the oldest age, and the free slots among the
                    // candidates (below the active capacity), counted after the pins (a hit is
                    // never free, whatever its slot held)
                    if (compact) Cast(sHalf_[base], lifeF, RoundMode::CAST_NONE, n);   // [-1, 1023]: exact
                    else Max(ageMax, ageMax, lifeF, n);
                    CompareScalar(mB_, lifeF, -1.0f, CMPMODE::EQ, n);
                    PipeBarrier<PIPE_V>();
                    const uint32_t live = base < activeCap_ ? MinU(n, activeCap_ - base) : 0u;
                    if (live) GatherMask(sink, t2, U32(mB_), true, live, GatherMaskParams(1, 1, 8, 0), nFree);
                    if (nFree) WinSetAdd(lruFreeWins_, id);
                }
                freeSlots_ += static_cast<uint32_t>(nFree);
                if (livesInHalf) {
                    PipeBarrier<PIPE_V>();        // the copy's cast reads lifeF, which t1 aliases
                    continue;
                }
                Cast(life, lifeF, RoundMode::CAST_RINT, n);
                PipeBarrier<PIPE_V>();
                if constexpr (Policy::kReuse) CountHits(base, n);
            }
            if (!livesInHalf) sl.dirty = true;
        }
        if constexpr (Policy::kLru) {
            // ages are in [-1, 1023] here: exact in float and in half
            if (compact) {
                ReduceMax(wIdx_.ReinterpretCast<half>(), sHalf_, wSlot_.ReinterpretCast<half>(),
                          static_cast<int32_t>(t_.capPad));
            } else {
                const LocalTensor<float> top = wIdx_.ReinterpretCast<float>();
                ReduceMax(top, ageMax, wSlot_.ReinterpretCast<float>(), static_cast<int32_t>(Wide()));
            }
        } else if constexpr (!Policy::kReuse) {
            if (!compact) {
                PipeBarrier<PIPE_V>();
                ReduceMin(wIdx_.ReinterpretCast<float>(), lowestLife, wSlot_.ReinterpretCast<float>(),
                          static_cast<int32_t>(Wide()));
            }
        }
        Sync<HardEvent::V_S>();
        if constexpr (Policy::kLru) {
            maxAge_ = compact ? static_cast<int32_t>(static_cast<float>(wIdx_.ReinterpretCast<half>().GetValue(0)))
                              : static_cast<int32_t>(wIdx_.ReinterpretCast<float>().GetValue(0));
        } else if constexpr (!Policy::kReuse) {
            if (!compact) lowestLife_ = static_cast<int32_t>(wIdx_.ReinterpretCast<float>().GetValue(0));
        }
    }
    // Victims in (life, turn) order among life < L, turn = (slot - hand) mod S: per level the
    // slots [hand, A) then [0, hand), one Compares EQ + GatherMask per chunk (the chunks that
    // cross an end of the range also mask the slot ids to it: int32 Compares is EQ-only on A2,
    // so through float), stopping at M -> miss_slots[0:M]. Each chunk's victims are installed
    // while their slot_life window is resident (miss j takes the j-th victim: slot_pos = its
    // position, slot_life = L+1, fresh), instead of in a second walk over the windows; a slot
    // installed at level lv holds L+1, which no later level (< L) matches, so the victims are those of the
    // decayed state. The hand then moves past the last victim. Where DecayAndPin's half copy of
    // the lives fits, the compares read it instead (no window moves per level; the installs
    // write it too, and move the slot_pos / slot_life windows only to where victims are).
    __aicore__ inline void Allocate(uint32_t r, uint32_t m) {
        const uint32_t nc = t_.nc;
        const uint64_t rowN = static_cast<uint64_t>(r) * t_.outPitch;
        Win& sl = win_[avsg::SEC_SL];
        constexpr uint32_t kHandWord = avsg::kHeaderHand - avsg::kHeaderStashCount;
        const int32_t handWord = countUb_.GetValue(kHandWord);
        const uint32_t hand = handWord >= 0 && static_cast<uint32_t>(handWord) < activeCap_
                                  ? static_cast<uint32_t>(handWord) : 0u;
        uint32_t have = 0, lastSlot = 0;
        const bool compact = HalfCopyFits();
        // The scan starts at the lowest life a candidate (a slot below the active capacity)
        // holds, -1 if one is free: every level below it is empty, and at L = 255 there can be
        // hundreds (a hit holds L, above every level). One reduction instead of their passes:
        // over the half copy where it fits, else of DecayAndPin's lane-wise minimum. After the
        // free slots (level -1) it jumps again, to the lowest life held (below).
        const int32_t low = compact ? HalfCopyLowestLife() : lowestLife_;
        const int32_t lv0 = low < static_cast<int32_t>(t_.lifetime) ? (low < -1 ? -1 : low) : 0;
        for (int32_t lv = lv0; lv < static_cast<int32_t>(t_.lifetime) && have < m; ++lv) {
            for (uint32_t part = 0; part < 2 && have < m; ++part) {
                const uint32_t lo = part == 0 ? hand : 0u, hi = part == 0 ? activeCap_ : hand;
                // chunks of nc slots, or of a whole window where windows are shorter
                const uint32_t grid = compact ? nc : MinU(nc, sl.wlen);
                for (uint32_t base = lo - lo % grid, n = 0; base < hi && have < m; base += n) {
                    Sync<HardEvent::S_V>();       // the previous chunk's scalar vT2_ reads, copy writes
                    if (compact) {
                        n = MinU(nc, t_.capPad - base);
                        CompareScalar(mA_, sHalf_[base], static_cast<half>(static_cast<float>(lv)), CMPMODE::EQ,
                                      avsg::RoundUp(n, kHalfCopyLanes));
                    } else {
                        const int32_t id = static_cast<int32_t>(base >> sl.wlog);
                        Ensure(sl, id);
                        const uint32_t off = base - static_cast<uint32_t>(id) * sl.wlen;
                        n = MinU(nc, WinCount(sl, id) - off);
                        CompareScalar(mA_, sl.buf[off], lv, CMPMODE::EQ, n);
                    }
                    Adds(vT1_, vLane_, static_cast<int32_t>(base), n);   // slot ids
                    PipeBarrier<PIPE_V>();
                    if (base < lo || base + n > hi) KeepSlotsIn(lo, hi, n);
                    uint64_t got = 0;
                    GatherMask(vT2_, vT1_, U32(mA_), true, n, GatherMaskParams(1, 1, 8, 0), got);
                    Sync<HardEvent::V_S>();
                    const uint32_t take = MinU(static_cast<uint32_t>(got), m - have);
                    if (take) {
                        Sync<HardEvent::V_MTE3>();
                        StoreInts(missSlotsGm_[rowN + have], vT2_, take);
                        Sync<HardEvent::MTE3_V>();
                        for (uint32_t q = 0; q < take; ++q) {
                            const uint32_t j = have + q;
                            LoadMisses(r, j - j % nc, m);   // miss_pos chunk of j in vWant_
                            const uint32_t s = static_cast<uint32_t>(vT2_.GetValue(q));
                            Put(win_[avsg::SEC_SP], s, vWant_.GetValue(j % nc));
                            // fresh: above every level
                            if (compact) sHalf_.SetValue(s, static_cast<half>(static_cast<float>(t_.lifetime + 1)));
                            else Put(sl, s, static_cast<int32_t>(t_.lifetime) + 1);
                            lastSlot = s;
                        }
                        have += take;
                    }
                }
            }
            // Level -1 took every free slot (each now holds L+1), fewer than the misses (after an
            // invalidate, say): the next level with candidates is the lowest life now held, which
            // may lie hundreds of empty levels up. One more reduction instead of their passes.
            if (lv == -1 && have < m) {
                const int32_t held = compact ? HalfCopyLowestLife() : WindowLowestLife();
                lv = (held < 0 ? 0 : held) - 1;
            }
        }
        if (have) countUb_.SetValue(kHandWord, static_cast<int32_t>(lastSlot + 1 < activeCap_ ? lastSlot + 1 : 0u));
        missChunk_ = -1;   // vMS_ was loaded before this step's victims were stored
        if (compact) WriteBackLives();
    }
    // The lowest life a candidate (a slot below the active capacity) holds, -1 if one is free:
    // over the half copy, which DecayAndPin's casts and Allocate's installs wrote.
    __aicore__ inline int32_t HalfCopyLowestLife() {
        const LocalTensor<half> lowest = wIdx_.ReinterpretCast<half>();
        Sync<HardEvent::S_V>();                   // the installs' scalar writes of the half copy
        PipeBarrier<PIPE_V>();                    // DecayAndPin's casts into it
        ReduceMin(lowest, sHalf_, wSlot_.ReinterpretCast<half>(), static_cast<int32_t>(activeCap_));
        Sync<HardEvent::V_S>();
        return static_cast<int32_t>(static_cast<float>(lowest.GetValue(0)));
    }
    // The same from the slot_life windows, where the half copy does not fit: one vector pass
    // (lane-wise Min, then one ReduceMin), from the resident window on.
    __aicore__ inline int32_t WindowLowestLife() {
        Win& sl = win_[avsg::SEC_SL];
        const LocalTensor<float> lowest = wTmp_.ReinterpretCast<float>(), lifeF = wWin_.ReinterpretCast<float>();
        const uint32_t chunk = Wide();
        Sync<HardEvent::S_V>();                   // the installs' scalar writes of the windows
        Duplicate(lowest, static_cast<float>(t_.lifetime), chunk);
        const uint32_t first = sl.cur < 0 ? 0u : static_cast<uint32_t>(sl.cur);
        for (uint32_t k = 0; k < sl.nwin; ++k) {
            const int32_t id = static_cast<int32_t>((first + k) % sl.nwin);
            const uint32_t base = static_cast<uint32_t>(id) * sl.wlen;
            if (base >= activeCap_) continue;
            Ensure(sl, id);
            const uint32_t live = MinU(WinCount(sl, id), activeCap_ - base);
            for (uint32_t off = 0; off < live; off += chunk) {
                const uint32_t n = MinU(chunk, live - off);
                PipeBarrier<PIPE_V>();            // the previous chunk's Min reads lifeF
                Cast(lifeF, sl.buf[off], RoundMode::CAST_RINT, n);   // lives in [-1, L+1]: exact
                PipeBarrier<PIPE_V>();
                Min(lowest, lowest, lifeF, n);
            }
        }
        PipeBarrier<PIPE_V>();
        ReduceMin(wIdx_.ReinterpretCast<float>(), lowest, wSlot_.ReinterpretCast<float>(), static_cast<int32_t>(chunk));
        Sync<HardEvent::V_S>();
        return static_cast<int32_t>(wIdx_.ReinterpretCast<float>().GetValue(0));
    }
    // slot_life = the half copy (lives in [-1, L+1]: exact in half), window by window. Every
    // entry of each window is overwritten, so no window is loaded: the step moves slot_life in
    // once (DecayAndPin) and out once, wherever its victims lie.
    __aicore__ inline void WriteBackLives() {
        Win& sl = win_[avsg::SEC_SL];
        const LocalTensor<float> lifeF = wWin_.ReinterpretCast<float>();
        const uint32_t chunk = Wide();
        Sync<HardEvent::S_V>();                   // the installs' scalar writes of the half copy
        PipeBarrier<PIPE_V>();                    // and the level scan's vector readers of wWin_
        for (uint32_t id = 0; id < sl.nwin; ++id) {
            Claim(sl, static_cast<int32_t>(id));
            const uint32_t base = id * sl.wlen, cnt = WinCount(sl, static_cast<int32_t>(id));
            for (uint32_t off = 0; off < cnt; off += chunk) {
                const uint32_t n = MinU(chunk, cnt - off);
                Cast(lifeF, sHalf_[base + off], RoundMode::CAST_NONE, n);
                PipeBarrier<PIPE_V>();
                Cast(sl.buf[off], lifeF, RoundMode::CAST_RINT, n);
                PipeBarrier<PIPE_V>();
            }
            sl.dirty = true;
        }
    }
    // mA_ &= lo <= slot id (vT1_) < hi on n lanes; ids are < 2^24, exact in float
    __aicore__ inline void KeepSlotsIn(uint32_t lo, uint32_t hi, uint32_t n) {
        Cast(vTmpF_, vT1_, RoundMode::CAST_RINT, n);
        PipeBarrier<PIPE_V>();
        CompareScalar(mB_, vTmpF_, static_cast<float>(lo), CMPMODE::GE, n);
        PipeBarrier<PIPE_V>();
        And(U16(mA_), U16(mA_), U16(mB_), n / 16);
        PipeBarrier<PIPE_V>();
        CompareScalar(mB_, vTmpF_, static_cast<float>(hi), CMPMODE::LT, n);
        PipeBarrier<PIPE_V>();
        And(U16(mA_), U16(mA_), U16(mB_), n / 16);
        PipeBarrier<PIPE_V>();
    }
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
        const uint32_t W = Wide();
        const LocalTensor<int32_t> a = V(0), b = V(5);
        const LocalTensor<float> fa = VF(1), fb = VF(4);
        Sync<HardEvent::S_V>();                   // scalar writes of the windows
        PipeBarrier<PIPE_V>();
        // heat of each slot's block: an all-probe gather with the block ids in the first nc lanes
        Duplicate(wIdx_, 0, W);
        PipeBarrier<PIPE_V>();
        Adds(wIdx_, ChunkOf(win_[avsg::SEC_SP], base), 0, n);
        PipeBarrier<PIPE_V>();
        Maxs(wIdx_, wIdx_, 0, n);
        PipeBarrier<PIPE_V>();
        HeatEntry(wIdx_, n);
        SplitIdx(win_[avsg::SEC_HT], wIdx_);
        GatherVals(win_[avsg::SEC_HT], wSlot_, 0, avsg::kReuseHeatMax);
        Adds(a, wSlot_, 0, n);
        PipeBarrier<PIPE_V>();
        LogBits(a, fa, 21, n);                                    // log4(heat)
        Adds(b, ChunkOf(win_[avsg::SEC_SC], base), 0, n);
        PipeBarrier<PIPE_V>();
        ClampInts(b, 0, avsg::kReuseCountMax, n);
        LogBits(b, fb, 20, n);                                    // log8(count)
        Add(a, a, b, n);
        PipeBarrier<PIPE_V>();
        const LocalTensor<int32_t> age = ChunkOf(win_[avsg::SEC_SL], base);
        Maxs(b, age, 0, n);
        PipeBarrier<PIPE_V>();
        LogBits(b, fb, 20, n);                                    // log8(age)
        Sub(a, a, b, n);
        PipeBarrier<PIPE_V>();
        Cast(fa, a, RoundMode::CAST_RINT, n);
        Cast(fb, age, RoundMode::CAST_RINT, n);                   // age in [-1, 1023]: exact
        PipeBarrier<PIPE_V>();
        CompareScalar(mA_, fb, 0.0f, CMPMODE::NE, n);             // used this step: pinned
        PipeBarrier<PIPE_V>();
        Select(fa, mA_, fa, static_cast<float>(avsg::kScorePinned), SELMODE::VSEL_TENSOR_SCALAR_MODE, n);
        PipeBarrier<PIPE_V>();
        CompareScalar(mA_, fb, -1.0f, CMPMODE::NE, n);            // free: first
        PipeBarrier<PIPE_V>();
        Select(fa, mA_, fa, static_cast<float>(avsg::kScoreFree), SELMODE::VSEL_TENSOR_SCALAR_MODE, n);
        Sync<HardEvent::V_MTE3>();
        StoreInts(wsGm_[t_.wsScoreOff + base], fa.ReinterpretCast<int32_t>(), MinU(n, t_.capacity - base));
        Sync<HardEvent::MTE3_V>();
    }
    // scores of slots [base, base+n) back into V(1) (float), padding slots and slots past the
    // active capacity (resize) as SCORE_PINNED: never victims
    __aicore__ inline LocalTensor<float> LoadScores(uint32_t base, uint32_t n) {
        const LocalTensor<float> sc = VF(1);
        Sync<HardEvent::S_V>();
        PipeBarrier<PIPE_V>();                    // the previous chunk's readers of sc
        Duplicate(sc, static_cast<float>(avsg::kScorePinned), t_.nc);
        Sync<HardEvent::V_MTE2>();
        Sync<HardEvent::S_MTE2>();
        Sync<HardEvent::MTE3_MTE2>();
        LoadInts(sc.ReinterpretCast<int32_t>(), wsGm_[t_.wsScoreOff + base],
                 base < activeCap_ ? MinU(n, activeCap_ - base) : 0u,
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
        for (uint32_t base = 0; base < activeCap_; base += t_.nc) {   // the rest is pinned
            const uint32_t n = MinU(t_.nc, t_.capPad - base);
            const LocalTensor<float> sc = LoadScores(base, n);
            uint64_t got[kThresholdsPerPass] = {};
            for (uint32_t i = 0; i < k; ++i) {
                CompareScalar(mA_, sc, static_cast<float>(theta[i]), CMPMODE::LE, n);
                PipeBarrier<PIPE_V>();
                GatherMask(V(5), sc.ReinterpretCast<int32_t>(), U32(mA_), true, n, GatherMaskParams(1, 1, 8, 0),
                           got[i]);
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
        const uint32_t nc = t_.nc;
        const uint64_t rowN = static_cast<uint64_t>(r) * t_.outPitch;
        for (uint32_t base = 0; base < t_.capPad; base += nc) ScoreChunk(base, MinU(nc, t_.capPad - base));
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
        const LocalTensor<int32_t> ids = V(0), tieIds = V(5), out = V(6);
        const LocalTensor<float> idsF = VF(4);
        for (uint32_t base = 0; base < activeCap_ && have < m; base += nc) {
            const uint32_t n = MinU(nc, t_.capPad - base);
            const LocalTensor<float> sc = LoadScores(base, n);
            CompareScalar(mA_, sc, theta, CMPMODE::LT, n);
            CompareScalar(mB_, sc, theta, CMPMODE::EQ, n);
            Adds(ids, vLane_, static_cast<int32_t>(base), n);
            PipeBarrier<PIPE_V>();
            uint64_t e = 0;
            GatherMask(tieIds, ids, U32(mB_), true, n, GatherMaskParams(1, 1, 8, 0), e);
            Sync<HardEvent::V_S>();
            if (static_cast<uint32_t>(e) > ties) {   // the tie boundary lies in this chunk
                const float last = ties == 0 ? -1.0f : static_cast<float>(tieIds.GetValue(ties - 1));
                Sync<HardEvent::S_V>();
                Cast(idsF, ids, RoundMode::CAST_RINT, n);
                PipeBarrier<PIPE_V>();
                CompareScalar(mC_, idsF, last, CMPMODE::LE, n);
                PipeBarrier<PIPE_V>();
                And(U16(mB_), U16(mB_), U16(mC_), n / 16);
                PipeBarrier<PIPE_V>();
                ties = 0;
            } else {
                ties -= static_cast<uint32_t>(e);
            }
            Or(U16(mA_), U16(mA_), U16(mB_), n / 16);
            PipeBarrier<PIPE_V>();
            uint64_t got = 0;
            GatherMask(out, ids, U32(mA_), true, n, GatherMaskParams(1, 1, 8, 0), got);
            Sync<HardEvent::V_S>();
            const uint32_t take = MinU(static_cast<uint32_t>(got), m - have);
            if (take) {
                Sync<HardEvent::V_MTE3>();
                StoreInts(missSlotsGm_[rowN + have], out, take);
                Sync<HardEvent::MTE3_V>();
                have += take;
            }
        }
        Sync<HardEvent::MTE3_S>();
        missChunk_ = -1;                          // vWant_ / vMS_ were used as scratch
    }
    // ---------------------------------------------------------------- lru
    // The lru victims are the m lowest (score, slot) of reference.lru_scores: with the key
    // x = age (0: used this step, pinned), x = 1024 for a free slot (age -1), the m highest
    // (x, -slot) among the slots below the active capacity. theta = the largest x with
    // count(x >= theta) >= m; victims: every x > theta and the first m - count(x > theta) slots
    // at theta. The search counts on DecayAndPin's half copy of the ages (no window moves) or,
    // where it does not fit, on the slot_life windows (no score pass, no workspace); its first pass counts the top ages below the largest one
    // (DecayAndPin's maxAge_), where the victims of a full buffer lie, later passes spread their
    // thresholds. Which thresholds are counted changes only how many passes the search takes.
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
        return avsg::RoundUp(t_.capPad, kHalfCopyLanes) <= 2 * avsg::kPlanSortVectors * t_.nc;
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
    // 16-bit sink i of CountAgesAtLeast's GatherMasks (2048 lanes each, two per wide vector, all
    // idle in the victims phase): distinct, so the counts need no barrier between them
    __aicore__ inline LocalTensor<uint16_t> CountSink(uint32_t i) {
        const LocalTensor<int32_t>& w = i < 2 ? wIdx_ : i < 4 ? wSlot_ : i < 6 ? wTmp_ : wKey_;
        return w.ReinterpretCast<uint16_t>()[(i % 2) * Wide()];
    }
    // the same for the half copy's chunks (Wide() / 2 lanes), clear of the sort region that holds it
    __aicore__ inline LocalTensor<uint16_t> CountSinkHalf(uint32_t i) {
        return (i < 4 ? wIdx_ : wSlot_).ReinterpretCast<uint16_t>()[(i % 4) * (Wide() / 2)];
    }
    // cnt[i] = count(age >= t[i]) over the slots below the active capacity, t[i] >= 1 (free and
    // pinned slots never count), k <= kLruThresholds, in one pass over the slot_life windows:
    // the resident one first, then those above it, then those below it, down to window 0.
    // seen[i]: the windows where that count is not 0. From the half copy of the ages where
    // DecayAndPin wrote one (no window moves; chunks inside one window each).
    // GatherMask counts the set bits of each compare mask; its source is only a count, so it
    // runs on 16-bit lanes (half the repeats of a 32-bit one).
    __aicore__ inline void CountAgesAtLeast(const int32_t* t, uint32_t k, uint32_t* cnt,
                                            uint32_t (*seen)[kLruWinWords]) {
        const uint32_t W = Wide(), maskBytes = W / 8;
        Win& sl = win_[avsg::SEC_SL];
        const LocalTensor<float> af = wWin_.ReinterpretCast<float>();
        const LocalTensor<uint16_t> src = wWin_.ReinterpretCast<uint16_t>();
        const LocalTensor<uint8_t> masks = V(1).ReinterpretCast<uint8_t>();
        for (uint32_t i = 0; i < k; ++i) {
            cnt[i] = 0;
            WinSetClear(seen[i], false);
        }
        if (HalfCopyFits()) {
            const uint32_t chunk = MinU(W / 2, sl.wlen);   // both powers of two, or one window
            const LocalTensor<uint16_t> ages = sHalf_.ReinterpretCast<uint16_t>();
            Sync<HardEvent::S_V>();               // scalar reads of the sinks (DecayAndPin's maximum)
            for (uint32_t off = 0; off < activeCap_; off += chunk) {
                const uint32_t live = MinU(chunk, activeCap_ - off), n = avsg::RoundUp(live, kHalfCopyLanes);
                const uint32_t id = off / sl.wlen;
                PipeBarrier<PIPE_V>();            // the copy's Casts; the previous chunk's GatherMasks
                for (uint32_t i = 0; i < k; ++i)
                    CompareScalar(masks[i * maskBytes], sHalf_[off], static_cast<half>(static_cast<float>(t[i])),
                                  CMPMODE::GE, n);
                PipeBarrier<PIPE_V>();
                for (uint32_t i = 0; i < k; ++i) {
                    uint64_t got = 0;
                    GatherMask(CountSinkHalf(i), ages[off], U16(masks[i * maskBytes]), true, live,
                               GatherMaskParams(1, 1, 8, 0), got);
                    cnt[i] += static_cast<uint32_t>(got);
                    if (got) WinSetAdd(seen[i], id);
                }
            }
            return;
        }
        const uint32_t first = static_cast<uint32_t>(FirstWin(sl)), up = sl.nwin - first;
        Sync<HardEvent::S_V>();                   // scalar writes of the windows
        for (uint32_t q = 0; q < sl.nwin; ++q) {
            const int32_t id = static_cast<int32_t>(q < up ? first + q : first - 1 - (q - up));
            const uint32_t start = static_cast<uint32_t>(id) * sl.wlen, cntW = WinCount(sl, id);
            if (start >= activeCap_) continue;    // the rest is never a victim
            Ensure(sl, id);
            for (uint32_t off = 0; off < cntW && start + off < activeCap_; off += W) {
                const uint32_t n = MinU(W, cntW - off), live = MinU(n, activeCap_ - start - off);
                PipeBarrier<PIPE_V>();            // the previous chunk's GatherMasks read af and the masks
                Cast(af, sl.buf[off], RoundMode::CAST_RINT, n);   // ages in [-1, 1023]: exact
                PipeBarrier<PIPE_V>();
                for (uint32_t i = 0; i < k; ++i)
                    CompareScalar(masks[i * maskBytes], af, static_cast<float>(t[i]), CMPMODE::GE, n);
                PipeBarrier<PIPE_V>();
                for (uint32_t i = 0; i < k; ++i) {
                    uint64_t got = 0;
                    GatherMask(CountSink(i), src, U16(masks[i * maskBytes]), true, live, GatherMaskParams(1, 1, 8, 0),
                               got);
                    cnt[i] += static_cast<uint32_t>(got);
                    if (got) WinSetAdd(seen[i], static_cast<uint32_t>(id));
                }
            }
        }
    }
    // The victims at threshold theta (ties: how many slots at theta to take), in slot order ->
    // miss_slots[0:m], each installed while its slot_life window is resident (slot_pos = its
    // position, age 0) as Allocate does; a slot installed in one chunk is not read again. Only
    // windows that hold a victim are loaded: a free slot (lruFreeWins_), an age above theta
    // (olderWins) or, while ties are still taken, one at theta (tieWins: ages >= theta).
    __aicore__ inline void SelectLru(uint32_t r, uint32_t m, int32_t theta, uint32_t ties, const uint32_t* tieWins,
                                     const uint32_t* olderWins) {
        const uint32_t W = Wide(), nc = t_.nc;
        const uint64_t rowN = static_cast<uint64_t>(r) * t_.outPitch;
        Win& sl = win_[avsg::SEC_SL];
        const bool freeLevel = theta == kLruFreeKey;   // only free slots are taken
        const float older = static_cast<float>(freeLevel ? kLruFreeKey : theta);   // age > older: taken
        const float tie = freeLevel ? -1.0f : static_cast<float>(theta);
        const LocalTensor<float> af = wWin_.ReinterpretCast<float>();
        const LocalTensor<int32_t> lane = wKey_, ids = wSlot_, tieIds = wTmp_, out = wIdx_;
        const LocalTensor<float> idsF = wTmp_.ReinterpretCast<float>();   // after tieIds is read
        Sync<HardEvent::S_V>();
        Sync<HardEvent::V_S>();                   // CreateVecIndex starts with scalar writes (of a count sink)
        CreateVecIndex(lane, 0, W);
        uint32_t have = 0;
        for (uint32_t id = 0; id < sl.nwin && have < m; ++id) {
            const uint32_t start = id * sl.wlen, cntW = WinCount(sl, static_cast<int32_t>(id));
            if (start >= activeCap_) break;
            const bool hasFree = WinSetHas(lruFreeWins_, id);
            if (!hasFree && (freeLevel || (!WinSetHas(olderWins, id) && (ties == 0 || !WinSetHas(tieWins, id)))))
                continue;
            Ensure(sl, static_cast<int32_t>(id));
            for (uint32_t off = 0; off < cntW && start + off < activeCap_ && have < m; off += W) {
                const uint32_t base = start + off, n = MinU(W, cntW - off), live = MinU(n, activeCap_ - base);
                Sync<HardEvent::S_V>();           // the previous chunk's installs and scalar reads
                PipeBarrier<PIPE_V>();            // and its vector readers of af / ids / the masks
                Cast(af, sl.buf[off], RoundMode::CAST_RINT, n);
                Adds(ids, lane, static_cast<int32_t>(base), n);
                PipeBarrier<PIPE_V>();
                CompareScalar(mA_, af, older, CMPMODE::GT, n);
                CompareScalar(mB_, af, tie, CMPMODE::EQ, n);
                const bool freeOlder = !freeLevel && hasFree;   // free: older than any age
                if (freeOlder) CompareScalar(mC_, af, -1.0f, CMPMODE::EQ, n);
                PipeBarrier<PIPE_V>();
                if (freeOlder) Or(U16(mA_), U16(mA_), U16(mC_), n / 16);
                uint64_t e = 0;
                GatherMask(tieIds, ids, U32(mB_), true, live, GatherMaskParams(1, 1, 8, 0), e);
                if (static_cast<uint32_t>(e) > ties) {   // the tie boundary lies in this chunk
                    Sync<HardEvent::V_S>();
                    const float last = ties == 0 ? -1.0f : static_cast<float>(tieIds.GetValue(ties - 1));
                    Sync<HardEvent::S_V>();
                    PipeBarrier<PIPE_V>();
                    Cast(idsF, ids, RoundMode::CAST_RINT, n);   // slot ids < 2^15: exact
                    PipeBarrier<PIPE_V>();
                    CompareScalar(mC_, idsF, last, CMPMODE::LE, n);
                    PipeBarrier<PIPE_V>();
                    And(U16(mB_), U16(mB_), U16(mC_), n / 16);
                    ties = 0;
                } else {
                    ties -= static_cast<uint32_t>(e);
                }
                PipeBarrier<PIPE_V>();
                Or(U16(mA_), U16(mA_), U16(mB_), n / 16);
                PipeBarrier<PIPE_V>();
                uint64_t got = 0;
                GatherMask(out, ids, U32(mA_), true, live, GatherMaskParams(1, 1, 8, 0), got);
                const uint32_t take = MinU(static_cast<uint32_t>(got), m - have);
                if (take == 0) continue;
                Sync<HardEvent::V_S>();
                Sync<HardEvent::V_MTE3>();
                StoreInts(missSlotsGm_[rowN + have], out, take);
                Sync<HardEvent::MTE3_V>();
                for (uint32_t q = 0; q < take; ++q) {
                    const uint32_t j = have + q;
                    LoadMisses(r, j - j % nc, m);   // miss_pos chunk of j in vWant_
                    const uint32_t s = static_cast<uint32_t>(out.GetValue(q));
                    Put(win_[avsg::SEC_SP], s, vWant_.GetValue(j % nc));
                    Put(sl, s, 0);                  // an age: used this step
                }
                have += take;
            }
        }
        missChunk_ = -1;   // vMS_ was loaded before this step's victims were stored
    }
    __aicore__ inline void AllocateLru(uint32_t r, uint32_t m) {
        if (m == 0) return;
        int32_t theta = kLruFreeKey;              // enough free slots: the first m of them
        uint32_t above = 0;                       // count(x > theta)
        uint32_t loWins[kLruWinWords], hiWins[kLruWinWords];   // windows with an age >= lo / >= hi
        WinSetClear(loWins, true);
        WinSetClear(hiWins, false);
        if (freeSlots_ < m) {
            // count(x >= lo) >= m > count(x >= hi) = above: lo = 0 counts every candidate (the
            // active capacity holds N >= m), no candidate is older than maxAge_
            int32_t lo = 0, hi = (maxAge_ > 0 ? maxAge_ : 0) + 1;
            above = freeSlots_;
            for (bool top = true; hi - lo > 1; top = false) {
                const uint32_t span = static_cast<uint32_t>(hi - lo);
                const uint32_t k = MinU(kLruThresholds, span - 1);
                int32_t t[kLruThresholds];
                uint32_t cnt[kLruThresholds];
                uint32_t seen[kLruThresholds][kLruWinWords];
                for (uint32_t i = 0; i < k; ++i)  // strictly increasing inside (lo, hi): span > k
                    t[i] = top ? hi - static_cast<int32_t>(k - i)
                               : lo + static_cast<int32_t>(span * (i + 1) / (k + 1));
                CountAgesAtLeast(t, k, cnt, seen);
                for (uint32_t i = k; i-- > 0;) {  // counts fall as t rises
                    if (cnt[i] + freeSlots_ >= m) {
                        lo = t[i];
                        WinSetCopy(loWins, seen[i]);
                        break;
                    }
                    hi = t[i];
                    above = cnt[i] + freeSlots_;
                    WinSetCopy(hiWins, seen[i]);
                }
            }
            theta = lo;
        }
        SelectLru(r, m, theta, m - above, loWins, hiWins);   // hi = theta + 1 here
    }
    // Evicted positions leave their counts as ghosts (entry p mod G, tag p >> log2 G), then each miss
    // takes its own back (when the tag is its own) + the return gain: all spills before any reload,
    // in miss order (reference: _reuse_install).
    __aicore__ inline void ScatterVictimsReuse(uint32_t r, uint32_t m) {
        Win& sp = win_[avsg::SEC_SP];
        Win& sc = win_[avsg::SEC_SC];
        Win& pc = win_[avsg::SEC_PC];
        for (uint32_t j0 = 0; j0 < m; j0 += t_.nc) {
            const uint32_t n = LoadMisses(r, j0, m);
            for (uint32_t q = 0; q < n; ++q) {
                const uint32_t s = static_cast<uint32_t>(vMS_.GetValue(q));
                const int32_t old = Get(sp, s);
                if (old >= 0) Put(pc, GhostEntry(old), GhostTag(old) << avsg::kGhostCountBits | ClampCount(Get(sc, s)));
            }
        }
        for (uint32_t j0 = 0; j0 < m; j0 += t_.nc) {
            const uint32_t n = LoadMisses(r, j0, m);
            for (uint32_t q = 0; q < n; ++q) {
                const uint32_t s = static_cast<uint32_t>(vMS_.GetValue(q));
                const int32_t pos = vWant_.GetValue(q);
                const int32_t ghost = Get(pc, GhostEntry(pos));
                const int32_t c = ((ghost >> avsg::kGhostCountBits) == GhostTag(pos) ? ghost & avsg::kGhostCountMask : 0) +
                                  avsg::kReuseGainReturn;
                Put(sc, s, c < avsg::kReuseCountMax ? c : avsg::kReuseCountMax);   // a miss is a return
                Put(sp, s, pos);
                Put(win_[avsg::SEC_SL], s, 0);
            }
        }
    }
    // Step 3 by policy: the m victims to miss_slots, then the misses installed in their slots.
    template <class Policy>
    __aicore__ inline void AssignVictims(uint32_t r, uint32_t m) {
        if constexpr (Policy::kReuse) {
            AllocateByScore(r, m);
            ScatterVictimsReuse(r, m);
        } else if constexpr (Policy::kLru) {
            AllocateLru(r, m);   // installs them as it finds them
        } else {
            Allocate(r, m);   // installs them as it finds them
        }
    }

    uint32_t freeSlots_ = 0;                 // lru: the free candidates after DecayAndPin (below
                                             // the active capacity); else 0
    int32_t lowestLife_ = -1;                // lifetime without the half copy: the candidates'
                                             // lowest life after DecayAndPin (L: none)
    int32_t maxAge_ = -1;                    // lru: the largest age after DecayAndPin, any slot
    uint32_t lruFreeWins_[kLruWinWords] = {};   // lru: the windows with a free candidate
};

}  // namespace avsg_kernel
