"""Shared pieces of the ``avsg bench`` commands: options, output directory, NPU check, JSON, plots.

Conventions (``avsg.cli_util``): a user mistake raises ``UsageError`` (one line on stderr, exit
status 2); every command writes its JSON and plots under one directory, ``--out DIR``
(default ``avsg-results/bench-<command>/``), and prints where they went; a progress bar runs on
stderr when it is a terminal (``--quiet`` silences it).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from typing import Dict, List, Optional

import torch

from .... import backend
from ....cli_util import (UsageError, check_dir_writable, check_writable, comma_list, progress_bar,
                         read_input, writing)
from ...costmodel import hardware

RESULTS_ROOT = "avsg-results"


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, torch {torch.__version__}"


def default_out(command: str) -> str:
    return os.path.join(RESULTS_ROOT, f"bench-{command}")


def add_common_arguments(parser: argparse.ArgumentParser, command: str, hw: bool = True,
                         device: bool = True) -> None:
    """``--out``, ``--quiet``, and (for modelled benchmarks) ``--hw``, ``--device``."""
    parser.add_argument("--out", metavar="DIR", default=None,
                        help=f"directory for the JSON and plots (default {default_out(command)}/)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    if hw:
        parser.add_argument("--hw", metavar="JSON", default=hardware.DEFAULT_PROFILE,
                            help="hardware profile the cost model reads (default: the bundled, "
                                 "uncalibrated 910B assumptions; 'avsg bench calibrate' writes one "
                                 "from an NPU)")
    if device:
        parser.add_argument("--device", choices=("cpu", "npu"), default="cpu",
                            help="cpu: kernels through the CPU emulation, counted work and the "
                                 "cost model (default); npu: time the kernels on an Ascend NPU "
                                 "(needs torch_npu and the NPU build)")
        parser.add_argument("--msprof", metavar="DIR", default=None,
                            help="with --device npu: also record the timed launches with the "
                                 "Ascend PyTorch profiler (torch_npu.profiler, msprof data) into "
                                 "DIR, for the MindStudio Insight / msprof tools")


_msprof_dir: Optional[str] = None     # set by out_dir from --msprof; read by npu_time_us


def out_dir(args: argparse.Namespace, command: str) -> str:
    """The output directory (created), after checking every output option (--out, --tables,
    --json, --msprof): called before a benchmark's work, so a bad path costs nothing."""
    global _msprof_dir
    msprof = getattr(args, "msprof", None)
    if msprof and getattr(args, "device", "cpu") != "npu":
        raise UsageError("--msprof: profiles NPU launches; it needs --device npu")
    _msprof_dir = msprof
    for option in ("tables", "json"):
        check_writable(f"--{option}", getattr(args, option, None))
    return check_dir_writable("--out", args.out or default_out(command))


def read_profile(path: str) -> hardware.Profile:
    """``--hw``'s profile (:func:`hardware.load_profile`): a binary file and any entry
    :func:`hardware.check_entries` refuses (a fractional count among them) are one-line errors
    naming the option, the file and the entry."""
    try:
        return read_input("--hw", path, hardware.load_profile)
    except ValueError as e:
        raise UsageError(str(e)) from None


def load_hw(args: argparse.Namespace) -> hardware.Profile:
    hw = read_profile(args.hw)
    try:
        for key in hardware.REQUIRED_KEYS:
            hw[key]
    except KeyError as e:
        raise UsageError(f"--hw: {e.args[0]}") from None
    return hw


def require_npu(command: str):
    """torch_npu and the NPU backend, or a one-line UsageError saying what is missing."""
    try:
        import torch_npu  # noqa: F401
    except ImportError:
        if command == "calibrate":
            raise UsageError("torch_npu is not installed on this machine: calibration measures an "
                             "Ascend NPU and runs nowhere else (nothing written)") from None
        raise UsageError(f"--device npu: torch_npu is not installed on this machine; 'avsg bench "
                         f"{command}' runs on the CPU emulation without --device npu") from None
    if not backend.load_npu_backend():
        raise UsageError("--device npu: the AVSG NPU library is not built (scripts/build_npu.sh)")
    if not torch.npu.is_available():
        raise UsageError("--device npu: torch_npu finds no NPU")
    return torch_npu


def npu_time_us(fn, warmup: int = 3, iters: int = 10) -> List[float]:
    """Device time of ``fn()`` per call with torch.npu.Event, after ``warmup`` calls.
    With ``--msprof DIR`` the timed calls also run under torch_npu's profiler, one profiler step
    each, written to DIR. Unverified: written from the torch_npu docs, never run (no NPU was
    available)."""
    import contextlib
    for _ in range(warmup):
        fn()
    torch.npu.synchronize()
    profiler = contextlib.nullcontext()
    if _msprof_dir:
        import torch_npu
        activity = torch_npu.profiler.ProfilerActivity
        profiler = torch_npu.profiler.profile(
            activities=[activity.CPU, activity.NPU],
            on_trace_ready=torch_npu.profiler.tensorboard_trace_handler(_msprof_dir))
    times = []
    with profiler as prof:
        for _ in range(iters):
            start, end = torch.npu.Event(enable_timing=True), torch.npu.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(1e3 * start.elapsed_time(end))
            if prof is not None:
                prof.step()
    return times


