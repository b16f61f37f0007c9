"""The CPU backend's AscendC emulation: which build the ops launch, its core count, and the work
each emulated launch counted (with the emulation's cost model).

The library holds two builds of the kernels from the same sources: ``"strict"`` (the default:
every run-time check of the emulation, the pipe-hazard scoreboard, UB poisoning, the counters,
one thread per block) and ``"fast"`` (all of that compiled out; bit-identical outputs). Select
with ``set_emulation``, ``with emulation(...)`` or ``AVSG_EMULATION`` at import (``avsg.backend``
applies it). Counters and estimates: see ``avsg.backend``'s docstring.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import Dict, Iterator, List, Optional, Tuple

import torch

from .._ops import has_op


def _require_op(name: str):
    if not has_op(name):
        raise RuntimeError(f"avsg: torch.ops.avsg.{name} is missing: the op library was built without "
                           f"the AscendC emulation (op_host/emu_counters.cpp)")
    return getattr(torch.ops.avsg, name)


EMULATION_BUILDS = ("strict", "fast")
EMULATION_ENV = "AVSG_EMULATION"


def get_emulation() -> str:
    """The build of the kernels the CPU ops launch: ``"strict"`` or ``"fast"``."""
    return str(_require_op("emulation")())


def fast_emulation_arch() -> str:
    """The instruction set the fast build was compiled for: an x86-64 level such as
    ``"x86-64-v4"`` (by default the best one the building machine runs) or ``"generic"``
    (``AVSG_FAST_ARCH=generic`` at build time). ``set_emulation("fast")`` refuses, with a
    ValueError saying so, on a CPU without that level."""
    return str(_require_op("fast_emulation_arch")())


def set_emulation(build: str) -> None:
    """Select the build of the kernels the CPU ops launch, process-wide (all threads).

    ``"strict"`` (default) checks every rule of the emulation and counts the work of each launch;
    ``"fast"`` runs the same kernel sources with the checks, the hazard scoreboard, UB poisoning
    and the counters compiled out, bit-identical for kernels that pass the strict build. After a
    fast launch ``last_launch_counters()`` raises instead of returning an older launch's numbers.
    The fast build is compiled for the building machine's instruction set (``fast_emulation_arch``);
    selecting it on a CPU without that set raises ValueError and keeps the current build.
    """
    if build not in EMULATION_BUILDS:
        raise ValueError(f"build: expected one of {EMULATION_BUILDS}, got {build!r}")
    _require_op("set_emulation")(build)


@contextlib.contextmanager
def emulation(build: str) -> Iterator[str]:
    """``with avsg.backend.emulation("fast"): ...`` runs the block with ``build`` selected and
    restores the previous build on exit, also on an exception. Process-wide, like
    ``set_emulation``: not meant for threads that want different builds at once."""
    previous = get_emulation()
    set_emulation(build)
    try:
        yield build
    finally:
        set_emulation(previous)


_emulation_env_error: Optional[str] = None


def emulation_env_error() -> Optional[str]:
    """Why ``AVSG_EMULATION`` was not applied at import (a value naming neither build, or a fast
    build this CPU cannot run), or None. The strict build then stays selected; the ``avsg``
    commands refuse to run with this message."""
    return _emulation_env_error


def _apply_emulation_env() -> None:
    """``AVSG_EMULATION`` selects the build at import, in any case (``FAST`` is ``fast``); empty
    is unset. A value it cannot apply does not fail ``import avsg``: raised here, it would kill
    every ``avsg`` command with a traceback, ``--help`` included, before the CLI could say which
    variable is wrong. The strict build, which checks everything, stays selected (a mistake there
    costs speed, never a check), and :func:`emulation_env_error` says why."""
    global _emulation_env_error
    value = os.environ.get(EMULATION_ENV, "")
    if not value.strip() or not has_op("set_emulation"):
        return
    build = value.strip().lower()
    if build not in EMULATION_BUILDS:
        _emulation_env_error = (f"expected {' or '.join(EMULATION_BUILDS)} (unset it for the "
                                f"default, strict)")
        return
    try:
        set_emulation(build)
    except ValueError as e:         # the fast build needs an instruction set this CPU lacks
        _emulation_env_error = " ".join(str(e).split())


# ------------------------------------------------------------------- emulated core count

def emulated_cores() -> int:
    """AIV cores the CPU emulation has (default 40, as Ascend 910B3/B4). A launch with more blocks,
    e.g. ``gather(num_cores=48)``, raises."""
    return int(_require_op("emulated_cores")())


def set_emulated_cores(cores: int) -> None:
    """Set the emulation's core count (48 models 910B1/B2 and A3 dies). Process-wide."""
    if isinstance(cores, bool) or not isinstance(cores, int) or cores < 1:
        raise ValueError(f"cores: expected an int >= 1, got {cores!r}")
    _require_op("set_emulated_cores")(cores)


# ------------------------------------------------------------------------------ counters

def counter_fields() -> Tuple[str, ...]:
    """Names of the per-block counters (columns of ``LaunchCounters.per_block``)."""
    return tuple(_require_op("counter_fields")())


