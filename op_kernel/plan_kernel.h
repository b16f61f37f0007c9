// plan_kernel.h: AscendC (Atlas A2 AIV) kernels of plan and plan_dual_pointer: PlanKernel, the
// per-row driver over the block-level pieces in plan/ (one header each, named after its step),
// and RunPlan, the entries' dispatch to the compile-time matcher and policy (plan/plan_policy.h).
// A policy's pieces are blocks specialised on its type, one file per policy: its decay
// (plan/plan_block_decay_<policy>.h), its victim search (plan/plan_block_victims_<policy>.h) and
// its per-step upkeep (plan/plan_block_upkeep.h: none for lifetime and lru;
// plan/plan_block_upkeep_reuse.h: the heat, the slot counts and the ghosts).
// Specification: python/avsg/reference.py (state layout, hash, lookup, stash, lifetime, victims,
// insert rounds, outputs, stats). Tiling: op_host/plan_tiling.h.
//
// Work split: with rows * 2 > cores (or the dual pointer), core c handles rows c, c+numBlocks,
// ...: a row's state, outputs, stats and the core's workspace are written by that core only (no
// GM atomics, no shared 64 B lines written by two cores except through exact-byte DataCopyPad
// stores).
// With fewer rows the hash plan splits each row's lookup (step 1 and the per-chunk part of step 2,
// a third to a half of a row's modelled time at K 2048) over split = min(cores / rows, chunks)
// cores: core b works on row b % rows as part b / rows; part 0 owns the row and does everything
// else. Where a core is left beside one per chunk the row takes chunks + 1 cores and its owner
// looks up none (PlanContext::OwnerLooksUp): it drops, compacts its stash and loads the index
// (bucket_slot, slot_pos) while the helpers look up. Helpers check the row's header themselves
// (a rejected row is skipped by every part), look up their chunks (PlanContext::FirstChunk, then
// every ChunkStride()-th; in groups, as the owner does), store the chunks' slots to the
// row's output and their sorted miss runs to the owner's workspace slice (DMA only: scalar GM goes
// through the non-coherent DCache), then their counts, run lengths and hit bitmap to their part
// region there.
// One soft SyncAll (counters after the slices, zeroed by the host per launch; no mixed kernel
// type needed), called exactly once by every core, separates the parts from the owner's fold
// (counts summed, bitmaps or-ed) and step 2's merge. During the lookup the owner writes no GM
// that a helper reads: helpers read bucket_slot and slot_pos only, the owner's
// prologue writes the stash and the heat, and it frees the padding slots (slot_pos) after the
// SyncAll. The reuse policy's heat comes from the final bitmap and miss list (HeatUsed), so
// nothing per hit stays with the owner but one bit.
// Per row (hash matcher; the dual pointer differs in step 1's match: the row's selections and
// resident slots sorted and walked once with two pointers, no hash and no stash lookup):
//   0. stash compaction #1 (scalar; before the lookup, see below)
//   1. refresh, by group of up to 4 chunks of NC selections (PlanBlockHashMatch::LookupGroup),
//      each chunk classified (2.) once its group is looked up. With bucket_slot and slot_pos
//      whole in UB (every S <= 8192), on the 4*NC-lane vectors: the group's selections loaded,
//      validity (Cast->float, Compares GE/LT, And on u16, Select, Cast back), probe 0 of all of
//      them (first bucket: shifts, u16 And against H-1, Muls/Add; Gather bucket_slot, clamp,
//      Gather slot_pos[slot], Compare), then only the valid lanes probe 0 missed (a few %:
//      misses and selections indexed at a later probe) compacted (GatherMask) and looked up at
//      probes 1..3 at once, 256 lanes at a time, their finds written back to their lanes
//      (scalar). Otherwise one chunk at a time, its 4 probes at once (4*NC lanes, HashLookup),
//      window by window (each window of a split section loaded at most once per chunk, the
//      resident one first). Either way the first matching probe wins. Hit slots -> hit bitmap;
//      the chunk's result is stored as its slots.
//   2. classify: GatherMask compaction of the chunk's misses, Cast->float, Sort + Extract
//      (ascending by negating; lanes as payload), run to GM workspace; scalar k-way merge (loser
//      tree) with dedup -> miss_pos (and each run entry's index in it). The stash, sorted once per
//      row (Sort in nc-entry runs), is merged along: a miss found there is a hit after all.
//      Reuse (PolicyUpkeep<PolicyReuse>): block heat from the hit bitmap (used slots' positions,
//      per nc-slot chunk, sorted) and the sorted misses: run lengths of equal block ids by vector
//      compare + GatherMask, one scalar update per heated block. Then one pass over slot_life
//      (PlanBlockDecay<Policy>): decay (Mins/Adds/Max) + hits to L (Not + Select).
//   3. allocate: for life level -1..L-1: Compares EQ + GatherMask over slot ids (victims in
//      (life, slot) order) until M -> miss_slots; scalar scatter slot_pos / slot_life;
//      the miss lists published: miss_counts out (PublishMisses; their -1 tails go with the
//      output; in plan_gather, at the block's last row, then the SyncAll after which the copy runs
//      beside the rest of this row: op_kernel/plan_gather.cpp); slot_life back from its half copy;
//      insert: freeness of all 4 buckets of every miss (all-probe gathers of the position each
//      bucket's slot holds, hashed: a bucket is occupied when that position probes it), 4 scalar
//      rounds (lowest-j claims, winner bits), winners written window by window (GatherMask lists);
//      stash compaction #2 + append (scalar).
//   4. output: missed lanes get miss_slots[j] (OutputMisses), patched into the chunks classify
//      stored, or in place where the row's slots stay in UB (the tiling's slotsResident) and go
//      out in one copy; stats via 32 B DMA of the int64 row.
// An idle row (seq_len <= 0: reference.idle_rows) selects nothing and does not age: after its
// header only its drop runs, if it has one (valid length below 2^24: the drop, the padding slots
// freed, the dirty windows back); outputs -1, miss_counts[r] = 0, stats untouched (an engine's
// rows without a request).
// Whatever the state holds (reference.py, "Whatever the state holds"): the row's header must
// match the tiling (else the row is left untouched, miss_counts[r] = -1); stash_count is clamped
// to [0, S]; every slot read from bucket_slot / stash_slot is clamped to [0, S-1] before it
// addresses a window or is returned; padding slots are reset to -1 and lives clamped to [-1, L-1]
// in the decay, so Allocate always finds M victims among the unpinned slots; the stash never
// grows past S entries. No state content can move an index outside the row's sections.
// Stash compaction #1 runs before the lookup instead of after it: it drops exactly the entries
// the lookup's validity test ignores, and nothing the lookup reads changes in between, so the
// lookup result is the reference's.
#pragma once
#include "plan/plan_block_decay_lifetime.h"
#include "plan/plan_block_decay_lru.h"
#include "plan/plan_block_decay_reuse.h"
#include "plan/plan_block_drop.h"
#include "plan/plan_block_upkeep_reuse.h"
#include "plan/plan_block_victims_lifetime.h"
#include "plan/plan_block_victims_lru.h"
#include "plan/plan_block_victims_reuse.h"
#include "plan/plan_phases.h"

