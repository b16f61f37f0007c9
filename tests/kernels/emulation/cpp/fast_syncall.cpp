// SyncAll in the fast emulation build (compiled with -DAVSG_EMU_FAST=1 by
// tests/kernels/test_emulation_fast.py). The fast launcher runs blocks one after another on the calling
// thread; when block 0 reaches its first SyncAll, it runs the other blocks as fibers up to each
// barrier. These cases check that blocks still meet in every barrier, that unequal SyncAll counts
// still fail, and that a failing block fails the launch with its own error.
// Usage: fast_syncall <case>; prints OK (exit 0) or the failure (exit 1).
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "kernel_operator.h"

using namespace AscendC;

static_assert(!avsg_emu::kStrict, "build this file with -DAVSG_EMU_FAST=1");

#define CHECK(cond)                                                                    \
    do {                                                                               \
        if (!(cond)) throw std::logic_error("CHECK failed line " + std::to_string(__LINE__) + ": " #cond); \
    } while (0)

// Every block writes round*100+idx to its GM cell, SyncAll, reads its right neighbour's cell,
// SyncAll; over several rounds. Without a real barrier a block reads a stale value.
static void exchange_rounds() {
    const uint32_t blocks = 8, rounds = 5;
    std::vector<int32_t> cell(blocks, -1), seen(blocks * rounds, -1);
    avsg_emu::launch(blocks, [&] {
        GlobalTensor<int32_t> g;
        g.SetGlobalBuffer(cell.data(), blocks);
        const uint32_t b = static_cast<uint32_t>(GetBlockIdx());
        for (uint32_t r = 0; r < rounds; ++r) {
            g.SetValue(b, static_cast<int32_t>(r * 100 + b));
            SyncAll();
            seen[r * blocks + b] = g.GetValue((b + 1) % blocks);
            SyncAll();
        }
    });
    for (uint32_t r = 0; r < rounds; ++r)
        for (uint32_t b = 0; b < blocks; ++b) CHECK(seen[r * blocks + b] == static_cast<int32_t>(r * 100 + (b + 1) % blocks));
    // the next launch (no SyncAll) runs sequentially again and still sees every block
    std::vector<int32_t> ran(blocks, 0);
    avsg_emu::launch(blocks, [&] { ran[GetBlockIdx()] = 1; });
    for (uint32_t b = 0; b < blocks; ++b) CHECK(ran[b] == 1);
}

static void single_block() {
    int32_t v = 0;
    avsg_emu::launch(1, [&] {
        SyncAll();
        v = 7;
        SyncAll();
    });
    CHECK(v == 7);
}

static void soft_sync() {
    const uint32_t blocks = 4;
    std::vector<int32_t> ws(8 * blocks, 0), gm(blocks, 0), seen(blocks, 0);
    avsg_emu::launch(blocks, [&] {
        TPipe pipe;
        TBuf<TPosition::VECCALC> b;
        pipe.InitBuffer(b, blocks * 32);
        GlobalTensor<int32_t> w, g;
        w.SetGlobalBuffer(ws.data(), 8 * blocks);
        g.SetGlobalBuffer(gm.data(), blocks);
        g.SetValue(GetBlockIdx(), 1);
        SyncAll(w, b.Get<int32_t>());
        int s = 0;
        for (uint32_t i = 0; i < blocks; ++i) s += g.GetValue(i);
        seen[GetBlockIdx()] = s;
        SyncAll(w, b.Get<int32_t>());
    });
    for (uint32_t b = 0; b < blocks; ++b) CHECK(seen[b] == static_cast<int32_t>(blocks));
}

// Block 0 finishes without SyncAll, block 1 calls it: a deadlock on the NPU, an error here.
static void unequal_counts() {
    try {
        avsg_emu::launch(2, [&] {
            if (GetBlockIdx() == 1) SyncAll();
        });
    } catch (const AscendC::EmuError& e) {
        CHECK(std::string(e.what()).find("different number of times") != std::string::npos);
        // and the other way round: block 0 waits in SyncAll for a block that never arrives
        try {
            avsg_emu::launch(2, [&] {
                if (GetBlockIdx() == 0) SyncAll();
            });
        } catch (const AscendC::EmuError& e2) {
            CHECK(std::string(e2.what()).find("SyncAll") != std::string::npos);
            return;
        }
        CHECK(!"block 0 alone in SyncAll did not fail");
    }
    CHECK(!"unequal SyncAll counts did not fail");
}

// A block fails while the others wait in SyncAll (before the first barrier, and after one): the
// launch raises that block's error, not a broken-barrier one, and every waiting block unwinds
// (the next launch on the same thread runs normally); a block not started yet never starts.
static void failure_breaks_the_barrier() {
    for (int late = 0; late < 2; ++late) {
        const uint32_t blocks = 5;
        std::vector<int32_t> unwound(blocks, 0);
        struct Guard {
            int32_t* flag;
            ~Guard() { *flag = 1; }
        };
        try {
            avsg_emu::launch(blocks, [&] {
                const uint32_t b = static_cast<uint32_t>(GetBlockIdx());
                Guard g{&unwound[b]};
                if (late) SyncAll();
                ascendc_assert(b != 3);
                SyncAll();
                SyncAll();
            });
            CHECK(!"a failing block did not fail the launch");
        } catch (const AscendC::EmuError& e) {
            CHECK(std::string(e.what()).find("ascendc_assert(b != 3)") != std::string::npos);
        }
        // blocks after the failing one never started when it failed before the first barrier
        for (uint32_t b = 0; b < blocks; ++b) CHECK(unwound[b] == (late || b <= 3 ? 1 : 0));
    }
    exchange_rounds();
}

int main(int argc, char** argv) {
    const std::string name = argc > 1 ? argv[1] : "";
    try {
        if (name == "exchange_rounds") exchange_rounds();
        else if (name == "single_block") single_block();
        else if (name == "soft_sync") soft_sync();
        else if (name == "unequal_counts") unequal_counts();
        else if (name == "failure_breaks_the_barrier") failure_breaks_the_barrier();
        else {
            std::printf("unknown case '%s'\n", name.c_str());
            return 1;
        }
    } catch (const std::exception& e) {
        std::printf("FAILED: %s\n", e.what());
        return 1;
    }
    std::printf("OK\n");
    return 0;
}
