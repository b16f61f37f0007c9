"""DeepSeek Sparse Attention: the lightning indexer's Index and Select, and sparse absorbed MLA.

Index. One key per token and layer (``Indexer.keys``: ``k_norm(wk(x))``, half-split RoPE on its
first dims) is kept on the device in ``index_keys [layers, rows, max_len, index_head_dim]``;
``index`` writes this pass's keys at ``batch.pos`` (active rows only), ``fill`` writes a context.
``index_dtype=torch.bfloat16`` halves that cache but widens a layer's keys to fp32 on every
select; fp32 is the fast choice on CPU.

Select. Query token ``t`` of row ``r`` scores every position ``s < causal_lens[r, t]``:

    score[s] = sum_h w_h * ReLU(q_h . k_s * index_head_dim^-0.5),   w = weights_proj(x) * H^-0.5

in fp32, and keeps the ``min(index_topk, causal_lens[r, t])`` best. The whole ``max_len`` is
scanned (fixed shapes, no host sync), so size ``max_len`` to the longest context plus generation.
Ties are broken towards the lower position (scores and positions are packed into one int64 key,
so the choice does not depend on ``topk``'s internal order). The output is int32
``[R, T, index_topk]``: selected positions ascending, then ``-1``; idle rows select nothing.

Attention (``sparse_mla_attention``, reusable by any algorithm). The store's ``Retrieved`` says
where each selection is; the selected rows are gathered ``[R, T, K, width]`` in selection order
first, decoded to fp32, and only then computed on, so every store that returns the same bytes
gives bit-identical outputs:

    score_k = (q_lat . latent_k + q_pe . k_pe_k) * softmax_scale       (-1 selections masked)
    out     = (softmax(score) @ latent) @ W_uv^T                       -> [R, T, H, v_head_dim]

Split attention (``split_mla_attention``, when the store returns ``Retrieved.split``): the same
computation over the hits and over the misses separately, each with its log-sum-exp, merged
before ``W_uv`` (docs/overlap.md: the schedule, and the bound on its distance from the above).

``invalidate`` is a no-op: rejected draft positions ``>= valid_lens`` are never visible to a query
(``causal_lens`` stops before them) until the next pass writes them again through ``index``.
"""
from __future__ import annotations

from typing import Dict, Optional, Sequence, Tuple

import torch

from ...cache.overlap import merge_attention
from ..base import Retrieved, SparseAlgorithm, register_algorithm
from ...model_config import ModelConfig
from ...kvformat import KVFormat, get_format
from ..step import NULL_TIMERS, StepBatch, Timers


def format_of_view(view: Tuple[torch.Tensor, ...], latent_dim: int, rope_dim: int) -> KVFormat:
    """The KV format whose components ``view`` holds (the attention signature carries no format:
    one uint8 component is the packed fp8 layout, two components are latent | pe of their dtype)."""
    if len(view) == 1 and view[0].dtype == torch.uint8:
        return get_format("fp8", latent_dim, rope_dim)
    if len(view) == 2 and view[0].dtype in (torch.bfloat16, torch.float32):
        return get_format("bf16" if view[0].dtype == torch.bfloat16 else "fp32", latent_dim, rope_dim)
    raise ValueError(f"attention: cannot tell the KV format of components "
                     f"{[(tuple(v.shape), v.dtype) for v in view]}")


def gather_selected(view: Tuple[torch.Tensor, ...], index: torch.Tensor,
                    scratch: Optional[Dict] = None) -> Tuple[torch.Tensor, ...]:
    """``view`` components ``[R, X, width]``, ``index`` int ``[R, T, K]`` (-1 = none) -> each
    component's rows in selection order ``[R, T, K, width]`` (row 0 of the view where -1).
    With ``scratch`` (a dict owned by the caller) the results land in reused buffers."""
    R, T, K = index.shape
    X = view[0].shape[1]
    row_base = torch.arange(R, device=index.device, dtype=torch.int64)[:, None, None] * X
    flat = (row_base + index.clamp_min(0).to(torch.int64)).reshape(-1)
    out = []
    for i, c in enumerate(view):
        # index_select on a flat [R*X, width] view: a plain row copy, far cheaper than advanced
        # indexing
        dst = _scratch(scratch, ("rows", i), (R * T * K, c.shape[-1]), c.dtype, c.device)
        out.append(torch.index_select(c.reshape(R * X, c.shape[-1]), 0, flat, out=dst)
                   .view(R, T, K, c.shape[-1]) if dst is not None else
                   c.reshape(R * X, c.shape[-1]).index_select(0, flat).view(R, T, K, c.shape[-1]))
    return tuple(out)


