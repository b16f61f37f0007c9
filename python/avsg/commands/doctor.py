"""``avsg doctor``: what this machine can run, and whether it runs it right.

Prints the backends present; the torch, torch_npu, CANN and driver versions; the core counts;
how host memory gets mapped for the AI cores (and whether an AI core reads the first and the last
row of a registered pool); whether a gather of runs of adjacent 656 B rows, which the kernel reads
many rows per DMA with each UB row padded to 32 B, matches the reference byte for byte (on every
backend present: the CPU emulation models the documented padding, the NPU is the check); how the
NPU library launches a split plan (with the batch schedule
mode and a launch timeout where CANN has the config launch) and whether the plan's split lookup
works on this NPU, with a plan_gather (plan and copy in one launch) beside it (both wait across
cores, so the split and the fused step are off on the NPU in every build until proven: tried in a
child process killed after a time limit, then AVSG_NPU_SPLIT=1 turns them on); then a
self-test: plan +
gather over a small multi-step session on every backend present, compared bit for bit with the
reference on CPU (the NPU part is bounded by ``--seconds``, 30 by default). The last line is a
one-line verdict. Without an NPU it says what is missing and exits 0: a CPU-only machine is a
supported setup, not a failure. It exits 1 only when something present is broken (a backend
disagreeing with the reference, a registration that fails).

    avsg doctor [--seconds 30] [--no-selftest] [--json report.json]

Run it first on a new Ascend machine (``scripts/build_npu.sh --test`` does, and writes its output
into the report file to attach to an issue).
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import platform
import shutil
import time
from typing import Callable, List, Optional

import torch

from ..cli_util import float_in, output_path, reject_together, writing

CANN_VERSION_FILES = ("ascend_toolkit_install.info", "ascend_cann_install.info", "version.info",
                      "runtime/version.info")
DEFAULT_CANN = "/usr/local/Ascend/ascend-toolkit/latest"
DEFAULT_DRIVER = "/usr/local/Ascend/driver"


@dataclasses.dataclass
class Check:
    name: str
    status: str          # "ok", "missing" (absent here: fine), "fail" (present and broken), "info"
    detail: str


def read_key_value(path: str, key: str) -> Optional[str]:
    """First ``key=value`` (case-insensitive key) in a text file, as op_host/npu/host_register.cpp."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                name, eq, value = line.partition("=")
                if eq and name.strip().lower() == key.lower():
                    return value.strip()
    except OSError:
        return None
    return None


def cann_version() -> Check:
    home = os.environ.get("ASCEND_HOME_PATH") or DEFAULT_CANN
    if not os.path.isdir(home):
        return Check("CANN", "missing", f"not found (ASCEND_HOME_PATH unset, no {DEFAULT_CANN})")
    for name in CANN_VERSION_FILES:
        version = read_key_value(os.path.join(home, name), "version")
        if version:
            return Check("CANN", "ok", f"{version} at {home}")
    return Check("CANN", "info", f"at {home}, version unknown (none of {', '.join(CANN_VERSION_FILES)})")


def driver_version() -> Check:
    root = os.environ.get("ASCEND_DRIVER_PATH") or DEFAULT_DRIVER
    version = read_key_value(os.path.join(root, "version.info"), "version")
    if version:
        return Check("driver", "ok", f"{version} at {root}")
    return Check("driver", "missing", f"not found (no {os.path.join(root, 'version.info')})")


def module_version(name: str) -> Check:
    try:
        module = importlib.import_module(name)
    except ImportError as e:
        return Check(name, "missing", f"not installed ({e})")
    except Exception as e:  # noqa: BLE001  (a broken install is worth reporting, not raising)
        return Check(name, "fail", f"does not import: {type(e).__name__}: {e}")
    return Check(name, "ok", f"{getattr(module, '__version__', '?')} ({os.path.dirname(module.__file__)})")


def npu_visible() -> Optional[int]:
    """NPUs torch_npu sees, or None without torch_npu."""
    try:
        import torch_npu  # noqa: F401
    except Exception:  # noqa: BLE001
        return None
    return torch.npu.device_count() if hasattr(torch, "npu") and torch.npu.is_available() else 0


