#pragma once
#include <c10/core/Stream.h>
#include "acl/acl.h"
namespace c10_npu {
struct NPUStream { aclrtStream stream(bool need_empty) const; c10::Stream unwrap() const; };
NPUStream getCurrentNPUStream();
}
