// plan_block_insert.h: the insert rounds (reference._insert). Freeness of every miss's 4
// buckets by all-probe gathers, the rounds on the scalar unit (lowest j claims a free bucket),
// the winners written window by window; what stays pending goes to the stash afterwards.
// UB: vWant_/vMS_ (misses and their slots), vFirst_/vStride_/vB_ (hash), mKey_ (free, then
// winner bits), claimBits_, pendBits_, the bucket_key / bucket_slot / slot_pos windows; GM: the
// workspace's free / winner bits when there are several miss chunks.
#pragma once
#include "plan_block_victims.h"

namespace avsg_kernel {

class PlanBlockInsert : public PlanBlockVictims {
protected:
    // Insert: 4 rounds; in round i every pending miss proposes its bucket_i, and a free bucket
    // (never used or stale) goes to the lowest proposing j.
    //  A. Freeness of all 4 buckets of every miss, with all-probe gathers (each window loaded at
    //     most once per miss chunk). A bucket's freeness changes during the rounds only when a
    //     miss wins it (slot_pos is not written during the insert, and a winner's entry is valid:
    //     its slot holds its position), so "free now" = "free before round 0 and not claimed in
    //     any round so far": claimBits_ is cleared once, not per round.
    //  B. The rounds on the scalar unit, in (round, j) order: claims, winner bits per probe.
    //  C. The winners are written window by window (no window ping-pong between claims).
    __aicore__ inline void Insert(uint32_t r, uint32_t m) {
        const uint32_t nc = t_.nc, n = Wide();
        for (uint32_t w = 0; w < t_.pendWords; ++w) {
            const uint32_t lo = w * 32;
            uint32_t word = 0;
            if (lo + 32 <= m) word = 0xFFFFFFFFu;
            else if (lo < m) word = (1u << (m - lo)) - 1u;
            pendBits_.SetValue(w, word);
        }
        if (m == 0) return;
        Win& bk = win_[avsg::SEC_BK];
        Win& bs = win_[avsg::SEC_BS];
        Win& sp = win_[avsg::SEC_SP];
        const uint32_t chunks = (m + nc - 1) / nc;
        const uint32_t freeWords = n / 32;
        const LocalTensor<int32_t> freeInts = mKey_.ReinterpretCast<int32_t>();
        // A. free bits (mKey_, W bits per miss chunk; kept in the workspace when there are several).
        // Last chunk first: the victims' step may have left it in vWant_ / vMS_.
        for (uint32_t c = chunks; c-- > 0;) {
            LoadMisses(r, c * nc, m);
            Sync<HardEvent::S_V>();               // the victims' scalar writes of the windows
            Hash(vWant_, nc);
            Buckets();
            SplitIdx(bk, wIdx_);
            GatherVals(bk, wKey_, -1, static_cast<int32_t>(avsg::kMaxPosition));
            Buckets();                            // bucket_slot has windows of its own
            SplitIdx(bs, wIdx_);
            GatherVals(bs, wSlot_, 0, SlotMax());
            Adds(wIdx_, wSlot_, 0, n);
            CompareScalar(mKey_, wKey_, -1, CMPMODE::EQ, n);     // never used
            PipeBarrier<PIPE_V>();
            SplitIdx(sp, wIdx_);
            MatchBits(sp, wKey_, true, mOwn_);                   // valid: slot_pos[slot] == key
            Not(U16(mOwn_), U16(mOwn_), n / 16);
            PipeBarrier<PIPE_V>();
            Or(U16(mKey_), U16(mKey_), U16(mOwn_), n / 16);      // free = never used | stale
            if (chunks > 1) {
                Sync<HardEvent::V_MTE3>();
                StoreInts(wsGm_[t_.wsFreeOff + c * freeWords], freeInts, freeWords);
                Sync<HardEvent::MTE3_V>();
            }
        }
        // B. rounds (vFirst_/vStride_/vWant_/vMS_/mKey_ still hold miss chunk 0). The free
        // bits of (round i, chunk c) are spent by that pass, so it overwrites them with its winners:
        // mKey_ (and, with several chunks, the workspace copy) ends up as per-probe winner bits.
        Duplicate(claimBits_.ReinterpretCast<uint16_t>(), static_cast<uint16_t>(0), t_.buckets / 16);
        Sync<HardEvent::V_S>();
        const LocalTensor<uint32_t> bits = freeInts.ReinterpretCast<uint32_t>();
        int32_t loaded = 0;
        for (uint32_t i = 0; i < avsg::kPlanProbes; ++i) {
            for (uint32_t c = 0; c < chunks; ++c) {
                const uint32_t j0 = c * nc;
                const uint32_t cnt = MinU(nc, m - j0);
                if (loaded != static_cast<int32_t>(c)) {
                    LoadInsertChunk(r, c, m);
                    loaded = static_cast<int32_t>(c);
                }
                Sync<HardEvent::S_V>();           // the previous pass's scalar reads of vB_
                Probe(static_cast<int32_t>(i), nc);
                Sync<HardEvent::V_S>();
                // 32 misses per step: candidates = pending & bucket free, lowest j first (j0 is a
                // multiple of 32; pending bits past m are 0)
                for (uint32_t w = 0; w < (cnt + 31) / 32; ++w) {
                    const uint32_t pw = (j0 >> 5) + w;
                    const uint32_t fw = i * nc / 32 + w;
                    uint32_t pend = pendBits_.GetValue(pw);
                    uint32_t cand = pend == 0 ? 0u : pend & bits.GetValue(fw);
                    uint32_t won = 0;
                    for (; cand != 0; cand &= cand - 1u) {
                        const uint32_t bit = LowestBit(cand);
                        const uint32_t b = static_cast<uint32_t>(vB_.GetValue(w * 32 + bit));
                        if (WordBit(claimBits_, b)) continue;
                        SetWordBit(claimBits_, b);
                        won |= 1u << bit;
                    }
                    bits.SetValue(fw, won);
                    if (won != 0) pendBits_.SetValue(pw, pend & ~won);
                }
                if (chunks > 1) {                 // winners of (i, c) back over its free bits
                    Sync<HardEvent::S_MTE3>();
                    StoreInts(wsGm_[t_.wsFreeOff + c * freeWords + i * nc / 32], freeInts[i * nc / 32], nc / 32);
                    Sync<HardEvent::MTE3_S>();
                }
            }
        }
        // C. write the winners, window by window: for each miss chunk, recompute its buckets and,
        // per window and probe, compact the winners (offset in the window, key, slot) by GatherMask.
        // A few winners' keys go straight to GM instead, one 4-byte DMA each: a paged
        // bucket_key window costs a load and a write-back (about 1,100 cycles of MTE at 8 KB),
        // an entry one DMA issue (about 90), so below kKeyEntriesPerWindow winners per window
        // the entries are cheaper, and the bound keeps the worst case (a cold buffer's T*K
        // misses) on the windows.
        const bool keyEntries = bk.nwin > 1 && m <= kKeyEntriesPerWindow * bk.nwin;
        if (keyEntries) {   // no window copy may outlive the entries (phase A left it clean)
            WinFlush<true>(bk);
            bk.cur = -1;
        }
        for (uint32_t c = 0; c < chunks; ++c) {
            const uint32_t cnt = MinU(nc, m - c * nc);
            if (loaded != static_cast<int32_t>(c)) {
                LoadInsertChunk(r, c, m);
                loaded = static_cast<int32_t>(c);
            }
            Sync<HardEvent::S_V>();               // scalar reads / writes of vB_ and the bits
            Buckets();
            if (keyEntries) {
                WriteKeyEntries(cnt);             // their positions to bucket_key, entry by entry
            } else {
                SplitIdx(bk, wIdx_);
                WriteWinners(bk, vWant_, cnt);    // their positions to bucket_key
            }
            Sync<HardEvent::S_V>();               // WriteWinners' scalar reads of wIdx_'s lists
            Buckets();
            SplitIdx(bs, wIdx_);
            WriteWinners(bs, vMS_, cnt);          // their slots to bucket_slot
        }
    }
    // Misses, hash and free/winner bits of miss chunk c (insert with several miss chunks).
    __aicore__ inline void LoadInsertChunk(uint32_t r, uint32_t c, uint32_t m) {
        const uint32_t freeWords = Wide() / 32;
        LoadMisses(r, c * t_.nc, m);
        Sync<HardEvent::S_MTE2>();
        Sync<HardEvent::V_MTE2>();
        Sync<HardEvent::MTE3_MTE2>();
        LoadInts(mKey_.ReinterpretCast<int32_t>(), wsGm_[t_.wsFreeOff + c * freeWords], freeWords, 0);
        Sync<HardEvent::MTE2_S>();
        Sync<HardEvent::MTE2_V>();
        Hash(vWant_, t_.nc);
    }
    static constexpr uint32_t kKeyEntriesPerWindow = 12;
    // Probe i's winners among the first cnt misses (winner bits of probe i in bits) compacted
    // into wSlot_: their wIdx_ lanes at [0, got), their values at [nc, nc + got). Returns got.
    __aicore__ inline uint32_t CompactWinners(const LocalTensor<uint8_t>& bits, uint32_t i,
                                              const LocalTensor<int32_t>& values, uint32_t cnt) {
        const uint32_t nc = t_.nc;
        const LocalTensor<uint32_t> pat = U32(bits[i * nc / 8]);
        uint64_t got = 0, got2 = 0;
        Sync<HardEvent::S_V>();                   // scalar reads of the previous lists
        PipeBarrier<PIPE_V>();                    // and the previous GatherMasks' writes
        GatherMask(wSlot_, wIdx_[i * nc], pat, true, cnt, GatherMaskParams(1, 1, 8, 0), got);
        if (got == 0) return 0;
        GatherMask(wSlot_[nc], values, pat, true, cnt, GatherMaskParams(1, 1, 8, 0), got2);
        Sync<HardEvent::V_S>();
        return static_cast<uint32_t>(got);
    }
    // bucket_key[b] = p for this chunk's winners (mKey_: per-probe winner bits; wIdx_: their
    // buckets), one exact 4-byte DMA per entry from a 32 B-aligned staging slot in wTmp_ (idle
    // here), up to 256 entries per batch.
    __aicore__ inline void WriteKeyEntries(uint32_t cnt) {
        const uint32_t nc = t_.nc;
        const GlobalTensor<int32_t>& gm = win_[avsg::SEC_BK].gm;
        const LocalTensor<int32_t> cBucket = wSlot_, cKey = wSlot_[nc];   // CompactWinners' lists
        const uint32_t slots = Wide() / 8;                                  // staging slots in wTmp_
        uint32_t staged = 0;
        for (uint32_t i = 0; i < avsg::kPlanProbes; ++i) {
            const uint32_t got = CompactWinners(mKey_, i, vWant_, cnt);
            for (uint32_t q0 = 0; q0 < got; q0 += slots) {
                const uint32_t n = MinU(slots, got - q0);
                if (staged) Sync<HardEvent::MTE3_S>();   // the previous batch's DMAs read wTmp_
                for (uint32_t q = 0; q < n; ++q) wTmp_.SetValue(q * 8, cKey.GetValue(q0 + q));
                Sync<HardEvent::S_MTE3>();
                for (uint32_t q = 0; q < n; ++q)
                    StoreInts(gm[static_cast<uint32_t>(cBucket.GetValue(q0 + q))], wTmp_[q * 8], 1);
                staged = n;
            }
        }
        Sync<HardEvent::MTE3_S>();
        Sync<HardEvent::MTE3_V>();
        PipeBarrier<PIPE_V>();   // the GatherMasks read wIdx_, which the caller rewrites next
    }
    // One bucket section's entries of this chunk's winners (mKey_: per-probe winner bits; wIdx_:
    // the probe buckets as in-window byte offsets of w, wWin_: their windows): values[j] for the
    // winner j, resident window first.
    __aicore__ inline void WriteWinners(Win& w, const LocalTensor<int32_t>& values, uint32_t cnt) {
        const uint32_t nc = t_.nc, n = Wide();
        const LocalTensor<int32_t> cOff = wSlot_, cVal = wSlot_[nc];   // CompactWinners' lists
        const int32_t first = FirstWin(w);
        for (uint32_t k = 0; k < w.nwin; ++k) {
            const int32_t id = static_cast<int32_t>((static_cast<uint32_t>(first) + k) % w.nwin);
            LocalTensor<uint8_t> sel = mKey_;
            if (w.nwin > 1) {
                CompareScalar(mWin_, wWin_, id, CMPMODE::EQ, n);
                PipeBarrier<PIPE_V>();
                And(U16(mTmp_), U16(mKey_), U16(mWin_), n / 16);
                PipeBarrier<PIPE_V>();
                sel = mTmp_;
            }
            for (uint32_t i = 0; i < avsg::kPlanProbes; ++i) {
                const uint32_t got = CompactWinners(sel, i, values, cnt);
                if (got == 0) continue;
                Ensure(w, id);
                for (uint32_t q = 0; q < got; ++q)
                    w.buf.SetValue(static_cast<uint32_t>(cOff.GetValue(q)) >> 2, cVal.GetValue(q));
                w.dirty = true;
            }
        }
        PipeBarrier<PIPE_V>();   // the GatherMasks read wIdx_, which the caller rewrites next
    }
};

}  // namespace avsg_kernel
