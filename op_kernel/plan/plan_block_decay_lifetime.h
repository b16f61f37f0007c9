// plan_block_decay_lifetime.h: the lifetime policy's decay, PlanBlockDecay<PolicyLifetime> (step
// 3's first pass; the declaration and what the policies share are plan_block_victims.h). Every
// life is clamped to [-1, L+1] (a no-op on states the ops built; on any other it keeps every
// unpinned slot a victim candidate) and decays (fresh L+1 -> first life - 1, other life > 0 ->
// life - 1: all in [-1, L-1]); hit slots -> L. Where the half copy fits (DecayInHalf) the lives
// go there for the level scan (plan_block_victims_lifetime.h); otherwise one vector pass per
// window leaves the candidates' lowest life (a lane-wise minimum) for its first level.
// UB: the slot_life windows, hitBits_, wWin_/wIdx_/wSlot_/wTmp_ and the masks as scratch; the
// sort region (the half copy) and wPair_ where it fits.
#pragma once
#include "plan_block_victims.h"

namespace avsg_kernel {

template <>
class PlanBlockDecay<PolicyLifetime> {
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
        const LocalTensor<float> lifeF = ctx_.wWin_.ReinterpretCast<float>();
        Win& sl = ctx_.win_[avsg::SEC_SL];
        // the candidates' lane-wise lowest life (Allocate's first level), reduced below
        const LocalTensor<float> lowestLife = ctx_.wTmp_.ReinterpretCast<float>();
        const float lifeL = static_cast<float>(ctx_.t_.lifetime);
        victims_.freeSlots_ = 0;
        Sync<HardEvent::S_V>();
        Duplicate(lowestLife, lifeL, probe_.Wide());
        // last window first, so Allocate starts its slot-order scan in the resident window 0
        for (uint32_t k = 0; k < sl.nwin; ++k) {
            const uint32_t id = sl.nwin - 1 - k;
            ctx_.Ensure(sl, static_cast<int32_t>(id));
            const uint32_t cnt = WinCount(sl, static_cast<int32_t>(id));
            for (uint32_t off = 0; off < cnt; off += chunk) {
                const uint32_t n = MinU(chunk, cnt - off);
                LocalTensor<int32_t> life = sl.buf[off];
                // clamp to [-1, L+1] first (life - 1 would wrap at INT32_MIN), then decay;
                // a fresh slot decays to L here, mapped to its first life below
                Maxs(t1, life, -1, n);
                PipeBarrier<PIPE_V>();
                Mins(t1, t1, static_cast<int32_t>(ctx_.t_.lifetime) + 1, n);
                PipeBarrier<PIPE_V>();
                Adds(t2, t1, -1, n);
                PipeBarrier<PIPE_V>();
                Mins(t1, t1, 0, n);
                PipeBarrier<PIPE_V>();
                Max(t2, t2, t1, n);                    // max(life-1, min(life,0))
                PipeBarrier<PIPE_V>();
                const uint32_t base = id * sl.wlen + off;
                Cast(lifeF, t2, RoundMode::CAST_RINT, n);
                Not(ctx_.U16(ctx_.mA_), ctx_.hitBits_.ReinterpretCast<uint16_t>()[base / 16], n / 16);
                PipeBarrier<PIPE_V>();
                // only a fresh slot decays to L: its probation (reference.first_life)
                avsg::CompareScalarAll(ctx_.mC_, lifeF, lifeL, CMPMODE::NE, n);
                PipeBarrier<PIPE_V>();
                Select(lifeF, ctx_.mC_, lifeF, static_cast<float>(avsg::FirstLife(ctx_.t_.lifetime)) - 1.0f,
                       SELMODE::VSEL_TENSOR_SCALAR_MODE, n);
                PipeBarrier<PIPE_V>();
                Select(lifeF, ctx_.mA_, lifeF, lifeL, SELMODE::VSEL_TENSOR_SCALAR_MODE, n);   // hits -> L
                PipeBarrier<PIPE_V>();
                // candidates only: a slot past the active capacity (resize) is none
                const uint32_t live = base < ctx_.activeCap_ ? MinU(n, ctx_.activeCap_ - base) : 0u;
                if (live) Min(lowestLife, lowestLife, lifeF, live);
                Cast(life, lifeF, RoundMode::CAST_RINT, n);
                PipeBarrier<PIPE_V>();
            }
            sl.dirty = true;
        }
        PipeBarrier<PIPE_V>();
        ReduceMin(ctx_.wIdx_.ReinterpretCast<float>(), lowestLife, ctx_.wSlot_.ReinterpretCast<float>(),
                  static_cast<int32_t>(probe_.Wide()));
        Sync<HardEvent::V_S>();
        victims_.lowestLife_ = static_cast<int32_t>(ctx_.wIdx_.ReinterpretCast<float>().GetValue(0));
    }
    // Where the half copy fits: slot_life moves into it whole and the decay and the pins run
    // on it in half precision, every instruction over the whole section (the lives are small
    // integers, exact in half; the instructions and their barriers, not the lanes, are most of
    // a pass's cost). The level scan reads and installs into the half copy, and the section goes
    // back from it once (WriteBackHalfCopy); the window is left empty.
    __aicore__ inline void DecayInHalf() {
        const LocalTensor<half> life = victims_.HalfCopyLoad(), x = ctx_.sHalf_;
        const uint32_t n = victims_.HalfCopyLanes();
        const LocalTensor<uint8_t> notHit = victims_.HalfMask(0), fresh = victims_.HalfMask(1);
        const half lifeL = static_cast<half>(static_cast<float>(ctx_.t_.lifetime));
        Not(notHit.ReinterpretCast<uint16_t>(), ctx_.hitBits_.ReinterpretCast<uint16_t>(), n / 16);
        // decay: max(life - 1, min(life, 0)) on lives clamped to -1 from below; a fresh slot (L+1,
        // or above: the reference clamps to L + 1 first, which decays the same) decays to L or
        // more. x (the copy's int16 lanes, cast into life) is scratch until the last Select.
        Maxs(life, life, static_cast<half>(-1.0f), n);
        PipeBarrier<PIPE_V>();
        Adds(x, life, static_cast<half>(-1.0f), n);
        PipeBarrier<PIPE_V>();                    // Mins below writes what Adds reads (write-after-read)
        Mins(life, life, static_cast<half>(0.0f), n);
        PipeBarrier<PIPE_V>();
        Max(life, life, x, n);
        PipeBarrier<PIPE_V>();
        // only a fresh slot decays to L or more: its probation (reference.first_life)
        avsg::CompareScalarAll(fresh, life, lifeL, CMPMODE::LT, n);
        PipeBarrier<PIPE_V>();
        Select(life, fresh, life, static_cast<half>(static_cast<float>(avsg::FirstLife(ctx_.t_.lifetime)) - 1.0f),
               SELMODE::VSEL_TENSOR_SCALAR_MODE, n);
        PipeBarrier<PIPE_V>();
        Select(x, notHit, life, lifeL, SELMODE::VSEL_TENSOR_SCALAR_MODE, n);   // hits -> L
        victims_.HalfCopyTail(lifeL);             // past the padded slots: pinned (L, no level's)
        Sync<HardEvent::V_S>();
    }

    // the context and the blocks this one calls
    PlanContext& ctx_;
    PlanBlockProbe& probe_;
    PlanBlockVictims& victims_;
};

}  // namespace avsg_kernel
