// The split plan's kernel binary (npu/split_launch.h): found next to _npu_ops.so, loaded once per
// device, unloaded at exit. And the tag naming how this build launches a split plan, which
// avsg.backend reads from the file (avsg doctor and backend_info print it).
#include "npu/split_launch.h"

#ifndef AVSG_NPU_SPLIT_LAUNCH
// op_host/npu/CMakeLists.txt sets it: "batch" or "stub: <why the config launch is not built>"
#define AVSG_NPU_SPLIT_LAUNCH "stub: built without op_host/npu/CMakeLists.txt"
#endif
extern "C" __attribute__((used, visibility("default"))) const char avsg_npu_split_launch_tag[] =
    "AVSG_NPU_SPLIT_LAUNCH=" AVSG_NPU_SPLIT_LAUNCH;

#ifdef AVSG_NPU_LAUNCH_CONFIG
#include <c10/util/Exception.h>
#include <dlfcn.h>

#include <map>
#include <mutex>
#include <utility>

#include "torch_npu/csrc/core/npu/NPUFunctions.h"  // c10_npu::GetDevice

namespace avsg {
namespace npu {

namespace {

struct LoadedBinary {
    aclrtBinHandle binary = nullptr;
    aclrtFuncHandle function = nullptr;
};

std::mutex g_mutex;
// by (device, binary file name)
std::map<std::pair<int32_t, std::string>, LoadedBinary>& Loaded()
{
    // Never destroyed: the handles belong to the runtime, released explicitly before teardown.
    static auto* loaded = new std::map<std::pair<int32_t, std::string>, LoadedBinary>();
    return *loaded;
}

// `entry`'s function handle in `binary` (next to _npu_ops.so) on the current device, loaded on
// first use; `op` and `off` name the op and how to do without it in the errors.
aclrtFuncHandle SyncFunction(const char* binary, const char* entry, const char* op, const char* off)
{
    int32_t device = 0;
    const aclError devErr = c10_npu::GetDevice(&device);   // also makes sure the device context exists
    TORCH_CHECK(devErr == ACL_SUCCESS, "avsg.", op, ": c10_npu::GetDevice failed with aclError ", devErr);
    std::lock_guard<std::mutex> lock(g_mutex);
    const auto key = std::make_pair(device, std::string(binary));
    auto found = Loaded().find(key);
    if (found != Loaded().end()) return found->second.function;
    const std::string path = SyncBinaryPath(binary);
    LoadedBinary loaded;
    SplitBinaryLoadOptions options;
    const aclError loadErr = aclrtBinaryLoadFromFile(path.c_str(), options.get(), &loaded.binary);
    TORCH_CHECK(loadErr == ACL_SUCCESS && loaded.binary != nullptr, "avsg.", op, ": the kernel binary ", path,
                " did not load on device ", device, " (aclrtBinaryLoadFromFile returned aclError ", loadErr, ")",
                off);
    const aclError getErr = aclrtBinaryGetFunction(loaded.binary, entry, &loaded.function);
    if (getErr != ACL_SUCCESS || loaded.function == nullptr) {
        (void)aclrtBinaryUnLoad(loaded.binary);
        TORCH_CHECK(false, "avsg.", op, ": ", path, " has no kernel entry ", entry,
                    " (aclrtBinaryGetFunction returned aclError ", getErr, ")", off);
    }
    Loaded().emplace(key, loaded);
    return loaded.function;
}

}  // namespace

std::string SyncBinaryPath(const char* binary)
{
    Dl_info info{};
    TORCH_CHECK(dladdr(reinterpret_cast<const void*>(&avsg_npu_split_launch_tag), &info) != 0 &&
                    info.dli_fname != nullptr,
                "avsg: cannot find the file of the NPU op library (dladdr) to locate ", binary);
    std::string dir(info.dli_fname);
    const auto slash = dir.rfind('/');
    dir = slash == std::string::npos ? "." : dir.substr(0, slash);
    return dir + "/" + binary;
}

aclrtFuncHandle PlanSplitFunction()
{
    return SyncFunction(kPlanSplitBinary, kPlanSplitEntry, "plan",
                        "; AVSG_NPU_SPLIT=0 runs plan without the split lookup");
}

aclrtFuncHandle PlanGatherFunction()
{
    return SyncFunction(kPlanGatherBinary, kPlanGatherEntry, "plan_gather", "; plan then gather launch them apart");
}

void ReleaseSplitBinaries() noexcept
{
    std::lock_guard<std::mutex> lock(g_mutex);
    for (auto& entry : Loaded()) (void)aclrtBinaryUnLoad(entry.second.binary);
    Loaded().clear();
}

}  // namespace npu
}  // namespace avsg
#endif  // AVSG_NPU_LAUNCH_CONFIG
