// state_host.h: what the host files of the state ops (plan_host.cpp, plan_gather_host.cpp,
// invalidate_host.cpp, reset_host.cpp, resize_host.cpp) share: the input checks (tensors, geometry, policy, the state's
// header), the PlanTiling every state kernel reads (geometry, section offsets, workspace, UB plan:
// plan_ub_layout.h) and the block counts. Defined in state_host.cpp, compiled into the CPU library
// and the NPU library alike.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <optional>
#include <tuple>

#include "plan_tiling.h"
#include "plan_ub_layout.h"

namespace avsg {

// Host-side value checks of the CPU backend (state headers here, the plan's indices in gather):
// on by default; tests switch them off to drive the kernels' own clamping and header checks, which
// are all an NPU has (reading values there would cost a host sync).
bool HostValueChecks();

// Geometry, section offsets, workspace and the UB plan of a plan (or state op) launch.
PlanTiling MakeTiling(uint32_t rows, uint32_t selections, uint32_t capacity, uint32_t buckets, uint32_t lifetime,
                      uint32_t policy, uint32_t maxContext);
// The tiling of an op over whole state rows (invalidate, reset): one selection per row.
PlanTiling StateTiling(int64_t rows, int64_t capacity, int64_t buckets, int64_t lifetime, int64_t policy,
                       int64_t max_context);
int64_t CoreCount();
uint32_t BlockDimFor(int64_t rows);
// The hash plan's split lookup over idle cores (AVSG_NPU_SPLIT=1 only).
void ApplySplit(PlanTiling& t, int64_t rows);

void CheckTensor(const at::Tensor& t, const char* name, at::ScalarType dtype, at::IntArrayRef shape);
void CheckPolicy(int64_t policy, int64_t max_context);
void CheckGeometry(int64_t capacity, int64_t buckets, int64_t lifetime, int64_t selections);
int64_t StateWidth(int64_t capacity, int64_t buckets, bool reuse);
void CheckStateForPolicy(const at::Tensor& state, int64_t R, int64_t capacity, int64_t buckets, int64_t policy);
// lifetime, policy, min_active < 0: not checked. CPU state only (see the definition).
void CheckHeader(const at::Tensor& state, int64_t capacity, int64_t buckets, int64_t max_context, int64_t lifetime,
                 int64_t policy, int64_t min_active);
// The state tensor and one per-row companion (valid_lens, row_mask): dtype, shape, device; returns R.
// reuse_expected -1: the policy sections are read off the state's width (reuse_out says which).
int64_t CheckStateArgs(const char* op, const at::Tensor& state, const at::Tensor& per_row, const char* per_row_name,
                       at::ScalarType per_row_dtype, int64_t capacity, int64_t buckets, int64_t max_context,
                       int reuse_expected, bool* reuse_out = nullptr);

// A plan launch's pieces (plan_host.cpp), for plan and for plan_gather, which launches the same
// plan composed with its gather. CheckPlan: every check of a plan call (tensors, geometry, policy,
// the state's header), before anything runs, and its tiling (split: the hash plan may split its
// lookup, ApplySplit). PlanBlocks: the blocks the plan itself needs.
using PlanOut = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;
PlanTiling CheckPlan(const char* op, bool split, const at::Tensor& topk_pos, const at::Tensor& seq_lens,
                     const at::Tensor& state, const at::Tensor& stats, int64_t capacity, int64_t buckets,
                     int64_t lifetime, int64_t policy, int64_t max_context, const std::optional<at::Tensor>& valid_lens);
uint32_t PlanBlocks(const PlanTiling& tiling);
// The outputs as the kernel writes them: rows padded to 32 B (tiling.outPitch), miss_counts at a
// pitch of kPlanCountPitch; PlanViews: what the op returns (views of the first T*K columns).
struct PlanRows {
    at::Tensor slots, miss_pos, miss_slots, miss_counts;
};
PlanRows AllocPlanRows(const at::Tensor& topk_pos, const PlanTiling& tiling);
PlanOut PlanViews(const PlanRows& rows, int64_t T, int64_t K);
// int32 scratch of `words` (its sync counters, if any, zeroed by the caller).
at::Tensor PlanWorkspace(int64_t words, const at::TensorOptions& opts);

}  // namespace avsg
