// plan_policy.h: the tags that choose a plan kernel's behaviour at compile time (as catlass
// chooses a block's by dispatch policies). A matcher tag picks how step 1 finds resident
// selections, a policy tag which residency policy's passes are compiled; the kernel entry reads
// the policy from the tiling once and instantiates PlanKernel<Matcher, Policy>. No UB.
#pragma once
#include "plan_tiling.h"

namespace avsg_kernel {

// Step 1: the hash index (probes, then the stash), or the dual-pointer baseline (sorted row
// and resident slots walked with two pointers; no index lookup, no lookup split). kDual stays a
// flag: it chooses which blocks the kernel composes (and whether the lookup splits), which is the
// kernel's own job (PlanKernel::Row), not a piece of a block.
struct MatchHash {
    static constexpr bool kDual = false;
};
struct MatchDualPointer {
    static constexpr bool kDual = true;
};

// Residency policies (reference.POLICY_IDS): only an id each. What a policy does is in the
// blocks specialised on its type, one file per policy: PlanBlockDecay<Policy>
// (plan_block_decay_<policy>.h), VictimSearch<Policy> (plan_block_victims_<policy>.h) and
// PolicyUpkeep<Policy> (plan_block_upkeep.h: none, plan_block_upkeep_reuse.h). No block tests a
// policy flag.
struct PolicyLifetime {
    static constexpr uint32_t kId = avsg::kPolicyLifetime;
};
struct PolicyReuse {
    static constexpr uint32_t kId = avsg::kPolicyReuse;
};
struct PolicyLru {
    static constexpr uint32_t kId = avsg::kPolicyLru;
};

}  // namespace avsg_kernel
