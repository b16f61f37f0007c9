"""The compact trace encoding the package ships its full traces in (``.avtrace``).

A selection trace changes little from one step to the next, and a position that enters a step's
top-k usually stays for a run of steps. So instead of every step's K positions, this stores, per
layer and per position that the layer ever selects, the steps at which that position enters or
leaves the selection (its *toggles*), as small gaps:

* per layer: the distinct positions ``U`` it selects (ascending, as gaps), how many toggles each
  has, then each position's toggle rows as gaps: the first from row 0, each later one from the
  previous toggle plus one. Gaps out of the selection ("off", with the first toggle) and runs in
  it ("on") have different statistics, so they go to separate streams;
* each of the four streams (``STREAMS``) as one byte per value, 255 escaping to a wider value in
  a stream of its own; all of it compressed with the standard library's ``lzma``.

A *row* is one (step, query) pair in order, so a trace with the MTP axis ``[layers, steps, Tq, K]``
is encoded as ``steps * Tq`` rows. Decoding turns each position's toggles into the row intervals it
is selected in, lists (row, position) pairs position by position and orders them by row with a
stable sort, so each row comes out in ascending position order. The trace format (:mod:`.format`)
requires every row to be strictly ascending, padded at the end with ``-1``, so the order of
positions within a row is fully determined by the set: decoding is exact, dtype, padding and shape
included. Everything else of the trace (``positions``, ``T``, ``k``, ``model``, ``rule``, extra keys)
is stored as it is.

Container: the 8-byte magic ``AVSGTRC1``, then an xz stream of: a 4-byte little-endian header
length, a JSON header (shape, dtypes, T, k, strings, each section's name and byte size), and the
sections: ``.npy`` images of the small arrays, then each stream and its escapes.

Sizes and decode times of the shipped traces: docs/hit_rate.md, "The shipped traces".
"""
from __future__ import annotations

import dataclasses
import io
import json
import lzma
import os
import struct
from typing import List

import numpy as np

from .trace import Trace, TraceFormatError, validate_trace

__all__ = ["MAGIC", "SUFFIX", "encode_trace", "decode_trace", "save_compact", "load_compact",
           "is_compact"]

MAGIC = b"AVSGTRC1"
SUFFIX = ".avtrace"
# a layer is encoded through a [rows, distinct positions] int8 matrix: bound it, so that a trace of
# a very long context with many steps is refused (keep it as .npz) instead of filling the memory
MAX_LAYER_CELLS = 1 << 31


def _bytes_encode(values: np.ndarray) -> "tuple[bytes, bytes, str]":
    """Non-negative integers as one byte each, 255 standing for the next value of the escape
    stream (almost every gap of a real trace is below 255); the escapes in the narrowest of
    uint16 / 32 / 64 that holds them, whose dtype is returned."""
    v = np.asarray(values, dtype=np.int64)
    big = v[v >= 255]
    width = next(d for d in ("<u2", "<u4", "<u8") if big.size == 0 or big.max() <= np.iinfo(d).max)
    return np.minimum(v, 255).astype(np.uint8).tobytes(), big.astype(width).tobytes(), width


def _bytes_decode(main: bytes, escapes: bytes, width: str) -> np.ndarray:
    v = np.frombuffer(main, dtype=np.uint8).astype(np.int64)
    if width not in ("<u2", "<u4", "<u8") or len(escapes) % np.dtype(width).itemsize:
        raise TraceFormatError("compact trace: a corrupted escape stream")
    big = np.frombuffer(escapes, dtype=width)
    where = np.flatnonzero(v == 255)
    if where.size != big.size or (big.size and big.max() >= 2**63):
        raise TraceFormatError("compact trace: the escape stream does not match its stream")
    v[where] = big.astype(np.int64)
    return v


def _npy_bytes(a: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, np.asarray(a), allow_pickle=False)
    return out.getvalue()


# the four value streams, each with statistics of its own (lzma compresses each section better
# than the four interleaved): distinct positions as gaps, toggles per position - 1, the row of a
# position's first toggle and its off-gaps (rows out of the selection - 1), its on-runs - 1
STREAMS = ("distinct", "toggles", "off", "on")


def _layer_fields(rows: np.ndarray) -> dict:
    """The stream values of one layer, ``rows`` int64 [R, K] sorted ascending, -1 padded."""
    R = rows.shape[0]
    r_idx, k_idx = np.nonzero(rows >= 0)
    distinct, col = np.unique(rows[r_idx, k_idx], return_inverse=True)
    if R * max(distinct.size, 1) > MAX_LAYER_CELLS:
        raise ValueError(f"compact trace: a layer of {R} rows x {distinct.size} distinct positions "
                         f"is past the encoding's {MAX_LAYER_CELLS:,} cells; keep it as .npz")
    member = np.zeros((R + 1, distinct.size), dtype=np.int8)
    member[r_idx + 1, col] = 1
    col_t, row_t = np.nonzero(np.diff(member, axis=0).T)   # by position, then row
    counts = np.bincount(col_t, minlength=distinct.size)
    gaps = np.diff(row_t, prepend=0) - 1
    first = np.cumsum(counts) - counts                     # each position's first toggle
    gaps[first] = row_t[first]
    j = np.arange(row_t.size) - np.repeat(first, counts)  # toggle index within its position
    d_gaps = np.diff(distinct, prepend=0)
    d_gaps[1:] -= 1
    return {"distinct": d_gaps, "toggles": counts - 1, "off": gaps[j % 2 == 0],
            "on": gaps[j % 2 == 1]}


