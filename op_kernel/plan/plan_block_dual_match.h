// plan_block_dual_match.h: the dual-pointer matcher (the baseline plan_dual_pointer). The row's
// resident slots (BuildResidentRuns) and its valid selections (DualMatchRow) are sorted into runs
// and walked once with two pointers; each chunk's matches are then scattered to their lanes
// (DualFound). No hash, no stash lookup.
// UB: the slot_pos windows (read), vKey_/vSlot_/vT1_/vT2_ and the sort region; writes vFoundF_.
// GM: the workspace's resident and selection runs.
#pragma once
#include "plan_block_hash_match.h"

namespace avsg_kernel {

class PlanBlockDualMatch {
public:
    __aicore__ inline explicit PlanBlockDualMatch(PlanContext& ctx, PlanBlockProbe& probe, PlanBlockMerge& merge)
        : ctx_(ctx), probe_(probe), merge_(merge) {}
    // Dual pointer: sorted runs of (slot_pos, slot) for resident slots, into the workspace.
    __aicore__ inline void BuildResidentRuns() {
        const uint32_t nc = ctx_.t_.nc;
        Win& sp = ctx_.win_[avsg::SEC_SP];
        uint32_t run = 0;
        Sync<HardEvent::S_V>();
        for (uint32_t id = 0; id < sp.nwin; ++id) {
            ctx_.Ensure(sp, static_cast<int32_t>(id));
            const uint32_t cnt = WinCount(sp, static_cast<int32_t>(id));
            for (uint32_t off = 0; off < cnt; off += nc, ++run) {
                const uint32_t n = MinU(nc, cnt - off);
                const uint32_t base = id * sp.wlen + off;
                Cast(ctx_.vTmpF_, sp.buf[off], RoundMode::CAST_RINT, n);
                Adds(ctx_.vT1_, ctx_.vLane_, static_cast<int32_t>(base), n);   // slot ids
                PipeBarrier<PIPE_V>();
                avsg::CompareScalarAll(ctx_.mA_, ctx_.vTmpF_, 0.0f, CMPMODE::GE, n);
                PipeBarrier<PIPE_V>();
                uint64_t m = 0, m2 = 0;
                GatherMask(ctx_.vKey_, sp.buf[off], ctx_.U32(ctx_.mA_), true, n, GatherMaskParams(1, 1, 8, 0), m);
                GatherMask(ctx_.vSlot_, ctx_.vT1_, ctx_.U32(ctx_.mA_), true, n, GatherMaskParams(1, 1, 8, 0), m2);
                PipeBarrier<PIPE_V>();
                resRuns_.len[run] = static_cast<uint32_t>(m);
                if (m == 0) continue;
                // whatever slot_pos holds, keys stay exact in the float sort (no selection is >= 2^24)
                Mins(ctx_.vKey_, ctx_.vKey_, static_cast<int32_t>(avsg::kMaxPosition), static_cast<uint32_t>(m));
                PipeBarrier<PIPE_V>();
                LocalTensor<uint32_t> pay = ctx_.vSlot_.ReinterpretCast<uint32_t>();
                merge_.SortAscending(ctx_.vKey_, static_cast<uint32_t>(m), &pay);
                Sync<HardEvent::V_MTE3>();
                StoreInts(ctx_.wsGm_[ctx_.t_.wsResKeyOff + run * nc], ctx_.sOutV_.template ReinterpretCast<int32_t>(),
                          static_cast<uint32_t>(m));
                StoreInts(ctx_.wsGm_[ctx_.t_.wsResSlotOff + run * nc], ctx_.sOutI_.template ReinterpretCast<int32_t>(),
                          static_cast<uint32_t>(m));
                Sync<HardEvent::MTE3_V>();
            }
        }
        merge_.Configure(resRuns_, run, ctx_.t_.wsResKeyOff, ctx_.t_.wsResSlotOff, false, 1, 2, 1);
    }
    // Dual pointer, once per row: the row's valid selections sorted per chunk (lanes as payload),
    // then one walk of two pointers over them and the merged resident runs. Both sides ascend, so
    // every resident entry and every selection is passed once: O((S + T*K) log runs) scalar steps
    // for the row. Each selection's match (slot or -1) replaces its key in the workspace run.
    __aicore__ inline void DualMatchRow(uint32_t r) {
        const uint32_t nc = ctx_.t_.nc;
        for (uint32_t c = 0; c < ctx_.t_.numChunks; ++c) {
            probe_.PrepareWant(r, c);
            avsg::CompareScalarAll(ctx_.mA_, ctx_.vWantF_, 0.0f, CMPMODE::GE, nc);
            PipeBarrier<PIPE_V>();
            uint64_t m = 0, m2 = 0;
            GatherMask(ctx_.vKey_, ctx_.vWant_, ctx_.U32(ctx_.mA_), true, nc, GatherMaskParams(1, 1, 8, 0), m);
            GatherMask(ctx_.vSlot_, ctx_.vLane_, ctx_.U32(ctx_.mA_), true, nc, GatherMaskParams(1, 1, 8, 0), m2);
            PipeBarrier<PIPE_V>();
            selRuns_.len[c] = static_cast<uint32_t>(m);
            if (m == 0) continue;
            LocalTensor<uint32_t> pay = ctx_.vSlot_.ReinterpretCast<uint32_t>();
            merge_.SortAscending(ctx_.vKey_, static_cast<uint32_t>(m), &pay);
            Sync<HardEvent::V_MTE3>();
            StoreInts(ctx_.wsGm_[ctx_.t_.wsSelKeyOff + c * nc], ctx_.sOutV_.template ReinterpretCast<int32_t>(),
                      static_cast<uint32_t>(m));
            StoreInts(ctx_.wsGm_[ctx_.t_.wsSelLaneOff + c * nc], ctx_.sOutI_.template ReinterpretCast<int32_t>(),
                      static_cast<uint32_t>(m));
            Sync<HardEvent::MTE3_V>();
        }
        merge_.Configure(selRuns_, ctx_.t_.numChunks, ctx_.t_.wsSelKeyOff, 0, true, 0, 0, 0);
        merge_.Start(resRuns_);
        merge_.Start(selRuns_);
        while (selRuns_.has) {
            const int32_t want = selRuns_.key;
            while (resRuns_.has && resRuns_.key < want) merge_.Advance(resRuns_);
            merge_.Emit(selRuns_, resRuns_.has && resRuns_.key == want ? merge_.Val(resRuns_) : -1);
            merge_.Advance(selRuns_);
        }
    }
    // Chunk c's matches (from DualMatchRow) -> vFoundF_: scattered to their lanes.
    __aicore__ inline void DualFound(uint32_t c) {
        const uint32_t nc = ctx_.t_.nc, len = selRuns_.len[c];
        const LocalTensor<int32_t> lanes = ctx_.vT1_, found = ctx_.vT2_;
        Duplicate(ctx_.vFoundI_, -1, nc);
        if (len > 0) {
            Sync<HardEvent::V_MTE2>();
            Sync<HardEvent::S_MTE2>();
            Sync<HardEvent::MTE3_MTE2>();
            LoadInts(lanes, ctx_.wsGm_[ctx_.t_.wsSelLaneOff + c * nc], len, 0);
            LoadInts(found, ctx_.wsGm_[ctx_.t_.wsSelKeyOff + c * nc], len, 0);
            Sync<HardEvent::MTE2_S>();
            Sync<HardEvent::V_S>();
            for (uint32_t e = 0; e < len; ++e)
                ctx_.vFoundI_.SetValue(static_cast<uint32_t>(lanes.GetValue(e)), found.GetValue(e));
            Sync<HardEvent::S_V>();
        }
        PipeBarrier<PIPE_V>();
        Cast(ctx_.vFoundF_, ctx_.vFoundI_, RoundMode::CAST_RINT, nc);
        PipeBarrier<PIPE_V>();
    }

    PlanMerger resRuns_, selRuns_;           // resident (slot_pos, slot) runs; selection runs

    // the context and the blocks this one calls
    PlanContext& ctx_;
    PlanBlockProbe& probe_;
    PlanBlockMerge& merge_;
};

}  // namespace avsg_kernel
