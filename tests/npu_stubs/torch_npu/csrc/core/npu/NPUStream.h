#pragma once
#include "acl/acl.h"
namespace c10_npu {
struct NPUStream { aclrtStream stream(bool need_empty) const; };
NPUStream getCurrentNPUStream();
aclError GetDevice(int32_t* device);
}
