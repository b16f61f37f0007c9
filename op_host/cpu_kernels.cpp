// One KernelBuild per emulation build (see cpu_kernels.h). This file is compiled twice, like the
// kernels: in the strict build it defines strict_kernels() and the selection; with AVSG_EMU_FAST
// it defines fast_kernels(), and the kernel names below are the renamed fast copies.
#if defined(AVSG_CPU_EMULATION)
#include "cpu_kernels.h"

#include <atomic>
#include <stdexcept>

#include "kernel_operator.h"

extern "C" void avsg_plan(GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR,
                          GM_ADDR);
extern "C" void avsg_plan_dual_pointer(GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR,
                                       GM_ADDR, GM_ADDR, GM_ADDR);
extern "C" void avsg_invalidate(GM_ADDR, GM_ADDR, GM_ADDR);
extern "C" void avsg_reset(GM_ADDR, GM_ADDR, GM_ADDR);
extern "C" void avsg_resize(GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR);
extern "C" void avsg_gather(GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR);
extern "C" void avsg_calibrate(GM_ADDR, GM_ADDR, GM_ADDR);
extern "C" void avsg_plan_gather(GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR,
                                 GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR);
extern "C" void avsg_split_slots(GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR);

namespace avsg_cpu {

#if AVSG_EMU_STRICT
const KernelBuild& strict_kernels()
#else
const KernelBuild& fast_kernels()
#endif
{
    static const KernelBuild build{
        AVSG_EMU_STRICT ? "strict" : "fast",
        /*counts_work=*/AVSG_EMU_STRICT != 0,
        &avsg_emu::launch_impl,
        &avsg_plan,
        &avsg_plan_dual_pointer,
        &avsg_invalidate,
        &avsg_reset,
        &avsg_resize,
        &avsg_gather,
        &avsg_calibrate,
        &avsg_plan_gather,
        &avsg_split_slots,
    };
    return build;
}

#if AVSG_EMU_STRICT
namespace {
std::atomic<const KernelBuild*>& selected() {
    static std::atomic<const KernelBuild*> build{nullptr};  // null: strict (no static-init order issue)
    return build;
}
}  // namespace

const KernelBuild& selected_kernels() {
    const KernelBuild* b = selected().load();
    return b ? *b : strict_kernels();
}

const char* fast_kernels_arch() {
#if defined(AVSG_FAST_MARCH)
    return AVSG_FAST_MARCH;
#else
    return "";
#endif
}

// This file's strict copy is compiled for the generic target, so the check itself runs anywhere.
std::string fast_kernels_unsupported() {
#if defined(AVSG_FAST_MARCH) && (defined(__x86_64__) || defined(__i386__))
    if (!__builtin_cpu_supports(AVSG_FAST_MARCH))
        return std::string("the fast build was compiled for ") + AVSG_FAST_MARCH +
               " (the machine that built it), which this CPU does not support; rebuild with "
               "AVSG_FAST_ARCH=generic pip install --no-build-isolation -e . (or on this machine)";
#endif
    return "";
}

void select_kernels(const std::string& name) {
    if (name == "strict") {
        selected() = &strict_kernels();
    } else if (name == "fast") {
        const std::string why = fast_kernels_unsupported();
        if (!why.empty()) throw std::invalid_argument(why);
        selected() = &fast_kernels();
    } else {
        throw std::invalid_argument("expected 'strict' or 'fast', got '" + name + "'");
    }
}
#endif

}  // namespace avsg_cpu
#endif  // AVSG_CPU_EMULATION
