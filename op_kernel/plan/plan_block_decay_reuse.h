// plan_block_decay_reuse.h: the reuse policy's ageing, PlanBlockDecay<PolicyReuse> (step 3's first
// pass; the declaration and what the policies share are plan_block_victims.h). Every age is
// clamped to [-1, 1023] and grows by one step (free slots, -1, stay free); hit slots -> 0 and
// their counts gain (PlanBlockHeat::CountHits, from the ages one step older). One vector pass per
// window, nc lanes at a time, as CountHits works in the nc-lane scratch (and reads the ages from
// vT2_); the score search (plan_block_victims_reuse.h) reads the windows, no half copy.
// UB: the slot_life and slot_count windows, hitBits_, vT1_/vT2_/vKey_/vTmpF_ and the masks.
#pragma once
#include "plan_block_victims.h"

namespace avsg_kernel {

template <>
class PlanBlockDecay<PolicyReuse> {
public:
    // every decay gets the same pieces (the kernel builds whichever its policy names)
    __aicore__ inline explicit PlanBlockDecay(PlanContext& ctx, PlanBlockProbe&, PlanBlockHeat& heat,
                                              PlanBlockVictims& victims)
        : ctx_(ctx), heat_(heat), victims_(victims) {}
    __aicore__ inline void DecayAndPin() {
        const uint32_t chunk = ctx_.t_.nc;
        const LocalTensor<int32_t> t1 = ctx_.vT1_, t2 = ctx_.vT2_;
        const LocalTensor<float> lifeF = ctx_.vTmpF_;
        Win& sl = ctx_.win_[avsg::SEC_SL];
        victims_.freeSlots_ = 0;
        Sync<HardEvent::S_V>();
        // last window first, so the search starts its slot-order scan in the resident window 0
        for (uint32_t k = 0; k < sl.nwin; ++k) {
            const uint32_t id = sl.nwin - 1 - k;
            ctx_.Ensure(sl, static_cast<int32_t>(id));
            const uint32_t cnt = WinCount(sl, static_cast<int32_t>(id));
            for (uint32_t off = 0; off < cnt; off += chunk) {
                const uint32_t n = MinU(chunk, cnt - off);
                LocalTensor<int32_t> life = sl.buf[off];
                const uint32_t base = id * sl.wlen + off;
                victims_.AgeAndPin(life, base, n, t1, ctx_.vKey_, t2, lifeF);
                Cast(life, lifeF, RoundMode::CAST_RINT, n);
                PipeBarrier<PIPE_V>();
                heat_.CountHits(base, n);
            }
            sl.dirty = true;
        }
        Sync<HardEvent::V_S>();
    }

    // the context and the blocks this one calls
    PlanContext& ctx_;
    PlanBlockHeat& heat_;
    PlanBlockVictims& victims_;
};

}  // namespace avsg_kernel
