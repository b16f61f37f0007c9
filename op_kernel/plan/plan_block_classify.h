// plan_block_classify.h: classify. Per chunk, the match is split into hits (hit bitmap, stats)
// and misses (a sorted run in the workspace; the chunk's slots stored as they are), then the runs
// are merged with dedup into miss_pos, looking each distinct miss up in the sorted stash on the
// way (MergeMisses).
// UB: reads vWant_/vWantF_/vFoundF_; writes vFoundI_, hitBytes_ (hitBits_ in MergeMisses),
// vT1_/vT2_/vKey_/vSlot_ and the sort region. GM: slots, miss_pos, the workspace's miss runs and
// their lanes.
#pragma once
#include "plan_block_dual_match.h"

namespace avsg_kernel {

class PlanBlockClassify {
public:
    __aicore__ inline explicit PlanBlockClassify(PlanContext& ctx, PlanBlockMerge& merge, PlanBlockStash& stash)
        : ctx_(ctx), merge_(merge), stash_(stash) {}
    // Counts, hit bitmap and the chunk's sorted miss run (workspace run c). The match is stored
    // as the chunk's slots (final for hits and invalid lanes) with the run's lanes (the sort's
    // payload), so OutputMisses patches just the missed lanes.
    __aicore__ inline void Classify(uint32_t r, uint32_t c, uint32_t n) {
        const uint32_t nc = ctx_.t_.nc;
        Cast(ctx_.vFoundI_, ctx_.vFoundF_, RoundMode::CAST_RINT, nc);
        CompareScalar(ctx_.mA_, ctx_.vWantF_, 0.0f, CMPMODE::GE, nc);     // valid
        CompareScalar(ctx_.mB_, ctx_.vFoundF_, 0.0f, CMPMODE::GE, nc);    // hit
        CompareScalar(ctx_.mC_, ctx_.vFoundF_, 0.0f, CMPMODE::LT, nc);    // not hit
        PipeBarrier<PIPE_V>();
        And(ctx_.U16(ctx_.mC_), ctx_.U16(ctx_.mC_), ctx_.U16(ctx_.mA_), nc / 16);             // miss = valid & not hit
        PipeBarrier<PIPE_V>();
        uint64_t nValid = 0, nHit = 0, nMiss = 0, nLanes = 0;
        GatherMask(ctx_.vT1_, ctx_.vWant_, ctx_.U32(ctx_.mA_), true, nc, GatherMaskParams(1, 1, 8, 0), nValid);
        GatherMask(ctx_.vKey_, ctx_.vFoundI_, ctx_.U32(ctx_.mB_), true, nc, GatherMaskParams(1, 1, 8, 0), nHit);
        GatherMask(ctx_.vSlot_, ctx_.vWant_, ctx_.U32(ctx_.mC_), true, nc, GatherMaskParams(1, 1, 8, 0), nMiss);
        GatherMask(ctx_.vT2_, ctx_.vLane_, ctx_.U32(ctx_.mC_), true, nc, GatherMaskParams(1, 1, 8, 0), nLanes);
        // the hit slots as int16 (S <= 2^15), four per scalar load in MarkHits; all nc lanes, so
        // the count is read only after the sync
        const LocalTensor<int16_t> hit16 = ctx_.vT1_.ReinterpretCast<int16_t>();
        PipeBarrier<PIPE_V>();
        Cast(hit16, ctx_.vKey_, RoundMode::CAST_NONE, nc);
        Sync<HardEvent::V_S>();
        ctx_.lookups_ += static_cast<int64_t>(nValid);
        ctx_.hits_ += static_cast<int64_t>(nHit);
        ctx_.misses_ += static_cast<int64_t>(nMiss);
        // reuse: heat and counts follow from the final bitmap (HeatUsed, CountHits)
        if (c * nc >= ctx_.t_.topk && nHit > 0) {   // a later query token: mark only the new slots
            const LocalTensor<int16_t> fresh = ctx_.wKey_.ReinterpretCast<int16_t>()[4 * nc];
            ctx_.MarkHits(fresh, ctx_.UnmarkedHits(ctx_.vKey_, hit16, static_cast<uint32_t>(nHit), fresh));
        } else {
            ctx_.MarkHits(hit16, static_cast<uint32_t>(nHit));
        }
        missRuns_.len[c] = static_cast<uint32_t>(nMiss);
        Sync<HardEvent::V_MTE3>();
        StoreInts(ctx_.slotsGm_[static_cast<uint64_t>(r) * ctx_.t_.outPitch + c * nc], ctx_.vFoundI_, n);
        if (nMiss == 0) Sync<HardEvent::MTE3_V>();
        if (nMiss == 0) return;
        Sync<HardEvent::S_V>();
        const LocalTensor<uint32_t> lanes = ctx_.vT2_.ReinterpretCast<uint32_t>();
        merge_.SortAscending(ctx_.vSlot_, static_cast<uint32_t>(nMiss), &lanes);
        Sync<HardEvent::V_MTE3>();
        // the run's keys and lanes (sOutV_, then sOutI_ nc later: the sort region's last 2 nc
        // lanes, a view of them from sHalf_) in one copy
        const LocalTensor<int32_t> keysLanes = ctx_.sHalf_[2 * (avsg::kPlanSortVectors - 2) * nc]
                                                   .template ReinterpretCast<int32_t>();
        StoreIntPair(ctx_.rowWs_[ctx_.t_.wsMissOff + c * nc], keysLanes, static_cast<uint32_t>(nMiss), nc,
                     ctx_.t_.wsRunLaneOff - ctx_.t_.wsMissOff);
        Sync<HardEvent::MTE3_V>();
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
                    ctx_.vT1_.SetValue(staged++, v);
                    if (staged == ctx_.t_.nc) {
                        Sync<HardEvent::S_MTE3>();
                        StoreInts(ctx_.missPosGm_[rowN + m], ctx_.vT1_, staged);
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
            StoreInts(ctx_.missPosGm_[rowN + m], ctx_.vT1_, staged);
            Sync<HardEvent::MTE3_S>();
            m += staged;
        }
        return m;
    }

    PlanMerger missRuns_;                    // the chunks' sorted miss runs

    // the context and the blocks this one calls
    PlanContext& ctx_;
    PlanBlockMerge& merge_;
    PlanBlockStash& stash_;
};

}  // namespace avsg_kernel
