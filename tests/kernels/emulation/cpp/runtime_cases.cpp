// Run-time cases for the AscendC CPU emulation. One binary, one case per invocation:
//   ./runtime_cases <case>     (see test_harness.h for exit codes)
// "bad_*" cases violate a rule and must end with EMUERROR; the others are controls that
// must print OK (their numeric checks run in C++ with CHECK).
#include <atomic>
#include <chrono>
#include <cmath>
#include <thread>
#include <vector>

#include "test_harness.h"

using namespace AscendC;

// ---------------------------------------------------------------- UB budget (card §0)
CASE(ub_budget_exact_ok) {
    run1([] {
        TPipe pipe;
        TBuf<TPosition::VECCALC> a, b;
        pipe.InitBuffer(a, 100 * 1024);
        pipe.InitBuffer(b, 84 * 1024);  // total exactly 184 KB = 188416 B
        auto t = b.Get<int32_t>();
        CHECK_EQ(t.GetPhyAddr(), avsg_emu::tpipe_base() + 100u * 1024u);  // TPipe starts at its base
        CHECK_EQ(t.GetSize(), 84u * 1024u / 4u);
    });
}
CASE(bad_ub_budget) {
    run1([] {
        TPipe pipe;
        TBuf<TPosition::VECCALC> a, b;
        pipe.InitBuffer(a, 100 * 1024);
        pipe.InitBuffer(b, 84 * 1024 + 1);  // rounded to 32 B -> over budget
    });
}
CASE(bad_ub_budget_queue) {
    run1([] {
        TPipe pipe;
        TQue<TPosition::VECIN, 1> q;
        pipe.InitBuffer(q, 2, 95 * 1024);
    });
}

// ---------------------------------------------------------------- alignment (card §0)
CASE(bad_unaligned_vector_operand) {
    run1([] {
        TPipe pipe;
        TBuf<TPosition::VECCALC> b;
        pipe.InitBuffer(b, 1024);
        auto t = b.Get<int32_t>();
        Adds(t[3], t[3], 1, 16);  // UB address 12: not 32 B aligned
    });
}
CASE(bad_unaligned_dma_operand) {
    run1([] {
        std::vector<int32_t> g(64, 1);
        TPipe pipe;
        TBuf<TPosition::VECCALC> b;
        pipe.InitBuffer(b, 1024);
        GlobalTensor<int32_t> gx;
        gx.SetGlobalBuffer(g.data(), 64);
        auto t = b.Get<int32_t>();
        DataCopy(t[4], gx, 8);  // UB address 16
    });
}
CASE_UNSYNCED(aligned_view_ok) {
    run1([] {
        TPipe pipe;
        TBuf<TPosition::VECCALC> b;
        pipe.InitBuffer(b, 1024);
        auto t = b.Get<int32_t>();
        Duplicate(t, 7, 256);
        Adds(t[8], t[8], 1, 16);  // UB address 32: fine
        CHECK_EQ(t.GetValue(7), 7);
        CHECK_EQ(t.GetValue(8), 8);
        CHECK_EQ(t.GetValue(23), 8);
        CHECK_EQ(t.GetValue(24), 7);
    });
}

