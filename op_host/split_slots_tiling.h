// Tiling of the split_slots kernel (op_kernel/split_slots_kernel.h, host op_host/split_slots_host.cpp):
// a POD struct of uint32 words the host fills and the kernel DMAs into UB (LoadTiling), so its
// bytes mean the same on the host compiler and the AI core compiler.
#pragma once
#include <stdint.h>

namespace avsg {

// Lanes the kernel classifies per vector pass: a multiple of 128, as the half CompareScalar over
// the gathered marks works on 256 B repeats; 1024 keeps a K 2048 token at two passes.
constexpr uint32_t kSplitChunk = 1024;
// Largest capacity S: the per-row slot map is S + 1 half words in UB (64 KB at 2^15, the largest
// capacity a buffer has: reference.MAX_BUCKETS).
constexpr uint32_t kSplitMaxCapacity = 32768;
// UB (bytes): the tiling (64), the slot map RoundUp(S + 1, 128) halves (<= 65.8 KB), six chunk
// vectors (selections, their float copy, map offsets, gathered marks, the hit and miss lists)
// and a -1 fill of kSplitChunk int32 (<= 26 KB), four lane masks (512 B), a scalar (32): < 93 KB.

struct SplitSlotsTiling {
    uint32_t rows;          // R
    uint32_t queries;       // T
    uint32_t topk;          // K
    uint32_t entries;       // N = T * K: columns of miss_slots
    uint32_t capacity;      // S: slots in [0, S) are valid
    uint32_t mapLen;        // half words of the slot map: S + 1 (the sentinel) rounded up to 128
    uint32_t slotsPitch;    // int32 between rows of slots (a plan's rows are padded to 8)
    uint32_t missPitch;     // int32 between rows of miss_slots
    uint32_t countStride;   // int32 between entries of miss_counts (a plan's: 8)
    uint32_t outPitch;      // int32 between rows of hits / misses: N rounded up to 8 (32 B), so no
                            // 32 B granule holds two rows (two rows may be written by two cores)
    uint32_t reserved[6];
};

}  // namespace avsg
