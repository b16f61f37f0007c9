"""The DeepSeek-V3.2 model of the runtime: modules named like the checkpoint, absorbed-MLA decode.

Module tree (attribute paths are the Hugging Face checkpoint's tensor names, so loading is a
name-for-name copy; ``L = num_hidden_layers``)::

    model.embed_tokens
    model.layers.N                       N < L: DecoderLayer
        input_layernorm, post_attention_layernorm
        self_attn.{q_a_proj, q_a_layernorm, q_b_proj, kv_a_proj_with_mqa, kv_a_layernorm,
                   kv_b_proj, o_proj}
        self_attn.indexer.{wq_b, wk, k_norm, weights_proj}
        mlp.{gate,up,down}_proj                               (N < first_k_dense_replace)
        mlp.gate.{weight, e_score_correction_bias}, mlp.experts.E.{gate,up,down}_proj,
        mlp.shared_experts.{gate,up,down}_proj                 (MoE layers)
    model.layers.{L+k}                   MTP module k: a MoE DecoderLayer plus
        enorm, hnorm, eh_proj, shared_head.{norm, head}, embed_tokens
    model.norm, lm_head

KV layer ids: decoder layer N keeps KV under id N, MTP module k under id ``L + k``
(``num_kv_layers = L + num_nextn_predict_layers``).

One attention layer, per pass over a ``StepBatch`` of R rows x T query tokens (``x`` is the layer's
normed input ``[R, T, D]``):

    1. q_resid = q_a_layernorm(q_a_proj(x)); q_b_proj splits per head into q_nope | q_pe;
       q_pe gets interleaved RoPE at batch.pos; q_nope is absorbed through kv_b_proj's key part:
       q_lat[h] = q_nope[h] @ W_uk[h]                       -> [R, T, H, kv_lora_rank]
    2. kv_a_proj_with_mqa(x) = latent | k_pe; latent -> kv_a_layernorm, k_pe -> RoPE;
       parts = kv_format.encode(latent, k_pe); store.offload(layer, batch, parts)   [Offload]
    3. algo.index(...); topk_pos = algo.select(...)          [Index, Select]  timer "index_select"
    4. retrieved = store.retrieve(layer, topk_pos, batch)    [Retrieve]       (the store times it)
       - in a prefill pass the pass's own parts serve as the view (positions = token indices)
    5. algo.attention(...) -> [R, T, H, v_head_dim]           [Attention]      timer "attention"
       (gather the selected rows in selection order, decode, softmax over the latent + RoPE
       scores, weight the latents, up-project through kv_b_proj's value part); then o_proj.

Everything runs in fp32 on whatever device the module lives on; the decode step has no host syncs
(no ``.item()``, no Python branch on tensor values). MoE runs every expert on every token and
weights the outputs by the (mostly zero) routing weights: wasteful in FLOPs, but fixed-shape and
sync-free, which is what the small configs here need.
"""
from __future__ import annotations

from typing import Tuple

import torch
from torch import nn
from torch.nn import functional as F

from .base import ForwardContext, Retrieved
from ..model_config import ModelConfig
from .rope import (RotaryEmbedding, indexer_softmax_scale, mla_softmax_scale, rope_half,
                   rope_interleaved)
from .step import StepBatch


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.float()
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def _linear(d_in: int, d_out: int) -> nn.Linear:
    return nn.Linear(d_in, d_out, bias=False)


