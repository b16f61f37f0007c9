"""The argument checks every public entry shares (``SparseKVBuffer``, the raw ops' wrappers, the
serving manager): each raises ``TypeError``/``ValueError`` whose message starts with the
argument's name, before any state is touched, so the CLI can name the option
(``capacity:`` becomes ``--capacity:``).
"""
from __future__ import annotations

import os
from typing import Optional

import torch


def require_int(name: str, value, low: Optional[int] = None, high: Optional[int] = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
    if low is not None and value < low:
        raise ValueError(f"{name}: expected >= {low}, got {value}")
    if high is not None and value > high:
        raise ValueError(f"{name}: expected <= {high}, got {value}")


def require_tensor(name: str, t, dtype: Optional[torch.dtype] = None, shape=None,
                    device: Optional[torch.device] = None, ndim: Optional[int] = None,
                    contiguous: bool = True) -> None:
    """``contiguous=False``: for tensors whose layout the op checks itself (a plan's padded rows,
    a buffer with padded slots)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if dtype is not None and t.dtype != dtype:
        raise TypeError(f"{name}: expected dtype {dtype}, got {t.dtype}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name}: expected {ndim} dimensions, got shape {tuple(t.shape)}")
    if shape is not None and tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)}, got {tuple(t.shape)}")
    if device is not None and t.device != device:
        raise ValueError(f"{name}: expected a tensor on {device}, got one on {t.device}")
    require_real(name, t)
    if contiguous and not t.is_contiguous():
        raise ValueError(f"{name}: expected a contiguous tensor")


def require_bool(name: str, value, optional: bool = False) -> None:
    if value is None and optional:
        return
    if not isinstance(value, bool):
        raise TypeError(f"{name}: expected {'None, ' if optional else ''}True or False, got "
                        f"{value!r}")


def require_device(name: str, device) -> torch.device:
    """A device the ops have kernels for (CPU, or the NPU backend) and that exists here."""
    if not isinstance(device, (str, torch.device)):
        raise TypeError(f"{name}: expected a device such as 'cpu' or 'npu:0', got "
                        f"{type(device).__name__}")
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError) as e:
        raise ValueError(f"{name}: expected a device such as 'cpu' or 'npu:0', got {device!r} "
                         f"({str(e).splitlines()[0]})") from None
    if dev.type == "meta":
        raise ValueError(f"{name}: a buffer needs real memory, got the meta device")
    npu = torch._C._get_privateuse1_backend_name()
    if dev.type not in ("cpu", npu):
        raise ValueError(f"{name}: expected 'cpu' or '{npu}' (the devices avsg has kernels for), "
                         f"got {str(dev)!r}")
    try:
        torch.empty(0, device=dev)
    except Exception as e:  # noqa: BLE001  (torch raises several kinds for an absent device)
        raise ValueError(f"{name}: {str(dev)!r} is not available here "
                         f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") \
            from None
    return dev


def available_bytes(device: torch.device) -> Optional[int]:
    """Memory an allocation on ``device`` can still get (host: MemAvailable; NPU: the
    runtime's free memory), or None when it cannot be told."""
    try:
        if device.type == "cpu":
            with open("/proc/meminfo") as f:
                for line in f:
                    if line.startswith("MemAvailable:"):
                        return int(line.split()[1]) * 1024
            return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        backend = getattr(torch, device.type, None)
        if backend is not None and hasattr(backend, "mem_get_info"):
            return int(backend.mem_get_info(device)[0])
    except (OSError, ValueError, RuntimeError):
        pass
    return None


_FITS_WITHOUT_ASKING = 1 << 28     # smaller allocations are not worth a look at the free memory


def require_fits(name: str, nbytes: int, device: torch.device, what: str) -> None:
    """Refuse an allocation that cannot succeed before trying it (the allocator's own error
    names no argument, and on a host a huge one may start swapping first)."""
    if nbytes < _FITS_WITHOUT_ASKING or tracing():
        return
    free = available_bytes(device)
    if free is not None and nbytes > free:
        raise ValueError(f"{name}: {what} needs {nbytes / 2**30:.3g} GiB on {device}, more than "
                         f"the {free / 2**30:.3g} GiB available")


def tracing() -> bool:
    """True while torch.compile traces: value checks would read data (a graph break)."""
    return torch.compiler.is_compiling()


def require_real(name: str, t: torch.Tensor) -> None:
    """A meta tensor has no data: an op would run its shape function only and return garbage."""
    if t.device.type == "meta":
        raise ValueError(f"{name}: expected a tensor with data, got one on the meta device")


def check_selections(sel: torch.Tensor, limits: torch.Tensor, where, considered=None,
                     limit_name=None, repeat_hint: str = "") -> None:
    """A top-k ``sel`` ``[N, K]`` (positions, ``-1`` = none) per query token: no value below ``-1``,
    every value ``< limits[n]`` (``[N]``), no position twice in one token's list. Raises
    ``ValueError`` at the first bad entry, named by ``where(n, k)`` (``where(n)``: the token);
    ``limit_name(n)`` names the bound in the message; ``considered`` bool ``[N]``: tokens to
    check (default all). Syncs: for checks outside the step's fast path."""
    considered = torch.ones_like(sel[:, 0], dtype=torch.bool) if considered is None else considered
    checked = considered[:, None].expand_as(sel)
    below = checked & (sel < -1)
    if bool(below.any()):
        n, k = (int(i) for i in below.nonzero()[0])
        raise ValueError(f"{where(n, k)} = {int(sel[n, k])}: only -1 may be negative (it "
                         f"means 'no selection')")
    beyond = checked & (sel >= limits[:, None])
    if bool(beyond.any()):
        n, k = (int(i) for i in beyond.nonzero()[0])
        raise ValueError(f"{where(n, k)} = {int(sel[n, k])} is out of range: expected < "
                         f"{limit_name(n) if limit_name else 'the limit'} = {int(limits[n])}")
    ordered, order = sel.sort(dim=1, stable=True)
    repeat = checked[:, 1:] & (ordered[:, 1:] == ordered[:, :-1]) & (ordered[:, 1:] >= 0)
    if bool(repeat.any()):
        n, i = (int(x) for x in repeat.nonzero()[0])
        raise ValueError(f"{where(n)}: position {int(ordered[n, i])} is repeated at index "
                         f"{int(order[n, i])} and index {int(order[n, i + 1])}{repeat_hint}")
