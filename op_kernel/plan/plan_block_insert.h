// plan_block_insert.h: the insert rounds (reference._insert). Freeness of every miss's 4
// buckets by all-probe gathers (the position each bucket's slot holds, hashed), the rounds on
// the scalar unit (lowest j claims a free bucket), the winners written window by window; what
// stays pending goes to the stash afterwards.
// UB: vWant_/vMS_ (misses and their slots), vFirst_/vStride_/vB_ (hash), wKey_ (one miss
// chunk's buckets, kept through the rounds), mKey_ (free, then winner bits; one chunk's winners
// in mOwn_), mTmp_ (the drop of indexed misses), claimBits_,
// pendBits_, the bucket_slot / slot_pos windows, the other wide vectors as scratch; GM: the
// workspace's free / winner bits when there are several miss chunks.
#pragma once
#include "plan_block_victims.h"

namespace avsg_kernel {

class PlanBlockInsert {
public:
    __aicore__ inline explicit PlanBlockInsert(PlanContext& ctx, PlanBlockProbe& probe) : ctx_(ctx), probe_(probe) {}
    // Insert: 4 rounds; in round i every pending miss proposes its bucket_i, and a free bucket
    // goes to the lowest proposing j.
    //  A. Freeness of all 4 buckets of every miss, with all-probe gathers (each window loaded at
    //     most once per miss chunk). A bucket's freeness changes during the rounds only when a
    //     miss wins it (slot_pos is not written during the insert, bucket_slot only for a winner,
    //     whose slot holds a position that probes the bucket), so "free now" = "free before
    //     round 0 and not claimed in any round so far": claimBits_ is cleared once, not per round.
    //  B. The rounds on the scalar unit, in (round, j) order: claims, winner bits per probe.
    //  C. The winners' slots are written window by window (no window ping-pong between claims).
    __aicore__ inline void Insert(uint32_t r, uint32_t m) {
        const uint32_t nc = ctx_.t_.nc;
        for (uint32_t w = 0; w < ctx_.t_.pendWords; ++w) {
            const uint32_t lo = w * 32;
            uint32_t word = 0;
            if (lo + 32 <= m) word = 0xFFFFFFFFu;
            else if (lo < m) word = (1u << (m - lo)) - 1u;
            ctx_.pendBits_.SetValue(w, word);
        }
        if (m == 0) return;
        Win& bs = ctx_.win_[avsg::SEC_BS];
        Win& sp = ctx_.win_[avsg::SEC_SP];
        const uint32_t chunks = (m + nc - 1) / nc;
        // One miss chunk (the usual few dozen misses): probe slices only as wide as the misses,
        // rounded up to whole repeats (to 256 lanes where bucket_slot has windows: its window
        // masks are sliced there). Several: nc, the layout of the workspace copies. Restored to
        // nc at the end, for every other block.
        const uint32_t grain = bs.nwin == 1 ? avsg::kPlanInsertStride : avsg::kPlanInsertWindowedStride;
        ctx_.probeStride_ = chunks == 1 ? MinU(nc, avsg::RoundUp(m, grain)) : nc;
        const uint32_t ps = ctx_.probeStride_, n = probe_.ProbeLanes();
        const uint32_t freeWords = n / 32;
        const LocalTensor<int32_t> freeInts = ctx_.mKey_.ReinterpretCast<int32_t>();
        // A. free bits (mKey_, W bits per miss chunk; kept in the workspace when there are several).
        // Last chunk first: the victims' step may have left it in vWant_ / vMS_.
        for (uint32_t c = chunks; c-- > 0;) {
            ctx_.LoadMisses(r, c * nc, m);
            Sync<HardEvent::S_V>();               // the victims' scalar writes of the windows
            probe_.Hash(ctx_.vWant_, ps);
            probe_.Buckets();
            Adds(ctx_.wKey_, ctx_.wIdx_, 0, n);             // the buckets, kept for FreeBuckets
            probe_.SplitBucketIdx(bs, ctx_.wIdx_);
            probe_.GatherBuckets(bs, ctx_.wSlot_, -1, ctx_.SlotMax());   // the slot each bucket names, -1: never used
            avsg::CompareScalarAll(ctx_.mKey_, ctx_.wSlot_, -1, CMPMODE::EQ, n);   // FreeBuckets ORs it in
            Maxs(ctx_.wIdx_, ctx_.wSlot_, 0, n);
            PipeBarrier<PIPE_V>();
            probe_.SplitIdx(sp, ctx_.wIdx_);
            probe_.GatherVals(sp, ctx_.wSlot_, -1, static_cast<int32_t>(avsg::kMaxPosition));   // what it holds
            DropIndexed(c);
            FreeBuckets();
            if (chunks > 1) {
                Sync<HardEvent::V_MTE3>();
                StoreInts(ctx_.wsGm_[ctx_.t_.wsFreeOff + c * freeWords], freeInts, freeWords);
                Sync<HardEvent::MTE3_V>();
            }
        }
        // B. rounds (vFirst_/vStride_/vWant_/vMS_/mKey_ still hold miss chunk 0). The free
        // bits of (round i, chunk c) are spent by that pass, so it overwrites them with its winners:
        // mKey_ (and, with several chunks, the workspace copy) ends up as per-probe winner bits.
        // One miss chunk: its buckets, every probe's, are still in wKey_ (A kept them for
        // FreeBuckets, which only reads them), so the rounds read them there and C copies them
        // back: no per-probe pass (and its S_V / V_S pair) and no second Buckets.
        // The winners of one kept chunk go to mOwn_ (idle from here), probe i's at word i * ws:
        // each probe's bits start 32 B aligned for its compaction (WriteWinners) whatever ps is.
        // Several chunks: over the free bits they spend, whose slices are aligned (ps = nc).
        const bool kept = chunks == 1;
        const uint32_t ws = WinnerWords();
        Duplicate(ctx_.claimBits_.ReinterpretCast<uint16_t>(), static_cast<uint16_t>(0), ctx_.t_.buckets / 16);
        Sync<HardEvent::V_S>();
        const LocalTensor<uint32_t> bits = freeInts.ReinterpretCast<uint32_t>();
        const LocalTensor<uint32_t> winners = kept ? ctx_.U32(ctx_.mOwn_) : bits;
        int32_t loaded = 0;
        for (uint32_t i = 0; i < avsg::kPlanProbes; ++i) {
            const LocalTensor<int32_t> bucket = kept ? ctx_.wKey_[i * ps] : ctx_.vB_;
            for (uint32_t c = 0; c < chunks; ++c) {
                const uint32_t j0 = c * nc;
                const uint32_t cnt = MinU(nc, m - j0);
                if (!kept) {
                    if (loaded != static_cast<int32_t>(c)) {
                        LoadInsertChunk(r, c, m);
                        loaded = static_cast<int32_t>(c);
                    }
                    Sync<HardEvent::S_V>();       // the previous pass's scalar reads of vB_
                    probe_.Probe(static_cast<int32_t>(i), ps);
                    Sync<HardEvent::V_S>();
                }
                // 32 misses per step: candidates = pending & bucket free, lowest j first (j0 is a
                // multiple of 32; pending bits past m are 0)
                for (uint32_t w = 0; w < (cnt + 31) / 32; ++w) {
                    const uint32_t pw = (j0 >> 5) + w;
                    const uint32_t fw = i * ps / 32 + w;
                    uint32_t pend = ctx_.pendBits_.GetValue(pw);
                    uint32_t cand = pend == 0 ? 0u : pend & bits.GetValue(fw);
                    uint32_t won = 0;
                    for (; cand != 0; cand &= cand - 1u) {
                        const uint32_t bit = LowestBit(cand);
                        const uint32_t b = static_cast<uint32_t>(bucket.GetValue(w * 32 + bit));
                        if (ctx_.WordBit(ctx_.claimBits_, b)) continue;
                        ctx_.SetWordBit(ctx_.claimBits_, b);
                        won |= 1u << bit;
                    }
                    winners.SetValue(kept ? i * ws + w : fw, won);
                    if (won != 0) ctx_.pendBits_.SetValue(pw, pend & ~won);
                }
                if (chunks > 1) {                 // winners of (i, c) back over its free bits
                    Sync<HardEvent::S_MTE3>();
                    StoreInts(ctx_.wsGm_[ctx_.t_.wsFreeOff + c * freeWords + i * ps / 32], freeInts[i * ps / 32],
                              ps / 32);
                    Sync<HardEvent::MTE3_S>();
                }
            }
        }
        // C. write the winners' slots, window by window: for each miss chunk, recompute its
        // buckets (one chunk: copy them from wKey_) and, per window and probe, compact the winners (offset in the window, slot) by
        // GatherMask.
        for (uint32_t c = 0; c < chunks; ++c) {
            const uint32_t cnt = MinU(nc, m - c * nc);
            if (loaded != static_cast<int32_t>(c)) {
                LoadInsertChunk(r, c, m);
                loaded = static_cast<int32_t>(c);
            }
            Sync<HardEvent::S_V>();               // scalar reads / writes of vB_ and the bits
            if (kept) {
                Adds(ctx_.wIdx_, ctx_.wKey_, 0, probe_.ProbeLanes());
                PipeBarrier<PIPE_V>();
            } else {
                probe_.Buckets();
            }
            probe_.SplitBucketIdx(bs, ctx_.wIdx_);
            WriteWinners(bs, kept ? ctx_.mOwn_ : ctx_.mKey_, ctx_.vMS_, cnt);   // their slots to bucket_slot
        }
        ctx_.probeStride_ = nc;
    }
    // Words per probe of the winner bits: ps bits rounded up to 32 B (ps / 32 where ps is a
    // multiple of 256, as with windows or several chunks: then the layout of the free bits).
    __aicore__ inline uint32_t WinnerWords() const { return avsg::RoundUp(ctx_.probeStride_ / 32, 8u); }
    // A miss one of whose probe buckets names the slot that holds it (wSlot_: the position each
    // probe's slot holds; mKey_: the probes that name no slot) is indexed already: its pending
    // bit (chunk c) is cleared, so the rounds and the stash skip it. Each probe's compare goes to
    // its own 32 B aligned slice of mTmp_ (WinnerWords apart: ps may be 64 lanes, whose bits
    // would start 8 B apart); the probes are ORed and the pending bits cleared by the scalar unit,
    // ps / 32 words per probe.
    __aicore__ inline void DropIndexed(uint32_t c) {
        const uint32_t nc = ctx_.t_.nc, ps = ctx_.probeStride_, ws = WinnerWords();
        for (uint32_t i = 0; i < avsg::kPlanProbes; ++i)
            avsg::CompareAll(ctx_.mTmp_[i * ws * 4], ctx_.wSlot_[i * ps], ctx_.vWant_, CMPMODE::EQ, ps);
        Sync<HardEvent::V_S>();
        const LocalTensor<uint32_t> same = ctx_.U32(ctx_.mTmp_), unnamed = ctx_.U32(ctx_.mKey_);
        for (uint32_t w = 0; w < ps / 32; ++w) {
            uint32_t indexed = 0;
            for (uint32_t i = 0; i < avsg::kPlanProbes; ++i)
                indexed |= same.GetValue(i * ws + w) & ~unnamed.GetValue(i * ps / 32 + w);
            // pending bits past ps (past m) are 0 already
            if (indexed) ctx_.pendBits_.SetValue(c * nc / 32 + w, ctx_.pendBits_.GetValue(c * nc / 32 + w) & ~indexed);
        }
        Sync<HardEvent::S_V>();
    }
    // mKey_ = free (W lanes): a bucket (wKey_) that names no slot (mKey_ set on entry) is free,
    // and so is one whose slot's position (wSlot_, clamped to [-1, 2^24]; -1: a free slot) does
    // not probe it, i.e. unless bucket - first is
    // k * stride (mod H) for a probe k of that position (reference.occupied_buckets). The hash as
    // in Hash, on all W lanes at once. Scratch: wIdx_, wWin_, wTmp_, wSlot_, mOwn_/mTmp_/mWin_.
    __aicore__ inline void FreeBuckets() {
        const uint32_t n = probe_.ProbeLanes();
        const LocalTensor<int32_t> hMask = ctx_.wTmp_, lo = ctx_.wIdx_, hi = ctx_.wWin_, first = ctx_.wSlot_;
        const LocalTensor<int32_t> owner = ctx_.wSlot_, diff = ctx_.wWin_, stride = ctx_.wIdx_, multiple = ctx_.wSlot_;
        const int32_t hm = static_cast<int32_t>(ctx_.t_.buckets - 1);
        avsg::CompareScalarAll(ctx_.mOwn_, owner, -1, CMPMODE::EQ, n);   // a free slot indexes nothing
        Maxs(lo, owner, 0, n);
        Duplicate(hMask, hm, n);
        PipeBarrier<PIPE_V>();
        ShiftRight(hi, lo, static_cast<int32_t>(ctx_.t_.logBuckets), n);
        PipeBarrier<PIPE_V>();
        probe_.AndMask(lo, lo, hMask, n);                          // lo = p mod H
        probe_.AndMask(hi, hi, hMask, n);                          // hi = (p >> m) mod H
        PipeBarrier<PIPE_V>();
        Muls(first, lo, static_cast<int32_t>(ctx_.t_.hashA1), n);   // the owner is in mOwn_ now
        Muls(hMask, hi, static_cast<int32_t>(ctx_.t_.hashB1), n);   // hMask rebuilt below
        PipeBarrier<PIPE_V>();
        Add(first, first, hMask, n);
        Muls(lo, lo, static_cast<int32_t>(ctx_.t_.hashA2), n);
        Muls(hi, hi, static_cast<int32_t>(ctx_.t_.hashB2), n);
        PipeBarrier<PIPE_V>();
        Add(stride, lo, hi, n);
        Duplicate(hMask, hm, n);
        PipeBarrier<PIPE_V>();
        probe_.AndMask(first, first, hMask, n);
        probe_.AndMask(stride, stride, hMask, n);
        PipeBarrier<PIPE_V>();
        Sub(diff, ctx_.wKey_, first, n);
        ShiftRight(stride, stride, 1, n);                   // "| 1": clear bit 0, then add 1
        PipeBarrier<PIPE_V>();
        probe_.AndMask(diff, diff, hMask, n);                      // (bucket - first) mod H
        ShiftLeft(stride, stride, 1, n);
        PipeBarrier<PIPE_V>();
        Adds(stride, stride, 1, n);
        avsg::CompareScalarAll(ctx_.mTmp_, diff, 0, CMPMODE::EQ, n);      // probe 0
        PipeBarrier<PIPE_V>();
        Adds(multiple, stride, 0, n);
        for (uint32_t k = 1;; ++k) {                        // probe k: k * stride mod H
            PipeBarrier<PIPE_V>();
            avsg::CompareAll(ctx_.mWin_, diff, multiple, CMPMODE::EQ, n);
            PipeBarrier<PIPE_V>();
            Or(ctx_.U16(ctx_.mTmp_), ctx_.U16(ctx_.mTmp_), ctx_.U16(ctx_.mWin_), n / 16);
            if (k + 1 == avsg::kPlanProbes) break;
            Add(multiple, multiple, stride, n);
            PipeBarrier<PIPE_V>();
            probe_.AndMask(multiple, multiple, hMask, n);
        }
        PipeBarrier<PIPE_V>();
        Not(ctx_.U16(ctx_.mTmp_), ctx_.U16(ctx_.mTmp_), n / 16);
        Or(ctx_.U16(ctx_.mOwn_), ctx_.U16(ctx_.mOwn_), ctx_.U16(ctx_.mKey_), n / 16);
        PipeBarrier<PIPE_V>();
        // free = no probe matches | no owner
        Or(ctx_.U16(ctx_.mKey_), ctx_.U16(ctx_.mTmp_), ctx_.U16(ctx_.mOwn_), n / 16);
        PipeBarrier<PIPE_V>();
    }
    // Misses, hash and free/winner bits of miss chunk c (insert with several miss chunks).
    __aicore__ inline void LoadInsertChunk(uint32_t r, uint32_t c, uint32_t m) {
        const uint32_t freeWords = probe_.Wide() / 32;
        ctx_.LoadMisses(r, c * ctx_.t_.nc, m);
        Sync<HardEvent::S_MTE2>();
        Sync<HardEvent::V_MTE2>();
        Sync<HardEvent::MTE3_MTE2>();
        LoadInts(ctx_.mKey_.ReinterpretCast<int32_t>(), ctx_.wsGm_[ctx_.t_.wsFreeOff + c * freeWords], freeWords, 0);
        Sync<HardEvent::MTE2_S>();
        Sync<HardEvent::MTE2_V>();
        probe_.Hash(ctx_.vWant_, ctx_.t_.nc);
    }
    // Every probe's winners among the first cnt misses (winner bits of probe i in bits) compacted
    // at once: probe i's wIdx_ lanes to wSlot_[i*ps, i*ps + got[i]), their values to wTmp_[i*ps, ...)
    // (got[i] <= cnt <= ps, so the lists stay apart; wTmp_ is idle once SplitIdx has run). One
    // S_V / V_S pair for all probes, not one per probe.
    __aicore__ inline void CompactWinners(const LocalTensor<uint8_t>& bits, uint32_t ws, const LocalTensor<int32_t>& values,
                                          uint32_t cnt, uint32_t* got) {
        const uint32_t ps = ctx_.probeStride_;
        Sync<HardEvent::S_V>();                   // scalar reads of the previous lists
        PipeBarrier<PIPE_V>();                    // and the previous GatherMasks' writes
        bool any = false;
        for (uint32_t i = 0; i < avsg::kPlanProbes; ++i) {
            const LocalTensor<uint32_t> pat = ctx_.U32(bits[i * ws * 4]);
            uint64_t n = 0, n2 = 0;
            GatherMask(ctx_.wSlot_[i * ps], ctx_.wIdx_[i * ps], pat, true, cnt, GatherMaskParams(1, 1, 8, 0), n);
            if (n) GatherMask(ctx_.wTmp_[i * ps], values, pat, true, cnt, GatherMaskParams(1, 1, 8, 0), n2);
            got[i] = static_cast<uint32_t>(n);
            any = any || n != 0;
        }
        if (any) Sync<HardEvent::V_S>();
    }
    // bucket_slot's entries of this chunk's winners (won: per-probe winner bits, probe i's at
    // word i * WinnerWords(); wIdx_: the probe buckets as in-window byte offsets of w's int16
    // entries, wWin_: their windows): values[j] for the winner j, resident window first.
    __aicore__ inline void WriteWinners(Win& w, const LocalTensor<uint8_t>& won, const LocalTensor<int32_t>& values,
                                        uint32_t cnt) {
        const uint32_t ps = ctx_.probeStride_, n = probe_.ProbeLanes(), ws = WinnerWords();
        const int32_t first = probe_.FirstWin(w);
        // windows: the window masks cover the probe slices as laid out (ps a multiple of 256)
        ascendc_assert(w.nwin == 1 || ws == ps / 32);
        for (uint32_t k = 0; k < w.nwin; ++k) {
            const int32_t id = static_cast<int32_t>((static_cast<uint32_t>(first) + k) % w.nwin);
            LocalTensor<uint8_t> sel = won;
            if (w.nwin > 1) {
                avsg::CompareScalarAll(ctx_.mWin_, ctx_.wWin_, id, CMPMODE::EQ, n);
                PipeBarrier<PIPE_V>();
                And(ctx_.U16(ctx_.mTmp_), ctx_.U16(won), ctx_.U16(ctx_.mWin_), n / 16);
                PipeBarrier<PIPE_V>();
                sel = ctx_.mTmp_;
            }
            uint32_t got[avsg::kPlanProbes];
            CompactWinners(sel, ws, values, cnt, got);
            for (uint32_t i = 0; i < avsg::kPlanProbes; ++i) {
                if (got[i] == 0) continue;
                ctx_.Ensure(w, id);
                const LocalTensor<int16_t> entries = w.buf.template ReinterpretCast<int16_t>();
                for (uint32_t q = 0; q < got[i]; ++q) {
                    // the bucket's in-window byte offset (SplitBucketIdx) -> its int16 entry
                    const uint32_t at = static_cast<uint32_t>(ctx_.wSlot_.GetValue(i * ps + q)) >> 1;
                    entries.SetValue(at, static_cast<int16_t>(ctx_.wTmp_.GetValue(i * ps + q)));   // a slot < 2^15
                    WinMark(w, at >> 1);
                }
            }
        }
        PipeBarrier<PIPE_V>();   // the GatherMasks read wIdx_, which the caller rewrites next
    }

    // the context and the blocks this one calls
    PlanContext& ctx_;
    PlanBlockProbe& probe_;
};

}  // namespace avsg_kernel
