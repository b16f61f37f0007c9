// emu_pipe.h: TPipe, TQueBind / TQue, TBuf (card §3).
// Buffers are carved linearly from avsg_emu::tpipe_base() (32 B by default, never assumed to be
// 0: see emu_core.h) of the block's UB arena, at most 184 KB (card §0). Freshly allocated memory is poisoned with 0xA5 bytes (card §9).
#pragma once
#include "emu_tensor.h"

namespace AscendC {
inline namespace AVSG_EMU_VARIANT {

class TPipe;

namespace emu_detail {
// State shared by every queue kind: its buffers in UB.
struct QueState {
    TPipe* pipe = nullptr;
    uint32_t base = 0;  // UB offset of buffer 0
    uint32_t len = 0;   // bytes per buffer (rounded up to 32)
    uint8_t num = 0;
    uint32_t pipe_generation = 0;
};
}  // namespace emu_detail

template <TPosition src, TPosition dst, int32_t depth, auto mask = 0>
class TQueBind;
template <TPosition pos = TPosition::VECCALC>
class TBuf;

// ---------------------------------------------------------------------------
// TPipe. Only one may be live per block (card §3). Limits: 184 KB, 64 buffers,
// 8 queue buffers per TPosition.
// ---------------------------------------------------------------------------
class TPipe {
public:
    __aicore__ inline TPipe() {
        auto& c = avsg_emu::ctx("TPipe::TPipe");
        if (c.live_pipe)
            avsg_emu::fail("TPipe: a second TPipe was created while another is live in this block "
                           "(card §3: only one TPipe may exist at a time; call Destroy() first)");
        c.live_pipe = this;
        block_ = &c;
        base_ = avsg_emu::tpipe_base();
    }
    __aicore__ inline ~TPipe() { release(); }
    TPipe(const TPipe&) = delete;
    TPipe& operator=(const TPipe&) = delete;

    template <TPosition s, TPosition d, int32_t depth, auto mask>
    __aicore__ inline bool InitBuffer(TQueBind<s, d, depth, mask>& que, uint8_t num, uint32_t len) {
        constexpr TPosition qpos = (s == TPosition::GM) ? d : s;
        check_live("TPipe::InitBuffer");
        if (num < 1)
            avsg_emu::fail("TPipe::InitBuffer(TQue): num must be >= 1 (card §3)");
        unsigned p = static_cast<unsigned>(qpos);
        if (que_bufs_[p] + num > 8)
            avsg_emu::fail("TPipe::InitBuffer(TQue): more than 8 queue buffers at one TPosition (" +
                           std::to_string(que_bufs_[p] + num) + ") (card §3: at most 8 TQue buffers per position)");
        uint32_t off = carve("TPipe::InitBuffer(TQue)", num, len);
        que_bufs_[p] += num;
        que.emu_init(this, off, round32(len), num, generation_);
        return true;
    }
    template <TPosition pos>
    __aicore__ inline bool InitBuffer(TBuf<pos>& buf, uint32_t len) {
        check_live("TPipe::InitBuffer");
        uint32_t off = carve("TPipe::InitBuffer(TBuf)", 1, len);
        buf.emu_init(this, off, round32(len), generation_);
        return true;
    }
    // Back to the initial state: buffers may be re-initialised (card §3).
    __aicore__ inline void Reset() {
        check_live("TPipe::Reset");
        used_ = 0;
        nbufs_ = 0;
        std::memset(que_bufs_, 0, sizeof(que_bufs_));
        std::memset(reserved_, 0, sizeof(reserved_));
        ++generation_;
    }
    // Releases everything so another TPipe can be created (card §3).
    __aicore__ inline void Destroy() {
        Reset();
        release();
    }
    // Borrows an id without reserving it: the lowest id not reserved with AllocEventID.
    __aicore__ inline TEventID FetchEventID(HardEvent evt) {
        check_live("TPipe::FetchEventID");
        unsigned e = static_cast<unsigned>(evt);
        if (e >= 12) avsg_emu::fail("TPipe::FetchEventID: not an AIV HardEvent (card §6)");
        for (int id = 0; id < 8; ++id)
            if (!reserved_[e][id]) return static_cast<TEventID>(id);
        avsg_emu::fail(std::string("TPipe::FetchEventID: all 8 ids of HardEvent::") + HardEventName(evt) + " are reserved");
    }
    template <HardEvent evt>
    __aicore__ inline TEventID FetchEventID() { return FetchEventID(evt); }
    template <HardEvent evt>
    __aicore__ inline TEventID AllocEventID() {
        check_live("TPipe::AllocEventID");
        unsigned e = static_cast<unsigned>(evt);
        for (int id = 0; id < 8; ++id)
            if (!reserved_[e][id]) {
                reserved_[e][id] = true;
                return static_cast<TEventID>(id);
            }
        avsg_emu::fail(std::string("TPipe::AllocEventID: no free id for HardEvent::") + HardEventName(evt) +
                       " (card §6: ids 0..7)");
    }
    template <HardEvent evt>
    __aicore__ inline void ReleaseEventID(TEventID id) {
        check_live("TPipe::ReleaseEventID");
        unsigned e = static_cast<unsigned>(evt);
        if (id < 0 || id > 7 || !reserved_[e][id])
            avsg_emu::fail(std::string("TPipe::ReleaseEventID: id ") + std::to_string(id) + " of HardEvent::" +
                           HardEventName(evt) + " was not allocated");
        reserved_[e][id] = false;
    }

    // ---- emulation internals ----
    uint8_t* ub() const { return block_->ub; }
    uint32_t generation() const { return generation_; }
    bool live() const { return live_; }
    avsg_emu::BlockContext* block() const { return block_; }

private:
    static uint32_t round32(uint32_t len) { return (len + 31u) & ~31u; }
    void check_live(const char* api) const {
    if constexpr (!avsg_emu::kStrict) return;  // fast build: checks compiled out
        if (!live_) avsg_emu::fail(std::string(api) + ": TPipe was destroyed");
        if (avsg_emu::tls_block != block_)
            avsg_emu::fail(std::string(api) + ": TPipe used from another block");
    }
    uint32_t carve(const char* api, uint32_t num, uint32_t len) {
        if (nbufs_ + num > 64)
            avsg_emu::fail(std::string(api) + ": more than 64 buffers in one TPipe (card §3)");
        uint64_t bytes = static_cast<uint64_t>(round32(len)) * num;
        if (used_ + bytes > avsg_emu::kUbTPipeBytes)
            avsg_emu::fail(std::string(api) + ": UB budget exceeded: " + std::to_string(used_) + " B already used + " +
                           std::to_string(bytes) + " B requested > " + std::to_string(avsg_emu::kUbTPipeBytes) +
                           " B (card §0: TPipe may hand out 184 KB of the 192 KB UB)");
        uint32_t off = base_ + used_;
        used_ += static_cast<uint32_t>(bytes);
        nbufs_ += num;
        avsg_emu::detail::poison(block_->ub + off, bytes);
        return off;
    }
    void release() {
        if (live_ && block_ && block_->live_pipe == this) block_->live_pipe = nullptr;
        live_ = false;
    }
    avsg_emu::BlockContext* block_ = nullptr;
    bool live_ = true;
    uint32_t base_ = 0;  // UB offset of the first buffer
    uint32_t used_ = 0;
    uint32_t nbufs_ = 0;
    uint32_t que_bufs_[static_cast<unsigned>(TPosition::MAX) + 1] = {};
    bool reserved_[12][8] = {};
    uint32_t generation_ = 0;
};

// The active pipe of this block (card §3).
__aicore__ inline TPipe* GetTPipePtr() {
    auto& c = avsg_emu::ctx("GetTPipePtr");
    if (!c.live_pipe) avsg_emu::fail("GetTPipePtr: no live TPipe in this block");
    return static_cast<TPipe*>(c.live_pipe);
}

// ---------------------------------------------------------------------------
// TQueBind<src, dst, depth>. Buffers are handed out round-robin. The syncs the
// real queue inserts (card §3 table) are counted in Counters::queue_syncs.
// ---------------------------------------------------------------------------
template <TPosition src, TPosition dst, int32_t depth, auto mask>
class TQueBind {
    static_assert(depth >= 0, "TQue: depth must be >= 0");

public:
    TQueBind() = default;

    template <class T>
    __aicore__ inline LocalTensor<T> AllocTensor() {
        check("TQue::AllocTensor");
        uint8_t b = next_;
        if (state_[b] != kFree)
            avsg_emu::fail("TQue::AllocTensor: buffer " + std::to_string(b) + " of " + std::to_string(st_.num) +
                           " is still in use (FreeTensor it first; on the NPU this waits forever)");
        state_[b] = kAllocated;
        next_ = static_cast<uint8_t>((next_ + 1) % st_.num);
        uint8_t* p = st_.pipe->ub() + st_.base + b * st_.len;
        avsg_emu::detail::poison(p, st_.len);  // AllocTensor contents are undefined (card §3)
        if constexpr (avsg_emu::kStrict) avsg_emu::tls_block->counters.queue_syncs++;  // wait for the previous user's Free event
        if (kProd >= 0) avsg_emu::hz::queue_wait(freeEvt_[b], kProd);
        return LocalTensor<T>::make(st_.pipe->ub(), st_.base + b * st_.len, st_.len, pos());
    }
    template <class T>
    __aicore__ inline bool EnQue(const LocalTensor<T>& t) {
        check("TQue::EnQue");
        int b = owner("TQue::EnQue", t);
        if (state_[b] != kAllocated)
            avsg_emu::fail("TQue::EnQue: tensor was not allocated from this queue or is already enqueued");
        uint32_t cap = depth == 0 ? st_.num : static_cast<uint32_t>(depth);
        if (count_ >= cap) return false;  // real API: false when the queue is full (card §3)
        state_[b] = kQueued;
        fifo_[(head_ + count_) % 8] = static_cast<uint8_t>(b);
        ++count_;
        if constexpr (avsg_emu::kStrict) avsg_emu::tls_block->counters.queue_syncs++;
        if (kProd >= 0) avsg_emu::hz::queue_set(enqEvt_[b], kProd);
        return true;
    }
    template <class T>
    __aicore__ inline LocalTensor<T> DeQue() {
        check("TQue::DeQue");
        if (count_ == 0)
            avsg_emu::fail("TQue::DeQue: queue is empty (on the NPU this waits forever)");
        uint8_t b = fifo_[head_];
        head_ = static_cast<uint8_t>((head_ + 1) % 8);
        --count_;
        state_[b] = kDequeued;
        if (kCons >= 0) avsg_emu::hz::queue_wait(enqEvt_[b], kCons);
        return LocalTensor<T>::make(st_.pipe->ub(), st_.base + b * st_.len, st_.len, pos());
    }
    template <class T>
    __aicore__ inline void FreeTensor(LocalTensor<T>& t) {
        check("TQue::FreeTensor");
        int b = owner("TQue::FreeTensor", t);
        if (state_[b] == kFree) avsg_emu::fail("TQue::FreeTensor: buffer freed twice");
        if (state_[b] == kQueued) avsg_emu::fail("TQue::FreeTensor: buffer is still enqueued (DeQue it first)");
        state_[b] = kFree;
        if (kCons >= 0) avsg_emu::hz::queue_set(freeEvt_[b], kCons);
    }
    __aicore__ inline bool VacantInQue() { return count_ < (depth == 0 ? st_.num : static_cast<uint32_t>(depth)); }
    __aicore__ inline bool HasTensorInQue() { return count_ > 0; }
    __aicore__ inline int32_t GetTensorCountInQue() { return static_cast<int32_t>(count_); }
    __aicore__ inline bool HasIdleBuffer() {
        for (uint8_t i = 0; i < st_.num; ++i)
            if (state_[i] == kFree) return true;
        return false;
    }
    __aicore__ inline void FreeAllEvent() {}

    // ---- emulation internals ----
    void emu_init(TPipe* p, uint32_t off, uint32_t len, uint8_t num, uint32_t gen) {
        st_.pipe = p;
        st_.base = off;
        st_.len = len;
        st_.num = num;
        st_.pipe_generation = gen;
        std::memset(state_, 0, sizeof(state_));
        for (auto& e : enqEvt_) e = avsg_emu::hz::QueueEvent();
        for (auto& e : freeEvt_) e = avsg_emu::hz::QueueEvent();
        next_ = head_ = 0;
        count_ = 0;
    }

private:
    enum : uint8_t { kFree = 0, kAllocated, kQueued, kDequeued };
    static constexpr TPosition pos() { return src == TPosition::GM ? dst : src; }
    void check(const char* api) const {
    if constexpr (!avsg_emu::kStrict) return;  // fast build: checks compiled out
        if (!st_.pipe) avsg_emu::fail(std::string(api) + ": queue was not initialised with TPipe::InitBuffer");
        if (!st_.pipe->live() || st_.pipe->generation() != st_.pipe_generation)
            avsg_emu::fail(std::string(api) + ": the queue's TPipe was reset or destroyed");
    }
    template <class T>
    int owner(const char* api, const LocalTensor<T>& t) const {
        if (t.bound() && t.GetPhyAddr() >= st_.base) {
            uint64_t rel = t.GetPhyAddr() - st_.base;
            if (rel % st_.len == 0 && rel / st_.len < st_.num) return static_cast<int>(rel / st_.len);
        }
        avsg_emu::fail(std::string(api) + ": tensor does not belong to this queue");
    }
    // Implicit syncs (card §3): EnQue->DeQue orders kProd before kCons; FreeTensor->AllocTensor of
    // the same buffer orders kCons before kProd. -1: this queue kind inserts none.
    static constexpr int kProd = src == TPosition::GM ? avsg_emu::kHzMte2
                               : dst == TPosition::GM ? avsg_emu::kHzV
                               : (src == TPosition::VECIN && dst == TPosition::VECOUT) ? avsg_emu::kHzMte2 : -1;
    static constexpr int kCons = src == TPosition::GM ? avsg_emu::kHzV
                               : dst == TPosition::GM ? avsg_emu::kHzMte3
                               : (src == TPosition::VECIN && dst == TPosition::VECOUT) ? avsg_emu::kHzMte3 : -1;
    avsg_emu::hz::QueueEvent enqEvt_[8], freeEvt_[8];
    emu_detail::QueState st_;
    uint8_t state_[256] = {};
    uint8_t fifo_[8] = {};
    uint8_t next_ = 0, head_ = 0;
    uint32_t count_ = 0;
};

template <TPosition pos, int32_t depth, auto mask = 0>
class TQue : public TQueBind<(pos == TPosition::VECIN ? TPosition::GM : pos),
                             (pos == TPosition::VECOUT ? TPosition::GM : pos), depth, mask> {
    static_assert(pos == TPosition::VECIN || pos == TPosition::VECOUT,
                  "TQue: only TPosition::VECIN / VECOUT queues exist on an AIV core (card §3)");
};

// ---------------------------------------------------------------------------
// TBuf<pos>: scratch memory, no automatic sync (card §3).
// ---------------------------------------------------------------------------
template <TPosition pos>
class TBuf {
    static_assert(pos == TPosition::VECIN || pos == TPosition::VECOUT || pos == TPosition::VECCALC,
                  "TBuf: only UB positions (VECIN/VECOUT/VECCALC) on an AIV core (card §2)");

public:
    TBuf() = default;
    template <class T>
    __aicore__ inline LocalTensor<T> Get() {
        check("TBuf::Get");
        return LocalTensor<T>::make(pipe_->ub(), base_, len_ / sizeof(T) * sizeof(T), pos);
    }
    // The first `len` elements (card §3).
    template <class T>
    __aicore__ inline LocalTensor<T> Get(uint32_t len) {
        check("TBuf::Get");
        uint64_t bytes = static_cast<uint64_t>(len) * sizeof(T);
        if (bytes > len_)
            avsg_emu::fail("TBuf::Get(len): " + std::to_string(len) + " elements (" + std::to_string(bytes) +
                           " B) exceed the buffer (" + std::to_string(len_) + " B) (tensor size overflow)");
        return LocalTensor<T>::make(pipe_->ub(), base_, static_cast<uint32_t>(bytes), pos);
    }
    template <class T>
    __aicore__ inline LocalTensor<T> GetWithOffset(uint32_t size, uint32_t bufOffset) {
        check("TBuf::GetWithOffset");
        if (bufOffset % 32 != 0)
            avsg_emu::fail("TBuf::GetWithOffset: byte offset " + std::to_string(bufOffset) + " is not 32 B aligned (card §3)");
        uint64_t bytes = static_cast<uint64_t>(size) * sizeof(T);
        if (bufOffset + bytes > len_)
            avsg_emu::fail("TBuf::GetWithOffset: offset " + std::to_string(bufOffset) + " + " + std::to_string(bytes) +
                           " B exceed the buffer (" + std::to_string(len_) + " B) (tensor size overflow)");
        return LocalTensor<T>::make(pipe_->ub(), base_ + bufOffset, static_cast<uint32_t>(bytes), pos);
    }

    void emu_init(TPipe* p, uint32_t off, uint32_t len, uint32_t gen) {
        pipe_ = p;
        base_ = off;
        len_ = len;
        gen_ = gen;
    }

private:
    void check(const char* api) const {
    if constexpr (!avsg_emu::kStrict) return;  // fast build: checks compiled out
        if (!pipe_) avsg_emu::fail(std::string(api) + ": TBuf was not initialised with TPipe::InitBuffer");
        if (!pipe_->live() || pipe_->generation() != gen_)
            avsg_emu::fail(std::string(api) + ": the TBuf's TPipe was reset or destroyed");
    }
    TPipe* pipe_ = nullptr;
    uint32_t base_ = 0, len_ = 0, gen_ = 0;
};

}  // inline namespace AVSG_EMU_VARIANT
}  // namespace AscendC
