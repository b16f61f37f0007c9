// plan_kernel.h: AscendC (Atlas A2 AIV) kernels of plan, plan_dual_pointer, invalidate, reset.
// Specification: python/avsg/reference.py (state layout, hash, lookup, stash, lifetime, victims,
// insert rounds, outputs, stats). Tiling: op_host/plan_tiling.h.
//
// Work split: with rows * 2 > cores (or the dual pointer), core c handles rows c, c+numBlocks,
// ... : a row's state, outputs, stats and the core's workspace are written by that core only (no
// GM atomics, no shared 64 B lines written by two cores except through exact-byte DataCopyPad
// stores). With fewer rows the hash plan splits each row's lookup (step 1 and the per-chunk part
// of step 2, 35-45% of a row's modelled time at K 2048) over split = min(cores / rows, chunks)
// cores: core b works on row b % rows as part b / rows; part 0 owns the row and does everything
// else. Helpers check the row's header themselves (a rejected row is skipped by every part),
// look up chunks part, part + split, ..., store the chunks' slots to the row's output and their
// sorted miss runs to the owner's workspace slice (DMA only: scalar GM goes through the
// non-coherent DCache), then their counts, run lengths and hit bitmap to their part region there.
// One soft SyncAll (counters after the slices, zeroed by the host per launch; no mixed kernel
// type needed), called exactly once by every core, separates the parts from the owner's fold
// (counts summed, bitmaps or-ed) and step 2's merge. During the lookup the owner writes no GM
// that a helper reads: helpers read bucket_key, bucket_slot and slot_pos only, the owner's
// prologue writes the stash and the heat, and it frees the padding slots (slot_pos) after the
// SyncAll. The reuse policy's heat comes from the final bitmap and miss list (HeatUsed), so
// nothing per hit stays with the owner but one bit.
// Per row (hash matcher; the dual pointer differs in step 1's match: the row's selections and
// resident slots sorted and walked once with two pointers, no hash and no stash lookup):
//   0. stash compaction #1 (scalar; before the lookup, see below)
//   1. refresh: per chunk of NC selections: validity (Cast->float, Compares GE/LT, And on u16,
//      Select, Cast back), hash (shifts, u16 And against H-1, Muls/Add), then the 4 probes of
//      the chunk at once (4*NC lanes, HashLookup): Gather bucket_key -> match bits, Gather
//      bucket_slot, Gather slot_pos[slot] -> match bits, window by window (each window of a
//      split section loaded at most once per chunk, the resident one first). Hit slots -> hit
//      bitmap; the chunk's result is stored as its slots.
//   2. classify: GatherMask compaction of the chunk's misses, Cast->float, Sort + Extract
//      (ascending by negating; lanes as payload), run to GM workspace; scalar k-way merge (loser
//      tree) with dedup -> miss_pos (and each run entry's index in it). The stash, sorted once per
//      row (Sort in nc-entry runs), is merged along: a miss found there is a hit after all.
//      Reuse: block heat from the hit bitmap (used slots' positions, per nc-slot chunk, sorted)
//      and the sorted misses: run lengths of equal block ids by vector compare + GatherMask, one
//      scalar update per heated block. Then one pass over slot_life: decay (Mins/Adds/Max) +
//      hits to L (Not + Select).
//   3. allocate: for life level -1..L-1: Compares EQ + GatherMask over slot ids (victims in
//      (life, slot) order) until M -> miss_slots; scalar scatter slot_pos / slot_life;
//      insert: freeness of all 4 buckets of every miss (all-probe gathers), 4 scalar rounds
//      (lowest-j claims, winner bits), winners written window by window (GatherMask lists);
//      stash compaction #2 + append (scalar).
//   4. output: missed lanes get miss_slots[j] (OutputMisses), patched into the stored chunks;
//      stats via 32 B DMA of the int64 row.
// Whatever the state holds (reference.py, "Whatever the state holds"): the row's header must
// match the tiling (else the row is left untouched, miss_counts[r] = -1); stash_count is clamped
// to [0, S]; every slot read from bucket_slot / stash_slot is clamped to [0, S-1] before it
// addresses a window or is returned; padding slots are reset to -1 and lives clamped to [-1, L-1]
// in the decay, so Allocate always finds M victims among the unpinned slots; the stash never
// grows past S entries. No state content can move an index outside the row's sections.
// Stash compaction #1 runs before the lookup instead of after it: it drops exactly the entries
// the lookup's validity test ignores, and nothing the lookup reads changes in between, so the
// lookup result is the reference's.
#pragma once
#include "kernel_operator.h"
#include "kernel_compat.h"
#include "plan_tiling.h"

namespace avsg_kernel {
using namespace AscendC;
using avsg::PlanTiling;

template <HardEvent E>
__aicore__ inline void Sync() {
    TEventID id = GetTPipePtr()->FetchEventID(E);
    SetFlag<E>(id);
    WaitFlag<E>(id);
}

__aicore__ inline uint32_t MinU(uint32_t a, uint32_t b) { return a < b ? a : b; }
// Index of the lowest set bit of x != 0 (plain scalar arithmetic, 5 steps).
__aicore__ inline uint32_t LowestBit(uint32_t x) {
    uint32_t n = 0;
    if ((x & 0xFFFFu) == 0) { n += 16; x >>= 16; }
    if ((x & 0xFFu) == 0) { n += 8; x >>= 8; }
    if ((x & 0xFu) == 0) { n += 4; x >>= 4; }
    if ((x & 0x3u) == 0) { n += 2; x >>= 2; }
    if ((x & 0x1u) == 0) n += 1;
    return n;
}

// Tiling: DMA it into its own UB buffer (the first one the kernel carves), wait MTE2 -> S, read
// the words from UB. A scalar GlobalTensor::GetValue would go through the core's non-coherent
// DCache (card §2, §8.11): the tiling's GM address is reused by later calls with another
// geometry, so a stale line could hand this core wrong offsets. DMA never goes through the DCache.
__aicore__ inline void LoadTiling(TPipe* pipe, TBuf<TPosition::VECCALC>& buf, PlanTiling& t, GM_ADDR tiling) {
    constexpr uint32_t kWords = sizeof(PlanTiling) / 4;
    GlobalTensor<uint32_t> g;
    g.SetGlobalBuffer(reinterpret_cast<__gm__ uint32_t*>(tiling), kWords);
    pipe->InitBuffer(buf, avsg::kPlanTilingUbBytes);
    LocalTensor<uint32_t> ub = buf.Get<uint32_t>();
    DataCopyPad(ub, g, DataCopyExtParams(1, static_cast<uint32_t>(sizeof(PlanTiling)), 0, 0, 0),
                DataCopyPadExtParams<uint32_t>(false, 0, 0, 0));
    Sync<HardEvent::MTE2_S>();
    uint32_t* dst = reinterpret_cast<uint32_t*>(&t);
    for (uint32_t i = 0; i < kWords; ++i) dst[i] = ub.GetValue(i);
}

// One UB window over a state section of the current row (software-managed, write-back).
struct Win {
    LocalTensor<int32_t> buf;
    GlobalTensor<int32_t> gm;
    uint32_t len = 0, wlog = 0, wlen = 0, nwin = 1;
    int32_t cur = -1;
    bool dirty = false;
};

// ------------------------------------------------------------------------------------ plan
template <bool kDual>
class PlanKernel {
public:
    __aicore__ inline PlanKernel() {}

    __aicore__ inline void Init(TPipe* pipe, GM_ADDR topk, GM_ADDR seq, GM_ADDR state, GM_ADDR stats,
                                GM_ADDR slots, GM_ADDR missPos, GM_ADDR missSlots, GM_ADDR missCounts,
                                GM_ADDR workspace, GM_ADDR tiling) {
        LoadTiling(pipe, tilingBuf_, t_, tiling);   // first buffer: UB offset 0
        const uint64_t R = t_.rows, N = t_.N;
        topkGm_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(topk), R * N);
        seqGm_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(seq), R);
        stateGm_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(state), R * t_.width);
        statsGm_.SetGlobalBuffer(reinterpret_cast<__gm__ int64_t*>(stats), R * 4);
        slotsGm_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(slots), R * N);
        missPosGm_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(missPos), R * N);
        missSlotsGm_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(missSlots), R * N);
        missCountsGm_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(missCounts), R);
        wsGm_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(workspace) +
                                  static_cast<uint64_t>(GetBlockIdx()) * t_.wsPerCore,
                              t_.wsPerCore);
        wsBase_ = reinterpret_cast<__gm__ int32_t*>(workspace);
        rowWs_ = wsGm_;
        split_ = kDual ? 1u : t_.split;

        const uint32_t nc = t_.nc;
        // The Sort operands (sort region, and the wide vectors that carry Sort payloads) need
        // Sort32's alignment (dst 256 B, sources 128 B), which TPipe does not promise: its pool
        // base is not ours. One buffer with slack, cut at the first 256 B boundary.
        const uint32_t wide = avsg::kPlanProbes * nc;
        const uint32_t sortBytes = avsg::kPlanSortVectors * nc * 4, wideBytes = wide * 4;
        pipe->InitBuffer(alignedBuf_, sortBytes + avsg::kPlanWideVectors * wideBytes + avsg::kPlanSortAlignSlack);
        const uint32_t alignPad = static_cast<uint32_t>(
            (avsg::kPlanSortAlign - avsg::UbAddr(alignedBuf_.Get<uint8_t>()) % avsg::kPlanSortAlign) %
            avsg::kPlanSortAlign);
        for (uint32_t i = 0; i < avsg::kPlanVectors; ++i) pipe->InitBuffer(vecBuf_[i], nc * 4);
        for (uint32_t i = 0; i < avsg::kPlanMasks; ++i) pipe->InitBuffer(maskBuf_[i], avsg::RoundUp(wide / 8, 32));
        pipe->InitBuffer(hitBuf_, avsg::RoundUp(t_.capPad / 8, 32));
        pipe->InitBuffer(claimBuf_, avsg::RoundUp(t_.buckets / 8, 32));
        pipe->InitBuffer(pendBuf_, avsg::RoundUp(t_.pendWords * 4, 32));
        pipe->InitBuffer(headBuf_, 2 * avsg::kPlanMaxRuns * avsg::kPlanHeadLen * 4);
        pipe->InitBuffer(treeBuf_, 2 * avsg::kPlanMaxRuns * 4);
        pipe->InitBuffer(statsBuf_, 32);
        pipe->InitBuffer(scalarBuf_, 32);
        pipe->InitBuffer(headerBuf_, 64);
        for (uint32_t s = 0; s < avsg::SEC_COUNT; ++s) {
            win_[s].len = t_.secLen[s];
            win_[s].wlog = t_.winLog[s];
            win_[s].wlen = t_.winLen[s];
            win_[s].nwin = 0;
            if (t_.winLen[s] == 0) continue;   // a policy section the lifetime policy lacks
            pipe->InitBuffer(winBuf_[s], t_.winLen[s] * 4);
            win_[s].buf = winBuf_[s].Get<int32_t>();
            win_[s].nwin = (t_.secLen[s] + t_.winLen[s] - 1) / t_.winLen[s];
        }
        reuse_ = t_.policy == avsg::kPolicyReuse;
        lru_ = t_.policy == avsg::kPolicyLru;
        // nc-element vectors that live across the steps of a chunk or a row
        vWant_ = V(0); vWantF_ = VF(1); vFirst_ = V(2); vStride_ = V(3);
        vFoundF_ = VF(4); vFoundI_ = V(5); vMS_ = V(6); vLane_ = V(7); vHMask_ = V(8);
        // all-probe vectors: lane (probe i, selection l) at i*nc + l
        LocalTensor<float> sb = alignedBuf_.GetWithOffset<float>(avsg::kPlanSortVectors * nc, alignPad);
        wIdx_ = alignedBuf_.GetWithOffset<int32_t>(wide, alignPad + sortBytes);
        wWin_ = alignedBuf_.GetWithOffset<int32_t>(wide, alignPad + sortBytes + wideBytes);
        wSlot_ = alignedBuf_.GetWithOffset<int32_t>(wide, alignPad + sortBytes + 2 * wideBytes);
        wTmp_ = sb.template ReinterpretCast<int32_t>();   // the sort region holds two wide vectors
        wKey_ = wTmp_[wide];                              // while no sort runs
        wIdx_.SetSize(wide); wWin_.SetSize(wide); wSlot_.SetSize(wide); wTmp_.SetSize(wide); wKey_.SetSize(wide);
        // short-lived nc-element scratch, aliased into wide vectors that are idle whenever these
        // are used (hash temporaries before the wide gathers; the rest outside the lookups)
        vLo_ = wWin_; vHi_ = wWin_[nc]; vT1_ = wWin_[2 * nc]; vT2_ = wWin_[3 * nc];
        vB_ = wIdx_; vTmpF_ = wIdx_[nc].template ReinterpretCast<float>();
        vKey_ = wSlot_; vSlot_ = wSlot_[nc];
        mKey_ = maskBuf_[0].Get<uint8_t>(); mOwn_ = maskBuf_[1].Get<uint8_t>();
        mWin_ = maskBuf_[2].Get<uint8_t>(); mTmp_ = maskBuf_[3].Get<uint8_t>();
        mA_ = mWin_; mB_ = mTmp_; mC_ = mOwn_;   // nc-bit masks of the per-chunk steps
        CreateVecIndex(vLane_, 0, nc);            // lane ids, read by Classify's compaction
        Duplicate(vHMask_, static_cast<int32_t>(t_.buckets - 1), nc);   // x mod H (AndMask)
        PipeBarrier<PIPE_V>();
        ascendc_assert(avsg::UbAddr(sb) % avsg::kPlanSortAlign == 0);
        sConcat_ = sb[0];
        sIdx_ = sb[nc].template ReinterpretCast<uint32_t>();
        sDst_ = sb[2 * nc];
        sTmp_ = sb[4 * nc];
        sOutV_ = sb[6 * nc];
        sOutI_ = sb[7 * nc].template ReinterpretCast<uint32_t>();
        sConcat_.SetSize(nc); sIdx_.SetSize(nc); sDst_.SetSize(2 * nc); sTmp_.SetSize(2 * nc);
        sOutV_.SetSize(nc); sOutI_.SetSize(nc);
        hitBits_ = hitBuf_.Get<uint32_t>();
        claimBits_ = claimBuf_.Get<uint32_t>();
        pendBits_ = pendBuf_.Get<uint32_t>();
        heads_ = headBuf_.Get<int32_t>();
        treeUb_ = treeBuf_.Get<int32_t>();
        statsUb_ = statsBuf_.Get<int64_t>();
        scalarUb_ = scalarBuf_.Get<int32_t>();
        headerUb_ = headerBuf_.Get<int32_t>();
        countUb_ = headerUb_[avsg::kHeaderStashCount];   // the header's second 32 B block
    }

    __aicore__ inline void Process() {
        const uint32_t blocks = static_cast<uint32_t>(GetBlockNum());
        if (split_ > 1) {                         // one (row, part) per core: rows * split blocks
            const uint32_t b = static_cast<uint32_t>(GetBlockIdx());
            part_ = b / t_.rows;
            rowWs_.SetGlobalBuffer(wsBase_ + static_cast<uint64_t>(b % t_.rows) * t_.wsPerCore, t_.wsPerCore);
            if (part_ == 0) Row(b % t_.rows);
            else HelpRow(b % t_.rows);
            return;
        }
        for (uint32_t r = static_cast<uint32_t>(GetBlockIdx()); r < t_.rows; r += blocks) Row(r);
    }

