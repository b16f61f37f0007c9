"""``RowTable``: which request holds which state row (host bookkeeping, no device work).

A *state row* is one request's residency: a row of every layer's ``SparseKVBuffer`` state and of
the device KV buffers behind it. A request is named by a *key* of the engine's choosing (vLLM's
request id, a batch row index, ...). A row's contents belong to the request that held it when
they were planned, so a row is reset before any request gets it: ``admit`` and ``assign`` say
which rows need the reset, and the caller resets them (on every layer) before the next plan.

An engine may also say what the row was used under (an *identity*: vllm-ascend's runner-owned
``(slot, generation)``); a request whose identity changed gets a fresh, reset row.

Every change bumps ``generation``: what was derived from the table before (a pass's mapping)
is superseded.
"""
from __future__ import annotations

from typing import Dict, Hashable, Iterable, List, Optional, Sequence, Tuple

from ..validation import require_int


class RowTable:
    """``rows`` state rows, each free or held by one key."""

    def __init__(self, rows: int):
        require_int("rows", rows, low=1)
        self.rows = rows
        self._row_of: Dict[Hashable, int] = {}
        self._identity_of: Dict[Hashable, Tuple] = {}
        self._free: List[int] = list(range(rows))      # FIFO: a freed row is reused last
        # keys whose row was reset since the last plan read into it: their identity may still
        # be recorded without a second reset
        self._untouched: set = set()
        self.generation = 0

    def __len__(self) -> int:
        return len(self._row_of)

    def __contains__(self, key) -> bool:
        return key in self._row_of

    def row_of(self, key) -> Optional[int]:
        return self._row_of.get(key)

    def keys(self) -> List[Hashable]:
        return list(self._row_of)

    def held(self) -> Dict[Hashable, int]:
        """``{key: state row}`` of every held row (a copy)."""
        return dict(self._row_of)

    def identity_of(self, key) -> Optional[Tuple]:
        """The ``(slot, generation)`` ``key``'s row was last used under (``None``: none given)."""
        return self._identity_of.get(key)

    def free_rows(self) -> List[int]:
        return list(self._free)

    def admit(self, key, row: Optional[int] = None) -> int:
        """``key`` gets a state row: ``row`` if given (it must be free), else the free row freed
        longest ago. Returns it; the caller resets it before the next plan."""
        if key in self._row_of:
            raise ValueError(f"key: {key!r} already holds state row {self._row_of[key]}")
        if row is None:
            if not self._free:
                raise ValueError(f"key: no free state row for {key!r} (all {self.rows} held)")
            row = self._free.pop(0)
        else:
            require_int("row", row, low=0, high=self.rows - 1)
            if row not in self._free:
                raise ValueError(f"row: state row {row} is held; admit into a free row")
            self._free.remove(row)
        self._row_of[key] = row
        self._untouched.add(key)
        self.generation += 1
        return row

    def release(self, keys: Iterable) -> List[int]:
        """Free the rows of ``keys`` (keys without a row are skipped); returns the rows freed."""
        freed = []
        for key in keys:
            row = self._row_of.pop(key, None)
            self._identity_of.pop(key, None)
            self._untouched.discard(key)
            if row is not None:
                self._free.append(row)
                freed.append(row)
        if freed:
            self.generation += 1
        return freed

    def rekey(self, old, new) -> None:
        """The request known as ``old`` is known as ``new`` now (an engine that names requests
        by batch row, after compaction); it keeps its row."""
        if old not in self._row_of:
            raise ValueError(f"key: {old!r} holds no state row")
        if new in self._row_of:
            raise ValueError(f"key: {new!r} already holds state row {self._row_of[new]}")
        self._row_of[new] = self._row_of.pop(old)
        if old in self._identity_of:
            self._identity_of[new] = self._identity_of.pop(old)
        if old in self._untouched:
            self._untouched.discard(old)
            self._untouched.add(new)
        self.generation += 1

    def swap(self, a, b) -> None:
        """Keys ``a`` and ``b`` exchange their rows (either may hold none)."""
        for mapping in (self._row_of, self._identity_of):
            va, vb = mapping.pop(a, None), mapping.pop(b, None)
            if va is not None:
                mapping[b] = va
            if vb is not None:
                mapping[a] = vb
        ua, ub = a in self._untouched, b in self._untouched
        self._untouched.difference_update((a, b))
        self._untouched.update(k for k, u in ((b, ua), (a, ub)) if u)
        self.generation += 1

    def planned(self) -> None:
        """A plan read into every held row: identities recorded from now on are checked."""
        self._untouched.clear()

    def stale(self, keys: Sequence, identities: Sequence[Optional[Tuple]]) -> List:
        """Of ``keys`` (with ``identities[i]`` = ``(slot, generation, active)`` or ``None``), those
        whose row must be reset: an identity other than the one its row was used under, or an
        inactive one. A row reset since the last plan only records its identity."""
        out = []
        for key, ident in zip(keys, identities):
            if ident is None or key not in self._row_of or key in self._untouched:
                continue
            if self._identity_of.get(key) != tuple(ident[:2]) or not ident[2]:
                out.append(key)
        return out

    def identity_changed(self, key, identity: Optional[Tuple]) -> bool:
        return identity is not None and key in self._row_of and \
            self._identity_of.get(key) != tuple(identity[:2])

    def assign(self, keys: Sequence, identities: Optional[Sequence[Optional[Tuple]]] = None
               ) -> Tuple[List[int], List[int]]:
        """One step's batch, ``keys[i]`` in batch position ``i`` (``None``: an empty position):
        free the rows of keys not in it and of stale identities, give every key without a row a
        free one. Returns ``(state row per position (-1: empty), rows to reset)``."""
        if len(keys) > self.rows:
            raise ValueError(f"keys: expected at most {self.rows} requests, got {len(keys)}")
        present = {k for k in keys if k is not None}
        self.release([k for k in self._row_of if k not in present])
        identities = list(identities) if identities is not None else [None] * len(keys)
        identities += [None] * (len(keys) - len(identities))
        self.release(self.stale(keys, identities))
        rows, fresh = [], []
        for key, ident in zip(keys, identities):
            if key is None:
                rows.append(-1)
                continue
            row = self._row_of.get(key)
            if row is None:
                row = self.admit(key)
                fresh.append(row)
            if ident is not None:
                self._identity_of[key] = tuple(ident[:2])
            rows.append(row)
        return rows, fresh
