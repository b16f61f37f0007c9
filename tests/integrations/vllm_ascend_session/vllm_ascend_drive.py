"""vllm-ascend's real sparse-KV-offload call sites on AVSG, many steps, on CPU.

Collected by the vllm-ascend session (a subprocess of tests/integrations/test_vllm_ascend.py,
after vllm-ascend's own unit tests, with its conftest's torch_npu stub and the AVSG plugin loaded
through the entry point). Driven for real: ``update_sparse_kv_offload_metadata``,
``AscendSFAKVOffloadImpl.exec_kv`` and ``._execute_sparse_flash_attention_process``,
``SparseKVOffloadManager.__init__`` / ``register_kv_caches`` / ``offload_new_kv``. Replaced, because
they need an NPU: ``_compute_kv_only`` (rope/norm: here the KV is the input split), the
``DeviceOperator`` sparse flash attention (a CPU model that checks the op's constraints), the
"npu" device (tensors asked for on it are made on the CPU), and MemFabric: ``offload`` is a
stand-in whose ``sparse_copy`` moves bytes by address, and whose host pool only rank 0 holds;
TP rank 1 reaches it only through the addresses rank 0 broadcasts, and every copy is checked to
read the pool or the rank's own inputs and to write only the rank's own buffers (or the pool).
The tests at the end put vllm-ascend's model runner (``execute_model``, ``_update_states``, its
persistent batch) between a scheduler and these call sites, steps that schedule no token included
(vllm_ascend_runner_drive.py).
"""
import contextlib
import ctypes
import json
import os
import random
import runpy
import sys
from collections import OrderedDict
from types import SimpleNamespace
from zlib import adler32

import pytest
import torch

if "torch_npu" not in sys.modules:
    # run alone (not after vllm-ascend's unit tests): stub torch_npu the way its tests do, with the
    # conftest of the vllm-ascend tree on the path (found without importing it: that needs the stub)
    import importlib.util
    tree = os.path.dirname(os.path.dirname(importlib.util.find_spec("vllm_ascend").origin))
    runpy.run_path(os.path.join(tree, "tests", "ut", "conftest.py"))

import vllm_ascend.distributed.kv_transfer.sparse_kv_offload.sparse_kv_offload_manager as vam
from vllm.v1.utils import CpuGpuBuffer
from vllm_ascend.attention.attention_v1 import AscendAttentionState
from vllm_ascend.attention.sfa_kv_offload import AscendSFAKVOffloadImpl
from vllm_ascend.device.device_op import DeviceOperator

from avsg.integrations import vllm_ascend_plugin

torch.set_num_threads(1)     # tiny ops: threads only add wake-up latency on a shared machine

# geometry (small, so the run is fast; the code paths are the production ones)
BS = 16                 # block size of the host pool and the resident pages
S_BUF = 16              # vllm-ascend topk_buffer_size (per token row)
TOPK = 8
T = 2                   # MTP-1: one draft
R = 4                   # max_num_seqs
DK, DV = 32, 16         # kv_lora_rank, qk_rope_head_dim
HEADS = 2
MAX_LEN = 160
NUM_BLOCKS = 48
TARGET_LAYERS = ["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn",
                 "model.layers.2.self_attn.attn"]
MTP_LAYER = "model.layers.3.self_attn.attn"
SKIP = {"model.layers.1.self_attn.attn"}          # IndexCache: reuses layer 0's top-k
LAYERS = TARGET_LAYERS + [MTP_LAYER]
SCALE = 0.125


# ----------------------------------------------------------------------------- stand-ins
class Regions:
    """Every byte range a copy may touch, by owner."""

    def __init__(self):
        self.ranges = {}

    def add(self, owner, t):
        self.ranges.setdefault(owner, []).append(
            (t.data_ptr(), t.data_ptr() + t.numel() * t.element_size(), t))

    def drop(self, owner):
        self.ranges.pop(owner, None)

    def owner(self, addr, length):
        for owner, spans in self.ranges.items():
            for lo, hi, _ in spans:
                if lo <= addr and addr + length <= hi:
                    return owner
        return None


REGIONS = Regions()


class FakeOffload:
    """MemFabric's ``offload`` API as the manager calls it."""

    class Scene:
        SHARED = 1

    class OffloadConfig:
        pass

    def __init__(self):
        self.rank = 0
        self.pool_allocs = []
        self.copies = 0

    def initialize(self, config):
        return 0

    def empty(self, shape, dtype, pin_memory=True):
        t = torch.zeros(shape, dtype=dtype)
        self.pool_allocs.append(t)
        REGIONS.add("pool", t)
        return t

    def sparse_copy(self, src, dst, lengths, size, device):
        n = int(size.reshape(-1)[0])
        s, d, ln = src[:n].tolist(), dst[:n].tolist(), lengths[:n].tolist()
        for a, b, k in zip(s, d, ln):
            if k == 0:
                continue
            src_owner, dst_owner = REGIONS.owner(a, k), REGIONS.owner(b, k)
            assert src_owner in ("pool", f"input{self.rank}"), f"copy reads {src_owner} at {a:#x}"
            assert dst_owner in ("pool", f"buffer{self.rank}"), \
                f"rank {self.rank} copy writes {dst_owner}"
            ctypes.memmove(b, a, k)
            self.copies += 1
        return 0