namespace avsg_kernel {

// The kernel composes the blocks: it owns one PlanContext (the core's tiling, GM views, UB and
// windows) and one object per block (plan/plan_block_*.h), each given the context and the blocks
// it calls, and drives them: Init, Process and Row. The matcher and the policy are types
// (plan/plan_policy.h): Row picks the matcher's blocks with if constexpr (which blocks run is the
// kernel's choice), and the policy's pieces are the specialisations PlanBlockDecay<Policy>,
// VictimSearch<Policy> and PolicyUpkeep<Policy>; Row calls every policy's hooks the same way.
template <class Matcher, class Policy>
class PlanKernel {
public:
    __aicore__ inline PlanKernel() {}

    // tiling: already in UB (RunPlan loaded it into the pipe's first buffer to pick the policy)
    __aicore__ inline void Init(TPipe* pipe, const PlanTiling& tiling, GM_ADDR topk, GM_ADDR seq, GM_ADDR validLens,
                                GM_ADDR state, GM_ADDR stats, GM_ADDR slots, GM_ADDR missPos, GM_ADDR missSlots,
                                GM_ADDR missCounts, GM_ADDR workspace) {
        ctx_.t_ = tiling;
        ctx_.BindGm(topk, seq, validLens, state, stats, slots, missPos, missSlots, missCounts, workspace);
        ctx_.split_ = Matcher::kDual ? 1u : ctx_.t_.split;
        // every chunk has exactly one part (PlanContext::FirstChunk): a core per chunk at most,
        // and one more for an owner that looks up none; the owner's fold copies at least one
        // part's region at a time into wIdx_ (op_host/state_host.cpp ApplySplit)
        ascendc_assert(ctx_.split_ >= 1 && ctx_.split_ <= ctx_.t_.numChunks + 1 &&
                       (ctx_.split_ == 1 || ctx_.t_.partWords <= avsg::kPlanProbes * ctx_.t_.nc));
        ctx_.CarveUb(pipe);
    }

