"""A seeded random soak of the AVSG plugin through vllm-ascend's model runner (project issue 40,
item 6), on the runner drive (vllm_ascend_runner_drive.py): the same real ``execute_model`` /
``_update_states`` / ``NPUInputBatch``, vLLM's own ``SchedulerOutput``, the drive's layers (three
target layers, one of them ``skip_topk``, and the MTP layer's draft pass) and stand-ins.

The scheduler here draws, every step: requests finishing (at the context limit, or at random:
finished or aborted, also while preempted), preemptions (one, some, or every running request:
then nothing may be left to schedule, a step with no forward), resumptions in random order (in
the step of the preemption, or later), arrivals (some under the id of a finished request, also
finished in the same step), running requests left unscheduled for a step, steps that admit
nothing (``hold``), graph padding; the runner's batch is reordered at random
(``InputBatch.swap_states`` where vLLM's ``_may_reorder_batch`` runs) besides its own condense;
MTP drafts are accepted or rejected at random (the drive's step); and the H2D copy of a layer
sometimes fails (``fault_rate``: ``offload.sparse_copy`` raises before or after moving the
bytes), which aborts the forward: the requests run the same positions again next step.

The check, in every layer of every forward, before attention runs: for every real token and
every position it selected, the bytes attention reads through its slot and block-table row equal
the host pool's current bytes at the position's host row (else ``StaleRead``), and those equal
the drive's true KV (else the write path is wrong); padding tokens get no slot. The drive then
checks every attention output, and the runner drive that after every step exactly that step's
scheduled requests hold a state row.

A *row-step* is one request's reads in one layer of one forward (``onload_topk_kv`` and the
attention of its tokens). Counts per run: ``SoakEngine.counts``.

Length: ``AVSG_SOAK_STEPS`` steps per run (default ``SHORT_STEPS``); with ``AVSG_SOAK_REPORT``
set to a folder, each run writes its counts there as ``plugin-<policy>.json``.
"""
import contextlib
import json
import os
import random
import time

import torch

import vllm_ascend_drive as drive
import vllm_ascend_runner_drive as runner_drive

T, R, BS, TOPK = drive.T, drive.R, drive.BS, drive.TOPK
SHORT_STEPS = 150
STEPS_ENV = "AVSG_SOAK_STEPS"
REPORT_ENV = "AVSG_SOAK_REPORT"
SEEDS = {"lifetime": 31, "reuse": 32, "lru": 33}


class StaleRead(AssertionError):
    """What attention reads through a slot is not the host's current KV of the selected
    position."""


class InjectedFault(RuntimeError):
    """The soak's failure of a layer's H2D copy (``fault_rate``)."""


_ENGINE = None          # the engine whose layer is running (the attention stand-in checks it)


def _checked_attention(cls, sfa_impl, ql_nope, q_pe, kv_cache, topk_indices, attn_metadata,
                       actual_seq_lengths_query, actual_seq_lengths_key, *, block_table=None,
                       sparse_mode=3, return_lse=False):
    """The drive's CPU attention, after the byte check of everything it is about to read."""
    if _ENGINE is not None:
        _ENGINE.check_reads(kv_cache, topk_indices, block_table)
    return drive.cpu_sparse_flash_attention(
        cls, sfa_impl, ql_nope, q_pe, kv_cache, topk_indices, attn_metadata,
        actual_seq_lengths_query, actual_seq_lengths_key, block_table=block_table,
        sparse_mode=sparse_mode, return_lse=return_lse)


