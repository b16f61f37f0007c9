// plan_block_heat.h: the reuse policy's per-step bookkeeping (reference.py: _add_heat,
// _reuse_refresh, the halving). Block heat from the slots used this step and the misses
// (HeatUsed, AddHeat), the hit slots' counts (CountHits, from DecayAndPin), the heat's cooling
// every step and the counts' and ghosts' halving every kReuseHalveEvery steps. Only
// PlanKernel<*, PolicyReuse> calls it.
// UB: the block_heat, slot_count and ghost windows; hitBits_ and the wide vectors (read/scratch).
#pragma once
#include "plan_block_classify.h"

namespace avsg_kernel {

class PlanBlockHeat {
public:
    __aicore__ inline explicit PlanBlockHeat(PlanContext& ctx, PlanBlockMerge& merge) : ctx_(ctx), merge_(merge) {}
    // (reference.py: reuse_scores, lowest_scores, _reuse_refresh, _add_heat, _reuse_install)
    __aicore__ inline int32_t ClampCount(int32_t c) const {
        return c < 0 ? 0 : (c > avsg::kReuseCountMax ? avsg::kReuseCountMax : c);
    }
    // heat[b] = min(heat[b] + c, 255) for the runs of equal block ids in wIdx_[0:n) (ascending;
    // wIdx_[n] = -1, no block). Run lengths come from the vector unit (ends where a lane differs
    // from the next one, compacted with their lane ids), so the scalar unit touches each heated
    // block once per call instead of once per use, in ascending order: each window of a paged
    // heat section is loaded at most once per call. Heat is in [0, 127] after CoolHeat and a
    // block's increments in one step commute with the clamp, so adding a run's length at once
    // saturates exactly as one increment per use does.
    __aicore__ inline void AddHeat(uint32_t n) {
        if (n == 0) return;
        const uint32_t n64 = (n + 63) / 64 * 64;
        const LocalTensor<int32_t> next = ctx_.wSlot_;
        const LocalTensor<int32_t> endKey = ctx_.wSlot_[ctx_.t_.nc], endLane = ctx_.wSlot_[2 * ctx_.t_.nc];
        const LocalTensor<int32_t> off = ctx_.wWin_;
        Muls(off, ctx_.vLane_, 4, n64);
        PipeBarrier<PIPE_V>();
        Adds(off, off, 4, n64);                   // byte offset of lane i + 1
        PipeBarrier<PIPE_V>();
        Gather(next, ctx_.wIdx_, off.ReinterpretCast<uint32_t>(), 0u, n64);
        PipeBarrier<PIPE_V>();
        avsg::CompareAll(ctx_.mA_, ctx_.wIdx_, next, CMPMODE::EQ, n64);
        PipeBarrier<PIPE_V>();
        Not(ctx_.U16(ctx_.mA_), ctx_.U16(ctx_.mA_), n64 / 16);        // run ends
        PipeBarrier<PIPE_V>();
        uint64_t runs = 0, lanes = 0;
        GatherMask(endKey, ctx_.wIdx_, ctx_.U32(ctx_.mA_), true, n, GatherMaskParams(1, 1, 8, 0), runs);
        GatherMask(endLane, ctx_.vLane_, ctx_.U32(ctx_.mA_), true, n, GatherMaskParams(1, 1, 8, 0), lanes);
        Sync<HardEvent::V_S>();
        Win& ht = ctx_.win_[avsg::SEC_HT];
        int32_t prev = -1;
        for (uint32_t k = 0; k < static_cast<uint32_t>(runs); ++k) {
            const uint32_t b = static_cast<uint32_t>(endKey.GetValue(k));
            const int32_t e = endLane.GetValue(k);
            const int32_t h = ctx_.Get(ht, b) + (e - prev);
            ctx_.Put(ht, b, h < avsg::kReuseHeatMax ? h : avsg::kReuseHeatMax);
            prev = e;
        }
        Sync<HardEvent::S_V>();
    }
    // Every slot used this step (hit bitmap: probe and stash hits, T tokens sharing a slot count
    // once) heats the block of the position it holds, then every miss heats its own (reference:
    // the two _add_heat calls). Hits: per nc-slot chunk, the used slots' positions compacted,
    // their blocks sorted; misses: miss_pos is ascending and unique already.
    __aicore__ inline void HeatUsed(uint32_t r, uint32_t m) {
        const uint32_t nc = ctx_.t_.nc;
        Sync<HardEvent::S_V>();                   // scalar writes of the hit bitmap
        for (uint32_t base = 0; base < ctx_.t_.capPad; base += nc) {
            const uint32_t n = MinU(nc, ctx_.t_.capPad - base);
            uint64_t used = 0;
            GatherMask(ctx_.vT1_, ctx_.ChunkOf(ctx_.win_[avsg::SEC_SP], base), ctx_.hitBits_[base / 32], true, n,
                       GatherMaskParams(1, 1, 8, 0), used);
            Sync<HardEvent::V_S>();
            if (used == 0) continue;
            const uint32_t u = static_cast<uint32_t>(used);
            // a hit slot holds the selection it matched (>= 0); the clamp keeps any state
            // content to the reference's heat entry
            Maxs(ctx_.vT1_, ctx_.vT1_, 0, u);
            PipeBarrier<PIPE_V>();
            HeatEntry(ctx_.vT1_, u);
            merge_.SortAscending(ctx_.vT1_, u, nullptr);
            Duplicate(ctx_.wIdx_, -1, (u + 63) / 64 * 64 + 64);
            PipeBarrier<PIPE_V>();
            Adds(ctx_.wIdx_, ctx_.sOutV_.template ReinterpretCast<int32_t>(), 0, u);
            PipeBarrier<PIPE_V>();
            AddHeat(u);
        }
        const uint64_t rowN = static_cast<uint64_t>(r) * ctx_.t_.outPitch;
        for (uint32_t j0 = 0; j0 < m; j0 += nc) {
            const uint32_t n = MinU(nc, m - j0);
            Duplicate(ctx_.wIdx_, -1, (n + 63) / 64 * 64 + 64);
            Sync<HardEvent::V_MTE2>();
            Sync<HardEvent::S_MTE2>();
            Sync<HardEvent::MTE3_MTE2>();        // MergeMisses stored miss_pos
            LoadInts(ctx_.wIdx_, ctx_.missPosGm_[rowN + j0], n, -1);
            Sync<HardEvent::MTE2_V>();
            HeatEntry(ctx_.wIdx_, n);   // valid selections: >= 0 (runs may wrap at B: each adds its own)
            AddHeat(n);
        }
    }
    // x (n lanes, >= 0) -> (x >> 6) & (B - 1), its heat entry: bits [6, 6 + log2 B) of x, by a
    // logical left shift that drops the bits above them and a logical right shift (no And: it is
    // 16-bit only, and no mask vector to hold)
    __aicore__ inline void HeatEntry(const LocalTensor<int32_t>& x, uint32_t n) {
        const uint32_t bits = HeatBits();
        const LocalTensor<uint32_t> u = x.template ReinterpretCast<uint32_t>();
        ShiftLeft(u, u, static_cast<uint32_t>(32 - avsg::kReuseBlockLog) - bits, n);
        PipeBarrier<PIPE_V>();
        ShiftRight(u, u, 32u - bits, n);
        PipeBarrier<PIPE_V>();
    }
    __aicore__ inline uint32_t HeatBits() const {
        uint32_t bits = 0;
        while ((1u << bits) <= ctx_.t_.heatMask) ++bits;
        return bits;
    }
    // Every 256 steps the ghosts' counts halve and their tags stay: e - ((e & 255) + 1) / 2, the
    // count's bits taken by a logical shift pair (reference.plan, the halving)
    __aicore__ inline void HalveGhosts() {
        Win& w = ctx_.win_[avsg::SEC_PC];
        const LocalTensor<int32_t> c = ctx_.wTmp_;
        const LocalTensor<uint32_t> cu = c.template ReinterpretCast<uint32_t>();
        for (uint32_t id = 0; id < w.nwin; ++id) {
            ctx_.Ensure(w, static_cast<int32_t>(id));
            Sync<HardEvent::S_V>();
            const uint32_t cnt = WinCount(w, static_cast<int32_t>(id));
            for (uint32_t off = 0; off < cnt; off += ctx_.t_.nc) {
                const uint32_t n = MinU(ctx_.t_.nc, cnt - off);
                ShiftLeft(cu, w.buf[off].template ReinterpretCast<uint32_t>(),
                          static_cast<uint32_t>(32 - avsg::kGhostCountBits), n);
                PipeBarrier<PIPE_V>();
                ShiftRight(cu, cu, static_cast<uint32_t>(32 - avsg::kGhostCountBits), n);
                PipeBarrier<PIPE_V>();
                Adds(c, c, 1, n);
                PipeBarrier<PIPE_V>();
                ShiftRight(c, c, 1, n);
                PipeBarrier<PIPE_V>();
                Sub(w.buf[off], w.buf[off], c, n);
                PipeBarrier<PIPE_V>();
            }
            w.dirty = true;
        }
        Sync<HardEvent::V_S>();
    }
    // dst = clamp(src, 0, high) >> 1 over a whole section, window by window (heat every step;
    // the slot counts every 256 steps)
    __aicore__ inline void HalveSection(Win& w, int32_t high) {
        for (uint32_t id = 0; id < w.nwin; ++id) {
            ctx_.Ensure(w, static_cast<int32_t>(id));
            Sync<HardEvent::S_V>();
            const uint32_t cnt = WinCount(w, static_cast<int32_t>(id));
            for (uint32_t off = 0; off < cnt; off += ctx_.t_.nc) {
                const uint32_t n = MinU(ctx_.t_.nc, cnt - off);
                ctx_.ClampInts(w.buf[off], 0, high, n);
                ShiftRight(w.buf[off], w.buf[off], 1, n);
                PipeBarrier<PIPE_V>();
            }
            w.dirty = true;
        }
        Sync<HardEvent::V_S>();
    }
    __aicore__ inline void CoolHeat() { HalveSection(ctx_.win_[avsg::SEC_HT], avsg::kReuseHeatMax); }
    // The step word counts steps since the last halving of the counts (clamped to [0, 255]).
    __aicore__ inline void AdvanceStep() {
        int32_t step = ctx_.countUb_.GetValue(1);
        step = (step < 0 ? 0 : (step > avsg::kReuseHalveEvery - 1 ? avsg::kReuseHalveEvery - 1 : step)) + 1;
        if (step == avsg::kReuseHalveEvery) {
            Sync<HardEvent::MTE3_V>();            // the row's output stores still read the aligned region
            HalveSection(ctx_.win_[avsg::SEC_SC], avsg::kReuseCountMax);
            HalveGhosts();
            step = 0;
        }
        ctx_.countUb_.SetValue(1, step);
    }
    // reuse: slot_count + gain (saturating) for the hit slots of [base, base+n), one vector pass
    // with the hit bitmap instead of a scalar access per hit (slot_count is paged: random scalar
    // accesses would reload its windows). The gain comes from the ages one step older, still in
    // vT2_ (DecayAndPin): a return (age > 1) gains more than a streak (reference: plan, step 3).
    // Other counts keep their bits exactly, whatever they hold: a bitwise blend
    // (count & keep) | (new & ~keep), keep = -1 off the hits.
    __aicore__ inline void CountHits(uint32_t base, uint32_t n) {
        static_assert(avsg::kReuseGainReturn - avsg::kReuseGainStreak == 1, "gain = streak + [age > 1]");
        const LocalTensor<int32_t> count = ctx_.ChunkOf(ctx_.win_[avsg::SEC_SC], base);
        const LocalTensor<int32_t> aged = ctx_.vT2_, keep = ctx_.vT2_;   // keep overwrites aged once read
        const LocalTensor<int32_t> notKeep = ctx_.vKey_, bumped = ctx_.vT1_, gain = ctx_.vKey_;
        Sync<HardEvent::S_V>();
        Duplicate(ctx_.vTmpF_, 0.0f, n);
        Adds(gain, aged, -1, n);                  // ages are in [-1, 1023]: no overflow
        Maxs(bumped, count, 0, n);
        PipeBarrier<PIPE_V>();
        Select(ctx_.vTmpF_, ctx_.hitBits_.ReinterpretCast<uint8_t>()[base / 8], ctx_.vTmpF_, -1.0f,
               SELMODE::VSEL_TENSOR_SCALAR_MODE, n);
        Maxs(gain, gain, 0, n);
        Mins(bumped, bumped, avsg::kReuseCountMax, n);
        PipeBarrier<PIPE_V>();
        Mins(gain, gain, 1, n);
        PipeBarrier<PIPE_V>();
        Adds(gain, gain, avsg::kReuseGainStreak, n);
        PipeBarrier<PIPE_V>();
        Add(bumped, bumped, gain, n);
        PipeBarrier<PIPE_V>();
        Cast(keep, ctx_.vTmpF_, RoundMode::CAST_RINT, n);
        Mins(bumped, bumped, avsg::kReuseCountMax, n);
        PipeBarrier<PIPE_V>();
        Not(notKeep.ReinterpretCast<uint16_t>(), keep.ReinterpretCast<uint16_t>(), 2 * n);
        And(count.ReinterpretCast<uint16_t>(), count.ReinterpretCast<uint16_t>(), keep.ReinterpretCast<uint16_t>(),
            2 * n);
        PipeBarrier<PIPE_V>();
        And(bumped.ReinterpretCast<uint16_t>(), bumped.ReinterpretCast<uint16_t>(),
            notKeep.ReinterpretCast<uint16_t>(), 2 * n);
        PipeBarrier<PIPE_V>();
        Or(count.ReinterpretCast<uint16_t>(), count.ReinterpretCast<uint16_t>(), bumped.ReinterpretCast<uint16_t>(),
           2 * n);
        PipeBarrier<PIPE_V>();
        ctx_.win_[avsg::SEC_SC].dirty = true;
    }
    __aicore__ inline uint32_t GhostEntry(int32_t pos) const {
        return static_cast<uint32_t>(pos) & ((1u << ctx_.t_.ghostLog) - 1);
    }
    __aicore__ inline int32_t GhostTag(int32_t pos) const { return pos >> ctx_.t_.ghostLog; }

    // the context and the blocks this one calls
    PlanContext& ctx_;
    PlanBlockMerge& merge_;
};

}  // namespace avsg_kernel
