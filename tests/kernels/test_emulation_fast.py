"""The fast build of the kernels against the strict build, bit for bit, and the switch between them.

Both builds come from the same kernel sources (CMakeLists.txt, op_host/cpu_kernels.h); the fast one
compiles the emulation's checks, hazard scoreboard, UB poisoning and counters out and runs blocks
sequentially. Here the same calls go through both, on clones of the same state and buffers, and
every output, the whole state, the stats and every byte of every ``dst`` must agree after every
call. The strict build is itself checked against the reference elsewhere (test_kernel_*.py).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import avsg
from avsg import backend, reference
from helpers.gather_cases import padded_slots, cases as gather_cases
from helpers.gather_cases import make_case, run_kernel, same_bytes
from helpers.plan_cases import draw

I32 = torch.int32
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def strict_after_each_test():
    """A failing test must not leave the process in the fast build for the tests after it."""
    yield
    backend.set_emulation("strict")


class StrictFastPair:
    """One plan state per build, driven in lockstep and compared after every call."""

    def __init__(self, R, S, H, L, matcher="hash"):
        self.S, self.H, self.L = S, H, L
        self.op = torch.ops.avsg.plan if matcher == "hash" else torch.ops.avsg.plan_dual_pointer
        state = reference.new_state(R, reference.Layout(S, H), L)
        self.states = {"strict": state, "fast": state.clone()}
        self.stats = {b: torch.zeros(R, 4, dtype=torch.int64) for b in self.states}

    def _each(self, call):
        results = {}
        for build in ("strict", "fast"):
            with backend.emulation(build):
                results[build] = call(self.states[build], self.stats[build])
        assert torch.equal(self.states["strict"], self.states["fast"]), "state differs"
        assert torch.equal(self.stats["strict"], self.stats["fast"]), "stats differ"
        return results

    def plan(self, topk, seq, valid_lens=None):
        out = self._each(lambda st_, stats: self.op(topk, seq, st_, stats, self.S, self.H, self.L,
                                                    valid_lens=valid_lens))
        for name, a, b in zip(("slots", "miss_pos", "miss_slots", "miss_counts"), out["strict"], out["fast"]):
            assert torch.equal(a, b), f"{name} differs between the strict and the fast build"
        return out["strict"]

    def invalidate(self, valid_lens):
        self._each(lambda st_, _: torch.ops.avsg.invalidate(st_, valid_lens, self.S, self.H))

    def reset(self, mask):
        self._each(lambda st_, _: torch.ops.avsg.reset(st_, mask, self.S, self.H, self.L))


def run_session(pair, ops, seed, R, T, K, S):
    gen = torch.Generator().manual_seed(seed)
    seq = torch.randint(1, 4 * S + 8, (R,), generator=gen, dtype=I32)
    for op in ops:
        if op in ("plan", "plan_drop"):            # plan_drop: the drop folded into the plan
            lens = seq - torch.randint(-2, T + 3, (R,), generator=gen, dtype=I32) if op == "plan_drop" else None
            seq = seq + torch.randint(0, T + 1, (R,), generator=gen, dtype=I32)
            pair.plan(draw(gen, R, T, K, seq, hot=2 * T * K), seq, lens)   # -1 padding, repeats, junk
        elif op == "invalidate":
            pair.invalidate(seq - torch.randint(-2, T + 3, (R,), generator=gen, dtype=I32))
        else:
            pair.reset(torch.rand(R, generator=gen) < 0.5)


# ------------------------------------------------------------------------------------ plan

geometry = st.tuples(
    st.integers(1, 4),                                   # R
    st.integers(1, 4),                                   # T (MTP)
    st.sampled_from([1, 3, 16, 31, 64, 100]),            # K
    st.sampled_from([1.0, 1.3, 2.0, 4.0]),               # S / (T*K)
    st.integers(1, 20),                                  # L
)
session = st.lists(st.sampled_from(["plan"] * 4 + ["plan_drop", "invalidate", "reset"]), min_size=2,
                   max_size=8)


@settings(max_examples=80, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(geometry, session, st.integers(0, 2**31 - 1), st.sampled_from(["hash", "dual_pointer"]))
def test_plan_sessions_fast_equals_strict(geo, ops, seed, matcher):
    R, T, K, ratio, L = geo
    S = max(T * K, int(T * K * ratio))
    H = reference.default_buckets(S)
    run_session(StrictFastPair(R, S, H, L, matcher), ops, seed, R, T, K, S)


@pytest.mark.parametrize("matcher", ["hash", "dual_pointer"])
def test_plan_real_size_fast_equals_strict(matcher):
    """K 2048, capacity 8192, 16384 buckets, MTP T=2, with invalidate and reset in between."""
    R, T, K, S, H, L = 3, 2, 2048, 8192, 16384, 4
    pair = StrictFastPair(R, S, H, L, matcher)
    gen = torch.Generator().manual_seed(17)
    seq = torch.full((R,), 20000, dtype=I32)
    for step in range(4):
        pair.plan(draw(gen, R, T, K, seq, hot=3 * K, pad=0.02, repeat=0.4, wild=0.01), seq)
        seq += T
        if step == 1:
            pair.invalidate(seq - 2)
        if step == 2:
            pair.reset(torch.tensor([False, True, False]))


# ---------------------------------------------------------------------------------- gather

def gather_both(case):
    """(per-core counts, dsts) of the strict and the fast build, each on its own dst clones."""
    results = {}
    for build in ("strict", "fast"):
        dsts = [padded_slots(d) for d in case.dsts]
        with backend.emulation(build):
            results[build] = (run_kernel(case, dsts), dsts)
    return results["strict"], results["fast"]


def assert_gathers_equal(case):
    (c_strict, d_strict), (c_fast, d_fast) = gather_both(case)
    assert torch.equal(c_strict, c_fast), f"per-core counts {c_fast.tolist()} != {c_strict.tolist()}"
    for i, (a, b) in enumerate(zip(d_strict, d_fast)):
        assert same_bytes(a, b), f"dst[{i}] differs between the strict and the fast build"
    return c_strict


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(gather_cases())
def test_gather_fast_equals_strict(case):
    assert_gathers_equal(case)


@pytest.mark.parametrize("partition", reference.PARTITIONS)
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_gather_mla_rows_several_pairs(partition, paged):
    """bf16 576-wide rows (1152 B), the 512 + 64 split and 656 B FP8 rows sharing one plan."""
    formats = [(torch.bfloat16, (576,)), (torch.bfloat16, (512,)), (torch.bfloat16, (64,)),
               (torch.uint8, (656,))]
    case = make_case(3, R=4, N=2 * 64, S=160, formats=formats, paged=paged, partition=partition,
                     cores=40, max_len=256, block_size=16)
    assert int(assert_gathers_equal(case).sum()) > 0


@pytest.mark.parametrize("policy", ["reuse", "lifetime"])
def test_plan_then_gather_at_real_size(policy):
    """The decode step the benchmark times: plan (R 4, T 2, K 2048, capacity 8192) + gather of
    1152 B rows from a paged pool, three steps, in both builds, under both policies."""
    R, T, K, S, block = 4, 2, 2048, 8192, 64
    ctx = 12288
    gen = torch.Generator().manual_seed(5)
    blocks_per_row = ctx // block
    table = torch.randperm(R * blocks_per_row, generator=gen).view(R, blocks_per_row).to(I32)
    pool = torch.randint(0, 256, (R * blocks_per_row, block, 1152), generator=gen, dtype=torch.uint8)
    bufs = {b: avsg.SparseKVBuffer(policy=policy, rows=R, capacity=S, topk=K, queries_per_step=T,
                                   device="cpu", check=False,   # draw() repeats positions
                                   max_context=ctx if policy == "reuse" else None)
            for b in ("strict", "fast")}
    dsts = {b: torch.zeros(R, S, 1152, dtype=torch.uint8) for b in bufs}
    seq = torch.full((R,), ctx - 8, dtype=I32)
    for _ in range(3):
        topk = draw(gen, R, T, K, seq, hot=3 * K, pad=0.02, repeat=0.4, wild=0.0)
        plans = {}
        for b in bufs:
            with backend.emulation(b):
                plans[b] = bufs[b].plan(topk, seq)
                avsg.gather(plans[b], src=pool, dst=dsts[b], block_table=table, block_size=block)
        for name in ("slots", "miss_pos", "miss_slots", "miss_counts"):
            assert torch.equal(getattr(plans["strict"], name), getattr(plans["fast"], name)), name
        assert torch.equal(dsts["strict"], dsts["fast"])
        assert torch.equal(bufs["strict"].state, bufs["fast"].state)
        seq += T
        if policy == "reuse":   # a rejected draft, as MTP serving does after verification
            for b in bufs:
                with backend.emulation(b):
                    bufs[b].invalidate(seq - 1)
            assert torch.equal(bufs["strict"].state, bufs["fast"].state)


# ---------------------------------------------------------------------------------- switch

def test_default_is_strict_and_reported():
    assert backend.get_emulation() == "strict"
    assert backend.backend_info()["emulation"] == "strict"
    backend.set_emulation("fast")
    assert backend.get_emulation() == "fast" and backend.backend_info()["emulation"] == "fast"
    backend.set_emulation("strict")
    assert backend.get_emulation() == "strict"


def test_fast_build_names_its_instruction_set_and_runs_on_the_machine_that_built_it():
    arch = backend.fast_emulation_arch()
    assert arch in ("generic", "x86-64-v2", "x86-64-v3", "x86-64-v4")
    assert backend.backend_info()["fast_emulation_arch"] == arch
    if arch != "generic":   # the level's defining features, as this CPU reports them
        flags = set()
        if os.path.exists("/proc/cpuinfo"):
            for line in open("/proc/cpuinfo"):
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
        need = {"x86-64-v2": {"sse4_2", "popcnt"}, "x86-64-v3": {"avx2", "fma", "bmi2"},
                "x86-64-v4": {"avx512f", "avx512bw", "avx512dq", "avx512vl"}}[arch]
        if flags:
            assert need <= flags, f"built for {arch}, this CPU lacks {sorted(need - flags)}"
    backend.set_emulation("fast")   # this machine built the library (tests run on a fresh build)
    assert backend.get_emulation() == "fast"


def _functions_using_wide_registers(library):
    """Demangled names of the library's functions whose code touches an AVX register or converts
    half in hardware (F16C works on xmm registers: emu_core.h's conversions in the fast copy)."""
    import re
    text = subprocess.run(["objdump", "-d", "--no-show-raw-insn", "-C", library], capture_output=True,
                          text=True, timeout=120, check=True).stdout
    found, name = set(), None
    for line in text.splitlines():
        head = re.match(r"^[0-9a-f]+ <(.*)>:$", line)
        if head:
            name = head.group(1)
        elif name and ("%ymm" in line or "%zmm" in line or "vcvtph2ps" in line or "vcvtps2ph" in line):
            found.add(name)
    return found


@pytest.mark.skipif(not __import__("shutil").which("objdump") or os.uname().machine != "x86_64",
                    reason="needs objdump on x86-64")
def test_only_the_fast_copy_uses_the_wider_instruction_set():
    """The strict emulation, the host code and the kernels' strict entries stay generic, so the
    strict build (and the check that refuses the fast one) run on any x86-64 CPU."""
    if backend.fast_emulation_arch() == "generic":
        pytest.skip("the fast build is generic too")
    library = next(Path(avsg.__file__).parent.glob("_C*.so"))
    wide = _functions_using_wide_registers(str(library))
    assert any("AscendC::fast::" in f for f in wide), "the fast copy was not built for its level"
    # (and what both copies share, the half type's conversions among it: kept from the strict
    # objects, so never the fast copy's F16C)
    strict_side = sorted(f for f in wide if f.startswith(("AscendC::strict::", "avsg_emu::strict::",
                                                          "avsg_cpu::", "avsg::", "avsg_plan", "avsg_gather",
                                                          "half::", "bfloat16_t::", "avsg_emu::numeric::")))
    strict_side = [f for f in strict_side if "_fast" not in f]
    assert strict_side == []
    # what the two copies share is kept from the first object that defines it: the fast ones last
    top = (ROOT / "CMakeLists.txt").read_text()
    assert "${AVSG_KERNEL_SOURCES} $<TARGET_OBJECTS:avsg_kernels_fast>)" in top


def test_context_manager_restores_the_previous_build():
    with backend.emulation("fast") as build:
        assert build == "fast" and backend.get_emulation() == "fast"
        with backend.emulation("strict"):
            assert backend.get_emulation() == "strict"
        assert backend.get_emulation() == "fast"
    assert backend.get_emulation() == "strict"
    with pytest.raises(KeyError):
        with backend.emulation("fast"):
            raise KeyError("boom")
    assert backend.get_emulation() == "strict"


@pytest.mark.parametrize("bad", ["Fast", "", "npu", None, 1])
def test_bad_build_names_the_argument(bad):
    with pytest.raises(ValueError, match="build"):
        backend.set_emulation(bad)
    with pytest.raises(ValueError, match="build"):
        with backend.emulation(bad):
            pass
    assert backend.get_emulation() == "strict"


def test_op_rejects_a_bad_build_too():
    with pytest.raises(ValueError, match="build: expected 'strict' or 'fast'"):
        torch.ops.avsg.set_emulation("turbo")


def _import_with_env(value):
    env = dict(os.environ, AVSG_EMULATION=value, PYTHONPATH=os.pathsep.join(
        [str(Path(avsg.__file__).parents[1]), os.environ.get("PYTHONPATH", "")]))
    code = "import avsg; print(avsg.backend.get_emulation())"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120)


