// kernel_tools.h: what the state kernels (plan, invalidate, reset, resize) share below the block
// level: pipe syncs, a few scalar helpers, the tiling load through UB, ragged int32 DMA, and the
// software-managed UB windows over a state row's sections. UB: the tiling buffer (LoadTiling) and
// whatever buffers a caller binds to its windows; nothing of its own.
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
__aicore__ inline uint32_t MaxU(uint32_t a, uint32_t b) { return a > b ? a : b; }
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

// Tiling (PlanTiling or ResizeTiling): DMA it into its own UB buffer (the first one a kernel
// carves), wait MTE2 -> S, read the words from UB. A scalar GlobalTensor::GetValue would go
// through the core's non-coherent DCache (card §2, §8.11): the tiling's GM address is reused by
// later calls with another geometry, so a stale line could hand this core wrong offsets. DMA
// never goes through the DCache.
template <typename Tiling>
__aicore__ inline void LoadTiling(TPipe* pipe, TBuf<TPosition::VECCALC>& buf, Tiling& t, GM_ADDR tiling) {
    static_assert(sizeof(Tiling) % 4 == 0, "a tiling is read as uint32 words");
    constexpr uint32_t kWords = sizeof(Tiling) / 4;
    constexpr uint32_t kUbBytes = (static_cast<uint32_t>(sizeof(Tiling)) + 31u) / 32u * 32u;
    GlobalTensor<uint32_t> g;
    g.SetGlobalBuffer(reinterpret_cast<__gm__ uint32_t*>(tiling), kWords);
    pipe->InitBuffer(buf, kUbBytes);
    LocalTensor<uint32_t> ub = buf.Get<uint32_t>();
    DataCopyPad(ub, g, DataCopyExtParams(1, static_cast<uint32_t>(sizeof(Tiling)), 0, 0, 0),
                DataCopyPadExtParams<uint32_t>(false, 0, 0, 0));
    Sync<HardEvent::MTE2_S>();
    uint32_t* dst = reinterpret_cast<uint32_t*>(&t);
    for (uint32_t i = 0; i < kWords; ++i) dst[i] = ub.GetValue(i);
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
// Two runs of n int32 in one copy (two blocks: a copy's issue costs as much as ~1.8 KB of data),
// the second `ubPitch` int32 after the first in UB and `gmPitch` after it in GM (both >= n, and
// ubPitch a multiple of 8). On the UB side block k starts at k * (AlignUp(len + pads, 32) +
// stride * 32) (docs/npu.md, DataCopyPad), so the UB stride counts from the first run's padded
// end; on the GM side the stride is the bytes between the end of one block and the next.
__aicore__ inline void LoadIntPair(const LocalTensor<int32_t>& dst, const GlobalTensor<int32_t>& src, uint32_t n,
                                   uint32_t ubPitch, uint32_t gmPitch, int32_t pad) {
    if (n == 0) return;
    const uint32_t padded = (n + 7) / 8 * 8;
    DataCopyExtParams p(2, n * 4, (gmPitch - n) * 4, (ubPitch - padded) / 8, 0);
    DataCopyPadExtParams<int32_t> padp(true, 0, static_cast<uint8_t>(padded - n), pad);
    DataCopyPad(dst, src, p, padp);
}
__aicore__ inline void StoreIntPair(const GlobalTensor<int32_t>& dst, const LocalTensor<int32_t>& src, uint32_t n,
                                    uint32_t ubPitch, uint32_t gmPitch) {
    if (n == 0) return;
    const uint32_t padded = (n + 7) / 8 * 8;
    DataCopyExtParams p(2, n * 4, (ubPitch - padded) / 8, (gmPitch - n) * 4, 0);
    DataCopyPad(dst, src, p);
}

// One UB window over a state section of the current row (software-managed, write-back): window
// `cur` of `nwin` holds section entries [cur * wlen, cur * wlen + wlen), wlen = 2^wlog or the
// whole section.
// Write-back: `dirty` marks the whole window (a vector write); a scalar write (WinPut, WinMark)
// marks only its block of the window, one of kWinBlocks, so that the few entries a step changes
// (a dozen bucket_slot / slot_pos entries per step) go back as a few short copies instead of the
// whole window. A block is a multiple of 8 int32 (32 B) and sections start on 32 B in GM, so a
// block copy writes only this row's granules.
// 512 blocks: a bucket_slot or slot_pos window of 8192 entries goes back in 64 B blocks, so the
// few dozen entries a step's misses write cost a few KB of MTE3, not one 512 B block each.
constexpr uint32_t kWinBlocks = 512, kWinBlockWords = kWinBlocks / 32;
constexpr uint32_t kWinMergeGap = 448;   // entries (1.75 KB): clean blocks copied along inside a run
// A narrow window (slot_life in the plan kernel) holds int32 entries in UB over a section of
// int16 entries in GM: a move widens them (int16 -> float -> int32, exact for every int16) and the
// write-back narrows them (int32 -> int16, exact: every value a plan writes is a small life or
// age, and every other entry came in as an int16) through `stage`, so the vector passes, the
// drop and the scalar installs work on int32 lanes as for every other section. Plan kernel
// only (vector casts): the scalar resize kernel reads the section by word (WinGet16).
struct Win {
    LocalTensor<int32_t> buf;
    GlobalTensor<int32_t> gm;
    uint32_t len = 0, wlog = 0, wlen = 0, nwin = 1;
    uint32_t blen = 8;                    // entries per dirty block: ceil(wlen / kWinBlocks), 32 B multiple
    int32_t cur = -1;
    bool dirty = false;
    uint32_t blocks[kWinBlockWords] = {};   // dirty blocks of the current window (when !dirty)
    bool narrow = false;
    LocalTensor<int16_t> stage;           // narrow: wlen int16 entries
    GlobalTensor<int16_t> gm16;           // narrow: the section as int16 entries
};

// Window moves. kVector: the window buffers are also vector operands (plan), so a move waits
// for the vector pipe too; a scalar-only kernel (resize) waits for the scalar unit alone.
__aicore__ inline uint32_t WinCount(const Win& w, int32_t id) {
    return MinU(w.wlen, w.len - static_cast<uint32_t>(id) * w.wlen);
}
// The dirty block length of a window of wlen entries: ceil(wlen / kWinBlocks) rounded up to 8.
__aicore__ inline void WinSetBlockLen(Win& w) {
    const uint32_t b = (w.wlen + kWinBlocks - 1) / kWinBlocks, g = w.narrow ? 16u : 8u;   // 32 B in GM
    w.blen = b < g ? g : (b + g - 1) / g * g;
}
__aicore__ inline bool WinBlocksAny(const Win& w) {
    uint32_t any = 0;
    for (uint32_t k = 0; k < kWinBlockWords; ++k) any |= w.blocks[k];
    return any != 0;
}
// The first dirty block at or after b, or nb if none is below nb (whole words of clean blocks
// skipped at once).
__aicore__ inline uint32_t WinNextDirty(const Win& w, uint32_t b, uint32_t nb) {
    if (b >= nb) return nb;
    uint32_t k = b >> 5;
    uint32_t bits = w.blocks[k] & (~0u << (b & 31));
    while (bits == 0) {
        if (++k * 32 >= nb) return nb;
        bits = w.blocks[k];
    }
    const uint32_t d = k * 32 + LowestBit(bits);
    return d < nb ? d : nb;
}
// Marks entry idx of the current window as written by the scalar unit (WinPut does it).
__aicore__ inline void WinMark(Win& w, uint32_t idx) {
    const uint32_t b = idx / w.blen;
    w.blocks[b >> 5] |= 1u << (b & 31);
}
// The copies of a window's write-back from src (the window, or a narrow window's stage) to gm:
// whole if a vector wrote it, else each run of dirty blocks as one copy; the window is clean
// after. A run ends at a clean stretch longer than 1.75 KB (kWinMergeGap int32 entries):
// copying a shorter one along costs less than starting another copy.
template <class T>
__aicore__ inline void WinCopyRuns(Win& w, uint32_t cnt, const GlobalTensor<T>& gm, const LocalTensor<T>& src) {
    if (w.dirty) {
        DataCopy(gm, src, cnt);
    } else {
        const uint32_t nb = (cnt + w.blen - 1) / w.blen, gap = kWinMergeGap * 4 / sizeof(T);
        for (uint32_t b = WinNextDirty(w, 0, nb); b < nb;) {
            uint32_t last = b, next = WinNextDirty(w, b + 1, nb);
            for (; next < nb && (next - last - 1) * w.blen <= gap; next = WinNextDirty(w, next + 1, nb)) last = next;
            const uint32_t lo = b * w.blen, hi = MinU((last + 1) * w.blen, cnt);
            DataCopy(gm[lo], src[lo], hi - lo);
            b = next;
        }
    }
    w.dirty = false;
    for (uint32_t k = 0; k < kWinBlockWords; ++k) w.blocks[k] = 0;
}
// Issues the current window's write-back copies, no syncs: the caller orders the writers
// (vector, scalar) before the copies and the copies before the buffer's next writers (WinFlush
// for one window; a row's end flushes all of them between one pair of syncs). A narrow window
// is narrowed into its stage first, after its scalar and vector writers.
__aicore__ inline void WinCopyBack(Win& w) {
    if (!w.dirty && !WinBlocksAny(w)) return;
    const uint32_t cnt = WinCount(w, w.cur), at = static_cast<uint32_t>(w.cur) * w.wlen;
    if (!w.narrow) {
        WinCopyRuns(w, cnt, w.gm[at], w.buf);
        return;
    }
    Sync<HardEvent::S_V>();
    Sync<HardEvent::MTE3_V>();                // the stage's previous copies
    PipeBarrier<PIPE_V>();
    Cast(w.stage, w.buf, RoundMode::CAST_NONE, cnt);
    Sync<HardEvent::V_MTE3>();
    WinCopyRuns(w, cnt, w.gm16[at], w.stage);
}
// Writes the current window back (WinCopyBack) between its syncs.
template <bool kVector>
__aicore__ inline void WinFlush(Win& w) {
    if (!w.dirty && !WinBlocksAny(w)) return;
    if (kVector) Sync<HardEvent::V_MTE3>();
    Sync<HardEvent::S_MTE3>();
    WinCopyBack(w);
    Sync<HardEvent::MTE3_MTE2>();
    if (kVector) Sync<HardEvent::MTE3_V>();
    Sync<HardEvent::MTE3_S>();
}
template <bool kVector>
__aicore__ inline void WinEnsure(Win& w, int32_t id) {
    if (w.cur == id) return;
    WinFlush<kVector>(w);
    if (kVector) Sync<HardEvent::V_MTE2>();
    Sync<HardEvent::S_MTE2>();
    const uint32_t cnt = WinCount(w, id);
    if (kVector && w.narrow) {                // int16 in GM: widened through float (exact)
        DataCopy(w.stage, w.gm16[static_cast<uint32_t>(id) * w.wlen], cnt);
        Sync<HardEvent::MTE2_V>();
        const LocalTensor<float> f = w.buf.template ReinterpretCast<float>();
        Cast(f, w.stage, RoundMode::CAST_NONE, cnt);
        PipeBarrier<PIPE_V>();
        Cast(w.buf, f, RoundMode::CAST_RINT, cnt);
        PipeBarrier<PIPE_V>();
        Sync<HardEvent::V_S>();
    } else {
        DataCopy(w.buf, w.gm[static_cast<uint32_t>(id) * w.wlen], cnt);
        if (kVector) Sync<HardEvent::MTE2_V>();
        Sync<HardEvent::MTE2_S>();
    }
    w.cur = id;
}
template <bool kVector>
__aicore__ inline int32_t WinGet(Win& w, uint32_t idx) {
    const int32_t id = static_cast<int32_t>(idx >> w.wlog);
    WinEnsure<kVector>(w, id);
    return w.buf.GetValue(idx - static_cast<uint32_t>(id) * w.wlen);
}
template <bool kVector>
__aicore__ inline void WinPut(Win& w, uint32_t idx, int32_t v) {
    const int32_t id = static_cast<int32_t>(idx >> w.wlog);
    WinEnsure<kVector>(w, id);
    w.buf.SetValue(idx - static_cast<uint32_t>(id) * w.wlen, v);
    WinMark(w, idx - static_cast<uint32_t>(id) * w.wlen);
}
// Entry idx of a section of int16 entries (bucket_slot: two per int32 word, entry 2w in the low
// half of word w), through the window of its word; the write marks the word's block.
template <bool kVector>
__aicore__ inline int32_t WinGet16(Win& w, uint32_t idx) {
    const int32_t id = static_cast<int32_t>((idx >> 1) >> w.wlog);
    WinEnsure<kVector>(w, id);
    return w.buf.template ReinterpretCast<int16_t>().GetValue(idx - static_cast<uint32_t>(id) * 2 * w.wlen);
}
template <bool kVector>
__aicore__ inline void WinPut16(Win& w, uint32_t idx, int32_t v) {
    const int32_t id = static_cast<int32_t>((idx >> 1) >> w.wlog);
    WinEnsure<kVector>(w, id);
    const uint32_t at = idx - static_cast<uint32_t>(id) * 2 * w.wlen;
    w.buf.template ReinterpretCast<int16_t>().SetValue(at, static_cast<int16_t>(v));
    WinMark(w, at >> 1);
}
// Points every section's window at row r of the state, nothing resident.
__aicore__ inline void BindWindows(Win* win, const GlobalTensor<int32_t>& stateGm, const PlanTiling& t, uint32_t r) {
    const uint64_t base = static_cast<uint64_t>(r) * t.width;
    for (uint32_t s = 0; s < avsg::SEC_COUNT; ++s) {
        win[s].gm = stateGm[base + t.secOff[s]];
        if (win[s].narrow)
            win[s].gm16.SetGlobalBuffer(reinterpret_cast<__gm__ int16_t*>(win[s].gm.GetPhyAddr(0)), 2 * t.secLen[s]);
        win[s].cur = -1;
        win[s].dirty = false;
        for (uint32_t k = 0; k < kWinBlockWords; ++k) win[s].blocks[k] = 0;
    }
}

// The geometry words of a state row's header are those of this tiling (reset wrote them).
__aicore__ inline bool HeaderGeometryMatches(const LocalTensor<int32_t>& hdr, const PlanTiling& t) {
    return static_cast<uint32_t>(hdr.GetValue(0)) == avsg::kHeaderMagic &&
           static_cast<uint32_t>(hdr.GetValue(avsg::kHeaderCapacity)) == t.capacity &&
           static_cast<uint32_t>(hdr.GetValue(avsg::kHeaderBuckets)) == t.buckets &&
           static_cast<uint32_t>(hdr.GetValue(avsg::kHeaderLifetime)) == t.lifetime &&
           static_cast<uint32_t>(hdr.GetValue(avsg::kHeaderPolicy)) == t.policy &&
           static_cast<uint32_t>(hdr.GetValue(avsg::kHeaderMaxContext)) == t.maxContext;
}

}  // namespace avsg_kernel
