// Host pool registry and its torch ops; NPU backend only.
//   avsg::register_host_pool(Tensor pool) -> ()
//   avsg::unregister_host_pool(Tensor pool) -> ()
//   avsg::host_pool_registered(Tensor t) -> bool
//   avsg::alloc_host_pool(int[] shape, ScalarType dtype) -> Tensor   (aclrtMallocHost, freed by us)
//   avsg::host_register_info() -> str[]     (path chosen, why, versions: for avsg doctor)
//   avsg::release_npu_resources() -> ()     (tiling cache, split binary and pools, before NPU teardown)
// Python: avsg.backend.register_host_pool / unregister_host_pool / host_pool_registered /
// alloc_host_pool / host_register_info.
#include "npu/host_pool.h"

#include <ATen/ATen.h>
#include <torch/library.h>

#include <atomic>
#include <dlfcn.h>

#include "acl/acl.h"
#include "torch_npu/csrc/core/npu/NPUFunctions.h"  // c10_npu::GetDevice
#include "npu/launch_util.h"
#include "npu/split_launch.h"

#ifndef AVSG_NPU_SOC_VERSION
#define AVSG_NPU_SOC_VERSION "unknown"   // op_host/npu/CMakeLists.txt sets it to SOC_VERSION
#endif
// The SoC the kernels were built for. avsg.backend reads this tag from the file, without loading
// it, and refuses a library built for another SoC than the device's.
extern "C" __attribute__((used, visibility("default"))) const char avsg_npu_soc_tag[] =
    "AVSG_NPU_SOC_VERSION=" AVSG_NPU_SOC_VERSION;