private:
    // ---------------------------------------------------------------------- helpers
    __aicore__ inline LocalTensor<int32_t> V(int i) { return vecBuf_[i].Get<int32_t>(); }
    __aicore__ inline LocalTensor<float> VF(int i) { return vecBuf_[i].Get<float>(); }
    __aicore__ inline LocalTensor<uint16_t> U16(const LocalTensor<uint8_t>& m) {
        return m.ReinterpretCast<uint16_t>();
    }
    __aicore__ inline LocalTensor<uint32_t> U32(const LocalTensor<uint8_t>& m) {
        return m.ReinterpretCast<uint32_t>();
    }
    __aicore__ inline bool WordBit(const LocalTensor<uint32_t>& w, uint32_t q) {
        return ((w.GetValue(q >> 5) >> (q & 31)) & 1u) != 0;
    }
    __aicore__ inline void SetWordBit(const LocalTensor<uint32_t>& w, uint32_t q) {
        w.SetValue(q >> 5, w.GetValue(q >> 5) | (1u << (q & 31)));
    }

    // GM <-> UB for ragged int32 runs (exact bytes; UB tail padded with `pad`).
    __aicore__ inline void LoadInts(const LocalTensor<int32_t>& dst, const GlobalTensor<int32_t>& src, uint32_t n,
                                    int32_t pad) {
        if (n == 0) return;
        uint8_t right = static_cast<uint8_t>((8 - n % 8) % 8);
        DataCopyExtParams p(1, n * 4, 0, 0, 0);
        DataCopyPadExtParams<int32_t> padp(true, 0, right, pad);
        DataCopyPad(dst, src, p, padp);
    }
    __aicore__ inline void StoreInts(const GlobalTensor<int32_t>& dst, const LocalTensor<int32_t>& src, uint32_t n) {
        if (n == 0) return;
        DataCopyExtParams p(1, n * 4, 0, 0, 0);
        DataCopyPad(dst, src, p);
    }

    // ---------------------------------------------------------------------- windows
    __aicore__ inline uint32_t WinCount(const Win& w, int32_t id) {
        return MinU(w.wlen, w.len - static_cast<uint32_t>(id) * w.wlen);
    }
    __aicore__ inline void Flush(Win& w) {
        if (!w.dirty) return;
        Sync<HardEvent::V_MTE3>();
        Sync<HardEvent::S_MTE3>();
        DataCopy(w.gm[static_cast<uint32_t>(w.cur) * w.wlen], w.buf, WinCount(w, w.cur));
        Sync<HardEvent::MTE3_MTE2>();
        Sync<HardEvent::MTE3_V>();
        Sync<HardEvent::MTE3_S>();
        w.dirty = false;
    }
    __aicore__ inline void Ensure(Win& w, int32_t id) {
        if (w.cur == id) return;
        Flush(w);
        Sync<HardEvent::V_MTE2>();
        Sync<HardEvent::S_MTE2>();
        DataCopy(w.buf, w.gm[static_cast<uint32_t>(id) * w.wlen], WinCount(w, id));
        Sync<HardEvent::MTE2_V>();
        Sync<HardEvent::MTE2_S>();
        w.cur = id;
    }
    __aicore__ inline int32_t Get(Win& w, uint32_t idx) {
        int32_t id = static_cast<int32_t>(idx >> w.wlog);
        Ensure(w, id);
        return w.buf.GetValue(idx - static_cast<uint32_t>(id) * w.wlen);
    }
    __aicore__ inline void Put(Win& w, uint32_t idx, int32_t v) {
        int32_t id = static_cast<int32_t>(idx >> w.wlog);
        Ensure(w, id);
        w.buf.SetValue(idx - static_cast<uint32_t>(id) * w.wlen, v);
        w.dirty = true;
    }
    __aicore__ inline void BindRow(uint32_t r) {
        const uint64_t base = static_cast<uint64_t>(r) * t_.width;
        for (uint32_t s = 0; s < avsg::SEC_COUNT; ++s) {
            win_[s].gm = stateGm_[base + t_.secOff[s]];
            win_[s].cur = -1;
            win_[s].dirty = false;
        }
    }

    // ---------------------------------------------------------------------- all-probe gathers
    // A lookup gathers for the kPlanProbes buckets of nc selections at once (W = kPlanProbes*nc
    // lanes), so a section split into windows has each window loaded at most once per chunk (and
    // the window left resident by the previous gather is served first, without a load), instead
    // of once per probe. Lanes are split once into (window id in wWin_, byte offset inside the
    // window in place of the index); for each window, every lane gathers at its in-window offset
    // (in bounds whatever its window) and only the lanes of that window are kept (mWin_).
    __aicore__ inline uint32_t Wide() const { return avsg::kPlanProbes * t_.nc; }
    __aicore__ inline int32_t FirstWin(const Win& w) const { return w.cur < 0 ? 0 : w.cur; }

    // idx (W lanes, entries of section w) -> byte offsets inside their window (in place) and
    // window ids (wWin_, multi-window sections only). Scratch: wTmp_.
    __aicore__ inline void SplitIdx(const Win& w, const LocalTensor<int32_t>& idx) {
        const uint32_t n = Wide();
        if (w.nwin > 1) {
            ShiftRight(wWin_, idx, static_cast<int32_t>(w.wlog), n);
            PipeBarrier<PIPE_V>();
            ShiftLeft(wTmp_, wWin_, static_cast<int32_t>(w.wlog), n);
            PipeBarrier<PIPE_V>();
            Sub(idx, idx, wTmp_, n);
            PipeBarrier<PIPE_V>();
        }
        ShiftLeft(idx, idx, 2, n);
        PipeBarrier<PIPE_V>();
    }
    // dst (nc-bit slices of a W-bit mask) = wTmp_ == ref: one W-lane reference, or the nc-lane
    // selections repeated for every probe
    __aicore__ inline void CompareRef(const LocalTensor<uint8_t>& dst, const LocalTensor<int32_t>& ref, bool wideRef) {
        const uint32_t nc = t_.nc;
        if (wideRef) {
            Compare(dst, wTmp_, ref, CMPMODE::EQ, Wide());
            return;
        }
        for (uint32_t i = 0; i < avsg::kPlanProbes; ++i) Compare(dst[i * nc / 8], wTmp_[i * nc], ref, CMPMODE::EQ, nc);
    }
    // acc (W bits) = section[lane] == ref, at the offsets in wIdx_ (from SplitIdx).
    __aicore__ inline void MatchBits(Win& w, const LocalTensor<int32_t>& ref, bool wideRef,
                                     const LocalTensor<uint8_t>& acc) {
        const uint32_t n = Wide();
        const LocalTensor<uint32_t> off = wIdx_.ReinterpretCast<uint32_t>();
        if (w.nwin == 1) {
            Ensure(w, 0);
            Gather(wTmp_, w.buf, off, 0u, n);
            PipeBarrier<PIPE_V>();
            CompareRef(acc, ref, wideRef);
            PipeBarrier<PIPE_V>();
            return;
        }
        Duplicate(U16(acc), static_cast<uint16_t>(0), n / 16);
        const int32_t first = FirstWin(w);
        for (uint32_t k = 0; k < w.nwin; ++k) {
            const int32_t id = static_cast<int32_t>((static_cast<uint32_t>(first) + k) % w.nwin);
            Ensure(w, id);
            CompareScalar(mWin_, wWin_, id, CMPMODE::EQ, n);
            Gather(wTmp_, w.buf, off, 0u, n);
            PipeBarrier<PIPE_V>();
            CompareRef(mTmp_, ref, wideRef);
            PipeBarrier<PIPE_V>();
            And(U16(mTmp_), U16(mTmp_), U16(mWin_), n / 16);
            PipeBarrier<PIPE_V>();
            Or(U16(acc), U16(acc), U16(mTmp_), n / 16);
            PipeBarrier<PIPE_V>();
        }
    }
    // x = clamp(x, lo, hi) on n int32 lanes
    __aicore__ inline void ClampInts(const LocalTensor<int32_t>& x, int32_t lo, int32_t hi, uint32_t n) {
        Maxs(x, x, lo, n);
        PipeBarrier<PIPE_V>();
        Mins(x, x, hi, n);
        PipeBarrier<PIPE_V>();
    }
    __aicore__ inline int32_t SlotMax() const { return static_cast<int32_t>(t_.capacity) - 1; }
    // A slot read from the state, brought into [0, S-1] before it addresses anything.
    __aicore__ inline uint32_t ClampSlot(int32_t slot) const {
        if (slot < 0) return 0;
        return static_cast<uint32_t>(slot) >= t_.capacity ? t_.capacity - 1 : static_cast<uint32_t>(slot);
    }

    // dst (W lanes) = clamp(section[lane], lo, hi), at the offsets in wIdx_ (from SplitIdx). The
    // clamp runs on the raw int32 values, so whatever the state holds, the result is a slot in
    // [0, S-1] or a key in [-1, 2^24]: several windows are then blended in float exactly (Select
    // is float-only on A2).
    __aicore__ inline void GatherVals(Win& w, const LocalTensor<int32_t>& dst, int32_t lo, int32_t hi) {
        const uint32_t n = Wide();
        const LocalTensor<uint32_t> off = wIdx_.ReinterpretCast<uint32_t>();
        if (w.nwin == 1) {
            Ensure(w, 0);
            Gather(dst, w.buf, off, 0u, n);
            PipeBarrier<PIPE_V>();
            ClampInts(dst, lo, hi, n);
            return;
        }
        const LocalTensor<float> dstF = dst.ReinterpretCast<float>();
        const LocalTensor<float> tmpF = wTmp_.ReinterpretCast<float>();
        const int32_t first = FirstWin(w);
        for (uint32_t k = 0; k < w.nwin; ++k) {
            const int32_t id = static_cast<int32_t>((static_cast<uint32_t>(first) + k) % w.nwin);
            Ensure(w, id);
            Gather(wTmp_, w.buf, off, 0u, n);
            if (k > 0) CompareScalar(mWin_, wWin_, id, CMPMODE::EQ, n);
            PipeBarrier<PIPE_V>();
            ClampInts(wTmp_, lo, hi, n);
            if (k == 0) {   // every lane takes the first window's value; later windows overwrite theirs
                Cast(dstF, wTmp_, RoundMode::CAST_RINT, n);
                PipeBarrier<PIPE_V>();
                continue;
            }
            Cast(tmpF, wTmp_, RoundMode::CAST_RINT, n);
            PipeBarrier<PIPE_V>();
            Select(dstF, mWin_, tmpF, dstF, SELMODE::VSEL_TENSOR_TENSOR_MODE, n);
            PipeBarrier<PIPE_V>();
        }
        Cast(dst, dstF, RoundMode::CAST_RINT, n);
        PipeBarrier<PIPE_V>();
    }

    // x & m on int32 lanes: And is 16-bit only on A2 (card §5), so both run as u16 with twice the
    // count; an int32 mask vector holding H-1 reads as [H-1, 0] per lane, i.e. x mod H.
    __aicore__ inline void AndMask(const LocalTensor<int32_t>& dst, const LocalTensor<int32_t>& x,
                                   const LocalTensor<int32_t>& mask, uint32_t n) {
        And(dst.ReinterpretCast<uint16_t>(), x.ReinterpretCast<uint16_t>(), mask.ReinterpretCast<uint16_t>(), 2 * n);
    }

    // first bucket and odd stride of max(src, 0) (reference.probe_buckets); all products < 2^30.
    // With H = 2^m: lo = p & (H-1), hi = (p >> m) & (H-1), first = (lo*A1 + hi*B1) & (H-1),
    // stride = ((lo*A2 + hi*B2) & (H-2)) + 1, which is "mod H, then | 1".
    __aicore__ inline void Hash(const LocalTensor<int32_t>& src, uint32_t n) {
        const int32_t m = static_cast<int32_t>(t_.logBuckets);
        const LocalTensor<int32_t> maskOdd = wSlot_[3 * t_.nc];   // idle whenever Hash runs
        Maxs(vT1_, src, 0, n);
        Duplicate(maskOdd, static_cast<int32_t>(t_.buckets - 2), n);
        PipeBarrier<PIPE_V>();
        ShiftRight(vHi_, vT1_, m, n);
        AndMask(vLo_, vT1_, vHMask_, n);          // lo = p mod H
        PipeBarrier<PIPE_V>();
        AndMask(vHi_, vHi_, vHMask_, n);          // hi = (p >> m) mod H
        PipeBarrier<PIPE_V>();
        Muls(vFirst_, vLo_, static_cast<int32_t>(t_.hashA1), n);
        Muls(vT1_, vHi_, static_cast<int32_t>(t_.hashB1), n);
        Muls(vStride_, vLo_, static_cast<int32_t>(t_.hashA2), n);
        Muls(vT2_, vHi_, static_cast<int32_t>(t_.hashB2), n);
        PipeBarrier<PIPE_V>();
        Add(vFirst_, vFirst_, vT1_, n);
        Add(vStride_, vStride_, vT2_, n);
        PipeBarrier<PIPE_V>();
        AndMask(vFirst_, vFirst_, vHMask_, n);
        AndMask(vStride_, vStride_, maskOdd, n);
        PipeBarrier<PIPE_V>();
        Adds(vStride_, vStride_, 1, n);
        PipeBarrier<PIPE_V>();
    }
    // vB = (first + i*stride) mod H: probe i of the nc selections hashed last
    __aicore__ inline void Probe(int32_t i, uint32_t n) {
        Muls(vB_, vStride_, i, n);
        PipeBarrier<PIPE_V>();
        Add(vB_, vB_, vFirst_, n);
        PipeBarrier<PIPE_V>();
        AndMask(vB_, vB_, vHMask_, n);
        PipeBarrier<PIPE_V>();
    }
    // wIdx[i*nc + l] = (first[l] + i*stride[l]) mod H for every probe i (first + 3*stride < 4H)
    __aicore__ inline void Buckets() {
        const uint32_t nc = t_.nc;
        Adds(wIdx_, vFirst_, 0, nc);
        for (uint32_t i = 1; i < avsg::kPlanProbes; ++i) Muls(wIdx_[i * nc], vStride_, static_cast<int32_t>(i), nc);
        PipeBarrier<PIPE_V>();
        for (uint32_t i = 1; i < avsg::kPlanProbes; ++i) Add(wIdx_[i * nc], wIdx_[i * nc], vFirst_, nc);
        PipeBarrier<PIPE_V>();
        for (uint32_t i = 1; i < avsg::kPlanProbes; ++i) AndMask(wIdx_[i * nc], wIdx_[i * nc], vHMask_, nc);
        PipeBarrier<PIPE_V>();
    }

    // ---------------------------------------------------------------------- row pieces
    // Loads chunk c of the row's selections: vWant = p if 0 <= p < bound else -2, vWantF = float.
    __aicore__ inline uint32_t PrepareWant(uint32_t r, uint32_t c) {
        const uint32_t nc = t_.nc;
        const uint32_t n = MinU(nc, t_.N - c * nc);
        Sync<HardEvent::S_V>();   // AppendPending's scalar reads of vWant_ (write-after-read)
        missChunk_ = -1;
        Duplicate(vWant_, -1, nc);
        Sync<HardEvent::V_MTE2>();
        LoadInts(vWant_, topkGm_[static_cast<uint64_t>(r) * t_.N + c * nc], n, -1);
        Sync<HardEvent::MTE2_V>();
        Cast(vWantF_, vWant_, RoundMode::CAST_RINT, nc);
        PipeBarrier<PIPE_V>();
        CompareScalar(mA_, vWantF_, 0.0f, CMPMODE::GE, nc);
        CompareScalar(mB_, vWantF_, boundF_, CMPMODE::LT, nc);
        PipeBarrier<PIPE_V>();
        And(U16(mA_), U16(mA_), U16(mB_), nc / 16);
        PipeBarrier<PIPE_V>();
        Select(vWantF_, mA_, vWantF_, -2.0f, SELMODE::VSEL_TENSOR_SCALAR_MODE, nc);
        PipeBarrier<PIPE_V>();
        Cast(vWant_, vWantF_, RoundMode::CAST_RINT, nc);
        PipeBarrier<PIPE_V>();
        return n;
    }

    // Hash lookup of vWant_ (nc lanes; invalid lanes hold -2) -> vFoundF_ (slot or -1), probes
    // only: the probes run last to first, so the first valid probe wins as in the reference even
    // if slot_pos held a position twice. A lane no probe finds is looked up in the stash once per
    // row, by the sorted merge in MergeMisses (reference: the stash is consulted only then).
    __aicore__ inline void HashLookup() {
        const uint32_t nc = t_.nc, n = Wide();
        Win& bk = win_[avsg::SEC_BK];
        Win& bs = win_[avsg::SEC_BS];
        Win& sp = win_[avsg::SEC_SP];
        Sync<HardEvent::S_V>();                   // scalar writes of the windows / inputs
        Hash(vWant_, nc);
        Buckets();
        SplitIdx(bk, wIdx_);                      // bucket_slot shares bucket_key's windows
        MatchBits(bk, vWant_, false, mKey_);      // bucket_key == p
        GatherVals(bs, wSlot_, 0, SlotMax());     // the slot each probe bucket names
        Adds(wIdx_, wSlot_, 0, n);
        PipeBarrier<PIPE_V>();
        SplitIdx(sp, wIdx_);
        MatchBits(sp, vWant_, false, mOwn_);      // slot_pos[slot] == p
        And(U16(mKey_), U16(mKey_), U16(mOwn_), n / 16);
        Cast(wSlot_.ReinterpretCast<float>(), wSlot_, RoundMode::CAST_RINT, n);
        Duplicate(vFoundF_, -1.0f, nc);
        PipeBarrier<PIPE_V>();
        const LocalTensor<float> slotF = wSlot_.ReinterpretCast<float>();
        for (uint32_t i = avsg::kPlanProbes; i-- > 0;) {
            Select(vFoundF_, mKey_[i * nc / 8], slotF[i * nc], vFoundF_, SELMODE::VSEL_TENSOR_TENSOR_MODE, nc);
            PipeBarrier<PIPE_V>();
        }
    }

    // Sort `m` int32 keys (UB, in [-1, 2^24]: exact in float) ascending with a uint32 payload (or
    // lane ids when payload is null): Cast->float, negate (Sort is descending), Sort + Extract,
    // negate, Cast.
    // Result: sOutV_ (as int32) keys, sOutI_ payload; m <= nc.
    __aicore__ inline void SortAscending(const LocalTensor<int32_t>& keys, uint32_t m,
                                         const LocalTensor<uint32_t>* payload) {
        const uint32_t n32 = (m + 31) / 32 * 32;
        Duplicate(sConcat_, 1073741824.0f, n32);   // sentinel 2^30, sorts last once negated
        PipeBarrier<PIPE_V>();
        Cast(sConcat_, keys, RoundMode::CAST_RINT, m);
        PipeBarrier<PIPE_V>();
        Muls(sConcat_, sConcat_, -1.0f, n32);
        if (payload == nullptr) CreateVecIndex(sIdx_.template ReinterpretCast<int32_t>(), 0, n32);
        PipeBarrier<PIPE_V>();
        LocalTensor<uint32_t> idx = payload == nullptr ? sIdx_ : *payload;
        // Sort32 on A2: scores and index 128 B aligned, pairs 256 B aligned (Init cuts them so).
        ascendc_assert(avsg::UbAddr(sConcat_) % 128 == 0 && avsg::UbAddr(idx) % 128 == 0 &&
                       avsg::UbAddr(sDst_) % 256 == 0);
        Sort<float, true>(sDst_, sConcat_, idx, sTmp_, static_cast<int32_t>(n32 / 32));
        PipeBarrier<PIPE_V>();
        Extract(sOutV_, sOutI_, sDst_, static_cast<int32_t>(n32 / 32));
        PipeBarrier<PIPE_V>();
        Muls(sOutV_, sOutV_, -1.0f, n32);
        PipeBarrier<PIPE_V>();
        Cast(sOutV_.template ReinterpretCast<int32_t>(), sOutV_, RoundMode::CAST_RINT, n32);
        PipeBarrier<PIPE_V>();
    }

    // ---- scalar k-way merge over sorted runs in the workspace (run c at keyOff + c*nc). Each run
    // streams through a head buffer of hlen entries (the merge's region of the head space, shared
    // by its runs). The runs' heads meet in a loser tree (UB, one int per node), so a step costs
    // O(log runs) scalar accesses, not O(runs) (a scan for a few runs). Ties go to the lower run. With `out`, the merge
    // also writes one value per consumed entry in place of its key (Emit): a head block goes back
    // to outOff + c*nc in the run's layout once it is consumed, so no staging is needed.
    struct Merger {
        uint32_t runs = 0, leaves = 1, keyOff = 0, payOff = 0, outOff = 0;
        uint32_t keyBase = 0, payBase = 0, space = 0, treeBase = 0, hlen = 8;
        bool pay = false, out = false;
        uint32_t len[avsg::kPlanMaxRuns];
        uint32_t pos[avsg::kPlanMaxRuns];
        uint32_t bpos[avsg::kPlanMaxRuns];
        uint32_t blen[avsg::kPlanMaxRuns];
        bool has = false;
        int32_t key = 0, val = 0;
        uint32_t best = 0;
    };
    // Head space regions (int32 offsets, 32 B aligned): one merge's keys, another's keys and payload.
    __aicore__ inline uint32_t Region(uint32_t i) const {
        return i * (2 * avsg::kPlanMaxRuns * avsg::kPlanHeadLen / avsg::kPlanMergeRegions / 8 * 8);
    }
    // A merge alone (no payload, no second merge at the same time) may take the whole head space:
    // fewer refills and write-backs.
    __aicore__ inline void Configure(Merger& g, uint32_t runs, uint32_t keyOff, uint32_t payOff, bool out,
                                     uint32_t keyRegion, uint32_t payRegion, uint32_t tree, bool alone = false) {
        g.space = alone ? 2 * avsg::kPlanMaxRuns * avsg::kPlanHeadLen : Region(1);
        g.runs = runs;
        g.keyOff = keyOff;
        g.payOff = payOff;
        g.outOff = keyOff;
        g.pay = payRegion != keyRegion;
        g.out = out;
        g.keyBase = Region(keyRegion);
        g.payBase = Region(payRegion);
        g.treeBase = tree * avsg::kPlanMaxRuns;
    }
    __aicore__ inline bool Live(const Merger& g, uint32_t c) const { return c < g.runs && g.pos[c] < g.len[c]; }
    __aicore__ inline int32_t HeadKey(const Merger& g, uint32_t c) {
        return heads_.GetValue(g.keyBase + c * g.hlen + g.bpos[c]);
    }
    // run a (key ka) goes before run b (key kb); an exhausted run goes after every live one
    __aicore__ inline bool Before(uint32_t a, int32_t ka, bool aLive, uint32_t b, int32_t kb, bool bLive) const {
        if (!aLive || !bLive) return aLive || (!bLive && a < b);
        return ka < kb || (ka == kb && a < b);
    }
    __aicore__ inline void Refill(Merger& g, uint32_t c) {
        const uint32_t n = MinU(g.hlen, g.len[c] - g.pos[c]);
        Sync<HardEvent::S_MTE2>();
        LoadInts(heads_[g.keyBase + c * g.hlen], wsGm_[g.keyOff + c * t_.nc + g.pos[c]], n, 0);
        if (g.pay) LoadInts(heads_[g.payBase + c * g.hlen], wsGm_[g.payOff + c * t_.nc + g.pos[c]], n, 0);
        Sync<HardEvent::MTE2_S>();
        g.bpos[c] = 0;
        g.blen[c] = n;
    }
    __aicore__ inline void SetWinner(Merger& g, uint32_t c, int32_t key, bool live) {
        g.best = c;
        g.has = live;
        g.key = key;
        if (live && g.pay) g.val = heads_.GetValue(g.payBase + c * g.hlen + g.bpos[c]);
    }
    // Few runs: a scan of the heads reads fewer keys than a replay through the tree (about two
    // accesses per level), so up to kScanRuns runs the winner is found by a scan.
    static constexpr uint32_t kScanRuns = 4;
    __aicore__ inline void Scan(Merger& g) {
        uint32_t best = 0;
        int32_t key = 0;
        bool has = false;
        for (uint32_t c = 0; c < g.runs; ++c) {
            if (!Live(g, c)) continue;
            const int32_t k = HeadKey(g, c);
            if (!has || k < key) {
                has = true;
                key = k;
                best = c;
            }
        }
        SetWinner(g, best, key, has);
    }
    // Run c's head changed: replay its path to the root.
    __aicore__ inline void Replay(Merger& g, uint32_t c) {
        if (g.leaves <= kScanRuns) {
            Scan(g);
            return;
        }
        uint32_t cur = c;
        bool curLive = Live(g, c);
        int32_t curKey = curLive ? HeadKey(g, c) : 0;
        for (uint32_t node = (c + g.leaves) >> 1; node >= 1; node >>= 1) {
            const uint32_t other = static_cast<uint32_t>(treeUb_.GetValue(g.treeBase + node));
            const bool live = Live(g, other);
            const int32_t k = live ? HeadKey(g, other) : 0;
            if (Before(other, k, live, cur, curKey, curLive)) {
                treeUb_.SetValue(g.treeBase + node, static_cast<int32_t>(cur));
                cur = other;
                curKey = k;
                curLive = live;
            }
        }
        SetWinner(g, cur, curKey, curLive);
    }
    __aicore__ inline void Start(Merger& g) {
        g.hlen = g.runs == 0 ? g.space : (g.space / g.runs / 8 * 8);
        g.leaves = 1;
        while (g.leaves < g.runs) g.leaves <<= 1;
        Sync<HardEvent::MTE3_MTE2>();   // runs were just stored
        for (uint32_t c = 0; c < g.leaves; ++c) {
            if (c >= g.runs) g.len[c] = 0;
            g.pos[c] = 0;
            g.blen[c] = 0;
            g.bpos[c] = 0;
            if (g.len[c] > 0) Refill(g, c);
        }
        if (g.leaves <= kScanRuns) {
            Scan(g);
            return;
        }
        // winners bottom-up (once per merge); each node keeps the loser, the root's winner leads
        uint32_t win[2 * avsg::kPlanMaxRuns];
        for (uint32_t c = 0; c < g.leaves; ++c) win[g.leaves + c] = c;
        for (uint32_t node = g.leaves - 1; node >= 1; --node) {
            const uint32_t a = win[2 * node], b = win[2 * node + 1];
            const bool la = Live(g, a), lb = Live(g, b);
            const bool aFirst = Before(a, la ? HeadKey(g, a) : 0, la, b, lb ? HeadKey(g, b) : 0, lb);
            win[node] = aFirst ? a : b;
            treeUb_.SetValue(g.treeBase + node, static_cast<int32_t>(aFirst ? b : a));
        }
        const uint32_t w = win[1];
        SetWinner(g, w, Live(g, w) ? HeadKey(g, w) : 0, Live(g, w));
    }
    // the value of the current entry (merges with `out`), written over its key
    __aicore__ inline void Emit(Merger& g, int32_t v) {
        heads_.SetValue(g.keyBase + g.best * g.hlen + g.bpos[g.best], v);
    }
    __aicore__ inline void Advance(Merger& g) {
        const uint32_t c = g.best;
        g.pos[c]++;
        g.bpos[c]++;
        if (g.bpos[c] == g.blen[c]) {
            if (g.out) {
                Sync<HardEvent::S_MTE3>();
                const uint32_t first = g.pos[c] - g.blen[c];   // the block's first entry in its run
                StoreInts(wsGm_[g.outOff + c * t_.nc + first], heads_[g.keyBase + c * g.hlen], g.blen[c]);
                Sync<HardEvent::MTE3_MTE2>();
                Sync<HardEvent::MTE3_S>();
            }
            if (g.pos[c] < g.len[c]) Refill(g, c);
        }
        Replay(g, c);
    }

    // Dual pointer: sorted runs of (slot_pos, slot) for resident slots, into the workspace.
    __aicore__ inline void BuildResidentRuns() {
        const uint32_t nc = t_.nc;
        Win& sp = win_[avsg::SEC_SP];
        uint32_t run = 0;
        Sync<HardEvent::S_V>();
        for (uint32_t id = 0; id < sp.nwin; ++id) {
            Ensure(sp, static_cast<int32_t>(id));
            const uint32_t cnt = WinCount(sp, static_cast<int32_t>(id));
            for (uint32_t off = 0; off < cnt; off += nc, ++run) {
                const uint32_t n = MinU(nc, cnt - off);
                const uint32_t base = id * sp.wlen + off;
                Cast(vTmpF_, sp.buf[off], RoundMode::CAST_RINT, n);
                Adds(vT1_, vLane_, static_cast<int32_t>(base), n);   // slot ids
                PipeBarrier<PIPE_V>();
                CompareScalar(mA_, vTmpF_, 0.0f, CMPMODE::GE, n);
                PipeBarrier<PIPE_V>();
                uint64_t m = 0, m2 = 0;
                GatherMask(vKey_, sp.buf[off], U32(mA_), true, n, GatherMaskParams(1, 1, 8, 0), m);
                GatherMask(vSlot_, vT1_, U32(mA_), true, n, GatherMaskParams(1, 1, 8, 0), m2);
                PipeBarrier<PIPE_V>();
                resRuns_.len[run] = static_cast<uint32_t>(m);
                if (m == 0) continue;
                // whatever slot_pos holds, keys stay exact in the float sort (no selection is >= 2^24)
                Mins(vKey_, vKey_, static_cast<int32_t>(avsg::kMaxPosition), static_cast<uint32_t>(m));
                PipeBarrier<PIPE_V>();
                LocalTensor<uint32_t> pay = vSlot_.ReinterpretCast<uint32_t>();
                SortAscending(vKey_, static_cast<uint32_t>(m), &pay);
                Sync<HardEvent::V_MTE3>();
                StoreInts(wsGm_[t_.wsResKeyOff + run * nc], sOutV_.template ReinterpretCast<int32_t>(),
                          static_cast<uint32_t>(m));
                StoreInts(wsGm_[t_.wsResSlotOff + run * nc], sOutI_.template ReinterpretCast<int32_t>(),
                          static_cast<uint32_t>(m));
                Sync<HardEvent::MTE3_V>();
            }
        }
        Configure(resRuns_, run, t_.wsResKeyOff, t_.wsResSlotOff, false, 1, 2, 1);
    }

    // Dual pointer, once per row: the row's valid selections sorted per chunk (lanes as payload),
    // then one walk of two pointers over them and the merged resident runs. Both sides ascend, so
    // every resident entry and every selection is passed once: O((S + T*K) log runs) scalar steps
    // for the row. Each selection's match (slot or -1) replaces its key in the workspace run.
    __aicore__ inline void DualMatchRow(uint32_t r) {
        const uint32_t nc = t_.nc;
        for (uint32_t c = 0; c < t_.numChunks; ++c) {
            PrepareWant(r, c);
            CompareScalar(mA_, vWantF_, 0.0f, CMPMODE::GE, nc);
            PipeBarrier<PIPE_V>();
            uint64_t m = 0, m2 = 0;
            GatherMask(vKey_, vWant_, U32(mA_), true, nc, GatherMaskParams(1, 1, 8, 0), m);
            GatherMask(vSlot_, vLane_, U32(mA_), true, nc, GatherMaskParams(1, 1, 8, 0), m2);
            PipeBarrier<PIPE_V>();
            selRuns_.len[c] = static_cast<uint32_t>(m);
            if (m == 0) continue;
            LocalTensor<uint32_t> pay = vSlot_.ReinterpretCast<uint32_t>();
            SortAscending(vKey_, static_cast<uint32_t>(m), &pay);
            Sync<HardEvent::V_MTE3>();
            StoreInts(wsGm_[t_.wsSelKeyOff + c * nc], sOutV_.template ReinterpretCast<int32_t>(),
                      static_cast<uint32_t>(m));
            StoreInts(wsGm_[t_.wsSelLaneOff + c * nc], sOutI_.template ReinterpretCast<int32_t>(),
                      static_cast<uint32_t>(m));
            Sync<HardEvent::MTE3_V>();
        }
        Configure(selRuns_, t_.numChunks, t_.wsSelKeyOff, 0, true, 0, 0, 0);
        Start(resRuns_);
        Start(selRuns_);
        while (selRuns_.has) {
            const int32_t want = selRuns_.key;
            while (resRuns_.has && resRuns_.key < want) Advance(resRuns_);
            Emit(selRuns_, resRuns_.has && resRuns_.key == want ? resRuns_.val : -1);
            Advance(selRuns_);
        }
    }
    // Chunk c's matches (from DualMatchRow) -> vFoundF_: scattered to their lanes.
    __aicore__ inline void DualFound(uint32_t c) {
        const uint32_t nc = t_.nc, len = selRuns_.len[c];
        const LocalTensor<int32_t> lanes = vT1_, found = vT2_;
        Duplicate(vFoundI_, -1, nc);
        if (len > 0) {
            Sync<HardEvent::V_MTE2>();
            Sync<HardEvent::S_MTE2>();
            Sync<HardEvent::MTE3_MTE2>();
            LoadInts(lanes, wsGm_[t_.wsSelLaneOff + c * nc], len, 0);
            LoadInts(found, wsGm_[t_.wsSelKeyOff + c * nc], len, 0);
            Sync<HardEvent::MTE2_S>();
            Sync<HardEvent::V_S>();
            for (uint32_t e = 0; e < len; ++e)
                vFoundI_.SetValue(static_cast<uint32_t>(lanes.GetValue(e)), found.GetValue(e));
            Sync<HardEvent::S_V>();
        }
        PipeBarrier<PIPE_V>();
        Cast(vFoundF_, vFoundI_, RoundMode::CAST_RINT, nc);
        PipeBarrier<PIPE_V>();
    }

    // Hash plan: the stash, compacted (every entry live), sorted in runs of nc entries by key with
    // payload (k << 16) | slot, into the workspace; MergeMisses merges it with the sorted misses.
    // Keys are clamped to [-1, 2^24] (exact in float; no selection reaches 2^24) and slots to
    // [0, S-1], as the lookup clamps them; k < S <= 2^15 keeps the payload positive.
    __aicore__ inline void BuildStashRuns() {
        const uint32_t nc = t_.nc;
        const uint32_t runs = (stashCount_ + nc - 1) / nc;
        Sync<HardEvent::S_V>();                   // CompactStash's scalar writes of the windows
        for (uint32_t q = 0; q < runs; ++q) {
            const uint32_t base = q * nc, n = MinU(nc, stashCount_ - base);
            CopySection(win_[avsg::SEC_SK], base, n, vKey_);
            CopySection(win_[avsg::SEC_SS], base, n, vSlot_);
            Adds(vT1_, vLane_, static_cast<int32_t>(base), n);   // stash index k
            PipeBarrier<PIPE_V>();
            ClampInts(vKey_, -1, static_cast<int32_t>(avsg::kMaxPosition), n);
            ClampInts(vSlot_, 0, SlotMax(), n);
            ShiftLeft(vT1_, vT1_, 16, n);
            PipeBarrier<PIPE_V>();
            Add(vSlot_, vSlot_, vT1_, n);
            PipeBarrier<PIPE_V>();
            LocalTensor<uint32_t> pay = vSlot_.ReinterpretCast<uint32_t>();
            SortAscending(vKey_, n, &pay);
            Sync<HardEvent::V_MTE3>();
            StoreInts(wsGm_[t_.wsResKeyOff + q * nc], sOutV_.template ReinterpretCast<int32_t>(), n);
            StoreInts(wsGm_[t_.wsResSlotOff + q * nc], sOutI_.template ReinterpretCast<int32_t>(), n);
            Sync<HardEvent::MTE3_V>();
            stashRuns_.len[q] = n;
        }
        Configure(stashRuns_, runs, t_.wsResKeyOff, t_.wsResSlotOff, false, 1, 2, 1);
    }
    // dst[0:n] = section entries [base, base+n), window by window (vector copies)
    __aicore__ inline void CopySection(Win& w, uint32_t base, uint32_t n, const LocalTensor<int32_t>& dst) {
        for (uint32_t done = 0; done < n;) {
            const uint32_t idx = base + done;
            const int32_t id = static_cast<int32_t>(idx >> w.wlog);
            Ensure(w, id);
            const uint32_t off = idx - static_cast<uint32_t>(id) * w.wlen;
            const uint32_t cnt = MinU(n - done, WinCount(w, id) - off);
            Adds(dst[done], w.buf[off], 0, cnt);
            done += cnt;
        }
    }
    // Stash lookup of v (ascending over calls): the slot of the first stash entry (lowest k, the
    // payload's high half) whose key is v, or -1.
    __aicore__ inline int32_t StashSlot(int32_t v) {
        Merger& g = stashRuns_;
        while (g.has && g.key < v) Advance(g);
        int32_t first = -1;
        for (; g.has && g.key == v; Advance(g))
            if (first < 0 || g.val < first) first = g.val;
        return first < 0 ? -1 : (first & 0xFFFF);
    }

    __aicore__ inline void Match(uint32_t c) {
        if (kDual) DualFound(c);
        else HashLookup();
    }

    // Counts, hit bitmap and the chunk's sorted miss run (workspace run c). The match is stored
    // as the chunk's slots (final for hits and invalid lanes) with the run's lanes (the sort's
    // payload), so OutputMisses patches just the missed lanes.
    __aicore__ inline void Classify(uint32_t r, uint32_t c, uint32_t n) {
        const uint32_t nc = t_.nc;
        Cast(vFoundI_, vFoundF_, RoundMode::CAST_RINT, nc);
        CompareScalar(mA_, vWantF_, 0.0f, CMPMODE::GE, nc);     // valid
        CompareScalar(mB_, vFoundF_, 0.0f, CMPMODE::GE, nc);    // hit
        CompareScalar(mC_, vFoundF_, 0.0f, CMPMODE::LT, nc);    // not hit
        PipeBarrier<PIPE_V>();
        And(U16(mC_), U16(mC_), U16(mA_), nc / 16);             // miss = valid & not hit
        PipeBarrier<PIPE_V>();
        uint64_t nValid = 0, nHit = 0, nMiss = 0, nLanes = 0;
        GatherMask(vT1_, vWant_, U32(mA_), true, nc, GatherMaskParams(1, 1, 8, 0), nValid);
        GatherMask(vKey_, vFoundI_, U32(mB_), true, nc, GatherMaskParams(1, 1, 8, 0), nHit);
        GatherMask(vSlot_, vWant_, U32(mC_), true, nc, GatherMaskParams(1, 1, 8, 0), nMiss);
        GatherMask(vT2_, vLane_, U32(mC_), true, nc, GatherMaskParams(1, 1, 8, 0), nLanes);
        Sync<HardEvent::V_S>();
        lookups_ += static_cast<int64_t>(nValid);
        hits_ += static_cast<int64_t>(nHit);
        misses_ += static_cast<int64_t>(nMiss);
        // reuse: heat and counts follow from the final bitmap (HeatUsed, CountHits)
        for (uint32_t q = 0; q < nHit; ++q) SetWordBit(hitBits_, static_cast<uint32_t>(vKey_.GetValue(q)));
        missRuns_.len[c] = static_cast<uint32_t>(nMiss);
        Sync<HardEvent::V_MTE3>();
        StoreInts(slotsGm_[static_cast<uint64_t>(r) * t_.N + c * nc], vFoundI_, n);
        if (nMiss == 0) Sync<HardEvent::MTE3_V>();
        if (nMiss == 0) return;
        Sync<HardEvent::S_V>();
        const LocalTensor<uint32_t> lanes = vT2_.ReinterpretCast<uint32_t>();
        SortAscending(vSlot_, static_cast<uint32_t>(nMiss), &lanes);
        Sync<HardEvent::V_MTE3>();
        StoreInts(rowWs_[t_.wsMissOff + c * nc], sOutV_.template ReinterpretCast<int32_t>(),
                  static_cast<uint32_t>(nMiss));
        StoreInts(rowWs_[t_.wsRunLaneOff + c * nc], sOutI_.template ReinterpretCast<int32_t>(),
                  static_cast<uint32_t>(nMiss));
        Sync<HardEvent::MTE3_V>();
    }

    // slot_life: decay (life>0 -> life-1), clamp to [-1, L-1] (a no-op on states the ops built;
    // on any other it keeps every unpinned slot a victim candidate), hit slots -> L, one vector
    // pass per window. Also counts the free slots (life -1, padding included), so Allocate can
    // skip level -1.
    __aicore__ inline void DecayAndPin() {
        const uint32_t nc = t_.nc;
        Win& sl = win_[avsg::SEC_SL];
        freeSlots_ = 0;
        Sync<HardEvent::S_V>();
        // last window first: Allocate then starts its slot-order scan in the resident window 0
        for (uint32_t id = sl.nwin; id-- > 0;) {
            Ensure(sl, static_cast<int32_t>(id));
            const uint32_t cnt = WinCount(sl, static_cast<int32_t>(id));
            for (uint32_t off = 0; off < cnt; off += nc) {
                const uint32_t n = MinU(nc, cnt - off);
                LocalTensor<int32_t> life = sl.buf[off];
                if (reuse_ || lru_) {
                    // age: clamp to [-1, 1023], then min(age+1, 1023) + min(age, 0): one step
                    // older, free slots (-1) stay free
                    Maxs(vT1_, life, -1, n);
                    PipeBarrier<PIPE_V>();
                    Mins(vT1_, vT1_, avsg::kReuseAgeMax, n);
                    PipeBarrier<PIPE_V>();
                    Adds(vT2_, vT1_, 1, n);
                    PipeBarrier<PIPE_V>();
                    Mins(vT1_, vT1_, 0, n);
                    PipeBarrier<PIPE_V>();
                    Mins(vT2_, vT2_, avsg::kReuseAgeMax, n);
                    PipeBarrier<PIPE_V>();
                    Add(vT2_, vT2_, vT1_, n);
                    PipeBarrier<PIPE_V>();
                } else {
                    // clamp to [-1, L] first (life - 1 would wrap at INT32_MIN), then decay: the
                    // same as the reference's decay-then-clamp to [-1, L-1]
                    Maxs(vT1_, life, -1, n);
                    PipeBarrier<PIPE_V>();
                    Mins(vT1_, vT1_, static_cast<int32_t>(t_.lifetime), n);
                    PipeBarrier<PIPE_V>();
                    Adds(vT2_, vT1_, -1, n);
                    PipeBarrier<PIPE_V>();
                    Mins(vT1_, vT1_, 0, n);
                    PipeBarrier<PIPE_V>();
                    Max(vT2_, vT2_, vT1_, n);                    // max(life-1, min(life,0))
                    PipeBarrier<PIPE_V>();
                }
                CompareScalar(mB_, vT2_, -1, CMPMODE::EQ, n);   // free (neither decayed nor hit)
                PipeBarrier<PIPE_V>();
                uint64_t nFree = 0;
                GatherMask(vKey_, vT2_, U32(mB_), true, n, GatherMaskParams(1, 1, 8, 0), nFree);
                freeSlots_ += static_cast<uint32_t>(nFree);
                PipeBarrier<PIPE_V>();
                Cast(vTmpF_, vT2_, RoundMode::CAST_RINT, n);
                Not(U16(mA_), hitBits_.ReinterpretCast<uint16_t>()[(id * sl.wlen + off) / 16], n / 16);
                PipeBarrier<PIPE_V>();
                Select(vTmpF_, mA_, vTmpF_, reuse_ || lru_ ? 0.0f : static_cast<float>(t_.lifetime),
                       SELMODE::VSEL_TENSOR_SCALAR_MODE, n);
                PipeBarrier<PIPE_V>();
                Cast(life, vTmpF_, RoundMode::CAST_RINT, n);
                PipeBarrier<PIPE_V>();
                if (reuse_) CountHits(id * sl.wlen + off, n);
            }
            sl.dirty = true;
        }
        Sync<HardEvent::V_S>();
    }

    // reuse: slot_count + gain (saturating) for the hit slots of [base, base+n), one vector pass
    // with the hit bitmap instead of a scalar access per hit (slot_count is paged: random scalar
    // accesses would reload its windows). The gain comes from the ages one step older, still in
    // vT2_ (DecayAndPin): a return (age > 1) gains more than a streak (reference: plan, step 3).
    // Other counts keep their bits exactly, whatever they hold: a bitwise blend
    // (count & keep) | (new & ~keep), keep = -1 off the hits.
    __aicore__ inline void CountHits(uint32_t base, uint32_t n) {
        static_assert(avsg::kReuseGainReturn - avsg::kReuseGainStreak == 1, "gain = streak + [age > 1]");
        const LocalTensor<int32_t> count = ChunkOf(win_[avsg::SEC_SC], base);
        const LocalTensor<int32_t> aged = vT2_, keep = vT2_, notKeep = vKey_, bumped = vT1_, gain = vKey_;
        Sync<HardEvent::S_V>();
        Duplicate(vTmpF_, 0.0f, n);
        Adds(gain, aged, -1, n);                  // ages are in [-1, 1023]: no overflow
        Maxs(bumped, count, 0, n);
        PipeBarrier<PIPE_V>();
        Select(vTmpF_, hitBits_.ReinterpretCast<uint8_t>()[base / 8], vTmpF_, -1.0f,
               SELMODE::VSEL_TENSOR_SCALAR_MODE, n);
        Maxs(gain, gain, 0, n);
        Mins(bumped, bumped, avsg::kReuseCountMax, n);
        PipeBarrier<PIPE_V>();
        Mins(gain, gain, 1, n);
        PipeBarrier<PIPE_V>();
        Adds(gain, gain, avsg::kReuseGainStreak, n);
        PipeBarrier<PIPE_V>();
        Add(bumped, bumped, gain, n);
        PipeBarrier<PIPE_V>();
        Cast(keep, vTmpF_, RoundMode::CAST_RINT, n);
        Mins(bumped, bumped, avsg::kReuseCountMax, n);
        PipeBarrier<PIPE_V>();
        Not(notKeep.ReinterpretCast<uint16_t>(), keep.ReinterpretCast<uint16_t>(), 2 * n);
        And(count.ReinterpretCast<uint16_t>(), count.ReinterpretCast<uint16_t>(), keep.ReinterpretCast<uint16_t>(),
            2 * n);
        PipeBarrier<PIPE_V>();
        And(bumped.ReinterpretCast<uint16_t>(), bumped.ReinterpretCast<uint16_t>(),
            notKeep.ReinterpretCast<uint16_t>(), 2 * n);
        PipeBarrier<PIPE_V>();
        Or(count.ReinterpretCast<uint16_t>(), count.ReinterpretCast<uint16_t>(), bumped.ReinterpretCast<uint16_t>(),
           2 * n);
        PipeBarrier<PIPE_V>();
        win_[avsg::SEC_SC].dirty = true;
    }

    // Scalar merge of the sorted miss runs with dedup -> miss_pos[0:M]. Returns M. Every run
    // entry's key is replaced by its index j in miss_pos (workspace, run layout): OutputMisses
    // turns it into the lane's reserved slot, miss_slots[j]. The misses here are the lanes no
    // probe found; each distinct one is looked up in the sorted stash on the way (both ascend): a
    // stash hit is a hit (hit bitmap, stats), its entries get -2 - slot instead of a j.
    __aicore__ inline uint32_t MergeMisses(uint32_t r) {
        const bool stash = stashRuns_.runs > 0;
        Configure(missRuns_, t_.numChunks, t_.wsMissOff, 0, true, 0, 0, 0, !stash);
        if (stash) Start(stashRuns_);
        Start(missRuns_);
        const uint64_t rowN = static_cast<uint64_t>(r) * t_.N;
        uint32_t m = 0, staged = 0;
        int32_t last = -1, code = -1;
        while (missRuns_.has) {
            const int32_t v = missRuns_.key;
            if (v != last) {
                last = v;
                const int32_t slot = stash ? StashSlot(v) : -1;
                if (slot >= 0) {
                    code = -2 - slot;
                    SetWordBit(hitBits_, static_cast<uint32_t>(slot));
                } else {
                    code = static_cast<int32_t>(m + staged);
                    vT1_.SetValue(staged++, v);
                    if (staged == t_.nc) {
                        Sync<HardEvent::S_MTE3>();
                        StoreInts(missPosGm_[rowN + m], vT1_, staged);
                        Sync<HardEvent::MTE3_S>();
                        m += staged;
                        staged = 0;
                    }
                }
            }
            if (code < 0) {   // a lane Classify counted as a miss
                ++hits_;
                --misses_;
            }
            Emit(missRuns_, code);
            Advance(missRuns_);
        }
        if (staged) {
            Sync<HardEvent::S_MTE3>();
            StoreInts(missPosGm_[rowN + m], vT1_, staged);
            Sync<HardEvent::MTE3_S>();
            m += staged;
        }
        return m;
    }

    // Victims in (life, slot) order among life < L: one Compares EQ + GatherMask per level and
    // window chunk, stopping at M -> miss_slots[0:M].
    __aicore__ inline void Allocate(uint32_t r, uint32_t m) {
        const uint32_t nc = t_.nc;
        const uint64_t rowN = static_cast<uint64_t>(r) * t_.N;
        Win& sl = win_[avsg::SEC_SL];
        uint32_t have = 0;
        // level -1 only if a real slot is free (the Sp - S padding slots always hold -1). Below a
        // shrunk active capacity the free count cannot tell: slots past it are free on a state
        // the ops built but need not be on any other, so level -1 is always searched there.
        const int32_t lv0 = activeCap_ < t_.capacity || freeSlots_ > t_.capPad - t_.capacity ? -1 : 0;
        for (int32_t lv = lv0; lv < static_cast<int32_t>(t_.lifetime) && have < m; ++lv) {
            for (uint32_t id = 0; id < sl.nwin && have < m; ++id) {
                Ensure(sl, static_cast<int32_t>(id));
                const uint32_t cnt = WinCount(sl, static_cast<int32_t>(id));
                for (uint32_t off = 0; off < cnt && have < m; off += nc) {
                    const uint32_t n = MinU(nc, cnt - off);
                    const uint32_t base = id * sl.wlen + off;
                    Sync<HardEvent::S_V>();       // scalar reads of the previous chunk's vT2_
                    CompareScalar(mA_, sl.buf[off], lv, CMPMODE::EQ, n);
                    Adds(vT1_, vLane_, static_cast<int32_t>(base), n);   // slot ids
                    PipeBarrier<PIPE_V>();
                    uint64_t got = 0;
                    GatherMask(vT2_, vT1_, U32(mA_), true, n, GatherMaskParams(1, 1, 8, 0), got);
                    Sync<HardEvent::V_S>();
                    uint32_t k = static_cast<uint32_t>(got);
                    // ids ascend: padding and slots past the active capacity (resize) are a tail
                    while (k > 0 && static_cast<uint32_t>(vT2_.GetValue(k - 1)) >= activeCap_) --k;
                    const uint32_t take = MinU(k, m - have);
                    if (take) {
                        Sync<HardEvent::V_MTE3>();
                        StoreInts(missSlotsGm_[rowN + have], vT2_, take);
                        Sync<HardEvent::MTE3_V>();
                        have += take;
                    }
                }
            }
        }
    }

    // ---------------------------------------------------------------------- reuse policy
    // (reference.py: reuse_scores, lowest_scores, _reuse_refresh, _add_heat, _reuse_install)
    __aicore__ inline int32_t ClampCount(int32_t c) const {
        return c < 0 ? 0 : (c > avsg::kReuseCountMax ? avsg::kReuseCountMax : c);
    }
    // heat[b] = min(heat[b] + c, 255) for the runs of equal block ids in wIdx_[0:n) (ascending;
    // wIdx_[n] = -1, no block). Run lengths come from the vector unit (ends where a lane differs
    // from the next one, compacted with their lane ids), so the scalar unit touches each heated
    // block once per call instead of once per use, in ascending order: each window of a paged
    // heat section is loaded at most once per call. Heat is in [0, 127] after CoolHeat and a
    // block's increments in one step commute with the clamp, so adding a run's length at once
    // saturates exactly as one increment per use does.
    __aicore__ inline void AddHeat(uint32_t n) {
        if (n == 0) return;
        const uint32_t n64 = (n + 63) / 64 * 64;
        const LocalTensor<int32_t> next = wSlot_, endKey = wSlot_[t_.nc], endLane = wSlot_[2 * t_.nc];
        const LocalTensor<int32_t> off = wWin_;
        Muls(off, vLane_, 4, n64);
        PipeBarrier<PIPE_V>();
        Adds(off, off, 4, n64);                   // byte offset of lane i + 1
        PipeBarrier<PIPE_V>();
        Gather(next, wIdx_, off.ReinterpretCast<uint32_t>(), 0u, n64);
        PipeBarrier<PIPE_V>();
        Compare(mA_, wIdx_, next, CMPMODE::EQ, n64);
        PipeBarrier<PIPE_V>();
        Not(U16(mA_), U16(mA_), n64 / 16);        // run ends
        PipeBarrier<PIPE_V>();
        uint64_t runs = 0, lanes = 0;
        GatherMask(endKey, wIdx_, U32(mA_), true, n, GatherMaskParams(1, 1, 8, 0), runs);
        GatherMask(endLane, vLane_, U32(mA_), true, n, GatherMaskParams(1, 1, 8, 0), lanes);
        Sync<HardEvent::V_S>();
        Win& ht = win_[avsg::SEC_HT];
        int32_t prev = -1;
        for (uint32_t k = 0; k < static_cast<uint32_t>(runs); ++k) {
            const uint32_t b = static_cast<uint32_t>(endKey.GetValue(k));
            const int32_t e = endLane.GetValue(k);
            const int32_t h = Get(ht, b) + (e - prev);
            Put(ht, b, h < avsg::kReuseHeatMax ? h : avsg::kReuseHeatMax);
            prev = e;
        }
        Sync<HardEvent::S_V>();
    }
    // Every slot used this step (hit bitmap: probe and stash hits, T tokens sharing a slot count
    // once) heats the block of the position it holds, then every miss heats its own (reference:
    // the two _add_heat calls). Hits: per nc-slot chunk, the used slots' positions compacted,
    // their blocks sorted; misses: miss_pos is ascending and unique already.
    __aicore__ inline void HeatUsed(uint32_t r, uint32_t m) {
        const uint32_t nc = t_.nc;
        Sync<HardEvent::S_V>();                   // scalar writes of the hit bitmap
        for (uint32_t base = 0; base < t_.capPad; base += nc) {
            const uint32_t n = MinU(nc, t_.capPad - base);
            uint64_t used = 0;
            GatherMask(vT1_, ChunkOf(win_[avsg::SEC_SP], base), hitBits_[base / 32], true, n,
                       GatherMaskParams(1, 1, 8, 0), used);
            Sync<HardEvent::V_S>();
            if (used == 0) continue;
            const uint32_t u = static_cast<uint32_t>(used);
            // a hit slot holds the selection it matched (>= 0); the clamp keeps any state
            // content to the reference's heat entry
            Maxs(vT1_, vT1_, 0, u);
            PipeBarrier<PIPE_V>();
            HeatEntry(vT1_, u);
            SortAscending(vT1_, u, nullptr);
            Duplicate(wIdx_, -1, (u + 63) / 64 * 64 + 64);
            PipeBarrier<PIPE_V>();
            Adds(wIdx_, sOutV_.template ReinterpretCast<int32_t>(), 0, u);
            PipeBarrier<PIPE_V>();
            AddHeat(u);
        }
        const uint64_t rowN = static_cast<uint64_t>(r) * t_.N;
        for (uint32_t j0 = 0; j0 < m; j0 += nc) {
            const uint32_t n = MinU(nc, m - j0);
            Duplicate(wIdx_, -1, (n + 63) / 64 * 64 + 64);
            Sync<HardEvent::V_MTE2>();
            Sync<HardEvent::S_MTE2>();
            Sync<HardEvent::MTE3_MTE2>();        // MergeMisses stored miss_pos
            LoadInts(wIdx_, missPosGm_[rowN + j0], n, -1);
            Sync<HardEvent::MTE2_V>();
            HeatEntry(wIdx_, n);   // valid selections: >= 0 (runs may wrap at B: each adds its own)
            AddHeat(n);
        }
    }
    // x (n lanes, >= 0) -> (x >> 6) & (B - 1), its heat entry: bits [6, 6 + log2 B) of x, by a
    // logical left shift that drops the bits above them and a logical right shift (no And: it is
    // 16-bit only, and no mask vector to hold)
    __aicore__ inline void HeatEntry(const LocalTensor<int32_t>& x, uint32_t n) {
        const uint32_t bits = HeatBits();
        const LocalTensor<uint32_t> u = x.template ReinterpretCast<uint32_t>();
        ShiftLeft(u, u, static_cast<uint32_t>(32 - avsg::kReuseBlockLog) - bits, n);
        PipeBarrier<PIPE_V>();
        ShiftRight(u, u, 32u - bits, n);
        PipeBarrier<PIPE_V>();
    }
    __aicore__ inline uint32_t HeatBits() const {
        uint32_t bits = 0;
        while ((1u << bits) <= t_.heatMask) ++bits;
        return bits;
    }
    // Every 256 steps the ghosts' counts halve and their tags stay: e - ((e & 255) + 1) / 2, the
    // count's bits taken by a logical shift pair (reference.plan, the halving)
    __aicore__ inline void HalveGhosts() {
        Win& w = win_[avsg::SEC_PC];
        const LocalTensor<int32_t> c = wTmp_;
        const LocalTensor<uint32_t> cu = c.template ReinterpretCast<uint32_t>();
        for (uint32_t id = 0; id < w.nwin; ++id) {
            Ensure(w, static_cast<int32_t>(id));
            Sync<HardEvent::S_V>();
            const uint32_t cnt = WinCount(w, static_cast<int32_t>(id));
            for (uint32_t off = 0; off < cnt; off += t_.nc) {
                const uint32_t n = MinU(t_.nc, cnt - off);
                ShiftLeft(cu, w.buf[off].template ReinterpretCast<uint32_t>(),
                          static_cast<uint32_t>(32 - avsg::kGhostCountBits), n);
                PipeBarrier<PIPE_V>();
                ShiftRight(cu, cu, static_cast<uint32_t>(32 - avsg::kGhostCountBits), n);
                PipeBarrier<PIPE_V>();
                Adds(c, c, 1, n);
                PipeBarrier<PIPE_V>();
                ShiftRight(c, c, 1, n);
                PipeBarrier<PIPE_V>();
                Sub(w.buf[off], w.buf[off], c, n);
                PipeBarrier<PIPE_V>();
            }
            w.dirty = true;
        }
        Sync<HardEvent::V_S>();
    }
    // dst = clamp(src, 0, high) >> 1 over a whole section, window by window (heat every step;
    // the slot counts every 256 steps)
    __aicore__ inline void HalveSection(Win& w, int32_t high) {
        for (uint32_t id = 0; id < w.nwin; ++id) {
            Ensure(w, static_cast<int32_t>(id));
            Sync<HardEvent::S_V>();
            const uint32_t cnt = WinCount(w, static_cast<int32_t>(id));
            for (uint32_t off = 0; off < cnt; off += t_.nc) {
                const uint32_t n = MinU(t_.nc, cnt - off);
                ClampInts(w.buf[off], 0, high, n);
                ShiftRight(w.buf[off], w.buf[off], 1, n);
                PipeBarrier<PIPE_V>();
            }
            w.dirty = true;
        }
        Sync<HardEvent::V_S>();
    }
    __aicore__ inline void CoolHeat() { HalveSection(win_[avsg::SEC_HT], avsg::kReuseHeatMax); }
    // The step word counts steps since the last halving of the counts (clamped to [0, 255]).
    __aicore__ inline void AdvanceStep() {
        int32_t step = countUb_.GetValue(1);
        step = (step < 0 ? 0 : (step > avsg::kReuseHalveEvery - 1 ? avsg::kReuseHalveEvery - 1 : step)) + 1;
        if (step == avsg::kReuseHalveEvery) {
            HalveSection(win_[avsg::SEC_SC], avsg::kReuseCountMax);
            HalveGhosts();
            step = 0;
        }
        countUb_.SetValue(1, step);
    }
    // x (int32 >= 0, n lanes) -> log8(x) (shift 20) or log4(x) (shift 21) from float32 bits
    __aicore__ inline void LogBits(const LocalTensor<int32_t>& x, const LocalTensor<float>& tmp, int32_t shift,
                                   uint32_t n) {
        Adds(x, x, 1, n);
        PipeBarrier<PIPE_V>();
        Cast(tmp, x, RoundMode::CAST_RINT, n);   // exact: x + 1 <= 2^24
        PipeBarrier<PIPE_V>();
        ShiftRight(x, tmp.ReinterpretCast<int32_t>(), shift, n);
        PipeBarrier<PIPE_V>();
        Adds(x, x, -(127 << (23 - shift)), n);
        PipeBarrier<PIPE_V>();
    }
    // window buffer of section w holding entries [base, base + nc) (windows are >= nc or whole)
    __aicore__ inline LocalTensor<int32_t> ChunkOf(Win& w, uint32_t base) {
        const int32_t id = static_cast<int32_t>(base >> w.wlog);
        Ensure(w, id);
        return w.buf[base - static_cast<uint32_t>(id) * w.wlen];
    }
    // Scores of slots [base, base+n) into the workspace (float; the Sp - S padding slots are
    // left out: the passes read them back as SCORE_PINNED).
    __aicore__ inline void ScoreChunk(uint32_t base, uint32_t n) {
        const uint32_t W = Wide();
        const LocalTensor<int32_t> a = V(0), b = V(5);
        const LocalTensor<float> fa = VF(1), fb = VF(4);
        Sync<HardEvent::S_V>();                   // scalar writes of the windows
        PipeBarrier<PIPE_V>();
        // heat of each slot's block: an all-probe gather with the block ids in the first nc lanes
        Duplicate(wIdx_, 0, W);
        PipeBarrier<PIPE_V>();
        Adds(wIdx_, ChunkOf(win_[avsg::SEC_SP], base), 0, n);
        PipeBarrier<PIPE_V>();
        Maxs(wIdx_, wIdx_, 0, n);
        PipeBarrier<PIPE_V>();
        HeatEntry(wIdx_, n);
        SplitIdx(win_[avsg::SEC_HT], wIdx_);
        GatherVals(win_[avsg::SEC_HT], wSlot_, 0, avsg::kReuseHeatMax);
        Adds(a, wSlot_, 0, n);
        PipeBarrier<PIPE_V>();
        LogBits(a, fa, 21, n);                                    // log4(heat)
        Adds(b, ChunkOf(win_[avsg::SEC_SC], base), 0, n);
        PipeBarrier<PIPE_V>();
        ClampInts(b, 0, avsg::kReuseCountMax, n);
        LogBits(b, fb, 20, n);                                    // log8(count)
        Add(a, a, b, n);
        PipeBarrier<PIPE_V>();
        const LocalTensor<int32_t> age = ChunkOf(win_[avsg::SEC_SL], base);
        Maxs(b, age, 0, n);
        PipeBarrier<PIPE_V>();
        LogBits(b, fb, 20, n);                                    // log8(age)
        Sub(a, a, b, n);
        PipeBarrier<PIPE_V>();
        Cast(fa, a, RoundMode::CAST_RINT, n);
        Cast(fb, age, RoundMode::CAST_RINT, n);                   // age in [-1, 1023]: exact
        PipeBarrier<PIPE_V>();
        CompareScalar(mA_, fb, 0.0f, CMPMODE::NE, n);             // used this step: pinned
        PipeBarrier<PIPE_V>();
        Select(fa, mA_, fa, static_cast<float>(avsg::kScorePinned), SELMODE::VSEL_TENSOR_SCALAR_MODE, n);
        PipeBarrier<PIPE_V>();
        CompareScalar(mA_, fb, -1.0f, CMPMODE::NE, n);            // free: first
        PipeBarrier<PIPE_V>();
        Select(fa, mA_, fa, static_cast<float>(avsg::kScoreFree), SELMODE::VSEL_TENSOR_SCALAR_MODE, n);
        Sync<HardEvent::V_MTE3>();
        StoreInts(wsGm_[t_.wsScoreOff + base], fa.ReinterpretCast<int32_t>(), MinU(n, t_.capacity - base));
        Sync<HardEvent::MTE3_V>();
    }
    // lru: score -age (exact in float: ages are in [-1, 1023] after DecayAndPin), free and pinned
    // slots as in ScoreChunk, with the lru's bounds
    __aicore__ inline void ScoreChunkLru(uint32_t base, uint32_t n) {
        const LocalTensor<float> fa = VF(1), fb = VF(4);
        const LocalTensor<int32_t> age = ChunkOf(win_[avsg::SEC_SL], base);
        Sync<HardEvent::S_V>();                   // scalar writes of the windows
        PipeBarrier<PIPE_V>();
        Cast(fb, age, RoundMode::CAST_RINT, n);
        PipeBarrier<PIPE_V>();
        Muls(fa, fb, -1.0f, n);
        CompareScalar(mA_, fb, 0.0f, CMPMODE::NE, n);             // used this step: pinned
        PipeBarrier<PIPE_V>();
        Select(fa, mA_, fa, static_cast<float>(avsg::kLruScorePinned), SELMODE::VSEL_TENSOR_SCALAR_MODE, n);
        PipeBarrier<PIPE_V>();
        CompareScalar(mA_, fb, -1.0f, CMPMODE::NE, n);            // free: first
        PipeBarrier<PIPE_V>();
        Select(fa, mA_, fa, static_cast<float>(avsg::kLruScoreFree), SELMODE::VSEL_TENSOR_SCALAR_MODE, n);
        Sync<HardEvent::V_MTE3>();
        StoreInts(wsGm_[t_.wsScoreOff + base], fa.ReinterpretCast<int32_t>(), MinU(n, t_.capacity - base));
        Sync<HardEvent::MTE3_V>();
    }
    // scores of slots [base, base+n) back into V(1) (float), padding slots and slots past the
    // active capacity (resize) as SCORE_PINNED: never victims
    __aicore__ inline LocalTensor<float> LoadScores(uint32_t base, uint32_t n) {
        const LocalTensor<float> sc = VF(1);
        Sync<HardEvent::S_V>();
        PipeBarrier<PIPE_V>();                    // the previous chunk's readers of sc
        Duplicate(sc, static_cast<float>(avsg::kScorePinned), t_.nc);
        Sync<HardEvent::V_MTE2>();
        Sync<HardEvent::S_MTE2>();
        Sync<HardEvent::MTE3_MTE2>();
        LoadInts(sc.ReinterpretCast<int32_t>(), wsGm_[t_.wsScoreOff + base],
                 base < activeCap_ ? MinU(n, activeCap_ - base) : 0u,
                 0x42FE0000);   // float bits of 127.0 (SCORE_PINNED)
        Sync<HardEvent::MTE2_V>();
        return sc;
    }
    static constexpr uint32_t kThresholdsPerPass = 7;
    // counts[i] = count(score <= theta[i]) for k <= 7 thresholds in one pass over the scores: each
    // chunk is loaded once for all of them (the loads and their syncs, not the compares, are what
    // a pass costs)
    __aicore__ inline void CountAtMost(const int32_t* theta, uint32_t k, uint32_t* counts) {
        for (uint32_t i = 0; i < k; ++i) counts[i] = 0;
        for (uint32_t base = 0; base < activeCap_; base += t_.nc) {   // the rest is pinned
            const uint32_t n = MinU(t_.nc, t_.capPad - base);
            const LocalTensor<float> sc = LoadScores(base, n);
            uint64_t got[kThresholdsPerPass] = {};
            for (uint32_t i = 0; i < k; ++i) {
                CompareScalar(mA_, sc, static_cast<float>(theta[i]), CMPMODE::LE, n);
                PipeBarrier<PIPE_V>();
                GatherMask(V(5), sc.ReinterpretCast<int32_t>(), U32(mA_), true, n, GatherMaskParams(1, 1, 8, 0),
                           got[i]);
                PipeBarrier<PIPE_V>();
            }
            Sync<HardEvent::V_S>();
            for (uint32_t i = 0; i < k; ++i) counts[i] += static_cast<uint32_t>(got[i]);
        }
    }
    // Victims: the m slots with the lowest (score, slot), in ascending slot order -> miss_slots.
    // Threshold theta (the smallest with count(score <= theta) >= m) by an 8-ary search: each pass
    // counts 7 thresholds spread over (lo, hi) (3 passes over the scores for reuse, 4 for lru, where
    // a binary search takes 8 and 11), then every slot below it and the first (m - count below)
    // ties, found by a running tie count.
    __aicore__ inline void AllocateByScore(uint32_t r, uint32_t m) {
        if (m == 0) return;
        const uint32_t nc = t_.nc;
        const uint64_t rowN = static_cast<uint64_t>(r) * t_.N;
        for (uint32_t base = 0; base < t_.capPad; base += nc) {
            if (lru_) ScoreChunkLru(base, MinU(nc, t_.capPad - base));
            else ScoreChunk(base, MinU(nc, t_.capPad - base));
        }
        int32_t lo = (lru_ ? avsg::kLruScoreFree : avsg::kScoreFree) - 1;
        int32_t hi = lru_ ? avsg::kLruScorePinned : avsg::kScorePinned;
        uint32_t below = 0;                       // count(score <= lo) < m <= count(score <= hi)
        while (hi - lo > 1) {
            const int32_t span = hi - lo;
            const uint32_t k = MinU(kThresholdsPerPass, static_cast<uint32_t>(span - 1));
            int32_t theta[kThresholdsPerPass];
            uint32_t cnt[kThresholdsPerPass];
            for (uint32_t i = 0; i < k; ++i)      // strictly increasing inside (lo, hi): span > k
                theta[i] = lo + static_cast<int32_t>(static_cast<uint32_t>(span) * (i + 1) / (k + 1));
            CountAtMost(theta, k, cnt);
            for (uint32_t i = 0; i < k; ++i) {
                if (cnt[i] >= m) {
                    hi = theta[i];
                    break;
                }
                lo = theta[i];
                below = cnt[i];
            }
        }
        const float theta = static_cast<float>(hi);
        uint32_t ties = m - below, have = 0;       // ties still to take, victims stored
        const LocalTensor<int32_t> ids = V(0), tieIds = V(5), out = V(6);
        const LocalTensor<float> idsF = VF(4);
        for (uint32_t base = 0; base < activeCap_ && have < m; base += nc) {
            const uint32_t n = MinU(nc, t_.capPad - base);
            const LocalTensor<float> sc = LoadScores(base, n);
            CompareScalar(mA_, sc, theta, CMPMODE::LT, n);
            CompareScalar(mB_, sc, theta, CMPMODE::EQ, n);
            Adds(ids, vLane_, static_cast<int32_t>(base), n);
            PipeBarrier<PIPE_V>();
            uint64_t e = 0;
            GatherMask(tieIds, ids, U32(mB_), true, n, GatherMaskParams(1, 1, 8, 0), e);
            Sync<HardEvent::V_S>();
            if (static_cast<uint32_t>(e) > ties) {   // the tie boundary lies in this chunk
                const float last = ties == 0 ? -1.0f : static_cast<float>(tieIds.GetValue(ties - 1));
                Sync<HardEvent::S_V>();
                Cast(idsF, ids, RoundMode::CAST_RINT, n);
                PipeBarrier<PIPE_V>();
                CompareScalar(mC_, idsF, last, CMPMODE::LE, n);
                PipeBarrier<PIPE_V>();
                And(U16(mB_), U16(mB_), U16(mC_), n / 16);
                PipeBarrier<PIPE_V>();
                ties = 0;
            } else {
                ties -= static_cast<uint32_t>(e);
            }
            Or(U16(mA_), U16(mA_), U16(mB_), n / 16);
            PipeBarrier<PIPE_V>();
            uint64_t got = 0;
            GatherMask(out, ids, U32(mA_), true, n, GatherMaskParams(1, 1, 8, 0), got);
            Sync<HardEvent::V_S>();
            const uint32_t take = MinU(static_cast<uint32_t>(got), m - have);
            if (take) {
                Sync<HardEvent::V_MTE3>();
                StoreInts(missSlotsGm_[rowN + have], out, take);
                Sync<HardEvent::MTE3_V>();
                have += take;
            }
        }
        Sync<HardEvent::MTE3_S>();
        missChunk_ = -1;                          // vWant_ / vMS_ were used as scratch
    }
    // Evicted positions leave their counts as ghosts (entry p mod G, tag p >> log2 G), then each miss
    // takes its own back (when the tag is its own) + the return gain: all spills before any reload,
    // in miss order (reference: _reuse_install).
    __aicore__ inline void ScatterVictimsReuse(uint32_t r, uint32_t m) {
        Win& sp = win_[avsg::SEC_SP];
        Win& sc = win_[avsg::SEC_SC];
        Win& pc = win_[avsg::SEC_PC];
        for (uint32_t j0 = 0; j0 < m; j0 += t_.nc) {
            const uint32_t n = LoadMisses(r, j0, m);
            for (uint32_t q = 0; q < n; ++q) {
                const uint32_t s = static_cast<uint32_t>(vMS_.GetValue(q));
                const int32_t old = Get(sp, s);
                if (old >= 0) Put(pc, GhostEntry(old), GhostTag(old) << avsg::kGhostCountBits | ClampCount(Get(sc, s)));
            }
        }
        for (uint32_t j0 = 0; j0 < m; j0 += t_.nc) {
            const uint32_t n = LoadMisses(r, j0, m);
            for (uint32_t q = 0; q < n; ++q) {
                const uint32_t s = static_cast<uint32_t>(vMS_.GetValue(q));
                const int32_t pos = vWant_.GetValue(q);
                const int32_t ghost = Get(pc, GhostEntry(pos));
                const int32_t c = ((ghost >> avsg::kGhostCountBits) == GhostTag(pos) ? ghost & avsg::kGhostCountMask : 0) +
                                  avsg::kReuseGainReturn;
                Put(sc, s, c < avsg::kReuseCountMax ? c : avsg::kReuseCountMax);   // a miss is a return
                Put(sp, s, pos);
                Put(win_[avsg::SEC_SL], s, 0);
            }
        }
    }

    __aicore__ inline uint32_t GhostEntry(int32_t pos) const {
        return static_cast<uint32_t>(pos) & ((1u << t_.ghostLog) - 1);
    }
    __aicore__ inline int32_t GhostTag(int32_t pos) const { return pos >> t_.ghostLog; }

    // Streams miss_pos / miss_slots chunk j0 back into vWant_ / vMS_ (tail lanes = 0).
    __aicore__ inline uint32_t LoadMisses(uint32_t r, uint32_t j0, uint32_t m) {
        const uint64_t rowN = static_cast<uint64_t>(r) * t_.N;
        const uint32_t n = MinU(t_.nc, m - j0);
        if (missChunk_ == static_cast<int32_t>(j0 / t_.nc)) return n;   // still in vWant_ / vMS_
        missChunk_ = static_cast<int32_t>(j0 / t_.nc);
        Sync<HardEvent::S_V>();   // the previous chunk's scalar reads of vWant_/vMS_ (write-after-read)
        Duplicate(vWant_, 0, t_.nc);
        Duplicate(vMS_, 0, t_.nc);
        Sync<HardEvent::V_MTE2>();
        Sync<HardEvent::S_MTE2>();
        Sync<HardEvent::MTE3_MTE2>();
        LoadInts(vWant_, missPosGm_[rowN + j0], n, 0);
        LoadInts(vMS_, missSlotsGm_[rowN + j0], n, 0);
        Sync<HardEvent::MTE2_V>();
        Sync<HardEvent::MTE2_S>();
        return n;
    }

    __aicore__ inline void ScatterVictims(uint32_t r, uint32_t m) {
        for (uint32_t j0 = 0; j0 < m; j0 += t_.nc) {
            const uint32_t n = LoadMisses(r, j0, m);
            for (uint32_t q = 0; q < n; ++q) {
                const uint32_t s = static_cast<uint32_t>(vMS_.GetValue(q));
                Put(win_[avsg::SEC_SP], s, vWant_.GetValue(q));
                Put(win_[avsg::SEC_SL], s, lru_ ? 0 : static_cast<int32_t>(t_.lifetime));   // lru: an age
            }
        }
    }

    // Insert: 4 rounds; in round i every pending miss proposes its bucket_i, and a free bucket
    // (never used or stale) goes to the lowest proposing j.
    //  A. Freeness of all 4 buckets of every miss, with all-probe gathers (each window loaded at
    //     most once per miss chunk). A bucket's freeness changes during the rounds only when a
    //     miss wins it (slot_pos is not written during the insert, and a winner's entry is valid:
    //     its slot holds its position), so "free now" = "free before round 0 and not claimed in
    //     any round so far": claimBits_ is cleared once, not per round.
    //  B. The rounds on the scalar unit, in (round, j) order: claims, winner bits per probe.
    //  C. The winners are written window by window (no window ping-pong between claims).
    __aicore__ inline void Insert(uint32_t r, uint32_t m) {
        const uint32_t nc = t_.nc, n = Wide();
        for (uint32_t w = 0; w < t_.pendWords; ++w) {
            const uint32_t lo = w * 32;
            uint32_t word = 0;
            if (lo + 32 <= m) word = 0xFFFFFFFFu;
            else if (lo < m) word = (1u << (m - lo)) - 1u;
            pendBits_.SetValue(w, word);
        }
        if (m == 0) return;
        Win& bk = win_[avsg::SEC_BK];
        Win& bs = win_[avsg::SEC_BS];
        Win& sp = win_[avsg::SEC_SP];
        const uint32_t chunks = (m + nc - 1) / nc;
        const uint32_t freeWords = n / 32;
        const LocalTensor<int32_t> freeInts = mKey_.ReinterpretCast<int32_t>();
        // A. free bits (mKey_, W bits per miss chunk; kept in the workspace when there are several).
        // Last chunk first: ScatterVictims left it in vWant_ / vMS_.
        for (uint32_t c = chunks; c-- > 0;) {
            LoadMisses(r, c * nc, m);
            Sync<HardEvent::S_V>();               // ScatterVictims' scalar writes of the windows
            Hash(vWant_, nc);
            Buckets();
            SplitIdx(bk, wIdx_);
            GatherVals(bk, wKey_, -1, static_cast<int32_t>(avsg::kMaxPosition));
            GatherVals(bs, wSlot_, 0, SlotMax());
            Adds(wIdx_, wSlot_, 0, n);
            CompareScalar(mKey_, wKey_, -1, CMPMODE::EQ, n);     // never used
            PipeBarrier<PIPE_V>();
            SplitIdx(sp, wIdx_);
            MatchBits(sp, wKey_, true, mOwn_);                   // valid: slot_pos[slot] == key
            Not(U16(mOwn_), U16(mOwn_), n / 16);
            PipeBarrier<PIPE_V>();
            Or(U16(mKey_), U16(mKey_), U16(mOwn_), n / 16);      // free = never used | stale
            if (chunks > 1) {
                Sync<HardEvent::V_MTE3>();
                StoreInts(wsGm_[t_.wsFreeOff + c * freeWords], freeInts, freeWords);
                Sync<HardEvent::MTE3_V>();
            }
        }
        // B. rounds (vFirst_/vStride_/vWant_/vMS_/mKey_ still hold miss chunk 0). The free
        // bits of (round i, chunk c) are spent by that pass, so it overwrites them with its winners:
        // mKey_ (and, with several chunks, the workspace copy) ends up as per-probe winner bits.
        Duplicate(claimBits_.ReinterpretCast<uint16_t>(), static_cast<uint16_t>(0), t_.buckets / 16);
        Sync<HardEvent::V_S>();
        const LocalTensor<uint32_t> bits = freeInts.ReinterpretCast<uint32_t>();
        int32_t loaded = 0;
        for (uint32_t i = 0; i < avsg::kPlanProbes; ++i) {
            for (uint32_t c = 0; c < chunks; ++c) {
                const uint32_t j0 = c * nc;
                const uint32_t cnt = MinU(nc, m - j0);
                if (loaded != static_cast<int32_t>(c)) {
                    LoadInsertChunk(r, c, m);
                    loaded = static_cast<int32_t>(c);
                }
                Sync<HardEvent::S_V>();           // the previous pass's scalar reads of vB_
                Probe(static_cast<int32_t>(i), nc);
                Sync<HardEvent::V_S>();
                // 32 misses per step: candidates = pending & bucket free, lowest j first (j0 is a
                // multiple of 32; pending bits past m are 0)
                for (uint32_t w = 0; w < (cnt + 31) / 32; ++w) {
                    const uint32_t pw = (j0 >> 5) + w;
                    const uint32_t fw = i * nc / 32 + w;
                    uint32_t pend = pendBits_.GetValue(pw);
                    uint32_t cand = pend == 0 ? 0u : pend & bits.GetValue(fw);
                    uint32_t won = 0;
                    for (; cand != 0; cand &= cand - 1u) {
                        const uint32_t bit = LowestBit(cand);
                        const uint32_t b = static_cast<uint32_t>(vB_.GetValue(w * 32 + bit));
                        if (WordBit(claimBits_, b)) continue;
                        SetWordBit(claimBits_, b);
                        won |= 1u << bit;
                    }
                    bits.SetValue(fw, won);
                    if (won != 0) pendBits_.SetValue(pw, pend & ~won);
                }
                if (chunks > 1) {                 // winners of (i, c) back over its free bits
                    Sync<HardEvent::S_MTE3>();
                    StoreInts(wsGm_[t_.wsFreeOff + c * freeWords + i * nc / 32], freeInts[i * nc / 32], nc / 32);
                    Sync<HardEvent::MTE3_S>();
                }
            }
        }
        // C. write the winners, window by window: for each miss chunk, recompute its buckets and,
        // per window and probe, compact the winners (offset in the window, key, slot) by GatherMask
        for (uint32_t c = 0; c < chunks; ++c) {
            const uint32_t cnt = MinU(nc, m - c * nc);
            if (loaded != static_cast<int32_t>(c)) {
                LoadInsertChunk(r, c, m);
                loaded = static_cast<int32_t>(c);
            }
            Sync<HardEvent::S_V>();               // scalar reads / writes of vB_ and the bits
            Buckets();
            SplitIdx(bk, wIdx_);
            WriteWinners(cnt);
        }
    }

    // Misses, hash and free/winner bits of miss chunk c (insert with several miss chunks).
    __aicore__ inline void LoadInsertChunk(uint32_t r, uint32_t c, uint32_t m) {
        const uint32_t freeWords = Wide() / 32;
        LoadMisses(r, c * t_.nc, m);
        Sync<HardEvent::S_MTE2>();
        Sync<HardEvent::V_MTE2>();
        Sync<HardEvent::MTE3_MTE2>();
        LoadInts(mKey_.ReinterpretCast<int32_t>(), wsGm_[t_.wsFreeOff + c * freeWords], freeWords, 0);
        Sync<HardEvent::MTE2_S>();
        Sync<HardEvent::MTE2_V>();
        Hash(vWant_, t_.nc);
    }

    // bucket_key / bucket_slot of this chunk's winners (mKey_: per-probe winner bits; wIdx_: the
    // probe buckets as in-window byte offsets, wWin_: their windows), resident window first.
    __aicore__ inline void WriteWinners(uint32_t cnt) {
        const uint32_t nc = t_.nc, n = Wide();
        Win& bk = win_[avsg::SEC_BK];
        Win& bs = win_[avsg::SEC_BS];
        const LocalTensor<int32_t> cOff = wSlot_, cKey = wSlot_[nc], cSlot = wSlot_[2 * nc];   // compacted
        const int32_t first = FirstWin(bk);
        for (uint32_t k = 0; k < bk.nwin; ++k) {
            const int32_t id = static_cast<int32_t>((static_cast<uint32_t>(first) + k) % bk.nwin);
            LocalTensor<uint8_t> sel = mKey_;
            if (bk.nwin > 1) {
                CompareScalar(mWin_, wWin_, id, CMPMODE::EQ, n);
                PipeBarrier<PIPE_V>();
                And(U16(mTmp_), U16(mKey_), U16(mWin_), n / 16);
                PipeBarrier<PIPE_V>();
                sel = mTmp_;
            }
            for (uint32_t i = 0; i < avsg::kPlanProbes; ++i) {
                const LocalTensor<uint32_t> pat = U32(sel[i * nc / 8]);
                uint64_t got = 0, got2 = 0, got3 = 0;
                Sync<HardEvent::S_V>();           // scalar reads of the previous lists
                PipeBarrier<PIPE_V>();            // and the previous GatherMasks' writes
                GatherMask(cOff, wIdx_[i * nc], pat, true, cnt, GatherMaskParams(1, 1, 8, 0), got);
                if (got == 0) continue;
                GatherMask(cKey, vWant_, pat, true, cnt, GatherMaskParams(1, 1, 8, 0), got2);
                GatherMask(cSlot, vMS_, pat, true, cnt, GatherMaskParams(1, 1, 8, 0), got3);
                Sync<HardEvent::V_S>();
                Ensure(bk, id);
                Ensure(bs, id);
                for (uint32_t q = 0; q < static_cast<uint32_t>(got); ++q) {
                    const uint32_t off = static_cast<uint32_t>(cOff.GetValue(q)) >> 2;
                    bk.buf.SetValue(off, cKey.GetValue(q));
                    bs.buf.SetValue(off, cSlot.GetValue(q));
                }
                bk.dirty = bs.dirty = true;
            }
        }
    }

    // Drops stale stash entries, order kept. Liveness (slot_pos[clamped slot] == key) is tested
    // nc entries at a time with the all-probe gather (the slots in the first nc lanes), and the
    // live entries are compacted by GatherMask; only their write-back is scalar. A scalar test per
    // entry would alternate between the window being read (k) and the one written (c < k) at
    // every entry once one entry was dropped, a window reload each time with small stash windows.
    __aicore__ inline void CompactStash() {
        const uint32_t nc = t_.nc, W = Wide();
        Win& sk = win_[avsg::SEC_SK];
        Win& ss = win_[avsg::SEC_SS];
        const LocalTensor<int32_t> keys = vKey_, slots = vSlot_, liveKeys = vFoundI_, liveSlots = vFirst_;
        uint32_t c = 0;
        for (uint32_t base = 0; base < stashCount_; base += nc) {
            const uint32_t n = MinU(nc, stashCount_ - base);
            Sync<HardEvent::S_V>();               // scalar writes of the windows / reads of the lists
            PipeBarrier<PIPE_V>();
            CopySection(sk, base, n, keys);
            CopySection(ss, base, n, slots);
            Duplicate(wIdx_, 0, W);
            PipeBarrier<PIPE_V>();
            Adds(wIdx_, slots, 0, n);
            PipeBarrier<PIPE_V>();
            ClampInts(wIdx_, 0, SlotMax(), n);
            SplitIdx(win_[avsg::SEC_SP], wIdx_);
            MatchBits(win_[avsg::SEC_SP], keys, false, mOwn_);   // first nc bits: live
            uint64_t cnt = 0, cnt2 = 0;
            GatherMask(liveKeys, keys, U32(mOwn_), true, n, GatherMaskParams(1, 1, 8, 0), cnt);
            GatherMask(liveSlots, slots, U32(mOwn_), true, n, GatherMaskParams(1, 1, 8, 0), cnt2);
            Sync<HardEvent::V_S>();
            if (c == base && static_cast<uint32_t>(cnt) == n) {   // nothing dropped so far
                c += n;
                continue;
            }
            for (uint32_t q = 0; q < static_cast<uint32_t>(cnt); ++q, ++c) {
                Put(sk, c, liveKeys.GetValue(q));
                Put(ss, c, liveSlots.GetValue(q));
            }
        }
        for (uint32_t k = c; k < stashCount_; ++k) {
            Put(sk, k, -1);
            Put(ss, k, 0);
        }
        stashCount_ = c;
    }

    __aicore__ inline void AppendPending(uint32_t r, uint32_t m) {
        for (uint32_t j0 = 0; j0 < m; j0 += t_.nc) {
            const uint32_t n = LoadMisses(r, j0, m);
            for (uint32_t q = 0; q < n; ++q) {
                if (!WordBit(pendBits_, j0 + q)) continue;
                if (stashCount_ >= t_.capacity) return;   // full: only a corrupted state gets here
                Put(win_[avsg::SEC_SK], stashCount_, vWant_.GetValue(q));
                Put(win_[avsg::SEC_SS], stashCount_, vMS_.GetValue(q));
                ++stashCount_;
            }
        }
    }

    __aicore__ inline void FillTail(const GlobalTensor<int32_t>& g, uint64_t rowN, uint32_t from, uint32_t to) {
        if (from >= to) return;
        Duplicate(vT1_, -1, t_.nc);
        Sync<HardEvent::V_MTE3>();
        for (uint32_t j = from; j < to; j += t_.nc) StoreInts(g[rowN + j], vT1_, MinU(t_.nc, to - j));
        Sync<HardEvent::MTE3_V>();
    }

    // Step 4: the slots of the lanes the match missed (reference: miss_slots[searchsorted]).
    // Classify stored every chunk's match (final for hits and invalid lanes) and its sorted miss
    // run's lanes; MergeMisses stored each run entry's index j in miss_pos (or -2 - slot for a
    // stash hit). So a missed lane's slot is miss_slots[j], with j ascending along the run: one
    // pass per chunk with misses, miss_slots streamed in nc blocks, no second lookup.
    __aicore__ inline void OutputMisses(uint32_t r, uint32_t m) {
        const uint32_t nc = t_.nc;
        const uint64_t rowN = static_cast<uint64_t>(r) * t_.N;
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

    // The row was built (reset) with the geometry and lifetime of this call, and its active
    // capacity (resize) lets a step's N selections fit without leaving the allocation; it is
    // kept for the victim searches.
    __aicore__ inline bool HeaderMatches() {
        activeCap_ = static_cast<uint32_t>(headerUb_.GetValue(avsg::kHeaderActive));
        return activeCap_ >= t_.N && activeCap_ <= t_.capacity &&
               static_cast<uint32_t>(headerUb_.GetValue(0)) == avsg::kHeaderMagic &&
               static_cast<uint32_t>(headerUb_.GetValue(avsg::kHeaderCapacity)) == t_.capacity &&
               static_cast<uint32_t>(headerUb_.GetValue(avsg::kHeaderBuckets)) == t_.buckets &&
               static_cast<uint32_t>(headerUb_.GetValue(avsg::kHeaderLifetime)) == t_.lifetime &&
               static_cast<uint32_t>(headerUb_.GetValue(avsg::kHeaderPolicy)) == t_.policy &&
               static_cast<uint32_t>(headerUb_.GetValue(avsg::kHeaderMaxContext)) == t_.maxContext;
    }
    // A row whose header does not match: state and stats untouched; no selection, no miss, and
    // miss_counts[r] = -1 so the caller can tell (the CPU host raises before this point).
    __aicore__ inline void RejectRow(uint32_t r) {
        const uint64_t rowN = static_cast<uint64_t>(r) * t_.N;
        Sync<HardEvent::S_V>();
        FillTail(slotsGm_, rowN, 0, t_.N);
        FillTail(missPosGm_, rowN, 0, t_.N);
        FillTail(missSlotsGm_, rowN, 0, t_.N);
        scalarUb_.SetValue(0, -1);
        Sync<HardEvent::S_MTE3>();
        StoreInts(missCountsGm_[r], scalarUb_, 1);
        Sync<HardEvent::MTE3_S>();
        Sync<HardEvent::MTE3_V>();
        Sync<HardEvent::MTE3_MTE2>();
    }

    // Row start, owner and helpers alike: windows bound, seq_len and header loaded, hit bitmap
    // cleared; false if the header does not match (the row is left alone). Sets the lookup bound.
    __aicore__ inline bool StartRow(uint32_t r) {
        BindRow(r);
        missChunk_ = -1;
        Sync<HardEvent::S_MTE2>();
        Sync<HardEvent::MTE3_MTE2>();
        LoadInts(scalarUb_, seqGm_[r], 1, 0);
        DataCopy(headerUb_, stateGm_[static_cast<uint64_t>(r) * t_.width], avsg::kHeaderWords + avsg::kStashCountPad);
        Duplicate(hitBits_.ReinterpretCast<uint16_t>(), static_cast<uint16_t>(0), t_.capPad / 16);
        Sync<HardEvent::MTE2_S>();
        Sync<HardEvent::V_S>();
        if (!HeaderMatches()) return false;
        int32_t seq = scalarUb_.GetValue(0);
        if (seq > static_cast<int32_t>(avsg::kMaxPosition)) seq = static_cast<int32_t>(avsg::kMaxPosition);
        if (t_.maxContext && seq > static_cast<int32_t>(t_.maxContext)) seq = static_cast<int32_t>(t_.maxContext);
        boundF_ = static_cast<float>(seq);
        lookups_ = hits_ = misses_ = 0;
        return true;
    }
    // padding slots free, so Allocate's free count and the dual pointer's resident runs see only
    // real slots. Nothing before DecayAndPin reads them in the hash plan (every slot read from
    // the index or the stash is clamped to [0, S-1]), so a split row resets them after its
    // lookup: no GM write of the owner overlaps the helpers' reads of slot_pos.
    __aicore__ inline void FreePadding() {
        for (uint32_t s = t_.capacity; s < t_.capPad; ++s) {
            if (Get(win_[avsg::SEC_SP], s) != -1) Put(win_[avsg::SEC_SP], s, -1);
            if (Get(win_[avsg::SEC_SL], s) != -1) Put(win_[avsg::SEC_SL], s, -1);
            if (reuse_ && Get(win_[avsg::SEC_SC], s) != 0) Put(win_[avsg::SEC_SC], s, 0);
        }
    }
    // Every core of a split launch calls this exactly once (rejected rows included): the soft
    // form (zeroed counters after the cores' slices, wIdx_ as its UB scratch) needs no mixed
    // kernel type. Its PipeBarrier<PIPE_ALL> completes the helpers' stores before the owner loads.
    __aicore__ inline void SyncParts() {
        const uint32_t blocks = static_cast<uint32_t>(GetBlockNum());
        GlobalTensor<int32_t> counters;
        counters.SetGlobalBuffer(wsBase_ + static_cast<uint64_t>(blocks) * t_.wsPerCore, blocks * avsg::kPlanSyncWords);
        SyncAll(counters, wIdx_, 0);
    }
    // Lookup part of a split row (helper core): its chunks looked up and classified as the owner
    // does its own; slots to the row's output, miss runs to the owner's workspace slice; then its
    // counts, run lengths and hit bitmap to its part region there. Reads of the row's state only.
    __aicore__ inline void HelpRow(uint32_t r) {
        if (StartRow(r)) {
            for (uint32_t c = part_; c < t_.numChunks; c += split_) {
                const uint32_t n = PrepareWant(r, c);
                Match(c);
                Classify(r, c, n);
            }
            const LocalTensor<int32_t> head = vFoundI_;
            const uint32_t headLen = avsg::kPlanPartHead + t_.numChunks;
            Sync<HardEvent::MTE3_S>();            // Classify's store of vFoundI_ (write-after-read)
            Sync<HardEvent::V_S>();
            head.SetValue(0, static_cast<int32_t>(lookups_));
            head.SetValue(1, static_cast<int32_t>(hits_));
            head.SetValue(2, static_cast<int32_t>(misses_));
            head.SetValue(3, 0);
            for (uint32_t c = 0; c < t_.numChunks; ++c)
                head.SetValue(avsg::kPlanPartHead + c, static_cast<int32_t>(missRuns_.len[c]));
            const uint32_t off = t_.wsPartOff + part_ * t_.partWords;
            Sync<HardEvent::S_MTE3>();
            StoreInts(rowWs_[off], head, headLen);
            StoreInts(rowWs_[off + avsg::RoundUp(headLen, 8)], hitBits_.ReinterpretCast<int32_t>(), t_.capPad / 32);
            Sync<HardEvent::MTE3_S>();
            Sync<HardEvent::MTE3_V>();
        }
        SyncParts();
    }
    // Owner, after the SyncAll: the helpers' counts and run lengths, their hit bits or-ed in.
    __aicore__ inline void FoldParts() {
        const LocalTensor<int32_t> head = vFoundI_, bits = wIdx_;
        const uint32_t headLen = avsg::kPlanPartHead + t_.numChunks;
        for (uint32_t p = 1; p < split_; ++p) {
            const uint32_t off = t_.wsPartOff + p * t_.partWords;
            Sync<HardEvent::S_MTE2>();
            Sync<HardEvent::V_MTE2>();
            Sync<HardEvent::MTE3_MTE2>();
            LoadInts(head, rowWs_[off], headLen, 0);
            LoadInts(bits, rowWs_[off + avsg::RoundUp(headLen, 8)], t_.capPad / 32, 0);
            Sync<HardEvent::MTE2_S>();
            Sync<HardEvent::MTE2_V>();
            Sync<HardEvent::S_V>();               // the owner's scalar writes of the bitmap
            Or(hitBits_.ReinterpretCast<uint16_t>(), hitBits_.ReinterpretCast<uint16_t>(),
               bits.ReinterpretCast<uint16_t>(), t_.capPad / 16);
            lookups_ += head.GetValue(0);
            hits_ += head.GetValue(1);
            misses_ += head.GetValue(2);
            for (uint32_t c = p; c < t_.numChunks; c += split_)
                missRuns_.len[c] = static_cast<uint32_t>(head.GetValue(avsg::kPlanPartHead + c));
            PipeBarrier<PIPE_V>();
            Sync<HardEvent::V_S>();
        }
    }

    __aicore__ inline void Row(uint32_t r) {
        const uint64_t rowState = static_cast<uint64_t>(r) * t_.width;
        const uint64_t rowN = static_cast<uint64_t>(r) * t_.N;
        if (!StartRow(r)) {
            RejectRow(r);
            if (split_ > 1) SyncParts();
            return;
        }
        const int32_t count = countUb_.GetValue(0);
        stashCount_ = count < 0 ? 0u : MinU(static_cast<uint32_t>(count), t_.capacity);
        if (split_ == 1) FreePadding();
        if (reuse_) CoolHeat();

        // 0. stash compaction #1, and the sorted stash (hash plan) or the matches (dual pointer)
        if (stashCount_ > 0) CompactStash();
        stashRuns_.runs = 0;
        if (!kDual && stashCount_ > 0) BuildStashRuns();
        if (kDual) {
            BuildResidentRuns();
            DualMatchRow(r);
        }
        // 1+2. refresh and classify, chunk by chunk; the stash hits join the hits in the merge,
        // before the decay pins them
        for (uint32_t c = 0; c < t_.numChunks; c += split_) {
            const uint32_t n = PrepareWant(r, c);
            Match(c);
            Classify(r, c, n);
        }
        if (split_ > 1) {
            SyncParts();
            FoldParts();
            FreePadding();
        }
        const uint32_t m = MergeMisses(r);
        if (reuse_) HeatUsed(r, m);
        DecayAndPin();
        // 3. allocate and install
        if (reuse_) {
            AllocateByScore(r, m);
            ScatterVictimsReuse(r, m);
        } else if (lru_) {
            AllocateByScore(r, m);
            ScatterVictims(r, m);
        } else {
            Allocate(r, m);
            ScatterVictims(r, m);
        }
        Insert(r, m);
        bool pending = false;
        for (uint32_t w = 0; w < t_.pendWords && !pending; ++w) pending = pendBits_.GetValue(w) != 0;
        if (stashCount_ > 0 || pending) {
            CompactStash();
            AppendPending(r, m);
        }
        // 4. output: every selection's slot
        OutputMisses(r, m);
        FillTail(missPosGm_, rowN, m, t_.N);
        FillTail(missSlotsGm_, rowN, m, t_.N);
        // counts, stats, stash count, state write-back
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
        if (reuse_) AdvanceStep();
        Sync<HardEvent::S_MTE3>();
        DataCopy(statsGm_[static_cast<uint64_t>(r) * 4], statsUb_, 4);
        StoreInts(missCountsGm_[r], scalarUb_, 1);
        DataCopy(stateGm_[rowState + t_.stashCountOff], countUb_, avsg::kStashCountPad);
        for (uint32_t s = 0; s < avsg::SEC_COUNT; ++s) Flush(win_[s]);
        Sync<HardEvent::MTE3_S>();
        Sync<HardEvent::MTE3_V>();
        Sync<HardEvent::MTE3_MTE2>();
    }

    PlanTiling t_;
    GlobalTensor<int32_t> topkGm_, seqGm_, stateGm_, slotsGm_, missPosGm_, missSlotsGm_, missCountsGm_, wsGm_;
    GlobalTensor<int64_t> statsGm_;
    TBuf<TPosition::VECCALC> vecBuf_[avsg::kPlanVectors];
    TBuf<TPosition::VECCALC> maskBuf_[avsg::kPlanMasks];
    TBuf<TPosition::VECCALC> tilingBuf_, alignedBuf_, hitBuf_, claimBuf_, pendBuf_, headBuf_, treeBuf_;
    TBuf<TPosition::VECCALC> statsBuf_, scalarBuf_, headerBuf_;
    TBuf<TPosition::VECCALC> winBuf_[avsg::SEC_COUNT];
    Win win_[avsg::SEC_COUNT];
    LocalTensor<int32_t> vWant_, vFirst_, vStride_, vFoundI_, vMS_, vLane_, vHMask_;   // nc lanes
    LocalTensor<float> vWantF_, vFoundF_;
    LocalTensor<int32_t> wIdx_, wWin_, wSlot_, wTmp_, wKey_;                   // kPlanProbes*nc lanes
    LocalTensor<int32_t> vLo_, vHi_, vT1_, vT2_, vB_, vKey_, vSlot_;  // aliases
    LocalTensor<float> vTmpF_;
    LocalTensor<uint8_t> mKey_, mOwn_, mWin_, mTmp_, mA_, mB_, mC_;
    LocalTensor<float> sConcat_, sDst_, sTmp_, sOutV_;
    LocalTensor<uint32_t> sIdx_, sOutI_;
    LocalTensor<uint32_t> hitBits_, claimBits_, pendBits_;
    LocalTensor<int32_t> heads_, treeUb_;
    LocalTensor<int64_t> statsUb_;
    LocalTensor<int32_t> scalarUb_, headerUb_, countUb_;
    Merger missRuns_, resRuns_, selRuns_, stashRuns_;
    float boundF_ = 0.0f;
    uint32_t stashCount_ = 0;
    __gm__ int32_t* wsBase_ = nullptr;
    GlobalTensor<int32_t> rowWs_;                 // the row's workspace: the owner core's slice
    uint32_t split_ = 1, part_ = 0;
    uint32_t freeSlots_ = 0;
    uint32_t activeCap_ = 0;                 // header word 6, checked in [N, S]: victims lie below it
    bool reuse_ = false;                     // policy: reuse (else lifetime)
    bool lru_ = false;                       // policy: lru (ages like reuse, scores -age)
    int32_t missChunk_ = -1;                 // miss chunk held by vWant_ / vMS_ (LoadMisses), -1: none                 // slots at life -1 after DecayAndPin (padding included)
    int64_t lookups_ = 0, hits_ = 0, misses_ = 0;
};

