"""What a selection trace is: the ``Trace`` record, its error, and its validation (the file
formats that hold one are :mod:`.format`'s ``.npz`` and :mod:`.compact`'s ``.avtrace``)."""
from __future__ import annotations

import dataclasses
from typing import Dict

import numpy as np

REQUIRED_KEYS = ("sel", "positions", "T", "k")
_SEL_DTYPES = (np.uint16, np.int16, np.uint32, np.int32, np.int64)


class TraceFormatError(ValueError):
    """A trace file or array does not follow the trace format."""


@dataclasses.dataclass
class Trace:
    """An in-memory selection trace (see module docstring for the meaning of each field)."""

    sel: np.ndarray
    positions: np.ndarray
    T: int
    k: int
    model: str = ""
    rule: str = ""
    extra: Dict[str, np.ndarray] = dataclasses.field(default_factory=dict)

    @property
    def layers(self) -> int:
        return int(self.sel.shape[0])

    @property
    def steps(self) -> int:
        return int(self.sel.shape[1])

    @property
    def queries(self) -> int:
        """Query tokens per step (``Tq``): 1 without the MTP axis."""
        return 1 if self.sel.ndim == 3 else int(self.sel.shape[2])

    @property
    def has_mtp_axis(self) -> bool:
        return self.sel.ndim == 4

    def sel4(self) -> np.ndarray:
        """``sel`` viewed as ``[layers, steps, Tq, K]`` (no copy)."""
        return self.sel if self.sel.ndim == 4 else self.sel[:, :, None, :]

    def positions2(self) -> np.ndarray:
        """``positions`` as ``[steps, Tq]`` (broadcast when the trace has one position per step)."""
        p = np.asarray(self.positions)
        if p.ndim == 1:
            if self.queries == 1:
                return p[:, None]
            # one position per step given for an MTP trace: query t sits at position + t
            return p[:, None] + np.arange(self.queries)[None, :]
        return p

    def subset(self, layers=None, steps=None) -> "Trace":
        """A trace restricted to some layers (list/slice) and steps (slice)."""
        sel, pos = self.sel, self.positions
        if layers is not None:
            sel = sel[layers]
        if steps is not None:
            sel = sel[:, steps]
            pos = pos[steps]
        return Trace(np.ascontiguousarray(sel), np.ascontiguousarray(pos), self.T, self.k,
                     self.model, self.rule, dict(self.extra))

    def summary(self) -> str:
        shape = "x".join(str(d) for d in self.sel.shape)
        return (f"sel {self.sel.dtype} [{shape}] (layers={self.layers}, steps={self.steps}, "
                f"Tq={self.queries}, K={self.k}), T={self.T}, positions "
                f"{int(np.min(self.positions))}..{int(np.max(self.positions))}, model={self.model!r}")


def _scalar_int(name: str, v) -> int:
    a = np.asarray(v)
    if a.ndim != 0 or a.dtype.kind not in "iu":
        raise TraceFormatError(
            f"trace key '{name}': expected a scalar integer, got {a.dtype} array of shape {a.shape}")
    return int(a)


def _string(name: str, v) -> str:
    a = np.asarray(v)
    if a.ndim != 0 or a.dtype.kind not in "US":
        raise TraceFormatError(
            f"trace key '{name}': expected a scalar string, got {a.dtype} array of shape {a.shape}")
    s = a.item()
    return s.decode() if isinstance(s, bytes) else str(s)


