"""``avsg run`` and ``avsg generate`` from the command line: a small run end to end, and every user
mistake as one line on stderr with exit status 2 (no traceback)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from avsg import cli
from avsg import model_config
from avsg.lab.traces import synth
from avsg.lab.traces.format import save_trace

TINY_RUN = ["run", "--config", "tiny", "--batch", "2", "--requests", "3", "--new-tokens", "6",
            "--capacity", "24", "--quiet"]


@pytest.fixture(scope="module")
def tiny_trace(tmp_path_factory):
    topk = model_config.preset("tiny").index_topk
    path = tmp_path_factory.mktemp("trace") / "tiny.npz"
    save_trace(path, synth.generate(steps=60, layers=2, k=topk, max_len=300, seed=0))
    return str(path)


def test_run_small_end_to_end(tiny_trace, tmp_path, capsys):
    out = tmp_path / "run.json"
    status = cli.main(TINY_RUN + ["--trace", tiny_trace, "--mtp", "2", "--json", str(out)])
    assert status == 0
    printed = capsys.readouterr().out
    assert "outputs identical across modes (tokens and logits, bit for bit): yes" in printed
    assert "not an NPU" in printed
    result = json.loads(out.read_text())
    assert result["outputs_identical"] is True
    assert [m["mode"] for m in result["modes"]] == ["offload", "avsg", "device"]
    for m in result["modes"]:
        for key in ("tpot_ms", "tpot_p50_ms", "tpot_p99_ms", "tokens_per_s", "hit_rate",
                    "h2d_bytes_per_token", "mtp_acceptance", "phase_ms"):
            assert key in m
        assert set(m["phase_ms"]) == {"index_select", "plan", "plan_gather", "gather", "attention",
                                      "rest"}
    by_mode = {m["mode"]: m for m in result["modes"]}
    assert by_mode["device"]["h2d_bytes_per_token"] == 0
    assert 0 < by_mode["avsg"]["h2d_bytes_per_token"] < by_mode["offload"]["h2d_bytes_per_token"]
    assert "simulated" in result["workload"]["acceptance"]
    # on CPU the avsg store's plan and copy are one launch: timed as one phase, shown as such
    avsg_ms = by_mode["avsg"]["phase_ms"]
    assert avsg_ms["plan_gather"] > 0 and avsg_ms["gather"] == 0
    assert by_mode["offload"]["phase_ms"]["plan_gather"] == 0
    row = next(line for line in printed.splitlines() if line.startswith("avsg ") and "|" in line)
    assert row.split()[-3] == "-"
    assert "avsg: plan and gather are one launch (plan_gather)" in printed


def test_run_with_split_attention_keeps_the_tokens_and_the_copies(tiny_trace, tmp_path,
                                                                   capsys):
    """--split-attention: the same copies and hit rate as the one-pass run, the same tokens in
    every mode (logits compared within tolerance elsewhere: tests/runtime/test_split_attention.py),
    and the run says what it compared."""
    runs = {}
    for extra in ([], ["--split-attention"]):
        out = tmp_path / f"run{len(extra)}.json"
        assert cli.main(TINY_RUN + ["--trace", tiny_trace, "--mtp", "1", "--json", str(out),
                                    *extra]) == 0
        runs[bool(extra)] = json.loads(out.read_text())
    printed = capsys.readouterr().out
    assert "avsg's split-attention logits are within its stated tolerance" in printed
    plain, split = runs[False], runs[True]
    assert split["outputs_identical"] is True and split["workload"]["split_attention"] is True
    a, b = ({m["mode"]: m for m in r["modes"]}["avsg"] for r in (plain, split))
    for key in ("hit_rate", "h2d_bytes_per_token", "h2d_fresh_share", "mtp_acceptance",
                "output_tokens"):
        assert a[key] == b[key], key


def test_split_attention_needs_the_avsg_mode():
    result = run_cli(*TINY_RUN, "--modes", "device", "--split-attention")
    assert result.returncode == 2 and "--split-attention" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("policy", ["lifetime", "lru"])
def test_run_with_every_residency_policy(tiny_trace, tmp_path, capsys, policy):
    out = tmp_path / "run.json"
    status = cli.main(TINY_RUN + ["--trace", tiny_trace, "--mtp", "1", "--policy", policy,
                                  "--json", str(out)])
    assert status == 0
    assert f"{policy} policy" in capsys.readouterr().out
    result = json.loads(out.read_text())
    assert result["outputs_identical"] is True and result["workload"]["policy"] == policy


def test_run_with_own_indexer_and_trace_recording(tmp_path, capsys):
    trace_out = tmp_path / "rec.npz"
    status = cli.main(TINY_RUN + ["--select", "indexer", "--context", "200", "--mtp", "0",
                                  "--modes", "avsg,device", "--record-trace", str(trace_out)])
    assert status == 0
    from avsg.lab.traces.format import load_trace
    recorded = load_trace(trace_out)
    assert recorded.k == model_config.preset("tiny").index_topk
    assert recorded.steps >= 1


def test_run_with_own_indexer_needs_no_context_on_a_small_model(capsys):
    """`avsg run --config tiny --select indexer` (docs/runtime.md): the default context is 32K, or
    what the model's positions hold beside the outputs (tiny: 4,096); on main it was refused."""
    status = cli.main(TINY_RUN + ["--select", "indexer", "--mtp", "0", "--modes", "avsg"])
    out = capsys.readouterr()
    assert status == 0, out.err
    import re
    low, high = (int(v.replace(",", "")) for v in
                 re.search(r"contexts ([\d,]+)\.\.([\d,]+)", out.out).groups())
    positions = model_config.preset("tiny").max_position_embeddings
    outputs = 8 + 1                    # up to 1.25 x 6 new tokens, + 1 (no drafts)
    assert positions - outputs - 1024 <= low <= high <= positions - outputs


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "avsg.cli", *args], capture_output=True,
                          text=True, timeout=300)


