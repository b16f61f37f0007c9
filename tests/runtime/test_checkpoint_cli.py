"""``avsg run --checkpoint DIR`` and ``avsg generate --checkpoint DIR`` on checkpoints as users
have them: the model comes from DIR/config.json (``--config`` overrides it), and every broken
checkpoint is one line on stderr and exit status 2, never a traceback.

The checkpoints are the ``tiny`` preset written the way a checkpoint directory holds it: its
config as config.json and its seeded random weights as model.safetensors.
"""
from __future__ import annotations

import json

import pytest
import torch

from avsg import cli
from avsg import model_config
from avsg.runtime.model import DeepseekV32
from avsg.runtime.weights import init_random

safetensors_torch = pytest.importorskip("safetensors.torch")

# the tiny model's top-8 does not fit the embedded top-2048 trace: its own indexer selects
RUN = ["run", "--select", "indexer", "--context", "100", "--batch", "2", "--requests", "2",
       "--new-tokens", "4", "--capacity", "24", "--modes", "avsg,device", "--quiet"]
GENERATE = ["generate", "--input-ids", "[[1, 2, 3]]", "--max-new-tokens", "3"]


def _tiny_config(**changes) -> dict:
    return {**dict(vars(model_config.preset("tiny"))), **changes}


def _tiny_model(config: dict, seed: int = 1) -> DeepseekV32:
    model = DeepseekV32(model_config.ModelConfig(**config))
    init_random(model, seed)
    return model


def write_checkpoint(directory, config: dict = None, drop_prefix: str = None, reshape=None):
    """config.json + model.safetensors of a seeded tiny model; ``drop_prefix`` leaves out every
    tensor whose name starts with it, ``reshape`` replaces one tensor by zeros of a shape."""
    config = config or _tiny_config()
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config, default=str))
    tensors = {k: v.clone().contiguous() for k, v in _tiny_model(config).state_dict().items()
               if not (drop_prefix and k.startswith(drop_prefix))}
    for name, shape in (reshape or {}).items():
        tensors[name] = torch.zeros(shape)
    safetensors_torch.save_file(tensors, str(directory / "model.safetensors"))
    return directory


def one_line_error(argv, capsys, named: str) -> str:
    status = cli.main(argv)
    err = capsys.readouterr().err
    assert status == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert named in lines[0] and "Traceback" not in err, err
    return lines[0]


def _selections(argv, path, capsys):
    """Row 0's indexer selections in a run: they depend on every weight up to the indexer."""
    assert cli.main(argv + ["--record-trace", str(path)]) == 0, capsys.readouterr().err
    capsys.readouterr()
    from avsg.lab.traces.format import load_trace
    return load_trace(path).sel


def test_run_reads_the_checkpoints_config_and_weights(tmp_path, capsys):
    """No --config: the model is the checkpoint's (tiny, from config.json, not the demo preset)
    and so are its weights: a checkpoint of the weights ``--seed 1`` draws selects exactly what
    the random model of seed 1 selects, one of other weights does not."""
    ckpt = write_checkpoint(tmp_path / "seed1")
    out = tmp_path / "run.json"
    assert cli.main(RUN + ["--checkpoint", str(ckpt), "--seed", "1", "--json", str(out)]) == 0
    assert str(ckpt / "config.json") in capsys.readouterr().out
    result = json.loads(out.read_text())
    assert result["config"]["model"] == str(ckpt / "config.json")
    assert result["config"]["hidden_size"] == model_config.preset("tiny").hidden_size
    assert result["outputs_identical"] is True
    random1 = _selections(RUN + ["--config", "tiny", "--seed", "1"], tmp_path / "r.npz", capsys)
    loaded = _selections(RUN + ["--checkpoint", str(ckpt), "--seed", "1"], tmp_path / "c.npz",
                         capsys)
    other = write_checkpoint(tmp_path / "seed7")
    safetensors_torch.save_file({k: v.contiguous() for k, v in _tiny_model(
        _tiny_config(), seed=7).state_dict().items()}, str(other / "model.safetensors"))
    loaded7 = _selections(RUN + ["--checkpoint", str(other), "--seed", "1"], tmp_path / "o.npz",
                          capsys)
    assert (loaded == random1).all() and loaded.shape == loaded7.shape
    assert not (loaded7 == random1).all()


