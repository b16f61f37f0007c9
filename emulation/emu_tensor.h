// emu_tensor.h: GlobalTensor / LocalTensor (card §2) and the shared argument checks
// used by the DMA and vector APIs (alignment, size overflow, dtype lists).
#pragma once
#include "emu_core.h"
#include "emu_hazard.h"

namespace avsg_emu {
inline namespace AVSG_EMU_VARIANT {
namespace detail {
template <class T, class... Ts>
struct is_one_of : std::disjunction<std::is_same<T, Ts>...> {};
template <class T, class... Ts>
constexpr bool is_one_of_v = is_one_of<T, Ts...>::value;

// DataCopy / DataCopyPad dtypes on A2 (card §4).
template <class T>
constexpr bool is_dma_type_v = is_one_of_v<T, int8_t, uint8_t, int16_t, uint16_t, half, bfloat16_t, int32_t, uint32_t,
                                           float, int64_t, uint64_t, double>;

inline std::string tname_of_size(size_t s) { return std::to_string(s) + "-byte"; }
}  // namespace detail
}  // inline namespace AVSG_EMU_VARIANT
}  // namespace avsg_emu

namespace AscendC {
inline namespace AVSG_EMU_VARIANT {

template <class T>
class LocalTensor;

// ---------------------------------------------------------------------------
// GlobalTensor<T> (card §2). Scalar GetValue/SetValue count as PIPE_S work.
// The DCache is not modelled: GM accesses are direct (see DataCacheCleanAndInvalid).
// ---------------------------------------------------------------------------
template <class T>
class GlobalTensor {
public:
    GlobalTensor() = default;
    __aicore__ inline void SetGlobalBuffer(__gm__ T* buffer, uint64_t bufferSize) {
        addr_ = buffer;
        size_ = bufferSize;
    }
    // Leaves GetSize() at 0: size checks are then impossible (card §2).
    __aicore__ inline void SetGlobalBuffer(__gm__ T* buffer) {
        addr_ = buffer;
        size_ = 0;
    }
    __aicore__ inline T GetValue(uint64_t offset) const {
        if constexpr (avsg_emu::kStrict) {
            check_index("GlobalTensor::GetValue", offset);
            avsg_emu::ctx("GlobalTensor::GetValue").counters.scalar_gm_reads++;
        }
        avsg_emu::hz::Instr(avsg_emu::kHzS, "GlobalTensor::GetValue")
            .rd_gm(addr_ + offset, sizeof(T));
        T v;
        std::memcpy(&v, addr_ + offset, sizeof(T));
        return v;
    }
    __aicore__ inline void SetValue(uint64_t offset, T value) const {
        if constexpr (avsg_emu::kStrict) {
            check_index("GlobalTensor::SetValue", offset);
            avsg_emu::ctx("GlobalTensor::SetValue").counters.scalar_gm_writes++;
        }
        avsg_emu::hz::Instr(avsg_emu::kHzS, "GlobalTensor::SetValue").wr_gm(addr_ + offset, sizeof(T));
        std::memcpy(addr_ + offset, &value, sizeof(T));
    }
    __aicore__ inline GlobalTensor operator[](uint64_t offset) const {
        if (avsg_emu::kStrict && size_ != 0 && offset > size_)
            avsg_emu::fail("GlobalTensor::operator[]: offset " + std::to_string(offset) + " beyond size " +
                           std::to_string(size_) + " (tensor size overflow)");
        GlobalTensor r;
        r.addr_ = addr_ + offset;
        r.size_ = size_ ? size_ - offset : 0;
        return r;
    }
    __aicore__ inline const __gm__ T* GetPhyAddr() const { return addr_; }
    __aicore__ inline __gm__ T* GetPhyAddr(uint64_t offset) const { return addr_ + offset; }
    __aicore__ inline uint64_t GetSize() const { return size_; }
    __aicore__ inline void SetL2CacheHint(CacheMode) {}

private:
    void check_index(const char* api, uint64_t offset) const {
        if (!addr_) avsg_emu::fail(std::string(api) + ": GlobalTensor has no buffer (SetGlobalBuffer not called)");
        if (size_ != 0 && offset >= size_)
            avsg_emu::fail(std::string(api) + ": index " + std::to_string(offset) + " out of range (size " +
                           std::to_string(size_) + ")");
    }
    __gm__ T* addr_ = nullptr;
    uint64_t size_ = 0;
};

// ---------------------------------------------------------------------------
// LocalTensor<T> (card §2): a view of the block's UB arena. It holds the UB byte
// offset (what GetPhyAddr returns) and the view's byte length.
// ---------------------------------------------------------------------------
template <class T>
class LocalTensor {
public:
    using PrimType = T;
    LocalTensor() = default;

    __aicore__ inline T GetValue(uint32_t index) const {
        if constexpr (avsg_emu::kStrict) {
            check_index("LocalTensor::GetValue", index);
            avsg_emu::ctx("LocalTensor::GetValue").counters.scalar_ub_reads++;
        }
        avsg_emu::hz::Instr(avsg_emu::kHzS, "LocalTensor::GetValue").rd_ub(off_ + static_cast<uint64_t>(index) * sizeof(T), sizeof(T));
        T v;
        std::memcpy(&v, ptr() + index, sizeof(T));
        return v;
    }
    template <class T1>
    __aicore__ inline void SetValue(uint32_t index, T1 value) const {
        if constexpr (avsg_emu::kStrict) {
            check_index("LocalTensor::SetValue", index);
            avsg_emu::ctx("LocalTensor::SetValue").counters.scalar_ub_writes++;
        }
        avsg_emu::hz::Instr(avsg_emu::kHzS, "LocalTensor::SetValue").wr_ub(off_ + static_cast<uint64_t>(index) * sizeof(T), sizeof(T));
        T v = static_cast<T>(value);
        std::memcpy(ptr() + index, &v, sizeof(T));
    }
    // Counted as one scalar read (the write through the reference is not visible to us). The
    // hazard scoreboard treats it as a scalar read and write (it may be either).
    __aicore__ inline T& operator()(uint32_t index) const {
        if constexpr (avsg_emu::kStrict) {
            check_index("LocalTensor::operator()", index);
            avsg_emu::ctx("LocalTensor::operator()").counters.scalar_ub_reads++;
        }
        {
            avsg_emu::hz::Instr hi(avsg_emu::kHzS, "LocalTensor::operator()");
            hi.rd_ub(off_ + static_cast<uint64_t>(index) * sizeof(T), sizeof(T));
            hi.wr_ub(off_ + static_cast<uint64_t>(index) * sizeof(T), sizeof(T));
        }
        return ptr()[index];
    }
    // Offsets by elements; the view's length shrinks accordingly (card §2).
    __aicore__ inline LocalTensor operator[](uint32_t offset) const {
        uint64_t bytes = static_cast<uint64_t>(offset) * sizeof(T);
        if (avsg_emu::kStrict && !ub_) avsg_emu::fail("LocalTensor::operator[]: tensor is not bound to UB");
        if (avsg_emu::kStrict && bytes > len_)
            avsg_emu::fail("LocalTensor::operator[]: offset " + std::to_string(offset) + " elements beyond the view (" +
                           std::to_string(len_ / sizeof(T)) + " elements) (tensor size overflow)");
        LocalTensor r = *this;
        r.off_ = off_ + static_cast<uint32_t>(bytes);
        r.len_ = len_ - static_cast<uint32_t>(bytes);
        return r;
    }
    // Same address and byte length; GetSize() rescales (card §2).
    template <class U>
    __aicore__ inline LocalTensor<U> ReinterpretCast() const {
        LocalTensor<U> r;
        r.ub_ = ub_;
        r.off_ = off_;
        r.len_ = len_;
        r.pos_ = pos_;
        return r;
    }
    __aicore__ inline uint32_t GetSize() const { return len_ / sizeof(T); }
    __aicore__ inline uint32_t GetLength() const { return len_; }
    // Shrinks (never grows) the view to `size` elements.
    __aicore__ inline void SetSize(uint32_t size) {
        uint64_t bytes = static_cast<uint64_t>(size) * sizeof(T);
        if (bytes > cap_len())
            avsg_emu::fail("LocalTensor::SetSize: " + std::to_string(size) + " elements exceed the buffer");
        len_ = static_cast<uint32_t>(bytes);
    }
    // The UB byte address of the view (0 = start of UB).
    __aicore__ inline uint64_t GetPhyAddr() const { return off_; }
    __aicore__ inline uint64_t GetPhyAddr(uint32_t offset) const { return off_ + offset * sizeof(T); }
    __aicore__ inline TPosition GetPosition() const { return pos_; }

    // ---- emulation internals (not AscendC API) ----
    T* ptr() const { return reinterpret_cast<T*>(ub_ + off_); }
    uint8_t* bytes() const { return ub_ + off_; }
    bool bound() const { return ub_ != nullptr; }
    uint32_t cap_len() const { return len_; }
    static LocalTensor make(uint8_t* ub, uint32_t off, uint32_t len, TPosition pos) {
        LocalTensor r;
        r.ub_ = ub;
        r.off_ = off;
        r.len_ = len;
        r.pos_ = pos;
        return r;
    }

    uint8_t* ub_ = nullptr;
    uint32_t off_ = 0;
    uint32_t len_ = 0;
    TPosition pos_ = TPosition::VECCALC;

private:
    void check_index(const char* api, uint32_t index) const {
        if (!ub_) avsg_emu::fail(std::string(api) + ": tensor is not bound to UB");
        if (static_cast<uint64_t>(index) * sizeof(T) + sizeof(T) > len_)
            avsg_emu::fail(std::string(api) + ": index " + std::to_string(index) + " out of range (size " +
                           std::to_string(len_ / sizeof(T)) + ")");
    }
};

}  // inline namespace AVSG_EMU_VARIANT
}  // namespace AscendC