// ------------------------------------------------------------------------------ invalidate
// slot_pos >= limit -> slot_pos = -1, slot_life = -1, with limit = clamp(valid_len, -1, 2^24).
// int32 Compare is EQ only on A2, so the test runs in float on min(slot_pos, 2^24): exact, and
// equivalent to the int32 test whatever slot_pos holds (limit <= 2^24; values below -1 stay below
// -1 when rounded). The kept values are never rounded: the float test becomes an int32 lane mask
// (-1 keep, 0 drop) and the update is (x & keep) | ~keep on u16 lanes. Rows whose header does not
// match the geometry are left untouched.
class InvalidateKernel {
public:
    __aicore__ inline InvalidateKernel() {}

    __aicore__ inline void Init(TPipe* pipe, GM_ADDR state, GM_ADDR validLens, GM_ADDR tiling) {
        LoadTiling(pipe, tilingBuf_, t_, tiling);
        reuse_ = t_.secLen[avsg::SEC_SC] != 0;
        stateGm_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(state), static_cast<uint64_t>(t_.rows) * t_.width);
        lensGm_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(validLens), t_.rows);
        const uint32_t ch = t_.fillChunk;
        pipe->InitBuffer(posBuf_, ch * 4);
        pipe->InitBuffer(lifeBuf_, ch * 4);
        pipe->InitBuffer(keepBuf_, ch * 4);
        pipe->InitBuffer(notKeepBuf_, ch * 4);
        pipe->InitBuffer(maskBuf_, avsg::RoundUp(ch / 8, 32));
        pipe->InitBuffer(scalarBuf_, 32);
        pipe->InitBuffer(headerBuf_, 32);
        if (reuse_) pipe->InitBuffer(countBuf_, ch * 4);   // reuse: slot counts, ghosts
    }
    __aicore__ inline void Process() {
        const uint32_t blocks = static_cast<uint32_t>(GetBlockNum());
        LocalTensor<int32_t> pos = posBuf_.Get<int32_t>(), life = lifeBuf_.Get<int32_t>();
        LocalTensor<int32_t> keep = keepBuf_.Get<int32_t>(), notKeep = notKeepBuf_.Get<int32_t>();
        LocalTensor<float> keepF = keep.ReinterpretCast<float>(), zeroF = notKeep.ReinterpretCast<float>();
        LocalTensor<uint8_t> drop = maskBuf_.Get<uint8_t>();
        LocalTensor<int32_t> sc = scalarBuf_.Get<int32_t>(), hdr = headerBuf_.Get<int32_t>();
        LocalTensor<int32_t> count;
        if (reuse_) count = countBuf_.Get<int32_t>();
        for (uint32_t r = static_cast<uint32_t>(GetBlockIdx()); r < t_.rows; r += blocks) {
            const uint64_t base = static_cast<uint64_t>(r) * t_.width;
            Sync<HardEvent::S_MTE2>();
            DataCopyPad(sc, lensGm_[r], DataCopyExtParams(1, 4, 0, 0, 0), DataCopyPadExtParams<int32_t>(true, 0, 7, 0));
            DataCopy(hdr, stateGm_[base], avsg::kHeaderWords);
            Sync<HardEvent::MTE2_S>();
            if (static_cast<uint32_t>(hdr.GetValue(0)) != avsg::kHeaderMagic ||
                static_cast<uint32_t>(hdr.GetValue(avsg::kHeaderCapacity)) != t_.capacity ||
                static_cast<uint32_t>(hdr.GetValue(avsg::kHeaderBuckets)) != t_.buckets ||
                static_cast<uint32_t>(hdr.GetValue(avsg::kHeaderMaxContext)) != t_.maxContext)
                continue;
            int32_t lim = sc.GetValue(0);
            if (lim < -1) lim = -1;
            if (lim > static_cast<int32_t>(avsg::kMaxPosition)) lim = static_cast<int32_t>(avsg::kMaxPosition);
            const float limit = static_cast<float>(lim);
            for (uint32_t off = 0; off < t_.capPad; off += t_.fillChunk) {
                const uint32_t n = MinU(t_.fillChunk, t_.capPad - off);
                const uint32_t real = off < t_.capacity ? MinU(n, t_.capacity - off) : 0;
                if (real == 0) break;
                Sync<HardEvent::MTE3_MTE2>();
                Sync<HardEvent::V_MTE2>();
                DataCopy(pos, stateGm_[base + t_.secOff[avsg::SEC_SP] + off], n);
                DataCopy(life, stateGm_[base + t_.secOff[avsg::SEC_SL] + off], n);
                if (reuse_) DataCopy(count, stateGm_[base + t_.secOff[avsg::SEC_SC] + off], n);
                Sync<HardEvent::MTE2_V>();
                Mins(keep, pos, static_cast<int32_t>(avsg::kMaxPosition), n);
                Duplicate(zeroF, 0.0f, n);
                PipeBarrier<PIPE_V>();
                Cast(keepF, keep, RoundMode::CAST_RINT, n);
                PipeBarrier<PIPE_V>();
                CompareScalar(drop, keepF, limit, CMPMODE::GE, n);
                PipeBarrier<PIPE_V>();
                Select(keepF, drop, zeroF, -1.0f, SELMODE::VSEL_TENSOR_SCALAR_MODE, n);   // drop ? 0 : -1
                PipeBarrier<PIPE_V>();
                Cast(keep, keepF, RoundMode::CAST_RINT, n);
                PipeBarrier<PIPE_V>();
                Not(notKeep.ReinterpretCast<uint16_t>(), keep.ReinterpretCast<uint16_t>(), 2 * n);
                And(pos.ReinterpretCast<uint16_t>(), pos.ReinterpretCast<uint16_t>(), keep.ReinterpretCast<uint16_t>(),
                    2 * n);
                And(life.ReinterpretCast<uint16_t>(), life.ReinterpretCast<uint16_t>(),
                    keep.ReinterpretCast<uint16_t>(), 2 * n);
                if (reuse_)   // a freed slot's count goes to 0
                    And(count.ReinterpretCast<uint16_t>(), count.ReinterpretCast<uint16_t>(),
                        keep.ReinterpretCast<uint16_t>(), 2 * n);
                PipeBarrier<PIPE_V>();
                Or(pos.ReinterpretCast<uint16_t>(), pos.ReinterpretCast<uint16_t>(), notKeep.ReinterpretCast<uint16_t>(),
                   2 * n);
                Or(life.ReinterpretCast<uint16_t>(), life.ReinterpretCast<uint16_t>(),
                   notKeep.ReinterpretCast<uint16_t>(), 2 * n);
                Sync<HardEvent::V_MTE3>();
                DataCopyExtParams p(1, real * 4, 0, 0, 0);
                DataCopyPad(stateGm_[base + t_.secOff[avsg::SEC_SP] + off], pos, p);
                DataCopyPad(stateGm_[base + t_.secOff[avsg::SEC_SL] + off], life, p);
                if (reuse_) DataCopyPad(stateGm_[base + t_.secOff[avsg::SEC_SC] + off], count, p);
                Sync<HardEvent::MTE3_V>();
            }
            if (reuse_) ZeroGhostsFrom(base, limit, pos, life, keep, notKeep, drop, count);
        }
        Sync<HardEvent::MTE3_MTE2>();
    }