def _scratch(scratch: Optional[Dict], key, shape, dtype, device) -> Optional[torch.Tensor]:
    """A reusable buffer: large per-step temporaries otherwise cost a fresh, page-faulting
    allocation every layer on CPU."""
    if scratch is None:
        return None
    buf = scratch.get(key)
    if buf is None or buf.shape != torch.Size(shape) or buf.dtype != dtype or buf.device != device:
        buf = scratch[key] = torch.empty(shape, dtype=dtype, device=device)
    return buf


def decode_rows(fmt: KVFormat, rows: Tuple[torch.Tensor, ...],
                scratch: Optional[Dict] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """``fmt.decode``; for the formats whose decode is a plain widening to fp32 (exact, so the
    same values), widen into reused buffers instead."""
    if scratch is None or fmt.name not in ("bf16", "fp32"):
        return fmt.decode(rows)
    out = []
    for i, r in enumerate(rows):
        if r.dtype == torch.float32:
            out.append(r)
            continue
        buf = _scratch(scratch, ("fp32", i), r.shape, torch.float32, r.device)
        out.append(buf.copy_(r))
    return out[0], out[1]


def sparse_mla_attention(attn: torch.nn.Module, q_lat: torch.Tensor, q_pe: torch.Tensor,
                         retrieved: Retrieved, kv_format: Optional[KVFormat] = None,
                         scratch: Optional[Dict] = None) -> torch.Tensor:
    """Absorbed MLA over the selected entries.

    ``attn`` is the layer's ``Attention`` (``softmax_scale``, ``w_uv()``); ``q_lat`` fp32
    ``[R, T, H, kv_lora_rank]`` (q_nope absorbed), ``q_pe`` fp32 ``[R, T, H, rope]`` (roped).
    -> ``[R, T, H, v_head_dim]`` fp32; a query with no selection gives zeros. ``scratch``: a dict
    the caller keeps across calls, for buffer reuse (never aliased by the result).
    """
    fmt = kv_format or format_of_view(retrieved.view, q_lat.shape[-1], q_pe.shape[-1])
    rows = gather_selected(retrieved.view, retrieved.index, scratch)
    latent, k_pe = decode_rows(fmt, rows, scratch)                   # [R, T, K, C], [R, T, K, P]
    R, T, H, C = q_lat.shape
    K = latent.shape[2]
    latent = latent.reshape(R * T, K, C)
    scores = torch.bmm(q_lat.reshape(R * T, H, C), latent.transpose(1, 2))
    scores = scores.baddbmm_(q_pe.reshape(R * T, H, -1), k_pe.reshape(R * T, K, -1).transpose(1, 2))
    selected = (retrieved.index >= 0).reshape(R * T, 1, K)
    # finfo.min, not -inf: a query with nothing selected then gets a finite (uniform) softmax,
    # which the mask below zeroes, instead of NaNs
    scores = (scores * attn.softmax_scale).masked_fill_(~selected, torch.finfo(scores.dtype).min)
    probs = torch.softmax(scores, dim=-1) * selected
    out_lat = torch.bmm(probs, latent).view(R, T, H, C)
    return torch.einsum("rthc,hvc->rthv", out_lat, attn.w_uv())


def sparse_mla_partial(attn: torch.nn.Module, q_lat: torch.Tensor, q_pe: torch.Tensor,
                       view: Tuple[torch.Tensor, ...], index: torch.Tensor, fmt: KVFormat,
                       scratch: Optional[Dict] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """Absorbed MLA over the part of the selection ``index`` names (``[R, T, K]``, -1 = none),
    before ``W_uv``: ``(out_lat fp32 [R, T, H, kv_lora_rank], lse fp32 [R, T, H])``, ``lse`` the
    log-sum-exp of the part's scaled scores (``-inf`` and zeros where it selects nothing). Two
    disjoint parts merged by ``avsg.cache.overlap.merge_attention`` are attention over their
    union (docs/overlap.md states how closely)."""
    rows = gather_selected(view, index, scratch)
    latent, k_pe = decode_rows(fmt, rows, scratch)
    R, T, H, C = q_lat.shape
    K = latent.shape[2]
    latent = latent.reshape(R * T, K, C)
    scores = torch.bmm(q_lat.reshape(R * T, H, C), latent.transpose(1, 2))
    scores = scores.baddbmm_(q_pe.reshape(R * T, H, -1), k_pe.reshape(R * T, K, -1).transpose(1, 2))
    selected = (index >= 0).reshape(R * T, 1, K)
    scores = (scores * attn.softmax_scale).masked_fill_(~selected, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)                                  # -inf: nothing selected
    probs = torch.exp(scores - torch.where(torch.isfinite(lse), lse, 0.0)[..., None])
    out_lat = torch.bmm(probs, latent).view(R, T, H, C)
    return out_lat, lse.view(R, T, H)


def split_mla_attention(attn: torch.nn.Module, q_lat: torch.Tensor, q_pe: torch.Tensor,
                        retrieved: Retrieved, kv_format: Optional[KVFormat] = None,
                        scratch: Optional[Dict] = None) -> torch.Tensor:
    """``sparse_mla_attention`` as the hit/miss split runs it: attention over the hits (resident
    before the step's copies, so it may run while they are in flight), then, after the copies
    (``retrieved.wait_copies``), over the misses, merged by log-sum-exp before ``W_uv``. Equal
    to the unsplit attention within docs/overlap.md's bound, not bit for bit."""
    fmt = kv_format or format_of_view(retrieved.view, q_lat.shape[-1], q_pe.shape[-1])
    hits, misses = retrieved.split
    out_hits, lse_hits = sparse_mla_partial(attn, q_lat, q_pe, retrieved.view, hits, fmt, scratch)
    if retrieved.wait_copies is not None:
        retrieved.wait_copies()
    out_misses, lse_misses = sparse_mla_partial(attn, q_lat, q_pe, retrieved.view, misses, fmt,
                                                scratch)
    out_lat, _ = merge_attention(out_hits, lse_hits, out_misses, lse_misses)
    return torch.einsum("rthc,hvc->rthv", out_lat, attn.w_uv())


def topk_lowest_position_first(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the ``k`` largest of ``scores [..., X]`` (fp32, no NaN), ties to the lower
    index, best first. Score and index are packed into one int64 so no two keys are equal."""
    scores = scores + 0.0                               # -0.0 -> +0.0: equal scores, equal bits
    bits = scores.view(torch.int32).to(torch.int64)
    # order-preserving map of an IEEE float's bits onto signed integers
    ordered = torch.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
    X = scores.shape[-1]
    position = torch.arange(X, device=scores.device, dtype=torch.int64)
    key = ordered * (1 << 32) + ((1 << 32) - 1 - position)
    return key.topk(k, dim=-1).indices


@register_algorithm
class DSA(SparseAlgorithm):
    name = "dsa"

    def __init__(self, config: ModelConfig, rows: int, max_len: int, device: torch.device,
                 layers: Optional[int] = None, index_dtype: torch.dtype = torch.float32,
                 timers: Timers = NULL_TIMERS, kv_format: Optional[KVFormat] = None):
        self.config = config
        self.topk = config.index_topk
        self.layers = config.num_kv_layers if layers is None else layers
        self.rows, self.max_len = rows, max_len
        self.device = torch.device(device)
        self.timers = timers
        self.kv_format = kv_format          # None: told apart from the retrieved components
        self._scratch: Dict = {}            # attention's reused buffers
        self.index_keys = torch.zeros(self.layers, rows, max_len, config.index_head_dim,
                                      dtype=index_dtype, device=self.device)

    # --- Index ------------------------------------------------------------------------------
    def index(self, layer: int, batch: StepBatch, attn, x: torch.Tensor,
              q_resid: torch.Tensor) -> None:
        cos, sin = attn.rotary(batch.pos)
        keys = attn.indexer.keys(x, cos, sin).to(self.index_keys.dtype)    # [R, T, Di]
        cache = self.index_keys[layer]
        pos = batch.pos.to(torch.int64)
        row = torch.arange(batch.rows, device=pos.device)[:, None].expand_as(pos)
        # idle rows keep what they hold (their pos is 0, which may belong to a filled context)
        keep = cache[row, pos]
        cache[row, pos] = torch.where(batch.active[:, None, None], keys, keep)

    def fill(self, layer: int, row: int, start: int, index_keys: torch.Tensor) -> None:
        n = index_keys.shape[0]
        if start + n > self.max_len:
            raise ValueError(f"dsa: fill of {n} keys at {start} exceeds max_len {self.max_len}")
        self.index_keys[layer, row, start:start + n] = index_keys.to(self.index_keys)

    # --- Select -----------------------------------------------------------------------------
    def scores(self, layer: int, batch: StepBatch, attn, x: torch.Tensor,
               q_resid: torch.Tensor) -> torch.Tensor:
        """Index scores fp32 ``[R, T, max_len]``; invisible positions are ``-inf``."""
        indexer = attn.indexer
        cos, sin = attn.rotary(batch.pos)
        # the scale is positive, so it commutes with ReLU: fold it into the (small) queries
        q = indexer.queries(q_resid, cos, sin).float() * indexer.softmax_scale   # [R, T, Hi, Di]
        R, T, Hi, Di = q.shape
        keys = self.index_keys[layer].float()                              # [R, X, Di]
        per_head = torch.bmm(q.reshape(R, T * Hi, Di), keys.transpose(1, 2)).relu_()
        weights = indexer.head_weights(x)                                  # [R, T, Hi]
        scores = torch.bmm(weights.reshape(R * T, 1, Hi),
                           per_head.view(R * T, Hi, self.max_len)).view(R, T, self.max_len)
        position = torch.arange(self.max_len, device=scores.device, dtype=torch.int32)
        visible = position < batch.causal_lens[..., None]
        return scores.masked_fill_(~visible, float("-inf"))

    def select(self, layer: int, batch: StepBatch, attn, x: torch.Tensor,
               q_resid: torch.Tensor) -> torch.Tensor:
        scores = self.scores(layer, batch, attn, x, q_resid)
        k = min(self.topk, self.max_len)
        best = topk_lowest_position_first(scores, k)                       # [R, T, k] best first
        # invisible positions score -inf and rank last, so the first min(k, visible) are real
        rank = torch.arange(k, device=best.device)
        real = rank < batch.causal_lens[..., None].to(torch.int64)
        none = torch.iinfo(torch.int64).max
        chosen = torch.where(real, best, torch.full_like(best, none)).sort(dim=-1).values
        chosen = torch.where(chosen == none, torch.full_like(chosen, -1), chosen).to(torch.int32)
        if k < self.topk:
            chosen = torch.cat([chosen, chosen.new_full((*chosen.shape[:-1], self.topk - k), -1)], -1)
        return chosen.contiguous()

    # --- Attention --------------------------------------------------------------------------
    def attention(self, layer: int, batch: StepBatch, attn, q_nope: torch.Tensor,
                  q_pe: torch.Tensor, retrieved: Retrieved) -> torch.Tensor:
        """``q_nope`` is the absorbed query ``[R, T, H, kv_lora_rank]``. A store that split
        the selection into hits and misses (``retrieved.split``) gets the split attention."""
        if retrieved.split is not None:
            return split_mla_attention(attn, q_nope, q_pe, retrieved, self.kv_format,
                                       self._scratch)
        return sparse_mla_attention(attn, q_nope, q_pe, retrieved, self.kv_format, self._scratch)

    # --- lifecycle --------------------------------------------------------------------------
    def invalidate(self, valid_lens: torch.Tensor, layers: Optional[Sequence[int]] = None) -> None:
        """Nothing to forget: see the module docstring."""

    def reset(self, rows: torch.Tensor) -> None:
        """A new request's keys are all written (fill / index) before any query can see them."""
