// resize_kernel.h: AscendC (Atlas A2 AIV) kernel of resize. Specification: reference.resize and
// reference.eviction_order (python/avsg/reference.py). Tiling: ResizeTiling (op_host/plan_tiling.h).
// Entry: resize.cpp. UB: the tiling, one kResizeWindow-entry window per section, the rank
// histogram, the move-list staging, the pending / claim bitmaps, header and scalars (kResizeUbBytes).
//
// Work split as in plan: core c handles rows c, c+numBlocks, ...; a row's state and its slices of
// the move lists are written by that core only, with exact-byte stores.
//
// Scalar by design. resize runs between steps, rarely (on admit/finish and every few dozen steps),
// and its work is a handful of passes over one row's slots plus O(moves) index inserts; it is
// never on the per-step path. On the scalar unit, through one UB window of kResizeWindow entries
// per section, its UB use is fixed whatever the geometry, and it reads the same values in the
// same order as the reference's definitions, which keeps it bit-exact on any state content.
//
// Per listed row (target[r] >= 0; the host scatters the (rows, capacities) lists into target):
//   header check (as plan's, plus the target in [N, S]); a mismatch leaves the row untouched
//   and reports move_counts[r] = -1. Grow: header word 6 = target. Shrink to c:
//   1. one pass over the slots: occupancy and a histogram of the eviction ranks (lifetime
//      life + 1, lru 1023 - age, reuse score + 80: all small integer ranges);
//   2. the e = occupied - c lowest (rank, slot): threshold bin from the histogram, then one pass
//      in slot order taking every rank below it and the first ties (lifetime: slot order from
//      the hand on, as plan);
//      the reuse policy spills each evicted count to pos_count;
//   3. survivors at slots >= c, ascending, move into the lowest free slots < c (two pointers) with
//      life/age and count; the moves are staged to the move lists in GM; slots >= c end free;
//   4. stash compaction, then the 4 insert rounds over the moves in order (lowest j wins a bucket
//      it finds free at the start of the round: the round's claims are kept in a bitmap, since a
//      claimed entry need not test valid when slot_pos held garbage >= 2^24), the rest to the stash.
// Whatever the state holds: every slot read from the index is clamped to [0, S-1], stash_count
// to [0, S], every value to its domain before it ranks or addresses anything, and the free-slot
// pointer never passes c, so no state content moves an access outside the row's sections.
#pragma once
#include "kernel_tools.h"

namespace avsg_kernel {

class ResizeKernel {
public:
    __aicore__ inline ResizeKernel() {}

