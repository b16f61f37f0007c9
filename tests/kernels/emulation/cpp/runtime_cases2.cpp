// Run-time cases, part 2 (linked into the same binary as runtime_cases.cpp; split only so the
// two halves compile in parallel). One binary, one case per invocation:
//   ./runtime_cases <case>     (see test_harness.h for exit codes)
// "bad_*" cases violate a rule and must end with EMUERROR; the others are controls that
// must print OK (their numeric checks run in C++ with CHECK).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <thread>
#include <vector>

#include "test_harness.h"

using namespace AscendC;

// ---------------------------------------------------------------- DataCopyPad (card §4, §8.12)
CASE_UNSYNCED(datacopypad_ragged_ok) {
    // 3 rows of 5 int32 (20 B) with a 12 B GM gap; right padding of 3 elements = -1.
    std::vector<int32_t> in(24), out(15, 0);
    for (int i = 0; i < 24; ++i) in[i] = 100 + i;
    run1([&] {
        TPipe pipe;
        TQueBind<TPosition::VECIN, TPosition::VECOUT, 1> q;
        pipe.InitBuffer(q, 1, 1024);
        GlobalTensor<int32_t> gi, go;
        gi.SetGlobalBuffer(in.data(), 24);
        go.SetGlobalBuffer(out.data(), 15);
        auto t = q.AllocTensor<int32_t>();
        DataCopyPad(t, gi, DataCopyExtParams(3, 20, 12, 0, 0), DataCopyPadExtParams<int32_t>(true, 0, 3, -1));
        // row pitch: roundup32(20 + 12) = 32 B = 8 elements
        for (int r = 0; r < 3; ++r) {
            for (int c = 0; c < 5; ++c) CHECK_EQ(t.GetValue(8 * r + c), 100 + 8 * r + c);
            for (int c = 5; c < 8; ++c) CHECK_EQ(t.GetValue(8 * r + c), -1);
        }
        q.EnQue(t);
        auto u = q.DeQue<int32_t>();
        DataCopyPad(go, u, DataCopyExtParams(3, 20, 0, 0, 0));  // UB rows 32 B apart, GM packed
        q.FreeTensor(u);
    });
    for (int r = 0; r < 3; ++r)
        for (int c = 0; c < 5; ++c) CHECK_EQ(out[5 * r + c], 100 + 8 * r + c);
}
CASE_UNSYNCED(datacopypad_undefined_padding_poisoned) {
    std::vector<int32_t> in(8, 7);
    run1([&] {
        TPipe pipe;
        TBuf<TPosition::VECCALC> b;
        pipe.InitBuffer(b, 256);
        auto t = b.Get<int32_t>();
        Duplicate(t, 0, 64);
        GlobalTensor<int32_t> gi;
        gi.SetGlobalBuffer(in.data(), 8);
        DataCopyPad(t, gi, DataCopyExtParams(1, 12, 0, 0, 0), DataCopyPadExtParams<int32_t>(false, 0, 0, 0));
        CHECK_EQ(t.GetValue(2), 7);
        for (int c = 3; c < 8; ++c) CHECK_EQ((uint32_t)t.GetValue(c), poison32());
        CHECK_EQ(t.GetValue(8), 0);  // beyond the 32 B row: untouched
        // left padding without isPad: undefined -> poisoned
        DataCopyPad(t, gi, DataCopyExtParams(1, 8, 0, 0, 0), DataCopyPadExtParams<int32_t>(false, 2, 0, 0));
        CHECK_EQ((uint32_t)t.GetValue(0), poison32());
        CHECK_EQ(t.GetValue(2), 7);
        CHECK_EQ(t.GetValue(3), 7);
    });
}
CASE(bad_datacopypad_blockcount) {
    std::vector<int8_t> in(8192);
    run1([&] {
        TPipe pipe;
        TBuf<TPosition::VECCALC> b;
        pipe.InitBuffer(b, 180 * 1024);
        GlobalTensor<int8_t> gi;
        gi.SetGlobalBuffer(in.data(), 8192);
        DataCopyPad(b.Get<int8_t>(), gi, DataCopyExtParams(4096, 1, 0, 0, 0), DataCopyPadExtParams<int8_t>());
    });
}
CASE(bad_datacopypad_blocklen) {
    run1([] {
        TPipe pipe;
        TBuf<TPosition::VECCALC> b;
        pipe.InitBuffer(b, 1024);
        std::vector<int8_t> out(16);
        GlobalTensor<int8_t> go;
        go.SetGlobalBuffer(out.data());
        DataCopyPad(go, b.Get<int8_t>(), DataCopyExtParams(1, 2097152, 0, 0, 0));
    });
}
CASE(bad_datacopypad_ub_last_block_unpadded) {
    // UB->GM reads every block padded to 32 B on the UB side, the last one included (the SDK's
    // extent check): 2 blocks of 12 B need 64 B of UB, not 32 + 12
    run1([] {
        TPipe pipe;
        TBuf<TPosition::VECCALC> b;
        pipe.InitBuffer(b, 64);
        std::vector<int8_t> out(64);
        GlobalTensor<int8_t> go;
        go.SetGlobalBuffer(out.data(), 64);
        DataCopyPad(go, b.Get<int8_t>(48), DataCopyExtParams(2, 12, 0, 0, 0));
    });
}
CASE(bad_datacopypad_pad_over_32B) {
    std::vector<int32_t> in(8, 7);
    run1([&] {
        TPipe pipe;
        TBuf<TPosition::VECCALC> b;
        pipe.InitBuffer(b, 256);
        GlobalTensor<int32_t> gi;
        gi.SetGlobalBuffer(in.data(), 8);
        DataCopyPad(b.Get<int32_t>(), gi, DataCopyExtParams(1, 4, 0, 0, 0), DataCopyPadExtParams<int32_t>(true, 0, 9, 0));
    });
}
CASE(bad_datacopypad_int64_padvalue) {
    std::vector<int64_t> in(8, 7);
    run1([&] {
        TPipe pipe;
        TBuf<TPosition::VECCALC> b;
        pipe.InitBuffer(b, 256);
        GlobalTensor<int64_t> gi;
        gi.SetGlobalBuffer(in.data(), 8);
        DataCopyPad(b.Get<int64_t>(), gi, DataCopyExtParams(1, 8, 0, 0, 0), DataCopyPadExtParams<int64_t>(true, 0, 1, 5));
    });
}
CASE(bad_datacopypad_blocklen_not_multiple) {
    std::vector<int32_t> in(8, 7);
    run1([&] {
        TPipe pipe;
        TBuf<TPosition::VECCALC> b;
        pipe.InitBuffer(b, 256);
        GlobalTensor<int32_t> gi;
        gi.SetGlobalBuffer(in.data(), 8);
        DataCopyPad(b.Get<int32_t>(), gi, DataCopyExtParams(1, 6, 0, 0, 0), DataCopyPadExtParams<int32_t>());
    });
}

// ---------------------------------------------------------------- poisoning (card §9)
CASE_UNSYNCED(alloc_tensor_poisoned) {
    run1([] {
        TPipe pipe;
        TQue<TPosition::VECOUT, 1> q;
        TBuf<TPosition::VECCALC> tb;
        pipe.InitBuffer(q, 2, 64);
        pipe.InitBuffer(tb, 64);
        auto t = q.AllocTensor<int32_t>();
        for (int i = 0; i < 16; ++i) CHECK_EQ((uint32_t)t.GetValue(i), poison32());
        CHECK_EQ((uint32_t)tb.Get<int32_t>().GetValue(3), poison32());
        Duplicate(t, 1, 16);
        q.FreeTensor(t);
        auto t2 = q.AllocTensor<int32_t>();  // second buffer
        auto t3 = t2;
        q.FreeTensor(t2);
        auto t4 = q.AllocTensor<int32_t>();  // first buffer again: re-poisoned
        CHECK_EQ((uint32_t)t4.GetValue(0), poison32());
        (void)t3;
        q.FreeTensor(t4);
    });
}

