// plan_phases.h: the steps of a plan row-step as AVSG_PHASE ids (kernel_compat.h), marked by
// PlanKernel::Process / Row (plan_kernel.h). On the NPU and in the fast emulation the markers are
// nothing; the strict emulation splits each block's counters by phase, read through
// avsg::last_launch_phases (op_host/emu_counters.cpp) and priced per phase by
// avsg.costmodel.plan_cost.phase_breakdown.
#pragma once
#include "kernel_operator.h"
#include "../kernel_compat.h"

namespace avsg_kernel {

enum class PlanPhase : uint32_t {
    kSetup = 0,     // the launch's prologue before its first row: tiling, UB carve
    kStart,         // a row's header check (or rejection), stash count, padding slots freed
                    // (after the split's SyncAll: in kSplitSync), the reuse policy's heat cooled
    kStash,         // stash compaction #1 and the sorted stash runs (hash matcher)
    kLookup,        // per chunk: PrepareWant + HashLookup / DualFound; the dual pointer's
                    // resident runs and two-pointer match; a split row's owner with no chunk
                    // of its own: its index loaded meanwhile
    kClassify,      // per chunk: misses compacted, sorted, run to the workspace
    kSplitSync,     // split lookup: the SyncAll; the owner's fold of the helpers' parts and
                    // its padding slots freed
    kMerge,         // k-way merge of the miss runs (and the stash) into miss_pos
    kHeat,          // reuse policy: heat raised by the row's used blocks (its cooling at the
                    // row's start is in kStart)
    kDecay,         // decay of slot_life and hits pinned
    kVictims,       // victims chosen, slot_pos / slot_life scattered
    kPublish,       // the miss count out (and plan_gather's SyncAll)
    kLivesBack,     // slot_life back from its half copy (lifetime, lru), after the publish
    kInsert,        // bucket insert rounds of the misses
    kStashPending,  // stash compaction #2 and append
    kStore,         // outputs, stats, state write-back
    kHelper,        // split lookup, helper core: its part of a row (HelpRow), before the SyncAll
    kCount
};

#if defined(AVSG_ASCENDC_EMULATION) && AVSG_EMU_STRICT
inline const ::avsg_emu::PhaseTable& PhaseTableOf(PlanPhase) {
    static constexpr const char* kNames[] = {
        "setup", "row start", "stash runs", "lookup", "classify", "split sync+fold", "merge misses",
        "heat", "decay+pin", "victims", "publish", "lives back", "insert", "stash pending", "output+store",
        "split helper"};
    static_assert(sizeof(kNames) / sizeof(kNames[0]) == static_cast<uint32_t>(PlanPhase::kCount),
                  "one name per PlanPhase");
    static constexpr ::avsg_emu::PhaseTable kTable{kNames, static_cast<uint32_t>(PlanPhase::kCount)};
    return kTable;
}
#endif

}  // namespace avsg_kernel
