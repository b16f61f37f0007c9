// Registry of host KV pools mapped into the NPU address space (NPU backend only).
//
// An AI core reads host memory only through the device address aclrtHostRegister returns for it
// (ACL_HOST_REGISTER_MAPPED; card §1 "Mapped host memory", §8.14): a raw host pointer faults.
// The registry registers each pool once (4 KB-aligned pointer, as the runtime requires), caches
// the device address, and translates any host tensor inside a registered pool (the pool itself
// or a view of it) to the matching device address for the kernel's tiling. The mapped address is
// only ever read by MTE2 DMA in the gather kernel; it must not be used with aclrtMemcpy.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>

namespace avsg {
namespace npu {

class HostPoolRegistry {
public:
    static HostPoolRegistry& instance();

    // Registers [ptr, ptr + bytes) on the current device; a no-op when exactly this range is
    // registered already. Raises (c10::Error) on misalignment, overlap or a runtime error.
    void register_pool(void* ptr, size_t bytes);
    // aclrtHostUnregister of the pool starting at ptr; raises when it is not registered.
    void unregister_pool(void* ptr);
    // True when [ptr, ptr + bytes) lies inside one registered pool.
    bool contains(const void* ptr, size_t bytes) const;
    // Device address of host address ptr, whose [ptr, ptr + bytes) must lie inside one registered
    // pool of the current device; raises naming `what` otherwise.
    void* device_address(const void* ptr, size_t bytes, const char* what) const;

private:
    struct Pool {
        uintptr_t host;
        size_t bytes;
        uintptr_t dev;
        int32_t device;
    };
    const Pool* find(uintptr_t p, size_t bytes) const;
    mutable std::mutex mutex_;
    std::map<uintptr_t, Pool> pools_;  // by host start address
};

}  // namespace npu
}  // namespace avsg
