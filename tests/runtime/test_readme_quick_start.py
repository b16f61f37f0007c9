"""The README's quick-start figures are what ``avsg run`` prints on a fresh clone (the embedded
trace, no ../shared): hit rate, H2D bytes per token, MTP acceptance, the avsg/offload H2D ratio,
the new-KV share and the modelled NPU TPOT line.

None of these depends on the model's body: selections come from the trace by position, MTP
acceptance is simulated from per-request seeds, and the bytes depend only on the KV geometry
(latent 512 + RoPE 64, bf16), the top-k and the layer count. So the fast test runs the same
command on the ``demo`` preset with a narrow body (same layers, vocabulary, KV geometry, top-k
and MTP layer) and checks the README's figures exactly; the slow test runs the real default.
Only the times differ between the two (and from machine to machine); they are not checked.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re

import pytest

from avsg import cli
from avsg import model_config

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# narrower everywhere the figures do not look: attention heads and their widths, the FFNs, the
# experts, the indexer heads
NARROW = dict(hidden_size=64, intermediate_size=64, moe_intermediate_size=32,
              num_attention_heads=1, q_lora_rank=32, qk_nope_head_dim=16, v_head_dim=16,
              n_routed_experts=4, num_experts_per_tok=2, n_group=2, topk_group=1,
              index_n_heads=1)


def readme_quick_start() -> dict:
    """The figures of the quick-start output block, as printed (strings)."""
    text = open(os.path.join(REPO, "README.md")).read()
    section = text[text.index("## Quick start"):text.index("## Tests")]
    block = re.search(r"```\n(mode +TPOT ms.*?)```", section, re.S).group(1)
    figures = {}
    for line in block.splitlines():
        cells = line.split()
        if cells and cells[0] in ("offload", "avsg", "device") and "|" in cells:
            # mode, TPOT, p50, p99, tok/s, hit rate, H2D B/tok, MTP acc, | ...
            figures[cells[0]] = {"hit_rate": cells[5], "h2d": cells[6], "mtp_acc": cells[7]}
    m = re.search(r"avsg moves (\S+)x the H2D bytes of offload per output token; (\S+)% of its "
                  r"copies", block)
    figures["ratio"], figures["fresh"] = m.group(1), m.group(2)
    figures["npu"] = re.search(r"TPOT (device .*)$", block, re.M).group(1).strip()
    assert set(figures) >= {"offload", "avsg", "device"}, block
    return figures


def printed(result: dict) -> dict:
    """The same figures from ``avsg run --json``, formatted as the command prints them."""
    pct = lambda x: "-" if x is None else f"{100 * x:.1f}%"  # noqa: E731
    by_mode = {m["mode"]: m for m in result["modes"]}
    figures = {mode: {"hit_rate": pct(m["hit_rate"]), "h2d": f"{m['h2d_bytes_per_token']:,.0f}",
                      "mtp_acc": pct(m["mtp_acceptance"])} for mode, m in by_mode.items()}
    a, o = by_mode["avsg"], by_mode["offload"]
    figures["ratio"] = f"{a['h2d_bytes_per_token'] / o['h2d_bytes_per_token']:.3f}"
    figures["fresh"] = f"{100 * a['h2d_fresh_share']:.1f}"
    figures["npu"] = ", ".join(f"{m} {1e3 * p['tpot_s']:.1f} ms"
                               for m, p in result["npu_projection_estimate"].items())
    return figures


def run_json(tmp_path, *extra) -> dict:
    out = tmp_path / f"run{len(extra)}.json"
    assert cli.main(["run", "--quiet", "--json", str(out), *extra]) == 0
    result = json.loads(out.read_text())
    assert result["outputs_identical"] is True
    assert result["workload"]["selection"].startswith("trace asyncio_32k_8x256 (embedded")
    return result


def test_readme_figures_are_what_avsg_run_prints_narrow_body(tmp_path):
    narrow = dataclasses.replace(model_config.preset("demo"), **NARROW)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(dataclasses.asdict(narrow)))
    assert printed(run_json(tmp_path, "--config", str(path))) == readme_quick_start()


def test_split_attention_keeps_the_quick_start_tokens_and_figures_narrow_body(tmp_path):
    """The quick-start workload with ``--split-attention``: avsg's figures as the README prints
    them (the split moves no copy) and the same greedy tokens as device-resident KV
    (``outputs_identical`` compares tokens when avsg splits; its logits are within the stated
    tolerance, not bit for bit)."""
    narrow = dataclasses.replace(model_config.preset("demo"), **NARROW)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(dataclasses.asdict(narrow)))
    # offload (every selection copied) adds nothing here: the split changes only avsg's attention
    result = run_json(tmp_path, "--config", str(path), "--split-attention", "--modes",
                      "avsg,device")
    assert result["workload"]["split_attention"] is True
    pct = lambda x: f"{100 * x:.1f}%"  # noqa: E731
    avsg = {m["mode"]: m for m in result["modes"]}["avsg"]
    want = readme_quick_start()
    assert {"hit_rate": pct(avsg["hit_rate"]), "h2d": f"{avsg['h2d_bytes_per_token']:,.0f}",
            "mtp_acc": pct(avsg["mtp_acceptance"])} == want["avsg"]
    assert f"{100 * avsg['h2d_fresh_share']:.1f}" == want["fresh"]


@pytest.mark.slow
def test_split_attention_keeps_the_quick_start_tokens_and_figures(tmp_path):
    assert printed(run_json(tmp_path, "--split-attention")) == readme_quick_start()


@pytest.mark.slow
def test_readme_figures_are_what_avsg_run_prints(tmp_path):
    """The command exactly as the README gives it (about a minute on an idle 2-core machine)."""
    assert printed(run_json(tmp_path)) == readme_quick_start()