def _layer_decode(fields: dict, at: dict, n: int, R: int, K: int, dtype) -> np.ndarray:
    """One layer's rows [R, K] from the streams, reading from offsets ``at`` (advanced)."""
    def take(name, count):
        part = fields[name][at[name]:at[name] + count]
        if part.size != count:
            raise TraceFormatError(f"compact trace: the '{name}' stream ends inside a layer")
        at[name] += count
        return part
    d_gaps = take("distinct", n)
    distinct = np.cumsum(d_gaps + (np.arange(n) > 0))     # int64: positions of any sel dtype
    counts = take("toggles", n) + 1
    total = int(counts.sum())
    first = np.cumsum(counts) - counts
    j = np.arange(total) - np.repeat(first, counts)
    odd = j % 2 == 1
    advance = np.empty(total, dtype=np.int64)
    advance[~odd] = take("off", total - int(odd.sum())) + 1
    advance[odd] = take("on", int(odd.sum())) + 1
    advance[first] -= 1                                     # a first toggle counts from row 0
    run = np.cumsum(advance)
    row_t = run - np.repeat(run[first] - advance[first], counts)
    if total and (row_t.min() < 0 or row_t.max() >= R):
        raise TraceFormatError("compact trace: a toggle outside the trace's rows")
    # a position is selected on [t0, t1), [t2, t3), ...: list those rows, position-major, and
    # order them by row with a stable sort, which keeps each row's positions ascending
    start_at = np.flatnonzero(~odd)
    starts = row_t[start_at]
    ends = np.full(starts.size, R, dtype=np.int64)         # a last start runs to the end
    closed = start_at + 1 < total
    closed[closed] = odd[start_at[closed] + 1]              # the next toggle is this position's
    ends[closed] = row_t[start_at[closed] + 1]
    lengths = ends - starts
    if lengths.size and lengths.min() <= 0:
        raise TraceFormatError("compact trace: toggles out of order")
    owner = np.repeat(np.arange(n), counts)[~odd]
    member_pos = np.repeat(distinct.astype(dtype)[owner], lengths)
    # the rows of each interval, concatenated: +1 within an interval, a jump to the next start;
    # summed in uint16 when rows fit it (the wrap-around of a negative jump cancels exactly, as
    # every partial sum is a row in [0, R)), which the stable sort below takes as a radix sort
    row_dtype = np.uint16 if R <= 65536 else np.int64
    step = np.ones(int(lengths.sum()), dtype=row_dtype)
    if step.size:
        interval_first = np.cumsum(lengths) - lengths
        step[interval_first] = (starts - np.r_[0, ends[:-1] - 1]).astype(row_dtype)
    member_row = np.cumsum(step, dtype=row_dtype)
    order = np.argsort(member_row, kind="stable")
    member_pos = member_pos[order]
    per_row = np.bincount(member_row, minlength=R)
    if per_row.max(initial=0) > K:
        raise TraceFormatError(f"compact trace: a row holds more than k={K} positions")
    if member_pos.size == R * K:                           # no padding (unsigned dtypes)
        return member_pos.reshape(R, K)
    if np.dtype(dtype).kind == "u":
        raise TraceFormatError(f"compact trace: a row of fewer than k={K} positions in {dtype}")
    out = np.full((R, K), -1, dtype=dtype)
    sorted_rows = np.repeat(np.arange(R), per_row)
    row_start = np.cumsum(per_row) - per_row
    out[sorted_rows, np.arange(sorted_rows.size) - row_start[sorted_rows]] = member_pos
    return out


def encode_trace(tr: Trace) -> bytes:
    """``tr`` (validated first) in the compact encoding."""
    validate_trace(tr)
    sel = tr.sel
    L, K = sel.shape[0], sel.shape[-1]
    rows = sel.reshape(L, -1, K)
    per_layer = [_layer_fields(rows[layer].astype(np.int64)) for layer in range(L)]
    small = {"positions": np.asarray(tr.positions),
             "distinct_per_layer": np.array([f["distinct"].size for f in per_layer], np.int64)}
    for key, value in tr.extra.items():
        small[f"extra:{key}"] = np.asarray(value)
    sections = [(key, _npy_bytes(a)) for key, a in small.items()]
    widths = {}
    for name in STREAMS:
        main, escapes, widths[name] = _bytes_encode(np.concatenate([f[name] for f in per_layer]))
        sections += [(name, main), (name + ":escapes", escapes)]
    header = {"shape": list(sel.shape), "dtype": sel.dtype.str, "T": int(tr.T), "k": int(tr.k),
              "model": tr.model, "rule": tr.rule, "escape_dtypes": widths,
              "sections": [[key, len(data)] for key, data in sections]}
    head = json.dumps(header).encode()
    payload = struct.pack("<I", len(head)) + head + b"".join(data for _, data in sections)
    return MAGIC + lzma.compress(payload, preset=9 | lzma.PRESET_EXTREME)


