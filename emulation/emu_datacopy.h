// emu_datacopy.h: DataCopy (count and DataCopyParams forms) and DataCopyPad (card §4).
// GM->UB runs on MTE2, UB->GM on MTE3 (counted separately), UB->UB on PIPE_V (card §0 ⚠️).
// Each call is one instruction on that pipe for the hazard scoreboard (emu_hazard.h).
#pragma once
#include "emu_tensor.h"

namespace AscendC {
inline namespace AVSG_EMU_VARIANT {

struct DataCopyParams {
    uint16_t blockCount = 1;  // 0..4095
    uint16_t blockLen = 0;    // in 32 B blocks
    uint16_t srcStride = 0;   // gap end-to-start, 32 B blocks (GM side too, card §4)
    uint16_t dstStride = 0;
    DataCopyParams() = default;
    DataCopyParams(uint16_t count, uint16_t len, uint16_t srcStrideIn, uint16_t dstStrideIn)
        : blockCount(count), blockLen(len), srcStride(srcStrideIn), dstStride(dstStrideIn) {}
};

struct DataCopyExtParams {
    uint16_t blockCount = 1;  // 0..4095
    uint32_t blockLen = 0;    // BYTES, 0..2097151
    uint32_t srcStride = 0;   // GM->UB: bytes (GM); UB->GM: 32 B blocks (UB)
    uint32_t dstStride = 0;   // GM->UB: 32 B blocks (UB); UB->GM: bytes (GM)
    uint32_t rsv = 0;
    DataCopyExtParams() = default;
    DataCopyExtParams(uint16_t count, uint32_t len, uint32_t srcStrideIn, uint32_t dstStrideIn, uint32_t rsvIn)
        : blockCount(count), blockLen(len), srcStride(srcStrideIn), dstStride(dstStrideIn), rsv(rsvIn) {}
};

template <class T>
struct DataCopyPadExtParams {
    bool isPad = false;
    uint8_t leftPadding = 0;   // elements, <= 32 B
    uint8_t rightPadding = 0;  // elements, <= 32 B
    T paddingValue = T(0);
    DataCopyPadExtParams() = default;
    DataCopyPadExtParams(bool isPadIn, uint8_t left, uint8_t right, T value)
        : isPad(isPadIn), leftPadding(left), rightPadding(right), paddingValue(value) {}
};

namespace emu_detail {
using avsg_emu::fail;
using avsg_emu::detail::check_gm;
using avsg_emu::detail::check_gm_bytes;
using avsg_emu::detail::check_ub;

template <class T>
void check_dma_type() {
    static_assert(avsg_emu::detail::is_dma_type_v<T>, "DataCopy/DataCopyPad: dtype not supported on A2 (card §4)");
}
template <class T>
void check_gm_align(const char* api, const GlobalTensor<T>& g) {
    if constexpr (!avsg_emu::kStrict) return;  // fast build: checks compiled out
    if (reinterpret_cast<uintptr_t>(g.GetPhyAddr()) % sizeof(T) != 0)
        fail(std::string(api) + ": GM address is not aligned to sizeof(T)=" + std::to_string(sizeof(T)) + " (card §4)");
}
// Count form: count*sizeof(T) must be a multiple of 32 B; the NPU silently drops the tail,
// we reject it (card §4, §8.1).
template <class T>
void check_count32(const char* api, uint32_t count) {
    if constexpr (!avsg_emu::kStrict) return;  // fast build: checks compiled out
    uint64_t bytes = static_cast<uint64_t>(count) * sizeof(T);
    if (bytes % 32 != 0)
        fail(std::string(api) + ": count*sizeof(T) = " + std::to_string(bytes) +
             " B is not a multiple of 32 B (card §4: the NPU silently drops the tail; use DataCopyPad)");
    if (bytes / 32 > 65535)
        fail(std::string(api) + ": count*sizeof(T)/32 exceeds the uint16_t blockLen (card §4)");
}
inline void count_mte(bool to_ub, uint64_t bytes) {
    if constexpr (!avsg_emu::kStrict) return;  // fast build: nothing is counted
    auto& c = avsg_emu::ctx("DataCopy").counters;
    if (to_ub) {
        c.mte2_copies++;
        c.mte2_bytes += bytes;
        avsg_emu::hz::note_mte2_issue(bytes);
    }
    else { c.mte3_copies++; c.mte3_bytes += bytes; }
}
inline void count_ubcopy(const char* api, uint64_t bytes) {
    if constexpr (!avsg_emu::kStrict) return;  // fast build: nothing is counted
    auto& c = avsg_emu::ctx(api).counters;
    uint64_t reps = (bytes + 255) / 256;
    c.ub_copies++;
    c.ub_bytes += bytes;
    c.vec_instrs++;
    c.vec_repeats += reps;
    auto& s = c.vec_by_api["DataCopy(UB->UB)"];
    s.instrs++;
    s.repeats += reps;
}
// UB->GM write honouring SetAtomicAdd.
inline void gm_write(uint8_t* dst, const uint8_t* src, size_t n) {
    auto& c = avsg_emu::ctx("DataCopy");
    if (c.atomic_add) {
        c.atomic_add(dst, src, n);   // DMA atomics exist to let cores accumulate into one place
        return;
    }
    if (avsg_emu::kStrict && n && c.launch && c.num > 1 && avsg_emu::granule_checks()) {
        std::lock_guard<std::mutex> lk(c.launch->granule_mu);
        const uintptr_t first = reinterpret_cast<uintptr_t>(dst) / 32, last = (reinterpret_cast<uintptr_t>(dst) + n - 1) / 32;
        const uint64_t epoch = c.counters.sync_alls;
        for (uintptr_t g = first; g <= last; ++g) {
            auto it = c.launch->granule_owner.emplace(g, avsg_emu::LaunchState::GranuleWriter{c.idx, epoch}).first;
            if (it->second.block != c.idx && it->second.epoch == epoch)
                fail("DataCopy(UB->GM): the 32 B GM granule at " + std::to_string(g * 32) + " is written by block " +
                     std::to_string(it->second.block) + " and block " + std::to_string(c.idx) +
                     " with no SyncAll between them (pad the output pitch so that no granule has two writers)");
            it->second = {c.idx, epoch};
        }
    }
    std::memcpy(dst, src, n);
}
inline bool atomic_on() { return avsg_emu::ctx("DataCopy").atomic_add != nullptr; }
inline void check_params(const char* api, uint32_t blockCount) {
    if constexpr (!avsg_emu::kStrict) return;  // fast build: checks compiled out
    if (blockCount > 4095)
        fail(std::string(api) + ": blockCount " + std::to_string(blockCount) + " > 4095 (card §4)");
}
}  // namespace emu_detail

// ---- DataCopy, count form ---------------------------------------------------
template <class T>
__aicore__ inline void DataCopy(const LocalTensor<T>& dst, const GlobalTensor<T>& src, const uint32_t count) {
    emu_detail::check_dma_type<T>();
    const char* api = "DataCopy(GM->UB)";
    emu_detail::check_count32<T>(api, count);
    emu_detail::check_ub(api, "dst", dst, count);
    emu_detail::check_gm(api, "src", src, count);
    emu_detail::check_gm_align(api, src);
    if (count == 0) return;
    {
        avsg_emu::hz::Instr hi(avsg_emu::kHzMte2, "DataCopy");
        hi.rd_gm(src.GetPhyAddr(), count * sizeof(T));
        hi.wr_ub(dst.GetPhyAddr(), count * sizeof(T));
    }
    std::memcpy(dst.bytes(), src.GetPhyAddr(), count * sizeof(T));
    emu_detail::count_mte(true, count * sizeof(T));
}
template <class T>
__aicore__ inline void DataCopy(const GlobalTensor<T>& dst, const LocalTensor<T>& src, const uint32_t count) {
    emu_detail::check_dma_type<T>();
    const char* api = "DataCopy(UB->GM)";
    emu_detail::check_count32<T>(api, count);
    emu_detail::check_ub(api, "src", src, count);
    emu_detail::check_gm(api, "dst", dst, count);
    emu_detail::check_gm_align(api, dst);
    if (count == 0) return;
    {
        avsg_emu::hz::Instr hi(avsg_emu::kHzMte3, "DataCopy");
        hi.set_atomic(emu_detail::atomic_on());
        hi.rd_ub(src.GetPhyAddr(), count * sizeof(T));
        hi.wr_gm(dst.GetPhyAddr(), count * sizeof(T));
    }
    emu_detail::gm_write(reinterpret_cast<uint8_t*>(dst.GetPhyAddr(0)), src.bytes(), count * sizeof(T));
    emu_detail::count_mte(false, count * sizeof(T));
}
template <class T>
__aicore__ inline void DataCopy(const LocalTensor<T>& dst, const LocalTensor<T>& src, const uint32_t count) {
    emu_detail::check_dma_type<T>();
    const char* api = "DataCopy(UB->UB)";
    emu_detail::check_count32<T>(api, count);
    emu_detail::check_ub(api, "dst", dst, count);
    emu_detail::check_ub(api, "src", src, count);
    if (count == 0) return;
    {
        avsg_emu::hz::Instr hi(avsg_emu::kHzV, "DataCopy");
        hi.rd_ub(src.GetPhyAddr(), count * sizeof(T));
        hi.wr_ub(dst.GetPhyAddr(), count * sizeof(T));
    }
    std::memmove(dst.bytes(), src.bytes(), count * sizeof(T));
    emu_detail::count_ubcopy(api, count * sizeof(T));
}

// ---- DataCopy, DataCopyParams form (all units 32 B blocks, card §4) ------------
template <class T>
__aicore__ inline void DataCopy(const LocalTensor<T>& dst, const GlobalTensor<T>& src, const DataCopyParams& p) {
    emu_detail::check_dma_type<T>();
    const char* api = "DataCopy(GM->UB, DataCopyParams)";
    emu_detail::check_params(api, p.blockCount);
    if (p.blockCount == 0 || p.blockLen == 0) return;
    uint64_t blk = p.blockLen * 32ull;
    uint64_t dext = (p.blockCount - 1ull) * (blk + p.dstStride * 32ull) + blk;
    uint64_t sext = (p.blockCount - 1ull) * (blk + p.srcStride * 32ull) + blk;
    emu_detail::check_ub(api, "dst", dst, (dext + sizeof(T) - 1) / sizeof(T));
    emu_detail::check_gm(api, "src", src, 0);
    emu_detail::check_gm_bytes(api, "src", src.GetSize(), sizeof(T), sext);
    emu_detail::check_gm_align(api, src);
    {
        avsg_emu::hz::Instr hi(avsg_emu::kHzMte2, "DataCopy");
        for (uint32_t i = 0; i < p.blockCount; ++i)
            hi.rd_gm(reinterpret_cast<const uint8_t*>(src.GetPhyAddr()) + i * (blk + p.srcStride * 32ull), blk);
        for (uint32_t i = 0; i < p.blockCount; ++i) hi.wr_ub(dst.GetPhyAddr() + i * (blk + p.dstStride * 32ull), blk);
    }
    for (uint32_t i = 0; i < p.blockCount; ++i)
        std::memcpy(dst.bytes() + i * (blk + p.dstStride * 32ull),
                    reinterpret_cast<const uint8_t*>(src.GetPhyAddr()) + i * (blk + p.srcStride * 32ull), blk);
    emu_detail::count_mte(true, blk * p.blockCount);
}
template <class T>
__aicore__ inline void DataCopy(const GlobalTensor<T>& dst, const LocalTensor<T>& src, const DataCopyParams& p) {
    emu_detail::check_dma_type<T>();
    const char* api = "DataCopy(UB->GM, DataCopyParams)";
    emu_detail::check_params(api, p.blockCount);
    if (p.blockCount == 0 || p.blockLen == 0) return;
    uint64_t blk = p.blockLen * 32ull;
    uint64_t sext = (p.blockCount - 1ull) * (blk + p.srcStride * 32ull) + blk;
    uint64_t dext = (p.blockCount - 1ull) * (blk + p.dstStride * 32ull) + blk;
    emu_detail::check_ub(api, "src", src, (sext + sizeof(T) - 1) / sizeof(T));
    emu_detail::check_gm(api, "dst", dst, 0);
    emu_detail::check_gm_bytes(api, "dst", dst.GetSize(), sizeof(T), dext);
    emu_detail::check_gm_align(api, dst);
    {
        avsg_emu::hz::Instr hi(avsg_emu::kHzMte3, "DataCopy");
        hi.set_atomic(emu_detail::atomic_on());
        for (uint32_t i = 0; i < p.blockCount; ++i) hi.rd_ub(src.GetPhyAddr() + i * (blk + p.srcStride * 32ull), blk);
        for (uint32_t i = 0; i < p.blockCount; ++i)
            hi.wr_gm(reinterpret_cast<const uint8_t*>(dst.GetPhyAddr()) + i * (blk + p.dstStride * 32ull), blk);
    }
    for (uint32_t i = 0; i < p.blockCount; ++i)
        emu_detail::gm_write(reinterpret_cast<uint8_t*>(dst.GetPhyAddr(0)) + i * (blk + p.dstStride * 32ull),
                             src.bytes() + i * (blk + p.srcStride * 32ull), blk);
    emu_detail::count_mte(false, blk * p.blockCount);
}
template <class T>
__aicore__ inline void DataCopy(const LocalTensor<T>& dst, const LocalTensor<T>& src, const DataCopyParams& p) {
    emu_detail::check_dma_type<T>();
    const char* api = "DataCopy(UB->UB, DataCopyParams)";
    emu_detail::check_params(api, p.blockCount);
    if (p.blockCount == 0 || p.blockLen == 0) return;
    uint64_t blk = p.blockLen * 32ull;
    uint64_t sext = (p.blockCount - 1ull) * (blk + p.srcStride * 32ull) + blk;
    uint64_t dext = (p.blockCount - 1ull) * (blk + p.dstStride * 32ull) + blk;
    emu_detail::check_ub(api, "src", src, (sext + sizeof(T) - 1) / sizeof(T));
    emu_detail::check_ub(api, "dst", dst, (dext + sizeof(T) - 1) / sizeof(T));
    {
        avsg_emu::hz::Instr hi(avsg_emu::kHzV, "DataCopy");
        for (uint32_t i = 0; i < p.blockCount; ++i) hi.rd_ub(src.GetPhyAddr() + i * (blk + p.srcStride * 32ull), blk);
        for (uint32_t i = 0; i < p.blockCount; ++i) hi.wr_ub(dst.GetPhyAddr() + i * (blk + p.dstStride * 32ull), blk);
    }
    for (uint32_t i = 0; i < p.blockCount; ++i)
        std::memmove(dst.bytes() + i * (blk + p.dstStride * 32ull), src.bytes() + i * (blk + p.srcStride * 32ull), blk);
    emu_detail::count_ubcopy("DataCopy", blk * p.blockCount);
}

// ---- DataCopyPad (card §4) ------------------------------------------------------
namespace emu_detail {
inline void check_pad_params(const char* api, const DataCopyExtParams& p, size_t elem) {
    if constexpr (!avsg_emu::kStrict) return;  // fast build: checks compiled out
    check_params(api, p.blockCount);
    if (p.blockLen > 2097151)
        fail(std::string(api) + ": blockLen " + std::to_string(p.blockLen) + " B > 2097151 (card §4)");
    if (p.blockLen % elem != 0)
        fail(std::string(api) + ": blockLen " + std::to_string(p.blockLen) + " B is not a multiple of sizeof(T)=" +
             std::to_string(elem) + " (card §4)");
}
}  // namespace emu_detail

// GM->UB (MTE2). Row i lands at UB byte i*(roundup32(left*sz + blockLen + right*sz) + dstStride*32)
// (card §4 ⚠️ for left>0). Padding: paddingValue when isPad, otherwise poisoned (undefined);
// the rest of each row's last 32 B block is poisoned too.
template <class T>
__aicore__ inline void DataCopyPad(const LocalTensor<T>& dst, const GlobalTensor<T>& src, const DataCopyExtParams& p,
                                   const DataCopyPadExtParams<T>& pad) {
    emu_detail::check_dma_type<T>();
    const char* api = "DataCopyPad(GM->UB)";
    emu_detail::check_pad_params(api, p, sizeof(T));
    if (pad.leftPadding * sizeof(T) > 32 || pad.rightPadding * sizeof(T) > 32)
        emu_detail::fail(std::string(api) + ": leftPadding/rightPadding (" + std::to_string(pad.leftPadding) + "/" +
                         std::to_string(pad.rightPadding) + " elements) exceed 32 B (card §4, §8.12)");
    if (sizeof(T) == 8 && pad.isPad) {
        uint64_t v;
        std::memcpy(&v, &pad.paddingValue, 8);
        if (v != 0)
            emu_detail::fail(std::string(api) + ": 64-bit paddingValue must be 0 (card §4, §8.12)");
    }
    if (p.blockCount == 0 || p.blockLen == 0) return;
    const uint64_t lb = pad.leftPadding * sizeof(T), rb = pad.rightPadding * sizeof(T);
    const uint64_t row = ((lb + p.blockLen + rb + 31) / 32) * 32;
    const uint64_t pitch = row + p.dstStride * 32ull;
    const uint64_t dext = (p.blockCount - 1ull) * pitch + row;
    const uint64_t sext = (p.blockCount - 1ull) * (p.blockLen + static_cast<uint64_t>(p.srcStride)) + p.blockLen;
    emu_detail::check_ub(api, "dst", dst, (dext + sizeof(T) - 1) / sizeof(T));
    emu_detail::check_gm(api, "src", src, 0);
    emu_detail::check_gm_bytes(api, "src", src.GetSize(), sizeof(T), sext);
    const uint8_t* s = reinterpret_cast<const uint8_t*>(src.GetPhyAddr());
    {
        avsg_emu::hz::Instr hi(avsg_emu::kHzMte2, "DataCopyPad");
        for (uint32_t i = 0; i < p.blockCount; ++i)
            hi.rd_gm(s + i * (p.blockLen + static_cast<uint64_t>(p.srcStride)), p.blockLen);
        for (uint32_t i = 0; i < p.blockCount; ++i) hi.wr_ub(dst.GetPhyAddr() + i * pitch, row);
    }
    for (uint32_t i = 0; i < p.blockCount; ++i) {
        uint8_t* d = dst.bytes() + i * pitch;
        avsg_emu::detail::poison(d, row);
        std::memcpy(d + lb, s + i * (p.blockLen + static_cast<uint64_t>(p.srcStride)), p.blockLen);
        if (pad.isPad) {
            for (uint32_t k = 0; k < pad.leftPadding; ++k) std::memcpy(d + k * sizeof(T), &pad.paddingValue, sizeof(T));
            for (uint32_t k = 0; k < pad.rightPadding; ++k)
                std::memcpy(d + lb + p.blockLen + k * sizeof(T), &pad.paddingValue, sizeof(T));
        }
    }
    emu_detail::count_mte(true, static_cast<uint64_t>(p.blockLen) * p.blockCount);
}

// UB->GM (MTE3): writes exactly blockLen bytes per block; UB rows are 32 B-padded, srcStride in
// 32 B blocks, dstStride in bytes; GM alignment 1 B (card §4).
template <class T>
__aicore__ inline void DataCopyPad(const GlobalTensor<T>& dst, const LocalTensor<T>& src, const DataCopyExtParams& p) {
    emu_detail::check_dma_type<T>();
    const char* api = "DataCopyPad(UB->GM)";
    emu_detail::check_pad_params(api, p, sizeof(T));
    if (p.blockCount == 0 || p.blockLen == 0) return;
    const uint64_t row = ((p.blockLen + 31ull) / 32) * 32;
    const uint64_t pitch = row + p.srcStride * 32ull;
    // the SDK's own extent check counts the last block padded to 32 B as well
    // (impl/basic_api/utils/kernel_check_data_copy_overflow.h, UB->GM): so must the UB source
    const uint64_t sext = (p.blockCount - 1ull) * pitch + row;
    const uint64_t dext = (p.blockCount - 1ull) * (p.blockLen + static_cast<uint64_t>(p.dstStride)) + p.blockLen;
    emu_detail::check_ub(api, "src", src, (sext + sizeof(T) - 1) / sizeof(T));
    emu_detail::check_gm(api, "dst", dst, 0);
    emu_detail::check_gm_bytes(api, "dst", dst.GetSize(), sizeof(T), dext);
    uint8_t* d = reinterpret_cast<uint8_t*>(dst.GetPhyAddr(0));
    {
        avsg_emu::hz::Instr hi(avsg_emu::kHzMte3, "DataCopyPad");
        hi.set_atomic(emu_detail::atomic_on());
        for (uint32_t i = 0; i < p.blockCount; ++i) hi.rd_ub(src.GetPhyAddr() + i * pitch, p.blockLen);
        for (uint32_t i = 0; i < p.blockCount; ++i)
            hi.wr_gm(d + i * (p.blockLen + static_cast<uint64_t>(p.dstStride)), p.blockLen);
    }
    for (uint32_t i = 0; i < p.blockCount; ++i)
        emu_detail::gm_write(d + i * (p.blockLen + static_cast<uint64_t>(p.dstStride)), src.bytes() + i * pitch, p.blockLen);
    emu_detail::count_mte(false, static_cast<uint64_t>(p.blockLen) * p.blockCount);
}

}  // inline namespace AVSG_EMU_VARIANT
}  // namespace AscendC