namespace avsg {
namespace npu {

namespace {

// Set once the NPU resources were released at exit: later frees must not call the runtime.
std::atomic<bool> g_released{false};

int32_t current_device()
{
    int32_t device = 0;
    aclError err = c10_npu::GetDevice(&device);  // also makes sure the device context exists
    TORCH_CHECK(err == ACL_SUCCESS, "avsg: c10_npu::GetDevice failed with aclError ", err);
    return device;
}

// The driver numbers devices by logical id; the runtime by user id (ASCEND_RT_VISIBLE_DEVICES may
// remap). aclrtGetLogicDevIdByUserDevId converts where the runtime has it.
uint32_t driver_device(int32_t userDevice)
{
    using Fn = int (*)(int32_t, int32_t*);
    static Fn convert = reinterpret_cast<Fn>(DlsymLookup("libascendcl.so", "aclrtGetLogicDevIdByUserDevId"));
    int32_t logical = userDevice;
    if (convert != nullptr && convert(userDevice, &logical) != 0) logical = userDevice;
    return static_cast<uint32_t>(logical);
}

}  // namespace

HostPoolRegistry& HostPoolRegistry::instance()
{
    // Never destroyed: pools are unregistered explicitly before NPU teardown (forget_all).
    static HostPoolRegistry* registry = new HostPoolRegistry();
    return *registry;
}

const HostPoolRegistry::Pool* HostPoolRegistry::find(uintptr_t p, size_t bytes) const
{
    auto it = pools_.upper_bound(p);
    if (it == pools_.begin()) return nullptr;
    --it;
    const Pool& pool = it->second;
    if (p >= pool.host && p + bytes <= pool.host + pool.bytes) return &pool;
    return nullptr;
}

void HostPoolRegistry::register_pool(void* ptr, size_t bytes)
{
    const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
    TORCH_CHECK_VALUE(ptr != nullptr && bytes > 0, "avsg.register_host_pool: empty pool");
    TORCH_CHECK_VALUE(p % kHostPageBytes == 0, "avsg.register_host_pool: the pool starts at ", ptr,
                      ", not on a 4 KB page boundary as host registration requires (allocate it with "
                      "avsg.backend.alloc_host_pool)");
    // The mapping is page-granular: the last partial page is mapped whole either way.
    const size_t pageBytes = static_cast<size_t>(RoundUpToPage(bytes));
    std::lock_guard<std::mutex> lock(mutex_);
    auto same = pools_.find(p);
    if (same != pools_.end() && same->second.bytes == pageBytes) return;  // registered once already
    for (const auto& kv : pools_) {
        const Pool& q = kv.second;
        TORCH_CHECK_VALUE(p + pageBytes <= q.host || q.host + q.bytes <= p, "avsg.register_host_pool: [", ptr,
                          ", +", pageBytes, ") overlaps the registered pool at ", reinterpret_cast<void*>(q.host),
                          "; unregister it first");
    }
    const int32_t device = current_device();
    const uint32_t driverDevice = driver_device(device);
    HostRegisterPath used = HostRegisterPath::kNone;
    void* dev = nullptr;
    try {
        dev = HostRegisterApi::Instance().Register(ptr, pageBytes, driverDevice, &used);
    } catch (const std::runtime_error& e) {
        TORCH_CHECK(false, "avsg.register_host_pool: ", e.what());
    }
    pools_[p] = Pool{p, pageBytes, reinterpret_cast<uintptr_t>(dev), device, driverDevice, used};
}

void HostPoolRegistry::unregister_locked(const Pool& pool)
{
    int status = HostRegisterApi::Instance().Unregister(reinterpret_cast<void*>(pool.host), pool.driverDevice, pool.path);
    TORCH_CHECK(status == 0, "avsg.unregister_host_pool: ", PathName(pool.path) == std::string("aclrtHostRegister")
                ? "aclrtHostUnregister" : "halHostUnregister", "(", reinterpret_cast<void*>(pool.host),
                ") failed with status ", status);
}

void HostPoolRegistry::unregister_pool(void* ptr)
{
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = pools_.find(reinterpret_cast<uintptr_t>(ptr));
    TORCH_CHECK_VALUE(it != pools_.end(), "avsg.unregister_host_pool: no pool registered at ", ptr);
    unregister_locked(it->second);
    pools_.erase(it);
}

void HostPoolRegistry::forget_pool(void* ptr) noexcept
{
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = pools_.find(reinterpret_cast<uintptr_t>(ptr));
    if (it == pools_.end()) return;
    if (!g_released.load()) {
        try {
            unregister_locked(it->second);
        } catch (...) {  // a deleter must not throw; the mapping dies with the process
        }
    }
    pools_.erase(it);
}

void HostPoolRegistry::forget_all() noexcept
{
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& kv : pools_) {
        try {
            unregister_locked(kv.second);
        } catch (...) {
        }
    }
    pools_.clear();
}

bool HostPoolRegistry::contains(const void* ptr, size_t bytes) const
{
    std::lock_guard<std::mutex> lock(mutex_);
    return find(reinterpret_cast<uintptr_t>(ptr), bytes) != nullptr;
}

void* HostPoolRegistry::device_address(const void* ptr, size_t bytes, const char* what) const
{
    std::lock_guard<std::mutex> lock(mutex_);
    const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
    const Pool* pool = find(p, bytes);
    TORCH_CHECK_VALUE(pool != nullptr, "avsg.gather: ", what, ": the host tensor at ", ptr, " (", bytes,
                      " bytes) is not inside a pool registered with avsg.backend.register_host_pool; AI cores "
                      "can only read host memory mapped for the device");
    const int32_t device = current_device();
    TORCH_CHECK_VALUE(pool->device == device, "avsg.gather: ", what, ": the host pool was registered on NPU ",
                      pool->device, " but the gather runs on NPU ", device);
    return reinterpret_cast<void*>(pool->dev + (p - pool->host));
}

}  // namespace npu
}  // namespace avsg