class MLP(nn.Module):
    """SwiGLU feed-forward: the dense FFN, one routed expert, or the shared experts."""

    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_proj = _linear(hidden, intermediate)
        self.up_proj = _linear(hidden, intermediate)
        self.down_proj = _linear(intermediate, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Gate(nn.Module):
    """DeepSeek-V3's router: sigmoid scores; the bias only steers which experts are chosen
    (groups ranked by their two best biased scores, ``topk_group`` groups kept, then the top
    ``num_experts_per_tok`` experts); the weights are the unbiased scores, renormalised and
    scaled by ``routed_scaling_factor``."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.weight = nn.Parameter(torch.empty(config.n_routed_experts, config.hidden_size))
        self.e_score_correction_bias = nn.Parameter(torch.zeros(config.n_routed_experts))

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """``x [N, D]`` -> ``(weights fp32 [N, k], experts int64 [N, k])``."""
        c = self.config
        scores = F.linear(x.float(), self.weight.float()).sigmoid()
        biased = scores + self.e_score_correction_bias
        per_group = biased.view(-1, c.n_group, c.n_routed_experts // c.n_group)
        group_rank = per_group.topk(2, dim=-1).values.sum(-1)                 # [N, groups]
        kept_groups = group_rank.topk(c.topk_group, dim=-1).indices
        group_kept = torch.zeros_like(group_rank, dtype=torch.bool).scatter(1, kept_groups, True)
        expert_kept = group_kept.repeat_interleave(c.n_routed_experts // c.n_group, dim=1)
        biased = biased.masked_fill(~expert_kept, float("-inf"))
        experts = biased.topk(c.num_experts_per_tok, dim=-1).indices
        weights = scores.gather(1, experts)
        if c.norm_topk_prob:
            weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
        return weights * c.routed_scaling_factor, experts


class MoE(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.gate = Gate(config)
        self.experts = nn.ModuleList(MLP(config.hidden_size, config.moe_intermediate_size)
                                     for _ in range(config.n_routed_experts))
        self.shared_experts = MLP(config.hidden_size,
                                  config.moe_intermediate_size * config.n_shared_experts) \
            if config.n_shared_experts else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        weights, experts = self.gate(flat)
        # [N, E] routing weight of each expert per token, zero where not chosen
        combine = torch.zeros(flat.shape[0], len(self.experts), dtype=weights.dtype,
                              device=flat.device).scatter(1, experts, weights)
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            out = out + expert(flat) * combine[:, e:e + 1]
        if self.shared_experts is not None:
            out = out + self.shared_experts(flat)
        return out.view(shape)


class Indexer(nn.Module):
    """The lightning indexer's weights and projections (the cache and the top-k live in the
    algorithm). Each index head/key is ``index_head_dim`` wide; its first ``qk_rope_head_dim``
    dims get half-split RoPE (the checkpoint's ``wq_b`` is ``[rope | nope]`` per head)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.n_heads = config.index_n_heads
        self.head_dim = config.index_head_dim
        self.rope_dim = config.qk_rope_head_dim
        self.softmax_scale = indexer_softmax_scale(config)
        self.wq_b = _linear(config.q_lora_rank, self.n_heads * self.head_dim)
        self.wk = _linear(config.hidden_size, self.head_dim)
        self.k_norm = nn.LayerNorm(self.head_dim, eps=1e-6)
        self.weights_proj = _linear(config.hidden_size, self.n_heads)

    def _rope(self, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return torch.cat((rope_half(v[..., :self.rope_dim], cos, sin), v[..., self.rope_dim:]), -1)

    def keys(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """``x [..., D]`` -> the one shared key per token ``[..., index_head_dim]``."""
        return self._rope(self.k_norm(self.wk(x)), cos, sin)

    def queries(self, q_resid: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """``q_resid [..., q_lora]`` -> ``[..., n_heads, index_head_dim]``."""
        q = self.wq_b(q_resid).unflatten(-1, (self.n_heads, self.head_dim))
        return self._rope(q, cos[..., None, :], sin[..., None, :])

    def head_weights(self, x: torch.Tensor) -> torch.Tensor:
        """Per-head weight of the ReLU scores, ``[..., n_heads]`` fp32."""
        return self.weights_proj(x).float() * self.n_heads ** -0.5


class Attention(nn.Module):
    """MLA with q-LoRA and kv-LoRA plus the DSA indexer; decodes in absorbed form."""

    def __init__(self, config: ModelConfig, layer_id: int, rotary: RotaryEmbedding):
        super().__init__()
        c = config
        self.layer_id = layer_id
        self.num_heads = c.num_attention_heads
        self.nope_dim, self.rope_dim, self.v_dim = c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim
        self.kv_lora_rank = c.kv_lora_rank
        self.softmax_scale = mla_softmax_scale(c)
        self.rotary = rotary
        self.q_a_proj = _linear(c.hidden_size, c.q_lora_rank)
        self.q_a_layernorm = RMSNorm(c.q_lora_rank, c.rms_norm_eps)
        self.q_b_proj = _linear(c.q_lora_rank, self.num_heads * c.qk_head_dim)
        self.kv_a_proj_with_mqa = _linear(c.hidden_size, c.kv_lora_rank + c.qk_rope_head_dim)
        self.kv_a_layernorm = RMSNorm(c.kv_lora_rank, c.rms_norm_eps)
        self.kv_b_proj = _linear(c.kv_lora_rank, self.num_heads * (self.nope_dim + self.v_dim))
        self.o_proj = _linear(self.num_heads * self.v_dim, c.hidden_size)
        self.indexer = Indexer(c)

    # kv_b_proj maps a latent to per-head [k_nope | v]; its two halves, [H, width, kv_lora_rank]
    def w_uk(self) -> torch.Tensor:
        return self.kv_b_proj.weight.view(self.num_heads, self.nope_dim + self.v_dim,
                                          self.kv_lora_rank)[:, :self.nope_dim]

    def w_uv(self) -> torch.Tensor:
        return self.kv_b_proj.weight.view(self.num_heads, self.nope_dim + self.v_dim,
                                          self.kv_lora_rank)[:, self.nope_dim:]

    def queries(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """-> ``(q_resid [.., q_lora], q_nope [.., H, nope], q_pe [.., H, rope] roped)``."""
        q_resid = self.q_a_layernorm(self.q_a_proj(x))
        q = self.q_b_proj(q_resid).unflatten(-1, (self.num_heads, self.nope_dim + self.rope_dim))
        q_nope, q_pe = q.split([self.nope_dim, self.rope_dim], dim=-1)
        return q_resid, q_nope, rope_interleaved(q_pe, cos[..., None, :], sin[..., None, :])

    def latent_kv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """-> what the KV cache keeps per token: ``(latent [.., kv_lora], k_pe [.., rope] roped)``."""
        latent, k_pe = self.kv_a_proj_with_mqa(x).split([self.kv_lora_rank, self.rope_dim], -1)
        return self.kv_a_layernorm(latent), rope_interleaved(k_pe, cos, sin)

    def absorb(self, q_nope: torch.Tensor) -> torch.Tensor:
        """``q_nope [.., H, nope]`` -> the query in latent space ``[.., H, kv_lora_rank]``."""
        return torch.einsum("...hn,hnc->...hc", q_nope, self.w_uk())

    def forward(self, x: torch.Tensor, batch: StepBatch, ctx: ForwardContext) -> torch.Tensor:
        layer = self.layer_id
        cos, sin = self.rotary(batch.pos)
        q_resid, q_nope, q_pe = self.queries(x, cos, sin)
        q_lat = self.absorb(q_nope)
        latent, k_pe = self.latent_kv(x, cos, sin)
        parts = ctx.kv_format.encode(latent, k_pe)
        ctx.store.offload(layer, batch, parts)
        with ctx.timers("index_select"):
            ctx.algo.index(layer, batch, self, x, q_resid)
            topk_pos = ctx.algo.select(layer, batch, self, x, q_resid)
        if ctx.recorder is not None:
            ctx.recorder(layer, topk_pos)
        if ctx.prefill:
            # Whole prompts from position 0: the pass's own KV, indexed by position, is the view.
            retrieved = Retrieved(view=parts, index=topk_pos)
        else:
            retrieved = ctx.store.retrieve(layer, topk_pos, batch)
        with ctx.timers("attention"):
            out = ctx.algo.attention(layer, batch, self, q_lat, q_pe, retrieved)
        return self.o_proj(out.flatten(-2))


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_id: int, rotary: RotaryEmbedding):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, layer_id, rotary)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MoE(config) if config.is_moe_layer(layer_id) else \
            MLP(config.hidden_size, config.intermediate_size)

    def forward(self, h: torch.Tensor, batch: StepBatch, ctx: ForwardContext) -> torch.Tensor:
        h = h + self.self_attn(self.input_layernorm(h), batch, ctx)
        return h + self.mlp(self.post_attention_layernorm(h))


class SharedHead(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.head = _linear(config.hidden_size, config.vocab_size)


class MTPLayer(DecoderLayer):
    """Multi-token prediction module: combines the main model's hidden state at position p with
    the embedding of the token at p+1, runs one decoder layer, and predicts the token at p+2."""

    def __init__(self, config: ModelConfig, layer_id: int, rotary: RotaryEmbedding):
        super().__init__(config, layer_id, rotary)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.enorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.hnorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.eh_proj = _linear(2 * config.hidden_size, config.hidden_size)
        self.shared_head = SharedHead(config)


class _Body(nn.Module):
    """The checkpoint's ``model.`` prefix."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.rotary = RotaryEmbedding(config)
        L = config.num_hidden_layers
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            [DecoderLayer(config, i, self.rotary) for i in range(L)]
            + [MTPLayer(config, L + k, self.rotary) for k in range(config.num_nextn_predict_layers)])
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class DeepseekV32(nn.Module):
    """The whole model. Inference only: parameters do not require grad."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.model = _Body(config)
        self.lm_head = _linear(config.hidden_size, config.vocab_size)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.requires_grad_(False)

    @property
    def num_kv_layers(self) -> int:
        return self.config.num_kv_layers

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    def forward(self, batch: StepBatch, ctx: ForwardContext) -> torch.Tensor:
        """One pass over ``batch`` (``store.begin_pass`` once, then the main layers) -> hidden
        ``[R, T, D]`` of the last decoder layer (before ``model.norm``)."""
        ctx.store.begin_pass(batch)
        h = self.model.embed_tokens(batch.tokens).float()
        for layer in self.model.layers[:self.config.num_hidden_layers]:
            h = layer(h, batch, ctx)
        return h

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.model.norm(hidden)).float()

    def mtp_layer(self, k: int) -> MTPLayer:
        if not 0 <= k < self.config.num_nextn_predict_layers:
            raise ValueError(f"mtp: module {k} does not exist (the config has "
                             f"{self.config.num_nextn_predict_layers} MTP layers)")
        return self.model.layers[self.config.num_hidden_layers + k]

    def mtp_forward(self, k: int, hidden: torch.Tensor, next_tokens: torch.Tensor,
                    batch: StepBatch, ctx: ForwardContext) -> torch.Tensor:
        """MTP module ``k``: entry ``(r, i)`` pairs ``hidden[r, i]`` (the state at position
        ``batch.pos[r, i]``) with ``next_tokens[r, i]`` (the token at that position + 1); its KV is
        stored at ``batch.pos[r, i]`` of KV layer ``L + k``; a pass of its own (``store.begin_pass``
        once, then the one layer). -> hidden ``[R, T, D]``."""
        layer = self.mtp_layer(k)
        ctx.store.begin_pass(batch)
        emb = layer.enorm(layer.embed_tokens(next_tokens).float())
        h = layer.eh_proj(torch.cat((emb, layer.hnorm(hidden)), dim=-1))
        return layer(h, batch, ctx)

    def mtp_logits(self, k: int, hidden: torch.Tensor) -> torch.Tensor:
        head = self.mtp_layer(k).shared_head
        return head.head(head.norm(hidden)).float()

    @torch.no_grad()
    def context_kv(self, layer: int, hidden: torch.Tensor, pos: torch.Tensor):
        """KV of a context produced outside the decode loop, at linear cost: ``hidden [N, D]`` is
        the layer's normed input, ``pos`` int ``[N]`` its positions. -> ``(latent fp32
        [N, kv_lora_rank], k_pe fp32 [N, rope] roped, index_key fp32 [N, index_head_dim])``,
        exactly what a forward pass would store for these inputs."""
        attn = self.model.layers[layer].self_attn
        cos, sin = attn.rotary(pos)
        hidden = hidden.float()
        latent, k_pe = attn.latent_kv(hidden, cos, sin)
        return latent, k_pe, attn.indexer.keys(hidden, cos, sin)


@torch.no_grad()
def prefill(model: DeepseekV32, tokens: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
    """Real prefill of short prompts: ``tokens`` int64 ``[R, N]`` at positions ``0 .. N-1``, every
    token with its own causal top-k. Writes every layer's KV through ``ctx.store`` and index keys
    through ``ctx.algo``; returns the hidden ``[R, N, D]`` (before ``model.norm``).

    Runs the main layers only; MTP layers get their KV when the caller runs ``mtp_forward`` over
    the prompt's hidden states (which needs the tokens one position ahead)."""
    start = torch.zeros(tokens.shape[0], dtype=torch.int32, device=tokens.device)
    batch = StepBatch.make(tokens, start)
    with ctx.settings(prefill=True, recorder=ctx.recorder):
        return model(batch, ctx)
