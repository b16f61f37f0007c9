"""The compact trace encoding (python/avsg/lab/traces/compact.py) the full shipped traces use: any valid
trace comes back exactly (values, dtype, shape, padding, every other key), bad files are one
TraceFormatError, and the shipped traces are the shared ones bit for bit where ../shared exists."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from avsg.lab.traces import compact
from avsg.lab.traces.format import Trace, TraceFormatError, load_trace, save_trace
from avsg.lab.traces.lookup import SHIPPED, shipped_trace

REPO = Path(__file__).resolve().parents[2]
SHARED_TRACES = Path(os.environ.get("AVSG_SHARED_DIR", REPO.parent / "shared")) / "traces"
FULL = ("asyncio_32k", "debian_reference_32k")


def _assert_same(a: Trace, b: Trace):
    assert a.sel.dtype == b.sel.dtype and a.sel.shape == b.sel.shape
    assert np.array_equal(a.sel, b.sel)
    assert a.positions.dtype == b.positions.dtype and np.array_equal(a.positions, b.positions)
    assert (a.T, a.k, a.model, a.rule) == (b.T, b.k, b.model, b.rule)
    assert sorted(a.extra) == sorted(b.extra)
    for key in a.extra:
        assert a.extra[key].dtype == b.extra[key].dtype and np.array_equal(a.extra[key], b.extra[key])


@st.composite
def traces(draw):
    """Valid traces of every shape the format allows: the MTP axis or not, short rows padded with
    -1 (signed dtypes), empty rows, rows repeated or replaced wholesale, positions at 0 and T - 1."""
    mtp = draw(st.booleans())
    padded = draw(st.booleans())
    dtype = draw(st.sampled_from([np.int16, np.int32, np.int64] if padded else
                                 [np.uint16, np.int16, np.uint32, np.int32, np.int64]))
    layers = draw(st.integers(1, 3))
    steps = draw(st.integers(1, 12))
    queries = draw(st.integers(1, 3)) if mtp else 1
    k = draw(st.integers(1, 24))
    T = draw(st.integers(k + steps * queries, 300))
    first = T - steps * queries                          # causal: positions[step] >= every selection
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    reuse = draw(st.floats(0.0, 1.0))
    sel = np.full((layers, steps, queries, k), -1, dtype=np.int64)
    for layer in range(layers):
        current = np.sort(rng.choice(first, size=k, replace=False))
        for row in range(steps * queries):
            limit = first + row + 1                      # query position first + row
            if rng.random() > reuse:                     # a new selection, else the previous one
                current = np.sort(rng.choice(limit, size=k, replace=False))
            count = int(rng.integers(0, k + 1)) if padded else k
            chosen = np.sort(rng.choice(current, size=count, replace=False))
            sel[layer, row // queries, row % queries, :count] = chosen
    positions = first + np.arange(steps * queries).reshape(steps, queries)
    positions = positions if mtp else positions[:, 0]
    extra = {"note": np.str_("x"), "weights": rng.random(3)} if draw(st.booleans()) else {}
    sel = sel.astype(dtype)
    return Trace(sel if mtp else sel[:, :, 0], positions.astype(np.int32), T, k,
                 draw(st.text(max_size=5)), "rule", extra)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(traces())
def test_round_trip_is_exact(tr):
    back = compact.decode_trace(compact.encode_trace(tr))
    _assert_same(back, tr)


def test_round_trip_through_files_and_load_trace(tmp_path):
    rng = np.random.default_rng(3)
    sel = np.sort(np.stack([rng.choice(5000, size=64, replace=False) for _ in range(2 * 40)])
                  .reshape(2, 40, 64), axis=-1).astype(np.uint16)
    tr = Trace(sel, np.arange(5000, 5040, dtype=np.int32), 5040, 64, "m", "r")
    path = tmp_path / "t.avtrace"
    compact.save_compact(path, tr)
    _assert_same(load_trace(path), tr)                   # load_trace knows it by its magic
    assert not load_trace(path).sel.flags.writeable      # shared with the decode cache


def test_bad_files_are_format_errors(tmp_path):
    rng = np.random.default_rng(0)
    sel = np.sort(np.stack([rng.choice(900, size=16, replace=False) for _ in range(10)]),
                  axis=-1)[None].astype(np.uint16)
    data = compact.encode_trace(Trace(sel, np.arange(900, 910, dtype=np.int32), 910, 16))
    for bad in (data[:len(data) // 2], data[:9], compact.MAGIC + b"not xz at all"):
        with pytest.raises(TraceFormatError):
            compact.decode_trace(bad)
    with pytest.raises(TraceFormatError, match="magic"):
        compact.decode_trace(b"PK" + data)
    path = tmp_path / "cut.avtrace"
    path.write_bytes(data[:-20])
    with pytest.raises(TraceFormatError, match=str(path)):
        load_trace(path)


def test_an_invalid_trace_is_refused_when_encoded():
    sel = np.array([[[3, 2]]], dtype=np.int32)           # not ascending
    with pytest.raises(TraceFormatError, match="ascending"):
        compact.encode_trace(Trace(sel, np.array([5]), 6, 2))


@pytest.mark.parametrize("name", FULL)
def test_shipped_full_traces_are_small_and_valid(name):
    tr = load_trace(shipped_trace(name))                 # full value checks
    assert (tr.layers, tr.steps, tr.k, tr.T) == (24, 1024, 2048, 32768)
    assert tr.sel.dtype == np.uint16 and list(tr.positions[[0, -1]]) == [31744, 32767]
    assert tr.model.startswith("Qwen2.5-Coder-0.5B-Instruct")
    assert os.path.getsize(shipped_trace(name)) < 17 * 2**20


@pytest.mark.parametrize("name", FULL)
def test_shipped_full_traces_are_the_shared_ones_bit_for_bit(name):
    original = SHARED_TRACES / f"{name}.npz"
    if not original.exists():
        pytest.skip(f"the shared trace is not at {original} (set AVSG_SHARED_DIR)")
    _assert_same(load_trace(shipped_trace(name), check_values=False),
                 load_trace(original, check_values=False))


def test_shipped_traces_are_package_data(tmp_path):
    """setup.py's package_data puts them in the built package, and .gitignore does not hide them."""
    result = subprocess.run([sys.executable, "setup.py", "-q", "build_py", "--build-lib",
                             str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    for name in SHIPPED:
        built = tmp_path / "avsg" / "lab" / "traces" / "data" / os.path.basename(shipped_trace(name))
        assert built.read_bytes() == Path(shipped_trace(name)).read_bytes()
        if (REPO / ".git").exists():
            ignored = subprocess.run(["git", "check-ignore", "-q", shipped_trace(name)], cwd=REPO)
            assert ignored.returncode == 1, f"{name} is git-ignored"
