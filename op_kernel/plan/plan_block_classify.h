// plan_block_classify.h: classify. Per chunk, the match is split into hits (hit bitmap, stats)
// and misses (the chunk's slots kept as they are: stored, or left in the row's resident slots);
// the misses of up to kPlanProbes consecutive chunks of a lookup group make one sorted run in the
// workspace; then the runs are merged with dedup into miss_pos, looking each distinct miss up in
// the sorted stash on the way (MergeMisses).
// UB: reads vWant_/vWantF_/vFoundF_; writes vFoundI_ or outSlots_, hitBytes_ (hitBits_ in
// MergeMisses), vT1_/vT2_/vKey_/vSlot_, the upper half of wSlot_ (a run being gathered, across
// the chunks of a group) and the sort region; MergeMisses vWant_/vMS_ (the misses' first
// chunk). GM: slots, miss_pos, the workspace's miss runs and their lanes.
#pragma once
#include "plan_block_dual_match.h"

namespace avsg_kernel {

class PlanBlockClassify {
public:
    __aicore__ inline explicit PlanBlockClassify(PlanContext& ctx, PlanBlockMerge& merge, PlanBlockStash& stash)
        : ctx_(ctx), merge_(merge), stash_(stash) {}
    // Counts, hit bitmap and the chunk's misses, into a sorted miss run (workspace run c, or the
    // run of an earlier chunk of the group this one joins). The match is stored as the chunk's
    // slots (final for hits and invalid lanes) with the run's lanes (the sort's payload, counted
    // from the run's first chunk), so OutputMisses patches just the missed lanes. groupEnds: the
    // caller looks up no more chunks of this group (a run never spans two groups).
    __aicore__ inline void Classify(uint32_t r, uint32_t c, uint32_t n, bool groupEnds) {
        const uint32_t nc = ctx_.t_.nc;
        // the chunk's slots: in place in the row's resident slots, or staged for their store
        const bool resident = ctx_.SlotsResident();
        const LocalTensor<int32_t> found = resident ? ctx_.outSlots_[c * nc] : ctx_.vFoundI_;
        Cast(found, ctx_.vFoundF_, RoundMode::CAST_RINT, nc);
        avsg::CompareScalarAll(ctx_.mA_, ctx_.vWantF_, 0.0f, CMPMODE::GE, nc);     // valid
        avsg::CompareScalarAll(ctx_.mB_, ctx_.vFoundF_, 0.0f, CMPMODE::GE, nc);    // hit
        avsg::CompareScalarAll(ctx_.mC_, ctx_.vFoundF_, 0.0f, CMPMODE::LT, nc);    // not hit
        PipeBarrier<PIPE_V>();
        And(ctx_.U16(ctx_.mC_), ctx_.U16(ctx_.mC_), ctx_.U16(ctx_.mA_), nc / 16);             // miss = valid & not hit
        PipeBarrier<PIPE_V>();
        // a hit is valid (no matcher finds an invalid lane), so the valid lanes are hits + misses
        uint64_t nHit = 0, nMiss = 0, nLanes = 0;
        GatherMask(ctx_.vKey_, found, ctx_.U32(ctx_.mB_), true, nc, GatherMaskParams(1, 1, 8, 0), nHit);
        GatherMask(ctx_.vSlot_, ctx_.vWant_, ctx_.U32(ctx_.mC_), true, nc, GatherMaskParams(1, 1, 8, 0), nMiss);
        GatherMask(ctx_.vT2_, ctx_.vLane_, ctx_.U32(ctx_.mC_), true, nc, GatherMaskParams(1, 1, 8, 0), nLanes);
        // the hit slots as int16 (S <= 2^15), four per scalar load in MarkHits; all nc lanes, so
        // the count is read only after the sync
        const LocalTensor<int16_t> hit16 = ctx_.vT1_.ReinterpretCast<int16_t>();
        PipeBarrier<PIPE_V>();
        Cast(hit16, ctx_.vKey_, RoundMode::CAST_NONE, nc);
        Sync<HardEvent::V_S>();
        ctx_.lookups_ += static_cast<int64_t>(nHit + nMiss);
        ctx_.hits_ += static_cast<int64_t>(nHit);
        ctx_.misses_ += static_cast<int64_t>(nMiss);
        // reuse: heat and counts follow from the final bitmap (HeatUsed, CountHits)
        if (c * nc >= ctx_.t_.topk && nHit > 0) {   // a later query token: mark only the new slots
            const LocalTensor<int16_t> fresh = ctx_.wKey_.ReinterpretCast<int16_t>()[4 * nc];
            ctx_.MarkHits(fresh, ctx_.UnmarkedHits(ctx_.vKey_, hit16, static_cast<uint32_t>(nHit), fresh));
        } else {
            ctx_.MarkHits(hit16, static_cast<uint32_t>(nHit));
        }
        missRuns_.len[c] = 0;
        runChunks_[c] = 1;
        if (!resident) {
            Sync<HardEvent::V_MTE3>();
            StoreInts(ctx_.slotsGm_[static_cast<uint64_t>(r) * ctx_.t_.outPitch + c * nc], found, n);
        }
        // MarkHits' scalar reads (of `fresh`, in the sort region, for a later query token's
        // chunk) before the vector writes of the run
        RunMisses(c, static_cast<uint32_t>(nMiss), groupEnds, true);
        if (!resident) Sync<HardEvent::MTE3_V>();   // the slots' store before vFoundI_ is rewritten
    }

