// plan_block_hash_match.h: the hash matcher. The row's selections are looked up in the hash
// index by their probes, a group of up to kPlanProbes chunks at a time (LookupGroup): on the wide
// vectors, probe 0 of the whole group and then the other probes of the few lanes probe 0 did not
// find, when bucket_slot and slot_pos are whole in UB; else one chunk at a time, all its probes at
// once, window by window (HashLookup). A lane no probe finds is looked up in the stash later, once
// per distinct miss, by MergeMisses.
// UB: reads the bucket_slot / slot_pos windows; writes vWant_/vWantF_/vFoundF_ (a chunk and its
// match, slot or -1 per lane), the wide vectors (wIdx_ and the lower half of wWin_ hold a group
// until its last chunk is taken), the nc-lane hash vectors and mKey_/mOwn_/mTmp_.
#pragma once
#include "plan_block_stash.h"

namespace avsg_kernel {

class PlanBlockHashMatch {
public:
    __aicore__ inline explicit PlanBlockHashMatch(PlanContext& ctx, PlanBlockProbe& probe) : ctx_(ctx), probe_(probe) {}
    // ---------------------------------------------------------------------- chunk groups
    // The lookup runs by group: LookupGroup looks up chunks c0, c0 + step, ... (at most
    // kPlanProbes of them: the row's chunks, or a split row's part), then TakeChunk hands each
    // chunk to Classify in vWant_ / vWantF_ / vFoundF_ as PrepareWant + HashLookup would have.
    // When bucket_slot and slot_pos are whole in UB (nwin == 1; every S <= 8192), a group is
    // looked up on the wide vectors (WideLookup: probe 0 of all its selections at once, the rest
    // of the probes only for the lanes probe 0 did not find); otherwise a group is one chunk,
    // looked up by HashLookup window by window.
    __aicore__ inline bool WideGroups() const {
        return ctx_.win_[avsg::SEC_BS].nwin == 1 && ctx_.win_[avsg::SEC_SP].nwin == 1;
    }
    // Returns the group's chunks.
    __aicore__ inline uint32_t LookupGroup(uint32_t r, uint32_t c0, uint32_t step) {
        if (!WideGroups()) {
            probe_.PrepareWant(r, c0);
            HashLookup();
            return 1;
        }
        uint32_t g = 0;
        for (uint32_t c = c0; c < ctx_.t_.numChunks && g < avsg::kPlanProbes; c += step) ++g;
        WideLookup(r, c0, step, g);
        return g;
    }
    // Chunk k of the group (the row's chunk c) -> vWant_ / vWantF_ / vFoundF_; returns its selections.
    __aicore__ inline uint32_t TakeChunk(uint32_t c, uint32_t k) {
        const uint32_t nc = ctx_.t_.nc;
        if (WideGroups()) {
            if (k > 0) Sync<HardEvent::S_V>();   // the previous chunk's Classify: its scalar reads
            Adds(ctx_.vWant_, GroupWant()[k * nc], 0, nc);
            Cast(ctx_.vWantF_, GroupWant()[k * nc], RoundMode::CAST_RINT, nc);
            Cast(ctx_.vFoundF_, GroupFound()[k * nc], RoundMode::CAST_NONE, nc);
            PipeBarrier<PIPE_V>();
        }
        return MinU(nc, ctx_.t_.N - c * nc);
    }

    // The group's selections (validated, -2 for invalid lanes; chunk k at k*nc) and their matches
    // (slot or -1, int16: S <= 2^15): live from WideLookup to the group's last TakeChunk, so they
    // sit where Classify never writes (wIdx_, the lower half of wWin_; plan_context.h).
    __aicore__ inline LocalTensor<int32_t> GroupWant() { return ctx_.wIdx_; }
    __aicore__ inline LocalTensor<int16_t> GroupFound() { return ctx_.wWin_.ReinterpretCast<int16_t>(); }

