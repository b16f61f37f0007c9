"""The NPU op library: where it is, what it was built for, and loading it (needs torch_npu).

The same kernel sources as the CPU backend, built by CANN (``scripts/build_npu.sh``) into
``_npu_ops.so`` and registered for PrivateUse1. ``load_npu_backend()`` loads it (``avsg.backend``
does so at import when the file exists); a CPU-only machine never fails on it.
"""
from __future__ import annotations

import atexit
import glob
import os
from typing import Optional

import torch

from .._ops import has_op

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NPU_LIBRARY_GLOB = "_npu_ops*.so"


def npu_library_path() -> Optional[str]:
    """Path of the NPU op library (built only with CANN, see scripts/build_npu.sh), or None."""
    found = sorted(glob.glob(os.path.join(_PACKAGE, NPU_LIBRARY_GLOB)))
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
    if has_op("release_npu_resources"):
        try:
            torch.npu.synchronize()
        except Exception:  # noqa: BLE001  (exit path: release what we can)
            pass
        torch.ops.avsg.release_npu_resources()


def _require_npu_op(name: str):
    if not has_op(name):
        load_npu_backend()
    if not has_op(name):
        raise RuntimeError(f"avsg.backend.{name}: the NPU backend is not loaded ({_npu_error}); "
                           "build it with scripts/build_npu.sh on a machine with CANN and torch_npu")
    return getattr(torch.ops.avsg, name)


def npu_error() -> Optional[str]:
    """Why the NPU backend is not loaded (None when it is, or before any attempt)."""
    return _npu_error


def npu_loaded() -> bool:
    return bool(_npu_loaded)
