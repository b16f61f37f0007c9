"""The attention-probability selection rule, and scripts/record_trace.py when transformers exists."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from avsg.lab.traces.format import load_trace
from avsg.lab.traces.record import select_topk

REPO = Path(__file__).resolve().parents[2]


def test_rule_sums_heads_is_causal_and_sorted():
    # 2 heads, 2 queries (positions 2 and 3) over 5 key positions
    attn = torch.zeros(2, 2, 5)
    # query at pos 2: head 0 likes 0 (0.6), head 1 likes 2 (0.5) and 1 (0.4); pos 4 is in the future
    attn[0, 0] = torch.tensor([0.6, 0.1, 0.3, 0.0, 0.9])
    attn[1, 0] = torch.tensor([0.1, 0.4, 0.5, 0.0, 0.9])
    # sums over heads (causal part): p0 0.7, p1 0.5, p2 0.8 -> top-2 {0, 2}, sorted ascending
    # query at pos 3: sums p0 0.2, p1 0.9, p2 0.2, p3 0.7 -> top-2 {1, 3}
    attn[0, 1] = torch.tensor([0.1, 0.5, 0.1, 0.3, 0.0])
    attn[1, 1] = torch.tensor([0.1, 0.4, 0.1, 0.4, 0.0])
    sel = select_topk(attn, [2, 3], k=2)
    assert sel.tolist() == [[0, 2], [1, 3]]


def test_rule_pads_short_contexts_and_breaks_ties_by_position():
    attn = torch.full((1, 2, 4), 0.25)
    # query at 1: only positions 0,1 are causal -> [0, 1, -1]; query at 3: all tie -> smallest first
    sel = select_topk(attn, [1, 3], k=3)
    assert sel.tolist() == [[0, 1, -1], [0, 1, 2]]


def test_rule_matches_bruteforce_on_random_tensors():
    rng = np.random.default_rng(0)
    H, Q, KV, k = 3, 6, 40, 7
    a = rng.random((H, Q, KV))
    qpos = np.arange(KV - Q, KV)
    sel = select_topk(torch.from_numpy(a), qpos, k)
    for i, q in enumerate(qpos):
        s = a[:, i, :q + 1].sum(0)
        expect = sorted(np.argsort(-s, kind="stable")[:k].tolist())
        assert sel[i].tolist() == expect


def test_rule_rejects_bad_shapes():
    with pytest.raises(ValueError, match="attn"):
        select_topk(torch.zeros(2, 3), [0, 1], 2)
    with pytest.raises(ValueError, match="query_positions"):
        select_topk(torch.zeros(1, 2, 3), [0, 5], 2)


def _load_script():
    spec = importlib.util.spec_from_file_location("record_trace", REPO / "scripts" / "record_trace.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_script_without_transformers_fails_clearly(monkeypatch):
    mod = _load_script()
    monkeypatch.setitem(sys.modules, "transformers", None)  # import -> ImportError
    with pytest.raises(SystemExit, match="optional dependency 'transformers'"):
        mod._import_transformers()


def test_record_tiny_random_model(tmp_path):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("tokenizers")
    from tokenizers import Tokenizer, models, pre_tokenizers
    words = [f"w{i}" for i in range(60)]
    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(words)}}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="[UNK]")
    cfg = transformers.Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                   max_position_embeddings=256)
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(cfg)
    mdir = tmp_path / "tiny"
    model.save_pretrained(mdir)
    fast.save_pretrained(tmp_path / "tok")  # apart: AutoTokenizer would follow the model's config
    rng = np.random.default_rng(0)
    text = tmp_path / "t.txt"
    text.write_text(" ".join(rng.choice(words, 120)))
    out = tmp_path / "rec.npz"
    mod = _load_script()
    assert mod.main(["--model", str(mdir), "--tokenizer", str(tmp_path / "tok"), "--text", str(text), "--out", str(out), "--context", "100",
                     "--steps", "20", "--k", "16", "--query-chunk", "8", "--prefill-chunk", "32"]) == 0
    tr = load_trace(out)
    assert tr.sel.shape == (2, 20, 16) and tr.T == 100 and list(tr.positions) == list(range(80, 100))
    # cross-check one layer against a full forward pass with the rule applied directly
    ids = fast(text.read_text(), return_tensors="pt", add_special_tokens=False)["input_ids"][:, :100]
    m2 = transformers.Qwen2ForCausalLM.from_pretrained(mdir, attn_implementation="eager")
    with torch.no_grad():
        att = m2(input_ids=ids, output_attentions=True).attentions
    for l in range(2):
        ref = select_topk(att[l][0, :, 80:100], np.arange(80, 100), 16)
        agree = np.mean([len(set(a) & set(b)) / 16 for a, b in zip(ref.tolist(), tr.sel[l].tolist())])
        assert agree > 0.97  # chunked KV-cache recording vs one full pass: equal up to fp rounding ties