private:
    // Reuse policy: every ghost naming a position >= limit (tag * G + entry, reference.
    // ghost_positions) returns to 0, so a rejected draft's positions start from nothing when the
    // real tokens arrive. The name is formed in float: tag * G is exact (a power of two), the sum
    // rounds monotonically and every integer limit in [-1, 2^24] is exact, so the GE test is the
    // int64 one whatever the entry holds.
    __aicore__ inline void ZeroGhostsFrom(uint64_t base, float limit, const LocalTensor<int32_t>& tag,
                                          const LocalTensor<int32_t>& entry, const LocalTensor<int32_t>& keep,
                                          const LocalTensor<int32_t>& notKeep, const LocalTensor<uint8_t>& drop,
                                          const LocalTensor<int32_t>& ghost) {
        const uint32_t len = t_.secLen[avsg::SEC_PC];
        const LocalTensor<float> tagF = tag.ReinterpretCast<float>(), entryF = entry.ReinterpretCast<float>();
        const LocalTensor<float> keepF = keep.ReinterpretCast<float>(), zeroF = notKeep.ReinterpretCast<float>();
        const float entries = static_cast<float>(1u << t_.ghostLog);
        Sync<HardEvent::MTE3_V>();
        for (uint32_t o = 0; o < len; o += t_.fillChunk) {
            const uint32_t n = MinU(t_.fillChunk, len - o);
            Sync<HardEvent::MTE3_MTE2>();
            Sync<HardEvent::V_MTE2>();
            DataCopy(ghost, stateGm_[base + t_.secOff[avsg::SEC_PC] + o], n);
            Sync<HardEvent::MTE2_V>();
            Sync<HardEvent::V_S>();               // CreateVecIndex starts with scalar writes
            CreateVecIndex(entry, static_cast<int32_t>(o), n);
            ShiftRight(tag, ghost, avsg::kGhostCountBits, n);   // arithmetic: a negative word, a negative tag
            Duplicate(zeroF, 0.0f, n);
            PipeBarrier<PIPE_V>();
            Cast(entryF, entry, RoundMode::CAST_RINT, n);   // exact: < 2^15
            Cast(tagF, tag, RoundMode::CAST_RINT, n);       // exact: |tag| < 2^24
            PipeBarrier<PIPE_V>();
            Muls(tagF, tagF, entries, n);
            PipeBarrier<PIPE_V>();
            Add(tagF, tagF, entryF, n);
            PipeBarrier<PIPE_V>();
            CompareScalar(drop, tagF, limit, CMPMODE::GE, n);
            PipeBarrier<PIPE_V>();
            Select(keepF, drop, zeroF, -1.0f, SELMODE::VSEL_TENSOR_SCALAR_MODE, n);   // drop ? 0 : -1
            PipeBarrier<PIPE_V>();
            Cast(keep, keepF, RoundMode::CAST_RINT, n);
            PipeBarrier<PIPE_V>();
            And(ghost.ReinterpretCast<uint16_t>(), ghost.ReinterpretCast<uint16_t>(), keep.ReinterpretCast<uint16_t>(),
                2 * n);
            Sync<HardEvent::V_MTE3>();
            DataCopy(stateGm_[base + t_.secOff[avsg::SEC_PC] + o], ghost, n);
        }
        Sync<HardEvent::MTE3_V>();
    }
    bool reuse_ = false;
    PlanTiling t_;
    GlobalTensor<int32_t> stateGm_, lensGm_;
    TBuf<TPosition::VECCALC> tilingBuf_, posBuf_, lifeBuf_, keepBuf_, notKeepBuf_, maskBuf_, scalarBuf_, headerBuf_;
    TBuf<TPosition::VECCALC> countBuf_;
};

