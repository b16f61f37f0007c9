// Host pool registry (aclrtHostRegister) and its torch ops; NPU backend only.
//   avsg::register_host_pool(Tensor pool) -> ()
//   avsg::unregister_host_pool(Tensor pool) -> ()
//   avsg::host_pool_registered(Tensor t) -> bool
// Python: avsg.backend.register_host_pool / unregister_host_pool / host_pool_registered.
#include "npu/host_pool.h"

#include <ATen/ATen.h>
#include <torch/library.h>

#include "acl/acl.h"
#include "torch_npu/csrc/core/npu/NPUStream.h"

namespace avsg {
namespace npu {

namespace {
constexpr uintptr_t kPageBytes = 4096;  // aclrtHostRegister: ptr must be 4 KB page aligned

int32_t current_device()
{
    int32_t device = 0;
    c10_npu::GetDevice(&device);  // also makes sure the device context exists on this thread
    return device;
}
}  // namespace

HostPoolRegistry& HostPoolRegistry::instance()
{
    // Never destroyed: unregistering from a static destructor could run after ACL finalisation.
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
    TORCH_CHECK_VALUE(p % kPageBytes == 0, "avsg.register_host_pool: the pool starts at ", ptr,
                      ", not on a 4 KB page boundary as aclrtHostRegister requires (allocate it with "
                      "avsg.backend.alloc_host_pool)");
    std::lock_guard<std::mutex> lock(mutex_);
    auto same = pools_.find(p);
    if (same != pools_.end() && same->second.bytes == bytes) return;  // registered once already
    for (const auto& kv : pools_) {
        const Pool& q = kv.second;
        TORCH_CHECK_VALUE(p + bytes <= q.host || q.host + q.bytes <= p, "avsg.register_host_pool: [", ptr, ", +",
                          bytes, ") overlaps the registered pool at ", reinterpret_cast<void*>(q.host),
                          "; unregister it first");
    }
    const int32_t device = current_device();
    void* dev = nullptr;
    aclError err = aclrtHostRegister(ptr, static_cast<uint64_t>(bytes), ACL_HOST_REGISTER_MAPPED, &dev);
    TORCH_CHECK(err == ACL_SUCCESS && dev != nullptr, "avsg.register_host_pool: aclrtHostRegister(", ptr, ", ",
                bytes, ", ACL_HOST_REGISTER_MAPPED) failed with aclError ", err,
                " (on Linux <= 5.10 the memory must be pinned, from aclrtMallocHost)");
    pools_[p] = Pool{p, bytes, reinterpret_cast<uintptr_t>(dev), device};
}

void HostPoolRegistry::unregister_pool(void* ptr)
{
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = pools_.find(reinterpret_cast<uintptr_t>(ptr));
    TORCH_CHECK_VALUE(it != pools_.end(), "avsg.unregister_host_pool: no pool registered at ", ptr);
    aclError err = aclrtHostUnregister(ptr);
    TORCH_CHECK(err == ACL_SUCCESS, "avsg.unregister_host_pool: aclrtHostUnregister(", ptr,
                ") failed with aclError ", err);
    pools_.erase(it);
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
                      "can only read host memory mapped by aclrtHostRegister");
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

}  // namespace

TORCH_LIBRARY_FRAGMENT(avsg, m)
{
    m.def("register_host_pool(Tensor pool) -> ()", &register_host_pool);
    m.def("unregister_host_pool(Tensor pool) -> ()", &unregister_host_pool);
    m.def("host_pool_registered(Tensor t) -> bool", &host_pool_registered);
}
