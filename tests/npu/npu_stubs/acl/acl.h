#pragma once
#include <cstdint>
#include <cstddef>
typedef void* aclrtStream; typedef int aclError;
typedef enum { ACL_HOST_REGISTER_MAPPED = 0 } aclrtHostRegisterType;
aclError aclrtHostRegister(void*, uint64_t, aclrtHostRegisterType, void**);
aclError aclrtHostUnregister(void*);
aclError aclrtMallocHost(void** hostPtr, size_t size);
aclError aclrtFreeHost(void* hostPtr);
const char* aclGetRecentErrMsg();
#define ACL_SUCCESS 0
