// plan_policy.h: the tags that choose a plan kernel's behaviour at compile time (as catlass
// chooses a block's by dispatch policies). A matcher tag picks how step 1 finds resident
// selections, a policy tag which residency policy's passes are compiled; the kernel entry reads
// the policy from the tiling once and instantiates PlanKernel<Matcher, Policy>. No UB.
#pragma once
#include "plan_tiling.h"

namespace avsg_kernel {

// Step 1: the hash index (probes, then the stash), or the dual-pointer baseline (sorted row
// and resident slots walked with two pointers; no index lookup, no lookup split).
struct MatchHash {
    static constexpr bool kDual = false;
};
struct MatchDualPointer {
    static constexpr bool kDual = true;
};

// Residency policies (reference.POLICY_IDS). kAged: slot_life holds an age and victims are
// chosen by score (reuse, lru), not by remaining life.
struct PolicyLifetime {
    static constexpr uint32_t kId = avsg::kPolicyLifetime;
    static constexpr bool kAged = false, kReuse = false, kLru = false;
};
struct PolicyReuse {
    static constexpr uint32_t kId = avsg::kPolicyReuse;
    static constexpr bool kAged = true, kReuse = true, kLru = false;
};
struct PolicyLru {
    static constexpr uint32_t kId = avsg::kPolicyLru;
    static constexpr bool kAged = true, kReuse = false, kLru = true;
};

}  // namespace avsg_kernel