    // Classify for a whole group of the wide lookup (PlanBlockHashMatch::WideLookup, chunks c0 ..
    // c0 + g - 1, consecutive) where the row's slots stay in UB: as Classify chunk by chunk, but
    // each step over the group's lanes at once, straight from the group's selections and matches
    // (GroupWant, GroupFound) and its validity mask (mKey_): one cast, compare and compaction of
    // the hits for up to four chunks, so only the misses' compactions and runs go by chunk.
    // UB: wSlot_ (the matches as float, then the hit slots, then the runs' stage), the upper half
    // of wWin_ (the hit slots as int16), mB_ / mC_; the sort region (a later token's new hits).
    __aicore__ inline void ClassifyGroup(uint32_t c0, uint32_t g, const LocalTensor<int32_t>& want,
                                         const LocalTensor<int16_t>& found16) {
        const uint32_t nc = ctx_.t_.nc, n = g * nc;
        const LocalTensor<int32_t> slots = ctx_.outSlots_[c0 * nc], hits = ctx_.wSlot_;
        const LocalTensor<float> foundF = ctx_.wSlot_.ReinterpretCast<float>();
        const LocalTensor<int16_t> hit16 = found16[n];          // the upper half of wWin_
        Cast(foundF, found16, RoundMode::CAST_NONE, n);   // the late lookup's writes: S_V there
        PipeBarrier<PIPE_V>();
        Cast(slots, foundF, RoundMode::CAST_RINT, n);
        avsg::CompareScalarAll(ctx_.mB_, foundF, 0.0f, CMPMODE::GE, n);    // hit
        avsg::CompareScalarAll(ctx_.mC_, foundF, 0.0f, CMPMODE::LT, n);    // not hit
        PipeBarrier<PIPE_V>();
        // miss = valid & not hit; a hit is valid (no matcher finds an invalid lane)
        And(ctx_.U16(ctx_.mC_), ctx_.U16(ctx_.mC_), ctx_.U16(ctx_.mKey_), n / 16);
        uint64_t nHit = 0;
        GatherMask(hits, slots, ctx_.U32(ctx_.mB_), true, n, GatherMaskParams(1, 1, 8, 0), nHit);
        PipeBarrier<PIPE_V>();
        Cast(hit16, hits, RoundMode::CAST_NONE, n);
        Sync<HardEvent::V_S>();
        ctx_.hits_ += static_cast<int64_t>(nHit);
        // the new hits of a group of later query tokens, nc at a time (UnmarkedHits' scratch)
        const uint32_t h = static_cast<uint32_t>(nHit);
        if (c0 * nc >= ctx_.t_.topk) {
            const LocalTensor<int16_t> fresh = ctx_.wKey_.ReinterpretCast<int16_t>()[4 * nc];
            for (uint32_t q = 0; q < h; q += nc) {
                if (q) Sync<HardEvent::S_V>();    // MarkHits' reads of `fresh` before it is rewritten
                ctx_.MarkHits(fresh, ctx_.UnmarkedHits(hits[q], hit16[q], MinU(nc, h - q), fresh));
            }
        } else {
            ctx_.MarkHits(hit16, h);
        }
        Sync<HardEvent::S_V>();                   // MarkHits' scalar reads before the runs' vector writes
        bool fenced = false;                      // the vector pipe is at a barrier
        for (uint32_t k = 0; k < g; ++k) {
            const uint32_t c = c0 + k;
            uint64_t nMiss = 0, nLanes = 0;
            if (!fenced) PipeBarrier<PIPE_V>();   // the previous chunk's run read vSlot_ / vT2_
            GatherMask(ctx_.vSlot_, want[k * nc], ctx_.U32(ctx_.mC_[k * nc / 8]), true, nc,
                       GatherMaskParams(1, 1, 8, 0), nMiss);
            GatherMask(ctx_.vT2_, ctx_.vLane_, ctx_.U32(ctx_.mC_[k * nc / 8]), true, nc,
                       GatherMaskParams(1, 1, 8, 0), nLanes);
            ctx_.lookups_ += static_cast<int64_t>(nMiss);
            ctx_.misses_ += static_cast<int64_t>(nMiss);
            missRuns_.len[c] = 0;
            runChunks_[c] = 1;
            PipeBarrier<PIPE_V>();
            fenced = RunMisses(c, static_cast<uint32_t>(nMiss), k + 1 == g, false);
        }
        ctx_.lookups_ += static_cast<int64_t>(nHit);
    }

