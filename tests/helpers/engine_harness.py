"""A model runner double that drives ``SparseOffloadManager`` the way vLLM's drives its attention
backends, and checks every read against the full cache.

Per step, like vLLM v1's ``GPUModelRunner`` with a persistent ``InputBatch``:

* scheduling: waiting requests take free batch rows (``add``); finished rows leave holes that
  ``condense`` fills by moving the last rows down (``move_row``); rows are sometimes reordered
  (``swap_rows``, as ``reorder_batch`` puts decodes first); a running request is sometimes
  preempted (``free``) and later resumed from scratch in whatever row is free (a cold start: its
  KV is recomputed, i.e. rewritten, into freshly allocated host blocks);
* tokens are flattened: request ``i`` = batch row ``i`` owns ``[qsl[i], qsl[i+1])``. A decode
  request carries ``1 + d`` tokens (``d`` MTP drafts, ``0 <= d <= n``: some steps none), a
  prefilling request a chunk of up to ``chunk`` tokens (longer than ``1 + n``: it bypasses the
  buffer), and the token count is padded to a fixed budget; ``num_reqs`` is sometimes padded too;
* every token's KV is written to the host pool through the engine's slot mapping (fresh random
  bytes each write, so a rewritten position really changes), then each layer selects a causal
  top-k per token (recent positions, a per-request hot set that makes hits, random others, ``-1``
  padding, sometimes ``-1`` in the middle) and calls ``retrieve``;
* MTP acceptance: ``a`` of the ``d`` drafts are accepted; rejected positions are rewritten by the
  next step (the manager's automatic stable-prefix invalidation, or an explicit ``invalidate``).

The check, per layer and token: the rows attention reads through the returned slots and the
resident block table equal, bit for bit, the rows of a logical full cache (kept independently of
the host pool and its block tables) at the token's valid top-k positions in the same order, and
so does a small attention computed over them.
"""
from __future__ import annotations

import dataclasses
import random
from typing import Dict, List, Optional

import torch

from avsg.integrations import SparseOffloadManager


