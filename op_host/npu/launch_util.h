// NPU launch helpers shared by the op host files (compiled only with AVSG_WITH_NPU).
//
// * CurrentStream(): read the caller's stream *before* OpCommand::RunOpApi, whose lambda may run
//   later on the task-queue thread, where the current stream is that thread's, not the caller's.
// * DeviceTiling(): the tiling struct in device memory without a host sync. Tilings depend only on
//   geometry and buffer addresses, so each distinct one is uploaded once (pinned staging, async
//   copy on the current stream) and kept for the process. Uploading per call would either sync
//   (pageable copy) or hand a graph replay a recycled host block; a cached device copy is
//   stream-ordered before every launch that uses it and stays valid for captured graphs.
#pragma once

#include <ATen/ATen.h>

#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "acl/acl.h"
#include "torch_npu/csrc/core/npu/NPUStream.h"

namespace avsg {
namespace npu {

inline aclrtStream CurrentStream() { return c10_npu::getCurrentNPUStream().stream(false); }

inline at::Tensor DeviceTiling(const void* bytes, size_t size, const at::Device& device) {
    static std::mutex mutex;
    static std::map<std::pair<std::string, int>, std::pair<at::Tensor, at::Tensor>> cache;
    std::string key(static_cast<const char*>(bytes), size);
    std::lock_guard<std::mutex> lock(mutex);
    auto found = cache.find({key, device.index()});
    if (found != cache.end()) return found->second.second;
    at::Tensor staging = at::empty({static_cast<int64_t>(size)}, at::TensorOptions().dtype(at::kByte)).pin_memory();
    std::memcpy(staging.data_ptr(), bytes, size);
    at::Tensor on_device = staging.to(device, at::kByte, /*non_blocking=*/true, /*copy=*/true);
    cache.emplace(std::make_pair(std::move(key), device.index()), std::make_pair(staging, on_device));
    return on_device;
}

// Launch status to RunOpApi, which reports a non-zero status as an error.
inline int LaunchStatus(uint32_t status) { return static_cast<int>(status); }

}  // namespace npu
}  // namespace avsg
