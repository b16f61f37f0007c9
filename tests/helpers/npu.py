"""NPU test helpers: why the NPU tests skip on this machine (``npu_skip_reason``), and compiling
one NPU host translation unit against the declaration-only stand-ins in ``tests/npu/npu_stubs``
(``compile_npu_unit``)."""
from __future__ import annotations

import importlib.util
import os
import subprocess

import torch
from torch.utils.cpp_extension import include_paths

from avsg import backend

from . import REPO

STUBS = os.path.join(REPO, "tests", "npu", "npu_stubs")
NPU_HOST_FILES = ["op_host/plan_host.cpp", "op_host/invalidate_host.cpp", "op_host/reset_host.cpp",
                  "op_host/resize_host.cpp", "op_host/state_host.cpp", "op_host/gather_host.cpp",
                  "op_host/plan_gather_host.cpp",
                  "op_host/calibrate_host.cpp", "op_host/npu/host_pool.cpp", "op_host/npu/host_register.cpp",
                  "op_host/npu/split_launch.cpp"]


def compile_npu_unit(path, *flags):
    cmd = ["g++", "-std=c++17", "-DAVSG_WITH_NPU=1", f"-I{STUBS}", f"-I{REPO}/op_host",
           f"-I{REPO}/op_kernel", *[f"-I{p}" for p in include_paths()], *flags,
           os.path.join(REPO, path)]
    return subprocess.run(cmd, capture_output=True, text=True)


def npu_skip_reason():
    if importlib.util.find_spec("torch_npu") is None:
        return "torch_npu is not installed"
    try:
        import torch_npu  # noqa: F401
    except Exception as e:  # pragma: no cover - depends on the machine
        return f"torch_npu does not import: {type(e).__name__}: {e}"
    if not (hasattr(torch, "npu") and torch.npu.is_available()):
        return "no Ascend NPU is visible (torch.npu.is_available() is False)"
    if not backend.load_npu_backend():
        return f"the AVSG NPU backend is not loaded: {backend.backend_info()['npu_error']}"
    return None