// ---------------------------------------------------------------- queues
CASE(bad_deque_empty) {
    run1([] {
        TPipe pipe;
        TQue<TPosition::VECIN, 1> q;
        pipe.InitBuffer(q, 1, 64);
        (void)q.DeQue<int32_t>();
    });
}
CASE(bad_alloc_without_free) {
    run1([] {
        TPipe pipe;
        TQue<TPosition::VECIN, 1> q;
        pipe.InitBuffer(q, 1, 64);
        (void)q.AllocTensor<int32_t>();
        (void)q.AllocTensor<int32_t>();
    });
}

// ---------------------------------------------------------------- shifts, casts, arithmetic
CASE_UNSYNCED(shift_and_arith_ok) {
    run1([] {
        TPipe pipe;
        TBuf<TPosition::VECCALC> b;
        pipe.InitBuffer(b, 4096);
        auto x = b.Get<int32_t>(64);
        auto y = b.GetWithOffset<int32_t>(64, 256);
        auto u = b.GetWithOffset<uint32_t>(64, 512);
        for (int i = 0; i < 64; ++i) x.SetValue(i, -i);
        ShiftRight(y, x, 1, 64);  // arithmetic
        CHECK_EQ(y.GetValue(3), -2);
        ShiftLeft(y, x, 4, 64);
        CHECK_EQ(y.GetValue(3), -48);
        for (int i = 0; i < 64; ++i) u.SetValue(i, 0x80000000u + (uint32_t)i);
        ShiftRight(u, u, 31u, 64);  // logical
        CHECK_EQ(u.GetValue(5), 1u);
        Muls(y, x, 0x10000, 64);
        Muls(y, y, 0x10000, 64);  // wraps (⚠️ undocumented on hardware)
        CHECK_EQ(y.GetValue(1), 0);
        Maxs(y, x, -10, 64);
        CHECK_EQ(y.GetValue(20), -10);
        Mins(y, x, -10, 64);
        CHECK_EQ(y.GetValue(5), -10);
        Sub(y, x, x, 64);
        CHECK_EQ(y.GetValue(9), 0);
        Add(y, x, x, 64);
        CHECK_EQ(y.GetValue(9), -18);
        Max(y, x, y, 64);
        CHECK_EQ(y.GetValue(9), -9);
        Min(y, x, y, 64);
        Mul(y, x, x, 64);
        CHECK_EQ(y.GetValue(9), 81);
        auto h = x.ReinterpretCast<uint16_t>();
        auto g = y.ReinterpretCast<uint16_t>();
        Duplicate(g, (uint16_t)0x00FF, 128);
        And(g, h, g, 128);
        Or(g, g, g, 128);
        Not(g, g, 128);
        CHECK_EQ((uint32_t)g.GetValue(2), 0xFF00u);  // low half of x[1] = -1 is 0xFFFF; ~(0xFFFF & 0x00FF)
        CreateVecIndex(x, 5, 64);
        CHECK_EQ(x.GetValue(63), 68);
    });
}
CASE(bad_shift_range) {
    run1([] {
        TPipe pipe;
        TBuf<TPosition::VECCALC> b;
        pipe.InitBuffer(b, 256);
        auto x = b.Get<int32_t>(64);
        ShiftLeft(x, x, 33, 64);
    });
}
CASE(bad_partial_overlap) {
    run1([] {
        TPipe pipe;
        TBuf<TPosition::VECCALC> b;
        pipe.InitBuffer(b, 1024);
        auto x = b.Get<int16_t>();
        Adds(x[16], x, (int16_t)1, 128);  // int16 has no overlap exception
    });
}
CASE(bad_select_partial_overlap) {
    run1([] {
        TPipe pipe;
        TBuf<TPosition::VECCALC> b;
        pipe.InitBuffer(b, 2048);
        auto f = b.Get<float>();
        auto mask = b.GetWithOffset<uint16_t>(16, 1024);
        Duplicate(mask, (uint16_t)0xFFFF, 16);
        PipeBarrier<PIPE_V>();
        Select(f[8], mask, f, 0.0f, SELMODE::VSEL_TENSOR_SCALAR_MODE, 64);  // dst starts 32 B into src0
    });
}
// A2's count-form compares issue under the mask the last GatherMask (or Gather with a tail) left
CASE(bad_compare_after_gathermask) {
    run1([] {
        TPipe pipe;
        TBuf<TPosition::VECCALC> b;
        pipe.InitBuffer(b, 4096);
        auto x = b.Get<float>(64);
        auto kept = b.GetWithOffset<float>(64, 256);
        auto pattern = b.GetWithOffset<uint32_t>(8, 512);
        auto bits = b.GetWithOffset<uint8_t>(32, 1024);
        Duplicate(x, 1.0f, 64);
        Duplicate(pattern, 0xFFFFFFFFu, 8);
        PipeBarrier<PIPE_V>();
        uint64_t n = 0;
        GatherMask(kept, x, pattern, true, 64, GatherMaskParams(1, 1, 8, 0), n);
        PipeBarrier<PIPE_V>();
        CompareScalar(bits, x, 0.0f, CMPMODE::GT, 64);
    });
}
CASE(bad_compare_after_gather_tail) {
    run1([] {
        TPipe pipe;
        TBuf<TPosition::VECCALC> b;
        pipe.InitBuffer(b, 4096);
        auto x = b.Get<float>(64);
        auto g = b.GetWithOffset<float>(64, 256);
        auto off = b.GetWithOffset<uint32_t>(64, 512);
        auto bits = b.GetWithOffset<uint8_t>(32, 1024);
        Duplicate(x, 1.0f, 64);
        Duplicate(off, 0u, 64);
        PipeBarrier<PIPE_V>();
        Gather(g, x, off, 0u, 40);   // 40 of 64 lanes: a tail repeat
        PipeBarrier<PIPE_V>();
        Compare(bits, x, g, CMPMODE::EQ, 64);
    });
}
CASE(compare_after_reset_mask_ok) {
    run1([] {
        TPipe pipe;
        TBuf<TPosition::VECCALC> b;
        pipe.InitBuffer(b, 4096);
        auto x = b.Get<float>(64);
        auto kept = b.GetWithOffset<float>(64, 256);
        auto pattern = b.GetWithOffset<uint32_t>(8, 512);
        auto bits = b.GetWithOffset<uint8_t>(32, 1024);
        auto off = b.GetWithOffset<uint32_t>(64, 1536);
        Duplicate(x, 1.0f, 64);
        Duplicate(pattern, 0xFFFFFFFFu, 8);
        Duplicate(off, 0u, 64);
        PipeBarrier<PIPE_V>();
        uint64_t n = 0;
        GatherMask(kept, x, pattern, true, 64, GatherMaskParams(1, 1, 8, 0), n);
        PipeBarrier<PIPE_V>();
        ResetMask();
        CompareScalar(bits, x, 0.0f, CMPMODE::GT, 64);
        PipeBarrier<PIPE_V>();
        Gather(kept, x, off, 0u, 64);   // whole repeats: the mask stays full
        PipeBarrier<PIPE_V>();
        Compare(bits, x, kept, CMPMODE::EQ, 64);
    });
}
// The other A2 clobbers: CreateVecIndex past 32 B, ReduceMax / ReduceMin, Extract, and a 32-bit
// Gather of whole repeats before a 16-bit compare (it leaves the high 64 lanes off)
CASE(bad_compare_after_createvecindex) {
    run1([] {
        TPipe pipe;
        TBuf<TPosition::VECCALC> b;
        pipe.InitBuffer(b, 4096);
        auto x = b.Get<float>(64);
        auto bits = b.GetWithOffset<uint8_t>(32, 1024);
        CreateVecIndex(x, 0.0f, 64);   // its last Adds sets 8 lanes
        PipeBarrier<PIPE_V>();
        CompareScalar(bits, x, 3.0f, CMPMODE::GT, 64);
    });
}
CASE(bad_compare_after_reducemax) {
    run1([] {
        TPipe pipe;
        TBuf<TPosition::VECCALC> b;
        pipe.InitBuffer(b, 4096);
        auto x = b.Get<float>(128);
        auto d = b.GetWithOffset<float>(8, 512);
        auto tmp = b.GetWithOffset<float>(64, 1024);
        auto bits = b.GetWithOffset<uint8_t>(32, 1536);
        Duplicate(x, 1.0f, 128);
        PipeBarrier<PIPE_V>();
        ReduceMax(d, x, tmp, 72);   // a tail: the last step merges 2 lanes
        PipeBarrier<PIPE_V>();
        CompareScalar(bits, x, 0.0f, CMPMODE::GT, 128);
    });
}
CASE(bad_compare_after_extract) {
    run1([] {
        TPipe pipe;
        TBuf<TPosition::VECCALC> b;
        pipe.InitBuffer(b, 8192);
        const uint32_t pad = static_cast<uint32_t>((256 - b.Get<uint8_t>().GetPhyAddr() % 256) % 256);
        auto sc = b.GetWithOffset<float>(64, pad + 2048);
        auto ix = b.GetWithOffset<uint32_t>(64, pad + 2304);
        auto sd = b.GetWithOffset<float>(128, pad + 2560);
        auto st = b.GetWithOffset<float>(128, pad + 3072);
        auto ov = b.GetWithOffset<float>(64, pad + 3584);
        auto oi = b.GetWithOffset<uint32_t>(64, pad + 3840);
        auto bits = b.GetWithOffset<uint8_t>(32, pad + 4096);
        Duplicate(sc, 1.0f, 64);
        CreateVecIndex(ix.ReinterpretCast<int32_t>(), 0, 64);
        PipeBarrier<PIPE_V>();
        ResetMask();   // CreateVecIndex's mask: this case is about Extract's
        Sort<float, true>(sd, sc, ix, st, 2);
        PipeBarrier<PIPE_V>();
        Extract(ov, oi, sd, 2);   // GatherMasks in normal mode: the mask register stays (0, 0)
        PipeBarrier<PIPE_V>();
        CompareScalar(bits, ov, 0.0f, CMPMODE::GT, 64);
    });
}
CASE(bad_half_compare_after_b32_gather) {
    run1([] {
        TPipe pipe;
        TBuf<TPosition::VECCALC> b;
        pipe.InitBuffer(b, 4096);
        auto x = b.Get<float>(64);
        auto g = b.GetWithOffset<float>(64, 256);
        auto off = b.GetWithOffset<uint32_t>(64, 512);
        auto h = b.GetWithOffset<half>(128, 1024);
        auto bits = b.GetWithOffset<uint8_t>(32, 1536);
        Duplicate(x, 1.0f, 64);
        Duplicate(off, 0u, 64);
        Duplicate(h, half(1.0f), 128);
        PipeBarrier<PIPE_V>();
        Gather(g, x, off, 0u, 64);   // one whole 32-bit repeat: SetMask<float>(64) = (0, all)
        PipeBarrier<PIPE_V>();
        CompareScalar(bits, h, half(0.0f), CMPMODE::GT, 128);
    });
}
// Each clobber above followed by ResetMask; and where the headers leave the mask full for the
// compare's width, no reset is needed: CreateVecIndex within 32 B (no vector instruction), a
// ReduceMax of exactly one half repeat, a 16-bit Gather of whole repeats.
CASE(compare_after_clobbers_reset_ok) {
    run1([] {
        TPipe pipe;
        TBuf<TPosition::VECCALC> b;
        pipe.InitBuffer(b, 8192);
        const uint32_t pad = static_cast<uint32_t>((256 - b.Get<uint8_t>().GetPhyAddr() % 256) % 256);
        auto x = b.GetWithOffset<float>(128, pad);
        auto d = b.GetWithOffset<float>(8, pad + 512);
        auto tmp = b.GetWithOffset<float>(64, pad + 768);
        auto bits = b.GetWithOffset<uint8_t>(32, pad + 1024);
        auto sc = b.GetWithOffset<float>(64, pad + 2048);
        auto ix = b.GetWithOffset<uint32_t>(64, pad + 2304);
        auto sd = b.GetWithOffset<float>(128, pad + 2560);
        auto st = b.GetWithOffset<float>(128, pad + 3072);
        auto ov = b.GetWithOffset<float>(64, pad + 3584);
        auto oi = b.GetWithOffset<uint32_t>(64, pad + 3840);
        auto h = b.GetWithOffset<half>(128, pad + 4096);
        auto hd = b.GetWithOffset<half>(16, pad + 4352);
        auto ht = b.GetWithOffset<half>(128, pad + 4608);
        auto off = b.GetWithOffset<uint32_t>(128, pad + 4864);
        auto hg = b.GetWithOffset<half>(128, pad + 5376);
        auto y = b.GetWithOffset<float>(64, pad + 5632);
        CreateVecIndex(x, 0.0f, 128);
        Duplicate(sc, 1.0f, 64);
        Duplicate(h, half(1.0f), 128);
        Duplicate(off, 0u, 128);
        PipeBarrier<PIPE_V>();
        ResetMask();
        CompareScalar(bits, x, 3.0f, CMPMODE::GT, 64);
        ReduceMax(d, x, tmp, 72);
        PipeBarrier<PIPE_V>();
        ResetMask();
        CompareScalar(bits, x, 0.0f, CMPMODE::GT, 64);
        CreateVecIndex(ix.ReinterpretCast<int32_t>(), 0, 64);
        PipeBarrier<PIPE_V>();
        ResetMask();
        Sort<float, true>(sd, sc, ix, st, 2);
        PipeBarrier<PIPE_V>();
        Extract(ov, oi, sd, 2);
        PipeBarrier<PIPE_V>();
        ResetMask();
        CompareScalar(bits, ov, 0.0f, CMPMODE::GT, 64);
        PipeBarrier<PIPE_V>();
        CreateVecIndex(y, 0.0f, 8);   // scalar writes only
        CompareScalar(bits, y, 3.0f, CMPMODE::GT, 64);
        ReduceMax(hd, h, ht, 128);   // one whole half repeat
        PipeBarrier<PIPE_V>();
        CompareScalar(bits, h, half(0.0f), CMPMODE::GT, 128);
        PipeBarrier<PIPE_V>();
        Gather(hg, h, off, 0u, 128);   // one whole 16-bit repeat
        PipeBarrier<PIPE_V>();
        CompareScalar(bits, hg, half(0.0f), CMPMODE::GT, 128);
    });
}
CASE(bad_gathermask_partial_overlap) {
    run1([] {
        TPipe pipe;
        TBuf<TPosition::VECCALC> b;
        pipe.InitBuffer(b, 2048);
        auto x = b.Get<int32_t>();
        uint64_t kept = 0;
        GatherMask(x[8], x, (uint8_t)7, false, 0, GatherMaskParams{1, 1, 8, 0}, kept);  // keep all, shifted dst
    });
}
CASE_UNSYNCED(cast_ok) {
    run1([] {
        TPipe pipe;
        TBuf<TPosition::VECCALC> b;
        pipe.InitBuffer(b, 4096);
        auto f = b.Get<float>(8);
        auto i = b.GetWithOffset<int32_t>(8, 256);
        auto l = b.GetWithOffset<int64_t>(8, 512);
        const float vals[8] = {2.5f, -2.5f, 3.5f, 1e10f, -1e10f, 0.49f, -0.51f, 7.0f};
        for (int k = 0; k < 8; ++k) f.SetValue(k, vals[k]);
        Cast(i, f, RoundMode::CAST_RINT, 8);
        CHECK_EQ(i.GetValue(0), 2);
        CHECK_EQ(i.GetValue(1), -2);
        CHECK_EQ(i.GetValue(2), 4);
        CHECK_EQ(i.GetValue(3), 2147483647);  // saturates
        CHECK_EQ(i.GetValue(4), (int32_t)-2147483648LL);
        Cast(i, f, RoundMode::CAST_ROUND, 8);
        CHECK_EQ(i.GetValue(0), 3);
        CHECK_EQ(i.GetValue(1), -3);
        Cast(i, f, RoundMode::CAST_FLOOR, 8);
        CHECK_EQ(i.GetValue(6), -1);
        Cast(i, f, RoundMode::CAST_TRUNC, 8);
        CHECK_EQ(i.GetValue(6), 0);
        i.SetValue(0, 16777217);
        Cast(f, i, RoundMode::CAST_NONE, 8);
        CHECK(f.GetValue(0) == 16777216.0f);
        Cast(l, i, RoundMode::CAST_NONE, 8);
        CHECK_EQ(l.GetValue(0), (int64_t)16777217);
        l.SetValue(1, (int64_t)1 << 31);
        l.SetValue(2, -((int64_t)1 << 40));
        Cast(i, l, RoundMode::CAST_NONE, 8);
        CHECK_EQ(i.GetValue(1), 2147483647);
        CHECK_EQ(i.GetValue(2), (int32_t)-2147483648LL);
        l.SetValue(0, 16777217);
        Cast(f, l, RoundMode::CAST_CEIL, 8);
        CHECK(f.GetValue(0) == 16777218.0f);
        auto h = b.GetWithOffset<int16_t>(16, 1024);   // float <-> int16 (vconv_f322s16r, vconv_s162f32)
        for (int k = 0; k < 8; ++k) f.SetValue(k, vals[k]);
        Cast(h, f, RoundMode::CAST_RINT, 8);
        CHECK_EQ(h.GetValue(0), 2);
        CHECK_EQ(h.GetValue(3), 32767);   // saturates: assumed, as for int32 above (no A2 header states it;
                                          // the plan's values stay in [-1, 32767])
        CHECK_EQ(h.GetValue(4), -32768);
        CHECK_EQ(h.GetValue(6), -1);
        Cast(f, h, RoundMode::CAST_NONE, 8);
        CHECK(f.GetValue(4) == -32768.0f);
        CHECK(f.GetValue(7) == 7.0f);
        auto hh = b.GetWithOffset<half>(16, 2048);   // int16 -> half (vconv_s162f16): exact to 2048
        Cast(hh, h, RoundMode::CAST_NONE, 8);
        CHECK(static_cast<float>(hh.GetValue(0)) == 2.0f);
        CHECK(static_cast<float>(hh.GetValue(6)) == -1.0f);
        CHECK(static_cast<float>(hh.GetValue(7)) == 7.0f);
        auto back = b.GetWithOffset<int32_t>(16, 2560);   // half -> int32 (vconv_f162s32r)
        Cast(back, hh, RoundMode::CAST_RINT, 8);
        CHECK_EQ(back.GetValue(0), 2);
        CHECK_EQ(back.GetValue(6), -1);
        CHECK_EQ(back.GetValue(7), 7);
        const float halves[8] = {1.25f, -1.25f, 1.75f, 2.5f, -2.5f, 0.5f, -0.5f, 3.0f};   // exact in half
        for (int k = 0; k < 8; ++k) f.SetValue(k, halves[k]);
        Cast(hh, f, RoundMode::CAST_NONE, 8);
        Cast(back, hh, RoundMode::CAST_FLOOR, 8);
        CHECK_EQ(back.GetValue(0), 1);
        CHECK_EQ(back.GetValue(1), -2);
        Cast(back, hh, RoundMode::CAST_RINT, 8);   // ties to even
        CHECK_EQ(back.GetValue(2), 2);
        CHECK_EQ(back.GetValue(3), 2);
        CHECK_EQ(back.GetValue(4), -2);
        CHECK_EQ(back.GetValue(7), 3);
    });
}
CASE(bad_cast_mode_half_int32) {
    run1([] {
        TPipe pipe;
        TBuf<TPosition::VECCALC> b;
        pipe.InitBuffer(b, 4096);
        auto h = b.Get<half>(16);
        auto i = b.GetWithOffset<int32_t>(16, 256);
        Duplicate(h, static_cast<half>(1.0f), 16);
        Cast(i, h, RoundMode::CAST_NONE, 16);  // A2: f162s32 has r/f/c/a/z forms only
    });
}
CASE(bad_cast_mode) {
    run1([] {
        TPipe pipe;
        TBuf<TPosition::VECCALC> b;
        pipe.InitBuffer(b, 4096);
        auto f = b.Get<float>(8);
        auto i = b.GetWithOffset<int32_t>(8, 256);
        Cast(i, f, RoundMode::CAST_NONE, 8);  // float->int32 needs an explicit rounding mode
    });
}

