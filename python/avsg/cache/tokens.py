"""From an engine's flat token layout (TND) to the buffers' ``[R, T, K]`` and back.

Engines batch a pass as flat tokens: request ``i`` owns a run of consecutive tokens (vLLM's
``query_start_loc``, or a per-token ``token_to_req`` map), and each token has its own top-k
(``[num_tokens, (1,) K]``). The buffers plan per *state row*: the ``T`` query tokens of one request
share its row (``[R, T, K]``). ``TokenRows`` says where every token goes; ``to_rows`` scatters a
layer's top-k there and ``to_tokens`` brings its slots back, valid entries first as sparse flash
attention reads them. Everything here is fixed-shape tensor work on the device, no host sync.

A token is *planned* when its request holds a state row, it is not padding, and it is among the
first ``T`` tokens of its request (a longer request, a prefill chunk, bypasses the buffers); an
unplanned token lands in the spare row ``R * T`` of the scatter and gets ``-1`` slots.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch


class TokenRows(NamedTuple):
    """Per token ``[N]``: where it goes in ``[R, T, K]``."""
    planned: torch.Tensor       # bool : goes through the buffers
    plan_index: torch.Tensor    # int64: state_row * T + j, or R * T (spare) when not planned
    state_row: torch.Tensor     # int64: its request's state row (0 where not planned)
    query: torch.Tensor         # int64: j, its index within its request


def requests_of_tokens(query_start_loc: torch.Tensor, num_tokens: int):
    """``query_start_loc`` int32 ``[Q + 1]`` -> per token ``(request, j, live)``; tokens past
    ``query_start_loc[Q]`` are padding (``live`` False)."""
    Q = query_start_loc.shape[0] - 1
    qsl = query_start_loc.to(torch.int64)
    token = torch.arange(num_tokens, dtype=torch.int64, device=qsl.device)
    req = torch.searchsorted(qsl[1:].contiguous(), token, right=True).clamp(max=max(Q - 1, 0))
    j = token - qsl[req]
    return req, j, (token < qsl[Q]) & (j >= 0)


def requests_of_token_map(token_to_req: torch.Tensor, num_tokens: int, num_requests: int):
    """A per-token request map (tokens of a request contiguous) -> ``(request, j)``."""
    t = torch.arange(num_tokens, dtype=torch.int64, device=token_to_req.device)
    req = token_to_req[:num_tokens].to(torch.int64).clamp(0, num_requests - 1)
    first = torch.full((num_requests,), num_tokens, dtype=torch.int64, device=t.device)
    first.scatter_reduce_(0, req, t, reduce="amin")
    return req, t - first.index_select(0, req)


def token_rows(req: torch.Tensor, query: torch.Tensor, live: torch.Tensor,
               state_row_of_request: torch.Tensor, rows: int, queries_per_step: int) -> TokenRows:
    """``req``/``query``/``live`` per token (above); ``state_row_of_request`` int64 ``[Q]`` (``-1``:
    the request is not buffered this pass)."""
    state_row = state_row_of_request.index_select(0, req)
    planned = live & (state_row >= 0) & (query < queries_per_step)
    state_row = torch.where(planned, state_row, 0)
    plan_index = torch.where(planned, state_row * queries_per_step + query,
                             rows * queries_per_step)
    return TokenRows(planned, plan_index, state_row, query)


def to_rows(topk: torch.Tensor, tokens: TokenRows, rows: int, queries_per_step: int
            ) -> torch.Tensor:
    """A layer's top-k ``[N, (1,) K]`` -> int32 ``[R, T, K]`` by state row (``-1`` where no token)."""
    N, K = tokens.plan_index.shape[0], topk.shape[-1]
    R, T = rows, queries_per_step
    by_row = torch.full((R * T + 1, K), -1, dtype=torch.int32, device=topk.device)
    by_row.index_copy_(0, tokens.plan_index, topk.reshape(N, K).to(torch.int32))
    return by_row[:R * T].view(R, T, K)


def to_tokens(slots: torch.Tensor, tokens: TokenRows) -> torch.Tensor:
    """A plan's slots ``[R, T, K]`` -> ``[N, K]`` per token, valid entries first (``-1`` for an
    unplanned token)."""
    R, T, K = slots.shape
    per_token = slots.reshape(R * T, K).index_select(0, tokens.plan_index.clamp(max=R * T - 1))
    per_token = torch.where(tokens.planned[:, None], per_token, torch.full_like(per_token, -1))
    return valid_first(per_token)


def valid_first(slots: torch.Tensor) -> torch.Tensor:
    """Per row, the valid (``>= 0``) entries first in their order, then the ``-1`` entries: a
    stable partition as one scatter (the destinations are a permutation, so it is exact)."""
    valid = slots >= 0
    n_valid = valid.sum(1, keepdim=True)
    dest = torch.where(valid, valid.cumsum(1) - 1, n_valid + (~valid).cumsum(1) - 1)
    return torch.full_like(slots, -1).scatter_(1, dest, slots)


def row_minimum(values: torch.Tensor, tokens: TokenRows, rows: int, empty: int) -> torch.Tensor:
    """Per state row, the minimum of ``values`` ``[N]`` over its planned tokens (``empty`` where
    none): int64 ``[R]``."""
    target = torch.where(tokens.planned, tokens.state_row, rows)
    out = torch.full((rows + 1,), empty, dtype=torch.int64, device=values.device)
    return out.scatter_reduce(0, target, values.to(torch.int64), reduce="amin")[:rows]


def row_counts(tokens: TokenRows, rows: int) -> torch.Tensor:
    """Planned tokens per state row, int64 ``[R]``."""
    target = torch.where(tokens.planned, tokens.state_row, rows)
    count = torch.zeros(rows + 1, dtype=torch.int64, device=target.device)
    return count.scatter_add_(0, target, torch.ones_like(target))[:rows]


def resident_pages(state_rows: torch.Tensor, pages_per_row: int,
                   out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The resident block table: entry ``i`` lists the pages of state row ``state_rows[i]``,
    ``[s * P, (s + 1) * P)`` for ``P = pages_per_row`` (int32 ``[n, P]``; into ``out`` if given)."""
    pages = torch.arange(pages_per_row, device=state_rows.device, dtype=torch.int64)
    table = (state_rows.to(torch.int64).clamp(min=0)[:, None] * pages_per_row
             + pages[None, :]).to(torch.int32)
    return table if out is None else out.copy_(table)
