// AVSG strict CPU emulation of the AscendC A2 (910B, dav-c220) AIV API subset.
// emu_core.h: compile shims, enums, the EmuError type, half/bfloat16 stand-ins,
// per-block context, instrumentation counters, the cost model and the launcher.
//
// Specification: the public AscendC API docs and asc-devkit headers; docs/npu.md lists every API
// the kernels use with its source. "card §N" below cites the team's A2 API notes these rules were
// first written from; each such fact is checked against its public source in docs/npu.md.
// The emulation is a correctness tool: every rule it knows is enforced with a
// static_assert (dtype lists) or an AscendC::EmuError exception (run-time limits).
// It never aborts the process.
//
// Two builds from this one source (AVSG_EMU_FAST selects):
//   strict (default)   everything above: checks, hazard scoreboard, UB poisoning, counters, one
//                      std::thread per block. Tests run this build.
//   fast (AVSG_EMU_FAST=1)  the same API semantics with the checks, the scoreboard, poisoning and
//                      the counters compiled out, and blocks run one after another on the calling
//                      thread (in a launch whose blocks call SyncAll, block 0's first SyncAll runs
//                      the others as fibers on that thread, see launch_sequential). For runs and benchmarks of
//                      kernels that already pass the strict build: a kernel that is correct there
//                      gives bit-identical results here, a wrong one may give anything.
// Everything that differs between the builds lives in the inline namespace
// avsg_emu::AVSG_EMU_VARIANT / AscendC::AVSG_EMU_VARIANT (strict or fast), so both builds can be
// linked into one library without ODR clashes; variant-independent pieces (EmuError, enums,
// counters, cost model, core count) are shared.
#pragma once

#if defined(AVSG_EMU_FAST) && AVSG_EMU_FAST
#define AVSG_EMU_VARIANT fast
#define AVSG_EMU_STRICT 0
#else
#define AVSG_EMU_VARIANT strict
#define AVSG_EMU_STRICT 1
#endif

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <vector>
#include <cmath>
#include <limits>

#include <sys/mman.h>
#include <ucontext.h>

// ---------------------------------------------------------------------------
// Compile shims (card §1, §9). On the NPU these are compiler keywords/macros.
// ---------------------------------------------------------------------------
#ifndef __aicore__
#define __aicore__
#endif
#ifndef __global__
#define __global__
#endif
#ifndef __gm__
#define __gm__
#endif
#ifndef __ubuf__
#define __ubuf__
#endif
#ifndef GM_ADDR
#define GM_ADDR uint8_t*
#endif
// Expands to nothing in the real device compile too (card §1).
#define KERNEL_TASK_TYPE_DEFAULT(x)
#define ASCEND_IS_AIV (true)
#define ASCEND_IS_AIC (false)

enum KernelMetaType {
    KERNEL_TYPE_AIV_ONLY,
    KERNEL_TYPE_AIC_ONLY,
    KERNEL_TYPE_MIX_AIV_1_0,
    KERNEL_TYPE_MIX_AIC_1_0,
    KERNEL_TYPE_MIX_AIC_1_1,
    KERNEL_TYPE_MIX_AIC_1_2,
};

// Compiler built-in enums (card §6): global namespace, unscoped.
enum pipe_t { PIPE_S = 0, PIPE_V, PIPE_M, PIPE_MTE1, PIPE_MTE2, PIPE_MTE3, PIPE_FIX, PIPE_ALL };
enum event_t { EVENT_ID0 = 0, EVENT_ID1, EVENT_ID2, EVENT_ID3, EVENT_ID4, EVENT_ID5, EVENT_ID6, EVENT_ID7 };

// ---------------------------------------------------------------------------
// half / bfloat16_t stand-ins (global namespace, as the CCE built-ins).
// Storage is the IEEE binary16 / bfloat16 bit pattern; arithmetic goes through
// float (round-to-nearest-even on the way back).
// ---------------------------------------------------------------------------
#if defined(__F16C__)
#include <immintrin.h>
#endif
namespace avsg_emu {
namespace numeric {
// float <-> half, round to nearest even. Where the compiler targets F16C (the fast build for an
// x86 host that has it: AVSG_FAST_ARCH=auto) the conversions are the hardware's, which round the
// same way; the software path below is the reference for every other build. The two differ
// only in a NaN's payload, which no kernel here produces. What both copies define outside their
// renamed namespaces (these functions, the half type's conversions) is kept from the strict
// objects, which link first (CMakeLists.txt): where the fast copy does not inline a conversion it
// runs the software one, and no F16C instruction runs outside the fast copy
// (tests/kernels/test_emulation_fast.py checks the library).
inline uint16_t f32_to_f16_soft(float f);
inline float f16_to_f32_soft(uint16_t h);
#if defined(__F16C__)
inline uint16_t f32_to_f16(float f) { return static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT)); }
inline float f16_to_f32(uint16_t h) { return _cvtsh_ss(h); }
#else
inline uint16_t f32_to_f16(float f) { return f32_to_f16_soft(f); }
inline float f16_to_f32(uint16_t h) { return f16_to_f32_soft(h); }
#endif
inline uint16_t f32_to_f16_soft(float f) {
    uint32_t x;
    std::memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t e8 = (x >> 23) & 0xffu;
    uint32_t mant = x & 0x7fffffu;
    if (e8 == 0xff) return static_cast<uint16_t>(sign | 0x7c00u | (mant ? 0x200u : 0u));
    int32_t exp = static_cast<int32_t>(e8) - 127 + 15;
    if (exp >= 31) return static_cast<uint16_t>(sign | 0x7c00u);
    if (exp <= 0) {
        if (exp < -10) return static_cast<uint16_t>(sign);
        mant |= 0x800000u;
        uint32_t shift = static_cast<uint32_t>(14 - exp);
        uint32_t h = mant >> shift;
        uint32_t rem = mant & ((1u << shift) - 1u);
        uint32_t halfway = 1u << (shift - 1u);
        if (rem > halfway || (rem == halfway && (h & 1u))) h++;
        return static_cast<uint16_t>(sign | h);
    }
    uint32_t h = (static_cast<uint32_t>(exp) << 10) | (mant >> 13);
    uint32_t rem = mant & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
    return static_cast<uint16_t>(sign | h);
}
inline float f16_to_f32_soft(uint16_t h) {
    uint32_t sign = (static_cast<uint32_t>(h) & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    if (exp == 0) {
        if (mant == 0) return sign ? -0.0f : 0.0f;   // zero, the common case, without ldexp
        float v = std::ldexp(static_cast<float>(mant), -24);
        return sign ? -v : v;
    }
    uint32_t bits = exp == 31 ? (sign | 0x7f800000u | (mant << 13))
                              : (sign | ((exp + 112u) << 23) | (mant << 13));
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}
inline uint16_t f32_to_bf16(float f) {
    uint32_t x;
    std::memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return static_cast<uint16_t>(x >> 16);
}
inline float bf16_to_f32(uint16_t b) {
    uint32_t x = static_cast<uint32_t>(b) << 16;
    float f;
    std::memcpy(&f, &x, 4);
    return f;
}
}  // namespace numeric
}  // namespace avsg_emu