@dataclasses.dataclass(frozen=True)
class LaunchCounters:
    """Work one emulated launch issued: ``per_block`` int64 ``[blocks, len(fields)]``.

    Fields (per block): ``scalar_ub_reads/writes`` and ``scalar_gm_reads/writes`` (PIPE_S tensor
    accesses), ``vec_instrs``/``vec_repeats`` (PIPE_V, 256 B repeats), ``mte2_copies``/
    ``mte2_bytes`` (GM->UB), ``mte3_copies``/``mte3_bytes`` (UB->GM), ``ub_copies``/``ub_bytes``
    (UB->UB), ``pipe_barriers``, ``set_flags``, ``wait_flags``, ``sync_alls``, ``queue_syncs``
    (flag pairs inserted by TQue), ``dcci``, and ``mte2_inflight_max`` /
    ``mte2_inflight_bytes_max`` (the most GM->UB copies, and bytes, a block had issued and no
    other pipe had yet waited for: the DMAs it kept in flight).
    """
    fields: Tuple[str, ...]
    per_block: torch.Tensor
    vector_apis: Dict[str, torch.Tensor]   # API name -> int64 [blocks, 2] (instructions, repeats)

    @property
    def blocks(self) -> int:
        return int(self.per_block.shape[0])

    def __getitem__(self, field: str) -> torch.Tensor:
        """One counter for every block: int64 ``[blocks]``."""
        return self.per_block[:, self.fields.index(field)]

    def block(self, i: int) -> Dict[str, int]:
        return dict(zip(self.fields, self.per_block[i].tolist()))

    def then(self, later: "LaunchCounters") -> "LaunchCounters":
        """This launch's work followed by ``later``'s on the same blocks (block i runs both, one
        after the other): per block the counters add up, a ``*_max`` one takes the larger. An
        approximation of two launches, whose critical path is the slowest block of each: the
        same wherever one of them costs every block alike (as ``invalidate`` does)."""
        if later.fields != self.fields or later.blocks != self.blocks:
            raise ValueError(f"later: expected a launch of {self.blocks} blocks with the same "
                             f"counters, got {later.blocks} blocks")
        is_max = torch.tensor([f.endswith("_max") for f in self.fields])
        per_block = torch.where(is_max, torch.maximum(self.per_block, later.per_block),
                                self.per_block + later.per_block)
        apis = dict(self.vector_apis)
        for name, work in later.vector_apis.items():
            apis[name] = apis[name] + work if name in apis else work
        return LaunchCounters(self.fields, per_block, apis)

    def total(self) -> Dict[str, int]:
        """Every counter summed over blocks, except the ``*_max`` ones (the largest block's)."""
        sums = self.per_block.sum(0).tolist()
        maxes = self.per_block.max(0).values.tolist() if self.blocks else sums
        return {f: (m if f.endswith("_max") else s) for f, s, m in zip(self.fields, sums, maxes)}


def last_launch_counters() -> LaunchCounters:
    """Counters of the most recent emulated launch (of any kernel: gather, plan, ...), recorded
    even when it failed. Raises RuntimeError when that launch ran in the fast build (which
    counts nothing; see ``set_emulation``)."""
    per_block = _require_op("last_launch_counters")()
    names, apis = _require_op("last_launch_vector_apis")()
    return LaunchCounters(counter_fields(), per_block,
                          {name: apis[:, i] for i, name in enumerate(names)})


@dataclasses.dataclass(frozen=True)
class LaunchPhases:
    """One emulated launch's counters split by the phases its kernel marked (``AVSG_PHASE``, see
    op_kernel/kernel_compat.h; the plan kernel's steps are op_kernel/plan/plan_phases.h):
    ``per_block`` int64 ``[blocks, len(names), len(fields)]``. Per block the summed fields of its
    phases add up to its :class:`LaunchCounters` row; a ``*_max`` field is the largest value seen
    while the phase ran. A kernel without markers has one phase, ``"kernel"``."""
    names: Tuple[str, ...]
    fields: Tuple[str, ...]
    per_block: torch.Tensor

    def phase(self, name: str) -> LaunchCounters:
        """One phase's counters for every block, shaped like a launch's (no per-API split)."""
        if name not in self.names:
            raise KeyError(f"phase: expected one of {', '.join(self.names)}, got {name!r}")
        return LaunchCounters(self.fields, self.per_block[:, self.names.index(name)], {})


def last_launch_phases() -> LaunchPhases:
    """The most recent emulated launch's counters by phase (strict build only, like
    :func:`last_launch_counters`)."""
    names, per_block = _require_op("last_launch_phases")()
    return LaunchPhases(tuple(names), counter_fields(), per_block)


def cost_model() -> Dict[str, float]:
    """Constants of the emulation's cost model (``avsg_emu::CostModel`` in emu_core.h)."""
    names, values = _require_op("cost_model")()
    return dict(zip(names, values))


def estimate_cost(counters: Optional[LaunchCounters] = None) -> List[Dict[str, float]]:
    """Per block: cycles per pipe (scalar, vector, mte2, mte3, sync) and ``serial_ns`` /
    ``overlap_ns``, from ``avsg_emu::estimate`` (default: the last launch)."""
    c = last_launch_counters() if counters is None else counters
    names = _require_op("cost_fields")()
    est = _require_op("estimate_cost")(c.per_block)
    return [dict(zip(names, row)) for row in est.tolist()]


def estimate_npu_time_us(counters: Optional[LaunchCounters] = None, bound: str = "serial") -> float:
    """Estimated NPU time of one launch in microseconds: the slowest block's estimate.

    ``bound="serial"`` (default, the *serial-pipe* estimate: a block's pipes one after another) or
    ``"overlap"`` (the *overlapped-pipe* estimate: the busiest pipe plus synchronisation). They
    bracket the model's own assumptions, not real hardware; a model, not a measurement (see the
    module docstring). ``avsg.lab.costmodel.hardware.launch_estimate`` computes the same from a hardware
    profile JSON, and adds the host link for gather.
    """
    if bound not in ("serial", "overlap"):
        raise ValueError(f"bound: expected 'serial' or 'overlap', got {bound!r}")
    per_block = estimate_cost(counters)
    if not per_block:
        return 0.0
    return max(b[f"{bound}_ns"] for b in per_block) / 1000.0
