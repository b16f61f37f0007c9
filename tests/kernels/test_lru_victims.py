"""The lru victim search of the plan kernel (AllocateLru: a threshold search on the ages, first
pass just below the oldest age, then SelectLru over the windows that hold a victim) against the
reference, bit for bit, on crafted ages in a buffer whose slot_life is paged through several UB
windows. The count passes read DecayAndPin's half copy of the ages (S 8192; S 8000, whose copy
is padded to whole 128-lane compares) or, where that copy does not fit the 8192 half lanes of
the sort region (S 16384), the windows. Cases: one age everywhere (the ties span every chunk and
window), ages spread over the whole range (several passes), few young ages with free slots (some
of them selected again, so hit slots that held -1), and a shrunk active capacity whose tail
holds the oldest ages.
"""
from __future__ import annotations

import pytest
import torch

from avsg import reference
from avsg.backend import emulation

from helpers.plan_cases import I32, Twin, draw

R, T, K = 2, 1, 2048


def _craft(twin: Twin, row: int, case: str, gen: torch.Generator, S: int) -> None:
    """Rewrite one row's ages (both states alike)."""
    seed = int(torch.randint(0, 1 << 30, (1,), generator=gen))
    for state in (twin.state, twin.ref_state):
        v = reference.view_state(state, twin.layout)
        life, pos = v.slot_life[row, :S], v.slot_pos[row, :S]
        g = torch.Generator().manual_seed(seed)
        if case == "ties":
            life[pos >= 0] = 5
        elif case == "spread":
            life[pos >= 0] = torch.randint(1, 1024, (S,), generator=g, dtype=torch.int16)[pos >= 0]
        elif case == "free":
            life[pos >= 0] = torch.randint(1, 40, (S,), generator=g, dtype=torch.int16)[pos >= 0]
            free = torch.randperm(S, generator=g)[:300]
            life[free] = -1                   # resident slots among them: hit slots holding -1
        elif case == "shrunk":
            active = S - 1500
            state[row, reference.HEADER_ACTIVE] = active
            life[:active] = torch.randint(1, 300, (active,), generator=g, dtype=torch.int16)
            life[active:] = 1023              # the oldest, but never victims
            pos[active:] = -1


@pytest.mark.parametrize("build", ["strict", "fast"])
@pytest.mark.parametrize("cases", [("ties", "spread"), ("free", "shrunk")])
@pytest.mark.parametrize("S", [8192, 8000, 16384])
def test_lru_victims_on_crafted_ages(build, cases, S):
    H = max(8192, S)
    windows = torch.ops.avsg.plan_ub_plan(T, K, S, H, 0)[2:]
    assert windows[3] < S * 4, "slot_life should be paged through several windows here"
    gen = torch.Generator().manual_seed(len(cases[0]) * 7 + len(build))
    with emulation(build):
        twin = Twin(R, S, H, 4, policy="lru")
        seq = torch.full((R,), 6 * S, dtype=I32)
        for _ in range(8):                    # fills the buffer (the first steps take free slots)
            twin.plan(draw(gen, R, T, K, seq, hot=3 * S), seq)
            seq += T
        for row, case in enumerate(cases):
            _craft(twin, row, case, gen, S)
        for _ in range(2):
            topk = draw(gen, R, T, K, seq, hot=3 * S)
            twin.plan(topk, seq)
            seq += T
