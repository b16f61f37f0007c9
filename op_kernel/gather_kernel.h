// Gather kernel (AscendC, Atlas A2 vector cores): miss-only copy of KV rows host pool -> buffer.
//
// Specification: python/avsg/reference.py (gather, assign_cores, chunk_bounds, host_rows).
// Every core (block) derives its own share of the miss list from miss_counts, then for each of
// its entries (r, j) with pos = miss_pos[r, j] >= 0 whose host row lies inside the pool, copies the
// host row of pos into dst[r, miss_slots[r, j]] for every (src, dst) pair:
//   contiguous pool [R', max_len, row]:      host row = r * max_len + pos      (pos < max_len)
//   paged pool [num_blocks, block_size, row]: host row = block_table[r, pos / bs] * bs + pos % bs
// and the row must be < src.shape[0] * src.shape[1]. Entries outside the pool are skipped.
//
// Partitions (docs/design.md §4), C = the tiling's cores, total = sum(miss_counts); core c runs on
// block c unless a composed launch rotates them (Init's firstBlock):
//   miss     entries in (row, pos) order, core c takes [c*total/C, (c+1)*total/C)
//   request  core c takes every row r with r % C == c
//   topk     the fixed R*N layout, core c takes [c*R*N/C, (c+1)*R*N/C); padding is a no-op
//            (an older baseline: it splits the compacted miss list, so it behaves like S1)
//   selection the paper's S2: miss_pos / miss_slots in the selection layout (entry r*N + j is
//            selection j of row r: its position and slot if it is the row's first selection of a
//            missed position, else -1; reference.selection_layout), core c takes
//            [c*R*N/C, (c+1)*R*N/C) and every entry with a valid slot is a copy, hits no-ops;
//            miss_counts is not read
// Output: countOut[c*8] = entries core c copied (once per entry, not per pair); the rest of the
// core's 32 B slot is written with zeros.
//
// Data path, built for the latency of host reads across PCIe (one DMA costs microseconds
// whatever its size up to ~16 KB, so a core must keep several in flight and make each count):
//   * consecutive entries of a row whose host rows increase form one read group: a run of
//     misses contiguous in host row is read by ONE DataCopyPad (blockCount = rows), and, with
//     page reads (tiling readGapRows > 0), misses a few rows apart in one host page share a read
//     that also fetches the rows between them; a group spans at most spanRows host rows;
//   * the group's rows land in UB at the pitch UbRowPitch(row bytes) (below: the UB block size
//     DataCopyPad documents, rounded up to 32 B, with no gap) and are written out by one
//     DataCopyPad per run contiguous in both host row and slot, which reads them at that pitch;
//   * reads go through a TQueBind<VECIN, VECOUT, kGatherCopyBuffers> whose every buffer can hold
//     a read in flight: a group is enqueued after its read is issued, and its writes are issued
//     only when the queue is full (oldest first) or at the end, so up to kGatherCopyBuffers reads
//     per core overlap one another and the writes;
//   * rows wider than a buffer (spanRows = 1) are read and written in copyBytes pieces.
// A row's misses name distinct slots in every plan (checked on CPU), so writes never overlap.
// Index tensors are read at their row pitch (entryPitch, countPitch) and dst is written at its
// slot pitch; the host refuses a dst whose slots could put one 32 B granule under two cores.
// Scalar reads of DMA-loaded indices (miss_pos, miss_slots, miss_counts, block_table, tiling) are
// preceded by an explicit MTE2->S flag; every reload of a scalar-read buffer is preceded by an
// S->MTE2 flag (write-after-read). The per-core count is written by scalar SetValue to UB, S->MTE3
// flag, then one 32 B DMA. No scalar GM access at all: mapped host memory is only read by MTE2.
#pragma once
#include "kernel_operator.h"
#include "kernel_compat.h"
#include "gather_tiling.h"