struct half {
    uint16_t bits = 0;
    half() = default;
    half(float f) : bits(avsg_emu::numeric::f32_to_f16(f)) {}
    half(double d) : half(static_cast<float>(d)) {}
    half(int i) : half(static_cast<float>(i)) {}
    operator float() const { return avsg_emu::numeric::f16_to_f32(bits); }
};
struct bfloat16_t {
    uint16_t bits = 0;
    bfloat16_t() = default;
    bfloat16_t(float f) : bits(avsg_emu::numeric::f32_to_bf16(f)) {}
    bfloat16_t(double d) : bfloat16_t(static_cast<float>(d)) {}
    bfloat16_t(int i) : bfloat16_t(static_cast<float>(i)) {}
    operator float() const { return avsg_emu::numeric::bf16_to_f32(bits); }
};

namespace AscendC {

// ---------------------------------------------------------------------------
// Errors. Every run-time rule violation throws EmuError with a message naming
// the API, the rule and the card section. The block index is prefixed.
// ---------------------------------------------------------------------------
class EmuError : public std::runtime_error {
public:
    explicit EmuError(const std::string& msg) : std::runtime_error(msg) {}
};

// Enums of the AscendC namespace (card §3-§6).
enum class TPosition : uint8_t { GM = 0, VECIN, VECOUT, VECCALC, LCM = VECCALC, MAX };
using QuePosition = TPosition;

// Only the 12 events legal on an AIV core (card §6); any other name fails to compile.
enum class HardEvent : uint8_t {
    MTE2_V = 0, V_MTE3, MTE3_MTE2, MTE2_MTE3, S_V, V_S, MTE2_S, S_MTE3, V_MTE2, MTE3_V, S_MTE2, MTE3_S,
    MAX
};
using TEventID = int8_t;

enum class CMPMODE : uint8_t { LT = 0, GT, EQ, LE, GE, NE };
enum class SELMODE : uint8_t { VSEL_CMPMASK_SPR = 0, VSEL_TENSOR_SCALAR_MODE, VSEL_TENSOR_TENSOR_MODE };
enum class RoundMode : uint8_t { CAST_NONE = 0, CAST_RINT, CAST_FLOOR, CAST_CEIL, CAST_ROUND, CAST_TRUNC, CAST_ODD };
enum class CacheLine : uint8_t { SINGLE_CACHE_LINE = 0, ENTIRE_DATA_CACHE };
enum class DcciDst : uint8_t { CACHELINE_ALL = 0, CACHELINE_UB, CACHELINE_OUT, CACHELINE_ATOMIC };
enum class CacheMode : uint8_t { CACHE_MODE_DISABLE = 0, CACHE_MODE_NORMAL };
enum class GatherMaskMode : uint8_t { VERSION_V1 = 0, VERSION_V2 };
constexpr GatherMaskMode defaultGatherMaskMode = GatherMaskMode::VERSION_V1;

inline const char* HardEventName(HardEvent e) {
    static const char* names[] = {"MTE2_V", "V_MTE3", "MTE3_MTE2", "MTE2_MTE3", "S_V",    "V_S",
                                  "MTE2_S", "S_MTE3", "V_MTE2",    "MTE3_V",    "S_MTE2", "MTE3_S"};
    auto i = static_cast<unsigned>(e);
    return i < 12 ? names[i] : "?";
}

}  // namespace AscendC

// ---------------------------------------------------------------------------
// avsg_emu: launcher, block context, counters, cost model.
// ---------------------------------------------------------------------------
namespace avsg_emu {

// Hardware constants (card §0).
constexpr uint32_t kUbPhysicalBytes = 192 * 1024;   // 196608: UB per AIV
constexpr uint32_t kUbTPipeBytes = 184 * 1024;      // 188416: what TPipe may hand out on arch 2201
constexpr uint32_t kUbAlign = 32;                   // DataBlock
constexpr uint32_t kRepeatBytes = 256;              // one vector repeat
constexpr uint32_t kMaxRepeat = 255;                // repeatTime is uint8_t
constexpr uint8_t kPoisonByte = 0xA5;               // fill for undefined memory (card §9 "Poisoning")
// Where TPipe starts carving UB. The real TPipe hands out buffers from a pool base the kernel
// does not choose (kernel_tpipe_impl.h: bufPool_.maxAddr), so a kernel that needs more than 32 B
// alignment (Sort32: dst 256 B, sources 128 B) must align explicitly from GetPhyAddr(). A base
// of 32 B is the most hostile 32 B-aligned choice: any reliance on 64/128/256 B alignment of a
// TPipe buffer fails here. Tests may change it (set_tpipe_base) to show results do not move.
constexpr uint32_t kDefaultTPipeBase = 32;

// ---- Instrumentation -------------------------------------------------------
struct VecApiStat {
    uint64_t instrs = 0;   // API calls that issued work (count > 0)
    uint64_t repeats = 0;  // 256-byte repeats they cover (ceil(bytes/256))
};

// Work issued by one block, grouped by pipe (card §0 "Pipes").
struct Counters {
    // PIPE_S: scalar accesses through the tensor API (loop/control overhead is not visible).
    uint64_t scalar_ub_reads = 0, scalar_ub_writes = 0;  // LocalTensor GetValue / SetValue / operator()
    uint64_t scalar_gm_reads = 0, scalar_gm_writes = 0;  // GlobalTensor GetValue / SetValue
    // PIPE_V
    uint64_t vec_instrs = 0, vec_repeats = 0;
    std::map<std::string, VecApiStat> vec_by_api;
    // PIPE_MTE2: GM -> UB (DataCopy, DataCopyPad)
    uint64_t mte2_copies = 0, mte2_bytes = 0;
    // Most GM->UB copies (and their bytes) issued and not yet waited for by any other pipe at
    // the moment one more is issued: the DMAs a core keeps in flight (strict build only).
    uint64_t mte2_inflight_max = 0, mte2_inflight_bytes_max = 0;
    // PIPE_MTE3: UB -> GM
    uint64_t mte3_copies = 0, mte3_bytes = 0;
    // UB -> UB DataCopy (runs on PIPE_V, card §0 ⚠️); also included in vec_instrs/vec_repeats.
    uint64_t ub_copies = 0, ub_bytes = 0;
    // Synchronisation
    uint64_t pipe_barriers = 0, set_flags = 0, wait_flags = 0, sync_alls = 0;
    uint64_t queue_syncs = 0;  // flag pairs inserted by TQue EnQue/DeQue/Free/Alloc
    uint64_t dcci = 0;         // DataCacheCleanAndInvalid