def test_config_overrides_the_checkpoints(tmp_path, capsys):
    """--config wins over DIR/config.json: a checkpoint whose config.json is broken still loads
    with --config naming the model it holds; without --config the broken file is the error."""
    ckpt = write_checkpoint(tmp_path / "ckpt")
    (ckpt / "config.json").write_text('{"vocab_size": 25')
    line = one_line_error(RUN + ["--checkpoint", str(ckpt)], capsys, "--checkpoint")
    assert "config.json" in line
    assert cli.main(RUN + ["--checkpoint", str(ckpt), "--config", "tiny"]) == 0
    capsys.readouterr()
    # and a --config that does not fit the weights is the shape error, not a silent mix
    one_line_error(RUN + ["--checkpoint", str(ckpt), "--config", "demo", "--capacity", "8192"],
                   capsys, "--checkpoint")


def test_checkpoint_without_config_json_asks_for_config(tmp_path, capsys):
    ckpt = write_checkpoint(tmp_path / "ckpt")
    (ckpt / "config.json").unlink()
    line = one_line_error(RUN + ["--checkpoint", str(ckpt)], capsys, "--checkpoint")
    assert "no config.json" in line and "--config" in line
    assert cli.main(RUN + ["--checkpoint", str(ckpt), "--config", "tiny"]) == 0


@pytest.mark.parametrize("command", ["run", "generate"])
def test_truncated_safetensors_is_one_line(tmp_path, capsys, command):
    ckpt = write_checkpoint(tmp_path / "ckpt")
    weights = ckpt / "model.safetensors"
    data = weights.read_bytes()
    for cut in (len(data) // 2, 6):                       # in the tensors, in the header
        weights.write_bytes(data[:cut])
        argv = (RUN if command == "run" else GENERATE) + ["--checkpoint", str(ckpt)]
        line = one_line_error(argv, capsys, "--checkpoint")
        assert "model.safetensors" in line and "not a readable safetensors file" in line


@pytest.mark.parametrize("command", ["run", "generate"])
def test_missing_files_are_one_line(tmp_path, capsys, command):
    argv = RUN if command == "run" else GENERATE
    one_line_error(argv + ["--checkpoint", str(tmp_path / "absent")], capsys, "--checkpoint")
    ckpt = write_checkpoint(tmp_path / "ckpt")
    (ckpt / "model.safetensors").unlink()
    assert "no *.safetensors" in one_line_error(argv + ["--checkpoint", str(ckpt)], capsys,
                                                "--checkpoint")
    # a sharded checkpoint whose index names a shard that is not there
    (ckpt / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"lm_head.weight": "model-00001-of-00002.safetensors"}}))
    assert "model-00001-of-00002" in one_line_error(argv + ["--checkpoint", str(ckpt)], capsys,
                                                    "--checkpoint")
    (ckpt / "model.safetensors.index.json").write_text('{"weight_map": ')
    assert "index" in one_line_error(argv + ["--checkpoint", str(ckpt)], capsys, "--checkpoint")


def test_wrong_shapes_are_one_line(tmp_path, capsys):
    name = "model.layers.1.self_attn.kv_b_proj.weight"
    ckpt = write_checkpoint(tmp_path / "ckpt", reshape={name: (3, 3)})
    line = one_line_error(RUN + ["--checkpoint", str(ckpt)], capsys, "--checkpoint")
    assert "wrong shape" in line and name in line


def test_missing_mtp_layer_is_one_line(tmp_path, capsys):
    """Two ways a checkpoint lacks the MTP layer: its config declares none (a transformers
    save_pretrained config) while --mtp asks for drafts, or the config declares one and the
    weights leave it out."""
    no_mtp = write_checkpoint(tmp_path / "no_mtp", _tiny_config(num_nextn_predict_layers=0))
    for mtp in ("1", "3"):
        line = one_line_error(RUN + ["--checkpoint", str(no_mtp), "--mtp", mtp], capsys, "--mtp")
        assert "no MTP layer" in line and "--mtp 0" in line
    assert cli.main(RUN + ["--checkpoint", str(no_mtp), "--mtp", "0"]) == 0
    capsys.readouterr()
    mtp_layer = f"model.layers.{model_config.preset('tiny').num_hidden_layers}."
    stripped = write_checkpoint(tmp_path / "stripped", drop_prefix=mtp_layer)
    line = one_line_error(RUN + ["--checkpoint", str(stripped)], capsys, "--checkpoint")
    assert "no weights for MTP layer" in line and mtp_layer in line
    line = one_line_error(GENERATE + ["--checkpoint", str(stripped), "--mtp", "1"], capsys,
                          "--checkpoint")
    assert "no weights for MTP layer" in line
