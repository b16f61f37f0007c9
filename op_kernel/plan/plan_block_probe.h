// plan_block_probe.h: the probe gather. A chunk of nc selections is loaded and validated
// (PrepareWant), hashed to its kPlanProbes probe buckets (Hash, Buckets, Probe), and the buckets'
// state entries are gathered for all probes at once, window by window (SplitIdx, MatchBits,
// GatherVals). Used by the hash matcher, the stash compaction, the insert and the reuse scores.
// UB: writes vWant_/vWantF_ (the chunk), vFirst_/vStride_ (its hash), wIdx_/wWin_ (lane offsets
// and windows), wSlot_/wTmp_ and the wide masks; reads the section windows.
#pragma once
#include "plan_context.h"

namespace avsg_kernel {

class PlanBlockProbe {
public:
    __aicore__ inline explicit PlanBlockProbe(PlanContext& ctx) : ctx_(ctx) {}
    // ---------------------------------------------------------------------- all-probe gathers
    // A lookup gathers for the kPlanProbes buckets of nc selections at once (W = kPlanProbes*nc
    // lanes), so a section split into windows has each window loaded at most once per chunk (and
    // the window left resident by the previous gather is served first, without a load), instead
    // of once per probe. Lanes are split once into (window id in wWin_, byte offset inside the
    // window in place of the index); for each window, every lane gathers at its in-window offset
    // (in bounds whatever its window) and only the lanes of that window are kept (mWin_).
    // Probe i of lane l sits at i * probeStride_ + l. The stride is nc, except inside the insert,
    // which narrows it to its misses rounded up to kPlanInsertStride (kPlanInsertWindowedStride
    // where bucket_slot has windows: fewer repeats for the usual few dozen misses); Wide() is the
    // vectors' capacity, ProbeLanes() the lanes in use.
    __aicore__ inline uint32_t Wide() const { return avsg::kPlanProbes * ctx_.t_.nc; }
    __aicore__ inline uint32_t ProbeLanes() const { return avsg::kPlanProbes * ctx_.probeStride_; }
    __aicore__ inline int32_t FirstWin(const Win& w) const { return w.cur < 0 ? 0 : w.cur; }
    // idx (W lanes, entries of section w) -> byte offsets inside their window (in place) and
    // window ids (wWin_, multi-window sections only). Scratch: wTmp_.
    __aicore__ inline void SplitIdx(const Win& w, const LocalTensor<int32_t>& idx) {
        const uint32_t n = ProbeLanes();
        if (w.nwin > 1) {
            ShiftRight(ctx_.wWin_, idx, static_cast<int32_t>(w.wlog), n);
            PipeBarrier<PIPE_V>();
            ShiftLeft(ctx_.wTmp_, ctx_.wWin_, static_cast<int32_t>(w.wlog), n);
            PipeBarrier<PIPE_V>();
            Sub(idx, idx, ctx_.wTmp_, n);
            PipeBarrier<PIPE_V>();
        }
        ShiftLeft(idx, idx, 2, n);
        PipeBarrier<PIPE_V>();
    }
    // dst (nc-bit slices of a W-bit mask) = wTmp_ == ref: one W-lane reference, or the nc-lane
    // selections repeated for every probe
    __aicore__ inline void CompareRef(const LocalTensor<uint8_t>& dst, const LocalTensor<int32_t>& ref, bool wideRef) {
        const uint32_t ps = ctx_.probeStride_;
        if (wideRef) {
            avsg::CompareAll(dst, ctx_.wTmp_, ref, CMPMODE::EQ, ProbeLanes());
            return;
        }
        for (uint32_t i = 0; i < avsg::kPlanProbes; ++i)
            avsg::CompareAll(dst[i * ps / 8], ctx_.wTmp_[i * ps], ref, CMPMODE::EQ, ps);
    }
    // acc (W bits) = section[lane] == ref, at the offsets in wIdx_ (from SplitIdx).
    __aicore__ inline void MatchBits(Win& w, const LocalTensor<int32_t>& ref, bool wideRef,
                                     const LocalTensor<uint8_t>& acc) {
        const uint32_t n = ProbeLanes();
        const LocalTensor<uint32_t> off = ctx_.wIdx_.ReinterpretCast<uint32_t>();
        if (w.nwin == 1) {
            ctx_.Ensure(w, 0);
            Gather(ctx_.wTmp_, w.buf, off, 0u, n);
            PipeBarrier<PIPE_V>();
            CompareRef(acc, ref, wideRef);
            PipeBarrier<PIPE_V>();
            return;
        }
        Duplicate(ctx_.U16(acc), static_cast<uint16_t>(0), n / 16);
        const int32_t first = FirstWin(w);
        for (uint32_t k = 0; k < w.nwin; ++k) {
            const int32_t id = static_cast<int32_t>((static_cast<uint32_t>(first) + k) % w.nwin);
            ctx_.Ensure(w, id);
            avsg::CompareScalarAll(ctx_.mWin_, ctx_.wWin_, id, CMPMODE::EQ, n);
            Gather(ctx_.wTmp_, w.buf, off, 0u, n);
            PipeBarrier<PIPE_V>();
            CompareRef(ctx_.mTmp_, ref, wideRef);
            PipeBarrier<PIPE_V>();
            And(ctx_.U16(ctx_.mTmp_), ctx_.U16(ctx_.mTmp_), ctx_.U16(ctx_.mWin_), n / 16);
            PipeBarrier<PIPE_V>();
            Or(ctx_.U16(acc), ctx_.U16(acc), ctx_.U16(ctx_.mTmp_), n / 16);
            PipeBarrier<PIPE_V>();
        }
    }
    // dst (W lanes) = clamp(section[lane], lo, hi), at the offsets in wIdx_ (from SplitIdx). The
    // clamp runs on the raw int32 values, so whatever the state holds, the result is a slot in
    // [0, S-1] or a key in [-1, 2^24]: several windows are then blended in float exactly (Select
    // is float-only on A2).
    __aicore__ inline void GatherVals(Win& w, const LocalTensor<int32_t>& dst, int32_t lo, int32_t hi) {
        const uint32_t n = ProbeLanes();
        const LocalTensor<uint32_t> off = ctx_.wIdx_.ReinterpretCast<uint32_t>();
        if (w.nwin == 1) {
            ctx_.Ensure(w, 0);
            Gather(dst, w.buf, off, 0u, n);
            PipeBarrier<PIPE_V>();
            ctx_.ClampInts(dst, lo, hi, n);
            return;
        }
        const LocalTensor<float> dstF = dst.ReinterpretCast<float>();
        const LocalTensor<float> tmpF = ctx_.wTmp_.ReinterpretCast<float>();
        const int32_t first = FirstWin(w);
        for (uint32_t k = 0; k < w.nwin; ++k) {
            const int32_t id = static_cast<int32_t>((static_cast<uint32_t>(first) + k) % w.nwin);
            ctx_.Ensure(w, id);
            Gather(ctx_.wTmp_, w.buf, off, 0u, n);
            if (k > 0) avsg::CompareScalarAll(ctx_.mWin_, ctx_.wWin_, id, CMPMODE::EQ, n);
            PipeBarrier<PIPE_V>();
            ctx_.ClampInts(ctx_.wTmp_, lo, hi, n);
            if (k == 0) {   // every lane takes the first window's value; later windows overwrite theirs
                Cast(dstF, ctx_.wTmp_, RoundMode::CAST_RINT, n);
                PipeBarrier<PIPE_V>();
                continue;
            }
            Cast(tmpF, ctx_.wTmp_, RoundMode::CAST_RINT, n);
            PipeBarrier<PIPE_V>();
            Select(dstF, ctx_.mWin_, tmpF, dstF, SELMODE::VSEL_TENSOR_TENSOR_MODE, n);
            PipeBarrier<PIPE_V>();
        }
        Cast(dst, dstF, RoundMode::CAST_RINT, n);
        PipeBarrier<PIPE_V>();
    }
    // bucket_slot's int16 entries (two per word, op_host/plan_tiling.h): bucket ids idx (W lanes)
    // -> byte offsets inside their window (in place) and window ids (wWin_, multi-window only);
    // a window of 2^wlog words holds 2^(wlog+1) entries. Scratch: wTmp_.
    __aicore__ inline void SplitBucketIdx(const Win& w, const LocalTensor<int32_t>& idx) {
        const uint32_t n = ProbeLanes();
        if (w.nwin > 1) {
            const int32_t entriesLog = static_cast<int32_t>(w.wlog) + 1;
            ShiftRight(ctx_.wWin_, idx, entriesLog, n);
            PipeBarrier<PIPE_V>();
            ShiftLeft(ctx_.wTmp_, ctx_.wWin_, entriesLog, n);
            PipeBarrier<PIPE_V>();
            Sub(idx, idx, ctx_.wTmp_, n);
            PipeBarrier<PIPE_V>();
        }
        ShiftLeft(idx, idx, 1, n);
        PipeBarrier<PIPE_V>();
    }
    // dst (W lanes) = clamp(bucket_slot[bucket], lo, hi) as int32, at the offsets in wIdx_ (from
    // SplitBucketIdx): the int16 entries widen through float, where every int16 is exact, so the
    // clamp after the windows' blend equals one on the raw entries. Several windows take half the
    // lanes at a time, so that the entries and their float values share wTmp_. Scratch: wTmp_.
    __aicore__ inline void GatherBuckets(Win& w, const LocalTensor<int32_t>& dst, int32_t lo, int32_t hi) {
        const uint32_t n = ProbeLanes();
        const LocalTensor<uint32_t> off = ctx_.wIdx_.ReinterpretCast<uint32_t>();
        const LocalTensor<float> dstF = dst.ReinterpretCast<float>();
        const LocalTensor<int16_t> entries = w.buf.template ReinterpretCast<int16_t>();
        if (w.nwin == 1) {
            const LocalTensor<int16_t> raw = ctx_.wTmp_.ReinterpretCast<int16_t>();
            ctx_.Ensure(w, 0);
            Gather(raw, entries, off, 0u, n);
            PipeBarrier<PIPE_V>();
            Cast(dstF, raw, RoundMode::CAST_NONE, n);
            PipeBarrier<PIPE_V>();
        } else {
            const uint32_t half = n / 2;
            const LocalTensor<float> tmpF = ctx_.wTmp_.ReinterpretCast<float>();            // bytes [0, 2n)
            const LocalTensor<int16_t> raw = ctx_.wTmp_[half].ReinterpretCast<int16_t>();   // bytes [2n, 3n)
            const int32_t first = FirstWin(w);
            for (uint32_t k = 0; k < w.nwin; ++k) {
                const int32_t id = static_cast<int32_t>((static_cast<uint32_t>(first) + k) % w.nwin);
                ctx_.Ensure(w, id);
                if (k > 0) avsg::CompareScalarAll(ctx_.mWin_, ctx_.wWin_, id, CMPMODE::EQ, n);
                for (uint32_t at = 0; at < n; at += half) {
                    PipeBarrier<PIPE_V>();    // the previous part's readers of wTmp_
                    Gather(raw, entries, off[at], 0u, half);
                    PipeBarrier<PIPE_V>();
                    if (k == 0) {             // every lane takes the first window's entry
                        Cast(dstF[at], raw, RoundMode::CAST_NONE, half);
                        continue;
                    }
                    Cast(tmpF, raw, RoundMode::CAST_NONE, half);
                    PipeBarrier<PIPE_V>();
                    Select(dstF[at], ctx_.mWin_[at / 8], tmpF, dstF[at], SELMODE::VSEL_TENSOR_TENSOR_MODE, half);
                }
            }
            PipeBarrier<PIPE_V>();
        }
        Maxs(dstF, dstF, static_cast<float>(lo), n);
        PipeBarrier<PIPE_V>();
        Mins(dstF, dstF, static_cast<float>(hi), n);
        PipeBarrier<PIPE_V>();
        Cast(dst, dstF, RoundMode::CAST_RINT, n);
        PipeBarrier<PIPE_V>();
    }
    // x & m on int32 lanes: And is 16-bit only on A2 (card §5), so both run as u16 with twice the
    // count; an int32 mask vector holding H-1 reads as [H-1, 0] per lane, i.e. x mod H.
    __aicore__ inline void AndMask(const LocalTensor<int32_t>& dst, const LocalTensor<int32_t>& x,
                                   const LocalTensor<int32_t>& mask, uint32_t n) {
        And(dst.ReinterpretCast<uint16_t>(), x.ReinterpretCast<uint16_t>(), mask.ReinterpretCast<uint16_t>(), 2 * n);
    }
    // The hash's operands: scratch t1, lo, hi (and t2, maskOdd with the stride), the x mod H mask
    // vector (hmask, n lanes) and the outputs; without the stride, first may be lo.
    struct HashVecs {
        LocalTensor<int32_t> t1, lo, hi, t2, hmask, maskOdd, first, stride;
    };
    // first bucket and odd stride of max(src, 0) (reference.probe_buckets); all products < 2^30.
    // With H = 2^m: lo = p & (H-1), hi = (p >> m) & (H-1), first = (lo*A1 + hi*B1) & (H-1),
    // stride = ((lo*A2 + hi*B2) & (H-2)) + 1, which is "mod H, then | 1". kStride = false: first only
    // (the wide lookup's probe 0).
    template <bool kStride>
    __aicore__ inline void HashInto(const HashVecs& v, const LocalTensor<int32_t>& src, uint32_t n) {
        const int32_t m = static_cast<int32_t>(ctx_.t_.logBuckets);
        Maxs(v.t1, src, 0, n);
        if constexpr (kStride) Duplicate(v.maskOdd, static_cast<int32_t>(ctx_.t_.buckets - 2), n);
        PipeBarrier<PIPE_V>();
        ShiftRight(v.hi, v.t1, m, n);
        AndMask(v.lo, v.t1, v.hmask, n);                  // lo = p mod H
        PipeBarrier<PIPE_V>();
        AndMask(v.hi, v.hi, v.hmask, n);                  // hi = (p >> m) mod H
        PipeBarrier<PIPE_V>();
        Muls(v.first, v.lo, static_cast<int32_t>(ctx_.t_.hashA1), n);
        Muls(v.t1, v.hi, static_cast<int32_t>(ctx_.t_.hashB1), n);
        if constexpr (kStride) {
            Muls(v.stride, v.lo, static_cast<int32_t>(ctx_.t_.hashA2), n);
            Muls(v.t2, v.hi, static_cast<int32_t>(ctx_.t_.hashB2), n);
        }
        PipeBarrier<PIPE_V>();
        Add(v.first, v.first, v.t1, n);
        if constexpr (kStride) Add(v.stride, v.stride, v.t2, n);
        PipeBarrier<PIPE_V>();
        AndMask(v.first, v.first, v.hmask, n);
        if constexpr (kStride) AndMask(v.stride, v.stride, v.maskOdd, n);
        PipeBarrier<PIPE_V>();
        if constexpr (kStride) {
            Adds(v.stride, v.stride, 1, n);
            PipeBarrier<PIPE_V>();
        }
    }
    // vFirst_ / vStride_ of src (n <= nc lanes); scratch: the nc-lane aliases in wWin_, and
    // wSlot_[3nc] (idle whenever Hash runs)
    __aicore__ inline void Hash(const LocalTensor<int32_t>& src, uint32_t n) {
        HashInto<true>({ctx_.vT1_, ctx_.vLo_, ctx_.vHi_, ctx_.vT2_, ctx_.vHMask_, ctx_.wSlot_[3 * ctx_.t_.nc],
                        ctx_.vFirst_, ctx_.vStride_},
                       src, n);
    }
    // vB = (first + i*stride) mod H: probe i of the nc selections hashed last
    __aicore__ inline void Probe(int32_t i, uint32_t n) {
        Muls(ctx_.vB_, ctx_.vStride_, i, n);
        PipeBarrier<PIPE_V>();
        Add(ctx_.vB_, ctx_.vB_, ctx_.vFirst_, n);
        PipeBarrier<PIPE_V>();
        AndMask(ctx_.vB_, ctx_.vB_, ctx_.vHMask_, n);
        PipeBarrier<PIPE_V>();
    }
    // wIdx[i*ps + l] = (first[l] + i*stride[l]) mod H for every probe i (first + 3*stride < 4H),
    // ps = probeStride_
    __aicore__ inline void Buckets() {
        const uint32_t ps = ctx_.probeStride_;
        Adds(ctx_.wIdx_, ctx_.vFirst_, 0, ps);
        for (uint32_t i = 1; i < avsg::kPlanProbes; ++i)
            Muls(ctx_.wIdx_[i * ps], ctx_.vStride_, static_cast<int32_t>(i), ps);
        PipeBarrier<PIPE_V>();
        for (uint32_t i = 1; i < avsg::kPlanProbes; ++i) Add(ctx_.wIdx_[i * ps], ctx_.wIdx_[i * ps], ctx_.vFirst_, ps);
        PipeBarrier<PIPE_V>();
        for (uint32_t i = 1; i < avsg::kPlanProbes; ++i)
            AndMask(ctx_.wIdx_[i * ps], ctx_.wIdx_[i * ps], ctx_.vHMask_, ps);
        PipeBarrier<PIPE_V>();
    }
    // Loads chunk c of the row's selections: vWant = p if 0 <= p < bound else -2, vWantF = float.
    __aicore__ inline uint32_t PrepareWant(uint32_t r, uint32_t c) {
        const uint32_t nc = ctx_.t_.nc;
        const uint32_t n = MinU(nc, ctx_.t_.N - c * nc);
        Sync<HardEvent::S_V>();   // AppendPending's scalar reads of vWant_ (write-after-read)
        ctx_.missChunk_ = -1;
        Duplicate(ctx_.vWant_, -1, nc);
        Sync<HardEvent::V_MTE2>();
        LoadInts(ctx_.vWant_, ctx_.topkGm_[static_cast<uint64_t>(r) * ctx_.t_.N + c * nc], n, -1);
        Sync<HardEvent::MTE2_V>();
        Cast(ctx_.vWantF_, ctx_.vWant_, RoundMode::CAST_RINT, nc);
        PipeBarrier<PIPE_V>();
        avsg::CompareScalarAll(ctx_.mA_, ctx_.vWantF_, 0.0f, CMPMODE::GE, nc);
        avsg::CompareScalarAll(ctx_.mB_, ctx_.vWantF_, ctx_.boundF_, CMPMODE::LT, nc);
        PipeBarrier<PIPE_V>();
        And(ctx_.U16(ctx_.mA_), ctx_.U16(ctx_.mA_), ctx_.U16(ctx_.mB_), nc / 16);
        PipeBarrier<PIPE_V>();
        Select(ctx_.vWantF_, ctx_.mA_, ctx_.vWantF_, -2.0f, SELMODE::VSEL_TENSOR_SCALAR_MODE, nc);
        PipeBarrier<PIPE_V>();
        Cast(ctx_.vWant_, ctx_.vWantF_, RoundMode::CAST_RINT, nc);
        PipeBarrier<PIPE_V>();
        return n;
    }

    // the context and the blocks this one calls
    PlanContext& ctx_;
};

}  // namespace avsg_kernel
