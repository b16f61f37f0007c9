"""Host KV pools the NPU's AI cores read: page-aligned (pinned with the NPU backend) allocation
and the registration that maps them into the device's address space."""
from __future__ import annotations

from typing import Sequence, Tuple

import torch

from .._ops import has_op
from .npu_library import _require_npu_op, load_npu_backend, npu_library_path

HOST_POOL_ALIGNMENT = 4096      # aclrtHostRegister needs a 4 KB page-aligned pointer


def alloc_host_pool(shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """A host tensor for a KV pool: page-aligned, its size rounded up to whole 4 KB pages.

    With the NPU backend it comes from the runtime's own host allocator (``aclrtMallocHost``,
    pinned) and is freed by its tensor's deleter, which unregisters it first if it is registered:
    no caching allocator can hand the block to anyone else while it is still mapped for the AI
    cores. Without it (CPU backend), plain page-aligned host memory owned by the tensor."""
    shape = tuple(int(d) for d in shape)
    if any(d < 0 for d in shape):
        raise ValueError(f"shape: expected sizes >= 0, got {shape}")
    if has_op("alloc_host_pool") or (npu_library_path() is not None and load_npu_backend()):
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
    if not has_op("host_pool_registered"):
        return False
    return bool(torch.ops.avsg.host_pool_registered(t))