    __aicore__ inline void Init(TPipe* pipe, GM_ADDR state, GM_ADDR target, GM_ADDR srcSlots, GM_ADDR dstSlots,
                                GM_ADDR moveCounts, GM_ADDR tiling) {
        LoadTiling(pipe, tilingBuf_, rt_, tiling);
        const PlanTiling& t = rt_.plan;
        W_ = rt_.moveWidth;
        pitch_ = rt_.movePitch;
        stateGm_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(state), static_cast<uint64_t>(t.rows) * t.width);
        targetGm_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(target), t.rows);
        srcGm_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(srcSlots), static_cast<uint64_t>(t.rows) * pitch_);
        dstGm_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(dstSlots), static_cast<uint64_t>(t.rows) * pitch_);
        countsGm_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(moveCounts),
                                  static_cast<uint64_t>(t.rows) * avsg::kPlanCountPitch);
        for (uint32_t s = 0; s < avsg::SEC_COUNT; ++s) {
            Win& w = win_[s];
            w.len = t.secLen[s];
            if (w.len == 0) continue;     // lifetime / lru: no per-position policy state
            w.wlen = w.len < avsg::kResizeWindow ? w.len : avsg::kResizeWindow;
            w.wlog = avsg::kResizeWindowLog;
            WinSetBlockLen(w);
            w.nwin = (w.len + avsg::kResizeWindow - 1) / avsg::kResizeWindow;
            pipe->InitBuffer(winBuf_[s], w.wlen * 4);
            w.buf = winBuf_[s].Get<int32_t>();
        }
        pipe->InitBuffer(histBuf_, avsg::kResizeBins * 4);
        pipe->InitBuffer(stageSrcBuf_, avsg::kResizeStage * 4);
        pipe->InitBuffer(stageDstBuf_, avsg::kResizeStage * 4);
        pipe->InitBuffer(negBuf_, avsg::kResizeStage * 4);
        pipe->InitBuffer(pendBuf_, avsg::kResizeMaxWidth / 8);
        pipe->InitBuffer(claimBuf_, avsg::kMaxBucketsResize / 8);
        pipe->InitBuffer(headerBuf_, 64);
        pipe->InitBuffer(scalarBuf_, 64);
        pipe->InitBuffer(targetBuf_, 64);
        hist_ = histBuf_.Get<int32_t>();
        stageSrc_ = stageSrcBuf_.Get<int32_t>();
        stageDst_ = stageDstBuf_.Get<int32_t>();
        neg_ = negBuf_.Get<int32_t>();
        pend_ = pendBuf_.Get<uint32_t>();
        claim_ = claimBuf_.Get<uint32_t>();
        hdr_ = headerBuf_.Get<int32_t>();
        scalar_ = scalarBuf_.Get<int32_t>();
        target_ = targetBuf_.Get<int32_t>();
        policy_ = t.policy;
    }

    __aicore__ inline void Process() {
        const uint32_t blocks = static_cast<uint32_t>(GetBlockNum());
        Duplicate(neg_, -1, avsg::kResizeStage);
        Sync<HardEvent::V_MTE3>();
        Sync<HardEvent::V_S>();
        for (uint32_t r = static_cast<uint32_t>(GetBlockIdx()); r < rt_.plan.rows; r += blocks) Row(r);
        Sync<HardEvent::MTE3_MTE2>();
        Sync<HardEvent::MTE3_S>();
    }