def npu_cores() -> str:
    try:
        props = torch.npu.get_device_properties(0)
    except Exception as e:  # noqa: BLE001
        return f"unknown ({type(e).__name__})"
    found = {k: getattr(props, k) for k in ("vector_core_num", "cube_core_num") if hasattr(props, k)}
    name = getattr(props, "name", "?")
    return f"{name}: " + (", ".join(f"{k}={v}" for k, v in found.items()) or "core counts not exposed "
                          "by this torch_npu (the ops query platform_ascendc at launch)")


# ------------------------------------------------------------------------------ self-test

def session_inputs(steps: int, rows: int = 2, queries: int = 2, topk: int = 64, context: int = 700,
                   seed: int = 0):
    """A small decode session: overlapping selections step after step, -1 padding, MTP-style
    repeats across the query tokens."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for step in range(steps):
        seq = torch.full((rows,), context - steps + step + 1, dtype=torch.int32)
        picks = torch.empty(rows, queries, topk, dtype=torch.int32)
        for r in range(rows):
            pool = torch.randperm(int(seq[r]), generator=g)[: topk * 2]
            for t in range(queries):
                picks[r, t] = pool[torch.randperm(pool.numel(), generator=g)[:topk]].to(torch.int32)
        picks[:, :, -3:] = -1
        out.append((picks, seq))
    return out


def selftest(device: str, steps: int, deadline: float) -> Check:
    """plan + gather on ``device`` against the reference on CPU, every output and byte."""
    from .. import reference
    from ..buffer import SparseKVBuffer, gather, kv_slots
    rows, queries, topk, capacity, row_bytes, context = 2, 2, 64, 384, 656, 700
    buf = SparseKVBuffer(rows=rows, capacity=capacity, topk=topk, queries_per_step=queries,
                         device=device, max_context=context)
    layout = buf.layout
    ref_state = reference.new_state(rows, layout, buf.lifetime, policy=buf.policy)
    ref_stats = torch.zeros(rows, len(reference.STAT_NAMES), dtype=torch.int64)
    host = torch.randint(0, 256, (rows, context, row_bytes), dtype=torch.uint8,
                         generator=torch.Generator().manual_seed(1))
    src = host
    if device != "cpu":
        from .. import backend
        src = backend.alloc_host_pool(host.shape, host.dtype)
        src.copy_(host)
        backend.register_host_pool(src)
    dst = kv_slots(rows * capacity, (row_bytes,), torch.uint8, device).view(rows, capacity, row_bytes)
    ref_dst = torch.zeros(rows, capacity, row_bytes, dtype=torch.uint8)
    done = 0
    for picks, seq in session_inputs(steps, rows, queries, topk, context):
        if time.monotonic() > deadline:
            break
        plan = buf.plan(picks.to(device), seq.to(device))
        want = reference.plan(ref_state, ref_stats, picks, seq, layout, buf.lifetime,
                              policy=buf.policy)
        got = (plan.slots, plan.miss_pos, plan.miss_slots, plan.miss_counts)
        for name, g, w in zip(("slots", "miss_pos", "miss_slots", "miss_counts"), got, want):
            if not torch.equal(g.cpu(), w):
                return Check(f"self-test {device}", "fail", f"step {done}: {name} differs from the reference")
        if not torch.equal(buf.state.cpu(), ref_state):
            return Check(f"self-test {device}", "fail", f"step {done}: the state differs from the reference")
        gather(plan, src, dst)
        reference.gather(want[1], want[2], want[3], [host], [ref_dst], None, None, "miss", 40)
        if not torch.equal(dst.cpu(), ref_dst):
            return Check(f"self-test {device}", "fail", f"step {done}: gathered bytes differ from the reference")
        done += 1
    if device != "cpu":
        from .. import backend
        torch.npu.synchronize()
        backend.unregister_host_pool(src)
    if done == 0:
        return Check(f"self-test {device}", "fail", "no step finished within the time limit")
    return Check(f"self-test {device}", "ok", f"plan + gather exact for {done} steps "
                 f"({rows} rows x {queries}x{topk} selections, capacity {capacity}, {row_bytes} B rows)")


# ------------------------------------------------------------------------------ report

def run_checks(seconds: float, selftest_on: bool, say: Callable[[str], None]) -> List[Check]:
    from .. import backend
    checks: List[Check] = []

    def add(check: Check) -> None:
        checks.append(check)
        mark = {"ok": "ok  ", "missing": "--  ", "fail": "FAIL", "info": "    "}[check.status]
        say(f"  [{mark}] {check.name:<22} {check.detail}")

    import avsg
    say(f"avsg doctor: {os.path.dirname(avsg.__file__)}, python {platform.python_version()}, "
        f"{platform.machine()} {platform.system()}")
    add(Check("torch", "ok", f"{torch.__version__}"))
    add(module_version("torch_npu"))
    add(cann_version())
    add(driver_version())
    smi = shutil.which("npu-smi")
    add(Check("npu-smi", "ok" if smi else "missing", smi or "not on PATH"))

    info = backend.backend_info()
    cpu_ops = [op for op, impl in info["cpu"].items() if impl == "kernel"] if isinstance(info["cpu"], dict) else []
    add(Check("backend cpu", "ok", f"AscendC kernels through the {info['emulation']} emulation "
              f"({', '.join(cpu_ops) or 'reference only'}); {info['emulated_cores']} emulated AIV cores; "
              f"fast build for {info['fast_emulation_arch']}"))
    launch = split_launch_note(info["npu_split_launch"])
    if info["npu_loaded"]:
        add(Check("backend npu", "ok", f"{info['npu_library']}; {launch}"))
    elif info["npu_library"]:
        add(Check("backend npu", "fail", f"built but not loaded: {info['npu_error']}; {launch}"))
    else:
        add(Check("backend npu", "missing", info["npu_error"] or "not built (no CANN at build time: "
                  "scripts/build_npu.sh on an Ascend machine)"))

    visible = npu_visible()
    if visible is None:
        add(Check("NPUs", "missing", "torch_npu not importable"))
    elif visible == 0:
        add(Check("NPUs", "missing", "torch_npu sees no NPU"))
    else:
        add(Check("NPUs", "ok", f"{visible} visible; {npu_cores()}"))

    npu_ready = bool(info["npu_loaded"]) and bool(visible)
    if npu_ready:
        path, describe = backend.host_register_info()[:2]
        add(Check("host registration", "info", describe))
        add(host_registration_probe(backend))
        add(adjacent_rows_probe("npu"))
        add(split_lookup_probe(min(seconds, 60.0), info["npu_split_launch"]))
    else:
        add(Check("host registration", "missing", "needs the NPU backend and an NPU"))
        add(Check("AI-core host reads", "missing", "needs the NPU backend and an NPU"))
        add(Check("adjacent rows npu", "missing", "needs the NPU backend and an NPU"))
        add(Check("split lookup", "missing", "needs the NPU backend and an NPU (the CPU emulation "
                  "splits only with AVSG_NPU_SPLIT=1, as the NPU does)"))

    if selftest_on:
        add(adjacent_rows_probe("cpu"))
        add(selftest("cpu", steps=3, deadline=time.monotonic() + seconds))
        if npu_ready:
            try:
                add(selftest("npu", steps=1000, deadline=time.monotonic() + seconds))
            except Exception as e:  # noqa: BLE001  (report, do not crash the doctor)
                add(Check("self-test npu", "fail", f"{type(e).__name__}: {e}"))
        else:
            add(Check("self-test npu", "missing", "needs the NPU backend and an NPU"))
    return checks


def host_registration_probe(backend) -> Check:
    """Register a pool, gather its first and its last row (the two ends of the registered range,
    where an off-by-one mapping faults, error 507035) and one from the middle on the NPU,
    compare: does an AI core read host memory through the mapping, end to end?"""
    rows, row_bytes = 1024, 64
    try:
        pool = backend.alloc_host_pool((1, rows, row_bytes), torch.uint8)
        pool.copy_(torch.randint(0, 256, (1, rows, row_bytes), dtype=torch.uint8,
                                 generator=torch.Generator().manual_seed(7)))
        backend.register_host_pool(pool)
    except Exception as e:  # noqa: BLE001
        return Check("AI-core host reads", "fail", f"registration failed: {e}")
    try:
        picks = [0, rows // 2 + 3, rows - 1]                    # pos: first, middle, last row
        miss_pos = torch.full((1, 4), -1, dtype=torch.int32)
        miss_pos[0, :3] = torch.tensor(picks, dtype=torch.int32)
        miss_slots = torch.tensor([[1, 3, 0, -1]], dtype=torch.int32)
        counts = torch.tensor([3], dtype=torch.int32)
        dst = torch.zeros(1, 4, row_bytes, dtype=torch.uint8, device="npu")
        torch.ops.avsg.gather(miss_pos.npu(), miss_slots.npu(), counts.npu(), [pool], [dst], None, 0, "miss", 1)
        torch.npu.synchronize()
        got = dst.cpu()
        bad = [name for name, slot, pos in zip(("first", "middle", "last"), (1, 3, 0), picks)
                if not torch.equal(got[0, slot], pool[0, pos])]
        if bad:
            return Check("AI-core host reads", "fail", f"gathered bytes differ from the host rows: {', '.join(bad)}")
        return Check("AI-core host reads", "ok", f"a gather read the first, a middle and the last of {rows} "
                     "rows of a registered pool exactly")
    except Exception as e:  # noqa: BLE001
        return Check("AI-core host reads", "fail", f"{type(e).__name__}: {e}")
    finally:
        try:
            backend.unregister_host_pool(pool)
        except Exception:  # noqa: BLE001
            pass


ADJACENT_ROW_BYTES = 656      # FP8 MLA row: not a multiple of 32 B, so UB rows carry padding
ADJACENT_RUN = 160            # consecutive positions per request row
ADJACENT_CORES = 4            # "miss" partition: 80 positions per core, read 32 + 32 + 16 rows at a time


def adjacent_rows_case():
    """The inputs of ``adjacent_rows_probe``: a pool ``[2, 320, 656]`` of random bytes; row 0
    misses positions 7..166, row 1 positions 120..279 (runs of adjacent host rows). Row 0's
    slots: the first 64 consecutive (one write per read), then pairs swapped, then descending
    (one write per row); row 1's slots descending. Capacity 192 slots."""
    R, L, S, n = 2, 320, 192, ADJACENT_RUN
    gen = torch.Generator().manual_seed(11)
    host = torch.randint(0, 256, (R, L, ADJACENT_ROW_BYTES), dtype=torch.uint8, generator=gen)
    miss_pos = torch.stack([torch.arange(7, 7 + n), torch.arange(120, 120 + n)]).to(torch.int32)
    first = list(range(64))
    pairs = [64 + (i ^ 1) for i in range(48)]
    down = list(range(191, 191 - (n - 112), -1))
    miss_slots = torch.tensor([first + pairs + down, list(range(S - 1, S - 1 - n, -1))], dtype=torch.int32)
    miss_counts = torch.full((R,), n, dtype=torch.int32)
    return host, miss_pos, miss_slots, miss_counts, S


