// plan_block_drop.h: the drop folded into the plan (plan(valid_lens=...), reference.plan): at the
// start of a row the owner frees every slot whose position is at or past the row's valid length
// (and, reuse, zeroes those slots' counts and the ghosts of those positions), as invalidate does,
// but on the section windows the plan holds anyway (whole in UB at S 8192: no extra GM traffic),
// before anything of the row is read. The vector steps are invalidate's (../drop_block.h).
// A split row's helpers read slot_pos from GM while the owner drops (its dirty windows may be
// flushed meanwhile): their lookup ignores every selection at or past the limit (HashLookup),
// which is exactly what the drop does to hits, so what they read (before or after) cannot matter.
// UB: vLo_ / vHi_ / vT1_ / vT2_ (idle at a row's start), mA_, scalarUb_; the windows of slot_pos,
// slot_life and (reuse) slot_count and ghost.
#pragma once
#include "../drop_block.h"
#include "plan_block_split.h"
#include "plan_block_upkeep.h"

namespace avsg_kernel {

// Policy: whose upkeep clears the sections only that policy keeps (PolicyUpkeep<Policy>)
template <class Policy>
class PlanBlockDrop {
public:
    __aicore__ inline explicit PlanBlockDrop(PlanContext& ctx, PolicyUpkeep<Policy>& upkeep)
        : ctx_(ctx), upkeep_(upkeep) {}
    __aicore__ inline void DropPast() {
        const float limit = ctx_.dropLimitF_;
        const LocalTensor<float> top = ctx_.scalarUb_.ReinterpretCast<float>();
        const LocalTensor<int32_t> keep = ctx_.vLo_, notKeep = ctx_.vHi_;
        Win& sp = ctx_.win_[avsg::SEC_SP];
        Win& sl = ctx_.win_[avsg::SEC_SL];
        Win& sc = ctx_.win_[avsg::SEC_SC];
        // Most passes drop nothing (one query token, or every draft accepted). Where slot_pos is
        // whole in UB one pass over it says so (a lane-wise maximum on wide chunks, one
        // reduction and one scalar read), instead of a reduction and a sync pair per chunk.
        if (sp.nwin == 1 && !AnyAtLeast(sp, top, limit)) {
            upkeep_.DropRest(keep, notKeep, top, limit);
            Sync<HardEvent::V_S>();   // the scalar steps that follow read the windows
            return;
        }
        // chunks never straddle a window: every paged window is a power of two >= 256
        uint32_t step = ctx_.t_.nc;
        const Win* sections[] = {&sp, &sl, &sc};
        for (const Win* w : sections)
            if (w->nwin > 1 && w->wlen < step) step = w->wlen;
        for (uint32_t off = 0; off < ctx_.t_.capacity; off += step) {
            const uint32_t n = MinU(step, ctx_.t_.capPad - off), real = MinU(n, ctx_.t_.capacity - off);
            const LocalTensor<int32_t> pos = ctx_.ChunkOf(sp, off);
            if (!DropTest(pos, keep, ctx_.vT1_.ReinterpretCast<float>(), top, n, real, limit)) continue;
            const LocalTensor<int32_t> life = ctx_.ChunkOf(sl, off);
            upkeep_.DropChunkBegin(off);
            Duplicate(notKeep.ReinterpretCast<float>(), 0.0f, n);
            PipeBarrier<PIPE_V>();
            // padding lanes (past S) may be dropped too: FreePadding writes them the same values
            DropMask(keep, notKeep, ctx_.mA_, n, limit);
            DropClear(pos, keep, n);
            DropClear(life, keep, n);
            upkeep_.DropChunkClear(keep, n);
            PipeBarrier<PIPE_V>();
            DropFill(pos, notKeep, n);
            DropFill(life, notKeep, n);
            PipeBarrier<PIPE_V>();
            sp.dirty = sl.dirty = true;
            upkeep_.DropChunkEnd();
        }
        upkeep_.DropRest(keep, notKeep, top, limit);
        Sync<HardEvent::V_S>();   // the scalar steps that follow read the windows
    }

    // Whether a real slot (below S) of the resident slot_pos window holds a position >= limit.
    // int32 -> float is monotone and exact below 2^24 >= limit, so the float maximum answers it
    // unclamped. Scratch: wWin_ and wIdx_ (idle at a row's start).
    __aicore__ inline bool AnyAtLeast(Win& sp, const LocalTensor<float>& top, float limit) {
        const uint32_t W = avsg::kPlanProbes * ctx_.t_.nc;   // the wide vectors' lanes
        const LocalTensor<float> acc = ctx_.wIdx_.ReinterpretCast<float>(), x = ctx_.wWin_.ReinterpretCast<float>();
        ctx_.Ensure(sp, 0);
        const uint32_t S = ctx_.t_.capacity, first = MinU(W, S);
        Sync<HardEvent::S_V>();                   // the row start's scalar accesses
        PipeBarrier<PIPE_V>();
        Cast(acc, sp.buf, RoundMode::CAST_RINT, first);
        for (uint32_t off = first; off < S; off += W) {
            const uint32_t n = MinU(W, S - off);
            PipeBarrier<PIPE_V>();                // the previous Max reads x
            Cast(x, sp.buf[off], RoundMode::CAST_RINT, n);
            PipeBarrier<PIPE_V>();
            Max(acc, acc, x, n);
        }
        return DropAnyAtLeast(top, acc, x, first, limit);
    }

    // the context and the blocks this one calls
    PlanContext& ctx_;
    PolicyUpkeep<Policy>& upkeep_;
};

}  // namespace avsg_kernel