    uint64_t scalar_ops() const { return scalar_ub_reads + scalar_ub_writes + scalar_gm_reads + scalar_gm_writes; }
    Counters& operator+=(const Counters& o) {
        scalar_ub_reads += o.scalar_ub_reads; scalar_ub_writes += o.scalar_ub_writes;
        scalar_gm_reads += o.scalar_gm_reads; scalar_gm_writes += o.scalar_gm_writes;
        vec_instrs += o.vec_instrs; vec_repeats += o.vec_repeats;
        for (auto& kv : o.vec_by_api) {
            vec_by_api[kv.first].instrs += kv.second.instrs;
            vec_by_api[kv.first].repeats += kv.second.repeats;
        }
        mte2_copies += o.mte2_copies; mte2_bytes += o.mte2_bytes;
        mte2_inflight_max = std::max(mte2_inflight_max, o.mte2_inflight_max);
        mte2_inflight_bytes_max = std::max(mte2_inflight_bytes_max, o.mte2_inflight_bytes_max);
        mte3_copies += o.mte3_copies; mte3_bytes += o.mte3_bytes;
        ub_copies += o.ub_copies; ub_bytes += o.ub_bytes;
        pipe_barriers += o.pipe_barriers; set_flags += o.set_flags; wait_flags += o.wait_flags;
        sync_alls += o.sync_alls; queue_syncs += o.queue_syncs; dcci += o.dcci;
        return *this;
    }
};

// The summable fields of Counters (all but vec_by_api and the *_max ones), for code that adds or
// subtracts counters field by field (the phases below).
#define AVSG_EMU_SUMMED_COUNTERS(X)                                                               \
    X(scalar_ub_reads) X(scalar_ub_writes) X(scalar_gm_reads) X(scalar_gm_writes) X(vec_instrs)   \
    X(vec_repeats) X(mte2_copies) X(mte2_bytes) X(mte3_copies) X(mte3_bytes) X(ub_copies)         \
    X(ub_bytes) X(pipe_barriers) X(set_flags) X(wait_flags) X(sync_alls) X(queue_syncs) X(dcci)

// ---- Phases ----------------------------------------------------------------
// A kernel marks where its steps begin with AVSG_PHASE(id) (kernel_compat.h; nothing on the NPU
// and in the fast build). The strict build then splits each block's counters by phase: what a
// block issued between two markers belongs to the phase the first one named, what it issued
// before its first marker to phase 0, what it issued after its last one to that phase. Per phase
// the summed fields add up to the block's counters exactly and the *_max fields are the largest
// value seen while the phase ran (their maximum over phases is the block's). vec_by_api is not
// split. The id is an enumerator of the kernel's own phase enum, whose table names the phases.
struct PhaseTable {
    const char* const* names;
    uint32_t count;
};

// ---- Cost model --------------------------------------------------------------
// A first-order model to turn counters into estimated NPU time. It is NOT a
// measurement: every constant below is an assumption, labelled with its origin.
//
//   vector_cycles = vec_instrs * kVecIssueCycles + vec_repeats * kVecCyclesPerRepeat
//   mte_cycles    = copies * kMteIssueCycles + bytes / kMteBytesPerCycle   (MTE2 and MTE3 separately)
//   scalar_cycles = ub_accesses * kScalarUbCycles + gm_accesses * kScalarGmCycles
//   sync_cycles   = pipe_barriers*kBarrierCycles + (set_flags+wait_flags+2*queue_syncs)*kFlagCycles
//                   + sync_alls*kSyncAllCycles + dcci*kDcciCycles
//   serial_ns  = (scalar + vector + mte2 + mte3 + sync) / kClockGHz   (upper bound: no pipe overlap)
//   overlap_ns = (max(scalar, vector, mte2, mte3) + sync) / kClockGHz (lower bound: perfect overlap)
// estimate_ns() returns serial_ns; a launch takes max over blocks (blocks run in parallel).
struct CostModel {
    // ~1.8 GHz AI-core clock of 910B from public spec sheets; assumption, not read from the card.
    static constexpr double kClockGHz = 1.85;
    // One 256 B repeat (8 x 32 B blocks, card §0) retired per cycle; assumption.
    static constexpr double kVecCyclesPerRepeat = 1.0;
    // Fixed issue/pipeline-fill cost per vector instruction; assumption.
    static constexpr double kVecIssueCycles = 10.0;
    // Per-core MTE bandwidth when all 40 cores stream from HBM: ~1.6 TB/s / 40 / 1.85 GHz
    // ~= 21.6 B/cycle; assumption (HBM figure from public spec sheets). Mapped host memory is slower
    // and not modelled.
    static constexpr double kMteBytesPerCycle = 21.6;
    // Fixed cost per DMA issue, chosen so that a 16 KB copy runs at ~90 % of full bandwidth,
    // following the card (§4/§5 design notes: "copies reach full bandwidth from about 16 KB").
    // 16384/21.6 = 758 cycles of transfer -> 758/9 ~= 85 cycles fixed. Assumption.
    static constexpr double kMteIssueCycles = 85.0;
    // Scalar UB access (GetValue/SetValue on LocalTensor): a few cycles; assumption.
    static constexpr double kScalarUbCycles = 2.0;
    // Scalar GM access through the 32 KB DCache (card §2): hit/miss mix average; assumption.
    static constexpr double kScalarGmCycles = 20.0;
    // PipeBarrier drains one pipe; assumption.
    static constexpr double kBarrierCycles = 20.0;
    // One SetFlag or WaitFlag; assumption.
    static constexpr double kFlagCycles = 10.0;
    // Cross-core hard SyncAll ~1 us; assumption.
    static constexpr double kSyncAllCycles = 1850.0;
    // DataCacheCleanAndInvalid of one line; assumption.
    static constexpr double kDcciCycles = 50.0;
};

struct CostBreakdown {
    double scalar_cycles = 0, vector_cycles = 0, mte2_cycles = 0, mte3_cycles = 0, sync_cycles = 0;
    double serial_ns = 0, overlap_ns = 0;
};

inline CostBreakdown estimate(const Counters& c) {
    CostBreakdown b;
    using M = CostModel;
    b.scalar_cycles = (c.scalar_ub_reads + c.scalar_ub_writes) * M::kScalarUbCycles +
                      (c.scalar_gm_reads + c.scalar_gm_writes) * M::kScalarGmCycles;
    b.vector_cycles = c.vec_instrs * M::kVecIssueCycles + c.vec_repeats * M::kVecCyclesPerRepeat;
    b.mte2_cycles = c.mte2_copies * M::kMteIssueCycles + c.mte2_bytes / M::kMteBytesPerCycle;
    b.mte3_cycles = c.mte3_copies * M::kMteIssueCycles + c.mte3_bytes / M::kMteBytesPerCycle;
    b.sync_cycles = c.pipe_barriers * M::kBarrierCycles +
                    (c.set_flags + c.wait_flags + 2 * c.queue_syncs) * M::kFlagCycles +
                    c.sync_alls * M::kSyncAllCycles + c.dcci * M::kDcciCycles;
    double serial = b.scalar_cycles + b.vector_cycles + b.mte2_cycles + b.mte3_cycles + b.sync_cycles;
    double overlap = std::max({b.scalar_cycles, b.vector_cycles, b.mte2_cycles, b.mte3_cycles}) + b.sync_cycles;
    b.serial_ns = serial / M::kClockGHz;
    b.overlap_ns = overlap / M::kClockGHz;
    return b;
}
inline double estimate_ns(const Counters& c) { return estimate(c).serial_ns; }
// Blocks run in parallel: the launch takes as long as its slowest block.
inline double estimate_launch_ns(const std::vector<Counters>& per_block) {
    double m = 0;
    for (auto& c : per_block) m = std::max(m, estimate_ns(c));
    return m;
}
inline Counters total(const std::vector<Counters>& per_block) {
    Counters t;
    for (auto& c : per_block) t += c;
    return t;
}

// ---- Shared by both builds ---------------------------------------------------

inline std::atomic<int>& core_count_ref() {
    static std::atomic<int> n{40};  // 910B3/B4: 40 AIV (card §0)
    return n;
}
// Number of emulated AIV cores; launch() rejects numBlocks above it (card §6/§8.13).
inline void set_core_count(int n) {
    if (n < 1) throw AscendC::EmuError("avsg_emu::set_core_count: core count must be >= 1");
    core_count_ref() = n;
}
inline int core_count() { return core_count_ref().load(); }

// False once a launch ran in the fast build, which counts nothing: the strict build's
// last_launch_counters() then describe an older launch, and readers must not report them.
inline std::atomic<bool>& last_launch_counted_ref() {
    static std::atomic<bool> counted{true};
    return counted;
}
inline bool last_launch_counted() { return last_launch_counted_ref().load(); }

inline namespace AVSG_EMU_VARIANT {

// Which build this translation unit sees (if constexpr switches below).
constexpr bool kStrict = AVSG_EMU_STRICT;

// ---- Launch state, barrier, block context -----------------------------------

// Thrown in blocks waiting in SyncAll when the launch is broken (another block failed or
// exited early). The launcher prefers the original error when rethrowing.
class BrokenBarrier : public AscendC::EmuError {
public:
    using AscendC::EmuError::EmuError;
};

// A reusable barrier for SyncAll that can be broken so no block deadlocks.
class Barrier {
public:
    explicit Barrier(uint32_t n) : n_(n) {}
    void arrive_and_wait(uint32_t block) {
        std::unique_lock<std::mutex> lk(m_);
        if (broken_) throw BrokenBarrier(reason_);
        if (exited_ > 0) {
            break_locked("SyncAll: block " + std::to_string(block) + " waits for a block that already exited "
                         "(blocks called SyncAll a different number of times: on the NPU this deadlocks, card §6)");
            throw BrokenBarrier(reason_);
        }
        uint64_t gen = gen_;
        if (++waiting_ == n_) {
            waiting_ = 0;
            ++gen_;
            cv_.notify_all();
            return;
        }
        cv_.wait(lk, [&] { return gen_ != gen || broken_; });
        if (gen_ == gen && broken_) throw BrokenBarrier(reason_);
    }
    void block_exited(bool failed, uint32_t block) {
        std::lock_guard<std::mutex> lk(m_);
        ++exited_;
        if (failed)
            break_locked("SyncAll: aborted because block " + std::to_string(block) + " failed");
        else if (waiting_ > 0)
            break_locked("SyncAll: block " + std::to_string(block) +
                         " exited while other blocks wait in SyncAll (unequal SyncAll counts deadlock on the NPU, card §6)");
    }

private:
    void break_locked(const std::string& why) {
        if (!broken_) reason_ = why;
        broken_ = true;
        cv_.notify_all();
    }
    std::mutex m_;
    std::condition_variable cv_;
    uint32_t n_, waiting_ = 0, exited_ = 0;
    uint64_t gen_ = 0;
    bool broken_ = false;
    std::string reason_;
};

struct FiberBlocks;

struct LaunchState {
    explicit LaunchState(uint32_t n) : num_blocks(n), barrier(n) {}
    uint32_t num_blocks;
    Barrier barrier;
    // Fast build: blocks run one after another on the launcher's stack until block 0 calls
    // SyncAll; from then on blocks 1..n-1 are fibers that block 0's SyncAll runs up to the barrier
    // (launch_sequential). Null until then.
    FiberBlocks* fibers = nullptr;
    std::function<void()> start_fibers;
    // GM granule ownership (strict build, granule_checks() on): per 32 B GM granule written by DMA
    // in this launch, the block that last wrote it and how many SyncAlls that block had passed.
    // Whether two cores' partial writes of one granule are safe is undocumented, so a second
    // writer between the same two SyncAlls is an error; a SyncAll orders writes on either side of
    // it (the split lookup's helpers store a chunk the owner patches after the barrier).
    struct GranuleWriter {
        uint32_t block;
        uint64_t epoch;
    };
    std::mutex granule_mu;
    std::unordered_map<uintptr_t, GranuleWriter> granule_owner;
};

// On by default in the strict build: every output pitch is padded to 32 B. AVSG_EMU_GRANULE_CHECK=0
// in the environment (read once) or set_granule_checks(false) turns the check off for later
// launches (to drive a layout the ops refuse).
inline std::atomic<bool>& granule_checks_ref() {
    static std::atomic<bool> on{[] {
        const char* e = std::getenv("AVSG_EMU_GRANULE_CHECK");
        return e == nullptr || e[0] != '0';
    }()};
    return on;
}
inline void set_granule_checks(bool on) { granule_checks_ref() = on; }
inline bool granule_checks() { return granule_checks_ref().load(); }

// Global mutex for emulated DMA atomics (SetAtomicAdd) across blocks.
inline std::mutex& atomic_mutex() {
    static std::mutex m;
    return m;
}

// ---- Pipe-hazard scoreboard state (card §9 "Pipe hazards"; logic and modelling notes in
// emu_hazard.h). Pipes of an AIV core that the scoreboard models:
enum HzPipe : uint8_t { kHzS = 0, kHzV = 1, kHzMte2 = 2, kHzMte3 = 3, kHzPipes = 4 };
// One 32 B granule of UB or GM: per pipe, the bytes it last wrote / read (byte mask) and the
// epoch (per-pipe instruction number) of that access, plus the API that did it.
struct HzRec {
    uint32_t wmask[kHzPipes] = {}, rmask[kHzPipes] = {};
    uint32_t wep[kHzPipes] = {}, rep[kHzPipes] = {};
    uint8_t wapi[kHzPipes] = {}, rapi[kHzPipes] = {};
};
struct Scoreboard {
    uint32_t epoch[kHzPipes] = {};             // instructions issued so far, per pipe
    uint32_t vc[kHzPipes][kHzPipes] = {};      // vc[B][A]: A's instructions <= vc[B][A] are complete
                                               // before B's next instruction starts
    uint32_t flag_snap[12][8][kHzPipes] = {};  // what a pending SetFlag(event, id) covers
    std::vector<HzRec> ub;                     // per 32 B UB granule, grown on demand
    std::unordered_map<uint64_t, HzRec> gm;    // per 32 B GM granule touched by this block
    std::deque<std::pair<uint32_t, uint64_t>> mte2_pending;  // (epoch, bytes) of GM->UB copies
                                                              // no other pipe has waited for yet
};
inline std::atomic<uint32_t>& tpipe_base_ref() {
    static std::atomic<uint32_t> base{kDefaultTPipeBase};
    return base;
}
// UB offset of the first TPipe buffer (32 B aligned, at most the 8 KB TPipe does not hand out).
inline void set_tpipe_base(uint32_t bytes) {
    if (bytes % kUbAlign != 0 || bytes > kUbPhysicalBytes - kUbTPipeBytes)
        throw AscendC::EmuError("avsg_emu::set_tpipe_base: expected a multiple of 32 B <= 8 KB, got " +
                                std::to_string(bytes));
    tpipe_base_ref() = bytes;
}
inline uint32_t tpipe_base() { return tpipe_base_ref().load(); }

inline std::atomic<bool>& hazard_checks_ref() {
    static std::atomic<bool> on{true};
    return on;
}
// Escape hatch for the emulation's own unit tests: launches started while it is false run
// without the scoreboard. The default is on (strict); kernels must pass with it on.
inline void set_hazard_checks(bool on) { hazard_checks_ref() = on; }
inline bool hazard_checks() { return hazard_checks_ref().load(); }

struct BlockContext {
    uint32_t idx = 0, num = 1;
    LaunchState* launch = nullptr;
    uint8_t* ub = nullptr;  // kUbPhysicalBytes, 64-byte aligned host memory
    Counters counters;
    void* live_pipe = nullptr;            // the one TPipe allowed (card §3)
    bool flag_set[12][8] = {};            // SetFlag state per (event, id) (card §6)
    uint32_t sync_all_calls = 0;          // soft SyncAll call count
    // The vector mask register (norm mode: bit i of lo / hi enables lane i / 64 + i of a repeat) as
    // A2's count-form Compare / Compares find it: they issue under whatever mask is set (dav_c220
    // kernel_operator_vec_cmp_impl.h, CompareCompute / CompareScalarCompute pass MASK_PLACEHOLDER and
    // the level-0 calls write no mask). The instructions that leave it partial, as their A2 code
    // ends (asc-devkit dav_c220): GatherMask (0, its count), Gather (its last repeat's lanes: the
    // tail, or 64 lanes of a 32-bit type, which leaves hi 0), CreateVecIndex past its first 32 B
    // (its last level-0 Adds), ReduceMax / ReduceMin (their last vcmax / vcmin step) and Extract
    // (two GatherMasks in normal mode, (0, 0)). It starts full (TPipe's constructor, InitSocState)
    // and ResetMask sets it full. Every other instruction is taken to leave it as it found it
    // (the level-2 count forms restore it full on the NPU: the model only asks for more ResetMask
    // calls than needed, never fewer). vector_mask_by names the API that last left it partial.
    uint64_t vector_mask_hi = ~0ull, vector_mask_lo = ~0ull;
    const char* vector_mask_by = nullptr;
    // DMA atomic add (SetAtomicAdd<T>): accumulate function for UB->GM copies, or null.
    void (*atomic_add)(uint8_t* dst, const uint8_t* src, size_t bytes) = nullptr;
    std::unique_ptr<Scoreboard> hz;       // pipe-hazard scoreboard, null when checks are off
    // AVSG_PHASE state (strict build): the phase running, the summed counters when it began
    // (vec_by_api empty), what each phase issued so far; the table of the first marker.
    const PhaseTable* phase_table = nullptr;
    uint32_t phase = 0;
    Counters phase_start;
    std::vector<Counters> phases;
};

inline thread_local BlockContext* tls_block = nullptr;

[[noreturn]] inline void fail(const std::string& msg) {
    std::string prefix = "AscendC emulation";
    if (tls_block) {
        prefix += " [block " + std::to_string(tls_block->idx);
        // the kernel's phase (AVSG_PHASE, strict build): where in the kernel the failure arose
        if (tls_block->phase_table && tls_block->phase < tls_block->phase_table->count)
            prefix += std::string(", phase ") + tls_block->phase_table->names[tls_block->phase];
        prefix += "]";
    }
    throw AscendC::EmuError(prefix + ": " + msg);
}

// ascendc_assert(expr[, fmt, ...]) (asc-devkit include/utils/debug/asc_assert.h): on the NPU a
// failed assertion traps the kernel unless built with NDEBUG / ASCENDC_DUMP=0; here it raises
// naming the expression, in both builds (a kernel invariant, not an API rule).
#define ascendc_assert(expr, ...)                                                               \
    (static_cast<bool>(expr) ? void(0)                                                          \
                             : ::avsg_emu::fail(std::string("ascendc_assert(") + #expr + ") failed at " + \
                                                __FILE__ + ":" + std::to_string(__LINE__)))

inline BlockContext& ctx(const char* api) {
    if constexpr (!kStrict) return *tls_block;
    if (!tls_block)
        throw AscendC::EmuError(std::string("AscendC emulation: ") + api +
                                " called outside avsg_emu::launch (kernel code must run inside a launched block)");
    return *tls_block;
}

inline std::mutex& last_mutex() {
    static std::mutex m;
    return m;
}
inline std::vector<Counters>& last_counters_ref() {
    static std::vector<Counters> v;
    return v;
}
// Per-block counters of the most recent launch (also recorded when it failed).
inline std::vector<Counters> last_launch_counters() {
    std::lock_guard<std::mutex> lk(last_mutex());
    return last_counters_ref();
}

// Charges what the block issued since its current phase began to that phase. The *_max fields
// restart per phase (finish_phases restores the block's own).
inline void close_phase(BlockContext& c) {
    if (c.phases.size() <= c.phase) c.phases.resize(c.phase + 1);
    Counters& p = c.phases[c.phase];
#define AVSG_EMU_PHASE_ADD(f) p.f += c.counters.f - c.phase_start.f; c.phase_start.f = c.counters.f;
    AVSG_EMU_SUMMED_COUNTERS(AVSG_EMU_PHASE_ADD)
#undef AVSG_EMU_PHASE_ADD
    p.mte2_inflight_max = std::max(p.mte2_inflight_max, c.counters.mte2_inflight_max);
    p.mte2_inflight_bytes_max = std::max(p.mte2_inflight_bytes_max, c.counters.mte2_inflight_bytes_max);
    c.counters.mte2_inflight_max = 0;
    c.counters.mte2_inflight_bytes_max = 0;
}

// AVSG_PHASE(id) in the strict build: phase `id` of `table` begins on this block.
inline void mark_phase(const PhaseTable& table, uint32_t id) {
    BlockContext& c = ctx("AVSG_PHASE");
    if (c.phase_table != &table) {
        if (c.phase_table) fail("AVSG_PHASE: one launch marks phases of two phase enums");
        c.phase_table = &table;
        c.phases.reserve(table.count);
    }
    if (id >= table.count)
        fail("AVSG_PHASE: phase id " + std::to_string(id) + " outside its table of " + std::to_string(table.count));
    close_phase(c);
    c.phase = id;
}

// After the block's body (returned or failed): the last phase closed, the block's *_max
// counters back to their maximum over its phases. A block without markers has one phase.
inline void finish_phases(BlockContext& c) {
    close_phase(c);
    for (const Counters& p : c.phases) {
        c.counters.mte2_inflight_max = std::max(c.counters.mte2_inflight_max, p.mte2_inflight_max);
        c.counters.mte2_inflight_bytes_max = std::max(c.counters.mte2_inflight_bytes_max, p.mte2_inflight_bytes_max);
    }
}

// The phases of the most recent strict launch: their names (the first marker's table; one phase,
// "kernel", if no block marked any) and per block, per phase the counters charged to it.
struct LaunchPhases {
    std::vector<std::string> names;
    std::vector<std::vector<Counters>> per_block;
};
inline LaunchPhases& last_phases_ref() {
    static LaunchPhases p;
    return p;
}
inline LaunchPhases last_launch_phases() {
    std::lock_guard<std::mutex> lk(last_mutex());
    return last_phases_ref();
}

// Called by the launcher after a block body returned normally: the block must not leave
// a SetFlag without its WaitFlag (card §6: unmatched Sets make later barriers hang).
inline void check_block_end(BlockContext& c) {
    for (int e = 0; e < 12; ++e)
        for (int id = 0; id < 8; ++id)
            if (c.flag_set[e][id])
                fail(std::string("SetFlag<HardEvent::") + AscendC::HardEventName(static_cast<AscendC::HardEvent>(e)) +
                     ">(" + std::to_string(id) + ") has no matching WaitFlag at kernel end (card §6: Set and Wait must match)");
}

// Strict build: one std::thread per block, fresh poisoned UB arenas, counters recorded.
inline void launch_threads(uint32_t numBlocks, const std::function<void()>& kernelBody) {
    LaunchState state(numBlocks);
    std::vector<std::unique_ptr<BlockContext>> blocks(numBlocks);
    std::vector<std::exception_ptr> errors(numBlocks);
    std::vector<bool> secondary(numBlocks, false);
    std::vector<uint64_t> error_order(numBlocks, 0);
    std::atomic<uint64_t> order{0};
    struct UbFree { void operator()(uint8_t* p) const { std::free(p); } };
    std::vector<std::unique_ptr<uint8_t, UbFree>> arenas(numBlocks);
    for (uint32_t b = 0; b < numBlocks; ++b) {
        arenas[b].reset(static_cast<uint8_t*>(std::aligned_alloc(64, kUbPhysicalBytes)));
        if (!arenas[b]) throw AscendC::EmuError("avsg_emu::launch: out of host memory for UB arenas");
        std::memset(arenas[b].get(), kPoisonByte, kUbPhysicalBytes);
        blocks[b].reset(new BlockContext());
        blocks[b]->idx = b;
        blocks[b]->num = numBlocks;
        blocks[b]->launch = &state;
        blocks[b]->ub = arenas[b].get();
        if (hazard_checks()) blocks[b]->hz.reset(new Scoreboard());
    }
    auto run = [&](uint32_t b) {
        tls_block = blocks[b].get();
        bool failed = false;
        try {
            kernelBody();
            check_block_end(*blocks[b]);
        } catch (const BrokenBarrier&) {
            failed = true;
            errors[b] = std::current_exception();
            secondary[b] = true;
            error_order[b] = ++order;
        } catch (...) {
            failed = true;
            errors[b] = std::current_exception();
            error_order[b] = ++order;
        }
        state.barrier.block_exited(failed, b);
        tls_block = nullptr;
    };
    std::vector<std::thread> threads;
    threads.reserve(numBlocks);
    for (uint32_t b = 0; b < numBlocks; ++b) threads.emplace_back(run, b);
    for (auto& t : threads) t.join();
    LaunchPhases phases;
    for (auto& bc : blocks) {
        finish_phases(*bc);
        if (bc->phase_table && phases.names.empty())
            phases.names.assign(bc->phase_table->names, bc->phase_table->names + bc->phase_table->count);
    }
    if (phases.names.empty()) phases.names = {"kernel"};
    for (auto& bc : blocks) {
        bc->phases.resize(phases.names.size());
        phases.per_block.push_back(std::move(bc->phases));
    }
    {
        std::lock_guard<std::mutex> lk(last_mutex());
        auto& v = last_counters_ref();
        v.clear();
        for (auto& bc : blocks) v.push_back(bc->counters);
        last_phases_ref() = std::move(phases);
        last_launch_counted_ref() = true;
    }
    // Prefer the earliest original error; fall back to the earliest secondary one.
    int best = -1;
    for (int pass = 0; pass < 2 && best < 0; ++pass)
        for (uint32_t b = 0; b < numBlocks; ++b)
            if (errors[b] && (pass == 1 || !secondary[b]) && (best < 0 || error_order[b] < error_order[best]))
                best = static_cast<int>(b);
    if (best >= 0) std::rethrow_exception(errors[best]);
}

// Fast build: UB arenas and fiber stacks of the calling thread, allocated once and reused by
// every launch it runs (no poisoning: a kernel that passes the strict build never reads UB it did
// not write). Arena 0 serves every block of a launch without SyncAll, so it stays hot; a launch
// with SyncAll needs one per block, since blocks then hold their UB across the barrier.
struct FastPool {
    struct UbFree { void operator()(uint8_t* p) const { std::free(p); } };
    struct StackFree { void operator()(void* p) const { munmap(p, kFiberStackBytes); } };
    // virtual address space only (pages are committed when touched): the size of a thread's stack
    static constexpr size_t kFiberStackBytes = 8u << 20;
    static constexpr size_t kGuardBytes = 64u << 10;   // a multiple of any page size in use
    std::vector<std::unique_ptr<uint8_t, UbFree>> arenas;
    std::vector<std::unique_ptr<void, StackFree>> stacks;
    uint8_t* arena(uint32_t i) {
        while (arenas.size() <= i) {
            arenas.emplace_back(static_cast<uint8_t*>(std::aligned_alloc(64, kUbPhysicalBytes)));
            if (!arenas.back()) {
                arenas.pop_back();
                throw AscendC::EmuError("avsg_emu::launch: out of host memory for a UB arena");
            }
        }
        return arenas[i].get();
    }
    void* stack(uint32_t i) {
        while (stacks.size() <= i) {
            void* p = mmap(nullptr, kFiberStackBytes, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
            if (p == MAP_FAILED) throw AscendC::EmuError("avsg_emu::launch: out of address space for a block's stack");
            // a guard page below the stack (it grows down): an overflow faults, as on a thread's
            // stack, instead of writing into whatever lies below
            if (mprotect(p, kGuardBytes, PROT_NONE) != 0) {
                munmap(p, kFiberStackBytes);
                throw AscendC::EmuError("avsg_emu::launch: cannot protect a block stack's guard page");
            }
            stacks.emplace_back(p);
        }
        return stacks[i].get();
    }
};
inline FastPool& fast_pool() {
    thread_local FastPool pool;
    return pool;
}

// Fast build: blocks 1..n-1 of a launch whose block 0 called SyncAll, each a fiber (ucontext) on
// the launcher's thread. Block 0 stays on the launcher's stack and is the scheduler: its SyncAll
// resumes every other block, in index order, until that block waits in its own SyncAll (it
// switches back) or ends; when all of them wait, the barrier is complete and block 0 goes on.
// After block 0 ends, the launcher resumes each block to its end. One thread, no thread starts,
// and a block's SyncAll is a pair of context switches. Unequal SyncAll counts and failures break
// the barrier as in the strict build: every waiting block is resumed to throw BrokenBarrier, so
// each fiber unwinds its own stack before the launch returns.
struct FiberBlocks {
    uint32_t n = 0;
    std::vector<ucontext_t> ctx;
    ucontext_t sched{};                    // whoever resumed the running fiber
    std::vector<uint8_t> started, done, waiting;
    bool block0_exited = false;
    bool broken = false;
    std::string reason;
    std::function<void(uint32_t)> body;    // runs block b (records its error), on its fiber
    std::vector<BlockContext*> blocks;
    uint32_t current = 0;
    void brk(const std::string& why) {
        if (!broken) reason = why;
        broken = true;
    }
};
inline thread_local FiberBlocks* tls_fibers = nullptr;
inline void fiber_entry() {
    FiberBlocks& f = *tls_fibers;
    const uint32_t b = f.current;
    f.body(b);                             // catches everything: nothing unwinds past a fiber
    f.done[b] = 1;
    // returns to f.sched through uc_link
}
// Runs block b (1..n-1) until it waits in SyncAll or ends; tls_block is b's meanwhile.
inline void fiber_resume(FiberBlocks& f, uint32_t b, BlockContext* self, BlockContext* blk) {
    f.current = b;
    tls_block = blk;
    if (!f.started[b]) {
        f.started[b] = 1;
        if (getcontext(&f.ctx[b]) != 0) throw AscendC::EmuError("avsg_emu::launch: getcontext failed");
        f.ctx[b].uc_stack.ss_sp = static_cast<uint8_t*>(fast_pool().stack(b)) + FastPool::kGuardBytes;
        f.ctx[b].uc_stack.ss_size = FastPool::kFiberStackBytes - FastPool::kGuardBytes;
        f.ctx[b].uc_link = &f.sched;
        makecontext(&f.ctx[b], &fiber_entry, 0);
    }
    FiberBlocks* outer = tls_fibers;
    tls_fibers = &f;
    swapcontext(&f.sched, &f.ctx[b]);
    tls_fibers = outer;
    tls_block = self;
}

// Fast build, SyncAll (emu_sync.h): block 0 schedules the fibers of the other blocks, which
// switch back to it from their own SyncAll.
inline void fiber_sync_all(BlockContext& c) {
    const std::string unequal = " (blocks called SyncAll a different number of times: on the NPU this deadlocks, card §6)";
    LaunchState& launch = *c.launch;
    if (c.idx != 0) {
        if (!launch.fibers)
            fail("SyncAll: block " + std::to_string(c.idx) + " calls SyncAll but block 0 finished without it" + unequal);
        FiberBlocks& f = *launch.fibers;
        if (f.broken) throw BrokenBarrier(f.reason);
        if (f.block0_exited) {
            f.brk("SyncAll: block " + std::to_string(c.idx) + " waits for a block that already exited" + unequal);
            throw BrokenBarrier(f.reason);
        }
        f.waiting[c.idx] = 1;
        swapcontext(&f.ctx[c.idx], &f.sched);
        f.waiting[c.idx] = 0;
        if (f.broken) throw BrokenBarrier(f.reason);
        return;
    }
    if (!launch.fibers) launch.start_fibers();
    FiberBlocks& f = *launch.fibers;
    for (uint32_t b = 1; b < f.n && !f.broken; ++b) {
        if (f.done[b]) {
            f.brk("SyncAll: block 0 waits for a block that already exited" + unequal);
            break;
        }
        fiber_resume(f, b, &c, f.blocks[b]);
        if (f.done[b])
            f.brk("SyncAll: block " + std::to_string(b) +
                  " exited while other blocks wait in SyncAll (unequal SyncAll counts deadlock on the NPU, card §6)");
    }
    if (!f.broken) return;   // every block waits in this SyncAll: the barrier is complete
    for (uint32_t b = 1; b < f.n; ++b)
        if (f.started[b] && !f.done[b]) fiber_resume(f, b, &c, f.blocks[b]);   // throws BrokenBarrier there
    throw BrokenBarrier(f.reason);
}

// Fast build: blocks run in index order on the calling thread, which saves a thread start per
// block and keeps one UB arena hot. Blocks of a kernel without SyncAll only meet in GM regions
// the kernel must keep disjoint anyway (no cross-block ordering exists on the NPU without
// SyncAll), so the order cannot change the result. A kernel with SyncAll cannot run that way:
// block 0 reaches its first SyncAll before any other block ran; that SyncAll makes blocks
// 1..n-1 fibers and runs them up to the barrier (FiberBlocks), each with its own UB arena. Equal
// SyncAll counts across blocks are required on the NPU, so block 0 calling SyncAll is the only
// way a launch meets one.
inline void launch_sequential(uint32_t numBlocks, const std::function<void()>& kernelBody) {
    LaunchState state(numBlocks);
    std::vector<BlockContext> blocks(numBlocks);
    std::vector<std::exception_ptr> errors(numBlocks);
    std::vector<bool> secondary(numBlocks, false);
    std::vector<uint64_t> error_order(numBlocks, 0);
    uint64_t order = 0;
    FastPool& pool = fast_pool();
    FiberBlocks fibers;
    for (uint32_t b = 0; b < numBlocks; ++b) {
        blocks[b].idx = b;
        blocks[b].num = numBlocks;
        blocks[b].launch = &state;
    }
    auto run_block = [&](uint32_t b) {
        BlockContext& c = blocks[b];
        bool failed = false;
        try {
            c.ub = pool.arena(state.fibers ? b : 0);
            tls_block = &c;
            kernelBody();
        } catch (const BrokenBarrier&) {
            failed = true;
            errors[b] = std::current_exception();
            secondary[b] = true;
            error_order[b] = ++order;
        } catch (...) {
            failed = true;
            errors[b] = std::current_exception();
            error_order[b] = ++order;
        }
        if (failed && state.fibers) state.fibers->brk("SyncAll: aborted because block " + std::to_string(b) + " failed");
        tls_block = nullptr;
    };
    state.start_fibers = [&] {
        fibers.n = numBlocks;
        fibers.ctx.resize(numBlocks);
        fibers.started.assign(numBlocks, 0);
        fibers.done.assign(numBlocks, 0);
        fibers.waiting.assign(numBlocks, 0);
        fibers.body = run_block;
        for (auto& bc : blocks) fibers.blocks.push_back(&bc);
        pool.arena(numBlocks - 1);   // every arena and stack before the first switch
        for (uint32_t b = 1; b < numBlocks; ++b) pool.stack(b);
        state.fibers = &fibers;
    };
    for (uint32_t b = 0; b < numBlocks && !state.fibers; ++b) {
        run_block(b);
        if (errors[b]) break;  // as a hang or abort on the NPU: the first failure is the result
    }
    if (state.fibers) {        // block 0 ended (or failed) after its SyncAlls: the others end now
        fibers.block0_exited = true;
        for (uint32_t b = 1; b < numBlocks; ++b)
            while (fibers.started[b] && !fibers.done[b]) fiber_resume(fibers, b, nullptr, &blocks[b]);
    }
    last_launch_counted_ref() = false;
    int best = -1;
    for (int pass = 0; pass < 2 && best < 0; ++pass)
        for (uint32_t b = 0; b < numBlocks; ++b)
            if (errors[b] && (pass == 1 || !secondary[b]) && (best < 0 || error_order[b] < error_order[best]))
                best = static_cast<int>(b);
    if (best >= 0) std::rethrow_exception(errors[best]);
}

// Non-template body of launch() (kept out of line of the template to keep compile times low).
inline void launch_impl(uint32_t numBlocks, const std::function<void()>& kernelBody) {
    if (tls_block) throw AscendC::EmuError("avsg_emu::launch: nested launch from inside a block");
    if (numBlocks == 0 || numBlocks > 65535)
        throw AscendC::EmuError("avsg_emu::launch: numBlocks=" + std::to_string(numBlocks) +
                                " outside 1..65535 (card §1)");
    if (numBlocks > static_cast<uint32_t>(core_count()))
        throw AscendC::EmuError("avsg_emu::launch: numBlocks=" + std::to_string(numBlocks) +
                                " exceeds the configured core count " + std::to_string(core_count()) +
                                " (card §6: numBlocks above the physical cores deadlocks SyncAll)");
    if constexpr (kStrict) launch_threads(numBlocks, kernelBody);
    else launch_sequential(numBlocks, kernelBody);
}

// numBlocks must be in 1..min(65535, core_count()).
template <class Fn>
void launch(uint32_t numBlocks, Fn&& kernelBody) {
    launch_impl(numBlocks, std::function<void()>(std::ref(kernelBody)));
}

// ACLRT_LAUNCH_KERNEL(k)(numBlocks, stream, args...) emulation (card §1, §9): host code written
// for the generated aclrtlaunch_<k> header works unchanged; void* arguments convert to GM_ADDR.
namespace detail {
template <class P, class A>
P convert_arg(A a) {
    if constexpr (std::is_pointer<P>::value && std::is_pointer<A>::value)
        return reinterpret_cast<P>(const_cast<void*>(static_cast<const void*>(a)));
    else
        return static_cast<P>(a);
}
template <class... P>
struct AclrtLauncher {
    void (*kernel)(P...);
    template <class... A>
    uint32_t operator()(uint32_t numBlocks, void* /*stream*/, A... args) const {
        static_assert(sizeof...(A) == sizeof...(P), "ACLRT_LAUNCH_KERNEL: wrong number of kernel arguments");
        auto k = kernel;
        launch(numBlocks, [&] { k(convert_arg<P>(args)...); });
        return 0;
    }
};
template <class... P>
AclrtLauncher<P...> make_aclrt_launcher(void (*k)(P...)) { return AclrtLauncher<P...>{k}; }
}  // namespace detail

}  // inline namespace AVSG_EMU_VARIANT
}  // namespace avsg_emu

#define ACLRT_LAUNCH_KERNEL(k) ::avsg_emu::detail::make_aclrt_launcher(&k)
// AVSG_EMU_LAUNCH(kernel, blockDim, args...) == avsg_emu::launch(blockDim, [&]{ kernel(args...); })
#define AVSG_EMU_LAUNCH(kernel, blockDim, ...) ::avsg_emu::launch((blockDim), [&] { kernel(__VA_ARGS__); })
