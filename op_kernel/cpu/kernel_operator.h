// kernel_operator.h — CPU stand-in for CANN's AscendC header (AVSG strict emulation).
//
// Kernel sources `#include "kernel_operator.h"`; on the host they are compiled with
// `-std=c++17 -pthread -I op_kernel/cpu` and get this file, on the NPU the real header.
// Only A2 (910B, dav-c220) AIV APIs from ../../shared/ascendc-api-card.md are declared.
//
// Layout:
//   emu_core.h      compile shims, enums, half/bfloat16_t, EmuError, block context, launcher,
//                   counters and cost model (namespace avsg_emu)
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
// Not modelled (documented gaps): the pipe-hazard scoreboard (missing SetFlag/WaitFlag or
// PipeBarrier between dependent instructions is NOT detected: execution is eager and in
// program order), the scalar DCache (GM scalar accesses are direct), --cce-auto-sync, the
// high-dim (mask/repeat) forms of the vector APIs, MrgSort/Concat, half Sort, the legacy
// DataCopyPad(DataCopyParams, DataCopyPadParams) overloads. int32 Add/Mul overflow wraps
// (card §10: undocumented on hardware).
//
// Keep kernel translation units free of torch headers: this file defines global names
// (half, bfloat16_t, pipe_t, event_t, GM_ADDR, __global__, ...) as the CCE compiler does.
#pragma once
#define AVSG_ASCENDC_EMULATION 1
#include "emu_core.h"
#include "emu_tensor.h"
#include "emu_pipe.h"
#include "emu_sync.h"
#include "emu_datacopy.h"
#include "emu_vector.h"
