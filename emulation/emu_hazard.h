// emu_hazard.h: the pipe-hazard scoreboard (card §0 "Pipes", §3 queue syncs, §6, §8.8-9, §9
// "Pipe hazards"). The emulation executes eagerly and in program order; this scoreboard checks
// that the program would also be correct on the NPU, where PIPE_S, PIPE_V, PIPE_MTE2 and
// PIPE_MTE3 run concurrently and a vector instruction may still be running when the next one
// is issued. A missing sync raises AscendC::EmuError naming both APIs, both pipes, the UB/GM
// byte range and the sync that was missing.
//
// Model (what the hardware guarantees, and nothing more):
//  * Every API call is one instruction on one pipe and gets that pipe's next epoch (1, 2, ...).
//    Scalar GetValue/SetValue on a LocalTensor or GlobalTensor: PIPE_S. Vector APIs, including
//    UB->UB DataCopy (card §0 ⚠️): PIPE_V. GM->UB DataCopy/DataCopyPad: PIPE_MTE2 (reads GM,
//    writes UB). UB->GM: PIPE_MTE3 (reads UB, writes GM). An instruction's reads are checked
//    before its writes, so in-place operations (dst == src) are one access, not a hazard.
//  * Ordering is a vector clock: vc[B][A] = the last epoch of pipe A that is known to be complete
//    before pipe B's next instruction starts.
//      SetFlag<A_B>(id)  snapshots vc[A] with vc[A][A] = epoch[A]: it covers exactly the A
//                        instructions issued before the SetFlag (a SetFlag issued before the
//                        producer access does NOT cover it).
//      WaitFlag<A_B>(id) merges that snapshot into vc[B]. Chains are transitive
//                        (MTE2_V then V_MTE3 orders MTE2 before MTE3).
//      PipeBarrier<P>    (P = V/MTE2/MTE3) sets vc[P][P] = epoch[P]: orders within P only.
//      PipeBarrier<PIPE_ALL>, SyncAll (both forms start with PIPE_ALL, card §6): everything.
//      TQue/TQueBind     EnQue->DeQue and FreeTensor->AllocTensor(same buffer) act as the
//                        flag pair of card §3's table (VECIN: MTE2->V / V->MTE2, VECOUT: V->MTE3
//                        / MTE3->V, TQueBind<VECIN,VECOUT>: MTE2->MTE3 / MTE3->MTE2); they never
//                        order PIPE_S and never add a V->V barrier.
//      Scalar issue      all instructions are issued by the scalar unit in program order, so
//                        whatever PIPE_S has waited for (vc[S][*], not its own stores) is complete
//                        before any instruction issued later on any pipe: vc[P] absorbs vc[S][A]
//                        for A != S at each issue. PIPE_S itself is in order (S->S needs nothing).
//  * An access by pipe B to bytes last written (RAW, WAW) or read (WAR) by pipe A != B at epoch e
//    is legal iff vc[B][A] >= e. Same pipe: PIPE_S never conflicts with itself; PIPE_V needs a
//    PipeBarrier<PIPE_V> between two dependent instructions (RAW, WAR and WAW: issue order is not
//    completion order, card §6); PIPE_MTE2/MTE3 need PipeBarrier<PIPE_MTE2/MTE3> between copies
//    with overlapping destinations (card §4), except DMA-atomic (SetAtomicAdd) stores, which
//    accumulate.
//  * Granularity: UB and GM are tracked per 32 B granule with a byte mask per pipe, so disjoint
//    bytes in one granule (e.g. scalar element accesses, ragged DataCopyPad rows) do not
//    conflict. Within a granule, a pipe keeps the union of the bytes it accessed with the epoch
//    of its latest access (conservative: an old, already-synced access to other bytes of the same
//    granule can be reported with the newer epoch). A write removes older accesses of the bytes
//    it overwrote.
//  * GM is tracked per block (std::unordered_map keyed by 32 B granule): MTE3->MTE2 (store then
//    reload), MTE2->MTE3 (WAR), MTE3->MTE3 (overlapping stores), and S<->MTE2/MTE3 through
//    GlobalTensor::GetValue/SetValue, which are PIPE_S accesses through the DCache (card §2).
//  * API-specific notes: CreateVecIndex is modelled as its A2 implementation (scalar SetValue of
//    the first 32 B, an internal S_V flag, then PIPE_V Adds with internal PipeBarrier<PIPE_V>s but
//    none after the last one, card §5). GatherMask's rsvdCnt is read by the API from a special
//    register right after the instruction and is available to the scalar code at once (card §5):
//    no sync is needed for the count, but it does not make the UB data GatherMask wrote visible
//    to PIPE_S (that still needs V_S). The undefined part of GatherMask's dst (beyond rsvdCnt) is
//    counted as written. Gather reads exactly the gathered elements. Select modes 1/2 and other
//    API-internal temporaries (the reserved 8 KB) are not tracked. Sort/Extract/Reduce* are one
//    instruction each.
//
// Not modelled: cross-block GM ordering (SyncAll, soft-sync workspaces), the scalar DCache
// (DataCacheCleanAndInvalid has no effect here; a missing DCCI is not reported), --cce-auto-sync,
// the reserved UB used inside APIs, raw __ubuf__/__gm__ pointer accesses that bypass the tensor
// API, and the hardware's actual timing (a reported hazard may be benign on a given chip by luck).
#pragma once
#include "emu_core.h"

