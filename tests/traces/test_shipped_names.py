"""Every command that takes a trace takes the shipped ones by name (asyncio_32k_8x256, the embedded
default, and the full asyncio_32k and debian_reference_32k), and names them so in its output; a
value that is not a shipped name is a path."""
from __future__ import annotations

import os

import pytest

from avsg import cli
from avsg.lab.traces.lookup import (EMBEDDED_TRACE, SHIPPED, TraceInputError, find_trace, read_trace,
                                shipped_trace, trace_label)


def _run(argv, capsys):
    status = cli.main(argv)
    out = capsys.readouterr()
    return status, out.out, out.err


def test_names_resolve_to_the_package_files():
    assert find_trace("asyncio_32k_8x256") == EMBEDDED_TRACE
    for name in SHIPPED:
        assert os.path.isfile(find_trace(name))
        assert trace_label(name) == trace_label(find_trace(name))
        assert trace_label(find_trace(name)).startswith(f"{name} (")
    assert find_trace("./asyncio_32k") == "./asyncio_32k"         # a path, not the name
    with pytest.raises(TraceInputError, match="no such file: ./asyncio_32k"):
        read_trace("--trace", "./asyncio_32k")


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_trace_info_takes_every_shipped_name(name, capsys):
    """`avsg trace info asyncio_32k_8x256`, the name other commands print, failed on main."""
    status, out, err = _run(["trace", "info", name], capsys)
    assert status == 0, err
    assert out.startswith(f"{name}: valid trace")


def test_commands_with_a_trace_option_take_a_name(capsys, tmp_path):
    status, out, err = _run(["bench", "hash-buckets", "--trace", "debian_reference_32k",
                             "--layers", "2", "--steps", "3", "--ratios", "1",
                             "--out", str(tmp_path / "h")], capsys)
    assert status == 0, err
    assert "trace debian_reference_32k (shipped" in out
    status, out, err = _run(["demo", "--trace", "asyncio_32k", "--layers", "1", "--steps", "3"],
                            capsys)
    assert status == 0, err
    assert "asyncio_32k (shipped" in out
    status, out, err = _run(["trace", "replay", "asyncio_32k", "--layer-select", "0",
                             "--steps", "8", "--capacity", "4096", "--policy", "lru",
                             "--no-plot", "--out", str(tmp_path / "r")], capsys)
    assert status == 0, err


def test_serve_sim_sees_a_name_and_its_file_as_one_trace(capsys):
    for second in ("asyncio_32k", shipped_trace("asyncio_32k")):
        status, _, err = _run(["serve-sim", "--trace", "asyncio_32k", "--trace", second,
                               "--quiet"], capsys)
        assert status == 2 and "given twice" in err
