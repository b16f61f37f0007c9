"""The serving soak (project issue 40, item 6): seeded engine-like runs of the serving manager
(``SparseOffloadManager``, driven by tests/helpers/engine_harness.py) and of the vllm-ascend
plugin (through vllm-ascend's own model runner, vllm_ascend_session/vllm_ascend_runner_soak.py),
with requests arriving and leaving, preemption with and without an empty step, resumptions in
any order, request ids used again, prompts longer than T (bypassing the buffer), MTP drafts
rejected at random, row swaps and condensing, several layers, all three policies, and copies
failing between plan and gather; after every retrieve, every selected position's bytes are
checked against the host's current KV.

Here: the manager's short soak per policy, and each deliberately broken variant failing it with a
stale read (so the soak can fail). The plugin's short soak and its broken variants run in the
vllm-ascend session (test_vllm_ascend.py collects vllm_ascend_drive.py, whose tests call the
soak module). ``-m slow``: the long run of both (docs/testing.md, "Serving soak"), lengths from
``AVSG_SOAK_MANAGER_STEPS`` / ``AVSG_SOAK_STEPS``, counts written to ``AVSG_SOAK_REPORT`` (a
folder) when set.
"""
import json
import os
import subprocess
import sys
import time

import pytest

from helpers.engine_harness import EngineHarness, StaleRead

POLICIES = ["lifetime", "reuse", "lru"]
SHORT_STEPS = 600
LONG_MANAGER_STEPS = 40_000      # per policy: about 475,000 row-steps each (docs/testing.md)
LONG_PLUGIN_STEPS = 12_000       # per policy: about 160,000 row-steps each

# Every lifecycle event at once. Rates are per step (preempt_rate, arrival_rate, hold_rate,
# abort_rate; dummy_rate: of empty steps), per retrieve (fault_rate) or per row and pass
# (defer_rate); preempt_many / preempt_all / preempt_hold: of preemptions; id_reuse: of
# arrivals; prefix_hit: of admissions (engine_harness.py says what each does).
SOAK = dict(rows=6, layers=3, num_requests=6, prompt_range=(1, 96), preempt_rate=0.08,
            preempt_many=0.3, preempt_all=0.4, preempt_hold=0.6, shuffle_resumes=True,
            arrival_rate=0.4, id_reuse=0.5, prefix_hit=0.5, hold_rate=0.05, abort_rate=0.03,
            defer_rate=0.03, swap_free=0.1, dummy_rate=0.5, fault_rate=0.02)
# per policy, the other manager options varied too (write-through or host reads, automatic or
# explicit invalidation, packed fp8 rows, unchecked NPU defaults)
RUNS = {
    "lifetime": dict(seed=21),
    "reuse": dict(seed=22, write_through=False, auto_invalidate=False),
    "lru": dict(seed=23, kv_format="fp8", latent_dim=128, rope_dim=16, check=False,
                resident_block_size=32),
}
COVERED = ("row_steps", "selections_checked", "bypassed", "short_chunks", "moves", "swaps",
           "preemptions", "resumptions", "resumed_same_step", "resumed_after_empty_step",
           "drafts_rejected", "empty_steps", "dummy_passes", "held",
           "arrivals", "id_reuses", "prefix_hits", "aborts", "deferred", "faults_skip",
           "faults_fail", "faults_after")


def soak(policy, steps, **overrides):
    harness = EngineHarness(policy=policy, **{**SOAK, **RUNS[policy], **overrides})
    start = time.time()
    harness.run(steps)
    harness.seconds = time.time() - start
    return harness


def _report(name, counts):
    folder = os.environ.get("AVSG_SOAK_REPORT")
    if folder:
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, f"{name}.json"), "w") as f:
            json.dump(counts, f)


@pytest.mark.parametrize("policy", POLICIES)
def test_manager_soak(policy):
    h = soak(policy, SHORT_STEPS)
    c = h.counts
    assert h.steps == SHORT_STEPS
    for event in COVERED:
        assert c[event] > 0, (event, c)
    assert c["drafts_rejected"] < c["drafts_offered"]
    # hits are what a stale read would come from: without them the byte checks prove nothing
    assert 0.3 < h.mgr.hit_rate() < 1.0, h.mgr.hit_rate()


