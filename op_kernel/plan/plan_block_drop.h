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

namespace avsg_kernel {

class PlanBlockDrop : public PlanBlockSplit {
protected:
    template <class Policy>
    __aicore__ inline void DropPast() {
        const float limit = dropLimitF_;
        const LocalTensor<float> top = scalarUb_.ReinterpretCast<float>();
        const LocalTensor<int32_t> keep = vLo_, notKeep = vHi_;
        Win& sp = win_[avsg::SEC_SP];
        Win& sl = win_[avsg::SEC_SL];
        Win& sc = win_[avsg::SEC_SC];
        // chunks never straddle a window: every paged window is a power of two >= 256
        uint32_t step = t_.nc;
        const Win* sections[] = {&sp, &sl, &sc};
        for (const Win* w : sections)
            if (w->nwin > 1 && w->wlen < step) step = w->wlen;
        for (uint32_t off = 0; off < t_.capacity; off += step) {
            const uint32_t n = MinU(step, t_.capPad - off), real = MinU(n, t_.capacity - off);
            const LocalTensor<int32_t> pos = ChunkOf(sp, off);
            if (!DropTest(pos, keep, vT1_.ReinterpretCast<float>(), top, n, real, limit)) continue;
            const LocalTensor<int32_t> life = ChunkOf(sl, off);
            LocalTensor<int32_t> count;
            if constexpr (Policy::kReuse) count = ChunkOf(sc, off);
            Duplicate(notKeep.ReinterpretCast<float>(), 0.0f, n);
            PipeBarrier<PIPE_V>();
            // padding lanes (past S) may be dropped too: FreePadding writes them the same values
            DropMask(keep, notKeep, mA_, n, limit);
            DropClear(pos, keep, n);
            DropClear(life, keep, n);
            if constexpr (Policy::kReuse) DropClear(count, keep, n);
            PipeBarrier<PIPE_V>();
            DropFill(pos, notKeep, n);
            DropFill(life, notKeep, n);
            PipeBarrier<PIPE_V>();
            sp.dirty = sl.dirty = true;
            if constexpr (Policy::kReuse) sc.dirty = true;
        }
        if constexpr (Policy::kReuse) {
            Win& pc = win_[avsg::SEC_PC];
            for (uint32_t id = 0; id < pc.nwin; ++id) {
                Ensure(pc, static_cast<int32_t>(id));
                const uint32_t cnt = WinCount(pc, static_cast<int32_t>(id));
                for (uint32_t off = 0; off < cnt; off += t_.nc) {
                    const uint32_t n = MinU(t_.nc, cnt - off);
                    const LocalTensor<int32_t> ghost = pc.buf[off];
                    if (!GhostDropTest(ghost, vT1_, vT2_, keep, notKeep, top, id * pc.wlen + off, n, t_.ghostLog,
                                       limit))
                        continue;
                    GhostDropApply(ghost, vT1_, keep, notKeep, mA_, n, limit);
                    PipeBarrier<PIPE_V>();
                    pc.dirty = true;
                }
            }
        }
        Sync<HardEvent::V_S>();   // the scalar steps that follow read the windows
    }
};

}  // namespace avsg_kernel