namespace avsg {

// UB row pitch of the gather's multi-row copies, and the one thing their layout depends on.
//
// A read of `rows` host rows of `len` bytes is one DataCopyPad GM->UB with blockCount = rows,
// blockLen = len, no left/right padding, dstStride = kUbRowGapBlocks; the writes read runs of
// those rows back with DataCopyPad UB->GM, blockLen = len, srcStride = kUbRowGapBlocks. On the UB
// side both count a block as len rounded up to 32 B and the stride (in 32 B blocks) from the end
// of that padded block, so row k of a read lies at k * UbRowPitch(len) and a write starting at a
// row's UB offset reads each following row at the same pitch. The SDK states this rule
// (asc-devkit 82b89a15f; A2 has only this form, PaddingMode::Normal):
//   * impl/basic_api/utils/kernel_check_data_copy_overflow.h:462-465 (GM->UB, DataCopyExtParams):
//     the UB extent is blockCount * AlignUp(blockLen + padding, 32) + (blockCount - 1) * dstStride * 32;
//     :483-484 (UB->GM): blockCount * AlignUp(blockLen, 32) + (blockCount - 1) * srcStride * 32
//     (32 = DEFAULT_C0_SIZE, impl/basic_api/utils/kernel_utils_constants.h:39);
//   * docs/zh/api/SIMD-API/基础API/Memory矢量计算/数据搬运/DataCopyPad（GMToUB非对齐数据搬运）.md:59
//     ("when blockLen is not 32 B aligned, every block is padded to 32 B"), :127 (dstStride: from
//     the end of one block to the start of the next, in 32 B blocks), :134 (isPad false: the
//     hardware pads the right of each block to 32 B), :107 (PaddingMode::Normal, the only mode
//     before Ascend 950: every block is padded; Compact, packing blocks, is 950-only);
//   * .../DataCopyPad（UBToGM非对齐数据搬运）.md:66 and :133 (a UB block that is not 32 B aligned
//     is read with its dummy tail up to 32 B, which is dropped in GM), :114 (srcStride in 32 B
//     blocks, end to start).
// The emulation (emulation/emu_datacopy.h) places and reads UB rows by the same rule and
// poisons the padding, so a kernel assuming another pitch fails its gather tests; `avsg doctor`
// gathers runs of adjacent 656 B rows on the NPU and compares them with the reference.
constexpr uint32_t kUbRowGapBlocks = 0;
__aicore__ inline uint64_t UbRowPitch(uint64_t len) { return (len + 31) / 32 * 32 + kUbRowGapBlocks * 32ull; }

class GatherKernel {
public:
    __aicore__ inline GatherKernel() {}

