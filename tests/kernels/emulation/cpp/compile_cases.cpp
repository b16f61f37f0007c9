// Compile-time cases for the AscendC CPU emulation. Compiled with -fsyntax-only:
//   without a CASE_* macro the file must compile (control: every API with an allowed dtype);
//   with -DCASE_<name> one forbidden use is added and must fail with the diagnostic that
//   test_emulation.py expects; with -DALL_CASES all of them are compiled at once (see below).
// Cases must not share a failing template instantiation (each is reported only once).
#include "kernel_operator.h"

using namespace AscendC;

__aicore__ inline void control(LocalTensor<int32_t> i32, LocalTensor<float> f32, LocalTensor<half> f16,
                               LocalTensor<int16_t> i16, LocalTensor<uint16_t> u16, LocalTensor<uint8_t> u8,
                               LocalTensor<uint32_t> u32, LocalTensor<int64_t> i64, GlobalTensor<int32_t> g32) {
    uint64_t cnt = 0;
    Add(i32, i32, i32, 64); Sub(f16, f16, f16, 128); Mul(i16, i16, i16, 128); Max(f32, f32, f32, 64);
    Min(i32, i32, i32, 64); Div(f32, f32, f32, 64);
    Adds(i32, i32, 1, 64); Muls(i16, i16, (int16_t)3, 64); Maxs(f32, f32, 0.0f, 64); Mins(f16, f16, half(1.0f), 64);
    ShiftLeft(u32, u32, 3u, 64); ShiftRight(i16, i16, (int16_t)1, 64);
    And(u16, u16, u16, 128); Or(i16, i16, i16, 128); Not(u16, u16, 128);
    Compare(u8, f32, f32, CMPMODE::LT, 64); Compare(u8, i32, i32, CMPMODE::EQ, 64);
    Compares(u8, i32, 5, CMPMODE::EQ, 64); CompareScalar(u8, f16, half(0.0f), CMPMODE::GE, 128);
    Select(f32, u8, f32, 0.0f, SELMODE::VSEL_TENSOR_SCALAR_MODE, 64);
    Select(f16, u16, f16, f16, SELMODE::VSEL_TENSOR_TENSOR_MODE, 128);
    GatherMask(i32, i32, u32, true, 64, {1, 1, 8, 0}, cnt);
    GatherMask(f16, f16, u16, true, 64, {1, 1, 8, 0}, cnt);
    GatherMask(f32, f32, (uint8_t)1, false, 0, {1, 1, 8, 8}, cnt);
    Gather(i32, i32, u32, 0u, 64);
    Cast(f32, i32, RoundMode::CAST_NONE, 64); Cast(i32, f32, RoundMode::CAST_RINT, 64);
    Cast(i64, i32, RoundMode::CAST_NONE, 64); Cast(i32, i64, RoundMode::CAST_NONE, 64);
    Cast(f32, i64, RoundMode::CAST_RINT, 64); Cast(i64, f32, RoundMode::CAST_TRUNC, 64);
    Cast(i16, i32, RoundMode::CAST_NONE, 64); Cast(f32, f16, RoundMode::CAST_NONE, 64);
    ReduceMax(f32, f32, f32, 64, true); ReduceMin(f16, f16, f16, 64); ReduceSum(f32, f32, f32, 64);
    Sort32(f32, f32, u32, 1); Sort<float, true>(f32, f32, u32, f32, 1); Extract(f32, u32, f32, 1);
    Duplicate(u16, (uint16_t)1, 128); CreateVecIndex(i32, 0, 64);
    DataCopy(i32, g32, 64); DataCopy(g32, i32, 64); DataCopy(i64, i64, 4);
    DataCopyPad(i32, g32, DataCopyExtParams(1, 4, 0, 0, 0), DataCopyPadExtParams<int32_t>(true, 0, 7, -1));
    DataCopyPad(g32, i32, DataCopyExtParams(1, 4, 0, 0, 0));
    PipeBarrier<PIPE_V>(); PipeBarrier<PIPE_ALL>();
    SetFlag<HardEvent::V_S>(0); WaitFlag<HardEvent::V_S>(0);
    SyncAll(); DataCacheCleanAndInvalid<int32_t, CacheLine::SINGLE_CACHE_LINE, DcciDst::CACHELINE_OUT>(g32);
    SetAtomicAdd<float>(); DisableDmaAtomic();
    TQueSync<PIPE_MTE2, PIPE_S> s; (void)s;
}

// Each forbidden use lives in its own function, compiled when CASE_<name> or ALL_CASES is
// defined. With ALL_CASES every case is compiled in ONE run: g++ reports every failed
// static_assert (each in its own instantiation), and the test attributes each diagnostic
// to a case through the `required from here` line inside the case's BEGIN/END markers.
#define CASE_ARGS LocalTensor<int32_t> i32, LocalTensor<float> f32, LocalTensor<half> f16, LocalTensor<int16_t> i16, LocalTensor<uint16_t> u16, LocalTensor<uint8_t> u8, LocalTensor<uint32_t> u32, LocalTensor<int64_t> i64, GlobalTensor<int32_t> g32
#define CASE_UNUSED (void)i32; (void)f32; (void)f16; (void)i16; (void)u16; (void)u8; (void)u32; (void)i64; (void)g32; uint64_t cnt = 0; (void)cnt