OFFLOAD = FakeOffload()
vam.offload = OFFLOAD           # the module imports memfabric_hybrid.offload when it exists


class Mailbox:
    """TP group stand-in: rank 0 goes first, the others receive what it broadcast."""

    def __init__(self):
        self.sent = []
        self.received = {}

    def group(self, rank):
        box = self

        class Group:
            def broadcast(self, tensor, src=0):
                if tensor.dim() == 0:
                    return          # the stream barrier before H2D
                if rank == 0:
                    box.sent.append(tensor.clone())
                else:
                    i = box.received.get(rank, 0)
                    tensor.copy_(box.sent[i])
                    box.received[rank] = i + 1

            def barrier(self):
                pass
        return Group()


@contextlib.contextmanager
def npu_on_cpu():
    """Tensors asked for on "npu" are made on the CPU; pinning is a no-op."""
    names = ["zeros", "empty", "full", "arange", "ones", "tensor"]
    saved = {n: getattr(torch, n) for n in names}
    saved_pin = torch.Tensor.pin_memory

    def wrap(fn):
        def inner(*args, **kwargs):
            if str(kwargs.get("device", "")) .startswith("npu"):
                kwargs["device"] = "cpu"
            kwargs.pop("pin_memory", None)
            return fn(*args, **kwargs)
        return inner
    for n in names:
        setattr(torch, n, wrap(saved[n]))
    torch.Tensor.pin_memory = lambda self, *a, **k: self
    try:
        yield
    finally:
        for n in names:
            setattr(torch, n, saved[n])
        torch.Tensor.pin_memory = saved_pin


def scores(q_nope, q_pe, k_rows, pe_rows, scale):
    return (q_nope.float() @ k_rows.float().T + q_pe.float() @ pe_rows.float().T) * scale


def attend(q_nope, q_pe, k_rows, pe_rows, scale):
    """Attention of one token over its selected rows (both sides call this: same arithmetic)."""
    return torch.softmax(scores(q_nope, q_pe, k_rows, pe_rows, scale), dim=-1) @ k_rows.float()


def split_tolerance(q_nope, q_pe, k_rows, pe_rows, scale):
    """docs/overlap.md's fp32 bound for one token (tests/helpers/split_bound.py, restated: this
    session imports nothing from the suite's helpers)."""
    import math
    u = 2.0 ** -24
    width = q_nope.shape[-1] + q_pe.shape[-1]
    K = k_rows.shape[0]
    terms = float(((q_nope.float().abs() @ k_rows.float().abs().T
                    + q_pe.float().abs() @ pe_rows.float().abs().T) * scale).max())
    lam = 2 * float(scores(q_nope, q_pe, k_rows, pe_rows, scale).abs().max()) + math.log(K)
    V = float(k_rows.float().abs().max())
    return V * (4 * width * u / (1 - width * u) * terms
                + (8 * K + 6 * lam + 4 * math.log(K) + 20) * u)


ATTN_CALLS = []


