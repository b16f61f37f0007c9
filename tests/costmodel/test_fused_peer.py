"""vllm-ascend's fused path in the decode model: the replay of its selection cache against a plain
statement of the kernel's semantics (and hand-checked cases), the two-pointer merge's closed form
against the loop, the counted-work matching (direct map up to 16,376 tokens, sorts above), and
the path's place in the projection (no launches, copies overlapped, memory per card)."""
import numpy as np
import pytest

from avsg.lab.costmodel import fused, hardware, projection
from avsg.lab.costmodel import traffic as copy_traffic
from avsg.model_config import from_hf_config

CONFIG = from_hf_config(projection.V32_CONFIG)


def _loop_merge_steps(cur, status):
    """FindSelectionTopkHit's loop as the kernel writes it (descending order), counting turns."""
    a, b = sorted(cur, reverse=True), sorted(status, reverse=True)
    i = j = turns = 0
    while i < len(a) and j < len(b):
        turns += 1
        if a[i] < 0 or b[j] < 0:
            break
        if a[i] == b[j]:
            i, j = i + 1, j + 1
        elif a[i] > b[j]:
            i += 1
        else:
            j += 1
    return turns


def test_hand_checked_steps():
    """K = 4: misses fill the lowest free slots in top-k order; hits stay where they are."""
    cache = fused.SelectionCache(1, 4)
    ref = [-1] * 4
    first = cache.step(np.array([[10, 3, 7, 5]]))
    assert first.misses.tolist() == [4] and cache.status[0].tolist() == [10, 3, 7, 5]
    assert fused.reference_step(ref, [10, 3, 7, 5]) == {"misses": 4, "slots": [0, 1, 2, 3]}
    # 3 and 5 stay in slots 1 and 3; 9 then 2 take slots 0 and 2 (the free ones, ascending)
    second = cache.step(np.array([[9, 5, 3, 2]]))
    assert second.misses.tolist() == [2] and cache.status[0].tolist() == [9, 3, 2, 5]
    assert fused.reference_step(ref, [9, 5, 3, 2]) == {"misses": 2, "slots": [0, 3, 1, 2]}
    assert ref == [9, 3, 2, 5]
    # the same top-k in slot order: the kernel's "same" fast path, nothing copied
    third = cache.step(np.array([[9, 3, 2, 5]]))
    assert third.same.tolist() == [True] and third.misses.tolist() == [0]
    assert third.probe.tolist() == [4]
    # the scan reads up to the last free slot: here slot 1 (3 dropped for 8)
    fourth = cache.step(np.array([[9, 8, 2, 5]]))
    assert fourth.misses.tolist() == [1] and fourth.scan.tolist() == [2]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_replay_matches_the_statement_on_random_and_adversarial_steps(seed):
    """Rows of MTP query tokens over many steps: random top-k, repeated ones, reordered repeats,
    sliding windows and disjoint ones; positions above and below 16,376 (the replay does not
    depend on the matching path, the cost does)."""
    rng = np.random.default_rng(seed)
    rows, k = 6, 24
    cache = fused.SelectionCache(rows, k)
    ref = [[-1] * k for _ in range(rows)]
    prev = None
    for step in range(60):
        span = 40 if step % 2 else 40_000              # few distinct positions, or many
        kind = step % 5
        if kind == 0 or prev is None:
            topk = np.stack([rng.choice(span, k, replace=False) for _ in range(rows)])
        elif kind == 1:
            topk = prev.copy()                             # a repeat
        elif kind == 2:
            topk = prev[:, rng.permutation(k)]             # the same set, reordered
        elif kind == 3:
            topk = np.sort(prev, axis=1) + 1               # a window sliding by one
        else:
            topk = np.stack([50_000 + rng.choice(span, k, replace=False)   # disjoint, far
                             for _ in range(rows)])
        before = [list(r) for r in ref]
        got = cache.step(topk)
        for r in range(rows):
            want = fused.reference_step(ref[r], topk[r].tolist())
            assert got.misses[r] == want["misses"]
            assert cache.status[r].tolist() == ref[r]
            assert got.merge_steps[r] == _loop_merge_steps(topk[r].tolist(), before[r])
            assert got.same[r] == (topk[r].tolist() == before[r])
            assert sorted(ref[r]) == sorted(topk[r].tolist())     # it holds exactly its top-k
        prev = topk


def test_merge_steps_closed_form_on_partly_empty_rows():
    rng = np.random.default_rng(5)
    for _ in range(200):
        k = int(rng.integers(1, 12))
        cur = rng.choice(30, k, replace=False)
        status = np.full(k, -1)
        held = int(rng.integers(0, k + 1))
        status[:held] = rng.choice(30, held, replace=False)
        got = fused.merge_steps(np.sort(cur)[None, ::-1], -np.sort(-status)[None])
        assert got[0] == _loop_merge_steps(cur.tolist(), status.tolist())


def test_bad_top_k_is_refused():
    cache = fused.SelectionCache(2, 3)
    with pytest.raises(ValueError, match="unique"):
        cache.step(np.array([[1, 1, 2], [3, 4, 5]]))
    with pytest.raises(ValueError, match=">= 0"):
        cache.step(np.array([[-1, 1, 2], [3, 4, 5]]))
    with pytest.raises(ValueError, match="expected"):
        cache.step(np.array([[1, 2, 3]]))


