#pragma once
#include <c10/core/Stream.h>
#include "acl/acl.h"
namespace c10_npu {
// torch_npu/csrc/core/npu/NPUStream.h: a c10::Stream of device type PrivateUse1; the constructor,
// unwrap() and device_index() are inline there too.
struct NPUStream {
    explicit NPUStream(c10::Stream stream) : stream_(stream) {}
    c10::Stream unwrap() const { return stream_; }
    c10::DeviceIndex device_index() const { return stream_.device_index(); }
    aclrtStream stream(bool need_empty) const;
private:
    c10::Stream stream_;
};
NPUStream getCurrentNPUStream(c10::DeviceIndex device_index = -1);
}
