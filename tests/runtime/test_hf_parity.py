"""Parity with an implementation no one here wrote: transformers' ``DeepseekV32ForCausalLM``.

A tiny random HF model (one dense and two MoE layers, YaRN, 16 index heads, ``index_topk`` far
below the context so that the sparse selection decides the outputs) is saved with
``save_pretrained``; our model loads the directory through ``from_hf_config`` + ``load_safetensors``
and must produce HF's greedy tokens exactly and its logits to fp32 tolerance over a prompt plus
24 generated tokens.

Where our model differs from HF, by design:
* MTP: HF has no MTP module (it ignores ``model.layers.{L}``), so parity covers the main model; a
  HF-saved config has no ``num_nextn_predict_layers`` and reads as zero MTP layers.
* MLA computes in absorbed form over the selected entries (HF expands K/V and masks); the RoPE
  output is kept interleaved (HF de-interleaves it); equal dot products, different summation order,
  hence a tolerance on logits and exact equality on tokens.
* Top-k ties go to the lower position (HF: ``torch.topk``'s order). 16 index heads make an exact
  tie practically impossible.
"""
from __future__ import annotations

import math

import pytest
import torch

transformers = pytest.importorskip("transformers")

from avsg import kvformat
from avsg.runtime.algo.dsa import DSA
from avsg.runtime.base import ForwardContext, StoreSpec
from avsg.model_config import from_hf_config
from avsg.runtime.model import DeepseekV32, prefill
from avsg.runtime.step import StepBatch
from avsg.runtime.store.device import DeviceStore
from avsg.runtime.weights import load_safetensors

PROMPT_LEN = 16
NEW_TOKENS = 24
BATCH = 2


def _hf_config(**overrides):
    kw = dict(vocab_size=192, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
              num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=32,
              kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
              n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2, n_group=4,
              topk_group=2, first_k_dense_replace=1, index_n_heads=16, index_head_dim=16,
              index_topk=6, max_position_embeddings=512, pad_token_id=0,
              rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                               "original_max_position_embeddings": 128, "beta_fast": 32,
                               "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0})
    kw.update(overrides)
    return transformers.DeepseekV32Config(**kw)


@torch.no_grad()
def _randomize(hf, seed: int) -> None:
    """HF's init (std 0.02) gives near-uniform logits where greedy ties are fp32 noise; draw
    O(1)-activation weights instead, with non-trivial norms and biases so that loading them
    matters."""
    gen = torch.Generator().manual_seed(seed)
    for name, t in list(hf.named_parameters()) + list(hf.named_buffers()):
        if "inv_freq" in name:
            continue
        if "embed_tokens" in name:
            t.copy_(torch.randn(t.shape, generator=gen))
        elif t.dim() >= 2:
            t.copy_(torch.randn(t.shape, generator=gen) / math.sqrt(t.shape[-1]))
        elif name.endswith("norm.weight") or "layernorm" in name:
            t.copy_(1 + 0.1 * torch.randn(t.shape, generator=gen))
        else:                                   # k_norm.bias, e_score_correction_bias
            t.copy_(0.1 * torch.randn(t.shape, generator=gen))


@pytest.fixture(scope="module")
def hf_checkpoint(tmp_path_factory):
    torch.manual_seed(0)
    hf = transformers.DeepseekV32ForCausalLM(_hf_config()).eval()
    hf.config._attn_implementation = "eager"
    _randomize(hf, seed=1)
    path = tmp_path_factory.mktemp("hf_deepseek_v32")
    hf.save_pretrained(path)
    prompt = torch.randint(1, hf.config.vocab_size, (BATCH, PROMPT_LEN),
                           generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        out = hf.generate(prompt, attention_mask=torch.ones_like(prompt),
                          max_new_tokens=NEW_TOKENS, do_sample=False, output_logits=True,
                          return_dict_in_generate=True, pad_token_id=0)
    tokens = out.sequences[:, PROMPT_LEN:]
    logits = torch.stack(out.logits, dim=1).float()            # [B, NEW, V]
    return path, prompt, tokens, logits


def make_device_store(spec: StoreSpec):
    return DeviceStore(spec)


# The one spot that chooses the store: extend with the offloading stores (via the engine) here.
STORES = {"device": make_device_store}


@pytest.mark.parametrize("store_name", sorted(STORES))
def test_greedy_tokens_and_logits_match_transformers(hf_checkpoint, store_name):
    path, prompt, hf_tokens, hf_logits = hf_checkpoint
    config = from_hf_config(str(path))
    assert config.num_nextn_predict_layers == 0 and config.index_topk == 6
    model = DeepseekV32(config)
    load_safetensors(model, str(path))

    rows, max_len = prompt.shape[0], PROMPT_LEN + NEW_TOKENS
    kv_format = kvformat.get_format("fp32", config.kv_lora_rank, config.qk_rope_head_dim)
    spec = StoreSpec(layers=model.num_kv_layers, rows=rows, max_len=max_len,
                     topk=config.index_topk, queries_per_step=1, kv_format=kv_format,
                     device=torch.device("cpu"))
    store = STORES[store_name](spec)
    algo = DSA(config, rows, max_len, torch.device("cpu"), layers=model.num_kv_layers)
    ctx = ForwardContext(algo=algo, store=store, kv_format=kv_format)

    with torch.no_grad():
        hidden = prefill(model, prompt, ctx)
        logits = [model.logits(hidden)[:, -1]]
        tokens = [logits[-1].argmax(-1)]
        for step in range(1, NEW_TOKENS):
            position = torch.full((rows,), PROMPT_LEN + step - 1, dtype=torch.int32)
            batch = StepBatch.make(tokens[-1][:, None], position)
            logits.append(model.logits(model(batch, ctx))[:, -1])
            tokens.append(logits[-1].argmax(-1))
    ours_tokens = torch.stack(tokens, dim=1)
    ours_logits = torch.stack(logits, dim=1)

    assert torch.equal(ours_tokens, hf_tokens), (ours_tokens, hf_tokens)
    torch.testing.assert_close(ours_logits, hf_logits, rtol=1e-4, atol=1e-4)
    # the context really is sparse: every decode query saw more positions than it selected
    assert PROMPT_LEN > config.index_topk


@pytest.mark.parametrize("mode", ["device", "offload", "avsg"])
def test_engine_matches_transformers_in_every_mode(hf_checkpoint, mode):
    """The same check through the engine (real prefill, then decode steps) for every store; the
    avsg buffer is small (16 slots for top-6) so that it evicts."""
    from avsg import backend
    from avsg.commands.generate import generate
    path, prompt, hf_tokens, hf_logits = hf_checkpoint
    config = from_hf_config(str(path))
    model = DeepseekV32(config)
    load_safetensors(model, str(path))
    with backend.emulation("fast"):
        outputs, logits = generate(model, prompt.tolist(), NEW_TOKENS, mode=mode, mtp=0,
                                   kv_format_name="fp32", capacity=16, record_logits=True)
    assert outputs == hf_tokens.tolist()
    # the engine records the logits of decode steps; the first token came from the prefill
    ours = torch.stack([torch.cat(logits[i]) for i in range(prompt.shape[0])])
    torch.testing.assert_close(ours, hf_logits[:, 1:], rtol=1e-4, atol=1e-4)
