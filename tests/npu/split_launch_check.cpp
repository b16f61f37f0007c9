// Driven by tests/npu/test_split_launch.py: op_host/npu/split_launch.h's host logic, compiled with
// g++ on CPU. Prints one `key=value` line per case; the test compares them with what the header
// documents. With -DAVSG_NPU_LAUNCH_CONFIG=1 (and CANN's acl_rt.h on the include path, as
// torch-npu's wheel ships it) also the launch config a split plan is launched with.
#include <cstdio>
#include <string>

#include "npu/split_launch.h"

using avsg::npu::ParseSplitSwitch;
using avsg::npu::ParseSplitTimeout;

static void Switch(const char* label, const char* text, bool before)
{
    bool on = before;   // must be set on success, left alone on error
    const std::string err = ParseSplitSwitch(text, on);
    if (err.empty())
        std::printf("switch_%s=%s\n", label, on ? "on" : "off");
    else
        std::printf("switch_%s=error %s|unchanged=%d\n", label, err.c_str(), on == before ? 1 : 0);
}

static void Timeout(const char* label, const char* text)
{
    uint16_t seconds = 7;   // must be set on success, left alone on error
    const std::string err = ParseSplitTimeout(text, seconds);
    if (err.empty())
        std::printf("timeout_%s=%u\n", label, static_cast<unsigned>(seconds));
    else
        std::printf("timeout_%s=error %s|unchanged=%d\n", label, err.c_str(), seconds == 7 ? 1 : 0);
}

int main()
{
    // `before` is the opposite of the expected result, so a parse that leaves `on` alone shows
    Switch("unset", nullptr, true);
    Switch("empty", "", true);
    Switch("zero", "0", true);
    Switch("one", "1", false);
    Switch("yes_from_off", "yes", false);
    Switch("yes_from_on", "yes", true);
    Switch("space", " 1", false);
    Timeout("unset", nullptr);
    Timeout("empty", "");
    Timeout("zero", "0");
    Timeout("five", "5");
    Timeout("max", "65535");
    Timeout("over", "65536");
    Timeout("long", "000001");
    Timeout("negative", "-1");
    Timeout("fraction", "1.5");
    Timeout("word", "ten");
    Timeout("space", " 5");
#ifdef AVSG_NPU_LAUNCH_CONFIG
    avsg::npu::SplitLaunchConfig config(45);
    aclrtLaunchKernelCfg* cfg = config.get();
    std::printf("cfg_attrs=%zu\n", cfg->numAttrs);
    for (size_t i = 0; i < cfg->numAttrs; ++i) {
        const aclrtLaunchKernelAttr& a = cfg->attrs[i];
        if (a.id == ACL_RT_LAUNCH_KERNEL_ATTR_SCHEM_MODE)
            std::printf("cfg_schem_mode=%u id=%d\n", static_cast<unsigned>(a.value.schemMode), static_cast<int>(a.id));
        else if (a.id == ACL_RT_LAUNCH_KERNEL_ATTR_TIMEOUT)
            std::printf("cfg_timeout=%u id=%d\n", static_cast<unsigned>(a.value.timeout), static_cast<int>(a.id));
        else
            std::printf("cfg_other=%d\n", static_cast<int>(a.id));
    }
    const char* self = reinterpret_cast<const char*>(&config);
    const char* attrs = reinterpret_cast<const char*>(cfg->attrs);
    std::printf("cfg_attrs_inside=%d\n", attrs >= self && attrs < self + sizeof(config) ? 1 : 0);
    std::printf("args_bytes=%zu\n", sizeof(avsg::npu::PlanSplitArgs));
    avsg::npu::SplitBinaryLoadOptions load;
    const aclrtBinaryLoadOption& option = load.get()->options[0];
    std::printf("load_options=%zu type=%d magic=0x%08X\n", load.get()->numOpt, static_cast<int>(option.type),
                static_cast<unsigned>(option.value.magic));
#endif
    return 0;
}
