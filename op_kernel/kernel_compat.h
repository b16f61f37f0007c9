// kernel_compat.h: what the kernels need beyond the AscendC API of every toolkit they may meet.
// Included after kernel_operator.h (CANN's, or the CPU emulation's).
#pragma once

// ascendc_assert(expr) traps a kernel on the NPU (asc-devkit include/utils/debug/asc_assert.h,
// compiled out with NDEBUG or ASCENDC_DUMP=0) and raises in the CPU emulation. Toolkits without
// it still compile the kernels; the invariants are then checked by the emulation only.
#ifndef ascendc_assert
#define ascendc_assert(...) ((void)0)
#endif
