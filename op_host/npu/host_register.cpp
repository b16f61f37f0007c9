// Host-register entry points resolved at run time: see host_register.h.
#include "npu/host_register.h"

#include <dlfcn.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace avsg {
namespace npu {

namespace {

std::string Trim(const std::string& s)
{
    size_t a = 0, b = s.size();
    while (a < b && std::isspace(static_cast<unsigned char>(s[a]))) ++a;
    while (b > a && std::isspace(static_cast<unsigned char>(s[b - 1]))) --b;
    return s.substr(a, b - a);
}

std::string Lower(std::string s)
{
    std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
    return s;
}

std::string EnvOr(const char* name, const char* fallback)
{
    const char* v = std::getenv(name);
    return v != nullptr && v[0] != '\0' ? std::string(v) : std::string(fallback);
}

}  // namespace

std::string ReadKeyValue(const std::string& path, const std::string& key)
{
    std::ifstream in(path);
    std::string line;
    const std::string want = Lower(key);
    while (std::getline(in, line)) {
        size_t eq = line.find('=');
        if (eq == std::string::npos) continue;
        if (Lower(Trim(line.substr(0, eq))) == want) return Trim(line.substr(eq + 1));
    }
    return "";
}

std::pair<int, int> ParseCannVersion(const std::string& version)
{
    int major = -1, minor = -1;
    size_t i = 0;
    auto number = [&](int* out) {
        size_t start = i;
        while (i < version.size() && std::isdigit(static_cast<unsigned char>(version[i]))) ++i;
        if (i == start) return false;
        *out = std::atoi(version.substr(start, i - start).c_str());
        return true;
    };
    while (i < version.size() && !std::isdigit(static_cast<unsigned char>(version[i]))) ++i;
    if (!number(&major)) return {-1, -1};
    if (i < version.size() && version[i] == '.') {
        ++i;
        if (!number(&minor)) minor = 0;
    } else {
        minor = 0;
    }
    return {major, minor};
}

StackVersions ReadStackVersions()
{
    StackVersions v;
    const std::string cann = EnvOr("ASCEND_HOME_PATH", "/usr/local/Ascend/ascend-toolkit/latest");
    // The toolkit's install record names the CANN release; the component files only their build.
    for (const char* file : {"ascend_toolkit_install.info", "ascend_cann_install.info", "version.info",
                             "runtime/version.info"}) {
        std::string found = ReadKeyValue(cann + "/" + file, "version");
        if (!found.empty()) {
            v.cann = found;
            break;
        }
    }
    const std::string driver = EnvOr("ASCEND_DRIVER_PATH", "/usr/local/Ascend/driver");
    v.driver = ReadKeyValue(driver + "/version.info", "version");
    return v;
}

std::string StackVersions::Describe() const
{
    std::ostringstream os;
    os << "CANN " << (cann.empty() ? "unknown (no version file under ASCEND_HOME_PATH)" : cann) << ", driver "
       << (driver.empty() ? "unknown (no driver/version.info)" : driver);
    if (halApiVersion >= 0) os << " (HAL API 0x" << std::hex << halApiVersion << std::dec << ")";
    return os.str();
}

const char* PathName(HostRegisterPath path)
{
    switch (path) {
        case HostRegisterPath::kAcl: return "aclrtHostRegister";
        case HostRegisterPath::kHal: return "halHostRegister";
        default: return "none";
    }
}

void* DlsymLookup(const std::string& library, const char* symbol)
{
    // Prefer the copy torch_npu already loaded; never make a missing library fatal.
    void* handle = dlopen(library.c_str(), RTLD_NOW | RTLD_NOLOAD);
    if (handle == nullptr) handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) return nullptr;
    return dlsym(handle, symbol);
}

