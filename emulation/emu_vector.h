// emu_vector.h: vector compute APIs (card §5), count ("first n") forms only.
// Each API: static_assert on the A2 dtype list, run-time checks (32 B alignment, size
// overflow, repeat granularity, modes), eager execution, and counting of one vector
// instruction plus its 256 B repeats (Counters::vec_*).
#pragma once
#include "emu_tensor.h"

#include <cfloat>
#include <cstdio>

namespace AscendC {
inline namespace AVSG_EMU_VARIANT {
namespace emu_detail {
using avsg_emu::fail;
using avsg_emu::detail::check_ub;
using avsg_emu::detail::is_one_of_v;

template <class T>
constexpr bool is_arith_v = is_one_of_v<T, int16_t, half, int32_t, float>;  // Add/Sub/Mul/Adds/Muls/Maxs/Mins/Max/Min
template <class T>
constexpr bool is_hf_v = is_one_of_v<T, half, float>;

// An instruction leaves the vector mask register at (hi, lo) (BlockContext::vector_mask_hi; the
// count-form compares check it: check_full_mask).
inline void leave_mask(const char* api, uint64_t hi, uint64_t lo) {
    if constexpr (!avsg_emu::kStrict) return;
    avsg_emu::BlockContext& c = avsg_emu::ctx(api);
    c.vector_mask_hi = hi;
    c.vector_mask_lo = lo;
    c.vector_mask_by = (hi == ~0ull && lo == ~0ull) ? nullptr : api;
}
// ... at `len` lanes of T, as AscendCUtils::SetMask<T>(int32_t len) writes them (asc-devkit
// impl/basic_api/kernel_utils_base.h): 64 lanes -> (0, all), a whole repeat or >= 128 -> full.
template <class T>
inline void leave_mask_lanes(const char* api, uint32_t len) {
    constexpr uint64_t kAll = ~0ull;
    if (len == 64) return leave_mask(api, 0, kAll);
    if (len == 256 / sizeof(T) || len >= 128) return leave_mask(api, kAll, kAll);
    if (len > 64) return leave_mask(api, (1ull << (len - 64)) - 1, kAll);
    leave_mask(api, 0, (1ull << len) - 1);
}

inline void vec_issue(const char* api, uint64_t repeats) {
    if constexpr (!avsg_emu::kStrict) return;  // fast build: nothing is counted
    auto& c = avsg_emu::ctx(api).counters;
    c.vec_instrs++;
    c.vec_repeats += repeats;
    auto& s = c.vec_by_api[api];
    s.instrs++;
    s.repeats += repeats;
}
inline uint64_t reps_for(uint64_t bytes) { return (bytes + avsg_emu::kRepeatBytes - 1) / avsg_emu::kRepeatBytes; }

// Count forms take `const int32_t& count`; a negative count is a caller bug.
inline uint32_t checked_count(const char* api, int32_t count) {
    if (avsg_emu::kStrict && count < 0) fail(std::string(api) + ": negative count " + std::to_string(count));
    return static_cast<uint32_t>(count);
}

// Card §0 "Address overlap": within one repeat src and dst overlap exactly or not at all.
// Partial overlap is rejected (the documented Add/Sub/Mul/Max/Min exception is allowed).
template <class T, class U>
void check_overlap(const char* api, const LocalTensor<T>& dst, uint64_t dbytes, const LocalTensor<U>& src,
                   uint64_t sbytes, bool allow_partial = false) {
    if constexpr (!avsg_emu::kStrict) return;  // fast build: checks compiled out
    if (allow_partial || dst.GetPhyAddr() == src.GetPhyAddr()) return;
    if (avsg_emu::detail::ranges_overlap(dst.bytes(), dbytes, src.bytes(), sbytes))
        fail(std::string(api) + ": dst and src overlap partially (card §0: they must overlap exactly or not at all)");
}

// Element arithmetic: integers wrap (two's complement; ⚠️ card §10 says int32 overflow
// behaviour is undocumented), half/float compute in float and round back.
template <class T>
struct Ar {
    using UT = std::conditional_t<std::is_integral<T>::value, std::make_unsigned_t<std::conditional_t<std::is_integral<T>::value, T, int>>, T>;
    static T add(T a, T b) {
        if constexpr (std::is_integral<T>::value) return static_cast<T>(static_cast<uint32_t>(static_cast<UT>(a)) + static_cast<UT>(b));
        else return T(static_cast<float>(a) + static_cast<float>(b));
    }
    static T sub(T a, T b) {
        if constexpr (std::is_integral<T>::value) return static_cast<T>(static_cast<uint32_t>(static_cast<UT>(a)) - static_cast<UT>(b));
        else return T(static_cast<float>(a) - static_cast<float>(b));
    }
    static T mul(T a, T b) {
        if constexpr (std::is_integral<T>::value)
            return static_cast<T>(static_cast<uint32_t>(static_cast<UT>(a)) * static_cast<uint32_t>(static_cast<UT>(b)));
        else return T(static_cast<float>(a) * static_cast<float>(b));
    }
    static T div(T a, T b) { return T(static_cast<float>(a) / static_cast<float>(b)); }
    static T max(T a, T b) {
        if constexpr (std::is_integral<T>::value) return a > b ? a : b;
        else return static_cast<float>(a) >= static_cast<float>(b) ? a : b;
    }
    static T min(T a, T b) {
        if constexpr (std::is_integral<T>::value) return a < b ? a : b;
        else return static_cast<float>(a) <= static_cast<float>(b) ? a : b;
    }
};

template <class T, class F>
void binary(const char* api, const LocalTensor<T>& dst, const LocalTensor<T>& s0, const LocalTensor<T>& s1,
            int32_t count, bool allow_overlap, F f) {
    uint32_t n = checked_count(api, count);
    check_ub(api, "dst", dst, n);
    check_ub(api, "src0", s0, n);
    check_ub(api, "src1", s1, n);
    if (n == 0) return;
    check_overlap(api, dst, n * sizeof(T), s0, n * sizeof(T), allow_overlap);
    check_overlap(api, dst, n * sizeof(T), s1, n * sizeof(T), allow_overlap);
    {
        avsg_emu::hz::Instr hi(avsg_emu::kHzV, api);
        avsg_emu::detail::hz_rd(hi, s0, n * sizeof(T));
        avsg_emu::detail::hz_rd(hi, s1, n * sizeof(T));
        avsg_emu::detail::hz_wr(hi, dst, n * sizeof(T));
    }
    T* d = dst.ptr();
    const T* a = s0.ptr();
    const T* b = s1.ptr();
    for (uint32_t i = 0; i < n; ++i) d[i] = f(a[i], b[i]);
    vec_issue(api, reps_for(n * sizeof(T)));
}
template <class T, class F>
void unary(const char* api, const LocalTensor<T>& dst, const LocalTensor<T>& s, int32_t count, F f) {
    uint32_t n = checked_count(api, count);
    check_ub(api, "dst", dst, n);
    check_ub(api, "src", s, n);
    if (n == 0) return;
    check_overlap(api, dst, n * sizeof(T), s, n * sizeof(T));
    {
        avsg_emu::hz::Instr hi(avsg_emu::kHzV, api);
        avsg_emu::detail::hz_rd(hi, s, n * sizeof(T));
        avsg_emu::detail::hz_wr(hi, dst, n * sizeof(T));
    }
    T* d = dst.ptr();
    const T* a = s.ptr();
    for (uint32_t i = 0; i < n; ++i) d[i] = f(a[i]);
    vec_issue(api, reps_for(n * sizeof(T)));
}
}  // namespace emu_detail

// ---------------------------------------------------------------------------
// Fill / index
// ---------------------------------------------------------------------------
template <class T>
__aicore__ inline void Duplicate(const LocalTensor<T>& dst, const T& scalarValue, const int32_t& count) {
    static_assert(emu_detail::is_one_of_v<T, int16_t, uint16_t, half, bfloat16_t, int32_t, uint32_t, float>,
                  "Duplicate: T must be int16/uint16/half/bf16/int32/uint32/float on A2 (card §5)");
    const char* api = "Duplicate";
    uint32_t n = emu_detail::checked_count(api, count);
    emu_detail::check_ub(api, "dst", dst, n);
    if (n == 0) return;
    {
        avsg_emu::hz::Instr hi(avsg_emu::kHzV, api);
        avsg_emu::detail::hz_wr(hi, dst, n * sizeof(T));
    }
    T* d = dst.ptr();
    for (uint32_t i = 0; i < n; ++i) d[i] = scalarValue;
    emu_detail::vec_issue(api, emu_detail::reps_for(n * sizeof(T)));
}

namespace emu_detail {
// The A2 implementation (card §5; asc-devkit dav_c220 CreateVecIndexCalc): scalar SetValue of the
// first 32 B, SetFlag/WaitFlag<S_V>, Adds over blocks 2..8 (PipeBarrier<PIPE_V> after each), then
// Adds over repeats 2..n with a PipeBarrier<PIPE_V> after each but the tail one.
template <class T>
void create_vec_index_hazards(const LocalTensor<T>& dst, uint32_t count) {
    if (!avsg_emu::hz::sb()) return;
    constexpr uint32_t blk = 32 / sizeof(T), rep = 256 / sizeof(T);
    const uint64_t off = dst.GetPhyAddr();
    for (uint32_t i = 0; i < std::min(count, blk); ++i)
        avsg_emu::hz::Instr(avsg_emu::kHzS, "CreateVecIndex").wr_ub(off + i * sizeof(T), sizeof(T));
    avsg_emu::Scoreboard& s = *avsg_emu::hz::sb();
    uint32_t snap[avsg_emu::kHzPipes];
    avsg_emu::hz::snapshot(s, avsg_emu::kHzS, snap);  // the internal S_V flag
    avsg_emu::hz::merge(s, avsg_emu::kHzV, snap);
    if (count <= blk) return;
    {
        avsg_emu::hz::Instr hi(avsg_emu::kHzV, "CreateVecIndex");
        hi.rd_ub(off, 32);
        hi.wr_ub(off + 32, (std::min(count, rep) - blk) * sizeof(T));
        hi.barrier_after();
    }
    if (count <= rep) return;
    avsg_emu::hz::Instr hi(avsg_emu::kHzV, "CreateVecIndex");
    hi.rd_ub(off, static_cast<uint64_t>(count - rep) * sizeof(T));
    hi.wr_ub(off + rep * sizeof(T), static_cast<uint64_t>(count - rep) * sizeof(T));
    if (count % rep == 0) hi.barrier_after();
}
}  // namespace emu_detail

// dst[i] = firstValue + i. On A2: scalar SetValue for the first 32 B, then a chain of Adds
// (card §5); follow it with PipeBarrier<PIPE_V> before use.
template <class T>
__aicore__ inline void CreateVecIndex(LocalTensor<T> dst, const T& firstValue, uint32_t count) {
    static_assert(emu_detail::is_one_of_v<T, int16_t, half, int32_t, float>,
                  "CreateVecIndex: T must be int16/half/int32/float on A2 (card §5)");
    const char* api = "CreateVecIndex";
    emu_detail::check_ub(api, "dst", dst, count);
    if (count == 0) return;
    emu_detail::create_vec_index_hazards<T>(dst, count);
    T* d = dst.ptr();
    for (uint32_t i = 0; i < count; ++i) {
        if constexpr (std::is_integral<T>::value)
            d[i] = static_cast<T>(static_cast<uint32_t>(firstValue) + i);
        else
            d[i] = T(static_cast<float>(firstValue) + static_cast<float>(i));
    }
    if constexpr (avsg_emu::kStrict) avsg_emu::ctx(api).counters.scalar_ub_writes += std::min<uint32_t>(count, 32 / sizeof(T));
    emu_detail::vec_issue(api, emu_detail::reps_for(static_cast<uint64_t>(count) * sizeof(T)));
    // Each level-0 Adds of the chain sets its own lanes (SetMask<T>(mask)) and the last one's stay
    // (dav_c220 CreateVecIndexCalc): the tail, else 32 B when the count fits one repeat, else a
    // whole repeat. Within the first 32 B no vector instruction runs: the register is untouched.
    constexpr uint32_t blk = 32 / sizeof(T), rep = 256 / sizeof(T);
    if (count > blk)
        emu_detail::leave_mask_lanes<T>(api, count <= rep ? (count % blk ? count % blk : blk)
                                                          : (count % rep ? count % rep : rep));
}

// ---------------------------------------------------------------------------
// Binary / scalar arithmetic: int16, half, int32, float on A2 (card §5). No int64.
// ---------------------------------------------------------------------------
#define AVSG_EMU_BINARY(NAME, FN, OVERLAP_OK, TYPES_OK, MSG)                                                      \
    template <class T>                                                                                            \
    __aicore__ inline void NAME(const LocalTensor<T>& dst, const LocalTensor<T>& src0, const LocalTensor<T>& src1, \
                                const int32_t& count) {                                                            \
        static_assert(TYPES_OK, MSG);                                                                             \
        emu_detail::binary(#NAME, dst, src0, src1, count, OVERLAP_OK, [](T a, T b) { return FN; });              \
    }
// Card §0: Add/Sub/Mul/Max/Min on half/int32/float are allowed to overlap.
#define AVSG_OV (emu_detail::is_one_of_v<T, half, int32_t, float>)
AVSG_EMU_BINARY(Add, emu_detail::Ar<T>::add(a, b), AVSG_OV, emu_detail::is_arith_v<T>,
                "Add: T must be int16/half/int32/float on A2 (card §5; no int64 vector arithmetic)")
AVSG_EMU_BINARY(Sub, emu_detail::Ar<T>::sub(a, b), AVSG_OV, emu_detail::is_arith_v<T>,
                "Sub: T must be int16/half/int32/float on A2 (card §5; no int64 vector arithmetic)")
AVSG_EMU_BINARY(Mul, emu_detail::Ar<T>::mul(a, b), AVSG_OV, emu_detail::is_arith_v<T>,
                "Mul: T must be int16/half/int32/float on A2 (card §5; no int64 vector arithmetic)")
AVSG_EMU_BINARY(Max, emu_detail::Ar<T>::max(a, b), AVSG_OV, emu_detail::is_arith_v<T>,
                "Max: T must be int16/half/int32/float on A2 (card §5)")
AVSG_EMU_BINARY(Min, emu_detail::Ar<T>::min(a, b), AVSG_OV, emu_detail::is_arith_v<T>,
                "Min: T must be int16/half/int32/float on A2 (card §5)")
AVSG_EMU_BINARY(Div, emu_detail::Ar<T>::div(a, b), false, emu_detail::is_hf_v<T>,
                "Div: T must be half/float on A2 (card §5)")
// Bitwise: 16-bit only on A2. For 32-bit data ReinterpretCast<uint16_t>() and pass 2*count
// (card §5, §8.3; the real int32 count form compiles but processes only half the bytes).
AVSG_EMU_BINARY(And, static_cast<T>(a & b), false, (emu_detail::is_one_of_v<T, int16_t, uint16_t>),
                "And: T must be int16/uint16 on A2; reinterpret 32-bit data as uint16 and pass 2*count (card §5)")
AVSG_EMU_BINARY(Or, static_cast<T>(a | b), false, (emu_detail::is_one_of_v<T, int16_t, uint16_t>),
                "Or: T must be int16/uint16 on A2; reinterpret 32-bit data as uint16 and pass 2*count (card §5)")
#undef AVSG_OV
#undef AVSG_EMU_BINARY

template <class T>
__aicore__ inline void Not(const LocalTensor<T>& dst, const LocalTensor<T>& src, const int32_t& count) {
    static_assert(emu_detail::is_one_of_v<T, int16_t, uint16_t>,
                  "Not: T must be int16/uint16 on A2; reinterpret 32-bit data as uint16 and pass 2*count (card §5)");
    emu_detail::unary("Not", dst, src, count, [](T a) { return static_cast<T>(~a); });
}

#define AVSG_EMU_SCALAR(NAME, FN)                                                                                  \
    template <class T, bool isSetMask = true>                                                                     \
    __aicore__ inline void NAME(const LocalTensor<T>& dst, const LocalTensor<T>& src, const T& scalarValue,       \
                                const int32_t& count) {                                                            \
        static_assert(emu_detail::is_arith_v<T>,                                                                  \
                      #NAME ": T must be int16/half/int32/float on A2 (card §5; no int64 vector arithmetic)");    \
        T s = scalarValue;                                                                                        \
        emu_detail::unary(#NAME, dst, src, count, [s](T a) { return FN; });                                      \
    }
AVSG_EMU_SCALAR(Adds, emu_detail::Ar<T>::add(a, s))
AVSG_EMU_SCALAR(Muls, emu_detail::Ar<T>::mul(a, s))
AVSG_EMU_SCALAR(Maxs, emu_detail::Ar<T>::max(a, s))
AVSG_EMU_SCALAR(Mins, emu_detail::Ar<T>::min(a, s))
#undef AVSG_EMU_SCALAR

// Shifts: 16/32-bit integers; bits in [0,16] / [0,32]. Unsigned: logical; signed: arithmetic
// right shift (card §5).
namespace emu_detail {
template <class T>
void check_shift(const char* api, T bits) {
    if constexpr (!avsg_emu::kStrict) return;  // fast build: checks compiled out
    static_assert(is_one_of_v<T, int16_t, uint16_t, int32_t, uint32_t>,
                  "ShiftLeft/ShiftRight: T must be int16/uint16/int32/uint32 on A2 (card §5)");
    int64_t b = static_cast<int64_t>(bits);
    if (b < 0 || b > static_cast<int64_t>(sizeof(T) * 8))
        fail(std::string(api) + ": shift " + std::to_string(b) + " outside [0," + std::to_string(sizeof(T) * 8) +
             "] (card §5)");
}
}  // namespace emu_detail
template <class T, bool isSetMask = true>
__aicore__ inline void ShiftLeft(const LocalTensor<T>& dst, const LocalTensor<T>& src, const T& scalarValue,
                                 const int32_t& count) {
    emu_detail::check_shift("ShiftLeft", scalarValue);
    const uint32_t b = static_cast<uint32_t>(scalarValue);
    emu_detail::unary("ShiftLeft", dst, src, count, [b](T a) {
        using U = std::make_unsigned_t<T>;
        if (b >= sizeof(T) * 8) return T(0);
        return static_cast<T>(static_cast<U>(static_cast<uint32_t>(static_cast<U>(a)) << b));
    });
}
template <class T, bool isSetMask = true>
__aicore__ inline void ShiftRight(const LocalTensor<T>& dst, const LocalTensor<T>& src, const T& scalarValue,
                                  const int32_t& count) {
    emu_detail::check_shift("ShiftRight", scalarValue);
    const uint32_t b = static_cast<uint32_t>(scalarValue);
    emu_detail::unary("ShiftRight", dst, src, count, [b](T a) {
        if constexpr (std::is_signed<T>::value) {
            if (b >= sizeof(T) * 8) return static_cast<T>(a < 0 ? -1 : 0);
            return static_cast<T>(a >> b);  // arithmetic (GCC: sign fill)
        } else {
            if (b >= sizeof(T) * 8) return T(0);
            return static_cast<T>(a >> b);
        }
    });
}

// ---------------------------------------------------------------------------
// Compare / Compares / CompareScalar (card §5, §8.2): bitmask output, LSB first.
// count*sizeof(T) must be a multiple of 256 B (tails are not computed on the NPU);
// int32 supports EQ only (the NPU silently computes EQ for any mode).
// ---------------------------------------------------------------------------
namespace emu_detail {
// A count-form compare on A2 runs under the mask the last instruction left (BlockContext::
// vector_mask_hi / _lo): after a clobber listed there, without ResetMask, some lanes of its result
// would keep whatever the mask bytes held. A repeat of T has 256 / sizeof(T) lanes: a 32-bit
// compare reads lo only, a 16-bit one lo and hi.
template <class T>
inline void check_full_mask(const char* api) {
    if constexpr (!avsg_emu::kStrict) return;
    const avsg_emu::BlockContext& c = avsg_emu::ctx(api);
    if (c.vector_mask_lo == ~0ull && (sizeof(T) == 4 || c.vector_mask_hi == ~0ull)) return;
    char bits[64];
    std::snprintf(bits, sizeof bits, "(hi %#llx, lo %#llx)", static_cast<unsigned long long>(c.vector_mask_hi),
                  static_cast<unsigned long long>(c.vector_mask_lo));
    avsg_emu::fail(std::string(api) + ": issued under a partial vector mask " + bits + " for " +
                   std::to_string(256 / sizeof(T)) + " lanes (the last " +
                   (c.vector_mask_by ? c.vector_mask_by : "?") +
                   " set it; A2's count-form compares do not set their own: dav_c220 "
                   "kernel_operator_vec_cmp_impl.h, CompareScalarCompute). Call ResetMask() first");
}
template <class T>
bool cmp(T a, T b, CMPMODE m) {
    using C = std::conditional_t<std::is_integral<T>::value, T, float>;
    C x = static_cast<C>(a), y = static_cast<C>(b);
    switch (m) {
        case CMPMODE::LT: return x < y;
        case CMPMODE::GT: return x > y;
        case CMPMODE::EQ: return x == y;
        case CMPMODE::LE: return x <= y;
        case CMPMODE::GE: return x >= y;
        case CMPMODE::NE: return x != y;
    }
    return false;
}
template <class T>
void check_cmp(const char* api, CMPMODE mode, uint32_t count) {
    if constexpr (!avsg_emu::kStrict) return;  // fast build: checks compiled out
    if (std::is_same<T, int32_t>::value && mode != CMPMODE::EQ)
        fail(std::string(api) + ": int32 supports only CMPMODE::EQ on A2 (card §5: the NPU silently computes EQ)");
    if (static_cast<unsigned>(mode) > 5) fail(std::string(api) + ": invalid CMPMODE");
    uint64_t bytes = static_cast<uint64_t>(count) * sizeof(T);
    if (bytes % 256 != 0)
        fail(std::string(api) + ": count*sizeof(T) = " + std::to_string(bytes) +
             " B is not a multiple of 256 B (card §5: tail elements are neither computed nor written; pad and round up)");
}
template <class T, class U, bool Bits = false, class F>
void compare_impl(const char* api, const LocalTensor<U>& dst, const LocalTensor<T>& src0, uint32_t count, F pred,
                  const LocalTensor<T>* src1 = nullptr) {
    check_ub(api, "dst", dst, count / 8);
    check_ub(api, "src0", src0, count);
    if (count == 0) return;
    {
        avsg_emu::hz::Instr hi(avsg_emu::kHzV, api);
        avsg_emu::detail::hz_rd(hi, src0, static_cast<uint64_t>(count) * sizeof(T));
        if (src1) avsg_emu::detail::hz_rd(hi, *src1, static_cast<uint64_t>(count) * sizeof(T));
        avsg_emu::detail::hz_wr(hi, dst, count / 8);
    }
    uint8_t* d = dst.bytes();
    const T* a = src0.ptr();
    // 0/1 flags for a block of elements, then each 8 flags (little-endian bytes of one word) to
    // one mask byte, element 0 in bit 0: the multiply moves flag k to bit 56 + k without carries.
    // pred takes the element as the type it compares in; a half as its bit pattern (Bits: the
    // callers compare order keys, see half_order_key).
    static_assert(Bits == std::is_same<T, half>::value, "compare_impl: half compares on its bits, and only half");
    constexpr uint32_t kBlock = 256;
    uint8_t flags[kBlock];
    const uint32_t bits = count / 8 * 8;
    // 64-bit offsets: with a 32-bit base + i (which may wrap) the loops load lane by lane
    for (size_t base = 0; base < bits; base += kBlock) {
        const uint32_t m = std::min<uint32_t>(kBlock, bits - static_cast<uint32_t>(base));
        if constexpr (Bits) {
            for (uint32_t i = 0; i < m; ++i) flags[i] = static_cast<uint8_t>(pred(a[base + i].bits, base + i));
        } else {
            for (uint32_t i = 0; i < m; ++i) flags[i] = static_cast<uint8_t>(pred(a[base + i], base + i));
        }
        for (uint32_t byte = 0; byte < m / 8; ++byte) {
            uint64_t w;
            std::memcpy(&w, flags + byte * 8, 8);
            d[base / 8 + byte] = static_cast<uint8_t>((w * 0x0102040810204080ull) >> 56);
        }
    }
    vec_issue(api, static_cast<uint64_t>(count) * sizeof(T) / 256);
}
}  // namespace emu_detail

namespace emu_detail {
// Half comparisons without widening (they vectorise): a NaN compares false but under NE; any
// other half orders as its key, the magnitude bits negated for a set sign (+0 and -0 both 0),
// exactly as the float values order.
inline bool half_is_nan(uint16_t h) { return (h & 0x7fffu) > 0x7c00u; }
inline int32_t half_order_key(uint16_t h) {
    const int32_t mag = h & 0x7fff, neg = -static_cast<int32_t>(h >> 15);
    return (mag ^ neg) - neg;
}
// Runs f with the comparison of `mode` as a function object, so the per-element loop has no
// switch (the mode is fixed for the whole call); an invalid mode compares false, as cmp() does.
template <class T, class F>
void with_cmp(CMPMODE mode, F f) {
    using C = std::conditional_t<std::is_integral<T>::value, T, float>;
    switch (mode) {
        case CMPMODE::LT: return f([](C x, C y) { return x < y; });
        case CMPMODE::GT: return f([](C x, C y) { return x > y; });
        case CMPMODE::EQ: return f([](C x, C y) { return x == y; });
        case CMPMODE::LE: return f([](C x, C y) { return x <= y; });
        case CMPMODE::GE: return f([](C x, C y) { return x >= y; });
        case CMPMODE::NE: return f([](C x, C y) { return x != y; });
    }
    f([](C, C) { return false; });
}
}  // namespace emu_detail

template <class T, class U>
__aicore__ inline void Compare(const LocalTensor<U>& dst, const LocalTensor<T>& src0, const LocalTensor<T>& src1,
                               CMPMODE cmpMode, uint32_t count) {
    static_assert(emu_detail::is_one_of_v<T, half, float, int32_t>,
                  "Compare: T must be half/float (or int32 with EQ only) on A2 (card §5)");
    static_assert(emu_detail::is_one_of_v<U, int8_t, uint8_t>, "Compare: mask type U must be int8/uint8 (card §5)");
    const char* api = "Compare";
    emu_detail::check_full_mask<T>(api);
    emu_detail::check_cmp<T>(api, cmpMode, count);
    emu_detail::check_ub(api, "src1", src1, count);
    const T* b = src1.ptr();
    if constexpr (std::is_same<T, half>::value) {   // on the halves' order keys: see Compares
        emu_detail::with_cmp<int32_t>(cmpMode, [&](auto op) {
            const bool ne = cmpMode == CMPMODE::NE;
            emu_detail::compare_impl<T, U, true>(api, dst, src0, count, [=](uint16_t a, size_t i) {
                const uint16_t c = b[i].bits;
                return (emu_detail::half_is_nan(a) | emu_detail::half_is_nan(c))
                           ? ne : op(emu_detail::half_order_key(a), emu_detail::half_order_key(c));
            }, &src1);
        });
    } else {
        emu_detail::with_cmp<T>(cmpMode, [&](auto op) {
            emu_detail::compare_impl<T, U>(
                api, dst, src0, count, [b, op](T a, size_t i) { return op(a, b[i]); }, &src1);
        });
    }
}
template <class T, class U>
__aicore__ inline void Compares(const LocalTensor<U>& dst, const LocalTensor<T>& src0, const T src1Scalar,
                                CMPMODE cmpMode, uint32_t count) {
    static_assert(emu_detail::is_one_of_v<T, half, float, int32_t>,
                  "Compares: T must be half/float (or int32 with EQ only) on A2 (card §5)");
    static_assert(std::is_same<U, uint8_t>::value, "Compares: mask type U must be uint8 on A2 (card §5)");
    const char* api = "Compares";
    emu_detail::check_full_mask<T>(api);
    emu_detail::check_cmp<T>(api, cmpMode, count);
    if constexpr (std::is_same<T, half>::value) {
        const uint16_t yb = src1Scalar.bits;
        emu_detail::with_cmp<int32_t>(cmpMode, [&](auto op) {
            const bool ne = cmpMode == CMPMODE::NE;
            const int32_t ky = emu_detail::half_order_key(yb);
            const bool yNan = emu_detail::half_is_nan(yb);
            emu_detail::compare_impl<T, U, true>(api, dst, src0, count, [=](uint16_t a, size_t) {
                return (yNan | emu_detail::half_is_nan(a)) ? ne : op(emu_detail::half_order_key(a), ky);
            });
        });
    } else {
        const T y = src1Scalar;
        emu_detail::with_cmp<T>(cmpMode, [&](auto op) {
            emu_detail::compare_impl<T, U>(api, dst, src0, count, [y, op](T a, size_t) { return op(a, y); });
        });
    }
}
// Deprecated alias of Compares (card §5).
template <class T, class U>
__aicore__ inline void CompareScalar(const LocalTensor<U>& dst, const LocalTensor<T>& src0, const T src1Scalar,
                                     CMPMODE cmpMode, uint32_t count) {
    Compares<T, U>(dst, src0, src1Scalar, cmpMode, count);
}

// ---------------------------------------------------------------------------
// Select (card §5): half/float only. Mask bit 1 -> src0, 0 -> src1.
// Mode 0 (VSEL_CMPMASK_SPR) reuses the first 256/sizeof(T) bits for every repeat;
// modes 1/2 consume the mask continuously.
// ---------------------------------------------------------------------------
namespace emu_detail {
template <class T, class U, class F>
void select_impl(const char* api, const LocalTensor<T>& dst, const LocalTensor<U>& mask, const LocalTensor<T>& src0,
                 SELMODE mode, uint32_t count, F src1_at, const LocalTensor<T>* src1 = nullptr) {
    static_assert(is_hf_v<T>, "Select: T must be half/float on A2 (card §5; use GatherMask for integer compaction)");
    static_assert(is_one_of_v<U, uint8_t, uint16_t, uint32_t, uint64_t>, "Select: mask type U must be uint8/16/32/64 (card §5)");
    const uint32_t per_rep = 256 / sizeof(T);
    uint64_t mask_bits = mode == SELMODE::VSEL_CMPMASK_SPR ? per_rep : count;
    check_ub(api, "dst", dst, count);
    check_ub(api, "src0", src0, count);
    check_ub(api, "selMask", mask, (mask_bits + 8 * sizeof(U) - 1) / (8 * sizeof(U)));
    check_overlap(api, dst, static_cast<uint64_t>(count) * sizeof(T), src0, static_cast<uint64_t>(count) * sizeof(T));
    if (src1) check_overlap(api, dst, static_cast<uint64_t>(count) * sizeof(T), *src1,
                            static_cast<uint64_t>(count) * sizeof(T));
    if (count == 0) return;
    {
        avsg_emu::hz::Instr hi(avsg_emu::kHzV, api);
        avsg_emu::detail::hz_rd(hi, mask, (mask_bits + 7) / 8);
        avsg_emu::detail::hz_rd(hi, src0, static_cast<uint64_t>(count) * sizeof(T));
        if (src1) avsg_emu::detail::hz_rd(hi, *src1, static_cast<uint64_t>(count) * sizeof(T));
        avsg_emu::detail::hz_wr(hi, dst, static_cast<uint64_t>(count) * sizeof(T));
    }
    const uint8_t* m = mask.bytes();
    T* d = dst.ptr();
    const T* a = src0.ptr();
    if (mode != SELMODE::VSEL_CMPMASK_SPR && count % 8 == 0) {
        // the mask runs on: per block, its bits to all-ones / zero words, then a bitwise blend
        // (the element's bits, exactly as a copy), then the block to dst (which may be a source)
        using W = std::conditional_t<sizeof(T) == 4, uint32_t, uint16_t>;
        constexpr uint32_t kBlock = 256;
        W sel[kBlock], out[kBlock];
        for (size_t base = 0; base < count; base += kBlock) {   // 64-bit: see compare_impl
            const uint32_t c = std::min<uint32_t>(kBlock, count - static_cast<uint32_t>(base));
            for (uint32_t q = 0; q < c / 8; ++q) {
                const uint32_t mb = m[base / 8 + q];
                for (uint32_t k = 0; k < 8; ++k) sel[q * 8 + k] = static_cast<W>(0u - ((mb >> k) & 1u));
            }
            for (uint32_t j = 0; j < c; ++j) {
                const T x = a[base + j], y = src1_at(base + j);
                W wx, wy;
                std::memcpy(&wx, &x, sizeof(W));
                std::memcpy(&wy, &y, sizeof(W));
                out[j] = static_cast<W>((wx & sel[j]) | (wy & static_cast<W>(~sel[j])));
            }
            std::memcpy(d + base, out, c * sizeof(T));
        }
    } else {
        const uint32_t wrap = mode == SELMODE::VSEL_CMPMASK_SPR ? per_rep : 0;   // 0: the mask runs on
        for (uint32_t i = 0, bit = 0; i < count; ++i) {
            const T x = a[i], y = src1_at(i);
            d[i] = ((m[bit / 8] >> (bit % 8)) & 1u) ? x : y;
            if (++bit == wrap) bit = 0;
        }
    }
    vec_issue(api, reps_for(static_cast<uint64_t>(count) * sizeof(T)));
}
}  // namespace emu_detail

template <class T, class U>
__aicore__ inline void Select(const LocalTensor<T>& dst, const LocalTensor<U>& selMask, const LocalTensor<T>& src0,
                              T src1, SELMODE selMode, uint32_t count) {
    if (selMode != SELMODE::VSEL_TENSOR_SCALAR_MODE)
        avsg_emu::fail("Select(tensor, scalar): selMode must be VSEL_TENSOR_SCALAR_MODE (card §5)");
    emu_detail::select_impl("Select", dst, selMask, src0, selMode, count, [&](size_t) { return src1; });
}
template <class T, class U>
__aicore__ inline void Select(const LocalTensor<T>& dst, const LocalTensor<U>& selMask, const LocalTensor<T>& src0,
                              const LocalTensor<T>& src1, SELMODE selMode, uint32_t count) {
    if (selMode == SELMODE::VSEL_TENSOR_SCALAR_MODE)
        avsg_emu::fail("Select(tensor, tensor): selMode must be VSEL_CMPMASK_SPR or VSEL_TENSOR_TENSOR_MODE (card §5)");
    emu_detail::check_ub("Select", "src1", src1, count);
    const T* b = src1.ptr();
    emu_detail::select_impl("Select", dst, selMask, src0, selMode, count, [&](size_t i) { return b[i]; }, &src1);
}

// ---------------------------------------------------------------------------
// GatherMask (card §5, §8.5): stream compaction. dst beyond rsvdCnt is poisoned.
// ---------------------------------------------------------------------------
struct GatherMaskParams {
    uint8_t src0BlockStride = 1;
    uint16_t repeatTimes = 0;  // default 0: always set it (card §5)
    uint16_t src0RepeatStride = 8;
    uint8_t src1RepeatStride = 8;
    GatherMaskParams() = default;
    GatherMaskParams(uint8_t src0BlockStrideIn, uint16_t repeatTimesIn, uint16_t src0RepeatStrideIn,
                     uint8_t src1RepeatStrideIn)
        : src0BlockStride(src0BlockStrideIn), repeatTimes(repeatTimesIn), src0RepeatStride(src0RepeatStrideIn),
          src1RepeatStride(src1RepeatStrideIn) {}
};

namespace emu_detail {
// Scratch of n elements: a local array when it fits, else the heap.
template <class T, uint32_t N = 4096>
class Stage {
public:
    T* get(uint64_t n) {
        if (n <= N) return local_;
        heap_.resize(n);
        return heap_.data();
    }

private:
    T local_[N];
    std::vector<T> heap_;
};
}  // namespace emu_detail

namespace emu_detail {
// pattern_bit(r, j): keep element j of repeat r (normal) / element j overall (counter, r = 0).
template <class T, class P>
void gather_mask_impl(const char* api, const LocalTensor<T>& dst, const LocalTensor<T>& src0, bool reduceMode,
                      uint32_t mask, const GatherMaskParams& p, uint64_t& rsvdCnt, uint64_t pattern_bytes_needed,
                      P pattern_bit, int64_t pattern_ub_off = -1) {
    constexpr uint32_t E = 256 / sizeof(T);  // elements per repeat
    constexpr uint32_t EB = 32 / sizeof(T);  // elements per 32 B block
    if (p.repeatTimes == 0)
        fail(std::string(api) + ": GatherMaskParams.repeatTimes is 0 (card §5, §8.5: the default is 0; always set it)");
    if (p.repeatTimes > avsg_emu::kMaxRepeat)
        fail(std::string(api) + ": repeatTimes " + std::to_string(p.repeatTimes) + " > 255 (card §0)");
    check_ub(api, "dst", dst, 0);
    check_ub(api, "src0", src0, 0);
    // Kept elements are staged, then copied to dst (which may be src0). Branch-free compaction:
    // every element is written at the next free place, which advances only when it is kept.
    Stage<T> stage;
    T* kept = nullptr;
    uint64_t nkept = 0;
    avsg_emu::hz::Instr hi(avsg_emu::kHzV, api);  // reads below, dst write at the end
    if (pattern_ub_off >= 0) hi.rd_ub(static_cast<uint64_t>(pattern_ub_off), pattern_bytes_needed);
    uint64_t processed = 0;
    if (reduceMode) {
        // Counter mode ("configuration 1"): repeatTimes x mask elements; only the verified idiom
        // repeatTimes == 1 with contiguous src0 is emulated (card §5 ⚠️).
        if (p.repeatTimes != 1)
            fail(std::string(api) + ": counter mode (reduceMode=true) with repeatTimes=" + std::to_string(p.repeatTimes) +
                 " > 1 is not verified on hardware and is rejected (card §5, §10)");
        if (mask == 0) fail(std::string(api) + ": counter mode needs mask >= 1 (the element count) (card §5)");
        if (p.src0BlockStride != 1)
            fail(std::string(api) + ": counter mode with src0BlockStride != 1 is not emulated");
        check_ub(api, "src0", src0, mask);
        avsg_emu::detail::hz_rd(hi, src0, static_cast<uint64_t>(mask) * sizeof(T));
        const T* s = src0.ptr();
        kept = stage.get(mask);
        for (uint32_t j = 0; j < mask; ++j) {
            kept[nkept] = s[j];
            nkept += pattern_bit(0u, j) ? 1u : 0u;
        }
        processed = mask;
        vec_issue(api, reps_for(static_cast<uint64_t>(mask) * sizeof(T)));
    } else {
        // Normal mode: repeatTimes repeats of 256 B; mask ignored (card §5).
        uint64_t ext = 0;
        for (uint32_t r = 0; r < p.repeatTimes; ++r)
            for (uint32_t j = 0; j < E; ++j) {
                uint64_t off = (static_cast<uint64_t>(r) * p.src0RepeatStride * 32) +
                               (j / EB) * static_cast<uint64_t>(p.src0BlockStride) * 32 + (j % EB) * sizeof(T);
                ext = std::max(ext, off + sizeof(T));
            }
        check_ub(api, "src0", src0, ext / sizeof(T));
        avsg_emu::detail::hz_rd(hi, src0, ext);  // the strided extent (conservative)
        kept = stage.get(static_cast<uint64_t>(p.repeatTimes) * E);
        const uint8_t* base = src0.bytes();
        for (uint32_t r = 0; r < p.repeatTimes; ++r)
            for (uint32_t j = 0; j < E; ++j) {
                uint64_t off = (static_cast<uint64_t>(r) * p.src0RepeatStride * 32) +
                               (j / EB) * static_cast<uint64_t>(p.src0BlockStride) * 32 + (j % EB) * sizeof(T);
                std::memcpy(&kept[nkept], base + off, sizeof(T));
                nkept += pattern_bit(r, j) ? 1u : 0u;
            }
        processed = static_cast<uint64_t>(p.repeatTimes) * E;
        vec_issue(api, p.repeatTimes);
    }
    check_ub(api, "dst", dst, nkept);
    uint64_t end = std::min<uint64_t>(processed, dst.GetSize());
    check_overlap(api, dst, end * sizeof(T), src0, processed * sizeof(T));
    // dst up to rsvdCnt plus the undefined (poisoned) part counts as written
    avsg_emu::detail::hz_wr(hi, dst, std::max<uint64_t>(end, nkept) * sizeof(T));
    if (nkept) std::memcpy(dst.bytes(), kept, nkept * sizeof(T));
    if (end > nkept)  // dst beyond rsvdCnt is undefined (card §5): poison it
        avsg_emu::detail::poison(dst.bytes() + nkept * sizeof(T), (end - nkept) * sizeof(T));
    rsvdCnt = nkept;
    // Both modes end with the register at (0, mask) (dav_c220 kernel_operator_vec_gather_mask_impl.h,
    // GatherMaskImpl: set_vector_mask(0, mask) on the NPU, then SetMaskNorm).
    leave_mask(api, 0, mask);
}
// Built-in patterns 1..7 (card §5 table), on the element index within a repeat.
inline bool builtin_pattern_keeps(uint8_t pattern, uint32_t j) {
    switch (pattern) {
        case 1: return j % 2 == 0;
        case 2: return j % 2 == 1;
        case 3: return j % 4 == 0;
        case 4: return j % 4 == 1;
        case 5: return j % 4 == 2;
        case 6: return j % 4 == 3;
        case 7: return true;
    }
    return false;
}
}  // namespace emu_detail

// User pattern: element j <-> bit j%(8*sizeof(U)) of pattern word j/(8*sizeof(U)), LSB first.
template <class T, class U, GatherMaskMode mode = defaultGatherMaskMode>
__aicore__ inline void GatherMask(const LocalTensor<T>& dst, const LocalTensor<T>& src0, const LocalTensor<U>& src1Pattern,
                                  const bool reduceMode, const uint32_t mask, const GatherMaskParams& gatherMaskParams,
                                  uint64_t& rsvdCnt) {
    static_assert((emu_detail::is_one_of_v<T, int16_t, uint16_t, half, bfloat16_t> && std::is_same<U, uint16_t>::value) ||
                      (emu_detail::is_one_of_v<T, int32_t, uint32_t, float> && std::is_same<U, uint32_t>::value),
                  "GatherMask: A2 pairs are int16/uint16/half/bf16 with a uint16_t pattern and "
                  "int32/uint32/float with a uint32_t pattern (card §5)");
    const char* api = "GatherMask";
    const auto& p = gatherMaskParams;
    constexpr uint32_t E = 256 / sizeof(T);
    // Pattern extent: counter mode reads `mask` bits contiguously; normal mode reads E bits per
    // repeat at src1RepeatStride blocks.
    uint64_t bits = reduceMode ? mask
                               : (p.repeatTimes ? (static_cast<uint64_t>(p.repeatTimes) - 1) * p.src1RepeatStride * 256 + E : 0);
    emu_detail::check_ub(api, "src1Pattern", src1Pattern, (bits + 8 * sizeof(U) - 1) / (8 * sizeof(U)));
    const uint8_t* pat = src1Pattern.bytes();
    const bool counter = reduceMode;
    const uint32_t stride = p.src1RepeatStride;
    const uint64_t pat_bytes = (bits + 8 * sizeof(U) - 1) / (8 * sizeof(U)) * sizeof(U);
    emu_detail::gather_mask_impl(
        api, dst, src0, reduceMode, mask, p, rsvdCnt, pat_bytes,
        [&](uint32_t r, uint32_t j) {
            uint64_t bit = counter ? j : static_cast<uint64_t>(r) * stride * 256 + j;
            return ((pat[bit / 8] >> (bit % 8)) & 1u) != 0;
        },
        static_cast<int64_t>(src1Pattern.GetPhyAddr()));
}
template <class T, GatherMaskMode mode = defaultGatherMaskMode>
__aicore__ inline void GatherMask(const LocalTensor<T>& dst, const LocalTensor<T>& src0, const uint8_t src1Pattern,
                                  const bool reduceMode, const uint32_t mask, const GatherMaskParams& gatherMaskParams,
                                  uint64_t& rsvdCnt) {
    static_assert(emu_detail::is_one_of_v<T, int16_t, uint16_t, half, bfloat16_t, int32_t, uint32_t, float>,
                  "GatherMask: T must be int16/uint16/half/bf16/int32/uint32/float on A2 (card §5)");
    if (src1Pattern < 1 || src1Pattern > 7)
        avsg_emu::fail("GatherMask: built-in pattern " + std::to_string(src1Pattern) + " outside 1..7 (card §5)");
    emu_detail::gather_mask_impl("GatherMask", dst, src0, reduceMode, mask, gatherMaskParams, rsvdCnt, 0,
                                 [&](uint32_t, uint32_t j) { return emu_detail::builtin_pattern_keeps(src1Pattern, j); });
}

// ---------------------------------------------------------------------------
// Gather inside UB (card §5, §8.4): dst[i] = *(T*)((uint8_t*)src + srcBaseAddr + srcOffset[i]).
// Offsets are BYTES, aligned to sizeof(T); the count form's repeat counter is uint8_t, so
// count/(256/sizeof(T)) must stay <= 255 (chunk below 16384 32-bit elements).
// ---------------------------------------------------------------------------
template <class T>
__aicore__ inline void Gather(const LocalTensor<T>& dst, const LocalTensor<T>& src, const LocalTensor<uint32_t>& srcOffset,
                              const uint32_t srcBaseAddr, const uint32_t count) {
    static_assert(emu_detail::is_one_of_v<T, int16_t, uint16_t, half, bfloat16_t, int32_t, uint32_t, float>,
                  "Gather: T must be int16/uint16/half/bf16/int32/uint32/float on A2 (card §5)");
    const char* api = "Gather";
    constexpr uint32_t E = 256 / sizeof(T);
    if (avsg_emu::kStrict && count / E > avsg_emu::kMaxRepeat)
        avsg_emu::fail("Gather: count " + std::to_string(count) + " needs " + std::to_string(count / E) +
                       " repeats > 255; the uint8_t repeat counter wraps on the NPU (card §5, §8.4: chunk below " +
                       std::to_string(256 * E) + " elements)");
    emu_detail::check_ub(api, "dst", dst, count);
    emu_detail::check_ub(api, "srcOffset", srcOffset, count);
    emu_detail::check_ub(api, "src", src, 0);
    if (count == 0) return;
    if (avsg_emu::kStrict &&
        avsg_emu::detail::ranges_overlap(dst.bytes(), count * sizeof(T), src.bytes(), src.GetLength()))
        avsg_emu::fail("Gather: dst must not alias src (card §5)");
    const uint32_t* o = srcOffset.ptr();
    T* d = dst.ptr();
    avsg_emu::hz::Instr hi(avsg_emu::kHzV, api);
    avsg_emu::detail::hz_rd(hi, srcOffset, static_cast<uint64_t>(count) * 4);
    for (uint32_t i = 0; avsg_emu::kStrict && i < count; ++i) {  // offset checks: strict build only
        uint64_t off = static_cast<uint64_t>(srcBaseAddr) + o[i];
        if (off % sizeof(T) != 0)
            avsg_emu::fail("Gather: byte offset " + std::to_string(off) + " (element " + std::to_string(i) +
                           ") is not aligned to sizeof(T)=" + std::to_string(sizeof(T)) +
                           " (card §5: offsets are in BYTES; misalignment silently shifts data)");
        if (off + sizeof(T) > src.GetLength())
            avsg_emu::fail("Gather: byte offset " + std::to_string(off) + " (element " + std::to_string(i) +
                           ") is outside src (" + std::to_string(src.GetLength()) + " B) (tensor size overflow)");
        hi.rd_ub(src.GetPhyAddr() + off, sizeof(T));  // exactly the gathered elements
    }
    avsg_emu::detail::hz_wr(hi, dst, static_cast<uint64_t>(count) * sizeof(T));
    const uint8_t* base = src.bytes() + static_cast<uint64_t>(srcBaseAddr);
    for (uint32_t i = 0; i < count; ++i) std::memcpy(&d[i], base + o[i], sizeof(T));
    emu_detail::vec_issue(api, emu_detail::reps_for(static_cast<uint64_t>(count) * sizeof(T)));
    // The count form is level-0 Gathers of whole repeats, then the tail, each setting its lanes
    // (kernel_operator_vec_gather_intf_impl.h, dav_c220 GatherImpl: SetMask<T>(mask)); the last
    // one's stay: the tail, else a whole repeat (hi 0 for a 32-bit type).
    emu_detail::leave_mask_lanes<T>(api, count % E != 0 ? count % E : E);
}

// ---------------------------------------------------------------------------
// Cast (card §5): the A2 pairs of interest plus half<->float, half->int32 (vconv_f162s32* in the
// A2 headers) and uint8->half (CAST_NONE, exact: vconv_u82f16 in the A2 headers).
// ---------------------------------------------------------------------------
namespace emu_detail {
inline const char* round_name(RoundMode m) {
    static const char* n[] = {"CAST_NONE", "CAST_RINT", "CAST_FLOOR", "CAST_CEIL", "CAST_ROUND", "CAST_TRUNC", "CAST_ODD"};
    return static_cast<unsigned>(m) < 7 ? n[static_cast<unsigned>(m)] : "?";
}
inline double round_to_int(double v, RoundMode m) {
    switch (m) {
        case RoundMode::CAST_RINT: return std::nearbyint(v);  // default FE_TONEAREST: half-even
        case RoundMode::CAST_FLOOR: return std::floor(v);
        case RoundMode::CAST_CEIL: return std::ceil(v);
        case RoundMode::CAST_ROUND: return std::round(v);  // half away from zero
        case RoundMode::CAST_TRUNC: return std::trunc(v);
        default: return std::nearbyint(v);
    }
}
template <class I>
I sat_from_double(double v) {
    if (std::isnan(v)) return 0;  // ⚠️ NaN -> 0 is an assumption
    if (v <= static_cast<double>(std::numeric_limits<I>::min())) return std::numeric_limits<I>::min();
    if (v >= static_cast<double>(std::numeric_limits<I>::max())) return std::numeric_limits<I>::max();
    return static_cast<I>(v);
}
// Integer -> float with a rounding mode (exact via long double, 64-bit mantissa on x86).
inline float int_to_float(long double v, RoundMode m) {
    float f = static_cast<float>(v);  // nearest-even
    long double lf = f;
    if (lf == v) return f;
    float lo = lf > v ? std::nextafter(f, -INFINITY) : f;
    float hi = lf > v ? f : std::nextafter(f, INFINITY);
    switch (m) {
        case RoundMode::CAST_FLOOR: return lo;
        case RoundMode::CAST_CEIL: return hi;
        case RoundMode::CAST_TRUNC: return v > 0 ? lo : hi;
        case RoundMode::CAST_ROUND: {
            long double dl = v - lo, dh = hi - v;
            if (dl == dh) return v > 0 ? hi : lo;
            return dl < dh ? lo : hi;
        }
        case RoundMode::CAST_ODD: {
            uint32_t b;
            std::memcpy(&b, &lo, 4);
            return (b & 1u) ? lo : hi;
        }
        default: return f;
    }
}
template <class D, class S>
void check_cast_mode(RoundMode m) {
    if constexpr (!avsg_emu::kStrict) return;  // fast build: checks compiled out
    auto bad = [&](const char* allowed) {
        fail(std::string("Cast: RoundMode::") + round_name(m) + " not allowed for this dtype pair; allowed: " + allowed +
             " (card §5)");
    };
    bool none = m == RoundMode::CAST_NONE, odd = m == RoundMode::CAST_ODD;
    if constexpr (std::is_same<S, int32_t>::value && std::is_same<D, float>::value) {
        (void)none; (void)odd;  // all modes
    } else if constexpr ((std::is_same<S, float>::value && std::is_same<D, int32_t>::value) ||
                         (std::is_same<S, float>::value && std::is_same<D, int16_t>::value) ||
                         (std::is_same<S, int64_t>::value && std::is_same<D, float>::value) ||
                         (std::is_same<S, float>::value && std::is_same<D, int64_t>::value) ||
                         (std::is_same<S, half>::value && std::is_same<D, int32_t>::value) ||
                         (std::is_same<S, half>::value && std::is_same<D, int16_t>::value)) {
        // half -> int32: vconv_f162s32{r,f,c,a,z} in the A2 headers, no CAST_NONE
        if (none || odd) bad("RINT/FLOOR/CEIL/ROUND/TRUNC");
    } else if constexpr (std::is_same<S, float>::value && std::is_same<D, half>::value) {
        if (!(none || m == RoundMode::CAST_RINT)) bad("CAST_NONE/CAST_RINT (other modes are not emulated)");
    } else {
        if (!none) bad("CAST_NONE");
    }
}
}  // namespace emu_detail

namespace emu_detail {
// The conversions of Cast, element by element. Fast paths that are exact by construction come
// first: an int32 of magnitude <= 2^24 is a float exactly (any mode), and for |v| < 2^22 adding
// and subtracting 1.5 * 2^23 rounds a float to the nearest integer, ties to even, which is
// nearbyint's result in the default rounding mode (what round_to_int uses for CAST_RINT).
// Everything else takes the general path.
// d[i] = f(s[i]) through a small local block: the conversion loop then vectorises even when
// d and s are the same buffer (an in-place Cast), which the compiler cannot assume apart.
template <class T, class U, class F>
void convert_blocked(T* d, const U* s, uint32_t count, F f) {
    if constexpr (sizeof(T) == sizeof(U)) {
        // element i is read before it is written and the ranges are equal or disjoint (Cast
        // rejects a partial overlap): no staging needed
        for (uint32_t i = 0; i < count; ++i) d[i] = f(s[i]);
        return;
    }
    constexpr uint32_t kBlock = 256;
    T out[kBlock];
    for (size_t base = 0; base < count; base += kBlock) {   // 64-bit: see compare_impl
        const uint32_t m = std::min<uint32_t>(kBlock, count - static_cast<uint32_t>(base));
        for (uint32_t i = 0; i < m; ++i) out[i] = f(s[base + i]);
        std::memcpy(d + base, out, m * sizeof(T));
    }
}
template <class T, class U>
void cast_loop(T* d, const U* s, uint32_t count, RoundMode roundMode) {
    if constexpr (std::is_same<T, half>::value && std::is_same<U, uint8_t>::value) {
        // exact: every uint8 is a half normal (or zero), so its float's bits rebias (in a loop
        // that vectorises, where a 256-entry table would be read lane by lane)
        for (uint32_t i = 0; i < count; ++i) {
            const float f = static_cast<float>(static_cast<int32_t>(s[i]));
            uint32_t x;
            std::memcpy(&x, &f, 4);
            d[i].bits = static_cast<uint16_t>(x ? (x >> 13) - (112u << 10) : 0u);
        }
        return;
    }
    if constexpr (std::is_same<T, float>::value && std::is_same<U, int32_t>::value) {
        uint32_t inexact = 0;   // |v| > 2^24 anywhere; a separate pass, in a form that vectorises
        for (uint32_t i = 0; i < count; ++i)
            inexact |= static_cast<uint32_t>(static_cast<uint32_t>(s[i]) + (1u << 24)) > (2u << 24);
        if (!inexact) {
            convert_blocked(d, s, count, [](int32_t v) { return static_cast<float>(v); });
            return;
        }
    }
    if constexpr (std::is_same<T, half>::value && std::is_same<U, float>::value) {
        // Every value a zero or a half normal exactly (exponent in range, low 13 mantissa bits
        // clear; the plan's small integers are): then the conversion is a rebias of the bits,
        // without rounding, as f32_to_f16 would give. Checked in a pass that vectorises.
        uint32_t other = 0;
        for (uint32_t i = 0; i < count; ++i) {
            uint32_t x;
            std::memcpy(&x, &s[i], 4);
            const uint32_t mag = x & 0x7fffffffu;
            other |= static_cast<uint32_t>(mag != 0u) &
                     static_cast<uint32_t>(((mag & 0x1fffu) != 0u) |
                                           ((mag - (113u << 23)) > (((142u - 113u) << 23) | 0x7fffffu)));
        }
        if (!other) {
            for (uint32_t i = 0; i < count; ++i) {
                uint32_t x;
                std::memcpy(&x, &s[i], 4);
                const uint32_t mag = x & 0x7fffffffu;
                const uint32_t h = ((x >> 16) & 0x8000u) | (mag ? (mag >> 13) - (112u << 10) : 0u);
                d[i].bits = static_cast<uint16_t>(h);
            }
            return;
        }
    }
#if FLT_EVAL_METHOD == 0 && !defined(__FAST_MATH__)   // float arithmetic rounds to float, in order
    if constexpr (std::is_same<T, int32_t>::value && std::is_same<U, float>::value) {
        if (roundMode == RoundMode::CAST_RINT) {
            constexpr float kShift = 12582912.0f;   // 1.5 * 2^23
            uint32_t large = 0;   // |v| >= 2^22 or NaN anywhere (in a form that vectorises)
            for (uint32_t i = 0; i < count; ++i) large |= !((s[i] > -4194304.0f) & (s[i] < 4194304.0f));
            if (!large) {
                convert_blocked(d, s, count, [](float v) { return static_cast<int32_t>((v + kShift) - kShift); });
                return;
            }
        }
    }
#endif
    for (uint32_t i = 0; i < count; ++i) {
        U v = s[i];
        if constexpr (std::is_same<T, float>::value && std::is_integral<U>::value)
            d[i] = int_to_float(static_cast<long double>(v), roundMode);
        else if constexpr (std::is_integral<T>::value && std::is_same<U, float>::value)
            d[i] = sat_from_double<T>(round_to_int(static_cast<double>(v), roundMode));
        else if constexpr (std::is_integral<T>::value && std::is_same<U, half>::value)
            d[i] = sat_from_double<T>(round_to_int(static_cast<double>(static_cast<float>(v)), roundMode));
        else if constexpr (std::is_integral<T>::value && std::is_integral<U>::value) {
            if (v < static_cast<U>(std::numeric_limits<T>::min()) && sizeof(U) > sizeof(T)) d[i] = std::numeric_limits<T>::min();
            else if (v > static_cast<U>(std::numeric_limits<T>::max()) && sizeof(U) > sizeof(T)) d[i] = std::numeric_limits<T>::max();
            else d[i] = static_cast<T>(v);  // widening is exact; narrowing saturates (card §5)
        } else
            d[i] = T(static_cast<float>(v));  // half <-> float
    }
}
}  // namespace emu_detail

template <class T, class U>
__aicore__ inline void Cast(const LocalTensor<T>& dst, const LocalTensor<U>& src, const RoundMode& roundMode,
                            const uint32_t count) {
    static_assert((std::is_same<U, int32_t>::value && std::is_same<T, float>::value) ||
                      (std::is_same<U, float>::value && std::is_same<T, int32_t>::value) ||
                      (std::is_same<U, int32_t>::value && std::is_same<T, int64_t>::value) ||
                      (std::is_same<U, int64_t>::value && std::is_same<T, int32_t>::value) ||
                      (std::is_same<U, int64_t>::value && std::is_same<T, float>::value) ||
                      (std::is_same<U, float>::value && std::is_same<T, int64_t>::value) ||
                      (std::is_same<U, int32_t>::value && std::is_same<T, int16_t>::value) ||
                      (std::is_same<U, int16_t>::value && std::is_same<T, float>::value) ||
                      (std::is_same<U, float>::value && std::is_same<T, int16_t>::value) ||
                      (std::is_same<U, int16_t>::value && std::is_same<T, half>::value) ||
                      (std::is_same<U, half>::value && std::is_same<T, float>::value) ||
                      (std::is_same<U, half>::value && std::is_same<T, int32_t>::value) ||
                      (std::is_same<U, half>::value && std::is_same<T, int16_t>::value) ||
                      (std::is_same<U, float>::value && std::is_same<T, half>::value) ||
                      (std::is_same<U, uint8_t>::value && std::is_same<T, half>::value),
                  "Cast: dtype pair not in the emulated A2 list (int32<->float, int32<->int64, int64<->float, "
                  "int32->int16, int16<->float, int16->half, half<->float, half->int32, uint8->half; card §5)");
    const char* api = "Cast";
    emu_detail::check_cast_mode<T, U>(roundMode);
    emu_detail::check_ub(api, "dst", dst, count);
    emu_detail::check_ub(api, "src", src, count);
    if (count == 0) return;
    if (dst.GetPhyAddr() != src.GetPhyAddr() &&
        avsg_emu::detail::ranges_overlap(dst.bytes(), count * sizeof(T), src.bytes(), count * sizeof(U)))
        avsg_emu::fail("Cast: dst and src overlap partially (card §0)");
    {
        avsg_emu::hz::Instr hi(avsg_emu::kHzV, api);
        avsg_emu::detail::hz_rd(hi, src, static_cast<uint64_t>(count) * sizeof(U));
        avsg_emu::detail::hz_wr(hi, dst, static_cast<uint64_t>(count) * sizeof(T));
    }
    // Element i is read before it is written, so only widening in place (dst == src, later
    // sources under earlier results) needs a copy of the sources.
    std::vector<U> staged;
    const U* s = src.ptr();
    if (sizeof(T) > sizeof(U) && dst.GetPhyAddr() == src.GetPhyAddr()) {
        staged.assign(s, s + count);
        s = staged.data();
    }
    T* d = dst.ptr();
    emu_detail::cast_loop(d, s, count, roundMode);
    emu_detail::vec_issue(api, emu_detail::reps_for(static_cast<uint64_t>(count) * std::max(sizeof(T), sizeof(U))));
}

// ---------------------------------------------------------------------------
// ReduceMax / ReduceMin / ReduceSum (card §5): half/float only.
// dst[0] = value; with calIndex dst[1] holds the index in the bits of T. Ties -> smallest index.
// The tmp buffer must hold at least roundup32(2*ceil(count/elemsPerRepeat)) elements' bytes
// (the no-index figure of the doc page; a lower bound when calIndex is set).
// ---------------------------------------------------------------------------
namespace emu_detail {
template <class T>
void check_reduce(const char* api, const LocalTensor<T>& dst, const LocalTensor<T>& src, const LocalTensor<T>& tmp,
                  int32_t count, uint32_t dst_elems) {
    if constexpr (!avsg_emu::kStrict) return;  // fast build: checks compiled out
    static_assert(is_hf_v<T>, "ReduceMax/ReduceMin/ReduceSum: T must be half/float on A2 (card §5)");
    uint32_t n = checked_count(api, count);
    check_ub(api, "dst", dst, dst_elems);
    check_ub(api, "src", src, n);
    uint64_t reps = (n + 256 / sizeof(T) - 1) / (256 / sizeof(T));
    uint64_t tmp_bytes = ((2 * reps * sizeof(T) + 31) / 32) * 32;
    check_ub(api, "sharedTmpBuffer", tmp, tmp_bytes / sizeof(T));
}
template <class T>
void reduce_minmax(const char* api, const LocalTensor<T>& dst, const LocalTensor<T>& src, const LocalTensor<T>& tmp,
                   int32_t count, bool calIndex, bool is_max) {
    check_reduce(api, dst, src, tmp, count, calIndex ? 2 : 1);
    uint32_t n = static_cast<uint32_t>(count);
    if (n == 0) return;
    {
        avsg_emu::hz::Instr hi(avsg_emu::kHzV, api);
        avsg_emu::detail::hz_rd(hi, src, static_cast<uint64_t>(n) * sizeof(T));
        avsg_emu::detail::hz_wr(hi, tmp, std::min<uint64_t>(tmp.GetLength(), 32));
        avsg_emu::detail::hz_wr(hi, dst, (calIndex ? 2 : 1) * sizeof(T));
    }
    const T* s = src.ptr();
    // The first index whose value is strictly the best seen, scanning in order (a NaN is never
    // taken, except as element 0, which nothing then beats), in two passes: the best value, then
    // the first element equal to it (+0 and -0 compare equal, as in the scan). Half runs on its
    // order keys (a NaN's key loses to every other), in integer loops that vectorise; float on
    // its values.
    uint32_t best = 0;
    if constexpr (std::is_same<T, half>::value) {
        if (!half_is_nan(s[0].bits)) {
            const int32_t loser = is_max ? INT32_MIN : INT32_MAX;
            auto key = [loser](uint16_t h) { return half_is_nan(h) ? loser : half_order_key(h); };
            int32_t top = key(s[0].bits);
            if (is_max) for (uint32_t i = 1; i < n; ++i) top = std::max(top, key(s[i].bits));
            else for (uint32_t i = 1; i < n; ++i) top = std::min(top, key(s[i].bits));
            while (key(s[best].bits) != top) ++best;
        }
    } else {
        const float first = s[0];
        if (first == first) {
            float top = first;
            for (uint32_t i = 1; i < n; ++i) {   // a NaN fails both compares: top stays
                const float a = s[i];
                top = (is_max ? a > top : a < top) ? a : top;
            }
            while (s[best] != top) ++best;
        }
    }
    T v = s[best];
    T* d = dst.ptr();
    d[0] = v;
    if (calIndex) {
        if constexpr (sizeof(T) == 4) {
            uint32_t idx = best;
            std::memcpy(static_cast<void*>(&d[1]), &idx, 4);
        } else {
            if (best > 65535) fail(std::string(api) + ": index > 65535 cannot be returned in half (card §5)");
            uint16_t idx = static_cast<uint16_t>(best);
            std::memcpy(static_cast<void*>(&d[1]), &idx, 2);
        }
    }
    avsg_emu::detail::poison(tmp.bytes(), std::min<uint64_t>(tmp.GetLength(), 32));
    vec_issue(api, reps_for(static_cast<uint64_t>(n) * sizeof(T)));
    // Every vcmax / vcmin step sets its own mask (dav_c220 kernel_operator_vec_reduce_impl.h,
    // ReduceOperation: SetMask<T>(highMask, lowMask)) and the last one's stay: the 2-lane merge of
    // a tail (ReduceTailCompute), else one repeat's `n` lanes, else a 0101... pattern of the
    // second / third steps (CreateSpecialFormatMask).
    constexpr uint32_t E = 256 / sizeof(T);
    if (n % E != 0 && n > E) leave_mask(api, 0, 3);
    else if (n <= E) leave_mask_lanes<T>(api, n);
    else leave_mask(api, sizeof(T) == 2 ? 0x5555555555555555ull : 0, 0x5555555555555555ull);
}
}  // namespace emu_detail

template <class T>
__aicore__ inline void ReduceMax(const LocalTensor<T>& dst, const LocalTensor<T>& src, const LocalTensor<T>& sharedTmpBuffer,
                                 const int32_t count, bool calIndex = 0) {
    emu_detail::reduce_minmax("ReduceMax", dst, src, sharedTmpBuffer, count, calIndex, true);
}
template <class T>
__aicore__ inline void ReduceMin(const LocalTensor<T>& dst, const LocalTensor<T>& src, const LocalTensor<T>& sharedTmpBuffer,
                                 const int32_t count, bool calIndex = 0) {
    emu_detail::reduce_minmax("ReduceMin", dst, src, sharedTmpBuffer, count, calIndex, false);
}
// Rounds of per-repeat binary-tree sums until one value remains (⚠️ the exact intra-repeat
// addition order of the hardware is not documented in the card).
template <class T, bool isSetMask = true>
__aicore__ inline void ReduceSum(const LocalTensor<T>& dst, const LocalTensor<T>& src, const LocalTensor<T>& sharedTmpBuffer,
                                 const int32_t count) {
    const char* api = "ReduceSum";
    emu_detail::check_reduce(api, dst, src, sharedTmpBuffer, count, 1);
    uint32_t n = static_cast<uint32_t>(count);
    if (n == 0) return;
    {
        avsg_emu::hz::Instr hi(avsg_emu::kHzV, api);
        avsg_emu::detail::hz_rd(hi, src, static_cast<uint64_t>(n) * sizeof(T));
        avsg_emu::detail::hz_wr(hi, sharedTmpBuffer, std::min<uint64_t>(sharedTmpBuffer.GetLength(), 32));
        avsg_emu::detail::hz_wr(hi, dst, sizeof(T));
    }
    constexpr uint32_t E = 256 / sizeof(T);
    std::vector<float> cur(n);
    for (uint32_t i = 0; i < n; ++i) cur[i] = static_cast<float>(src.ptr()[i]);
    do {
        std::vector<float> next;
        for (uint32_t r = 0; r * E < cur.size(); ++r) {
            std::vector<float> part(cur.begin() + r * E, cur.begin() + std::min<size_t>(cur.size(), (r + 1) * E));
            while (part.size() > 1) {
                std::vector<float> h((part.size() + 1) / 2);
                for (size_t k = 0; k < h.size(); ++k)
                    h[k] = 2 * k + 1 < part.size() ? static_cast<float>(T(part[2 * k] + part[2 * k + 1])) : part[2 * k];
                part.swap(h);
            }
            next.push_back(part[0]);
        }
        cur.swap(next);
    } while (cur.size() > 1);
    dst.ptr()[0] = T(cur[0]);
    avsg_emu::detail::poison(sharedTmpBuffer.bytes(), std::min<uint64_t>(sharedTmpBuffer.GetLength(), 32));
    emu_detail::vec_issue(api, emu_detail::reps_for(static_cast<uint64_t>(n) * sizeof(T)));
}

// ---------------------------------------------------------------------------
// Sorting, float only in this emulation (card §5 "Sorting"; half is valid on A2 but not emulated).
// Pairs are 8 B: score in the low 4 B, uint32 index in the high 4 B. Descending; ties keep the
// lower original position first.
// ---------------------------------------------------------------------------
namespace emu_detail {
inline void check_sort_rep(const char* api, int32_t repeatTime) {
    if constexpr (!avsg_emu::kStrict) return;  // fast build: checks compiled out
    if (repeatTime < 0 || repeatTime > 255)
        fail(std::string(api) + ": repeatTime " + std::to_string(repeatTime) + " outside 0..255 (card §0, §5)");
}
inline void sort_pairs(float* out_pairs, const float* scores, const uint32_t* idx, uint32_t n) {
    std::vector<uint32_t> ord(n);
    for (uint32_t i = 0; i < n; ++i) ord[i] = i;
    std::stable_sort(ord.begin(), ord.end(), [&](uint32_t a, uint32_t b) { return scores[a] > scores[b]; });
    for (uint32_t k = 0; k < n; ++k) {
        std::memcpy(&out_pairs[2 * k], &scores[ord[k]], 4);
        std::memcpy(&out_pairs[2 * k + 1], &idx[ord[k]], 4);
    }
}

// One vmrgsort4 (MrgSort, A2): merge the lists whose validBit is set, each `len[i]` (score,
// index) pairs sorted by descending score, into `out`; the sources are read before anything is
// written, as they are distinct from `out` in the network below. On equal scores the list with
// the lower number goes first. ⚠️ The docs do not state the tie order; this is the order that
// makes Sort's merge network stable, as Sort32 is (lower original position first).
inline void mrgsort4(float* out, const float* const src[4], const uint32_t len[4], uint16_t validBit) {
    uint32_t at[4] = {0, 0, 0, 0}, total = 0;
    for (int i = 0; i < 4; ++i)
        if (validBit & (1u << i)) total += len[i];
    std::vector<float> merged(2ull * total);
    for (uint32_t k = 0; k < total; ++k) {
        int best = -1;
        for (int i = 0; i < 4; ++i) {
            if (!(validBit & (1u << i)) || at[i] == len[i]) continue;
            if (best < 0 || src[i][2 * at[i]] > src[best][2 * at[best]]) best = i;
        }
        std::memcpy(&merged[2 * k], &src[best][2 * at[best]], 8);
        ++at[best];
    }
    std::memcpy(out, merged.data(), merged.size() * 4);
}

// Sort<float, true>'s merge stage on A2 (asc-devkit impl/basic_api/dav_c220/
// kernel_operator_proposal_impl.h, DoFullSort with FullSortInnerLoop / FullSortInnerLoopTail /
// ComSortInnerLoopTail), on `dst` (the Sort32 runs of 32 pairs) and `tmp`, both 2*32*repeatTime
// floats. Each round copies dst to tmp and merges groups of four runs from tmp into dst
// (MrgSort4 with repeatTimes = full groups), then the tail group: 2..4 runs, the last one
// `elementCountTail` long, in one MrgSort4, or a single run copied. Offsets in floats (a pair is
// two). Kept line for line so that its tail arithmetic, not a stable sort, decides the result.
inline void full_sort_network(float* dst, float* tmp, int32_t repeatTime) {
    constexpr uint32_t kLists = 4, kRun = 32;
    uint32_t loop = 0;
    for (int32_t q = repeatTime; q > 1; q = (q + 3) / 4) ++loop;
    uint16_t single = kRun;                       // singleMergeTmpElementCount (uint16_t, as there)
    const uint32_t srcCount = static_cast<uint32_t>(repeatTime) * kRun;
    const uint32_t dstFloats = srcCount * 2;
    int32_t totalQue = repeatTime, tailQue = repeatTime % kLists;
    int32_t reps = repeatTime / kLists;
    std::memcpy(tmp, dst, dstFloats * 4);
    for (uint32_t i = 0; i < loop; ++i) {
        const uint32_t base = single * 2u;
        for (int32_t r = 0; r < reps; ++r) {        // FullSortInnerLoop: MrgSort4, repeatTimes = reps
            const uint32_t off = r * kLists * base;
            const float* src[4] = {tmp + off, tmp + off + base, tmp + off + 2 * base, tmp + off + 3 * base};
            const uint32_t len[4] = {single, single, single, single};
            if (single > 4095) fail("Sort: a merge list of " + std::to_string(single) + " pairs (MrgSort takes <= 4095)");
            mrgsort4(dst + off, src, len, 0b1111);
        }
        const uint16_t tailCount = srcCount % single ? srcCount % single : single;
        if (tailQue > 0) {                          // FullSortInnerLoopTail
            const uint32_t off0 = kLists * base * reps;
            if (tailQue > 1) {
                uint32_t len[4] = {single, single, single, single};
                uint16_t valid = 0b1111;
                if (tailQue == 2) { len[1] = tailCount; len[2] = len[3] = 0; valid = 0b0011; }
                else if (tailQue == 3) { len[2] = tailCount; len[3] = 0; valid = 0b0111; }
                else len[3] = tailCount;
                const float* src[4] = {tmp + off0, tmp + off0 + base, tmp + off0 + 2 * base, tmp + off0 + 3 * base};
                mrgsort4(dst + off0, src, len, valid);
            } else {
                std::memcpy(dst + off0, tmp + off0, tailCount * 2u * 4);
            }
        }
        std::memcpy(tmp, dst, dstFloats * 4);
        single = static_cast<uint16_t>(single * kLists);
        totalQue = totalQue % kLists ? totalQue / kLists + 1 : totalQue / kLists;
        tailQue = totalQue % kLists;
        if (tailQue == 0 && tailCount != single) tailQue = kLists;
        reps = (totalQue - tailQue) / kLists;
    }
}
}  // namespace emu_detail

template <class T>
__aicore__ inline void Sort32(const LocalTensor<T>& dst, const LocalTensor<T>& src0, const LocalTensor<uint32_t>& src1,
                              const int32_t repeatTime) {
    static_assert(std::is_same<T, float>::value, "Sort32: only float is emulated (A2 also has half; card §5)");
    const char* api = "Sort32";
    emu_detail::check_sort_rep(api, repeatTime);
    uint32_t n = static_cast<uint32_t>(repeatTime) * 32;
    // Per repeat: src0 128 B aligned (float), src1 128 B, dst 256 B (Sort32.md, A2).
    emu_detail::check_ub(api, "dst", dst, 2 * n, 256);
    emu_detail::check_ub(api, "src0", src0, n, 128);
    emu_detail::check_ub(api, "src1", src1, n, 128);
    if (n == 0) return;
    {
        avsg_emu::hz::Instr hi(avsg_emu::kHzV, api);
        avsg_emu::detail::hz_rd(hi, src0, n * 4ull);
        avsg_emu::detail::hz_rd(hi, src1, n * 4ull);
        avsg_emu::detail::hz_wr(hi, dst, 2ull * n * 4);
    }
    std::vector<float> out(2 * n);
    for (int32_t r = 0; r < repeatTime; ++r) emu_detail::sort_pairs(&out[64 * r], src0.ptr() + 32 * r, src1.ptr() + 32 * r, 32);
    std::memcpy(dst.bytes(), out.data(), out.size() * 4);
    emu_detail::vec_issue(api, static_cast<uint64_t>(repeatTime));
}
// Sort<T, isFullSort>: Sort32 plus (isFullSort) the MrgSort4 merge network of A2 over all
// repeatTime*32 elements (emu_detail::full_sort_network); tmp must be as large as dst (card §5).
// `concatLocal` holds the scores (Concat is a no-op alias on A2).
template <class T, bool isFullSort>
__aicore__ inline void Sort(const LocalTensor<T>& dstLocal, const LocalTensor<T>& concatLocal,
                            const LocalTensor<uint32_t>& indexLocal, LocalTensor<T>& tmpLocal, const int32_t repeatTime) {
    static_assert(std::is_same<T, float>::value, "Sort: only float is emulated (A2 also has half; card §5)");
    const char* api = "Sort";
    emu_detail::check_sort_rep(api, repeatTime);
    uint32_t n = static_cast<uint32_t>(repeatTime) * 32;
    // On A2 Sort starts with Sort32(dst, concat, index) (kernel_operator_proposal_intf_impl.h), so
    // Sort32's alignment applies: dst 256 B, concat 128 B (float), index 128 B.
    emu_detail::check_ub(api, "dst", dstLocal, 2 * n, 256);
    emu_detail::check_ub(api, "concat", concatLocal, n, 128);
    emu_detail::check_ub(api, "index", indexLocal, n, 128);
    emu_detail::check_ub(api, "tmp", tmpLocal, isFullSort ? 2 * n : 0);
    if (n == 0) return;
    {
        avsg_emu::hz::Instr hi(avsg_emu::kHzV, api);
        avsg_emu::detail::hz_rd(hi, concatLocal, n * 4ull);
        avsg_emu::detail::hz_rd(hi, indexLocal, n * 4ull);
        if (isFullSort) avsg_emu::detail::hz_wr(hi, tmpLocal, 2ull * n * sizeof(T));
        avsg_emu::detail::hz_wr(hi, dstLocal, 2ull * n * 4);
    }
    std::vector<float> out(2 * n);
    for (int32_t r = 0; r < repeatTime; ++r)        // Sort32
        emu_detail::sort_pairs(&out[64 * r], concatLocal.ptr() + 32 * r, indexLocal.ptr() + 32 * r, 32);
    if (isFullSort) {                                // the MrgSort4 network, through tmp
        std::vector<float> tmp(2 * n);
        emu_detail::full_sort_network(out.data(), tmp.data(), repeatTime);
    }
    std::memcpy(dstLocal.bytes(), out.data(), out.size() * 4);
    // tmp's last contents (a copy of dst) are the implementation's, not the API's: poisoned.
    if (isFullSort) avsg_emu::detail::poison(tmpLocal.bytes(), 2ull * n * sizeof(T));
    emu_detail::vec_issue(api, emu_detail::reps_for(2ull * n * sizeof(T)) * (isFullSort ? 2 : 1));
}
// Extract(values, indices, sorted pairs, repeatTime = n/32) (card §5).
template <class T>
__aicore__ inline void Extract(const LocalTensor<T>& dstValueLocal, const LocalTensor<uint32_t>& dstIndexLocal,
                               const LocalTensor<T>& sortedLocal, const int32_t repeatTime) {
    static_assert(std::is_same<T, float>::value, "Extract: only float is emulated (card §5)");
    const char* api = "Extract";
    emu_detail::check_sort_rep(api, repeatTime);
    uint32_t n = static_cast<uint32_t>(repeatTime) * 32;
    emu_detail::check_ub(api, "dstValue", dstValueLocal, n);
    emu_detail::check_ub(api, "dstIndex", dstIndexLocal, n);
    emu_detail::check_ub(api, "sorted", sortedLocal, 2 * n);
    // A2's Extract is two GatherMasks in normal mode with mask 0 (kernel_operator_proposal_intf_impl.h):
    // the register stays at (0, 0) (dav_c220 GatherMaskImpl).
    emu_detail::leave_mask(api, 0, 0);
    if (n == 0) return;
    {
        avsg_emu::hz::Instr hi(avsg_emu::kHzV, api);
        avsg_emu::detail::hz_rd(hi, sortedLocal, 8ull * n);
        avsg_emu::detail::hz_wr(hi, dstValueLocal, 4ull * n);
        avsg_emu::detail::hz_wr(hi, dstIndexLocal, 4ull * n);
    }
    std::vector<float> pairs(2 * n);
    std::memcpy(pairs.data(), sortedLocal.bytes(), 8ull * n);
    for (uint32_t i = 0; i < n; ++i) {
        std::memcpy(dstValueLocal.ptr() + i, &pairs[2 * i], 4);
        std::memcpy(dstIndexLocal.ptr() + i, &pairs[2 * i + 1], 4);
    }
    emu_detail::vec_issue(api, 2 * emu_detail::reps_for(8ull * n));  // two GatherMask passes (card §5)
}

}  // inline namespace AVSG_EMU_VARIANT
}  // namespace AscendC
