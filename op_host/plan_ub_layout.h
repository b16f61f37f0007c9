// plan_ub_layout.h: the plan kernels' Unified Buffer plan, computed once from the tiling and read
// by both sides: PlanKernel::Init (CarveUb, op_kernel/plan/plan_context.h) allocates every buffer
// with the sizes below, in this order, and checks where they end; the host (op_host/plan_host.cpp)
// sizes the section windows so that `total` fits the budget. Plain C++ like plan_tiling.h (no
// AscendC types), so the device compile, the CPU emulation and the host compiler all accept it.
//
// Order (TPipe places buffers one after another, 32 B aligned; every size here is already a
// multiple of 32): tiling copy, the aligned region (sort buffers + the three wide vectors, one
// buffer with slack because Sort32 wants 256 B / 128 B boundaries that TPipe does not promise),
// the nc-element work vectors, the wide compare masks, the bitmaps (hit slots, the hit byte map,
// claimed buckets, pending misses), the merge heads and loser trees, stats / scalars / header, the
// resident slots (if any), then one window per state section (a section the policy lacks has none).
#pragma once
#include "plan_tiling.h"

namespace avsg {

struct PlanUbLayout {
    // bytes per buffer
    uint32_t tiling;                 // the tiling's UB copy (LoadTiling)
    uint32_t aligned;                // sort region + wide vectors + alignment slack
    uint32_t vector;                 // each of kPlanVectors nc-element vectors
    uint32_t mask;                   // each of kPlanMasks kPlanProbes*nc-bit masks
    uint32_t hitBits, hitBytes, claimBits, pendBits;   // hitBytes: one byte per padded slot
    uint32_t heads, trees;           // merge head space (kPlanMergeRegions), two merges' loser trees
    uint32_t stats, scalars, header;  // int64 stats row, scalar staging, header (+ stash count block)
    uint32_t slots;                  // the row's slots, whole chunks (t.slotsResident; 0: stored per chunk)
    uint32_t lifeStage;              // slot_life's window as int16, on its way to and from GM
    uint32_t window[SEC_COUNT];      // 0: the section has no window (its policy lacks it)
    // byte offsets inside the aligned region, from its first kPlanSortAlign boundary
    uint32_t sortBytes;              // kPlanSortVectors nc-element float vectors (Sort / Extract)
    uint32_t wideBytes;              // one kPlanProbes*nc-element vector
    uint32_t wIdxOff, wWinOff, wSlotOff;
    // totals
    uint32_t fixed;                  // everything but the windows
    uint32_t total;
};

// The hit byte map: one byte per padded slot, rounded up to whole 128-lane half compares.
AVSG_PLAN_SHARED_FN uint32_t HitByteMapBytes(const PlanTiling& t) { return RoundUp(t.capPad, 128); }

AVSG_PLAN_SHARED_FN PlanUbLayout MakePlanUbLayout(const PlanTiling& t) {
    PlanUbLayout l{};
    const uint32_t nc = t.nc, wide = kPlanProbes * t.nc;
    l.tiling = kPlanTilingUbBytes;
    l.sortBytes = RoundUp(kPlanSortVectors * nc * 4, 32);
    l.wideBytes = RoundUp(wide * 4, 32);
    l.wIdxOff = l.sortBytes;
    l.wWinOff = l.sortBytes + l.wideBytes;
    l.wSlotOff = l.sortBytes + 2 * l.wideBytes;
    l.aligned = l.sortBytes + kPlanWideVectors * l.wideBytes + kPlanSortAlignSlack;
    l.vector = RoundUp(nc * 4, 32);
    l.mask = RoundUp(wide / 8, 32);
    l.hitBits = RoundUp(t.capPad / 8, 32);
    l.hitBytes = HitByteMapBytes(t);
    l.claimBits = RoundUp(t.buckets / 8, 32);
    l.pendBits = RoundUp(t.pendWords * 4, 32);
    l.heads = RoundUp(2 * kPlanMaxRuns * kPlanHeadLen * 4, 32);
    l.trees = RoundUp(2 * kPlanMaxRuns * 4, 32);
    l.stats = 32;
    l.scalars = 32;
    l.header = 64;
    l.slots = t.slotsResident ? RoundUp(t.numChunks * t.nc * 4, 32) : 0;   // Classify writes whole chunks
    l.lifeStage = RoundUp(t.winLen[SEC_SL] * 2, 32);
    l.fixed = l.tiling + l.aligned + kPlanVectors * l.vector + kPlanMasks * l.mask + l.hitBits + l.hitBytes + l.claimBits +
              l.pendBits + l.heads + l.trees + l.stats + l.scalars + l.header + l.slots + l.lifeStage;
    l.total = l.fixed;
    for (uint32_t s = 0; s < SEC_COUNT; ++s) {
        l.window[s] = RoundUp(t.winLen[s] * 4, 32);
        l.total += l.window[s];
    }
    return l;
}

}  // namespace avsg
