// plan_block_hash_match.h: the hash matcher. Each chunk's selections are looked up in the hash
// index by their probes (all probes of the chunk in one pass of wide gathers); a lane no probe
// finds is looked up in the stash later, once per distinct miss, by MergeMisses.
// UB: reads vWant_/vWantF_ (the chunk) and the bucket_slot / slot_pos windows; writes
// vFoundF_ (slot or -1 per lane), the wide vectors and mKey_/mOwn_.
#pragma once
#include "plan_block_stash.h"

namespace avsg_kernel {

class PlanBlockHashMatch {
public:
    __aicore__ inline explicit PlanBlockHashMatch(PlanContext& ctx, PlanBlockProbe& probe) : ctx_(ctx), probe_(probe) {}
    // Hash lookup of vWant_ (nc lanes; invalid lanes hold -2) -> vFoundF_ (slot or -1), probes
    // only: a probe matches when the slot its bucket names holds p (reference.index_lookup), so
    // the gathers touch bucket_slot and slot_pos only, which the host keeps whole in UB where
    // they fit. The probes run last to first, so the first matching
    // probe wins as in the reference even if slot_pos held a position twice. A lane no probe
    // finds is looked up in the stash later, once per row, by the sorted merge in MergeMisses
    // (reference: the stash is consulted only then).
    __aicore__ inline void HashLookup() {
        const uint32_t nc = ctx_.t_.nc, n = probe_.Wide();
        Win& bs = ctx_.win_[avsg::SEC_BS];
        Win& sp = ctx_.win_[avsg::SEC_SP];
        Sync<HardEvent::S_V>();                   // scalar writes of the windows / inputs
        probe_.Hash(ctx_.vWant_, nc);
        probe_.Buckets();
        probe_.SplitIdx(bs, ctx_.wIdx_);
        probe_.GatherVals(bs, ctx_.wSlot_, 0, ctx_.SlotMax());     // the slot each probe bucket names
        if (sp.nwin == 1) {                       // SplitIdx of one window: the byte offsets
            ShiftLeft(ctx_.wIdx_, ctx_.wSlot_, 2, n);
            PipeBarrier<PIPE_V>();
        } else {
            Adds(ctx_.wIdx_, ctx_.wSlot_, 0, n);
            PipeBarrier<PIPE_V>();
            probe_.SplitIdx(sp, ctx_.wIdx_);
        }
        probe_.MatchBits(sp, ctx_.vWant_, false, ctx_.mOwn_);      // slot_pos[slot] == p
        // an invalid lane (-2) matches nothing, whatever a corrupted slot_pos holds
        CompareScalar(ctx_.mKey_, ctx_.vWantF_, 0.0f, CMPMODE::GE, nc);
        if (ctx_.split_ > 1 && ctx_.t_.dropPast) {          // nor, in a split row, one the owner drops
            CompareScalar(ctx_.mTmp_, ctx_.vWantF_, ctx_.dropLimitF_, CMPMODE::LT, nc);   // (plan_block_drop.h)
            PipeBarrier<PIPE_V>();
            And(ctx_.U16(ctx_.mKey_), ctx_.U16(ctx_.mKey_), ctx_.U16(ctx_.mTmp_), nc / 16);
        }
        Cast(ctx_.wSlot_.ReinterpretCast<float>(), ctx_.wSlot_, RoundMode::CAST_RINT, n);
        Duplicate(ctx_.vFoundF_, -1.0f, nc);
        PipeBarrier<PIPE_V>();
        for (uint32_t i = 0; i < avsg::kPlanProbes; ++i)
            And(ctx_.U16(ctx_.mOwn_[i * nc / 8]), ctx_.U16(ctx_.mOwn_[i * nc / 8]), ctx_.U16(ctx_.mKey_), nc / 16);
        PipeBarrier<PIPE_V>();
        const LocalTensor<float> slotF = ctx_.wSlot_.ReinterpretCast<float>();
        for (uint32_t i = avsg::kPlanProbes; i-- > 0;) {
            Select(ctx_.vFoundF_, ctx_.mOwn_[i * nc / 8], slotF[i * nc], ctx_.vFoundF_,
                   SELMODE::VSEL_TENSOR_TENSOR_MODE, nc);
            PipeBarrier<PIPE_V>();
        }
    }

    // the context and the blocks this one calls
    PlanContext& ctx_;
    PlanBlockProbe& probe_;
};

}  // namespace avsg_kernel
