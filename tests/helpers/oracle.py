"""Two independent checkers for plan outputs, written without looking at the vectorised code.

``ContentOracle`` knows nothing of the policy. It tracks what each slot holds from the plan
outputs alone (a miss writes its position into its slot) and checks the contract's invariants
on every step: sharing, miss-only, pinning, capacity, and the shape of the miss lists.

``PolicyModel`` is the default policy as a plain sequential loop over Python lists: decay, hits
back to L, misses sorted, victims by (lifetime, slot), a fetched position starting 4 steps short
of a hit's life (half of it below L = 8). It predicts every output exactly.
"""
from __future__ import annotations

from typing import Dict, List, Optional

import torch

from avsg import reference

MAX_POSITION = 1 << 24


def _valid(p: int, seq_len: int) -> bool:
    return 0 <= p < min(seq_len, MAX_POSITION)


class ContentOracle:
    def __init__(self, rows: int, capacity: int):
        self.capacity = capacity
        self.active = [capacity] * rows                                      # resize
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
            assert all(0 <= s < self.active[r] for s in miss_slots[:count]), \
                f"row {r}: a miss slot at or past the active capacity {self.active[r]}"
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
            self.active[r] = self.capacity

    def resize(self, rows, capacities, moves, T: int, K: int, resident) -> None:
        """Check a resize against what each slot held. ``resident(r)`` is what row r holds after
        it ({pos: slot}, from the buffer: which positions a shrink evicts is the policy's
        business, not this oracle's). A grow moves and evicts nothing; a shrink to c keeps
        min(held, c) positions, all below c, each in its old slot or moved from a slot >= c to
        a slot < c, the moves ascending and disjoint."""
        for r, c in zip(rows, capacities):
            assert T * K <= c <= self.capacity
            count = int(moves.miss_counts[r])
            src = moves.miss_pos[r].tolist()
            dst = moves.miss_slots[r].tolist()
            assert all(x == -1 for x in src[count:] + dst[count:]), "move padding must be -1"
            src, dst = src[:count], dst[:count]
            before = dict(self.content[r])                      # slot -> pos
            after = resident(r)                                 # pos -> slot
            if c >= self.active[r]:
                assert count == 0, "a grow moves nothing"
                assert after == {p: s for s, p in before.items()}, "a grow changes nothing"
                self.active[r] = c
                continue
            assert src == sorted(src) and dst == sorted(dst), "moves ascend"
            assert all(s >= c for s in src) and all(d < c for d in dst), "sources >= c > dests"
            assert len(set(src)) == count and len(set(dst)) == count
            assert all(s in before for s in src), "only resident positions move"
            assert len(after) == min(len(before), c), \
                f"row {r}: {len(after)} survivors of {len(before)} at capacity {c}"
            moved_to = dict(zip(src, dst))
            for s, p in before.items():
                if s in moved_to:
                    assert after.get(p) == moved_to[s], f"row {r}: pos {p} not moved {s}->{moved_to[s]}"
                elif p in after:
                    assert s < c and after[p] == s, f"row {r}: pos {p} left slot {s} unmoved"
            assert all(p in before.values() for p in after), "a resize brings no new position"
            self.content[r] = {s: p for p, s in after.items()}
            self.active[r] = c


class PolicyModel:
    """The default lifetime policy, one row and one selection at a time: ties between equal
    lives go in slot order from the row's hand, which then moves past the last victim."""

    def __init__(self, rows: int, capacity: int, lifetime: int):
        self.capacity, self.lifetime = capacity, lifetime
        self.pos = [[-1] * capacity for _ in range(rows)]
        self.life = [[-1] * capacity for _ in range(rows)]
        self.active = [capacity] * rows
        self.hand = [0] * rows

    def plan(self, topk_pos: torch.Tensor, seq_lens: torch.Tensor):
        R, T, K = topk_pos.shape
        out_slots, out_miss_pos, out_miss_slots, out_counts = [], [], [], []
        L = self.lifetime
        for r in range(R):
            pos, life = self.pos[r], self.life[r]
            seq_len = int(seq_lens[r])
            sel = [p if _valid(p, seq_len) else -1 for p in topk_pos[r].flatten().tolist()]
            for s in range(self.capacity):
                if life[s] == L + 1:              # fetched last step: on probation
                    life[s] = L - min(4, L // 2) - 1
                elif life[s] > 0:
                    life[s] -= 1
            where = {p: s for s, p in enumerate(pos) if p >= 0}
            for p in sel:
                if p in where:
                    life[where[p]] = L
            misses = sorted({p for p in sel if p >= 0 and p not in where})
            A = self.active[r]
            hand = self.hand[r] if self.hand[r] < A else 0
            turn = [s for s in range(hand, A)] + [s for s in range(hand)]
            candidates = sorted((life[s], i, s) for i, s in enumerate(turn) if life[s] < L)
            victims = [s for _, _, s in candidates[:len(misses)]]
            assert len(victims) == len(misses)
            if victims:
                self.hand[r] = (victims[-1] + 1) % A
            for p, s in zip(misses, victims):
                pos[s], life[s] = p, L + 1        # fresh until the next decay
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
            self.active[r] = self.capacity
            self.hand[r] = 0

    def resize(self, rows, capacities):
        """Shrink: evict the lowest (life, slot from the hand on) until the row fits, then move
        the survivors past the capacity, lowest first, into the lowest free slots. The hand stays
        (plan takes it as 0 once it lies past the capacity). Returns {row: [(src, dst)]}."""
        moves = {}
        for r, c in zip(rows, capacities):
            pos, life = self.pos[r], self.life[r]
            moves[r] = []
            if c >= self.active[r]:
                self.active[r] = c
                continue
            hand = self.hand[r] if self.hand[r] < self.active[r] else 0
            held = sorted((min(life[s], self.lifetime), (s - hand) % self.capacity, s)
                          for s in range(self.capacity) if pos[s] >= 0)
            for _, _, s in held[:max(0, len(held) - c)]:
                pos[s], life[s] = -1, -1
            free = [s for s in range(c) if pos[s] < 0]
            for s in range(c, self.capacity):
                if pos[s] >= 0:
                    d = free.pop(0)
                    pos[d], life[d], pos[s], life[s] = pos[s], life[s], -1, -1
                    moves[r].append((s, d))
            self.active[r] = c
        return moves


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


def check_index_consistent(buf, after_plan: bool = True) -> None:
    """The hash index finds exactly what slot_pos holds; right after a plan the stash holds no
    stale entry (invalidate and reset leave stale ones for the next plan to drop)."""
    v = reference.view_state(buf.state, buf.layout)
    resident = v.slot_pos.clone()
    probe = torch.where(resident >= 0, resident, torch.full_like(resident, -1))
    found = reference.index_lookup(v, probe, buf.hash_buckets)
    assert torch.equal(found, brute_force_lookup(v.slot_pos, probe))
    for r in range(buf.rows if after_plan else 0):
        n = int(v.stash_count[r])
        keys, slots = v.stash_key[r, :n], v.stash_slot[r, :n].long()
        assert torch.equal(v.slot_pos[r, slots], keys), "stash holds a stale entry after plan"
        assert keys.unique().numel() == n, "stash holds a position twice"
