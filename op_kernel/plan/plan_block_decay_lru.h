// plan_block_decay_lru.h: the lru policy's ageing, PlanBlockDecay<PolicyLru> (step 3's first
// pass; the declaration and what the policies share are plan_block_victims.h). Every age is
// clamped to [-1, 1023] and grows by one step (free slots, -1, stay free); hit slots -> 0. Where
// the half copy fits (DecayInHalf) the ages go there for the threshold search
// (plan_block_victims_lru.h); otherwise one vector pass per window. Either way it leaves what the
// search starts from: the oldest age and the free candidates (their count and their windows).
// UB: the slot_life windows, hitBits_, wWin_/wIdx_/wSlot_/wTmp_/wKey_ and the masks as scratch; the
// sort region (the half copy) and wPair_ where it fits.
#pragma once
#include "plan_block_victims.h"

namespace avsg_kernel {

template <>
class PlanBlockDecay<PolicyLru> {
public:
    // every decay gets the same pieces (the kernel builds whichever its policy names)
    __aicore__ inline explicit PlanBlockDecay(PlanContext& ctx, PlanBlockProbe& probe, PlanBlockHeat&,
                                              PlanBlockVictims& victims)
        : ctx_(ctx), probe_(probe), victims_(victims) {}
    __aicore__ inline void DecayAndPin() {
        if (victims_.HalfCopyFits()) {
            DecayInHalf();
            return;
        }
        // chunks of a whole window, up to the wide vectors' lanes (fewer instructions and
        // barriers per slot)
        const uint32_t chunk = probe_.Wide();
        const LocalTensor<int32_t> t1 = ctx_.wWin_, t2 = ctx_.wIdx_;
        const LocalTensor<int32_t> sink = ctx_.wSlot_;
        const LocalTensor<float> lifeF = ctx_.wWin_.ReinterpretCast<float>();
        Win& sl = ctx_.win_[avsg::SEC_SL];
        // the ages' lane-wise max, reduced below
        const LocalTensor<float> ageMax = ctx_.wTmp_.ReinterpretCast<float>();
        victims_.freeSlots_ = 0;
        PlanBlockVictims::WinSetClear(victims_.lruFreeWins_, false);
        Sync<HardEvent::S_V>();
        Duplicate(ageMax, -1.0f, probe_.Wide());
        // first window first: the count passes (CountAgesAtLeast) start from the resident window
        // and end in window 0, where SelectLru starts
        for (uint32_t id = 0; id < sl.nwin; ++id) {
            ctx_.Ensure(sl, static_cast<int32_t>(id));
            const uint32_t cnt = WinCount(sl, static_cast<int32_t>(id));
            for (uint32_t off = 0; off < cnt; off += chunk) {
                const uint32_t n = MinU(chunk, cnt - off);
                LocalTensor<int32_t> life = sl.buf[off];
                const uint32_t base = id * sl.wlen + off;
                victims_.AgeAndPin(life, base, n, t1, ctx_.wKey_, t2, lifeF);
                // the victim search's bounds: the oldest age, and the free slots among the
                // candidates (below the active capacity), counted after the pins (a hit is
                // never free, whatever its slot held)
                Max(ageMax, ageMax, lifeF, n);
                avsg::CompareScalarAll(ctx_.mB_, lifeF, -1.0f, CMPMODE::EQ, n);
                PipeBarrier<PIPE_V>();
                const uint32_t live = base < ctx_.activeCap_ ? MinU(n, ctx_.activeCap_ - base) : 0u;
                uint64_t nFree = 0;
                if (live) GatherMask(sink, t2, ctx_.U32(ctx_.mB_), true, live, GatherMaskParams(1, 1, 8, 0), nFree);
                if (nFree) PlanBlockVictims::WinSetAdd(victims_.lruFreeWins_, id);
                victims_.freeSlots_ += static_cast<uint32_t>(nFree);
                Cast(life, lifeF, RoundMode::CAST_RINT, n);
                PipeBarrier<PIPE_V>();
            }
            sl.dirty = true;
        }
        // ages are in [-1, 1023] here: exact in float
        const LocalTensor<float> top = ctx_.wIdx_.ReinterpretCast<float>();
        ReduceMax(top, ageMax, ctx_.wSlot_.ReinterpretCast<float>(), static_cast<int32_t>(probe_.Wide()));
        Sync<HardEvent::V_S>();
        victims_.maxAge_ = static_cast<int32_t>(ctx_.wIdx_.ReinterpretCast<float>().GetValue(0));
    }
    // Where the half copy fits: slot_life moves into it whole and the ageing and the pins run
    // on it in half precision, every instruction over the whole section (ages in [-1, 1023] are
    // exact in half; the instructions and their barriers, not the lanes, are most of a pass's
    // cost), as do the free count (any: every set, LruSetLen) and the oldest age. The search counts and
    // takes its victims there and installs into it; the section goes back from it once
    // (WriteBackHalfCopy); the window is left empty.
    __aicore__ inline void DecayInHalf() {
        const LocalTensor<half> age = victims_.HalfCopyLoad(), x = ctx_.sHalf_;
        const uint32_t n = victims_.HalfCopyLanes();
        const LocalTensor<uint8_t> notHit = victims_.HalfMask(0), freeMask = victims_.HalfMask(1);
        PlanBlockVictims::WinSetClear(victims_.lruFreeWins_, false);
        Not(notHit.ReinterpretCast<uint16_t>(), ctx_.hitBits_.ReinterpretCast<uint16_t>(), n / 16);
        // clamped to [-1, 1022] (age + 1 needs no upper clamp, as in AgeAndPin), then one step
        // older: (age + 1) + min(age, 0), free slots (-1) stay free. x (the copy's int16 lanes,
        // cast into age) is scratch until the pins write the result there.
        Maxs(age, age, static_cast<half>(-1.0f), n);
        PipeBarrier<PIPE_V>();
        Mins(age, age, static_cast<half>(static_cast<float>(avsg::kReuseAgeMax - 1)), n);
        PipeBarrier<PIPE_V>();
        Adds(x, age, static_cast<half>(1.0f), n);
        PipeBarrier<PIPE_V>();                    // Mins below writes what Adds reads (write-after-read)
        Mins(age, age, static_cast<half>(0.0f), n);
        PipeBarrier<PIPE_V>();
        Add(age, age, x, n);
        PipeBarrier<PIPE_V>();
        Select(x, notHit, age, static_cast<half>(0.0f), SELMODE::VSEL_TENSOR_SCALAR_MODE, n);   // hits: age 0
        victims_.HalfCopyTail(static_cast<half>(-1.0f));   // past the padded slots: free, counted nowhere
        PipeBarrier<PIPE_V>();
        // the free candidates (below the active capacity), counted after the pins; the sink is
        // the widened ages' lanes, idle now
        avsg::CompareScalarAll(freeMask, x, static_cast<half>(-1.0f), CMPMODE::EQ, n);
        PipeBarrier<PIPE_V>();
        uint64_t nFree = 0;
        if (ctx_.activeCap_)
            GatherMask(age.ReinterpretCast<uint16_t>(), x.ReinterpretCast<uint16_t>(), ctx_.U16(freeMask), true,
                       ctx_.activeCap_, GatherMaskParams(1, 1, 8, 0), nFree);
        // free slots are rare in steady state: where there are some, every set may hold one
        if (nFree) PlanBlockVictims::WinSetClear(victims_.lruFreeWins_, true);
        victims_.freeSlots_ = static_cast<uint32_t>(nFree);
        PipeBarrier<PIPE_V>();                    // the sink's GatherMask; the masks' last reader
        ReduceMax(ctx_.wIdx_.ReinterpretCast<half>(), x, ctx_.wSlot_.ReinterpretCast<half>(),
                  static_cast<int32_t>(ctx_.t_.capPad));
        Sync<HardEvent::V_S>();
        // the search's first vector writer of wIdx_ waits on S_V (CountAgesAtLeast, SelectLru)
        victims_.maxAge_ = static_cast<int32_t>(static_cast<float>(ctx_.wIdx_.ReinterpretCast<half>().GetValue(0)));
    }

    // the context and the blocks this one calls
    PlanContext& ctx_;
    PlanBlockProbe& probe_;
    PlanBlockVictims& victims_;
};

}  // namespace avsg_kernel
