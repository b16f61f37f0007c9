// plan_context.h: what one core of a plan kernel holds while it plans rows: the tiling, the GM
// tensors, every UB buffer (carved once from avsg::PlanUbLayout, the layout the host budgets
// with), the aliases the blocks use, the section windows of the current row, and the row's
// framing (header check, rejection, stats counters). The block-level pieces (plan_block_*.h) are
// given a reference to it (and to the blocks they call); PlanKernel (plan_kernel.h) owns it and
// them.
// UB: allocates all of it (CarveUb); writes hitBits_, headerUb_ and scalarUb_ at a row's start.
//
// Names: `r` is a host row (request) of the batch, `s` a slot of the row's buffer, a position
// (request-relative) is `pos` or `p`; vectors are vX_ (nc lanes), wX_ (kPlanProbes * nc lanes),
// masks mX_, bitmaps xBits_.
#pragma once
#include "../drop_block.h"
#include "plan_policy.h"
#include "plan_ub_layout.h"

namespace avsg_kernel {

class PlanContext {
public:
    // GM views of the launch's tensors; the workspace slice of this core.
    // validLens: read only when the tiling says the launch has them (dropPast).
    __aicore__ inline void BindGm(GM_ADDR topk, GM_ADDR seq, GM_ADDR validLens, GM_ADDR state, GM_ADDR stats,
                                  GM_ADDR slots, GM_ADDR missPos, GM_ADDR missSlots, GM_ADDR missCounts,
                                  GM_ADDR workspace) {
        const uint64_t R = t_.rows, N = t_.N;
        topkGm_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(topk), R * N);
        seqGm_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(seq), R);
        if (t_.dropPast) lensGm_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(validLens), R);
        stateGm_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(state), R * t_.width);
        statsGm_.SetGlobalBuffer(reinterpret_cast<__gm__ int64_t*>(stats), R * 4);
        // the outputs at their padded pitches (op_host/plan_tiling.h): a row's granules are its own
        const uint64_t outLen = R * t_.outPitch;
        slotsGm_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(slots), outLen);
        missPosGm_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(missPos), outLen);
        missSlotsGm_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(missSlots), outLen);
        missCountsGm_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(missCounts), R * avsg::kPlanCountPitch);
        wsGm_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(workspace) +
                                  static_cast<uint64_t>(GetBlockIdx()) * t_.wsPerCore,
                              t_.wsPerCore);
        wsBase_ = reinterpret_cast<__gm__ int32_t*>(workspace);
        rowWs_ = wsGm_;
    }

    // Every UB buffer, sized by avsg::MakePlanUbLayout (the host's budget reads the same struct),
    // then the aliases.
    __aicore__ inline void CarveUb(TPipe* pipe) {
        const avsg::PlanUbLayout ub = avsg::MakePlanUbLayout(t_);
        const uint32_t nc = t_.nc;
        // The Sort operands (sort region, and the wide vectors that carry Sort payloads) need
        // Sort32's alignment (dst 256 B, sources 128 B), which TPipe does not promise: its pool
        // base is not ours. One buffer with slack, cut at the first 256 B boundary.
        const uint32_t wide = avsg::kPlanProbes * nc;
        probeStride_ = nc;
        pipe->InitBuffer(alignedBuf_, ub.aligned);
        const uint32_t alignPad = static_cast<uint32_t>(
            (avsg::kPlanSortAlign - avsg::UbAddr(alignedBuf_.Get<uint8_t>()) % avsg::kPlanSortAlign) %
            avsg::kPlanSortAlign);
        for (uint32_t i = 0; i < avsg::kPlanVectors; ++i) pipe->InitBuffer(vecBuf_[i], ub.vector);
        for (uint32_t i = 0; i < avsg::kPlanMasks; ++i) pipe->InitBuffer(maskBuf_[i], ub.mask);
        pipe->InitBuffer(hitBuf_, ub.hitBits);
        pipe->InitBuffer(hitByteBuf_, ub.hitBytes);
        pipe->InitBuffer(claimBuf_, ub.claimBits);
        pipe->InitBuffer(pendBuf_, ub.pendBits);
        pipe->InitBuffer(headBuf_, ub.heads);
        pipe->InitBuffer(treeBuf_, ub.trees);
        pipe->InitBuffer(statsBuf_, ub.stats);
        pipe->InitBuffer(scalarBuf_, ub.scalars);
        pipe->InitBuffer(headerBuf_, ub.header);
        if (ub.slots != 0) {
            pipe->InitBuffer(slotsBuf_, ub.slots);
            outSlots_ = slotsBuf_.Get<int32_t>();
        }
        pipe->InitBuffer(lifeStageBuf_, ub.lifeStage);
        for (uint32_t s = 0; s < avsg::SEC_COUNT; ++s) {
            win_[s].len = avsg::WinEntries(t_, s);
            win_[s].wlog = t_.winLog[s];
            win_[s].wlen = t_.winLen[s];
            win_[s].narrow = s == avsg::SEC_SL;
            if (win_[s].narrow) win_[s].stage = lifeStageBuf_.Get<int16_t>();
            WinSetBlockLen(win_[s]);
            win_[s].nwin = 0;
            if (ub.window[s] == 0) continue;   // a policy section the lifetime policy lacks
            pipe->InitBuffer(winBuf_[s], ub.window[s]);
            win_[s].buf = winBuf_[s].Get<int32_t>();
            win_[s].nwin = (win_[s].len + t_.winLen[s] - 1) / t_.winLen[s];
        }
        // TPipe carves in order, so the buffers end where the layout says: what the host budgets
        // is what was allocated (the tiling copy before alignedBuf_ is ub.tiling by construction).
        ascendc_assert(UbEnd(ub) - avsg::UbAddr(alignedBuf_.Get<uint8_t>()) == ub.total - ub.tiling);
        // nc-element vectors that live across the steps of a chunk or a row
        vWant_ = V(0); vWantF_ = VF(1); vFirst_ = V(2); vStride_ = V(3);
        vFoundF_ = VF(4); vFoundI_ = V(5); vMS_ = V(6); vLane_ = V(7); vHMask_ = V(8);
        // all-probe vectors: lane (probe i, selection l) at i*nc + l
        LocalTensor<float> sb = alignedBuf_.GetWithOffset<float>(avsg::kPlanSortVectors * nc, alignPad);
        wIdx_ = alignedBuf_.GetWithOffset<int32_t>(wide, alignPad + ub.wIdxOff);
        wWin_ = alignedBuf_.GetWithOffset<int32_t>(wide, alignPad + ub.wWinOff);
        wPair_ = alignedBuf_.GetWithOffset<int32_t>(2 * wide, alignPad + ub.wIdxOff);   // wIdx_, wWin_
        fillLanes_ = (ub.sortBytes + avsg::kPlanWideVectors * ub.wideBytes) / 4;
        fillUb_ = alignedBuf_.GetWithOffset<int32_t>(fillLanes_, alignPad);
        wSlot_ = alignedBuf_.GetWithOffset<int32_t>(wide, alignPad + ub.wSlotOff);
        wTmp_ = sb.template ReinterpretCast<int32_t>();   // the sort region holds two wide vectors
        wKey_ = wTmp_[wide];                              // while no sort runs
        wIdx_.SetSize(wide); wWin_.SetSize(wide); wSlot_.SetSize(wide); wTmp_.SetSize(wide); wKey_.SetSize(wide);
        sHalf_ = sb.template ReinterpretCast<half>();     // the whole sort region as half lanes
        sHalf_.SetSize(2 * avsg::kPlanSortVectors * nc);
        // short-lived nc-element scratch, aliased into wide vectors that are idle whenever these
        // are used (hash temporaries before the wide gathers; the rest outside the lookups).
        // A wide lookup group (plan_block_hash_match.h) lives in wIdx_ and the lower half of
        // wWin_ until its last chunk is classified: Classify's scratch stays out of them.
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
        hitBytes_ = hitByteBuf_.Get<uint8_t>();
        claimBits_ = claimBuf_.Get<uint32_t>();
        pendBits_ = pendBuf_.Get<uint32_t>();
        heads_ = headBuf_.Get<int32_t>();
        treeUb_ = treeBuf_.Get<int32_t>();
        statsUb_ = statsBuf_.Get<int64_t>();
        scalarUb_ = scalarBuf_.Get<int32_t>();
        headerUb_ = headerBuf_.Get<int32_t>();
        countUb_ = headerUb_[avsg::kHeaderStashCount];   // the header's second 32 B block
    }

    // UB byte address just past the last buffer CarveUb allocated (its consistency check only).
    __aicore__ inline uint64_t UbEnd(const avsg::PlanUbLayout& ub) {
        uint64_t end = avsg::UbAddr(headerBuf_.Get<uint8_t>()) + ub.header;
        if (ub.slots != 0) end = avsg::UbAddr(slotsBuf_.Get<uint8_t>()) + ub.slots;
        end = avsg::UbAddr(lifeStageBuf_.Get<uint8_t>()) + ub.lifeStage;
        for (uint32_t s = 0; s < avsg::SEC_COUNT; ++s)
            if (ub.window[s] != 0) end = avsg::UbAddr(winBuf_[s].Get<uint8_t>()) + ub.window[s];
        return end;
    }

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
    // Windows of the current row; their buffers are vector operands too (kVector).
    __aicore__ inline void Flush(Win& w) { WinFlush<true>(w); }
    __aicore__ inline void Ensure(Win& w, int32_t id) { WinEnsure<true>(w, id); }
    __aicore__ inline int32_t Get(Win& w, uint32_t idx) { return WinGet<true>(w, idx); }
    __aicore__ inline void Put(Win& w, uint32_t idx, int32_t v) { WinPut<true>(w, idx, v); }
    __aicore__ inline void BindRow(uint32_t r) { BindWindows(win_, stateGm_, t_, r); }
    // Window 0 of the sections in `sections` (bit s: section s) into UB ahead of their use, where
    // it is not there yet: every copy behind one set of syncs (each set is four flag pairs, as
    // much as a 16 KB copy's bytes; Ensure issues one per window). A narrow window is widened
    // on its way in, by Ensure.
    __aicore__ inline void LoadFirstWindows(uint32_t sections) {
        uint32_t copies = 0;
        for (uint32_t s = 0; s < avsg::SEC_COUNT; ++s) {
            Win& w = win_[s];
            if (((sections >> s) & 1u) == 0 || w.cur == 0) continue;
            if (w.narrow) {
                Ensure(w, 0);
                continue;
            }
            Flush(w);                             // another window of it, if written
            copies |= 1u << s;
        }
        if (copies == 0) return;
        Sync<HardEvent::V_MTE2>();
        Sync<HardEvent::S_MTE2>();
        for (uint32_t s = 0; s < avsg::SEC_COUNT; ++s) {
            if (((copies >> s) & 1u) == 0) continue;
            DataCopy(win_[s].buf, win_[s].gm, WinCount(win_[s], 0));
            win_[s].cur = 0;
        }
        Sync<HardEvent::MTE2_V>();
        Sync<HardEvent::MTE2_S>();
    }
    // The sections of `sections` that are whole in UB (one window)
    __aicore__ inline uint32_t WholeSections(uint32_t sections) const {
        uint32_t whole = 0;
        for (uint32_t s = 0; s < avsg::SEC_COUNT; ++s)
            if (((sections >> s) & 1u) != 0 && win_[s].nwin == 1) whole |= 1u << s;
        return whole;
    }
    __aicore__ static constexpr uint32_t SectionBit(uint32_t s) { return 1u << s; }
    // x = clamp(x, lo, hi) on n int32 lanes
    __aicore__ inline void ClampInts(const LocalTensor<int32_t>& x, int32_t lo, int32_t hi, uint32_t n) {
        Maxs(x, x, lo, n);
        PipeBarrier<PIPE_V>();
        Mins(x, x, hi, n);
        PipeBarrier<PIPE_V>();
    }
    // The row's slots stay in UB until the output (the tiling's slotsResident), except in a
    // split row, whose helpers' chunks reach the owner through GM.
    __aicore__ inline bool SlotsResident() const { return t_.slotsResident != 0 && split_ == 1; }
    __aicore__ inline int32_t SlotMax() const { return static_cast<int32_t>(t_.capacity) - 1; }
    // Which chunks a part of a split row looks up: part p takes FirstChunk(p), then every
    // ChunkStride()-th. With a core beside one per chunk (split = chunks + 1, the host's rule)
    // the owner (part 0) takes none and gets the rest of its row ready meanwhile; otherwise
    // every part looks up, the owner too. Unsplit (split 1): the owner takes every chunk.
    __aicore__ inline bool OwnerLooksUp() const { return split_ <= t_.numChunks; }
    __aicore__ inline uint32_t ChunkStride() const { return OwnerLooksUp() ? split_ : split_ - 1; }
    __aicore__ inline uint32_t FirstChunk(uint32_t part) const {
        if (OwnerLooksUp()) return part;
        return part == 0 ? t_.numChunks : part - 1;
    }
    // window buffer of section w holding entries [base, base + nc) (windows are >= nc or whole)
    __aicore__ inline LocalTensor<int32_t> ChunkOf(Win& w, uint32_t base) {
        const int32_t id = static_cast<int32_t>(base >> w.wlog);
        Ensure(w, id);
        return w.buf[base - static_cast<uint32_t>(id) * w.wlen];
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
    // Streams miss_pos / miss_slots chunk j0 back into vWant_ / vMS_ (tail lanes = 0).
    __aicore__ inline uint32_t LoadMisses(uint32_t r, uint32_t j0, uint32_t m) {
        const uint64_t rowN = static_cast<uint64_t>(r) * t_.outPitch;
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
    // Entries [from, to) of row rowN of each of the n outputs g[0..n) = -1. The -1s fill the
    // aligned region (sort region and wide vectors, contiguous and idle at a row's start and end)
    // once, so a tail goes out in copies of up to fillLanes_ entries, not nc. The caller orders
    // the stores (MTE3) before the region's next writer.
    __aicore__ inline void FillTails(const GlobalTensor<int32_t>* g, uint32_t n, uint64_t rowN, uint32_t from,
                                     uint32_t to) {
        if (from >= to) return;
        const uint32_t lanes = MinU(fillLanes_, to - from);
        Duplicate(fillUb_, -1, lanes);
        Sync<HardEvent::V_MTE3>();
        for (uint32_t k = 0; k < n; ++k)
            for (uint32_t j = from; j < to; j += lanes) StoreInts(g[k][rowN + j], fillUb_, MinU(lanes, to - j));
    }

    // The launch's soft SyncAll over every block (the split lookup's, and plan_gather's after the
    // miss lists are published): counters after the cores' workspace slices (zeroed by the host per
    // launch; each block's counter counts its calls), wIdx_ as UB scratch (idle at both callers:
    // after the lookup parts, and between the victims and the insert).
    __aicore__ inline void SyncAllBlocks() {
        const uint32_t blocks = static_cast<uint32_t>(GetBlockNum());
        GlobalTensor<int32_t> counters;
        counters.SetGlobalBuffer(wsBase_ + static_cast<uint64_t>(blocks) * t_.wsPerCore, blocks * avsg::kPlanSyncWords);
        SyncAll(counters, wIdx_, 0);
    }

    // ---------------------------------------------------------------------- row framing
    // The row was built (reset) with the geometry and lifetime of this call, and its active
    // capacity (resize) lets a step's N selections fit without leaving the allocation; it is
    // kept for the victim searches.
    __aicore__ inline bool HeaderMatches() {
        activeCap_ = static_cast<uint32_t>(headerUb_.GetValue(avsg::kHeaderActive));
        return activeCap_ >= t_.N && activeCap_ <= t_.capacity && HeaderGeometryMatches(headerUb_, t_);
    }
    // A row left out of the step: state and stats untouched, every output -1 and miss_counts[r] =
    // count: -1 for a row whose header does not match (so the caller can tell; the CPU host
    // raises before this point), 0 for an idle row (IsIdle).
    __aicore__ inline void LeaveRow(uint32_t r, int32_t count) {
        const uint64_t rowN = static_cast<uint64_t>(r) * t_.outPitch;
        Sync<HardEvent::S_V>();
        const GlobalTensor<int32_t> outs[] = {slotsGm_, missPosGm_, missSlotsGm_};
        FillTails(outs, 3, rowN, 0, t_.N);
        scalarUb_.SetValue(0, count);
        Sync<HardEvent::S_MTE3>();
        StoreInts(missCountsGm_[static_cast<uint64_t>(r) * avsg::kPlanCountPitch], scalarUb_, 1);
        Sync<HardEvent::MTE3_S>();
        Sync<HardEvent::MTE3_V>();
        Sync<HardEvent::MTE3_MTE2>();
    }
    // Row start, owner and helpers alike: windows bound, seq_len and header loaded, hit bitmap
    // cleared; false if the header does not match (the row is left alone). Sets the lookup bound
    // (and, with valid lengths, the drop's limit).
    __aicore__ inline bool StartRow(uint32_t r) {
        BindRow(r);
        missChunk_ = -1;
        Sync<HardEvent::S_MTE2>();
        Sync<HardEvent::MTE3_MTE2>();
        LoadInts(scalarUb_, seqGm_[r], 1, 0);
        DataCopy(headerUb_, stateGm_[static_cast<uint64_t>(r) * t_.width], avsg::kHeaderWords + avsg::kStashCountPad);
        Duplicate(hitBits_.ReinterpretCast<uint16_t>(), static_cast<uint16_t>(0), t_.capPad / 16);
        Duplicate(hitBytes_.ReinterpretCast<uint16_t>(), static_cast<uint16_t>(0), avsg::HitByteMapBytes(t_) / 2);
        Sync<HardEvent::MTE2_S>();
        Sync<HardEvent::V_S>();
        if (!HeaderMatches()) return false;
        int32_t seq = scalarUb_.GetValue(0);
        if (seq > static_cast<int32_t>(avsg::kMaxPosition)) seq = static_cast<int32_t>(avsg::kMaxPosition);
        if (t_.maxContext && seq > static_cast<int32_t>(t_.maxContext)) seq = static_cast<int32_t>(t_.maxContext);
        boundF_ = static_cast<float>(seq);
        lookups_ = hits_ = misses_ = 0;
        if (t_.dropPast) {                        // the row's valid length, once seq_len is read
            Sync<HardEvent::S_MTE2>();
            LoadInts(scalarUb_, lensGm_[r], 1, 0);
            Sync<HardEvent::MTE2_S>();
            dropLimitF_ = DropLimit(scalarUb_.GetValue(0));
        }
        idle_ = seq <= 0;                         // the clamps above keep its sign
        return true;
    }
    // After StartRow: the row is idle (reference.idle_rows: seq_len <= 0, so it selects
    // nothing), and the step only applies its drop (IdleDrops) and writes its outputs
    // (LeaveRow(r, 0)): an engine's rows without a request cost their header.
    __aicore__ inline bool IsIdle() const { return idle_; }
    // An idle row's drop: valid lengths below 2^24 (at 2^24 a drop frees only positions no
    // selection can name, and the idle row is left whole)
    __aicore__ inline bool IdleDrops() const {
        return t_.dropPast && dropLimitF_ < static_cast<float>(avsg::kMaxPosition);
    }
    // Before StartRow (plan_gather's blocks of several rows): whether row r is idle, from its
    // seq_len alone, exactly as StartRow will find it.
    __aicore__ inline bool RowIsIdle(uint32_t r) {
        Sync<HardEvent::S_MTE2>();
        Sync<HardEvent::MTE3_MTE2>();
        LoadInts(scalarUb_, seqGm_[r], 1, 0);
        Sync<HardEvent::MTE2_S>();
        return scalarUb_.GetValue(0) <= 0;
    }
    // Hits are marked in a byte map by the scalar unit (MarkHits: one store per hit, four hit
    // slots per load, as int16: S <= 2^15; A2 has no vector scatter) and turned into the hit
    // bitmap here by Cast u8->half + compare (HitBytesToBits), once the row's (or the part's)
    // chunks are classified.
    __aicore__ inline void MarkHits(const LocalTensor<int16_t>& hitSlots, uint32_t count) {
        const LocalTensor<uint64_t> quads = hitSlots.ReinterpretCast<uint64_t>();
        uint32_t q = 0;
        for (; q + 3 < count; q += 4) {
            const uint64_t four = quads.GetValue(q / 4);   // slots in [0, S-1]: clamped by the lookup
            hitBytes_.SetValue(static_cast<uint32_t>(four & 0xFFFFu), 1);
            hitBytes_.SetValue(static_cast<uint32_t>((four >> 16) & 0xFFFFu), 1);
            hitBytes_.SetValue(static_cast<uint32_t>((four >> 32) & 0xFFFFu), 1);
            hitBytes_.SetValue(static_cast<uint32_t>(four >> 48), 1);
        }
        for (; q < count; ++q) hitBytes_.SetValue(static_cast<uint32_t>(hitSlots.GetValue(q)), 1);
    }
    // The hits of a chunk of a later query token whose slot an earlier chunk of the row already
    // marked (76% at T = 4 on the shipped code trace) are dropped before MarkHits, which stores
    // one scalar per hit: the marks are gathered and the new hits compacted on the vector unit.
    // A2's Gather reads 16 or 32-bit elements at byte offsets aligned to them, so slot s reads
    // the 16-bit word at s & ~1 and keeps the byte of its parity: And with 1 << 8 * (s & 1) leaves
    // 0, 1 or 256, exact as half (vconv_s162f16), so a half compare with 0 tells the new hits.
    // Skipping a store of 1 to a byte that holds 1 leaves the map as it was: the row's bitmap is
    // the same.
    // hitSlots: the chunk's hit slots in [0, S-1] (int32, count lanes), hit16 the same as int16;
    // the new ones go to out (int16). UB: the sort region (wTmp_, wKey_: idle until Classify's
    // sort; the wide lookup keeps a group in wIdx_ and wWin_ across Classify), mKey_. Returns how
    // many.
    __aicore__ inline uint32_t UnmarkedHits(const LocalTensor<int32_t>& hitSlots, const LocalTensor<int16_t>& hit16,
                                            uint32_t count, const LocalTensor<int16_t>& out) {
        const uint32_t nc = t_.nc;
        const uint32_t lanes = avsg::RoundUp(count, 128u);      // whole 256 B repeats of half (Compare)
        const LocalTensor<int32_t> wordOff = wTmp_, evenMask = wTmp_[nc];
        const LocalTensor<int16_t> w16 = wKey_.ReinterpretCast<int16_t>();
        const LocalTensor<int16_t> word = w16, keep = w16[nc], ones = w16[2 * nc], parity16 = w16[3 * nc];
        const LocalTensor<half> wordH = w16[2 * nc].ReinterpretCast<half>();   // over `ones`, once read
        Duplicate(evenMask, static_cast<int32_t>(-2), count);   // ~1 (And is 16-bit: [0xFFFE, 0xFFFF])
        Duplicate(ones.ReinterpretCast<uint16_t>(), static_cast<uint16_t>(1), count);
        PipeBarrier<PIPE_V>();
        And(wordOff.ReinterpretCast<uint16_t>(), hitSlots.ReinterpretCast<uint16_t>(),
            evenMask.ReinterpretCast<uint16_t>(), 2 * count);   // s & ~1: the word's byte offset
        And(parity16.ReinterpretCast<uint16_t>(), hit16.ReinterpretCast<uint16_t>(), ones.ReinterpretCast<uint16_t>(),
            count);                                             // s & 1
        PipeBarrier<PIPE_V>();
        Gather(word, hitBytes_.ReinterpretCast<int16_t>(), wordOff.ReinterpretCast<uint32_t>(), 0u, count);
        Muls(keep, parity16, static_cast<int16_t>(255), count);
        PipeBarrier<PIPE_V>();
        Adds(keep, keep, static_cast<int16_t>(1), count);         // 1 (s even) or 256 (s odd)
        PipeBarrier<PIPE_V>();
        And(word.ReinterpretCast<uint16_t>(), word.ReinterpretCast<uint16_t>(), keep.ReinterpretCast<uint16_t>(),
            count);
        PipeBarrier<PIPE_V>();
        Cast(wordH, word, RoundMode::CAST_NONE, count);
        PipeBarrier<PIPE_V>();
        // lanes past count compare whatever they hold: the counter-mode compaction reads count bits
        avsg::CompareScalarAll(mKey_, wordH, static_cast<half>(0.0f), CMPMODE::EQ, lanes);
        PipeBarrier<PIPE_V>();
        uint64_t fresh = 0;
        GatherMask(out, hit16, U16(mKey_), true, count, GatherMaskParams(1, 1, 8, 0), fresh);
        Sync<HardEvent::V_S>();
        return static_cast<uint32_t>(fresh);
    }
    __aicore__ inline void HitBytesToBits() {
        const uint32_t total = avsg::HitByteMapBytes(t_);
        // The wide pair (wIdx_ and wWin_, idle once the chunks are classified) holds 8,192 half
        // lanes at nc 512: up to S 8192 the whole map is one Cast and one compare (each
        // instruction and barrier costs as much as 10-20 repeats).
        const uint32_t piece = 4 * avsg::kPlanProbes * t_.nc;   // half lanes in wPair_
        const LocalTensor<half> tmp = wPair_.ReinterpretCast<half>();
        const LocalTensor<uint8_t> bits = hitBits_.ReinterpretCast<uint8_t>();
        Sync<HardEvent::S_V>();   // MarkHits' stores, and its reads of hit16 in vT1_ (inside wPair_)
        for (uint32_t base = 0; base < total; base += piece) {
            const uint32_t n = MinU(piece, total - base);   // a multiple of 128
            Cast(tmp, hitBytes_[base], RoundMode::CAST_NONE, n);
            PipeBarrier<PIPE_V>();
            avsg::CompareScalarAll(bits[base / 8], tmp, static_cast<half>(0.0f), CMPMODE::GT, n);
            PipeBarrier<PIPE_V>();
        }
        Sync<HardEvent::V_S>();
        Sync<HardEvent::V_MTE3>();
    }
    // padding slots free, so Allocate's free count and the dual pointer's resident runs see only
    // real slots. Nothing before DecayAndPin reads them in the hash plan (every slot read from
    // the index or the stash is clamped to [0, S-1]), so a split row resets them after its
    // lookup: no GM write of the owner overlaps the helpers' reads of slot_pos.
    // (and the sections only its policy keeps, through upkeep.FreePaddingSlot)
    template <class Upkeep>
    __aicore__ inline void FreePadding(Upkeep& upkeep) {
        for (uint32_t s = t_.capacity; s < t_.capPad; ++s) {
            if (Get(win_[avsg::SEC_SP], s) != -1) Put(win_[avsg::SEC_SP], s, -1);
            if (Get(win_[avsg::SEC_SL], s) != -1) Put(win_[avsg::SEC_SL], s, -1);
            upkeep.FreePaddingSlot(s);
        }
    }

    PlanTiling t_;
    GlobalTensor<int32_t> topkGm_, seqGm_, lensGm_, stateGm_, slotsGm_, missPosGm_, missSlotsGm_, missCountsGm_, wsGm_;
    GlobalTensor<int64_t> statsGm_;
    TBuf<TPosition::VECCALC> vecBuf_[avsg::kPlanVectors];
    TBuf<TPosition::VECCALC> maskBuf_[avsg::kPlanMasks];
    TBuf<TPosition::VECCALC> alignedBuf_, hitBuf_, hitByteBuf_, claimBuf_, pendBuf_, headBuf_, treeBuf_;
    TBuf<TPosition::VECCALC> statsBuf_, scalarBuf_, headerBuf_, slotsBuf_, lifeStageBuf_;
    LocalTensor<int32_t> outSlots_;           // the row's slots (SlotsResident), chunk c at c * nc
    TBuf<TPosition::VECCALC> winBuf_[avsg::SEC_COUNT];
    Win win_[avsg::SEC_COUNT];
    LocalTensor<int32_t> vWant_, vFirst_, vStride_, vFoundI_, vMS_, vLane_, vHMask_;   // nc lanes
    LocalTensor<float> vWantF_, vFoundF_;
    LocalTensor<int32_t> wIdx_, wWin_, wSlot_, wTmp_, wKey_;                   // kPlanProbes*nc lanes
    LocalTensor<half> sHalf_;                      // the sort region, 2 * kPlanSortVectors * nc lanes
    LocalTensor<int32_t> vLo_, vHi_, vT1_, vT2_, vB_, vKey_, vSlot_;  // aliases
    LocalTensor<int32_t> fillUb_;                  // the whole aligned region (FillTails)
    LocalTensor<int32_t> wPair_;                   // wIdx_ and wWin_ as one 2*kPlanProbes*nc-lane vector
    uint32_t fillLanes_ = 0;
    LocalTensor<float> vTmpF_;
    LocalTensor<uint8_t> mKey_, mOwn_, mWin_, mTmp_, mA_, mB_, mC_;
    LocalTensor<float> sConcat_, sDst_, sTmp_, sOutV_;
    LocalTensor<uint32_t> sIdx_, sOutI_;
    LocalTensor<uint32_t> hitBits_, claimBits_, pendBits_;
    LocalTensor<uint8_t> hitBytes_;              // one byte per padded slot (MarkHits)
    LocalTensor<int32_t> heads_, treeUb_;
    LocalTensor<int64_t> statsUb_;
    LocalTensor<int32_t> scalarUb_, headerUb_, countUb_;
    float boundF_ = 0.0f;
    float dropLimitF_ = 0.0f;                // clamp(valid_len, -1, 2^24) when the tiling has dropPast
    bool idle_ = false;                      // StartRow's row is idle (IsIdle)
    __gm__ int32_t* wsBase_ = nullptr;
    GlobalTensor<int32_t> rowWs_;                 // the row's workspace: the owner core's slice
    uint32_t split_ = 1, part_ = 0;           // lookup parts of a row (1: not split), this core's part
    uint32_t activeCap_ = 0;                 // header word 6, checked in [N, S]: victims lie below it
    int32_t missChunk_ = -1;                 // miss chunk held by vWant_ / vMS_ (LoadMisses), -1: none
    uint32_t probeStride_ = 0;               // lanes per probe slice of the wide vectors (ProbeLanes)
    int64_t lookups_ = 0, hits_ = 0, misses_ = 0;
};

}  // namespace avsg_kernel