# Each broken variant runs the lifetime soak above (same seed, same rates: it passes unbroken)
# and must fail it with a stale read.
def _no_row_reset(monkeypatch):
    """(a) ``add`` resets nothing: a resumed request, or a new one in a used row, keeps the
    row's old residency (caught through prefix hits: a first pass past position 0 drops only
    what it rewrites)."""
    from avsg.buffer import SparseKVBuffer
    stock = SparseKVBuffer.reset
    # construction still initialises the state; only the per-row resets are dropped
    monkeypatch.setattr(SparseKVBuffer, "reset",
                        lambda self, rows=None: stock(self) if rows is None else None)


def _no_invalidate(monkeypatch):
    """(b) The manager's invalidate launch drops nothing: rejected drafts (and what bypassing
    passes rewrote) stay resident."""
    from avsg.buffer import SparseKVBuffer
    stock = SparseKVBuffer.step
    monkeypatch.setattr(SparseKVBuffer, "invalidate", lambda self, valid_lens: None)
    monkeypatch.setattr(SparseKVBuffer, "step",
                        lambda self, topk_pos, seq_lens, copy, drop_from=None:
                        stock(self, topk_pos, seq_lens, copy))


def _uncopied_stays(monkeypatch):
    """(c) A plan whose gather never ran (or failed) keeps its misses resident: the soak's
    injected faults leave such plans."""
    from avsg.buffer import SparseKVBuffer
    monkeypatch.setattr(SparseKVBuffer, "_drop_uncopied", lambda self: None)


@pytest.mark.parametrize("broken", [_no_row_reset, _no_invalidate, _uncopied_stays],
                         ids=["no-reset", "no-invalidate", "uncopied-stays"])
def test_manager_soak_catches_a_broken_variant(broken, monkeypatch):
    broken(monkeypatch)
    with pytest.raises(StaleRead):
        soak("lifetime", SHORT_STEPS)


def test_the_uncopied_variant_needs_the_faults(monkeypatch):
    """(c) is caught through the injected faults, not something else: without them the broken
    buffer passes the same soak."""
    _uncopied_stays(monkeypatch)
    soak("lifetime", SHORT_STEPS, fault_rate=0.0)


# ----------------------------------------------------------------------------- the long run
@pytest.mark.slow
@pytest.mark.parametrize("policy", POLICIES)
def test_manager_soak_long(policy):
    steps = int(os.environ.get("AVSG_SOAK_MANAGER_STEPS", LONG_MANAGER_STEPS))
    h = soak(policy, steps)
    counts = {"policy": policy, "steps": h.steps, "seconds": round(h.seconds, 1),
              "hit_rate": round(h.mgr.hit_rate(), 4), **h.counts}
    print(f"\nmanager soak {policy}: {counts}")
    _report(f"manager-{policy}", counts)
    assert h.steps == steps
    for event in COVERED:
        assert h.counts[event] > 0, event


@pytest.mark.slow
def test_plugin_soak_long(tmp_path):
    """The plugin's soak in the vllm-ascend session (as test_vllm_ascend.py runs it), each
    policy for ``AVSG_SOAK_STEPS`` steps."""
    import test_vllm_ascend as session
    from helpers import third_party
    (tree,) = third_party.require("vllm-ascend", required_by=session.REQUIRED_BY)
    steps = os.environ.get("AVSG_SOAK_STEPS", str(LONG_PLUGIN_STEPS))
    report = os.environ.get("AVSG_SOAK_REPORT") or str(tmp_path / "report")
    env = session._env(tree, tmp_path / "dist", switch=True)
    env.update(AVSG_SOAK_STEPS=steps, AVSG_SOAK_REPORT=report)
    work = tmp_path / "work"
    work.mkdir()
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
           "avsg_vllm_hook", "-o", "addopts=", "--rootdir", str(tree),
           str(session.SESSION / "vllm_ascend_drive.py"), "-k", "test_runner_soak and not broken"]
    proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    for policy in POLICIES:
        with open(os.path.join(report, f"plugin-{policy}.json")) as f:
            counts = json.load(f)
        print(f"\nplugin soak {policy}: {counts}")
        assert counts["steps"] == int(steps)
