"""Backends and the AscendC emulation's instrumentation, from Python.

What runs where (docs/design.md §5):

* ``cpu``: the AscendC kernel sources in ``op_kernel/`` compiled against the project's strict CPU
  emulation; they serve ``torch.ops.avsg.*`` for CPU tensors. ``backend_info()`` says which ops
  have a compiled kernel (the others fall back to the Python reference).
  The library holds two builds of those kernels from the same sources: ``"strict"`` (the
  default: every run-time check of the emulation, the pipe-hazard scoreboard, UB poisoning, the
  counters below, one thread per block) and ``"fast"`` (all of that compiled out, blocks run one
  after another on the calling thread; bit-identical outputs, for runs and benchmarks). Select
  with ``set_emulation("fast")``, ``with emulation("fast"): ...`` or ``AVSG_EMULATION=fast`` in the
  environment at import; ``backend_info()["emulation"]`` says which is active (an
  ``AVSG_EMULATION`` it could not apply leaves strict selected: ``emulation_env_error()``).
* ``npu``: the same kernel sources built by CANN (``scripts/build_npu.sh``) into ``_npu_ops.so``,
  registered for PrivateUse1. ``load_npu_backend()`` loads it (done at import when the file exists).

Emulated time, not CPU time
---------------------------
CPU wall time of the emulation says nothing about an NPU. Each emulated launch instead counts, per
block and per pipe, the work the kernel issued (scalar accesses, vector instructions and 256 B
repeats, MTE2/MTE3 copies and bytes, synchronisations)::

    avsg.gather(plan, host_kv, buffer_kv)
    c = avsg.backend.last_launch_counters()       # the most recent launch of ANY kernel
    c.total()["mte2_bytes"], c.blocks
    avsg.backend.estimate_npu_time_us(c)          # cost model of op_kernel/cpu/emu_core.h

``estimate_npu_time_us`` applies the emulation's first-order cost model (``avsg_emu::estimate``:
constants in ``cost_model()``, each an assumption documented in ``emu_core.h``): a block's time is
the sum of its pipes' cycles (``bound="serial"``, an upper bound, the default) or the busiest
pipe plus synchronisation (``bound="overlap"``, a lower bound); blocks run in parallel, so a launch
takes as long as its slowest block. Mapped host memory is not modelled slower than HBM.

Host KV on the NPU
------------------
AI cores read a host pool through the device address of memory registered with
``aclrtHostRegister(ptr, size, ACL_HOST_REGISTER_MAPPED, &dev_ptr)`` on recent CANN, or the
driver's ``halHostRegister`` on older stacks (chosen at run time, ``host_register_info()``).
Register each pool once, before the first ``gather`` that reads it::

    host_kv = avsg.backend.alloc_host_pool((R, max_len, 576), torch.bfloat16)  # aclrtMallocHost
    avsg.backend.register_host_pool(host_kv)
    avsg.gather(plan, host_kv, buffer_kv_on_npu)     # src on CPU, plan and dst on the NPU

Every CPU ``src`` of an NPU gather must lie inside a registered pool (a view of one is fine);
otherwise the op raises. Keep the tensor alive while it is registered.
"""
from __future__ import annotations

import atexit
import contextlib
import dataclasses
import glob
import os
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import torch

from . import _ops

_HERE = os.path.dirname(os.path.abspath(__file__))
NPU_LIBRARY_GLOB = "_npu_ops*.so"
HOST_POOL_ALIGNMENT = 4096      # aclrtHostRegister needs a 4 KB page-aligned pointer


# ------------------------------------------------------------------------------ backends

def npu_library_path() -> Optional[str]:
    """Path of the NPU op library (built only with CANN, see scripts/build_npu.sh), or None."""
    found = sorted(glob.glob(os.path.join(_HERE, NPU_LIBRARY_GLOB)))
    return found[0] if found else None


_npu_loaded: Optional[str] = None
_npu_error: Optional[str] = None

SOC_TAG = b"AVSG_NPU_SOC_VERSION="
SPLIT_LAUNCH_TAG = b"AVSG_NPU_SPLIT_LAUNCH="


