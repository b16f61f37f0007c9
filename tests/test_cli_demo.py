"""``avsg demo``: user mistakes are one line on stderr with exit status 2, no traceback."""
import os
import subprocess
import sys

import pytest

SHARED = os.path.join("..", "shared", "traces", "asyncio_32k.npz")


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


@pytest.mark.skipif(not os.path.exists(SHARED), reason="shared trace not beside the repository")
@pytest.mark.parametrize("args, named", [(["--layers", "100"], "--layers"),
                                         (["--steps", "5000"], "--steps")])
def test_demo_refuses_more_than_the_trace_holds(args, named):
    result = run("--trace", SHARED, *args)
    assert result.returncode == 2 and named in result.stderr
