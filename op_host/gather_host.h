// gather_host.h: what the host files of the copying ops (gather_host.cpp, plan_gather_host.cpp)
// share: the argument checks of a gather (shapes, dtypes, layouts; the miss lists' values on the
// CPU), the device addresses of its pools, and its tiling (gather_tiling.h). Header-only; compiled
// into the CPU library (AVSG_CPU_EMULATION) and the NPU library (AVSG_WITH_NPU) alike. The checks
// run in the ops themselves, whatever called them, and never read a value on an NPU (a host sync).
#pragma once
#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "gather_tiling.h"
#include "state_host.h"   // HostValueChecks

#include "kernel_launch.h"     // the build check; in the CPU library the emulation (core count)
#if defined(AVSG_WITH_NPU)
#include "npu/host_pool.h"
#include "tiling/platform/platform_ascendc.h"
#endif

namespace avsg {
namespace gather_host {

struct Args {
    int64_t R = 0, N = 0, S = 0;
    uint32_t partition = 0;
    int64_t cores = 0;
    int64_t blockSize = 0, maxBlocks = 0, rowsPerRequest = 0, poolRows = 0;
    int64_t entryPitch = 0, countPitch = 1;   // int32 between rows of miss_pos / miss_slots, counts
    std::vector<uint64_t> rowBytes;
    std::vector<uint64_t> slotPitch;          // bytes between slots of each dst
    std::vector<uint64_t> hostPitch;          // bytes between host rows of each src
};

inline uint32_t parse_partition(c10::string_view p)
{
    if (p == "miss") return kPartitionMiss;
    if (p == "request") return kPartitionRequest;
    if (p == "topk") return kPartitionTopk;
    if (p == "selection") return kPartitionSelection;
    TORCH_CHECK_VALUE(false, "avsg.gather: partition: expected one of ('miss', 'request', 'topk', 'selection'), "
                      "got '",
                      std::string(p.data(), p.size()), "'");
    return 0;
}

inline void check_index_tensor(const at::Tensor& t, const char* name, int64_t dim)
{
    TORCH_CHECK_TYPE(t.scalar_type() == at::kInt, "avsg.gather: ", name, ": expected dtype torch.int32, got ",
                     t.scalar_type());
    TORCH_CHECK_VALUE(t.dim() == dim, "avsg.gather: ", name, ": expected a ", dim, "-D tensor, got shape ",
                      t.sizes());
}

// A [R, N] index tensor whose rows are contiguous (plan's outputs are views of rows padded to 32 B):
// its row pitch in int32.
inline int64_t row_pitch(const at::Tensor& t, const char* name)
{
    const bool rows_contiguous = t.size(1) <= 1 || t.stride(1) == 1;
    const int64_t pitch = t.size(0) <= 1 ? t.size(1) : t.stride(0);
    TORCH_CHECK_VALUE(rows_contiguous && pitch >= t.size(1), "avsg.gather: ", name, ": expected rows of "
                      "contiguous int32 (a plan's output, or a contiguous tensor), got strides ", t.strides());
    return pitch;
}

// Bytes from one row of a [A, B, ...] pool or buffer to the next (dst: slots; src: host rows): the
// inner dims (one token's row) must be contiguous and the rows evenly spaced over both leading
// dims, as in a contiguous tensor or a view of one whose rows are padded (avsg.kv_slots).
inline uint64_t row_pitch_bytes(const at::Tensor& t, const char* name, size_t i, uint64_t rowElems)
{
    int64_t expect = 1;
    for (int64_t k = t.dim() - 1; k >= 2; --k) {
        TORCH_CHECK_VALUE(t.size(k) <= 1 || t.stride(k) == expect, "avsg.gather: ", name, "[", i, "]: expected "
                          "each row contiguous, got strides ", t.strides());
        expect *= t.size(k);
    }
    // a dim of one entry says nothing about the spacing: take it from the other (or the row)
    int64_t pitch = t.size(1) > 1 ? t.stride(1) : t.size(0) > 1 ? t.stride(0) : static_cast<int64_t>(rowElems);
    const bool even = t.size(0) <= 1 || t.size(1) <= 1 || t.stride(0) == pitch * t.size(1);
    TORCH_CHECK_VALUE(pitch >= static_cast<int64_t>(rowElems) && even, "avsg.gather: ", name, "[", i, "]: expected "
                      "evenly spaced rows (a contiguous tensor, or one with padded rows), got strides ", t.strides());
    return static_cast<uint64_t>(pitch) * t.element_size();
}

// Two cores may write one request's slots (every partition but 'request'), and two requests' rows
// meet at every S slots: a 32 B GM granule written by two cores is a question the AscendC docs do
// not answer (a byte-masked DMA write may be a read-modify-write of its granule), so refuse any
// dst layout that allows it rather than risk corrupted KV.
inline void check_granules(const Args& a, const at::Tensor& d, size_t i)
{
    if (a.cores <= 1 || a.R * a.S <= 1) return;   // one writer, or one slot in all
    const uint64_t pitch = a.slotPitch[i];
    const uint64_t base = reinterpret_cast<uint64_t>(d.data_ptr()) % 32;
    const bool per_slot = a.partition != kPartitionRequest;
    const uint64_t unit = per_slot ? pitch : pitch * static_cast<uint64_t>(a.S);   // bytes one core owns
    TORCH_CHECK_VALUE(base == 0 && unit % 32 == 0, "avsg.gather: dst[", i, "]: ",
                      base != 0 ? "its data does not start on a 32 B boundary" :
                      per_slot ? "its slot pitch of " + std::to_string(pitch) + " B is not a multiple of 32 B"
                               : "a request's " + std::to_string(unit) + " B of slots is not a multiple of 32 B",
                      ", so two of the ", a.cores, " cores could write one 32 B granule of it (partition '",
                      per_slot ? "miss/topk/selection" : "request", "'): allocate it with "
                      "avsg.kv_slots (slots padded to 32 B), or pass num_cores=1");
}

// Shape / dtype / layout checks shared by every backend (no tensor values are read here).
inline Args validate(const at::Tensor& miss_pos, const at::Tensor& miss_slots, const at::Tensor& miss_counts,
                     at::TensorList src, at::TensorList dst, const c10::optional<at::Tensor>& block_table,
                     int64_t block_size, c10::string_view partition, int64_t num_cores)
{
    Args a;
    a.partition = parse_partition(partition);
    TORCH_CHECK_VALUE(num_cores >= 1 && num_cores <= 65535,
                      "avsg.gather: num_cores: expected 1..65535 (blocks of one launch), got ", num_cores);
    a.cores = num_cores;
    check_index_tensor(miss_pos, "miss_pos", 2);
    check_index_tensor(miss_slots, "miss_slots", 2);
    check_index_tensor(miss_counts, "miss_counts", 1);
    a.R = miss_pos.size(0);
    a.N = miss_pos.size(1);
    TORCH_CHECK_VALUE(miss_slots.sizes() == miss_pos.sizes(), "avsg.gather: miss_slots: expected shape ",
                      miss_pos.sizes(), " (that of miss_pos), got ", miss_slots.sizes());
    TORCH_CHECK_VALUE(miss_counts.size(0) == a.R, "avsg.gather: miss_counts: expected shape [", a.R, "], got ",
                      miss_counts.sizes());
    a.entryPitch = row_pitch(miss_pos, "miss_pos");
    TORCH_CHECK_VALUE(row_pitch(miss_slots, "miss_slots") == a.entryPitch, "avsg.gather: miss_slots: expected "
                      "the row pitch of miss_pos (", a.entryPitch, " int32), got strides ", miss_slots.strides());
    a.countPitch = a.R <= 1 ? 1 : miss_counts.stride(0);
    TORCH_CHECK_VALUE(a.countPitch >= 1, "avsg.gather: miss_counts: expected a positive stride, got ",
                      miss_counts.strides());
    TORCH_CHECK_VALUE(!src.empty(), "avsg.gather: src: expected at least one (src, dst) pair");
    TORCH_CHECK_VALUE(src.size() == dst.size(), "avsg.gather: src/dst: expected the same number of tensors, got ",
                      src.size(), " and ", dst.size());
    const at::Device dev = miss_pos.device();
    TORCH_CHECK_VALUE(miss_slots.device() == dev, "avsg.gather: miss_slots: expected a tensor on ", dev,
                      " (that of miss_pos), got one on ", miss_slots.device());
    TORCH_CHECK_VALUE(miss_counts.device() == dev, "avsg.gather: miss_counts: expected a tensor on ", dev,
                      " (that of miss_pos), got one on ", miss_counts.device());
    for (size_t i = 0; i < dst.size(); ++i) {
        const at::Tensor& d = dst[i];
        const at::Tensor& s = src[i];
        TORCH_CHECK_VALUE(d.dim() >= 2 && d.size(0) == a.R, "avsg.gather: dst[", i, "]: expected shape [", a.R,
                          ", S, ...], got ", d.sizes());
        if (i == 0) a.S = d.size(1);
        TORCH_CHECK_VALUE(d.size(1) == a.S, "avsg.gather: dst[", i, "]: expected ", a.S,
                          " slots (those of dst[0]), got ", d.sizes());
        TORCH_CHECK_VALUE(d.device() == dev, "avsg.gather: dst[", i, "]: expected a tensor on ", dev,
                          " (that of miss_pos), got one on ", d.device());
        TORCH_CHECK_TYPE(s.scalar_type() == d.scalar_type(), "avsg.gather: src[", i, "]: expected dtype ",
                         d.scalar_type(), " (that of dst[", i, "]), got ", s.scalar_type());
        TORCH_CHECK_VALUE(s.dim() == d.dim() && s.sizes().slice(2) == d.sizes().slice(2), "avsg.gather: src[", i,
                          "]: expected shape [*, *, ", d.sizes().slice(2), "] matching dst[", i, "]'s row, got ",
                          s.sizes());
        TORCH_CHECK_VALUE(s.size(0) == src[0].size(0) && s.size(1) == src[0].size(1), "avsg.gather: src[", i,
                          "]: every pool sharing one plan needs the leading shape of src[0] ",
                          src[0].sizes().slice(0, 2), ", got ", s.sizes());
        int64_t row = 1;  // elements of one row: prod(shape[2:])
        for (int64_t k = 2; k < d.dim(); ++k) row *= d.size(k);
        a.rowBytes.push_back(static_cast<uint64_t>(row) * d.element_size());
        a.slotPitch.push_back(row_pitch_bytes(d, "dst", i, static_cast<uint64_t>(row)));
        a.hostPitch.push_back(row_pitch_bytes(s, "src", i, static_cast<uint64_t>(row)));
    }
    a.poolRows = src[0].size(0) * src[0].size(1);
    if (block_table.has_value()) {
        const at::Tensor& bt = *block_table;
        check_index_tensor(bt, "block_table", 2);
        TORCH_CHECK_VALUE(bt.size(0) == a.R, "avsg.gather: block_table: expected ", a.R,
                          " rows (one per request), got ", bt.sizes());
        TORCH_CHECK_VALUE(bt.device() == dev, "avsg.gather: block_table: expected a tensor on ", dev,
                          " (that of miss_pos), got one on ", bt.device());
        TORCH_CHECK_VALUE(block_size >= 1, "avsg.gather: block_size: expected >= 1 with a block_table, got ",
                          block_size);
        TORCH_CHECK_VALUE(src[0].size(1) == block_size, "avsg.gather: src[0]: a paged pool is [num_blocks, "
                          "block_size=", block_size, ", ...], got ", src[0].sizes());
        a.blockSize = block_size;
        a.maxBlocks = bt.size(1);
    } else {
        TORCH_CHECK_VALUE(block_size == 0, "avsg.gather: block_size: expected 0 for a contiguous pool (no "
                          "block_table), got ", block_size);
        a.rowsPerRequest = src[0].size(1);
    }
    return a;
}

// Value checks that need the index tensors on the host (CPU backend): every miss-list entry the
// kernel will visit names a slot of the buffer, and a row's misses name distinct slots, so the
// result never depends on which core copies first. Plans always satisfy both.
inline void check_values_cpu(const Args& a, const at::Tensor& miss_pos, const at::Tensor& miss_slots,
                             const at::Tensor& miss_counts)
{
    const int32_t* cnt = miss_counts.data_ptr<int32_t>();
    const int32_t* slots = miss_slots.data_ptr<int32_t>();
    // seen[s] == first + r: row r of this call copied into slot s. The marks outlive the call
    // and every call takes fresh ones, so no per-call pass over S slots clears them (nor pages
    // in a new array).
    thread_local std::vector<uint64_t> marks;
    thread_local uint64_t nextMark = 1;
    if (marks.size() < static_cast<size_t>(a.S)) marks.assign(static_cast<size_t>(a.S), 0);
    const uint64_t first = nextMark;
    nextMark += static_cast<uint64_t>(a.R);
    uint64_t* seen = marks.data();
    if (a.partition == kPartitionSelection) {
        // selection layout: every entry with a position and a slot in range is a copy
        const int32_t* pos = miss_pos.data_ptr<int32_t>();
        for (int64_t r = 0; r < a.R; ++r) {
            for (int64_t j = 0; j < a.N; ++j) {
                int32_t s = slots[r * a.entryPitch + j];
                if (pos[r * a.entryPitch + j] < 0 || s < 0 || s >= a.S) continue;
                TORCH_CHECK_VALUE(seen[s] != first + r, "avsg.gather: miss_slots[", r, ", ", j, "] = ", s,
                                  " repeats an earlier copy of row ", r, " (selection layout: a row's "
                                  "copies need distinct slots)");
                seen[s] = first + r;
            }
        }
        return;
    }
    for (int64_t r = 0; r < a.R; ++r) {
        const int32_t count = cnt[r * a.countPitch];
        TORCH_CHECK_VALUE(count >= 0 && count <= a.N, "avsg.gather: miss_counts[", r, "] = ", count,
                          ": expected a count in [0, ", a.N, "]");
        for (int64_t j = 0; j < count; ++j) {
            int32_t s = slots[r * a.entryPitch + j];
            TORCH_CHECK_VALUE(s >= 0 && s < a.S, "avsg.gather: miss_slots[", r, ", ", j, "] = ", s,
                              ": expected a slot in [0, ", a.S, ")");
            TORCH_CHECK_VALUE(seen[s] != first + r, "avsg.gather: miss_slots[", r, ", ", j, "] = ", s,
                              " repeats an earlier miss of row ", r, " (a row's misses need distinct slots)");
            seen[s] = first + r;
        }
    }
}

// AVSG_GATHER_PAGE_READS=1: a read may fetch unmissed host rows between two misses of the same
// host page (fewer DMAs, a few more bytes across PCIe). Off by default; read at every call.
inline bool PageReadsEnabled()
{
    const char* v = std::getenv("AVSG_GATHER_PAGE_READS");
    return v != nullptr && v[0] != '\0' && std::strcmp(v, "0") != 0;
}

// Tiling of one launch over pairs [first, first + count).
inline GatherTiling make_tiling(const Args& a, size_t first, size_t count, const std::vector<uint64_t>& srcAddr,
                                const std::vector<uint64_t>& dstAddr)
{
    GatherTiling t;
    std::memset(&t, 0, sizeof(t));
    t.rows = static_cast<uint64_t>(a.R);
    t.entriesPerRow = static_cast<uint64_t>(a.N);
    t.capacity = static_cast<uint64_t>(a.S);
    t.partition = a.partition;
    t.numCores = static_cast<uint64_t>(a.cores);
    t.numPairs = count;
    t.blockSize = static_cast<uint64_t>(a.blockSize);
    t.maxBlocks = static_cast<uint64_t>(a.maxBlocks);
    t.rowsPerRequest = static_cast<uint64_t>(a.rowsPerRequest);
    t.poolRows = static_cast<uint64_t>(a.poolRows);
    uint64_t widest = 1;
    for (size_t i = 0; i < count; ++i) {
        t.rowBytes[i] = a.rowBytes[first + i];
        t.src[i] = srcAddr[first + i];
        t.dst[i] = dstAddr[first + i];
        t.slotPitch[i] = a.slotPitch[first + i];
        t.hostPitch[i] = a.hostPitch[first + i];
        widest = std::max<uint64_t>(widest, t.rowBytes[i]);
    }
    // A buffer holds up to kGatherMaxSpanRows rows at the UB row pitch of the widest pair (its
    // bytes rounded up to 32: UbRowPitch in op_kernel/gather_kernel.h, where the rule is cited),
    // at most kGatherCopyBytesMax; rows wider than that are copied in pieces, one row per read.
    const uint64_t pitch = (widest + 31) / 32 * 32;
    t.copyBytes = std::min<uint64_t>(pitch * kGatherMaxSpanRows, kGatherCopyBytesMax);
    t.spanRows = pitch <= t.copyBytes ? std::min<uint64_t>(t.copyBytes / pitch, kGatherMaxSpanRows) : 1;
    // Page reads: skip over at most the rest of one host page between two misses of a read.
    t.readGapRows = PageReadsEnabled() && t.spanRows > 1 ? (kGatherPageBytes - 1) / widest : 0;
    t.idxChunk = kGatherIdxChunk;
    t.entryPitch = static_cast<uint64_t>(a.entryPitch);
    t.countPitch = static_cast<uint64_t>(a.countPitch);
    // the counts window holds (cntChunk - 1) * countPitch + 1 int32 of the kGatherCntChunk buffer
    t.cntChunk = std::max<uint64_t>(1, (kGatherCntChunk - 1) / t.countPitch + 1);
    t.btWindow = kGatherBtWindow;
    return t;
}


// Cores the launch's device has for blocks: the emulated AIV cores, or the NPU's.
inline int64_t AivCores()
{
#if defined(AVSG_CPU_EMULATION)
    return avsg_emu::core_count();
#else
    auto* platform = platform_ascendc::PlatformAscendCManager::GetInstance();
    TORCH_CHECK(platform != nullptr, "avsg.gather: cannot query the Ascend platform (PlatformAscendCManager)");
    return static_cast<int64_t>(platform->GetCoreNumAiv());
#endif
}

// A gather's checks, after validate: the core count against the device, dst's granules, and (CPU
// only, unless tests switched them off) the miss lists' values when `values` says they exist yet
// (plan_gather's are written by its own launch). Returns the (src, dst) device addresses.
struct Addresses {
    std::vector<uint64_t> src, dst;
};
inline Addresses check_launch(const Args& a, const at::Tensor& miss_pos, const at::Tensor& miss_slots,
                              const at::Tensor& miss_counts, at::TensorList src, at::TensorList dst, bool values)
{
    const at::Device dev = miss_pos.device();
    const int64_t cores = AivCores();
#if defined(AVSG_CPU_EMULATION)
    TORCH_CHECK_VALUE(a.cores <= cores, "avsg.gather: num_cores=", a.cores, " exceeds the emulated AIV core count ",
                      cores, " (blockDim may not exceed the physical cores; 910B3/B4 have 40, 910B1/B2 48): "
                      "raise it with avsg.backend.set_emulated_cores(n)");
    const bool host_checks = HostValueChecks();   // off only in tests that show the kernels' own guards
                                                  // (and the emulation's granule-ownership check) at work
#else
    TORCH_CHECK_VALUE(a.cores <= cores, "avsg.gather: num_cores=", a.cores, " exceeds the ", cores,
                      " AIV cores of this NPU (blockDim must not exceed the physical cores)");
    // Values are not read here (that would be a host sync, docs/design.md §3, invariant 7): the
    // kernel clamps miss_counts to [0, N] and skips slots outside [0, S) and rows outside the pool.
    const bool host_checks = true;
    (void)miss_slots, (void)miss_counts, (void)values;
#endif
    if (host_checks)
        for (size_t i = 0; i < dst.size(); ++i) check_granules(a, dst[i], i);
#if defined(AVSG_CPU_EMULATION)
    if (host_checks && values) check_values_cpu(a, miss_pos, miss_slots, miss_counts);
#endif
    Addresses out;
    for (size_t i = 0; i < src.size(); ++i) {
        const at::Tensor& s = src[i];
        if (s.device() == dev) {
            out.src.push_back(reinterpret_cast<uint64_t>(s.data_ptr()));   // a pool on the device
        } else {
#if defined(AVSG_CPU_EMULATION)
            TORCH_CHECK_VALUE(false, "avsg.gather: src[", i, "]: expected a CPU tensor, got one on ", s.device());
#else
            TORCH_CHECK_VALUE(s.device().is_cpu(), "avsg.gather: src[", i, "]: expected a host (CPU) pool "
                              "registered with avsg.backend.register_host_pool, or a tensor on ", dev);
            // Host KV: read by the AI cores through the device address of the registered mapping.
            out.src.push_back(reinterpret_cast<uint64_t>(npu::HostPoolRegistry::instance().device_address(
                s.data_ptr(), static_cast<size_t>((a.poolRows - 1) * a.hostPitch[i] + a.rowBytes[i]), "src")));
#endif
        }
        out.dst.push_back(reinterpret_cast<uint64_t>(dst[i].data_ptr()));
    }
    return out;
}

}  // namespace gather_host
}  // namespace avsg