// ---------------------------------------------------------------- reduce / sort
CASE_UNSYNCED(reduce_sort_ok) {
    run1([] {
        TPipe pipe;
        TBuf<TPosition::VECCALC> b;
        pipe.InitBuffer(b, 16384);
        auto x = b.Get<float>(128);
        auto d = b.GetWithOffset<float>(8, 512);
        auto tmp = b.GetWithOffset<float>(64, 1024);
        for (int k = 0; k < 128; ++k) x.SetValue(k, (float)((k * 37) % 128));
        x.SetValue(100, 127.0f);  // tie with k where (k*37)%128==127 -> smaller index wins
        int first127 = -1;
        for (int k = 0; k < 128; ++k)
            if (x.GetValue(k) == 127.0f) { first127 = k; break; }
        ReduceMax(d, x, tmp, 128, true);
        CHECK(d.GetValue(0) == 127.0f);
        uint32_t idx;
        float v = d.GetValue(1);
        std::memcpy(&idx, &v, 4);
        CHECK_EQ(idx, (uint32_t)first127);
        ReduceMin(d, x, tmp, 128, false);
        CHECK(d.GetValue(0) == 0.0f);
        for (int k = 0; k < 128; ++k) x.SetValue(k, 1.0f);
        ReduceSum(d, x, tmp, 128);
        CHECK(d.GetValue(0) == 128.0f);
        // Sort<float,true> + Extract of 64 scores, operands cut at Sort32's alignment from the
        // buffer's physical address (TPipe's base is not 256 B aligned)
        const uint32_t pad = static_cast<uint32_t>((256 - b.Get<uint8_t>().GetPhyAddr() % 256) % 256);
        auto sc = b.GetWithOffset<float>(64, pad + 2048);
        auto ix = b.GetWithOffset<uint32_t>(64, pad + 2304);
        auto sd = b.GetWithOffset<float>(128, pad + 2560);
        auto st = b.GetWithOffset<float>(128, pad + 3072);
        auto ov = b.GetWithOffset<float>(64, pad + 3584);
        auto oi = b.GetWithOffset<uint32_t>(64, pad + 3840);
        for (int k = 0; k < 64; ++k) {
            sc.SetValue(k, (float)(k % 10));
            ix.SetValue(k, (uint32_t)k);
        }
        Sort<float, true>(sd, sc, ix, st, 2);
        Extract(ov, oi, sd, 2);
        CHECK(ov.GetValue(0) == 9.0f);
        CHECK_EQ(oi.GetValue(0), 9u);  // ties: lower original position first
        CHECK_EQ(oi.GetValue(1), 19u);
        CHECK(ov.GetValue(63) == 0.0f);
        CHECK_EQ(oi.GetValue(63), 60u);
        Sort32(sd, sc, ix, 2);
        Extract(ov, oi, sd, 2);
        CHECK_EQ(oi.GetValue(32), 39u);  // second repeat sorted on its own: max 9 at 39
    });
}
// Sort32 / Sort alignment (Sort32.md, A2): dst 256 B, scores and index 128 B. TPipe's first
// buffer starts at avsg_emu::tpipe_base() (32 B), so a buffer start is not enough.
CASE(bad_sort_dst_unaligned) {
    run1([] {
        TPipe pipe;
        TBuf<TPosition::VECCALC> b;
        pipe.InitBuffer(b, 4096);
        auto all = b.Get<float>();
        const uint32_t pad = static_cast<uint32_t>((256 - all.GetPhyAddr() % 256) % 256) / 4;
        auto sc = all[pad];             // 256 B aligned
        auto ix = all[pad + 32].ReinterpretCast<uint32_t>();
        auto sd = all[pad + 64 + 32];   // 128 B past a 256 B boundary
        auto st = all[pad + 256];
        Sort<float, true>(sd, sc, ix, st, 1);
    });
}
CASE(bad_sort_index_unaligned) {
    run1([] {
        TPipe pipe;
        TBuf<TPosition::VECCALC> b;
        pipe.InitBuffer(b, 4096);
        auto all = b.Get<float>();
        const uint32_t pad = static_cast<uint32_t>((256 - all.GetPhyAddr() % 256) % 256) / 4;
        auto sc = all[pad];
        auto ix = all[pad + 40].ReinterpretCast<uint32_t>();  // 160 B: 32 B but not 128 B aligned
        auto sd = all[pad + 128];
        auto st = all[pad + 256];
        Sort32(sd, sc, ix, 1);
        (void)st;
    });
}
CASE_UNSYNCED(tpipe_base_is_not_zero) {
    run1([] {
        TPipe pipe;
        TBuf<TPosition::VECCALC> b;
        pipe.InitBuffer(b, 64);
        CHECK_EQ(b.Get<uint8_t>().GetPhyAddr(), static_cast<uint64_t>(avsg_emu::tpipe_base()));
        CHECK(avsg_emu::tpipe_base() != 0);
    });
}
CASE_UNSYNCED(kernel_assert_fails) {
    run1([] {
        int rows = 3;
        ascendc_assert(rows % 2 == 0);
    });
}

