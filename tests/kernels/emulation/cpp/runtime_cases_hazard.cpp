// Run-time cases for the pipe-hazard scoreboard (emulation/emu_hazard.h, card §3, §6, §9).
// Each hazard class has a violating mini-kernel ("hazard_*_bad", must end with the EmuError the
// driver expects) and a correctly synchronised control ("hazard_*_ok", must print OK). All cases
// run strict (CASE = scoreboard on).
#include <vector>

#include "test_harness.h"

using namespace AscendC;

namespace {
// Two 1 KB UB buffers: A at UB 0x0, B at UB 0x400; GM in (64 x int32) and out (64 x int32).
struct Mini {
    TPipe pipe;
    TBuf<TPosition::VECCALC> a, b;
    LocalTensor<int32_t> A, B;
    GlobalTensor<int32_t> gi, go;
    std::vector<int32_t> in, out;
    Mini() : in(256), out(256, 0) {
        for (int i = 0; i < 256; ++i) in[i] = i;
        pipe.InitBuffer(a, 1024);
        pipe.InitBuffer(b, 1024);
        A = a.Get<int32_t>();
        B = b.Get<int32_t>();
        gi.SetGlobalBuffer(in.data(), 256);
        go.SetGlobalBuffer(out.data(), 256);
    }
};
template <HardEvent E>
void sync(int id = 0) {
    SetFlag<E>(id);
    WaitFlag<E>(id);
}
}  // namespace

// ---------------------------------------------------------------- MTE2 -> V
CASE(hazard_mte2_v_bad) {
    run1([] {
        Mini m;
        DataCopy(m.A, m.gi, 64);
        Adds(m.B, m.A, 1, 64);  // reads A while the load may still be in flight
    });
}
CASE(hazard_mte2_v_ok) {
    run1([] {
        Mini m;
        DataCopy(m.A, m.gi, 64);
        sync<HardEvent::MTE2_V>();
        Adds(m.B, m.A, 1, 64);
        sync<HardEvent::V_S>();
        CHECK_EQ(m.B.GetValue(63), 64);
    });
}
// A flag of another pipe pair does not order MTE2 before V. (MTE2_S would: the scalar unit
// waits for the load and only then issues the Adds; see hazard_v_s_orders_later_v_ok.)
CASE(hazard_wrong_event_bad) {
    run1([] {
        Mini m;
        DataCopy(m.A, m.gi, 64);
        sync<HardEvent::MTE2_MTE3>();
        Adds(m.B, m.A, 1, 64);
    });
}
// A SetFlag issued before the producer access does not cover it.
CASE(hazard_setflag_before_producer_bad) {
    run1([] {
        Mini m;
        SetFlag<HardEvent::MTE2_V>(0);
        DataCopy(m.A, m.gi, 64);
        WaitFlag<HardEvent::MTE2_V>(0);
        Adds(m.B, m.A, 1, 64);
    });
}

// ---------------------------------------------------------------- MTE2 -> S
CASE(hazard_mte2_s_bad) {
    run1([] {
        Mini m;
        DataCopy(m.A, m.gi, 64);
        (void)m.A.GetValue(5);
    });
}
CASE(hazard_mte2_s_ok) {
    run1([] {
        Mini m;
        DataCopy(m.A, m.gi, 64);
        sync<HardEvent::MTE2_S>();
        CHECK_EQ(m.A.GetValue(5), 5);
    });
}
// Transitive: MTE2 -> V -> S orders the load before the scalar read.
CASE(hazard_transitive_mte2_v_s_ok) {
    run1([] {
        Mini m;
        DataCopy(m.A, m.gi, 64);
        sync<HardEvent::MTE2_V>();
        sync<HardEvent::V_S>();
        CHECK_EQ(m.A.GetValue(5), 5);
    });
}