// ---------------------------------------------------------------- DataCopy 32 B granularity (card §4)
CASE(bad_datacopy_not32_gm_to_ub) {
    run1([] {
        std::vector<int32_t> g(64, 1);
        TPipe pipe;
        TBuf<TPosition::VECCALC> b;
        pipe.InitBuffer(b, 1024);
        GlobalTensor<int32_t> gx;
        gx.SetGlobalBuffer(g.data(), 64);
        auto t = b.Get<int32_t>();
        DataCopy(t, gx, 9);  // 36 B
    });
}
CASE(bad_datacopy_not32_ub_to_gm) {
    run1([] {
        std::vector<int16_t> g(64, 1);
        TPipe pipe;
        TBuf<TPosition::VECCALC> b;
        pipe.InitBuffer(b, 1024);
        GlobalTensor<int16_t> gx;
        gx.SetGlobalBuffer(g.data(), 64);
        auto t = b.Get<int16_t>();
        DataCopy(gx, t, 24);  // 48 B
    });
}
CASE(datacopy_roundtrip_ok) {
    std::vector<int32_t> in(64), out(64, 0);
    for (int i = 0; i < 64; ++i) in[i] = i * 3 - 50;
    run1([&] {
        TPipe pipe;
        TQue<TPosition::VECIN, 1> qi;
        TQue<TPosition::VECOUT, 1> qo;
        pipe.InitBuffer(qi, 1, 256);
        pipe.InitBuffer(qo, 1, 256);
        GlobalTensor<int32_t> gi, go;
        gi.SetGlobalBuffer(in.data(), 64);
        go.SetGlobalBuffer(out.data(), 64);
        auto a = qi.AllocTensor<int32_t>();
        DataCopy(a, gi, 64);
        qi.EnQue(a);
        auto x = qi.DeQue<int32_t>();
        auto y = qo.AllocTensor<int32_t>();
        Muls(y, x, 2, 64);
        qo.EnQue(y);
        qi.FreeTensor(x);
        auto z = qo.DeQue<int32_t>();
        DataCopy(go, z, 64);
        qo.FreeTensor(z);
    });
    for (int i = 0; i < 64; ++i) CHECK_EQ(out[i], 2 * in[i]);
}
CASE_UNSYNCED(datacopy_params_ok) {
    // 3 blocks of 32 B from GM with a 1-block source gap, packed in UB, then back with a dst gap.
    std::vector<int32_t> in(64), out(64, -1);
    for (int i = 0; i < 64; ++i) in[i] = i;
    run1([&] {
        TPipe pipe;
        TBuf<TPosition::VECCALC> b;
        pipe.InitBuffer(b, 1024);
        GlobalTensor<int32_t> gi, go;
        gi.SetGlobalBuffer(in.data(), 64);
        go.SetGlobalBuffer(out.data(), 64);
        auto t = b.Get<int32_t>();
        DataCopy(t, gi, DataCopyParams(3, 1, 1, 0));
        CHECK_EQ(t.GetValue(0), 0);
        CHECK_EQ(t.GetValue(8), 16);
        CHECK_EQ(t.GetValue(16), 32);
        DataCopy(go, t, DataCopyParams(3, 1, 0, 2));
    });
    CHECK_EQ(out[0], 0);
    CHECK_EQ(out[8], -1);
    CHECK_EQ(out[24], 16);
    CHECK_EQ(out[48], 32);
}

// ---------------------------------------------------------------- tensor size overflow
CASE(bad_ub_overflow) {
    run1([] {
        std::vector<int32_t> g(128, 1);
        TPipe pipe;
        TBuf<TPosition::VECCALC> b;
        pipe.InitBuffer(b, 256);
        GlobalTensor<int32_t> gx;
        gx.SetGlobalBuffer(g.data(), 128);
        auto t = b.Get<int32_t>();
        DataCopy(t, gx, 128);  // 512 B into a 256 B view
    });
}
CASE(bad_gm_overflow) {
    run1([] {
        std::vector<int32_t> g(128, 1);
        TPipe pipe;
        TBuf<TPosition::VECCALC> b;
        pipe.InitBuffer(b, 1024);
        GlobalTensor<int32_t> gx;
        gx.SetGlobalBuffer(g.data(), 32);
        auto t = b.Get<int32_t>();
        DataCopy(t, gx[16], 32);  // only 16 elements left in the GM view
    });
}
CASE(bad_vector_overflow) {
    run1([] {
        TPipe pipe;
        TBuf<TPosition::VECCALC> b;
        pipe.InitBuffer(b, 1024);
        auto t = b.Get<float>(64);
        Duplicate(t, 1.0f, 65);
    });
}
CASE(bad_getvalue_out_of_range) {
    run1([] {
        TPipe pipe;
        TBuf<TPosition::VECCALC> b;
        pipe.InitBuffer(b, 64);
        auto t = b.Get<int32_t>();
        (void)t.GetValue(16);
    });
}
CASE(bad_gm_getvalue_out_of_range) {
    std::vector<int32_t> g(8, 1);
    run1([&] {
        GlobalTensor<int32_t> gx;
        gx.SetGlobalBuffer(g.data(), 8);
        (void)gx.GetValue(8);
    });
}
CASE(bad_tbuf_get_len) {
    run1([] {
        TPipe pipe;
        TBuf<TPosition::VECCALC> b;
        pipe.InitBuffer(b, 64);
        (void)b.Get<int32_t>(17);
    });
}

