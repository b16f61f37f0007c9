"""The real trace the package ships (python/avsg/lab/traces/data/asyncio_32k_8x256.npz): a valid trace,
exactly the cut of the shared one it says it is, installed as package data, and the default of
every command that replays a trace (which says so in one line)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from avsg import cli
from avsg.lab.traces.lookup import EMBEDDED_TRACE, find_trace, shipped_trace, trace_label
from avsg.lab.traces.format import load_trace

REPO = Path(__file__).resolve().parents[2]
LAYERS = list(range(0, 24, 3))


def test_embedded_trace_is_a_small_valid_real_trace():
    tr = load_trace(EMBEDDED_TRACE)                       # full value checks
    assert (tr.layers, tr.steps, tr.k, tr.T) == (8, 256, 2048, 32768)
    assert tr.sel.dtype == np.uint16 and not tr.has_mtp_axis
    assert list(tr.positions[[0, -1]]) == [31744, 31999]
    assert "cut from asyncio_32k.npz" in tr.model and "cut from asyncio_32k.npz" in tr.rule
    assert "layers 0,3,6,9,12,15,18,21 of 24" in tr.model
    assert os.path.getsize(EMBEDDED_TRACE) < 4 * 2**20


def test_embedded_trace_is_the_cut_it_names():
    full = load_trace(shipped_trace("asyncio_32k"), check_values=False)   # the recorded one, bit
    # for bit (tests/traces/test_compact_trace.py)
    tr = load_trace(EMBEDDED_TRACE, check_values=False)
    assert np.array_equal(tr.sel, full.sel[LAYERS, :256])
    assert np.array_equal(tr.positions, full.positions[:256]) and tr.T == full.T
    assert tr.model.startswith(full.model) and tr.rule.startswith(full.rule)


def test_embedded_trace_is_package_data(tmp_path):
    """setup.py's package_data puts it in the built package (build_py, no compiler needed), and
    .gitignore's *.npz does not hide it from git."""
    result = subprocess.run([sys.executable, "setup.py", "-q", "build_py", "--build-lib",
                             str(tmp_path)], cwd=REPO, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    built = tmp_path / "avsg" / "lab" / "traces" / "data" / os.path.basename(EMBEDDED_TRACE)
    assert built.read_bytes() == Path(EMBEDDED_TRACE).read_bytes()
    if (REPO / ".git").exists():
        ignored = subprocess.run(["git", "check-ignore", "-q", EMBEDDED_TRACE], cwd=REPO)
        assert ignored.returncode == 1, "the embedded trace is git-ignored"


def test_default_is_the_embedded_trace_and_named():
    assert find_trace(None) == EMBEDDED_TRACE and find_trace("x.npz") == "x.npz"
    assert trace_label(EMBEDDED_TRACE).startswith("asyncio_32k_8x256 (embedded")
    assert trace_label("some/other.npz") == "some/other.npz"
    from avsg.commands.run import load_selection_trace
    trace, line = load_selection_trace(None)
    assert trace.steps == 256 and line == f"trace {trace_label(EMBEDDED_TRACE)}"


def _run(argv, capsys):
    status = cli.main(argv)
    out = capsys.readouterr()
    return status, out.out, out.err


def test_bench_decode_and_serve_sim_default_to_it(capsys, tmp_path):
    status, out, err = _run(["bench", "decode", "--trace-steps", "40", "--trace-layers", "1",
                             "--batch", "1", "--context", "32768", "--mtp", "0",
                             "--out", str(tmp_path / "d")], capsys)
    assert status == 0, err
    assert "measured on asyncio_32k_8x256 (embedded" in out
    status, out, err = _run(["serve-sim", "--requests", "4", "--layers-per-trace", "2",
                             "--trace-steps", "64", "--variants", "fixed", "--quiet",
                             "--out", str(tmp_path / "s")], capsys)
    assert status == 0, err
    assert "locality from 2 trace rows (asyncio_32k_8x256 (embedded" in out


def test_another_trace_is_named_by_its_path(capsys, tmp_path):
    from avsg.lab.traces import synth
    from avsg.lab.traces.format import save_trace
    path = str(tmp_path / "mine.npz")
    save_trace(path, synth.generate(steps=48, layers=2, k=2048, max_len=6000, seed=0))
    status, out, err = _run(["bench", "hash-buckets", "--trace", path, "--steps", "3",
                             "--ratios", "1", "--out", str(tmp_path / "h")], capsys)
    assert status == 0, err
    assert f"trace {path}: 2 layers x 3 steps" in out      # --layers defaults to all of them