def _library_tag(path: str, tag: bytes) -> Optional[str]:
    """The NUL-terminated text after ``tag`` in the file, read without loading it; None without."""
    with open(path, "rb") as f:
        data = f.read()
    at = data.find(tag)
    if at < 0:
        return None
    end = data.find(b"\0", at)
    return data[at + len(tag):end if end >= 0 else None].decode("ascii", "replace")


def built_soc_version(path: str) -> Optional[str]:
    """The SoC the NPU library's kernels were built for (the ``SOC_VERSION`` tag that
    op_host/npu/host_pool.cpp compiles in), read from the file without loading it; None when the
    library has no tag."""
    soc = _library_tag(path, SOC_TAG)
    return None if soc in (None, "", "unknown") else soc


def built_split_launch(path: str) -> Optional[str]:
    """How the NPU library launches a split plan (the tag op_host/npu/split_launch.cpp compiles
    in): ``"batch"`` (batch schedule mode and a timeout) or ``"stub: <why the config launch was not
    built>"`` (ACLRT_LAUNCH_KERNEL). Either way the split is off unless AVSG_NPU_SPLIT=1. None for a
    library without the tag (built before it existed)."""
    return _library_tag(path, SPLIT_LAUNCH_TAG) or None


def soc_mismatch(built: Optional[str], device: Optional[str]) -> Optional[str]:
    """Why a library built for ``built`` must not run on a ``device`` (torch.npu.get_device_name),
    or None. Kernels are compiled per SoC (core count, UB, instruction set): no near matches."""
    if built is None or not device:
        return None
    if built.strip().lower() == device.strip().lower():
        return None
    return (f"the NPU library was built for {built} but device 0 is {device}: rebuild with "
            f"scripts/build_npu.sh --soc {device.strip()}")


def load_npu_backend() -> bool:
    """Load the NPU op library (registers ``torch.ops.avsg.*`` for PrivateUse1). Needs torch_npu.
    Returns True when it is loaded; the reason it is not is in ``backend_info()["npu_error"]``."""
    global _npu_loaded, _npu_error
    if _npu_loaded:
        return True
    path = npu_library_path()
    if path is None:
        _npu_error = "not built (no CANN at build time; see scripts/build_npu.sh)"
        return False
    try:
        import torch_npu  # noqa: F401  (registers the PrivateUse1 backend the library links against)
        device = torch.npu.get_device_name(0) if torch.npu.is_available() else None
        why = soc_mismatch(built_soc_version(path), device)
        if why is not None:
            _npu_error = why
            return False
        torch.ops.load_library(path)
    except Exception as e:  # ImportError, OSError: report, do not break the CPU backend
        _npu_error = f"{type(e).__name__}: {e}"
        return False
    _npu_loaded, _npu_error = path, None
    # atexit runs last-registered first: registered after torch_npu's shutdown hook, this frees
    # the cached device tilings and unregisters host pools while the NPU runtime is still up.
    atexit.register(_release_npu_resources)
    return True


def _release_npu_resources() -> None:
    if _has_op("release_npu_resources"):
        try:
            torch.npu.synchronize()
        except Exception:  # noqa: BLE001  (exit path: release what we can)
            pass
        torch.ops.avsg.release_npu_resources()


def backend_info() -> Dict[str, object]:
    """Which implementation serves each op, and the state of the NPU backend (with
    ``npu_split_launch``: how the built NPU library launches a split plan, ``built_split_launch``)."""
    lib = npu_library_path()
    return {
        "cpu": dict(_ops.CPU_BACKEND),
        "emulation": get_emulation() if _has_op("emulation") else None,
        "emulation_env_error": _emulation_env_error,
        "fast_emulation_arch": fast_emulation_arch() if _has_op("fast_emulation_arch") else None,
        "emulated_cores": emulated_cores() if _has_op("emulated_cores") else None,
        "npu_library": lib,
        "npu_split_launch": built_split_launch(lib) if lib else None,
        "npu_loaded": bool(_npu_loaded),
        "npu_error": _npu_error,
        "npu_available": _ops.npu_available(),
        "npu_kernels": {op: _ops.has_kernel(op, "PrivateUse1") for op in _ops.OP_NAMES},
    }


def _has_op(name: str) -> bool:
    return hasattr(torch.ops.avsg, name)


