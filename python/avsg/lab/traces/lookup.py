"""Which trace a command replays, and loading its selections.

Every command that replays a trace takes the embedded one unless told otherwise, so what a fresh
clone prints is what the README quotes. The embedded trace is ``asyncio_32k`` cut to 8 of its
24 layers and its first 256 decode steps (``scripts/cut_trace.py``; 2.8 MiB).

The package also ships the two full traces, ``asyncio_32k`` and ``debian_reference_32k`` (24 layers
x 1,024 steps x top-2,048 each), in the compact encoding of :mod:`.compact`. Every option or
argument that takes a trace accepts these three names as well as a path: a value that is exactly
one of :data:`SHIPPED` is that shipped trace (write ``./NAME`` for a file of that name), anything
else is a path.

Errors here are :class:`TraceInputError` (a ``ValueError``) whose message starts with the argument
it is about, e.g. ``--trace: no such file: x.npz``; the CLI prints that as its one-line error.
"""
from __future__ import annotations

import os
from typing import Optional, Tuple

import numpy as np

from .format import TraceFormatError, load_trace, validate_trace

MAX_CONTEXT = 1 << 24          # positions the buffer addresses
DATA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
# name -> (file in DATA_DIR, how commands describe it after its name)
SHIPPED = {
    "asyncio_32k_8x256": ("asyncio_32k_8x256.npz",
                          "embedded: asyncio_32k.npz cut to 8 layers x 256 steps"),
    "asyncio_32k": ("asyncio_32k.avtrace", "shipped: 24 layers x 1024 steps, Python source"),
    "debian_reference_32k": ("debian_reference_32k.avtrace",
                             "shipped: 24 layers x 1024 steps, English prose"),
}
# what every --trace option's help says it takes
TRACE_HELP = ("a trace .npz path, or a shipped trace's name: asyncio_32k, debian_reference_32k "
              "(full, 24 layers x 1024 steps) or asyncio_32k_8x256 (the embedded default)")
EMBEDDED_TRACE = os.path.join(DATA_DIR, SHIPPED["asyncio_32k_8x256"][0])
EMBEDDED_NAME = f"asyncio_32k_8x256 ({SHIPPED['asyncio_32k_8x256'][1]})"


class TraceInputError(ValueError):
    """A trace that cannot be used as asked; the message starts with the argument's name."""


def shipped_trace(name: str) -> str:
    """The path of the shipped trace called ``name`` (a key of :data:`SHIPPED`)."""
    return os.path.join(DATA_DIR, SHIPPED[name][0])


def find_trace(value: Optional[str]) -> str:
    """The trace a ``--trace`` value names: none is the embedded one, a shipped trace's name is
    that trace's path, anything else a path as given."""
    if not value:
        return EMBEDDED_TRACE
    if value in SHIPPED:
        return shipped_trace(value)
    return value


def trace_label(path: str) -> str:
    """How a command names the trace it replays: a shipped one by name, any other by path."""
    if path in SHIPPED:
        path = shipped_trace(path)
    for name, (file, what) in SHIPPED.items():
        if os.path.abspath(path) == os.path.join(DATA_DIR, file):
            return f"{name} ({what})"
    return path


def read_trace(option: str, path: Optional[str], check_values: bool = True):
    """Load the trace given as ``option`` (``--trace``, or ``trace`` for a positional); every
    failure is one :class:`TraceInputError`: no such file, a directory, not an .npz, a corrupted
    member, a format error."""
    import zipfile
    import zlib
    if not path:
        raise TraceInputError(f"{option}: expected a trace .npz path or a shipped trace's name "
                              f"({', '.join(SHIPPED)})")
    path = find_trace(path)
    if not os.path.exists(path):
        raise TraceInputError(f"{option}: no such file: {path}")
    if os.path.isdir(path):
        raise TraceInputError(f"{option}: {path} is a directory, expected a trace .npz")
    try:
        return load_trace(path, check_values=check_values)
    except FileNotFoundError:
        raise TraceInputError(f"{option}: no such file: {path}") from None
    except MemoryError:
        raise TraceInputError(f"{option}: {path}: not enough memory to load it") from None
    except (zipfile.BadZipFile, zlib.error, EOFError) as e:
        raise TraceInputError(f"{option}: {path}: a corrupted or truncated file "
                              f"({type(e).__name__}: {e})") from None
    except OSError as e:
        raise TraceInputError(f"{option}: {path}: {e.strerror or e}") from None
    except ValueError as e:            # TraceFormatError messages start with the path
        message = " ".join(str(e).split()) or type(e).__name__
        if not message.startswith(path):
            message = f"{path}: {message}"
        raise TraceInputError(f"{option}: {message}") from None


def load_selections(trace: str, layers: Optional[int], steps: int,
                    option: str = "--trace", layers_option: str = "--layers",
                    steps_option: str = "--steps") -> Tuple[np.ndarray, np.ndarray, int]:
    """The first ``layers`` (None: all) x ``steps`` of a trace as (sel int64 [layers, steps, k],
    positions int64 [steps], context T), their values checked; asking for more than it holds is
    an error naming ``layers_option`` / ``steps_option`` (the caller's options that asked)."""
    tr = read_trace(option, trace, check_values=False)
    trace = trace_label(trace)
    if tr.sel.ndim != 3:
        raise TraceInputError(f"{option}: {trace} has an MTP axis; expected sel [layers, steps, k]")
    if layers is None:
        layers = tr.layers
    if layers > tr.layers:
        raise TraceInputError(f"{layers_option}: the trace has {tr.layers} layers, asked for {layers}")
    if steps > tr.steps:
        raise TraceInputError(f"{steps_option}: the trace has {tr.steps} steps, asked for {steps}")
    tr = tr.subset(layers=slice(0, layers), steps=slice(0, steps))
    try:            # the values replayed, not the layers and steps left out
        validate_trace(tr)
    except TraceFormatError as e:
        raise TraceInputError(f"{option}: {trace}: {e}") from None
    if tr.T > MAX_CONTEXT:
        raise TraceInputError(f"{option}: {trace}: its context T = {tr.T:,} is past the buffer's "
                              f"{MAX_CONTEXT:,} positions")
    sel = tr.sel.astype(np.int64)
    positions = np.asarray(tr.positions).astype(np.int64)
    return sel, positions, int(tr.T)


def synthetic_selections(layers: int, steps: int, k: int, context: int, seed: int = 0):
    """Top-k streams with realistic reuse: each step keeps ~75% of the previous selection.
    Returns (sel int64 [layers, steps, k], positions [steps], context + steps)."""
    rng = np.random.default_rng(seed)
    sel = np.empty((layers, steps, k), dtype=np.int64)
    for layer in range(layers):
        current = rng.choice(context, size=k, replace=False)
        for step in range(steps):
            if step:
                keep = current[rng.random(k) < 0.75]
                fresh = rng.choice(context + step, size=2 * k, replace=False)
                fresh = fresh[~np.isin(fresh, keep)][:k - keep.size]
                current = np.concatenate([keep, fresh])
            sel[layer, step] = np.sort(current)
    positions = np.arange(context, context + steps)
    return sel, positions, context + steps