def adjacent_rows_probe(device: str, gather: Optional[Callable] = None) -> Check:
    """Gather runs of ADJACENT 656 B rows (FP8) over several cores on ``device`` and compare every
    byte of every slot, and the per-core counts, with the reference. A multi-row read puts host row
    k of a run at k * roundup32(656) = k * 672 in UB and the writes read it back there: DataCopyPad
    pads every block to 32 B on the UB side (op_kernel/gather_kernel.h, UbRowPitch, cites the
    rule). If this device padded differently, the first row of every read would be right and the
    rows after it wrong; the detail says which. ``gather``: the op (tests pass a stand-in)."""
    from .. import backend, reference
    from ..buffer import kv_slots
    gather = gather or torch.ops.avsg.gather
    name = f"adjacent rows {device}"
    host, miss_pos, miss_slots, miss_counts, S = adjacent_rows_case()
    R = host.shape[0]
    src = host
    try:
        if device != "cpu":
            src = backend.alloc_host_pool(host.shape, host.dtype)
            src.copy_(host)
            backend.register_host_pool(src)
    except Exception as e:  # noqa: BLE001
        return Check(name, "fail", f"registration failed: {e}")
    try:
        dst = kv_slots(R * S, (ADJACENT_ROW_BYTES,), torch.uint8, device).view(R, S, ADJACENT_ROW_BYTES)
        got_counts = gather(miss_pos.to(device), miss_slots.to(device), miss_counts.to(device), [src], [dst],
                            None, 0, "miss", ADJACENT_CORES)
        if device != "cpu":
            torch.npu.synchronize()
        want = torch.zeros(R, S, ADJACENT_ROW_BYTES, dtype=torch.uint8)
        want_counts = reference.gather(miss_pos, miss_slots, miss_counts, [host], [want], None, None, "miss",
                                       ADJACENT_CORES)
        got = dst.cpu()
        bad = (got != want).any(dim=-1).nonzero().tolist()      # [row, slot] of every wrong slot
        if bad:
            entry = {(r, int(miss_slots[r, j])): j for r in range(R) for j in range(ADJACENT_RUN)}
            r, slot = bad[0]
            j = entry.get((r, slot))
            where = (f"row {r} slot {slot} (pos {int(miss_pos[r, j])})" if j is not None
                     else f"row {r} slot {slot}, where no miss goes")
            # each core's share starts a read; if those rows are right and later ones are not,
            # the rows of a multi-row read land at another UB pitch than the one the kernel uses
            share = R * ADJACENT_RUN // ADJACENT_CORES
            heads_ok = not any(entry.get((rr, ss), -1) % share == 0 for rr, ss in bad)
            hint = ("; the first row of each core's share is right, later rows of its reads are not: "
                    "DataCopyPad's UB row pitch on this device is not the one op_kernel/gather_kernel.h "
                    "(UbRowPitch) cites" if heads_ok else "")
            return Check(name, "fail", f"{len(bad)} of {R * ADJACENT_RUN} gathered {ADJACENT_ROW_BYTES} B rows "
                         f"differ from the reference, first at {where}{hint}")
        if not torch.equal(got_counts.cpu(), want_counts):
            return Check(name, "fail", f"per-core counts {got_counts.cpu().tolist()} != reference "
                         f"{want_counts.tolist()}")
        return Check(name, "ok", f"{R} x {ADJACENT_RUN} adjacent {ADJACENT_ROW_BYTES} B rows over "
                     f"{ADJACENT_CORES} cores (multi-row reads) match the reference byte for byte")
    except Exception as e:  # noqa: BLE001  (report, do not crash the doctor)
        return Check(name, "fail", f"{type(e).__name__}: {e}")
    finally:
        if device != "cpu":
            try:
                backend.unregister_host_pool(src)
            except Exception:  # noqa: BLE001
                pass