@dataclasses.dataclass
class Req:
    id: int
    prompt_len: int
    max_new: int
    computed: int = 0           # positions whose KV is written and final
    generated: int = 0
    hot: Optional[List[int]] = None
    blocks: Optional[List[int]] = None

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
                 resident_block_size: int = 16):
        self.rng = random.Random(seed)
        self.gen = torch.Generator().manual_seed(seed)
        self.R, self.L, self.K, self.n = rows, layers, topk, drafts
        self.T = 1 + drafts
        self.chunk, self.budget, self.block_size = chunk, token_budget, block_size
        self.max_len = max_len
        self.max_blocks = -(-max_len // block_size)
        self.num_blocks = rows * self.max_blocks + 8
        self.mgr = SparseOffloadManager(
            num_layers=layers, max_rows=rows, capacity=capacity, topk=topk,
            queries_per_step=self.T, kv_format=kv_format, resident_block_size=resident_block_size,
            write_through=write_through, auto_invalidate=auto_invalidate, check=check,
            latent_dim=latent_dim, rope_dim=rope_dim, max_context=max_len)
        self.comps = self.mgr.kv_format.components
        self.host = [tuple(torch.zeros(self.num_blocks, block_size, 1, c.width, dtype=c.dtype)
                           for c in self.comps) for _ in range(layers)]
        self.mgr.register_host_kv(self.host)
        self.free_blocks = list(range(self.num_blocks))
        self.rng.shuffle(self.free_blocks)
        # the logical full cache: layer -> request id -> component -> [max_len, width]
        self.full: List[Dict[int, List[torch.Tensor]]] = [{} for _ in range(layers)]
        self.batch: List[Optional[Req]] = [None] * rows
        self.waiting: List[Req] = [
            Req(i, self.rng.randint(8, 64), self.rng.randint(20, 80)) for i in range(num_requests)]
        self.finished: List[Req] = []
        self.steps = 0
        self.counts = dict(tokens_checked=0, bypassed=0, moves=0, swaps=0, preemptions=0,
                           resumptions=0, drafts_rejected=0, drafts_offered=0, short_chunks=0)
        self.preempted_ids = set()

    # ------------------------------------------------------------------------ scheduling
    def _alloc(self, req: Req) -> None:
        need = -(-(req.prompt_len + req.max_new + self.T) // self.block_size)
        req.blocks = [self.free_blocks.pop() for _ in range(need)]

    def _release(self, req: Req) -> None:
        self.free_blocks.extend(req.blocks)
        self.rng.shuffle(self.free_blocks)
        req.blocks = None

    def _admit(self) -> None:
        for row in range(self.R):
            if self.batch[row] is None and self.waiting:
                req = self.waiting.pop(0)
                if req.id in self.preempted_ids:
                    self.counts["resumptions"] += 1
                self._alloc(req)
                req.computed = 0                     # recompute: prompt and outputs so far
                req.hot = None
                self.batch[row] = req
                self.mgr.add(row)
                for layer in range(self.L):
                    self.full[layer][req.id] = [torch.zeros(self.max_len, c.width, dtype=c.dtype)
                                                for c in self.comps]

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

    def _maybe_preempt(self) -> None:
        live = [r for r in range(self.R) if self.batch[r] is not None]
        if live and self.rng.random() < 0.04:
            row = self.rng.choice(live)
            req = self.batch[row]
            self.mgr.free(row)
            self._release(req)
            self.batch[row] = None
            req.prompt_len += req.generated          # outputs become part of the prompt
            req.max_new -= req.generated
            req.generated = 0
            self.waiting.insert(0, req)
            self.preempted_ids.add(req.id)
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
        self._maybe_preempt()
        self._condense()
        self._admit()
        self._maybe_swap()
        live = [r for r in range(self.R) if self.batch[r] is not None]
        if not live:
            return False
        num_reqs = max(live) + 1
        spans, drafts = [], {}
        for row in range(num_reqs):
            req = self.batch[row]
            if req is None:
                spans.append(0)
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
        positions = [-1] * N
        token_row = [-1] * N
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
        for layer in range(self.L):
            new = self._kv_bytes(N)
            self.mgr.write_kv(layer, slot_mapping, new)
            for t, (p, r) in enumerate(zip(positions, token_row)):
                if p >= 0:
                    for c, part in enumerate(new):
                        self.full[layer][self.batch[r].id][c][p] = part[t, 0]
            topk = torch.full((N, 1, self.K), -1, dtype=torch.int32)
            for t, (p, r) in enumerate(zip(positions, token_row)):
                if p >= 0:
                    topk[t, 0] = torch.tensor(self._topk(self.batch[r], p, layer))
            out = self.mgr.retrieve(layer, topk, meta, new_kv=new)
            self._verify(layer, topk, out, positions, token_row, spans)
        self._finish_step(spans, drafts)
        self.steps += 1
        return True

    def _verify(self, layer, topk, out, positions, token_row, spans) -> None:
        resident = out.kv
        bs = resident[0].shape[1]
        for t, (p, r) in enumerate(zip(positions, token_row)):
            slots = out.slots[t, 0]
            if p < 0 or spans[r] > self.T:
                assert bool((slots == -1).all()) and not bool(out.planned[t])
                self.counts["bypassed"] += p >= 0
                continue
            if spans[r] > 1 and self.batch[r].prefilling:
                self.counts["short_chunks"] += 1
            want_pos = [int(x) for x in topk[t, 0] if x >= 0]
            n = len(want_pos)
            got = slots[:n]
            assert bool((got >= 0).all()) and bool((slots[n:] == -1).all()), \
                f"step {self.steps} layer {layer} token {t}: valid slots first, then -1"
            pages = out.block_table[r, (got // bs).long()].long()
            offsets = (got % bs).long()
            req = self.batch[r]
            for c in range(len(self.comps)):
                read = resident[c][pages, offsets, 0]
                want = self.full[layer][req.id][c][torch.tensor(want_pos, dtype=torch.long)]
                assert torch.equal(read.view(torch.uint8), want.view(torch.uint8)), \
                    f"step {self.steps} layer {layer} token {t} component {c}: bytes differ"
            if self.comps[0].dtype != torch.uint8:
                q = torch.randn(2, self.comps[0].width, generator=self.gen)
                assert torch.equal(_attention(q, resident[0][pages, offsets, 0]),
                                   _attention(q, self.full[layer][req.id][0][
                                       torch.tensor(want_pos, dtype=torch.long)]))
            assert int(out.kv_lens[r]) == self.mgr.capacity
            self.counts["tokens_checked"] += 1

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
                self.mgr.free(row)
                self._release(req)
                self.batch[row] = None
                self.finished.append(req)

    def run(self, steps: int) -> None:
        for _ in range(steps):
            if not self.step():
                break


def _attention(q: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """A plain softmax attention over the rows in the order given (fp32)."""
    k = rows.float()
    scores = (q @ k.T) * k.shape[-1] ** -0.5
    # by hand: torch.softmax took milliseconds per call on these tiny rows on this machine
    weights = (scores - scores.amax(-1, keepdim=True)).exp()
    return (weights / weights.sum(-1, keepdim=True)) @ k
