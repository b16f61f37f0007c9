"""The manager driven like vLLM's model runner (engine_harness.py): hundreds of steps with
flattened uneven batches, compaction, preemption and resumption, MTP with acceptance, prefill
chunks bypassing the buffer; every read through the returned slots equals the host's current KV
(and the host pool the engine's own copy of it). The serving soak (test_serving_soak.py) adds the
rest of a scheduler's events on the same harness."""
import pytest

from helpers.engine_harness import EngineHarness, StaleRead


def _run(steps, **kwargs):
    harness = EngineHarness(**kwargs)
    harness.run(steps)
    return harness


def test_engine_loop_reads_the_full_cache_bit_for_bit():
    h = _run(400, seed=1)
    c = h.counts
    assert h.steps == 400
    assert c["tokens_checked"] > 4000
    # every lifecycle event the loop is meant to cover happened
    for event in ("moves", "swaps", "preemptions", "resumptions", "drafts_rejected", "bypassed",
                  "short_chunks"):
        assert c[event] > 0, event
    assert c["drafts_rejected"] < c["drafts_offered"]
    assert len(h.finished) > 20
    assert 0.5 < h.mgr.hit_rate() < 1.0
    # each pass selects its own newest position: written through, never fetched from the host
    assert int(h.mgr.write_through_rows) >= c["tokens_checked"] // 2
    assert int(h.mgr.h2d_rows) > 0


@pytest.mark.parametrize("variant", [
    dict(auto_invalidate=False),                          # the engine invalidates explicitly
    dict(write_through=False),                            # fresh KV fetched from the host
    dict(kv_format="fp8", latent_dim=128, rope_dim=16),   # one packed row per token
    dict(check=False, resident_block_size=32, seed=5),    # NPU defaults; two pages per row
], ids=["explicit-invalidate", "no-write-through", "fp8-packed", "unchecked"])
def test_engine_loop_variants(variant):
    h = _run(150, **{"seed": 2, **variant})
    assert h.counts["tokens_checked"] > 1000
    if variant.get("write_through") is False:
        assert int(h.mgr.write_through_rows) == 0


def test_explicit_invalidate_is_needed_without_the_automatic_one():
    """The harness catches stale drafts: with neither invalidation, a rewritten position is
    served from its old speculative copy."""
    h = EngineHarness(seed=3, auto_invalidate=False)
    h.mgr.invalidate = lambda *args, **kwargs: None
    with pytest.raises(StaleRead):
        h.run(200)


@pytest.mark.strict_kernels
def test_engine_loop_under_the_strict_emulation():
    h = _run(25, seed=4)
    assert h.counts["tokens_checked"] > 100


@pytest.mark.slow
@pytest.mark.parametrize("seed", [11, 12, 13])
def test_engine_loop_soak(seed):
    h = _run(2500, seed=seed, num_requests=400, rows=6, token_budget=64)
    assert h.steps > 2000 and h.counts["preemptions"] > 20
