// Host side of plan / plan_dual_pointer / invalidate / reset: input checks, tiling (UB plan), launch
// and registration. This file is compiled twice: into the CPU library with AVSG_CPU_EMULATION (the
// kernels run through the emulation; registered for CPU) and, when CANN is found, into the NPU
// library with AVSG_WITH_NPU (ACLRT_LAUNCH_KERNEL on the caller's NPU stream inside
// OpCommand::RunOpApi, a split plan through the config launch of npu/split_launch.h where the
// build has it; registered for PrivateUse1). Checks and tiling are shared.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <atomic>
#include <cstring>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "plan_tiling.h"
#include "plan_ub_layout.h"

#if defined(AVSG_CPU_EMULATION) == defined(AVSG_WITH_NPU)
#error "op_host/plan_host.cpp: build with exactly one of AVSG_CPU_EMULATION (CPU library) or AVSG_WITH_NPU (NPU library)"
#endif

#ifdef AVSG_CPU_EMULATION
#include "cpu_kernels.h"  // the kernels, in the strict and the fast emulation build
#include "kernel_operator.h"
#include "npu/split_launch.h"  // its switches only: the config launch needs CANN
using GM_ADDR_T = GM_ADDR;
#endif

#ifdef AVSG_WITH_NPU
#include "acl/acl.h"
#include "tiling/platform/platform_ascendc.h"
#include "torch_npu/csrc/core/npu/NPUStream.h"
#include "torch_npu/csrc/framework/OpCommand.h"
#include "aclrtlaunch_avsg_plan.h"
#include "aclrtlaunch_avsg_plan_dual_pointer.h"
#include "aclrtlaunch_avsg_invalidate.h"
#include "aclrtlaunch_avsg_reset.h"
#include "aclrtlaunch_avsg_resize.h"
#include "npu/launch_util.h"
#include "npu/split_launch.h"
using GM_ADDR_T = uint8_t*;
#endif

namespace avsg {

// Host-side value checks of the CPU backend (state headers here, the plan's indices in gather):
// on by default; tests switch them off to drive the kernels' own clamping and header checks, which
// are all an NPU has (reading values there would cost a host sync).
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
    t.winLen[s] = std::min<uint32_t>(1u << wlog, t.secLen[s]);
}