// ---------------------------------------------------------------- V -> S, S -> V
CASE(hazard_v_s_bad) {
    run1([] {
        Mini m;
        Duplicate(m.A, 7, 64);
        (void)m.A.GetValue(0);
    });
}
CASE(hazard_v_s_ok) {
    run1([] {
        Mini m;
        Duplicate(m.A, 7, 64);
        sync<HardEvent::V_S>();
        CHECK_EQ(m.A.GetValue(0), 7);
    });
}
CASE(hazard_s_v_bad) {
    run1([] {
        Mini m;
        for (int i = 0; i < 8; ++i) m.A.SetValue(i, i);
        Adds(m.B, m.A, 1, 8);
    });
}
CASE(hazard_s_v_ok) {
    run1([] {
        Mini m;
        for (int i = 0; i < 8; ++i) m.A.SetValue(i, i);
        sync<HardEvent::S_V>();
        Adds(m.B, m.A, 1, 8);
        sync<HardEvent::V_S>();
        CHECK_EQ(m.B.GetValue(7), 8);
    });
}

// ---------------------------------------------------------------- V -> MTE3, S -> MTE3
CASE(hazard_v_mte3_bad) {
    run1([] {
        Mini m;
        Duplicate(m.A, 3, 64);
        DataCopy(m.go, m.A, 64);
    });
}
CASE(hazard_v_mte3_ok) {
    std::vector<int32_t> out(64, 0);
    run1([&] {
        Mini m;
        m.go.SetGlobalBuffer(out.data(), 64);
        Duplicate(m.A, 3, 64);
        sync<HardEvent::V_MTE3>();
        DataCopy(m.go, m.A, 64);
    });
    CHECK_EQ(out[63], 3);
}
CASE(hazard_s_mte3_bad) {
    run1([] {
        Mini m;
        for (int i = 0; i < 8; ++i) m.A.SetValue(i, i);
        DataCopy(m.go, m.A, 8);
    });
}
CASE(hazard_s_mte3_ok) {
    run1([] {
        Mini m;
        for (int i = 0; i < 8; ++i) m.A.SetValue(i, i);
        sync<HardEvent::S_MTE3>();
        DataCopy(m.go, m.A, 8);
    });
}
// Disjoint bytes of one 32 B granule do not conflict: the scalar writes element 7 (bytes 28..31)
// while MTE3 stores bytes 0..15.
CASE(hazard_disjoint_bytes_ok) {
    run1([] {
        Mini m;
        DataCopy(m.A, m.gi, 8);
        sync<HardEvent::MTE2_S>();
        sync<HardEvent::MTE2_MTE3>();
        m.A.SetValue(7, 70);
        DataCopyPad(m.go, m.A, DataCopyExtParams(1, 16, 0, 0, 0));
        sync<HardEvent::MTE3_S>();
    });
}

// ---------------------------------------------------------------- MTE3 -> MTE2 (UB reuse, GM reload)
CASE(hazard_mte3_mte2_ub_reuse_bad) {
    run1([] {
        Mini m;
        Duplicate(m.A, 1, 64);
        sync<HardEvent::V_MTE3>();
        DataCopy(m.go, m.A, 64);
        sync<HardEvent::V_MTE2>();
        DataCopy(m.A, m.gi, 64);  // overwrites A while the store may still read it
    });
}
CASE(hazard_mte3_mte2_ub_reuse_ok) {
    run1([] {
        Mini m;
        Duplicate(m.A, 1, 64);
        sync<HardEvent::V_MTE3>();
        DataCopy(m.go, m.A, 64);
        sync<HardEvent::V_MTE2>();
        sync<HardEvent::MTE3_MTE2>();
        DataCopy(m.A, m.gi, 64);
        sync<HardEvent::MTE2_V>();
    });
}
CASE(hazard_mte3_mte2_gm_bad) {
    run1([] {
        Mini m;
        Duplicate(m.A, 1, 64);
        sync<HardEvent::V_MTE3>();
        DataCopy(m.go, m.A, 64);
        DataCopy(m.B, m.go, 64);  // reloads GM the store may not have reached
    });
}
CASE(hazard_mte3_mte2_gm_ok) {
    run1([] {
        Mini m;
        Duplicate(m.A, 1, 64);
        sync<HardEvent::V_MTE3>();
        DataCopy(m.go, m.A, 64);
        sync<HardEvent::MTE3_MTE2>();
        DataCopy(m.B, m.go, 64);
        sync<HardEvent::MTE2_S>();
        CHECK_EQ(m.B.GetValue(3), 1);
    });
}

