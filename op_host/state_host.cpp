// state_host.cpp: the checks, tiling and block counts the state ops' host files share
// (state_host.h). Compiled into the CPU library (AVSG_CPU_EMULATION: the emulation's core count)
// and the NPU library (AVSG_WITH_NPU: the device's AIV core count).
#include "state_host.h"

#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "npu/split_launch.h"  // its switches (the config launch itself is plan_host.cpp's)

#if defined(AVSG_CPU_EMULATION) == defined(AVSG_WITH_NPU)
#error "op_host/state_host.cpp: build with exactly one of AVSG_CPU_EMULATION (CPU library) or AVSG_WITH_NPU (NPU library)"
#endif

#ifdef AVSG_CPU_EMULATION
#include "kernel_operator.h"  // avsg_emu::core_count
#endif

#ifdef AVSG_WITH_NPU
#include "tiling/platform/platform_ascendc.h"
#endif

namespace avsg {

std::atomic<bool> g_hostValueChecks{true};
bool HostValueChecks() { return g_hostValueChecks.load(); }

namespace {

constexpr uint32_t kHashA1 = 0x9E3779B1u, kHashB1 = 0x85EBCA77u, kHashA2 = 0xC2B2AE3Du, kHashB2 = 0x27D4EB2Fu;
constexpr int64_t kMaxBuckets = 1 << 15;
constexpr int64_t kMaxLifetime = 255;

uint32_t CeilLog2(uint32_t x) {
    uint32_t l = 0;
    while ((1u << l) < x) ++l;
    return l;
}

void SetWindow(PlanTiling& t, uint32_t s, uint32_t wlog) {
    t.winLog[s] = wlog;
    t.winLen[s] = std::min<uint32_t>(1u << wlog, WinEntries(t, s));
}

constexpr int64_t kMaxContext = kMaxPosition;

// The section windows of t (whole, then halved while the UB plan exceeds the budget, then grown
// into what is left); false if no plan fits. slotsFirst (the plan with the row's slots resident,
// t.slotsResident): the stash windows stay at their minimum (a row's stash is the overflow of
// four probes, a few entries if any, and a window is loaded whole whatever the stash holds), and
// slot_life's window gives way first (MakeTiling keeps such a plan only where slot_life's step
// runs on the half copy, HalfCopyFits, or where it stayed whole).
bool PlanWindows(PlanTiling& t, bool slotsFirst = false) {
    for (uint32_t s = 0; s < SEC_COUNT; ++s) SetWindow(t, s, CeilLog2(std::max<uint32_t>(WinEntries(t, s), 1)));
    if (t.secLen[SEC_SC] == 0)   // lifetime policy: no policy sections, no windows
        for (uint32_t s = SEC_SC; s <= SEC_HT; ++s) t.winLen[s] = 0;
    // Shrink order while the plan exceeds the budget: the stash (touched only in rows whose stash
    // is not empty, sequentially), then slot_life (streamed by decay / victim passes), then the
    // larger of the sections every lookup and insert gathers from: slot_pos or bucket_slot.
    // slot_pos keeps at least nc entries (BuildResidentRuns, see MakeTiling's checks); so do
    // slot_life and slot_count under the reuse policy (its score pass reads them in nc-slot
    // chunks). The per-position counts (touched by scalar loops over misses only) and the heat
    // go first.
    const bool scored = t.policy != kPolicyLifetime;   // reuse, lru: victims by score
    auto minWin = [&](uint32_t s) {
        return s == SEC_SP || (scored && (s == SEC_SL || s == SEC_SC)) ? std::max(kPlanMinWindow, t.nc)
                                                                       : kPlanMinWindow;
    };
    auto shrinkable = [&](uint32_t s) { return t.winLen[s] > minWin(s); };
    auto halve = [&](PlanTiling& p, uint32_t s) {
        uint32_t wlog = p.winLog[s];   // a section that fitted whole gets a power-of-two window below it
        while ((1u << wlog) >= p.winLen[s] && wlog > 0) --wlog;
        SetWindow(p, s, wlog);
    };
    if (slotsFirst)
        for (uint32_t s : {SEC_SK, SEC_SS})
            while (shrinkable(s)) halve(t, s);
    while (MakePlanUbLayout(t).total > kPlanUbBudget) {
        int pick = -1;
        const uint32_t order[2][6] = {{SEC_PC, SEC_HT, SEC_SK, SEC_SS, SEC_SC, SEC_SL},
                                      {SEC_PC, SEC_HT, SEC_SL, SEC_SK, SEC_SS, SEC_SC}};
        for (uint32_t s : order[slotsFirst])
            if (pick < 0 && t.winLen[s] > 0 && shrinkable(s)) pick = static_cast<int>(s);
        if (pick < 0) {
            const bool sp = shrinkable(SEC_SP), bs = shrinkable(SEC_BS);
            if (sp && (!bs || t.winLen[SEC_SP] >= t.winLen[SEC_BS])) pick = SEC_SP;
            else if (bs) pick = SEC_BS;
        }
        if (pick < 0) return false;
        halve(t, static_cast<uint32_t>(pick));
    }
    // hand leftover UB back: slot_life first (fewer window switches in the decay and victim
    // passes), then the stash windows (kept small in the slotsFirst plan)
    for (bool grown = true; grown;) {
        grown = false;
        for (uint32_t s : {SEC_SL, SEC_SC, SEC_HT, SEC_SK, SEC_SS, SEC_PC}) {
            if (slotsFirst && (s == SEC_SK || s == SEC_SS)) continue;
            if (t.winLen[s] >= WinEntries(t, s)) continue;
            PlanTiling trial = t;
            SetWindow(trial, s, t.winLog[s] + 1);
            if (MakePlanUbLayout(trial).total <= kPlanUbBudget) {
                t = trial;
                grown = true;
            }
        }
    }
    return true;
}

}  // namespace

// A state row's sections (reference.Layout), in int32 words: the one place their offsets,
// lengths and the row's width are computed (MakeTiling's tiling, StateWidth's op checks).
// bucket_slot and slot_life hold two int16 entries per word; the reuse policy's sections (counts
// per slot, ghosts, heat per block modulo B) are sized by S and H only.
struct StateSections {
    uint32_t off[SEC_COUNT], len[SEC_COUNT], width;
};
static StateSections MakeStateSections(uint32_t capacity, uint32_t buckets, bool reuse) {
    StateSections sec{};
    const uint32_t Sp = RoundUp(capacity, 64), H = buckets;
    sec.len[SEC_BS] = BucketWords(H);
    sec.len[SEC_SP] = Sp;
    sec.len[SEC_SL] = LifeWords(Sp);
    sec.len[SEC_SK] = Sp;
    sec.len[SEC_SS] = Sp;
    sec.len[SEC_SC] = reuse ? Sp : 0;
    sec.len[SEC_PC] = reuse ? GhostEntries(H) : 0;
    sec.len[SEC_HT] = reuse ? HeatEntries(H) : 0;
    uint32_t at = kStateHeaderLen;
    for (uint32_t s = 0; s < SEC_COUNT; ++s) {   // in layout order
        sec.off[s] = at;
        at += sec.len[s];
    }
    sec.width = at;
    return sec;
}

// Geometry, section offsets, workspace and the UB plan. Windows start whole and are halved while
// the plan exceeds the UB budget (order below).
PlanTiling MakeTiling(uint32_t rows, uint32_t selections, uint32_t capacity, uint32_t buckets, uint32_t lifetime,
                      uint32_t policy, uint32_t maxContext) {
    PlanTiling t;
    std::memset(&t, 0, sizeof(t));
    t.rows = rows;
    t.N = selections;
    t.topk = selections;
    t.outPitch = RoundUp(selections, 8);
    t.capacity = capacity;
    t.capPad = RoundUp(capacity, 64);
    t.buckets = buckets;
    t.logBuckets = CeilLog2(buckets);
    t.lifetime = lifetime;
    t.policy = policy;
    t.maxContext = maxContext;
    const uint32_t H = buckets, Sp = t.capPad;
    const bool reuse = policy == kPolicyReuse;
    const StateSections sec = MakeStateSections(capacity, buckets, reuse);
    t.ghostLog = CeilLog2(GhostEntries(H));
    t.heatMask = HeatEntries(H) - 1;
    for (uint32_t s = 0; s < SEC_COUNT; ++s) {
        t.secOff[s] = sec.off[s];
        t.secLen[s] = sec.len[s];
    }
    t.stashCountOff = kHeaderStashCount;
    t.width = sec.width;
    t.nc = kPlanChunk;
    t.numChunks = (t.N + t.nc - 1) / t.nc;
    const uint32_t resChunks = (Sp + t.nc - 1) / t.nc;   // sorted resident runs (dual pointer)
    t.pendWords = t.numChunks * t.nc / 32;
    t.wsMissOff = 0;
    // resident runs (dual pointer) or stash runs (hash plan; the stash holds at most Sp entries)
    t.wsResKeyOff = t.numChunks * t.nc;
    t.wsResSlotOff = t.wsResKeyOff + resChunks * t.nc;
    t.wsRunLaneOff = t.wsResSlotOff + resChunks * t.nc;
    t.wsSelKeyOff = t.wsRunLaneOff + t.numChunks * t.nc;
    t.wsSelLaneOff = t.wsSelKeyOff + t.numChunks * t.nc;
    t.wsFreeOff = t.wsSelLaneOff + t.numChunks * t.nc;
    t.wsScoreOff = t.wsFreeOff + t.numChunks * (kPlanProbes * t.nc / 32);
    t.wsPerCore = t.wsScoreOff + (reuse ? Sp : 0);   // lru counts its ages in UB, without scores
    t.split = 1;
    t.wsPartOff = t.wsPerCore;
    t.partWords = RoundUp(kPlanPartHead + t.numChunks, 8) + RoundUp(Sp / 32, 8);
    t.hashA1 = kHashA1 & (H - 1);
    t.hashB1 = kHashB1 & (H - 1);
    t.hashA2 = kHashA2 & (H - 1);
    t.hashB2 = kHashB2 & (H - 1);
    t.fillChunk = std::min<uint32_t>(8192, RoundUp(std::max(Sp, H), 64));
    PlanTiling perChunk = t;
    TORCH_CHECK(PlanWindows(perChunk), "avsg.plan: no UB plan fits ", kPlanUbBudget, " bytes for capacity=",
                capacity, " buckets=", buckets, " T*K=", t.N);
    // The row's slots resident in UB where that leaves every section a step reads through its
    // window as whole as without it: a store and a reload of every chunk with misses saved, not
    // a window switch added. The stash's are read only in rows whose stash is not empty (and
    // then only a few entries: small windows load less); slot_life's, where the half copy fits
    // (lifetime, lru), only by a drop.
    const bool lifeStreamed = HalfCopyFits(t);
    PlanTiling resident = t;
    resident.slotsResident = 1u;
    bool keeps = PlanWindows(resident, true);
    for (uint32_t s = 0; s < SEC_COUNT; ++s)
        if (s != SEC_SK && s != SEC_SS && !(s == SEC_SL && lifeStreamed))
            keeps = keeps && resident.winLen[s] == perChunk.winLen[s];
    t = keeps ? resident : perChunk;
    // Assumptions of the kernels, checked here for every geometry the ops accept:
    //  * the scalar k-way merges (PlanMerger, op_kernel/plan/plan_block_merge.h) hold at most
    //    kPlanMaxRuns runs: one miss or selection run per selection chunk, one stash run per nc
    //    stash entries (at most S), and (dual pointer) one resident run per nc-slot chunk of
    //    slot_pos.
    //    BuildResidentRuns cuts its runs at window boundaries, so a slot_pos window of at least nc
    //    entries (a power of two, hence a multiple of nc) or the whole section keeps the runs at
    //    ceil(Sp / nc), which is also what the workspace reserves;
    //  * Allocate drops padding slots (S <= slot < Sp, life -1 like a free slot) by trimming the
    //    tail of each compacted nc-slot chunk: padding is the last Sp - S < 64 entries of slot_life
    //    and compaction keeps slot order, so padding victims always come last in their chunk.
    TORCH_CHECK(t.numChunks <= kPlanMaxRuns && resChunks <= kPlanMaxRuns, "avsg.plan: T*K=", t.N,
                " or capacity=", capacity, " needs more than ", kPlanMaxRuns, " merge runs");
    TORCH_CHECK(t.winLen[SEC_SP] >= t.nc || t.winLen[SEC_SP] == t.secLen[SEC_SP],
                "avsg.plan: slot_pos window of ", t.winLen[SEC_SP], " entries is below the ", t.nc,
                "-entry chunk the resident runs assume");
    TORCH_CHECK(Sp - capacity < 64 && t.nc % 64 == 0, "avsg.plan: padding / chunk geometry");
    for (uint32_t s : {SEC_SL, SEC_SC})
        TORCH_CHECK(policy == kPolicyLifetime || t.winLen[s] >= t.nc || t.winLen[s] == WinEntries(t, s),
                    "avsg.plan: the score pass needs ", t.nc, "-slot windows");
    t.ubBytes = MakePlanUbLayout(t).total;
    return t;
}

int64_t CoreCount() {
#ifdef AVSG_WITH_NPU
    // blockDim must not exceed the physical AIV cores (910B3/B4: 40, 910B1/B2 and A3 dies: 48).
    auto* platform = platform_ascendc::PlatformAscendCManager::GetInstance();
    TORCH_CHECK(platform != nullptr, "avsg.plan: cannot query the Ascend platform (PlatformAscendCManager)");
    const int64_t cores = static_cast<int64_t>(platform->GetCoreNumAiv());
#else
    const int64_t cores = avsg_emu::core_count();
#endif
    return cores;
}

uint32_t BlockDimFor(int64_t rows) {
    return static_cast<uint32_t>(std::max<int64_t>(1, std::min<int64_t>(rows, CoreCount())));
}

// Hash plan with idle cores: every row's lookup chunks spread over up to cores / rows cores (at
// most one chunk each). The lookup is 35-45% of a row's modelled time at K 2048 and pays for one
// soft SyncAll and the owner's fold from two chunks on. With a core to spare beside one per chunk
// the row takes chunks + 1: the owner looks up none and gets its row ready (the drop, the stash,
// the index loaded) while the helpers look up (PlanContext::OwnerLooksUp). Workspace: the parts'
// regions in each slice, and 8 int32 of sync counters per core after the slices (zeroed per
// launch). python/avsg/buffer.py lookup_split states the same rule (the decode model's).
void ApplySplit(PlanTiling& t, int64_t rows) {
    // On the NPU the split waits across cores in a soft SyncAll, which has no timeout: launched
    // without the batch schedule mode it can deadlock when other streams hold some of its cores.
    // Off until AVSG_NPU_SPLIT=1, which `avsg doctor` recommends once a split plan matched the
    // reference on this device in a child process it can kill: the batch mode, the launch timeout
    // (npu/split_launch.h, where the build has the config launch) and what a timed-out launch
    // leaves behind have not run on a card, so they bound the wait once it is on but do not make
    // it the default. The CPU backend reads the same switch, so that it runs the launch the card
    // runs (and does not pay for helper blocks that run one after another here).
    bool enabled = false;
    const std::string bad = npu::ParseSplitSwitch(std::getenv(npu::kSplitEnv), enabled);
    TORCH_CHECK_VALUE(bad.empty(), "avsg.plan: ", bad);
    if (!enabled) return;
    const int64_t perRow = CoreCount() / rows;
    const int64_t split = std::min<int64_t>(perRow, t.numChunks);
    // the owner folds the parts through the all-probe vector wIdx_: one part's region at least
    if (split < 2 || t.partWords > kPlanProbes * t.nc) return;
    t.split = static_cast<uint32_t>(perRow > t.numChunks ? t.numChunks + 1 : split);
    t.wsPerCore = t.wsPartOff + t.split * t.partWords;
}

void CheckTensor(const at::Tensor& t, const char* name, at::ScalarType dtype, at::IntArrayRef shape) {
    TORCH_CHECK_TYPE(t.scalar_type() == dtype, name, ": expected dtype ", c10::toString(dtype), ", got ",
                     c10::toString(t.scalar_type()));
    TORCH_CHECK_VALUE(t.sizes() == shape, name, ": expected shape ", shape, ", got ", t.sizes());
    TORCH_CHECK_VALUE(t.is_contiguous(), name, ": expected a contiguous tensor");
}

// max_context is a bound checked by plan (0: none), never a size: any policy takes any value.
void CheckPolicy(int64_t policy, int64_t max_context) {
    TORCH_CHECK_VALUE(policy == kPolicyLifetime || policy == kPolicyReuse || policy == kPolicyLru,
                      "policy: expected ", kPolicyLifetime, " (lifetime), ", kPolicyReuse, " (reuse) or ", kPolicyLru,
                      " (lru), got ", policy);
    TORCH_CHECK_VALUE(max_context >= 0 && max_context <= kMaxContext, "max_context: expected 0 (none)..",
                      kMaxContext, ", got ", max_context);
}

void CheckGeometry(int64_t capacity, int64_t buckets, int64_t lifetime, int64_t selections) {
    TORCH_CHECK_VALUE(capacity >= 1 && capacity <= kMaxBuckets, "capacity: expected 1..", kMaxBuckets, ", got ",
                      capacity);
    TORCH_CHECK_VALUE(buckets >= std::max<int64_t>(64, capacity) && buckets <= kMaxBuckets &&
                          (buckets & (buckets - 1)) == 0,
                      "buckets: expected a power of two in [max(64, capacity), ", kMaxBuckets, "], got ", buckets);
    TORCH_CHECK_VALUE(lifetime >= 1 && lifetime <= kMaxLifetime, "lifetime: expected 1..", kMaxLifetime, ", got ",
                      lifetime);
    TORCH_CHECK_VALUE(selections <= capacity, "capacity: expected >= T*K = ", selections,
                      " so every step's selections fit, got ", capacity);
}

int64_t StateWidth(int64_t capacity, int64_t buckets, bool reuse) {
    return MakeStateSections(static_cast<uint32_t>(capacity), static_cast<uint32_t>(buckets), reuse).width;
}

// The state of an op told its policy: the reuse policy's sections make the only width choice, so
// a state built for the other kind of policy is named as a policy mismatch.
void CheckStateForPolicy(const at::Tensor& state, int64_t R, int64_t capacity, int64_t buckets, int64_t policy) {
    const bool reuse = policy == kPolicyReuse;
    TORCH_CHECK_VALUE(state.dim() != 2 || state.size(0) != R || state.size(1) != StateWidth(capacity, buckets, !reuse),
                      "policy: the state was built ", reuse ? "without" : "with", " the reuse policy's sections (width ",
                      state.size(1), "), got policy ", policy, reuse ? " (reuse)" : "");
    CheckTensor(state, "state", at::kInt, {R, StateWidth(capacity, buckets, reuse)});
}

// The geometry the state was built with (its header, written by reset) against the arguments.
// CPU state only: on an NPU this read would be a host sync, so there the kernels check the header
// themselves and leave a mismatched row untouched (miss_counts[r] = -1).
void CheckHeader(const at::Tensor& state, int64_t capacity, int64_t buckets, int64_t max_context,
                 int64_t lifetime /* < 0: none */, int64_t policy /* < 0: none */,
                 int64_t min_active /* < 0: none */) {
    if (!state.device().is_cpu() || !HostValueChecks()) return;
    const int32_t* row = state.data_ptr<int32_t>();
    const int64_t width = state.size(1);
    for (int64_t r = 0; r < state.size(0); ++r, row += width) {
        TORCH_CHECK_VALUE(static_cast<uint32_t>(row[0]) == kHeaderMagic, "state: row ", r,
                          " holds no AVSG state header (word 0 = ", row[0], ", expected ", kHeaderMagic,
                          "): build the state with reset");
        TORCH_CHECK_VALUE(row[kHeaderCapacity] == capacity, "capacity: the state was built with ",
                          row[kHeaderCapacity], ", got ", capacity, " (state row ", r, ")");
        TORCH_CHECK_VALUE(row[kHeaderBuckets] == buckets, "buckets: the state was built with ", row[kHeaderBuckets],
                          ", got ", buckets, " (state row ", r, ")");
        TORCH_CHECK_VALUE(row[kHeaderMaxContext] == max_context, "max_context: the state was built with ",
                          row[kHeaderMaxContext], ", got ", max_context, " (state row ", r, ")");
        TORCH_CHECK_VALUE(lifetime < 0 || row[kHeaderLifetime] == lifetime, "lifetime: the state was built with ",
                          row[kHeaderLifetime], ", got ", lifetime, " (state row ", r, ")");
        auto name = [](int64_t p) {
            return p == kPolicyLifetime ? "'lifetime'" : p == kPolicyReuse ? "'reuse'" : p == kPolicyLru ? "'lru'" : "?";
        };
        TORCH_CHECK_VALUE(policy < 0 || row[kHeaderPolicy] == policy, "policy: the state was built with ",
                          name(row[kHeaderPolicy]), " (", row[kHeaderPolicy], "), got ", name(policy),
                          " (state row ", r, ")");
        TORCH_CHECK_VALUE(min_active < 0 || (row[kHeaderActive] >= min_active && row[kHeaderActive] <= capacity),
                          "state: row ", r, " records an active capacity of ", row[kHeaderActive],
                          ", expected one in [", min_active, ", ", capacity, "] (T*K .. S)");
    }
}

// The state tensor and one per-row companion (valid_lens, row_mask): dtype, shape, device.
int64_t CheckStateArgs(const char* op, const at::Tensor& state, const at::Tensor& per_row, const char* per_row_name,
                       at::ScalarType per_row_dtype, int64_t capacity, int64_t buckets, int64_t max_context,
                       int reuse_expected, bool* reuse_out) {
    TORCH_CHECK_TYPE(state.scalar_type() == at::kInt, "avsg.", op, ": state: expected dtype int32, got ",
                     c10::toString(state.scalar_type()));
    TORCH_CHECK_VALUE(state.dim() == 2 && state.size(0) >= 1, "avsg.", op, ": state: expected shape [R, width], got ",
                      state.sizes());
    const int64_t R = state.size(0);
    CheckGeometry(capacity, buckets, 1, 1);
    TORCH_CHECK_VALUE(max_context >= 0 && max_context <= kMaxContext, "max_context: expected 0..", kMaxContext,
                      ", got ", max_context);
    // the reuse sections are the only layout choice; ops that take no policy read it off the width
    const bool reuse = reuse_expected >= 0 ? reuse_expected > 0 : state.size(1) == StateWidth(capacity, buckets, true);
    if (reuse_out) *reuse_out = reuse;
    CheckTensor(state, "state", at::kInt, {R, StateWidth(capacity, buckets, reuse)});
    CheckTensor(per_row, per_row_name, per_row_dtype, {R});
    TORCH_CHECK_VALUE(per_row.device() == state.device(), "avsg.", op, ": ", per_row_name, ": expected a tensor on ",
                      state.device(), " (the state's device), got one on ", per_row.device());
    return R;
}

PlanTiling StateTiling(int64_t rows, int64_t capacity, int64_t buckets, int64_t lifetime, int64_t policy,
                       int64_t max_context) {
    return MakeTiling(static_cast<uint32_t>(rows), 1, static_cast<uint32_t>(capacity),
                      static_cast<uint32_t>(buckets), static_cast<uint32_t>(lifetime), static_cast<uint32_t>(policy),
                      static_cast<uint32_t>(max_context));
}

}  // namespace avsg

#ifdef AVSG_CPU_EMULATION
TORCH_LIBRARY_FRAGMENT(avsg, m) {
    // Tests only: switch the CPU backend's host-side value checks (state headers in plan /
    // invalidate, plan indices in gather) off to exercise what the kernels do on their own.
    m.def("_set_host_value_checks(bool enabled) -> bool", [](bool enabled) {
        return avsg::g_hostValueChecks.exchange(enabled);
    });
}
#endif
