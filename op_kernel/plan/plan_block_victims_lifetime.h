// plan_block_victims_lifetime.h: the lifetime policy's victim search (step 3), specialised on
// its policy type: the lowest (life, slot - hand mod S): a level scan from the lowest life up,
// ties from the hand. The decay pass before it is plan_block_decay_lifetime.h, what the searches
// share plan_block_victims.h; the kernel composes VictimSearch<Policy> (plan_kernel.h).
#pragma once
#include "plan_block_victims.h"

namespace avsg_kernel {

template <>
class VictimSearch<PolicyLifetime> {
public:
    // every search gets the same pieces (the kernel builds whichever its policy names)
    __aicore__ inline explicit VictimSearch(PlanContext& ctx, PlanBlockProbe& probe, PlanBlockHeat& heat,
                                            PlanBlockVictims& victims)
        : ctx_(ctx), probe_(probe), heat_(heat), victims_(victims) {}
    // the m victims to miss_slots, each miss installed in its victim as they are found
    __aicore__ inline void Assign(uint32_t r, uint32_t m) { Allocate(r, m); }

    // Victims in (life, turn) order among life < L, turn = (slot - hand) mod S: per level the
    // slots [hand, A) then [0, hand), stopping at M -> miss_slots[0:M]. Each chunk's victims are
    // installed while their slot_life window is resident (miss j takes the j-th victim: slot_pos
    // = its position, slot_life = L+1, fresh), instead of in a second walk over the windows; a
    // slot installed at level lv holds L+1, which no later level (< L) matches, so the victims are
    // those of the decayed state. The hand then moves past the last victim.
    // Where DecayAndPin's half copy of the lives fits, a level is one compare of the whole copy,
    // cut by two range masks built once ([hand, A) and [0, hand)), and each chunk one compaction
    // of the lane ids by its slice (its victims' slot ids are the lane ids + the chunk's base):
    // the victims spread over a few levels, each with a few slots in most chunks. Otherwise one
    // compare per chunk of a window (the chunks that cross an end of the range also mask the
    // slot ids to it: int32 Compares is EQ-only on A2, so through float).
    __aicore__ inline void Allocate(uint32_t r, uint32_t m) {
        Win& sl = ctx_.win_[avsg::SEC_SL];
        constexpr uint32_t kHandWord = avsg::kHeaderHand - avsg::kHeaderStashCount;
        const int32_t handWord = ctx_.countUb_.GetValue(kHandWord);
        const uint32_t hand = handWord >= 0 && static_cast<uint32_t>(handWord) < ctx_.activeCap_
                                  ? static_cast<uint32_t>(handWord) : 0u;
        uint32_t have = 0, lastSlot = 0;
        const bool compact = victims_.HalfCopyFits();
        // The scan starts at the lowest life a candidate (a slot below the active capacity)
        // holds, -1 if one is free: every level below it is empty, and at L = 255 there can be
        // hundreds (a hit holds L, above every level). One reduction instead of their passes:
        // over the half copy where it fits, else of DecayAndPin's lane-wise minimum. After the
        // free slots (level -1) it jumps again, to the lowest life held (below).
        const int32_t low = compact ? HalfCopyLowestLife() : victims_.lowestLife_;
        const int32_t lv0 = low < static_cast<int32_t>(ctx_.t_.lifetime) ? (low < -1 ? -1 : low) : 0;
        // Chunks of Wide() slots (2,048 at nc 512; whole windows where they are shorter): a
        // compaction whatever its length, so four times fewer chunks than at nc lanes. The lane
        // ids in wSlot_, the chunk's victims in wIdx_, the windows' slot ids in wWin_ or the half
        // copy's masks there (the wide vectors are idle here).
        const LocalTensor<int32_t> ids = ctx_.wWin_, found = ctx_.wIdx_;
        if (compact) RangeMasks(hand);
        SlotLanes();
        // A chunk that takes no victim touches no UB by scalar (GatherMask's count needs no
        // sync): the next one then needs only a barrier (its compaction rewrites what this one's
        // reads), not the S_V / V_S pair around the scalar installs.
        bool touched = true;                      // scalar UB accesses since the last S_V
        bool fenced = true;                       // SlotLanes just ended with an S_V and a barrier
        for (int32_t lv = lv0; lv < static_cast<int32_t>(ctx_.t_.lifetime) && have < m; ++lv) {
            if (compact) {
                if (!fenced) LevelMasks(lv, touched);
                else LevelMasksFenced(lv);
                touched = false;
            }
            fenced = false;
            for (uint32_t part = 0; part < 2 && have < m; ++part) {
                const uint32_t lo = part == 0 ? hand : 0u, hi = part == 0 ? ctx_.activeCap_ : hand;
                const uint32_t grid = compact ? probe_.Wide() : MinU(probe_.Wide(), sl.wlen);
                for (uint32_t base = lo - lo % grid, n = 0; base < hi && have < m; base += n) {
                    if (touched) Sync<HardEvent::S_V>();   // the previous chunk's `found` reads, copy writes
                    else PipeBarrier<PIPE_V>();
                    touched = false;
                    uint64_t got = 0;
                    if (compact) {
                        n = MinU(grid, ctx_.t_.capPad - base);
                        GatherMask(found, ctx_.wSlot_, ctx_.U32(Mask(kLevelPart + part)[base / 8]), true, n,
                                   GatherMaskParams(1, 1, 8, 0), got);
                    } else {
                        const int32_t id = static_cast<int32_t>(base >> sl.wlog);
                        ctx_.Ensure(sl, id);
                        const uint32_t off = base - static_cast<uint32_t>(id) * sl.wlen;
                        n = MinU(grid, WinCount(sl, id) - off);
                        avsg::CompareScalarAll(ctx_.mA_, sl.buf[off], lv, CMPMODE::EQ, n);
                        Adds(ids, ctx_.wSlot_, static_cast<int32_t>(base), n);   // slot ids
                        PipeBarrier<PIPE_V>();
                        if (base < lo || base + n > hi) KeepSlotsIn(ids, lo, hi, n);
                        GatherMask(found, ids, ctx_.U32(ctx_.mA_), true, n, GatherMaskParams(1, 1, 8, 0), got);
                    }
                    const uint32_t take = MinU(static_cast<uint32_t>(got), m - have);
                    if (take) {
                        touched = true;
                        if (compact) {            // lane ids -> slot ids
                            PipeBarrier<PIPE_V>();
                            Adds(found, found, static_cast<int32_t>(base), take);
                        }
                        // fresh (L + 1): above every level
                        const int32_t fresh = static_cast<int32_t>(ctx_.t_.lifetime) + 1;
                        lastSlot = victims_.Install(r, have, take, m, found, fresh);
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
                SlotLanes();                      // the reduction's scratch took wSlot_
                touched = true;
            }
        }
        if (have) {
            const uint32_t hand = lastSlot + 1 < ctx_.activeCap_ ? lastSlot + 1 : 0u;
            ctx_.countUb_.SetValue(kHandWord, static_cast<int32_t>(hand));
        }
        victims_.FlushInstalled(r, m);   // the last chunk of miss_slots; vWant_ / vMS_ hold it
    }
    // The half copy's masks (bits of its HalfCopyLanes() lanes) in wWin_ (idle here: 4 nc words,
    // and a mask is at most 2 nc bytes, HalfCopyFits): the range of each part of a level, then
    // the level's slots in each, then the level's slots.
    static constexpr uint32_t kRangePart = 0, kLevelPart = 2, kLevel = 4;
    __aicore__ inline LocalTensor<uint8_t> Mask(uint32_t i) {
        const uint32_t bytes = avsg::RoundUp(victims_.HalfCopyLanes() / 8, 32u);
        ascendc_assert(i <= kLevel && (i + 1) * bytes <= 16 * ctx_.t_.nc);
        return ctx_.wWin_.ReinterpretCast<uint8_t>()[i * bytes];
    }
    // Part 0's range [hand, A) and part 1's [0, hand) as masks, once per step. Where the active
    // capacity A covers every lane of the copy, part 0 is part 1's complement.
    __aicore__ inline void RangeMasks(uint32_t hand) {
        const LocalTensor<uint16_t> part0 = ctx_.U16(Mask(kRangePart)), part1 = ctx_.U16(Mask(kRangePart + 1));
        const LocalTensor<uint16_t> active = ctx_.U16(Mask(kLevel));   // free until the first level
        const uint32_t words = victims_.HalfCopyLanes() / 16;
        const bool cut = ctx_.activeCap_ < victims_.HalfCopyLanes();
        Sync<HardEvent::S_V>();                   // scalar reads of wWin_ (the victims' last lists)
        PipeBarrier<PIPE_V>();
        LanesBelow(part1, hand);
        if (cut) LanesBelow(active, ctx_.activeCap_);
        Sync<HardEvent::V_S>();
        PatchLanesBelow(part1, hand);
        if (cut) PatchLanesBelow(active, ctx_.activeCap_);
        Sync<HardEvent::S_V>();
        Not(part0, part1, words);
        if (!cut) return;
        PipeBarrier<PIPE_V>();
        And(part0, part0, active, words);
    }
    // bits = lanes [0, k) of the half copy's lanes: whole 32 B granules (256 lanes) by Duplicate
    // here, the granule k falls in by scalar (PatchLanesBelow, after a V_S; the mask goes back to
    // the vector pipe with an S_V).
    __aicore__ inline void LanesBelow(const LocalTensor<uint16_t>& bits, uint32_t k) {
        const uint32_t words = victims_.HalfCopyLanes() / 16, full = k / 256 * 16;
        if (full) Duplicate(bits, static_cast<uint16_t>(0xFFFF), full);
        if (full < words) Duplicate(bits[full], static_cast<uint16_t>(0), words - full);
    }
    __aicore__ inline void PatchLanesBelow(const LocalTensor<uint16_t>& bits, uint32_t k) {
        for (uint32_t w = k / 256 * 16; w < (k + 15) / 16; ++w)
            bits.SetValue(w, static_cast<uint16_t>(w < k / 16 ? 0xFFFFu : (1u << (k % 16)) - 1u));
    }
    // The slots at life lv (the half copy, one compare) in each part's range.
    __aicore__ inline void LevelMasks(int32_t lv, bool touched) {
        if (touched) Sync<HardEvent::S_V>();      // the installs' scalar writes of the half copy
        PipeBarrier<PIPE_V>();                    // the previous level's compactions read the masks
        LevelMasksFenced(lv);
    }
    // The same where the scalar writes and the vector readers before it are ordered already
    __aicore__ inline void LevelMasksFenced(int32_t lv) {
        const uint32_t words = victims_.HalfCopyLanes() / 16;
        avsg::CompareScalarAll(Mask(kLevel), ctx_.sHalf_, static_cast<half>(static_cast<float>(lv)), CMPMODE::EQ,
                               victims_.HalfCopyLanes());
        PipeBarrier<PIPE_V>();
        for (uint32_t part = 0; part < 2; ++part)
            And(ctx_.U16(Mask(kLevelPart + part)), ctx_.U16(Mask(kLevel)), ctx_.U16(Mask(kRangePart + part)), words);
    }
    // After the miss lists are published: the lives go back to GM from the half copy (the miss
    // lists do not depend on it, so plan_gather's copy already runs beside it).
    __aicore__ inline void AfterPublish() {
        if (victims_.HalfCopyFits()) victims_.WriteBackHalfCopy();
    }
    // The lowest life a candidate (a slot below the active capacity) holds, -1 if one is free:
    // over the half copy, which DecayAndPin's casts and Allocate's installs wrote.
    __aicore__ inline int32_t HalfCopyLowestLife() {
        const LocalTensor<half> lowest = ctx_.wIdx_.ReinterpretCast<half>();
        Sync<HardEvent::S_V>();                   // the installs' scalar writes of the half copy
        PipeBarrier<PIPE_V>();                    // DecayAndPin's casts into it
        ReduceMin(lowest, ctx_.sHalf_, ctx_.wSlot_.ReinterpretCast<half>(), static_cast<int32_t>(ctx_.activeCap_));
        Sync<HardEvent::V_S>();
        return static_cast<int32_t>(static_cast<float>(lowest.GetValue(0)));
    }
    // The same from the slot_life windows, where the half copy does not fit: one vector pass
    // (lane-wise Min, then one ReduceMin), from the resident window on.
    __aicore__ inline int32_t WindowLowestLife() {
        Win& sl = ctx_.win_[avsg::SEC_SL];
        const LocalTensor<float> lowest = ctx_.wTmp_.ReinterpretCast<float>();
        const LocalTensor<float> lifeF = ctx_.wWin_.ReinterpretCast<float>();
        const uint32_t chunk = probe_.Wide();
        Sync<HardEvent::S_V>();                   // the installs' scalar writes of the windows
        Duplicate(lowest, static_cast<float>(ctx_.t_.lifetime), chunk);
        const uint32_t first = sl.cur < 0 ? 0u : static_cast<uint32_t>(sl.cur);
        for (uint32_t k = 0; k < sl.nwin; ++k) {
            const int32_t id = static_cast<int32_t>((first + k) % sl.nwin);
            const uint32_t base = static_cast<uint32_t>(id) * sl.wlen;
            if (base >= ctx_.activeCap_) continue;
            ctx_.Ensure(sl, id);
            const uint32_t live = MinU(WinCount(sl, id), ctx_.activeCap_ - base);
            for (uint32_t off = 0; off < live; off += chunk) {
                const uint32_t n = MinU(chunk, live - off);
                PipeBarrier<PIPE_V>();            // the previous chunk's Min reads lifeF
                Cast(lifeF, sl.buf[off], RoundMode::CAST_RINT, n);   // lives in [-1, L+1]: exact
                PipeBarrier<PIPE_V>();
                Min(lowest, lowest, lifeF, n);
            }
        }
        PipeBarrier<PIPE_V>();
        ReduceMin(ctx_.wIdx_.ReinterpretCast<float>(), lowest, ctx_.wSlot_.ReinterpretCast<float>(),
                  static_cast<int32_t>(chunk));
        Sync<HardEvent::V_S>();
        return static_cast<int32_t>(ctx_.wIdx_.ReinterpretCast<float>().GetValue(0));
    }
    // wSlot_ = the lane ids 0 .. Wide() - 1 (the chunks' slot ids are them + the chunk's base)
    __aicore__ inline void SlotLanes() {
        Sync<HardEvent::S_V>();                   // scalar reads of what wSlot_ held
        PipeBarrier<PIPE_V>();
        CreateVecIndex(ctx_.wSlot_, 0, probe_.Wide());
        PipeBarrier<PIPE_V>();
    }
    // mA_ &= lo <= slot id (ids) < hi on n lanes; ids are < 2^24, exact in float. Scratch: the
    // chunk's victims' vector (wIdx_), which the compaction after this overwrites.
    __aicore__ inline void KeepSlotsIn(const LocalTensor<int32_t>& ids, uint32_t lo, uint32_t hi, uint32_t n) {
        const LocalTensor<float> idsF = ctx_.wIdx_.ReinterpretCast<float>();
        Cast(idsF, ids, RoundMode::CAST_RINT, n);
        PipeBarrier<PIPE_V>();
        avsg::CompareScalarAll(ctx_.mB_, idsF, static_cast<float>(lo), CMPMODE::GE, n);
        PipeBarrier<PIPE_V>();
        And(ctx_.U16(ctx_.mA_), ctx_.U16(ctx_.mA_), ctx_.U16(ctx_.mB_), n / 16);
        PipeBarrier<PIPE_V>();
        avsg::CompareScalarAll(ctx_.mB_, idsF, static_cast<float>(hi), CMPMODE::LT, n);
        PipeBarrier<PIPE_V>();
        And(ctx_.U16(ctx_.mA_), ctx_.U16(ctx_.mA_), ctx_.U16(ctx_.mB_), n / 16);
        PipeBarrier<PIPE_V>();
    }

    // the context and the blocks this one calls
    PlanContext& ctx_;
    PlanBlockProbe& probe_;
    PlanBlockHeat& heat_;
    PlanBlockVictims& victims_;
};

}  // namespace avsg_kernel
