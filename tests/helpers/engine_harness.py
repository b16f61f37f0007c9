"""A model runner double that drives ``SparseOffloadManager`` the way vLLM's drives its attention
backends, and checks every read against the host pool.

Per scheduler step, like vLLM v1's ``GPUModelRunner`` with a persistent ``InputBatch``:

* scheduling: requests arrive (``arrival_rate``; an arriving request may take the id of a
  finished one, ``id_reuse``) and wait; waiting requests take free batch rows (``add``), unless
  the step holds admission (``hold_rate``, or ``preempt_hold`` in a step that preempted: no KV
  memory this step); finished or aborted requests
  leave (``free``, ``abort_rate``); holes are filled by ``condense``, moving the last rows down
  (``move_row``); rows are sometimes reordered (``swap_rows``, as ``reorder_batch`` puts decodes
  first; ``swap_free`` swaps a request into a free row, leaving a hole for one pass); running
  requests are preempted (``free``: one, some, or all of them, ``preempt_many``/``preempt_all``)
  and later resumed from scratch in whatever row is free (a cold start: KV recomputed, i.e.
  rewritten with new bytes, into freshly allocated host blocks), at once or after other steps, in
  queue order or not (``shuffle_resumes``). A step that schedules no token runs no pass (an empty
  step: its lifecycle calls only), or sometimes a pass whose every token is padding
  (``dummy_rate``: a data-parallel rank's dummy batch);
* an admitted request may find a prefix of its prompt's KV already in the host pool
  (``prefix_hit``: a prefix-cache hit, or a PD decode node receiving the prompt's KV), written
  there without any pass of this engine; its first pass then starts past position 0, so nothing
  but the reset in ``add`` keeps the row's earlier residency from being hit;
* tokens are flattened: request ``i`` = batch row ``i`` owns ``[qsl[i], qsl[i+1])``. A decode
  request carries ``1 + d`` tokens (``d`` MTP drafts, ``0 <= d <= n``: some steps none), a
  prefilling request a chunk of up to ``chunk`` tokens (longer than ``1 + n``: it bypasses the
  buffer), a deferred request none (``defer_rate``: it keeps its row and state through the pass),
  and the token count is padded to a fixed budget; ``num_reqs`` is sometimes padded too;
* every token's KV is written to the host pool through the engine's slot mapping (fresh random
  bytes each write, so a rewritten position really changes), then each layer selects a causal
  top-k per token (recent positions, a per-request hot set that makes hits, random others, ``-1``
  padding, sometimes ``-1`` in the middle) and calls ``retrieve``, which sometimes fails between
  its plan and its gather (``fault_rate``, ``InjectedFault``): the engine then drops the pass,
  accepting nothing, and runs its requests again;
* MTP acceptance: ``a`` of the ``d`` drafts are accepted; rejected positions are rewritten by the
  next step (the manager's automatic stable-prefix invalidation, or an explicit ``invalidate``).

The check, after every ``retrieve``, for every token it planned and every position the token
selected: the bytes attention reads through the returned slot and the resident block table equal
the host pool's current bytes at that position's host row (else ``StaleRead``), and the host
pool's bytes equal a logical full cache kept independently of the pool and its block tables (else
the write path is wrong). Tokens it did not plan (bypassed, padding) get no slot.

Three index spaces, named as in the manager: ``pos`` is a request-relative token position (what
the top-k selects), a *host row* is ``block * block_size + offset`` in the host pool (the slot
mapping), a ``slot`` is a row of a device buffer (what ``retrieve`` returns).

A *row-step* (``counts["row_steps"]``) is one request's retrieve in one layer of one pass: a
batch row the pass buffered (1..T tokens), planned and checked by that layer's ``retrieve``.
"""
from __future__ import annotations

import contextlib
import dataclasses
import random
from typing import Dict, List, Optional

import torch

from avsg import buffer as avsg_buffer
from avsg import reference
from avsg.cache import SparseOffloadManager


class StaleRead(AssertionError):
    """What attention reads through a retrieve's slot is not the host's current KV of the
    position the token selected: a resident copy outlived the KV it was copied from, or a slot no
    copy filled counted as resident."""


