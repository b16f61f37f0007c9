// calibrate_tiling.h: POD tiling shared by op_host/calibrate_host.cpp and the calibration
// microkernel (op_kernel/calibrate_kernel.h). Plain fixed-width integers, every field 64-bit, so
// the host compiler and the AI core compiler agree on its bytes (as gather_tiling.h).
//
// The microkernel repeats one of the plan kernel's costly operations `iters` times on one core,
// so that `avsg bench calibrate` can time it on an NPU for several iters and fit the cost of one
// iteration (the slope; launch overhead is the intercept). Its shapes are the plan kernel's, taken
// from plan_tiling.h so that they follow it: Gather over kPlanProbes * kPlanChunk lanes, Sort and
// GatherMask over kPlanChunk lanes.
#pragma once
#include <stdint.h>

#include "plan_tiling.h"

namespace avsg {

enum CalibrateMode : uint64_t {
    kCalibScalar = 0,      // dependent chain of scalar UB reads: idx = table[idx] & (L-1)
    kCalibGather = 1,      // dependent chain of Gather: offsets(k+1) = table[offsets(k)], W lanes
    kCalibSort = 2,        // Sort<float, true> of kPlanChunk (score, index) pairs
    kCalibGatherMask = 3,  // GatherMask compaction of kPlanChunk int32 lanes, two masks in turn
};

constexpr uint32_t kCalibGatherLanes = kPlanProbes * kPlanChunk;   // the plan's Wide()
constexpr uint32_t kCalibVectorLanes = kPlanChunk;                 // the plan's nc
constexpr uint32_t kCalibMaxTable = 8192;                          // int32 entries (32 KB of UB)
// Output int32 [kCalibOutLen]: an 8-word header (32 B, one DMA) then the mode's vector checksum.
//   header: [0] scalar checksum a, [1] scalar checksum b, [2] iters (low 32 bits), [3] mode
//   scalar      a = final idx, b = sum of the visited idx (mod 2^32)
//   gather      payload [0, W) = final byte offsets
//   sort        payload [0, nc) = sorted scores (float bits), [nc, 2nc) = their indices
//   gathermask  a = sum of the kept counts (mod 2^32), b = last count; payload [0, b) = last result
constexpr uint32_t kCalibHeaderWords = 8;
constexpr uint32_t kCalibOutLen = kCalibHeaderWords + kCalibGatherLanes;

struct CalibrateTiling {
    uint64_t mode;       // CalibrateMode
    uint64_t iters;      // >= 1
    uint64_t tableLen;   // L: values.numel(), a power of two in [kCalibGatherLanes, kCalibMaxTable]
    uint64_t reserved;   // keeps the struct a multiple of 32 B (one DMA, no padding rules)
};

}  // namespace avsg
