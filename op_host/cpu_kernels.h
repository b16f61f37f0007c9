// The CPU builds of the AscendC kernels and which one the ops use.
//
// op_kernel/*.cpp and op_host/cpu_kernels.cpp are compiled twice into the CPU op library
// (CMakeLists.txt): against the strict emulation, and against the fast one (AVSG_EMU_FAST=1, with
// the kernels' extern "C" entries and namespaces renamed so that the two copies do not clash).
// Each copy describes itself with one KernelBuild; the op implementations (the *_host.cpp
// files) fetch the selected build once per call and launch its kernels with its
// launcher, so a launch never mixes the two.
#pragma once
#include <cstdint>
#include <functional>
#include <string>

namespace avsg_cpu {

using GmAddr = uint8_t*;

struct KernelBuild {
    const char* name;  // "strict" or "fast"
    bool counts_work;  // its launches record the per-block counters (avsg.backend.last_launch_counters)
    void (*launch)(uint32_t blocks, const std::function<void()>& body);
    void (*plan)(GmAddr topk, GmAddr seq, GmAddr validLens, GmAddr state, GmAddr stats, GmAddr slots,
                 GmAddr missPos, GmAddr missSlots, GmAddr missCounts, GmAddr workspace, GmAddr tiling);
    void (*plan_dual_pointer)(GmAddr topk, GmAddr seq, GmAddr validLens, GmAddr state, GmAddr stats, GmAddr slots,
                              GmAddr missPos, GmAddr missSlots, GmAddr missCounts, GmAddr workspace,
                              GmAddr tiling);
    void (*invalidate)(GmAddr state, GmAddr validLens, GmAddr tiling);
    void (*reset)(GmAddr state, GmAddr rowMask, GmAddr tiling);
    void (*resize)(GmAddr state, GmAddr target, GmAddr srcSlots, GmAddr dstSlots, GmAddr moveCounts, GmAddr tiling);
    void (*gather)(GmAddr missPos, GmAddr missSlots, GmAddr missCounts, GmAddr blockTable, GmAddr countOut,
                   GmAddr tiling);
    void (*calibrate)(GmAddr values, GmAddr out, GmAddr tiling);
    void (*plan_gather)(GmAddr topk, GmAddr seq, GmAddr validLens, GmAddr state, GmAddr stats, GmAddr slots,
                        GmAddr missPos, GmAddr missSlots, GmAddr missCounts, GmAddr workspace, GmAddr blockTable,
                        GmAddr countOut, GmAddr sync, GmAddr tiling);
    void (*split_slots)(GmAddr slots, GmAddr missSlots, GmAddr missCounts, GmAddr hits, GmAddr misses, GmAddr tiling);
};

const KernelBuild& strict_kernels();
const KernelBuild& fast_kernels();

// The build the CPU ops launch: process-wide, "strict" until select_kernels says otherwise.
const KernelBuild& selected_kernels();
// name: "strict" or "fast"; anything else throws std::invalid_argument, and so does "fast" where
// fast_kernels_unsupported() says why not.
void select_kernels(const std::string& name);
// The -march the fast build was compiled for (CMakeLists.txt: AVSG_FAST_ARCH), "" when generic.
const char* fast_kernels_arch();
// Why this CPU cannot run the fast build (it lacks that instruction set), or "" when it can.
std::string fast_kernels_unsupported();

}  // namespace avsg_cpu
