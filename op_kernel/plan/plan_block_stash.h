// plan_block_stash.h: the stash (positions no probe bucket could take). Compaction drops the
// entries whose slot moved on (CompactStash, vector liveness test); the hash plan sorts the live
// ones once per row (BuildStashRuns) so MergeMisses looks each distinct miss up by a merge
// (StashSlot); after the insert the still-pending misses are appended (StashPending).
// UB: the stash_key / stash_slot windows, vKey_/vSlot_/vFoundI_/vFirst_ as scratch, pendBits_
// (read); GM: the workspace's resident/stash run space.
#pragma once
#include "plan_block_merge.h"

namespace avsg_kernel {

class PlanBlockStash {
public:
    __aicore__ inline explicit PlanBlockStash(PlanContext& ctx, PlanBlockProbe& probe, PlanBlockMerge& merge)
        : ctx_(ctx), probe_(probe), merge_(merge) {}
    // Hash plan: the stash, compacted (every entry live), sorted in runs of nc entries by key with
    // payload (k << 16) | slot, into the workspace; MergeMisses merges it with the sorted misses.
    // Keys are clamped to [-1, 2^24] (exact in float; no selection reaches 2^24) and slots to
    // [0, S-1], as the lookup clamps them; k < S <= 2^15 keeps the payload positive.
    __aicore__ inline void BuildStashRuns() {
        const uint32_t nc = ctx_.t_.nc;
        const uint32_t runs = (stashCount_ + nc - 1) / nc;
        Sync<HardEvent::S_V>();                   // CompactStash's scalar writes of the windows
        for (uint32_t q = 0; q < runs; ++q) {
            const uint32_t base = q * nc, n = MinU(nc, stashCount_ - base);
            // a stash of one chunk is still in CompactStash's lists of live entries
            LocalTensor<int32_t> keys = ctx_.vFoundI_, slots = ctx_.vFirst_;
            if (!liveListsHeld_) {
                ctx_.CopySection(ctx_.win_[avsg::SEC_SK], base, n, ctx_.vKey_);
                ctx_.CopySection(ctx_.win_[avsg::SEC_SS], base, n, ctx_.vSlot_);
                keys = ctx_.vKey_;
                slots = ctx_.vSlot_;
            }
            PipeBarrier<PIPE_V>();                // the lists' writers; the previous run's sort
            Maxs(ctx_.vKey_, keys, -1, n);
            Maxs(ctx_.vSlot_, slots, 0, n);
            Adds(ctx_.vT1_, ctx_.vLane_, static_cast<int32_t>(base), n);   // stash index k
            PipeBarrier<PIPE_V>();
            Mins(ctx_.vKey_, ctx_.vKey_, static_cast<int32_t>(avsg::kMaxPosition), n);
            Mins(ctx_.vSlot_, ctx_.vSlot_, ctx_.SlotMax(), n);
            ShiftLeft(ctx_.vT1_, ctx_.vT1_, 16, n);
            PipeBarrier<PIPE_V>();
            Add(ctx_.vSlot_, ctx_.vSlot_, ctx_.vT1_, n);
            PipeBarrier<PIPE_V>();
            LocalTensor<uint32_t> pay = ctx_.vSlot_.ReinterpretCast<uint32_t>();
            merge_.SortAscending(ctx_.vKey_, n, &pay);
            Sync<HardEvent::V_MTE3>();
            StoreInts(ctx_.wsGm_[ctx_.t_.wsResKeyOff + q * nc], ctx_.sOutV_.template ReinterpretCast<int32_t>(), n);
            StoreInts(ctx_.wsGm_[ctx_.t_.wsResSlotOff + q * nc], ctx_.sOutI_.template ReinterpretCast<int32_t>(), n);
            Sync<HardEvent::MTE3_V>();
            stashRuns_.len[q] = n;
        }
        liveListsHeld_ = false;
        merge_.Configure(stashRuns_, runs, ctx_.t_.wsResKeyOff, ctx_.t_.wsResSlotOff, false, 1, 2, 1);
    }
    // Stash lookup of v (ascending over calls): the slot of the first stash entry (lowest k, the
    // payload's high half) whose key is v, or -1.
    __aicore__ inline int32_t StashSlot(int32_t v) {
        PlanMerger& g = stashRuns_;
        while (g.has && g.key < v) merge_.Advance(g);
        int32_t first = -1;
        for (; g.has && g.key == v; merge_.Advance(g)) {
            const int32_t val = merge_.Val(g);
            if (first < 0 || val < first) first = val;
        }
        return first < 0 ? -1 : (first & 0xFFFF);
    }
    // Drops stale stash entries, order kept. Liveness (slot_pos[clamped slot] == key) is tested
    // nc entries at a time with the all-probe gather (the slots in the first nc lanes), and the
    // live entries are compacted by GatherMask; only their write-back is scalar. A scalar test per
    // entry would alternate between the window being read (k) and the one written (c < k) at
    // every entry once one entry was dropped, a window reload each time with small stash windows.
    __aicore__ inline void CompactStash() {
        const uint32_t nc = ctx_.t_.nc, W = probe_.Wide();
        Win& sk = ctx_.win_[avsg::SEC_SK];
        Win& ss = ctx_.win_[avsg::SEC_SS];
        const LocalTensor<int32_t> keys = ctx_.vKey_, slots = ctx_.vSlot_;
        const LocalTensor<int32_t> liveKeys = ctx_.vFoundI_, liveSlots = ctx_.vFirst_;
        uint32_t c = 0;
        // one chunk: the live lists below end up holding the whole compacted stash, in order
        liveListsHeld_ = stashCount_ <= nc;
        for (uint32_t base = 0; base < stashCount_; base += nc) {
            const uint32_t n = MinU(nc, stashCount_ - base);
            Sync<HardEvent::S_V>();               // scalar writes of the windows / reads of the lists
            PipeBarrier<PIPE_V>();
            ctx_.CopySection(sk, base, n, keys);
            ctx_.CopySection(ss, base, n, slots);
            LiveBits(keys, slots, n, W);          // mOwn_'s first n bits: live
            uint64_t cnt = 0, cnt2 = 0;
            GatherMask(liveKeys, keys, ctx_.U32(ctx_.mOwn_), true, n, GatherMaskParams(1, 1, 8, 0), cnt);
            GatherMask(liveSlots, slots, ctx_.U32(ctx_.mOwn_), true, n, GatherMaskParams(1, 1, 8, 0), cnt2);
            Sync<HardEvent::V_S>();
            if (c == base && static_cast<uint32_t>(cnt) == n) {   // nothing dropped so far
                c += n;
                continue;
            }
            if (n == stashCount_ && n <= sk.wlen && n <= ss.wlen) {
                // the whole stash in this one chunk and in window 0 of both sections (resident
                // since CopySection): it goes back by vector, not one scalar store per entry
                CompactedBack(static_cast<uint32_t>(cnt), n);
                stashCount_ = static_cast<uint32_t>(cnt);
                return;
            }
            for (uint32_t q = 0; q < static_cast<uint32_t>(cnt); ++q, ++c) {
                ctx_.Put(sk, c, liveKeys.GetValue(q));
                ctx_.Put(ss, c, liveSlots.GetValue(q));
            }
        }
        for (uint32_t k = c; k < stashCount_; ++k) {
            ctx_.Put(sk, k, -1);
            ctx_.Put(ss, k, 0);
        }
        stashCount_ = c;
    }
    // mOwn_ bits [0, n): slot_pos[clamp(slots[q], 0, S-1)] == keys[q]. With slot_pos whole in
    // UB (every S <= 8192) on the n entries alone: their offsets, one gather, one compare (the
    // lanes up to the compare's whole repeats compare whatever wTmp_ holds; GatherMask reads n
    // bits). Otherwise with the all-probe gather over its windows (the slots in the first nc
    // lanes of W, the rest offset 0).
    __aicore__ inline void LiveBits(const LocalTensor<int32_t>& keys, const LocalTensor<int32_t>& slots, uint32_t n,
                                    uint32_t W) {
        Win& sp = ctx_.win_[avsg::SEC_SP];
        if (sp.nwin == 1) {
            PipeBarrier<PIPE_V>();                // the copies of keys and slots
            Maxs(ctx_.wIdx_, slots, 0, n);
            PipeBarrier<PIPE_V>();
            Mins(ctx_.wIdx_, ctx_.wIdx_, ctx_.SlotMax(), n);
            PipeBarrier<PIPE_V>();
            ShiftLeft(ctx_.wIdx_, ctx_.wIdx_, 2, n);   // byte offsets of the int32 entries
            ctx_.Ensure(sp, 0);
            PipeBarrier<PIPE_V>();
            Gather(ctx_.wTmp_, sp.buf, ctx_.wIdx_.ReinterpretCast<uint32_t>(), 0u, n);
            PipeBarrier<PIPE_V>();
            avsg::CompareAll(ctx_.mOwn_, ctx_.wTmp_, keys, CMPMODE::EQ, avsg::RoundUp(n, 64u));
            PipeBarrier<PIPE_V>();
            return;
        }
        Duplicate(ctx_.wIdx_, 0, W);
        PipeBarrier<PIPE_V>();
        Adds(ctx_.wIdx_, slots, 0, n);
        PipeBarrier<PIPE_V>();
        ctx_.ClampInts(ctx_.wIdx_, 0, ctx_.SlotMax(), n);
        probe_.SplitIdx(sp, ctx_.wIdx_);
        probe_.MatchBits(sp, keys, false, ctx_.mOwn_);
    }
    // CompactStash's write-back where the stash [0, n) is one chunk in window 0 of stash_key and
    // stash_slot: entries [0, live) = the live ones (vFoundI_ / vFirst_, in order), [live, n) =
    // (-1, 0), entries past n untouched, as the scalar stores would leave them; the blocks marked
    // for write-back. Ends with the windows readable by the scalar unit and the vector pipe.
    __aicore__ inline void CompactedBack(uint32_t live, uint32_t n) {
        Win& sk = ctx_.win_[avsg::SEC_SK];
        Win& ss = ctx_.win_[avsg::SEC_SS];
        PipeBarrier<PIPE_V>();                    // CopySection read the windows; GatherMask wrote the lists
        Duplicate(sk.buf, -1, n);
        Duplicate(ss.buf, 0, n);
        PipeBarrier<PIPE_V>();
        if (live) {
            Adds(sk.buf, ctx_.vFoundI_, 0, live);
            Adds(ss.buf, ctx_.vFirst_, 0, live);
        }
        for (uint32_t idx = 0; idx < n; idx += sk.blen) WinMark(sk, idx);
        for (uint32_t idx = 0; idx < n; idx += ss.blen) WinMark(ss, idx);
        PipeBarrier<PIPE_V>();
        Sync<HardEvent::V_S>();
    }
    __aicore__ inline void AppendPending(uint32_t r, uint32_t m) {
        for (uint32_t j0 = 0; j0 < m; j0 += ctx_.t_.nc) {
            const uint32_t n = ctx_.LoadMisses(r, j0, m);
            for (uint32_t q = 0; q < n; ++q) {
                if (!ctx_.WordBit(ctx_.pendBits_, j0 + q)) continue;
                if (stashCount_ >= ctx_.t_.capacity) return;   // full: only a corrupted state gets here
                ctx_.Put(ctx_.win_[avsg::SEC_SK], stashCount_, ctx_.vWant_.GetValue(q));
                ctx_.Put(ctx_.win_[avsg::SEC_SS], stashCount_, ctx_.vMS_.GetValue(q));
                ++stashCount_;
            }
        }
    }
    // After the insert: misses no probe bucket took go to the stash, stale entries out first.
    __aicore__ inline void StashPending(uint32_t r, uint32_t m) {
        bool pending = false;
        for (uint32_t w = 0; w < ctx_.t_.pendWords && !pending; ++w) pending = ctx_.pendBits_.GetValue(w) != 0;
        if (stashCount_ > 0 || pending) {
            CompactStash();
            AppendPending(r, m);
        }
    }
    // stash_count from the header, clamped to [0, S] whatever the state holds.
    __aicore__ inline void LoadStashCount() {
        const int32_t count = ctx_.countUb_.GetValue(0);
        stashCount_ = count < 0 ? 0u : MinU(static_cast<uint32_t>(count), ctx_.t_.capacity);
    }

    PlanMerger stashRuns_;                   // the sorted stash (hash plan), runs 0 when empty
    uint32_t stashCount_ = 0;
    // CompactStash's last run left the stash [0, stashCount_) in vFoundI_ (keys) and vFirst_
    // (slots): BuildStashRuns, called right after it, reads them there
    bool liveListsHeld_ = false;

    // the context and the blocks this one calls
    PlanContext& ctx_;
    PlanBlockProbe& probe_;
    PlanBlockMerge& merge_;
};

}  // namespace avsg_kernel