namespace {

void check_pool_tensor(const at::Tensor& t, const char* api)
{
    TORCH_CHECK_VALUE(t.device().is_cpu(), api, ": expected a host (CPU) tensor, got one on ", t.device());
    TORCH_CHECK_VALUE(t.is_contiguous(), api, ": expected a contiguous tensor");
}

void register_host_pool(const at::Tensor& pool)
{
    check_pool_tensor(pool, "avsg.register_host_pool");
    avsg::npu::HostPoolRegistry::instance().register_pool(pool.data_ptr(), pool.nbytes());
}

void unregister_host_pool(const at::Tensor& pool)
{
    check_pool_tensor(pool, "avsg.unregister_host_pool");
    avsg::npu::HostPoolRegistry::instance().unregister_pool(pool.data_ptr());
}

bool host_pool_registered(const at::Tensor& t)
{
    return t.device().is_cpu() && avsg::npu::HostPoolRegistry::instance().contains(t.data_ptr(), t.nbytes());
}

// Pinned, page-aligned host memory from the runtime's own allocator, owned by the tensor: its
// deleter unregisters the pool (if it was registered) and frees it with aclrtFreeHost.
at::Tensor alloc_host_pool(at::IntArrayRef shape, at::ScalarType dtype)
{
    int64_t elements = 1;
    for (int64_t d : shape) {
        TORCH_CHECK_VALUE(d >= 0, "avsg.alloc_host_pool: shape: expected sizes >= 0, got ", shape);
        elements *= d;
    }
    const uint64_t bytes = avsg::npu::RoundUpToPage(std::max<uint64_t>(1, elements * c10::elementSize(dtype)));
    int32_t device = 0;
    c10_npu::GetDevice(&device);  // the runtime context must exist before aclrtMallocHost
    void* ptr = nullptr;
    aclError err = aclrtMallocHost(&ptr, static_cast<size_t>(bytes));
    TORCH_CHECK(err == ACL_SUCCESS && ptr != nullptr, "avsg.alloc_host_pool: aclrtMallocHost(", bytes,
                " bytes) failed with aclError ", err);
    TORCH_CHECK(reinterpret_cast<uintptr_t>(ptr) % avsg::npu::kHostPageBytes == 0, "avsg.alloc_host_pool: "
                "aclrtMallocHost returned ", ptr, ", not 4 KB aligned");
    auto deleter = [](void* p) {
        avsg::npu::HostPoolRegistry::instance().forget_pool(p);
        if (!avsg::npu::g_released.load()) aclrtFreeHost(p);  // after teardown the process owns it
    };
    return at::from_blob(ptr, shape, deleter, at::TensorOptions().dtype(dtype).device(at::kCPU));
}

std::vector<std::string> host_register_info()
{
    const auto& api = avsg::npu::HostRegisterApi::Instance();
    const auto& v = api.versions();
    return {avsg::npu::PathName(api.preferred()), api.Describe(), v.cann, v.driver,
            std::to_string(v.halApiVersion), api.HasAcl() ? "1" : "0", api.HasHal() ? "1" : "0"};
}

// Before torch_npu's own exit hook tears the NPU down: device tilings freed while the runtime is
// alive, pools unregistered; later tensor deleters then leave the memory to the process.
void release_npu_resources()
{
    avsg::npu::ReleaseDeviceTilings();
#ifdef AVSG_NPU_LAUNCH_CONFIG
    avsg::npu::ReleaseSplitBinaries();
#endif
    avsg::npu::HostPoolRegistry::instance().forget_all();
    avsg::npu::g_released = true;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(avsg, m)
{
    m.def("register_host_pool(Tensor pool) -> ()", &register_host_pool);
    m.def("unregister_host_pool(Tensor pool) -> ()", &unregister_host_pool);
    m.def("host_pool_registered(Tensor t) -> bool", &host_pool_registered);
    m.def("alloc_host_pool(int[] shape, ScalarType dtype) -> Tensor", &alloc_host_pool);
    m.def("host_register_info() -> str[]", &host_register_info);
    m.def("release_npu_resources() -> ()", &release_npu_resources);
}