    // Wide lookup of g <= kPlanProbes chunks (g*nc lanes; the tail of a short last chunk is invalid).
    // Probe 0 of every selection at once: hash (first bucket only), Gather bucket_slot, clamp to
    // [0, S-1], Gather slot_pos, compare. The valid lanes it does not find (a few %: misses and
    // selections indexed at a later probe) are compacted (GatherMask) and looked up at probes
    // 1..kPlanProbes-1 by LateLookup, so the first matching probe wins (reference.index_lookup)
    // whatever the state holds. An invalid lane (-2) matches nothing, nor, in a split row, one
    // the owner drops (plan_block_drop.h).
    // Scratch: wSlot_, wTmp_ / wKey_ (the sort region), all of wWin_ until the group's matches are
    // written (its lower half holds them from then on), mKey_/mOwn_/mTmp_.
    __aicore__ inline void WideLookup(uint32_t r, uint32_t c0, uint32_t step, uint32_t g) {
        const uint32_t nc = ctx_.t_.nc, n = g * nc;   // a short group (a row's last, a split part) works its lanes only
        Win& bs = ctx_.win_[avsg::SEC_BS];
        Win& sp = ctx_.win_[avsg::SEC_SP];
        const LocalTensor<int32_t> want = GroupWant(), b = ctx_.wWin_, x = ctx_.wSlot_, y = ctx_.wTmp_;
        const LocalTensor<int32_t> z = ctx_.wKey_;
        const LocalTensor<float> wantF = y.ReinterpretCast<float>(), slotF = x.ReinterpretCast<float>();
        Sync<HardEvent::S_V>();                   // scalar writes of the windows, scalar reads of the last group
        ctx_.missChunk_ = -1;                     // vWant_ / vMS_ are scratch below
        ctx_.Ensure(bs, 0);
        ctx_.Ensure(sp, 0);
        // the selections: one load per run of consecutive chunks (-1 past a short last chunk)
        if (ctx_.t_.N % nc != 0) Duplicate(want, -1, n);
        Duplicate(z, static_cast<int32_t>(ctx_.t_.buckets - 1), n);   // x mod H (AndMask)
        Sync<HardEvent::V_MTE2>();
        const uint64_t rowN = static_cast<uint64_t>(r) * ctx_.t_.N;
        const uint32_t run = step == 1 ? g : 1;  // chunks per load: consecutive ones in one
        for (uint32_t k = 0; k < g; k += run) {
            const uint32_t c = c0 + k * step;
            LoadInts(want[k * nc], ctx_.topkGm_[rowN + c * nc], MinU(run * nc, ctx_.t_.N - c * nc), -1);
        }
        Sync<HardEvent::MTE2_V>();
        // validity: p if 0 <= p < bound else -2; mKey_ = valid (and below the split row's drop limit)
        Cast(wantF, want, RoundMode::CAST_RINT, n);
        PipeBarrier<PIPE_V>();
        avsg::CompareScalarAll(ctx_.mKey_, wantF, 0.0f, CMPMODE::GE, n);
        avsg::CompareScalarAll(ctx_.mTmp_, wantF, ctx_.boundF_, CMPMODE::LT, n);
        PipeBarrier<PIPE_V>();
        And(ctx_.U16(ctx_.mKey_), ctx_.U16(ctx_.mKey_), ctx_.U16(ctx_.mTmp_), n / 16);
        PipeBarrier<PIPE_V>();
        Select(wantF, ctx_.mKey_, wantF, -2.0f, SELMODE::VSEL_TENSOR_SCALAR_MODE, n);
        PipeBarrier<PIPE_V>();
        Cast(want, wantF, RoundMode::CAST_RINT, n);
        if (ctx_.split_ > 1 && ctx_.t_.dropPast) {
            avsg::CompareScalarAll(ctx_.mTmp_, wantF, ctx_.dropLimitF_, CMPMODE::LT, n);
            PipeBarrier<PIPE_V>();
            And(ctx_.U16(ctx_.mKey_), ctx_.U16(ctx_.mKey_), ctx_.U16(ctx_.mTmp_), n / 16);
        }
        PipeBarrier<PIPE_V>();
        // probe 0: b = first bucket, x = the slot it names (clamped, as float), z = the position that slot holds
        probe_.HashInto<false>({x, b, y, {}, z, {}, b, {}}, want, n);   // hmask: z
        SlotsAndOwners(b, y, z, slotF, n);
        avsg::CompareAll(ctx_.mOwn_, z, want, CMPMODE::EQ, n);
        PipeBarrier<PIPE_V>();
        And(ctx_.U16(ctx_.mOwn_), ctx_.U16(ctx_.mOwn_), ctx_.U16(ctx_.mKey_), n / 16);   // found at probe 0
        for (uint32_t k = 0; k < g; ++k) Adds(z[k * nc], ctx_.vLane_, static_cast<int32_t>(k * nc), nc);
        PipeBarrier<PIPE_V>();
        Select(slotF, ctx_.mOwn_, slotF, -1.0f, SELMODE::VSEL_TENSOR_SCALAR_MODE, n);   // the group's matches so far
        Not(ctx_.U16(ctx_.mTmp_), ctx_.U16(ctx_.mOwn_), n / 16);
        PipeBarrier<PIPE_V>();
        Cast(GroupFound(), slotF, RoundMode::CAST_RINT, n);
        And(ctx_.U16(ctx_.mTmp_), ctx_.U16(ctx_.mTmp_), ctx_.U16(ctx_.mKey_), n / 16);   // late: valid, not found
        PipeBarrier<PIPE_V>();
        // the late lanes' selections (y) and group lanes (x), in lane order
        uint64_t late = 0, lanes = 0;
        GatherMask(y, want, ctx_.U32(ctx_.mTmp_), true, n, GatherMaskParams(1, 1, 8, 0), late);
        GatherMask(x, z, ctx_.U32(ctx_.mTmp_), true, n, GatherMaskParams(1, 1, 8, 0), lanes);
        PipeBarrier<PIPE_V>();
        for (uint32_t j0 = 0; j0 < static_cast<uint32_t>(late); j0 += kLate)
            LateLookup(j0, MinU(kLate, static_cast<uint32_t>(late) - j0));
    }

