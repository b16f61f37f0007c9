// The plan kernel's split lookup on the NPU: when it runs, and how it is launched.
//
// Why a launch of its own. A split plan (tiling.split > 1) is the only kernel here that waits
// across cores (a soft SyncAll, op_kernel/plan/plan_block_split.h). SyncAll has no timeout, and
// when other streams hold some of the cores a kernel whose blocks started on the free cores waits
// for blocks that cannot start: a deadlock (the SyncAll page of asc-devkit's docs). The runtime's
// batch schedule mode (launch attribute ACL_RT_LAUNCH_KERNEL_ATTR_SCHEM_MODE = 1) starts a kernel
// only when all of its numBlocks cores are free, and ACL_RT_LAUNCH_KERNEL_ATTR_TIMEOUT bounds how
// long the task scheduler waits for it. ACLRT_LAUNCH_KERNEL (the stub ascendc_library generates)
// takes no launch attributes: it calls aclrtLaunchKernelWithHostArgs with no config on a function
// handle it keeps to itself. So a split plan is launched from a kernel binary of its own
// (ascendc_fatbin_library over op_kernel/plan.cpp, copied next to _npu_ops.so as
// kPlanSplitBinary), loaded with aclrtBinaryLoadFromFile (SplitBinaryLoadOptions), its entry
// found by name with aclrtBinaryGetFunction, and launched with aclrtLaunchKernelWithHostArgs and
// a config holding both attributes (SplitLaunchConfig). The arguments are passed as the
// generated stub passes them: one packed struct of the entry's parameters in order
// (PlanSplitArgs). None of this has run on an NPU (docs/npu.md, "Split plan launch").
//
// The build decides how (op_host/npu/CMakeLists.txt, avsg_check_launch_config in
// avsg_build.cmake): AVSG_NPU_LAUNCH_CONFIG is defined when CANN's acl_rt.h declares that API and
// ascendc_fatbin_library produced the binary; without it a split plan goes through
// ACLRT_LAUNCH_KERNEL like every other launch. Whether is the same in every build: the split is
// off unless AVSG_NPU_SPLIT=1, which `avsg doctor` recommends once a split plan matched the
// reference in a child process it kills after a time limit. Batch mode, the timeout's semantics
// and what a timed-out launch leaves behind are unverified on a card, so they bound the wait of a
// split that was turned on; they do not turn it on. Non-split launches always go through
// ACLRT_LAUNCH_KERNEL.
//
// The first half of this header is plain C++ (no CANN): the environment switches, unit-tested on
// CPU (tests/npu/test_split_launch.py). The second half needs CANN's acl_rt.h.
#pragma once

#include <cstdint>
#include <string>

namespace avsg {
namespace npu {

constexpr const char* kSplitEnv = "AVSG_NPU_SPLIT";                  // 0 | 1 (unset: 0)
constexpr const char* kSplitTimeoutEnv = "AVSG_NPU_SPLIT_TIMEOUT";   // seconds, 0..65535 (0: no limit)
// A split plan runs in well under a second; 30 s bounds a launch that cannot finish without
// cutting into one that waits for busy cores (batch mode waits until all of them are free).
constexpr uint16_t kDefaultSplitTimeoutSeconds = 30;
constexpr const char* kPlanSplitBinary = "avsg_plan_split.o";       // next to _npu_ops.so
constexpr const char* kPlanSplitEntry = "avsg_plan";
// plan_gather (op_kernel/plan_gather.cpp) waits across cores on every launch (one SyncAll between
// the plan and the copy): the same config launch, from a kernel binary of its own.
constexpr const char* kPlanGatherBinary = "avsg_plan_gather_sync.o";   // next to _npu_ops.so
constexpr const char* kPlanGatherEntry = "avsg_plan_gather";

// Whether plan may split its lookup, from AVSG_NPU_SPLIT (text may be null: unset, off). Returns
// an error message naming the variable for any value but "0" and "1"; `on` is set only on success.
inline std::string ParseSplitSwitch(const char* text, bool& on)
{
    if (text == nullptr || *text == '\0') {
        on = false;
        return "";
    }
    const std::string v(text);
    if (v == "0" || v == "1") {
        on = v == "1";
        return "";
    }
    return std::string(kSplitEnv) + ": expected 0 (plan never splits its lookup) or 1 (it may), got '" + v + "'";
}

// The split launch's timeout in seconds, from AVSG_NPU_SPLIT_TIMEOUT (text may be null: unset,
// the default). 0 disables the limit (the runtime then waits for ever). Returns an error message
// naming the variable and the range for anything but a decimal integer in 0..65535.
inline std::string ParseSplitTimeout(const char* text, uint16_t& seconds)
{
    if (text == nullptr || *text == '\0') {
        seconds = kDefaultSplitTimeoutSeconds;
        return "";
    }
    const std::string v(text);
    long value = 0;
    bool ok = true;
    for (char c : v) {
        ok = ok && c >= '0' && c <= '9' && value <= 65535;   // stops growing once out of range
        if (ok) value = value * 10 + (c - '0');
    }
    if (!ok || value > 65535) {
        return std::string(kSplitTimeoutEnv) + ": expected whole seconds in 0..65535 (0: no limit; default " +
               std::to_string(kDefaultSplitTimeoutSeconds) + "), got '" + v + "'";
    }
    seconds = static_cast<uint16_t>(value);
    return "";
}

}  // namespace npu
}  // namespace avsg

