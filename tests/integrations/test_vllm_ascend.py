"""AVSG inside vllm-ascend, on CPU, in one subprocess: vLLM's plugin loading with the switch off
(nothing in vllm-ascend changes) and on, vllm-ascend's own sparse-KV-offload unit tests with the
plugin active, the multi-step drive of its real call sites (vllm_ascend_session/
vllm_ascend_drive.py) and the H2D comparison with its per-token LRU.

Needs vllm 0.27.1 (``.ci/run`` installs it with ``--no-deps``) and the vllm-ascend source tree in
the third-party cache (``$AVSG_THIRD_PARTY/vllm-ascend/<commit>/``, default
``~/.cache/avsg/third_party``; scripts/third_party.py, docs/testing.md), used in place and never
written to; skips with the reason when either is absent (fails instead under AVSG_REQUIRE_VLLM=1,
which .ci/run sets when it finds the tree). Everything that imports vllm runs in a subprocess:
vllm-ascend's conftest stubs ``torch_npu`` and ``torch.npu`` process-wide, which must not leak into
the rest of the suite.
"""
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import third_party

REPO = Path(__file__).resolve().parents[2]
SESSION = Path(__file__).resolve().parent / "vllm_ascend_session"
REQUIRED_BY = "AVSG_REQUIRE_VLLM"
UNIT_TESTS = ["tests/ut/attention/test_sfa_kv_offload.py",
              "tests/ut/distributed/kv_transfer/sparse_kv_offload/"]


def _vllm_version():
    spec = importlib.util.find_spec("vllm")
    if spec is None:
        return None
    from importlib import metadata
    try:
        return metadata.version("vllm")
    except metadata.PackageNotFoundError:
        return "unknown"


@pytest.fixture(scope="module")
def vllm_ascend_tree():
    (tree,) = third_party.require("vllm-ascend", required_by=REQUIRED_BY)
    version = _vllm_version()
    if version is None or not version.startswith("0.27."):
        message = (f"vllm 0.27.x is not installed (found {version}); .ci/run installs it with "
                   f"--no-deps -r requirements-vllm.txt")
        if os.environ.get(REQUIRED_BY) == "1":     # set by .ci/run with the tree: never skip there
            pytest.fail(message)
        pytest.skip(message)
    return Path(tree)


def _listing(tree: Path) -> dict:
    """Every path under the tree and its modification time: the cache is read, never written."""
    listing = {}
    for folder, dirs, files in os.walk(tree):
        for name in dirs + files:
            path = os.path.join(folder, name)
            listing[path] = os.lstat(path).st_mtime_ns
    return listing


def _entry_point_dist(tmp: Path) -> Path:
    """A dist-info declaring setup.py's vllm.general_plugins entry point, so vLLM's own
    ``load_general_plugins`` finds the plugin whether or not this checkout is pip-installed."""
    text = (REPO / "setup.py").read_text()
    match = re.search(r'"vllm\.general_plugins":\s*\[\s*"([^"]+)"', text)
    assert match, "setup.py declares no vllm.general_plugins entry point"
    name, target = (s.strip() for s in match.group(1).split("="))
    dist = tmp / "avsg_vllm_plugin-0.0.0.dist-info"
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: avsg-vllm-plugin\n"
                                   "Version: 0.0.0\n")
    (dist / "entry_points.txt").write_text(f"[vllm.general_plugins]\n{name} = {target}\n")
    return tmp


def _env(tree, tmp, switch):
    env = dict(os.environ)
    paths = [str(tree), str(REPO / "python"), str(SESSION), str(_entry_point_dist(tmp))]
    env["PYTHONPATH"] = os.pathsep.join(paths + [env.get("PYTHONPATH", "")])
    env["PYTHONDONTWRITEBYTECODE"] = "1"     # no __pycache__ inside the cache's tree
    env.pop("VLLM_PLUGINS", None)
    if switch:
        env["AVSG_VLLM_ASCEND"] = "1"
    else:
        env.pop("AVSG_VLLM_ASCEND", None)
    return env


def test_vllm_ascend_unit_tests_and_drive_with_the_plugin_on(vllm_ascend_tree, tmp_path):
    tree = vllm_ascend_tree
    report = tmp_path / "h2d.json"
    env = _env(tree, tmp_path / "dist", switch=True)
    env["AVSG_VLLM_ASCEND_REPORT"] = str(report)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
           "avsg_vllm_hook", "-o", "addopts=", "--rootdir", str(tree),
           *(str(tree / t) for t in UNIT_TESTS), str(SESSION / "vllm_ascend_drive.py")]
    before = _listing(tree)
    # run from a scratch folder: whatever the tests write relative to it stays out of the cache
    work = tmp_path / "work"
    work.mkdir()
    proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=600)
    tail = (proc.stdout + proc.stderr)[-4000:]
    assert proc.returncode == 0, tail
    after = _listing(tree)
    changed = sorted(p for p in before.keys() | after.keys() if before.get(p) != after.get(p))
    assert not changed, f"the session wrote into the cache's tree: {changed[:10]}"
    passed = re.search(r"(\d+) passed", proc.stdout)
    assert passed and int(passed.group(1)) >= 11 + 6, tail   # 11 of vllm-ascend's, 6 drive
    result = json.loads(report.read_text())
    print(f"\nH2D rows over the drive (same steps, equal buffer memory): AVSG "
          f"{result['avsg_h2d_rows']}, vllm-ascend per-token LRU {result['lru_h2d_rows']} "
          f"({result['lru_h2d_rows'] / max(1, result['avsg_h2d_rows']):.2f}x); "
          f"{result['exact_tokens']} attention outputs exact; events {result['events']}")
    assert result["avsg_h2d_rows"] > 0 and result["lru_h2d_rows"] > 0
