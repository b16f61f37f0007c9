// Host side of plan / plan_dual_pointer / invalidate / reset: input checks, tiling (UB plan),
// launch through the CPU emulation, and registration as the CPU implementation of torch.ops.avsg.*.
// The NPU launch of the same kernels (ACLRT_LAUNCH_KERNEL on the current NPU stream inside
// OpCommand::RunOpApi) is compiled only with AVSG_WITH_NPU (op_host/npu, CANN present).
#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <tuple>

#include "plan_tiling.h"

#ifdef AVSG_CPU_EMULATION
#include "kernel_operator.h"
extern "C" void avsg_plan(GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR);
extern "C" void avsg_plan_dual_pointer(GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR,
                                       GM_ADDR, GM_ADDR);
extern "C" void avsg_invalidate(GM_ADDR, GM_ADDR, GM_ADDR);
extern "C" void avsg_reset(GM_ADDR, GM_ADDR, GM_ADDR);
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
#endif

namespace avsg {
namespace {

constexpr uint32_t kHashA1 = 0x9E3779B1u, kHashB1 = 0x85EBCA77u, kHashA2 = 0xC2B2AE3Du, kHashB2 = 0x27D4EB2Fu;
constexpr int64_t kMaxBuckets = 1 << 15;
constexpr int64_t kMaxLifetime = 255;

uint32_t RoundUp(uint32_t x, uint32_t m) { return (x + m - 1) / m * m; }
uint32_t CeilLog2(uint32_t x) {
    uint32_t l = 0;
    while ((1u << l) < x) ++l;
    return l;
}

void SetWindow(PlanTiling& t, uint32_t s, uint32_t wlog) {
    t.winLog[s] = wlog;
    t.winLen[s] = std::min<uint32_t>(1u << wlog, t.secLen[s]);
}

// Geometry, section offsets, workspace and the UB plan. Windows start whole; while the plan
// exceeds the UB budget, the streaming sections (stash, slot_life) are halved first, then the
// largest of the randomly accessed ones (bucket_slot, bucket_key, slot_pos).
PlanTiling MakeTiling(uint32_t rows, uint32_t T, uint32_t K, uint32_t capacity, uint32_t buckets, uint32_t lifetime,
                      uint32_t blockDim) {
    PlanTiling t;
    std::memset(&t, 0, sizeof(t));
    t.rows = rows;
    t.T = T;
    t.K = K;
    t.N = T * K;
    t.capacity = capacity;
    t.capPad = RoundUp(capacity, 64);
    t.buckets = buckets;
    t.logBuckets = CeilLog2(buckets);
    t.lifetime = lifetime;
    const uint32_t H = buckets, Sp = t.capPad;
    t.secOff[SEC_BK] = 0;
    t.secOff[SEC_BS] = H;
    t.secOff[SEC_SP] = 2 * H;
    t.secOff[SEC_SL] = 2 * H + Sp;
    t.secOff[SEC_SK] = 2 * H + 2 * Sp;
    t.secOff[SEC_SS] = 2 * H + 3 * Sp;
    t.stashCountOff = 2 * H + 4 * Sp;
    t.width = t.stashCountOff + kStashCountPad;
    t.secLen[SEC_BK] = t.secLen[SEC_BS] = H;
    for (uint32_t s = SEC_SP; s < SEC_COUNT; ++s) t.secLen[s] = Sp;
    t.nc = kPlanChunk;
    t.numChunks = (t.N + t.nc - 1) / t.nc;
    t.resChunks = (Sp + t.nc - 1) / t.nc;
    t.pendWords = t.numChunks * t.nc / 32;
    t.wsMissOff = 0;
    t.wsResKeyOff = t.numChunks * t.nc;
    t.wsResSlotOff = t.wsResKeyOff + t.resChunks * t.nc;
    t.wsPerCore = t.wsResSlotOff + t.resChunks * t.nc;
    t.blockDim = blockDim;
    t.hashA1 = kHashA1 & (H - 1);
    t.hashB1 = kHashB1 & (H - 1);
    t.hashA2 = kHashA2 & (H - 1);
    t.hashB2 = kHashB2 & (H - 1);
    t.fillChunk = std::min<uint32_t>(8192, RoundUp(std::max(Sp, H), 64));
    for (uint32_t s = 0; s < SEC_COUNT; ++s) SetWindow(t, s, CeilLog2(t.secLen[s]));
    const uint32_t streaming[] = {SEC_SK, SEC_SS, SEC_SL};
    const uint32_t random[] = {SEC_BS, SEC_BK, SEC_SP};
    while (PlanUbBytes(t) > kPlanUbBudget) {
        int pick = -1;
        for (const uint32_t* group : {streaming, random}) {
            for (int i = 0; i < 3; ++i) {
                uint32_t s = group[i];
                if (t.winLen[s] <= kPlanMinWindow) continue;
                if (pick < 0 || t.winLen[s] > t.winLen[pick]) pick = static_cast<int>(s);
            }
            if (pick >= 0) break;
        }
        TORCH_CHECK(pick >= 0, "avsg.plan: no UB plan fits ", kPlanUbBudget, " bytes for capacity=", capacity,
                    " buckets=", buckets, " T*K=", t.N);
        // a section that fitted whole gets a power-of-two window no larger than itself
        uint32_t wlog = t.winLog[pick];
        while ((1u << wlog) >= t.winLen[pick] && wlog > 0) --wlog;
        SetWindow(t, pick, wlog);
    }
    // hand leftover UB back to the streaming windows (fewer slot_life / stash window switches)
    for (bool grown = true; grown;) {
        grown = false;
        for (uint32_t s : streaming) {
            if (t.winLen[s] >= t.secLen[s]) continue;
            PlanTiling trial = t;
            SetWindow(trial, s, t.winLog[s] + 1);
            if (PlanUbBytes(trial) <= kPlanUbBudget) {
                t = trial;
                grown = true;
            }
        }
    }
    t.ubBytes = PlanUbBytes(t);
    return t;
}

uint32_t BlockDimFor(int64_t rows) {
#ifdef AVSG_CPU_EMULATION
    const int64_t cores = avsg_emu::core_count();
#else
    // blockDim must not exceed the physical AIV cores (910B3/B4: 40, 910B1/B2 and A3 dies: 48).
    auto* platform = platform_ascendc::PlatformAscendCManager::GetInstance();
    TORCH_CHECK(platform != nullptr, "avsg.plan: cannot query the Ascend platform (PlatformAscendCManager)");
    const int64_t cores = static_cast<int64_t>(platform->GetCoreNumAiv());
#endif
    return static_cast<uint32_t>(std::max<int64_t>(1, std::min<int64_t>(rows, cores)));
}

void CheckTensor(const at::Tensor& t, const char* name, at::ScalarType dtype, at::IntArrayRef shape) {
    TORCH_CHECK_TYPE(t.scalar_type() == dtype, name, ": expected dtype ", c10::toString(dtype), ", got ",
                     c10::toString(t.scalar_type()));
    TORCH_CHECK_VALUE(t.sizes() == shape, name, ": expected shape ", shape, ", got ", t.sizes());
    TORCH_CHECK_VALUE(t.is_contiguous(), name, ": expected a contiguous tensor");
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

int64_t StateWidth(int64_t capacity, int64_t buckets) {
    return 2 * buckets + 4 * static_cast<int64_t>(RoundUp(static_cast<uint32_t>(capacity), 64)) + kStashCountPad;
}

template <class F>
void RunOnCpu(const char* op, uint32_t blockDim, F&& body) {
#ifdef AVSG_CPU_EMULATION
    try {
        avsg_emu::launch(blockDim, body);
    } catch (const AscendC::EmuError& e) {
        TORCH_CHECK(false, "avsg.", op, ": AscendC kernel failed in the CPU emulation: ", e.what());
    }
#else
    TORCH_CHECK(false, "avsg.", op, ": built without the CPU emulation");
#endif
}

using PlanOut = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

PlanOut PlanImpl(bool dual, const at::Tensor& topk_pos, const at::Tensor& seq_lens, const at::Tensor& state,
                 const at::Tensor& stats, int64_t capacity, int64_t buckets, int64_t lifetime) {
    const char* op = dual ? "plan_dual_pointer" : "plan";
    TORCH_CHECK_TYPE(topk_pos.scalar_type() == at::kInt, "topk_pos: expected dtype int32, got ",
                     c10::toString(topk_pos.scalar_type()));
    TORCH_CHECK_VALUE(topk_pos.dim() == 3, "topk_pos: expected shape [R, T, K], got ", topk_pos.sizes());
    const int64_t R = topk_pos.size(0), T = topk_pos.size(1), K = topk_pos.size(2);
    TORCH_CHECK_VALUE(R >= 1 && T >= 1 && K >= 1, "topk_pos: expected non-empty [R, T, K], got ", topk_pos.sizes());
    CheckGeometry(capacity, buckets, lifetime, T * K);
    CheckTensor(topk_pos, "topk_pos", at::kInt, {R, T, K});
    CheckTensor(seq_lens, "seq_lens", at::kInt, {R});
    CheckTensor(state, "state", at::kInt, {R, StateWidth(capacity, buckets)});
    CheckTensor(stats, "stats", at::kLong, {R, 4});
    for (const at::Tensor* t : {&topk_pos, &seq_lens, &state, &stats})
        TORCH_CHECK_VALUE(t->device() == topk_pos.device(), op, ": all tensors must be on one device");

    const uint32_t blockDim = BlockDimFor(R);
    PlanTiling tiling = MakeTiling(static_cast<uint32_t>(R), static_cast<uint32_t>(T), static_cast<uint32_t>(K),
                                   static_cast<uint32_t>(capacity), static_cast<uint32_t>(buckets),
                                   static_cast<uint32_t>(lifetime), blockDim);
    auto opts = topk_pos.options().dtype(at::kInt);
    at::Tensor slots = at::empty({R, T, K}, opts);
    at::Tensor miss_pos = at::empty({R, T * K}, opts);
    at::Tensor miss_slots = at::empty({R, T * K}, opts);
    at::Tensor miss_counts = at::empty({R}, opts);
    at::Tensor workspace = at::empty({static_cast<int64_t>(blockDim) * tiling.wsPerCore}, opts);
    auto addr = [](const at::Tensor& t) { return reinterpret_cast<uint8_t*>(t.data_ptr()); };

    if (topk_pos.device().is_cpu()) {
        uint8_t* tl = reinterpret_cast<uint8_t*>(&tiling);
        RunOnCpu(op, blockDim, [&] {
#ifdef AVSG_CPU_EMULATION
            (dual ? avsg_plan_dual_pointer : avsg_plan)(addr(topk_pos), addr(seq_lens), addr(state), addr(stats),
                                                        addr(slots), addr(miss_pos), addr(miss_slots),
                                                        addr(miss_counts), addr(workspace), tl);
#endif
        });
        return {slots, miss_pos, miss_slots, miss_counts};
    }
#ifdef AVSG_WITH_NPU
    at::Tensor tilingDev = at::from_blob(&tiling, {static_cast<int64_t>(sizeof(tiling))}, at::kByte)
                               .to(topk_pos.device(), /*non_blocking=*/false, /*copy=*/true);
    void* args[10] = {topk_pos.data_ptr(), seq_lens.data_ptr(), state.data_ptr(), stats.data_ptr(),
                      slots.data_ptr(), miss_pos.data_ptr(), miss_slots.data_ptr(), miss_counts.data_ptr(),
                      workspace.data_ptr(), tilingDev.data_ptr()};
    // RunOpApi may defer the lambda (task queue): it owns the tiling and workspace until then.
    at_npu::native::OpCommand::RunOpApi(dual ? "avsg_plan_dual_pointer" : "avsg_plan",
                                        [=, keepTiling = tilingDev, keepWorkspace = workspace]() -> int {
        (void)keepTiling;
        (void)keepWorkspace;
        aclrtStream stream = c10_npu::getCurrentNPUStream().stream(false);
        if (dual)
            ACLRT_LAUNCH_KERNEL(avsg_plan_dual_pointer)(blockDim, stream, args[0], args[1], args[2], args[3],
                                                        args[4], args[5], args[6], args[7], args[8], args[9]);
        else
            ACLRT_LAUNCH_KERNEL(avsg_plan)(blockDim, stream, args[0], args[1], args[2], args[3], args[4], args[5],
                                           args[6], args[7], args[8], args[9]);
        return 0;
    });
    return {slots, miss_pos, miss_slots, miss_counts};
#else
    TORCH_CHECK(false, "avsg.", op, ": no kernel for device ", topk_pos.device());
#endif
}

PlanOut PlanCpu(const at::Tensor& topk_pos, const at::Tensor& seq_lens, at::Tensor& state, at::Tensor& stats,
                int64_t capacity, int64_t buckets, int64_t lifetime) {
    return PlanImpl(false, topk_pos, seq_lens, state, stats, capacity, buckets, lifetime);
}
PlanOut PlanDualCpu(const at::Tensor& topk_pos, const at::Tensor& seq_lens, at::Tensor& state, at::Tensor& stats,
                    int64_t capacity, int64_t buckets, int64_t lifetime) {
    return PlanImpl(true, topk_pos, seq_lens, state, stats, capacity, buckets, lifetime);
}

PlanTiling StateTiling(const at::Tensor& state, int64_t capacity, int64_t buckets, uint32_t blockDim) {
    CheckGeometry(capacity, buckets, 1, 1);
    return MakeTiling(static_cast<uint32_t>(state.size(0)), 1, 1, static_cast<uint32_t>(capacity),
                      static_cast<uint32_t>(buckets), 1, blockDim);
}

void InvalidateCpu(at::Tensor& state, const at::Tensor& valid_lens, int64_t capacity, int64_t buckets) {
    TORCH_CHECK_TYPE(state.scalar_type() == at::kInt, "state: expected dtype int32");
    TORCH_CHECK_VALUE(state.dim() == 2 && state.size(0) >= 1, "state: expected shape [R, width], got ",
                      state.sizes());
    const int64_t R = state.size(0);
    CheckGeometry(capacity, buckets, 1, 1);
    CheckTensor(state, "state", at::kInt, {R, StateWidth(capacity, buckets)});
    CheckTensor(valid_lens, "valid_lens", at::kInt, {R});
    const uint32_t blockDim = BlockDimFor(R);
    PlanTiling tiling = StateTiling(state, capacity, buckets, blockDim);
    uint8_t* tl = reinterpret_cast<uint8_t*>(&tiling);
    RunOnCpu("invalidate", blockDim, [&] {
#ifdef AVSG_CPU_EMULATION
        avsg_invalidate(reinterpret_cast<uint8_t*>(state.data_ptr()),
                        reinterpret_cast<uint8_t*>(valid_lens.data_ptr()), tl);
#endif
    });
}

void ResetCpu(at::Tensor& state, const at::Tensor& row_mask, int64_t capacity, int64_t buckets) {
    TORCH_CHECK_TYPE(state.scalar_type() == at::kInt, "state: expected dtype int32");
    TORCH_CHECK_VALUE(state.dim() == 2 && state.size(0) >= 1, "state: expected shape [R, width], got ",
                      state.sizes());
    const int64_t R = state.size(0);
    CheckGeometry(capacity, buckets, 1, 1);
    CheckTensor(state, "state", at::kInt, {R, StateWidth(capacity, buckets)});
    CheckTensor(row_mask, "row_mask", at::kBool, {R});
    const uint32_t blockDim = BlockDimFor(R);
    PlanTiling tiling = StateTiling(state, capacity, buckets, blockDim);
    uint8_t* tl = reinterpret_cast<uint8_t*>(&tiling);
    RunOnCpu("reset", blockDim, [&] {
#ifdef AVSG_CPU_EMULATION
        avsg_reset(reinterpret_cast<uint8_t*>(state.data_ptr()), reinterpret_cast<uint8_t*>(row_mask.data_ptr()),
                   tl);
#endif
    });
}

}  // namespace

// For tests and benchmarks: the UB plan chosen for a geometry.
std::vector<int64_t> PlanUbPlan(int64_t T, int64_t K, int64_t capacity, int64_t buckets) {
    CheckGeometry(capacity, buckets, 1, T * K);
    PlanTiling t = MakeTiling(1, static_cast<uint32_t>(T), static_cast<uint32_t>(K), static_cast<uint32_t>(capacity),
                              static_cast<uint32_t>(buckets), 1, 1);
    std::vector<int64_t> out{t.ubBytes, PlanFixedUbBytes(t)};
    for (uint32_t s = 0; s < SEC_COUNT; ++s) out.push_back(static_cast<int64_t>(t.winLen[s]) * 4);
    return out;
}

}  // namespace avsg

TORCH_LIBRARY_FRAGMENT(avsg, m) {
    // [total UB bytes, fixed bytes, window bytes of bucket_key, bucket_slot, slot_pos, slot_life,
    //  stash_key, stash_slot] of the plan kernels for a geometry (introspection for tests/docs).
    m.def("plan_ub_plan(int T, int K, int capacity, int buckets) -> int[]", &avsg::PlanUbPlan);
}

TORCH_LIBRARY_IMPL(avsg, CPU, m) {
    m.impl("plan", &avsg::PlanCpu);
    m.impl("plan_dual_pointer", &avsg::PlanDualCpu);
    m.impl("invalidate", &avsg::InvalidateCpu);
    m.impl("reset", &avsg::ResetCpu);
}

#ifdef AVSG_WITH_NPU
namespace avsg {
namespace {
void InvalidateNpu(at::Tensor& state, const at::Tensor& valid_lens, int64_t capacity, int64_t buckets) {
    const int64_t R = state.size(0);
    CheckGeometry(capacity, buckets, 1, 1);
    CheckTensor(state, "state", at::kInt, {R, StateWidth(capacity, buckets)});
    CheckTensor(valid_lens, "valid_lens", at::kInt, {R});
    const uint32_t blockDim = BlockDimFor(R);
    PlanTiling tiling = StateTiling(state, capacity, buckets, blockDim);
    at::Tensor tl = at::from_blob(&tiling, {static_cast<int64_t>(sizeof(tiling))}, at::kByte).to(state.device());
    void *s = state.data_ptr(), *v = valid_lens.data_ptr(), *t = tl.data_ptr();
    at_npu::native::OpCommand::RunOpApi("avsg_invalidate", [=, keepTiling = tl]() -> int {
        (void)keepTiling;
        ACLRT_LAUNCH_KERNEL(avsg_invalidate)(blockDim, c10_npu::getCurrentNPUStream().stream(false), s, v, t);
        return 0;
    });
}
void ResetNpu(at::Tensor& state, const at::Tensor& row_mask, int64_t capacity, int64_t buckets) {
    const int64_t R = state.size(0);
    CheckGeometry(capacity, buckets, 1, 1);
    CheckTensor(state, "state", at::kInt, {R, StateWidth(capacity, buckets)});
    CheckTensor(row_mask, "row_mask", at::kBool, {R});
    const uint32_t blockDim = BlockDimFor(R);
    PlanTiling tiling = StateTiling(state, capacity, buckets, blockDim);
    at::Tensor tl = at::from_blob(&tiling, {static_cast<int64_t>(sizeof(tiling))}, at::kByte).to(state.device());
    void *s = state.data_ptr(), *m = row_mask.data_ptr(), *t = tl.data_ptr();
    at_npu::native::OpCommand::RunOpApi("avsg_reset", [=, keepTiling = tl]() -> int {
        (void)keepTiling;
        ACLRT_LAUNCH_KERNEL(avsg_reset)(blockDim, c10_npu::getCurrentNPUStream().stream(false), s, m, t);
        return 0;
    });
}
}  // namespace
}  // namespace avsg

TORCH_LIBRARY_IMPL(avsg, PrivateUse1, m) {
    m.impl("plan", &avsg::PlanCpu);               // PlanImpl dispatches on the tensors' device
    m.impl("plan_dual_pointer", &avsg::PlanDualCpu);
    m.impl("invalidate", &avsg::InvalidateNpu);
    m.impl("reset", &avsg::ResetNpu);
}
#endif
