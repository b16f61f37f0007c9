"""The host-LRU timing code is built with the op library (lab/host_lru.cpp), not compiled at run
time: with no C compiler reachable it still runs, from the op library, and agrees with its
pure-Python statement."""
import random

import numpy as np

from avsg import _ops
from avsg.lab.costmodel import host_lru


def test_runs_from_the_op_library_without_a_compiler(monkeypatch, tmp_path):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(host_lru, "_LIB", None)
    lib = host_lru._library()
    assert lib._name == _ops.LIBRARY_PATH
    assert not list(tmp_path.iterdir()), "something was written or compiled at run time"
    rng = random.Random(3)
    rows, S, K, max_pos = 3, 8, 4, 40
    lru = host_lru.HostLRU(rows, S, K, max_pos)
    slot_pos = [np.full(S, -1, np.int32) for _ in range(rows)]
    order = [np.arange(S, dtype=np.int32) for _ in range(rows)]
    for step in range(30):
        sel = np.array([rng.sample(range(max(0, step - 6), step + 6), K) for _ in range(rows)],
                       np.int32)
        valid = np.full(rows, step + 6, np.int32)
        lru.step(sel, valid)
        for r in range(rows):
            want = host_lru.reference_step(slot_pos[r], order[r], sel[r], int(valid[r]))
            assert np.array_equal(lru.slot_of[r], want), (step, r)
        assert np.array_equal(lru.slot_pos, np.stack(slot_pos))