    // The probe step both lookups share, on n lanes of whole sections: slotF = bucket_slot[bucket]
    // clamped to [0, S-1] (whatever the state holds) as float, owner = slot_pos[that slot].
    // off: scratch for the byte offsets (it may be `buckets` itself).
    __aicore__ inline void SlotsAndOwners(const LocalTensor<int32_t>& buckets, const LocalTensor<int32_t>& off,
                                          const LocalTensor<int32_t>& owner, const LocalTensor<float>& slotF,
                                          uint32_t n) {
        Win& bs = ctx_.win_[avsg::SEC_BS];
        Win& sp = ctx_.win_[avsg::SEC_SP];
        // bucket_slot's int16 entries land in owner's lanes (free until the second gather), widen
        // to float (exact) and are clamped there; the slot as int32 only for its byte offset
        const LocalTensor<int16_t> entry = owner.ReinterpretCast<int16_t>();
        ShiftLeft(off, buckets, 1, n);
        PipeBarrier<PIPE_V>();
        Gather(entry, bs.buf.ReinterpretCast<int16_t>(), off.ReinterpretCast<uint32_t>(), 0u, n);
        PipeBarrier<PIPE_V>();
        Cast(slotF, entry, RoundMode::CAST_NONE, n);
        PipeBarrier<PIPE_V>();
        Maxs(slotF, slotF, 0.0f, n);
        PipeBarrier<PIPE_V>();
        Mins(slotF, slotF, static_cast<float>(ctx_.SlotMax()), n);
        PipeBarrier<PIPE_V>();
        Cast(off, slotF, RoundMode::CAST_RINT, n);
        PipeBarrier<PIPE_V>();
        ShiftLeft(off, off, 2, n);
        PipeBarrier<PIPE_V>();
        Gather(owner, sp.buf, off.ReinterpretCast<uint32_t>(), 0u, n);
        PipeBarrier<PIPE_V>();
    }