#if defined(ALL_CASES) || defined(CASE_and_int32)
// BEGIN and_int32
void case_and_int32(CASE_ARGS) {
    CASE_UNUSED;

    And(i32, i32, i32, 64);
}
// END and_int32
#endif

#if defined(ALL_CASES) || defined(CASE_or_int32)
// BEGIN or_int32
void case_or_int32(CASE_ARGS) {
    CASE_UNUSED;
    Or(i32, i32, i32, 64);
}
// END or_int32
#endif

#if defined(ALL_CASES) || defined(CASE_not_int32)
// BEGIN not_int32
void case_not_int32(CASE_ARGS) {
    CASE_UNUSED;
    Not(i32, i32, 64);
}
// END not_int32
#endif

#if defined(ALL_CASES) || defined(CASE_select_int32)
// BEGIN select_int32
void case_select_int32(CASE_ARGS) {
    CASE_UNUSED;
    Select(i32, u8, i32, 0, SELMODE::VSEL_TENSOR_SCALAR_MODE, 64);
}
// END select_int32
#endif

#if defined(ALL_CASES) || defined(CASE_compares_int8_mask)
// BEGIN compares_int8_mask
void case_compares_int8_mask(CASE_ARGS) {
    CASE_UNUSED;
    LocalTensor<int8_t> m8;
    Compares(m8, f32, 0.0f, CMPMODE::LT, 64);
}
// END compares_int8_mask
#endif

#if defined(ALL_CASES) || defined(CASE_compare_int16)
// BEGIN compare_int16
void case_compare_int16(CASE_ARGS) {
    CASE_UNUSED;
    Compare(u8, i16, i16, CMPMODE::EQ, 128);
}
// END compare_int16
#endif

#if defined(ALL_CASES) || defined(CASE_compare_uint16_mask)
// BEGIN compare_uint16_mask
void case_compare_uint16_mask(CASE_ARGS) {
    CASE_UNUSED;
    Compare(u16, f32, f32, CMPMODE::EQ, 64);
}
// END compare_uint16_mask
#endif

#if defined(ALL_CASES) || defined(CASE_add_int64)
// BEGIN add_int64
void case_add_int64(CASE_ARGS) {
    CASE_UNUSED;
    Add(i64, i64, i64, 64);
}
// END add_int64
#endif

#if defined(ALL_CASES) || defined(CASE_muls_int64)
// BEGIN muls_int64
void case_muls_int64(CASE_ARGS) {
    CASE_UNUSED;
    Muls(i64, i64, (int64_t)3, 64);
}
// END muls_int64
#endif

#if defined(ALL_CASES) || defined(CASE_adds_uint32)
// BEGIN adds_uint32
void case_adds_uint32(CASE_ARGS) {
    CASE_UNUSED;
    Adds(u32, u32, 1u, 64);
}
// END adds_uint32
#endif

#if defined(ALL_CASES) || defined(CASE_max_uint16)
// BEGIN max_uint16
void case_max_uint16(CASE_ARGS) {
    CASE_UNUSED;
    Max(u16, u16, u16, 128);
}
// END max_uint16
#endif

#if defined(ALL_CASES) || defined(CASE_shift_int64)
// BEGIN shift_int64
void case_shift_int64(CASE_ARGS) {
    CASE_UNUSED;
    ShiftLeft(i64, i64, (int64_t)1, 64);
}
// END shift_int64
#endif

#if defined(ALL_CASES) || defined(CASE_shift_uint8)
// BEGIN shift_uint8
void case_shift_uint8(CASE_ARGS) {
    CASE_UNUSED;
    ShiftRight(u8, u8, (uint8_t)1, 64);
}
// END shift_uint8
#endif

#if defined(ALL_CASES) || defined(CASE_reducemax_int32)
// BEGIN reducemax_int32
void case_reducemax_int32(CASE_ARGS) {
    CASE_UNUSED;
    ReduceMax(i32, i32, i32, 64);
}
// END reducemax_int32
#endif

#if defined(ALL_CASES) || defined(CASE_reducesum_int16)
// BEGIN reducesum_int16
void case_reducesum_int16(CASE_ARGS) {
    CASE_UNUSED;
    LocalTensor<int16_t> s16;
    ReduceSum(s16, s16, s16, 64);  // distinct instantiation from reducemax_int32
}
// END reducesum_int16
#endif

#if defined(ALL_CASES) || defined(CASE_sort_int32)
// BEGIN sort_int32
void case_sort_int32(CASE_ARGS) {
    CASE_UNUSED;
    Sort32(i32, i32, u32, 1);
}
// END sort_int32
#endif

