#pragma once
#include "acl/acl.h"
namespace c10_npu {
aclError GetDevice(int32_t* device);
}
