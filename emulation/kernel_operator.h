// kernel_operator.h — CPU stand-in for CANN's AscendC header (AVSG strict emulation).
//
// Kernel sources `#include "kernel_operator.h"`; on the host they are compiled with
// `-std=c++17 -pthread -I emulation` and get this file, on the NPU the real header.
// Only A2 (910B, dav-c220) AIV APIs are declared (docs/npu.md: each with its public source).
//
// Layout:
//   emu_core.h      compile shims, enums, half/bfloat16_t, EmuError, block context, launcher,
//                   counters and cost model (namespace avsg_emu)
//   emu_hazard.h    the pipe-hazard scoreboard (see "Pipe hazards" below)
//   emu_tensor.h    GlobalTensor, LocalTensor, shared operand checks
//   emu_pipe.h      TPipe, TQueBind/TQue, TBuf, GetTPipePtr
//   emu_sync.h      GetBlockIdx/GetBlockNum, PipeBarrier, SetFlag/WaitFlag, TQueSync, SyncAll,
//                   DataCacheCleanAndInvalid, SetAtomicAdd/DisableDmaAtomic
//   emu_datacopy.h  DataCopy (count + DataCopyParams), DataCopyPad (Ext params)
//   emu_vector.h    Duplicate, CreateVecIndex, Add/Sub/Mul/Div/Max/Min, Adds/Muls/Maxs/Mins,
//                   ShiftLeft/ShiftRight, And/Or/Not, Compare/Compares/CompareScalar, Select,
//                   GatherMask, Gather, Cast, ReduceMax/ReduceMin/ReduceSum, Sort32/Sort/Extract
//
// Host usage:
//   avsg_emu::set_core_count(40);                       // default 40 (910B3/B4)
//   avsg_emu::launch(blockDim, [&]{ my_kernel(a, b); }); // one std::thread per block
//   auto per_block = avsg_emu::last_launch_counters();  // std::vector<avsg_emu::Counters>
//   double ns = avsg_emu::estimate_launch_ns(per_block);
//   AVSG_EMU_LAUNCH(kernel, blockDim, args...);          // same as the lambda form
//   ACLRT_LAUNCH_KERNEL(kernel)(blockDim, stream, args...); // void* args convert to GM_ADDR
// Violations throw AscendC::EmuError (rethrown on the launching thread).
//
// Pipe hazards (emu_hazard.h; card §3, §6, §8.8-9, §9). Execution stays eager and in program
// order, but every launch runs a scoreboard, on by default, that rejects programs whose result
// would depend on pipe timing on the NPU. It models PIPE_S (scalar GetValue/SetValue/operator()
// on LocalTensor and GlobalTensor), PIPE_V (vector APIs, UB->UB DataCopy), PIPE_MTE2 (GM->UB)
// and PIPE_MTE3 (UB->GM). Each API call is one instruction with a per-pipe epoch; UB and GM
// (per block) are tracked per 32 B granule with a byte mask per pipe, last writer and readers.
// Ordering is a vector clock fed by SetFlag/WaitFlag (a WaitFlag covers exactly the producer
// instructions issued before the matching SetFlag), PipeBarrier<P> (within P), PIPE_ALL and
// SyncAll (everything), the implicit TQue/TQueBind events of card §3 (EnQue->DeQue, FreeTensor->
// AllocTensor of the same buffer; never PIPE_S, never V->V), and scalar issue (instructions issued
// after PIPE_S waited for a pipe start after that pipe's covered work). Reported, with both APIs,
// pipes, the UB/GM byte range and the missing sync: cross-pipe RAW, WAR and WAW without a covering
// flag; dependent PIPE_V instructions without PipeBarrier<PIPE_V>; overlapping DMA destinations
// without PipeBarrier<PIPE_MTE2/MTE3> (DMA-atomic stores excepted); same-block GM store->reload
// (MTE3->MTE2), reload->store, and scalar GM access against DMA. CreateVecIndex follows its A2
// implementation (scalar first 32 B, internal S_V, PIPE_V Adds, no barrier after the tail);
// GatherMask's rsvdCnt is synchronous but its UB output still needs V_S before scalar reads.
// Not checked: cross-block GM ordering, the DCache (missing DataCacheCleanAndInvalid),
// API-internal temporaries (reserved UB), raw pointer accesses, --cce-auto-sync, and paths a
// test does not execute. Only the emulation's own unit tests may switch it off:
// avsg_emu::set_hazard_checks(false) (read at launch). Full modelling notes: emu_hazard.h.
//
// Not modelled (documented gaps): the scalar DCache (GM scalar accesses are direct),
// --cce-auto-sync, the high-dim (mask/repeat) forms of the vector APIs, MrgSort/Concat, half
// Sort, the legacy DataCopyPad(DataCopyParams, DataCopyPadParams) overloads. int32 Add/Mul
// overflow wraps (card §10: undocumented on hardware).
//
// Keep kernel translation units free of torch headers: this file defines global names
// (half, bfloat16_t, pipe_t, event_t, GM_ADDR, __global__, ...) as the CCE compiler does.
#pragma once
#define AVSG_ASCENDC_EMULATION 1
#include "emu_core.h"
#include "emu_hazard.h"
#include "emu_tensor.h"
#include "emu_pipe.h"
#include "emu_sync.h"
#include "emu_datacopy.h"
#include "emu_vector.h"