    // Every block plans its rows; with publishSync (plan_gather) every block also meets the others
    // exactly once in the SyncAll after the miss lists are out: at the publish point of the last
    // row it plans (syncRow_), or, where that row is rejected or the block plans none (helpers,
    // blocks without a row, idle rows only), once its part is done. The copy after the SyncAll
    // reads every row's count and lists, so a block meets the others only once all its rows have
    // published theirs: its idle rows (count 0) go first, the others after them in row order.
    __aicore__ inline void Process() {
        PlanRows();
        if (ctx_.t_.publishSync && !published_) ctx_.SyncAllBlocks();
    }

private:
    __aicore__ inline void PlanRows() {
        const uint32_t blocks = static_cast<uint32_t>(GetBlockNum());
        const uint32_t b = static_cast<uint32_t>(GetBlockIdx());
        if (ctx_.split_ > 1) {                         // one (row, part) per core: rows * split blocks
            ctx_.part_ = b / ctx_.t_.rows;
            if (ctx_.part_ >= ctx_.split_) {           // a block of a composed launch past the plan's
                splitLookup_.SyncParts();              // (plan_gather): only its one SyncAll
                return;
            }
            const uint64_t rowWs = static_cast<uint64_t>(b % ctx_.t_.rows) * ctx_.t_.wsPerCore;
            ctx_.rowWs_.SetGlobalBuffer(ctx_.wsBase_ + rowWs, ctx_.t_.wsPerCore);
            if (ctx_.part_ == 0) {
                syncRow_ = b % ctx_.t_.rows;
                Row(syncRow_);
            } else {
                AVSG_PHASE(PlanPhase::kHelper);
                splitLookup_.HelpRow(b % ctx_.t_.rows);
                AVSG_PHASE(PlanPhase::kSplitSync);
                splitLookup_.SyncParts();
            }
            return;
        }
        if (!ctx_.t_.publishSync || b + blocks >= ctx_.t_.rows) {   // no SyncAll, or one row at most
            syncRow_ = b;
            for (uint32_t r = b; r < ctx_.t_.rows; r += blocks) Row(r);
            return;
        }
        // plan_gather, several rows on this block: the idle ones first, the SyncAll at the last
        // other row's publish (RowIsIdle reads seq_len again in the second pass: an input,
        // unchanged by the launch)
        for (uint32_t r = b; r < ctx_.t_.rows; r += blocks) {
            AVSG_PHASE(PlanPhase::kStart);
            if (ctx_.RowIsIdle(r)) {
                Row(r);
            } else {
                syncRow_ = r;
            }
        }
        if (syncRow_ == kNoRow) return;
        for (uint32_t r = b; r <= syncRow_; r += blocks) {
            AVSG_PHASE(PlanPhase::kStart);
            if (!ctx_.RowIsIdle(r)) Row(r);
        }
    }

