"""The vllm-ascend backend's options and import hygiene (no vllm needed)."""
import json
import subprocess
import sys

import pytest

from avsg import reference
from avsg.integrations.vllm_ascend import avsg_options, resolve_options


@pytest.fixture(autouse=True)
def _no_avsg_settings(monkeypatch):
    for name in ("AVSG_CONFIG", "AVSG_POLICY", "AVSG_LIFETIME", "AVSG_SPLIT_ATTENTION"):
        monkeypatch.delenv(name, raising=False)


def test_defaults_env_and_additional_config(monkeypatch):
    monkeypatch.delenv("AVSG_POLICY", raising=False)
    assert avsg_options(None) == {"policy": reference.DEFAULT_POLICY,
                                   "lifetime": reference.DEFAULT_LIFETIME,
                                   "split_attention": False}
    monkeypatch.setenv("AVSG_POLICY", "lru")
    assert avsg_options({})["policy"] == "lru"
    assert avsg_options({"avsg": {"policy": "lifetime", "lifetime": 8}}) == \
        {"policy": "lifetime", "lifetime": 8, "split_attention": False}
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


def test_settings_file_env_and_additional_config_in_that_order(monkeypatch, tmp_path):
    """AVSG's own settings (no key inside vllm-ascend's config): the AVSG_CONFIG file, then
    AVSG_POLICY / AVSG_LIFETIME, then additional_config["avsg"] where vllm-ascend accepts it;
    each option says where it came from."""
    path = tmp_path / "avsg.json"
    path.write_text(json.dumps({"policy": "lifetime", "lifetime": 12}))
    monkeypatch.setenv("AVSG_CONFIG", str(path))
    options, sources = resolve_options(None)
    assert options == {"policy": "lifetime", "lifetime": 12, "split_attention": False}
    assert sources == {"policy": f"AVSG_CONFIG={path}: policy",
                       "lifetime": f"AVSG_CONFIG={path}: lifetime",
                       "split_attention": "default"}
    monkeypatch.setenv("AVSG_LIFETIME", "40")
    assert resolve_options({})[0]["lifetime"] == 40
    assert resolve_options({})[1]["lifetime"] == "AVSG_LIFETIME"
    options, sources = resolve_options({"avsg": {"lifetime": 7}})
    assert options["lifetime"] == 7 and sources["lifetime"] == "additional_config.avsg.lifetime"
    assert sources["policy"] == f"AVSG_CONFIG={path}: policy"
    # a lifetime set anywhere is refused under another policy, naming both settings
    monkeypatch.setenv("AVSG_POLICY", "reuse")
    with pytest.raises(ValueError, match=r"AVSG_LIFETIME: read only by the lifetime policy; "
                                         r"the policy is 'reuse' \(from AVSG_POLICY\)"):
        resolve_options({})
    monkeypatch.delenv("AVSG_LIFETIME")
    with pytest.raises(ValueError, match=r"AVSG_CONFIG=.*: lifetime: read only by the lifetime"):
        resolve_options({})


@pytest.mark.parametrize("content, words", [
    (None, "cannot read it"),
    ("{policy: lru}", "not JSON"),
    ("[1]", "expected a JSON object, got list"),
    ('{"polcy": "lru"}', "unknown keys ['polcy']"),
    ('{"policy": "fifo"}', ": policy: expected one of"),
    ('{"lifetime": 300}', ": lifetime: expected an int in [1, 255]"),
])
def test_bad_settings_file_is_a_one_line_error_naming_it(content, words, monkeypatch, tmp_path):
    path = tmp_path / "avsg.json"
    if content is not None:
        path.write_text(content)
    monkeypatch.setenv("AVSG_CONFIG", str(path))
    with pytest.raises(ValueError) as err:
        avsg_options({})
    text = str(err.value)
    assert "\n" not in text and f"AVSG_CONFIG={path}" in text and words in text


@pytest.mark.parametrize("value, words", [("x", "AVSG_LIFETIME: expected an int"),
                                          ("0", "AVSG_LIFETIME: expected an int in [1, 255]")])
def test_bad_lifetime_env(value, words, monkeypatch):
    monkeypatch.setenv("AVSG_LIFETIME", value)
    with pytest.raises(ValueError) as err:
        avsg_options({})
    assert words in str(err.value)


def test_split_attention_from_env_file_and_additional_config(monkeypatch, tmp_path):
    assert avsg_options(None)["split_attention"] is False
    monkeypatch.setenv("AVSG_SPLIT_ATTENTION", "1")
    options, sources = resolve_options(None)
    assert options["split_attention"] is True and sources["split_attention"] == \
        "AVSG_SPLIT_ATTENTION"
    assert avsg_options({"avsg": {"split_attention": False}})["split_attention"] is False
    monkeypatch.setenv("AVSG_SPLIT_ATTENTION", "maybe")
    with pytest.raises(ValueError, match="AVSG_SPLIT_ATTENTION: expected 1 or 0"):
        avsg_options(None)
    monkeypatch.delenv("AVSG_SPLIT_ATTENTION")
    path = tmp_path / "avsg.json"
    path.write_text('{"split_attention": "yes"}')
    monkeypatch.setenv("AVSG_CONFIG", str(path))
    with pytest.raises(ValueError, match="split_attention: expected true or false"):
        avsg_options(None)
