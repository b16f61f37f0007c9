// plan_tiling.h: POD tiling shared by the host (op_host/plan_host.cpp) and the plan / invalidate /
// reset / resize kernels (op_kernel/plan_kernel.h, invalidate_kernel.h, reset_kernel.h,
// resize_kernel.h). Plain C++ only, so the AscendC device compiler and the host compiler both
// accept it. All sizes are in int32 elements unless named *Bytes.
//
// State row layout (python/avsg/reference.py): a 64-int32 header (magic, S, H, L at words 0..3,
// stash_count at word 8), then sections BS bucket_slot [Hw = BucketWords(H): H int16 entries,
// two per word, bucket 2w in the low half of word w], SP slot_pos [Sp],
// SL slot_life [LifeWords(Sp): Sp int16 entries, two per word], SK stash_key [Sp], SS stash_slot [Sp], and for the reuse policy SC
// slot_count [Sp], PC ghost [G] (evicted counts, tag << 8 | count), HT block_heat [B] (empty
// for the lifetime and lru policies). Each section is reached through one UB "window" of winLen elements (a power
// of two, or the whole section when it fits): see plan_ub_layout.h for the UB plan.
#pragma once
#include <cstdint>

namespace avsg {

enum PlanSection : uint32_t { SEC_BS = 0, SEC_SP, SEC_SL, SEC_SK, SEC_SS, SEC_SC, SEC_PC, SEC_HT, SEC_COUNT };

constexpr uint32_t kPlanChunk = 512;        // selections per vector chunk (NC): 8 repeats of int32
constexpr uint32_t kPlanProbes = 4;         // 1 + RETRIES probe buckets per position
// The insert's narrowest probe slice: whole 256 B repeats of int32 where bucket_slot is whole in
// UB; 256 lanes where it has windows (a slice's window mask, and half of the four, start 32 B aligned)
constexpr uint32_t kPlanInsertStride = 64, kPlanInsertWindowedStride = 256;
static_assert(kPlanChunk % kPlanInsertWindowedStride == 0 && kPlanInsertWindowedStride % kPlanInsertStride == 0,
              "the insert's probe slices divide a chunk");
constexpr uint32_t kPlanMaxRuns = 64;       // sorted runs merged by one scalar k-way merge
constexpr uint32_t kPlanHeadLen = 16;       // int32 per run and merge head space (x 2 x kPlanMaxRuns)
constexpr uint32_t kPlanMergeRegions = 3;   // head space regions: two merges (one with payload) at once
constexpr uint32_t kPlanMinWindow = 256;    // keeps bitmap slices 32 B aligned
constexpr uint32_t kPlanUbBudget = 184 * 1024;
constexpr uint32_t kPlanPartHead = 4;       // a lookup part's counts: lookups, hits, misses, pad
constexpr uint32_t kPlanSyncWords = 8;      // soft SyncAll counter per core (32 B)
constexpr uint32_t kPlanCountPitch = 8;    // int32 per row of miss_counts as the kernel writes it (32 B)
constexpr uint32_t kPlanVectors = 9;        // NC-element int32/float work vectors
constexpr uint32_t kPlanWideVectors = 3;    // kPlanProbes*NC-element vectors (all probes of a chunk)
constexpr uint32_t kPlanMasks = 4;          // kPlanProbes*NC-bit compare masks
constexpr uint32_t kPlanSortVectors = 8;    // concat 1 + index 1 + dst 2 + tmp 2 + out 2 (x NC)
constexpr uint32_t kStashCountPad = 8;      // the stash_count block: 8 int32 (32 B) of the header
constexpr uint32_t kStateHeaderLen = 64;    // int32 header at the start of every state row
constexpr uint32_t kHeaderWords = 8;        // geometry block read by the kernels (32 B)
constexpr uint32_t kHeaderMagic = 0x41565334u;   // "AVS4" (reference.HEADER_MAGIC)
constexpr uint32_t kHeaderCapacity = 1, kHeaderBuckets = 2, kHeaderLifetime = 3;
constexpr uint32_t kHeaderPolicy = 4, kHeaderMaxContext = 5;
constexpr uint32_t kHeaderActive = 6;       // active capacity in [N, S] (resize; reset writes S)
constexpr uint32_t kHeaderStashCount = 8;   // stash_count's block starts here
constexpr uint32_t kHeaderStep = 9;         // reuse: steps since the counts were halved
constexpr uint32_t kHeaderHand = 10;        // lifetime: the slot the next tie search starts at
constexpr uint32_t kMaxPosition = 1u << 24;
constexpr uint32_t kProbationSteps = 4;     // lifetime: see FirstLife (reference.PROBATION_STEPS)
// Residency policies (reference.POLICY_IDS) and the reuse policy's constants (reference.REUSE_*)
constexpr uint32_t kPolicyLifetime = 0, kPolicyReuse = 1, kPolicyLru = 2;
constexpr int32_t kReuseAgeMax = 1023, kReuseCountMax = 255, kReuseHeatMax = 255;
constexpr int32_t kReuseBlockLog = 6, kReuseHalveEvery = 256;
constexpr int32_t kReuseGainStreak = 1, kReuseGainReturn = 2;   // count gain: used last step / not
constexpr int32_t kScoreFree = -128, kScorePinned = 127;
constexpr int32_t kGhostCountBits = 8, kGhostCountMask = 255;   // a ghost: tag << 8 | count
constexpr uint32_t kHeatBlocksPerBucketLog = 4;                  // B = max(64, H / 16)
constexpr int32_t kLruScoreFree = -kReuseAgeMax - 1, kLruScorePinned = 1;   // lru scores: -age

// int32 words of the bucket_slot section: H int16 entries (slot ids < S <= 2^15), rounded up to
// 64 words like every section (reference.Layout.bucket_words).
constexpr uint32_t BucketWords(uint32_t buckets) { return (buckets / 2 + 63) / 64 * 64; }
// slot_life: Sp int16 entries, two per word, rounded up to 64 words (reference.Layout.life_words)
constexpr uint32_t LifeWords(uint32_t capPad) { return (capPad / 2 + 63) / 64 * 64; }

struct PlanTiling {
    uint32_t rows, N;                    // N = T*K selections per row
    uint32_t outPitch;                   // int32 per row of slots / miss_pos / miss_slots: N rounded up
                                         // to 32 B, so that no 32 B granule of an output holds two rows
                                         // (two rows may be written by two cores; see kPlanCountPitch)
    uint32_t capacity, capPad;           // S, Sp = roundup(S, 64)
    uint32_t buckets, logBuckets;        // H = 2^logBuckets
    uint32_t lifetime;                   // L
    uint32_t policy;                     // kPolicyLifetime / kPolicyReuse / kPolicyLru
    uint32_t maxContext;                 // positions with per-position state (0: none)
    uint32_t width;                      // int32 per state row
    uint32_t secOff[SEC_COUNT];          // section offsets in a state row
    uint32_t secLen[SEC_COUNT];          // section lengths in int32 words (multiples of 64)
    uint32_t winLog[SEC_COUNT];          // window = 2^winLog elements (multi-window sections)
    uint32_t winLen[SEC_COUNT];          // UB buffer length = min(2^winLog, secLen)
    uint32_t stashCountOff;              // kHeaderStashCount
    uint32_t nc;                         // kPlanChunk
    uint32_t numChunks;                  // ceil(N / nc): sorted miss runs per row
    uint32_t pendWords;                  // uint32 words of the pending bitmap (numChunks*nc/32)
    uint32_t wsPerCore;                  // int32 workspace per core
    // workspace (int32 offsets in the core's slice), nc entries per run: sorted miss runs (each
    // entry overwritten by its index in miss_pos once merged); sorted (key, payload) runs of the
    // resident slots (dual pointer) or, in the same space, of the stash (hash plan); the miss runs'
    // lanes; the dual pointer's sorted selection runs (overwritten by their match) and their lanes;
    // the insert's free / winner bits (kPlanProbes*nc bits per miss chunk)
    uint32_t wsMissOff, wsResKeyOff, wsResSlotOff, wsRunLaneOff, wsSelKeyOff, wsSelLaneOff, wsFreeOff;
    uint32_t wsScoreOff;                 // reuse: the slots' scores (float, Sp) for the victim search
    uint32_t hashA1, hashB1, hashA2, hashB2;   // constants mod H
    uint32_t ubBytes;                    // planned UB use of the plan kernels
    uint32_t fillChunk;                  // invalidate / reset chunk (elements, multiple of 64)
    // Split lookup (hash plan, few rows): core b looks up the chunks c = part, part + split, ...
    // of row b % rows, part = b / rows (part 0 owns the row). Each part's counts, chunk run
    // lengths and hit bitmap go to the owner's workspace slice at wsPartOff + part * partWords;
    // the soft SyncAll's counters follow the cores' slices. split = 1: one core per row.
    uint32_t split, wsPartOff, partWords;
    // reuse: ghost entry of position p = p & (2^ghostLog - 1), its tag p >> ghostLog; heat entry of
    // p = (p >> kReuseBlockLog) & heatMask (reference.ghost_entries / heat_entries)
    uint32_t ghostLog, heatMask;
    // 1: the plan launch has valid lengths (plan(valid_lens=...)) and drops every slot whose
    // position is at or past its row's before the row is read (op_kernel/plan/plan_block_drop.h)
    uint32_t dropPast;
    // K, the selections of one query token (N = T*K; MakeTiling's default N: one token). A chunk
    // that starts at or past it belongs to a later query token, whose hits are mostly slots an
    // earlier token already hit: Classify marks only the new ones (PlanContext::UnmarkedHits).
    uint32_t topk;
    // 1 (plan_gather): the plan publishes each row's miss lists as soon as its victims are
    // chosen, and every block meets the others in one soft SyncAll (the split's counters) once
    // all its rows have (idle rows first, then at its last row's publish), so the composed
    // gather copies while the owners finish their last rows (op_kernel/plan_gather.cpp). 0: the
    // plan op.
    uint32_t publishSync;
    // 1: the row's slots stay in UB from Classify to the output (PlanContext::outSlots_), stored
    // once at the row's end instead of per chunk and patched in place. MakeTiling sets it where
    // the buffer fits beside every window the lookup and the insert gather from, as whole as
    // without it; a split row (its helpers' chunks reach the owner through GM) stores per chunk.
    uint32_t slotsResident;
};

// resize (op_kernel/resize_kernel.h): the plan geometry (N = T*K, the smallest active capacity),
// the width of the move lists, and the kernel's fixed UB plan. The kernel runs on the scalar unit
// through kResizeWindow-element windows per section, so its UB use does not depend on the
// geometry: the budget is checked once, here.
struct ResizeTiling {
    PlanTiling plan;
    uint32_t moveWidth;                  // W = max(1, S / 2) entries per row of the move lists
    uint32_t movePitch;                  // int32 per row of the move lists as written: W rounded up to
                                         // 32 B (rows belong to different cores); move_counts at a
                                         // pitch of kPlanCountPitch
};
constexpr uint32_t kResizeWindow = 2048;     // int32 per section window (power of two)
constexpr uint32_t kResizeWindowLog = 11;
constexpr uint32_t kResizeBins = 1024;       // rank histogram: lru ranks -1023..0 need the most
constexpr uint32_t kResizeStage = 256;       // move-list entries staged per DMA
constexpr uint32_t kResizeMaxWidth = 16384;  // W <= S / 2 <= 2^15 / 2
constexpr uint32_t kMaxBucketsResize = 32768;  // H <= 2^15 (reference.MAX_BUCKETS): claim bitmap
constexpr uint32_t kResizeTilingUbBytes = (static_cast<uint32_t>(sizeof(ResizeTiling)) + 31u) / 32u * 32u;
constexpr uint32_t kResizeUbBytes = kResizeTilingUbBytes + SEC_COUNT * kResizeWindow * 4 + kResizeBins * 4 +
                                    3 * kResizeStage * 4 + kResizeMaxWidth / 8 + kMaxBucketsResize / 8 +
                                    3 * 64;
static_assert(kResizeUbBytes <= kPlanUbBudget, "the resize kernel's UB plan exceeds the budget");
static_assert((1u << kResizeWindowLog) == kResizeWindow, "windows are addressed by shifts");

// The one round-up helper of the plan kernels (x, m > 0). The kernels include kernel_operator.h
// first, which defines __aicore__ (empty in the CPU emulation, the aicore attribute in the device
// compile); the host gets a plain function.
#if defined(__aicore__)
#define AVSG_PLAN_SHARED_FN constexpr __aicore__ inline
#else
#define AVSG_PLAN_SHARED_FN constexpr inline
#endif
AVSG_PLAN_SHARED_FN uint32_t RoundUp(uint32_t x, uint32_t m) { return (x + m - 1) / m * m; }
// Lifetime policy: a fetched position starts kProbationSteps short of a hit's life, or at half of it
// (rounded up) when L < 2 * kProbationSteps (reference.first_life).
AVSG_PLAN_SHARED_FN uint32_t FirstLife(uint32_t L) { return L - (L / 2 < kProbationSteps ? L / 2 : kProbationSteps); }
// Lifetime and lru: the step's lives are kept as half in the plan kernel's sort region, in whole
// 128-lane half compares, where the padded slots fit it (PlanBlockVictims): slot_life then moves
// in and out of GM once per step in stretches, and its window is read only by a drop and the
// padding's reset.
constexpr uint32_t kPlanHalfCopyLanes = 128;
AVSG_PLAN_SHARED_FN bool HalfCopyFits(const PlanTiling& t) {
    return t.policy != kPolicyReuse && RoundUp(t.capPad, kPlanHalfCopyLanes) <= 2 * kPlanSortVectors * t.nc;
}
// The entries a section's window counts: slot_life's are its slots (int16 in GM, widened to int32
// in its UB window: PlanContext), every other section's its int32 words (bucket_slot's words
// hold two int16 entries each and are read as such: WinGet16).
AVSG_PLAN_SHARED_FN uint32_t WinEntries(const PlanTiling& t, uint32_t s) { return s == SEC_SL ? t.capPad : t.secLen[s]; }
// Reuse policy sections, sized by the buckets H (a power of two >= 64) only.
AVSG_PLAN_SHARED_FN uint32_t GhostEntries(uint32_t H) { return 2 * H; }   // reference.ghost_entries
AVSG_PLAN_SHARED_FN uint32_t HeatEntries(uint32_t H) {
    return (H >> kHeatBlocksPerBucketLog) > 64u ? (H >> kHeatBlocksPerBucketLog) : 64u;
}

// Namespace-scope constants are plain expressions, never calls: a constexpr initialised from an
// __aicore__ function is rejected by an AI-core-only compile (--cce-aicore-only).
static_assert(sizeof(PlanTiling) % 4 == 0, "PlanTiling is read as uint32 words");
// The kernels DMA the tiling into its own UB buffer (op_kernel/kernel_tools.h, LoadTiling).
constexpr uint32_t kPlanTilingUbBytes = (static_cast<uint32_t>(sizeof(PlanTiling)) + 31u) / 32u * 32u;
// Sort32 on A2 needs its destination 256 B aligned and its sources 128 B aligned; TPipe only
// promises 32 B. The plan kernel's sort region (with the wide vectors that carry Sort payloads)
// is one buffer with this much slack, cut at its first 256 B boundary.
constexpr uint32_t kPlanSortAlign = 256;
constexpr uint32_t kPlanSortAlignSlack = kPlanSortAlign - 32;

}  // namespace avsg