def unknown_key_config(tmp_path):
    config = dict(vars(model_config.preset("tiny")))
    config["not_a_deepseek_key"] = 1
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config, default=str))
    return str(path)


@pytest.mark.parametrize("args, named", [
    (["--batch", "0"], "--batch"),
    (["--capacity", "8"], "--capacity"),
    (["--trace", "/no/such/trace.npz"], "--trace"),
    (["--config", "giant"], "--config"),
    (["--context", "999999", "--select", "indexer"], "--context"),
    (["--modes", "device,cloud"], "--modes"),
    (["--acceptance", "sometimes"], "--acceptance"),
    (["--mtp", "7"], "--mtp"),
    (["--lifetime", "300"], "--lifetime"),
    (["--device", "tpu"], "--device"),
])
def test_run_user_mistakes_are_one_line(args, named):
    result = run_cli(*TINY_RUN, *args)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and named in lines[0], result.stderr
    assert "Traceback" not in result.stderr


def test_run_default_trace_with_tiny_topk_is_refused():
    """The embedded trace selects top-2048; the tiny model's top-k differs: refuse, do not
    truncate."""
    result = run_cli(*TINY_RUN)
    assert result.returncode == 2 and "top-" in result.stderr


def test_config_with_unknown_key_is_one_line(tmp_path):
    result = run_cli(*TINY_RUN, "--config", unknown_key_config(tmp_path), "--select", "indexer",
                     "--context", "100")
    assert result.returncode == 2
    assert "not_a_deepseek_key" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_generate_matches_the_function_and_refuses_bad_input(tmp_path):
    transformers = pytest.importorskip("transformers")
    from avsg.commands.generate import generate
    from avsg.runtime.model import DeepseekV32
    from avsg.model_config import from_hf_config
    from avsg.runtime.weights import load_safetensors
    hf_config = transformers.DeepseekV32Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2, q_lora_rank=16,
        kv_lora_rank=32,
        qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8, n_routed_experts=4,
        num_experts_per_tok=2, n_group=2, topk_group=1, first_k_dense_replace=1,
        index_n_heads=8, index_head_dim=16, index_topk=4, max_position_embeddings=256)
    torch.manual_seed(0)
    transformers.DeepseekV32ForCausalLM(hf_config).save_pretrained(tmp_path / "ckpt")
    ckpt = str(tmp_path / "ckpt")
    out = tmp_path / "gen.json"
    prompts = [[1, 2, 3, 4, 5, 6, 7, 8], [9, 10, 11, 12, 13]]
    result = run_cli("generate", "--checkpoint", ckpt, "--input-ids", json.dumps(prompts),
                     "--max-new-tokens", "5", "--mode", "avsg", "--json", str(out))
    assert result.returncode == 0, result.stderr
    model = DeepseekV32(from_hf_config(ckpt + "/config.json"))
    load_safetensors(model, ckpt)
    assert json.loads(out.read_text())["outputs"] == generate(model, prompts, 5)
    for bad, named in [(["--input-ids", "[[1, 2], []]"], "--input-ids"),
                       (["--input-ids", "not json"], "--input-ids"),
                       (["--input-ids", "[[1, 999]]"], "--input-ids"),
                       (["--input-ids", "[[1]]", "--mtp", "1"], "--mtp"),
                       (["--input-ids", "[[1]]", "--max-new-tokens", "0"], "--max-new-tokens")]:
        result = run_cli("generate", "--checkpoint", ckpt, *bad)
        assert result.returncode == 2 and named in result.stderr, (bad, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1
    result = run_cli("generate", "--checkpoint", str(tmp_path / "nothing"), "--input-ids", "[[1]]")
    assert result.returncode == 2 and "--checkpoint" in result.stderr