private:
    // ------------------------------------------------------------------------- windows
    // Scalar accesses only: a window move waits for the scalar unit alone (kVector false).
    __aicore__ inline void Flush(Win& w) { WinFlush<false>(w); }
    __aicore__ inline int32_t Get(Win& w, uint32_t idx) { return WinGet<false>(w, idx); }
    __aicore__ inline void Put(Win& w, uint32_t idx, int32_t v) { WinPut<false>(w, idx, v); }
    // bucket_slot's int16 entries (op_host/plan_tiling.h)
    __aicore__ inline int32_t GetBucket(uint32_t b) { return WinGet16<false>(win_[avsg::SEC_BS], b); }
    __aicore__ inline void PutBucket(uint32_t b, int32_t slot) { WinPut16<false>(win_[avsg::SEC_BS], b, slot); }
    // slot_life: int16 entries, two per word, like bucket_slot
    __aicore__ inline int32_t GetLife(uint32_t s) { return WinGet16<false>(win_[avsg::SEC_SL], s); }
    __aicore__ inline void PutLife(uint32_t s, int32_t life) { WinPut16<false>(win_[avsg::SEC_SL], s, life); }
    __aicore__ inline void BindRow(uint32_t r) { BindWindows(win_, stateGm_, rt_.plan, r); }

    // ------------------------------------------------------------------------- ranks
    static __aicore__ inline int32_t Clamp(int32_t x, int32_t lo, int32_t hi) { return x < lo ? lo : (x > hi ? hi : x); }
    // reference.log8 / log4 without floats: for y = x + 1 < 2^24 the float32 conversion is exact,
    // so its bits give 2^frac * exponent + the top `frac` mantissa bits, computed here directly
    static __aicore__ inline int32_t LogBits(int32_t x, uint32_t frac) {
        const uint32_t y = static_cast<uint32_t>(x) + 1u;
        uint32_t e = 0;
        while ((y >> (e + 1)) != 0u) ++e;
        const uint32_t top = ((y << (23u - e)) >> (23u - frac)) & ((1u << frac) - 1u);
        return static_cast<int32_t>((e << frac) + top);
    }
    // Eviction rank of an occupied slot as a histogram bin (reference.eviction_order: lower goes first)
    __aicore__ inline uint32_t Bin(uint32_t s, int32_t pos) {
        const int32_t life = GetLife(s);
        if (policy_ == avsg::kPolicyLifetime)
            return static_cast<uint32_t>(Clamp(life, -1, static_cast<int32_t>(rt_.plan.lifetime)) + 1);
        const int32_t age = Clamp(life, 0, avsg::kReuseAgeMax);
        if (policy_ == avsg::kPolicyLru) return static_cast<uint32_t>(avsg::kReuseAgeMax - age);
        const int32_t count = Clamp(Get(win_[avsg::SEC_SC], s), 0, avsg::kReuseCountMax);
        const uint32_t block = (static_cast<uint32_t>(pos < 0 ? 0 : pos) >> avsg::kReuseBlockLog) & rt_.plan.heatMask;
        const int32_t heat = Clamp(Get(win_[avsg::SEC_HT], block), 0, avsg::kReuseHeatMax);
        const int32_t score = LogBits(count, 3) + LogBits(heat, 2) - LogBits(age, 3);   // [-80, 96]
        return static_cast<uint32_t>(score + kReuseRankShift);
    }
    static constexpr int32_t kReuseRankShift = 80;

    // ------------------------------------------------------------------------- row
    __aicore__ inline bool HeaderMatches(int32_t c) {
        const PlanTiling& t = rt_.plan;
        const int32_t active = hdr_.GetValue(avsg::kHeaderActive);
        return HeaderGeometryMatches(hdr_, t) && active >= static_cast<int32_t>(t.N) && active <= static_cast<int32_t>(t.capacity) &&
               c >= static_cast<int32_t>(t.N) && c <= static_cast<int32_t>(t.capacity);
    }

    __aicore__ inline void Row(uint32_t r) {
        const uint64_t base = static_cast<uint64_t>(r) * rt_.plan.width;
        Sync<HardEvent::S_MTE2>();
        Sync<HardEvent::MTE3_MTE2>();
        DataCopyPad(target_, targetGm_[r], DataCopyExtParams(1, 4, 0, 0, 0), DataCopyPadExtParams<int32_t>(true, 0, 7, 0));
        DataCopy(hdr_, stateGm_[base], avsg::kHeaderWords + avsg::kStashCountPad);
        Sync<HardEvent::MTE2_S>();
        const int32_t c = target_.GetValue(0);
        if (c < 0) {                               // not listed
            Finish(r, 0);
            return;
        }
        if (!HeaderMatches(c)) {
            Finish(r, -1);
            return;
        }
        BindRow(r);
        staged_ = written_ = 0;
        uint32_t moves = 0;
        if (c < hdr_.GetValue(avsg::kHeaderActive)) moves = Shrink(r, static_cast<uint32_t>(c));
        hdr_.SetValue(avsg::kHeaderActive, c);
        if (moves) hdr_.SetValue(avsg::kHeaderStashCount, static_cast<int32_t>(stashCount_));
        for (uint32_t s = 0; s < avsg::SEC_COUNT; ++s) Flush(win_[s]);
        Sync<HardEvent::S_MTE3>();
        DataCopy(stateGm_[base], hdr_, avsg::kHeaderWords + avsg::kStashCountPad);
        Sync<HardEvent::MTE3_S>();
        Finish(r, static_cast<int32_t>(moves));
    }

    // move_counts[r] = count; the move lists' entries from max(count, 0) on = -1
    __aicore__ inline void Finish(uint32_t r, int32_t count) {
        const uint64_t rowW = static_cast<uint64_t>(r) * pitch_;
        scalar_.SetValue(0, count);
        Sync<HardEvent::S_MTE3>();
        DataCopyPad(countsGm_[static_cast<uint64_t>(r) * avsg::kPlanCountPitch], scalar_, DataCopyExtParams(1, 4, 0, 0, 0));
        for (uint32_t j = count > 0 ? static_cast<uint32_t>(count) : 0u; j < W_; j += avsg::kResizeStage) {
            const uint32_t n = MinU(avsg::kResizeStage, W_ - j);
            DataCopyPad(srcGm_[rowW + j], neg_, DataCopyExtParams(1, n * 4, 0, 0, 0));
            DataCopyPad(dstGm_[rowW + j], neg_, DataCopyExtParams(1, n * 4, 0, 0, 0));
        }
        Sync<HardEvent::MTE3_S>();
        Sync<HardEvent::MTE3_MTE2>();
    }

    __aicore__ inline void Stage(uint32_t r, uint32_t src, uint32_t dst) {
        stageSrc_.SetValue(staged_, static_cast<int32_t>(src));
        stageDst_.SetValue(staged_, static_cast<int32_t>(dst));
        if (++staged_ == avsg::kResizeStage) StoreStaged(r);
    }
    __aicore__ inline void StoreStaged(uint32_t r) {
        if (staged_ == 0) return;
        const uint64_t at = static_cast<uint64_t>(r) * pitch_ + written_;
        Sync<HardEvent::S_MTE3>();
        DataCopyPad(srcGm_[at], stageSrc_, DataCopyExtParams(1, staged_ * 4, 0, 0, 0));
        DataCopyPad(dstGm_[at], stageDst_, DataCopyExtParams(1, staged_ * 4, 0, 0, 0));
        Sync<HardEvent::MTE3_S>();
        written_ += staged_;
        staged_ = 0;
    }

    __aicore__ inline uint32_t Shrink(uint32_t r, uint32_t c) {
        const uint32_t S = rt_.plan.capacity;
        const bool reuse = policy_ == avsg::kPolicyReuse;
        Win& sp = win_[avsg::SEC_SP];
        Win& sc = win_[avsg::SEC_SC];
        // 1. occupancy and rank histogram
        Sync<HardEvent::S_V>();
        Duplicate(hist_, 0, avsg::kResizeBins);
        Sync<HardEvent::V_S>();
        uint32_t occupied = 0;
        for (uint32_t s = 0; s < S; ++s) {
            const int32_t pos = Get(sp, s);
            if (pos < 0) continue;
            ++occupied;
            const uint32_t b = Bin(s, pos);
            hist_.SetValue(b, hist_.GetValue(b) + 1);
        }
        // 2. evict the occupied - c lowest (rank, slot)
        if (occupied > c) {
            const uint32_t evict = occupied - c;
            uint32_t theta = 0, below = 0;
            while (below + static_cast<uint32_t>(hist_.GetValue(theta)) < evict) below += hist_.GetValue(theta++);
            uint32_t ties = evict - below;
            // ties in slot order, from the hand on under the lifetime policy (as plan takes them)
            const int32_t handWord = hdr_.GetValue(avsg::kHeaderHand);
            const uint32_t hand = policy_ == avsg::kPolicyLifetime && handWord >= 0 &&
                                          handWord < hdr_.GetValue(avsg::kHeaderActive)
                                      ? static_cast<uint32_t>(handWord) : 0u;
            for (uint32_t i = 0; i < S; ++i) {
                const uint32_t s = i < S - hand ? hand + i : i - (S - hand);
                const int32_t pos = Get(sp, s);
                if (pos < 0) continue;
                const uint32_t b = Bin(s, pos);
                if (b > theta) continue;
                if (b == theta) {
                    if (ties == 0) continue;
                    --ties;
                }
                if (reuse) {
                    // its count stays behind as a ghost (reference.ghost_pack; pos >= 0 here)
                    Put(win_[avsg::SEC_PC], static_cast<uint32_t>(pos) & ((1u << rt_.plan.ghostLog) - 1),
                        (pos >> rt_.plan.ghostLog) << avsg::kGhostCountBits | Clamp(Get(sc, s), 0, avsg::kReuseCountMax));
                    Put(sc, s, 0);
                }
                Put(sp, s, -1);
                PutLife(s, -1);
            }
        }
        // 3. survivors past c into the lowest free slots below it
        uint32_t moves = 0, d = 0;
        for (uint32_t s = c; s < S; ++s) {
            const int32_t pos = Get(sp, s);
            if (pos < 0) continue;
            while (d < c && Get(sp, d) >= 0) ++d;
            if (d >= c) break;                     // cannot happen (counting); keeps d inside the row
            Put(sp, d, pos);
            PutLife(d, GetLife(s));
            if (reuse) Put(sc, d, Get(sc, s));
            Stage(r, s, d);
            ++d;
            ++moves;
        }
        StoreStaged(r);
        for (uint32_t s = c; s < S; ++s) {
            if (Get(sp, s) != -1) Put(sp, s, -1);
            if (GetLife(s) != -1) PutLife(s, -1);
            if (reuse && Get(sc, s) != 0) Put(sc, s, 0);
        }
        if (moves == 0) return 0;
        // 4. re-index the moved positions
        const int32_t count = hdr_.GetValue(avsg::kHeaderStashCount);
        stashCount_ = count < 0 ? 0u : MinU(static_cast<uint32_t>(count), S);
        CompactStash();
        Insert(r, moves);
        return moves;
    }

    __aicore__ inline void CompactStash() {
        Win& sk = win_[avsg::SEC_SK];
        Win& ss = win_[avsg::SEC_SS];
        const int32_t slotMax = static_cast<int32_t>(rt_.plan.capacity) - 1;
        uint32_t kept = 0;
        for (uint32_t k = 0; k < stashCount_; ++k) {
            const int32_t key = Get(sk, k), slot = Get(ss, k);
            if (Get(win_[avsg::SEC_SP], static_cast<uint32_t>(Clamp(slot, 0, slotMax))) != key) continue;
            if (kept != k) {
                Put(sk, kept, key);
                Put(ss, kept, slot);
            }
            ++kept;
        }
        for (uint32_t k = kept; k < stashCount_; ++k) {
            Put(sk, k, -1);
            Put(ss, k, 0);
        }
        stashCount_ = kept;
    }

    // reference.probe_buckets for one position (p >= 0): products stay below 2^30
    __aicore__ inline uint32_t Probe(int32_t pos, uint32_t i) const {
        const PlanTiling& t = rt_.plan;
        const uint32_t mask = t.buckets - 1, p = static_cast<uint32_t>(pos < 0 ? 0 : pos);
        const uint32_t lo = p & mask, hi = (p >> t.logBuckets) & mask;
        const uint32_t first = (lo * t.hashA1 + hi * t.hashB1) & mask;
        const uint32_t stride = ((lo * t.hashA2 + hi * t.hashB2) & mask) | 1u;
        return (first + i * stride) & mask;
    }

    // Streams move j's destination slot from the move list in GM (stored by StoreStaged).
    __aicore__ inline uint32_t MoveDst(uint32_t r, uint32_t j) {
        const uint32_t chunk = j / avsg::kResizeStage;
        if (chunk != loadedChunk_) {
            const uint32_t from = chunk * avsg::kResizeStage;
            const uint32_t n = MinU(avsg::kResizeStage, written_ - from);
            Sync<HardEvent::S_MTE2>();
            Sync<HardEvent::MTE3_MTE2>();
            const uint8_t right = static_cast<uint8_t>((8 - n % 8) % 8);
            DataCopyPad(stageDst_, dstGm_[static_cast<uint64_t>(r) * pitch_ + from], DataCopyExtParams(1, n * 4, 0, 0, 0),
                        DataCopyPadExtParams<int32_t>(true, 0, right, 0));
            Sync<HardEvent::MTE2_S>();
            loadedChunk_ = chunk;
        }
        return static_cast<uint32_t>(stageDst_.GetValue(j % avsg::kResizeStage));
    }

    __aicore__ inline bool Pending(uint32_t j) { return (pend_.GetValue(j / 32) >> (j % 32)) & 1u; }

    // reference.occupied_buckets for one bucket: its slot holds a position that probes it
    __aicore__ inline bool Occupied(uint32_t b) {
        const int32_t slotMax = static_cast<int32_t>(rt_.plan.capacity) - 1;
        const int32_t slot = Clamp(GetBucket(b), -1, slotMax);   // -1: never used
        if (slot < 0) return false;
        const int32_t owner = Clamp(Get(win_[avsg::SEC_SP], static_cast<uint32_t>(slot)), -1,
                                    static_cast<int32_t>(avsg::kMaxPosition));
        if (owner < 0) return false;
        for (uint32_t k = 0; k < avsg::kPlanProbes; ++k)
            if (Probe(owner, k) == b) return true;
        return false;
    }

    // reference._insert over the moves in order: 4 rounds, a free bucket to the lowest pending
    // j, the rest appended to the stash while it has room
    __aicore__ inline void Insert(uint32_t r, uint32_t moves) {
        Win& sp = win_[avsg::SEC_SP];
        for (uint32_t w = 0; w < (moves + 31) / 32; ++w) {
            const uint32_t lo = w * 32;
            pend_.SetValue(w, lo + 32 <= moves ? 0xFFFFFFFFu : (1u << (moves - lo)) - 1u);
        }
        loadedChunk_ = 0xFFFFFFFFu;
        const int32_t slotMax = static_cast<int32_t>(rt_.plan.capacity) - 1;
        for (uint32_t j = 0; j < moves; ++j) {   // indexed already: a probe names its slot
            const uint32_t dst = MoveDst(r, j);
            const int32_t pos = Get(sp, dst);
            for (uint32_t k = 0; k < avsg::kPlanProbes; ++k) {
                const int32_t slot = Clamp(GetBucket(Probe(pos, k)), -1, slotMax);
                if (slot >= 0 && Get(sp, static_cast<uint32_t>(slot)) == pos) {
                    pend_.SetValue(j / 32, pend_.GetValue(j / 32) & ~(1u << (j % 32)));
                    break;
                }
            }
        }
        for (uint32_t i = 0; i < avsg::kPlanProbes; ++i) {
            for (uint32_t w = 0; w < rt_.plan.buckets / 32; ++w) claim_.SetValue(w, 0u);
            for (uint32_t j = 0; j < moves; ++j) {
                if (!Pending(j)) continue;
                const uint32_t dst = MoveDst(r, j);
                const int32_t pos = Get(sp, dst);
                const uint32_t b = Probe(pos, i);
                if ((claim_.GetValue(b / 32) >> (b % 32)) & 1u) continue;   // a lower j won it
                if (Occupied(b)) continue;
                claim_.SetValue(b / 32, claim_.GetValue(b / 32) | (1u << (b % 32)));
                PutBucket(b, static_cast<int32_t>(dst));
                pend_.SetValue(j / 32, pend_.GetValue(j / 32) & ~(1u << (j % 32)));
            }
        }
        for (uint32_t j = 0; j < moves && stashCount_ < rt_.plan.capacity; ++j) {
            if (!Pending(j)) continue;
            const uint32_t dst = MoveDst(r, j);
            Put(win_[avsg::SEC_SK], stashCount_, Get(sp, dst));
            Put(win_[avsg::SEC_SS], stashCount_, static_cast<int32_t>(dst));
            ++stashCount_;
        }
    }

    avsg::ResizeTiling rt_;
    uint32_t W_ = 1;
    uint32_t pitch_ = 8;   // int32 per move-list row in GM (W_ rounded up to 32 B)
    uint32_t policy_ = 0;
    uint32_t stashCount_ = 0;
    uint32_t staged_ = 0, written_ = 0;      // move-list entries staged in UB / stored to GM
    uint32_t loadedChunk_ = 0xFFFFFFFFu;     // move-list chunk held by stageDst_ (Insert)
    GlobalTensor<int32_t> stateGm_, targetGm_, srcGm_, dstGm_, countsGm_;
    TBuf<TPosition::VECCALC> tilingBuf_, histBuf_, stageSrcBuf_, stageDstBuf_, negBuf_, pendBuf_, claimBuf_;
    TBuf<TPosition::VECCALC> headerBuf_, scalarBuf_, targetBuf_;
    TBuf<TPosition::VECCALC> winBuf_[avsg::SEC_COUNT];
    Win win_[avsg::SEC_COUNT];
    LocalTensor<int32_t> hist_, stageSrc_, stageDst_, neg_, hdr_, scalar_, target_;
    LocalTensor<uint32_t> pend_, claim_;   // pending moves; buckets claimed in the current round
};

}  // namespace avsg_kernel