def int_list(option: str, text: str, low: int = 1, high: Optional[int] = None) -> List[int]:
    try:
        values = [int(v) for v in comma_list(option, text)]
    except ValueError:
        raise UsageError(f"{option}: expected comma-separated integers, got {text!r}") from None
    if len(set(values)) < len(values):
        raise UsageError(f"{option}: a value given twice in {text!r}")
    if min(values) < low:
        raise UsageError(f"{option}: expected integers >= {low}, got {text!r}")
    if high is not None and max(values) > high:
        raise UsageError(f"{option}: expected integers {low}..{high}, got {text!r}")
    return values


def float_list(option: str, text: str, low: float, high: float) -> List[float]:
    try:
        values = [float(v) for v in comma_list(option, text)]
    except ValueError:
        raise UsageError(f"{option}: expected comma-separated numbers, got {text!r}") from None
    if len(set(values)) < len(values):
        raise UsageError(f"{option}: a value given twice in {text!r}")
    if min(values) <= low or max(values) > high:
        raise UsageError(f"{option}: expected numbers in ({low:g}, {high:g}], got {text!r}")
    return values


def at_least(option: str, value: int, low: int = 1) -> int:
    if value < low:
        raise UsageError(f"{option}: expected >= {low}, got {value}")
    return value


def trace_path(option_value: Optional[str]) -> str:
    """The trace given (a shipped trace's name or a path that exists), else the embedded one."""
    from ...traces.lookup import find_trace
    path = find_trace(option_value)
    if not os.path.exists(path):
        raise UsageError(f"--trace: no such file: {option_value}")
    return path


def write_json(path: str, payload: dict, option: str = "--out") -> str:
    """``payload`` as JSON at ``path`` (``option``'s file: a failed write names it)."""
    with writing(option, path):
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "w") as f:
            json.dump(payload, f, indent=1, default=float)
    return path


def pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


PLOTS_SKIPPED = "skipped: matplotlib is not installed (pip install matplotlib)"


def save_plot(path: str, draw) -> str:
    """``draw(path)`` and ``path``; without matplotlib (an optional extra) nothing is drawn and
    the returned text says the plot was skipped, which :func:`report_outputs` prints on one
    line: the benchmark's tables and JSON are its job, the plot is not."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return PLOTS_SKIPPED
    with writing("--out", path):
        draw(path)
    return path


def report_outputs(files: Dict[str, str]) -> None:
    for what, path in files.items():
        print(f"  {what}: {path}")


def bar(total: int, desc: str, args: argparse.Namespace):
    return progress_bar(total, desc, enabled=not getattr(args, "quiet", False) and sys.stderr.isatty())


def counted_launch() -> Dict[str, float]:
    """The last emulated launch's work, summed over blocks (the cost model reads the counters)."""
    counters = backend.last_launch_counters()
    total = counters.total()
    return dict(blocks=counters.blocks, vec_repeats=total["vec_repeats"],
                scalar_ops=sum(total[k] for k in ("scalar_ub_reads", "scalar_ub_writes",
                                                  "scalar_gm_reads", "scalar_gm_writes")),
                mte2_bytes=total["mte2_bytes"], mte3_bytes=total["mte3_bytes"],
                copies=total["mte2_copies"] + total["mte3_copies"])


def add_tables_argument(parser: argparse.ArgumentParser, example: str) -> None:
    parser.add_argument("--tables", metavar="PATH",
                        help=f"also write the summary tables as Markdown to PATH ({example}, "
                             f"regenerated this way, is what README.md and docs/ quote)")


def markdown_table(name: str, header: List[str], rows: List[List[str]], align: str = "") -> str:
    """One table between '<!-- results:NAME -->' markers (tests/test_docs.py matches these)."""
    align = align or "l" + "r" * (len(header) - 1)
    if len(align) != len(header):
        raise ValueError(f"markdown_table {name}: {len(align)} alignments for {len(header)} columns")
    sep = ["---:" if a == "r" else "---" for a in align]
    lines = [f"<!-- results:{name} -->", "| " + " | ".join(header) + " |", "|" + "|".join(sep) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    lines.append(f"<!-- /results:{name} -->")
    return "\n".join(lines) + "\n"


MODELLED = ("Modelled times are estimates from the CPU emulation's counted work and an assumed "
            "hardware profile, not measurements.")


def write_tables(path: Optional[str], command: str, blocks: List[str],
                 note: str = MODELLED) -> Optional[str]:
    if not path:
        return None
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "w") as f:
            f.write(f"Written by `{command}` on {machine()}. {note}\n\n")
            f.write("\n".join(blocks))
    except OSError as e:
        raise UsageError(f"--tables: cannot write {path}: {e.strerror}") from None
    return path


def invocation(args: argparse.Namespace) -> str:
    """The command as the user typed it, without --out / --tables / --quiet / --debug."""
    argv, out, skip = list(getattr(args, "argv", [])), [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in ("--out", "--tables"):
            skip = True
            continue
        if a.startswith(("--out=", "--tables=")) or a in ("--quiet", "--debug"):
            continue
        out.append(a)
    return "avsg " + " ".join(out)