CASE(bad_sort32_repeat) {
    run1([] {
        TPipe pipe;
        TBuf<TPosition::VECCALC> b;
        pipe.InitBuffer(b, 1024);
        auto x = b.Get<float>();
        Sort32(x, x, x.ReinterpretCast<uint32_t>(), 256);
    });
}

// ---------------------------------------------------------------- events and sync (card §6)
CASE(flags_ok) {
    run1([] {
        TPipe pipe;
        event_t e = static_cast<event_t>(GetTPipePtr()->FetchEventID(HardEvent::V_S));
        SetFlag<HardEvent::V_S>(e);
        WaitFlag<HardEvent::V_S>(e);
        auto id = pipe.AllocEventID<HardEvent::MTE2_V>();
        CHECK_EQ((int)id, 0);
        CHECK_EQ((int)pipe.FetchEventID(HardEvent::MTE2_V), 1);
        SetFlag<HardEvent::MTE2_V>(id);
        WaitFlag<HardEvent::MTE2_V>(id);
        pipe.ReleaseEventID<HardEvent::MTE2_V>(id);
        TQueSync<PIPE_S, PIPE_MTE3> s;
        s.SetFlag(2);
        s.WaitFlag(2);
        PipeBarrier<PIPE_ALL>();
    });
}
CASE(bad_event_id_range) {
    run1([] { SetFlag<HardEvent::MTE2_V>(8); });
}
CASE(bad_double_setflag) {
    run1([] {
        SetFlag<HardEvent::S_MTE3>(1);
        SetFlag<HardEvent::S_MTE3>(1);
    });
}
CASE(bad_wait_without_set) {
    run1([] { WaitFlag<HardEvent::MTE3_MTE2>(0); });
}
CASE(bad_set_without_wait_at_end) {
    run1([] { SetFlag<HardEvent::V_MTE3>(3); });
}

