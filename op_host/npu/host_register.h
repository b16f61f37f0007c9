// Host-register entry points, resolved at run time (NPU backend; no SDK header needed).
//
// An AI core reads host memory only through a device address the runtime or the driver maps it
// to. Two calls can do it, and neither is safe to link directly:
//   aclrtHostRegister(ptr, size, ACL_HOST_REGISTER_MAPPED, &dev)   libascendcl.so. Documented for
//       AI-core use (as a kernel argument) only by recent CANN (the 9.x runtime docs; 8.2's say
//       "for the device NIC"); older runtimes may lack the symbol.
//   halHostRegister(ptr, size, HOST_MEM_MAP_DEV, devid, &dev)      libascend_hal.so, the driver's
//       own call, which the runtime uses underneath on older stacks.
// Linking aclrtHostRegister would make the whole op library (plan included) fail to load on a
// stack without it, so both are looked up with dlsym when first needed. The choice, in order:
//   AVSG_HOST_REGISTER=acl|hal forces one;
//   aclrtHostRegister when present and CANN >= kMinCannForAclMapped;
//   halHostRegister when present (older CANN, or the runtime call missing);
//   aclrtHostRegister when present (undocumented for AI cores on this CANN: `avsg doctor` checks);
// and when the chosen call fails, the other one is tried. With neither, Register raises one error
// naming the CANN and driver versions found and what is missing.
#pragma once
#include <cstdint>
#include <functional>
#include <string>

namespace avsg {
namespace npu {

// Versions of the stack, read from the install's version files (empty when not found).
struct StackVersions {
    std::string cann;          // e.g. "8.2.RC1": $ASCEND_HOME_PATH/*install.info, version.cfg
    std::string driver;        // e.g. "24.1.rc2": $ASCEND_DRIVER_PATH|/usr/local/Ascend/driver/version.info
    int64_t halApiVersion = -1;  // halGetAPIVersion(), -1 when unavailable
    std::string Describe() const;
};
StackVersions ReadStackVersions();
// (major, minor) of a CANN version string such as "8.2.RC1" or "9.1.0-beta.2"; (-1, -1) if none.
std::pair<int, int> ParseCannVersion(const std::string& version);
// First value of `key=value` (case-insensitive key) in a text file, trimmed; empty when absent.
std::string ReadKeyValue(const std::string& path, const std::string& key);

// The first CANN whose runtime docs present aclrtHostRegister's mapping as a kernel argument for
// the AI cores (9.1 beta docs; 9.0's describe a device-accessible address; 8.2's the device NIC).
constexpr int kMinCannForAclMappedMajor = 9;
constexpr int kMinCannForAclMappedMinor = 0;

enum class HostRegisterPath { kNone = 0, kAcl, kHal };
const char* PathName(HostRegisterPath path);

// Runtime symbols (signatures from the ACL runtime docs and the driver's ascend_hal_base.h).
using AclHostRegisterFn = int (*)(void* ptr, uint64_t size, int type, void** devPtr);
using AclHostUnregisterFn = int (*)(void* ptr);
using HalHostRegisterFn = int (*)(void* ptr, uint64_t size, uint32_t flag, uint32_t devid, void** devPtr);
using HalHostUnregisterFn = int (*)(void* ptr, uint32_t devid);
using HalGetApiVersionFn = int (*)(int* version);
constexpr int kAclHostRegisterMapped = 0;   // ACL_HOST_REGISTER_MAPPED
constexpr uint32_t kHalHostMemMapDev = 0;   // HOST_MEM_MAP_DEV (enum drvRegisterTpye)

// Looks up `symbol` in shared library `library` (already loaded or loadable); null when either
// is missing. Replaceable for tests.
using SymbolLookup = std::function<void*(const std::string& library, const char* symbol)>;
void* DlsymLookup(const std::string& library, const char* symbol);

class HostRegisterApi {
public:
    // Resolves the entry points. Never throws: what is missing is recorded for Register's error.
    HostRegisterApi(const SymbolLookup& lookup, StackVersions versions, const std::string& forced,
                    const std::string& aclLibrary = "libascendcl.so",
                    const std::string& halLibrary = "libascend_hal.so");
    // The process-wide instance (real libraries, versions from the install, AVSG_HOST_REGISTER).
    static HostRegisterApi& Instance();

    HostRegisterPath preferred() const { return preferred_; }
    const StackVersions& versions() const { return versions_; }
    bool HasAcl() const { return aclRegister_ && aclUnregister_; }
    bool HasHal() const { return halRegister_ && halUnregister_; }
    // One line: the path chosen and why.
    std::string Describe() const;

    // Maps [ptr, ptr + bytes) (ptr 4 KB aligned, bytes a multiple of 4 KB) for device `devid`.
    // Returns the device address and sets *used to the path that worked; throws
    // std::runtime_error naming the versions when no path works.
    void* Register(void* ptr, uint64_t bytes, uint32_t devid, HostRegisterPath* used) const;
    // Unmaps a range registered through `path`; returns the runtime/driver status (0 = success).
    int Unregister(void* ptr, uint32_t devid, HostRegisterPath path) const;

private:
    int CallRegister(HostRegisterPath path, void* ptr, uint64_t bytes, uint32_t devid, void** dev) const;
    std::string MissingDescription() const;

    AclHostRegisterFn aclRegister_ = nullptr;
    AclHostUnregisterFn aclUnregister_ = nullptr;
    HalHostRegisterFn halRegister_ = nullptr;
    HalHostUnregisterFn halUnregister_ = nullptr;
    StackVersions versions_;
    HostRegisterPath preferred_ = HostRegisterPath::kNone;
    std::string why_;
    std::string aclLibrary_, halLibrary_;
};

constexpr uint64_t kHostPageBytes = 4096;
inline uint64_t RoundUpToPage(uint64_t bytes) { return (bytes + kHostPageBytes - 1) / kHostPageBytes * kHostPageBytes; }

}  // namespace npu
}  // namespace avsg
