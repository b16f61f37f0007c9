// plan_gather_tiling.h: the tiling of plan_gather, the plan and the gather as one launch
// (op_kernel/plan_gather.cpp, host op_host/plan_gather_host.cpp): the two kernels' own tilings
// side by side, so that each kernel reads its own exactly as its separate launch would. POD, plain
// C++ (read by the host compiler and the AI core compiler alike).
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "gather_tiling.h"
#include "plan_tiling.h"

namespace avsg {

struct PlanGatherTiling {
    PlanTiling plan;                 // at offset 0: the plan kernel loads it from the tiling's address
    alignas(32) GatherTiling gather; // the gather kernel loads it from its own 32 B granule on
};

static_assert(offsetof(PlanGatherTiling, plan) == 0, "the plan's tiling leads");
static_assert(offsetof(PlanGatherTiling, gather) % 32 == 0, "the gather's tiling starts a 32 B granule");
// The GM address of the gather's part of the tiling: what its kernel is given.
constexpr size_t kPlanGatherGatherOffset = offsetof(PlanGatherTiling, gather);

}  // namespace avsg