// Geometry, section offsets, workspace and the UB plan. Windows start whole and are halved while
// the plan exceeds the UB budget (order below).
PlanTiling MakeTiling(uint32_t rows, uint32_t selections, uint32_t capacity, uint32_t buckets, uint32_t lifetime,
                      uint32_t policy, uint32_t maxContext) {
    PlanTiling t;
    std::memset(&t, 0, sizeof(t));
    t.rows = rows;
    t.N = selections;
    t.outPitch = RoundUp(selections, 8);
    t.capacity = capacity;
    t.capPad = RoundUp(capacity, 64);
    t.buckets = buckets;
    t.logBuckets = CeilLog2(buckets);
    t.lifetime = lifetime;
    t.policy = policy;
    t.maxContext = maxContext;
    const uint32_t H = buckets, Sp = t.capPad, hd = kStateHeaderLen;
    // reuse policy state, sized by S and H only (reference.Layout): counts per slot, ghosts
    // (evicted counts, one per bucket), heat per 64-position block modulo B
    const bool reuse = policy == kPolicyReuse;
    const uint32_t slotCountLen = reuse ? Sp : 0;
    const uint32_t ctxPad = reuse ? GhostEntries(H) : 0;
    const uint32_t heatLen = reuse ? HeatEntries(H) : 0;
    t.ghostLog = CeilLog2(GhostEntries(H));
    t.heatMask = HeatEntries(H) - 1;
    t.secOff[SEC_BS] = hd;
    t.secOff[SEC_SP] = hd + H;
    t.secOff[SEC_SL] = hd + H + Sp;
    t.secOff[SEC_SK] = hd + H + 2 * Sp;
    t.secOff[SEC_SS] = hd + H + 3 * Sp;
    t.secOff[SEC_SC] = hd + H + 4 * Sp;
    t.secOff[SEC_PC] = t.secOff[SEC_SC] + slotCountLen;
    t.secOff[SEC_HT] = t.secOff[SEC_PC] + ctxPad;
    t.stashCountOff = kHeaderStashCount;
    t.width = t.secOff[SEC_HT] + heatLen;
    t.secLen[SEC_BS] = H;
    for (uint32_t s = SEC_SP; s <= SEC_SS; ++s) t.secLen[s] = Sp;
    t.secLen[SEC_SC] = slotCountLen;
    t.secLen[SEC_PC] = ctxPad;
    t.secLen[SEC_HT] = heatLen;
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
    for (uint32_t s = 0; s < SEC_COUNT; ++s) SetWindow(t, s, CeilLog2(std::max<uint32_t>(t.secLen[s], 1)));
    if (t.secLen[SEC_SC] == 0)   // lifetime policy: no policy sections, no windows
        for (uint32_t s = SEC_SC; s <= SEC_HT; ++s) t.winLen[s] = 0;
    // Shrink order while the plan exceeds the budget: the stash (touched only in rows whose stash
    // is not empty, sequentially), then slot_life (streamed by decay / victim passes), then the
    // larger of the sections every lookup and insert gathers from: slot_pos or bucket_slot.
    // slot_pos keeps at least nc entries (BuildResidentRuns, see the checks below); so do
    // slot_life and slot_count under the reuse policy (its score pass reads them in nc-slot
    // chunks). The per-position counts (touched by scalar loops over misses only) and the heat
    // go first.
    const bool scored = policy != kPolicyLifetime;   // reuse, lru: victims by score
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
    while (MakePlanUbLayout(t).total > kPlanUbBudget) {
        int pick = -1;
        for (uint32_t s : {SEC_PC, SEC_HT, SEC_SK, SEC_SS, SEC_SC, SEC_SL})
            if (pick < 0 && t.winLen[s] > 0 && shrinkable(s)) pick = static_cast<int>(s);
        if (pick < 0) {
            const bool sp = shrinkable(SEC_SP), bs = shrinkable(SEC_BS);
            if (sp && (!bs || t.winLen[SEC_SP] >= t.winLen[SEC_BS])) pick = SEC_SP;
            else if (bs) pick = SEC_BS;
        }
        TORCH_CHECK(pick >= 0, "avsg.plan: no UB plan fits ", kPlanUbBudget, " bytes for capacity=", capacity,
                    " buckets=", buckets, " T*K=", t.N);
        halve(t, static_cast<uint32_t>(pick));
    }
    // hand leftover UB back: slot_life first (fewer window switches in the decay and victim
    // passes), then the stash windows
    for (bool grown = true; grown;) {
        grown = false;
        for (uint32_t s : {SEC_SL, SEC_SC, SEC_HT, SEC_SK, SEC_SS, SEC_PC}) {
            if (t.winLen[s] >= t.secLen[s]) continue;
            PlanTiling trial = t;
            SetWindow(trial, s, t.winLog[s] + 1);
            if (MakePlanUbLayout(trial).total <= kPlanUbBudget) {
                t = trial;
                grown = true;
            }
        }
    }
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
        TORCH_CHECK(!scored || t.winLen[s] >= t.nc || t.winLen[s] == t.secLen[s], "avsg.plan: the score pass needs ",
                    t.nc, "-slot windows");
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
// soft SyncAll and the owner's fold from two chunks on. Workspace: the parts' regions in each
// slice, and 8 int32 of sync counters per core after the slices (zeroed per launch).
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
    const int64_t split = std::min<int64_t>(CoreCount() / rows, t.numChunks);
    // the owner folds a part's hit bitmap through the all-probe vector wIdx_
    if (split < 2 || t.capPad / 8 > kPlanProbes * t.nc * 4) return;
    t.split = static_cast<uint32_t>(split);
    t.wsPerCore = t.wsPartOff + t.split * t.partWords;
}