def test_env_var_selects_the_build_at_import():
    done = _import_with_env("fast")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "fast"
    # a value it cannot apply leaves the strict build and never breaks the import (the CLI
    # refuses it before any command, naming the variable: tests/cli)
    bad = _import_with_env("quick")
    assert bad.returncode == 0, bad.stderr
    assert bad.stdout.strip() == "strict"


def test_counters_raise_after_a_fast_launch_and_return_after_a_strict_one():
    case = make_case(1, R=2, N=8, S=10, formats=[(torch.uint8, (64,))], paged=False,
                     partition="miss", cores=4)
    with backend.emulation("fast"):
        run_kernel(case, [padded_slots(d) for d in case.dsts])
    with pytest.raises(RuntimeError, match="fast emulation build"):
        backend.last_launch_counters()
    run_kernel(case, [padded_slots(d) for d in case.dsts])
    assert backend.last_launch_counters().blocks == 4


# ------------------------------------------------------------------- SyncAll in the fast build

FAST_SYNC_CPP = ROOT / "tests" / "kernels" / "emulation" / "cpp" / "fast_syncall.cpp"


@pytest.fixture(scope="module")
def fast_sync_binary(tmp_path_factory):
    exe = tmp_path_factory.mktemp("fast_sync") / "fast_syncall"
    cmd = [os.environ.get("CXX", "g++"), "-std=c++17", "-O1", "-pthread", "-DAVSG_EMU_FAST=1",
           f"-I{ROOT / 'emulation'}", str(FAST_SYNC_CPP), "-o", str(exe)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return exe


@pytest.mark.parametrize("case", ["exchange_rounds", "single_block", "soft_sync", "unequal_counts",
                                  "failure_breaks_the_barrier"])
def test_syncall_in_the_fast_build(fast_sync_binary, case):
    """The fast build runs blocks one after another but must still meet in SyncAll: blocks
    exchange values through GM across barriers (C++ checks every value), a block that calls
    SyncAll after block 0 finished without it fails as in the strict build, and a block failing
    while the others wait fails the launch with its own error, every waiting block unwound."""
    done = subprocess.run([str(fast_sync_binary), case], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().endswith("OK"), done.stdout


# ------------------------------------------------------------------- half conversions

HALF_CPP = ROOT / "tests" / "kernels" / "emulation" / "cpp" / "half_convert.cpp"


def _cpu_has_f16c() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            return " f16c" in f.read()
    except OSError:
        return False


@pytest.mark.skipif(not _cpu_has_f16c(), reason="this CPU has no F16C: the fast build converts halves in software")
def test_f16c_half_conversions_equal_the_software_ones(tmp_path):
    """The fast build for an F16C host converts float <-> half in hardware (emu_core.h), the
    strict build in software: every half, every float at the rounding boundaries of its dropped
    bits and 4M random floats convert the same way both ways (NaN payloads aside)."""
    exe = tmp_path / "half_convert"
    cmd = [os.environ.get("CXX", "g++"), "-std=c++17", "-O2", "-mf16c", "-pthread", "-DAVSG_EMU_FAST=1",
           f"-I{ROOT / 'emulation'}", str(HALF_CPP), "-o", str(exe)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    done = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "OK", done.stdout + done.stderr
