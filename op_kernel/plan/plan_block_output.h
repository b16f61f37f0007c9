// plan_block_output.h: output. The slots of the missed lanes are patched into the stored
// chunks from miss_slots (OutputMisses: one pass per chunk with misses, no second lookup), then
// the row's results and its state go back to GM (StoreRow).
// UB: wKey_ (a chunk's slots), vT1_/vT2_/vMS_, statsUb_, scalarUb_, countUb_ and every window;
// GM: slots, miss_pos / miss_slots tails, stats, miss_counts, the state row.
#pragma once
#include "plan_block_insert.h"

namespace avsg_kernel {

class PlanBlockOutput {
public:
    __aicore__ inline explicit PlanBlockOutput(PlanContext& ctx, PlanBlockStash& stash,
                                               PlanBlockClassify& classify)
        : ctx_(ctx), stash_(stash), classify_(classify) {}
    // Step 4: the slots of the lanes the match missed (reference: miss_slots[searchsorted]).
    // Classify stored every chunk's match (final for hits and invalid lanes) and its sorted miss
    // run's lanes; MergeMisses stored each run entry's index j in miss_pos (or -2 - slot for a
    // stash hit). So a missed lane's slot is miss_slots[j], with j ascending along the run: one
    // pass per chunk with misses, miss_slots streamed in nc blocks, no second lookup.
    __aicore__ inline void OutputMisses(uint32_t r, uint32_t m) {
        const uint32_t nc = ctx_.t_.nc;
        const uint64_t rowN = static_cast<uint64_t>(r) * ctx_.t_.outPitch;
        const LocalTensor<int32_t> out = ctx_.wKey_;   // the chunk's slots
        const LocalTensor<int32_t> lanes = ctx_.vT1_, js = ctx_.vT2_, block = ctx_.vMS_;
        ctx_.missChunk_ = -1;
        Sync<HardEvent::V_S>();                   // vector reads/writes of these buffers so far
        Sync<HardEvent::V_MTE2>();
        for (uint32_t c = 0; c < ctx_.t_.numChunks; ++c) {
            const uint32_t len = classify_.missRuns_.len[c];
            if (len == 0) continue;
            const uint32_t n = MinU(nc, ctx_.t_.N - c * nc);
            Sync<HardEvent::S_MTE2>();
            Sync<HardEvent::MTE3_MTE2>();
            LoadInts(out, ctx_.slotsGm_[rowN + c * nc], n, 0);
            LoadInts(lanes, ctx_.wsGm_[ctx_.t_.wsRunLaneOff + c * nc], len, 0);
            LoadInts(js, ctx_.wsGm_[ctx_.t_.wsMissOff + c * nc], len, 0);
            Sync<HardEvent::MTE2_S>();
            int32_t cur = -1;                     // miss_slots block in `block`
            for (uint32_t e = 0; e < len; ++e) {
                const int32_t code = js.GetValue(e);
                if (code < 0) {                   // stash hit
                    out.SetValue(static_cast<uint32_t>(lanes.GetValue(e)), -2 - code);
                    continue;
                }
                const uint32_t j = static_cast<uint32_t>(code);
                const int32_t blk = static_cast<int32_t>(j / nc);
                if (blk != cur) {
                    Sync<HardEvent::S_MTE2>();
                    LoadInts(block, ctx_.missSlotsGm_[rowN + static_cast<uint32_t>(blk) * nc],
                             MinU(nc, m - static_cast<uint32_t>(blk) * nc), 0);
                    Sync<HardEvent::MTE2_S>();
                    cur = blk;
                }
                const uint32_t inBlock = j - static_cast<uint32_t>(blk) * nc;
                out.SetValue(static_cast<uint32_t>(lanes.GetValue(e)), block.GetValue(inBlock));
            }
            Sync<HardEvent::S_MTE3>();
            StoreInts(ctx_.slotsGm_[rowN + c * nc], out, n);
            Sync<HardEvent::MTE3_S>();
        }
        Sync<HardEvent::S_V>();                   // scalar reads of lanes / js / block before vector reuse
        Sync<HardEvent::MTE3_V>();
    }
    // Step 4: every selection's slot, the unused tails of miss_pos / miss_slots, the stats, miss
    // count and stash count staged in UB; the policy's upkeep may stage more (reuse: the step
    // word in countUb_) before WriteBack.
    __aicore__ inline void StoreResults(uint32_t r, uint32_t m) {
        const uint64_t rowN = static_cast<uint64_t>(r) * ctx_.t_.outPitch;
        OutputMisses(r, m);
        const GlobalTensor<int32_t> tails[] = {ctx_.missPosGm_, ctx_.missSlotsGm_};
        ctx_.FillTails(tails, 2, rowN, m, ctx_.t_.N);
        Sync<HardEvent::MTE3_MTE2>();
        Sync<HardEvent::MTE3_S>();
        DataCopy(ctx_.statsUb_, ctx_.statsGm_[static_cast<uint64_t>(r) * 4], 4);
        Sync<HardEvent::MTE2_S>();
        ctx_.statsUb_.SetValue(0, ctx_.statsUb_.GetValue(0) + ctx_.lookups_);
        ctx_.statsUb_.SetValue(1, ctx_.statsUb_.GetValue(1) + ctx_.hits_);
        ctx_.statsUb_.SetValue(2, ctx_.statsUb_.GetValue(2) + ctx_.misses_);
        ctx_.statsUb_.SetValue(3, ctx_.statsUb_.GetValue(3) + static_cast<int64_t>(m));
        ctx_.scalarUb_.SetValue(0, static_cast<int32_t>(m));
        ctx_.countUb_.SetValue(0, static_cast<int32_t>(stash_.stashCount_));
    }
    // The row's end: the staged stats, miss count and stash count, and every dirty window written
    // back.
    __aicore__ inline void WriteBack(uint32_t r) {
        const uint64_t rowState = static_cast<uint64_t>(r) * ctx_.t_.width;
        Sync<HardEvent::S_MTE3>();
        DataCopy(ctx_.statsGm_[static_cast<uint64_t>(r) * 4], ctx_.statsUb_, 4);
        StoreInts(ctx_.missCountsGm_[static_cast<uint64_t>(r) * avsg::kPlanCountPitch], ctx_.scalarUb_, 1);
        DataCopy(ctx_.stateGm_[rowState + ctx_.t_.stashCountOff], ctx_.countUb_, avsg::kStashCountPad);
        for (uint32_t s = 0; s < avsg::SEC_COUNT; ++s) ctx_.Flush(ctx_.win_[s]);
        Sync<HardEvent::MTE3_S>();
        Sync<HardEvent::MTE3_V>();
        Sync<HardEvent::MTE3_MTE2>();
    }

    // the context and the blocks this one calls
    PlanContext& ctx_;
    PlanBlockStash& stash_;
    PlanBlockClassify& classify_;
};

}  // namespace avsg_kernel
