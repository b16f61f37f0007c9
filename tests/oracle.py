"""Two independent checkers for plan outputs, written without looking at the vectorised code.

``ContentOracle`` knows nothing of the policy. It tracks what each slot holds from the plan
outputs alone (a miss writes its position into its slot) and checks the contract's invariants
on every step: sharing, miss-only, pinning, capacity, and the shape of the miss lists.

``PolicyModel`` is the default policy as a plain sequential loop over Python lists: decay, hits
back to L, misses sorted, victims by (lifetime, slot). It predicts every output exactly.
"""
from __future__ import annotations

from typing import Dict, List, Optional

import torch

MAX_POSITION = 1 << 24


def _valid(p: int, seq_len: int) -> bool:
    return 0 <= p < min(seq_len, MAX_POSITION)


class ContentOracle:
    def __init__(self, rows: int, capacity: int):
        self.capacity = capacity
        self.content: List[Dict[int, int]] = [dict() for _ in range(rows)]  # slot -> pos

    def resident(self, r: int) -> Dict[int, int]:
        return {p: s for s, p in self.content[r].items()}

    def step(self, topk_pos: torch.Tensor, seq_lens: torch.Tensor, plan) -> None:
        R, T, K = topk_pos.shape
        for r in range(R):
            seq_len = int(seq_lens[r])
            sel = [p if _valid(p, seq_len) else -1 for p in topk_pos[r].flatten().tolist()]
            slots = plan.slots[r].flatten().tolist()
            count = int(plan.miss_counts[r])
            miss_pos = plan.miss_pos[r].tolist()
            miss_slots = plan.miss_slots[r].tolist()
            before = self.resident(r)

            # miss list shape: count valid entries, ascending and unique, then -1
            assert 0 <= count <= T * K
            assert all(p == -1 for p in miss_pos[count:]), "miss_pos padding must be -1"
            assert all(s == -1 for s in miss_slots[count:]), "miss_slots padding must be -1"
            fetched = miss_pos[:count]
            assert fetched == sorted(set(fetched)), "misses must be unique and ascending"
            assert all(0 <= s < self.capacity for s in miss_slots[:count])
            assert len(set(miss_slots[:count])) == count, "each miss needs its own slot"

            # miss-only: fetched exactly the valid selections that were not resident
            wanted = {p for p in sel if p >= 0}
            assert set(fetched) == {p for p in wanted if p not in before}, \
                f"row {r}: fetched {sorted(set(fetched))} but non-resident selections are " \
                f"{sorted(p for p in wanted if p not in before)}"

            # pinning: no miss takes a slot a hit of this step reads
            hit_slots = {before[p] for p in wanted if p in before}
            assert not hit_slots & set(miss_slots[:count]), "a pinned slot was evicted"

            # slots: hits keep their slot, misses get theirs, -1 stays -1; sharing follows
            reserved = dict(zip(fetched, miss_slots[:count]))
            for p, s in zip(sel, slots):
                if p < 0:
                    assert s == -1
                else:
                    assert s == before.get(p, reserved.get(p)), f"row {r}: pos {p} slot {s}"
            by_pos: Dict[int, int] = {}
            for p, s in zip(sel, slots):
                if p >= 0:
                    assert by_pos.setdefault(p, s) == s, "equal positions must share a slot"
            assert len(set(by_pos.values())) == len(by_pos), "distinct positions, distinct slots"

            # eviction only by reassignment
            for p, s in reserved.items():
                self.content[r][s] = p

    def invalidate(self, valid_lens: torch.Tensor) -> None:
        for r, limit in enumerate(valid_lens.tolist()):
            self.content[r] = {s: p for s, p in self.content[r].items() if p < limit}

    def reset(self, rows) -> None:
        for r in rows:
            self.content[r] = {}


class PolicyModel:
    """The default lifetime policy, one row and one selection at a time."""

    def __init__(self, rows: int, capacity: int, lifetime: int):
        self.capacity, self.lifetime = capacity, lifetime
        self.pos = [[-1] * capacity for _ in range(rows)]
        self.life = [[-1] * capacity for _ in range(rows)]

    def plan(self, topk_pos: torch.Tensor, seq_lens: torch.Tensor):
        R, T, K = topk_pos.shape
        out_slots, out_miss_pos, out_miss_slots, out_counts = [], [], [], []
        L = self.lifetime
        for r in range(R):
            pos, life = self.pos[r], self.life[r]
            seq_len = int(seq_lens[r])
            sel = [p if _valid(p, seq_len) else -1 for p in topk_pos[r].flatten().tolist()]
            for s in range(self.capacity):
                if life[s] > 0:
                    life[s] -= 1
            where = {p: s for s, p in enumerate(pos) if p >= 0}
            for p in sel:
                if p in where:
                    life[where[p]] = L
            misses = sorted({p for p in sel if p >= 0 and p not in where})
            candidates = sorted((life[s], s) for s in range(self.capacity) if life[s] < L)
            victims = [s for _, s in candidates[:len(misses)]]
            assert len(victims) == len(misses)
            for p, s in zip(misses, victims):
                pos[s], life[s] = p, L
                where[p] = s
            pad = T * K - len(misses)
            out_slots.append([where[p] if p >= 0 else -1 for p in sel])
            out_miss_pos.append(misses + [-1] * pad)
            out_miss_slots.append(victims + [-1] * pad)
            out_counts.append(len(misses))
        as_t = lambda x: torch.tensor(x, dtype=torch.int32)  # noqa: E731
        return (as_t(out_slots).view(R, T, K), as_t(out_miss_pos), as_t(out_miss_slots),
                as_t(out_counts))

    def invalidate(self, valid_lens: torch.Tensor) -> None:
        for r, limit in enumerate(valid_lens.tolist()):
            for s in range(self.capacity):
                if self.pos[r][s] >= limit:
                    self.pos[r][s], self.life[r][s] = -1, -1

    def reset(self, rows) -> None:
        for r in rows:
            self.pos[r] = [-1] * self.capacity
            self.life[r] = [-1] * self.capacity


def brute_force_lookup(slot_pos: torch.Tensor, sel: torch.Tensor) -> torch.Tensor:
    """Slot of each position by scanning slot_pos (the ground truth the index accelerates)."""
    match = (slot_pos[:, None, :] == sel[:, :, None]) & (sel[:, :, None] >= 0)
    idx = match.int().argmax(-1)
    return torch.where(match.any(-1), idx.to(torch.int32), torch.full_like(sel, -1))


def host_row_values(src: torch.Tensor, r: int, p: int, block_table: Optional[torch.Tensor],
                    block_size: Optional[int]) -> torch.Tensor:
    if block_table is None:
        return src[r, p]
    return src[int(block_table[r, p // block_size]), p % block_size]