HostRegisterApi::HostRegisterApi(const SymbolLookup& lookup, StackVersions versions, const std::string& forced,
                                 const std::string& aclLibrary, const std::string& halLibrary)
    : versions_(std::move(versions)), aclLibrary_(aclLibrary), halLibrary_(halLibrary)
{
    aclRegister_ = reinterpret_cast<AclHostRegisterFn>(lookup(aclLibrary, "aclrtHostRegister"));
    aclUnregister_ = reinterpret_cast<AclHostUnregisterFn>(lookup(aclLibrary, "aclrtHostUnregister"));
    halRegister_ = reinterpret_cast<HalHostRegisterFn>(lookup(halLibrary, "halHostRegister"));
    halUnregister_ = reinterpret_cast<HalHostUnregisterFn>(lookup(halLibrary, "halHostUnregister"));
    if (versions_.halApiVersion < 0) {
        auto getVersion = reinterpret_cast<HalGetApiVersionFn>(lookup(halLibrary, "halGetAPIVersion"));
        int api = -1;
        if (getVersion != nullptr && getVersion(&api) == 0) versions_.halApiVersion = api;
    }

    const std::pair<int, int> cann = ParseCannVersion(versions_.cann);
    const bool cannDocumentsAiCore = cann.first > kMinCannForAclMappedMajor ||
                                     (cann.first == kMinCannForAclMappedMajor && cann.second >= kMinCannForAclMappedMinor);
    const std::string force = Lower(forced);
    if (force == "acl" || force == "hal") {
        preferred_ = force == "acl" ? HostRegisterPath::kAcl : HostRegisterPath::kHal;
        why_ = "forced by AVSG_HOST_REGISTER=" + force;
        if ((preferred_ == HostRegisterPath::kAcl && !HasAcl()) || (preferred_ == HostRegisterPath::kHal && !HasHal()))
            why_ += " (but it is missing)";
    } else if (HasAcl() && cannDocumentsAiCore) {
        preferred_ = HostRegisterPath::kAcl;
        why_ = "CANN " + versions_.cann + " documents its mapping for AI cores";
    } else if (HasHal()) {
        preferred_ = HostRegisterPath::kHal;
        why_ = HasAcl() ? "CANN " + (versions_.cann.empty() ? std::string("(unknown)") : versions_.cann) +
                              " predates AI-core use of aclrtHostRegister: the driver's call"
                        : "aclrtHostRegister is missing from " + aclLibrary_ + ": the driver's call";
    } else if (HasAcl()) {
        preferred_ = HostRegisterPath::kAcl;
        why_ = "only aclrtHostRegister is available (AI-core reads not documented for CANN " +
               (versions_.cann.empty() ? std::string("(unknown)") : versions_.cann) + ": run avsg doctor)";
    } else {
        preferred_ = HostRegisterPath::kNone;
        why_ = MissingDescription();
    }
}

HostRegisterApi& HostRegisterApi::Instance()
{
    // Never destroyed: it holds only function pointers into libraries that outlive it.
    static HostRegisterApi* api =
        new HostRegisterApi(DlsymLookup, ReadStackVersions(), EnvOr("AVSG_HOST_REGISTER", "auto"));
    return *api;
}

std::string HostRegisterApi::MissingDescription() const
{
    std::string s = "neither aclrtHostRegister/aclrtHostUnregister (" + aclLibrary_ + ": " +
                    (HasAcl() ? "found" : "missing") + ") nor halHostRegister/halHostUnregister (" + halLibrary_ +
                    ": " + (HasHal() ? "found" : "missing") + ") can be used";
    return s;
}

std::string HostRegisterApi::Describe() const
{
    return std::string(PathName(preferred_)) + ": " + why_ + "; " + versions_.Describe();
}

int HostRegisterApi::CallRegister(HostRegisterPath path, void* ptr, uint64_t bytes, uint32_t devid, void** dev) const
{
    if (path == HostRegisterPath::kAcl && HasAcl()) return aclRegister_(ptr, bytes, kAclHostRegisterMapped, dev);
    if (path == HostRegisterPath::kHal && HasHal()) return halRegister_(ptr, bytes, kHalHostMemMapDev, devid, dev);
    return -1;
}

void* HostRegisterApi::Register(void* ptr, uint64_t bytes, uint32_t devid, HostRegisterPath* used) const
{
    const HostRegisterPath order[2] = {
        preferred_, preferred_ == HostRegisterPath::kHal ? HostRegisterPath::kAcl : HostRegisterPath::kHal};
    std::ostringstream tried;
    for (HostRegisterPath path : order) {
        if (path == HostRegisterPath::kNone) continue;
        if ((path == HostRegisterPath::kAcl && !HasAcl()) || (path == HostRegisterPath::kHal && !HasHal())) continue;
        void* dev = nullptr;
        int status = CallRegister(path, ptr, bytes, devid, &dev);
        if (status == 0 && dev != nullptr) {
            if (used != nullptr) *used = path;
            return dev;
        }
        tried << (tried.tellp() > 0 ? "; " : "") << PathName(path) << " returned " << status;
    }
    std::ostringstream msg;
    msg << "cannot map host memory for the AI cores: ";
    if (tried.tellp() > 0)
        msg << tried.str();
    else
        msg << MissingDescription();
    msg << " (" << versions_.Describe()
        << "; AI-core reads of host memory need aclrtHostRegister from CANN >= " << kMinCannForAclMappedMajor << "."
        << kMinCannForAclMappedMinor << " or the driver's halHostRegister; on Linux <= 5.10 the memory must be "
        << "pinned: allocate it with avsg.backend.alloc_host_pool)";
    throw std::runtime_error(msg.str());
}

int HostRegisterApi::Unregister(void* ptr, uint32_t devid, HostRegisterPath path) const
{
    if (path == HostRegisterPath::kAcl && HasAcl()) return aclUnregister_(ptr);
    if (path == HostRegisterPath::kHal && HasHal()) return halUnregister_(ptr, devid);
    return -1;
}

}  // namespace npu
}  // namespace avsg
