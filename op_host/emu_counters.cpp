// The AscendC CPU emulation's instrumentation and configuration, exposed as torch ops so Python
// (python/avsg/backend.py) can read what the last kernel launch issued and turn it into an
// estimated NPU time with the emulation's documented cost model (emulation/emu_core.h:
// avsg_emu::CostModel, estimate(), estimate_launch_ns()).
//
//   avsg::set_emulation(str build) -> ()             "strict" (default) or "fast": which build of the
//                                                    kernels the CPU ops launch (op_host/cpu_kernels.h)
//   avsg::emulation() -> str                         the selected build
//   avsg::fast_emulation_arch() -> str               the -march of the fast build, or "generic"
//   avsg::set_emulated_cores(int cores) -> ()        blockDim limit of the emulation (default 40)
//   avsg::emulated_cores() -> int
//   avsg::counter_fields() -> str[]                  column names of last_launch_counters
//   avsg::last_launch_counters() -> Tensor           int64 [blocks, fields]: the most recent launch
//                                                    of ANY kernel (plan, gather, ...) in the process
//   avsg::last_launch_vector_apis() -> (str[], Tensor)  per vector API: int64 [blocks, apis, 2]
//                                                    (instructions, 256 B repeats)
//   avsg::last_launch_phases() -> (str[], Tensor)    per phase the kernel marked (AVSG_PHASE,
//                                                    op_kernel/kernel_compat.h): its name and int64
//                                                    [blocks, phases, fields], the counters split by
//                                                    phase (summed fields add up to
//                                                    last_launch_counters; *_max: max over phases)
//   avsg::cost_fields() -> str[]                     column names of estimate_cost
//   avsg::estimate_cost(Tensor counters) -> Tensor   float64 [blocks, cost fields]: avsg_emu::estimate
//                                                    applied to each row of a counters tensor
//   avsg::cost_model() -> (str[], float[])           the model's constants, for reports
//
// Only in the CPU build (AVSG_CPU_EMULATION); the NPU library does not carry the emulation.
#if defined(AVSG_CPU_EMULATION)
#include <ATen/ATen.h>
#include <torch/library.h>

#include <set>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "cpu_kernels.h"
#include "kernel_operator.h"

namespace {

using avsg_emu::Counters;

// Column order of the counters tensor. Add fields at the end only.
const std::vector<std::string>& fields()
{
    static const std::vector<std::string> f = {
        "scalar_ub_reads", "scalar_ub_writes", "scalar_gm_reads", "scalar_gm_writes",
        "vec_instrs",      "vec_repeats",      "mte2_copies",     "mte2_bytes",
        "mte3_copies",     "mte3_bytes",       "ub_copies",       "ub_bytes",
        "pipe_barriers",   "set_flags",        "wait_flags",      "sync_alls",
        "queue_syncs",     "dcci",             "mte2_inflight_max", "mte2_inflight_bytes_max",
    };
    return f;
}

void to_row(const Counters& c, int64_t* row)
{
    const uint64_t v[] = {c.scalar_ub_reads, c.scalar_ub_writes, c.scalar_gm_reads, c.scalar_gm_writes,
                          c.vec_instrs,      c.vec_repeats,      c.mte2_copies,     c.mte2_bytes,
                          c.mte3_copies,     c.mte3_bytes,       c.ub_copies,       c.ub_bytes,
                          c.pipe_barriers,   c.set_flags,        c.wait_flags,      c.sync_alls,
                          c.queue_syncs,     c.dcci,             c.mte2_inflight_max, c.mte2_inflight_bytes_max};
    static_assert(sizeof(v) / sizeof(v[0]) == 20, "keep fields() and to_row/from_row in step");
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); ++i) row[i] = static_cast<int64_t>(v[i]);
}

Counters from_row(const int64_t* row)
{
    Counters c;
    uint64_t* dst[] = {&c.scalar_ub_reads, &c.scalar_ub_writes, &c.scalar_gm_reads, &c.scalar_gm_writes,
                       &c.vec_instrs,      &c.vec_repeats,      &c.mte2_copies,     &c.mte2_bytes,
                       &c.mte3_copies,     &c.mte3_bytes,       &c.ub_copies,       &c.ub_bytes,
                       &c.pipe_barriers,   &c.set_flags,        &c.wait_flags,      &c.sync_alls,
                       &c.queue_syncs,     &c.dcci,             &c.mte2_inflight_max, &c.mte2_inflight_bytes_max};
    for (size_t i = 0; i < sizeof(dst) / sizeof(dst[0]); ++i) *dst[i] = static_cast<uint64_t>(row[i]);
    return c;
}

void set_emulation(c10::string_view build)
{
    try {
        avsg_cpu::select_kernels(std::string(build.data(), build.size()));
    } catch (const std::invalid_argument& e) {
        TORCH_CHECK_VALUE(false, "avsg.set_emulation: build: ", e.what());
    }
}

std::string emulation() { return avsg_cpu::selected_kernels().name; }

std::string fast_emulation_arch() {
    const std::string arch = avsg_cpu::fast_kernels_arch();
    return arch.empty() ? "generic" : arch;
}

// The fast build counts nothing; the counters still held are those of an older strict launch.
void require_counted_launch(const char* what)
{
    TORCH_CHECK(avsg_emu::last_launch_counted(), "avsg.", what, ": the most recent kernel launch ran in the fast "
                "emulation build, which compiles the counters out; run the launch to inspect with "
                "avsg.backend.emulation('strict')");
}

void set_emulated_cores(int64_t cores)
{
    TORCH_CHECK_VALUE(cores >= 1 && cores <= 65535, "avsg.set_emulated_cores: expected 1..65535 cores, got ", cores);
    avsg_emu::set_core_count(static_cast<int>(cores));
}

