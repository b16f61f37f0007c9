// plan_block_stash.h: the stash (positions no probe bucket could take). Compaction drops the
// entries whose slot moved on (CompactStash, vector liveness test); the hash plan sorts the live
// ones once per row (BuildStashRuns) so MergeMisses looks each distinct miss up by a merge
// (StashSlot); after the insert the still-pending misses are appended (StashPending).
// UB: the stash_key / stash_slot windows, vKey_/vSlot_/vFoundI_/vFirst_ as scratch, pendBits_
// (read); GM: the workspace's resident/stash run space.
#pragma once
#include "plan_block_merge.h"

namespace avsg_kernel {

class PlanBlockStash : public PlanBlockMerge {
protected:
    // Hash plan: the stash, compacted (every entry live), sorted in runs of nc entries by key with
    // payload (k << 16) | slot, into the workspace; MergeMisses merges it with the sorted misses.
    // Keys are clamped to [-1, 2^24] (exact in float; no selection reaches 2^24) and slots to
    // [0, S-1], as the lookup clamps them; k < S <= 2^15 keeps the payload positive.
    __aicore__ inline void BuildStashRuns() {
        const uint32_t nc = t_.nc;
        const uint32_t runs = (stashCount_ + nc - 1) / nc;
        Sync<HardEvent::S_V>();                   // CompactStash's scalar writes of the windows
        for (uint32_t q = 0; q < runs; ++q) {
            const uint32_t base = q * nc, n = MinU(nc, stashCount_ - base);
            CopySection(win_[avsg::SEC_SK], base, n, vKey_);
            CopySection(win_[avsg::SEC_SS], base, n, vSlot_);
            Adds(vT1_, vLane_, static_cast<int32_t>(base), n);   // stash index k
            PipeBarrier<PIPE_V>();
            ClampInts(vKey_, -1, static_cast<int32_t>(avsg::kMaxPosition), n);
            ClampInts(vSlot_, 0, SlotMax(), n);
            ShiftLeft(vT1_, vT1_, 16, n);
            PipeBarrier<PIPE_V>();
            Add(vSlot_, vSlot_, vT1_, n);
            PipeBarrier<PIPE_V>();
            LocalTensor<uint32_t> pay = vSlot_.ReinterpretCast<uint32_t>();
            SortAscending(vKey_, n, &pay);
            Sync<HardEvent::V_MTE3>();
            StoreInts(wsGm_[t_.wsResKeyOff + q * nc], sOutV_.template ReinterpretCast<int32_t>(), n);
            StoreInts(wsGm_[t_.wsResSlotOff + q * nc], sOutI_.template ReinterpretCast<int32_t>(), n);
            Sync<HardEvent::MTE3_V>();
            stashRuns_.len[q] = n;
        }
        Configure(stashRuns_, runs, t_.wsResKeyOff, t_.wsResSlotOff, false, 1, 2, 1);
    }
    // Stash lookup of v (ascending over calls): the slot of the first stash entry (lowest k, the
    // payload's high half) whose key is v, or -1.
    __aicore__ inline int32_t StashSlot(int32_t v) {
        PlanMerger& g = stashRuns_;
        while (g.has && g.key < v) Advance(g);
        int32_t first = -1;
        for (; g.has && g.key == v; Advance(g))
            if (first < 0 || g.val < first) first = g.val;
        return first < 0 ? -1 : (first & 0xFFFF);
    }
    // Drops stale stash entries, order kept. Liveness (slot_pos[clamped slot] == key) is tested
    // nc entries at a time with the all-probe gather (the slots in the first nc lanes), and the
    // live entries are compacted by GatherMask; only their write-back is scalar. A scalar test per
    // entry would alternate between the window being read (k) and the one written (c < k) at
    // every entry once one entry was dropped, a window reload each time with small stash windows.
    __aicore__ inline void CompactStash() {
        const uint32_t nc = t_.nc, W = Wide();
        Win& sk = win_[avsg::SEC_SK];
        Win& ss = win_[avsg::SEC_SS];
        const LocalTensor<int32_t> keys = vKey_, slots = vSlot_, liveKeys = vFoundI_, liveSlots = vFirst_;
        uint32_t c = 0;
        for (uint32_t base = 0; base < stashCount_; base += nc) {
            const uint32_t n = MinU(nc, stashCount_ - base);
            Sync<HardEvent::S_V>();               // scalar writes of the windows / reads of the lists
            PipeBarrier<PIPE_V>();
            CopySection(sk, base, n, keys);
            CopySection(ss, base, n, slots);
            Duplicate(wIdx_, 0, W);
            PipeBarrier<PIPE_V>();
            Adds(wIdx_, slots, 0, n);
            PipeBarrier<PIPE_V>();
            ClampInts(wIdx_, 0, SlotMax(), n);
            SplitIdx(win_[avsg::SEC_SP], wIdx_);
            MatchBits(win_[avsg::SEC_SP], keys, false, mOwn_);   // first nc bits: live
            uint64_t cnt = 0, cnt2 = 0;
            GatherMask(liveKeys, keys, U32(mOwn_), true, n, GatherMaskParams(1, 1, 8, 0), cnt);
            GatherMask(liveSlots, slots, U32(mOwn_), true, n, GatherMaskParams(1, 1, 8, 0), cnt2);
            Sync<HardEvent::V_S>();
            if (c == base && static_cast<uint32_t>(cnt) == n) {   // nothing dropped so far
                c += n;
                continue;
            }
            for (uint32_t q = 0; q < static_cast<uint32_t>(cnt); ++q, ++c) {
                Put(sk, c, liveKeys.GetValue(q));
                Put(ss, c, liveSlots.GetValue(q));
            }
        }
        for (uint32_t k = c; k < stashCount_; ++k) {
            Put(sk, k, -1);
            Put(ss, k, 0);
        }
        stashCount_ = c;
    }
    __aicore__ inline void AppendPending(uint32_t r, uint32_t m) {
        for (uint32_t j0 = 0; j0 < m; j0 += t_.nc) {
            const uint32_t n = LoadMisses(r, j0, m);
            for (uint32_t q = 0; q < n; ++q) {
                if (!WordBit(pendBits_, j0 + q)) continue;
                if (stashCount_ >= t_.capacity) return;   // full: only a corrupted state gets here
                Put(win_[avsg::SEC_SK], stashCount_, vWant_.GetValue(q));
                Put(win_[avsg::SEC_SS], stashCount_, vMS_.GetValue(q));
                ++stashCount_;
            }
        }
    }
    // After the insert: misses no probe bucket took go to the stash, stale entries out first.
    __aicore__ inline void StashPending(uint32_t r, uint32_t m) {
        bool pending = false;
        for (uint32_t w = 0; w < t_.pendWords && !pending; ++w) pending = pendBits_.GetValue(w) != 0;
        if (stashCount_ > 0 || pending) {
            CompactStash();
            AppendPending(r, m);
        }
    }
    // stash_count from the header, clamped to [0, S] whatever the state holds.
    __aicore__ inline void LoadStashCount() {
        const int32_t count = countUb_.GetValue(0);
        stashCount_ = count < 0 ? 0u : MinU(static_cast<uint32_t>(count), t_.capacity);
    }

    PlanMerger stashRuns_;                   // the sorted stash (hash plan), runs 0 when empty
    uint32_t stashCount_ = 0;
};

}  // namespace avsg_kernel
