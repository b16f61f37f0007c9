// Tiling of the gather kernel: a POD struct the host fills and the kernel reads from GM.
//
// Shared by op_kernel/gather_kernel.h (device side: AscendC, or the CPU emulation) and by
// op_host/gather_host.cpp (host side). It must stay a plain struct of fixed-width integers, with
// no pointers and no constructors, so that its bytes mean the same thing on the host compiler and
// on the AI core compiler. Every field is 64-bit, so there is no padding to disagree about.
//
// Device addresses of the src/dst tensors travel as uint64_t, as the generated launch stub
// (aclrtlaunch_<kernel>.h) only takes GM pointers and scalars, not arrays of pointers.
#pragma once
#include <stdint.h>

namespace avsg {

// Tensor pairs one launch copies (a latent and a RoPE cache, say). More pairs: several launches.
constexpr uint32_t kGatherMaxPairs = 8;

// Partition codes (docs/design.md §4): the order is the one of reference.PARTITIONS.
enum GatherPartition : uint32_t {
    kPartitionMiss = 0,     // (row, pos)-ordered misses cut into C contiguous chunks (+-1)
    kPartitionRequest = 1,  // row r -> core r % C
    kPartitionTopk = 2,     // the fixed R*N miss-list layout cut into C chunks; padding = no-op
    kPartitionSelection = 3,  // the paper's S2: the R*N selection layout cut into C chunks,
                              // entries of hits (-1) are no-ops, miss_counts unused
};

// UB plan of one core (bytes). 192 KB physical, 184 KB for TPipe (card §0):
//   copy queue  TQueBind<VECIN, VECOUT, 4>, 4 buffers x copyBytes     (<= 4 x 32 KB = 128 KB)
//   miss_pos    idxChunk int32                                       (2048 -> 8 KB)
//   miss_slots  idxChunk int32                                       (8 KB)
//   miss_counts cntChunk int32                                       (4096 -> 16 KB)
//   block_table btWindow int32 (paged pools only, else 32 B)         (2048 -> 8 KB)
//   per-core count 32 B; the tiling itself ~350 B (DMA'd in, read by the scalar unit)
//   total <= 128 + 8 + 8 + 16 + 8 + 0.4 KB = 168.4 KB < 184 KB.
// Host rows are read across PCIe, where one DMA costs microseconds of latency whatever its size
// up to ~16 KB: the copy queue keeps kGatherCopyBuffers reads in flight per core, and a read
// covers up to spanRows host rows (a run of misses contiguous in host row, or, with page reads,
// several misses of one host page).
constexpr uint32_t kGatherCopyBytesMax = 32 * 1024;
constexpr uint32_t kGatherIdxChunk = 2048;
constexpr uint32_t kGatherCntChunk = 4096;
constexpr uint32_t kGatherBtWindow = 2048;
// Queue depth = buffers: every buffer can hold a read in flight. Each outstanding EnQue holds one
// MTE2_MTE3 event id and each freed buffer one MTE3_MTE2 id (kernel_tquebind_impl.h); 4 leaves
// A2's 8 ids per event room for TPipe's own.
constexpr uint32_t kGatherCopyBuffers = 4;
// Most host rows one read may cover, and most separate slot runs (writes) it may feed.
constexpr uint32_t kGatherMaxSpanRows = 32;
// Page reads (AVSG_GATHER_PAGE_READS=1): a read may also cover up to this many bytes of host
// rows nobody missed, when that saves a separate DMA for a miss in the same host page.
constexpr uint32_t kGatherPageBytes = 4096;
// Each core writes its count into its own 32 B slot (8 int32) of the [numCores, 8] output, with
// one 32 B DMA, so no two cores ever write the same 32 B block (card §2/§8.11).
constexpr uint32_t kGatherCountSlot = 8;

struct GatherTiling {
    uint64_t rows;            // R: rows of miss_pos / miss_slots / miss_counts / block_table / dst
    uint64_t entriesPerRow;   // N = T*K: columns of miss_pos / miss_slots
    uint64_t capacity;        // S: slots per row of every dst
    uint64_t partition;       // GatherPartition
    uint64_t numCores;        // C: blocks launched; each writes countOut[c*8 .. c*8+8)
    uint64_t numPairs;        // 1..kGatherMaxPairs
    uint64_t blockSize;       // paged pool: tokens per block; 0: contiguous pool
    uint64_t maxBlocks;       // paged pool: block_table.shape[1]; 0 otherwise
    uint64_t rowsPerRequest;  // contiguous pool: max_len = src.shape[1]; 0 otherwise
    uint64_t poolRows;        // flat host rows of every src pool: src.shape[0] * src.shape[1]
    uint64_t copyBytes;       // bytes of one copy-queue buffer (multiple of 32); wider rows split
    uint64_t idxChunk;        // miss-list entries per index load (<= kGatherIdxChunk)
    uint64_t cntChunk;        // miss_counts entries per load (<= kGatherCntChunk)
    uint64_t btWindow;        // block_table entries per load (<= kGatherBtWindow)
    uint64_t spanRows;        // host rows one read may cover (1..kGatherMaxSpanRows); 1 when a row
                              // is wider than copyBytes (such rows are copied in pieces)
    uint64_t readGapRows;     // unmissed host rows a read may skip over (0: only exact runs)
    uint64_t entryPitch;      // int32 from one row of miss_pos / miss_slots to the next (>= N;
                              // plan pads it to 32 B)
    uint64_t countPitch;      // int32 from one miss_counts entry to the next (plan writes 8)
    uint64_t rowBytes[kGatherMaxPairs];  // bytes of one row of pair i (prod(shape[2:]) * itemsize)
    uint64_t src[kGatherMaxPairs];       // device address of src[i] (host pool, mapped or on device)
    uint64_t dst[kGatherMaxPairs];       // device address of dst[i] [R, S, row]
    uint64_t slotPitch[kGatherMaxPairs]; // bytes from one slot of dst[i] to the next (>= rowBytes[i]):
                                         // a multiple of 32 whenever two cores may write one row
    uint64_t hostPitch[kGatherMaxPairs]; // bytes from one host row of src[i] to the next (>= rowBytes[i])
};

}  // namespace avsg
