#pragma once
#include "acl/acl.h"
#ifndef ACLRT_LAUNCH_KERNEL
#define ACLRT_LAUNCH_KERNEL(k) aclrtlaunch_##k
#endif
uint32_t aclrtlaunch_avsg_split_slots(uint32_t, aclrtStream, void*, void*, void*, void*, void*, void*);
