// kernel_compat.h: what the kernels need beyond the AscendC API of every toolkit they may meet.
// Included after kernel_operator.h (CANN's, or the CPU emulation's).
#pragma once

// ascendc_assert(expr) traps a kernel on the NPU (asc-devkit include/utils/debug/asc_assert.h,
// compiled out with NDEBUG or ASCENDC_DUMP=0) and raises in the CPU emulation. Toolkits without
// it still compile the kernels; the invariants are then checked by the emulation only.
#ifndef ascendc_assert
#define ascendc_assert(...) ((void)0)
#endif

// AVSG_PHASE(id): the kernel's step `id` begins here (id: an enumerator of a phase enum E with a
// PhaseTableOf(E) found by argument-dependent lookup, e.g. avsg::PlanPhase in plan/plan_phases.h).
// The strict emulation charges each block's counters to the phase running when they accrue
// (avsg_emu::mark_phase); on the NPU, in CANN's CPU-debug build and in the fast emulation it is
// nothing, not even an evaluation of id.
#if defined(AVSG_ASCENDC_EMULATION) && AVSG_EMU_STRICT
#define AVSG_PHASE(id) ::avsg_emu::mark_phase(PhaseTableOf(id), static_cast<uint32_t>(id))
#else
#define AVSG_PHASE(id) ((void)0)
#endif

namespace avsg {
// The UB byte address of a LocalTensor, as an integer, for alignment arithmetic (Sort32 wants
// 256 B / 128 B boundaries that TPipe does not promise). GetPhyAddr() is that integer on the device
// (uint64_t) and in the CPU emulation; in CANN's CPU-debug build (RUN_MODE=cpu,
// ASCENDC_CPU_DEBUG) it is a host pointer into the modelled UB, so the address is taken relative
// to that UB's base, which is what the device alignment refers to.
template <typename T>
__aicore__ inline uint64_t UbAddr(const AscendC::LocalTensor<T>& t)
{
#if defined(ASCENDC_CPU_DEBUG) && ASCENDC_CPU_DEBUG == 1
    return static_cast<uint64_t>(reinterpret_cast<const uint8_t*>(t.GetPhyAddr()) -
                                 AscendC::GetBaseAddrCpu(static_cast<int8_t>(t.GetPosition())));
#else
    return static_cast<uint64_t>(t.GetPhyAddr());
#endif
}

// A2's count-form Compare / CompareScalar issue under whatever vector mask is set (dav_c220
// kernel_operator_vec_cmp_impl.h, CompareCompute / CompareScalarCompute pass no mask of their own),
// and GatherMask, Gather, CreateVecIndex past its first 32 B, ReduceMax / ReduceMin and Extract
// leave it partial (docs/npu.md, "The vector mask"): a compare after them would fill only some
// lanes of its result. The other count forms the kernels use set their own mask and restore it
// full, and no other instruction of ours reads it, so the compares are the one place to guard:
// every compare restores the full mask first (ResetMask, a scalar write of the mask register);
// the strict emulation fails a compare issued under a partial mask.
template <typename T, typename U>
__aicore__ inline void CompareAll(const AscendC::LocalTensor<U>& dst, const AscendC::LocalTensor<T>& src0,
                                  const AscendC::LocalTensor<T>& src1, AscendC::CMPMODE mode, uint32_t count)
{
    AscendC::ResetMask();
    AscendC::Compare(dst, src0, src1, mode, count);
}
template <typename T, typename U, typename S>
__aicore__ inline void CompareScalarAll(const AscendC::LocalTensor<U>& dst, const AscendC::LocalTensor<T>& src0,
                                        const S scalar, AscendC::CMPMODE mode, uint32_t count)
{
    AscendC::ResetMask();
    AscendC::CompareScalar(dst, src0, static_cast<T>(scalar), mode, count);
}
}  // namespace avsg