// ---------------------------------------------------------------- V -> V
CASE(hazard_v_v_raw_bad) {
    run1([] {
        Mini m;
        Duplicate(m.A, 2, 64);
        Adds(m.B, m.A, 1, 64);
    });
}
CASE(hazard_v_v_raw_ok) {
    run1([] {
        Mini m;
        Duplicate(m.A, 2, 64);
        PipeBarrier<PIPE_V>();
        Adds(m.B, m.A, 1, 64);
        Adds(m.A, m.A, 1, 64);  // in place: one instruction, not a hazard (A was read by the previous
                                 // instruction, but reads do not conflict with reads)
    });
}
CASE(hazard_v_v_war_bad) {
    run1([] {
        Mini m;
        Duplicate(m.A, 2, 64);
        PipeBarrier<PIPE_V>();
        Adds(m.B, m.A, 1, 64);
        Duplicate(m.A, 0, 64);  // may overtake the Adds still reading A
    });
}
CASE(hazard_v_v_waw_bad) {
    run1([] {
        Mini m;
        Duplicate(m.A, 2, 64);
        Duplicate(m.A, 0, 64);
    });
}
// The scalar unit issues every instruction: after it waited for V (V_S), later vector
// instructions start after the earlier ones completed, without a PipeBarrier<PIPE_V>.
CASE(hazard_v_s_orders_later_v_ok) {
    run1([] {
        Mini m;
        Duplicate(m.A, 2, 64);
        sync<HardEvent::V_S>();
        Adds(m.B, m.A, 1, 64);
    });
}

// ---------------------------------------------------------------- write-after-read across pipes
CASE(hazard_v_mte2_war_bad) {
    run1([] {
        Mini m;
        Duplicate(m.A, 2, 64);
        sync<HardEvent::V_MTE2>();  // covers the Duplicate (WAW), not the Adds issued after it
        PipeBarrier<PIPE_V>();
        Adds(m.B, m.A, 1, 64);
        DataCopy(m.A, m.gi, 64);  // may land before the Adds read A
    });
}
CASE(hazard_v_mte2_war_ok) {
    run1([] {
        Mini m;
        Duplicate(m.A, 2, 64);
        PipeBarrier<PIPE_V>();
        Adds(m.B, m.A, 1, 64);
        sync<HardEvent::V_MTE2>();
        DataCopy(m.A, m.gi, 64);
    });
}
CASE(hazard_s_mte2_war_bad) {
    run1([] {
        Mini m;
        DataCopy(m.A, m.gi, 64);
        sync<HardEvent::MTE2_S>();
        (void)m.A.GetValue(0);
        DataCopy(m.A, m.gi[64], 64);
    });
}
CASE(hazard_s_mte2_war_ok) {
    run1([] {
        Mini m;
        DataCopy(m.A, m.gi, 64);
        sync<HardEvent::MTE2_S>();
        CHECK_EQ(m.A.GetValue(0), 0);
        sync<HardEvent::S_MTE2>();
        DataCopy(m.A, m.gi[64], 64);
        sync<HardEvent::MTE2_S>();
        CHECK_EQ(m.A.GetValue(0), 64);
    });
}
CASE(hazard_mte3_v_war_bad) {
    run1([] {
        Mini m;
        Duplicate(m.A, 1, 64);
        sync<HardEvent::V_MTE3>();
        DataCopy(m.go, m.A, 64);
        PipeBarrier<PIPE_V>();
        Duplicate(m.A, 5, 64);  // overwrites A while the store may still read it
    });
}
CASE(hazard_mte3_v_war_ok) {
    run1([] {
        Mini m;
        Duplicate(m.A, 1, 64);
        sync<HardEvent::V_MTE3>();
        DataCopy(m.go, m.A, 64);
        sync<HardEvent::MTE3_V>();
        PipeBarrier<PIPE_V>();
        Duplicate(m.A, 5, 64);
    });
}

