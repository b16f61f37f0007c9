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
    // slot_life = the half copy (lives in [-1, L+1], ages in [-1, 1023]: exact in half, so one
    // half -> int16 Cast), in one stretch through wPair_ (it holds 4 * Wide() int16 entries, as
    // many as the half copy), straight to GM: every entry is overwritten, so the section moves in
    // once (HalfCopyLoad) and out once, and its window stays empty.
    __aicore__ inline void WriteBackHalfCopy() {
        const Win& sl = ctx_.win_[avsg::SEC_SL];
        const LocalTensor<int16_t> stage16 = ctx_.wPair_.ReinterpretCast<int16_t>();
        Sync<HardEvent::S_V>();                   // the installs' scalar writes of the half copy
        PipeBarrier<PIPE_V>();                    // and the search's vector readers of the wide vectors
        Cast(stage16, ctx_.sHalf_, RoundMode::CAST_RINT, ctx_.t_.capPad);   // integers: exact
        Sync<HardEvent::V_MTE3>();
        DataCopy(sl.gm16, stage16, ctx_.t_.capPad);
        // one MTE3_S: the scalar unit issues every later instruction, vector and MTE2 alike
        // (emulation/emu_hazard.h, "Scalar issue")
        Sync<HardEvent::MTE3_S>();
    }
    // A chunk's victims found[0:take] -> misses have .. have + take - 1, each installed at once
    // (lifetime and lru): miss j takes found[q]: slot_pos = its position, slot_life = life (the
    // half copy where DecayAndPin wrote one, else the slot_life window). The victims are staged
    // in vMS_, the miss_slots chunk LoadMisses holds with its positions in vWant_, and go out a
    // chunk at a time (FlushInstalled; the search ends with it), not one store per call: the
    // insert then finds the last chunk in vWant_ / vMS_ as LoadMisses would bring it back.
    // Returns the last slot installed.
    __aicore__ inline uint32_t Install(uint32_t r, uint32_t have, uint32_t take, uint32_t m,
                                       const LocalTensor<int32_t>& found, int32_t life) {
        const uint32_t nc = ctx_.t_.nc;
        const bool compact = HalfCopyFits();
        Sync<HardEvent::V_S>();
        uint32_t s = 0;
        for (uint32_t q = 0; q < take; ++q) {
            const uint32_t j = have + q;
            if (j % nc == 0 && j > 0) FlushInstalled(r, m);   // chunk j / nc - 1 is whole
            ctx_.LoadMisses(r, j - j % nc, m);   // miss_pos chunk of j in vWant_
            s = static_cast<uint32_t>(found.GetValue(q));
            ctx_.vMS_.SetValue(j % nc, static_cast<int32_t>(s));
            ctx_.Put(ctx_.win_[avsg::SEC_SP], s, ctx_.vWant_.GetValue(j % nc));
            if (compact) ctx_.sHalf_.SetValue(s, static_cast<half>(static_cast<float>(life)));
            else ctx_.Put(ctx_.win_[avsg::SEC_SL], s, life);
        }
        return s;
    }
    // The staged miss_slots chunk (vMS_, chunk missChunk_ of the m misses) to GM; vMS_ stays
    // that chunk's, readable and writable by every pipe after.
    __aicore__ inline void FlushInstalled(uint32_t r, uint32_t m) {
        const uint32_t j0 = static_cast<uint32_t>(ctx_.missChunk_) * ctx_.t_.nc;
        if (ctx_.missChunk_ < 0 || j0 >= m) return;   // no install yet
        Sync<HardEvent::S_MTE3>();
        StoreInts(ctx_.missSlotsGm_[static_cast<uint64_t>(r) * ctx_.t_.outPitch + j0], ctx_.vMS_,
                  MinU(ctx_.t_.nc, m - j0));
        Sync<HardEvent::MTE3_V>();
        Sync<HardEvent::MTE3_S>();
    }
    // lru and reuse: lifeF[0:n] = the ages in life one step older, the hits (hitBits_ from slot
    // base on) at age 0; aged[0:n] = the same before the pins (int32: reuse's CountHits reads
    // them). One step older is min(age + 1, 1023) + min(age, 0) on ages clamped to [-1, 1023]:
    // free slots (-1) stay free. Clamped to [-1, 1022] instead, age + 1 needs no upper clamp
    // (1023 -> 1022 + 1), and its two terms are independent (t3 apart from t1): four dependency
    // levels before the Cast, not six. Scratch: t1 (lifeF may alias it), t3, mA_.
    __aicore__ inline void AgeAndPin(const LocalTensor<int32_t>& life, uint32_t base, uint32_t n,
                                     const LocalTensor<int32_t>& t1, const LocalTensor<int32_t>& t3,
                                     const LocalTensor<int32_t>& aged, const LocalTensor<float>& lifeF) {
        Maxs(t1, life, -1, n);
        PipeBarrier<PIPE_V>();
        Mins(t1, t1, avsg::kReuseAgeMax - 1, n);
        PipeBarrier<PIPE_V>();
        Adds(aged, t1, 1, n);
        Mins(t3, t1, 0, n);
        PipeBarrier<PIPE_V>();
        Add(aged, aged, t3, n);
        PipeBarrier<PIPE_V>();
        Cast(lifeF, aged, RoundMode::CAST_RINT, n);
        Not(ctx_.U16(ctx_.mA_), ctx_.hitBits_.ReinterpretCast<uint16_t>()[base / 16], n / 16);
        PipeBarrier<PIPE_V>();
        Select(lifeF, ctx_.mA_, lifeF, 0.0f, SELMODE::VSEL_TENSOR_SCALAR_MODE, n);   // hits: age 0
        PipeBarrier<PIPE_V>();
    }
    // The half copy's pass (DecayInHalf of lifetime and lru) works on whole-section vectors of
    // HalfCopyLanes() half lanes: every padded slot, rounded up to whole 256 B compares.
    __aicore__ inline uint32_t HalfCopyLanes() const { return avsg::RoundUp(ctx_.t_.capPad, kHalfCopyLanes); }
    // Its start: slot_life's window written back (a drop or a freed padding slot) and left empty,
    // as the section moves in whole; the int16 lives land in the half copy's own lanes and widen
    // to half into wPair_ (exact for every value a plan writes; any other int16 rounds
    // monotonically, so whatever the passes clamp stays clamped). Returns the widened lives;
    // the half copy's lanes are the pass's scratch until it writes its result there. The pass
    // touches no UB by scalar.
    __aicore__ inline LocalTensor<half> HalfCopyLoad() {
        Win& sl = ctx_.win_[avsg::SEC_SL];
        freeSlots_ = 0;
        ctx_.Flush(sl);
        sl.cur = -1;
        const LocalTensor<half> lives = ctx_.wPair_.ReinterpretCast<half>();
        const LocalTensor<int16_t> raw = ctx_.sHalf_.template ReinterpretCast<int16_t>();
        Sync<HardEvent::V_MTE2>();                // the step's vector reads of the wide vectors
        Sync<HardEvent::S_MTE2>();                // and its scalar reads / writes
        DataCopy(raw, sl.gm16, ctx_.t_.capPad);
        Sync<HardEvent::MTE2_V>();
        Cast(lives, raw, RoundMode::CAST_NONE, HalfCopyLanes());   // lanes past capPad: garbage, overwritten
        PipeBarrier<PIPE_V>();
        return lives;
    }
    // The half copy's lanes past the padded slots (read by the searches' whole-256 B compares)
    // set to `tail`, after the pass's last write of the copy.
    __aicore__ inline void HalfCopyTail(half tail) {
        const uint32_t padded = HalfCopyLanes();
        if (padded == ctx_.t_.capPad) return;
        PipeBarrier<PIPE_V>();
        Duplicate(ctx_.sHalf_[ctx_.t_.capPad], tail, padded - ctx_.t_.capPad);
    }
    // Mask i < kLruThresholds (bits of HalfCopyLanes() lanes) of a pass over the half copy, in
    // wSlot_ (idle then): the copy is at most 16 nc lanes (HalfCopyFits), so a mask is at most
    // 2 nc bytes and eight of them fill wSlot_'s 4 nc words.
    __aicore__ inline LocalTensor<uint8_t> HalfMask(uint32_t i) {
        const uint32_t bytes = avsg::RoundUp(HalfCopyLanes() / 8, 32u);
        ascendc_assert(i < kLruThresholds && (i + 1) * bytes <= 16 * ctx_.t_.nc);
        return ctx_.wSlot_.ReinterpretCast<uint8_t>()[i * bytes];
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
    static constexpr uint32_t kHalfCopyLanes = avsg::kPlanHalfCopyLanes;
    __aicore__ inline bool HalfCopyFits() const { return avsg::HalfCopyFits(ctx_.t_); }
    // lru's sets of slots (lruFreeWins_, the counts' window sets): slot_life's windows, or where
    // the half copy fits SelectLru's chunks of it (Wide() slots), whose victims it takes one
    // compaction each: a chunk with no candidate is skipped (slot_life's window may be short:
    // the host gives its UB to the resident slots first)
    __aicore__ inline uint32_t LruSetLen() const {
        return HalfCopyFits() ? probe_.Wide() : ctx_.win_[avsg::SEC_SL].wlen;
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
