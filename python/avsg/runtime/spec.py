"""MTP acceptance: greedy verification, and a labelled simulated model for performance studies.

With MTP-n a step feeds ``[x0, d1..dn]`` (the last output token and n drafts) at positions
``L .. L+n``; the verify pass predicts ``y0..yn``. Greedy verification accepts the longest prefix
of drafts that equals what the model itself predicts (``d[i+1] == y[i]``), so speculative decoding
emits exactly the tokens of plain greedy decoding: ``y0..ya`` for ``a`` accepted drafts.

Random weights almost never produce acceptable drafts, which would hide what MTP does to the
KV traffic. ``SimulatedAcceptance`` draws ``a`` per request and step from a geometric model (each
draft accepted with probability ``p`` given its predecessors were, as in the trace lab); the
emitted tokens are then ``d1..da, ya``. Outputs under it are not greedy outputs: every report that
uses it says "simulated acceptance".
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from ..lab.traces.mtp import acceptance_probability


def greedy_accept(drafts: torch.Tensor, predicted: torch.Tensor) -> torch.Tensor:
    """``drafts`` [R, n], ``predicted`` [R, n+1] -> accepted count int64 [R] (leading matches)."""
    n = drafts.shape[1]
    if n == 0:
        return torch.zeros(drafts.shape[0], dtype=torch.int64, device=drafts.device)
    matches = (drafts == predicted[:, :n]).to(torch.int64)
    return matches.cumprod(dim=1).sum(dim=1)


def emitted_tokens(drafts: torch.Tensor, predicted: torch.Tensor,
                   accepted: torch.Tensor) -> torch.Tensor:
    """Tokens committed after ``x0`` this step, ``[R, n+1]``; the first ``accepted+1`` count:
    the accepted drafts, then the model's prediction after the last of them."""
    R, n1 = predicted.shape
    index = torch.arange(n1, device=predicted.device)[None, :]
    padded = torch.cat([drafts, predicted[:, -1:]], dim=1)
    bonus = predicted.gather(1, accepted[:, None])
    return torch.where(index < accepted[:, None], padded,
                       torch.where(index == accepted[:, None], bonus, torch.zeros_like(predicted)))


class SimulatedAcceptance:
    """Geometric acceptance with mean ``accept_mean`` accepted drafts per step (of ``drafts``),
    drawn per request from its own seed, so every mode sees the same draws."""

    def __init__(self, drafts: int, accept_mean: float):
        if drafts < 1:
            raise ValueError("simulated acceptance needs MTP drafts (--mtp >= 1)")
        if not 0.0 <= accept_mean <= drafts:
            raise ValueError(f"accept_mean: expected a value in [0, {drafts}], got {accept_mean}")
        self.drafts = drafts
        self.accept_mean = accept_mean
        self.p = acceptance_probability(drafts, accept_mean)

    def stream(self, seed: int) -> "np.random.Generator":
        return np.random.default_rng([seed, 0x5EC])

    def draw(self, rng: "np.random.Generator") -> int:
        accepted = 0
        while accepted < self.drafts and rng.random() < self.p:
            accepted += 1
        return accepted

    def describe(self) -> str:
        return (f"simulated acceptance (geometric, p={self.p:.3f}, "
                f"mean {self.accept_mean:g} of {self.drafts} drafts)")


def parse_acceptance(text: Optional[str], drafts: int) -> Optional[SimulatedAcceptance]:
    """``None``/``"greedy"`` -> real greedy acceptance; ``"sim:0.8"`` -> simulated, mean 0.8."""
    if text is None or text == "greedy":
        return None
    if text.startswith("sim:"):
        try:
            mean = float(text[4:])
        except ValueError:
            raise ValueError(f"--acceptance: expected 'greedy' or 'sim:MEAN', got {text!r}") from None
        return SimulatedAcceptance(drafts, mean)
    raise ValueError(f"--acceptance: expected 'greedy' or 'sim:MEAN', got {text!r}")
