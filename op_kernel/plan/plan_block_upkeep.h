// plan_block_upkeep.h: a policy's per-step bookkeeping beside the shared blocks, a type
// specialised per policy (as VictimSearch<Policy> is): PolicyUpkeep<Policy>. The kernel calls its
// hooks at fixed points of a row (start, after the merge, before the write-back) and the drop and
// the padding reset call it for the per-slot sections only that policy keeps. lifetime and lru
// keep nothing beyond slot_pos and slot_life: this primary template, whose hooks compile to
// nothing. reuse: plan_block_upkeep_reuse.h (heat, slot counts, ghosts).
#pragma once
#include "plan_block_heat.h"

namespace avsg_kernel {

template <class Policy>
class PolicyUpkeep {
public:
    // every upkeep gets the same pieces (the kernel builds whichever its policy names)
    __aicore__ inline explicit PolicyUpkeep(PlanContext&, PlanBlockHeat&) {}
    __aicore__ inline void StartRow() {}
    __aicore__ inline void AfterMerge(uint32_t, uint32_t) {}
    __aicore__ inline void BeforeWriteBack() {}
    __aicore__ inline void FreePaddingSlot(uint32_t) {}
    __aicore__ inline void DropChunkBegin(uint32_t) {}
    __aicore__ inline void DropChunkClear(const LocalTensor<int32_t>&, uint32_t) {}
    __aicore__ inline void DropChunkEnd() {}
    __aicore__ inline void DropRest(const LocalTensor<int32_t>&, const LocalTensor<int32_t>&, const LocalTensor<float>&,
                                    float) {}
};

}  // namespace avsg_kernel
