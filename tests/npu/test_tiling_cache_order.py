"""The device tiling cache (op_host/npu/launch_util.h) is shared by every stream: its ordering must
hold for every stream that uses an entry, not just the one that uploaded or evicts it.

tests/npu/tiling_cache_check.cpp compiles the cache as the NPU library does (AVSG_WITH_NPU, the
stand-ins of tests/npu/npu_stubs), links it against libtorch on CPU and fakes two NPU streams, A
and B: the stand-in of torch_npu's event implementation (what c10::Event dispatches to) and of
record_stream log each call instead of making it. Checked here, from that log:

* an upload records an event on the stream its copy was queued on;
* the first use of an entry on another stream waits on that event (else a launch there may read
  the tiling before the copy landed: garbage geometry); later uses there, and every use on the
  upload stream, add nothing;
* eviction protects every stream that used the entry (record_stream on each), not the evicting
  caller's stream: an entry used on A and B evicted from either names both, one used on A only
  evicted from B names A only.

Nothing here runs on an NPU: it checks which ordering calls are made, not that the runtime honours
them (docs/npu.md section 3).
"""
import os
import re
import shutil
import subprocess
from collections import OrderedDict

import pytest
import torch
from torch.utils.cpp_extension import include_paths, library_paths

from helpers import REPO as ROOT
from helpers.npu import STUBS

CHECK = os.path.join(ROOT, "tests", "npu", "tiling_cache_check.cpp")

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")


@pytest.fixture(scope="module")
def log(tmp_path_factory):
    exe = tmp_path_factory.mktemp("tiling_cache") / "tiling_cache_check"
    abi = int(torch.compiled_with_cxx11_abi())
    cmd = ["g++", "-std=c++17", "-O0", "-DAVSG_WITH_NPU=1", f"-D_GLIBCXX_USE_CXX11_ABI={abi}", "-Wall",
           "-Wextra", "-Werror", f"-I{ROOT}/op_host", f"-I{STUBS}",
           *[a for p in include_paths() for a in ("-isystem", p)], CHECK, "-o", str(exe),
           *[f"-L{p}" for p in library_paths()], *[f"-Wl,-rpath,{p}" for p in library_paths()],
           "-ltorch", "-ltorch_cpu", "-lc10"]
    build = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr[-4000:]
    res = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr[-4000:]
    assert "WRONG BYTES" not in res.stdout
    steps = OrderedDict()
    name = None
    for line in res.stdout.splitlines():
        if line.startswith("== "):
            name = line[3:]
            steps[name] = []
        else:
            steps[name].append(line)
    return steps


def uploads(lines, stream):
    """Event ids recorded on `stream`: the uploads of new entries."""
    return [int(m.group(1)) for m in (re.fullmatch(rf"record event=(\d+) stream={stream}", s) for s in lines) if m]


def record_streams(lines, tensor):
    return [s.split("stream=")[1] for s in lines if s.startswith(f"record_stream tensor={tensor} ")]


@needs_gxx
def test_use_on_another_stream_waits_for_the_upload(log):
    (t1,) = uploads(log["upload t1 on A"], "A")
    assert log["upload t1 on A"] == [f"record event={t1} stream=A"]
    assert log["t1 on B"] == [f"wait event={t1} stream=B"]
    (t2,) = uploads(log["upload t2 on B"], "B")
    assert t2 != t1
    assert log["upload t2 on B"] == [f"record event={t2} stream=B"]
    assert log["t2 on A"] == [f"wait event={t2} stream=A"]


@needs_gxx
def test_same_stream_use_needs_no_wait(log):
    for step in ("t1 again on A", "t1 again on B", "t1 back on A"):
        assert log[step] == [], step
    assert len(uploads(log["upload t3 on A"], "A")) == 1 and len(log["upload t3 on A"]) == 1
    # hits on the upload stream record nothing either: the fill's only calls are its own uploads
    fill = log["fill"]
    assert all(re.fullmatch(r"record event=\d+ stream=A|size=\d+", s) for s in fill), fill
    assert fill[-1] == "size=256"


@needs_gxx
def test_eviction_protects_every_stream_that_used_the_entry(log):
    # t1: uploaded on A, used on B; evicted by a miss on A
    assert sorted(record_streams(log["evict t1 from A"], "t1")) == ["A", "B"]
    # t2: uploaded on B, used on A; evicted by a miss on B
    assert sorted(record_streams(log["evict t2 from B"], "t2")) == ["A", "B"]
    # f100: used on A only; evicted by a miss on B: A is protected, B has nothing to protect
    assert record_streams(log["evict f100 from B"], "f100") == ["A"]
    # nothing else is recorded for reuse, and the bound holds
    for step in ("evict t1 from A", "evict t2 from B", "evict f100 from B"):
        assert len([s for s in log[step] if s.startswith("record_stream")]) == \
            {"evict t1 from A": 2, "evict t2 from B": 2, "evict f100 from B": 1}[step]
    assert log["evict f100 from B"][-1] == "size=256"


@needs_gxx
def test_eviction_records_the_streams_before_the_entry_goes(log):
    """record_stream must reach the allocator while the tensor is alive (it acts when the block is
    freed); the entry's upload event is released with it."""
    (t1,) = uploads(log["upload t1 on A"], "A")
    lines = log["evict t1 from A"]
    destroyed = lines.index(f"destroy event={t1}")
    assert all(i < destroyed for i, s in enumerate(lines) if s.startswith("record_stream tensor=t1"))


@needs_gxx
def test_release_empties_the_cache(log):
    assert log["release"][-1] == "size=0"
