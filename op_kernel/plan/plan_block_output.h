// plan_block_output.h: output. The slots of the missed lanes are patched into the stored
// chunks from miss_slots (OutputMisses: one pass per chunk with misses, no second lookup), then
// the row's results and its state go back to GM (StoreRow).
// UB: wKey_ (a chunk's slots), vT1_/vT2_/vMS_, statsUb_, scalarUb_, countUb_ and every window;
// GM: slots, miss_pos / miss_slots tails, stats, miss_counts, the state row.
#pragma once
#include "plan_block_insert.h"

namespace avsg_kernel {

class PlanBlockOutput : public PlanBlockInsert {
protected:
    // Step 4: the slots of the lanes the match missed (reference: miss_slots[searchsorted]).
    // Classify stored every chunk's match (final for hits and invalid lanes) and its sorted miss
    // run's lanes; MergeMisses stored each run entry's index j in miss_pos (or -2 - slot for a
    // stash hit). So a missed lane's slot is miss_slots[j], with j ascending along the run: one
    // pass per chunk with misses, miss_slots streamed in nc blocks, no second lookup.
    __aicore__ inline void OutputMisses(uint32_t r, uint32_t m) {
        const uint32_t nc = t_.nc;
        const uint64_t rowN = static_cast<uint64_t>(r) * t_.outPitch;
        const LocalTensor<int32_t> out = wKey_;   // the chunk's slots
        const LocalTensor<int32_t> lanes = vT1_, js = vT2_, block = vMS_;
        missChunk_ = -1;
        Sync<HardEvent::V_S>();                   // vector reads/writes of these buffers so far
        Sync<HardEvent::V_MTE2>();
        for (uint32_t c = 0; c < t_.numChunks; ++c) {
            const uint32_t len = missRuns_.len[c];
            if (len == 0) continue;
            const uint32_t n = MinU(nc, t_.N - c * nc);
            Sync<HardEvent::S_MTE2>();
            Sync<HardEvent::MTE3_MTE2>();
            LoadInts(out, slotsGm_[rowN + c * nc], n, 0);
            LoadInts(lanes, wsGm_[t_.wsRunLaneOff + c * nc], len, 0);
            LoadInts(js, wsGm_[t_.wsMissOff + c * nc], len, 0);
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
                    LoadInts(block, missSlotsGm_[rowN + static_cast<uint32_t>(blk) * nc],
                             MinU(nc, m - static_cast<uint32_t>(blk) * nc), 0);
                    Sync<HardEvent::MTE2_S>();
                    cur = blk;
                }
                out.SetValue(static_cast<uint32_t>(lanes.GetValue(e)), block.GetValue(j - static_cast<uint32_t>(blk) * nc));
            }
            Sync<HardEvent::S_MTE3>();
            StoreInts(slotsGm_[rowN + c * nc], out, n);
            Sync<HardEvent::MTE3_S>();
        }
        Sync<HardEvent::S_V>();                   // scalar reads of lanes / js / block before vector reuse
        Sync<HardEvent::MTE3_V>();
    }
    // Step 4 and the row's end: every selection's slot, the unused tails of miss_pos / miss_slots,
    // the stats row, miss_counts, the stash count (and the reuse step word), every dirty window
    // written back.
    template <class Policy>
    __aicore__ inline void StoreRow(uint32_t r, uint32_t m) {
        const uint64_t rowState = static_cast<uint64_t>(r) * t_.width;
        const uint64_t rowN = static_cast<uint64_t>(r) * t_.outPitch;
        OutputMisses(r, m);
        FillTail(missPosGm_, rowN, m, t_.N);
        FillTail(missSlotsGm_, rowN, m, t_.N);
        Sync<HardEvent::MTE3_MTE2>();
        Sync<HardEvent::MTE3_S>();
        DataCopy(statsUb_, statsGm_[static_cast<uint64_t>(r) * 4], 4);
        Sync<HardEvent::MTE2_S>();
        statsUb_.SetValue(0, statsUb_.GetValue(0) + lookups_);
        statsUb_.SetValue(1, statsUb_.GetValue(1) + hits_);
        statsUb_.SetValue(2, statsUb_.GetValue(2) + misses_);
        statsUb_.SetValue(3, statsUb_.GetValue(3) + static_cast<int64_t>(m));
        scalarUb_.SetValue(0, static_cast<int32_t>(m));
        countUb_.SetValue(0, static_cast<int32_t>(stashCount_));
        if constexpr (Policy::kReuse) AdvanceStep();
        Sync<HardEvent::S_MTE3>();
        DataCopy(statsGm_[static_cast<uint64_t>(r) * 4], statsUb_, 4);
        StoreInts(missCountsGm_[static_cast<uint64_t>(r) * avsg::kPlanCountPitch], scalarUb_, 1);
        DataCopy(stateGm_[rowState + t_.stashCountOff], countUb_, avsg::kStashCountPad);
        for (uint32_t s = 0; s < avsg::SEC_COUNT; ++s) Flush(win_[s]);
        Sync<HardEvent::MTE3_S>();
        Sync<HardEvent::MTE3_V>();
        Sync<HardEvent::MTE3_MTE2>();
    }
};

}  // namespace avsg_kernel