// ---------------------------------------------------------------- Compare / Compares (card §5)
CASE(bad_compare_not256) {
    run1([] {
        TPipe pipe;
        TBuf<TPosition::VECCALC> b;
        pipe.InitBuffer(b, 4096);
        auto x = b.Get<float>(128);
        auto m = b.GetWithOffset<uint8_t>(64, 1024);
        Duplicate(x, 1.0f, 128);
        Compare(m, x, x, CMPMODE::LT, 32);  // 128 B
    });
}
CASE(bad_compares_int32_not_eq) {
    run1([] {
        TPipe pipe;
        TBuf<TPosition::VECCALC> b;
        pipe.InitBuffer(b, 4096);
        auto x = b.Get<int32_t>(64);
        auto m = b.GetWithOffset<uint8_t>(64, 1024);
        Duplicate(x, 1, 64);
        Compares(m, x, 3, CMPMODE::LT, 64);
    });
}
CASE(bad_compare_int32_not_eq) {
    run1([] {
        TPipe pipe;
        TBuf<TPosition::VECCALC> b;
        pipe.InitBuffer(b, 4096);
        auto x = b.Get<int32_t>(64);
        auto m = b.GetWithOffset<uint8_t>(64, 1024);
        Duplicate(x, 1, 64);
        Compare(m, x, x, CMPMODE::GE, 64);
    });
}
CASE_UNSYNCED(compare_bitmask_layout_ok) {
    run1([] {
        TPipe pipe;
        TBuf<TPosition::VECCALC> b;
        pipe.InitBuffer(b, 4096);
        auto x = b.Get<int32_t>(128);
        auto y = b.GetWithOffset<int32_t>(128, 512);
        auto m = b.GetWithOffset<uint8_t>(32, 1024);
        for (int i = 0; i < 128; ++i) {
            x.SetValue(i, i % 5);
            y.SetValue(i, 0);
        }
        CompareScalar(m, x, 0, CMPMODE::EQ, 128);  // element i -> byte i/8, bit i%8 (LSB first)
        auto w = m.ReinterpretCast<uint32_t>();
        for (int i = 0; i < 128; ++i) CHECK_EQ((w.GetValue(i / 32) >> (i % 32)) & 1u, (uint32_t)(i % 5 == 0));
        CHECK_EQ((uint32_t)m.GetValue(0), 0x21u);  // elements 0 and 5
        Compare(m, x, y, CMPMODE::EQ, 128);
        CHECK_EQ((uint32_t)m.GetValue(0), 0x21u);
        // float LT with 64 elements
        auto f = b.GetWithOffset<float>(64, 2048);
        for (int i = 0; i < 64; ++i) f.SetValue(i, (float)i - 10.5f);
        Compares(m, f, 0.0f, CMPMODE::LT, 64);
        auto w2 = m.ReinterpretCast<uint32_t>();
        CHECK_EQ(w2.GetValue(0), 0x7FFu);  // 0..10 are negative
        CHECK_EQ(w2.GetValue(1), 0u);
    });
}

// ---------------------------------------------------------------- Select (card §5)
CASE_UNSYNCED(select_ok) {
    run1([] {
        TPipe pipe;
        TBuf<TPosition::VECCALC> b;
        pipe.InitBuffer(b, 4096);
        auto x = b.Get<float>(64);
        auto y = b.GetWithOffset<float>(64, 256);
        auto d = b.GetWithOffset<float>(64, 512);
        auto m = b.GetWithOffset<uint8_t>(32, 1024);
        for (int i = 0; i < 64; ++i) {
            x.SetValue(i, (float)i);
            y.SetValue(i, -1.0f);
        }
        Compares(m, x, 31.5f, CMPMODE::GT, 64);
        Select(d, m, x, -2.0f, SELMODE::VSEL_TENSOR_SCALAR_MODE, 64);
        CHECK(d.GetValue(31) == -2.0f);
        CHECK(d.GetValue(32) == 32.0f);
        Select(d, m, x, y, SELMODE::VSEL_TENSOR_TENSOR_MODE, 64);
        CHECK(d.GetValue(0) == -1.0f);
        CHECK(d.GetValue(63) == 63.0f);
    });
}
CASE(bad_select_mode) {
    run1([] {
        TPipe pipe;
        TBuf<TPosition::VECCALC> b;
        pipe.InitBuffer(b, 4096);
        auto x = b.Get<float>(64);
        auto m = b.GetWithOffset<uint8_t>(32, 1024);
        Select(x, m, x, 0.0f, SELMODE::VSEL_TENSOR_TENSOR_MODE, 64);
    });
}

