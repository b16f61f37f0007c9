// plan_block_upkeep_reuse.h: the reuse policy's per-step bookkeeping, PolicyUpkeep<PolicyReuse>
// (the primary template, plan_block_upkeep.h, is the other policies' none). Heat cooled at a
// row's start and heated by the step's used blocks after the merge, the step word advanced (with
// the counts' and ghosts' halving) before the write-back, all by PlanBlockHeat; the slot counts
// and the ghosts are the sections only reuse keeps, so the drop (PlanBlockDrop) and the padding
// reset (PlanContext::FreePadding) clear them through these hooks.
// UB: the slot_count and ghost windows; scratch of the drop (vT1_/vT2_/mA_) and the heat.
#pragma once
#include "plan_block_upkeep.h"
#include "plan_phases.h"

namespace avsg_kernel {

template <>
class PolicyUpkeep<PolicyReuse> {
public:
    __aicore__ inline explicit PolicyUpkeep(PlanContext& ctx, PlanBlockHeat& heat) : ctx_(ctx), heat_(heat) {}
    __aicore__ inline void StartRow() {
        AVSG_PHASE(PlanPhase::kStart);   // before the lookup (and a split's SyncAll): the row's start
        heat_.CoolHeat();
    }
    __aicore__ inline void AfterMerge(uint32_t r, uint32_t m) {
        AVSG_PHASE(PlanPhase::kHeat);
        heat_.HeatUsed(r, m);
    }
    // into countUb_ beside the stash count, written back with it
    __aicore__ inline void BeforeWriteBack() { heat_.AdvanceStep(); }
    // a padding slot counts nothing
    __aicore__ inline void FreePaddingSlot(uint32_t s) {
        if (ctx_.Get(ctx_.win_[avsg::SEC_SC], s) != 0) ctx_.Put(ctx_.win_[avsg::SEC_SC], s, 0);
    }
    // The drop's chunk at slot off: its slot counts cleared with its slot_pos and slot_life
    // (Begin before the chunk's vector steps, as ChunkOf may load a window).
    __aicore__ inline void DropChunkBegin(uint32_t off) {
        count_ = ctx_.ChunkOf(ctx_.win_[avsg::SEC_SC], off);
    }
    __aicore__ inline void DropChunkClear(const LocalTensor<int32_t>& keep, uint32_t n) {
        DropClear(count_, keep, n);
    }
    __aicore__ inline void DropChunkEnd() { ctx_.win_[avsg::SEC_SC].dirty = true; }
    // after the slots: every ghost naming a dropped position returns to 0
    __aicore__ inline void DropRest(const LocalTensor<int32_t>& keep, const LocalTensor<int32_t>& notKeep,
                                    const LocalTensor<float>& top, float limit) {
        Win& pc = ctx_.win_[avsg::SEC_PC];
        for (uint32_t id = 0; id < pc.nwin; ++id) {
            ctx_.Ensure(pc, static_cast<int32_t>(id));
            const uint32_t cnt = WinCount(pc, static_cast<int32_t>(id));
            for (uint32_t off = 0; off < cnt; off += ctx_.t_.nc) {
                const uint32_t n = MinU(ctx_.t_.nc, cnt - off);
                const LocalTensor<int32_t> ghost = pc.buf[off];
                if (!GhostDropTest(ghost, ctx_.vT1_, ctx_.vT2_, keep, notKeep, top, id * pc.wlen + off, n,
                                   ctx_.t_.ghostLog, limit))
                    continue;
                GhostDropApply(ghost, ctx_.vT1_, keep, notKeep, ctx_.mA_, n, limit);
                PipeBarrier<PIPE_V>();
                pc.dirty = true;
            }
        }
    }

private:
    PlanContext& ctx_;
    PlanBlockHeat& heat_;
    LocalTensor<int32_t> count_;   // the drop's current chunk of slot_count
};

}  // namespace avsg_kernel
