// Registry of host KV pools mapped into the NPU address space (NPU backend only).
//
// An AI core reads host memory only through a device address the runtime (aclrtHostRegister,
// ACL_HOST_REGISTER_MAPPED) or the driver (halHostRegister) maps it to (card §1 "Mapped host
// memory", §8.14): a raw host pointer faults. Which call is used is decided at run time
// (npu/host_register.h), so the library loads on stacks that lack either. The registry registers
// each pool once (4 KB-aligned pointer, size rounded up to whole 4 KB pages: the runtime maps
// pages), caches the device address, and translates any host tensor inside a registered pool
// (the pool itself or a view of it) to the matching device address for the kernel's tiling. The
// mapped address is only ever read by MTE2 DMA in the gather kernel; it must not be used with
// aclrtMemcpy.
//
// Pools from avsg.backend.alloc_host_pool come from the runtime's host allocator
// (aclrtMallocHost) and are freed by their tensor's deleter, which unregisters them first: no
// caching allocator can hand the block to someone else while it is still mapped.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "npu/host_register.h"

namespace avsg {
namespace npu {

class HostPoolRegistry {
public:
    static HostPoolRegistry& instance();

    // Registers [ptr, ptr + roundup(bytes, 4 KB)) on the current device; a no-op when exactly this
    // range is registered already. Raises (c10::Error) on misalignment, overlap, or when no
    // host-register call works (naming the CANN and driver versions).
    void register_pool(void* ptr, size_t bytes);
    // Unregisters the pool starting at ptr; raises when it is not registered.
    void unregister_pool(void* ptr);
    // Unregisters the pool starting at ptr if there is one (tensor deleters, exit); never raises.
    void forget_pool(void* ptr) noexcept;
    // Unregisters every pool (before NPU teardown at exit); never raises.
    void forget_all() noexcept;
    // True when [ptr, ptr + bytes) lies inside one registered pool.
    bool contains(const void* ptr, size_t bytes) const;
    // Device address of host address ptr, whose [ptr, ptr + bytes) must lie inside one registered
    // pool of the current device; raises naming `what` otherwise.
    void* device_address(const void* ptr, size_t bytes, const char* what) const;

private:
    struct Pool {
        uintptr_t host;
        size_t bytes;       // registered bytes (whole 4 KB pages)
        uintptr_t dev;
        int32_t device;
        uint32_t driverDevice;
        HostRegisterPath path;
    };
    const Pool* find(uintptr_t p, size_t bytes) const;
    void unregister_locked(const Pool& pool) noexcept(false);
    mutable std::mutex mutex_;
    std::map<uintptr_t, Pool> pools_;  // by host start address
};

}  // namespace npu
}  // namespace avsg
