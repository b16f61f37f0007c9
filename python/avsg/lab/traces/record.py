"""The attention-probability selection rule used to record traces from a causal LM.

Rule (the one ``../shared/traces/asyncio_32k.npz`` documents): for each layer and each decode step
(query position ``q``), score every position ``p <= q`` by the causal attention probability summed
over all query heads, and keep the ``k`` highest (one set per layer, shared by all heads); the set is
stored sorted ascending. With fewer than ``k`` candidates (``q + 1 < k``) every position is kept and
the row is padded with ``-1``. Ties are broken towards the smaller position (stable), which makes
the rule deterministic.

:func:`select_topk` applies the rule to attention-probability tensors; ``scripts/record_trace.py``
feeds it from a Hugging Face model (``output_attentions=True``).
"""
from __future__ import annotations

import numpy as np

__all__ = ["select_topk"]


def select_topk(attn, query_positions, k: int) -> np.ndarray:
    """Selections from attention probabilities.

    ``attn``: ``[heads, q, kv]`` (torch tensor or numpy array) -- probabilities of ``q`` query tokens
    over ``kv`` key positions ``0..kv-1``; ``query_positions``: ``[q]`` absolute positions of the
    queries (``< kv``). Returns int64 ``[q, k]``: per query the ``k`` positions ``<= q`` with the
    highest head-summed probability, ascending, ``-1`` padded.
    """
    import torch
    a = torch.as_tensor(attn)
    if a.dim() != 3:
        raise ValueError(f"attn: expected [heads, q, kv], got shape {tuple(a.shape)}")
    qpos = torch.as_tensor(np.asarray(query_positions), dtype=torch.long)
    H, Q, KV = a.shape
    if qpos.shape != (Q,):
        raise ValueError(f"query_positions: expected shape ({Q},), got {tuple(qpos.shape)}")
    if int(qpos.max()) >= KV or int(qpos.min()) < 0:
        raise ValueError(f"query_positions: expected values in [0, {KV}), got {qpos.tolist()}")
    score = a.to(torch.float64).sum(0)                                     # [Q, KV]
    cols = torch.arange(KV)
    causal = cols[None, :] <= qpos[:, None]
    # ties -> smaller position first: subtract a tiny position-proportional epsilon via a stable sort
    score = torch.where(causal, score, torch.full_like(score, -1.0))
    order = torch.sort(score, dim=1, descending=True, stable=True).indices[:, :k]  # [Q, min(k,KV)]
    take = torch.gather(causal, 1, order)
    sel = torch.where(take, order, torch.full_like(order, -1))
    big = KV + 1
    sel = torch.sort(torch.where(sel >= 0, sel, torch.full_like(sel, big)), dim=1).values
    sel = torch.where(sel == big, torch.full_like(sel, -1), sel)
    out = np.full((Q, k), -1, np.int64)
    out[:, :sel.shape[1]] = sel.numpy()
    return out
