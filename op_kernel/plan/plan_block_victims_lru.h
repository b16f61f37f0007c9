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
    // After the miss lists are published: the ages (with the installs) go back from the half copy.
    __aicore__ inline void AfterPublish() {
        if (victims_.HalfCopyFits()) victims_.WriteBackHalfCopy();
    }

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
    // cnt[i] = count(age >= t[i]) over the slots below the active capacity, t[i] >= 1 (free and
    // pinned slots never count), t ascending, k <= kLruThresholds, in one pass over the slot_life
    // windows: the resident one first, then those above it, then those below it, down to window
    // 0. seen[i]: the windows where that count is not 0. From the half copy of the ages where
    // DecayAndPin wrote one (no window moves, one set), from the top down: below the first
    // count that reaches `need`, cnt[i] is `need` (a lower bound; AllocateLru reads none of them).
    // GatherMask counts the set bits of each compare mask; its source is only a count, so it
    // runs on 16-bit lanes (half the repeats of a 32-bit one).
    __aicore__ inline void CountAgesAtLeast(const int32_t* t, uint32_t k, uint32_t need, uint32_t* cnt,
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
            // one compare of the whole copy per threshold, from the highest down until a count
            // reaches `need`: the caller reads no count below it, and each below it is at least
            // `need` (counts fall as t rises), which is what it is given (seen: every set). One
            // mask (wSlot_) and one sink as large as the copy (wPair_), a barrier apart; the count
            // by set (SelectLru's chunks, W slots each: no barrier between their compactions, each
            // has its own part of the sink), so that SelectLru skips the chunks without one.
            const uint32_t n = victims_.HalfCopyLanes(), live = ctx_.activeCap_;
            const LocalTensor<uint16_t> ages = ctx_.sHalf_.ReinterpretCast<uint16_t>();
            const LocalTensor<uint16_t> sink = ctx_.wPair_.ReinterpretCast<uint16_t>();
            const LocalTensor<uint8_t> mask = victims_.HalfMask(0);
            Sync<HardEvent::S_V>();               // scalar reads of the sink (DecayAndPin's maximum)
            bool reached = false;
            for (uint32_t i = k; i-- > 0;) {
                if (reached) {
                    cnt[i] = need;
                    PlanBlockVictims::WinSetClear(seen[i], true);
                    continue;
                }
                PipeBarrier<PIPE_V>();            // the copy's writers; the previous GatherMasks
                avsg::CompareScalarAll(mask, ctx_.sHalf_, static_cast<half>(static_cast<float>(t[i])), CMPMODE::GE, n);
                PipeBarrier<PIPE_V>();
                for (uint32_t base = 0; base < live; base += W) {
                    uint64_t got = 0;
                    GatherMask(sink[base], ages[base], ctx_.U16(mask[base / 8]), true, MinU(W, live - base),
                               GatherMaskParams(1, 1, 8, 0), got);
                    cnt[i] += static_cast<uint32_t>(got);
                    if (got) PlanBlockVictims::WinSetAdd(seen[i], base / W);   // LruSetLen: W
                }
                reached = cnt[i] >= need;
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
    // miss_slots[0:m], each installed as Allocate does (slot_pos = its position, age 0); a slot
    // installed in one chunk is not read again. The ages come from DecayAndPin's half copy where
    // it fits (installs write it; WriteBackHalfCopy stores the section once), else from the
    // slot_life windows, of which only those that hold a victim are loaded: a free slot
    // (lruFreeWins_), an age above theta (olderWins) or, while ties are still taken, one at theta
    // (tieWins: ages >= theta). Either way a chunk is Wide() slots (or a shorter window) and
    // TakeChunk picks its victims.
    __aicore__ inline void SelectLru(uint32_t r, uint32_t m, int32_t theta, uint32_t ties, const uint32_t* tieWins,
                                     const uint32_t* olderWins) {
        const uint32_t W = probe_.Wide();
        Win& sl = ctx_.win_[avsg::SEC_SL];
        const bool compact = victims_.HalfCopyFits();
        Chunk ch;
        ch.freeLevel = theta == PlanBlockVictims::kLruFreeKey;   // only free slots are taken
        // age > older: taken
        ch.older = static_cast<float>(ch.freeLevel ? PlanBlockVictims::kLruFreeKey : theta);
        ch.tie = ch.freeLevel ? -1.0f : static_cast<float>(theta);
        ch.ties = ties;
        const LocalTensor<float> af = ctx_.wTmp_.ReinterpretCast<float>();   // windows only: no half copy
        Sync<HardEvent::S_V>();
        Sync<HardEvent::V_S>();                   // CreateVecIndex starts with scalar writes (of a count sink)
        CreateVecIndex(ctx_.wSlot_, 0, W);        // lane ids
        uint32_t have = 0;
        const uint32_t grid = compact ? W : MinU(W, sl.wlen), setLen = victims_.LruSetLen();
        for (uint32_t base = 0; base < ctx_.activeCap_ && have < m; base += grid) {
            const uint32_t id = base / sl.wlen, last = MinU(base + grid, ctx_.activeCap_) - 1;
            bool hasFree = false, hasOlder = false, hasTie = false;   // in the sets the chunk spans
            for (uint32_t w = base / setLen; w <= last / setLen; ++w) {
                hasFree = hasFree || PlanBlockVictims::WinSetHas(victims_.lruFreeWins_, w);
                hasOlder = hasOlder || PlanBlockVictims::WinSetHas(olderWins, w);
                hasTie = hasTie || (ch.ties != 0 && PlanBlockVictims::WinSetHas(tieWins, w));
            }
            if (!hasFree && (ch.freeLevel || (!hasOlder && !hasTie))) continue;
            ch.freeOlder = !ch.freeLevel && hasFree;   // free: older than any age
            uint32_t n, got;
            Sync<HardEvent::S_V>();               // the previous chunk's installs and scalar reads
            PipeBarrier<PIPE_V>();                // and its vector readers of the ids and the masks
            if (compact) {
                n = MinU(grid, ctx_.t_.capPad - base);
                got = TakeChunk(ctx_.sHalf_[base], avsg::RoundUp(n, PlanBlockVictims::kHalfCopyLanes), base, n,
                                MinU(n, ctx_.activeCap_ - base), ch);
            } else {
                ctx_.Ensure(sl, static_cast<int32_t>(id));
                const uint32_t off = base - id * sl.wlen;
                n = MinU(grid, WinCount(sl, static_cast<int32_t>(id)) - off);
                Cast(af, sl.buf[off], RoundMode::CAST_RINT, n);   // ages in [-1, 1023]: exact
                PipeBarrier<PIPE_V>();
                got = TakeChunk(af, n, base, n, MinU(n, ctx_.activeCap_ - base), ch);
            }
            const uint32_t take = MinU(got, m - have);
            if (take == 0) continue;
            victims_.Install(r, have, take, m, ctx_.wIdx_, 0);   // an age: used this step
            have += take;
        }
        victims_.FlushInstalled(r, m);   // the last chunk of miss_slots; vWant_ / vMS_ hold it
    }
    // What SelectLru's chunks share: the threshold, the ties still to take, whether free slots
    // count as older (they do unless only free slots are taken).
    struct Chunk {
        bool freeLevel = false, freeOlder = false;
        float older = 0.0f, tie = 0.0f;
        uint32_t ties = 0;
    };
    // One chunk's victims, slots base .. base + live - 1 (ages[0:cmp] its ages, cmp >= n lanes
    // compared: the half copy compares whole 256 B), in slot order -> wIdx_; returns how many.
    // Victims: age > older, free slots where they count as older, and the first ch.ties slots
    // at age tie (ch.ties falls by those taken). UB: wSlot_ (lane ids, read), wWin_ (slot ids),
    // wIdx_ (the ties, then the slot ids as float, then the victims), mA_ / mB_ / mC_.
    template <class T>
    __aicore__ inline uint32_t TakeChunk(const LocalTensor<T>& ages, uint32_t cmp, uint32_t base, uint32_t n,
                                         uint32_t live, Chunk& ch) {
        const LocalTensor<int32_t> ids = ctx_.wWin_, out = ctx_.wIdx_;
        const LocalTensor<float> idsF = ctx_.wIdx_.ReinterpretCast<float>();   // after the ties are read
        Adds(ids, ctx_.wSlot_, static_cast<int32_t>(base), n);
        avsg::CompareScalarAll(ctx_.mA_, ages, static_cast<T>(ch.older), CMPMODE::GT, cmp);
        avsg::CompareScalarAll(ctx_.mB_, ages, static_cast<T>(ch.tie), CMPMODE::EQ, cmp);
        if (ch.freeOlder) avsg::CompareScalarAll(ctx_.mC_, ages, static_cast<T>(-1.0f), CMPMODE::EQ, cmp);
        PipeBarrier<PIPE_V>();
        if (ch.freeOlder) Or(ctx_.U16(ctx_.mA_), ctx_.U16(ctx_.mA_), ctx_.U16(ctx_.mC_), n / 16);
        uint64_t e = 0;
        GatherMask(out, ids, ctx_.U32(ctx_.mB_), true, live, GatherMaskParams(1, 1, 8, 0), e);
        if (static_cast<uint32_t>(e) > ch.ties) {   // the tie boundary lies in this chunk
            Sync<HardEvent::V_S>();
            const float last = ch.ties == 0 ? -1.0f : static_cast<float>(out.GetValue(ch.ties - 1));
            Sync<HardEvent::S_V>();
            PipeBarrier<PIPE_V>();
            Cast(idsF, ids, RoundMode::CAST_RINT, n);   // slot ids < 2^15: exact
            PipeBarrier<PIPE_V>();
            avsg::CompareScalarAll(ctx_.mC_, idsF, last, CMPMODE::LE, n);
            PipeBarrier<PIPE_V>();
            And(ctx_.U16(ctx_.mB_), ctx_.U16(ctx_.mB_), ctx_.U16(ctx_.mC_), n / 16);
            ch.ties = 0;
        } else {
            ch.ties -= static_cast<uint32_t>(e);
        }
        PipeBarrier<PIPE_V>();
        Or(ctx_.U16(ctx_.mA_), ctx_.U16(ctx_.mA_), ctx_.U16(ctx_.mB_), n / 16);
        PipeBarrier<PIPE_V>();
        uint64_t got = 0;
        GatherMask(out, ids, ctx_.U32(ctx_.mA_), true, live, GatherMaskParams(1, 1, 8, 0), got);
        return static_cast<uint32_t>(got);
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
                CountAgesAtLeast(t, k, m - victims_.freeSlots_, cnt, seen);
                // counts fall as t rises; read from the top down, stopping at the first that
                // reaches the misses: CountAgesAtLeast fills the counts below it with a bound
                for (uint32_t i = k; i-- > 0;) {
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
            // a pinned slot (age 0) is never a victim: the header check keeps A >= T*K, so at
            // least m unpinned candidates have an age >= 1
            ascendc_assert(theta >= 1);
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