// ---------------------------------------------------------------- same-pipe DMA destinations
CASE(hazard_mte2_waw_bad) {
    run1([] {
        Mini m;
        DataCopy(m.A, m.gi, 64);
        DataCopy(m.A, m.gi[64], 64);
    });
}
CASE(hazard_mte2_waw_ok) {
    run1([] {
        Mini m;
        DataCopy(m.A, m.gi, 64);
        PipeBarrier<PIPE_MTE2>();
        DataCopy(m.A, m.gi[64], 64);
        DataCopy(m.B, m.gi, 64);  // disjoint destination: no barrier needed
    });
}
CASE(hazard_mte3_waw_gm_bad) {
    run1([] {
        Mini m;
        Duplicate(m.A, 1, 128);
        sync<HardEvent::V_MTE3>();
        DataCopy(m.go, m.A, 64);
        DataCopy(m.go, m.A[64], 64);
    });
}
CASE(hazard_mte3_waw_gm_ok) {
    run1([] {
        Mini m;
        Duplicate(m.A, 1, 128);
        sync<HardEvent::V_MTE3>();
        DataCopy(m.go, m.A, 64);
        PipeBarrier<PIPE_MTE3>();
        DataCopy(m.go, m.A[64], 64);
    });
}

// ---------------------------------------------------------------- scalar GM access vs DMA
CASE(hazard_gm_s_mte2_bad) {
    run1([] {
        Mini m;
        m.gi.SetValue(3, 99);
        DataCopy(m.A, m.gi, 64);
    });
}
CASE(hazard_gm_s_mte2_ok) {
    run1([] {
        Mini m;
        m.gi.SetValue(3, 99);
        DataCacheCleanAndInvalid<int32_t, CacheLine::SINGLE_CACHE_LINE, DcciDst::CACHELINE_OUT>(m.gi);
        sync<HardEvent::S_MTE2>();
        DataCopy(m.A, m.gi, 64);
    });
}
CASE(hazard_gm_mte3_s_bad) {
    run1([] {
        Mini m;
        Duplicate(m.A, 1, 64);
        sync<HardEvent::V_MTE3>();
        DataCopy(m.go, m.A, 64);
        (void)m.go.GetValue(0);
    });
}
CASE(hazard_gm_mte3_s_ok) {
    run1([] {
        Mini m;
        Duplicate(m.A, 1, 64);
        sync<HardEvent::V_MTE3>();
        DataCopy(m.go, m.A, 64);
        sync<HardEvent::MTE3_S>();
        CHECK_EQ(m.go.GetValue(0), 1);
    });
}

