"""The decode engine: continuous batching over ``R`` persistent rows, MTP-n, any algorithm and store.

One ``step()``:

1. **Admit.** Free rows take waiting requests: the store row and algorithm row are reset, the
   host pool hands the row its blocks, and the context is produced (real prefill for a prompt,
   linear-cost fill otherwise).
2. **Verify.** Every active row feeds ``[x0, d1..dn]`` at positions ``L .. L+n`` (``x0`` the last
   output token, ``d`` the MTP drafts, ``L`` the committed length); the model predicts ``y0..yn``.
3. **Accept.** ``a`` drafts are accepted (greedy verification, or the labelled simulated model);
   ``a + 1`` tokens are emitted; the committed length becomes ``L + 1 + a``.
4. **Draft** (n > 0). The MTP layer catches up on entries ``(h[L+i], t[L+i+1])``, ``i = 0..n``
   (entries past ``a`` hold rejected hidden states and are dropped), which yields ``d1``; it is
   then applied again ``n - 1`` times for ``d2..dn``. Speculative positions are dropped with
   ``invalidate`` (store and algorithm, every layer) before they are written again.
5. **Finish.** Rows that reached ``max_new_tokens`` release their blocks; the next step admits.

Forward passes of one step: the verification (the ``L`` main layers), with MTP-n the catch-up
(the MTP layer) and ``n - 1`` drafts (the MTP layer); admitting a prompt adds its prefill passes
(``prefill=True``: no retrieve) and the drafts that follow them. Each pass calls
``store.begin_pass`` once and then, per layer, offload, select, retrieve and attention (``base``);
invalidation runs between passes. All passes share one ``ForwardContext``, the only place the
engine holds its algorithm and store (``engine.store = s`` swaps the store).

The engine sees only ``model``, a ``SparseAlgorithm`` and a ``KVStore``: it has no mode branches.
It syncs with the host once per step, to hand out tokens and decide which requests finished.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Callable, Dict, List, Optional

import torch

from .base import ForwardContext, KVStore, SparseAlgorithm
from .context import ContextFill
from ..kvformat import KVFormat
from .scheduler import Request, Scheduler
from .spec import SimulatedAcceptance, emitted_tokens, greedy_accept
from .step import NULL_TIMERS, StepBatch, Timers

MTP_MODULE = 0          # DeepSeek-V3.2 ships one MTP module; MTP-n applies it n times


def positions_needed(context_len: int, max_new_tokens: int, mtp: int) -> int:
    """Positions a request may ever write: its context and outputs, then in its last step up to
    ``mtp`` drafts verified past them and ``mtp - 1`` more drafted after those."""
    return context_len + max_new_tokens + 2 * mtp + 1


@dataclasses.dataclass
class StepRecord:
    """What one decode step did (host values)."""
    seconds: float
    emitted: Dict[int, int]               # request id -> tokens emitted this step
    accepted: Dict[int, int]              # request id -> drafts accepted
    logits: Optional[Dict[int, torch.Tensor]] = None   # request id -> verify logits [T, V]


class Engine:
    def __init__(self, model, algo: SparseAlgorithm, store: KVStore, kv_format: KVFormat,
                 rows: int, mtp: int = 0, acceptance: Optional[SimulatedAcceptance] = None,
                 context_fill: Optional[ContextFill] = None, timers: Timers = NULL_TIMERS,
                 record_logits: bool = False, recorder=None):
        if mtp < 0:
            raise ValueError(f"mtp: expected >= 0 drafts, got {mtp}")
        if mtp > 0 and model.num_kv_layers <= model.config.num_hidden_layers:
            raise ValueError("mtp: the model has no MTP layer (num_nextn_predict_layers = 0)")
        if acceptance is not None and acceptance.drafts != mtp:
            raise ValueError(f"acceptance: built for {acceptance.drafts} drafts, engine has {mtp}")
        self.model = model
        # the one place the engine holds its algorithm and store (``store`` / ``algo`` read it)
        self.ctx = ForwardContext(algo, store, kv_format, timers)
        self.kv_format = kv_format
        self.rows, self.mtp = rows, mtp
        self.acceptance = acceptance
        self.context_fill = context_fill or ContextFill(model, kv_format)
        self.timers = timers
        self.record_logits = record_logits
        self.device = next(model.parameters()).device
        self.scheduler = Scheduler(rows)
        self.mtp_layer = model.config.num_hidden_layers + MTP_MODULE
        R = rows
        self.length = torch.zeros(R, dtype=torch.int32, device=self.device)
        self.last_token = torch.zeros(R, dtype=torch.int64, device=self.device)
        self.drafts = torch.zeros(R, mtp, dtype=torch.int64, device=self.device)
        self.active = torch.zeros(R, dtype=torch.bool, device=self.device)
        self._accept_streams: Dict[int, object] = {}
        # the verify pass is the one a trace records (not prefill, not MTP passes)
        self.recorder = recorder

    @property
    def store(self) -> KVStore:
        return self.ctx.store

    @store.setter
    def store(self, store: KVStore) -> None:
        self.ctx.store = store

    @property
    def algo(self) -> SparseAlgorithm:
        return self.ctx.algo

    @algo.setter
    def algo(self, algo: SparseAlgorithm) -> None:
        self.ctx.algo = algo

    # ------------------------------------------------------------------------- requests
    def add(self, request: Request) -> None:
        self.scheduler.add(request)

    def _row_mask(self, row: int) -> torch.Tensor:
        mask = torch.zeros(self.rows, dtype=torch.bool, device=self.device)
        mask[row] = True
        return mask

    def admit(self) -> List[int]:
        """Fill free rows with waiting requests; returns the rows admitted. Admission (context
        fill or prefill) is not decode work: the phase timers are paused meanwhile."""
        timing, self.timers.enabled = self.timers.enabled, False
        try:
            return self._admit_free_rows()
        finally:
            self.timers.enabled = timing

    def _admit_free_rows(self) -> List[int]:
        admitted = []
        for row in self.scheduler.free_rows():
            request = self.scheduler.admit_next(row)
            if request is None:
                break
            length = positions_needed(request.context_len, request.max_new_tokens, self.mtp)
            self.store.admit(row, length)
            self.algo.reset(self._row_mask(row))
            if self.acceptance is not None:
                self._accept_streams[request.id] = self.acceptance.stream(request.seed)
            with torch.no_grad():
                if request.prompt is not None:
                    self._prefill(row, request)
                else:
                    self.context_fill.fill(row, request.context_len, self.store, self.algo)
                    self.length[row] = request.context_len
                    self.last_token[row] = request.first_token
                    # no hidden state exists for a filled context: the first drafts are
                    # placeholders, which verification rejects
                    self.drafts[row] = 0
            self.active[row] = True
            admitted.append(row)
        return admitted

    def _prefill(self, row: int, request: Request) -> None:
        prompt = torch.tensor(request.prompt, dtype=torch.int64, device=self.device)
        n = prompt.numel()
        tokens = torch.zeros(self.rows, n, dtype=torch.int64, device=self.device)
        tokens[row] = prompt
        only_row = self._row_mask(row)
        batch = StepBatch.make(tokens, torch.zeros(self.rows, dtype=torch.int32,
                                                   device=self.device), only_row)
        with self.ctx.settings(prefill=True):
            hidden = self.model.forward(batch, self.ctx)
        first = self.model.logits(hidden[row:row + 1, -1:])[0, 0].argmax()
        request.output.append(int(first))
        self.length[row] = n
        self.last_token[row] = first
        if self.mtp:
            next_tokens = torch.cat([tokens[:, 1:], tokens[:, -1:]], dim=1)
            next_tokens[row, -1] = first
            with self.ctx.settings(prefill=True):
                mtp_hidden = self.model.mtp_forward(MTP_MODULE, hidden, next_tokens, batch,
                                                    self.ctx)
            last = mtp_hidden[:, -1:]
            first_draft = self.model.mtp_logits(MTP_MODULE, last)[:, 0].argmax(-1)
            start = torch.where(only_row, torch.full_like(self.length, n), self.length)
            drafts = self._draft_chain(last, first_draft, start, only_row)
            self.drafts[row] = drafts[row]
            self._drop_beyond(torch.where(only_row, start, self.length))

    # ---------------------------------------------------------------------------- decode
    def _draft_chain(self, hidden: torch.Tensor, first_draft: torch.Tensor,
                     start_pos: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
        """Apply the MTP module again for drafts 2..n: entry ``(hidden, d_k)`` at position
        ``start_pos + k - 1`` predicts ``d_{k+1}``. Returns int64 ``[R, n]``."""
        drafts = [first_draft]
        for k in range(1, self.mtp):
            token = drafts[-1][:, None]
            batch = StepBatch.make(token, start_pos + (k - 1), active)
            hidden = self.model.mtp_forward(MTP_MODULE, hidden, token, batch, self.ctx)
            drafts.append(self.model.mtp_logits(MTP_MODULE, hidden)[:, 0].argmax(-1))
        return torch.stack(drafts, dim=1)

    def _drop_beyond(self, valid_lens: torch.Tensor, layers=None) -> None:
        valid_lens = valid_lens.to(torch.int32).contiguous()
        self.store.invalidate(valid_lens, layers)
        self.algo.invalidate(valid_lens, layers)

    def step(self) -> Optional[StepRecord]:
        """Admit, then one decode step over the active rows; None when all work is done."""
        self.admit()
        if not bool(self.active.any()):
            return None
        started = time.perf_counter()
        with torch.no_grad():
            tokens = torch.cat([self.last_token[:, None], self.drafts], dim=1)
            batch = StepBatch.make(tokens, self.length, self.active)
            with self.ctx.settings(recorder=self.recorder):
                hidden = self.model.forward(batch, self.ctx)
            logits = self.model.logits(hidden)
            predicted = logits.argmax(-1)
            accepted = self._accept(predicted)
            emitted = emitted_tokens(self.drafts, predicted, accepted)
            committed = torch.where(self.active, self.length + 1 + accepted.to(torch.int32),
                                    torch.zeros_like(self.length))
            if self.mtp:
                self._next_drafts(hidden, predicted, accepted, committed, batch)
            self.length = committed
            self.last_token = emitted.gather(1, accepted[:, None])[:, 0]
        if self.recorder is not None and bool(batch.active[self.recorder.row]):
            self.recorder.end_step(int(batch.pos[self.recorder.row, 0]))
        return self._bookkeeping(emitted, accepted, logits, time.perf_counter() - started)

    def _accept(self, predicted: torch.Tensor) -> torch.Tensor:
        if self.acceptance is None:
            return greedy_accept(self.drafts, predicted)
        draws = [0] * self.rows
        for row, request in enumerate(self.scheduler.running):
            if request is not None:
                draws[row] = self.acceptance.draw(self._accept_streams[request.id])
        return torch.tensor(draws, dtype=torch.int64, device=self.device)

    def _next_drafts(self, hidden, predicted, accepted, committed, batch) -> None:
        n = self.mtp
        entry = torch.arange(n + 1, device=self.device)[None, :]
        drafts_padded = torch.cat([self.drafts, predicted[:, -1:]], dim=1)
        # entry i pairs h[L+i] with the token that follows it: an accepted draft, then y_a
        next_tokens = torch.where(entry < accepted[:, None], drafts_padded, predicted)
        mtp_hidden = self.model.mtp_forward(MTP_MODULE, hidden, next_tokens, batch, self.ctx)
        last = mtp_hidden.gather(1, accepted[:, None, None].expand(-1, 1, mtp_hidden.shape[-1]))
        first_draft = self.model.mtp_logits(MTP_MODULE, last)[:, 0].argmax(-1)
        # catch-up entries past a were written from rejected hidden states
        self._drop_beyond(committed, layers=[self.mtp_layer])
        self.drafts = self._draft_chain(last, first_draft, committed, self.active)
        self._drop_beyond(committed)

    def _bookkeeping(self, emitted, accepted, logits, seconds) -> StepRecord:
        emitted_rows = emitted.tolist()
        accepted_rows = accepted.tolist()
        record = StepRecord(seconds, {}, {}, {} if self.record_logits else None)
        for row, request in enumerate(self.scheduler.running):
            if request is None:
                continue
            a = accepted_rows[row]
            room = request.max_new_tokens - len(request.output)
            new_tokens = emitted_rows[row][:a + 1][:room]
            request.output.extend(new_tokens)
            request.steps += 1
            request.drafts_offered += self.mtp
            request.drafts_accepted += a
            record.emitted[request.id] = len(new_tokens)
            record.accepted[request.id] = a
            if self.record_logits:
                record.logits[request.id] = logits[row].detach().clone()
            if request.done:
                self.scheduler.finish(row)
                self.store.release(row)
                self.active[row] = False
                self.length[row] = 0
        return record

    def run(self, requests: List[Request], on_step: Optional[Callable[[StepRecord], None]] = None
            ) -> List[StepRecord]:
        for request in requests:
            self.add(request)
        records = []
        while True:
            record = self.step()
            if record is None:
                break
            records.append(record)
            if on_step:
                on_step(record)
        return records
