"""Backends and the AscendC emulation's instrumentation, from Python.

One file per job: ``npu_library.py`` (the NPU op library: find, check, load),
``emulation.py`` (the CPU emulation: build switch, core count, launch counters and the cost
model), ``host_pool.py`` (host KV pools the AI cores read). This module re-exports them and says
which backend serves each op (``backend_info``).

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
    avsg.backend.estimate_npu_time_us(c)          # cost model of emulation/emu_core.h

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

from typing import Dict

from .. import _ops
from .._ops import has_op
from .emulation import (EMULATION_BUILDS, EMULATION_ENV, LaunchCounters, LaunchPhases,
                        _apply_emulation_env, _require_op, cost_model, counter_fields,
                        emulated_cores, emulation, emulation_env_error, estimate_cost,
                        estimate_npu_time_us, fast_emulation_arch, get_emulation,
                        last_launch_counters, last_launch_phases, set_emulated_cores,
                        set_emulation)
from .host_pool import (HOST_POOL_ALIGNMENT, alloc_host_pool, host_pool_registered,
                        host_register_info, register_host_pool, unregister_host_pool)
from .npu_library import (NPU_LIBRARY_GLOB, SOC_TAG, SPLIT_LAUNCH_TAG, _release_npu_resources,
                          _require_npu_op, built_soc_version, built_split_launch,
                          load_npu_backend, npu_error, npu_library_path, npu_loaded,
                          soc_mismatch)

_has_op = has_op        # (the name tests and tools used before the split)


def backend_info() -> Dict[str, object]:
    """Which implementation serves each op, and the state of the NPU backend (with
    ``npu_split_launch``: how the built NPU library launches a split plan, ``built_split_launch``)."""
    lib = npu_library_path()
    return {
        "cpu": dict(_ops.CPU_BACKEND),
        "emulation": get_emulation() if has_op("emulation") else None,
        "emulation_env_error": emulation_env_error(),
        "fast_emulation_arch": fast_emulation_arch() if has_op("fast_emulation_arch") else None,
        "emulated_cores": emulated_cores() if has_op("emulated_cores") else None,
        "npu_library": lib,
        "npu_split_launch": built_split_launch(lib) if lib else None,
        "npu_loaded": npu_loaded(),
        "npu_error": npu_error(),
        "npu_available": _ops.npu_available(),
        "npu_kernels": {op: _ops.has_kernel(op, "PrivateUse1") for op in _ops.OP_NAMES},
    }

# Load the NPU backend at import when it was built (never an error on a CPU-only machine).
if npu_library_path() is not None:
    load_npu_backend()

_apply_emulation_env()
