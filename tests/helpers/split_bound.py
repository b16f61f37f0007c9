"""The bound docs/overlap.md derives for attention split into two parts and merged by
log-sum-exp, against attention over the whole selection (per query token and head, per output
element), computed from the data of one token: not a fitted number."""
from __future__ import annotations

import math

U_FP32 = 2.0 ** -24
U_BF16 = 2.0 ** -8


def gamma(n: int, u: float = U_FP32) -> float:
    return n * u / (1 - n * u)


def fp32_bound(V: float, abs_score_terms: float, max_abs_score: float, K: int,
               width: int) -> float:
    """``V (4 eps_s + (8K + 6 Lambda + 4 ln K + 20) u)`` with ``eps_s = gamma_width *
    abs_score_terms`` (the largest ``scale * sum |q||k|`` of a selected entry) and
    ``Lambda = 2 max |s| + ln K``."""
    K = max(K, 1)
    eps_s = gamma(width) * abs_score_terms
    lam = 2 * max_abs_score + math.log(K)
    return V * (4 * eps_s + (8 * K + 6 * lam + 4 * math.log(K) + 20) * U_FP32)


def bf16_bound(V: float, *fp32_args) -> float:
    """BF16 outputs (each part and the result rounded to BF16; LSE in fp32): the fp32 bound plus
    ``3 u_bf16 V``."""
    return fp32_bound(V, *fp32_args) + 3 * U_BF16 * V
