"""The model pieces against independent formulations: config parsing, YaRN, RoPE layouts, the
indexer's causal top-k, MoE routing, absorbed MLA, weight loading, prefill vs decode."""
from __future__ import annotations

import json
import math

import pytest
import torch

from avsg import kvformat
from avsg.runtime.algo.dsa import DSA, sparse_mla_attention
from avsg.runtime.base import ForwardContext, Retrieved, StoreSpec
from avsg.model_config import from_hf_config, preset
from avsg.runtime.model import DeepseekV32, MoE, prefill
from avsg.runtime.rope import (mla_softmax_scale, rope_frequencies, rope_half, rope_interleaved)
from avsg.runtime.step import StepBatch
from avsg.runtime.store.device import DeviceStore
from avsg.runtime.weights import init_random, load_safetensors

# DeepSeek-V3.2's released config.json (deepseek-ai/DeepSeek-V3.2), key for key.
REAL_CONFIG = {
    "architectures": ["DeepseekV32ForCausalLM"], "attention_bias": False,
    "attention_dropout": 0.0, "bos_token_id": 0, "eos_token_id": 1, "ep_size": 1,
    "first_k_dense_replace": 3, "hidden_act": "silu", "hidden_size": 7168,
    "index_head_dim": 128, "index_n_heads": 64, "index_topk": 2048, "initializer_range": 0.02,
    "intermediate_size": 18432, "kv_lora_rank": 512, "max_position_embeddings": 163840,
    "model_type": "deepseek_v32", "moe_intermediate_size": 2048, "moe_layer_freq": 1,
    "n_group": 8, "n_routed_experts": 256, "n_shared_experts": 1, "norm_topk_prob": True,
    "num_attention_heads": 128, "num_experts_per_tok": 8, "num_hidden_layers": 61,
    "num_key_value_heads": 128, "num_nextn_predict_layers": 1, "q_lora_rank": 1536,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                            "scale_fmt": "ue8m0", "weight_block_size": [128, 128]},
    "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                     "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                     "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid",
    "tie_word_embeddings": False, "topk_group": 4, "topk_method": "noaux_tc",
    "torch_dtype": "bfloat16", "transformers_version": "4.44.2", "use_cache": True,
    "v_head_dim": 128, "vocab_size": 129280,
}


def _write(tmp_path, cfg: dict) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return str(path)


# --- config -----------------------------------------------------------------------------------

def test_presets():
    tiny, demo = preset("tiny"), preset("demo")
    assert tiny.num_hidden_layers == 2 and not tiny.is_moe_layer(0) and tiny.is_moe_layer(1)
    assert tiny.num_kv_layers == 3
    assert (demo.kv_lora_rank, demo.qk_rope_head_dim, demo.index_topk, demo.index_head_dim) == \
        (512, 64, 2048, 128)
    assert demo.max_position_embeddings > 131072
    with pytest.raises(ValueError, match="huge"):
        preset("huge")


def test_real_config(tmp_path):
    c = from_hf_config(_write(tmp_path, REAL_CONFIG))
    assert (c.num_hidden_layers, c.index_topk, c.index_n_heads, c.n_routed_experts) == (61, 2048, 64, 256)
    assert c.num_kv_layers == 62 and c.first_k_dense_replace == 3 and not c.is_moe_layer(2)
    assert c.rope_scaling["factor"] == 40 and c.rope_theta == 10000


def test_rope_parameters_spelling_reads_the_same(tmp_path):
    official = from_hf_config(_write(tmp_path, REAL_CONFIG))
    hf = dict(REAL_CONFIG)
    scaling, theta = hf.pop("rope_scaling"), hf.pop("rope_theta")
    hf["rope_parameters"] = {**{k: v for k, v in scaling.items() if k != "type"},
                             "rope_type": "yarn", "rope_theta": theta}
    assert from_hf_config(_write(tmp_path, hf)) == official


@pytest.mark.parametrize("key,value,match", [
    ("sliding_window", 128, "unknown key 'sliding_window'"),
    ("hidden_act", "gelu", "hidden_act"),
    ("num_key_value_heads", 1, "num_key_value_heads"),
])
def test_config_errors_name_the_key(tmp_path, key, value, match):
    with pytest.raises(ValueError, match=match):
        from_hf_config(_write(tmp_path, {**REAL_CONFIG, key: value}))


def test_config_missing_and_unknown_rope_key(tmp_path):
    cfg = dict(REAL_CONFIG)
    del cfg["kv_lora_rank"]
    with pytest.raises(ValueError, match="kv_lora_rank"):
        from_hf_config(_write(tmp_path, cfg))
    cfg = {**REAL_CONFIG, "rope_scaling": {**REAL_CONFIG["rope_scaling"], "low_freq_factor": 1}}
    with pytest.raises(ValueError, match="low_freq_factor"):
        from_hf_config(_write(tmp_path, cfg))