// ---------------------------------------------------------------- GatherMask (card §5, §8.5)
CASE_UNSYNCED(gathermask_user_pattern_counter_ok) {
    run1([] {
        TPipe pipe;
        TBuf<TPosition::VECCALC> b;
        pipe.InitBuffer(b, 8192);
        const int N = 200;
        auto src = b.Get<int32_t>(N);
        auto dst = b.GetWithOffset<int32_t>(256, 1024);
        auto pat = b.GetWithOffset<uint32_t>(8, 2048);
        for (int i = 0; i < N; ++i) src.SetValue(i, 1000 + i);
        for (int w = 0; w < 8; ++w) pat.SetValue(w, 0u);
        std::vector<int> keep;
        for (int i = 0; i < N; ++i)
            if (i % 3 == 0 || i == 199) {
                keep.push_back(i);
                pat.SetValue(i / 32, pat.GetValue(i / 32) | (1u << (i % 32)));
            }
        uint64_t cnt = 0;
        GatherMask(dst, src, pat, true, N, {1, 1, 8, 0}, cnt);
        CHECK_EQ(cnt, (uint64_t)keep.size());
        for (size_t k = 0; k < keep.size(); ++k) CHECK_EQ(dst.GetValue(k), 1000 + keep[k]);
        // beyond rsvdCnt: poisoned up to the processed element count
        CHECK_EQ((uint32_t)dst.GetValue(cnt), poison32());
        CHECK_EQ((uint32_t)dst.GetValue(N - 1), poison32());
    });
}
CASE_UNSYNCED(gathermask_builtin_and_normal_ok) {
    run1([] {
        TPipe pipe;
        TBuf<TPosition::VECCALC> b;
        pipe.InitBuffer(b, 8192);
        auto src = b.Get<float>(128);
        auto dst = b.GetWithOffset<float>(128, 1024);
        for (int i = 0; i < 128; ++i) src.SetValue(i, (float)i);
        uint64_t cnt = 0;
        // Normal mode, built-in pattern 2 (odd indices), two repeats of 64 floats.
        GatherMask(dst, src, (uint8_t)2, false, 0, {1, 2, 8, 8}, cnt);
        CHECK_EQ(cnt, (uint64_t)64);
        for (int k = 0; k < 64; ++k) CHECK(dst.GetValue(k) == (float)(2 * k + 1));
        CHECK_EQ(bits_of(dst.GetValue(64)), poison32());
        // Normal mode, user uint32 pattern per repeat (src1RepeatStride = 1 block = 32 B = 256 bits)
        auto pat = b.GetWithOffset<uint32_t>(16, 2048);
        for (int w = 0; w < 16; ++w) pat.SetValue(w, 0u);
        pat.SetValue(0, 0x9u);      // repeat 0: elements 0 and 3
        pat.SetValue(8, 0x80000000u);  // repeat 1: element 31 -> 64+31
        GatherMask(dst, src, pat, false, 0, {1, 2, 8, 1}, cnt);
        CHECK_EQ(cnt, (uint64_t)3);
        CHECK(dst.GetValue(0) == 0.0f);
        CHECK(dst.GetValue(1) == 3.0f);
        CHECK(dst.GetValue(2) == 95.0f);
        // Counter mode with a built-in pattern: index 0 of every 4 over 10 elements
        GatherMask(dst, src, (uint8_t)3, true, 10, {1, 1, 8, 0}, cnt);
        CHECK_EQ(cnt, (uint64_t)3);
        CHECK(dst.GetValue(2) == 8.0f);
    });
}
CASE_UNSYNCED(gathermask_int16_ok) {
    run1([] {
        TPipe pipe;
        TBuf<TPosition::VECCALC> b;
        pipe.InitBuffer(b, 4096);
        auto src = b.Get<int16_t>(128);
        auto dst = b.GetWithOffset<int16_t>(128, 512);
        auto pat = b.GetWithOffset<uint16_t>(16, 1024);
        for (int i = 0; i < 128; ++i) src.SetValue(i, (int16_t)(i - 64));
        for (int w = 0; w < 16; ++w) pat.SetValue(w, (uint16_t)0);
        pat.SetValue(1, (uint16_t)0x8001);  // elements 16 and 31
        uint64_t cnt = 0;
        GatherMask(dst, src, pat, true, 128, {1, 1, 8, 0}, cnt);
        CHECK_EQ(cnt, (uint64_t)2);
        CHECK_EQ((int)dst.GetValue(0), 16 - 64);
        CHECK_EQ((int)dst.GetValue(1), 31 - 64);
    });
}
CASE(bad_gathermask_repeat0) {
    run1([] {
        TPipe pipe;
        TBuf<TPosition::VECCALC> b;
        pipe.InitBuffer(b, 4096);
        auto src = b.Get<int32_t>(64);
        auto dst = b.GetWithOffset<int32_t>(64, 1024);
        auto pat = b.GetWithOffset<uint32_t>(8, 2048);
        uint64_t cnt = 0;
        GatherMaskParams p;  // repeatTimes defaults to 0
        GatherMask(dst, src, pat, true, 64, p, cnt);
    });
}
CASE(bad_gathermask_counter_repeat2) {
    run1([] {
        TPipe pipe;
        TBuf<TPosition::VECCALC> b;
        pipe.InitBuffer(b, 4096);
        auto src = b.Get<int32_t>(128);
        auto dst = b.GetWithOffset<int32_t>(128, 1024);
        auto pat = b.GetWithOffset<uint32_t>(8, 2048);
        uint64_t cnt = 0;
        GatherMask(dst, src, pat, true, 64, {1, 2, 8, 0}, cnt);
    });
}
CASE(bad_gathermask_repeat256) {
    run1([] {
        TPipe pipe;
        TBuf<TPosition::VECCALC> b;
        pipe.InitBuffer(b, 4096);
        auto src = b.Get<int32_t>(64);
        auto dst = b.GetWithOffset<int32_t>(64, 1024);
        uint64_t cnt = 0;
        GatherMask(dst, src, (uint8_t)7, false, 0, {1, 256, 0, 0}, cnt);
    });
}

