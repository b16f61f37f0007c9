"""vllm-ascend backend: its sparse KV offload with residency planned by AVSG on the device.

What stays vllm-ascend's
------------------------
``AVSGSparseKVOffloadManager`` subclasses vllm-ascend's ``SparseKVOffloadManager`` (created lazily
by ``backend_class()``, so ``import avsg`` never imports vllm). It keeps the MemFabric pool set-up
(``__init__``), ``register_kv_caches`` (host pool on TP rank 0, global virtual addresses broadcast
to every rank, the per-layer top-k buffers), ``offload_new_kv`` (new KV D2H through
``offload.sparse_copy``) and every attribute its D2H connector reads. Only the C++ host LRU is
not built, and ``onload_topk_kv`` (the per-layer residency step) is replaced.

Layout
------
vllm-ascend sizes each layer's top-k buffer as ``[P, S_buf, 1, width]`` with
``P = min(max_num_batched_tokens, max_num_seqs * (1 + num_speculative_tokens))`` per-*token* rows.
This backend reads the same memory as one row per *request*: ``[R, C, 1, width]`` with
``R = max_num_seqs`` and ``C = (P // R) * S_buf`` (``T * S_buf`` in the usual case), so a request's
``T = 1 + drafts`` query tokens share one buffer of ``T`` times the slots, at equal device memory.
Each layer has a ``SparseKVBuffer`` state of ``R`` rows (the plan's hash index and policy state).

Attention keeps its per-token TND layout and ``sparse_mode=3``: token ``t`` gets a block-table row
listing the pages of its request's state row ``s``, ``[s*C/bs, (s+1)*C/bs)``, kv length ``C`` and
its slots (``current_slots_npu[t]``, valid first, then ``-1``).

Phases
------
0. per scheduler step, forward or not (``apply_scheduler_output``, hooked before the model
   runner's ``_update_states``, which runs before its early return for a step that schedules no
   token): the state row of every request the step does not continue with its KV intact is
   freed: finished, preempted, not scheduled, resumed from preemption (its KV is recomputed into
   new blocks) or scheduled as new under an id that still holds a row. A freed row is reset before
   any request gets it again. Without this, a request preempted while it was alone (that step
   runs no forward, so phase 1 never sees it leave) kept its row and read its pre-preemption KV
   after resuming.
1. per forward, on the host (``begin_step``, hooked after vllm-ascend's
   ``update_sparse_kv_offload_metadata``): request ids -> state rows. A request keeps its state
   row while it stays in the batch, wherever condense or swap moves it; a request absent from the
   batch frees its row (phase 0 has normally done so already), and a row is reset before a request
   without one gets it, so no hit outlives its request's KV. The batch-index -> state-row table
   and each request's scheduled token count go to the device in place (fixed addresses: graph
   replays read the current values).
2. per layer, on the device (``onload_topk_kv``): tokens -> (state row, query index ``j``) from the
   token-to-request map (target or drafter's); tokens past their request's scheduled count
   (graph padding, whose ``token_to_req`` is 0) are dropped. Positions ``>= stable_prefix_len``
   are invalidated (rejected drafts are rewritten), ``plan`` runs on ``[R, T, K]``, and the misses
   become ``offload.sparse_copy`` descriptors (host address from the published global virtual
   address of the layer's host pool + the host block table; device address in the layer's buffer),
   compacted on the device: one K and one V descriptor per miss. ``skip_topk`` layers (IndexCache)
   reuse the group's plan and copy the same misses into their own buffer.

No value of a plan can make a copy leave its row: every slot is clamped to ``[0, C)`` and every
block id to the host pool before an address is formed; entries past a row's miss count write a
zero-length descriptor.
"""
from __future__ import annotations

import json
import os
from typing import Dict, List, Optional, Sequence

import torch

