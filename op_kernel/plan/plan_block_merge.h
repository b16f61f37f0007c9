// plan_block_merge.h: sorted runs and their merge. SortAscending sorts up to nc keys with a
// payload on the vector unit (Sort32 + Extract); the runs go to the workspace, and a scalar k-way
// merge (PlanMerger: loser tree, or a scan for a few runs) streams them back in key order. The
// classify, stash and dual-pointer blocks build on it.
// UB: the sort region (sConcat_, sIdx_, sDst_, sTmp_, sOutV_, sOutI_), the merge heads (heads_)
// and loser trees (treeUb_); GM: the core's workspace slice.
#pragma once
#include "plan_block_probe.h"

namespace avsg_kernel {

// ---- scalar k-way merge over sorted runs in the workspace (run c at keyOff + c*nc). Each run
// streams through a head buffer of hlen entries (the merge's region of the head space, shared
// by its runs). The runs' heads meet in a loser tree (UB, one int per node), so a step costs
// O(log runs) scalar accesses, not O(runs) (a scan for a few runs). Ties go to the lower run. With `out`, the merge
// also writes one value per consumed entry in place of its key (Emit): a head block goes back
// to outOff + c*nc in the run's layout once it is consumed, so no staging is needed.
struct PlanMerger {
    uint32_t runs = 0, leaves = 1, keyOff = 0, payOff = 0, outOff = 0;
    uint32_t keyBase = 0, payBase = 0, space = 0, treeBase = 0, hlen = 8;
    bool pay = false, out = false;
    uint32_t len[avsg::kPlanMaxRuns];
    uint32_t pos[avsg::kPlanMaxRuns];
    uint32_t bpos[avsg::kPlanMaxRuns];
    uint32_t blen[avsg::kPlanMaxRuns];
    bool has = false;
    int32_t key = 0;                         // the current entry's key (its payload: PlanBlockMerge::Val)
    uint32_t best = 0;
};

class PlanBlockMerge {
public:
    __aicore__ inline explicit PlanBlockMerge(PlanContext& ctx) : ctx_(ctx) {}
    // Sort `m` int32 keys (UB, in [-1, 2^24]: exact in float) ascending with a uint32 payload (or
    // lane ids when payload is null): Cast->float, negate (Sort is descending), Sort + Extract,
    // negate, Cast.
    // Result: sOutV_ (as int32) keys, sOutI_ payload; m <= nc.
    __aicore__ inline void SortAscending(const LocalTensor<int32_t>& keys, uint32_t m,
                                         const LocalTensor<uint32_t>* payload) {
        const uint32_t n32 = (m + 31) / 32 * 32;
        Duplicate(ctx_.sConcat_, 1073741824.0f, n32);   // sentinel 2^30, sorts last once negated
        PipeBarrier<PIPE_V>();
        Cast(ctx_.sConcat_, keys, RoundMode::CAST_RINT, m);
        PipeBarrier<PIPE_V>();
        Muls(ctx_.sConcat_, ctx_.sConcat_, -1.0f, n32);
        if (payload == nullptr) CreateVecIndex(ctx_.sIdx_.template ReinterpretCast<int32_t>(), 0, n32);
        PipeBarrier<PIPE_V>();
        LocalTensor<uint32_t> idx = payload == nullptr ? ctx_.sIdx_ : *payload;
        // Sort32 on A2: scores and index 128 B aligned, pairs 256 B aligned (Init cuts them so).
        ascendc_assert(avsg::UbAddr(ctx_.sConcat_) % 128 == 0 && avsg::UbAddr(idx) % 128 == 0 &&
                       avsg::UbAddr(ctx_.sDst_) % 256 == 0);
        Sort<float, true>(ctx_.sDst_, ctx_.sConcat_, idx, ctx_.sTmp_, static_cast<int32_t>(n32 / 32));
        PipeBarrier<PIPE_V>();
        Extract(ctx_.sOutV_, ctx_.sOutI_, ctx_.sDst_, static_cast<int32_t>(n32 / 32));
        PipeBarrier<PIPE_V>();
        Muls(ctx_.sOutV_, ctx_.sOutV_, -1.0f, n32);
        PipeBarrier<PIPE_V>();
        Cast(ctx_.sOutV_.template ReinterpretCast<int32_t>(), ctx_.sOutV_, RoundMode::CAST_RINT, n32);
        PipeBarrier<PIPE_V>();
    }