    // firstBlock: the block that runs core 0; core c runs on block (firstBlock + c) mod blocks.
    // A composed launch (plan_gather) starts the copy on the blocks that own no plan row, so the
    // owners, still finishing their rows, get the last cores' shares or none.
    __aicore__ inline void Init(GM_ADDR missPos, GM_ADDR missSlots, GM_ADDR missCounts, GM_ADDR blockTable,
                                GM_ADDR countOut, GM_ADDR tiling, AscendC::TPipe* pipe, uint32_t firstBlock = 0)
    {
        pipe_ = pipe;
        const uint64_t blocks = static_cast<uint64_t>(AscendC::GetBlockNum());
        blockIdx_ = (static_cast<uint64_t>(AscendC::GetBlockIdx()) + blocks - firstBlock % blocks) % blocks;
        LoadTiling(tiling);

        const uint64_t R = t_.rows, N = t_.entriesPerRow;
        // the index tensors at their pitches (plan pads its rows to 32 B and miss_counts to 8 int32)
        posGm_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(missPos), (R - 1) * t_.entryPitch + N);
        slotGm_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(missSlots), (R - 1) * t_.entryPitch + N);
        cntGm_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(missCounts), (R - 1) * t_.countPitch + 1);
        if (t_.blockSize != 0) {
            btGm_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(blockTable), R * t_.maxBlocks);
        }
        outGm_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(countOut), t_.numCores * kGatherCountSlot);
        for (uint64_t p = 0; p < t_.numPairs; ++p) {
            srcGm_[p].SetGlobalBuffer(reinterpret_cast<__gm__ uint8_t*>(t_.src[p]),
                                      (t_.poolRows - 1) * t_.hostPitch[p] + t_.rowBytes[p]);
            dstGm_[p].SetGlobalBuffer(reinterpret_cast<__gm__ uint8_t*>(t_.dst[p]),
                                      (R * t_.capacity - 1) * t_.slotPitch[p] + t_.rowBytes[p]);
        }

        pipe_->InitBuffer(copyQue_, kGatherCopyBuffers, static_cast<uint32_t>(t_.copyBytes));
        pipe_->InitBuffer(posBuf_, static_cast<uint32_t>(t_.idxChunk * sizeof(int32_t)));
        pipe_->InitBuffer(slotBuf_, static_cast<uint32_t>(t_.idxChunk * sizeof(int32_t)));
        pipe_->InitBuffer(cntBuf_, static_cast<uint32_t>(t_.cntChunk * sizeof(int32_t)));
        pipe_->InitBuffer(btBuf_, static_cast<uint32_t>((t_.blockSize != 0 ? t_.btWindow : 8) * sizeof(int32_t)));
        pipe_->InitBuffer(outBuf_, kGatherCountSlot * sizeof(int32_t));
        posLocal_ = posBuf_.Get<int32_t>();
        slotLocal_ = slotBuf_.Get<int32_t>();
        cntLocal_ = cntBuf_.Get<int32_t>();
        btLocal_ = btBuf_.Get<int32_t>();
    }

    __aicore__ inline void Process()
    {
        if (blockIdx_ >= t_.numCores) {
            return;  // more blocks than the tiling expects: nothing of ours to write
        }
        if (t_.partition == kPartitionMiss) {
            ProcessMiss();
        } else if (t_.partition == kPartitionRequest) {
            ProcessRequest();
        } else if (t_.partition == kPartitionSelection) {
            ProcessEqualChunks(false);
        } else {
            ProcessEqualChunks(true);
        }
        while (queued_ > 0) WriteOldest();
        WriteCount();
    }