ENV_SWITCH = "AVSG_VLLM_ASCEND"
ENV_POLICY = "AVSG_POLICY"
CONFIG_KEY = "avsg"                 # additional_config["avsg"]: residency options

_BACKEND = None


def backend_class():
    """The manager class (defined on first use: it subclasses vllm-ascend's)."""
    global _BACKEND
    if _BACKEND is None:
        _BACKEND = _define_backend()
    return _BACKEND


def avsg_options(additional_config=None) -> Dict[str, object]:
    """Residency options: ``additional_config["avsg"]`` (a dict, or its JSON), then
    ``AVSG_POLICY``; defaults: the buffer's (``reference.DEFAULT_POLICY``, ``DEFAULT_LIFETIME``)."""
    from .. import reference
    opts: Dict[str, object] = {"policy": os.environ.get(ENV_POLICY, reference.DEFAULT_POLICY),
                               "lifetime": reference.DEFAULT_LIFETIME}
    raw = (additional_config or {}).get(CONFIG_KEY) if isinstance(additional_config, dict) \
        else None
    if isinstance(raw, str):
        raw = json.loads(raw)
    if raw:
        if not isinstance(raw, dict):
            raise ValueError(f"additional_config.{CONFIG_KEY}: expected a dict, got "
                             f"{type(raw).__name__}")
        unknown = set(raw) - {"policy", "lifetime"}
        if unknown:
            raise ValueError(f"additional_config.{CONFIG_KEY}: unknown keys {sorted(unknown)}; "
                             f"expected 'policy', 'lifetime'")
        opts.update(raw)
    if opts["policy"] not in reference.POLICY_IDS:
        raise ValueError(f"additional_config.{CONFIG_KEY}.policy / {ENV_POLICY}: expected one of "
                         f"{tuple(reference.POLICY_IDS)}, got {opts['policy']!r}")
    lifetime = opts["lifetime"]
    if raw and "lifetime" in raw and opts["policy"] != "lifetime":
        # (the default policy reads the lifetime: another one came from the config or the env)
        source = f"additional_config.{CONFIG_KEY}.policy" if "policy" in raw else ENV_POLICY
        raise ValueError(f"additional_config.{CONFIG_KEY}.lifetime: read only by the lifetime "
                         f"policy; the policy is {opts['policy']!r} (from {source})")
    if isinstance(lifetime, bool) or not isinstance(lifetime, int) or \
            not 1 <= lifetime <= reference.MAX_LIFETIME:
        raise ValueError(f"additional_config.{CONFIG_KEY}.lifetime: expected an int in "
                         f"[1, {reference.MAX_LIFETIME}], got {lifetime!r}")
    return opts


