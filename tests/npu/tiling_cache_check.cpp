// Driven by tests/npu/test_tiling_cache_order.py: op_host/npu/launch_util.h's DeviceTilingCache,
// compiled as the NPU library compiles it (AVSG_WITH_NPU, the stand-ins of tests/npu/npu_stubs)
// and linked against libtorch (CPU), with stand-ins that record the ordering calls instead of
// making them:
//   * torch_npu's current stream: c10_npu::getCurrentNPUStream returns the stream the driver set
//     (fake NPU streams: c10::Stream of device type PrivateUse1, ids 1 = "A", 2 = "B");
//   * torch_npu's NPUGuardImpl (what c10::Event dispatches to on PrivateUse1): a guard
//     implementation registered for PrivateUse1 that logs record / block / destroy;
//   * torch_npu's record_stream and pinned memory: aten::record_stream, is_pinned and _pin_memory
//     kernels for CPU tensors (the driver's "device" is the CPU, so the upload is a plain copy).
// Every call prints one line; "== name" lines separate the steps. The test reads the log.
#include <ATen/ATen.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/library.h>

#include <cstdio>
#include <map>

#include "npu/launch_util.h"

namespace {

c10::Stream FakeStream(c10::StreamId id)
{
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(c10::DeviceType::PrivateUse1, 0), id);
}
c10::Stream g_current = FakeStream(1);
const char* Name(const c10::Stream& s) { return s.id() == 1 ? "A" : s.id() == 2 ? "B" : "?"; }

// Events are numbered in order of creation; tensors by their data pointer, as the driver names them.
std::map<void*, int> g_event_ids;
std::map<const void*, std::string> g_tensor_names;
int g_next_event = 1;

struct RecordingGuardImpl final : public c10::impl::DeviceGuardImplInterface {
    c10::DeviceType type() const override { return c10::DeviceType::PrivateUse1; }
    c10::Device exchangeDevice(c10::Device d) const override { return d; }
    c10::Device getDevice() const override { return c10::Device(c10::DeviceType::PrivateUse1, 0); }
    void setDevice(c10::Device) const override {}
    void uncheckedSetDevice(c10::Device) const noexcept override {}
    c10::Stream getStream(c10::Device) const noexcept override { return g_current; }
    c10::Stream exchangeStream(c10::Stream s) const noexcept override
    {
        c10::Stream old = g_current;
        g_current = s;
        return old;
    }
    c10::DeviceIndex deviceCount() const noexcept override { return 1; }
    // NPUGuardImpl::record: creates the event lazily, then queues aclrtRecordEvent on the stream.
    void record(void** event, const c10::Stream& stream, const c10::DeviceIndex, const c10::EventFlag) const override
    {
        if (*event == nullptr) {
            *event = reinterpret_cast<void*>(static_cast<uintptr_t>(g_next_event));
            g_event_ids[*event] = g_next_event++;
        }
        std::printf("record event=%d stream=%s\n", g_event_ids[*event], Name(stream));
    }
    // NPUGuardImpl::block: queues aclrtStreamWaitEvent(stream, event).
    void block(void* event, const c10::Stream& stream) const override
    {
        if (event == nullptr) return;
        std::printf("wait event=%d stream=%s\n", g_event_ids[event], Name(stream));
    }
    void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override
    {
        if (event != nullptr) std::printf("destroy event=%d\n", g_event_ids[event]);
    }
    bool queryEvent(void*) const override { return true; }
};
C10_REGISTER_GUARD_IMPL(PrivateUse1, RecordingGuardImpl);

void RecordStream(at::Tensor& self, c10::Stream s)
{
    auto it = g_tensor_names.find(self.data_ptr());
    std::printf("record_stream tensor=%s stream=%s\n", it == g_tensor_names.end() ? "?" : it->second.c_str(), Name(s));
}
bool IsPinned(const at::Tensor&, std::optional<c10::Device>) { return false; }
at::Tensor PinMemory(const at::Tensor& self, std::optional<c10::Device>) { return self.clone(); }

TORCH_LIBRARY_IMPL(aten, CPU, m)
{
    m.impl("record_stream", TORCH_FN(RecordStream));
    m.impl("is_pinned", TORCH_FN(IsPinned));
    m.impl("_pin_memory", TORCH_FN(PinMemory));
}

// A tiling: 64 bytes, distinct per id.
at::Tensor Get(uint64_t id, const std::string& name)
{
    uint64_t bytes[8] = {id, 1, 2, 3, 4, 5, 6, 7};
    at::Tensor t = avsg::npu::DeviceTiling(bytes, sizeof(bytes), at::Device(at::kCPU));
    g_tensor_names[t.data_ptr()] = name;
    if (std::memcmp(t.data_ptr(), bytes, sizeof(bytes)) != 0) std::printf("WRONG BYTES %s\n", name.c_str());
    return t;
}
void On(c10::StreamId id) { g_current = FakeStream(id); }
void Step(const char* name) { std::printf("== %s\n", name); }

}  // namespace

// torch_npu's current stream (NPUStream.cpp), as the stand-in header declares it.
namespace c10_npu {
NPUStream getCurrentNPUStream(c10::DeviceIndex) { return NPUStream(g_current); }
aclrtStream NPUStream::stream(bool) const
{
    return reinterpret_cast<aclrtStream>(static_cast<uintptr_t>(stream_.id()));
}
}  // namespace c10_npu

int main()
{
    using avsg::npu::kMaxDeviceTilings;
    Step("upload t1 on A");
    On(1);
    Get(1, "t1");
    Step("t1 again on A");
    Get(1, "t1");
    Step("t1 on B");
    On(2);
    Get(1, "t1");
    Step("t1 again on B");
    Get(1, "t1");
    Step("t1 back on A");
    On(1);
    Get(1, "t1");
    Step("upload t2 on B");
    On(2);
    Get(2, "t2");
    Step("t2 on A");
    On(1);
    Get(2, "t2");
    Step("upload t3 on A");
    Get(3, "t3");
    // LRU order now (oldest first): t1, t2, t3. Fill the cache up to its bound from stream A
    // (fillers f100.., used on A only), then refresh t3: the next new tilings evict t1 (uploaded on
    // A, used on B), t2 (uploaded on B, used on A) and f100 (A only), in that order.
    Step("fill");
    for (uint64_t id = 100; id < 100 + kMaxDeviceTilings - 3; ++id) Get(id, "f" + std::to_string(id));
    Get(3, "t3");
    std::printf("size=%zu\n", avsg::npu::DeviceTilingCache::Instance().Size());
    Step("evict t1 from A");
    Get(1000, "f1000");
    Step("evict t2 from B");
    On(2);
    Get(1001, "f1001");
    Step("evict f100 from B");
    Get(1002, "f1002");
    std::printf("size=%zu\n", avsg::npu::DeviceTilingCache::Instance().Size());
    Step("release");
    avsg::npu::ReleaseDeviceTilings();
    std::printf("size=%zu\n", avsg::npu::DeviceTilingCache::Instance().Size());
    Step("end");
    return 0;
}