namespace avsg_emu {
inline namespace AVSG_EMU_VARIANT {
namespace hz {

inline const char* pipe_name(int p) {
    static const char* n[] = {"PIPE_S", "PIPE_V", "PIPE_MTE2", "PIPE_MTE3"};
    return n[p];
}
inline const char* pipe_short(int p) {
    static const char* n[] = {"S", "V", "MTE2", "MTE3"};
    return n[p];
}

// ---- API names: interned to a byte so granule records stay small --------------------------------
inline std::mutex& names_mutex() {
    static std::mutex m;
    return m;
}
inline std::vector<std::string>& names_locked() {
    static std::vector<std::string> v{"?"};
    return v;
}
inline uint8_t api_id(const char* api) {
    thread_local std::unordered_map<const void*, uint8_t> cache;
    auto it = cache.find(api);
    if (it != cache.end()) return it->second;
    std::lock_guard<std::mutex> lk(names_mutex());
    auto& v = names_locked();
    uint8_t id = 0;
    for (size_t i = 1; i < v.size(); ++i)
        if (v[i] == api) id = static_cast<uint8_t>(i);
    if (id == 0 && v.size() < 255) {
        v.emplace_back(api);
        id = static_cast<uint8_t>(v.size() - 1);
    }
    cache[api] = id;
    return id;
}
inline std::string api_name(uint8_t id) {
    std::lock_guard<std::mutex> lk(names_mutex());
    auto& v = names_locked();
    return id < v.size() ? v[id] : std::string("?");
}

inline Scoreboard* sb() {
    if constexpr (!kStrict) return nullptr;  // fast build: no scoreboard, every hz:: call folds away
    BlockContext* b = tls_block;
    return b ? b->hz.get() : nullptr;
}

// Pipe of each AIV HardEvent (producer, consumer), in HardEvent order (card §6).
inline int event_src(int e) {
    static const int s[12] = {kHzMte2, kHzV, kHzMte3, kHzMte2, kHzS, kHzV, kHzMte2, kHzS, kHzV, kHzMte3, kHzS, kHzMte3};
    return s[e];
}
inline int event_dst(int e) {
    static const int d[12] = {kHzV, kHzMte3, kHzMte2, kHzMte3, kHzV, kHzS, kHzS, kHzMte3, kHzMte2, kHzV, kHzMte2, kHzS};
    return d[e];
}

// ---- vector-clock operations -------------------------------------------------------------------
// Instructions issued by the scalar unit start after everything PIPE_S has waited for.
inline void inherit_scalar(Scoreboard& s, int p) {
    if (p == kHzS) return;
    for (int q = 0; q < kHzPipes; ++q)
        if (q != kHzS && s.vc[kHzS][q] > s.vc[p][q]) s.vc[p][q] = s.vc[kHzS][q];
}
// What a flag set on pipe a now covers.
inline void snapshot(Scoreboard& s, int a, uint32_t out[kHzPipes]) {
    inherit_scalar(s, a);
    for (int q = 0; q < kHzPipes; ++q) out[q] = s.vc[a][q];
    out[a] = s.epoch[a];
}
inline void merge(Scoreboard& s, int b, const uint32_t in[kHzPipes]) {
    for (int q = 0; q < kHzPipes; ++q)
        if (in[q] > s.vc[b][q]) s.vc[b][q] = in[q];
}
inline void pipe_barrier(Scoreboard& s, int p) { s.vc[p][p] = s.epoch[p]; }
inline void barrier_all(Scoreboard& s) {
    for (int p = 0; p < kHzPipes; ++p)
        for (int q = 0; q < kHzPipes; ++q) s.vc[p][q] = s.epoch[q];
}
inline void set_flag(int event, int id) {
    if (Scoreboard* s = sb()) snapshot(*s, event_src(event), s->flag_snap[event][id]);
}
inline void wait_flag(int event, int id) {
    if (Scoreboard* s = sb()) merge(*s, event_dst(event), s->flag_snap[event][id]);
}
inline void barrier(int p) {
    if (Scoreboard* s = sb()) pipe_barrier(*s, p);
}
inline void all() {
    if (Scoreboard* s = sb()) barrier_all(*s);
}
// Implicit queue events (card §3): a per-buffer snapshot taken on the producer pipe and merged
// into the consumer pipe. `valid` is false until the first Set.
struct QueueEvent {
    uint32_t snap[kHzPipes] = {};
    bool valid = false;
};
inline void queue_set(QueueEvent& ev, int producer) {
    if (Scoreboard* s = sb()) {
        snapshot(*s, producer, ev.snap);
        ev.valid = true;
    }
}
inline void queue_wait(QueueEvent& ev, int consumer) {
    if (Scoreboard* s = sb()) {
        if (ev.valid) merge(*s, consumer, ev.snap);
        ev.valid = false;
    }
}

// ---- accesses ----------------------------------------------------------------------------------
inline std::string hex(uint64_t v) {
    std::ostringstream o;
    o << "0x" << std::hex << v;
    return o.str();
}
inline std::string missing_sync(int a, int b) {
    if (a == b) return std::string("PipeBarrier<") + pipe_name(a) + ">";
    return std::string(pipe_short(a)) + "_" + pipe_short(b) + " flag";
}

[[noreturn]] inline void report(bool is_ub, uint64_t lo, uint64_t hi, int b, uint8_t bapi, bool bwrite, int a,
                                uint8_t aapi, bool awrite) {
    std::string kind = bwrite ? (awrite ? "write-after-write" : "write-after-read") : "read-after-write";
    fail(std::string("hazard: ") + api_name(bapi) + " (" + pipe_name(b) + ") " + (bwrite ? "writes " : "reads ") +
         (is_ub ? "UB [" : "GM [") + hex(lo) + "," + hex(hi) + ") " + (awrite ? "written" : "read") + " by " +
         api_name(aapi) + " (" + pipe_name(a) + ") with no " + missing_sync(a, b) +
         " or PIPE_ALL barrier in between (" + kind + "; card §6, §9)");
}

// Is an access by b at epoch e ordered after a's access at epoch ea?
inline bool ordered(const Scoreboard& s, int b, uint32_t e, int a, uint32_t ea, bool same_pipe_free) {
    if (a == b) {
        if (a == kHzS || ea == e || same_pipe_free) return true;
        return s.vc[b][b] >= ea;
    }
    return s.vc[b][a] >= ea;
}

inline HzRec& ub_rec(Scoreboard& s, uint64_t g) {
    if (g >= s.ub.size()) s.ub.resize(std::max<size_t>(g + 1, std::min<size_t>(s.ub.size() * 2 + 64, kUbPhysicalBytes / 32)));
    return s.ub[g];
}

// One instruction on pipe p: call rd()/wr() for its operands (reads first).
// DMAs in flight: called right after a GM->UB copy was issued. A copy stays in flight until
// some other pipe has waited for it (vc[B][MTE2] >= its epoch): a queue DeQue, a WaitFlag, a
// barrier over all pipes. The counters keep the most copies and bytes ever in flight at once.
inline void note_mte2_issue(uint64_t bytes) {
    Scoreboard* s = sb();
    if (!s) return;
    uint32_t covered = 0;
    for (int b = 0; b < kHzPipes; ++b)
        if (b != kHzMte2) covered = std::max(covered, s->vc[b][kHzMte2]);
    auto& q = s->mte2_pending;
    while (!q.empty() && q.front().first <= covered) q.pop_front();
    q.emplace_back(s->epoch[kHzMte2], bytes);
    uint64_t total = 0;
    for (const auto& e : q) total += e.second;
    Counters& c = tls_block->counters;
    c.mte2_inflight_max = std::max<uint64_t>(c.mte2_inflight_max, q.size());
    c.mte2_inflight_bytes_max = std::max(c.mte2_inflight_bytes_max, total);
}

class Instr {
public:
    Instr(int pipe, const char* api) : s_(sb()), p_(pipe) {
        if (!s_) return;
        inherit_scalar(*s_, p_);
        api_ = api_id(api);
        e_ = ++s_->epoch[p_];
    }
    bool on() const { return s_ != nullptr; }
    void rd_ub(uint64_t off, uint64_t len) { if (s_) access(true, off, len, false); }
    void wr_ub(uint64_t off, uint64_t len) { if (s_) access(true, off, len, true); }
    void rd_gm(const void* p, uint64_t len) { if (s_) access(false, reinterpret_cast<uintptr_t>(p), len, false); }
    void wr_gm(const void* p, uint64_t len) { if (s_) access(false, reinterpret_cast<uintptr_t>(p), len, true); }
    // DMA-atomic stores accumulate: overlapping atomic stores on MTE3 need no barrier.
    void set_atomic(bool a) { atomic_ = a; }
    // After the instruction: PipeBarrier on its own pipe (API-internal barriers).
    void barrier_after() { if (s_) pipe_barrier(*s_, p_); }

private:
    void access(bool is_ub, uint64_t addr, uint64_t len, bool write) {
        if (len == 0) return;
        Scoreboard& s = *s_;
        const uint64_t g0 = addr >> 5, g1 = (addr + len - 1) >> 5;
        for (uint64_t g = g0; g <= g1; ++g) {
            const uint32_t lo = g == g0 ? static_cast<uint32_t>(addr & 31) : 0u;
            const uint32_t hi = g == g1 ? static_cast<uint32_t>((addr + len - 1) & 31) : 31u;
            const uint32_t m = (hi == 31 ? 0xFFFFFFFFu : ((1u << (hi + 1)) - 1u)) & ~((1u << lo) - 1u);
            HzRec& r = is_ub ? ub_rec(s, g) : s.gm[g];
            for (int a = 0; a < kHzPipes; ++a) {
                if ((r.wmask[a] & m) &&
                    !ordered(s, p_, e_, a, r.wep[a], write && atomic_ && a == p_ && p_ == kHzMte3))
                    report_at(is_ub, g, r.wmask[a] & m, a, r.wapi[a], true, write);
                if (write && (r.rmask[a] & m) && !ordered(s, p_, e_, a, r.rep[a], false))
                    report_at(is_ub, g, r.rmask[a] & m, a, r.rapi[a], false, write);
            }
            if (write) {
                for (int a = 0; a < kHzPipes; ++a) {
                    r.wmask[a] &= ~m;
                    r.rmask[a] &= ~m;
                }
                r.wmask[p_] |= m;
                r.wep[p_] = e_;
                r.wapi[p_] = api_;
            } else {
                r.rmask[p_] |= m;
                r.rep[p_] = e_;
                r.rapi[p_] = api_;
            }
        }
    }
    [[noreturn]] void report_at(bool is_ub, uint64_t g, uint32_t bytes, int a, uint8_t aapi, bool awrite, bool bwrite) {
        uint32_t first = 0, last = 31;
        while (!((bytes >> first) & 1u)) ++first;
        while (!((bytes >> last) & 1u)) --last;
        report(is_ub, g * 32 + first, g * 32 + last + 1, p_, api_, bwrite, a, aapi, awrite);
    }
    Scoreboard* s_;
    int p_;
    uint8_t api_ = 0;
    uint32_t e_ = 0;
    bool atomic_ = false;
};

}  // namespace hz
}  // inline namespace AVSG_EMU_VARIANT
}  // namespace avsg_emu
