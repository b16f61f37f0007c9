"""Tests of the strict AscendC CPU emulation (emulation/).

Two C++ sources in tests/kernels/emulation/cpp/ are built once per session (in parallel):
  * runtime_cases.cpp + runtime_cases2.cpp + runtime_cases_hazard.cpp -> one binary; each test runs one named case. "bad_*" cases violate a
    run-time rule and must end with AscendC::EmuError carrying the expected message; the other
    cases are controls whose numeric checks run in C++ (CHECK) and must print OK.
  * compile_cases.cpp  -> compiled with -fsyntax-only: as is (control, must compile cleanly) and
    with -DALL_CASES, where every forbidden dtype/API use sits in its own function; each compiler
    error is attributed to its case through the source lines in its diagnostic chain, and each
    case must produce its expected diagnostic (AVSG_EMU_COMPILE_EACH=1 also compiles every case
    separately).
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
EMU_DIR = ROOT / "emulation"
CPP_DIR = Path(__file__).resolve().parent / "cpp"
CXX = os.environ.get("CXX", "g++")
BASE_FLAGS = ["-std=c++17", "-pthread", f"-I{EMU_DIR}", f"-I{CPP_DIR}"]

# ---------------------------------------------------------------------------------------------
# Compile-time rules: case -> text the compiler error must contain.
COMPILE_FAIL = {
    "and_int32": "And: T must be int16/uint16 on A2",
    "or_int32": "Or: T must be int16/uint16 on A2",
    "not_int32": "Not: T must be int16/uint16 on A2",
    "select_int32": "Select: T must be half/float on A2",
    "compares_int8_mask": "Compares: mask type U must be uint8",
    "compare_int16": "Compare: T must be half/float (or int32 with EQ only)",
    "compare_uint16_mask": "Compare: mask type U must be int8/uint8",
    "add_int64": "Add: T must be int16/half/int32/float",
    "muls_int64": "Muls: T must be int16/half/int32/float",
    "adds_uint32": "Adds: T must be int16/half/int32/float",
    "max_uint16": "Max: T must be int16/half/int32/float",
    "shift_int64": "ShiftLeft/ShiftRight: T must be int16/uint16/int32/uint32",
    "shift_uint8": "ShiftLeft/ShiftRight: T must be int16/uint16/int32/uint32",
    "reducemax_int32": "ReduceMax/ReduceMin/ReduceSum: T must be half/float",
    "reducesum_int16": "ReduceMax/ReduceMin/ReduceSum: T must be half/float",
    "sort_int32": "Sort32: only float is emulated",
    "gathermask_int32_u16_pattern": "GatherMask: A2 pairs are",
    "gathermask_int16_u32_pattern": "GatherMask: A2 pairs are",
    "gather_int64": "Gather: T must be",
    "cast_int16_int32": "Cast: dtype pair not in the emulated A2 list",
    "duplicate_int64": "Duplicate: T must be",
    "createvecindex_uint32": "CreateVecIndex: T must be",
    "pipebarrier_s": "PipeBarrier: pipe must be",
    "dcci_atomic": "CACHELINE_ATOMIC is not supported on A2",
    "atomicadd_int64": "SetAtomicAdd: T must be",
    "datacopy_bool": "DataCopy/DataCopyPad: dtype not supported on A2",
    "tque_veccalc": "TQue: only TPosition::VECIN / VECOUT",
    "tquesync_bad_pair": "TQueSync: no AIV HardEvent for this pipe pair",
    "gm_atomic_cas": "'AtomicCas' was not declared",
    "hardevent_not_aiv": "'M_V' is not a member of 'AscendC::HardEvent'",
}

# ---------------------------------------------------------------------------------------------
# Run-time rules: case -> substrings of the EmuError message (None = control, must print OK).
RUNTIME = {
    # UB budget (card §0)
    "ub_budget_exact_ok": None,
    "bad_ub_budget": ["TPipe::InitBuffer(TBuf): UB budget exceeded", "188416"],
    "bad_ub_budget_queue": ["TPipe::InitBuffer(TQue): UB budget exceeded"],
    # 32 B alignment of UB operands (card §0)
    "aligned_view_ok": None,
    # TPipe's first buffer starts at UB byte 32 (avsg_emu::tpipe_base): 32 + 12, 32 + 16
    "bad_unaligned_vector_operand": ["Adds: dst UB address 44 is not 32-byte aligned"],
    "bad_unaligned_dma_operand": ["DataCopy(GM->UB): dst UB address 48 is not 32-byte aligned"],
    # DataCopy 32 B granularity (card §4)
    "datacopy_roundtrip_ok": None,
    "datacopy_params_ok": None,
    "bad_datacopy_not32_gm_to_ub": ["DataCopy(GM->UB)", "36 B is not a multiple of 32 B"],
    "bad_datacopy_not32_ub_to_gm": ["DataCopy(UB->GM)", "48 B is not a multiple of 32 B"],
    "bad_datacopy_gm_misaligned": ["DataCopy(GM->UB): GM address is not aligned to sizeof(T)=4"],
    # tensor size overflow
    "bad_ub_overflow": ["DataCopy(GM->UB): dst needs 128 elements", "tensor size overflow"],
    "bad_gm_overflow": ["GlobalTensor size is 16", "tensor size overflow"],
    "bad_vector_overflow": ["Duplicate: dst needs 65 elements", "tensor size overflow"],
    "bad_getvalue_out_of_range": ["LocalTensor::GetValue: index 16 out of range"],
    "bad_gm_getvalue_out_of_range": ["GlobalTensor::GetValue: index 8 out of range"],
    "bad_tbuf_get_len": ["TBuf::Get(len)", "tensor size overflow"],
    # Compare / Compares (card §5)
    "compare_bitmask_layout_ok": None,
    "cast_float_to_half_matches_rounding_ok": None,
    "reduce_minmax_matches_scan_ok": None,
    "compare_half_all_modes_all_patterns_ok": None,
    "bad_compare_not256": ["Compare: count*sizeof(T) = 128 B is not a multiple of 256 B"],
    "bad_compares_int32_not_eq": ["Compares: int32 supports only CMPMODE::EQ"],
    "bad_compare_int32_not_eq": ["Compare: int32 supports only CMPMODE::EQ"],
    # Select
    "select_ok": None,
    "bad_select_mode": ["Select(tensor, scalar): selMode must be VSEL_TENSOR_SCALAR_MODE"],
    # GatherMask (card §5, §8.5)
    "gathermask_user_pattern_counter_ok": None,
    "gathermask_builtin_and_normal_ok": None,
    "gathermask_int16_ok": None,
    "bad_gathermask_repeat0": ["GatherMask: GatherMaskParams.repeatTimes is 0"],
    "bad_gathermask_counter_repeat2": ["GatherMask: counter mode", "repeatTimes=2 > 1"],
    "bad_gathermask_repeat256": ["GatherMask: repeatTimes 256 > 255"],
    # Gather (card §5, §8.4)
    "gather_byte_offsets_ok": None,
    "gather_count_max_ok": None,
    "bad_gather_count_limit": ["Gather: count 16384 needs 256 repeats > 255"],
    "bad_gather_unaligned_offset": ["Gather: byte offset 6 (element 5) is not aligned"],
    # DataCopyPad (card §4, §8.12)
    "datacopypad_ragged_ok": None,
    "datacopypad_undefined_padding_poisoned": None,
    "bad_datacopypad_blockcount": ["DataCopyPad(GM->UB): blockCount 4096 > 4095"],
    "bad_datacopypad_blocklen": ["DataCopyPad(UB->GM): blockLen 2097152 B > 2097151"],
    "bad_datacopypad_ub_last_block_unpadded": ["DataCopyPad(UB->GM): src needs 64 elements"],
    "bad_datacopypad_pad_over_32B": ["leftPadding/rightPadding", "exceed 32 B"],
    "bad_datacopypad_int64_padvalue": ["64-bit paddingValue must be 0"],
    "bad_datacopypad_blocklen_not_multiple": ["blockLen 6 B is not a multiple of sizeof(T)=4"],
    # poisoning and queues
    "alloc_tensor_poisoned": None,
    "bad_deque_empty": ["TQue::DeQue: queue is empty"],
    "bad_alloc_without_free": ["TQue::AllocTensor: buffer 0 of 1 is still in use"],
    # arithmetic, shifts, casts, reduce, sort
    "shift_and_arith_ok": None,
    "bad_shift_range": ["ShiftLeft: shift 33 outside [0,32]"],
    "bad_partial_overlap": ["Adds: dst and src overlap partially"],
    "bad_select_partial_overlap": ["Select: dst and src overlap partially"],
    "bad_gathermask_partial_overlap": ["GatherMask: dst and src overlap partially"],
    "bad_compare_after_gathermask": ["Compares: issued under a partial vector mask", "ResetMask"],
    "bad_compare_after_gather_tail": ["Compare: issued under a partial vector mask"],
    "compare_after_reset_mask_ok": None,
    "bad_compare_after_createvecindex": ["Compares: issued under a partial vector mask", "CreateVecIndex set it"],
    "bad_compare_after_reducemax": ["Compares: issued under a partial vector mask", "ReduceMax set it"],
    "bad_compare_after_extract": ["Compares: issued under a partial vector mask", "Extract set it"],
    "bad_half_compare_after_b32_gather": ["Compares: issued under a partial vector mask", "for 128 lanes",
                                          "Gather set it"],
    "compare_after_clobbers_reset_ok": None,
    "cast_ok": None,
    "bad_cast_mode": ["Cast: RoundMode::CAST_NONE not allowed"],
    "bad_cast_mode_half_int32": ["Cast: RoundMode::CAST_NONE not allowed"],
    "reduce_sort_ok": None,
    "bad_sort32_repeat": ["Sort32: repeatTime 256 outside 0..255"],
    "bad_sort_dst_unaligned": ["Sort: dst UB address", "is not 256-byte aligned"],
    "bad_sort_index_unaligned": ["Sort32: src1 UB address", "is not 128-byte aligned"],
    "tpipe_base_is_not_zero": None,
    "kernel_assert_fails": ["ascendc_assert(rows % 2 == 0) failed"],
    # events (card §6)
    "flags_ok": None,
    "bad_event_id_range": ["SetFlag<HardEvent::MTE2_V>: event id 8 outside 0..7"],
    "bad_double_setflag": ["SetFlag<HardEvent::S_MTE3>(1): set twice without a WaitFlag"],
    "bad_wait_without_set": ["WaitFlag<HardEvent::MTE3_MTE2>(0): no matching SetFlag"],
    "bad_set_without_wait_at_end": ["SetFlag<HardEvent::V_MTE3>(3) has no matching WaitFlag at kernel end"],
    # TPipe limits (card §3)
    "bad_two_live_tpipes": ["TPipe: a second TPipe was created while another is live"],
    "tpipe_destroy_then_new_ok": None,
    "bad_tbuf_after_reset": ["TBuf::Get: the TBuf's TPipe was reset or destroyed"],
    "bad_65_buffers": ["more than 64 buffers in one TPipe"],
    "buffers_64_ok": None,
    "bad_9_queue_buffers_one_position": ["more than 8 queue buffers at one TPosition"],
    "queue_buffers_8_per_position_ok": None,
    # launch, blocks, SyncAll
    "bad_blockdim_over_core_count": ["numBlocks=41 exceeds the configured core count 40"],
    "blockdim_core_count_ok": None,
    "bad_outside_launch": ["GetBlockIdx called outside avsg_emu::launch"],
    "aclrt_launch_ok": None,
    "syncall_ordering_ok": None,
    "syncall_soft_ok": None,
    "bad_syncall_soft_dirty_workspace": ["[block 1]", "SyncAll(soft): workspace counter of block 1 is 3"],
    "bad_block_fails_before_syncall": ["[block 1]", "event id 9 outside 0..7"],
    "bad_unequal_syncall_counts": ["SyncAll", "exited"],
    "syncall_soft_ub_workspace_poisoned": None,
    "sort_network_fuzz_ok": None,
    "granule_padded_pitch_ok": None,
    "granule_shared_unchecked_ok": None,
    "bad_granule_shared_by_two_blocks": ["32 B GM granule", "with no SyncAll between them"],
    "granule_handed_over_at_sync_all_ok": None,
    "bad_granule_rewritten_without_sync_all": ["32 B GM granule", "with no SyncAll between them"],
    "atomic_add_ok": None,
    # instrumentation and cost model
    "counters_ok": None,
    "counters_recorded_on_failure_ok": None,
}

# Pipe-hazard scoreboard (card §3, §6, §9; emulation/emu_hazard.h): each hazard class has a
# violating mini-kernel and a synchronised control. The message names both APIs and pipes, the
# UB/GM range and the missing sync.
_GAP = " or PIPE_ALL barrier in between"
HAZARD = {
    # MTE2 -> V
    "hazard_mte2_v_bad": ["hazard: Adds (PIPE_V) reads UB [0x20,0x40) written by DataCopy (PIPE_MTE2) "
                          "with no MTE2_V flag" + _GAP, "read-after-write"],
    "hazard_mte2_v_ok": None,
    "hazard_wrong_event_bad": ["Adds (PIPE_V) reads UB [0x20,0x40) written by DataCopy (PIPE_MTE2) with no MTE2_V flag"],
    "hazard_setflag_before_producer_bad": ["Adds (PIPE_V) reads UB [0x20,0x40) written by DataCopy (PIPE_MTE2) "
                                           "with no MTE2_V flag"],
    # MTE2 -> S
    "hazard_mte2_s_bad": ["hazard: LocalTensor::GetValue (PIPE_S) reads UB [0x34,0x38) written by DataCopy "
                          "(PIPE_MTE2) with no MTE2_S flag" + _GAP],
    "hazard_mte2_s_ok": None,
    "hazard_transitive_mte2_v_s_ok": None,
    # V -> S, S -> V
    "hazard_v_s_bad": ["LocalTensor::GetValue (PIPE_S) reads UB [0x20,0x24) written by Duplicate (PIPE_V) "
                       "with no V_S flag" + _GAP],
    "hazard_v_s_ok": None,
    "hazard_s_v_bad": ["Adds (PIPE_V) reads UB [0x20,0x40) written by LocalTensor::SetValue (PIPE_S) "
                       "with no S_V flag" + _GAP],
    "hazard_s_v_ok": None,
    # V -> MTE3, S -> MTE3
    "hazard_v_mte3_bad": ["DataCopy (PIPE_MTE3) reads UB [0x20,0x40) written by Duplicate (PIPE_V) "
                          "with no V_MTE3 flag" + _GAP],
    "hazard_v_mte3_ok": None,
    "hazard_s_mte3_bad": ["DataCopy (PIPE_MTE3) reads UB [0x20,0x40) written by LocalTensor::SetValue (PIPE_S) "
                          "with no S_MTE3 flag" + _GAP],
    "hazard_s_mte3_ok": None,
    "hazard_disjoint_bytes_ok": None,
    # MTE3 -> MTE2
    "hazard_mte3_mte2_ub_reuse_bad": ["DataCopy (PIPE_MTE2) writes UB [0x20,0x40) read by DataCopy (PIPE_MTE3) "
                                      "with no MTE3_MTE2 flag" + _GAP, "write-after-read"],
    "hazard_mte3_mte2_ub_reuse_ok": None,
    "hazard_mte3_mte2_gm_bad": ["DataCopy (PIPE_MTE2) reads GM [0x", "written by DataCopy (PIPE_MTE3) "
                                "with no MTE3_MTE2 flag" + _GAP],
    "hazard_mte3_mte2_gm_ok": None,
    # V -> V
    "hazard_v_v_raw_bad": ["Adds (PIPE_V) reads UB [0x20,0x40) written by Duplicate (PIPE_V) "
                           "with no PipeBarrier<PIPE_V>" + _GAP],
    "hazard_v_v_raw_ok": None,
    "hazard_v_v_war_bad": ["Duplicate (PIPE_V) writes UB [0x20,0x40) read by Adds (PIPE_V) "
                           "with no PipeBarrier<PIPE_V>" + _GAP, "write-after-read"],
    "hazard_v_v_waw_bad": ["Duplicate (PIPE_V) writes UB [0x20,0x40) written by Duplicate (PIPE_V) "
                           "with no PipeBarrier<PIPE_V>" + _GAP, "write-after-write"],
    "hazard_v_s_orders_later_v_ok": None,
    # write-after-read across pipes
    "hazard_v_mte2_war_bad": ["DataCopy (PIPE_MTE2) writes UB [0x20,0x40) read by Adds (PIPE_V) "
                              "with no V_MTE2 flag" + _GAP, "write-after-read"],
    "hazard_v_mte2_war_ok": None,
    "hazard_s_mte2_war_bad": ["DataCopy (PIPE_MTE2) writes UB [0x20,0x24) read by LocalTensor::GetValue (PIPE_S) "
                              "with no S_MTE2 flag" + _GAP, "write-after-read"],
    "hazard_s_mte2_war_ok": None,
    "hazard_mte3_v_war_bad": ["Duplicate (PIPE_V) writes UB [0x20,0x40) read by DataCopy (PIPE_MTE3) "
                              "with no MTE3_V flag" + _GAP, "write-after-read"],
    "hazard_mte3_v_war_ok": None,
    # same-pipe DMA destinations
    "hazard_mte2_waw_bad": ["DataCopy (PIPE_MTE2) writes UB [0x20,0x40) written by DataCopy (PIPE_MTE2) "
                            "with no PipeBarrier<PIPE_MTE2>" + _GAP],
    "hazard_mte2_waw_ok": None,
    "hazard_mte3_waw_gm_bad": ["DataCopy (PIPE_MTE3) writes GM [0x", "written by DataCopy (PIPE_MTE3) "
                               "with no PipeBarrier<PIPE_MTE3>" + _GAP],
    "hazard_mte3_waw_gm_ok": None,
    # scalar GM access vs DMA
    "hazard_gm_s_mte2_bad": ["DataCopy (PIPE_MTE2) reads GM [0x", "written by GlobalTensor::SetValue (PIPE_S) "
                             "with no S_MTE2 flag" + _GAP],
    "hazard_gm_s_mte2_ok": None,
    "hazard_gm_mte3_s_bad": ["GlobalTensor::GetValue (PIPE_S) reads GM [0x", "written by DataCopy (PIPE_MTE3) "
                             "with no MTE3_S flag" + _GAP],
    "hazard_gm_mte3_s_ok": None,
    # queue-provided syncs
    "hazard_queue_vecin_vecout_ok": None,
    "hazard_queue_bind_copy_ok": None,
    "hazard_queue_free_alloc_ok": None,
    "hazard_queue_no_scalar_sync_bad": ["LocalTensor::GetValue (PIPE_S) reads UB", "written by DataCopy (PIPE_MTE2) "
                                        "with no MTE2_S flag"],
    "hazard_queue_bind_no_vector_sync_bad": ["Adds (PIPE_V) reads UB", "written by DataCopy (PIPE_MTE2) "
                                             "with no MTE2_V flag"],
    # PIPE_ALL, SyncAll
    "hazard_pipe_all_ok": None,
    "hazard_syncall_ok": None,
    # API-specific modelling
    "hazard_createvecindex_no_barrier_bad": ["Adds (PIPE_V) reads UB [0x120,0x140) written by CreateVecIndex "
                                             "(PIPE_V) with no PipeBarrier<PIPE_V>"],
    "hazard_createvecindex_ok": None,
    "hazard_createvecindex_scalar_war_bad": ["CreateVecIndex (PIPE_S) writes UB [0x20,0x24)", "(PIPE_V) with no V_S flag"],
    "hazard_gathermask_count_ok": None,
    "hazard_gathermask_dst_scalar_bad": ["LocalTensor::GetValue (PIPE_S) reads UB [0x520,0x524) written by "
                                         "GatherMask (PIPE_V) with no V_S flag"],
    # escape hatch
    "hazard_checks_off_ok": None,
}
RUNTIME.update(HAZARD)


def _compile(args: list[str], timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([CXX, *BASE_FLAGS, *args], capture_output=True, text=True, timeout=timeout)


def _case_ranges(src: Path) -> dict[str, tuple[int, int]]:
    """Line ranges of the `// BEGIN name` ... `// END name` blocks of compile_cases.cpp."""
    ranges, start = {}, {}
    for no, line in enumerate(src.read_text().splitlines(), 1):
        m = re.match(r"// (BEGIN|END) (\w+)$", line.strip())
        if m and m.group(1) == "BEGIN":
            start[m.group(2)] = no
        elif m:
            ranges[m.group(2)] = (start[m.group(2)], no)
    return ranges


def _attribute_errors(stderr: str, src_name: str, ranges: dict[str, tuple[int, int]]) -> dict[str, list[str]]:
    """Map each g++ error to the case whose lines appear in its diagnostic chain.

    A chain starts at an "In instantiation of" / "In function" / "In member function" line and
    collects every `compile_cases.cpp:<line>` reference ("required from here", or the error
    line itself) until the error."""
    stderr = stderr.replace("\u2018", "'").replace("\u2019", "'")
    ref = re.compile(re.escape(src_name) + r":(\d+):")
    out: dict[str, list[str]] = {name: [] for name in ranges}
    chain: list[int] = []
    for line in stderr.splitlines():
        if "In instantiation of" in line or ": In function" in line or ": In member function" in line:
            chain = []
        m = ref.search(line)
        if m and "In file included from" not in line and not line.lstrip().startswith("from "):
            chain.append(int(m.group(1)))
        if "error:" in line:
            for name, (lo, hi) in ranges.items():
                if any(lo <= no <= hi for no in chain):
                    out[name].append(line)
    return out


@pytest.fixture(scope="session")
def builds(tmp_path_factory):
    """Build the runtime binary (two translation units in parallel) and compile the compile-time
    cases: once as control (must compile) and once with every case enabled (-DALL_CASES).
    Set AVSG_EMU_COMPILE_EACH=1 to also compile each case on its own (slower)."""
    if shutil.which(CXX) is None:
        pytest.skip(f"C++ compiler {CXX!r} not found")
    out = tmp_path_factory.mktemp("emu_build")
    exe = out / "runtime_cases"
    names = ["runtime_cases", "runtime_cases2", "runtime_cases_hazard"]
    objs = [out / f"{n}.o" for n in names]
    srcs = [CPP_DIR / f"{n}.cpp" for n in names]
    src_ct = CPP_DIR / "compile_cases.cpp"
    each = os.environ.get("AVSG_EMU_COMPILE_EACH") == "1"
    with cf.ThreadPoolExecutor(max_workers=2) as pool:
        rt = [pool.submit(_compile, ["-O1", "-c", str(s), "-o", str(o)]) for s, o in zip(srcs, objs)]
        control = pool.submit(_compile, ["-fsyntax-only", "-Wall", "-Wextra", str(src_ct)])
        all_cases = pool.submit(_compile, ["-fsyntax-only", "-DALL_CASES", str(src_ct)])
        single = {n: pool.submit(_compile, ["-fsyntax-only", f"-DCASE_{n}", str(src_ct)]) for n in COMPILE_FAIL} if each else {}
        rt_res = [f.result() for f in rt]
        control_res, all_res = control.result(), all_cases.result()
        single_res = {n: f.result() for n, f in single.items()}
    failed = [r for r in rt_res if r.returncode != 0]
    link = failed[0] if failed else _compile([*map(str, objs), "-o", str(exe)])
    ranges = _case_ranges(src_ct)
    return {
        "exe": exe,
        "rt": link,
        "control": control_res,
        "all": all_res,
        "ranges": ranges,
        "errors": _attribute_errors(all_res.stderr, src_ct.name, ranges),
        "single": single_res,
    }


@pytest.fixture(scope="session")
def runtime_exe(builds):
    res = builds["rt"]
    assert res.returncode == 0, f"runtime cases failed to build:\n{res.stderr[-4000:]}"
    return builds["exe"]


def test_compile_control_builds_cleanly(builds):
    res = builds["control"]
    assert res.returncode == 0, res.stderr[-4000:]
    assert "warning" not in res.stderr, res.stderr[-4000:]


def test_compile_case_list_is_complete(builds):
    assert set(builds["ranges"]) == set(COMPILE_FAIL)
    assert builds["all"].returncode != 0


@pytest.mark.parametrize("case", sorted(COMPILE_FAIL))
def test_compile_time_rule(builds, case):
    expected = COMPILE_FAIL[case]
    errors = builds["errors"][case]
    assert errors, f"CASE_{case} produced no compiler error (it must be rejected)"
    assert any(expected in e for e in errors), f"expected {expected!r} among:\n" + "\n".join(errors)
    if case in builds["single"]:
        res = builds["single"][case]
        assert res.returncode != 0 and expected in res.stderr.replace("\u2018", "'").replace("\u2019", "'")


def test_runtime_case_list_is_complete(runtime_exe):
    listed = subprocess.run([str(runtime_exe), "--list"], capture_output=True, text=True, timeout=30)
    assert listed.returncode == 0
    assert set(listed.stdout.split()) == set(RUNTIME)


@pytest.mark.parametrize("case", sorted(RUNTIME))
def test_runtime_rule(runtime_exe, case):
    res = subprocess.run([str(runtime_exe), case], capture_output=True, text=True, timeout=60)
    out = res.stdout + res.stderr
    expected = RUNTIME[case]
    if expected is None:
        assert res.returncode == 0 and "OK" in res.stdout, out
    else:
        assert res.returncode == 3, f"expected an EmuError, got rc={res.returncode}:\n{out}"
        assert out.startswith("EMUERROR:"), out
        for text in expected:
            assert text in out, f"expected {text!r} in {out!r}"