    // Chunk c's misses (positions in vSlot_, their lanes in vT2_) into a sorted run: a run of its
    // own, or staged with the group's earlier chunks'; groupEnds closes the open run. scalarRead:
    // the scalar unit read UB since the last S_V (the run's vector writes wait for it). Returns
    // whether it ends at a barrier of the vector pipe (nothing issued, or a join last).
    __aicore__ inline bool RunMisses(uint32_t c, uint32_t misses, bool groupEnds, bool scalarRead) {
        const LocalTensor<uint32_t> lanes = ctx_.vT2_.ReinterpretCast<uint32_t>();
        // this chunk's run, or the open run a chunk without misses closes (its sort writes the
        // sort region too)
        if (scalarRead && (misses > 0 || (groupEnds && runFirst_ >= 0))) Sync<HardEvent::S_V>();
        bool fenced = true;
        if (misses > 0) {
            if (ctx_.split_ > 1 || misses > kRunSlot) {   // a run of its own: a split row's chunks
                CloseRun();                                // are not consecutive; too many to stage
                StoreRun(c, 1, ctx_.vSlot_, lanes, misses, misses);
                fenced = false;
            } else if (runFirst_ < 0 && groupEnds) {       // a run of this chunk alone: no staging
                StoreRun(c, 1, ctx_.vSlot_, lanes, misses, misses);
                fenced = false;
            } else {
                if (runFirst_ >= 0 && c - static_cast<uint32_t>(runFirst_) >= avsg::kPlanProbes) CloseRun();
                JoinRun(c, misses);               // ends with a barrier
            }
        }
        if (groupEnds && runFirst_ >= 0) {
            CloseRun();
            fenced = false;
        }
        return fenced;
    }