    // AVSG_PHASE: each step's counted work by phase in the strict emulation (plan/plan_phases.h)
    __aicore__ inline void Row(uint32_t r) {
        AVSG_PHASE(PlanPhase::kStart);
        const bool matches = ctx_.StartRow(r);
        if (!matches || ctx_.IsIdle()) {          // a rejected row is left out whole, an idle
            if (matches && ctx_.IdleDrops()) {    // one but for its drop (and, as every plan
                drop_.DropPast();                 // that writes a row, its padding slots freed)
                ctx_.FreePadding(upkeep_);
                output_.WriteBackWindows();
            }
            ctx_.LeaveRow(r, matches ? 0 : -1);
            if (ctx_.split_ > 1) {
                AVSG_PHASE(PlanPhase::kSplitSync);
                splitLookup_.SyncParts();
            }
            return;
        }
        if (ctx_.t_.dropPast) drop_.DropPast();   // invalidate's drop, before the row is read
        stash_.LoadStashCount();
        if (ctx_.split_ == 1) ctx_.FreePadding(upkeep_);
        upkeep_.StartRow();
        classify_.ClearRuns();                    // every chunk's run empty until classified or folded

        // 0. stash compaction #1, and the sorted stash (hash plan) or the matches (dual pointer)
        AVSG_PHASE(PlanPhase::kStash);
        if constexpr (!Matcher::kDual) {          // what the stash and the lookup read first, at once
            const uint32_t stash = PlanContext::SectionBit(avsg::SEC_SK) | PlanContext::SectionBit(avsg::SEC_SS);
            ctx_.LoadFirstWindows(ctx_.WholeSections(kIndexSections) | (stash_.stashCount_ > 0 ? stash : 0u));
        }
        if (stash_.stashCount_ > 0) stash_.CompactStash();
        stash_.stashRuns_.runs = 0;
        if constexpr (Matcher::kDual) {
            AVSG_PHASE(PlanPhase::kLookup);
            dualMatch_.BuildResidentRuns();
            dualMatch_.DualMatchRow(r);
        } else if (stash_.stashCount_ > 0) {
            stash_.BuildStashRuns();
        }
        // 1+2. refresh and classify, chunk by chunk; the stash hits join the hits in the merge,
        // before the decay pins them
        if constexpr (Matcher::kDual) {
            for (uint32_t c = 0; c < ctx_.t_.numChunks; ++c) {
                AVSG_PHASE(PlanPhase::kLookup);
                const uint32_t n = probe_.PrepareWant(r, c);
                dualMatch_.DualFound(c);
                AVSG_PHASE(PlanPhase::kClassify);
                classify_.Classify(r, c, n, true);
            }
        } else {
            const uint32_t stride = ctx_.ChunkStride();
            for (uint32_t c = ctx_.FirstChunk(0); c < ctx_.t_.numChunks;) {   // a group of chunks, then each classified
                AVSG_PHASE(PlanPhase::kLookup);
                const uint32_t g = hashMatch_.LookupGroup(r, c, stride);
                if (hashMatch_.WideGroups() && ctx_.SlotsResident()) {   // the group at once (stride 1)
                    AVSG_PHASE(PlanPhase::kClassify);
                    classify_.ClassifyGroup(c, g, hashMatch_.GroupWant(), hashMatch_.GroupFound());
                    c += g;
                    continue;
                }
                for (uint32_t k = 0; k < g; ++k, c += stride) {
                    AVSG_PHASE(PlanPhase::kLookup);
                    const uint32_t n = hashMatch_.TakeChunk(c, k);
                    AVSG_PHASE(PlanPhase::kClassify);
                    classify_.Classify(r, c, n, k + 1 == g);
                }
            }
            if (!ctx_.OwnerLooksUp()) {   // no chunk of its own: while the helpers look up, the
                AVSG_PHASE(PlanPhase::kLookup);   // index the merge and the insert read loads
                ctx_.LoadFirstWindows(ctx_.WholeSections(kIndexSections));
            }
        }
        ctx_.HitBytesToBits();
        if (ctx_.split_ > 1) {
            AVSG_PHASE(PlanPhase::kSplitSync);
            splitLookup_.SyncParts();
            splitLookup_.FoldParts();
            ctx_.FreePadding(upkeep_);       // the padding slots, freed once the helpers read them
        }
        AVSG_PHASE(PlanPhase::kMerge);
        const uint32_t m = classify_.MergeMisses(r);
        upkeep_.AfterMerge(r, m);
        AVSG_PHASE(PlanPhase::kDecay);
        decay_.DecayAndPin();
        // 3. allocate and install, index the new residents, stash the rest
        AVSG_PHASE(PlanPhase::kVictims);
        victimSearch_.Assign(r, m);
        AVSG_PHASE(PlanPhase::kPublish);
        output_.PublishMisses(r, m);
        if (ctx_.t_.publishSync && r == syncRow_) {   // the composed copy starts; this core goes on
            ctx_.SyncAllBlocks();
            published_ = true;
        }
        AVSG_PHASE(PlanPhase::kLivesBack);
        victimSearch_.AfterPublish();
        AVSG_PHASE(PlanPhase::kInsert);
        insert_.Insert(r, m);
        AVSG_PHASE(PlanPhase::kStashPending);
        stash_.StashPending(r, m);
        // 4. output, stats, state write-back
        AVSG_PHASE(PlanPhase::kStore);
        output_.StoreResults(r, m);
        upkeep_.BeforeWriteBack();
        output_.WriteBack(r);
    }

private:
    // the hash index: bucket_slot and slot_pos, which the lookup, the stash and the insert read
    static constexpr uint32_t kIndexSections =
        PlanContext::SectionBit(avsg::SEC_BS) | PlanContext::SectionBit(avsg::SEC_SP);
    // the row's state (one per core) and the blocks, each given what it works on
    PlanContext ctx_;
    PlanBlockProbe probe_{ctx_};
    PlanBlockMerge merge_{ctx_};
    PlanBlockStash stash_{ctx_, probe_, merge_};
    PlanBlockHashMatch hashMatch_{ctx_, probe_};
    PlanBlockDualMatch dualMatch_{ctx_, probe_, merge_};
    PlanBlockClassify classify_{ctx_, merge_, stash_};
    PlanBlockHeat heat_{ctx_, merge_};
    PlanBlockVictims victims_{ctx_, probe_};
    PlanBlockDecay<Policy> decay_{ctx_, probe_, heat_, victims_};
    VictimSearch<Policy> victimSearch_{ctx_, probe_, heat_, victims_};
    PlanBlockInsert insert_{ctx_, probe_};
    PlanBlockOutput output_{ctx_, stash_, classify_};
    PlanBlockSplit splitLookup_{ctx_, probe_, hashMatch_, classify_};
    PolicyUpkeep<Policy> upkeep_{ctx_, heat_};
    PlanBlockDrop<Policy> drop_{ctx_, upkeep_};
    bool published_ = false;                      // this block met the others after its publish
    static constexpr uint32_t kNoRow = ~0u;
    uint32_t syncRow_ = kNoRow;                   // with publishSync: the row whose publish meets them
};

// The entries' body on the caller's pipe: the tiling into the pipe's first buffer (UB offset
// 0), then the policy it names picks the instantiation, once per launch. An unknown id plans as
// lifetime (the host rejects it before a launch). A kernel that composes the plan with more work
// (op_kernel/plan_gather.cpp) calls this and then resets the pipe for its next block. Returns
// the plan's rows when the plan met every block after publishing its miss lists (tiling
// publishSync: row r is on block r mod blocks, so the copy's rotation starts past them), else 0
// (no SyncAll yet).
template <class Matcher>
__aicore__ inline uint32_t PlanOnPipe(TPipe* pipe, GM_ADDR topk, GM_ADDR seq, GM_ADDR validLens, GM_ADDR state,
                                  GM_ADDR stats, GM_ADDR slots, GM_ADDR missPos, GM_ADDR missSlots,
                                  GM_ADDR missCounts, GM_ADDR workspace, GM_ADDR tiling) {
    TBuf<TPosition::VECCALC> tilingBuf;
    PlanTiling t;
    LoadTiling(pipe, tilingBuf, t, tiling);
    if (t.policy == PolicyReuse::kId) {
        PlanKernel<Matcher, PolicyReuse> op;
        op.Init(pipe, t, topk, seq, validLens, state, stats, slots, missPos, missSlots, missCounts, workspace);
        op.Process();
    } else if (t.policy == PolicyLru::kId) {
        PlanKernel<Matcher, PolicyLru> op;
        op.Init(pipe, t, topk, seq, validLens, state, stats, slots, missPos, missSlots, missCounts, workspace);
        op.Process();
    } else {
        PlanKernel<Matcher, PolicyLifetime> op;
        op.Init(pipe, t, topk, seq, validLens, state, stats, slots, missPos, missSlots, missCounts, workspace);
        op.Process();
    }
    return t.publishSync ? t.rows : 0u;
}

// The plan entries' body: a pipe of its own.
template <class Matcher>
__aicore__ inline void RunPlan(GM_ADDR topk, GM_ADDR seq, GM_ADDR validLens, GM_ADDR state, GM_ADDR stats,
                               GM_ADDR slots, GM_ADDR missPos, GM_ADDR missSlots, GM_ADDR missCounts,
                               GM_ADDR workspace, GM_ADDR tiling) {
    TPipe pipe;
    PlanOnPipe<Matcher>(&pipe, topk, seq, validLens, state, stats, slots, missPos, missSlots, missCounts, workspace,
                        tiling);
}

}  // namespace avsg_kernel
