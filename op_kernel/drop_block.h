// drop_block.h: the drop of positions at or past a row's valid length (reference._drop_past), as
// vector steps on UB chunks of a state row. One piece of logic, two users: the invalidate kernel
// (invalidate_kernel.h), which streams a row's sections through buffers of its own, and the plan
// kernel when it is given valid lengths (plan/plan_block_drop.h), which applies it to its section
// windows at the start of a row, so the serving path needs no separate invalidate launch.
//
// slot_pos >= limit -> slot_pos = -1, slot_life = -1 (reuse: slot_count = 0), with limit =
// clamp(valid_len, -1, 2^24). int32 Compare is EQ only on A2, so the test runs in float on
// min(slot_pos, 2^24): exact, and equivalent to the int32 test whatever slot_pos holds (limit <=
// 2^24; values below -1 stay below -1 when rounded). The kept values are never rounded: the float
// test becomes an int32 lane mask (-1 keep, 0 drop) and the update is (x & keep) | ~keep on u16
// lanes. Reuse: every ghost naming a position >= limit returns to 0 (GhostDropTest/Apply).
// UB: none of its own; the caller passes n-lane scratch vectors and a 32 B result buffer.
#pragma once
#include "kernel_tools.h"

namespace avsg_kernel {

// clamp(valid_len, -1, 2^24) as the float the tests compare against (exact)
__aicore__ inline float DropLimit(int32_t validLen) {
    if (validLen < -1) validLen = -1;
    if (validLen > static_cast<int32_t>(avsg::kMaxPosition)) validLen = static_cast<int32_t>(avsg::kMaxPosition);
    return static_cast<float>(validLen);
}

// Whether any of the first ``count`` values of ``vals`` (floats holding exact integers) is
// >= limit: one ReduceMax (float only on A2) into ``top`` (32 B) and a scalar read of its result.
__aicore__ inline bool DropAnyAtLeast(const LocalTensor<float>& top, const LocalTensor<float>& vals,
                                      const LocalTensor<float>& work, uint32_t count, float limit) {
    Sync<HardEvent::S_V>();                   // earlier scalar reads of top's buffer
    PipeBarrier<PIPE_V>();                    // vals was just computed
    ReduceMax(top, vals, work, static_cast<int32_t>(count));
    Sync<HardEvent::V_S>();
    return top.GetValue(0) >= limit;
}

// keep (as float) = min(pos, 2^24) on n lanes; whether any of the first ``real`` (the row's real
// slots) is >= limit. Most passes drop nothing (every draft accepted, or one query token); then
// the caller reads and writes nothing more of the chunk. ``work``: n floats of scratch.
__aicore__ inline bool DropTest(const LocalTensor<int32_t>& pos, const LocalTensor<int32_t>& keep,
                                const LocalTensor<float>& work, const LocalTensor<float>& top, uint32_t n,
                                uint32_t real, float limit) {
    const LocalTensor<float> keepF = keep.ReinterpretCast<float>();
    Mins(keep, pos, static_cast<int32_t>(avsg::kMaxPosition), n);
    PipeBarrier<PIPE_V>();
    Cast(keepF, keep, RoundMode::CAST_RINT, n);
    return DropAnyAtLeast(top, keepF, work, real, limit);
}

// After DropTest: keep = -1 on kept lanes, 0 on dropped ones; notKeep = ~keep. notKeep holds
// 0.0f on entry (the caller's Duplicate, placed where its pipe is idle).
__aicore__ inline void DropMask(const LocalTensor<int32_t>& keep, const LocalTensor<int32_t>& notKeep,
                                const LocalTensor<uint8_t>& drop, uint32_t n, float limit) {
    const LocalTensor<float> keepF = keep.ReinterpretCast<float>(), zeroF = notKeep.ReinterpretCast<float>();
    avsg::CompareScalarAll(drop, keepF, limit, CMPMODE::GE, n);
    PipeBarrier<PIPE_V>();
    Select(keepF, drop, zeroF, -1.0f, SELMODE::VSEL_TENSOR_SCALAR_MODE, n);   // drop ? 0 : -1
    PipeBarrier<PIPE_V>();
    Cast(keep, keepF, RoundMode::CAST_RINT, n);
    PipeBarrier<PIPE_V>();
    Not(notKeep.ReinterpretCast<uint16_t>(), keep.ReinterpretCast<uint16_t>(), 2 * n);
}

// x &= keep: a dropped lane to 0 (first half of the update; a count's whole update)
__aicore__ inline void DropClear(const LocalTensor<int32_t>& x, const LocalTensor<int32_t>& keep, uint32_t n) {
    And(x.ReinterpretCast<uint16_t>(), x.ReinterpretCast<uint16_t>(), keep.ReinterpretCast<uint16_t>(), 2 * n);
}
// x |= notKeep after DropClear: a dropped lane to -1 (slot_pos, slot_life)
__aicore__ inline void DropFill(const LocalTensor<int32_t>& x, const LocalTensor<int32_t>& notKeep, uint32_t n) {
    Or(x.ReinterpretCast<uint16_t>(), x.ReinterpretCast<uint16_t>(), notKeep.ReinterpretCast<uint16_t>(), 2 * n);
}

// Reuse policy, ghost entries [o, o + n) in ``ghost``: tag (as float) = the position each names
// (tag * G + entry, reference.ghost_positions); whether any is >= limit. The name is formed in
// float: tag * G is exact (a power of two), the sum rounds monotonically and every integer limit
// in [-1, 2^24] is exact, so the GE test is the int64 one whatever the entry holds. zero: set to
// 0.0f here (DropMask's notKeep); keep: ReduceMax's scratch.
__aicore__ inline bool GhostDropTest(const LocalTensor<int32_t>& ghost, const LocalTensor<int32_t>& tag,
                                     const LocalTensor<int32_t>& entry, const LocalTensor<int32_t>& keep,
                                     const LocalTensor<int32_t>& zero, const LocalTensor<float>& top, uint32_t o,
                                     uint32_t n, uint32_t ghostLog, float limit) {
    const LocalTensor<float> tagF = tag.ReinterpretCast<float>(), entryF = entry.ReinterpretCast<float>();
    const float entries = static_cast<float>(1u << ghostLog);
    Sync<HardEvent::V_S>();               // CreateVecIndex starts with scalar writes
    CreateVecIndex(entry, static_cast<int32_t>(o), n);
    ShiftRight(tag, ghost, avsg::kGhostCountBits, n);   // arithmetic: a negative word, a negative tag
    Duplicate(zero.ReinterpretCast<float>(), 0.0f, n);
    PipeBarrier<PIPE_V>();
    Cast(entryF, entry, RoundMode::CAST_RINT, n);   // exact: < 2^16
    Cast(tagF, tag, RoundMode::CAST_RINT, n);       // exact: |tag| < 2^24
    PipeBarrier<PIPE_V>();
    Muls(tagF, tagF, entries, n);
    PipeBarrier<PIPE_V>();
    Add(tagF, tagF, entryF, n);
    return DropAnyAtLeast(top, tagF, keep.ReinterpretCast<float>(), n, limit);
}
// After GhostDropTest found one: ghost &= keep, keep = 0 where the named position is >= limit.
__aicore__ inline void GhostDropApply(const LocalTensor<int32_t>& ghost, const LocalTensor<int32_t>& tag,
                                      const LocalTensor<int32_t>& keep, const LocalTensor<int32_t>& zero,
                                      const LocalTensor<uint8_t>& drop, uint32_t n, float limit) {
    const LocalTensor<float> keepF = keep.ReinterpretCast<float>();
    avsg::CompareScalarAll(drop, tag.ReinterpretCast<float>(), limit, CMPMODE::GE, n);
    PipeBarrier<PIPE_V>();
    Select(keepF, drop, zero.ReinterpretCast<float>(), -1.0f, SELMODE::VSEL_TENSOR_SCALAR_MODE, n);   // drop ? 0 : -1
    PipeBarrier<PIPE_V>();
    Cast(keep, keepF, RoundMode::CAST_RINT, n);
    PipeBarrier<PIPE_V>();
    DropClear(ghost, keep, n);
}

}  // namespace avsg_kernel
