// Stand-in for CANN's stub_fun.h (CPU-debug builds only; it ships inside CANN, not in asc-devkit):
// the CCE built-in types the AscendC headers name. Written for scripts/typecheck_ascendc.py.
//
// The intrinsics (copy_gm_to_ubuf, vadd, set_flag, ...) are not listed here: the check appends
// one permissive declaration per name that the compiler reports undeclared *inside the SDK
// headers* (never in our sources), so no kernel-side misspelling can be declared into existence.
// Nothing here links or runs; the values of these enums only need to be distinct.
#pragma once
#include <cstdint>

enum pipe_t { PIPE_S = 0, PIPE_V, PIPE_M, PIPE_MTE1, PIPE_MTE2, PIPE_MTE3, PIPE_ALL, PIPE_MTE4, PIPE_MTE5,
              PIPE_V2, PIPE_FIX };
enum event_t { EVENT_ID0 = 0, EVENT_ID1, EVENT_ID2, EVENT_ID3, EVENT_ID4, EVENT_ID5, EVENT_ID6, EVENT_ID7 };
enum mem_dsb_t { DSB_ALL = 0, DSB_DDR, DSB_UB, DSB_SEQ };
enum ub_addr8_t { VA0 = 0, VA1, VA2, VA3, VA4, VA5, VA6, VA7 };
enum vpart_t { L128 = 0, H128 };
enum addr_cal_mode_t : uint8_t { inc = 0, dec };
enum pad_t : uint8_t { PAD_NONE = 0 };
// Only ever cast to from integers by the headers: no enumerators needed.
enum mem_t : uint8_t {};
enum atomic_type_t : uint8_t {};
enum atomic_op_t : uint8_t {};
enum class cache_line_t : uint8_t { SINGLE_CACHE_LINE = 0, ENTIRE_DATA_CACHE };
enum class dcci_dst_t : uint8_t { CACHELINE_ALL = 0, CACHELINE_UB, CACHELINE_OUT, CACHELINE_ATOMIC };
enum class Order_t : uint8_t { VALUE_INDEX = 0, INDEX_VALUE, ONLY_VALUE, ONLY_INDEX };
enum class QuantMode_t : uint8_t {
    NoQuant = 0, F322F16, F322BF16, DEQF16, VDEQF16, DEQS16, VDEQS16, REQ8, VREQ8, REQ4, VREQ4,
    QF322B8_PRE, VQF322B8_PRE, QF322F16_PRE, VQF322F16_PRE, QF322BF16_PRE, VQF322BF16_PRE,
    QF322F32_PRE, VQF322F32_PRE, QF322FP8_PRE, VQF322FP8_PRE, QF322HIF8_PRE, VQF322HIF8_PRE,
    QF322HIF8_PRE_HYBRID, VQF322HIF8_PRE_HYBRID, QS322BF16_PRE, VQS322BF16_PRE, QF162B8_PRE,
    VQF162B8_PRE, QF162S16_PRE, VQF162S16_PRE, QF162S4_PRE, VQF162S4_PRE };

// What a stubbed intrinsic returns. The headers use the results of the value-returning ones
// (get_ctrl, get_block_idx, sbitset0, ...) as integers.
using avsg_intrinsic_result = int64_t;