def decode_trace(data: bytes, check_values: bool = True) -> Trace:
    """The trace :func:`encode_trace` wrote, exactly; :class:`TraceFormatError` if ``data`` is not
    one (a wrong magic, a truncated or corrupted stream)."""
    if not data.startswith(MAGIC):
        raise TraceFormatError("not a compact trace (no AVSGTRC1 magic)")
    try:
        payload = lzma.decompress(data[len(MAGIC):])
    except lzma.LZMAError as e:
        raise TraceFormatError(f"compact trace: corrupted or truncated ({e})") from None
    try:
        (head_len,) = struct.unpack_from("<I", payload, 0)
        header = json.loads(payload[4:4 + head_len].decode())
        at = 4 + head_len
        sections = {}
        for key, size in header["sections"]:
            sections[key] = payload[at:at + size]
            at += size
        small = {key: np.load(io.BytesIO(sections.pop(key)), allow_pickle=False)
                 for key in list(sections) if key not in STREAMS and not key.endswith(":escapes")}
        fields = {name: _bytes_decode(sections[name], sections[name + ":escapes"],
                                      header["escape_dtypes"][name]) for name in STREAMS}
        shape = tuple(int(d) for d in header["shape"])
        dtype = np.dtype(header["dtype"])
        T, k, model, rule = int(header["T"]), int(header["k"]), header["model"], header["rule"]
        distinct_per_layer = small.pop("distinct_per_layer")
        positions = small.pop("positions")
    except (struct.error, ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
        if isinstance(e, TraceFormatError):
            raise
        raise TraceFormatError(f"compact trace: a corrupted header ({type(e).__name__}: {e})") from None
    if at != len(payload) or len(shape) not in (3, 4) or distinct_per_layer.size != shape[0]:
        raise TraceFormatError("compact trace: its sections do not match its header")
    L, K = shape[0], shape[-1]
    R = int(np.prod(shape[1:-1]))
    sel = np.empty((L, R, K), dtype=dtype)
    offsets = dict.fromkeys(STREAMS, 0)
    for layer in range(L):
        sel[layer] = _layer_decode(fields, offsets, int(distinct_per_layer[layer]), R, K, dtype)
    if any(offsets[name] != fields[name].size for name in STREAMS):
        raise TraceFormatError("compact trace: data left after the last layer")
    extra = {key[len("extra:"):]: a for key, a in small.items() if key.startswith("extra:")}
    tr = Trace(sel.reshape(shape), positions, T, k, model, rule, extra)
    return validate_trace(tr, check_values=check_values)


def is_compact(path: "str | os.PathLike") -> bool:
    """Whether ``path`` starts with the compact encoding's magic."""
    with open(path, "rb") as f:
        return f.read(len(MAGIC)) == MAGIC


def save_compact(path: "str | os.PathLike", tr: Trace) -> None:
    with open(path, "wb") as f:
        f.write(encode_trace(tr))


# the last traces decoded, by file identity: a command that reads its trace twice (the whole trace
# for its shape, then the cut it replays), or serve-sim's several traces, decodes each once
_CACHE: "dict[tuple, Trace]" = {}
_CACHE_SIZE = 2


def load_compact(path: "str | os.PathLike", check_values: bool = True) -> Trace:
    """The trace in the compact file ``path``; its arrays are shared with a small cache of recent
    decodes, so they are read-only (copy before changing them)."""
    path = os.fspath(path)
    st = os.stat(path)
    key = (os.path.realpath(path), st.st_size, st.st_mtime_ns)
    cached = _CACHE.pop(key, None)
    if cached is None:
        with open(path, "rb") as f:
            data = f.read()
        try:
            cached = decode_trace(data, check_values=False)
        except TraceFormatError as e:
            raise TraceFormatError(f"{path}: {e}") from None
        for array in [cached.sel, cached.positions, *cached.extra.values()]:
            array.flags.writeable = False
    _CACHE[key] = cached                                    # most recent last
    while len(_CACHE) > _CACHE_SIZE:
        _CACHE.pop(next(iter(_CACHE)))
    tr = dataclasses.replace(cached, extra=dict(cached.extra))
    if check_values:
        try:
            validate_trace(tr)
        except TraceFormatError as e:
            raise TraceFormatError(f"{path}: {e}") from None
    return tr
