// plan_ub_budget.h: the plan kernels' Unified Buffer plan, buffer by buffer (host only: the tiling
// code in plan_host.cpp sizes the section windows with it; the kernels never include it, so the
// device compile sees no host functions).
#pragma once
#include "plan_tiling.h"

namespace avsg {

// Fixed (window-independent) UB bytes of the plan kernels, buffer by buffer (mirrors Init).
inline uint32_t PlanFixedUbBytes(const PlanTiling& t) {
    uint32_t b = kPlanTilingUbBytes;                      // tiling copy
    b += kPlanSortVectors * RoundUp(t.nc * 4, 32);        // Sort / Extract buffers
    b += kPlanWideVectors * RoundUp(kPlanProbes * t.nc * 4, 32);  // all-probe vectors
    b += kPlanSortAlignSlack;                             // aligning the two groups above
    b += kPlanVectors * RoundUp(t.nc * 4, 32);            // work vectors
    b += kPlanMasks * RoundUp(kPlanProbes * t.nc / 8, 32);  // compare masks
    b += RoundUp(t.capPad / 8, 32);                       // hit bitmap over slots
    b += RoundUp(t.buckets / 8, 32);                      // claimed bitmap over buckets
    b += RoundUp(t.pendWords * 4, 32);                    // pending bitmap over misses
    b += RoundUp(2 * kPlanMaxRuns * kPlanHeadLen * 4, 32);   // merge heads (kPlanMergeRegions)
    b += RoundUp(2 * kPlanMaxRuns * 4, 32);                  // two merges' loser trees
    b += 2 * 32 + 64;                                     // stats, scalars, header (+ stash count)
    return b;
}

inline uint32_t PlanUbBytes(const PlanTiling& t) {
    uint32_t b = PlanFixedUbBytes(t);
    for (uint32_t s = 0; s < SEC_COUNT; ++s) b += RoundUp(t.winLen[s] * 4, 32);
    return b;
}

}  // namespace avsg