class InjectedFault(RuntimeError):
    """The harness's failure between a layer's plan and its gather (``fault_rate``)."""


# How a copy fails: "skip", the gather is never launched (the buffer's next call must drop the
# plan's reserved misses); "fail", the copy itself raises (gather drops them at once); "after",
# the bytes land and then an error is raised (dropping them only costs misses).
FAULT_MODES = ("skip", "fail", "after")


@dataclasses.dataclass
class Req:
    id: int
    prompt_len: int
    max_new: int
    computed: int = 0           # positions whose KV is written and final
    generated: int = 0
    hot: Optional[List[int]] = None
    blocks: Optional[List[int]] = None
    preempted: bool = False     # preempted at least once (its next admission is a resumption)
    preempted_at: int = -1      # the step of its last preemption
    empty_seen: int = 0         # empty steps since then
    started: bool = False       # admitted at least once

    @property
    def prefilling(self) -> bool:
        return self.computed < self.prompt_len

    @property
    def done(self) -> bool:
        return self.generated >= self.max_new


class EngineHarness:
    def __init__(self, seed: int = 0, rows: int = 4, layers: int = 2, topk: int = 16,
                 drafts: int = 2, capacity: int = 64, block_size: int = 16, chunk: int = 24,
                 token_budget: int = 48, kv_format: str = "bf16", latent_dim: int = 32,
                 rope_dim: int = 8, write_through: bool = True, auto_invalidate: bool = True,
                 check: bool = True, max_len: int = 320, num_requests: int = 60,
                 resident_block_size: int = 16, policy: str = reference.DEFAULT_POLICY,
                 prompt_range=(8, 64), preempt_rate: float = 0.04, preempt_many: float = 0.0,
                 preempt_all: float = 0.0, preempt_hold: float = 0.0,
                 shuffle_resumes: bool = False,
                 arrival_rate: float = 0.0, id_reuse: float = 0.0, prefix_hit: float = 0.0,
                 hold_rate: float = 0.0, abort_rate: float = 0.0, defer_rate: float = 0.0,
                 swap_free: float = 0.0, dummy_rate: float = 0.0, fault_rate: float = 0.0):
        # (every feature off by default draws nothing from the rng: the older tests keep their
        # sequences)
        self.rng = random.Random(seed)
        self.gen = torch.Generator().manual_seed(seed)
        self.R, self.L, self.K, self.n = rows, layers, topk, drafts
        self.T = 1 + drafts
        self.chunk, self.budget, self.block_size = chunk, token_budget, block_size
        self.max_len = max_len
        self.max_blocks = -(-max_len // block_size)
        self.num_blocks = rows * self.max_blocks + 8
        self.prompt_range = prompt_range
        self.preempt_rate, self.preempt_many, self.preempt_all = \
            preempt_rate, preempt_many, preempt_all
        self.preempt_hold = preempt_hold
        self.shuffle_resumes = shuffle_resumes
        self.arrival_rate, self.id_reuse, self.prefix_hit = arrival_rate, id_reuse, prefix_hit
        self.hold_rate, self.abort_rate, self.defer_rate = hold_rate, abort_rate, defer_rate
        self.swap_free, self.dummy_rate, self.fault_rate = swap_free, dummy_rate, fault_rate
        self.policy = policy
        self.mgr = SparseOffloadManager(
            num_layers=layers, max_rows=rows, capacity=capacity, topk=topk,
            queries_per_step=self.T, kv_format=kv_format, resident_block_size=resident_block_size,
            write_through=write_through, auto_invalidate=auto_invalidate, check=check,
            latent_dim=latent_dim, rope_dim=rope_dim, max_context=max_len, policy=policy)
        self.comps = self.mgr.kv_format.components
        self.host = [tuple(torch.zeros(self.num_blocks, block_size, 1, c.width, dtype=c.dtype)
                           for c in self.comps) for _ in range(layers)]
        self.mgr.register_host_kv(self.host)
        self.free_blocks = list(range(self.num_blocks))
        self.rng.shuffle(self.free_blocks)
        # the logical full cache of the requests admitted: layer -> request id -> component ->
        # [max_len, width], indexed by pos
        self.full: List[Dict[int, List[torch.Tensor]]] = [{} for _ in range(layers)]
        self.batch: List[Optional[Req]] = [None] * rows
        self.waiting: List[Req] = [
            Req(i, self.rng.randint(*prompt_range), self.rng.randint(20, 80))
            for i in range(num_requests)]
        self.next_id = num_requests
        self.reusable_ids: List[int] = []       # ids of finished requests, free to take again
        self.finished: List[Req] = []
        self.steps = 0
        self.counts = dict(tokens_checked=0, bypassed=0, moves=0, swaps=0, preemptions=0,
                           resumptions=0, drafts_rejected=0, drafts_offered=0, short_chunks=0,
                           resumed_same_step=0, resumed_after_empty_step=0,
                           row_steps=0, selections_checked=0, passes=0, empty_steps=0,
                           dummy_passes=0, held=0, arrivals=0, id_reuses=0, prefix_hits=0,
                           aborts=0, deferred=0, faults=0, **{f"faults_{m}": 0
                                                              for m in FAULT_MODES})

    # ------------------------------------------------------------------------ scheduling
    def _alloc(self, req: Req) -> None:
        need = -(-(req.prompt_len + req.max_new + self.T) // self.block_size)
        req.blocks = [self.free_blocks.pop() for _ in range(need)]

    def _release(self, req: Req) -> None:
        self.free_blocks.extend(req.blocks)
        self.rng.shuffle(self.free_blocks)
        req.blocks = None

    def _host_rows(self, req: Req, positions) -> torch.Tensor:
        bs = self.block_size
        return torch.tensor([req.blocks[p // bs] * bs + p % bs for p in positions],
                            dtype=torch.int64)

    def _arrive(self) -> None:
        if self.arrival_rate and self.rng.random() < self.arrival_rate:
            if self.id_reuse and self.reusable_ids and self.rng.random() < self.id_reuse:
                # a new request under a finished request's id (an abort and resubmit)
                rid = self.reusable_ids.pop(self.rng.randrange(len(self.reusable_ids)))
                self.counts["id_reuses"] += 1
            else:
                rid, self.next_id = self.next_id, self.next_id + 1
            self.waiting.append(Req(rid, self.rng.randint(*self.prompt_range),
                                    self.rng.randint(20, 80)))
            self.counts["arrivals"] += 1

    def _admit(self) -> None:
        for row in range(self.R):
            if self.batch[row] is None and self.waiting:
                req = self.waiting.pop(0)
                if req.preempted:
                    self.counts["resumptions"] += 1
                    self.counts["resumed_same_step"] += req.preempted_at == self.steps
                    self.counts["resumed_after_empty_step"] += req.empty_seen > 0
                req.started = True
                self._alloc(req)
                req.computed = 0                     # recompute: prompt and outputs so far
                req.hot = None
                self.batch[row] = req
                self.mgr.add(row)
                for layer in range(self.L):
                    self.full[layer][req.id] = [torch.zeros(self.max_len, c.width, dtype=c.dtype)
                                                for c in self.comps]
                if self.prefix_hit and self.rng.random() < self.prefix_hit:
                    self._prefix_arrives(req)

    def _prefix_arrives(self, req: Req) -> None:
        """The KV of the first ``n`` prompt positions lands in the host pool with no pass of this
        engine (new bytes: a resumed request's recomputed KV differs from its old KV)."""
        n = self.rng.randint(1, req.prompt_len)
        rows = self._host_rows(req, range(n))
        for layer in range(self.L):
            for c, part in enumerate(self._kv_bytes(n)):
                pool = self.host[layer][c]
                pool.view(-1, 1, pool.shape[-1])[rows] = part
                self.full[layer][req.id][c][:n] = part[:, 0]
        req.computed = n
        self.counts["prefix_hits"] += 1

    def _leave(self, row: int) -> None:
        """The request in ``row`` finished or was aborted: its row is freed, its id reusable."""
        req = self.batch[row]
        self.mgr.free(row)
        self._release(req)
        self.batch[row] = None
        self._forget(req)

    def _forget(self, req: Req) -> None:
        self.finished.append(req)
        for layer in range(self.L):
            self.full[layer].pop(req.id, None)
        self.reusable_ids.append(req.id)

    def _maybe_abort(self) -> None:
        """A client aborts a request, running or waiting (a preempted one holds no row)."""
        if not self.abort_rate or self.rng.random() >= self.abort_rate:
            return
        live = [r for r in range(self.R) if self.batch[r] is not None]
        waiting = [w for w in self.waiting if w.started]
        if not live and not waiting:
            return
        self.counts["aborts"] += 1
        pick = self.rng.randrange(len(live) + len(waiting))
        if pick < len(live):
            self._leave(live[pick])
        else:
            self.waiting.remove(waiting[pick - len(live)])
            self._forget(waiting[pick - len(live)])

    def _condense(self) -> None:
        """vLLM's InputBatch.condense: fill each hole with the last occupied row."""
        while True:
            holes = [r for r in range(self.R) if self.batch[r] is None]
            last = max((r for r in range(self.R) if self.batch[r] is not None), default=-1)
            if not holes or holes[0] > last:
                return
            self.mgr.move_row(last, holes[0])
            self.batch[holes[0]], self.batch[last] = self.batch[last], None
            self.counts["moves"] += 1

    def _maybe_swap(self) -> None:
        live = [r for r in range(self.R) if self.batch[r] is not None]
        if len(live) >= 2 and self.rng.random() < 0.3:
            a, b = self.rng.sample(live, 2)
            self.mgr.swap_rows(a, b)
            self.batch[a], self.batch[b] = self.batch[b], self.batch[a]
            self.counts["swaps"] += 1
        free = [r for r in range(self.R) if self.batch[r] is None]
        if live and free and self.swap_free and self.rng.random() < self.swap_free:
            # a request into a free row: a hole in the batch for this pass (condensed next step)
            a, b = self.rng.choice(live), self.rng.choice(free)
            self.mgr.swap_rows(a, b)
            self.batch[a], self.batch[b] = self.batch[b], self.batch[a]
            self.counts["swaps"] += 1

    def _maybe_preempt(self) -> bool:
        live = [r for r in range(self.R) if self.batch[r] is not None]
        if live and self.rng.random() < self.preempt_rate:
            if self.preempt_all and self.rng.random() < self.preempt_all:
                rows = live                          # all of them: maybe an empty step next
            elif self.preempt_many and self.rng.random() < self.preempt_many:
                rows = self.rng.sample(live, self.rng.randint(1, len(live)))
            else:
                rows = [self.rng.choice(live)]
            for row in rows:
                self._preempt(row)
            return True
        return False

    def _preempt(self, row: int) -> None:
        req = self.batch[row]
        self.mgr.free(row)
        self._release(req)
        self.batch[row] = None
        req.prompt_len += req.generated              # outputs become part of the prompt
        req.max_new -= req.generated
        req.generated = 0
        req.preempted, req.preempted_at, req.empty_seen = True, self.steps, 0
        at = 0
        if self.shuffle_resumes:
            # anywhere among the preempted requests at the head of the queue: resumed in any order
            at = self.rng.randint(0, sum(1 for w in self.waiting if w.preempted))
        self.waiting.insert(at, req)
        self.counts["preemptions"] += 1

    # ------------------------------------------------------------------------------ step
    def _kv_bytes(self, n: int) -> List[torch.Tensor]:
        out = []
        for c in self.comps:
            if c.dtype == torch.uint8:
                out.append(torch.randint(0, 256, (n, 1, c.width), generator=self.gen,
                                         dtype=torch.uint8))
            else:
                out.append(torch.randn(n, 1, c.width, generator=self.gen).to(c.dtype))
        return out

    def _topk(self, req: Req, pos: int, layer: int) -> List[int]:
        visible = pos + 1
        if req.hot is None:
            req.hot = []
        if len(req.hot) < self.K // 2 and visible > 1:
            req.hot.append(self.rng.randrange(visible))
        cands = [pos, pos - 1, pos - 2] + [h for h in req.hot if h < visible]
        cands += [self.rng.randrange(visible) for _ in range(self.K)]
        picked = []
        for p in cands:
            if 0 <= p < visible and p not in picked and len(picked) < self.K:
                picked.append(p)
        if layer % 2:
            picked.reverse()
        picked += [-1] * (self.K - len(picked))
        if self.rng.random() < 0.2:
            self.rng.shuffle(picked)                 # -1 in the middle
        return picked

    def step(self) -> bool:
        """One scheduler step: lifecycle calls, then one forward pass over the scheduled tokens,
        or none (an empty step). False once nothing is left to schedule and nothing arrives."""
        self._maybe_abort()
        preempted = self._maybe_preempt()
        self._condense()
        self._arrive()
        # a preemption means the KV memory ran short: often nothing is admitted in that step
        # either (the preempted request alone: a step with no token, issue 40)
        if (preempted and self.preempt_hold and self.rng.random() < self.preempt_hold) or \
                (self.hold_rate and self.rng.random() < self.hold_rate):
            self.counts["held"] += 1                 # no memory to admit anyone this step
        else:
            self._admit()
        self._maybe_swap()
        live = [r for r in range(self.R) if self.batch[r] is not None]
        if not live:
            if not self.waiting and not self.arrival_rate:
                return False
            self._empty_step()
            self.steps += 1
            return True
        num_reqs = max(live) + 1
        spans, drafts = [], {}
        for row in range(num_reqs):
            req = self.batch[row]
            if req is None:
                spans.append(0)
            elif self.defer_rate and self.rng.random() < self.defer_rate:
                spans.append(0)                      # nothing this pass: it keeps row and state
                self.counts["deferred"] += 1
            elif req.prefilling:
                spans.append(min(self.chunk, req.prompt_len - req.computed))
            else:
                d = self.rng.randint(0, self.n)
                drafts[row] = d
                spans.append(1 + d)
        while sum(spans) > self.budget:              # the token budget defers some prefill
            row = max(range(num_reqs), key=lambda r: spans[r])
            spans[row] = max(spans[row] // 2, 1 if self.batch[row] is not None else 0)
        if self.rng.random() < 0.3 and num_reqs < self.R:
            spans += [0] * (self.R - num_reqs)       # num_reqs padded (graph batch sizes)
            num_reqs = self.R
        qsl = [0]
        for s in spans:
            qsl.append(qsl[-1] + s)
        N = self.budget                              # tokens padded to a fixed count
        positions = [-1] * N                         # per token: its pos, -1 = padding
        token_row = [-1] * N                         # per token: its batch row
        seq_lens = []
        for row in range(num_reqs):
            req = self.batch[row]
            seq_lens.append(0 if req is None else req.computed + spans[row])
            for i in range(spans[row]):
                positions[qsl[row] + i] = req.computed + i
                token_row[qsl[row] + i] = row
        block_table = torch.full((self.R, self.max_blocks), -1, dtype=torch.int32)
        for row in range(num_reqs):
            if self.batch[row] is not None:
                b = self.batch[row].blocks
                block_table[row, :len(b)] = torch.tensor(b, dtype=torch.int32)
        slot_mapping = torch.tensor(
            [-1 if p < 0 else self.batch[r].blocks[p // self.block_size] * self.block_size
             + p % self.block_size for p, r in zip(positions, token_row)], dtype=torch.int64)
        meta = self.mgr.begin_step(torch.tensor(qsl, dtype=torch.int32),
                                   torch.tensor(seq_lens, dtype=torch.int32), block_table, N)
        self.counts["passes"] += 1
        buffered_rows = sum(1 for s in spans if 1 <= s <= self.T)
        try:
            for layer in range(self.L):
                new = self._kv_bytes(N)
                self.mgr.write_kv(layer, slot_mapping, new)
                for row in range(num_reqs):
                    if spans[row]:
                        req, lo = self.batch[row], self.batch[row].computed
                        for c, part in enumerate(new):
                            self.full[layer][req.id][c][lo:lo + spans[row]] = \
                                part[qsl[row]:qsl[row + 1], 0]
                topk = torch.tensor(
                    [self._topk(self.batch[r], p, layer) if p >= 0 else [-1] * self.K
                     for p, r in zip(positions, token_row)], dtype=torch.int32).view(N, 1, self.K)
                with self._faults():
                    out = self.mgr.retrieve(layer, topk, meta, new_kv=new)
                self._verify(layer, topk, out, positions, token_row, spans, block_table)
                self.counts["row_steps"] += buffered_rows
        except InjectedFault:
            self._abort_pass(spans)
        else:
            self._finish_step(spans, drafts)
        self.steps += 1
        return True

    @contextlib.contextmanager
    def _faults(self):
        """Around one retrieve: with probability ``fault_rate``, its copy fails (FAULT_MODES)."""
        if not self.fault_rate or self.rng.random() >= self.fault_rate:
            yield
            return
        mode = self.rng.choice(FAULT_MODES)
        self.counts[f"faults_{mode}"] += 1
        # the manager calls avsg.buffer.gather, which calls avsg.buffer._copy: both looked up at
        # call time, so patching the module's names for this one call reaches the retrieve
        name = "gather" if mode == "skip" else "_copy"
        stock = getattr(avsg_buffer, name)

        def broken(*args, **kwargs):
            if mode == "after":
                stock(*args, **kwargs)
            raise InjectedFault(f"injected fault ({mode}) between plan and gather, step "
                                f"{self.steps}")
        setattr(avsg_buffer, name, broken)
        try:
            yield
        finally:
            setattr(avsg_buffer, name, stock)

    def _abort_pass(self, spans) -> None:
        """A retrieve raised: the engine drops the pass (nothing accepted or sampled) and runs its
        requests again next step, which rewrites every position this pass wrote. An engine
        without auto_invalidate says so, as it does for rejected drafts."""
        self.counts["faults"] += 1
        if not self.mgr.auto_invalidate:
            commit = torch.full((self.R,), 1 << 24, dtype=torch.int32)
            for row, req in enumerate(self.batch):
                if req is not None and row < len(spans) and spans[row]:
                    commit[row] = req.computed
            self.mgr.invalidate(commit)

    def _empty_step(self) -> None:
        """A step that schedules no token: no pass (only the lifecycle calls above), or a dummy
        pass of padding alone."""
        self.counts["empty_steps"] += 1
        for req in self.waiting:
            req.empty_seen += 1
        if self.dummy_rate and self.rng.random() < self.dummy_rate:
            self._dummy_pass()

    def _dummy_pass(self) -> None:
        """A forward with no scheduled token, padded to the token budget (a data-parallel rank's
        dummy batch): whatever the padding's top-k holds, nothing is planned or served."""
        N = self.budget
        meta = self.mgr.begin_step(torch.zeros(2, dtype=torch.int32),
                                   torch.zeros(1, dtype=torch.int32),
                                   torch.full((self.R, self.max_blocks), -1, dtype=torch.int32), N)
        for layer in range(self.L):
            new = self._kv_bytes(N)
            self.mgr.write_kv(layer, torch.full((N,), -1, dtype=torch.int64), new)
            garbage = torch.randint(-1, self.max_len, (N, 1, self.K), generator=self.gen,
                                    dtype=torch.int32)
            out = self.mgr.retrieve(layer, garbage, meta, new_kv=new)
            assert not bool(out.planned.any()) and bool((out.slots == -1).all()), \
                f"step {self.steps} layer {layer}: a dummy pass planned its padding"
        self.counts["dummy_passes"] += 1

    def _verify(self, layer, topk, out, positions, token_row, spans, block_table) -> None:
        """Every planned token's reads, byte for byte, against the host's current KV (module
        docstring); unplanned tokens get no slot."""
        where = f"step {self.steps} layer {layer}"
        planned = torch.tensor([p >= 0 and spans[r] <= self.T
                                for p, r in zip(positions, token_row)])
        assert torch.equal(out.planned, planned), f"{where}: planned tokens differ"
        assert bool((out.slots[~planned] == -1).all()), \
            f"{where}: a token that bypasses the buffer (or padding) got a slot"
        self.counts["bypassed"] += sum(1 for p, r in zip(positions, token_row)
                                       if p >= 0 and spans[r] > self.T)
        tokens = planned.nonzero().flatten()
        if not tokens.numel():
            return
        rows = torch.tensor(token_row)[tokens]                     # batch row per token
        self.counts["short_chunks"] += sum(1 for r in rows.tolist()
                                           if spans[r] > 1 and self.batch[r].prefilling)
        # the top-k in the order retrieve returns slots: valid entries first, order kept
        want = _valid_first(topk[tokens, 0])                       # [n, K] pos, -1 = none
        slots = out.slots[tokens, 0]                               # [n, K] slot, -1 = none
        valid = want >= 0
        assert torch.equal(slots >= 0, valid), f"{where}: valid slots first, then -1"
        assert bool((out.kv_lens[rows] == self.mgr.capacity).all()), f"{where}: kv lengths"
        # every valid selection as one entry: i its token (of ``tokens``), k its index
        i, k = valid.nonzero(as_tuple=True)
        rows_v = rows[i]
        rbs = out.kv[0].shape[1]                                   # resident page size
        slot = slots[i, k].long()
        page = out.block_table[rows_v, slot // rbs].long()
        pos = want[i, k].long()
        host_block = block_table[rows_v, pos // self.block_size].long()
        host_off = pos % self.block_size
        order = sorted(set(rows.tolist()))
        which = torch.tensor([order.index(r) for r in rows_v.tolist()], dtype=torch.long)
        for c in range(len(self.comps)):
            read = out.kv[c][page, slot % rbs, 0]                  # [entries, width]
            host = self.host[layer][c][host_block, host_off, 0]
            truth = torch.stack([self.full[layer][self.batch[r].id][c] for r in order])[which, pos]
            if not _same(host, truth):
                e = int(_differ(host, truth).nonzero()[0, 0])
                raise AssertionError(f"{where} component {c}: the host pool's bytes of pos "
                                     f"{int(pos[e])} differ from the engine's KV: the write "
                                     f"path, not residency")
            if not _same(read, host):
                e = int(_differ(read, host).nonzero()[0, 0])
                r = int(rows_v[e])
                host_row = int(host_block[e]) * self.block_size + int(host_off[e])
                raise StaleRead(
                    f"stale read, {where} component {c} token {int(tokens[i[e]])}: request "
                    f"{self.batch[r].id} (batch row {r}, state row {self.mgr.state_row(r)}) "
                    f"selected pos {int(pos[e])} (host row {host_row}); slot {int(slot[e])} "
                    f"holds other bytes (bytes differ from the host's current KV); policy "
                    f"{self.policy}")
        self.counts["tokens_checked"] += int(tokens.numel())
        self.counts["selections_checked"] += int(valid.sum())

    def _finish_step(self, spans, drafts) -> None:
        commit = torch.full((self.R,), 1 << 24, dtype=torch.int32)
        for row, req in enumerate(self.batch):
            if req is None or row >= len(spans) or spans[row] == 0:
                continue
            if row in drafts:
                d = drafts[row]
                a = self.rng.randint(0, d)
                self.counts["drafts_offered"] += d
                self.counts["drafts_rejected"] += d - a
                req.computed += 1 + a
                req.generated += 1 + a
                commit[row] = req.computed
            else:
                req.computed += spans[row]
                if not req.prefilling:
                    req.generated += 1               # the last chunk samples a token
        if not self.mgr.auto_invalidate:
            self.mgr.invalidate(commit)
        for row, req in enumerate(self.batch):
            if req is not None and req.done:
                self._leave(row)

    def run(self, steps: int) -> None:
        # one intra-op thread: these ops are tiny, and on a shared 2-core machine the thread
        # pool's wake-ups cost far more than the work (advanced indexing 400x slower measured)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            for _ in range(steps):
                if not self.step():
                    break
        finally:
            torch.set_num_threads(threads)


def _valid_first(sel: torch.Tensor) -> torch.Tensor:
    """Per row, the ``>= 0`` entries first in their order, then ``-1`` (what retrieve does to
    slots, done here to the positions independently)."""
    order = torch.sort((sel < 0).to(torch.int8), dim=1, stable=True).indices
    return sel.gather(1, order)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Byte for byte (NaN bit patterns included)."""
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def _differ(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per row of the last dimension: any byte differs."""
    return (a.contiguous().view(torch.uint8) != b.contiguous().view(torch.uint8)).any(-1)