def _define_backend():
    from vllm.logger import logger
    from vllm_ascend.distributed.kv_transfer.sparse_kv_offload import \
        sparse_kv_offload_manager as vam

    from ..buffer import SparseKVBuffer

    base = getattr(vam, "_ORIGINAL_SPARSE_KV_OFFLOAD_MANAGER", vam.SparseKVOffloadManager)

    class AVSGSparseKVOffloadManager(base):
        def __init__(self, vllm_config, kv_cache_config, sparse_kv_offload_config):
            super().__init__(vllm_config, kv_cache_config, sparse_kv_offload_config)
            self.avsg_options = avsg_options(getattr(vllm_config, "additional_config", None))
            self.decode_width = 1
            if vllm_config.speculative_config is not None:
                self.decode_width += vllm_config.speculative_config.num_speculative_tokens
            logger.info("AVSG sparse KV offload backend active (policy=%s): residency planned "
                        "on the device, one buffer row per request",
                        self.avsg_options["policy"])

        def _build_cpp(self):
            """The host LRU is replaced; nothing to build."""
            self.sparse_kv_offload_cpp = None

        # ------------------------------------------------------------------ registration
        def register_kv_caches(self, kv_caches):
            super().register_kv_caches(kv_caches)
            R, T, K = self.max_num_reqs, self.decode_width, self.topk
            rows_per_req = self.max_num_topk_rows // R
            capacity = rows_per_req * self.topk_buffer_size
            if rows_per_req < 1 or capacity < T * K:
                raise ValueError(
                    f"AVSG sparse KV offload: a request's buffer of {capacity} slots "
                    f"(max_num_topk_rows={self.max_num_topk_rows} // max_num_seqs={R} rows of "
                    f"topk_buffer_size={self.topk_buffer_size}) is below topk * (1 + "
                    f"num_speculative_tokens) = {K} * {T}; raise max_num_batched_tokens or "
                    f"topk_buffer_size")
            self.avsg_capacity = C = capacity
            device = self.topk_buffers_k[0].device
            self.avsg_device = device
            opts = self.avsg_options
            policy = str(opts["policy"])
            self.avsg_buffers: List[SparseKVBuffer] = [
                SparseKVBuffer(rows=R, capacity=C, topk=K, queries_per_step=T,
                               lifetime=int(opts["lifetime"]), device=device, check=False,
                               policy=policy,
                               max_context=self.max_model_len if policy == "reuse" else None)
                for _ in range(self.num_layers)]
            # the top-k buffers' memory read as one row per request (same bytes)
            self.avsg_kv_k = [b.reshape(-1)[:R * C * b.shape[-1]].view(R, C, 1, b.shape[-1])
                              for b in self.topk_buffers_k]
            self.avsg_kv_v = [b.reshape(-1)[:R * C * b.shape[-1]].view(R, C, 1, b.shape[-1])
                              for b in self.topk_buffers_v]
            bs = self.block_size
            self.avsg_pages_per_row = C // bs
            self.resident_block_table_npu = torch.zeros(
                self.max_num_topk_rows, C // bs, dtype=torch.int32, device=device)
            self.resident_seq_lens_npu = torch.full((self.max_num_topk_rows,), C,
                                                    dtype=torch.int32, device=device)
            # per step (host truth, device copies the layers read)
            self._row_of_req: Dict[str, int] = {}
            self._free_rows: List[int] = list(range(R))
            self.avsg_state_row_of_batch = torch.full((R,), -1, dtype=torch.int64, device=device)
            self.avsg_batch_of_state_row = torch.zeros(R, dtype=torch.int64, device=device)
            self.avsg_scheduled_tokens = torch.zeros(R, dtype=torch.int64, device=device)
            # the group plan of the last non-skip layer (IndexCache reuses it)
            self._group_plan = None
            self._group_batch_rows = None
            M = R * T * K
            self.avsg_max_misses = M
            self.h2d_src_npu = torch.zeros(2 * M + 2, dtype=torch.int64, device=device)
            self.h2d_dst_npu = torch.zeros(2 * M + 2, dtype=torch.int64, device=device)
            self.h2d_len_npu = torch.zeros(2 * M + 2, dtype=torch.int32, device=device)
            self.h2d_count_npu = torch.zeros(1, dtype=torch.int32, device=device)
            self.avsg_h2d_rows = torch.zeros((), dtype=torch.int64, device=device)
            self.avsg_host_blocks = self.kv_cache_config.num_blocks
            logger.info("AVSG sparse KV offload: %d layers, %d request rows x %d slots (T=%d, "
                        "topk=%d), policy=%s", self.num_layers, R, C, T, K, policy)

        # ------------------------------------------------------------------ per step (host)
        def begin_step(self, req_ids: Sequence[Optional[str]], scheduled_tokens) -> None:
            """Map this step's batch (``req_ids[i]`` in batch row ``i``, ``scheduled_tokens[i]``
            tokens) to state rows; free the rows of requests no longer in the batch and reset a
            row before a request without one gets it (``apply_scheduler_output`` has freed the
            rows of resumed and restarted requests, so they get a reset one here)."""
            R = self.max_num_reqs
            if len(req_ids) > R:
                raise ValueError(f"req_ids: expected at most max_num_seqs = {R} requests, got "
                                 f"{len(req_ids)}")
            present = {r for r in req_ids if isinstance(r, str)}
            self.release_rows([r for r in self._row_of_req if r not in present])
            fresh: List[int] = []
            state_of_batch = [-1] * R
            batch_of_state = [0] * R
            counts = [0] * R
            for i, req in enumerate(req_ids):
                if not isinstance(req, str):
                    continue
                row = self._row_of_req.get(req)
                if row is None:
                    row = self._free_rows.pop(0)
                    self._row_of_req[req] = row
                    fresh.append(row)
                state_of_batch[i] = row
                batch_of_state[row] = i
                counts[i] = int(scheduled_tokens[i])
            if fresh:
                for buf in self.avsg_buffers:
                    buf.reset(fresh)
            self.avsg_state_row_of_batch.copy_(torch.tensor(state_of_batch, dtype=torch.int64))
            self.avsg_batch_of_state_row.copy_(torch.tensor(batch_of_state, dtype=torch.int64))
            self.avsg_scheduled_tokens.copy_(torch.tensor(counts, dtype=torch.int64))

        def apply_scheduler_output(self, scheduler_output) -> None:
            """Free the state rows of the requests this scheduler step does not continue with
            their KV intact. Called for every ``SchedulerOutput`` the model runner applies,
            including one that schedules no token (no forward, so no ``begin_step``)."""
            if not hasattr(self, "_row_of_req"):
                return                  # before register_kv_caches: no rows yet
            out = scheduler_output
            # KV gone or replaced: finished, preempted, resumed from preemption (recomputed into
            # new blocks; also in the very step of its preemption, as reset_prefix_cache does),
            # and new under an id that still holds a row (finished and resubmitted; a streaming
            # update too, where the reset only costs misses)
            kv_replaced = set(out.finished_req_ids)
            kv_replaced.update(getattr(out, "preempted_req_ids", None) or ())
            kv_replaced.update(getattr(out.scheduled_cached_reqs, "resumed_req_ids", None) or ())
            kv_replaced.update(new.req_id for new in out.scheduled_new_reqs)
            # not scheduled: the runner drops it from the persistent batch this step, so the
            # next begin_step would free its row anyway; freeing it now covers a step with no
            # forward
            scheduled = out.num_scheduled_tokens
            self.release_rows([req for req in self._row_of_req
                               if req in kv_replaced or req not in scheduled])

        def release_rows(self, req_ids: Sequence[str]) -> None:
            """Free the state rows of ``req_ids`` (ids without a row are skipped). A freed row is
            reset before ``begin_step`` gives it to any request, this one included."""
            for req in req_ids:
                row = self._row_of_req.pop(req, None)
                if row is not None:
                    self._free_rows.append(row)

        def state_row_of(self, req_id: str) -> Optional[int]:
            return self._row_of_req.get(req_id)

        # ------------------------------------------------------------------ attention views
        def resident_views(self, layer_name: str, rows: int):
            """What ``AscendSFAKVOffloadImpl._resident_views`` returns, over the whole buffer."""
            layer_id = self._get_offload_layer_id(layer_name)
            R, C, bs = self.max_num_reqs, self.avsg_capacity, self.block_size
            k, v = self.avsg_kv_k[layer_id], self.avsg_kv_v[layer_id]
            return (k.view(R * C // bs, bs, k.shape[-2], k.shape[-1]),
                    v.view(R * C // bs, bs, v.shape[-2], v.shape[-1]),
                    self.current_slots_npu[:rows],
                    self.resident_block_table_npu[:rows],
                    self.resident_query_lens_npu[:rows],
                    self.resident_seq_lens_npu[:rows])

        # ------------------------------------------------------------------ per layer (device)
        def onload_topk_kv(self, layer_name, num_tokens, num_reqs, block_table, topk_indices_npu,
                           current_slots_npu, req_ids_npu, stable_prefix_lens_npu,
                           token_to_req_npu=None, capturing=False, skip_topk=False):
            layer_id = self._get_offload_layer_id(layer_name)
            N = int(num_tokens)
            if N > self.max_num_topk_rows:
                raise ValueError(
                    "Sparse KV offload topk rows exceed configured workspace, "
                    f"num_tokens={N}, max_num_topk_rows={self.max_num_topk_rows}")
            if skip_topk:
                if layer_id == 0 or self._group_plan is None:
                    raise RuntimeError(f"skip_topk layer {layer_name}: no earlier layer planned "
                                       f"in this pass")
            else:
                self._plan_group(layer_id, N, block_table, topk_indices_npu,
                                 stable_prefix_lens_npu, token_to_req_npu, current_slots_npu)
            self._copy_misses(layer_id)
            if skip_topk and current_slots_npu.data_ptr() != self.current_slots_npu.data_ptr():
                current_slots_npu[:N].copy_(self.current_slots_npu[:N])

        def _plan_group(self, layer_id, N, block_table, topk_indices, stable_prefix_lens,
                        token_to_req, current_slots_out):
            R, T, K = self.max_num_reqs, self.decode_width, self.topk
            dev = self.avsg_device
            t = torch.arange(N, dtype=torch.int64, device=dev)
            if token_to_req is None:
                req = t.clone()
            else:
                req = token_to_req[:N].to(torch.int64).clamp(0, R - 1)
            # query index within the request: tokens of a request are contiguous
            first = torch.full((R,), N, dtype=torch.int64, device=dev)
            first.scatter_reduce_(0, req, t, reduce="amin")
            j = t - first.index_select(0, req)
            state_row = self.avsg_state_row_of_batch.index_select(0, req)
            valid = ((state_row >= 0) & (j < T)
                     & (j < self.avsg_scheduled_tokens.index_select(0, req)))
            plan_index = torch.where(valid, state_row.clamp(min=0) * T + j,
                                     torch.full_like(j, R * T))
            topk = topk_indices[:N].reshape(N, K).to(torch.int32)
            by_row = torch.full((R * T + 1, K), -1, dtype=torch.int32, device=dev)
            by_row.index_copy_(0, plan_index, topk)
            # per state row: the first rewritten position, and the kv length
            stable_tok = stable_prefix_lens[:N].to(torch.int64)
            big = torch.full((R + 1,), 1 << 24, dtype=torch.int64, device=dev)
            srow = torch.where(valid, state_row.clamp(min=0), torch.full_like(j, R))
            stable = big.scatter_reduce(0, srow, stable_tok, reduce="amin")[:R]
            count = torch.zeros(R + 1, dtype=torch.int64, device=dev)
            count.scatter_add_(0, srow, torch.ones_like(srow))
            count = count[:R]
            seq_lens = torch.where(count > 0, stable + count, 0).to(torch.int32)
            buf = self.avsg_buffers[layer_id]
            buf.invalidate(stable.clamp(max=1 << 24).to(torch.int32))
            plan = buf.plan(by_row[:R * T].view(R, T, K), seq_lens, check=False)
            self._group_plan = plan
            self._group_batch_rows = self.avsg_batch_of_state_row.clone()
            self._group_block_table = block_table
            # per token: its slots (valid first) and its request's pages
            slots = plan.slots.reshape(R * T, K).index_select(0, plan_index.clamp(max=R * T - 1))
            slots = torch.where(valid[:, None], slots, torch.full_like(slots, -1))
            current_slots_out[:N].copy_(_valid_first(slots))
            pages = (state_row.clamp(min=0)[:, None] * self.avsg_pages_per_row
                     + torch.arange(self.avsg_pages_per_row, device=dev)[None, :])
            self.resident_block_table_npu[:N].copy_(pages.to(torch.int32))

        def _copy_misses(self, layer_id):
            """The group plan's misses into this layer's buffer, from the shared host pool,
            by address (works on every TP rank: the bases are rank 0's published addresses)."""
            plan = self._group_plan
            R, C, bs = self.max_num_reqs, self.avsg_capacity, self.block_size
            M = self.avsg_max_misses
            dev = self.avsg_device
            W = plan.miss_pos.shape[1]
            counts = plan.miss_counts.to(torch.int64).clamp(0, W)
            idx = torch.arange(W, device=dev)[None, :]
            live = idx < counts[:, None]
            pos = plan.miss_pos.to(torch.int64).clamp(min=0)
            slot = plan.miss_slots.to(torch.int64).clamp(0, C - 1)
            table = self._group_block_table
            batch_rows = self._group_batch_rows.clamp(0, table.shape[0] - 1)
            blocks_of_row = table.index_select(0, batch_rows).to(torch.int64)   # [R, blocks]
            col = (pos // bs).clamp(max=blocks_of_row.shape[1] - 1)
            block = blocks_of_row.gather(1, col)
            live = live & (block >= 0) & (block < self.avsg_host_blocks)
            host_row = block.clamp(0, self.avsg_host_blocks - 1) * bs + pos % bs
            dev_row = torch.arange(R, device=dev)[:, None] * C + slot
            # compact the live entries to the front: row r's go after rows < r
            live_counts = live.sum(1)
            start = live_counts.cumsum(0) - live_counts
            rank = live.cumsum(1) - 1
            dest = torch.where(live, start[:, None] + rank, torch.full_like(idx, M))
            tk, tv = self.token_size_bytes_k, self.token_size_bytes_v
            src_k = self.gvas_k_bases[layer_id] + host_row * tk
            src_v = self.gvas_v_bases[layer_id] + host_row * tv
            dst_k = self.addr_k_bases[layer_id] + dev_row * tk
            dst_v = self.addr_v_bases[layer_id] + dev_row * tv
            d = dest.reshape(-1)
            self.h2d_len_npu.zero_()
            for half, (src, dst, size) in enumerate(((src_k, dst_k, tk), (src_v, dst_v, tv))):
                target = 2 * d + half
                self.h2d_src_npu.index_copy_(0, target, src.reshape(-1))
                self.h2d_dst_npu.index_copy_(0, target, dst.reshape(-1))
                self.h2d_len_npu.index_copy_(0, target, torch.where(
                    live, size, 0).reshape(-1).to(torch.int32))
            # the spare pair (2M, 2M+1) took every dropped entry: never copied
            self.h2d_len_npu[2 * M:].zero_()
            total = live.sum()
            self.h2d_count_npu.copy_((2 * total).to(torch.int32).view(1))
            self.avsg_h2d_rows += total
            if self.tp_size > 1:
                # TP0's D2H of this step's KV must land before any rank reads the pool
                self.tp_group.broadcast(torch.empty([], dtype=torch.int8, device=dev), src=0)
            vam.offload.sparse_copy(self.h2d_src_npu, self.h2d_dst_npu, self.h2d_len_npu,
                                    self.h2d_count_npu, dev)
            if plan.source is not None:
                # the copy is ours, not avsg.gather: tell the buffer, or its next call drops
                # the plan's misses as never copied (a plan made under capture is untracked)
                plan.source.mark_copied(plan)

    return AVSGSparseKVOffloadManager


def _valid_first(slots: torch.Tensor) -> torch.Tensor:
    """Per row, the valid (``>= 0``) entries first in their order, then ``-1``: a stable
    partition as one scatter (the destinations are a permutation)."""
    valid = slots >= 0
    n_valid = valid.sum(1, keepdim=True)
    dest = torch.where(valid, valid.cumsum(1) - 1, n_valid + (~valid).cumsum(1) - 1)
    return torch.full_like(slots, -1).scatter_(1, dest, slots)
