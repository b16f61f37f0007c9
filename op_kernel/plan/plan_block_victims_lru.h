// plan_block_victims_lru.h: the lru policy's victim search (step 3), specialised on
// its policy type: the oldest (age, then slot order): a threshold search on the ages. The ageing
// pass before it is plan_block_decay_lru.h, what the searches share plan_block_victims.h; the
// kernel composes VictimSearch<Policy> (plan_kernel.h).
#pragma once
#include "plan_block_victims.h"

namespace avsg_kernel {

template <>
class VictimSearch<PolicyLru> {
public:
    // every search gets the same pieces (the kernel builds whichever its policy names)
    __aicore__ inline explicit VictimSearch(PlanContext& ctx, PlanBlockProbe& probe, PlanBlockHeat& heat,
                                            PlanBlockVictims& victims)
        : ctx_(ctx), probe_(probe), heat_(heat), victims_(victims) {}
    // the m victims to miss_slots, each miss installed in its victim as they are found
    __aicore__ inline void Assign(uint32_t r, uint32_t m) { AllocateLru(r, m); }

    // The lru victims are the m lowest (score, slot) of reference.lru_scores: with the key
    // x = age (0: used this step, pinned), x = 1024 for a free slot (age -1), the m highest
    // (x, -slot) among the slots below the active capacity. theta = the largest x with
    // count(x >= theta) >= m; victims: every x > theta and the first m - count(x > theta) slots
    // at theta. The search counts on DecayAndPin's half copy of the ages (no window moves) or,
    // where it does not fit, on the slot_life windows (no score pass, no workspace); its first
    // pass counts the top ages below the largest one
    // (DecayAndPin's maxAge_), where the victims of a full buffer lie, later passes spread their
    // thresholds. Which thresholds are counted changes only how many passes the search takes.
    // 16-bit sink i of CountAgesAtLeast's GatherMasks (2048 lanes each, two per wide vector, all
    // idle in the victims phase): distinct, so the counts need no barrier between them
    __aicore__ inline LocalTensor<uint16_t> CountSink(uint32_t i) {
        const LocalTensor<int32_t>& w = i < 2 ? ctx_.wIdx_ : i < 4 ? ctx_.wSlot_ : i < 6 ? ctx_.wTmp_ : ctx_.wKey_;
        return w.ReinterpretCast<uint16_t>()[(i % 2) * probe_.Wide()];
    }
    // the same for the half copy's chunks (Wide() / 2 lanes), clear of the sort region that holds it
    __aicore__ inline LocalTensor<uint16_t> CountSinkHalf(uint32_t i) {
        return (i < 4 ? ctx_.wIdx_ : ctx_.wSlot_).ReinterpretCast<uint16_t>()[(i % 4) * (probe_.Wide() / 2)];
    }
    // cnt[i] = count(age >= t[i]) over the slots below the active capacity, t[i] >= 1 (free and
    // pinned slots never count), k <= kLruThresholds, in one pass over the slot_life windows:
    // the resident one first, then those above it, then those below it, down to window 0.
    // seen[i]: the windows where that count is not 0. From the half copy of the ages where
    // DecayAndPin wrote one (no window moves; chunks inside one window each).
    // GatherMask counts the set bits of each compare mask; its source is only a count, so it
    // runs on 16-bit lanes (half the repeats of a 32-bit one).
    __aicore__ inline void CountAgesAtLeast(const int32_t* t, uint32_t k, uint32_t* cnt,
                                            uint32_t (*seen)[PlanBlockVictims::kLruWinWords]) {
        const uint32_t W = probe_.Wide(), maskBytes = W / 8;
        Win& sl = ctx_.win_[avsg::SEC_SL];
        const LocalTensor<float> af = ctx_.wWin_.ReinterpretCast<float>();
        const LocalTensor<uint16_t> src = ctx_.wWin_.ReinterpretCast<uint16_t>();
        const LocalTensor<uint8_t> masks = ctx_.V(1).ReinterpretCast<uint8_t>();
        for (uint32_t i = 0; i < k; ++i) {
            cnt[i] = 0;
            PlanBlockVictims::WinSetClear(seen[i], false);
        }
        if (victims_.HalfCopyFits()) {
            const uint32_t chunk = MinU(W / 2, sl.wlen);   // both powers of two, or one window
            const LocalTensor<uint16_t> ages = ctx_.sHalf_.ReinterpretCast<uint16_t>();
            Sync<HardEvent::S_V>();               // scalar reads of the sinks (DecayAndPin's maximum)
            for (uint32_t off = 0; off < ctx_.activeCap_; off += chunk) {
                const uint32_t live = MinU(chunk, ctx_.activeCap_ - off);
                const uint32_t n = avsg::RoundUp(live, PlanBlockVictims::kHalfCopyLanes);
                const uint32_t id = off / sl.wlen;
                PipeBarrier<PIPE_V>();            // the copy's Casts; the previous chunk's GatherMasks
                for (uint32_t i = 0; i < k; ++i)
                    avsg::CompareScalarAll(masks[i * maskBytes], ctx_.sHalf_[off],
                                           static_cast<half>(static_cast<float>(t[i])), CMPMODE::GE, n);
                PipeBarrier<PIPE_V>();
                for (uint32_t i = 0; i < k; ++i) {
                    uint64_t got = 0;
                    GatherMask(CountSinkHalf(i), ages[off], ctx_.U16(masks[i * maskBytes]), true, live,
                               GatherMaskParams(1, 1, 8, 0), got);
                    cnt[i] += static_cast<uint32_t>(got);
                    if (got) PlanBlockVictims::WinSetAdd(seen[i], id);
                }
            }
            return;
        }
        const uint32_t first = static_cast<uint32_t>(probe_.FirstWin(sl)), up = sl.nwin - first;
        Sync<HardEvent::S_V>();                   // scalar writes of the windows
        for (uint32_t q = 0; q < sl.nwin; ++q) {
            const int32_t id = static_cast<int32_t>(q < up ? first + q : first - 1 - (q - up));
            const uint32_t start = static_cast<uint32_t>(id) * sl.wlen, cntW = WinCount(sl, id);
            if (start >= ctx_.activeCap_) continue;    // the rest is never a victim
            ctx_.Ensure(sl, id);
            for (uint32_t off = 0; off < cntW && start + off < ctx_.activeCap_; off += W) {
                const uint32_t n = MinU(W, cntW - off), live = MinU(n, ctx_.activeCap_ - start - off);
                PipeBarrier<PIPE_V>();            // the previous chunk's GatherMasks read af and the masks
                Cast(af, sl.buf[off], RoundMode::CAST_RINT, n);   // ages in [-1, 1023]: exact
                PipeBarrier<PIPE_V>();
                for (uint32_t i = 0; i < k; ++i)
                    avsg::CompareScalarAll(masks[i * maskBytes], af, static_cast<float>(t[i]), CMPMODE::GE, n);
                PipeBarrier<PIPE_V>();
                for (uint32_t i = 0; i < k; ++i) {
                    uint64_t got = 0;
                    GatherMask(CountSink(i), src, ctx_.U16(masks[i * maskBytes]), true, live,
                               GatherMaskParams(1, 1, 8, 0), got);
                    cnt[i] += static_cast<uint32_t>(got);
                    if (got) PlanBlockVictims::WinSetAdd(seen[i], static_cast<uint32_t>(id));
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
        const uint32_t W = probe_.Wide(), nc = ctx_.t_.nc;
        const uint64_t rowN = static_cast<uint64_t>(r) * ctx_.t_.outPitch;
        Win& sl = ctx_.win_[avsg::SEC_SL];
        const bool freeLevel = theta == PlanBlockVictims::kLruFreeKey;   // only free slots are taken
        // age > older: taken
        const float older = static_cast<float>(freeLevel ? PlanBlockVictims::kLruFreeKey : theta);
        const float tie = freeLevel ? -1.0f : static_cast<float>(theta);
        const LocalTensor<float> af = ctx_.wWin_.ReinterpretCast<float>();
        const LocalTensor<int32_t> lane = ctx_.wKey_, ids = ctx_.wSlot_, tieIds = ctx_.wTmp_, out = ctx_.wIdx_;
        const LocalTensor<float> idsF = ctx_.wTmp_.ReinterpretCast<float>();   // after tieIds is read
        Sync<HardEvent::S_V>();
        Sync<HardEvent::V_S>();                   // CreateVecIndex starts with scalar writes (of a count sink)
        CreateVecIndex(lane, 0, W);
        uint32_t have = 0;
        for (uint32_t id = 0; id < sl.nwin && have < m; ++id) {
            const uint32_t start = id * sl.wlen, cntW = WinCount(sl, static_cast<int32_t>(id));
            if (start >= ctx_.activeCap_) break;
            const bool hasFree = PlanBlockVictims::WinSetHas(victims_.lruFreeWins_, id);
            const bool hasOlder = PlanBlockVictims::WinSetHas(olderWins, id);
            const bool hasTie = ties != 0 && PlanBlockVictims::WinSetHas(tieWins, id);
            if (!hasFree && (freeLevel || (!hasOlder && !hasTie))) continue;
            ctx_.Ensure(sl, static_cast<int32_t>(id));
            for (uint32_t off = 0; off < cntW && start + off < ctx_.activeCap_ && have < m; off += W) {
                const uint32_t base = start + off, n = MinU(W, cntW - off), live = MinU(n, ctx_.activeCap_ - base);
                Sync<HardEvent::S_V>();           // the previous chunk's installs and scalar reads
                PipeBarrier<PIPE_V>();            // and its vector readers of af / ids / the masks
                Cast(af, sl.buf[off], RoundMode::CAST_RINT, n);
                Adds(ids, lane, static_cast<int32_t>(base), n);
                PipeBarrier<PIPE_V>();
                avsg::CompareScalarAll(ctx_.mA_, af, older, CMPMODE::GT, n);
                avsg::CompareScalarAll(ctx_.mB_, af, tie, CMPMODE::EQ, n);
                const bool freeOlder = !freeLevel && hasFree;   // free: older than any age
                if (freeOlder) avsg::CompareScalarAll(ctx_.mC_, af, -1.0f, CMPMODE::EQ, n);
                PipeBarrier<PIPE_V>();
                if (freeOlder) Or(ctx_.U16(ctx_.mA_), ctx_.U16(ctx_.mA_), ctx_.U16(ctx_.mC_), n / 16);
                uint64_t e = 0;
                GatherMask(tieIds, ids, ctx_.U32(ctx_.mB_), true, live, GatherMaskParams(1, 1, 8, 0), e);
                if (static_cast<uint32_t>(e) > ties) {   // the tie boundary lies in this chunk
                    Sync<HardEvent::V_S>();
                    const float last = ties == 0 ? -1.0f : static_cast<float>(tieIds.GetValue(ties - 1));
                    Sync<HardEvent::S_V>();
                    PipeBarrier<PIPE_V>();
                    Cast(idsF, ids, RoundMode::CAST_RINT, n);   // slot ids < 2^15: exact
                    PipeBarrier<PIPE_V>();
                    avsg::CompareScalarAll(ctx_.mC_, idsF, last, CMPMODE::LE, n);
                    PipeBarrier<PIPE_V>();
                    And(ctx_.U16(ctx_.mB_), ctx_.U16(ctx_.mB_), ctx_.U16(ctx_.mC_), n / 16);
                    ties = 0;
                } else {
                    ties -= static_cast<uint32_t>(e);
                }
                PipeBarrier<PIPE_V>();
                Or(ctx_.U16(ctx_.mA_), ctx_.U16(ctx_.mA_), ctx_.U16(ctx_.mB_), n / 16);
                PipeBarrier<PIPE_V>();
                uint64_t got = 0;
                GatherMask(out, ids, ctx_.U32(ctx_.mA_), true, live, GatherMaskParams(1, 1, 8, 0), got);
                const uint32_t take = MinU(static_cast<uint32_t>(got), m - have);
                if (take == 0) continue;
                Sync<HardEvent::V_S>();
                Sync<HardEvent::V_MTE3>();
                StoreInts(ctx_.missSlotsGm_[rowN + have], out, take);
                Sync<HardEvent::MTE3_V>();
                for (uint32_t q = 0; q < take; ++q) {
                    const uint32_t j = have + q;
                    ctx_.LoadMisses(r, j - j % nc, m);   // miss_pos chunk of j in vWant_
                    const uint32_t s = static_cast<uint32_t>(out.GetValue(q));
                    ctx_.Put(ctx_.win_[avsg::SEC_SP], s, ctx_.vWant_.GetValue(j % nc));
                    ctx_.Put(sl, s, 0);                  // an age: used this step
                }
                have += take;
            }
        }
        ctx_.missChunk_ = -1;   // vMS_ was loaded before this step's victims were stored
    }
    __aicore__ inline void AllocateLru(uint32_t r, uint32_t m) {
        if (m == 0) return;
        int32_t theta = PlanBlockVictims::kLruFreeKey;              // enough free slots: the first m of them
        uint32_t above = 0;                       // count(x > theta)
        // windows with an age >= lo / >= hi
        uint32_t loWins[PlanBlockVictims::kLruWinWords], hiWins[PlanBlockVictims::kLruWinWords];
        PlanBlockVictims::WinSetClear(loWins, true);
        PlanBlockVictims::WinSetClear(hiWins, false);
        if (victims_.freeSlots_ < m) {
            // count(x >= lo) >= m > count(x >= hi) = above: lo = 0 counts every candidate (the
            // active capacity holds N >= m), no candidate is older than maxAge_
            int32_t lo = 0, hi = (victims_.maxAge_ > 0 ? victims_.maxAge_ : 0) + 1;
            above = victims_.freeSlots_;
            for (bool top = true; hi - lo > 1; top = false) {
                const uint32_t span = static_cast<uint32_t>(hi - lo);
                const uint32_t k = MinU(PlanBlockVictims::kLruThresholds, span - 1);
                int32_t t[PlanBlockVictims::kLruThresholds];
                uint32_t cnt[PlanBlockVictims::kLruThresholds];
                uint32_t seen[PlanBlockVictims::kLruThresholds][PlanBlockVictims::kLruWinWords];
                for (uint32_t i = 0; i < k; ++i)  // strictly increasing inside (lo, hi): span > k
                    t[i] = top ? hi - static_cast<int32_t>(k - i)
                               : lo + static_cast<int32_t>(span * (i + 1) / (k + 1));
                CountAgesAtLeast(t, k, cnt, seen);
                for (uint32_t i = k; i-- > 0;) {  // counts fall as t rises
                    if (cnt[i] + victims_.freeSlots_ >= m) {
                        lo = t[i];
                        PlanBlockVictims::WinSetCopy(loWins, seen[i]);
                        break;
                    }
                    hi = t[i];
                    above = cnt[i] + victims_.freeSlots_;
                    PlanBlockVictims::WinSetCopy(hiWins, seen[i]);
                }
            }
            theta = lo;
        }
        SelectLru(r, m, theta, m - above, loWins, hiWins);   // hi = theta + 1 here
    }

    // the context and the blocks this one calls
    PlanContext& ctx_;
    PlanBlockProbe& probe_;
    PlanBlockHeat& heat_;
    PlanBlockVictims& victims_;
};

}  // namespace avsg_kernel