// ---------------------------------------------------------------- TPipe limits (card §3)
CASE(bad_two_live_tpipes) {
    run1([] {
        TPipe a;
        TPipe b;
    });
}
CASE(tpipe_destroy_then_new_ok) {
    run1([] {
        TPipe a;
        TBuf<TPosition::VECCALC> x;
        a.InitBuffer(x, 180 * 1024);
        a.Destroy();
        TPipe b;
        TBuf<TPosition::VECCALC> y;
        b.InitBuffer(y, 180 * 1024);
        b.Reset();
        b.InitBuffer(y, 180 * 1024);
    });
}
CASE(bad_tbuf_after_reset) {
    run1([] {
        TPipe a;
        TBuf<TPosition::VECCALC> x;
        a.InitBuffer(x, 1024);
        a.Reset();
        (void)x.Get<int32_t>();
    });
}
CASE(bad_65_buffers) {
    run1([] {
        TPipe pipe;
        static TBuf<TPosition::VECCALC> bufs[65];
        for (int i = 0; i < 65; ++i) pipe.InitBuffer(bufs[i], 32);
    });
}
CASE(buffers_64_ok) {
    run1([] {
        TPipe pipe;
        static TBuf<TPosition::VECCALC> bufs[64];
        for (int i = 0; i < 64; ++i) pipe.InitBuffer(bufs[i], 32);
    });
}
CASE(bad_9_queue_buffers_one_position) {
    run1([] {
        TPipe pipe;
        TQue<TPosition::VECIN, 1> q[5];
        for (int i = 0; i < 5; ++i) pipe.InitBuffer(q[i], 2, 64);  // 10 VECIN buffers
    });
}
CASE(queue_buffers_8_per_position_ok) {
    run1([] {
        TPipe pipe;
        TQue<TPosition::VECIN, 1> qi[4];
        TQue<TPosition::VECOUT, 1> qo[4];
        for (int i = 0; i < 4; ++i) pipe.InitBuffer(qi[i], 2, 64);
        for (int i = 0; i < 4; ++i) pipe.InitBuffer(qo[i], 2, 64);
    });
}

