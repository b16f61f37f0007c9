// plan_block_hash_match.h: the hash matcher. Each chunk's selections are looked up in the hash
// index by their probes (all probes of the chunk in one pass of wide gathers); a lane no probe
// finds is looked up in the stash later, once per distinct miss, by MergeMisses.
// UB: reads vWant_/vWantF_ (the chunk) and the bucket_slot / slot_pos windows; writes
// vFoundF_ (slot or -1 per lane), the wide vectors and mKey_/mOwn_.
#pragma once
#include "plan_block_stash.h"

namespace avsg_kernel {

class PlanBlockHashMatch : public PlanBlockStash {
protected:
    // Hash lookup of vWant_ (nc lanes; invalid lanes hold -2) -> vFoundF_ (slot or -1), probes
    // only: a probe matches when the slot its bucket names holds p (reference.index_lookup), so
    // the gathers touch bucket_slot and slot_pos only, which the host keeps whole in UB where
    // they fit. The probes run last to first, so the first matching
    // probe wins as in the reference even if slot_pos held a position twice. A lane no probe
    // finds is looked up in the stash later, once per row, by the sorted merge in MergeMisses
    // (reference: the stash is consulted only then).
    __aicore__ inline void HashLookup() {
        const uint32_t nc = t_.nc, n = Wide();
        Win& bs = win_[avsg::SEC_BS];
        Win& sp = win_[avsg::SEC_SP];
        Sync<HardEvent::S_V>();                   // scalar writes of the windows / inputs
        Hash(vWant_, nc);
        Buckets();
        SplitIdx(bs, wIdx_);
        GatherVals(bs, wSlot_, 0, SlotMax());     // the slot each probe bucket names
        Adds(wIdx_, wSlot_, 0, n);
        PipeBarrier<PIPE_V>();
        SplitIdx(sp, wIdx_);
        MatchBits(sp, vWant_, false, mOwn_);      // slot_pos[slot] == p
        // an invalid lane (-2) matches nothing, whatever a corrupted slot_pos holds
        CompareScalar(mKey_, vWantF_, 0.0f, CMPMODE::GE, nc);
        if (split_ > 1 && t_.dropPast) {          // nor, in a split row, one the owner drops
            CompareScalar(mTmp_, vWantF_, dropLimitF_, CMPMODE::LT, nc);   // (plan_block_drop.h)
            PipeBarrier<PIPE_V>();
            And(U16(mKey_), U16(mKey_), U16(mTmp_), nc / 16);
        }
        Cast(wSlot_.ReinterpretCast<float>(), wSlot_, RoundMode::CAST_RINT, n);
        Duplicate(vFoundF_, -1.0f, nc);
        PipeBarrier<PIPE_V>();
        for (uint32_t i = 0; i < avsg::kPlanProbes; ++i)
            And(U16(mOwn_[i * nc / 8]), U16(mOwn_[i * nc / 8]), U16(mKey_), nc / 16);
        PipeBarrier<PIPE_V>();
        const LocalTensor<float> slotF = wSlot_.ReinterpretCast<float>();
        for (uint32_t i = avsg::kPlanProbes; i-- > 0;) {
            Select(vFoundF_, mOwn_[i * nc / 8], slotF[i * nc], vFoundF_, SELMODE::VSEL_TENSOR_TENSOR_MODE, nc);
            PipeBarrier<PIPE_V>();
        }
    }
};

}  // namespace avsg_kernel
