// plan_block_output.h: output. The slots of the missed lanes are patched into the stored
// chunks from miss_slots (OutputMisses: one pass per chunk with misses, no second lookup), then
// the row's results and its state go back to GM (StoreRow).
// UB: wKey_ (a group's slots) or outSlots_, vT1_/vT2_/vMS_, statsUb_, scalarUb_, countUb_ and
// every window;
// GM: miss_counts (PublishMisses, before the insert), slots, miss_pos / miss_slots tails, stats,
// the state row.
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
    // pass over the chunks with misses, miss_slots streamed in nc blocks, no second lookup.
    // The chunks go in groups of kPlanProbes (a wide vector holds their slots; their run lanes and
    // indices the other two): per group one load of the stored slots from its first chunk with
    // misses to its last, one store back, and one set of syncs, not one per chunk. The stats ride
    // on the first group's loads. miss_slots block: vMS_ holds one already where the insert or the
    // stash left it (LoadMisses), the only one when m <= nc.
    // Resident slots (PlanContext::SlotsResident) are patched in place and go out in one copy at
    // the end instead of a load and a store per group.
    __aicore__ inline void OutputMisses(uint32_t r, uint32_t m) {
        const uint32_t nc = ctx_.t_.nc, group = avsg::kPlanProbes;
        const uint64_t rowN = static_cast<uint64_t>(r) * ctx_.t_.outPitch;
        const bool resident = ctx_.SlotsResident();
        if (resident) Sync<HardEvent::V_S>();     // Classify's vector writes of the slots
        // js and lanes: wIdx_ and wWin_, one Wide() after the other (wPair_), so a run's two
        // loads are one copy
        const LocalTensor<int32_t> js = ctx_.wPair_, lanes = ctx_.wWin_, block = ctx_.vMS_;
        int32_t cur = ctx_.missChunk_;            // miss_slots block in `block`, -1: none
        ctx_.missChunk_ = -1;                     // vMS_ may move to another block below
        bool statsLoaded = false;
        for (uint32_t c0 = 0; c0 < ctx_.t_.numChunks; c0 += group) {
            uint32_t lo = c0 + group, hi = c0;    // the chunks the group's runs cover lie in [lo, hi)
            for (uint32_t c = c0; c < MinU(c0 + group, ctx_.t_.numChunks); ++c) {
                if (classify_.missRuns_.len[c] == 0) continue;
                lo = MinU(lo, c);
                hi = MaxU(hi, c + classify_.runChunks_[c]);   // a run stays inside its group
            }
            if (lo >= hi) continue;
            const uint32_t first = lo * nc, n = MinU(hi * nc, ctx_.t_.N) - first;
            const LocalTensor<int32_t> out = resident ? ctx_.outSlots_[first] : ctx_.wKey_;   // the group's slots
            if (!statsLoaded) Sync<HardEvent::V_MTE2>();   // vector work on these buffers so far
            Sync<HardEvent::S_MTE2>();            // the previous group's scalar accesses
            Sync<HardEvent::MTE3_MTE2>();         // the chunks' stores (classify; the previous group's)
            if (!resident) LoadInts(out, ctx_.slotsGm_[rowN + first], n, 0);
            for (uint32_t c = lo; c < hi; ++c) {
                const uint32_t len = classify_.missRuns_.len[c];
                // the run's indices and lanes in one copy
                LoadIntPair(js[(c - lo) * nc], ctx_.wsGm_[ctx_.t_.wsMissOff + c * nc], len,
                            avsg::kPlanProbes * nc, ctx_.t_.wsRunLaneOff - ctx_.t_.wsMissOff, 0);
            }
            if (!statsLoaded) LoadStats(r);
            statsLoaded = true;
            Sync<HardEvent::MTE2_S>();
            for (uint32_t c = lo; c < hi; ++c) {
                const uint32_t at = (c - lo) * nc;   // the chunk's lanes in out / lanes / js
                for (uint32_t e = 0; e < classify_.missRuns_.len[c]; ++e) {
                    const int32_t code = js.GetValue(at + e);
                    const uint32_t lane = at + static_cast<uint32_t>(lanes.GetValue(at + e));
                    if (code < 0) {               // stash hit
                        out.SetValue(lane, -2 - code);
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
                    out.SetValue(lane, block.GetValue(j - static_cast<uint32_t>(blk) * nc));
                }
            }
            if (resident) continue;
            Sync<HardEvent::S_MTE3>();
            StoreInts(ctx_.slotsGm_[rowN + first], out, n);
        }
        if (!statsLoaded) {                       // no misses: the stats alone
            Sync<HardEvent::S_MTE2>();
            LoadStats(r);
            Sync<HardEvent::MTE2_S>();
        }
        if (resident) {   // one copy; StoreBack's MTE3_S orders it before the next row's Classify
            Sync<HardEvent::S_MTE3>();
            Sync<HardEvent::V_MTE3>();
            StoreInts(ctx_.slotsGm_[rowN], ctx_.outSlots_, ctx_.t_.N);
        }
    }
    // statsUb_ = the row's stats (int64 x 4, one 32 B copy)
    __aicore__ inline void LoadStats(uint32_t r) {
        DataCopy(ctx_.statsUb_, ctx_.statsGm_[static_cast<uint64_t>(r) * 4], 4);
    }
    // Step 4's miss lists are final once the victims are chosen (merge stored miss_pos[0:m], the
    // victim search miss_slots[0:m]): miss_counts[r] goes out now, before the insert, so that a
    // copy composed after the plan (plan_gather) can read the m misses while this core finishes
    // the row. The copy reads entries [0, m) only (gather_kernel.h clamps to the count), so the
    // -1 tails [m, N) follow later (StoreResults), by exact-byte stores that leave [0, m) alone.
    __aicore__ inline void PublishMisses(uint32_t r, uint32_t m) {
        ctx_.scalarUb_.SetValue(0, static_cast<int32_t>(m));
        Sync<HardEvent::S_MTE3>();
        StoreInts(ctx_.missCountsGm_[static_cast<uint64_t>(r) * avsg::kPlanCountPitch], ctx_.scalarUb_, 1);
        Sync<HardEvent::MTE3_S>();
    }
    // Step 4: the unused tails of miss_pos / miss_slots, every selection's slot, the stats and
    // stash count staged in UB; the policy's upkeep may stage more (reuse: the step word in
    // countUb_) before WriteBack. The tails' -1s fill the aligned region that holds OutputMisses'
    // buffers, so they go first: its loads wait for their stores anyway (the chunks' slots,
    // stored by classify).
    __aicore__ inline void StoreResults(uint32_t r, uint32_t m) {
        const uint64_t rowN = static_cast<uint64_t>(r) * ctx_.t_.outPitch;
        const GlobalTensor<int32_t> tails[] = {ctx_.missPosGm_, ctx_.missSlotsGm_};
        Sync<HardEvent::S_V>();                   // scalar accesses of the aligned region so far
        ctx_.FillTails(tails, 2, rowN, m, ctx_.t_.N);
        OutputMisses(r, m);
        ctx_.statsUb_.SetValue(0, ctx_.statsUb_.GetValue(0) + ctx_.lookups_);
        ctx_.statsUb_.SetValue(1, ctx_.statsUb_.GetValue(1) + ctx_.hits_);
        ctx_.statsUb_.SetValue(2, ctx_.statsUb_.GetValue(2) + ctx_.misses_);
        ctx_.statsUb_.SetValue(3, ctx_.statsUb_.GetValue(3) + static_cast<int64_t>(m));
        ctx_.countUb_.SetValue(0, static_cast<int32_t>(stash_.stashCount_));
    }
    // The row's end: the staged stats and stash count, and every dirty window written
    // back, all behind one pair of syncs. One MTE3_S after them: the scalar unit issues every
    // later instruction, so whatever comes next on any pipe starts after the stores
    // (emulation/emu_hazard.h, "Scalar issue"); the vector pipe may still be reading a buffer
    // the stores read, which is a read too.
    __aicore__ inline void WriteBack(uint32_t r) { StoreBack(true, r); }
    // An idle row's end after its drop (PlanKernel::Row): the dirty windows back, nothing else of
    // the row (no stats, no stash count: the step left them as they were).
    __aicore__ inline void WriteBackWindows() { StoreBack(false, 0); }

private:
    __aicore__ inline void StoreBack(bool results, uint32_t r) {
        Sync<HardEvent::V_MTE3>();                // windows a vector wrote
        Sync<HardEvent::S_MTE3>();
        if (results) {
            const uint64_t rowState = static_cast<uint64_t>(r) * ctx_.t_.width;
            DataCopy(ctx_.statsGm_[static_cast<uint64_t>(r) * 4], ctx_.statsUb_, 4);
            DataCopy(ctx_.stateGm_[rowState + ctx_.t_.stashCountOff], ctx_.countUb_, avsg::kStashCountPad);
        }
        for (uint32_t s = 0; s < avsg::SEC_COUNT; ++s) WinCopyBack(ctx_.win_[s]);
        Sync<HardEvent::MTE3_S>();
    }

public:
    // the context and the blocks this one calls
    PlanContext& ctx_;
    PlanBlockStash& stash_;
    PlanBlockClassify& classify_;
};

}  // namespace avsg_kernel