#if defined(ALL_CASES) || defined(CASE_gathermask_int32_u16_pattern)
// BEGIN gathermask_int32_u16_pattern
void case_gathermask_int32_u16_pattern(CASE_ARGS) {
    CASE_UNUSED;
    GatherMask(i32, i32, u16, true, 64, {1, 1, 8, 0}, cnt);
}
// END gathermask_int32_u16_pattern
#endif

#if defined(ALL_CASES) || defined(CASE_gathermask_int16_u32_pattern)
// BEGIN gathermask_int16_u32_pattern
void case_gathermask_int16_u32_pattern(CASE_ARGS) {
    CASE_UNUSED;
    GatherMask(i16, i16, u32, true, 64, {1, 1, 8, 0}, cnt);
}
// END gathermask_int16_u32_pattern
#endif

#if defined(ALL_CASES) || defined(CASE_gather_int64)
// BEGIN gather_int64
void case_gather_int64(CASE_ARGS) {
    CASE_UNUSED;
    Gather(i64, i64, u32, 0u, 64);
}
// END gather_int64
#endif

#if defined(ALL_CASES) || defined(CASE_cast_int16_int32)
// BEGIN cast_int16_int32
void case_cast_int16_int32(CASE_ARGS) {
    CASE_UNUSED;
    Cast(i32, i16, RoundMode::CAST_NONE, 64);   // A2 has no int16 -> int32 conversion
}
// END cast_int16_int32
#endif

#if defined(ALL_CASES) || defined(CASE_duplicate_int64)
// BEGIN duplicate_int64
void case_duplicate_int64(CASE_ARGS) {
    CASE_UNUSED;
    Duplicate(i64, (int64_t)0, 64);
}
// END duplicate_int64
#endif

#if defined(ALL_CASES) || defined(CASE_createvecindex_uint32)
// BEGIN createvecindex_uint32
void case_createvecindex_uint32(CASE_ARGS) {
    CASE_UNUSED;
    CreateVecIndex(u32, 0u, 64);
}
// END createvecindex_uint32
#endif

#if defined(ALL_CASES) || defined(CASE_pipebarrier_s)
// BEGIN pipebarrier_s
void case_pipebarrier_s(CASE_ARGS) {
    CASE_UNUSED;
    PipeBarrier<PIPE_S>();
}
// END pipebarrier_s
#endif

#if defined(ALL_CASES) || defined(CASE_dcci_atomic)
// BEGIN dcci_atomic
void case_dcci_atomic(CASE_ARGS) {
    CASE_UNUSED;
    DataCacheCleanAndInvalid<int32_t, CacheLine::SINGLE_CACHE_LINE, DcciDst::CACHELINE_ATOMIC>(g32);
}
// END dcci_atomic
#endif

#if defined(ALL_CASES) || defined(CASE_atomicadd_int64)
// BEGIN atomicadd_int64
void case_atomicadd_int64(CASE_ARGS) {
    CASE_UNUSED;
    SetAtomicAdd<int64_t>();
}
// END atomicadd_int64
#endif

#if defined(ALL_CASES) || defined(CASE_datacopy_bool)
// BEGIN datacopy_bool
void case_datacopy_bool(CASE_ARGS) {
    CASE_UNUSED;
    LocalTensor<bool> b; GlobalTensor<bool> gb;
    DataCopy(b, gb, 32);
}
// END datacopy_bool
#endif

#if defined(ALL_CASES) || defined(CASE_tque_veccalc)
// BEGIN tque_veccalc
void case_tque_veccalc(CASE_ARGS) {
    CASE_UNUSED;
    TQue<TPosition::VECCALC, 1> q; (void)q;
}
// END tque_veccalc
#endif

#if defined(ALL_CASES) || defined(CASE_tquesync_bad_pair)
// BEGIN tquesync_bad_pair
void case_tquesync_bad_pair(CASE_ARGS) {
    CASE_UNUSED;
    TQueSync<PIPE_V, PIPE_V> bad; (void)bad;
}
// END tquesync_bad_pair
#endif

#if defined(ALL_CASES) || defined(CASE_gm_atomic_cas)
// BEGIN gm_atomic_cas
void case_gm_atomic_cas(CASE_ARGS) {
    CASE_UNUSED;
    AtomicCas(g32.GetPhyAddr(0), 0, 1);  // scalar GM atomics do not exist on A2 (card §6)
}
// END gm_atomic_cas
#endif

#if defined(ALL_CASES) || defined(CASE_hardevent_not_aiv)
// BEGIN hardevent_not_aiv
void case_hardevent_not_aiv(CASE_ARGS) {
    CASE_UNUSED;
    SetFlag<HardEvent::M_V>(0);  // cube events are not declared (card §6)
}
// END hardevent_not_aiv
#endif

int main() { return 0; }