def _require_op(name: str):
    if not _has_op(name):
        raise RuntimeError(f"avsg: torch.ops.avsg.{name} is missing: the op library was built without "
                           f"the AscendC emulation (op_host/emu_counters.cpp)")
    return getattr(torch.ops.avsg, name)


# ---------------------------------------------------------------- emulation build (CPU)

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
    if not value.strip() or not _has_op("set_emulation"):
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
    module docstring). ``avsg.costmodel.hardware.launch_estimate`` computes the same from a hardware
    profile JSON, and adds the host link for gather.
    """
    if bound not in ("serial", "overlap"):
        raise ValueError(f"bound: expected 'serial' or 'overlap', got {bound!r}")
    per_block = estimate_cost(counters)
    if not per_block:
        return 0.0
    return max(b[f"{bound}_ns"] for b in per_block) / 1000.0


# ---------------------------------------------------------------------- host pools (NPU)

def alloc_host_pool(shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """A host tensor for a KV pool: page-aligned, its size rounded up to whole 4 KB pages.

    With the NPU backend it comes from the runtime's own host allocator (``aclrtMallocHost``,
    pinned) and is freed by its tensor's deleter, which unregisters it first if it is registered:
    no caching allocator can hand the block to anyone else while it is still mapped for the AI
    cores. Without it (CPU backend), plain page-aligned host memory owned by the tensor."""
    shape = tuple(int(d) for d in shape)
    if any(d < 0 for d in shape):
        raise ValueError(f"shape: expected sizes >= 0, got {shape}")
    if _has_op("alloc_host_pool") or (npu_library_path() is not None and load_npu_backend()):
        return torch.ops.avsg.alloc_host_pool(list(shape), dtype)
    itemsize = torch.empty((), dtype=dtype).element_size()
    nbytes = max(1, itemsize * int(torch.Size(shape).numel()))
    pages = -(-nbytes // HOST_POOL_ALIGNMENT) * HOST_POOL_ALIGNMENT
    raw = torch.empty(pages + HOST_POOL_ALIGNMENT, dtype=torch.uint8)
    skip = -raw.data_ptr() % HOST_POOL_ALIGNMENT
    return raw[skip:skip + nbytes].view(dtype).view(shape)


def host_register_info() -> Tuple[str, str, str, str, int, bool, bool]:
    """How host pools get mapped for the AI cores, decided at run time (op_host/npu/host_register.h):
    ``(call, description, cann_version, driver_version, hal_api_version, has_aclrtHostRegister,
    has_halHostRegister)``. Needs the NPU backend."""
    path, describe, cann, driver, hal, acl_ok, hal_ok = _require_npu_op("host_register_info")()
    return path, describe, cann, driver, int(hal), acl_ok == "1", hal_ok == "1"


def register_host_pool(pool: torch.Tensor) -> None:
    """Map a host KV pool into the NPU's address space (``aclrtHostRegister``, MAPPED), once.
    Needs the NPU backend; ``pool`` must be a contiguous CPU tensor starting on a 4 KB boundary
    (pinned memory: ``alloc_host_pool``). Registering the same pool twice is a no-op."""
    _require_npu_op("register_host_pool")(pool)


def unregister_host_pool(pool: torch.Tensor) -> None:
    """Undo ``register_host_pool`` (``aclrtHostUnregister``); gathers must have finished."""
    _require_npu_op("unregister_host_pool")(pool)


def host_pool_registered(t: torch.Tensor) -> bool:
    """True when ``t`` lies inside a registered host pool."""
    if not _has_op("host_pool_registered"):
        return False
    return bool(torch.ops.avsg.host_pool_registered(t))


def _require_npu_op(name: str):
    if not _has_op(name):
        load_npu_backend()
    if not _has_op(name):
        raise RuntimeError(f"avsg.backend.{name}: the NPU backend is not loaded ({_npu_error}); "
                           "build it with scripts/build_npu.sh on a machine with CANN and torch_npu")
    return getattr(torch.ops.avsg, name)


# Load the NPU backend at import when it was built (never an error on a CPU-only machine).
if npu_library_path() is not None:
    load_npu_backend()

_apply_emulation_env()