// ---------------------------------------------------------------- launch / blocks
CASE(bad_blockdim_over_core_count) {
    avsg_emu::set_core_count(40);
    avsg_emu::launch(41, [] {});
}
CASE(blockdim_core_count_ok) {
    avsg_emu::set_core_count(48);
    std::vector<int64_t> seen(48, -1);
    avsg_emu::launch(48, [&] {
        seen[GetBlockIdx()] = GetBlockNum();
    });
    for (auto s : seen) CHECK_EQ(s, (int64_t)48);
    avsg_emu::set_core_count(40);
}
CASE(bad_outside_launch) {
    (void)GetBlockIdx();
}
CASE(aclrt_launch_ok) {
    std::vector<int32_t> out(8, 0);
    struct K {
        static void kernel(GM_ADDR o, int32_t v) {
            GlobalTensor<int32_t> g;
            g.SetGlobalBuffer((__gm__ int32_t*)o, 8);
            g.SetValue(GetBlockIdx(), v + (int32_t)GetBlockIdx());
        }
    };
    ACLRT_LAUNCH_KERNEL(K::kernel)(8, nullptr, (void*)out.data(), 100);
    for (int b = 0; b < 8; ++b) CHECK_EQ(out[b], 100 + b);
    AVSG_EMU_LAUNCH(K::kernel, 4, (GM_ADDR)out.data(), 7);
    CHECK_EQ(out[3], 10);
}
// Block 0 writes GM before the barrier (late, after a sleep); block 1 reads it after.
CASE(syncall_ordering_ok) {
    for (int round = 0; round < 3; ++round) {
        std::vector<int32_t> gm(64, 0), seen(8, -1);
        avsg_emu::launch(4, [&] {
            GlobalTensor<int32_t> g;
            g.SetGlobalBuffer(gm.data(), 64);
            if (GetBlockIdx() == 0) {
                std::this_thread::sleep_for(std::chrono::milliseconds(20));
                g.SetValue(0, 42 + round);
                DataCacheCleanAndInvalid<int32_t, CacheLine::SINGLE_CACHE_LINE, DcciDst::CACHELINE_OUT>(g);
            }
            SyncAll();
            DataCacheCleanAndInvalid<int32_t, CacheLine::SINGLE_CACHE_LINE, DcciDst::CACHELINE_OUT>(g);
            seen[GetBlockIdx()] = g.GetValue(0);
            SyncAll();
        });
        for (int b = 0; b < 4; ++b) CHECK_EQ(seen[b], 42 + round);
    }
    auto c = avsg_emu::last_launch_counters();
    CHECK_EQ(c.size(), (size_t)4);
    CHECK_EQ(c[1].sync_alls, (uint64_t)2);
}
CASE(syncall_soft_ok) {
    std::vector<int32_t> ws(8 * 4, 0), gm(4, 0), seen(4, 0);
    avsg_emu::launch(4, [&] {
        TPipe pipe;
        TBuf<TPosition::VECCALC> b;
        pipe.InitBuffer(b, 4 * 32);
        GlobalTensor<int32_t> w, g;
        w.SetGlobalBuffer(ws.data(), 32);
        g.SetGlobalBuffer(gm.data(), 4);
        g.SetValue(GetBlockIdx(), 1);
        SyncAll(w, b.Get<int32_t>());
        int s = 0;
        for (int i = 0; i < 4; ++i) s += g.GetValue(i);
        seen[GetBlockIdx()] = s;
        SyncAll(w, b.Get<int32_t>());
    });
    for (int b = 0; b < 4; ++b) CHECK_EQ(seen[b], 4);
}
CASE(bad_syncall_soft_dirty_workspace) {
    std::vector<int32_t> ws(8 * 2, 0);
    ws[8] = 3;  // not zeroed before launch
    avsg_emu::launch(2, [&] {
        TPipe pipe;
        TBuf<TPosition::VECCALC> b;
        pipe.InitBuffer(b, 64);
        GlobalTensor<int32_t> w;
        w.SetGlobalBuffer(ws.data(), 16);
        SyncAll(w, b.Get<int32_t>());
    });
}
// Block 1 fails before SyncAll; block 0 must not deadlock, and the original error wins.
CASE(bad_block_fails_before_syncall) {
    avsg_emu::launch(3, [&] {
        if (GetBlockIdx() == 1) {
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
            SetFlag<HardEvent::MTE2_V>(9);
        }
        SyncAll();
    });
}
CASE(bad_unequal_syncall_counts) {
    avsg_emu::launch(2, [&] {
        if (GetBlockIdx() == 0) SyncAll();
    });
}

// ---------------------------------------------------------------- DMA atomics
CASE_UNSYNCED(atomic_add_ok) {
    std::vector<float> gm(8, 1.0f);
    avsg_emu::launch(4, [&] {
        TPipe pipe;
        TBuf<TPosition::VECCALC> b;
        pipe.InitBuffer(b, 32);
        auto t = b.Get<float>();
        Duplicate(t, 0.5f, 8);
        GlobalTensor<float> g;
        g.SetGlobalBuffer(gm.data(), 8);
        SetAtomicAdd<float>();
        DataCopy(g, t, 8);
        DisableDmaAtomic();
    });
    for (float v : gm) CHECK(v == 3.0f);
}

// ---------------------------------------------------------------- instrumentation
CASE_UNSYNCED(counters_ok) {
    std::vector<int32_t> in(256, 1);
    alignas(64) static int32_t out[2 * 256];   // a 1 KB region per block: no shared granule
    avsg_emu::launch(2, [&] {
        TPipe pipe;
        TBuf<TPosition::VECCALC> b;
        pipe.InitBuffer(b, 4096);
        GlobalTensor<int32_t> gi, go;
        gi.SetGlobalBuffer(in.data(), 256);
        go.SetGlobalBuffer(out + GetBlockIdx() * 256, 256);
        auto t = b.Get<int32_t>(256);
        auto m = b.GetWithOffset<uint8_t>(32, 2048);
        DataCopy(t, gi, 256);                                                            // MTE2 1024 B
        SetFlag<HardEvent::MTE2_V>(0);
        WaitFlag<HardEvent::MTE2_V>(0);
        Adds(t, t, 1, 256);                                                              // 4 repeats
        PipeBarrier<PIPE_V>();
        Muls(t, t, 3, 100);                                                              // 2 repeats
        PipeBarrier<PIPE_V>();
        Compares(m, t, 6, CMPMODE::EQ, 128);                                             // 2 repeats
        SetFlag<HardEvent::V_S>(0);
        WaitFlag<HardEvent::V_S>(0);
        (void)t.GetValue(0);
        t.SetValue(1, 5);
        (void)gi.GetValue(0);
        SetFlag<HardEvent::S_MTE3>(0);
        WaitFlag<HardEvent::S_MTE3>(0);
        DataCopyPad(go, t, DataCopyExtParams(2, 100, 0, 0, 0));                          // MTE3 200 B
        DataCopy(go, t, 64);                                                             // MTE3 256 B
        SyncAll();
    });
    auto cs = avsg_emu::last_launch_counters();
    CHECK_EQ(cs.size(), (size_t)2);
    for (auto& c : cs) {
        CHECK_EQ(c.mte2_copies, (uint64_t)1);
        CHECK_EQ(c.mte2_bytes, (uint64_t)1024);
        CHECK_EQ(c.mte3_copies, (uint64_t)2);
        CHECK_EQ(c.mte3_bytes, (uint64_t)456);
        CHECK_EQ(c.vec_instrs, (uint64_t)3);
        CHECK_EQ(c.vec_repeats, (uint64_t)8);
        CHECK_EQ(c.vec_by_api.at("Adds").repeats, (uint64_t)4);
        CHECK_EQ(c.vec_by_api.at("Muls").instrs, (uint64_t)1);
        CHECK_EQ(c.vec_by_api.at("Compares").repeats, (uint64_t)2);
        CHECK_EQ(c.scalar_ub_reads, (uint64_t)1);
        CHECK_EQ(c.scalar_ub_writes, (uint64_t)1);
        CHECK_EQ(c.scalar_gm_reads, (uint64_t)1);
        CHECK_EQ(c.scalar_ops(), (uint64_t)3);
        CHECK_EQ(c.set_flags, (uint64_t)3);
        CHECK_EQ(c.wait_flags, (uint64_t)3);
        CHECK_EQ(c.sync_alls, (uint64_t)1);
        CHECK_EQ(c.pipe_barriers, (uint64_t)3);  // 2 explicit + the one SyncAll starts with
    }
    auto tot = avsg_emu::total(cs);
    CHECK_EQ(tot.vec_repeats, (uint64_t)16);
    // Cost model: hand-computed from the documented constants.
    using M = avsg_emu::CostModel;
    auto e = avsg_emu::estimate(cs[0]);
    double vec = 3 * M::kVecIssueCycles + 8 * M::kVecCyclesPerRepeat;
    double mte2 = M::kMteIssueCycles + 1024 / M::kMteBytesPerCycle;
    double mte3 = 2 * M::kMteIssueCycles + 456 / M::kMteBytesPerCycle;
    double sc = 2 * M::kScalarUbCycles + M::kScalarGmCycles;
    double sy = 3 * M::kBarrierCycles + 6 * M::kFlagCycles + M::kSyncAllCycles;
    CHECK(std::fabs(e.serial_ns - (vec + mte2 + mte3 + sc + sy) / M::kClockGHz) < 1e-6);
    CHECK(std::fabs(avsg_emu::estimate_ns(cs[0]) - e.serial_ns) < 1e-9);
    CHECK(e.overlap_ns < e.serial_ns);
    CHECK(std::fabs(avsg_emu::estimate_launch_ns(cs) - e.serial_ns) < 1e-9);
}
CASE(counters_recorded_on_failure_ok) {
    bool threw = false;
    try {
        run1([] {
            TPipe pipe;
            TBuf<TPosition::VECCALC> b;
            pipe.InitBuffer(b, 1024);
            Duplicate(b.Get<int32_t>(), 1, 64);
            Duplicate(b.Get<int32_t>(), 1, 1000);
        });
    } catch (const EmuError& e) {
        threw = std::string(e.what()).find("[block 0]") != std::string::npos;
    }
    CHECK(threw);
    auto cs = avsg_emu::last_launch_counters();
    CHECK_EQ(cs.at(0).vec_instrs, (uint64_t)1);
}