SPLIT_ENV = "AVSG_NPU_SPLIT"
SPLIT_TIMEOUT_ENV = "AVSG_NPU_SPLIT_TIMEOUT"
DEFAULT_SPLIT_TIMEOUT = 30     # seconds: op_host/npu/split_launch.h, kDefaultSplitTimeoutSeconds


def split_launch_note(launch: Optional[str]) -> str:
    """One line: how the built NPU library launches a split plan (backend.built_split_launch)."""
    if launch == "batch":
        timeout = os.environ.get(SPLIT_TIMEOUT_ENV) or str(DEFAULT_SPLIT_TIMEOUT)
        return (f"split plan launch: batch schedule mode, timeout {timeout} s ({SPLIT_TIMEOUT_ENV}); "
                f"the split is off unless {SPLIT_ENV}=1")
    if launch is None:
        return (f"split plan launch: ACLRT_LAUNCH_KERNEL (library without the tag); "
                f"the split is off unless {SPLIT_ENV}=1")
    why = launch.split(":", 1)[1].strip() if ":" in launch else launch
    return (f"split plan launch: ACLRT_LAUNCH_KERNEL, no batch schedule mode ({why}); "
            f"the split is off unless {SPLIT_ENV}=1")


def plan_gather_probe(device: str, steps: int = 3) -> Optional[str]:
    """``plan_gather`` (plan and copy in one launch, the serving step where the copy is the
    package's) on ``device`` against ``reference.plan_gather``, in three small sessions:

    * 2 rows, one a block: the plan meets the other blocks in a SyncAll as soon as its victims
      are chosen and the copy runs on the blocks that own no row while the owners finish
      (op_kernel/plan_gather.cpp); 2 selection chunks per row, so with ``AVSG_NPU_SPLIT=1`` (the
      doctor's child) the lookup is split too (a row's own core looking up none) and every
      block meets the others twice;
    * ``cores // 3`` rows of 4 chunks: with the switch, every row's own core looks up chunks
      with its helpers (``buffer.lookup_split``), two of them;
    * 3 rows more than the cores, so some blocks plan two rows: a block plans its idle rows
      first and meets the others at its last row's victims; every third row is idle
      (``seq_len`` 0), one of them with a drop to apply.

    Compares the plan's outputs, the state, the statistics, the per-core counts and every copied
    byte. Returns what differs, or None."""
    from ..buffer import get_num_cores
    cores = get_num_cores()
    bad = _plan_gather_session(device, 2, 2048, 2, 512, 4096, steps, idle_every=0)
    if bad is None:
        bad = _plan_gather_session(device, max(1, cores // 3), 2048, 2, 1024, 4096, steps,
                                   idle_every=0)
    if bad is None:
        bad = _plan_gather_session(device, cores + 3, 256, 1, 64, 1024, steps, idle_every=3)
    return bad


def _plan_gather_session(device: str, R: int, S: int, T: int, K: int, context: int, steps: int,
                         idle_every: int) -> Optional[str]:
    """``plan_gather_probe``'s session of ``R`` rows over a host pool of ``context`` positions per
    row: every ``idle_every``-th row idle (0: none), the first idle row dropping what it holds
    past position 100 from the second step on."""
    from .. import backend, reference
    from ..buffer import copy_cores_beside_plan, get_num_cores, kv_slots
    L, row_bytes = 4, 656
    H = reference.default_buckets(S)
    layout = reference.Layout(S, H, 0)
    ref_state = reference.new_state(R, layout, L)
    ref_stats = torch.zeros(R, len(reference.STAT_NAMES), dtype=torch.int64)
    state, stats = ref_state.clone().to(device), ref_stats.clone().to(device)
    gen = torch.Generator().manual_seed(5)
    host = torch.randint(0, 256, (R, context, row_bytes), dtype=torch.uint8, generator=gen)
    src = host
    if device != "cpu":
        src = backend.alloc_host_pool(host.shape, host.dtype)
        src.copy_(host)
        backend.register_host_pool(src)
    dst = kv_slots(R * S, (row_bytes,), torch.uint8, device).view(R, S, row_bytes)
    ref_dst = dst.cpu().clone()
    cores = copy_cores_beside_plan(get_num_cores(), R)
    idle = torch.zeros(R, dtype=torch.bool)
    if idle_every:
        idle[1::idle_every] = True
    try:
        for step in range(steps):
            seq = torch.full((R,), context - steps + step + 1, dtype=torch.int32)
            topk = torch.randint(0, int(seq[0]), (R, T, K), dtype=torch.int32, generator=gen)
            lens = None
            if idle_every and step:          # the idle rows sit this step out, one drops
                seq = torch.where(idle, torch.zeros_like(seq), seq)
                lens = torch.full((R,), reference.MAX_POSITION, dtype=torch.int32)
                lens[1] = 100
            got = torch.ops.avsg.plan_gather(topk.to(device), seq.to(device), state, stats, S, H, L, 0, 0,
                                             None if lens is None else lens.to(device), [src], [dst],
                                             None, 0, "miss", cores)
            want = reference.plan_gather(ref_state, ref_stats, topk, seq, layout, L, [host], [ref_dst],
                                         None, None, "miss", cores, valid_lens=lens)
            for name, a, b in zip(("slots", "miss_pos", "miss_slots", "miss_counts", "per-core counts"),
                                  got, want):
                if not torch.equal(a.cpu(), b):
                    return f"plan_gather ({R} rows) step {step}: {name} differs from the reference"
            if not torch.equal(state.cpu(), ref_state) or not torch.equal(stats.cpu(), ref_stats):
                return f"plan_gather ({R} rows) step {step}: the state differs from the reference"
            if not torch.equal(dst.cpu(), ref_dst):
                return f"plan_gather ({R} rows) step {step}: copied bytes differ from the reference"
    finally:
        if device != "cpu":
            torch.npu.synchronize()
            backend.unregister_host_pool(src)
    return None


def split_plan_probe(device: str) -> Optional[str]:
    """The hash plan with its lookup split (run with AVSG_NPU_SPLIT=1) on ``device`` against the
    reference, two steps in each of two sessions: one row of 8 selection chunks (T 2, K 2048),
    which takes a core per chunk and one more (its own core looks up none) wherever the device
    has 9 cores; and ``cores // 4`` rows of 4 chunks (T 1), where every row's own core looks
    up a chunk too (``buffer.lookup_split``). Returns what differs, in one line, or None."""
    from .. import reference
    from ..buffer import get_num_cores
    S, H, L, K = 8192, 8192, 4, 2048
    layout = reference.Layout(S, H, 0)
    gen = torch.Generator().manual_seed(3)
    for R, T in ((1, 2), (max(1, get_num_cores() // 4), 1)):
        ref_state = reference.new_state(R, layout, L)
        ref_stats = torch.zeros(R, len(reference.STAT_NAMES), dtype=torch.int64)
        state, stats = ref_state.clone().to(device), ref_stats.clone().to(device)
        seq = torch.full((R,), 3 * S, dtype=torch.int32)
        for step in range(2):
            topk = torch.randint(0, 2 * S, (R, T, K), dtype=torch.int32, generator=gen)
            got = torch.ops.avsg.plan(topk.to(device), seq.to(device), state, stats, S, H, L, 0, 0)
            want = reference.plan(ref_state, ref_stats, topk, seq, layout, L)
            where = f"split plan ({R} row{'s' if R > 1 else ''} of {T} x top-{K}) step {step}"
            for name, a, b in zip(("slots", "miss_pos", "miss_slots", "miss_counts"), got, want):
                if not torch.equal(a.cpu(), b):
                    return f"{where}: {name} differs from the reference"
            if not torch.equal(state.cpu(), ref_state):
                return f"{where}: the state differs from the reference"
            seq += T
    return None


def split_probe_child() -> int:
    """Run in a child process with AVSG_NPU_SPLIT=1: ``split_plan_probe`` (the hash plan whose
    lookup is split over idle cores and waits in a soft SyncAll) on the NPU, then
    ``plan_gather_probe`` (the other launch that waits across cores, which the serving core
    fuses where the split may run). Exit 0 when exact; prints what differs otherwise."""
    from .. import backend
    if not backend.load_npu_backend():
        print(f"the NPU backend is not loaded: {backend.backend_info()['npu_error']}")
        return 1
    bad = split_plan_probe("npu") or plan_gather_probe("npu")
    if bad:
        print(bad)
        return 1
    return 0


def split_lookup_probe(seconds: float, launch: Optional[str] = None) -> Check:
    """The split lookup is off on the NPU in every build until proven: its cross-core wait has no
    timeout of its own, and the batch schedule mode and launch timeout a ``"batch"`` library
    launches it with (``launch``, backend.built_split_launch) have not run on a card. Run it in a
    child process that is killed after ``seconds``; report whether it matched the reference and
    that AVSG_NPU_SPLIT=1 turns it on (or, in one line, why it stays off)."""
    import subprocess
    import sys
    env = dict(os.environ, **{SPLIT_ENV: "1"})
    code = "import sys; from avsg.commands.doctor import split_probe_child; sys.exit(split_probe_child())"
    try:
        res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                             timeout=seconds)
    except subprocess.TimeoutExpired:
        return Check("split lookup", "fail", f"stays off: the split plan did not finish in {seconds:g} s "
                     "(a cross-core wait that never completed; the child was killed)")
    if res.returncode != 0:
        why = (res.stdout.strip() or res.stderr.strip() or f"exit {res.returncode}").splitlines()[-1]
        return Check("split lookup", "fail", f"stays off: {why}")
    mode = " (batch schedule mode)" if launch == "batch" else ""
    on = os.environ.get(SPLIT_ENV) == "1"
    return Check("split lookup", "ok", f"a split plan{mode} and a plan_gather matched the reference on this device; "
                 + (f"on ({SPLIT_ENV}=1)" if on else f"turn it on with {SPLIT_ENV}=1"))


def verdict(checks: List[Check]) -> str:
    failed = [c.name for c in checks if c.status == "fail"]
    if failed:
        return f"verdict: BROKEN: {', '.join(failed)} failed (details above)"
    names = {c.name: c for c in checks}
    npu = names.get("self-test npu")
    if npu is not None and npu.status == "ok":
        return "verdict: NPU backend OK: plan + gather on the NPU match the reference bit for bit"
    missing = [c.name for c in checks if c.status == "missing"]
    return (f"verdict: CPU backend OK; NPU backend not available here (missing: {', '.join(missing)})")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seconds", type=float_in(0, 86400, low_open=True), default=None,
                        help="time limit of the NPU self-test, seconds in (0, 86400] (default 30)")
    parser.add_argument("--no-selftest", action="store_true", help="versions and backends only")
    parser.add_argument("--json", help="also write the checks as JSON to this file")


def main(args: argparse.Namespace) -> int:
    reject_together(args, "--no-selftest", "--seconds", "--seconds limits the self-test")
    json_path = output_path("--json", args.json)
    seconds = 30.0 if args.seconds is None else args.seconds
    checks = run_checks(seconds, not args.no_selftest, lambda line: print(line, flush=True))
    line = verdict(checks)
    print(line)
    if json_path:
        with writing("--json", json_path), open(json_path, "w") as f:
            json.dump(dict(checks=[dataclasses.asdict(c) for c in checks], verdict=line), f, indent=1)
    return 1 if any(c.status == "fail" for c in checks) else 0
