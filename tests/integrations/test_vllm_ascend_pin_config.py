"""AVSG's settings and the fused-path check against vllm-ascend's REAL code at the pinned commit
(182b75ea84), on CPU, in a subprocess (vllm-ascend's torch_npu stubs must not leak into this
process).

At the pin, ``AscendConfig`` is a plain class that ignores unknown keys of ``additional_config``:
``additional_config["avsg"]`` reaches AVSG through the plugin's guard on ``init_ascend_config``
(installed on the config module and rebound in the platform module, which imported it by name),
and vllm-ascend's ``SparseKVOffloadConfig`` carries no fused flag, so AVSG is not refused. The
later shapes (a config that forbids the key, the fused flags) are exercised on stand-ins in
test_vllm_ascend_upstream_standins.py. Same prerequisites and skip rules as
test_vllm_ascend.py (vllm 0.27.x installed with ``--no-deps``, the vllm-ascend tree in the
third-party cache).
"""
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import third_party

REPO = Path(__file__).resolve().parents[2]
SESSION = Path(__file__).resolve().parent / "vllm_ascend_session"
REQUIRED_BY = "AVSG_REQUIRE_VLLM"

SCRIPT = r'''
import json, os, runpy, sys
tree = sys.argv[1]
import avsg_vllm_hook            # the session's torchvision stand-in (an import side effect)
runpy.run_path(os.path.join(tree, "tests", "ut", "conftest.py"))     # vllm-ascend's stubs
from unittest.mock import patch
from vllm.config import DeviceConfig, VllmConfig
import vllm_ascend.ascend_config as config
import vllm_ascend.platform as platform
stock = config.init_ascend_config
os.environ["AVSG_VLLM_ASCEND"] = "1"
for name in ("AVSG_CONFIG", "AVSG_POLICY", "AVSG_LIFETIME", "AVSG_SPLIT_ATTENTION"):
    os.environ.pop(name, None)
from avsg.integrations import vllm_ascend as backend
from avsg.integrations import vllm_ascend_plugin as plugin
plugin.install()
result = {"guarded": config.init_ascend_config._stock is stock,
          "rebound_in_platform": platform.init_ascend_config is config.init_ascend_config}
with patch("vllm_ascend.platform.NPUPlatform.check_and_update_config"):
    vllm_config = VllmConfig(device_config=DeviceConfig(device="cpu"))   # no platform plugin
    vllm_config.additional_config = {"avsg": {"policy": "reuse"}, "refresh": True}
    if sys.argv[2] == "1":      # a key the pin's SparseKVOffloadConfig ignores
        vllm_config.additional_config["sparse_kv_offload_config"] = {"use_fused_overlap": True}
    try:
        ascend_config = platform.init_ascend_config(vllm_config)
        result["outcome"] = "accepted"
        offload = ascend_config.sparse_kv_offload_config
        result["fused_conflict"] = backend.fused_path_conflict(offload) is not None
    except backend.AVSGConfigRefused as exc:
        result["outcome"] = "refused"
        result["message"] = str(exc)
    options, sources = backend.resolve_options(vllm_config.additional_config)
    result["options"], result["sources"] = options, sources
plugin.uninstall()
result["restored"] = config.init_ascend_config is stock and platform.init_ascend_config is stock
print("RESULT " + json.dumps(result))
'''


def run_config_script(tree, tmp_path, fused_key=True):
    """The script above against the vllm-ascend tree ``tree``; its result dict. ``fused_key``:
    put ``use_fused_overlap`` in ``sparse_kv_offload_config`` (a tree whose config forbids
    unknown keys refuses it)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tree), str(REPO / "python"), str(SESSION),
                                         env.get("PYTHONPATH", "")])
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.pop("VLLM_PLUGINS", None)
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tree), "1" if fused_key else "0"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


@pytest.fixture(scope="module")
def pinned_tree():
    (tree,) = third_party.require("vllm-ascend", required_by=REQUIRED_BY)
    spec = importlib.util.find_spec("vllm")
    from importlib import metadata
    version = metadata.version("vllm") if spec is not None else None
    if version is None or not version.startswith("0.27."):
        message = f"vllm 0.27.x is not installed (found {version})"
        if os.environ.get(REQUIRED_BY) == "1":
            pytest.fail(message)
        pytest.skip(message)
    return Path(tree)


def test_at_the_pin_additional_config_avsg_is_accepted_and_no_fused_flag(pinned_tree, tmp_path):
    result = run_config_script(pinned_tree, tmp_path)
    assert result["guarded"] and result["rebound_in_platform"] and result["restored"]
    assert result["outcome"] == "accepted", result
    assert result["options"] == {"policy": "reuse", "lifetime": 255, "split_attention": False}
    assert result["sources"]["policy"] == "additional_config.avsg.policy"
    # the pin's SparseKVOffloadConfig ignores use_fused_overlap: nothing routes around AVSG
    assert result["fused_conflict"] is False