// ---------------------------------------------------------------- queue-provided syncs (card §3)
CASE(hazard_queue_vecin_vecout_ok) {
    std::vector<int32_t> in(256), out(256, 0);
    for (int i = 0; i < 256; ++i) in[i] = i;
    run1([&] {
        TPipe pipe;
        TQue<TPosition::VECIN, 1> qi;
        TQue<TPosition::VECOUT, 1> qo;
        pipe.InitBuffer(qi, 2, 256);
        pipe.InitBuffer(qo, 2, 256);
        GlobalTensor<int32_t> gi, go;
        gi.SetGlobalBuffer(in.data(), 256);
        go.SetGlobalBuffer(out.data(), 256);
        for (int t = 0; t < 4; ++t) {  // buffers are reused: Free->Alloc orders V->MTE2, MTE3->V
            auto x = qi.AllocTensor<int32_t>();
            DataCopy(x, gi[t * 64], 64);
            qi.EnQue(x);
            auto xi = qi.DeQue<int32_t>();
            auto y = qo.AllocTensor<int32_t>();
            Adds(y, xi, 1000, 64);
            qo.EnQue(y);
            qi.FreeTensor(xi);
            auto yo = qo.DeQue<int32_t>();
            DataCopy(go[t * 64], yo, 64);
            qo.FreeTensor(yo);
        }
    });
    CHECK_EQ(out[255], 1255);
}
CASE(hazard_queue_bind_copy_ok) {
    std::vector<int32_t> in(256), out(256, 0);
    for (int i = 0; i < 256; ++i) in[i] = i;
    run1([&] {
        TPipe pipe;
        TQueBind<TPosition::VECIN, TPosition::VECOUT, 1> q;
        pipe.InitBuffer(q, 2, 256);
        GlobalTensor<int32_t> gi, go;
        gi.SetGlobalBuffer(in.data(), 256);
        go.SetGlobalBuffer(out.data(), 256);
        for (int t = 0; t < 4; ++t) {
            auto x = q.AllocTensor<int32_t>();
            DataCopy(x, gi[t * 64], 64);
            q.EnQue(x);
            auto y = q.DeQue<int32_t>();
            DataCopy(go[t * 64], y, 64);
            q.FreeTensor(y);
        }
    });
    CHECK_EQ(out[200], 200);
}
// Queues never sync PIPE_S (card §3, §8.8).
CASE(hazard_queue_no_scalar_sync_bad) {
    std::vector<int32_t> in(64, 4);
    run1([&] {
        TPipe pipe;
        TQue<TPosition::VECIN, 1> qi;
        pipe.InitBuffer(qi, 1, 256);
        GlobalTensor<int32_t> gi;
        gi.SetGlobalBuffer(in.data(), 64);
        auto x = qi.AllocTensor<int32_t>();
        DataCopy(x, gi, 64);
        qi.EnQue(x);
        auto xi = qi.DeQue<int32_t>();
        (void)xi.GetValue(0);
    });
}
// TQueBind<VECIN, VECOUT> orders MTE2 -> MTE3 only, not MTE2 -> V.
CASE(hazard_queue_bind_no_vector_sync_bad) {
    std::vector<int32_t> in(64, 4);
    run1([&] {
        TPipe pipe;
        TQueBind<TPosition::VECIN, TPosition::VECOUT, 1> q;
        pipe.InitBuffer(q, 1, 256);
        GlobalTensor<int32_t> gi;
        gi.SetGlobalBuffer(in.data(), 64);
        auto x = q.AllocTensor<int32_t>();
        DataCopy(x, gi, 64);
        q.EnQue(x);
        auto y = q.DeQue<int32_t>();
        Adds(y, y, 1, 64);
    });
}
// One buffer: every AllocTensor waits for the previous FreeTensor (MTE3 -> MTE2), so the reload
// after the store needs no explicit MTE3_MTE2 flag.
CASE(hazard_queue_free_alloc_ok) {
    std::vector<int32_t> in(64, 4), out(64, 0);
    run1([&] {
        TPipe pipe;
        TQueBind<TPosition::VECIN, TPosition::VECOUT, 1> q;
        pipe.InitBuffer(q, 1, 256);
        GlobalTensor<int32_t> gi, go;
        gi.SetGlobalBuffer(in.data(), 64);
        go.SetGlobalBuffer(out.data(), 64);
        for (int t = 0; t < 3; ++t) {  // one buffer: every Alloc waits for the previous Free (MTE3->MTE2)
            auto x = q.AllocTensor<int32_t>();
            DataCopy(x, gi, 64);
            q.EnQue(x);
            auto y = q.DeQue<int32_t>();
            DataCopy(go, y, 64);
            q.FreeTensor(y);
            PipeBarrier<PIPE_MTE3>();  // the next store hits the same GM
        }
    });
}