void CheckTensor(const at::Tensor& t, const char* name, at::ScalarType dtype, at::IntArrayRef shape) {
    TORCH_CHECK_TYPE(t.scalar_type() == dtype, name, ": expected dtype ", c10::toString(dtype), ", got ",
                     c10::toString(t.scalar_type()));
    TORCH_CHECK_VALUE(t.sizes() == shape, name, ": expected shape ", shape, ", got ", t.sizes());
    TORCH_CHECK_VALUE(t.is_contiguous(), name, ": expected a contiguous tensor");
}

constexpr int64_t kMaxContext = kMaxPosition;

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
    const int64_t Sp = RoundUp(static_cast<uint32_t>(capacity), 64);
    const uint32_t H = static_cast<uint32_t>(buckets);
    const int64_t policyState = reuse ? Sp + GhostEntries(H) + HeatEntries(H) : 0;
    return kStateHeaderLen + buckets + 4 * Sp + policyState;
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
                       int reuse_expected /* -1: read off the width */, bool* reuse_out = nullptr) {
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

// ------------------------------------------------------------------------------------ launch
// One entry per kernel; CPU tensors run through the emulation, NPU tensors on the NPU.
#ifdef AVSG_CPU_EMULATION
// `kernels` is fetched once per op call, so the launcher and the kernel come from one build.
template <class F>
void RunOnCpu(const char* op, const avsg_cpu::KernelBuild& kernels, uint32_t blockDim, F&& body) {
    try {
        kernels.launch(blockDim, body);
    } catch (const AscendC::EmuError& e) {
        TORCH_CHECK(false, "avsg.", op, ": AscendC kernel failed in the CPU emulation: ", e.what());
    }
}
#endif

GM_ADDR_T Addr(const at::Tensor& t) { return reinterpret_cast<GM_ADDR_T>(t.data_ptr()); }

// valid_lens: the tensor the kernel reads when tiling.dropPast is set; otherwise any tensor of the
// call (the kernel never reads it), so every parameter is a real device address.
void LaunchPlan(bool dual, uint32_t blockDim, const PlanTiling& tiling, const at::Tensor& topk_pos,
                const at::Tensor& seq_lens, const at::Tensor& valid_lens, const at::Tensor& state, const at::Tensor& stats, const at::Tensor& slots,
                const at::Tensor& miss_pos, const at::Tensor& miss_slots, const at::Tensor& miss_counts,
                const at::Tensor& workspace) {
    const char* op = dual ? "plan_dual_pointer" : "plan";
#ifdef AVSG_CPU_EMULATION
    GM_ADDR_T tl = reinterpret_cast<GM_ADDR_T>(const_cast<PlanTiling*>(&tiling));
    const avsg_cpu::KernelBuild& k = avsg_cpu::selected_kernels();
    RunOnCpu(op, k, blockDim, [&] {
        (dual ? k.plan_dual_pointer : k.plan)(Addr(topk_pos), Addr(seq_lens), Addr(valid_lens), Addr(state),
                                              Addr(stats),
                                                    Addr(slots), Addr(miss_pos), Addr(miss_slots), Addr(miss_counts),
                                                    Addr(workspace), tl);
    });
#else
    c10::OptionalDeviceGuard guard(topk_pos.device());
    at::Tensor tl = npu::DeviceTiling(&tiling, sizeof(tiling), topk_pos.device());
    aclrtStream stream = npu::CurrentStream();
#ifdef AVSG_NPU_LAUNCH_CONFIG
    // The only launch that syncs across cores: batch schedule mode and a timeout (npu/split_launch.h).
    // Tensors are captured by value, as below.
    if (tiling.split > 1) {
        TORCH_CHECK(!dual, "avsg.plan_dual_pointer: the dual-pointer plan never splits its lookup");
        uint16_t timeout = 0;
        const std::string bad = npu::ParseSplitTimeout(std::getenv(npu::kSplitTimeoutEnv), timeout);
        TORCH_CHECK_VALUE(bad.empty(), "avsg.plan: ", bad);
        aclrtFuncHandle function = npu::PlanSplitFunction();
        at_npu::native::OpCommand::RunOpApi(op, [=]() -> int {
            npu::SplitLaunchConfig cfg(timeout);
            npu::PlanSplitArgs args{topk_pos.data_ptr(),  seq_lens.data_ptr(),   valid_lens.data_ptr(),
                                    state.data_ptr(),     stats.data_ptr(),      slots.data_ptr(),
                                    miss_pos.data_ptr(),  miss_slots.data_ptr(), miss_counts.data_ptr(),
                                    workspace.data_ptr(), tl.data_ptr()};
            const aclError err = aclrtLaunchKernelWithHostArgs(function, blockDim, stream, cfg.get(), &args,
                                                               sizeof(args), nullptr, 0);
            if (err != ACL_SUCCESS)   // maybe on the task-queue thread: say what failed; RunOpApi reports the status
                std::fprintf(stderr,
                             "avsg.plan: the split plan's launch (aclrtLaunchKernelWithHostArgs, %u blocks, batch "
                             "schedule mode, timeout %u s) failed with aclError %d; %s=0 runs plan without the split\n",
                             blockDim, static_cast<unsigned>(timeout), static_cast<int>(err), npu::kSplitEnv);
            return static_cast<int>(err);
        });
        return;
    }
#endif
    // Tensors are captured by value: the task queue may run the lambda after this returns.
    at_npu::native::OpCommand::RunOpApi(op, [=]() -> int {
        if (dual)
            return npu::LaunchStatus(ACLRT_LAUNCH_KERNEL(avsg_plan_dual_pointer)(
                blockDim, stream, topk_pos.data_ptr(), seq_lens.data_ptr(), valid_lens.data_ptr(), state.data_ptr(),
                stats.data_ptr(), slots.data_ptr(), miss_pos.data_ptr(), miss_slots.data_ptr(),
                miss_counts.data_ptr(), workspace.data_ptr(), tl.data_ptr()));
        return npu::LaunchStatus(ACLRT_LAUNCH_KERNEL(avsg_plan)(
            blockDim, stream, topk_pos.data_ptr(), seq_lens.data_ptr(), valid_lens.data_ptr(), state.data_ptr(),
            stats.data_ptr(), slots.data_ptr(), miss_pos.data_ptr(), miss_slots.data_ptr(), miss_counts.data_ptr(),
            workspace.data_ptr(), tl.data_ptr()));
    });
#endif
}

// invalidate and reset share a launch: (state, one per-row tensor, tiling).
void LaunchStateOp(bool is_reset, uint32_t blockDim, const PlanTiling& tiling, const at::Tensor& state,
                   const at::Tensor& per_row) {
    const char* op = is_reset ? "reset" : "invalidate";
#ifdef AVSG_CPU_EMULATION
    GM_ADDR_T tl = reinterpret_cast<GM_ADDR_T>(const_cast<PlanTiling*>(&tiling));
    const avsg_cpu::KernelBuild& k = avsg_cpu::selected_kernels();
    RunOnCpu(op, k, blockDim, [&] { (is_reset ? k.reset : k.invalidate)(Addr(state), Addr(per_row), tl); });
#else
    c10::OptionalDeviceGuard guard(state.device());
    at::Tensor tl = npu::DeviceTiling(&tiling, sizeof(tiling), state.device());
    aclrtStream stream = npu::CurrentStream();
    at_npu::native::OpCommand::RunOpApi(op, [=]() -> int {
        if (is_reset)
            return npu::LaunchStatus(
                ACLRT_LAUNCH_KERNEL(avsg_reset)(blockDim, stream, state.data_ptr(), per_row.data_ptr(), tl.data_ptr()));
        return npu::LaunchStatus(ACLRT_LAUNCH_KERNEL(avsg_invalidate)(blockDim, stream, state.data_ptr(),
                                                                      per_row.data_ptr(), tl.data_ptr()));
    });
#endif
}

// ---------------------------------------------------------------------------------------- ops

using PlanOut = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

// The plan's scratch in GM: every word the kernel reads it wrote earlier in the same launch (the
// sync counters are zeroed by the caller). On the NPU the caching allocator recycles it. On the
// CPU a fresh allocation of several hundred KB would be new pages every call, which the operating
// system zeroes on the kernel's first writes (7% of a fast-build plan's profile at 16K slots), so
// each thread keeps one buffer, grown to the largest plan it ran and held until the thread ends.
// A plan launch finishes before its op returns, so one buffer per thread is never in use twice.
at::Tensor PlanWorkspace(int64_t words, const at::TensorOptions& opts) {
#ifdef AVSG_CPU_EMULATION
    thread_local at::Tensor cached;
    if (!cached.defined() || cached.numel() < words) cached = at::empty({words}, opts);
    return cached.narrow(0, 0, words);
#else
    return at::empty({words}, opts);
#endif
}

// valid_lens (optional, int32 [R]): the plan first drops what invalidate(valid_lens) would, in the
// same launch (reference.plan).
PlanOut PlanImpl(bool dual, const at::Tensor& topk_pos, const at::Tensor& seq_lens, const at::Tensor& state,
                 const at::Tensor& stats, int64_t capacity, int64_t buckets, int64_t lifetime, int64_t policy,
                 int64_t max_context, const std::optional<at::Tensor>& valid_lens) {
    const char* op = dual ? "plan_dual_pointer" : "plan";
    TORCH_CHECK_TYPE(topk_pos.scalar_type() == at::kInt, "topk_pos: expected dtype int32, got ",
                     c10::toString(topk_pos.scalar_type()));
    TORCH_CHECK_VALUE(topk_pos.dim() == 3, "topk_pos: expected shape [R, T, K], got ", topk_pos.sizes());
    const int64_t R = topk_pos.size(0), T = topk_pos.size(1), K = topk_pos.size(2);
    TORCH_CHECK_VALUE(R >= 1 && T >= 1 && K >= 1, "topk_pos: expected non-empty [R, T, K], got ", topk_pos.sizes());
    CheckGeometry(capacity, buckets, lifetime, T * K);
    CheckPolicy(policy, max_context);
    CheckTensor(topk_pos, "topk_pos", at::kInt, {R, T, K});
    CheckTensor(seq_lens, "seq_lens", at::kInt, {R});
    CheckStateForPolicy(state, R, capacity, buckets, policy);
    CheckTensor(stats, "stats", at::kLong, {R, 4});
    const bool drop = valid_lens.has_value();
    if (drop) CheckTensor(*valid_lens, "valid_lens", at::kInt, {R});
    const at::Tensor& lens = drop ? *valid_lens : seq_lens;   // unread without dropPast
    const std::pair<const char*, const at::Tensor*> same_device[] = {
        {"seq_lens", &seq_lens}, {"valid_lens", &lens}, {"state", &state}, {"stats", &stats}};
    for (const auto& [name, t] : same_device)
        TORCH_CHECK_VALUE(t->device() == topk_pos.device(), "avsg.", op, ": ", name, ": expected a tensor on ",
                          topk_pos.device(), " (that of topk_pos), got one on ", t->device());
    CheckHeader(state, capacity, buckets, max_context, lifetime, policy, T * K);

    PlanTiling tiling = MakeTiling(static_cast<uint32_t>(R), static_cast<uint32_t>(T * K),
                                   static_cast<uint32_t>(capacity), static_cast<uint32_t>(buckets),
                                   static_cast<uint32_t>(lifetime), static_cast<uint32_t>(policy),
                                   static_cast<uint32_t>(max_context));
    tiling.dropPast = drop ? 1u : 0u;
    if (!dual) ApplySplit(tiling, R);
    const uint32_t blockDim = tiling.split > 1 ? static_cast<uint32_t>(R) * tiling.split : BlockDimFor(R);
    auto opts = topk_pos.options().dtype(at::kInt);
    // Two rows may be planned by two cores, so every output row gets 32 B granules of its own:
    // rows of tiling.outPitch int32 (T*K rounded up to 8) and miss_counts at a pitch of
    // kPlanCountPitch. The caller gets views of the first T*K columns (contiguous whenever T*K is a
    // multiple of 8) and of miss_counts' first column.
    const int64_t pitch = tiling.outPitch;
    at::Tensor slots_rows = at::empty({R, pitch}, opts);
    at::Tensor miss_pos_rows = at::empty({R, pitch}, opts);
    at::Tensor miss_slots_rows = at::empty({R, pitch}, opts);
    at::Tensor miss_count_rows = at::empty({R, static_cast<int64_t>(kPlanCountPitch)}, opts);
    at::Tensor slots = slots_rows.narrow(1, 0, T * K).view({R, T, K});
    at::Tensor miss_pos = miss_pos_rows.narrow(1, 0, T * K);
    at::Tensor miss_slots = miss_slots_rows.narrow(1, 0, T * K);
    at::Tensor miss_counts = miss_count_rows.select(1, 0);
    const int64_t slices = static_cast<int64_t>(blockDim) * tiling.wsPerCore;
    const int64_t syncWords = tiling.split > 1 ? static_cast<int64_t>(blockDim) * kPlanSyncWords : 0;
    at::Tensor workspace = PlanWorkspace(slices + syncWords, opts);
    if (syncWords) workspace.narrow(0, slices, syncWords).zero_();   // soft SyncAll counters
    LaunchPlan(dual, blockDim, tiling, topk_pos, seq_lens, lens, state, stats, slots_rows, miss_pos_rows, miss_slots_rows,
               miss_count_rows, workspace);
    return {slots, miss_pos, miss_slots, miss_counts};
}

PlanOut Plan(const at::Tensor& topk_pos, const at::Tensor& seq_lens, at::Tensor& state, at::Tensor& stats,
             int64_t capacity, int64_t buckets, int64_t lifetime, int64_t policy, int64_t max_context,
             const std::optional<at::Tensor>& valid_lens) {
    return PlanImpl(false, topk_pos, seq_lens, state, stats, capacity, buckets, lifetime, policy, max_context,
                    valid_lens);
}
PlanOut PlanDualPointer(const at::Tensor& topk_pos, const at::Tensor& seq_lens, at::Tensor& state,
                        at::Tensor& stats, int64_t capacity, int64_t buckets, int64_t lifetime, int64_t policy,
                        int64_t max_context, const std::optional<at::Tensor>& valid_lens) {
    return PlanImpl(true, topk_pos, seq_lens, state, stats, capacity, buckets, lifetime, policy, max_context,
                    valid_lens);
}

PlanTiling StateTiling(int64_t rows, int64_t capacity, int64_t buckets, int64_t lifetime, int64_t policy,
                       int64_t max_context) {
    return MakeTiling(static_cast<uint32_t>(rows), 1, static_cast<uint32_t>(capacity),
                      static_cast<uint32_t>(buckets), static_cast<uint32_t>(lifetime), static_cast<uint32_t>(policy),
                      static_cast<uint32_t>(max_context));
}

void Invalidate(at::Tensor& state, const at::Tensor& valid_lens, int64_t capacity, int64_t buckets,
                int64_t max_context) {
    bool reuse = false;
    const int64_t R = CheckStateArgs("invalidate", state, valid_lens, "valid_lens", at::kInt, capacity, buckets,
                                     max_context, -1, &reuse);
    // invalidate only frees slots: any active capacity stays valid, so it is not checked
    CheckHeader(state, capacity, buckets, max_context, -1, -1, -1);
    const uint32_t blockDim = BlockDimFor(R);
    // lifetime 0: the invalidate kernel checks the header's magic, capacity, buckets and
    // max_context only (the reuse sections, read off the state's width, are all it needs)
    LaunchStateOp(false, blockDim, StateTiling(R, capacity, buckets, 0, reuse ? kPolicyReuse : kPolicyLifetime,
                                               max_context),
                  state, valid_lens);
}

// resize: (rows, capacities) become one int32 target per row (-1: not listed) on the state's
// device, so the kernel needs no host sync; a shrink's moves come back as fixed-shape lists.
std::tuple<at::Tensor, at::Tensor, at::Tensor> Resize(at::Tensor& state, const at::Tensor& rows,
                                                      const at::Tensor& capacities, int64_t capacity, int64_t buckets,
                                                      int64_t lifetime, int64_t policy, int64_t max_context,
                                                      int64_t min_active) {
    TORCH_CHECK_TYPE(state.scalar_type() == at::kInt, "avsg.resize: state: expected dtype int32, got ",
                     c10::toString(state.scalar_type()));
    TORCH_CHECK_VALUE(state.dim() == 2 && state.size(0) >= 1, "avsg.resize: state: expected shape [R, width], got ",
                      state.sizes());
    const int64_t R = state.size(0);
    TORCH_CHECK_VALUE(min_active >= 1, "min_active: expected >= 1 (T*K), got ", min_active);
    CheckGeometry(capacity, buckets, lifetime, min_active);
    CheckPolicy(policy, max_context);
    CheckStateForPolicy(state, R, capacity, buckets, policy);
    TORCH_CHECK_VALUE(rows.dim() == 1, "rows: expected a 1-D tensor, got shape ", rows.sizes());
    CheckTensor(rows, "rows", at::kLong, {rows.size(0)});
    CheckTensor(capacities, "capacities", at::kLong, {rows.size(0)});
    const std::pair<const char*, const at::Tensor*> same_device[] = {{"rows", &rows}, {"capacities", &capacities}};
    for (const auto& [name, t] : same_device)
        TORCH_CHECK_VALUE(t->device() == state.device(), "avsg.resize: ", name, ": expected a tensor on ",
                          state.device(), " (the state's device), got one on ", t->device());
    if (state.device().is_cpu()) {
        // always checked on CPU: an index outside [0, R) would make the scatter below fault
        const int64_t* row = rows.data_ptr<int64_t>();
        const int64_t* cap = capacities.data_ptr<int64_t>();
        std::vector<bool> seen(static_cast<size_t>(R), false);
        for (int64_t i = 0; i < rows.size(0); ++i) {
            TORCH_CHECK_VALUE(row[i] >= 0 && row[i] < R, "rows[", i, "] = ", row[i], ": expected a row in [0, ", R, ")");
            TORCH_CHECK_VALUE(!seen[row[i]], "rows: row ", row[i], " is listed twice; each row takes one capacity");
            seen[row[i]] = true;
            TORCH_CHECK_VALUE(cap[i] >= min_active && cap[i] <= capacity, "capacities[", i, "] = ", cap[i],
                              ": expected a capacity in [", min_active, ", ", capacity,
                              "] (T*K .. S, the allocated slots)");
        }
    }
    CheckHeader(state, capacity, buckets, max_context, lifetime, policy, min_active);
    auto opts = state.options().dtype(at::kInt);
    at::Tensor target = at::full({R}, -1, opts);
    target.index_put_({rows}, capacities.to(at::kInt));
    const int64_t W = std::max<int64_t>(1, capacity / 2);
    // rows of the move lists and the counts padded to 32 B, as for plan's outputs; views returned
    const int64_t pitch = (W + 7) / 8 * 8;
    at::Tensor src_rows = at::empty({R, pitch}, opts), dst_rows = at::empty({R, pitch}, opts);
    at::Tensor count_rows = at::empty({R, static_cast<int64_t>(kPlanCountPitch)}, opts);
    ResizeTiling tiling{};
    tiling.plan = MakeTiling(static_cast<uint32_t>(R), static_cast<uint32_t>(min_active),
                             static_cast<uint32_t>(capacity), static_cast<uint32_t>(buckets),
                             static_cast<uint32_t>(lifetime), static_cast<uint32_t>(policy),
                             static_cast<uint32_t>(max_context));
    tiling.moveWidth = static_cast<uint32_t>(W);
    tiling.movePitch = static_cast<uint32_t>(pitch);
    const uint32_t blockDim = BlockDimFor(R);
#ifdef AVSG_CPU_EMULATION
    GM_ADDR_T tl = reinterpret_cast<GM_ADDR_T>(&tiling);
    const avsg_cpu::KernelBuild& k = avsg_cpu::selected_kernels();
    RunOnCpu("resize", k, blockDim,
             [&] { k.resize(Addr(state), Addr(target), Addr(src_rows), Addr(dst_rows), Addr(count_rows), tl); });
#else
    c10::OptionalDeviceGuard guard(state.device());
    at::Tensor tl = npu::DeviceTiling(&tiling, sizeof(tiling), state.device());
    aclrtStream stream = npu::CurrentStream();
    at_npu::native::OpCommand::RunOpApi("resize", [=]() -> int {
        return npu::LaunchStatus(ACLRT_LAUNCH_KERNEL(avsg_resize)(blockDim, stream, state.data_ptr(),
                                                                  target.data_ptr(), src_rows.data_ptr(),
                                                                  dst_rows.data_ptr(), count_rows.data_ptr(),
                                                                  tl.data_ptr()));
    });
#endif
    return {src_rows.narrow(1, 0, W), dst_rows.narrow(1, 0, W), count_rows.select(1, 0)};
}

// Reset reads nothing from the rows it rewrites (header included): it is also how a corrupted row
// is repaired.
void Reset(at::Tensor& state, const at::Tensor& row_mask, int64_t capacity, int64_t buckets, int64_t lifetime,
           int64_t policy, int64_t max_context) {
    CheckGeometry(capacity, buckets, lifetime, 1);
    CheckPolicy(policy, max_context);
    const int64_t R = CheckStateArgs("reset", state, row_mask, "row_mask", at::kBool, capacity, buckets, max_context,
                                     policy == kPolicyReuse ? 1 : 0);
    const uint32_t blockDim = BlockDimFor(R);
    LaunchStateOp(true, blockDim, StateTiling(R, capacity, buckets, lifetime, policy, max_context), state, row_mask);
}

}  // namespace