namespace avsg_emu {
inline namespace AVSG_EMU_VARIANT {
namespace detail {

// A LocalTensor operand of a vector or DMA API: bound, 32 B aligned (card §0), and at least
// `count` elements long (tensor size overflow).
template <class T>
void check_ub(const char* api, const char* operand, const AscendC::LocalTensor<T>& t, uint64_t count,
              uint32_t align = kUbAlign) {
    if constexpr (!kStrict) return;
    if (!t.bound()) fail(std::string(api) + ": " + operand + " is not bound to UB (uninitialised LocalTensor)");
    if (t.GetPhyAddr() % align != 0)
        fail(std::string(api) + ": " + operand + " UB address " + std::to_string(t.GetPhyAddr()) +
             " is not " + std::to_string(align) + "-byte aligned (card §0: every LocalTensor passed to a vector or DMA "
             "API must start on a 32 B boundary)");
    if (count * sizeof(T) > t.GetLength())
        fail(std::string(api) + ": " + operand + " needs " + std::to_string(count) + " elements (" +
             std::to_string(count * sizeof(T)) + " B) but the view holds " + std::to_string(t.GetLength()) +
             " B (tensor size overflow)");
}
// A GlobalTensor operand: has a buffer; `count` elements fit in its size when it has one.
template <class T>
void check_gm(const char* api, const char* operand, const AscendC::GlobalTensor<T>& g, uint64_t count) {
    if constexpr (!kStrict) return;
    if (!g.GetPhyAddr()) fail(std::string(api) + ": " + operand + " GlobalTensor has no buffer");
    if (g.GetSize() != 0 && count > g.GetSize())
        fail(std::string(api) + ": " + operand + " needs " + std::to_string(count) + " elements but the GlobalTensor size is " +
             std::to_string(g.GetSize()) + " (tensor size overflow)");
}
inline void check_gm_bytes(const char* api, const char* operand, uint64_t size_elems, size_t elem, uint64_t bytes) {
    if constexpr (!kStrict) return;
    if (size_elems != 0 && bytes > size_elems * elem)
        fail(std::string(api) + ": " + operand + " extent " + std::to_string(bytes) + " B exceeds the GlobalTensor size " +
             std::to_string(size_elems * elem) + " B (tensor size overflow)");
}
inline bool ranges_overlap(const uint8_t* a, size_t alen, const uint8_t* b, size_t blen) {
    return alen && blen && a < b + blen && b < a + alen;
}
// Undefined memory: a recognisable pattern in the strict build; left as is in the fast build.
inline void poison(void* p, size_t n) {
    if constexpr (kStrict) std::memset(p, kPoisonByte, n);
}

// Scoreboard helpers for LocalTensor operands (bytes from the view's start).
template <class T>
void hz_rd(hz::Instr& i, const AscendC::LocalTensor<T>& t, uint64_t bytes) {
    i.rd_ub(t.GetPhyAddr(), bytes);
}
template <class T>
void hz_wr(hz::Instr& i, const AscendC::LocalTensor<T>& t, uint64_t bytes) {
    i.wr_ub(t.GetPhyAddr(), bytes);
}

}  // namespace detail
}  // inline namespace AVSG_EMU_VARIANT
}  // namespace avsg_emu