def validate_trace(tr: Trace, check_values: bool = True) -> Trace:
    """Check shapes, dtypes and values of ``tr``; raise :class:`TraceFormatError` on the first problem.

    ``check_values=False`` skips the O(size) value checks (ordering, range, causality).
    Returns ``tr`` for chaining.
    """
    sel = tr.sel
    if not isinstance(sel, np.ndarray):
        raise TraceFormatError(f"trace key 'sel': expected a numpy array, got {type(sel).__name__}")
    if sel.dtype.type not in _SEL_DTYPES:
        raise TraceFormatError(
            f"trace key 'sel': expected an integer dtype (uint16, int16, uint32, int32 or int64), "
            f"got {sel.dtype}")
    if sel.ndim not in (3, 4):
        raise TraceFormatError(
            f"trace key 'sel': expected 3 dims [layers, steps, K] or 4 dims [layers, steps, Tq, K], "
            f"got shape {sel.shape}")
    if min(sel.shape) == 0:
        raise TraceFormatError(f"trace key 'sel': expected a non-empty array, got shape {sel.shape}")
    T = _scalar_int("T", tr.T)
    k = _scalar_int("k", tr.k)
    if k <= 0 or T <= 0:
        raise TraceFormatError(f"trace keys 'T'/'k': expected positive integers, got T={T}, k={k}")
    if sel.shape[-1] != k:
        raise TraceFormatError(
            f"trace key 'k': expected it to equal the last axis of 'sel' ({sel.shape[-1]}), got {k}")
    if k > T:
        raise TraceFormatError(f"trace key 'k': expected k <= T ({T}), got {k}")
    pos = np.asarray(tr.positions)
    if pos.dtype.kind not in "iu":
        raise TraceFormatError(f"trace key 'positions': expected an integer dtype, got {pos.dtype}")
    steps = sel.shape[1]
    ok_shapes = [(steps,)] + ([(steps, sel.shape[2])] if sel.ndim == 4 else [])
    if pos.shape not in ok_shapes:
        raise TraceFormatError(
            f"trace key 'positions': expected shape {' or '.join(map(str, ok_shapes))}, got {pos.shape}")
    if check_values:
        if pos.min() < 0 or pos.max() >= T:
            raise TraceFormatError(
                f"trace key 'positions': expected values in [0, T={T}), got "
                f"{int(pos.min())}..{int(pos.max())}")
        _check_sel_values(sel, tr.positions2() if sel.ndim == 4 else pos[:, None], T)
    return tr


def _check_sel_values(sel: np.ndarray, pos2: np.ndarray, T: int) -> None:
    s4 = sel if sel.ndim == 4 else sel[:, :, None, :]
    L = s4.shape[0]
    for l in range(L):  # per layer keeps memory bounded (int64 copy of one layer at a time)
        a = s4[l].astype(np.int64)  # [steps, Tq, K]
        where = lambda idx: (f"layer {l}, step {idx[0]}" + (f", query {idx[1]}" if sel.ndim == 4 else "")
                             + f", index {idx[2]}")
        if (a < -1).any():
            idx = np.argwhere(a < -1)[0]
            raise TraceFormatError(
                f"trace key 'sel': expected positions >= 0 or -1 (padding), got {a[tuple(idx)]} at "
                f"{where(idx)}")
        valid = a >= 0
        # padding must be a suffix: once -1 appears, no valid entry may follow
        if (valid[..., 1:] & ~valid[..., :-1]).any():
            idx = np.argwhere(valid[..., 1:] & ~valid[..., :-1])[0]
            idx[2] += 1
            raise TraceFormatError(
                f"trace key 'sel': expected -1 padding only at the end of a row, got a position after "
                f"-1 at {where(idx)}")
        if (a >= T).any():
            idx = np.argwhere(a >= T)[0]
            raise TraceFormatError(
                f"trace key 'sel': expected positions < T={T}, got {a[tuple(idx)]} at {where(idx)}")
        d = np.diff(a, axis=-1)
        bad = (d <= 0) & valid[..., 1:]
        if bad.any():
            idx = np.argwhere(bad)[0]
            idx[2] += 1
            raise TraceFormatError(
                f"trace key 'sel': expected each row sorted strictly ascending (no duplicates), got "
                f"{a[idx[0], idx[1], idx[2] - 1]} then {a[tuple(idx)]} at {where(idx)}")
        beyond = a > pos2[:, :, None]
        if beyond.any():
            idx = np.argwhere(beyond)[0]
            raise TraceFormatError(
                f"trace key 'sel': expected positions <= the step's query position "
                f"{int(pos2[idx[0], idx[1]])} (causal), got {a[tuple(idx)]} at {where(idx)}")


def smallest_sel_dtype(T: int, padded: bool) -> np.dtype:
    """uint16 when positions fit and no -1 padding is needed, else int32."""
    if not padded and T <= 65536:
        return np.dtype(np.uint16)
    return np.dtype(np.int32)
