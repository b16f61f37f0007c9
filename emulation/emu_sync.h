// emu_sync.h: core identity, intra-core sync (PipeBarrier, SetFlag/WaitFlag, TQueSync),
// cross-core SyncAll, DataCacheCleanAndInvalid, DMA atomics (card §1, §6).
// Execution is eager and in program order, so syncs have no effect on results here;
// they are checked (ids, matching), counted, and fed to the pipe-hazard scoreboard (emu_hazard.h).
#pragma once
#include "emu_tensor.h"

namespace AscendC {
inline namespace AVSG_EMU_VARIANT {

// Block index in [0, numBlocks) and numBlocks (card §1).
__aicore__ inline int64_t GetBlockIdx() { return avsg_emu::ctx("GetBlockIdx").idx; }
__aicore__ inline int64_t GetBlockNum() { return avsg_emu::ctx("GetBlockNum").num; }

// Orders instructions within one pipe. Not PIPE_S: scalar order is automatic (card §6).
template <pipe_t pipe>
__aicore__ inline void PipeBarrier() {
    static_assert(pipe == PIPE_V || pipe == PIPE_MTE2 || pipe == PIPE_MTE3 || pipe == PIPE_ALL,
                  "PipeBarrier: pipe must be PIPE_V, PIPE_MTE2, PIPE_MTE3 or PIPE_ALL on an AIV core (card §6)");
    if constexpr (avsg_emu::kStrict) avsg_emu::ctx("PipeBarrier").counters.pipe_barriers++;
    if constexpr (pipe == PIPE_ALL) avsg_emu::hz::all();
    else avsg_emu::hz::barrier(pipe == PIPE_V ? avsg_emu::kHzV : pipe == PIPE_MTE2 ? avsg_emu::kHzMte2 : avsg_emu::kHzMte3);
}

// Restores the full vector mask (include/basic_api/kernel_common.h; see BlockContext::
// vector_mask_hi). A scalar write of the mask register: no pipe, no counted cost.
__aicore__ inline void ResetMask() {
    if constexpr (avsg_emu::kStrict) {
        avsg_emu::BlockContext& c = avsg_emu::ctx("ResetMask");
        c.vector_mask_hi = c.vector_mask_lo = ~0ull;
        c.vector_mask_by = nullptr;
    }
}

namespace emu_detail {
inline void check_event_id(const char* api, HardEvent e, int32_t id) {
    if constexpr (!avsg_emu::kStrict) return;  // fast build: checks compiled out
    if (id < 0 || id > 7)
        avsg_emu::fail(std::string(api) + "<HardEvent::" + HardEventName(e) + ">: event id " + std::to_string(id) +
                       " outside 0..7 (card §6)");
}
}  // namespace emu_detail

// Cross-pipe ordering. Set and Wait must match exactly; two Sets of the same (event, id)
// without a Wait in between are an error, as is a Wait with no pending Set (a hang on the NPU).
template <HardEvent event>
__aicore__ inline void SetFlag(int32_t eventID) {
    static_assert(static_cast<unsigned>(event) < 12, "SetFlag: not an AIV HardEvent (card §6)");
    if constexpr (!avsg_emu::kStrict) return;  // fast build: execution is in order, nothing to check
    auto& c = avsg_emu::ctx("SetFlag");
    emu_detail::check_event_id("SetFlag", event, eventID);
    bool& f = c.flag_set[static_cast<unsigned>(event)][eventID];
    if (f)
        avsg_emu::fail(std::string("SetFlag<HardEvent::") + HardEventName(event) + ">(" + std::to_string(eventID) +
                       "): set twice without a WaitFlag in between (card §6: undefined, later PIPE_ALL barrier hangs)");
    f = true;
    c.counters.set_flags++;
    avsg_emu::hz::set_flag(static_cast<int>(event), eventID);
}
template <HardEvent event>
__aicore__ inline void WaitFlag(int32_t eventID) {
    static_assert(static_cast<unsigned>(event) < 12, "WaitFlag: not an AIV HardEvent (card §6)");
    if constexpr (!avsg_emu::kStrict) return;  // fast build: execution is in order, nothing to check
    auto& c = avsg_emu::ctx("WaitFlag");
    emu_detail::check_event_id("WaitFlag", event, eventID);
    bool& f = c.flag_set[static_cast<unsigned>(event)][eventID];
    if (!f)
        avsg_emu::fail(std::string("WaitFlag<HardEvent::") + HardEventName(event) + ">(" + std::to_string(eventID) +
                       "): no matching SetFlag is pending (card §6: Set and Wait must match; the NPU would hang)");
    f = false;
    c.counters.wait_flags++;
    avsg_emu::hz::wait_flag(static_cast<int>(event), eventID);
}

namespace emu_detail {
template <pipe_t s, pipe_t d>
constexpr int pipes_to_event() {
    if (s == PIPE_MTE2 && d == PIPE_V) return 0;
    if (s == PIPE_V && d == PIPE_MTE3) return 1;
    if (s == PIPE_MTE3 && d == PIPE_MTE2) return 2;
    if (s == PIPE_MTE2 && d == PIPE_MTE3) return 3;
    if (s == PIPE_S && d == PIPE_V) return 4;
    if (s == PIPE_V && d == PIPE_S) return 5;
    if (s == PIPE_MTE2 && d == PIPE_S) return 6;
    if (s == PIPE_S && d == PIPE_MTE3) return 7;
    if (s == PIPE_V && d == PIPE_MTE2) return 8;
    if (s == PIPE_MTE3 && d == PIPE_V) return 9;
    if (s == PIPE_S && d == PIPE_MTE2) return 10;
    if (s == PIPE_MTE3 && d == PIPE_S) return 11;
    return -1;
}
}  // namespace emu_detail

// TQueSync<src, dst>: the portable spelling of SetFlag/WaitFlag (card §6).
template <pipe_t src, pipe_t dst>
class TQueSync {
    static constexpr int kEvt = emu_detail::pipes_to_event<src, dst>();
    static_assert(kEvt >= 0, "TQueSync: no AIV HardEvent for this pipe pair (card §6)");

public:
    __aicore__ inline void SetFlag(TEventID id) { AscendC::SetFlag<static_cast<HardEvent>(kEvt)>(id); }
    __aicore__ inline void WaitFlag(TEventID id) { AscendC::WaitFlag<static_cast<HardEvent>(kEvt)>(id); }
};

namespace emu_detail {
// The barrier of both SyncAll forms. The fast build runs blocks one after another until the first
// SyncAll; it must come from block 0 (equal SyncAll counts, card §6), which then runs the other
// blocks as fibers up to the barrier (avsg_emu::launch_sequential, fiber_sync_all).
inline void sync_all_wait(avsg_emu::BlockContext& c) {
    if constexpr (!avsg_emu::kStrict) avsg_emu::fiber_sync_all(c);
    else c.launch->barrier.arrive_and_wait(c.idx);
}
}  // namespace emu_detail

// Hard cross-core barrier over all launched blocks (card §6). Needs KERNEL_TYPE_MIX_AIV_1_0
// on the NPU (not checkable here: KERNEL_TASK_TYPE_DEFAULT expands to nothing).
template <bool isAIVOnly = true>
__aicore__ inline void SyncAll() {
    auto& c = avsg_emu::ctx("SyncAll");
    if constexpr (avsg_emu::kStrict) {
        c.counters.pipe_barriers++;  // both forms start with PipeBarrier<PIPE_ALL> (card §6)
        c.counters.sync_alls++;
    }
    avsg_emu::hz::all();
    emu_detail::sync_all_wait(c);
}

// Soft form (card §6): gmWs >= numBlocks*32 B, zeroed before the first call of a launch;
// ubWs >= numBlocks*32 B. Emulated with the same barrier; the per-block counter in gmWs is
// checked and advanced as the real implementation does, so a non-zeroed workspace is caught;
// ubWs is poisoned after the call (strict build).
template <bool isAIVOnly = true>
__aicore__ inline void SyncAll(const GlobalTensor<int32_t>& gmWorkspace, const LocalTensor<int32_t>& ubWorkspace,
                               const int32_t usedCores = 0) {
    auto& c = avsg_emu::ctx("SyncAll");
    uint32_t n = usedCores ? static_cast<uint32_t>(usedCores) : c.num;
    if (avsg_emu::kStrict && (usedCores < 0 || n > c.num))
        avsg_emu::fail("SyncAll(soft): usedCores=" + std::to_string(usedCores) + " outside 0..numBlocks (card §6)");
    if (n != c.num)
        avsg_emu::fail("SyncAll(soft): usedCores < numBlocks is not emulated");
    avsg_emu::detail::check_gm("SyncAll(soft)", "gmWorkspace", gmWorkspace, static_cast<uint64_t>(c.num) * 8);
    avsg_emu::detail::check_ub("SyncAll(soft)", "ubWorkspace", ubWorkspace, static_cast<uint64_t>(c.num) * 8);
    int32_t* slot = const_cast<int32_t*>(gmWorkspace.GetPhyAddr()) + c.idx * 8;
    if (avsg_emu::kStrict && *slot != static_cast<int32_t>(c.sync_all_calls))
        avsg_emu::fail("SyncAll(soft): workspace counter of block " + std::to_string(c.idx) + " is " + std::to_string(*slot) +
                       ", expected " + std::to_string(c.sync_all_calls) +
                       " (card §6: the GM workspace must be zeroed before every launch)");
    ++c.sync_all_calls;
    *slot = static_cast<int32_t>(c.sync_all_calls);
    if constexpr (avsg_emu::kStrict) {
        c.counters.pipe_barriers++;
        c.counters.sync_alls++;
    }
    avsg_emu::hz::all();
    emu_detail::sync_all_wait(c);
    // The library stages its counters through ubWs (DMA in and out, scalar compares): what it
    // leaves there is its own, so a kernel must not read ubWs after the call without writing it.
    avsg_emu::detail::poison(ubWorkspace.bytes(), static_cast<size_t>(c.num) * 32);
}

// The DCache is not modelled (GM accesses are direct); the call is checked and counted. It has no
// effect on the hazard scoreboard (a missing DCCI is not reported).
template <class T, CacheLine entireType, DcciDst dcciDst>
__aicore__ inline void DataCacheCleanAndInvalid(const GlobalTensor<T>& dstTensor) {
    static_assert(dcciDst != DcciDst::CACHELINE_ATOMIC, "DataCacheCleanAndInvalid: CACHELINE_ATOMIC is not supported on A2 (card §6)");
    (void)dstTensor;
    if constexpr (avsg_emu::kStrict) avsg_emu::ctx("DataCacheCleanAndInvalid").counters.dcci++;
}

// DMA atomics (card §6): later UB->GM copies accumulate into GM with the given type.
namespace emu_detail {
template <class T>
void atomic_accumulate(uint8_t* dst, const uint8_t* src, size_t bytes) {
    std::lock_guard<std::mutex> lk(avsg_emu::atomic_mutex());
    for (size_t i = 0; i + sizeof(T) <= bytes; i += sizeof(T)) {
        T a, b;
        std::memcpy(&a, dst + i, sizeof(T));
        std::memcpy(&b, src + i, sizeof(T));
        T r;
        if constexpr (std::is_integral<T>::value)
            r = static_cast<T>(static_cast<std::make_unsigned_t<T>>(a) + static_cast<std::make_unsigned_t<T>>(b));
        else
            r = T(static_cast<float>(a) + static_cast<float>(b));
        std::memcpy(dst + i, &r, sizeof(T));
    }
}
}  // namespace emu_detail

template <class T>
__aicore__ inline void SetAtomicAdd() {
    static_assert(avsg_emu::detail::is_one_of_v<T, int8_t, int16_t, half, bfloat16_t, int32_t, float>,
                  "SetAtomicAdd: T must be int8/int16/half/bf16/int32/float on A2 (card §6)");
    avsg_emu::ctx("SetAtomicAdd").atomic_add = &emu_detail::atomic_accumulate<T>;
}
__aicore__ inline void DisableDmaAtomic() { avsg_emu::ctx("DisableDmaAtomic").atomic_add = nullptr; }
__aicore__ inline void SetAtomicNone() { DisableDmaAtomic(); }

}  // inline namespace AVSG_EMU_VARIANT
}  // namespace AscendC