// ---------------------------------------------------------------- Gather (card §5, §8.4)
CASE_UNSYNCED(gather_byte_offsets_ok) {
    run1([] {
        TPipe pipe;
        TBuf<TPosition::VECCALC> b;
        pipe.InitBuffer(b, 8192);
        auto src = b.Get<int32_t>(256);
        auto off = b.GetWithOffset<uint32_t>(64, 1024);
        auto dst = b.GetWithOffset<int32_t>(64, 2048);
        for (int i = 0; i < 256; ++i) src.SetValue(i, 10 * i);
        for (int i = 0; i < 64; ++i) off.SetValue(i, (uint32_t)(4 * ((i * 7) % 64)));  // bytes
        Gather(dst, src, off, 128u /* base: element 32 */, 64);
        for (int i = 0; i < 64; ++i) CHECK_EQ(dst.GetValue(i), 10 * (32 + (i * 7) % 64));
    });
}
CASE_UNSYNCED(gather_count_max_ok) {
    run1([] {
        TPipe pipe;
        TBuf<TPosition::VECCALC> a, o, d;
        pipe.InitBuffer(a, 1024);
        pipe.InitBuffer(o, 16383 * 4 + 32);
        pipe.InitBuffer(d, 16383 * 4 + 32);
        auto src = a.Get<int32_t>();
        auto off = o.Get<uint32_t>(16383);
        auto dst = d.Get<int32_t>(16383);
        Duplicate(src, 5, 256);
        Duplicate(off.ReinterpretCast<int32_t>(), 8, 16383);
        Gather(dst, src, off, 0u, 16383);  // 255 repeats + tail: allowed
        CHECK_EQ(dst.GetValue(16382), 5);
    });
}
CASE(bad_gather_count_limit) {
    run1([] {
        TPipe pipe;
        TBuf<TPosition::VECCALC> a, o, d;
        pipe.InitBuffer(a, 1024);
        pipe.InitBuffer(o, 16384 * 4);
        pipe.InitBuffer(d, 16384 * 4);
        Gather(d.Get<int32_t>(), a.Get<int32_t>(), o.Get<uint32_t>(), 0u, 16384);
    });
}
CASE_UNSYNCED(bad_gather_unaligned_offset) {
    run1([] {
        TPipe pipe;
        TBuf<TPosition::VECCALC> b;
        pipe.InitBuffer(b, 4096);
        auto src = b.Get<int32_t>(64);
        auto off = b.GetWithOffset<uint32_t>(64, 1024);
        auto dst = b.GetWithOffset<int32_t>(64, 2048);
        Duplicate(off.ReinterpretCast<int32_t>(), 0, 64);
        off.SetValue(5, 6u);  // element index instead of bytes*4 ... misaligned
        Gather(dst, src, off, 0u, 64);
    });
}

int main(int argc, char** argv) { return run_main(argc, argv); }
