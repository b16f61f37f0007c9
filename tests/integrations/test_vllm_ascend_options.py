"""The vllm-ascend backend's options and import hygiene (no vllm needed)."""
import subprocess
import sys

import pytest

from avsg import reference
from avsg.integrations.vllm_ascend import avsg_options


def test_defaults_env_and_additional_config(monkeypatch):
    monkeypatch.delenv("AVSG_POLICY", raising=False)
    assert avsg_options(None) == {"policy": reference.DEFAULT_POLICY,
                                   "lifetime": reference.DEFAULT_LIFETIME}
    monkeypatch.setenv("AVSG_POLICY", "lru")
    assert avsg_options({})["policy"] == "lru"
    assert avsg_options({"avsg": {"policy": "lifetime", "lifetime": 8}}) == \
        {"policy": "lifetime", "lifetime": 8}
    assert avsg_options({"avsg": '{"policy": "lifetime", "lifetime": 4}'})["lifetime"] == 4


def test_a_lifetime_under_another_policy_names_where_that_policy_came_from(monkeypatch):
    monkeypatch.setenv("AVSG_POLICY", "lru")
    with pytest.raises(ValueError, match=r"the policy is 'lru' \(from AVSG_POLICY\)"):
        avsg_options({"avsg": {"lifetime": 16}})
    with pytest.raises(ValueError, match=r"the policy is 'reuse' \(from additional_config.avsg.policy\)"):
        avsg_options({"avsg": {"policy": "reuse", "lifetime": 16}})
    assert avsg_options({"avsg": {"policy": "lifetime", "lifetime": 16}})["lifetime"] == 16


@pytest.mark.parametrize("config, words", [
    ({"avsg": {"polcy": "lru"}}, "unknown keys ['polcy']"),
    ({"avsg": {"policy": "fifo"}}, "expected one of"),
    ({"avsg": {"lifetime": 0}}, "lifetime: expected an int in [1, 255]"),
    ({"avsg": ["lru"]}, "expected a dict"),
    ({"avsg": {"policy": "reuse", "lifetime": 8}}, "lifetime: read only by the lifetime policy"),
])
def test_bad_options_name_the_key(config, words, monkeypatch):
    monkeypatch.delenv("AVSG_POLICY", raising=False)
    with pytest.raises(ValueError) as err:
        avsg_options(config)
    assert words in str(err.value) and "additional_config.avsg" in str(err.value)


def test_importing_the_backend_and_plugin_imports_no_vllm():
    code = ("import sys, avsg.integrations.vllm_ascend, avsg.integrations.vllm_ascend_plugin as p;"
            "p.register();"
            "bad = [m for m in sys.modules if m.split('.')[0] in ('vllm', 'vllm_ascend', 'torch_npu')];"
            "assert not bad, bad")
    env_off = {k: v for k, v in __import__("os").environ.items() if k != "AVSG_VLLM_ASCEND"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env_off, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
