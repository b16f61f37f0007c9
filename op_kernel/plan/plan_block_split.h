// plan_block_split.h: the split lookup (hash plan, fewer rows than cores). Helper cores look up
// and classify their chunks of a row (PlanContext::FirstChunk, then every ChunkStride()-th:
// HelpRow) and leave their counts, run lengths and hit bits in the owner's workspace slice; one
// soft SyncAll (SyncParts) later the owner folds them in (FoldParts) and finishes the row alone.
// UB: vFoundI_ / wIdx_ (staging), hitBits_; GM: the owner's workspace slice and the SyncAll
// counters after the cores' slices.
#pragma once
#include "plan_block_output.h"

namespace avsg_kernel {

class PlanBlockSplit {
public:
    __aicore__ inline explicit PlanBlockSplit(PlanContext& ctx, PlanBlockProbe& probe, PlanBlockHashMatch& hashMatch,
                                              PlanBlockClassify& classify)
        : ctx_(ctx), probe_(probe), hashMatch_(hashMatch), classify_(classify) {}
    // Every core of a split launch calls this exactly once (rejected rows included): the soft
    // form (zeroed counters after the cores' slices, wIdx_ as its UB scratch) needs no mixed
    // kernel type. Its PipeBarrier<PIPE_ALL> completes the helpers' stores before the owner loads.
    __aicore__ inline void SyncParts() { ctx_.SyncAllBlocks(); }
    // Lookup part of a split row (helper core): its chunks looked up and classified as the owner
    // does its own; slots to the row's output, miss runs to the owner's workspace slice; then its
    // counts, run lengths and hit bitmap to its part region there. Reads of the row's state only.
    // The caller then meets the owner in SyncParts.
    __aicore__ inline void HelpRow(uint32_t r) {
        if (ctx_.StartRow(r) && !ctx_.IsIdle()) {   // the owner leaves out a rejected or idle row
            const uint32_t stride = ctx_.ChunkStride();
            for (uint32_t c = ctx_.FirstChunk(ctx_.part_); c < ctx_.t_.numChunks;) {   // only the hash plan splits a row
                const uint32_t g = hashMatch_.LookupGroup(r, c, stride);
                for (uint32_t k = 0; k < g; ++k, c += stride) classify_.Classify(r, c, hashMatch_.TakeChunk(c, k), true);
            }
            ctx_.HitBytesToBits();
            const LocalTensor<int32_t> head = ctx_.vFoundI_;
            const uint32_t headLen = avsg::kPlanPartHead + ctx_.t_.numChunks;
            Sync<HardEvent::MTE3_S>();            // Classify's store of vFoundI_ (write-after-read)
            Sync<HardEvent::V_S>();
            head.SetValue(0, static_cast<int32_t>(ctx_.lookups_));
            head.SetValue(1, static_cast<int32_t>(ctx_.hits_));
            head.SetValue(2, static_cast<int32_t>(ctx_.misses_));
            head.SetValue(3, 0);
            for (uint32_t c = 0; c < ctx_.t_.numChunks; ++c)
                head.SetValue(avsg::kPlanPartHead + c, static_cast<int32_t>(classify_.missRuns_.len[c]));
            const uint32_t off = ctx_.t_.wsPartOff + ctx_.part_ * ctx_.t_.partWords;
            Sync<HardEvent::S_MTE3>();
            StoreInts(ctx_.rowWs_[off], head, headLen);
            StoreInts(ctx_.rowWs_[off + avsg::RoundUp(headLen, 8)], ctx_.hitBits_.ReinterpretCast<int32_t>(),
                      ctx_.t_.capPad / 32);
            Sync<HardEvent::MTE3_S>();
            Sync<HardEvent::MTE3_V>();
        }
    }
    // Owner, after the SyncAll: the helpers' counts and run lengths, their hit bits or-ed in.
    // The parts' regions lie one after another in the owner's workspace slice (partWords each),
    // so one copy brings as many as the all-probe vector wIdx_ holds (the host splits only where
    // it holds one: op_host/state_host.cpp ApplySplit).
    __aicore__ inline void FoldParts() {
        const LocalTensor<int32_t> stage = ctx_.wIdx_;
        const LocalTensor<uint16_t> hit16 = ctx_.hitBits_.ReinterpretCast<uint16_t>();
        const uint32_t words = ctx_.t_.partWords;
        const uint32_t bitsOff = avsg::RoundUp(avsg::kPlanPartHead + ctx_.t_.numChunks, 8);
        const uint32_t perCopy = probe_.Wide() / words;
        for (uint32_t p0 = 1; p0 < ctx_.split_; p0 += perCopy) {
            const uint32_t parts = MinU(perCopy, ctx_.split_ - p0);
            Sync<HardEvent::S_MTE2>();
            Sync<HardEvent::V_MTE2>();            // the previous copy's parts or-ed in
            Sync<HardEvent::MTE3_MTE2>();
            LoadInts(stage, ctx_.rowWs_[ctx_.t_.wsPartOff + p0 * words], parts * words, 0);
            Sync<HardEvent::MTE2_S>();
            Sync<HardEvent::MTE2_V>();
            Sync<HardEvent::S_V>();               // the owner's scalar writes of the bitmap
            for (uint32_t k = 0; k < parts; ++k) {
                const LocalTensor<int32_t> head = stage[k * words];
                Or(hit16, hit16, stage[k * words + bitsOff].ReinterpretCast<uint16_t>(), ctx_.t_.capPad / 16);
                PipeBarrier<PIPE_V>();
                ctx_.lookups_ += head.GetValue(0);
                ctx_.hits_ += head.GetValue(1);
                ctx_.misses_ += head.GetValue(2);
                for (uint32_t c = ctx_.FirstChunk(p0 + k); c < ctx_.t_.numChunks; c += ctx_.ChunkStride())
                    classify_.missRuns_.len[c] = static_cast<uint32_t>(head.GetValue(avsg::kPlanPartHead + c));
            }
            Sync<HardEvent::V_S>();
        }
    }

    // the context and the blocks this one calls
    PlanContext& ctx_;
    PlanBlockProbe& probe_;
    PlanBlockHashMatch& hashMatch_;
    PlanBlockClassify& classify_;
};

}  // namespace avsg_kernel