# --- RoPE / YaRN ------------------------------------------------------------------------------

def test_mla_softmax_scale_of_the_real_config(tmp_path):
    c = from_hf_config(_write(tmp_path, REAL_CONFIG))
    m = 0.1 * 1.0 * math.log(40) + 1.0                  # YaRN mscale with mscale_all_dim = 1
    expected = (128 + 64) ** -0.5 * m * m
    assert mla_softmax_scale(c) == pytest.approx(expected, rel=1e-12)
    assert round(expected, 5) == 0.13523


def test_yarn_frequencies_match_transformers():
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    for extra in ({"mscale": 1.0, "mscale_all_dim": 1.0}, {"mscale": 0.9, "mscale_all_dim": 1.0}, {}):
        params = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0,
                  "original_max_position_embeddings": 4096, "beta_fast": 32, "beta_slow": 1,
                  **extra}
        hf = transformers.DeepseekV32Config(rope_parameters=dict(params),
                                            max_position_embeddings=163840)
        want_freq, want_factor = ROPE_INIT_FUNCTIONS["yarn"](hf)
        freq, factor = rope_frequencies(64, 10000.0, {"type": "yarn", **params})
        assert torch.equal(freq, want_freq)
        assert factor == pytest.approx(want_factor, rel=1e-12)
    # without mscale keys the cos/sin factor is YaRN's default 0.1 ln(s) + 1
    assert rope_frequencies(64, 1e4, {"type": "yarn", "factor": 40,
                                      "original_max_position_embeddings": 4096})[1] == \
        pytest.approx(0.1 * math.log(40) + 1)


def test_rope_layouts():
    torch.manual_seed(0)
    x = torch.randn(5, 16)
    angle = torch.randn(5, 8)
    # interleaved = complex multiplication of consecutive pairs (DeepSeek's reference form)
    want = torch.view_as_real(torch.view_as_complex(x.view(5, 8, 2)) * torch.polar(
        torch.ones_like(angle), angle)).flatten(-2)
    torch.testing.assert_close(rope_interleaved(x, angle.cos(), angle.sin()), want)
    # half-split pairs element i with i + d/2
    want_half = torch.view_as_real(torch.complex(x[:, :8], x[:, 8:]) * torch.polar(
        torch.ones_like(angle), angle))
    got = rope_half(x, angle.cos(), angle.sin())
    torch.testing.assert_close(torch.stack((got[:, :8], got[:, 8:]), -1), want_half)


# --- indexer ----------------------------------------------------------------------------------

def _tiny(seed=0, **changes):
    cfg = preset("tiny").replace(**changes)
    model = DeepseekV32(cfg)
    init_random(model, seed)
    return model


def _ctx(model, rows, max_len, fmt="fp32", queries=1):
    cfg = model.config
    kv_format = kvformat.get_format(fmt, cfg.kv_lora_rank, cfg.qk_rope_head_dim)
    spec = StoreSpec(layers=model.num_kv_layers, rows=rows, max_len=max_len,
                     topk=cfg.index_topk, queries_per_step=queries, kv_format=kv_format,
                     device=torch.device("cpu"))
    return ForwardContext(algo=DSA(cfg, rows, max_len, torch.device("cpu")),
                          store=DeviceStore(spec), kv_format=kv_format)


@torch.no_grad()
def test_indexer_selects_causally_with_padding():
    model = _tiny()
    cfg = model.config
    R, X = 3, 40
    ctx = _ctx(model, R, X, queries=3)
    algo: DSA = ctx.algo
    torch.manual_seed(1)
    algo.index_keys.normal_()
    batch = StepBatch.make(torch.randint(0, cfg.vocab_size, (R, 3)),
                           torch.tensor([2, 30, 0]), active=torch.tensor([True, True, False]))
    attn = model.model.layers[0].self_attn
    x = torch.randn(R, 3, cfg.hidden_size)
    q_resid = torch.randn(R, 3, cfg.q_lora_rank)
    sel = algo.select(0, batch, attn, x, q_resid)
    assert sel.shape == (R, 3, cfg.index_topk) and sel.dtype == torch.int32

    # reference: plain per-query loop over visible positions, stable ranking (ties -> lower pos)
    cos, sin = attn.rotary(batch.pos)
    q = attn.indexer.queries(q_resid, cos, sin)
    w = attn.indexer.head_weights(x)
    for r in range(R):
        for t in range(3):
            visible = int(batch.causal_lens[r, t])
            keys = algo.index_keys[0, r, :visible]
            score = (torch.relu(q[r, t] @ keys.T * cfg.index_head_dim ** -0.5) * w[r, t, :, None]).sum(0)
            n = min(cfg.index_topk, visible)
            order = sorted(range(visible), key=lambda s: (-float(score[s]), s))[:n]
            want = sorted(order) + [-1] * (cfg.index_topk - n)
            assert sel[r, t].tolist() == want, (r, t)
    assert (sel[0, 0] >= 0).sum() == 3            # position 2 sees 3 < topk positions
    assert (sel[2] == -1).all()                   # idle row selects nothing