int64_t emulated_cores() { return avsg_emu::core_count(); }

std::vector<std::string> counter_fields() { return fields(); }

at::Tensor last_launch_counters()
{
    require_counted_launch("last_launch_counters");
    std::vector<Counters> per_block = avsg_emu::last_launch_counters();
    const int64_t F = static_cast<int64_t>(fields().size());
    at::Tensor t = at::zeros({static_cast<int64_t>(per_block.size()), F}, at::kLong);
    int64_t* p = t.data_ptr<int64_t>();
    for (size_t b = 0; b < per_block.size(); ++b) to_row(per_block[b], p + b * F);
    return t;
}

std::tuple<std::vector<std::string>, at::Tensor> last_launch_vector_apis()
{
    require_counted_launch("last_launch_vector_apis");
    std::vector<Counters> per_block = avsg_emu::last_launch_counters();
    std::set<std::string> names;
    for (auto& c : per_block)
        for (auto& kv : c.vec_by_api) names.insert(kv.first);
    std::vector<std::string> apis(names.begin(), names.end());
    at::Tensor t = at::zeros({static_cast<int64_t>(per_block.size()), static_cast<int64_t>(apis.size()), 2}, at::kLong);
    auto acc = t.accessor<int64_t, 3>();
    for (size_t b = 0; b < per_block.size(); ++b)
        for (size_t a = 0; a < apis.size(); ++a) {
            auto it = per_block[b].vec_by_api.find(apis[a]);
            if (it == per_block[b].vec_by_api.end()) continue;
            acc[b][a][0] = static_cast<int64_t>(it->second.instrs);
            acc[b][a][1] = static_cast<int64_t>(it->second.repeats);
        }
    return std::make_tuple(apis, t);
}

std::tuple<std::vector<std::string>, at::Tensor> last_launch_phases()
{
    require_counted_launch("last_launch_phases");
    avsg_emu::LaunchPhases phases = avsg_emu::last_launch_phases();
    const int64_t F = static_cast<int64_t>(fields().size());
    const int64_t P = static_cast<int64_t>(phases.names.size());
    at::Tensor t = at::zeros({static_cast<int64_t>(phases.per_block.size()), P, F}, at::kLong);
    int64_t* p = t.data_ptr<int64_t>();
    for (size_t b = 0; b < phases.per_block.size(); ++b)
        for (int64_t k = 0; k < P; ++k) to_row(phases.per_block[b][k], p + (static_cast<int64_t>(b) * P + k) * F);
    return std::make_tuple(phases.names, t);
}

std::vector<std::string> cost_fields()
{
    return {"scalar_cycles", "vector_cycles", "mte2_cycles", "mte3_cycles", "sync_cycles", "serial_ns", "overlap_ns"};
}

at::Tensor estimate_cost(const at::Tensor& counters)
{
    const int64_t F = static_cast<int64_t>(fields().size());
    TORCH_CHECK_VALUE(counters.dim() == 2 && counters.size(1) == F, "avsg.estimate_cost: counters: expected shape "
                      "[blocks, ", F, "] (see avsg.counter_fields()), got ", counters.sizes());
    at::Tensor c = counters.to(at::kLong).contiguous().cpu();
    at::Tensor out = at::zeros({c.size(0), 7}, at::kDouble);
    const int64_t* p = c.data_ptr<int64_t>();
    double* o = out.data_ptr<double>();
    for (int64_t b = 0; b < c.size(0); ++b) {
        avsg_emu::CostBreakdown e = avsg_emu::estimate(from_row(p + b * F));
        const double v[] = {e.scalar_cycles, e.vector_cycles, e.mte2_cycles, e.mte3_cycles, e.sync_cycles,
                            e.serial_ns, e.overlap_ns};
        for (int k = 0; k < 7; ++k) o[b * 7 + k] = v[k];
    }
    return out;
}

std::tuple<std::vector<std::string>, std::vector<double>> cost_model()
{
    using M = avsg_emu::CostModel;
    return std::make_tuple(
        std::vector<std::string>{"clock_ghz", "vec_cycles_per_repeat", "vec_issue_cycles", "mte_bytes_per_cycle",
                                 "mte_issue_cycles", "scalar_ub_cycles", "scalar_gm_cycles", "barrier_cycles",
                                 "flag_cycles", "sync_all_cycles", "dcci_cycles"},
        std::vector<double>{M::kClockGHz, M::kVecCyclesPerRepeat, M::kVecIssueCycles, M::kMteBytesPerCycle,
                            M::kMteIssueCycles, M::kScalarUbCycles, M::kScalarGmCycles, M::kBarrierCycles,
                            M::kFlagCycles, M::kSyncAllCycles, M::kDcciCycles});
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(avsg, m)
{
    m.def("set_emulation(str build) -> ()", &set_emulation);
    m.def("emulation() -> str", &emulation);
    m.def("fast_emulation_arch() -> str", &fast_emulation_arch);
    m.def("set_emulated_cores(int cores) -> ()", &set_emulated_cores);
    m.def("emulated_cores() -> int", &emulated_cores);
    m.def("counter_fields() -> str[]", &counter_fields);
    m.def("last_launch_counters() -> Tensor", &last_launch_counters);
    m.def("last_launch_vector_apis() -> (str[], Tensor)", &last_launch_vector_apis);
    m.def("last_launch_phases() -> (str[], Tensor)", &last_launch_phases);
    m.def("cost_fields() -> str[]", &cost_fields);
    m.def("estimate_cost(Tensor counters) -> Tensor", &estimate_cost);
    m.def("cost_model() -> (str[], float[])", &cost_model);
}
#endif  // AVSG_CPU_EMULATION