    // No run for any chunk yet (a row's start): a chunk's run is set when it is classified here
    // or, in a split row, folded from its part (PlanBlockSplit::FoldParts), so a chunk that
    // neither reaches (none, by the chunk-to-part mapping) merges as empty, not as a stale length.
    __aicore__ inline void ClearRuns() {
        for (uint32_t c = 0; c < ctx_.t_.numChunks; ++c) {
            missRuns_.len[c] = 0;
            runChunks_[c] = 1;
        }
        runFirst_ = -1;
    }

    // ---------------------------------------------------------------------- runs of a group
    // A sorted run costs a sort (a chain of 8 vector instructions, whatever its length) and a
    // copy, and each run is one more way for MergeMisses and one more copy each way for
    // OutputMisses: at T = 4 a chunk has a few misses. So the misses of up to kPlanProbes
    // consecutive chunks are staged in the upper half of wSlot_ (idle from a group's lookup to its
    // last chunk), chunk k of the run at lane k * kRunSlot (32 B aligned), the rest of the stage
    // holding a key above any position, and sorted once: the run's keys ascend, then the fillers.
    static constexpr uint32_t kRunSlot = avsg::kPlanChunk / avsg::kPlanProbes;
    __aicore__ inline LocalTensor<int32_t> RunKeys() { return ctx_.wSlot_[2 * ctx_.t_.nc]; }
    __aicore__ inline LocalTensor<int32_t> RunLanes() { return ctx_.wSlot_[3 * ctx_.t_.nc]; }
    __aicore__ inline void JoinRun(uint32_t c, uint32_t misses) {
        if (runFirst_ < 0) {
            runFirst_ = static_cast<int32_t>(c);
            runLen_ = 0;
            Duplicate(RunKeys(), kRunFiller, ctx_.t_.nc);
            PipeBarrier<PIPE_V>();
        }
        const uint32_t k = c - static_cast<uint32_t>(runFirst_);
        Adds(RunKeys()[k * kRunSlot], ctx_.vSlot_, 0, misses);
        Adds(RunLanes()[k * kRunSlot], ctx_.vT2_, static_cast<int32_t>(k * ctx_.t_.nc), misses);   // from the run's start
        PipeBarrier<PIPE_V>();
        runLen_ += misses;
        runSpan_ = k + 1;
    }
    __aicore__ inline void CloseRun() {
        if (runFirst_ < 0) return;
        const LocalTensor<uint32_t> lanes = RunLanes().ReinterpretCast<uint32_t>();
        StoreRun(static_cast<uint32_t>(runFirst_), runSpan_, RunKeys(), lanes, runSpan_ * kRunSlot, runLen_);
        runFirst_ = -1;
    }
    // Sorts `sorted` staged keys with their lanes and stores the first `len` as run c, which
    // covers chunks c .. c + chunks - 1.
    __aicore__ inline void StoreRun(uint32_t c, uint32_t chunks, const LocalTensor<int32_t>& keys,
                                    const LocalTensor<uint32_t>& lanes, uint32_t sorted, uint32_t len) {
        const uint32_t nc = ctx_.t_.nc;
        merge_.SortAscending(keys, sorted, &lanes);
        Sync<HardEvent::V_MTE3>();
        // the run's keys and lanes (sOutV_, then sOutI_ nc later: the sort region's last 2 nc
        // lanes, a view of them from sHalf_) in one copy
        const LocalTensor<int32_t> keysLanes = ctx_.sHalf_[2 * (avsg::kPlanSortVectors - 2) * nc]
                                                   .template ReinterpretCast<int32_t>();
        StoreIntPair(ctx_.rowWs_[ctx_.t_.wsMissOff + c * nc], keysLanes, len, nc,
                     ctx_.t_.wsRunLaneOff - ctx_.t_.wsMissOff);
        Sync<HardEvent::MTE3_V>();
        missRuns_.len[c] = len;
        runChunks_[c] = chunks;
    }
    // Scalar merge of the sorted miss runs with dedup -> miss_pos[0:M]. Returns M. Every run
    // entry's key is replaced by its index j in miss_pos (workspace, run layout): OutputMisses
    // turns it into the lane's reserved slot, miss_slots[j]. The misses here are the lanes no
    // probe found; each distinct one is looked up in the sorted stash on the way (both ascend): a
    // stash hit is a hit (hit bitmap, stats), its entries get -2 - slot instead of a j.
    __aicore__ inline uint32_t MergeMisses(uint32_t r) {
        const bool stash = stash_.stashRuns_.runs > 0;
        merge_.Configure(missRuns_, ctx_.t_.numChunks, ctx_.t_.wsMissOff, 0, true, 0, 0, 0, !stash);
        if (stash) merge_.Start(stash_.stashRuns_);
        merge_.Start(missRuns_);
        const uint64_t rowN = static_cast<uint64_t>(r) * ctx_.t_.outPitch;
        // The positions are staged in vWant_ and stored a chunk at a time. Where they are one
        // chunk (m <= nc: the usual few dozen misses), vWant_ and vMS_ are then what
        // LoadMisses(r, 0, m) would bring back (the tail lanes 0): the victims' installs read the
        // positions there and stage their slots in vMS_, with no reload.
        const LocalTensor<int32_t> stage = ctx_.vWant_;
        Duplicate(stage, 0, ctx_.t_.nc);
        Duplicate(ctx_.vMS_, 0, ctx_.t_.nc);
        Sync<HardEvent::V_S>();
        uint32_t m = 0, staged = 0;
        int32_t last = -1, code = -1;
        while (missRuns_.has) {
            const int32_t v = missRuns_.key;
            if (v != last) {
                last = v;
                const int32_t slot = stash ? stash_.StashSlot(v) : -1;
                if (slot >= 0) {
                    code = -2 - slot;
                    ctx_.SetWordBit(ctx_.hitBits_, static_cast<uint32_t>(slot));
                } else {
                    code = static_cast<int32_t>(m + staged);
                    stage.SetValue(staged++, v);
                    if (staged == ctx_.t_.nc) {
                        Sync<HardEvent::S_MTE3>();
                        StoreInts(ctx_.missPosGm_[rowN + m], stage, staged);
                        Sync<HardEvent::MTE3_S>();
                        m += staged;
                        staged = 0;
                    }
                }
            }
            if (code < 0) {   // a lane Classify counted as a miss
                ++ctx_.hits_;
                --ctx_.misses_;
            }
            merge_.Emit(missRuns_, code);
            merge_.Advance(missRuns_);
        }
        if (staged) {
            Sync<HardEvent::S_MTE3>();
            StoreInts(ctx_.missPosGm_[rowN + m], stage, staged);
            Sync<HardEvent::MTE3_S>();
            m += staged;
        }
        // several chunks: the stage holds the last one's, with stale lanes past it
        ctx_.missChunk_ = m <= ctx_.t_.nc ? 0 : -1;
        return m;
    }

    PlanMerger missRuns_;                    // the sorted miss runs: run c at chunk c (len 0: none)
    uint32_t runChunks_[avsg::kPlanMaxRuns];  // the chunks run c covers (c .. c + runChunks_[c] - 1)
    int32_t runFirst_ = -1;                  // the first chunk of the run being staged, -1: none
    uint32_t runLen_ = 0, runSpan_ = 0;      // its misses so far, its chunks so far
    static constexpr int32_t kRunFiller = 1 << 30;   // above any position: sorts after the run

    // the context and the blocks this one calls
    PlanContext& ctx_;
    PlanBlockMerge& merge_;
    PlanBlockStash& stash_;
};

}  // namespace avsg_kernel
