// NPU launch helpers shared by the op host files (compiled only with AVSG_WITH_NPU).
//
// * CurrentStream(): read the caller's stream *before* OpCommand::RunOpApi, whose lambda may run
//   later on the task-queue thread, where the current stream is that thread's, not the caller's.
// * DeviceTiling(): the tiling struct in device memory without a host sync. Each distinct tiling
//   is uploaded once (pinned staging, async copy on the current stream) and kept in a bounded
//   cache: tilings hold raw tensor addresses, so a long-running server would otherwise see one
//   new entry per new buffer for ever. Uploading per call would either sync (pageable copy) or
//   hand a graph replay a recycled host block. An entry is stream-ordered before every launch that
//   uses it, and record_stream keeps an evicted entry's block from being reused before the
//   launches already queued on that stream have run. A captured graph must be replayed while its
//   tilings are cached (at most kMaxDeviceTilings distinct ones since capture).
// * ReleaseDeviceTilings(): empties the cache. Called by avsg.backend at exit, before torch_npu
//   tears the NPU down; a static destructor would free device memory after that.
#pragma once

#include <ATen/ATen.h>

#include <cstring>
#include <list>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "acl/acl.h"
#include "torch_npu/csrc/core/npu/NPUStream.h"

namespace avsg {
namespace npu {

inline aclrtStream CurrentStream() { return c10_npu::getCurrentNPUStream().stream(false); }

// Distinct tilings kept on the device (a few hundred bytes each).
constexpr size_t kMaxDeviceTilings = 256;

class DeviceTilingCache {
public:
    static DeviceTilingCache& Instance()
    {
        // Never destroyed: entries are device memory, released explicitly before NPU teardown.
        static DeviceTilingCache* cache = new DeviceTilingCache();
        return *cache;
    }

    at::Tensor Get(const void* bytes, size_t size, const at::Device& device)
    {
        std::lock_guard<std::mutex> lock(mutex_);
        Key key{std::string(static_cast<const char*>(bytes), size), device.index()};
        auto found = index_.find(key);
        if (found != index_.end()) {
            lru_.splice(lru_.begin(), lru_, found->second);  // most recently used first
            return found->second->onDevice;
        }
        at::Tensor staging = at::empty({static_cast<int64_t>(size)}, at::TensorOptions().dtype(at::kByte)).pin_memory();
        std::memcpy(staging.data_ptr(), bytes, size);
        at::Tensor onDevice = staging.to(device, at::kByte, /*non_blocking=*/true, /*copy=*/true);
        lru_.push_front(Entry{key, staging, onDevice});
        index_[key] = lru_.begin();
        while (lru_.size() > kMaxDeviceTilings) {
            Entry& old = lru_.back();
            // Launches already queued may still read it: reuse waits for the current stream.
            old.onDevice.record_stream(c10_npu::getCurrentNPUStream().unwrap());
            index_.erase(old.key);
            lru_.pop_back();
        }
        return onDevice;
    }

    void Release()
    {
        std::lock_guard<std::mutex> lock(mutex_);
        index_.clear();
        lru_.clear();
    }

    size_t Size() const
    {
        std::lock_guard<std::mutex> lock(mutex_);
        return lru_.size();
    }

private:
    using Key = std::pair<std::string, int>;
    struct Entry {
        Key key;
        at::Tensor staging, onDevice;
    };
    mutable std::mutex mutex_;
    std::list<Entry> lru_;
    std::map<Key, std::list<Entry>::iterator> index_;
};

inline at::Tensor DeviceTiling(const void* bytes, size_t size, const at::Device& device)
{
    return DeviceTilingCache::Instance().Get(bytes, size, device);
}

inline void ReleaseDeviceTilings() { DeviceTilingCache::Instance().Release(); }

// Launch status to RunOpApi, which reports a non-zero status as an error.
inline int LaunchStatus(uint32_t status) { return static_cast<int>(status); }

}  // namespace npu
}  // namespace avsg