class SoakEngine(runner_drive.RunnerEngine):
    def __init__(self, policy, seed, finish_rate=0.03, abort_waiting_rate=0.1,
                 preempt_rate=0.12, hold_rate=0.1, resume_rate=0.8, arrival_rate=0.5,
                 id_reuse=0.4, defer_rate=0.04, swap_rate=0.3, pad_rate=0.3,
                 fault_rate=0.03, check_rows=True):
        super().__init__(policy, seed)
        self.check_rows = check_rows
        self.fail_next_copy_of = None    # a layer name: its next H2D copy fails (one fault)
        self.policy = policy
        self.finish_rate, self.abort_waiting_rate = finish_rate, abort_waiting_rate
        self.preempt_rate, self.hold_rate, self.resume_rate = preempt_rate, hold_rate, resume_rate
        self.arrival_rate, self.id_reuse, self.defer_rate = arrival_rate, id_reuse, defer_rate
        self.swap_rate, self.pad_rate, self.fault_rate = swap_rate, pad_rate, fault_rate
        self.reusable = []           # ids of finished requests, free to take again
        self.empty_since = {}        # preempted request id -> empty steps since its preemption
        # the layer running now: (layer id, name, topk, token_positions, seq_t, meta, n_real),
        # what run_layer was given (check_reads and the faulty copy read it)
        self.layer = None
        self.counts = dict(
            steps=0, forwards=0, empty_steps=0, held=0, row_steps=0, tokens_checked=0,
            selections_checked=0, arrivals=0, id_reuses=0, finishes=0, aborted_waiting=0,
            preemptions=0, preempted_all=0, resumptions=0, resumed_same_step=0,
            resumed_after_empty_step=0, deferred=0,
            swaps=0, moves=0, drafts_offered=0, drafts_rejected=0, padded=0, faults=0)
        batch = self.runner.input_batch
        # vLLM's _update_states calls these on the runner's own batch: count what they do, and
        # reorder at random where an attention backend's reorder_batch would
        stock_condense = batch.condense

        def condense():
            before = list(batch._req_ids)
            stock_condense()
            self.counts["moves"] += sum(
                1 for i, rid in enumerate(batch._req_ids[:batch.num_reqs])
                if rid is not None and (i >= len(before) or before[i] != rid))
        batch.condense = condense
        self.runner._may_reorder_batch = self._reorder

    # ---- scheduler side
    def _reorder(self, scheduler_output):
        batch = self.runner.input_batch
        if batch.num_reqs >= 2 and self.rng.random() < self.swap_rate:
            a, b = self.rng.sample(range(batch.num_reqs), 2)
            batch.swap_states(a, b)
            self.counts["swaps"] += 1

    def _finish(self, req):
        self.finish(req.rid)
        self.reusable.append(req.rid)
        self.counts["finishes"] += 1

    def _abort_waiting(self, req):
        """A preempted request finishes (aborted) before it resumes: it holds no row."""
        self.waiting.remove(req)
        self.empty_since.pop(req.rid, None)
        self.truth.pop(req.rid, None)
        self.events["finished"].add(req.rid)
        self.reusable.append(req.rid)
        self.counts["aborted_waiting"] += 1

    def _arrive(self):
        rid = None
        if self.reusable and self.rng.random() < self.id_reuse:
            # a new request under a finished request's id (abort and resubmit), maybe the id of
            # one that finished in this very step
            rid = self.reusable.pop(self.rng.randrange(len(self.reusable)))
            self.counts["id_reuses"] += 1
        self.admit(rid)
        self.counts["arrivals"] += 1

    def soak_step(self):
        rng = self.rng
        for req in list(self.running):
            if req.n + 2 * T >= drive.MAX_LEN - BS or rng.random() < self.finish_rate:
                self._finish(req)
        if self.waiting and rng.random() < self.abort_waiting_rate:
            self._abort_waiting(rng.choice(self.waiting))
        preempted = []
        if self.running and rng.random() < self.preempt_rate:
            u = rng.random()
            if u < 0.3:
                preempted = list(self.running)       # all of them: nothing left to schedule
                self.counts["preempted_all"] += 1
            elif u < 0.5:
                preempted = rng.sample(self.running, rng.randint(1, len(self.running)))
            else:
                preempted = [rng.choice(self.running)]
            for req in preempted:
                self.preempt(req.rid)
                self.empty_since[req.rid] = 0
            self.counts["preemptions"] += len(preempted)
        # a preemption means no KV memory: often nothing is admitted in that step either
        if (preempted and rng.random() < 0.4) or rng.random() < self.hold_rate:
            self.counts["held"] += 1
        else:
            while self.waiting and len(self.running) < R and rng.random() < self.resume_rate:
                req = rng.choice(self.waiting)       # any order
                self.resume(req.rid)
                self.counts["resumptions"] += 1
                self.counts["resumed_same_step"] += req in preempted
                self.counts["resumed_after_empty_step"] += self.empty_since.pop(req.rid) > 0
            while len(self.running) < R and rng.random() < self.arrival_rate:
                self._arrive()
        # a running request the scheduler leaves out of this step (token budget): the runner
        # drops it from its batch; it comes back as a cached request, its KV intact
        deferred = [req for req in self.running if req.rid not in self.events["new"]
                    and req.rid not in self.events["resumed"] and rng.random() < self.defer_rate]
        for req in deferred:
            self.running.remove(req)
        self.counts["deferred"] += len(deferred)
        pad = rng.random() < self.pad_rate
        self.counts["padded"] += pad and 0 < len(self.running) < R
        if not self.running:
            self.counts["empty_steps"] += 1
            for rid in self.empty_since:
                self.empty_since[rid] += 1
        try:
            self.run_step(pad=pad)
        except InjectedFault:
            self.counts["faults"] += 1       # the forward is lost: the same positions next step
            self.steps += 1
        finally:
            self.running.extend(deferred)
        self.counts["steps"] += 1
        if self.check_rows:
            assert not self.row_faults, f"rows kept past their request's step: {self.row_faults}"

    # ---- the forward
    def step(self, pad_to=None, update_metadata=None):
        before = {id(r): r.n for r in self.batch}
        super().step(pad_to=pad_to, update_metadata=update_metadata)
        self.counts["forwards"] += 1
        for r in self.batch:
            self.counts["drafts_offered"] += T - 1
            self.counts["drafts_rejected"] += T - (r.n - before[id(r)])

    def run_layer(self, layer_id, name, new_kv, slots, meta, topk, q, cum_q, seq_t, n_real,
                  token_positions):
        self.layer = (layer_id, name, topk, token_positions, seq_t, meta, n_real)
        super().run_layer(layer_id, name, new_kv, slots, meta, topk, q, cum_q, seq_t, n_real,
                          token_positions)
        self.counts["row_steps"] += len({id(r) for r, _ in token_positions})

    def check_reads(self, kv_cache, sparse_indices, block_table):
        """Every real token's reads (what the attention op is given) against the host pool's
        current KV, byte for byte (module docstring)."""
        layer_id, name, topk, token_positions, seq_t, meta, n_real = self.layer
        where = f"step {self.steps} layer {name}"
        slots = sparse_indices[:, 0].to(torch.int64)                 # [n, K] slot, -1 = none
        assert bool((slots[n_real:] == -1).all()), f"{where}: a padding token got a slot"
        token_req = meta.token_to_req[:n_real].to(torch.int64)        # batch index per token
        limit = seq_t.to(torch.int64)[token_req][:, None]
        sel = topk[:n_real, 0].to(torch.int64)
        sel = torch.where((sel >= 0) & (sel < limit), sel, -1)
        # the selections in the order the slots come in: valid first, order kept
        want = sel.gather(1, torch.sort((sel < 0).to(torch.int8), dim=1, stable=True).indices)
        valid = want >= 0
        assert torch.equal(slots[:n_real] >= 0, valid), f"{where}: valid slots first, then -1"
        i, k = valid.nonzero(as_tuple=True)
        slot, pos = slots[i, k], want[i, k]
        pages = block_table.to(torch.int64)[i, slot // BS]
        host_block = self.block_table().to(torch.int64)[token_req[i], pos // BS]
        reqs = [token_positions[t][0] for t in i.tolist()]
        truth = torch.stack([self.truth[r.rid][layer_id, p] for r, p in zip(reqs, pos.tolist())]) \
            if reqs else torch.zeros(0, drive.DK + drive.DV, dtype=torch.bfloat16)
        cache_parts = (kv_cache[0], kv_cache[1])
        pool_parts = self.pool[layer_id]
        widths = ((0, drive.DK), (drive.DK, drive.DK + drive.DV))
        for part, (cache, pool, (lo, hi)) in enumerate(zip(cache_parts, pool_parts, widths)):
            read = cache[pages, slot % BS, 0]
            host = pool[host_block, pos % BS, 0]
            if not _same(host, truth[:, lo:hi]):
                e = int(_differ(host, truth[:, lo:hi]).nonzero()[0, 0])
                raise AssertionError(f"{where} part {part}: the host pool's bytes of "
                                     f"{reqs[e].rid}@{int(pos[e])} differ from its true KV: the "
                                     f"write path, not residency")
            if not _same(read, host):
                e = int(_differ(read, host).nonzero()[0, 0])
                rid = reqs[e].rid
                raise StaleRead(
                    f"stale read, {where} part {part} token {int(i[e])}: request {rid} (state "
                    f"row {self.manager.state_row_of(rid)}) selected pos {int(pos[e])} (host row "
                    f"{int(host_block[e]) * BS + int(pos[e]) % BS}); slot {int(slot[e])} holds "
                    f"other bytes; policy {self.policy}")
        self.counts["tokens_checked"] += n_real
        self.counts["selections_checked"] += int(valid.sum())

    # ---- injected faults
    def _faulty_sparse_copy(self, stock):
        """``offload.sparse_copy`` failing now and then for a layer's H2D (not the D2H of new
        KV): before any byte moves, or after the bytes landed; in any layer, a ``skip_topk``
        one included (it copies a plan its group's first layer already marked copied:
        test_skip_layer_copy_failure_is_dropped in vllm_ascend_drive.py)."""
        def sparse_copy(src, dst, lengths, size, device):
            name = self.layer[1] if self.layer else None
            if src is self.manager.h2d_src_npu and name == self.fail_next_copy_of:
                self.fail_next_copy_of = None
                raise InjectedFault(f"injected: the H2D copy of {name} failed")
            if src is self.manager.h2d_src_npu and self.rng.random() < self.fault_rate:
                if self.rng.random() < 0.5:
                    stock(src, dst, lengths, size, device)
                raise InjectedFault(f"injected: the H2D copy of {name} failed, step {self.steps}")
            return stock(src, dst, lengths, size, device)
        return sparse_copy


def _same(a, b):
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def _differ(a, b):
    return (a.contiguous().view(torch.uint8) != b.contiguous().view(torch.uint8)).any(-1)


def steps_from_env():
    return int(os.environ.get(STEPS_ENV, SHORT_STEPS))


@contextlib.contextmanager
def installed(engine):
    """The byte check before attention, the faulty copy, one intra-op thread (tiny ops: threads
    only add wake-ups on a shared machine); all undone after."""
    global _ENGINE
    op = drive.DeviceOperator
    saved_op = op.__dict__["execute_sparse_flash_attention_process"]
    op.execute_sparse_flash_attention_process = classmethod(_checked_attention)
    drive.OFFLOAD.sparse_copy = engine._faulty_sparse_copy(
        type(drive.OFFLOAD).sparse_copy.__get__(drive.OFFLOAD))
    _ENGINE = engine
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield engine
    finally:
        _ENGINE = None
        del drive.OFFLOAD.sparse_copy                     # the class's again
        op.execute_sparse_flash_attention_process = saved_op
        torch.set_num_threads(threads)


def run_soak(policy, steps=None, seed=None, **rates):
    """One seeded soak of ``steps`` scheduler steps; returns the engine (its ``counts``)."""
    steps = steps_from_env() if steps is None else steps
    seed = SEEDS[policy] if seed is None else seed
    engine = SoakEngine(policy, seed, **rates)
    assert engine.manager.avsg_options["policy"] == policy
    start = time.time()
    with installed(engine):
        for _ in range(steps):
            engine.soak_step()
    engine.seconds = time.time() - start
    report = os.environ.get(REPORT_ENV)
    if report:
        os.makedirs(report, exist_ok=True)
        with open(os.path.join(report, f"plugin-{policy}.json"), "w") as f:
            json.dump({"policy": policy, "seed": seed, "steps": steps,
                       "seconds": round(engine.seconds, 1), **engine.counts}, f)
    return engine


def check_coverage(engine):
    """Every event the soak is meant to cover happened, and hits made the byte checks matter
    (a run without hits would pass whatever residency did)."""
    c = engine.counts
    for event in ("empty_steps", "held", "id_reuses", "finishes", "aborted_waiting",
                  "preemptions", "preempted_all", "resumptions", "resumed_same_step",
                  "resumed_after_empty_step", "deferred",
                  "swaps", "moves", "drafts_rejected", "padded", "faults", "row_steps"):
        assert c[event] > 0, (event, c)
    assert c["drafts_rejected"] < c["drafts_offered"]
    hits = sum(buf.stats()["hits"] for buf in engine.manager.avsg_buffers)
    assert hits > c["selections_checked"] // 4, (hits, c)


# ----------------------------------------------------------------------------- broken variants
# Each must make the short soak fail with a stale read (vllm_ascend_drive.py's tests).
def break_reset(monkeypatch):
    """No reset of a row a request gets (begin_step's ``reset(fresh)``): a resumed request, or a
    new one under a used id or in a used row, keeps the row's old residency."""
    from avsg.buffer import SparseKVBuffer
    stock = SparseKVBuffer.reset
    # construction still initialises the state; only the per-request resets are dropped
    monkeypatch.setattr(SparseKVBuffer, "reset",
                        lambda self, rows=None: stock(self) if rows is None else None)


def break_scheduler_hook(monkeypatch):
    """No release of rows on the scheduler step (issue 40's bug): a request preempted in a step
    with no forward keeps its row and, resumed, reads its pre-preemption KV."""
    cls = drive.vam.SparseKVOffloadManager
    monkeypatch.setattr(cls, "apply_scheduler_output", lambda self, scheduler_output: None)


def break_invalidate(monkeypatch):
    """The per-layer invalidate drops nothing: rejected drafts' positions stay resident."""
    from avsg.buffer import SparseKVBuffer
    stock = SparseKVBuffer.step
    monkeypatch.setattr(SparseKVBuffer, "invalidate", lambda self, valid_lens: None)
    # the drop runs inside the layer's one buffer call
    monkeypatch.setattr(SparseKVBuffer, "step",
                        lambda self, topk_pos, seq_lens, copy, drop_from=None:
                        stock(self, topk_pos, seq_lens, copy))


def break_uncopied(monkeypatch):
    """A plan whose copy never ran keeps its misses resident (the faults leave some)."""
    from avsg.buffer import SparseKVBuffer
    monkeypatch.setattr(SparseKVBuffer, "_drop_uncopied", lambda self: None)


def break_discard(monkeypatch):
    """A failed copy is not discarded (``SparseKVBuffer.discard`` a no-op): when the copy into
    a ``skip_topk`` layer fails after its group's first layer copied the plan and marked it
    copied, that layer's reserved slots stay resident unfilled."""
    from avsg.buffer import SparseKVBuffer
    monkeypatch.setattr(SparseKVBuffer, "discard", lambda self, plan: None)


BROKEN = {f.__name__[len("break_"):]: f for f in (break_reset, break_scheduler_hook,
                                                  break_invalidate, break_uncopied,
                                                  break_discard)}


def run_broken(variant, monkeypatch, steps=SHORT_STEPS):
    """The short soak of test_runner_soak[reuse] (same seed, same rates, so it passes unbroken)
    under a broken variant: raises, StaleRead if the soak does its job."""
    BROKEN[variant](monkeypatch)
    # the runner drive's row check would stop the scheduler_hook variant first (a row kept past
    # its request's step); without it the soak shows what attention then reads
    run_soak("reuse", steps=steps, check_rows=variant != "scheduler_hook")


# ----------------------------------------------------------------------------- found here
def skip_layer_copy_failure(policy):
    """One request, two forwards. In the first, the H2D copy into the ``skip_topk`` layer's
    buffer fails after the group's first layer copied the same plan and marked it copied; the
    engine drops that forward and runs the next. Unless the plugin discards the plan when a
    layer's copy fails, layer 0's state counts those positions as resident and layer 1, reusing
    layer 0's plan, reads slots no copy filled: StaleRead in layer 1."""
    engine = SoakEngine(policy, seed=0, fault_rate=0.0)
    with installed(engine):
        engine.admit()
        engine.fail_next_copy_of = "model.layers.1.self_attn.attn"
        try:
            engine.run_step()
        except InjectedFault:
            engine.steps += 1
        else:
            raise AssertionError("the injected copy failure did not happen")
        engine.run_step()