def cpu_sparse_flash_attention(cls, sfa_impl, ql_nope, q_pe, kv_cache, topk_indices,
                               attn_metadata, actual_seq_lengths_query, actual_seq_lengths_key, *,
                               block_table=None, sparse_mode=3, return_lse=False):
    """npu_sparse_flash_attention (TND query, PA_BSND kv, sparse_block_size 1), checking the
    constraints the op documents: int32 sparse_indices [T, 1, K] with valid indices first
    (then -1) below each token's kv length; cumulative query lengths; block table rows inside
    the paged cache; sparse_mode 3. ``return_lse``: also the softmax max and sum of every token
    and head, fp32 ``[1, T, heads]`` (TND; a token with nothing selected: max 0, sum 0)."""
    assert sparse_mode == 3
    k_cache, pe_cache = kv_cache
    n = ql_nope.shape[0]
    assert topk_indices.dtype == torch.int32 and topk_indices.shape[:2] == (n, 1)
    assert block_table.dtype == torch.int32 and block_table.shape[0] == n
    assert torch.equal(actual_seq_lengths_query[:n].long(), torch.arange(1, n + 1))
    pages, bs = k_cache.shape[0], k_cache.shape[1]
    assert bool((block_table >= 0).all()) and bool((block_table < pages).all())
    out = torch.zeros(n, ql_nope.shape[1], ql_nope.shape[2])
    smax = torch.zeros(1, n, ql_nope.shape[1])
    ssum = torch.zeros(1, n, ql_nope.shape[1])
    for t in range(n):
        idx = topk_indices[t, 0].long()
        valid = idx >= 0
        nv = int(valid.sum())
        assert bool(valid[:nv].all()) and not bool(valid[nv:].any()), "valid indices first"
        kv_len = int(actual_seq_lengths_key[t])
        assert kv_len <= block_table.shape[1] * bs
        sel = idx[:nv]
        assert bool((sel < kv_len).all())
        page = block_table[t].long()[sel // bs]
        k_rows = k_cache[page, sel % bs, 0]
        pe_rows = pe_cache[page, sel % bs, 0]
        if nv:
            out[t] = attend(ql_nope[t], q_pe[t], k_rows, pe_rows, SCALE)
            if return_lse:
                logits = scores(ql_nope[t], q_pe[t], k_rows, pe_rows, SCALE)
                smax[0, t] = logits.amax(-1)
                ssum[0, t] = torch.exp(logits - smax[0, t][:, None]).sum(-1)
    ATTN_CALLS.append((n, return_lse))
    return (out, smax, ssum) if return_lse else out


# ----------------------------------------------------------------------------- model + engine
def vllm_config(policy="reuse", split=False):
    return SimpleNamespace(
        model_config=SimpleNamespace(
            get_num_layers=lambda parallel_config: len(TARGET_LAYERS), max_model_len=MAX_LEN,
            hf_text_config=SimpleNamespace(kv_lora_rank=DK, qk_rope_head_dim=DV)),
        parallel_config=SimpleNamespace(),
        scheduler_config=SimpleNamespace(max_num_seqs=R, max_num_batched_tokens=64),
        speculative_config=SimpleNamespace(num_speculative_tokens=T - 1),
        kv_transfer_config=None, additional_config={"avsg": dict(
            {"policy": policy}, **({"split_attention": True} if split else {}))})


def offload_config():
    return SimpleNamespace(topk_buffer_size=S_BUF, topk=TOPK, dram_size_per_dp_GB=1,
                           keep_device_kv_cache=False, enabled=True)


def make_manager(rank, tp_size, mailbox, pool, policy="reuse", split=False):
    cfg = vllm_config(policy, split)
    kv_cache_config = SimpleNamespace(
        num_blocks=NUM_BLOCKS,
        kv_cache_groups=[SimpleNamespace(kv_cache_spec=SimpleNamespace(block_size=BS))])
    vam.get_tensor_model_parallel_rank = lambda: rank
    vam.get_tensor_model_parallel_world_size = lambda: tp_size
    vam.get_tp_group = lambda: mailbox.group(rank)
    OFFLOAD.rank = rank
    with npu_on_cpu():
        manager = vam.init_sparse_kv_offload_manager(cfg, kv_cache_config, offload_config())
        kv_caches = {}
        for i, name in enumerate(LAYERS):
            k_buf = torch.zeros(cfg.scheduler_config.max_num_seqs * T, S_BUF, 1, DK,
                                dtype=torch.bfloat16)
            v_buf = torch.zeros(cfg.scheduler_config.max_num_seqs * T, S_BUF, 1, DV,
                                dtype=torch.bfloat16)
            REGIONS.add(f"buffer{rank}", k_buf)
            REGIONS.add(f"buffer{rank}", v_buf)
            k_cpu, v_cpu = pool[i] if rank == 0 else (None, None)
            kv_caches[name] = (None, None, k_cpu, v_cpu, k_buf, v_buf)
            kv_caches[name.replace("attn", "indexer.k_cache")] = torch.zeros(1)
        manager.register_kv_caches(kv_caches)
    return manager


def make_impl(name):
    impl = AscendSFAKVOffloadImpl.__new__(AscendSFAKVOffloadImpl)
    impl.layer_name = name
    impl._current_layer_name = None
    impl.skip_topk = name in SKIP
    impl.num_kv_heads = 1
    impl.kv_lora_rank, impl.qk_rope_head_dim = DK, DV
    impl.scale = SCALE
    impl._compute_kv_only = compute_kv_only
    return impl


def compute_kv_only(kv_no_split, cos, sin):
    """rope / rms norm run on the NPU; here the new KV is the input split as it is."""
    k_nope = kv_no_split[..., :DK].contiguous()
    k_pe = kv_no_split[..., DK:].contiguous()
    REGIONS.add(f"input{OFFLOAD.rank}", k_nope)
    REGIONS.add(f"input{OFFLOAD.rank}", k_pe)
    return k_nope, k_pe


class Request:
    def __init__(self, rid, prompt_len, rng):
        self.rid, self.n = rid, prompt_len       # n: positions whose KV is final
        self.blocks = []
        self.hot = rng.sample(range(prompt_len), min(prompt_len, TOPK))


class Engine:
    """A persistent batch as vLLM's InputBatch keeps it, a host pool with a block allocator,
    the true KV of every request, and the per-token LRU model of vllm-ascend at equal memory."""

    def __init__(self, tp_size, seed=0, policy="reuse", split=False):
        self.rng = random.Random(seed)
        torch.manual_seed(seed)
        REGIONS.ranges.clear()          # (the tensors a range holds stay alive with it)
        self.pool = [(OFFLOAD.empty([NUM_BLOCKS * BS * DK * 2], torch.int8)
                      .view(torch.bfloat16).view(NUM_BLOCKS, BS, 1, DK),
                      OFFLOAD.empty([NUM_BLOCKS * BS * DV * 2], torch.int8)
                      .view(torch.bfloat16).view(NUM_BLOCKS, BS, 1, DV))
                     for _ in LAYERS]
        mailbox = Mailbox()
        self.managers = []
        for rank in range(tp_size):
            vam._SPARSE_KV_OFFLOAD_MANAGER = None
            self.managers.append(make_manager(rank, tp_size, mailbox, self.pool, policy, split))
        self.split = split
        self.impls = {name: make_impl(name) for name in LAYERS}
        self.free_blocks = list(range(NUM_BLOCKS))
        self.batch = []                  # persistent batch: requests in rows 0..n-1
        self.waiting = []                # preempted, to resume
        self.truth = {}                  # rid -> [layers, MAX_LEN, DK + DV] bf16
        self.next_id = 0
        self.lru = LRUModel()
        self.exact_tokens = 0
        self.checked_padding = 0
        self.req_ids_buf = CpuGpuBuffer(R, dtype=torch.int64, device="cpu", pin_memory=False)
        self.token_to_req_buf = CpuGpuBuffer(64, dtype=torch.int32, device="cpu",
                                             pin_memory=False)
        self.qsl_buf = CpuGpuBuffer(R + 1, dtype=torch.int32, device="cpu", pin_memory=False)

    # ---- host pool
    def ensure_blocks(self, req, length):
        while len(req.blocks) * BS < length:
            req.blocks.append(self.free_blocks.pop(0))

    def release(self, req):
        self.free_blocks.extend(req.blocks)
        req.blocks = []

    def host_row(self, req, pos):
        return req.blocks[pos // BS] * BS + pos % BS

    def write_prefill(self, req):
        """PD decode node: the prompt's KV arrives in the pool (new values on a resumption:
        anything a stale hit served would differ)."""
        self.ensure_blocks(req, req.n + T)
        kv = (torch.randn(len(LAYERS), MAX_LEN, DK + DV)).to(torch.bfloat16)
        self.truth[req.rid] = kv
        for layer, (k_pool, v_pool) in enumerate(self.pool):
            for pos in range(req.n):
                b, o = req.blocks[pos // BS], pos % BS
                k_pool[b, o, 0] = kv[layer, pos, :DK]
                v_pool[b, o, 0] = kv[layer, pos, DK:]

    # ---- lifecycle
    def add(self):
        req = Request(f"req-{self.next_id}", self.rng.randint(20, 60), self.rng)
        self.next_id += 1
        self.write_prefill(req)
        self.batch.append(req)

    def finish(self, row):
        req = self.batch.pop(row)          # then condense: the last row moves into the hole
        if row < len(self.batch):
            self.batch.insert(row, self.batch.pop())
        self.release(req)
        self.truth.pop(req.rid)

    def preempt(self, row):
        req = self.batch.pop(row)
        self.release(req)
        self.waiting.append(req)

    def resume(self):
        req = self.waiting.pop(0)
        self.write_prefill(req)
        self.batch.append(req)

    def swap(self, a, b):
        self.batch[a], self.batch[b] = self.batch[b], self.batch[a]

    # ---- one step: verify pass (target layers), then the draft pass (MTP layer)
    def topk_for(self, req, limit):
        """Top-k of a token that may attend positions < limit: mostly the request's hot set,
        some recent and some random positions; sometimes -1 among them."""
        picks = [p for p in req.hot if p < limit]
        if self.rng.random() < 0.3 and req.hot:
            req.hot[self.rng.randrange(len(req.hot))] = self.rng.randrange(limit)
        picks += [limit - 1 - i for i in range(3) if limit - 1 - i >= 0]
        picks += [self.rng.randrange(limit) for _ in range(3)]
        picks = list(dict.fromkeys(picks))[:TOPK]
        row = picks + [-1] * (TOPK - len(picks))
        if self.rng.random() < 0.3:
            self.rng.shuffle(row)          # -1 among valid entries: the op needs them last
        return row

    def step(self, pad_to=None, update_metadata=None):
        """One forward of ``self.batch``; ``update_metadata``: the function standing for the
        model runner's call (default: the manager module's, looked up now: the plugin wraps it)."""
        batch = self.batch
        nreq = len(batch)
        if nreq == 0:
            return
        for req in batch:
            self.ensure_blocks(req, req.n + T)
        q_lens = [T] * nreq
        n_tok = sum(q_lens)
        n_pad = pad_to or n_tok
        qsl = [0]
        for q in q_lens:
            qsl.append(qsl[-1] + q)
        self.qsl_buf.np[:nreq + 1] = qsl
        self.qsl_buf.copy_to_gpu(nreq + 1)
        req_ids = [r.rid for r in batch]
        for rank, manager in enumerate(self.managers):
            vam._SPARSE_KV_OFFLOAD_MANAGER = manager
            (update_metadata or vam.update_sparse_kv_offload_metadata)(
                n_tok, nreq, n_pad, nreq, req_ids, self.qsl_buf, self.req_ids_buf,
                self.token_to_req_buf)
        token_to_req = self.token_to_req_buf.gpu[:n_pad].clone()
        assert token_to_req[:n_tok].tolist() == sum([[i] * T for i in range(nreq)], [])
        seq_lens = [r.n + T for r in batch]
        positions = [(i, r, r.n + j) for i, r in enumerate(batch) for j in range(T)]
        # the verify pass's new KV, per layer (rewrites the rejected draft's position)
        new_kv = torch.randn(len(LAYERS), n_pad, DK + DV).to(torch.bfloat16)
        topk = []
        for i, r, pos in positions:
            topk.append(self.topk_for(r, pos + 1))
        for _ in range(n_pad - n_tok):
            topk.append(self.topk_for(batch[0], seq_lens[0]))   # padding rows: req 0
        topk = torch.tensor(topk, dtype=torch.int32).view(n_pad, 1, TOPK)
        block_table = self.block_table()
        slots = torch.tensor([self.host_row(r, pos) for _, r, pos in positions]
                             + [-1] * (n_pad - n_tok), dtype=torch.int64)
        meta = SimpleNamespace(
            attn_state=AscendAttentionState.SpecDecoding, num_decodes=nreq, num_prefills=0,
            num_decode_tokens=n_pad, req_ids_tensor=self.req_ids_buf.gpu[:nreq].clone(),
            token_to_req=token_to_req, block_table=block_table)
        seq_t = torch.tensor(seq_lens, dtype=torch.int32)
        cum_q = torch.tensor(qsl[1:], dtype=torch.int32)
        q = torch.randn(len(LAYERS), n_pad, HEADS, DK + DV).to(torch.bfloat16)
        for layer_id, name in enumerate(TARGET_LAYERS):
            for i, r, pos in positions:
                self.truth[r.rid][layer_id, pos] = new_kv[layer_id, positions.index((i, r, pos))]
            self.run_layer(layer_id, name, new_kv[layer_id], slots, meta, topk, q[layer_id],
                           cum_q, seq_t, n_tok, [(r, p) for _, r, p in positions])
        # acceptance: the draft is kept or rejected (its position is rewritten next step)
        mtp = len(TARGET_LAYERS)
        for r in batch:
            accepted = T if self.rng.random() < 0.6 else 1
            # the drafter's first pass writes the MTP layer's KV of the accepted positions but
            # the last one (the draft pass below writes that one through exec_kv)
            for pos in range(r.n, r.n + accepted - 1):
                kv = torch.randn(DK + DV).to(torch.bfloat16)
                self.truth[r.rid][mtp, pos] = kv
                b, o = r.blocks[pos // BS], pos % BS
                self.pool[mtp][0][b, o, 0] = kv[:DK]
                self.pool[mtp][1][b, o, 0] = kv[DK:]
            r.n += accepted
        self.draft_pass()

    def draft_pass(self):
        """The drafter's MTP layer: one token per request at its last position, with the
        drafter's own token_to_req (arange) and query lengths of 1."""
        batch = self.batch
        nreq = len(batch)
        layer_id = len(TARGET_LAYERS)
        positions = [(r, r.n - 1) for r in batch]
        new_kv = torch.randn(nreq, DK + DV).to(torch.bfloat16)
        for i, (r, pos) in enumerate(positions):
            self.truth[r.rid][layer_id, pos] = new_kv[i]
        topk = torch.tensor([self.topk_for(r, r.n) for r in batch],
                            dtype=torch.int32).view(nreq, 1, TOPK)
        meta = SimpleNamespace(
            attn_state=AscendAttentionState.SpecDecoding, num_decodes=nreq, num_prefills=0,
            num_decode_tokens=nreq, req_ids_tensor=torch.arange(1, nreq + 1),
            token_to_req=torch.arange(nreq, dtype=torch.int32), block_table=self.block_table())
        slots = torch.tensor([self.host_row(r, pos) for r, pos in positions])
        q = torch.randn(nreq, HEADS, DK + DV).to(torch.bfloat16)
        self.run_layer(layer_id, MTP_LAYER, new_kv, slots, meta, topk, q,
                       torch.arange(1, nreq + 1, dtype=torch.int32),
                       torch.tensor([r.n for r in batch], dtype=torch.int32), nreq, positions)

    def block_table(self):
        width = MAX_LEN // BS
        table = torch.full((len(self.batch), width), 0, dtype=torch.int32)
        for i, r in enumerate(self.batch):
            table[i, :len(r.blocks)] = torch.tensor(r.blocks, dtype=torch.int32)
        return table

    def run_layer(self, layer_id, name, new_kv, slots, meta, topk, q, cum_q, seq_t, n_real,
                  token_positions):
        impl = self.impls[name]
        outs = []
        for rank, manager in enumerate(self.managers):
            vam._SPARSE_KV_OFFLOAD_MANAGER = manager
            OFFLOAD.rank = rank
            kv_in = new_kv.reshape(-1, 1, 1, DK + DV).contiguous()
            REGIONS.drop(f"input{rank}")
            REGIONS.add(f"input{rank}", kv_in)
            impl.exec_kv(kv_in, None, None, None, slots, meta)
            self.lru.observe(rank, layer_id, name in SKIP, meta, topk, seq_t, cum_q)
            out = impl._execute_sparse_flash_attention_process(
                q[:, :, :DK], q[:, :, DK:], None, topk, meta, cum_q, seq_t)
            outs.append(out)
        # every output equals attention over the true KV of the selected positions
        for out in outs:
            for t in range(n_real):
                r, pos = token_positions[t]
                seq_len = int(seq_t[meta.token_to_req[t]])
                sel = [p for p in topk[t, 0].tolist() if 0 <= p < seq_len]
                true = self.truth[r.rid][layer_id]
                k_rows = true[sel, :DK]
                pe_rows = true[sel, DK:]
                want = attend(q[t, :, :DK], q[t, :, DK:], k_rows, pe_rows, SCALE) if sel else \
                    torch.zeros(HEADS, DK)
                if self.split and sel:
                    # hits, then misses, merged: within the stated bound, not bit for bit
                    tol = split_tolerance(q[t, :, :DK], q[t, :, DK:], k_rows, pe_rows, SCALE)
                    err = float((out[t] - want).abs().max())
                    assert err <= tol, f"layer {name} token {t} ({r.rid}@{pos}): {err} > {tol}"
                else:
                    assert torch.equal(out[t], want), f"layer {name} token {t} ({r.rid}@{pos})"
                self.exact_tokens += 1
            self.checked_padding += out.shape[0] - n_real


class LRUModel:
    """vllm-ascend's residency as it behaves (our own code): per layer, one buffer of S_BUF slots
    per token row of the flat batch, reset when the request in that row changes; positions at or
    past the token's stable prefix are dropped; hits stay; misses take the least recently used
    slots; skip_topk layers copy the previous layer's misses. Counts H2D rows."""

    def __init__(self):
        self.rows = {}          # (layer, token row) -> (req id, OrderedDict pos -> None)
        self.h2d = 0
        self.last = 0

    def observe(self, rank, layer_id, skip, meta, topk, seq_t, cum_q):
        if rank != 0:
            return
        if skip:
            self.h2d += self.last
            return
        n = int(meta.num_decode_tokens)
        nreq = int(meta.num_decodes)
        q_lens = torch.diff(torch.cat([torch.zeros(1, dtype=cum_q.dtype), cum_q[:nreq]]))
        misses = 0
        for t in range(n):
            req = int(meta.token_to_req[t])
            rid = int(meta.req_ids_tensor[req])
            seq_len = int(seq_t[req])
            stable = seq_len - int(q_lens[req])
            key = (layer_id, t)
            owner, resident = self.rows.get(key, (None, None))
            if owner != rid:
                resident = OrderedDict()
            for pos in [p for p in resident if p >= stable]:
                del resident[pos]
            want = [p for p in topk[t, 0].tolist() if 0 <= p < seq_len]
            for pos in want:
                if pos in resident:
                    resident.move_to_end(pos)
            for pos in want:
                if pos not in resident:
                    if len(resident) >= S_BUF:
                        resident.popitem(last=False)
                    resident[pos] = None
                    misses += 1
            self.rows[key] = (rid, resident)
        self.h2d += misses
        self.last = misses


def run_drive(tp_size, steps, seed, split=False):
    DeviceOperator.execute_sparse_flash_attention_process = classmethod(
        cpu_sparse_flash_attention)
    engine = Engine(tp_size, seed, split=split)
    rng = engine.rng
    for _ in range(3):
        engine.add()
    events = {"finish": 0, "preempt": 0, "resume": 0, "swap": 0, "padded": 0, "add": 3}
    for step in range(steps):
        if len(engine.batch) < R and (engine.waiting and rng.random() < 0.5):
            engine.resume()
            events["resume"] += 1
        elif len(engine.batch) < R and rng.random() < 0.3:
            engine.add()
            events["add"] += 1
        for r in list(engine.batch):
            if r.n + 2 * T >= MAX_LEN - BS:
                engine.finish(engine.batch.index(r))
                events["finish"] += 1
        if len(engine.batch) > 1 and step % 7 == 3:
            engine.finish(0)                                   # condense moves the last row
            events["finish"] += 1
        if len(engine.batch) > 1 and step % 11 == 5:
            engine.preempt(len(engine.batch) - 1)
            events["preempt"] += 1
        if len(engine.batch) > 1 and step % 5 == 1:
            engine.swap(0, len(engine.batch) - 1)
            events["swap"] += 1
        if not engine.batch:
            engine.add()
            events["add"] += 1
        pad = None
        if step % 3 == 2 and len(engine.batch) < R:
            pad = R * T                     # graph padding to the captured size, token_to_req 0
            events["padded"] += 1
        engine.step(pad_to=pad)
    avsg_rows = int(engine.managers[0].avsg_h2d_rows)
    return engine, events, avsg_rows


# ----------------------------------------------------------------------------- tests
def test_switch_off_left_vllm_ascend_untouched():
    import avsg_vllm_hook
    assert avsg_vllm_hook.SWITCH_OFF == {"untouched": True, "entry_point_called": True,
                                         "no_original_saved": True}


def test_plugin_is_installed_through_the_entry_point():
    assert vam.SparseKVOffloadManager.__name__ == "AVSGSparseKVOffloadManager"
    assert issubclass(vam.SparseKVOffloadManager, vam._ORIGINAL_SPARSE_KV_OFFLOAD_MANAGER)


def test_unsupported_versions_are_one_line_errors(monkeypatch):
    import vllm
    monkeypatch.setattr(vllm, "__version__", "0.26.0")
    with pytest.raises(vllm_ascend_plugin.UnsupportedVersion) as err:
        vllm_ascend_plugin.check_versions()
    assert "\n" not in str(err.value) and "vllm 0.27.x" in str(err.value)
    monkeypatch.setattr(vllm, "__version__", "0.27.1")
    stock = vam._ORIGINAL_SPARSE_KV_OFFLOAD_MANAGER.onload_topk_kv

    def onload_topk_kv(self, layer_name, num_tokens):
        pass
    monkeypatch.setattr(vam._ORIGINAL_SPARSE_KV_OFFLOAD_MANAGER, "onload_topk_kv",
                        onload_topk_kv)
    with pytest.raises(vllm_ascend_plugin.UnsupportedVersion) as err:
        vllm_ascend_plugin.check_versions()
    assert "\n" not in str(err.value) and "182b75ea" in str(err.value)
    monkeypatch.setattr(vam._ORIGINAL_SPARSE_KV_OFFLOAD_MANAGER, "onload_topk_kv", stock)
    vllm_ascend_plugin.check_versions()


def test_drive_split_attention_within_the_stated_tolerance():
    """additional_config avsg.split_attention: vllm-ascend's decode call of sparse flash
    attention (a CPU model returning the softmax max and sum) runs over the hits, then the
    misses, merged by log-sum-exp (no torch_npu.npu_attention_update under the stub: the
    reference merge); every output is within docs/overlap.md's bound of attention over the true
    KV, through finishes, preemptions, swaps, graph padding and an IndexCache layer."""
    ATTN_CALLS.clear()
    engine, events, _ = run_drive(1, steps=24, seed=5, split=True)
    assert engine.managers[0].avsg_split and engine.exact_tokens > 0
    assert all(events[k] > 0 for k in ("finish", "swap", "padded")), events
    with_lse = [c for c in ATTN_CALLS if c[1]]
    assert with_lse and not [c for c in ATTN_CALLS if not c[1]]      # every decode call split
    # split off (the default): the same drive is bit-exact and never asks for the LSE
    ATTN_CALLS.clear()
    engine, _, _ = run_drive(1, steps=6, seed=5)
    assert not engine.managers[0].avsg_split and all(not c[1] for c in ATTN_CALLS)


@pytest.mark.parametrize("tp_size", [1, 2])
def test_drive_many_steps_exact(tp_size):
    engine, events, avsg_rows = run_drive(tp_size, steps=60 if tp_size == 1 else 24, seed=tp_size)
    assert all(events[k] > 0 for k in events), events
    assert engine.exact_tokens > 0 and engine.checked_padding > 0
    if tp_size == 2:
        # rank 1 holds no host tensor: everything it read came through rank 0's addresses
        assert engine.managers[1].k_caches_cpu == []
        # what vllm-ascend's PD D2H connector (sfa_pd_rd2h) reads is vllm-ascend's, intact
        m0, m1 = engine.managers
        assert m0.gvas_k_bases == m1.gvas_k_bases == [k.data_ptr() for k, _ in engine.pool]
        assert m0.gvas_v_bases == m1.gvas_v_bases == [v.data_ptr() for _, v in engine.pool]
        assert m0.cpu_block_lens == m1.cpu_block_lens
        assert m0.offload_layer_names == m1.offload_layer_names == LAYERS
        assert [m0._get_offload_layer_id(n) for n in LAYERS] == list(range(len(LAYERS)))
        for a, b in zip(engine.managers[0].avsg_kv_k, engine.managers[1].avsg_kv_k):
            assert torch.equal(a, b)
    report = os.environ.get("AVSG_VLLM_ASCEND_REPORT")
    if report and tp_size == 1:
        with open(report, "w") as f:
            json.dump({"avsg_h2d_rows": avsg_rows, "lru_h2d_rows": engine.lru.h2d,
                       "events": events, "exact_tokens": engine.exact_tokens,
                       "buffer_slots_per_request": T * S_BUF, "topk": TOPK, "T": T}, f)


def test_the_drive_catches_a_stale_hit(monkeypatch):
    """Without the row reset, a new or resumed request reads its predecessor's KV: the drive's
    exactness check must fail (so it can)."""
    from avsg.buffer import SparseKVBuffer
    stock = SparseKVBuffer.reset
    # construction still initialises the state; only the per-request resets are dropped
    monkeypatch.setattr(SparseKVBuffer, "reset",
                        lambda self, rows=None: stock(self) if rows is None else None)
    with pytest.raises(AssertionError, match="layer model.layers"):
        run_drive(1, steps=60, seed=1)


# ----------------------------------------------------------------------------- the model runner
# vllm-ascend's model runner between a scheduler and the layers, steps without a forward included
# (vllm_ascend_runner_drive.py; imported in the tests, as it imports this module)
RUNNER_SCENARIOS = ["preempted_alone", "several_preempted_resumed_in_order",
                    "several_preempted_resumed_in_reverse",
                    "preempted_beside_then_alone_resume_earlier_first",
                    "preempted_beside_then_alone_resume_later_first",
                    "preempted_and_resumed_in_one_step", "finished_alone_then_same_id_again"]


@pytest.mark.parametrize("policy", ["lifetime", "reuse", "lru"])
@pytest.mark.parametrize("scenario", RUNNER_SCENARIOS)
def test_runner_resumed_requests_read_their_current_kv(scenario, policy):
    """Preemption (alone, beside others, several at once, resumed in either order or in the same
    step), finish and an id used again, through the runner's execute_model: every attention
    output exact against the host's current KV, and after every step (forward or not) exactly
    that step's requests hold a state row."""
    import vllm_ascend_runner_drive as runner_drive
    assert sorted(runner_drive.SCENARIOS) == sorted(RUNNER_SCENARIOS)
    runner_drive.run_scenario(scenario, policy)


def test_runner_hook_wraps_update_states_and_uninstall_restores_it():
    import vllm_ascend_runner_drive as runner_drive
    runner_cls = runner_drive.npu_runner.NPUModelRunner
    runner_drive.RunnerEngine("reuse")           # a manager built: the runtime hooks are in
    hooked = runner_cls._update_states
    assert hooked._avsg and hooked._stock.__qualname__ == "NPUModelRunner._update_states"
    vllm_ascend_plugin.uninstall()
    try:
        assert runner_cls._update_states is hooked._stock
        assert not hasattr(vam.update_sparse_kv_offload_metadata, "_stock")
    finally:
        vllm_ascend_plugin.install()
        runner_drive.RunnerEngine("reuse")
    assert runner_cls._update_states._stock is hooked._stock


# ----------------------------------------------------------------------------- the soak
# A seeded random schedule through the model runner, every read byte-checked against the host
# pool (vllm_ascend_runner_soak.py; AVSG_SOAK_STEPS sets its length, tests/integrations/
# test_serving_soak.py runs the long one)
@pytest.mark.parametrize("policy", ["lifetime", "reuse", "lru"])
def test_runner_soak(policy):
    import vllm_ascend_runner_soak as soak
    soak.check_coverage(soak.run_soak(policy))


@pytest.mark.parametrize("variant", ["reset", "scheduler_hook", "invalidate", "uncopied",
                                     "discard"])
def test_runner_soak_catches_a_broken_variant(variant, monkeypatch):
    """Each deliberately broken variant (vllm_ascend_runner_soak.BROKEN) fails the short soak
    with a stale read: the soak can fail."""
    import vllm_ascend_runner_soak as soak
    with pytest.raises(soak.StaleRead):
        soak.run_broken(variant, monkeypatch)


@pytest.mark.parametrize("policy", ["lifetime", "reuse", "lru"])
def test_skip_layer_copy_failure_is_dropped(policy):
    """Found by the soak: a failed H2D copy into a skip_topk layer's buffer, after the group's
    first layer copied the same plan, must drop the plan's misses (the plugin discards it): the
    next forward's hits would read uncopied slots there."""
    import vllm_ascend_runner_soak as soak
    soak.skip_layer_copy_failure(policy)
