"""``avsg demo``: user mistakes are one line on stderr with exit status 2, no traceback."""
import subprocess
import sys

import pytest


def run(*args):
    return subprocess.run([sys.executable, "-m", "avsg.cli", "demo", *args], capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("args, named", [
    (["--steps", "0"], "--steps"), (["--steps", "-5"], "--steps"), (["--layers", "0"], "--layers"),
    (["--capacity", "100"], "--capacity"), (["--lifetime", "0"], "--lifetime"),
    (["--lifetime", "256"], "--lifetime"), (["--trace", "/no/such.npz"], "--trace"),
    (["--steps", "two"], "--steps"),
])
def test_demo_mistakes_are_one_line(args, named):
    result = run(*args)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and named in lines[0] and "Traceback" not in result.stderr


@pytest.mark.parametrize("args, named", [(["--layers", "9"], "--layers"),
                                         (["--steps", "257"], "--steps")])
def test_demo_refuses_more_than_the_embedded_trace_holds(args, named):
    result = run(*args)
    assert result.returncode == 2 and named in result.stderr


# ------------------------------------------------------------------------------ avsg trace

@pytest.fixture(scope="module")
def small_trace(tmp_path_factory):
    from avsg.lab.traces import synth
    from avsg.lab.traces.format import save_trace
    path = tmp_path_factory.mktemp("trace") / "small.npz"
    save_trace(path, synth.generate(steps=20, layers=2, k=16, max_len=200, seed=0))
    return str(path)


def run_trace(*args):
    return subprocess.run([sys.executable, "-m", "avsg.cli", "trace", *args],
                          capture_output=True, text=True, timeout=120)


def test_trace_mistakes_are_one_line(small_trace, tmp_path):
    not_a_trace = tmp_path / "junk.npz"
    not_a_trace.write_bytes(b"not a zip file")
    cases = [(["info", "/no/such.npz"], "no such file"),
             (["info", str(not_a_trace)], "junk.npz"),
             (["replay", small_trace, "--steps", "0"], "--steps"),
             (["replay", small_trace, "--steps", "-1"], "--steps"),
             (["replay", small_trace, "--steps", "500"], "--steps"),
             (["replay", small_trace, "--layer-select", "0-9"], "--layer-select"),
             (["replay", small_trace, "--layer-select", "x"], "--layer-select"),
             (["replay", small_trace, "--capacity", "0"], "--capacity"),
             (["replay", small_trace, "--policy", "nope"], "--policy")]
    for args, needle in cases:
        result = run_trace(*args)
        assert result.returncode == 2, (args, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and needle in lines[0] and "Traceback" not in result.stderr, args


def test_trace_replay_small(small_trace, tmp_path):
    result = run_trace("replay", small_trace, "--capacity", "32", "--policy", "lru", "belady",
                       "--layer-select", "1", "--steps", "10", "--out", str(tmp_path),
                       "--no-plot", "--quiet")
    assert result.returncode == 0, result.stderr
    assert "wrote" in result.stdout