#ifdef AVSG_NPU_LAUNCH_CONFIG
#include "acl/acl_rt.h"

namespace avsg {
namespace npu {

// The launch config of a split plan: batch schedule mode and the timeout. attrs_ lives inside the
// object the config points to, so it is built in place and never copied.
class SplitLaunchConfig {
public:
    explicit SplitLaunchConfig(uint16_t timeoutSeconds)
    {
        attrs_[0] = aclrtLaunchKernelAttr{};
        attrs_[0].id = ACL_RT_LAUNCH_KERNEL_ATTR_SCHEM_MODE;
        attrs_[0].value.schemMode = kBatchScheduleMode;
        attrs_[1] = aclrtLaunchKernelAttr{};
        attrs_[1].id = ACL_RT_LAUNCH_KERNEL_ATTR_TIMEOUT;
        attrs_[1].value.timeout = timeoutSeconds;
        cfg_.attrs = attrs_;
        cfg_.numAttrs = 2;
    }
    SplitLaunchConfig(const SplitLaunchConfig&) = delete;
    SplitLaunchConfig& operator=(const SplitLaunchConfig&) = delete;

    aclrtLaunchKernelCfg* get() { return &cfg_; }

    static constexpr uint8_t kBatchScheduleMode = 1;   // start only when all numBlocks cores are free

private:
    aclrtLaunchKernelAttr attrs_[2];
    aclrtLaunchKernelCfg cfg_{};
};

// How the split binary is loaded: as the ascendc_library stub loads the AIV half of a kernel
// library (its RegisterAscendBinary for an AIV-only entry: ACL_RT_BINARY_LOAD_OPT_MAGIC =
// ACL_RT_BINARY_MAGIC_ELF_VECTOR_CORE). Every entry of plan.cpp is KERNEL_TYPE_AIV_ONLY, so the
// binary holds vector-core code only. Built in place, like SplitLaunchConfig.
class SplitBinaryLoadOptions {
public:
    SplitBinaryLoadOptions()
    {
        option_ = aclrtBinaryLoadOption{};
        option_.type = ACL_RT_BINARY_LOAD_OPT_MAGIC;
        option_.value.magic = ACL_RT_BINARY_MAGIC_ELF_VECTOR_CORE;
        options_.options = &option_;
        options_.numOpt = 1;
    }
    SplitBinaryLoadOptions(const SplitBinaryLoadOptions&) = delete;
    SplitBinaryLoadOptions& operator=(const SplitBinaryLoadOptions&) = delete;

    aclrtBinaryLoadOptions* get() { return &options_; }

private:
    aclrtBinaryLoadOption option_;
    aclrtBinaryLoadOptions options_{};
};

// avsg_plan's parameters in entry order (op_kernel/plan.cpp), each a device address: the
// argument block aclrtLaunchKernelWithHostArgs copies to the device, laid out as the
// ascendc_library stub lays out its own (a struct of the parameters; no dump pointer, the split
// binary is built with ASCENDC_DUMP=0).
struct PlanSplitArgs {
    void* topk;
    void* seq;
    void* validLens;
    void* state;
    void* stats;
    void* slots;
    void* missPos;
    void* missSlots;
    void* missCounts;
    void* workspace;
    void* tiling;
};
static_assert(sizeof(PlanSplitArgs) == 11 * sizeof(void*), "PlanSplitArgs: packed, one pointer per parameter");

// avsg_plan_gather's parameters in entry order (op_kernel/plan_gather.cpp), as PlanSplitArgs.
struct PlanGatherArgs {
    void* topk;
    void* seq;
    void* validLens;
    void* state;
    void* stats;
    void* slots;
    void* missPos;
    void* missSlots;
    void* missCounts;
    void* workspace;
    void* blockTable;
    void* countOut;
    void* sync;
    void* tiling;
};
static_assert(sizeof(PlanGatherArgs) == 14 * sizeof(void*), "PlanGatherArgs: packed, one pointer per parameter");

// avsg_plan's function handle in the split binary on the current device, loaded on first use.
// Raises (c10::Error) naming the file and the failing call when the binary cannot be loaded.
aclrtFuncHandle PlanSplitFunction();
// avsg_plan_gather's, in kPlanGatherBinary, likewise.
aclrtFuncHandle PlanGatherFunction();
// A config-launched binary's path: `binary` in the directory of _npu_ops.so.
std::string SyncBinaryPath(const char* binary);
inline std::string PlanSplitBinaryPath() { return SyncBinaryPath(kPlanSplitBinary); }
// Unloads the config-launched binaries from every device (before NPU teardown at exit); never raises.
void ReleaseSplitBinaries() noexcept;

}  // namespace npu
}  // namespace avsg
#endif  // AVSG_NPU_LAUNCH_CONFIG