private:
    // ------------------------------------------------------------------ tiling and index loads

    // The tiling struct is DMA'd into its own small TBuf (320 B) and read word by word by the
    // scalar unit after an MTE2->S flag: no scalar GM read, so no DCache question (card §2).
    __aicore__ inline void LoadTiling(GM_ADDR tiling)
    {
        constexpr uint32_t kWords = sizeof(GatherTiling) / sizeof(uint64_t);
        AscendC::GlobalTensor<uint64_t> tilingGm;
        tilingGm.SetGlobalBuffer(reinterpret_cast<__gm__ uint64_t*>(tiling), kWords);
        pipe_->InitBuffer(tilingBuf_, static_cast<uint32_t>(sizeof(GatherTiling)));
        AscendC::LocalTensor<uint64_t> w = tilingBuf_.Get<uint64_t>();
        AscendC::DataCopyExtParams params{1, static_cast<uint32_t>(sizeof(GatherTiling)), 0, 0, 0};
        AscendC::DataCopyPadExtParams<uint64_t> pad{false, 0, 0, 0};
        AscendC::DataCopyPad(w, tilingGm, params, pad);
        SyncMte2ToScalar();
        uint64_t words[kWords];
        for (uint32_t i = 0; i < kWords; ++i) {
            words[i] = w.GetValue(i);
        }
        uint32_t k = 0;
        t_.rows = words[k++];
        t_.entriesPerRow = words[k++];
        t_.capacity = words[k++];
        t_.partition = words[k++];
        t_.numCores = words[k++];
        t_.numPairs = words[k++];
        t_.blockSize = words[k++];
        t_.maxBlocks = words[k++];
        t_.rowsPerRequest = words[k++];
        t_.poolRows = words[k++];
        t_.copyBytes = words[k++];
        t_.idxChunk = words[k++];
        t_.cntChunk = words[k++];
        t_.btWindow = words[k++];
        t_.spanRows = words[k++];
        t_.readGapRows = words[k++];
        t_.entryPitch = words[k++];
        t_.countPitch = words[k++];
        for (uint32_t p = 0; p < kGatherMaxPairs; ++p) t_.rowBytes[p] = words[k++];
        for (uint32_t p = 0; p < kGatherMaxPairs; ++p) t_.src[p] = words[k++];
        for (uint32_t p = 0; p < kGatherMaxPairs; ++p) t_.dst[p] = words[k++];
        for (uint32_t p = 0; p < kGatherMaxPairs; ++p) t_.slotPitch[p] = words[k++];
        for (uint32_t p = 0; p < kGatherMaxPairs; ++p) t_.hostPitch[p] = words[k++];
        scalarReadPending_ = true;  // the tiling buffer was read by S; it is never reloaded
    }

    __aicore__ inline void SyncMte2ToScalar()
    {
        event_t e = static_cast<event_t>(pipe_->FetchEventID(AscendC::HardEvent::MTE2_S));
        AscendC::SetFlag<AscendC::HardEvent::MTE2_S>(e);
        AscendC::WaitFlag<AscendC::HardEvent::MTE2_S>(e);
    }
    // Before MTE2 overwrites a UB buffer the scalar unit has been reading (write-after-read).
    __aicore__ inline void SyncScalarToMte2()
    {
        event_t e = static_cast<event_t>(pipe_->FetchEventID(AscendC::HardEvent::S_MTE2));
        AscendC::SetFlag<AscendC::HardEvent::S_MTE2>(e);
        AscendC::WaitFlag<AscendC::HardEvent::S_MTE2>(e);
    }

    // n int32 from GM into a UB buffer (byte-exact; the 32 B tail of the last block is undefined).
    __aicore__ inline void LoadInt32(const AscendC::LocalTensor<int32_t>& dst, const AscendC::GlobalTensor<int32_t>& src,
                                     uint64_t n)
    {
        AscendC::DataCopyExtParams params{1, static_cast<uint32_t>(n * sizeof(int32_t)), 0, 0, 0};
        AscendC::DataCopyPadExtParams<int32_t> pad{false, 0, 0, 0};
        AscendC::DataCopyPad(dst, src, params, pad);
    }

    // miss_counts[r] clamped to [0, N], through a UB window of cntChunk rows (the window holds the
    // entries at their pitch: (cntChunk - 1) * countPitch + 1 int32 fit the buffer, host tiling).
    __aicore__ inline uint64_t CountOf(uint64_t r)
    {
        if (!cntValid_ || r < cntBase_ || r >= cntBase_ + cntLen_) {
            uint64_t base = r - r % t_.cntChunk;
            uint64_t len = t_.rows - base < t_.cntChunk ? t_.rows - base : t_.cntChunk;
            if (scalarReadPending_) SyncScalarToMte2();
            LoadInt32(cntLocal_, cntGm_[base * t_.countPitch], (len - 1) * t_.countPitch + 1);
            SyncMte2ToScalar();
            cntBase_ = base;
            cntLen_ = len;
            cntValid_ = true;
        }
        scalarReadPending_ = true;
        int32_t c = cntLocal_.GetValue(static_cast<uint32_t>((r - cntBase_) * t_.countPitch));
        if (c < 0) return 0;
        uint64_t u = static_cast<uint64_t>(c);
        return u > t_.entriesPerRow ? t_.entriesPerRow : u;
    }

    // block_table[r, col] through a UB window of btWindow entries of row r.
    __aicore__ inline int64_t BlockOf(uint64_t r, uint64_t col)
    {
        if (!btValid_ || r != btRow_ || col < btBase_ || col >= btBase_ + btLen_) {
            uint64_t base = col - col % t_.btWindow;
            uint64_t len = t_.maxBlocks - base < t_.btWindow ? t_.maxBlocks - base : t_.btWindow;
            if (scalarReadPending_) SyncScalarToMte2();
            LoadInt32(btLocal_, btGm_[r * t_.maxBlocks + base], len);
            SyncMte2ToScalar();
            btRow_ = r;
            btBase_ = base;
            btLen_ = len;
            btValid_ = true;
        }
        scalarReadPending_ = true;
        return btLocal_.GetValue(static_cast<uint32_t>(col - btBase_));
    }

    // Flat host-pool row of (r, pos), or -1 when it lies outside the pool (reference.host_rows).
    __aicore__ inline int64_t HostRow(uint64_t r, int64_t pos)
    {
        if (pos < 0) return -1;
        uint64_t p = static_cast<uint64_t>(pos);
        uint64_t flat;
        if (t_.blockSize == 0) {
            if (p >= t_.rowsPerRequest) return -1;
            flat = r * t_.rowsPerRequest + p;
        } else {
            uint64_t col = p / t_.blockSize;
            if (col >= t_.maxBlocks) return -1;
            int64_t block = BlockOf(r, col);
            if (block < 0) return -1;
            flat = static_cast<uint64_t>(block) * t_.blockSize + p % t_.blockSize;
        }
        if (flat >= t_.poolRows) return -1;
        return static_cast<int64_t>(flat);
    }

    // ------------------------------------------------------------------------ partitions

    __aicore__ inline void ProcessMiss()
    {
        const uint64_t R = t_.rows, C = t_.numCores;
        uint64_t total = 0;
        for (uint64_t r = 0; r < R; ++r) total += CountOf(r);
        const uint64_t lo = blockIdx_ * total / C, hi = (blockIdx_ + 1) * total / C;
        if (lo >= hi) return;
        uint64_t pre = 0;
        for (uint64_t r = 0; r < R && pre < hi; ++r) {
            uint64_t cnt = CountOf(r);
            uint64_t a = lo > pre ? lo - pre : 0;
            uint64_t end = pre + cnt < hi ? pre + cnt : hi;
            if (end > pre + a) CopySegment(r, a, end - pre);
            pre += cnt;
        }
    }

    __aicore__ inline void ProcessRequest()
    {
        for (uint64_t r = blockIdx_; r < t_.rows; r += t_.numCores) {
            uint64_t cnt = CountOf(r);
            if (cnt > 0) CopySegment(r, 0, cnt);
        }
    }

    // Equal chunks of the R*N entry layout, one per core. `topk` (the older split) walks the
    // compacted miss list: entries past a row's miss count are padding, no-ops. `selection` (the
    // paper's S2) walks the selection layout: entries that are not first misses hold -1 and are
    // skipped by CopySegment (slot < 0), so hits cost an index read each.
    __aicore__ inline void ProcessEqualChunks(bool clipToMissCount)
    {
        const uint64_t N = t_.entriesPerRow, C = t_.numCores;
        const uint64_t L = t_.rows * N;
        if (L == 0) return;
        const uint64_t lo = blockIdx_ * L / C, hi = (blockIdx_ + 1) * L / C;
        if (lo >= hi) return;
        for (uint64_t r = lo / N; r <= (hi - 1) / N; ++r) {
            uint64_t rowStart = r * N;
            uint64_t a = lo > rowStart ? lo - rowStart : 0;
            uint64_t b = hi < rowStart + N ? hi - rowStart : N;
            if (clipToMissCount) {
                const uint64_t cnt = CountOf(r);
                if (b > cnt) b = cnt;
            }
            if (b > a) CopySegment(r, a, b);
        }
    }

    // ------------------------------------------------------------------------ copies

    // Entries [a, b) of row r: indices loaded in chunks of idxChunk; entries grouped into reads.
    __aicore__ inline void CopySegment(uint64_t r, uint64_t a, uint64_t b)
    {
        const uint64_t S = t_.capacity;
        for (uint64_t j0 = a; j0 < b; j0 += t_.idxChunk) {
            uint64_t n = b - j0 < t_.idxChunk ? b - j0 : t_.idxChunk;
            if (scalarReadPending_) SyncScalarToMte2();
            LoadInt32(posLocal_, posGm_[r * t_.entryPitch + j0], n);
            LoadInt32(slotLocal_, slotGm_[r * t_.entryPitch + j0], n);
            SyncMte2ToScalar();
            scalarReadPending_ = true;
            for (uint64_t i = 0; i < n; ++i) {
                int32_t pos = posLocal_.GetValue(static_cast<uint32_t>(i));
                int32_t slot = slotLocal_.GetValue(static_cast<uint32_t>(i));
                if (slot < 0 || static_cast<uint64_t>(slot) >= S) continue;  // never from a valid plan
                int64_t hostRow = HostRow(r, pos);
                if (hostRow < 0) continue;
                AddToGroup(r, static_cast<uint64_t>(hostRow), static_cast<uint32_t>(slot));
                ++copied_;
            }
        }
        FlushGroup();  // groups never span rows: a group's writes go to one dst row block
    }

    // Entry (host row h -> slot s of row r) joins the open group when its host row follows the
    // group's last one within readGapRows and the group's span stays within spanRows rows.
    __aicore__ inline void AddToGroup(uint64_t r, uint64_t h, uint32_t s)
    {
        if (group_.pieces > 0) {
            const bool after = h > group_.lastHost;
            if (after && h - group_.lastHost - 1 <= t_.readGapRows && h - group_.firstHost < t_.spanRows) {
                Piece& last = group_.piece[group_.pieces - 1];
                if (h == group_.lastHost + 1 && s == last.slot + last.count) {
                    ++last.count;  // contiguous in host row and slot: the same write
                } else {
                    if (group_.pieces == kGatherMaxSpanRows) {
                        FlushGroup();
                        StartGroup(r, h, s);
                        return;
                    }
                    group_.piece[group_.pieces++] = Piece{s, static_cast<uint32_t>(h - group_.firstHost), 1};
                }
                group_.lastHost = h;
                return;
            }
            FlushGroup();
        }
        StartGroup(r, h, s);
    }

    __aicore__ inline void StartGroup(uint64_t r, uint64_t h, uint32_t s)
    {
        group_.row = r;
        group_.firstHost = h;
        group_.lastHost = h;
        group_.pieces = 1;
        group_.piece[0] = Piece{s, 0, 1};
    }

    // The open group's read, once per tensor pair (pieces of copyBytes for rows wider than that).
    __aicore__ inline void FlushGroup()
    {
        if (group_.pieces == 0) return;
        const uint64_t spanRows = group_.lastHost - group_.firstHost + 1;
        for (uint64_t p = 0; p < t_.numPairs; ++p) {
            const uint64_t bytes = t_.rowBytes[p];
            if (bytes <= t_.copyBytes) {
                Enqueue(p, 0, static_cast<uint32_t>(bytes), static_cast<uint16_t>(spanRows));
            } else {  // spanRows is 1 whenever a row exceeds copyBytes (host tiling)
                for (uint64_t off = 0; off < bytes; off += t_.copyBytes) {
                    uint64_t len = bytes - off < t_.copyBytes ? bytes - off : t_.copyBytes;
                    Enqueue(p, off, static_cast<uint32_t>(len), 1);
                }
            }
        }
        group_.pieces = 0;
    }

    // Issue the read of the open group (bytes [rowOff, rowOff + len) of `rows` host rows of pair p)
    // into a free queue buffer and enqueue it; its writes wait until the queue is full.
    __aicore__ inline void Enqueue(uint64_t p, uint64_t rowOff, uint32_t len, uint16_t rows)
    {
        if (queued_ == kGatherCopyBuffers) WriteOldest();
        Pending& d = pending_[(head_ + queued_) % kGatherCopyBuffers];
        d.pair = p;
        d.row = group_.row;
        d.rowOff = rowOff;
        d.len = len;
        d.pieces = group_.pieces;
        for (uint32_t k = 0; k < group_.pieces; ++k) d.piece[k] = group_.piece[k];
        const uint64_t hostPitch = t_.hostPitch[p];
        AscendC::LocalTensor<uint8_t> in = copyQue_.AllocTensor<uint8_t>();
        // host row firstHost + k -> UB byte k * UbRowPitch(len) (the rule above UbRowPitch)
        AscendC::DataCopyExtParams params{rows, len, static_cast<uint32_t>(hostPitch - len), kUbRowGapBlocks, 0};
        AscendC::DataCopyPadExtParams<uint8_t> pad{false, 0, 0, 0};
        AscendC::DataCopyPad(in, srcGm_[p][group_.firstHost * hostPitch + rowOff], params, pad);
        copyQue_.EnQue(in);
        ++queued_;
    }

    // Dequeue the oldest read and write each of its slot runs (one DMA per run).
    __aicore__ inline void WriteOldest()
    {
        Pending& d = pending_[head_];
        AscendC::LocalTensor<uint8_t> out = copyQue_.DeQue<uint8_t>();
        const uint64_t slotPitch = t_.slotPitch[d.pair];
        const uint64_t pitch = UbRowPitch(d.len);  // where Enqueue's read put each row
        for (uint32_t k = 0; k < d.pieces; ++k) {
            const Piece& pc = d.piece[k];
            // pc.count rows from UB row pc.ubRow on, read at UbRowPitch(len), to consecutive slots
            AscendC::DataCopyExtParams params{static_cast<uint16_t>(pc.count), d.len, kUbRowGapBlocks,
                                              static_cast<uint32_t>(slotPitch - d.len), 0};
            const uint64_t dstOff = (d.row * t_.capacity + pc.slot) * slotPitch + d.rowOff;
            AscendC::DataCopyPad(dstGm_[d.pair][dstOff], out[static_cast<uint32_t>(pc.ubRow * pitch)], params);
        }
        copyQue_.FreeTensor(out);
        head_ = (head_ + 1) % kGatherCopyBuffers;
        --queued_;
    }

    // countOut[c*8 .. c*8+8) = {copied, 0 x 7}: one whole 32 B block per core.
    __aicore__ inline void WriteCount()
    {
        AscendC::LocalTensor<int32_t> o = outBuf_.Get<int32_t>();
        o.SetValue(0, static_cast<int32_t>(copied_));
        for (uint32_t k = 1; k < kGatherCountSlot; ++k) o.SetValue(k, 0);
        event_t e = static_cast<event_t>(pipe_->FetchEventID(AscendC::HardEvent::S_MTE3));
        AscendC::SetFlag<AscendC::HardEvent::S_MTE3>(e);
        AscendC::WaitFlag<AscendC::HardEvent::S_MTE3>(e);
        AscendC::DataCopy(outGm_[blockIdx_ * kGatherCountSlot], o, kGatherCountSlot);
    }

    AscendC::TPipe* pipe_ = nullptr;
    GatherTiling t_;
    uint64_t blockIdx_ = 0;
    uint64_t copied_ = 0;

    AscendC::TQueBind<AscendC::TPosition::VECIN, AscendC::TPosition::VECOUT, kGatherCopyBuffers> copyQue_;

    // A run of entries contiguous in host row and slot: one write of `count` rows from UB row
    // ubRow of its group's read to slot `slot` onwards.
    struct Piece {
        uint32_t slot, ubRow, count;
    };
    // The read group being formed (entries of row `row`, host rows firstHost..lastHost).
    struct Group {
        uint64_t row = 0, firstHost = 0, lastHost = 0;
        uint32_t pieces = 0;
        Piece piece[kGatherMaxSpanRows];
    };
    // A read in flight in the copy queue, with the writes it feeds.
    struct Pending {
        uint64_t pair = 0, row = 0, rowOff = 0;
        uint32_t len = 0, pieces = 0;
        Piece piece[kGatherMaxSpanRows];
    };
    Group group_;
    Pending pending_[kGatherCopyBuffers];
    uint32_t head_ = 0, queued_ = 0;
    AscendC::TBuf<AscendC::TPosition::VECCALC> tilingBuf_, posBuf_, slotBuf_, cntBuf_, btBuf_, outBuf_;
    AscendC::LocalTensor<int32_t> posLocal_, slotLocal_, cntLocal_, btLocal_;

    AscendC::GlobalTensor<int32_t> posGm_, slotGm_, cntGm_, btGm_, outGm_;
    AscendC::GlobalTensor<uint8_t> srcGm_[kGatherMaxPairs], dstGm_[kGatherMaxPairs];

    // UB windows over miss_counts and block_table.
    bool cntValid_ = false, btValid_ = false;
    uint64_t cntBase_ = 0, cntLen_ = 0;
    uint64_t btRow_ = 0, btBase_ = 0, btLen_ = 0;
    // The scalar unit has read a DMA-loaded buffer since the last S->MTE2 flag.
    bool scalarReadPending_ = false;
};

}  // namespace avsg
