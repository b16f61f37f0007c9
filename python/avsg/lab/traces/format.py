"""Selection-trace format: load, save, validate.

A trace is an ``.npz`` file (docs/design.md §8) with these keys (:func:`load_trace` also reads the
same arrays from the compact ``.avtrace`` encoding of :mod:`.compact`):

``sel``        integer array ``[layers, steps, K]`` -- or ``[layers, steps, Tq, K]`` with the optional
               MTP axis (``Tq`` query tokens per step).  Each row (one layer, one step, one query token)
               lists the selected token positions in strictly ascending order.  Rows with fewer than
               ``K`` selections (a short context) are padded at the *end* with ``-1``; padding needs a
               signed dtype.  Accepted dtypes: uint16, int16, uint32, int32, int64 (uint16 for contexts up
               to 65536, as in the shared trace).
``positions``  integer ``[steps]`` (or ``[steps, Tq]`` with the MTP axis): the query position of each step.
               Every selection must be ``<= positions`` of its step/query (causality: a query may
               select itself).
``T``          scalar integer: the context length; every selection must be ``< T``.
``k``          scalar integer: the top-k; must equal the last axis of ``sel``.
``model``      free-text string (optional on load, defaults to "").
``rule``       free-text string (optional on load, defaults to "").

Any other keys are kept in :attr:`Trace.extra` and written back by :func:`save_trace`.
Validation errors are :class:`TraceFormatError` (a ``ValueError``) and name the key and what was
expected.
"""
from __future__ import annotations

import os
import zipfile
import zlib

import numpy as np

from . import compact
from .trace import (REQUIRED_KEYS, Trace, TraceFormatError, _scalar_int, _string,
                    smallest_sel_dtype, validate_trace)

__all__ = ["Trace", "TraceFormatError", "load_trace", "save_trace", "validate_trace",
           "REQUIRED_KEYS"]


def load_trace(path: "str | os.PathLike", check_values: bool = True) -> Trace:
    """Load and validate a trace: an ``.npz`` (no pickles are ever loaded) or the compact encoding
    the package ships its full traces in (:mod:`.compact`, recognised by its magic)."""
    path = os.fspath(path)
    if os.path.isfile(path) and compact.is_compact(path):
        return compact.load_compact(path, check_values=check_values)
    try:
        f = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise
    except IsADirectoryError:
        raise TraceFormatError(f"{path}: a directory, expected a trace .npz file") from None
    except (ValueError, zipfile.BadZipFile, EOFError, OSError) as e:
        # numpy calls anything that is not an array or a zip "pickled data" and suggests
        # allow_pickle; a trace never is, so say what the file is not
        why = "not a zip archive" if isinstance(e, ValueError) else f"{type(e).__name__}: {e}"
        raise TraceFormatError(f"{path}: not a readable .npz trace ({why})") from None
    if not hasattr(f, "files"):
        raise TraceFormatError(f"{path}: expected an .npz archive with keys {REQUIRED_KEYS}, "
                               f"got a single array")
    with f:
        missing = [key for key in REQUIRED_KEYS if key not in f.files]
        if missing:
            raise TraceFormatError(
                f"{path}: missing trace key(s) {missing}; expected {list(REQUIRED_KEYS)} "
                f"(+ optional 'model', 'rule'), found {sorted(f.files)}")
        data = {}
        for key in f.files:
            try:
                data[key] = f[key]
            except (zipfile.BadZipFile, zlib.error, EOFError, OSError) as e:
                kind = "zlib" if isinstance(e, zlib.error) else type(e).__name__
                raise TraceFormatError(f"{path}: key '{key}' is corrupted or truncated "
                                       f"({kind}: {e})") from None
            except ValueError as e:  # a truncated member, or an object array (needs pickles)
                why = ("holds pickled objects" if "pickle" in str(e)
                       else f"is corrupted or truncated ({e})")
                raise TraceFormatError(f"{path}: key '{key}' {why}") from None
    try:
        tr = Trace(sel=data.pop("sel"), positions=data.pop("positions"),
                   T=_scalar_int("T", data.pop("T")), k=_scalar_int("k", data.pop("k")),
                   model=_string("model", data.pop("model")) if "model" in data else "",
                   rule=_string("rule", data.pop("rule")) if "rule" in data else "",
                   extra=data)
        return validate_trace(tr, check_values=check_values)
    except TraceFormatError as e:
        raise TraceFormatError(f"{path}: {e}") from None


def save_trace(path: "str | os.PathLike", tr: Trace, compress: bool = True,
               validate: bool = True) -> None:
    """Validate and write ``tr`` as ``.npz`` (compressed by default)."""
    if validate:
        validate_trace(tr)
    arrays = dict(tr.extra)
    arrays.update(sel=tr.sel, positions=np.asarray(tr.positions), T=np.int32(tr.T) if tr.T < 2**31
                  else np.int64(tr.T), k=np.int32(tr.k), model=np.str_(tr.model), rule=np.str_(tr.rule))
    (np.savez_compressed if compress else np.savez)(path, **arrays)