// ----------------------------------------------------------------------------------- reset
// Rows with row_mask set return to the empty state: -1 everywhere except bucket_slot, stash_slot
// and the header, which are 0, then the header's geometry words (reference.reset). Nothing is read
// from the row, so reset also repairs a corrupted one. Duplicate + DataCopy per section.
class ResetKernel {
public:
    __aicore__ inline ResetKernel() {}

    __aicore__ inline void Init(TPipe* pipe, GM_ADDR state, GM_ADDR rowMask, GM_ADDR tiling) {
        LoadTiling(pipe, tilingBuf_, t_, tiling);
        stateGm_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(state), static_cast<uint64_t>(t_.rows) * t_.width);
        maskGm_.SetGlobalBuffer(reinterpret_cast<__gm__ uint8_t*>(rowMask), t_.rows);
        pipe->InitBuffer(negBuf_, t_.fillChunk * 4);
        pipe->InitBuffer(zeroBuf_, t_.fillChunk * 4);
        pipe->InitBuffer(flagBuf_, 32);
        pipe->InitBuffer(headerBuf_, 32);
    }
    __aicore__ inline void Process() {
        const uint32_t blocks = static_cast<uint32_t>(GetBlockNum());
        LocalTensor<int32_t> neg = negBuf_.Get<int32_t>(), zero = zeroBuf_.Get<int32_t>();
        LocalTensor<uint8_t> flag = flagBuf_.Get<uint8_t>();
        LocalTensor<int32_t> hdr = headerBuf_.Get<int32_t>();
        Duplicate(neg, -1, t_.fillChunk);
        Duplicate(zero, 0, t_.fillChunk);
        Duplicate(hdr, 0, avsg::kHeaderWords);
        Sync<HardEvent::V_S>();
        hdr.SetValue(0, static_cast<int32_t>(avsg::kHeaderMagic));
        hdr.SetValue(avsg::kHeaderCapacity, static_cast<int32_t>(t_.capacity));
        hdr.SetValue(avsg::kHeaderBuckets, static_cast<int32_t>(t_.buckets));
        hdr.SetValue(avsg::kHeaderLifetime, static_cast<int32_t>(t_.lifetime));
        hdr.SetValue(avsg::kHeaderPolicy, static_cast<int32_t>(t_.policy));
        hdr.SetValue(avsg::kHeaderMaxContext, static_cast<int32_t>(t_.maxContext));
        hdr.SetValue(avsg::kHeaderActive, static_cast<int32_t>(t_.capacity));
        Sync<HardEvent::S_MTE3>();
        Sync<HardEvent::V_MTE3>();
        for (uint32_t r = static_cast<uint32_t>(GetBlockIdx()); r < t_.rows; r += blocks) {
            Sync<HardEvent::S_MTE2>();
            DataCopyPad(flag, maskGm_[r], DataCopyExtParams(1, 1, 0, 0, 0), DataCopyPadExtParams<uint8_t>(true, 0, 31, 0));
            Sync<HardEvent::MTE2_S>();
            if (flag.GetValue(0) == 0) continue;
            const uint64_t base = static_cast<uint64_t>(r) * t_.width;
            DataCopy(stateGm_[base], hdr, avsg::kHeaderWords);
            Fill(base + avsg::kHeaderWords, avsg::kStateHeaderLen - avsg::kHeaderWords, zero);
            Fill(base + t_.secOff[avsg::SEC_BK], t_.buckets, neg);
            Fill(base + t_.secOff[avsg::SEC_BS], t_.buckets, zero);
            Fill(base + t_.secOff[avsg::SEC_SP], t_.capPad, neg);
            Fill(base + t_.secOff[avsg::SEC_SL], t_.capPad, neg);
            Fill(base + t_.secOff[avsg::SEC_SK], t_.capPad, neg);
            Fill(base + t_.secOff[avsg::SEC_SS], t_.capPad, zero);
            for (uint32_t sec = avsg::SEC_SC; sec <= avsg::SEC_HT; ++sec)   // reuse policy state
                Fill(base + t_.secOff[sec], t_.secLen[sec], zero);
        }
        Sync<HardEvent::MTE3_MTE2>();
    }

private:
    __aicore__ inline void Fill(uint64_t off, uint32_t len, const LocalTensor<int32_t>& src) {
        for (uint32_t o = 0; o < len; o += t_.fillChunk) DataCopy(stateGm_[off + o], src, MinU(t_.fillChunk, len - o));
    }
    PlanTiling t_;
    GlobalTensor<int32_t> stateGm_;
    GlobalTensor<uint8_t> maskGm_;
    TBuf<TPosition::VECCALC> tilingBuf_, negBuf_, zeroBuf_, flagBuf_, headerBuf_;
};

}  // namespace avsg_kernel