// DataCopy needs GM aligned to sizeof(T) (card §0, §4).
CASE(bad_datacopy_gm_misaligned) {
    std::vector<int32_t> g(80, 1);
    run1([&] {
        TPipe pipe;
        TBuf<TPosition::VECCALC> b;
        pipe.InitBuffer(b, 256);
        GlobalTensor<int32_t> gx;
        gx.SetGlobalBuffer(reinterpret_cast<int32_t*>(reinterpret_cast<uint8_t*>(g.data()) + 2), 64);
        DataCopy(b.Get<int32_t>(), gx, 64);
    });
}

// SyncAll(soft) leaves its UB workspace to the library: poisoned after the call, whatever the
// kernel wrote there before.
CASE_UNSYNCED(syncall_soft_ub_workspace_poisoned) {
    std::vector<int32_t> ws(8 * 2, 0);
    std::vector<uint32_t> after(2 * 16, 0);
    avsg_emu::launch(2, [&] {
        TPipe pipe;
        TBuf<TPosition::VECCALC> b;
        pipe.InitBuffer(b, 2 * 32);
        GlobalTensor<int32_t> w;
        w.SetGlobalBuffer(ws.data(), 16);
        LocalTensor<int32_t> u = b.Get<int32_t>();
        for (int i = 0; i < 16; ++i) u.SetValue(i, 7);
        SyncAll(w, u);
        for (int i = 0; i < 16; ++i) after[GetBlockIdx() * 16 + i] = static_cast<uint32_t>(u.GetValue(i));
    });
    for (uint32_t v : after) CHECK_EQ(v, poison32());
}

// Sort<float, true> is Sort32 plus A2's MrgSort4 network with its tails (repeat counts that are
// not powers of 4): for every repeat count 1..16 and random scores with many ties, the result is
// the stable descending sort (ties: lower original position first), computed here independently.
CASE_UNSYNCED(sort_network_fuzz_ok) {
    run1([] {
        TPipe pipe;
        TBuf<TPosition::VECCALC> b;
        pipe.InitBuffer(b, 16 * 1024 + 256);
        const uint32_t pad = static_cast<uint32_t>((256 - b.Get<uint8_t>().GetPhyAddr() % 256) % 256);
        const uint32_t nmax = 16 * 32;
        auto sc = b.GetWithOffset<float>(nmax, pad);
        auto ix = b.GetWithOffset<uint32_t>(nmax, pad + 4 * nmax);
        auto sd = b.GetWithOffset<float>(2 * nmax, pad + 8 * nmax);
        auto st = b.GetWithOffset<float>(2 * nmax, pad + 16 * nmax);
        uint64_t rng = 0x9E3779B97F4A7C15ull;
        auto next = [&] { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; return rng; };
        for (int32_t rep = 1; rep <= 16; ++rep) {
            for (int trial = 0; trial < 6; ++trial) {
                const uint32_t n = 32u * rep;
                const uint32_t range = trial % 3 == 0 ? 4u : (trial % 3 == 1 ? 64u : 100000u);
                std::vector<float> scores(n);
                for (uint32_t k = 0; k < n; ++k) {
                    scores[k] = static_cast<float>(static_cast<int64_t>(next() % range) - range / 2);
                    sc.SetValue(k, scores[k]);
                    ix.SetValue(k, 1000u + k);
                }
                std::vector<uint32_t> want(n);
                for (uint32_t k = 0; k < n; ++k) want[k] = k;
                std::stable_sort(want.begin(), want.end(), [&](uint32_t a, uint32_t c) { return scores[a] > scores[c]; });
                Sort<float, true>(sd, sc, ix, st, rep);
                for (uint32_t k = 0; k < n; ++k) {
                    uint32_t idx;
                    float v = sd.GetValue(2 * k + 1);
                    std::memcpy(&idx, &v, 4);
                    CHECK_EQ(idx, 1000u + want[k]);
                    CHECK(sd.GetValue(2 * k) == scores[want[k]]);
                }
            }
        }
    });
}

// GM granule ownership (avsg_emu::set_granule_checks): no 32 B GM granule may be written by DMA
// from two blocks between the same two SyncAlls. Each block writes 16 B (ragged, DataCopyPad) at
// `pitch` bytes from the previous block's output; with `handover`, block 1 writes block 0's 16 B
// again after a SyncAll (ordered: the split lookup's owner patching a helper's chunk).
static void write_16B_per_block(uint32_t pitch, bool check, bool handover = false, bool sync = true) {
    struct Restore {
        bool was = avsg_emu::granule_checks();
        ~Restore() { avsg_emu::set_granule_checks(was); }
    } restore;
    avsg_emu::set_granule_checks(check);
    alignas(64) static int32_t out[64];
    avsg_emu::launch(2, [&] {
        TPipe pipe;
        TBuf<TPosition::VECCALC> b;
        pipe.InitBuffer(b, 32);
        GlobalTensor<int32_t> g;
        g.SetGlobalBuffer(out + GetBlockIdx() * (pitch / 4), 4);
        LocalTensor<int32_t> u = b.Get<int32_t>();
        Duplicate(u, static_cast<int32_t>(GetBlockIdx()), 8);
        PipeBarrier<PIPE_ALL>();
        DataCopyPad(g, u, DataCopyExtParams(1, 16, 0, 0, 0));
        DataCopyPad(g, u, DataCopyExtParams(1, 16, 0, 0, 0));   // a block may rewrite its own granule
        if (!handover) return;
        if (sync) {
            PipeBarrier<PIPE_ALL>();
            SyncAll();
        }
        GlobalTensor<int32_t> first;
        first.SetGlobalBuffer(out, 4);
        if (GetBlockIdx() == 1) DataCopyPad(first, u, DataCopyExtParams(1, 16, 0, 0, 0));
    });
}
CASE_UNSYNCED(granule_padded_pitch_ok) { write_16B_per_block(32, true); }
CASE_UNSYNCED(granule_shared_unchecked_ok) { write_16B_per_block(16, false); }
CASE_UNSYNCED(bad_granule_shared_by_two_blocks) { write_16B_per_block(16, true); }
CASE_UNSYNCED(granule_handed_over_at_sync_all_ok) { write_16B_per_block(32, true, true); }
CASE_UNSYNCED(bad_granule_rewritten_without_sync_all) { write_16B_per_block(32, true, true, false); }