def test_stale_hits_count_bytes_rewritten_after_their_copy():
    """A rejected draft's position copied in iteration 0, rewritten in iteration 1 and hit in
    iteration 2 is a stale hit (the kernel copies nothing for it)."""
    cache = fused.SelectionCache(1, 2)
    last_write = np.full(100, -1)
    last_write[50] = 0
    cache.step(np.array([[50, 10]]), last_write, 0)
    last_write[50] = 1                                      # the next pass rewrote position 50
    cache.step(np.array([[50, 11]]), last_write, 1)
    assert cache.step(np.array([[50, 12]]), last_write, 2).stale_hits.tolist() == [1]


def _summary(misses, share=1.0, regime=None):
    regime = regime or ("large" if misses > fused.SYNC_COPY_THRESHOLD else
                        "small" if misses else "all_hit")
    out = {g: {"share": 0.0, "misses": 0.0, "merge_steps": 0.0, "scan": 0.0, "probe": 1.0,
               "stale_hits": 0.0} for g in fused.REGIMES}
    out[regime] = {"share": share, "misses": float(misses), "merge_steps": 4096.0 - misses,
                   "scan": 2048.0 if misses else 0.0, "probe": 1.0, "stale_hits": 0.0}
    return out


def test_matching_cost_direct_map_below_16376_sorts_above():
    hw = hardware.load_profile()
    def us(m, ctx, slots=2048):
        return fused.matching_us(_summary(m), hw, ctx, 2048, slots)
    for m in (0, 30, 300):
        assert us(m, 8192)["us_per_row"] < us(m, 32768)["us_per_row"]      # no sorts
        assert us(m, 32768)["us_per_row"] == pytest.approx(us(m, 131072)["us_per_row"])
    assert us(300, 32768)["us_per_row"] < us(300, 32768, 4096)["us_per_row"]   # a longer sort
    # more misses, more scalar work on the map path (on the sorted path a hit costs the merge
    # about what a miss costs the walk)
    assert us(100, 8192)["us_per_row"] < us(600, 8192)["us_per_row"]
    # up to 64 misses above the map's reach are copied while matching, each waiting for its
    # host read; with the map kept in UB they go to MergeKv with the rest
    small = us(30, 32768)
    assert small["sync_rows"] == 30 and small["deferred_rows"] == 0
    assert small["us_per_row"] > 30 * hw["host_dma_latency_s"] * 1e6
    kept = us(30, 8192)
    assert kept["sync_rows"] == 0 and kept["deferred_rows"] == 30
    assert us(300, 32768)["deferred_rows"] == 300 and us(300, 32768)["sync_rows"] == 0


def _traffic(drafts=0):
    L = 3
    summary = {"fused-2048": _summary(500), "fused-4096": _summary(200)}
    return copy_traffic.Traffic(drafts, 0.0, 1.0 + drafts * 0.5, 8192, 4096,
                                {"offload": [2048.0] * L, "lru-host": [200.0] * L,
                                 "lru-device": [150.0] * L, "slotmap-device": [160.0] * L,
                                 "fused-2048": [500.0] * L, "fused-4096": [200.0] * L,
                                 "avsg": [140.0] * L}, "test", summary)


def _costs():
    from avsg.lab.costmodel import plan_cost
    return plan_cost.Costs({m: {T: 50.0 * T for T in range(1, 5)}
                            for m in ("avsg", "lru-device", "slotmap-device")}, 30.0, "test")


def test_projection_prices_launches_and_overlaps_the_fused_copies():
    hw = hardware.load_profile()
    hw.override("hbm_bytes", 1e15, "test: no memory limit")
    tr, costs = _traffic(), _costs()
    free = projection.project(CONFIG, hw, tr, costs, 1, 32768, 32, launch_s=0.0)
    paid = projection.project(CONFIG, hw, tr, costs, 1, 32768, 32, launch_s=10e-6)
    L = CONFIG.num_hidden_layers
    for mode, r in paid.items():
        if mode in projection.SPLIT_MODES:
            continue        # the rule weighs the launch cost: tests/costmodel/test_split_price.py
        n = projection.launches_per_layer(mode)
        assert r["launches_per_layer"] == n
        assert r["step_s"] - free[mode]["step_s"] == pytest.approx(L * n * 10e-6)
    assert paid["fused-2048"]["step_s"] == free["fused-2048"]["step_s"]
    # the fused copy overlaps attention: the layer pays max(copy, attention), not their sum
    fmt = projection.kv_format(hw)
    _, mla_s = projection._compute_layer_s(CONFIG, hw, fmt, 1, 1, 32768, 32)
    for rows in (5.0, 500.0, 5000.0):
        t = copy_traffic.Traffic(**{**tr.__dict__, "rows": {**tr.rows, "fused-2048": [rows] * 3}})
        r = projection.project(CONFIG, hw, t, costs, 1, 32768, 32, launch_s=0.0)["fused-2048"]
        link = projection._link_s(hw, rows, fmt.row_bytes, dmas_per_row=2)
        assert r["copy_s"] == pytest.approx(L * max(0.0, link - mla_s))
        assert r["step_s"] == pytest.approx(r["compute_s"] + r["match_s"] + r["copy_s"])
    assert mla_s > projection._link_s(hw, 5.0, fmt.row_bytes, 2)      # the small copy hides


def test_fused_memory_per_card_is_per_query_token():
    hw = hardware.load_profile()
    L = CONFIG.num_hidden_layers + CONFIG.num_nextn_predict_layers
    for mode, slots in (("fused-2048", 2048), ("fused-4096", 4096)):
        for T in (1, 4):
            m = projection.memory_per_card(CONFIG, hw, mode, 3, 32768, T, 8192, 4096, 32)
            assert m["kv_buffers"] == 3 * L * T * (slots * (1152 + 4) + 4 + 2 * 16400)