// ---------------------------------------------------------------- PIPE_ALL, SyncAll
CASE(hazard_pipe_all_ok) {
    run1([] {
        Mini m;
        DataCopy(m.A, m.gi, 64);
        PipeBarrier<PIPE_ALL>();
        m.A.SetValue(0, m.A.GetValue(1));
        PipeBarrier<PIPE_ALL>();
        Adds(m.A, m.A, 1, 64);
        PipeBarrier<PIPE_ALL>();
        DataCopy(m.go, m.A, 64);
        PipeBarrier<PIPE_ALL>();
        DataCopy(m.B, m.go, 64);
        PipeBarrier<PIPE_ALL>();
        CHECK_EQ(m.B.GetValue(0), 2);
    });
}
CASE(hazard_syncall_ok) {
    avsg_emu::launch(2, [] {
        Mini m;
        DataCopy(m.A, m.gi, 64);
        SyncAll();
        CHECK_EQ(m.A.GetValue(2), 2);
    });
}

// ---------------------------------------------------------------- API-specific modelling
// CreateVecIndex: no PipeBarrier<PIPE_V> after its last (tail) Adds (card §5, §8.9).
CASE(hazard_createvecindex_no_barrier_bad) {
    run1([] {
        Mini m;
        CreateVecIndex(m.A, 0, 100);
        Adds(m.B, m.A, 1, 100);
    });
}
CASE(hazard_createvecindex_ok) {
    run1([] {
        Mini m;
        CreateVecIndex(m.A, 0, 128);
        PipeBarrier<PIPE_V>();
        Adds(m.B, m.A, 1, 128);
        sync<HardEvent::V_S>();
        CHECK_EQ(m.B.GetValue(127), 128);
    });
}
// Its first 32 B are written by the scalar unit: a pending vector read of dst needs V_S first.
CASE(hazard_createvecindex_scalar_war_bad) {
    run1([] {
        Mini m;
        Duplicate(m.A, 0, 128);
        PipeBarrier<PIPE_V>();
        Adds(m.B, m.A, 1, 128);
        CreateVecIndex(m.A, 0, 128);
    });
}
// GatherMask's rsvdCnt is returned synchronously, but its UB output still needs V_S.
CASE(hazard_gathermask_count_ok) {
    run1([] {
        Mini m;
        Duplicate(m.A, 9, 64);
        Duplicate(m.B.ReinterpretCast<uint32_t>(), 0x55555555u, 8);
        PipeBarrier<PIPE_V>();
        uint64_t cnt = 0;
        GatherMask(m.B[64], m.A, m.B.ReinterpretCast<uint32_t>(), true, 64, GatherMaskParams(1, 1, 8, 0), cnt);
        CHECK_EQ(cnt, 32u);  // scalar use of the count: no sync needed
        sync<HardEvent::V_S>();
        CHECK_EQ(m.B.GetValue(64 + 31), 9);
    });
}
CASE(hazard_gathermask_dst_scalar_bad) {
    run1([] {
        Mini m;
        Duplicate(m.A, 9, 64);
        Duplicate(m.B.ReinterpretCast<uint32_t>(), 0x55555555u, 8);
        PipeBarrier<PIPE_V>();
        uint64_t cnt = 0;
        GatherMask(m.B[64], m.A, m.B.ReinterpretCast<uint32_t>(), true, 64, GatherMaskParams(1, 1, 8, 0), cnt);
        if (cnt > 0) (void)m.B.GetValue(64);
    });
}

// ---------------------------------------------------------------- escape hatch
CASE(hazard_checks_off_ok) {
    avsg_emu::set_hazard_checks(false);
    run1([] {
        Mini m;
        DataCopy(m.A, m.gi, 64);
        Adds(m.B, m.A, 1, 64);
        CHECK_EQ(m.B.GetValue(1), 2);
    });
    avsg_emu::set_hazard_checks(true);
    bool threw = false;
    try {
        run1([] {
            Mini m;
            DataCopy(m.A, m.gi, 64);
            Adds(m.B, m.A, 1, 64);
        });
    } catch (const AscendC::EmuError&) {
        threw = true;
    }
    CHECK(threw);
}