#ifdef AVSG_CPU_EMULATION
// For tests and benchmarks: the UB plan chosen for a geometry.
std::vector<int64_t> PlanUbPlan(int64_t T, int64_t K, int64_t capacity, int64_t buckets, int64_t max_context) {
    CheckGeometry(capacity, buckets, 1, T * K);
    const int64_t policy = max_context ? kPolicyReuse : kPolicyLifetime;
    CheckPolicy(policy, max_context);
    PlanTiling t = MakeTiling(1, static_cast<uint32_t>(T * K), static_cast<uint32_t>(capacity),
                              static_cast<uint32_t>(buckets), 1, static_cast<uint32_t>(policy),
                              static_cast<uint32_t>(max_context));
    std::vector<int64_t> out{t.ubBytes, MakePlanUbLayout(t).fixed};
    for (uint32_t s = 0; s < SEC_COUNT; ++s) out.push_back(static_cast<int64_t>(t.winLen[s]) * 4);
    return out;
}
#endif

}  // namespace avsg

// The CPU library (_C, emulation) and the NPU library (_npu_ops) each register only their own
// dispatch key, so loading both never registers anything twice.
#ifdef AVSG_CPU_EMULATION
TORCH_LIBRARY_FRAGMENT(avsg, m) {
    // [total UB bytes, fixed bytes, window bytes of bucket_slot, slot_pos, slot_life,
    //  stash_key, stash_slot, slot_count, pos_count, block_heat]; max_context > 0: reuse policy
    m.def("plan_ub_plan(int T, int K, int capacity, int buckets, int max_context=0) -> int[]", &avsg::PlanUbPlan);
    // Tests only: switch the CPU backend's host-side value checks (state headers in plan /
    // invalidate, plan indices in gather) off to exercise what the kernels do on their own.
    m.def("_set_host_value_checks(bool enabled) -> bool", [](bool enabled) {
        return avsg::g_hostValueChecks.exchange(enabled);
    });
}

TORCH_LIBRARY_IMPL(avsg, CPU, m) {
    m.impl("plan", &avsg::Plan);
    m.impl("plan_dual_pointer", &avsg::PlanDualPointer);
    m.impl("invalidate", &avsg::Invalidate);
    m.impl("reset", &avsg::Reset);
    m.impl("resize", &avsg::Resize);
}
#endif

#ifdef AVSG_WITH_NPU
TORCH_LIBRARY_IMPL(avsg, PrivateUse1, m) {
    m.impl("plan", &avsg::Plan);
    m.impl("plan_dual_pointer", &avsg::PlanDualPointer);
    m.impl("invalidate", &avsg::Invalidate);
    m.impl("reset", &avsg::Reset);
    m.impl("resize", &avsg::Resize);
}
#endif