# --- MoE --------------------------------------------------------------------------------------

@torch.no_grad()
def test_moe_matches_a_plain_loop():
    cfg = preset("tiny").replace(n_routed_experts=16, n_group=4, topk_group=2, num_experts_per_tok=3)
    moe = MoE(cfg)
    gen = torch.Generator().manual_seed(0)
    for p in moe.parameters():
        p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[-1]))
    x = torch.randn(7, cfg.hidden_size, generator=gen)
    got = moe(x)
    size = cfg.n_routed_experts // cfg.n_group
    for i in range(x.shape[0]):
        s = torch.sigmoid(moe.gate.weight @ x[i])
        b = s + moe.gate.e_score_correction_bias
        group_score = [sorted(b[g * size:(g + 1) * size].tolist())[-2:] for g in range(cfg.n_group)]
        groups = sorted(range(cfg.n_group), key=lambda g: -sum(group_score[g]))[:cfg.topk_group]
        allowed = [e for g in groups for e in range(g * size, (g + 1) * size)]
        chosen = sorted(allowed, key=lambda e: -float(b[e]))[:cfg.num_experts_per_tok]
        total = sum(float(s[e]) for e in chosen)
        want = moe.shared_experts(x[i])
        for e in chosen:
            want = want + moe.experts[e](x[i]) * (float(s[e]) / total * cfg.routed_scaling_factor)
        torch.testing.assert_close(got[i], want, rtol=1e-5, atol=1e-5)


# --- MLA --------------------------------------------------------------------------------------