    // Head space regions (int32 offsets, 32 B aligned): one merge's keys, another's keys and payload.
    __aicore__ inline uint32_t Region(uint32_t i) const {
        return i * (2 * avsg::kPlanMaxRuns * avsg::kPlanHeadLen / avsg::kPlanMergeRegions / 8 * 8);
    }
    // A merge alone (no payload, no second merge at the same time) may take the whole head space:
    // fewer refills and write-backs.
    __aicore__ inline void Configure(PlanMerger& g, uint32_t runs, uint32_t keyOff, uint32_t payOff, bool out,
                                     uint32_t keyRegion, uint32_t payRegion, uint32_t tree, bool alone = false) {
        g.space = alone ? 2 * avsg::kPlanMaxRuns * avsg::kPlanHeadLen : Region(1);
        g.runs = runs;
        g.keyOff = keyOff;
        g.payOff = payOff;
        g.outOff = keyOff;
        g.pay = payRegion != keyRegion;
        g.out = out;
        g.keyBase = Region(keyRegion);
        g.payBase = Region(payRegion);
        g.treeBase = tree * avsg::kPlanMaxRuns;
    }
    __aicore__ inline bool Live(const PlanMerger& g, uint32_t c) const { return c < g.runs && g.pos[c] < g.len[c]; }
    __aicore__ inline int32_t HeadKey(const PlanMerger& g, uint32_t c) {
        return ctx_.heads_.GetValue(g.keyBase + c * g.hlen + g.bpos[c]);
    }
    // run a (key ka) goes before run b (key kb); an exhausted run goes after every live one
    __aicore__ inline bool Before(uint32_t a, int32_t ka, bool aLive, uint32_t b, int32_t kb, bool bLive) const {
        if (!aLive || !bLive) return aLive || (!bLive && a < b);
        return ka < kb || (ka == kb && a < b);
    }
    // Run c's next head block: the copies only; the caller orders them after the block's last
    // readers and before its scalar reads (Start: every run's between one pair of syncs).
    __aicore__ inline void Refill(PlanMerger& g, uint32_t c) {
        const uint32_t n = MinU(g.hlen, g.len[c] - g.pos[c]);
        LoadInts(ctx_.heads_[g.keyBase + c * g.hlen], ctx_.wsGm_[g.keyOff + c * ctx_.t_.nc + g.pos[c]], n, 0);
        if (g.pay)
            LoadInts(ctx_.heads_[g.payBase + c * g.hlen], ctx_.wsGm_[g.payOff + c * ctx_.t_.nc + g.pos[c]], n, 0);
        g.bpos[c] = 0;
        g.blen[c] = n;
    }
    __aicore__ inline void SetWinner(PlanMerger& g, uint32_t c, int32_t key, bool live) {
        g.best = c;
        g.has = live;
        g.key = key;
    }
    // The current entry's payload (a merge with one, while has): read only where a reader wants
    // it, for a key it matched, not for every entry the merge passes.
    __aicore__ inline int32_t Val(const PlanMerger& g) {
        return ctx_.heads_.GetValue(g.payBase + g.best * g.hlen + g.bpos[g.best]);
    }
    // Few runs: a scan of the heads reads fewer keys than a replay through the tree (about two
    // accesses per level), so up to kScanRuns runs the winner is found by a scan.
    static constexpr uint32_t kScanRuns = 4;
    __aicore__ inline void Scan(PlanMerger& g) {
        uint32_t best = 0;
        int32_t key = 0;
        bool has = false;
        for (uint32_t c = 0; c < g.runs; ++c) {
            if (!Live(g, c)) continue;
            const int32_t k = HeadKey(g, c);
            if (!has || k < key) {
                has = true;
                key = k;
                best = c;
            }
        }
        SetWinner(g, best, key, has);
    }
    // Run c's head changed: replay its path to the root.
    __aicore__ inline void Replay(PlanMerger& g, uint32_t c) {
        if (g.leaves <= kScanRuns) {
            Scan(g);
            return;
        }
        uint32_t cur = c;
        bool curLive = Live(g, c);
        int32_t curKey = curLive ? HeadKey(g, c) : 0;
        for (uint32_t node = (c + g.leaves) >> 1; node >= 1; node >>= 1) {
            const uint32_t other = static_cast<uint32_t>(ctx_.treeUb_.GetValue(g.treeBase + node));
            const bool live = Live(g, other);
            const int32_t k = live ? HeadKey(g, other) : 0;
            if (Before(other, k, live, cur, curKey, curLive)) {
                ctx_.treeUb_.SetValue(g.treeBase + node, static_cast<int32_t>(cur));
                cur = other;
                curKey = k;
                curLive = live;
            }
        }
        SetWinner(g, cur, curKey, curLive);
    }
    __aicore__ inline void Start(PlanMerger& g) {
        g.hlen = g.runs == 0 ? g.space : (g.space / g.runs / 8 * 8);
        g.leaves = 1;
        while (g.leaves < g.runs) g.leaves <<= 1;
        Sync<HardEvent::MTE3_MTE2>();   // runs were just stored
        Sync<HardEvent::S_MTE2>();      // scalar reads of the head space (an earlier merge)
        for (uint32_t c = 0; c < g.leaves; ++c) {
            if (c >= g.runs) g.len[c] = 0;
            g.pos[c] = 0;
            g.blen[c] = 0;
            g.bpos[c] = 0;
            if (g.len[c] > 0) Refill(g, c);
        }
        Sync<HardEvent::MTE2_S>();
        if (g.leaves <= kScanRuns) {
            Scan(g);
            return;
        }
        // winners bottom-up (once per merge); each node keeps the loser, the root's winner leads
        uint32_t win[2 * avsg::kPlanMaxRuns];
        for (uint32_t c = 0; c < g.leaves; ++c) win[g.leaves + c] = c;
        for (uint32_t node = g.leaves - 1; node >= 1; --node) {
            const uint32_t a = win[2 * node], b = win[2 * node + 1];
            const bool la = Live(g, a), lb = Live(g, b);
            const bool aFirst = Before(a, la ? HeadKey(g, a) : 0, la, b, lb ? HeadKey(g, b) : 0, lb);
            win[node] = aFirst ? a : b;
            ctx_.treeUb_.SetValue(g.treeBase + node, static_cast<int32_t>(aFirst ? b : a));
        }
        const uint32_t w = win[1];
        SetWinner(g, w, Live(g, w) ? HeadKey(g, w) : 0, Live(g, w));
    }
    // the value of the current entry (merges with `out`), written over its key
    __aicore__ inline void Emit(PlanMerger& g, int32_t v) {
        ctx_.heads_.SetValue(g.keyBase + g.best * g.hlen + g.bpos[g.best], v);
    }
    __aicore__ inline void Advance(PlanMerger& g) {
        const uint32_t c = g.best;
        g.pos[c]++;
        g.bpos[c]++;
        if (g.bpos[c] == g.blen[c]) {
            if (g.out) {
                Sync<HardEvent::S_MTE3>();        // Emit's writes
                const uint32_t first = g.pos[c] - g.blen[c];   // the block's first entry in its run
                StoreInts(ctx_.wsGm_[g.outOff + c * ctx_.t_.nc + first], ctx_.heads_[g.keyBase + c * g.hlen],
                          g.blen[c]);
            }
            if (g.pos[c] < g.len[c]) {
                // the refill overwrites the block: after its scalar reads, and after the store that
                // reads it (S -> MTE3 -> MTE2 is a chain: one flag covers both)
                if (g.out) Sync<HardEvent::MTE3_MTE2>();
                else Sync<HardEvent::S_MTE2>();
                Refill(g, c);
                Sync<HardEvent::MTE2_S>();
            } else if (g.out) {
                Sync<HardEvent::MTE3_S>();        // the block's next scalar writer (a later merge)
            }
        }
        Replay(g, c);
    }

    // the context and the blocks this one calls
    PlanContext& ctx_;
};

}  // namespace avsg_kernel