    // Late lookup of the compacted lanes [j0, j0 + cnt) (cnt <= kLate; selections in wTmp_, lanes
    // in wSlot_, from WideLookup): probes 1..kPlanProbes-1 at once, in kLate-lane slices, the last
    // matching probe selected first so the first one wins. Each lane found is written to its
    // group lane (scalar: a few % of the selections). All kLate lanes are computed (the tail's
    // buckets and slots are masked and clamped like any other), only the first cnt written back.
    // Scratch: vWant_ / vWantF_ / vFoundI_ / vMS_ (hash), vFirst_ / vStride_, wKey_ (buckets, then
    // their slots), the upper half of wWin_ (positions, then the match), mOwn_.
    static constexpr uint32_t kLate = avsg::kPlanChunk / 2;   // a slice's mask is 32 B
    static constexpr uint32_t kLateProbes = avsg::kPlanProbes - 1;
    __aicore__ inline void LateLookup(uint32_t j0, uint32_t cnt) {
        const LocalTensor<int32_t> w = ctx_.wTmp_[j0], lanes = ctx_.wSlot_[j0];
        const LocalTensor<int32_t> bkt = ctx_.wKey_, slot = ctx_.wKey_[4 * kLate], maskOdd = ctx_.wKey_[7 * kLate];
        const LocalTensor<int32_t> owner = ctx_.wWin_[4 * kLate];
        const LocalTensor<float> found = ctx_.wWin_[7 * kLate].ReinterpretCast<float>();
        const LocalTensor<float> slotF = slot.ReinterpretCast<float>();
        const uint32_t n = kLateProbes * kLate;
        probe_.HashInto<true>({ctx_.vWant_, ctx_.vFoundI_, ctx_.vMS_, ctx_.vWantF_.ReinterpretCast<int32_t>(),
                               ctx_.vHMask_, maskOdd, ctx_.vFirst_, ctx_.vStride_},
                              w, kLate);
        for (uint32_t i = 0; i < kLateProbes; ++i)
            Muls(bkt[i * kLate], ctx_.vStride_, static_cast<int32_t>(i + 1), kLate);
        PipeBarrier<PIPE_V>();
        for (uint32_t i = 0; i < kLateProbes; ++i) Add(bkt[i * kLate], bkt[i * kLate], ctx_.vFirst_, kLate);
        PipeBarrier<PIPE_V>();
        for (uint32_t i = 0; i < kLateProbes; ++i) probe_.AndMask(bkt[i * kLate], bkt[i * kLate], ctx_.vHMask_, kLate);
        PipeBarrier<PIPE_V>();
        Duplicate(found, -1.0f, kLate);
        SlotsAndOwners(bkt, bkt, owner, slotF, n);
        for (uint32_t i = 0; i < kLateProbes; ++i)
            avsg::CompareAll(ctx_.mOwn_[i * kLate / 8], owner[i * kLate], w, CMPMODE::EQ, kLate);
        PipeBarrier<PIPE_V>();
        for (uint32_t i = kLateProbes; i-- > 0;) {
            Select(found, ctx_.mOwn_[i * kLate / 8], slotF[i * kLate], found, SELMODE::VSEL_TENSOR_TENSOR_MODE, kLate);
            PipeBarrier<PIPE_V>();
        }
        // the found lanes of [0, cnt) as lane << 16 | slot (lane < W <= 2^15, slot < 2^15), one
        // scalar load and one store each
        const LocalTensor<int32_t> foundI = bkt, packed = bkt[kLate], hits = bkt[2 * kLate];
        Cast(foundI, found, RoundMode::CAST_RINT, kLate);
        avsg::CompareScalarAll(ctx_.mTmp_, found, 0.0f, CMPMODE::GE, kLate);
        ShiftLeft(packed, lanes, 16, kLate);
        PipeBarrier<PIPE_V>();
        Add(packed, packed, foundI, kLate);
        PipeBarrier<PIPE_V>();
        uint64_t h = 0;
        GatherMask(hits, packed, ctx_.U32(ctx_.mTmp_), true, cnt, GatherMaskParams(1, 1, 8, 0), h);
        Sync<HardEvent::V_S>();
        const LocalTensor<int16_t> groupFound = GroupFound();
        for (uint32_t j = 0; j < static_cast<uint32_t>(h); ++j) {
            const int32_t v = hits.GetValue(j);
            groupFound.SetValue(static_cast<uint32_t>(v) >> 16, static_cast<int16_t>(v & 0xFFFF));
        }
        Sync<HardEvent::S_V>();
    }

    // ---------------------------------------------------------------------- windowed sections
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
        probe_.SplitBucketIdx(bs, ctx_.wIdx_);
        probe_.GatherBuckets(bs, ctx_.wSlot_, 0, ctx_.SlotMax());  // the slot each probe bucket names
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
        avsg::CompareScalarAll(ctx_.mKey_, ctx_.vWantF_, 0.0f, CMPMODE::GE, nc);
        if (ctx_.split_ > 1 && ctx_.t_.dropPast) {   // nor, in a split row, one the owner drops (drop block)
            avsg::CompareScalarAll(ctx_.mTmp_, ctx_.vWantF_, ctx_.dropLimitF_, CMPMODE::LT, nc);
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