@torch.no_grad()
def test_absorbed_mla_equals_expanded_attention():
    model = _tiny(seed=3)
    cfg = model.config
    attn = model.model.layers[1].self_attn
    R, T, X, K, H = 2, 2, 20, cfg.index_topk, cfg.num_attention_heads
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(R, T, cfg.hidden_size, generator=gen)
    ctx_h = torch.randn(R, X, cfg.hidden_size, generator=gen)
    pos = torch.tensor([[12, 13], [18, 19]])
    cos, sin = attn.rotary(pos)
    _, q_nope, q_pe = attn.queries(x, cos, sin)
    kcos, ksin = attn.rotary(torch.arange(X))
    latent, k_pe = attn.latent_kv(ctx_h, kcos, ksin)                     # [R, X, C], [R, X, P]
    index = torch.stack([torch.randperm(X, generator=gen)[:K] for _ in range(R * T)]).view(R, T, K)
    index[0, 0, -3:] = -1                                                # some empty selections
    index = index.to(torch.int32)
    got = sparse_mla_attention(attn, attn.absorb(q_nope), q_pe, Retrieved((latent, k_pe), index))

    # expanded form: per-head keys [k_nope | k_pe] and values from kv_b_proj
    kv = attn.kv_b_proj(latent).view(R, X, H, attn.nope_dim + attn.v_dim)
    k_nope, v = kv.split([attn.nope_dim, attn.v_dim], -1)
    for r in range(R):
        for t in range(T):
            keep = index[r, t][index[r, t] >= 0].long()
            q = torch.cat([q_nope[r, t], q_pe[r, t]], -1)                   # [H, qk]
            k = torch.cat([k_nope[r, keep], k_pe[r, keep, None].expand(-1, H, -1)], -1)
            p = torch.softmax(torch.einsum("hd,khd->hk", q, k) * attn.softmax_scale, -1)
            want = torch.einsum("hk,khv->hv", p, v[r, keep])
            torch.testing.assert_close(got[r, t], want, rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_prefill_equals_token_by_token_decode():
    model = _tiny(seed=5)
    R, N = 2, 14
    tokens = torch.randint(0, model.config.vocab_size, (R, N), generator=torch.Generator().manual_seed(6))
    full = model.logits(prefill(model, tokens, _ctx(model, R, N)))
    ctx = _ctx(model, R, N)
    stepped = []
    for i in range(N):
        batch = StepBatch.make(tokens[:, i:i + 1], torch.full((R,), i))
        stepped.append(model.logits(model(batch, ctx)))
    torch.testing.assert_close(torch.cat(stepped, 1), full, rtol=1e-4, atol=1e-4)


@torch.no_grad()
def test_mtp_writes_its_own_kv_layer():
    model = _tiny(seed=7)
    cfg = model.config
    R = 2
    ctx = _ctx(model, R, 16, queries=2)
    tokens = torch.randint(0, cfg.vocab_size, (R, 2))
    batch = StepBatch.make(tokens, torch.tensor([0, 3]), active=torch.tensor([True, False]))
    hidden = model(batch, ctx)
    h = model.mtp_forward(0, hidden, tokens, batch, ctx)
    assert h.shape == hidden.shape and model.mtp_logits(0, h).shape == (R, 2, cfg.vocab_size)
    store: DeviceStore = ctx.store
    mtp_latent = store.cache[cfg.num_hidden_layers][0]
    assert mtp_latent[0, :2].abs().sum() > 0 and mtp_latent[0, 2:].abs().sum() == 0
    assert mtp_latent[1].abs().sum() == 0                                # idle row untouched


# --- weights ----------------------------------------------------------------------------------

def _save(model, path, drop=(), add=None, reshape=None):
    from safetensors.torch import save_file
    tensors = {k: v.clone().contiguous() for k, v in model.state_dict().items() if k not in drop}
    tensors.update(add or {})
    for name, shape in (reshape or {}).items():
        tensors[name] = torch.zeros(shape)
    path.mkdir(exist_ok=True)
    save_file(tensors, str(path / "model.safetensors"))


@pytest.mark.parametrize("case", ["missing", "unexpected", "shape"])
def test_weight_errors_before_any_change(tmp_path, case):
    source, target = _tiny(seed=1), _tiny(seed=2)
    name = "model.layers.1.mlp.experts.3.up_proj.weight"
    kwargs = {"missing": dict(drop=[name]),
              "unexpected": dict(add={"model.layers.1.self_attn.q_proj.weight": torch.zeros(2, 2)}),
              "shape": dict(reshape={name: (3, 3)})}[case]
    _save(source, tmp_path / case, **kwargs)
    before = {k: v.clone() for k, v in target.state_dict().items()}
    with pytest.raises(ValueError) as err:
        load_safetensors(target, str(tmp_path / case))
    assert (name if case != "unexpected" else "q_proj") in str(err.value)
    assert case.replace("shape", "wrong shape") in str(err.value)
    assert all(torch.equal(before[k], v) for k, v in target.state_dict().items())


def test_weights_load_exactly_and_fp8_dequantizes(tmp_path):
    source, target = _tiny(seed=1), _tiny(seed=2)
    _save(source, tmp_path / "plain")
    load_safetensors(target, str(tmp_path / "plain"))
    assert all(torch.equal(a, b) for a, b in zip(source.state_dict().values(),
                                                  target.state_dict().values()))
    name = "model.layers.0.self_attn.q_b_proj.weight"                   # [96, 48]: partial blocks
    w = source.state_dict()[name]
    scale = torch.full((1, 1), 0.01)
    quant = (w / 0.01).to(torch.float8_e4m3fn)
    _save(source, tmp_path / "fp8", add={name: quant, name + "_scale_inv": scale})
    load_safetensors(target, str(tmp_path / "fp8"))
    torch.testing.assert_close(target.state_dict()[name], quant.float() * 0.01)


@pytest.mark.parametrize("fmt_name", ["bf16", "fp8"])
@torch.no_grad()
def test_attention_buffers_do_not_change_results(fmt_name):
    model = _tiny(seed=8)
    cfg = model.config
    attn = model.model.layers[0].self_attn
    fmt = kvformat.get_format(fmt_name, cfg.kv_lora_rank, cfg.qk_rope_head_dim)
    gen = torch.Generator().manual_seed(9)
    R, T, X, H = 2, 2, 30, cfg.num_attention_heads
    view = fmt.encode(torch.randn(R, X, cfg.kv_lora_rank, generator=gen),
                      torch.randn(R, X, cfg.qk_rope_head_dim, generator=gen))
    q_lat = torch.randn(R, T, H, cfg.kv_lora_rank, generator=gen)
    q_pe = torch.randn(R, T, H, cfg.qk_rope_head_dim, generator=gen)
    scratch = {}
    for trial in range(2):                      # the second call reuses the buffers
        index = torch.randint(-1, X, (R, T, cfg.index_topk), generator=gen, dtype=torch.int32)
        plain = sparse_mla_attention(attn, q_lat, q_pe, Retrieved(view, index), fmt)
        reused = sparse_mla_attention(attn, q_lat, q_pe, Retrieved(view, index), None, scratch)
        assert torch.equal(plain, reused)