// Cast float -> half has a fast path for blocks of zeros and exact half normals (a rebias of
// the bits); any other value sends the whole call to the rounding conversion. uint8 -> half is
// always a rebias. Either way every
// element must be f32_to_f16's: every half's float value in 64-lane blocks (the blocks holding
// an infinity, a NaN or a subnormal take the slow path), then single values beside 1.0f (so the
// guard alone picks the path) at the exponent and mantissa edges and at random bit patterns.
CASE_UNSYNCED(cast_float_to_half_matches_rounding_ok) {
    run1([] {
        TPipe pipe;
        TBuf<TPosition::VECCALC> b;
        pipe.InitBuffer(b, 1024);
        auto x = b.Get<float>(64);
        auto h = b.GetWithOffset<half>(64, 512);
        auto check = [&](uint32_t n) {
            Cast(h, x, RoundMode::CAST_NONE, n);
            for (uint32_t i = 0; i < n; ++i) {
                uint32_t bits;
                const float f = x.GetValue(i);
                std::memcpy(&bits, &f, 4);
                const uint16_t want = avsg_emu::numeric::f32_to_f16(f);
                if (h.GetValue(i).bits != want)
                    throw CheckFailed("float bits " + std::to_string(bits) + ": half " +
                                      std::to_string(h.GetValue(i).bits) + " != " + std::to_string(want));
            }
        };
        for (uint32_t base = 0; base < 65536; base += 64) {
            for (uint32_t i = 0; i < 64; ++i)
                x.SetValue(i, avsg_emu::numeric::f16_to_f32(static_cast<uint16_t>(base + i)));
            check(64);
        }
        auto pair = [&](uint32_t bits) {
            float f;
            std::memcpy(&f, &bits, 4);
            x.SetValue(0, f);
            x.SetValue(1, 1.0f);
            check(2);
        };
        const uint32_t exps[] = {0, 1, 101, 102, 111, 112, 113, 114, 141, 142, 143, 144, 254, 255};
        const uint32_t mants[] = {0, 1, 0xfff, 0x1000, 0x1001, 0x1fff, 0x2000, 0x3000, 0x7fe000, 0x7fefff, 0x7ff000, 0x7fffff};
        for (uint32_t sign = 0; sign < 2; ++sign)
            for (uint32_t e : exps)
                for (uint32_t m : mants) pair((sign << 31) | (e << 23) | m);
        // uint8 -> half (exact, by rebias in the emulation): every byte value
        auto u8 = b.GetWithOffset<uint8_t>(256, 768);
        for (uint32_t v = 0; v < 256; ++v) u8.SetValue(v, static_cast<uint8_t>(v));
        auto wide = b.GetWithOffset<half>(256, 0);   // over x, set again below
        Cast(wide, u8, RoundMode::CAST_NONE, 256);
        for (uint32_t v = 0; v < 256; ++v) {
            const uint16_t got = wide.GetValue(v).bits;
            if (got != avsg_emu::numeric::f32_to_f16(static_cast<float>(v)))
                throw CheckFailed("uint8 " + std::to_string(v) + ": half " + std::to_string(got));
        }
        uint64_t state = 0x9e3779b97f4a7c15ull;
        for (int i = 0; i < 200000; ++i) {
            state = state * 6364136223846793005ull + 1442695040888963407ull;
            uint32_t bits = static_cast<uint32_t>(state >> 32);
            if (i % 2) bits &= ~0x1fffu;   // half of them with the low mantissa bits clear
            pair(bits);
        }
    });
}

// ReduceMin / ReduceMax (two passes in the emulation: the best value, then its first index)
// against the one-pass scan they replace, on half and float: ties, +0 / -0, NaNs (never taken
// unless at index 0), infinities, every length up to 300 lanes.
template <class T>
static void reduce_against_scan(TBuf<TPosition::VECCALC>& b, uint64_t& state) {
    auto src = b.Get<T>(512);
    auto dst = b.GetWithOffset<T>(16, 2048);
    auto tmp = b.GetWithOffset<T>(64, 2304);
    const float pool[] = {0.0f, -0.0f, 1.0f, -1.0f, 2.0f, 3.0f, -7.0f, 65504.0f, -65504.0f,
                          INFINITY, -INFINITY, NAN, 0.5f, 5.0f};
    for (uint32_t n = 1; n <= 300; ++n)
        for (int trial = 0; trial < 6; ++trial) {
            for (uint32_t i = 0; i < n; ++i) {
                state = state * 6364136223846793005ull + 1442695040888963407ull;
                const uint32_t r = static_cast<uint32_t>(state >> 33);
                src.SetValue(i, static_cast<T>(trial < 3 ? pool[r % 14] : static_cast<float>(static_cast<int>(r % 9) - 4)));
            }
            for (int is_max = 0; is_max < 2; ++is_max) {
                uint32_t best = 0;
                for (uint32_t i = 1; i < n; ++i) {
                    const float a = static_cast<float>(src.GetValue(i)), c = static_cast<float>(src.GetValue(best));
                    if (is_max ? a > c : a < c) best = i;
                }
                if (is_max) ReduceMax(dst, src, tmp, static_cast<int32_t>(n), true);
                else ReduceMin(dst, src, tmp, static_cast<int32_t>(n), true);
                uint32_t idx = 0;
                std::memcpy(&idx, static_cast<const void*>(&dst.ptr()[1]), sizeof(T));
                const T got = dst.GetValue(0), want = src.GetValue(best);
                if (idx != best || std::memcmp(&got, &want, sizeof(T)) != 0)
                    throw CheckFailed(std::string(is_max ? "ReduceMax" : "ReduceMin") + " n=" + std::to_string(n) +
                                      ": index " + std::to_string(idx) + " != " + std::to_string(best));
            }
        }
}
CASE_UNSYNCED(reduce_minmax_matches_scan_ok) {
    run1([] {
        TPipe pipe;
        TBuf<TPosition::VECCALC> b;
        pipe.InitBuffer(b, 4096);
        uint64_t state = 12345;
        reduce_against_scan<half>(b, state);
        reduce_against_scan<float>(b, state);
    });
}

// Compare / Compares on half run on order keys of the bit patterns (+0 / -0 alike, NaN
// compares false but under NE): the mask must be the float comparison's in every mode, for
// every half against zeros, NaNs, infinities, subnormals and normals, in both forms.
CASE_UNSYNCED(compare_half_all_modes_all_patterns_ok) {
    run1([] {
        TPipe pipe;
        TBuf<TPosition::VECCALC> b;
        pipe.InitBuffer(b, 2048);
        auto x = b.Get<half>(256);
        auto ys = b.GetWithOffset<half>(256, 512);
        auto m = b.GetWithOffset<uint8_t>(32, 1024);
        const uint16_t scalars[] = {0x0000, 0x8000, 0x3c00, 0xbc00, 0x7c00, 0xfc00, 0x7e00, 0x7c01, 0xfe00,
                                    0x0001, 0x8001, 0x03ff, 0x0400, 0x7bff, 0xfbff, 0x5140, 0xd140};
        const CMPMODE modes[] = {CMPMODE::LT, CMPMODE::GT, CMPMODE::EQ, CMPMODE::LE, CMPMODE::GE, CMPMODE::NE};
        for (uint16_t yb : scalars) {
            half y;
            y.bits = yb;
            const float yf = avsg_emu::numeric::f16_to_f32(yb);
            for (uint32_t i = 0; i < 256; ++i) ys.SetValue(i, y);
            for (uint32_t base = 0; base < 65536; base += 256) {
                for (uint32_t i = 0; i < 256; ++i) {
                    half v;
                    v.bits = static_cast<uint16_t>(base + i);
                    x.SetValue(i, v);
                }
                for (CMPMODE mode : modes)
                    for (int tensor = 0; tensor < 2; ++tensor) {
                        if (tensor) Compare(m, x, ys, mode, 256);
                        else Compares(m, x, y, mode, 256);
                        for (uint32_t i = 0; i < 256; ++i) {
                            const float xf = avsg_emu::numeric::f16_to_f32(static_cast<uint16_t>(base + i));
                            bool want = false;
                            switch (mode) {
                                case CMPMODE::LT: want = xf < yf; break;
                                case CMPMODE::GT: want = xf > yf; break;
                                case CMPMODE::EQ: want = xf == yf; break;
                                case CMPMODE::LE: want = xf <= yf; break;
                                case CMPMODE::GE: want = xf >= yf; break;
                                case CMPMODE::NE: want = xf != yf; break;
                            }
                            const bool got = (m.GetValue(i / 8) >> (i % 8)) & 1u;
                            if (got != want)
                                throw CheckFailed("half " + std::to_string(base + i) + " mode " +
                                                  std::to_string(static_cast<int>(mode)) + " vs " + std::to_string(yb) +
                                                  (tensor ? " (Compare)" : " (Compares)") + ": got " + std::to_string(got));
                        }
                    }
            }
        }
    });
}
