// NPU launch helpers shared by the op host files (compiled only with AVSG_WITH_NPU).
//
// * CurrentStream(): read the caller's stream *before* OpCommand::RunOpApi, whose lambda may run
//   later on the task-queue thread, where the current stream is that thread's, not the caller's.
// * DeviceTiling(): the tiling struct in device memory without a host sync. Each distinct tiling
//   is uploaded once (pinned staging, async copy on the current stream) and kept in a bounded
//   cache: tilings hold raw tensor addresses, so a long-running server would otherwise see one
//   new entry per new buffer for ever. Uploading per call would either sync (pageable copy) or
//   hand a graph replay a recycled host block. The cache is shared by every stream (two managers
//   on two streams hit the same entry when their geometry and buffers match), so its ordering is
//   per stream, see DeviceTilingCache. A captured graph must be replayed while its tilings are
//   cached (at most kMaxDeviceTilings distinct ones since capture).
// * ReleaseDeviceTilings(): empties the cache. Called by avsg.backend at exit, before torch_npu
//   tears the NPU down; a static destructor would free device memory after that.
#pragma once

#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>

#include <cstring>
#include <list>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "acl/acl.h"
#include "torch_npu/csrc/core/npu/NPUStream.h"

namespace avsg {
namespace npu {

inline aclrtStream CurrentStream() { return c10_npu::getCurrentNPUStream().stream(false); }

// Distinct tilings kept on the device (a few hundred bytes each).
constexpr size_t kMaxDeviceTilings = 256;

// The device tiling cache, ordered for every stream that uses an entry.
//
// An entry is uploaded on the stream current at its first Get (stream A): a non-blocking H2D copy
// queued on A, so only launches queued on A after it are ordered after the copy. Right after the
// copy an event is recorded on A. Each other stream that gets the entry (stream B) waits on that
// event once, at its first Get, before the launch it is fetched for: without the wait a launch on
// B could read the tiling before the copy on A has landed, i.e. run on garbage geometry. Later
// Gets on a stream that already used the entry need nothing (stream order).
//
// Eviction: the entry's device block came from torch_npu's caching allocator on stream A, so its
// reuse is ordered after A only. Launches queued on B may still read it, so eviction calls
// record_stream for every stream that used the entry (A included: harmless, caching allocators
// skip the allocation stream): the allocator then records an event on each of them when the
// block is freed and reuses it only after all of them completed. The evicting caller's stream
// alone is not enough: a manager on B may evict an entry that A's queued launches still read,
// and vice versa.
//
// APIs, as torch_npu implements them (Ascend/pytorch, read in the code index):
// * c10::Event(c10::DeviceType::PrivateUse1): record(stream) and block(stream) dispatch to
//   torch_npu's NPUGuardImpl::record / ::block (torch_npu/csrc/core/npu/impl/NPUGuardImpl.cpp),
//   which create the event lazily with aclrtCreateEventWithFlag and queue aclrtRecordEvent /
//   aclrtStreamWaitEvent through c10_npu::queue::LaunchRecordEventTask / LaunchWaitEventTask
//   (torch_npu/csrc/core/npu/interface/AsyncTaskQueueInterface.cpp): in task-queue order with the
//   H2D copy (copy_between_host_and_device -> LaunchAsyncCopyTask on the current stream,
//   torch_npu/csrc/aten/common/CopyKernel.cpp) and with the kernel launches (OpCommand::RunOpApi).
//   A raw aclrtRecordEvent from this thread could reach the runtime before the still-queued copy.
//   NPUGuardImpl::block also waits, with per-stream task queues, until the record has left its
//   queue; c10_npu::NPUEvent::block does not (torch_npu/csrc/core/npu/NPUEvent.cpp), hence
//   c10::Event. The event is destroyed lazily (destroyEvent -> LaunchLazyDestroyEventTask).
// * at::Tensor::record_stream(c10::Stream): torch_npu's NPUNativeFunctions::record_stream ->
//   c10_npu::NPUCachingAllocator::recordStream, whose insert_events queues one event per recorded
//   stream (NpuAllocatorLaunchRecordEventTask) when the block is freed
//   (torch_npu/csrc/core/npu/NPUCachingAllocator.cpp).
//
// Not settled without an NPU: a stream's first Get of an entry inside a graph capture captures a
// wait on an event recorded outside it. Run each stream's ops once before capturing.
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
        // The stream the caller's launch goes to: op hosts read CurrentStream() on this thread too.
        const c10::Stream stream = c10_npu::getCurrentNPUStream(device.index()).unwrap();
        std::lock_guard<std::mutex> lock(mutex_);
        Key key{std::string(static_cast<const char*>(bytes), size), device.index()};
        auto found = index_.find(key);
        if (found != index_.end()) {
            lru_.splice(lru_.begin(), lru_, found->second);  // most recently used first
            Entry& entry = *found->second;
            if (!entry.UsedOn(stream)) {
                entry.uploaded.block(stream);  // first use here: wait for the upload on its stream
                entry.users.push_back(stream);
            }
            return entry.onDevice;
        }
        at::Tensor staging = at::empty({static_cast<int64_t>(size)}, at::TensorOptions().dtype(at::kByte)).pin_memory();
        std::memcpy(staging.data_ptr(), bytes, size);
        at::Tensor onDevice = staging.to(device, at::kByte, /*non_blocking=*/true, /*copy=*/true);
        lru_.emplace_front(key, staging, onDevice, stream);
        lru_.front().uploaded.record(stream);  // after the copy, on the stream it was queued on
        index_[key] = lru_.begin();
        while (lru_.size() > kMaxDeviceTilings) {
            Entry& old = lru_.back();
            // Launches queued on any stream that used it may still read it.
            for (const c10::Stream& user : old.users) old.onDevice.record_stream(user);
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
        Entry(Key k, at::Tensor host, at::Tensor dev, c10::Stream uploadStream)
            : key(std::move(k)), staging(std::move(host)), onDevice(std::move(dev)),
              uploaded(c10::DeviceType::PrivateUse1), users{uploadStream}
        {
        }
        bool UsedOn(const c10::Stream& stream) const
        {
            for (const c10::Stream& s : users)
                if (s == stream) return true;
            return false;
        }
        Key key;
        at::Tensor staging, onDevice;
        c10::Event uploaded;              // recorded on users[0] right after the H2D copy
        std::vector<c10::Stream> users;   // streams that got this entry, the upload stream first
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
