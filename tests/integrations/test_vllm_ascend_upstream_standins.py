"""The vllm-ascend plugin against STAND-INS for upstream shapes later than the pinned commit.

Not vllm-ascend's code: every class and module here is a stand-in written from the signatures
and behaviour upstream documents after 182b75ea84 (../shared/UPSTREAM.md; docs/vllm-ascend.md,
"Versions"), none of its code copied. The plugin's run against vllm-ascend's real code at the
pinned commit is tests/integrations/test_vllm_ascend.py; these tests say only that the plugin
handles each later shape as written down, not that upstream behaves so.

Stand-ins (no vllm, no vllm-ascend, no NPU: tensors on the CPU, copies by address):

* ``StandInManager``: ``SparseKVOffloadManager``'s documented interface (the ``__init__``
  arguments, ``register_kv_caches`` with the per-layer 6-tuple and the attributes the connectors
  read, ``onload_topk_kv``'s signature, ``offload_new_kv`` in three signatures: as at the pin,
  with a leading ``layer_name``, with a trailing ``src_slot_mapping``);
* a host pool either published by TP rank 0 (MemFabric: one global address space) or mapped by
  every rank at its own address (Mooncake's shared segment: the same file mapped twice);
* ``AscendConfig`` as a pydantic dataclass that forbids unknown keys (#13838), and one that drops
  them (#15321); ``SparseKVOffloadConfig`` with the fused flags (#14957, #16640);
* the call sites: model runner V1 (``CpuGpuBuffer`` ``query_start_loc``), Model Runner V2's
  model-state module (numpy ``query_start_loc``, its own by-name import), the metadata builder
  with runner-owned ``req_topk_buffer_slots`` / ``_generations`` / ``_active``, V1's
  ``_update_states`` and V2's ``finish_requests``, registered under vllm-ascend's module names
  for the test only.
"""
import ctypes
import dataclasses
import inspect
import mmap
import random
import sys
import types
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from avsg.cache.split_rule import SPLIT_LAUNCHES
from torch.utils._python_dispatch import TorchDispatchMode
from avsg.integrations import vllm_ascend as backend
from helpers import split_bound
from avsg.integrations import vllm_ascend_plugin as plugin

BS, S_BUF, TOPK, T, R = 4, 8, 4, 2, 2       # block, top-k buffer per token row, top-k, 1+MTP, seqs
DK, DV = 8, 4                                # latent and rope widths (bf16)
NUM_BLOCKS = 64
LAYERS = ["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"]
MAX_LEN = 64

MANAGER_MODULE = plugin._MANAGER_MODULE
ATTN_MODULE = plugin._ATTN_MODULE
V1_RUNNER = plugin._RUNNER_MODULE
V2_RUNNER = plugin._RUNNER_V2_MODULE
V2_MODEL_STATE = "vllm_ascend.worker.v2.model_states.default"


class AvsgLaunches(TorchDispatchMode):
    """The avsg ops (kernel launches) dispatched inside the block, by name."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "avsg":
            self.names.append(func.__name__.split(".")[0])
        return func(*args, **(kwargs or {}))


# ----------------------------------------------------------------------------- copies by address
class Regions:
    """Byte ranges a stand-in copy may touch, by owner."""

    def __init__(self):
        self.spans = []

    def add(self, owner, tensor):
        lo = tensor.data_ptr()
        self.spans.append((owner, lo, lo + tensor.numel() * tensor.element_size(), tensor))

    def owner(self, addr, length):
        for owner, lo, hi, _ in self.spans:
            if lo <= addr and addr + length <= hi:
                return owner
        return None


class StandInOffload:
    """MemFabric's ``offload.sparse_copy`` as the manager calls it: moves bytes by address and
    asserts that rank ``rank`` reads only a host pool it may address (or its own new KV) and
    writes only its own buffers (or the pool)."""

    def __init__(self, regions, pool_owner):
        self.regions, self.pool_owner = regions, pool_owner
        self.rank = 0
        self.copies = []

    def sparse_copy(self, src, dst, lengths, size, device):
        n = int(size.reshape(-1)[0])
        for a, b, k in zip(src[:n].tolist(), dst[:n].tolist(), lengths[:n].tolist()):
            if k == 0:
                continue
            src_owner, dst_owner = self.regions.owner(a, k), self.regions.owner(b, k)
            pool = self.pool_owner(self.rank)
            assert src_owner in (pool, f"input{self.rank}"), \
                f"rank {self.rank} reads {src_owner} at {a:#x}"
            assert dst_owner in (pool, f"buffer{self.rank}"), \
                f"rank {self.rank} writes {dst_owner} at {b:#x}"
            ctypes.memmove(b, a, k)
            self.copies.append((self.rank, src_owner, dst_owner))
        return 0


# ----------------------------------------------------------------------------- the stand-in manager
OFFLOAD_NEW_KV = {
    # the pin (182b75ea84)
    "pin": "slot_mapping, k_cache_cpu, v_cache_cpu, k_cache_npu, v_cache_npu, k, v, "
           "has_prefill=False, capturing=False",
    # a branch with a leading layer name
    "leading_layer_name": "layer_name, slot_mapping, k_cache_cpu, v_cache_cpu, k_cache_npu, "
                          "v_cache_npu, k, v, has_prefill=False, capturing=False",
    # a branch with a trailing source slot mapping
    "trailing_src_slot_mapping": "slot_mapping, k_cache_cpu, v_cache_cpu, k_cache_npu, "
                                 "v_cache_npu, k, v, has_prefill=False, capturing=False, "
                                 "src_slot_mapping=None",
}


def make_offload_new_kv(variant, calls):
    """``offload_new_kv`` in one of the documented signatures; decode path only: rank 0 writes the
    new rows into its host view at ``slot_mapping``."""
    params = OFFLOAD_NEW_KV[variant]
    code = (f"def offload_new_kv(self, {params}):\n"
            f"    calls.append(dict(locals()))\n"
            f"    if self.tp_rank != 0:\n"
            f"        return\n"
            f"    rows = slot_mapping.reshape(-1).tolist()\n"
            f"    for i, row in enumerate(rows):\n"
            f"        if row < 0:\n"
            f"            continue\n"
            f"        k_cache_cpu.view(-1, k.shape[-1])[row] = k.reshape(-1, k.shape[-1])[i]\n"
            f"        v_cache_cpu.view(-1, v.shape[-1])[row] = v.reshape(-1, v.shape[-1])[i]\n")
    scope = {"calls": calls}
    exec(code, scope)
    return scope["offload_new_kv"]


class Publication:
    """The TP group's broadcast of rank 0's host addresses (``gvas_*``, ``cpu_block_lens``)."""

    def __init__(self):
        self.k, self.v, self.block_lens = [], [], []


class StandInManager:
    """``SparseKVOffloadManager``'s documented interface (not its code)."""

    def __init__(self, vllm_config, kv_cache_config, sparse_kv_offload_config):
        self.vllm_config = vllm_config
        self.kv_cache_config = kv_cache_config
        self.sparse_kv_offload_config = sparse_kv_offload_config
        self.tp_rank, self.tp_size = vllm_config.rank, vllm_config.tp_size
        self.tp_group = SimpleNamespace(broadcast=lambda tensor, src=0: None,
                                        barrier=lambda: None)
        self.block_size = kv_cache_config.kv_cache_groups[0].kv_cache_spec.block_size
        self.topk_buffer_size = sparse_kv_offload_config.topk_buffer_size
        self.topk = sparse_kv_offload_config.topk
        self.max_num_reqs = vllm_config.scheduler_config.max_num_seqs
        self.max_num_tokens = vllm_config.scheduler_config.max_num_batched_tokens
        self.max_model_len = vllm_config.model_config.max_model_len
        width = 1 + vllm_config.speculative_config.num_speculative_tokens
        self.max_num_topk_rows = min(self.max_num_tokens, self.max_num_reqs * width)
        self._build_cpp()
        type(self).host_pools_initialised += 1

    host_pools_initialised = 0

    def _build_cpp(self):
        self.sparse_kv_offload_cpp = "the host LRU"

    def register_kv_caches(self, kv_caches):
        self.offload_layer_names = [n for n in kv_caches if "indexer" not in n]
        self.num_layers = len(self.offload_layer_names)
        self.layer_name_to_offload_id = {n: i for i, n in enumerate(self.offload_layer_names)}
        self.topk_buffers_k, self.topk_buffers_v = [], []
        self.k_caches_cpu, self.v_caches_cpu = [], []
        for name in self.offload_layer_names:
            k_npu, v_npu, k_cpu, v_cpu, buf_k, buf_v = kv_caches[name]
            self.topk_buffers_k.append(buf_k)
            self.topk_buffers_v.append(buf_v)
            if k_cpu is not None:           # rank 0 (MemFabric), every rank (per-rank mapping)
                self.k_caches_cpu.append(k_cpu)
                self.v_caches_cpu.append(v_cpu)
        pub = self.vllm_config.publication
        if self.tp_rank == 0:
            nb = self.kv_cache_config.num_blocks
            pub.k = [t.data_ptr() for t in self.k_caches_cpu]
            pub.v = [t.data_ptr() for t in self.v_caches_cpu]
            pub.block_lens = [(k.numel() * k.element_size() // nb, v.numel() * v.element_size()
                               // nb) for k, v in zip(self.k_caches_cpu, self.v_caches_cpu)]
        self.gvas_k_bases, self.gvas_v_bases = list(pub.k), list(pub.v)
        self.cpu_block_lens = list(pub.block_lens)
        self.addr_k_bases = [t.data_ptr() for t in self.topk_buffers_k]
        self.addr_v_bases = [t.data_ptr() for t in self.topk_buffers_v]
        device = self.topk_buffers_k[0].device
        pages = self.topk_buffer_size // self.block_size
        self.current_slots_npu = torch.empty(self.max_num_topk_rows, self.topk,
                                             dtype=torch.int32, device=device)
        self.resident_block_table_npu = torch.arange(
            self.max_num_topk_rows * pages, dtype=torch.int32).view(self.max_num_topk_rows, pages)
        self.resident_query_lens_npu = torch.arange(1, self.max_num_topk_rows + 1,
                                                    dtype=torch.int32)
        self.resident_seq_lens_npu = torch.full((self.max_num_topk_rows,),
                                                self.topk_buffer_size, dtype=torch.int32)

    def _get_offload_layer_id(self, layer_name):
        return self.layer_name_to_offload_id[layer_name]

    def onload_topk_kv(self, layer_name, num_tokens, num_reqs, block_table, topk_indices_npu,
                       current_slots_npu, req_ids_npu, stable_prefix_lens_npu,
                       token_to_req_npu=None, capturing=False, skip_topk=False):
        raise AssertionError("the stand-in's host LRU ran: the plugin did not replace it")


class RegisterWithHostPool(StandInManager):
    """A ``register_kv_caches`` variant with an extra keyword and a return value."""

    def register_kv_caches(self, kv_caches, host_pool=None):
        super().register_kv_caches(kv_caches)
        self.host_pool_seen = host_pool
        return "registered"


def standin_base(variant="pin", register="pin"):
    """A stand-in manager class in its own module (the plugin looks ``offload`` up there)."""
    calls = []
    module = types.ModuleType(MANAGER_MODULE)      # registered under that name by Engine
    parent = RegisterWithHostPool if register == "host_pool_kwarg" else StandInManager
    cls = type("SparseKVOffloadManager", (parent,), {
        "offload_new_kv": make_offload_new_kv(variant, calls), "__module__": module.__name__})
    module.SparseKVOffloadManager = cls
    module.offload_new_kv_calls = calls
    return module


# ----------------------------------------------------------------------------- the other call sites
def metadata_update_stock(num_tokens, num_reqs, num_tokens_padded, num_reqs_padded, req_ids,
                          query_start_loc, offload_req_ids_tensor, offload_token_to_req):
    """``update_sparse_kv_offload_metadata``'s documented signature; ``query_start_loc`` a
    ``CpuGpuBuffer`` (V1) or a numpy array (V2). Fills the per-token request index."""
    q = query_start_loc
    starts = np.asarray(q.np if hasattr(q, "np") else q)[:num_reqs + 1]
    token_to_req = np.repeat(np.arange(num_reqs), np.diff(starts))
    offload_token_to_req.np[:num_tokens] = token_to_req[:num_tokens]
    offload_token_to_req.np[num_tokens:num_tokens_padded] = 0


class Buffer:
    """``CpuGpuBuffer`` as the call sites use it (host tensor, numpy view, device copy)."""

    def __init__(self, n, dtype):
        self.cpu = torch.zeros(n, dtype=dtype)
        self.np = self.cpu.numpy()
        self.gpu = self.cpu


def standin_modules(manager_module):
    """vllm-ascend's modules the runtime hooks reach, as stand-ins under their real names."""
    manager_module.update_sparse_kv_offload_metadata = metadata_update_stock
    manager_module._SPARSE_KV_OFFLOAD_MANAGER = None

    attn = types.ModuleType(ATTN_MODULE)

    class AscendSFAKVOffloadImpl:
        @staticmethod
        def _resident_views(manager, layer_name, rows):
            raise AssertionError("the stock per-token views")

    class AscendSFAKVOffloadMetadataBuilder:
        def build(self, common_prefix_len, common_attn_metadata, fast_build=False, **kwargs):
            return SimpleNamespace(common=common_attn_metadata)

        def build_for_drafting(self, common_attn_metadata, draft_index, **kwargs):
            return SimpleNamespace(common=common_attn_metadata, draft_index=draft_index)
    attn.AscendSFAKVOffloadImpl = AscendSFAKVOffloadImpl
    attn.AscendSFAKVOffloadMetadataBuilder = AscendSFAKVOffloadMetadataBuilder

    v1 = types.ModuleType(V1_RUNNER)
    v1.update_sparse_kv_offload_metadata = metadata_update_stock    # by-name import

    class NPUModelRunnerV1:
        applied = []

        def _update_states(self, scheduler_output):
            self.applied.append(scheduler_output)
    v1.NPUModelRunner = NPUModelRunnerV1

    v2_state = types.ModuleType(V2_MODEL_STATE)
    v2_state.update_sparse_kv_offload_metadata = metadata_update_stock

    v2 = types.ModuleType(V2_RUNNER)

    class GPUModelRunnerV2:               # vLLM's: finish_requests inherited by vllm-ascend's
        finished = []

        def finish_requests(self, scheduler_output):
            self.finished.append(scheduler_output)

    class NPUModelRunnerV2(GPUModelRunnerV2):
        pass
    v2.NPUModelRunner = NPUModelRunnerV2
    return {MANAGER_MODULE: manager_module, ATTN_MODULE: attn, V1_RUNNER: v1,
            V2_MODEL_STATE: v2_state, V2_RUNNER: v2}


# ----------------------------------------------------------------------------- the engine
class HostPool:
    """The host KV pool per layer: ``views(rank)`` is what rank ``rank`` registers; ``truth`` the
    bytes (rank 0's view). ``memfabric``: one allocation, only rank 0 holds views, the others use
    its published addresses. ``per_rank``: one file mapped once per rank (each rank its own
    address for the same bytes, as Mooncake's shared segment)."""

    def __init__(self, kind, tp_size, regions, tmp_path):
        self.kind, self.maps = kind, []
        nbytes = NUM_BLOCKS * BS * (DK + DV) * 2 * len(LAYERS)
        if kind == "memfabric":
            raw = [torch.zeros(nbytes, dtype=torch.uint8)]
            regions.add("pool", raw[0])
        else:
            path = tmp_path / "host_pool.bin"
            path.write_bytes(bytes(nbytes))
            raw = []
            with open(path, "r+b") as f:
                for rank in range(tp_size):
                    mapping = mmap.mmap(f.fileno(), nbytes)
                    self.maps.append(mapping)
                    raw.append(torch.frombuffer(mapping, dtype=torch.uint8))
                    regions.add(f"pool{rank}", raw[-1])
            assert raw[0].data_ptr() != raw[-1].data_ptr() or tp_size == 1
        self.per_rank = [self._split(r) for r in raw]

    @staticmethod
    def _split(raw):
        layers, offset = [], 0
        for _ in LAYERS:
            k_bytes, v_bytes = NUM_BLOCKS * BS * DK * 2, NUM_BLOCKS * BS * DV * 2
            k = raw[offset:offset + k_bytes].view(torch.bfloat16).view(NUM_BLOCKS, BS, 1, DK)
            offset += k_bytes
            v = raw[offset:offset + v_bytes].view(torch.bfloat16).view(NUM_BLOCKS, BS, 1, DV)
            offset += v_bytes
            layers.append((k, v))
        return layers

    def views(self, rank):
        if self.kind == "memfabric":
            return self.per_rank[0] if rank == 0 else [(None, None)] * len(LAYERS)
        return self.per_rank[rank]

    @property
    def truth(self):
        return self.per_rank[0]

    def owner(self, rank):
        return "pool" if self.kind == "memfabric" else f"pool{rank}"


def vllm_config(rank, tp_size, publication, additional=None):
    return SimpleNamespace(
        rank=rank, tp_size=tp_size, publication=publication,
        model_config=SimpleNamespace(max_model_len=MAX_LEN),
        scheduler_config=SimpleNamespace(max_num_seqs=R, max_num_batched_tokens=R * T),
        speculative_config=SimpleNamespace(num_speculative_tokens=T - 1),
        additional_config=additional if additional is not None else {})


def offload_config(**flags):
    return SimpleNamespace(enabled=True, topk_buffer_size=S_BUF, topk=TOPK,
                           dram_size_per_dp_GB=1, keep_device_kv_cache=False, **flags)


def kv_cache_config():
    return SimpleNamespace(num_blocks=NUM_BLOCKS, kv_cache_groups=[
        SimpleNamespace(kv_cache_spec=SimpleNamespace(block_size=BS))])


class Request:
    def __init__(self, rid, n, blocks):
        self.rid, self.n, self.blocks = rid, n, blocks
        self.slot, self.generation = -1, -1


class Engine:
    """Managers for ``tp_size`` ranks on the stand-in base, a host pool, a batch of requests;
    ``step`` is one forward: the metadata call (V1 or V2 shape), optionally the metadata
    builder with runner-owned rows, then per layer the new KV D2H through the stand-in's
    ``offload_new_kv`` (its own signature) and ``onload_topk_kv``; every selected position's
    bytes as attention would read them are checked against the host pool."""

    def __init__(self, monkeypatch, tmp_path, variant="pin", register="pin", host="memfabric",
                 tp_size=1, tail_blocks=0, seed=0, runner="v1"):
        self.rng = random.Random(seed)
        torch.manual_seed(seed)
        self.variant, self.runner = variant, runner
        self.regions = Regions()
        self.pool = HostPool(host, tp_size, self.regions, tmp_path)
        self.module = standin_base(variant, register)
        self.offload = StandInOffload(self.regions, self.pool.owner)
        self.module.offload = self.offload
        self.modules = standin_modules(self.module)
        for name, module in self.modules.items():
            monkeypatch.setitem(sys.modules, name, module)
        self.cls = backend.define_backend(self.module.SparseKVOffloadManager)
        publication = Publication()
        self.managers = []
        for rank in range(tp_size):
            manager = self.cls(vllm_config(rank, tp_size, publication), kv_cache_config(),
                               offload_config())
            kv = {}
            for layer, name in enumerate(LAYERS):
                rows = manager.max_num_topk_rows
                buf_k = torch.zeros(rows, S_BUF + tail_blocks * BS, 1, DK, dtype=torch.bfloat16)
                buf_v = torch.zeros(rows, S_BUF + tail_blocks * BS, 1, DV, dtype=torch.bfloat16)
                self.regions.add(f"buffer{rank}", buf_k)
                self.regions.add(f"buffer{rank}", buf_v)
                k_cpu, v_cpu = self.pool.views(rank)[layer]
                kv[name] = (None, None, k_cpu, v_cpu, buf_k, buf_v)
                kv[name.replace("attn", "indexer.k_cache")] = torch.zeros(1)
            if register == "host_pool_kwarg":
                assert manager.register_kv_caches(kv, host_pool="mooncake") == "registered"
                assert manager.host_pool_seen == "mooncake"
            else:
                manager.register_kv_caches(kv)
            self.managers.append(manager)
        self.module._SPARSE_KV_OFFLOAD_MANAGER = self.managers[0]
        plugin.install_runtime_hooks()
        self.free_blocks = list(range(NUM_BLOCKS))
        self.batch = []
        self.next_slot, self.next_generation = 0, 0
        self.exact = 0
        self.split_checked = 0
        self.builder = self.modules[ATTN_MODULE].AscendSFAKVOffloadMetadataBuilder()

    # ---- requests
    def add(self, rid=None, n=None):
        rid = rid or f"req-{len(self.batch)}-{self.rng.randrange(1 << 30)}"
        req = Request(rid, n or self.rng.randint(9, 20), [])
        self.fill(req)
        self.batch.append(req)
        self.give_runner_row(req)
        return req

    def fill(self, req):
        """Fresh blocks with fresh KV for the request's positions (a prefill, or a resumption
        whose KV was recomputed)."""
        self.free_blocks.extend(req.blocks)
        req.blocks = []
        while len(req.blocks) * BS < MAX_LEN:
            req.blocks.append(self.free_blocks.pop(0))
        for k, v in self.pool.truth:
            for pos in range(req.n):
                b, o = req.blocks[pos // BS], pos % BS
                k[b, o, 0] = torch.randn(DK).to(torch.bfloat16)
                v[b, o, 0] = torch.randn(DV).to(torch.bfloat16)

    def give_runner_row(self, req):
        """A runner-owned buffer row and a new generation (what a runner's slot manager does
        when a request gets a row)."""
        req.slot = self.next_slot % (R + 2)
        self.next_slot += 1
        self.next_generation += 1
        req.generation = self.next_generation

    # ---- one forward
    def step(self, runner_rows=True, check=True):
        batch = self.batch
        nreq = len(batch)
        n_tok = nreq * T
        qsl = np.arange(0, n_tok + 1, T, dtype=np.int32)
        token_to_req = Buffer(R * T, torch.int32)
        req_ids = [r.rid for r in batch]
        update = self.modules[V1_RUNNER if self.runner == "v1" else V2_MODEL_STATE] \
            .update_sparse_kv_offload_metadata
        for rank, manager in enumerate(self.managers):
            self.module._SPARSE_KV_OFFLOAD_MANAGER = manager
            if self.runner == "v1":
                q = Buffer(R + 1, torch.int32)
                q.np[:nreq + 1] = qsl
            else:
                q = qsl                          # Model Runner V2: numpy
            update(n_tok, nreq, n_tok, nreq, req_ids, q, Buffer(R, torch.int64), token_to_req)
            if runner_rows is not None:
                cm = SimpleNamespace(
                    query_start_loc=torch.from_numpy(qsl),
                    req_topk_buffer_slots=torch.tensor([r.slot for r in batch],
                                                       dtype=torch.int32)
                    if runner_rows else None,
                    req_topk_buffer_generations=torch.tensor([r.generation for r in batch])
                    if runner_rows else None,
                    req_topk_buffer_active=torch.ones(nreq, dtype=torch.bool)
                    if runner_rows else None)
                self.builder.build(0, cm)
        ttr = token_to_req.cpu[:n_tok].clone()
        assert ttr.tolist() == [i for i in range(nreq) for _ in range(T)]
        width = MAX_LEN // BS
        block_table = torch.zeros(nreq, width, dtype=torch.int32)
        for i, r in enumerate(batch):
            block_table[i, :len(r.blocks)] = torch.tensor(r.blocks, dtype=torch.int32)
        positions = [(i, r, r.n + j) for i, r in enumerate(batch) for j in range(T)]
        stable = torch.tensor([r.n for _, r, _ in positions], dtype=torch.int32)
        topk = []
        for _, r, pos in positions:
            hot = [p for p in range(0, pos + 1, 3)][-3:] + [pos]
            picks = list(dict.fromkeys(hot + [self.rng.randrange(pos + 1)]))[:TOPK]
            topk.append(picks + [-1] * (TOPK - len(picks)))
        topk = torch.tensor(topk, dtype=torch.int32).view(n_tok, 1, TOPK)
        slot_mapping = torch.tensor([r.blocks[p // BS] * BS + p % BS for _, r, p in positions])
        for layer, name in enumerate(LAYERS):
            new_k = torch.randn(n_tok, 1, DK).to(torch.bfloat16)
            new_v = torch.randn(n_tok, 1, DV).to(torch.bfloat16)
            for rank, manager in enumerate(self.managers):
                self.module._SPARSE_KV_OFFLOAD_MANAGER = manager
                self.offload.rank = rank
                self.regions.add(f"input{rank}", new_k)
                self.regions.add(f"input{rank}", new_v)
                k_cpu = manager.k_caches_cpu[layer] if manager.k_caches_cpu else None
                v_cpu = manager.v_caches_cpu[layer] if manager.v_caches_cpu else None
                kwargs = dict(slot_mapping=slot_mapping, k_cache_cpu=k_cpu, v_cache_cpu=v_cpu,
                              k_cache_npu=None, v_cache_npu=None, k=new_k, v=new_v,
                              has_prefill=False, capturing=False)
                if self.variant == "leading_layer_name":
                    manager.offload_new_kv(name, **kwargs)
                elif self.variant == "trailing_src_slot_mapping":
                    manager.offload_new_kv(**kwargs, src_slot_mapping=slot_mapping)
                else:
                    manager.offload_new_kv(**kwargs)
                with AvsgLaunches() as launches:
                    manager.onload_topk_kv(name, n_tok, nreq, block_table, topk,
                                           manager.current_slots_npu, None, stable, ttr)
                self.split_launches = launches.names.count("split_slots")
                if check:
                    self.check_reads(manager, layer, name, n_tok, topk, positions)
                if check and manager.avsg_split:
                    self.check_split(manager, layer, name, n_tok, topk, positions)
        for r in batch:
            r.n += 1 if self.rng.random() < 0.5 else T

    def check_reads(self, manager, layer, name, n_tok, topk, positions):
        """What attention reads through the slots and block table equals the host pool's bytes
        of every selected position."""
        views = self.modules[ATTN_MODULE].AscendSFAKVOffloadImpl._resident_views(
            manager, name, n_tok)
        k_pages, v_pages, slots, table = views[:4]
        pool_k, pool_v = self.pool.truth[layer]
        for t in range(n_tok):
            _, r, pos = positions[t]
            wanted = [p for p in topk[t, 0].tolist() if 0 <= p <= pos]
            got = [s for s in slots[t].tolist() if s >= 0]
            assert len(got) == len(wanted), (t, got, wanted)
            for p, s in zip(wanted, got):
                page = int(table[t, s // BS])
                b, o = r.blocks[p // BS], p % BS
                assert torch.equal(k_pages[page, s % BS, 0], pool_k[b, o, 0]), \
                    f"stale read: layer {name} token {t} ({r.rid}@{p})"
                assert torch.equal(v_pages[page, s % BS, 0], pool_v[b, o, 0])
                self.exact += 1

    def check_split(self, manager, layer, name, n_tok, topk, positions):
        """The split (option split_attention): each token's hit and miss slots partition its
        slots, and ``split_attention`` around a CPU model of sparse flash attention (BF16
        outputs, fp32 softmax max and sum, as the op returns them) equals attention over the
        host pool's KV of the selected positions within docs/overlap.md's BF16 bound."""
        k_pages, v_pages, slots, table = self.modules[ATTN_MODULE].AscendSFAKVOffloadImpl \
            ._resident_views(manager, name, n_tok)[:4]
        hits = manager.avsg_hit_slots_npu[:n_tok]
        misses = manager.avsg_miss_slots_npu[:n_tok]
        for t in range(n_tok):
            h = [s for s in hits[t].tolist() if s >= 0]
            m = [s for s in misses[t].tolist() if s >= 0]
            assert sorted(h + m) == sorted(s for s in slots[t].tolist() if s >= 0)
            assert hits[t, len(h):].eq(-1).all() and misses[t, len(m):].eq(-1).all()
        heads = 2
        q = torch.randn(n_tok, heads, DK + DV)
        scale = 0.3

        def scores_of(t, k_rows, v_rows):
            return (q[t, :, :DK] @ k_rows.float().T + q[t, :, DK:] @ v_rows.float().T) * scale

        def attend(indices):
            """The CPU model of npu_sparse_flash_attention(return_softmax_lse=True)."""
            out = torch.zeros(n_tok, heads, DK)
            smax = torch.zeros(1, n_tok, heads)
            ssum = torch.zeros(1, n_tok, heads)
            for t in range(n_tok):
                sel = [s for s in indices[t, 0].tolist() if s >= 0]
                if not sel:
                    continue
                page = table[t].long()[torch.tensor(sel) // BS]
                off = torch.tensor(sel) % BS
                k_rows, v_rows = k_pages[page, off, 0], v_pages[page, off, 0]
                sc = scores_of(t, k_rows, v_rows)
                smax[0, t] = sc.amax(-1)
                e = torch.exp(sc - smax[0, t][:, None])
                ssum[0, t] = e.sum(-1)
                out[t] = (e / ssum[0, t][:, None]) @ k_rows.float()
            return out.to(torch.bfloat16), smax, ssum

        # what the split launches beside the unsplit path's one attention call is what the
        # decode model prices (split_rule.SPLIT_LAUNCHES): count the op calls and the merges
        launched = []

        def counted(indices):
            launched.append("attention")
            return attend(indices)
        scope = manager.split_attention.__func__.__globals__
        merge = scope["attention_update"]

        def counted_merge(*args, **kwargs):
            launched.append("attention_update")
            return merge(*args, **kwargs)
        scope["attention_update"] = counted_merge
        try:
            merged = manager.split_attention(counted, n_tok)
        finally:
            scope["attention_update"] = merge
        # the lists: the layer's step launched the split_slots kernel once (no torch derivation)
        assert self.split_launches == 1, self.split_launches
        assert ["split_slots"] + launched[1:] == list(SPLIT_LAUNCHES) and launched[0] == "attention", launched
        assert merged.dtype == torch.bfloat16 and merged.shape == (n_tok, heads, DK)
        pool_k, pool_v = self.pool.truth[layer]
        for t in range(n_tok):
            _, r, pos = positions[t]
            wanted = [p for p in topk[t, 0].tolist() if 0 <= p <= pos]
            if not wanted:
                assert merged[t].eq(0).all()
                continue
            blocks = torch.tensor([r.blocks[p // BS] for p in wanted])
            off = torch.tensor([p % BS for p in wanted])
            k_rows, v_rows = pool_k[blocks, off, 0], pool_v[blocks, off, 0]
            sc = scores_of(t, k_rows, v_rows)
            full = (torch.softmax(sc, -1) @ k_rows.float()).to(torch.bfloat16)
            V = float(k_rows.float().abs().max())
            terms = float(((q[t, :, :DK].abs() @ k_rows.float().abs().T
                            + q[t, :, DK:].abs() @ v_rows.float().abs().T) * scale).max())
            tol = split_bound.bf16_bound(V, terms, float(sc.abs().max()), len(wanted), DK + DV)
            err = float((merged[t].float() - full.float()).abs().max())
            assert err <= tol, f"layer {name} token {t}: {err} > {tol}"
            self.split_checked += 1

    def hits(self):
        return sum(buf.stats()["hits"] for m in self.managers for buf in m.avsg_buffers)


@pytest.fixture(autouse=True)
def _unhook(monkeypatch):
    for name in ("AVSG_CONFIG", "AVSG_POLICY", "AVSG_LIFETIME", "AVSG_SPLIT_ATTENTION"):
        monkeypatch.delenv(name, raising=False)
    yield
    plugin.uninstall()


# ----------------------------------------------------------------------------- config (#13838)
def standin_config_modules(drop_unknown):
    """``vllm_ascend.ascend_config`` after #13838 (a pydantic ``AscendConfig`` that forbids
    unknown keys; ``init_ascend_config`` passes the user's keys as keyword arguments), or with
    #15321 (unknown top-level keys dropped first); and a module that imported
    ``init_ascend_config`` by name, as vllm-ascend's platform module does."""
    from pydantic import ConfigDict
    from pydantic.dataclasses import dataclass as pydantic_dataclass

    @pydantic_dataclass(config=ConfigDict(extra="forbid"))
    class AscendConfig:
        enable_cpu_binding: bool = True
        weight_nz_mode: int = 1

    def init_ascend_config(vllm_config):
        additional = vllm_config.additional_config or {}
        kwargs = {k: v for k, v in additional.items()
                  if k not in ("sparse_kv_offload_config", "refresh")}
        if drop_unknown:
            kwargs = {k: v for k, v in kwargs.items()
                      if k in {f.name for f in dataclasses.fields(AscendConfig)}}
        return AscendConfig(**kwargs)

    config = types.ModuleType("standin_pkg.ascend_config")
    config.AscendConfig = AscendConfig
    config.init_ascend_config = init_ascend_config
    platform = types.ModuleType("standin_pkg.platform")
    platform.init_ascend_config = init_ascend_config
    return config, platform


def test_standin_pydantic_config_refuses_additional_config_avsg_in_one_line(monkeypatch):
    config, platform = standin_config_modules(drop_unknown=False)
    monkeypatch.setitem(sys.modules, config.__name__, config)
    monkeypatch.setitem(sys.modules, platform.__name__, platform)
    stock = config.init_ascend_config
    plugin._guard_config(config, prefix="standin_pkg")
    assert platform.init_ascend_config is config.init_ascend_config is not stock
    with pytest.raises(backend.AVSGConfigRefused) as err:
        platform.init_ascend_config(SimpleNamespace(additional_config={
            "avsg": {"policy": "reuse"}, "weight_nz_mode": 2}))
    text = str(err.value)
    assert "\n" not in text and "#13838" in text and "AVSG_CONFIG" in text
    assert "additional_config.avsg" in text and "'reuse'" in text
    # anything else: vllm-ascend's own outcome, unchanged
    assert platform.init_ascend_config(SimpleNamespace(
        additional_config={"weight_nz_mode": 2})).weight_nz_mode == 2
    with pytest.raises(Exception) as err:
        platform.init_ascend_config(SimpleNamespace(additional_config={"weight_nz_mod": 2}))
    assert not isinstance(err.value, backend.AVSGConfigRefused)
    assert "weight_nz_mod" in str(err.value)
    # idempotent, and undone by uninstall's rebinding
    plugin._guard_config(config, prefix="standin_pkg")
    assert config.init_ascend_config._stock is stock


def test_standin_config_dropping_unknown_keys_lets_additional_config_avsg_through(monkeypatch):
    """#15321 (open): unknown top-level keys are dropped, so ``additional_config["avsg"]``
    stays on the vLLM config for AVSG to read."""
    monkeypatch.delenv("AVSG_POLICY", raising=False)
    monkeypatch.delenv("AVSG_CONFIG", raising=False)
    config, _ = standin_config_modules(drop_unknown=True)
    plugin._guard_config(config, prefix="standin_pkg")
    additional = {"avsg": {"policy": "reuse"}}
    config.init_ascend_config(SimpleNamespace(additional_config=additional))
    options, sources = backend.resolve_options(additional)
    assert options["policy"] == "reuse" and sources["policy"] == "additional_config.avsg.policy"


def test_standin_refusal_detection_reads_pydantic_errors():
    config, _ = standin_config_modules(drop_unknown=False)
    try:
        config.AscendConfig(avsg={"policy": "lru"})
    except Exception as exc:
        refusal = backend.config_refusal(exc, {"avsg": {"policy": "lru"}})
        assert isinstance(refusal, backend.AVSGConfigRefused)
        assert backend.config_refusal(exc, {"weight_nz_mode": 1}) is None
    else:
        pytest.fail("the stand-in AscendConfig accepted an unknown key")


# ----------------------------------------------------------------------------- fused flags
@pytest.mark.parametrize("flags, named", [
    ({"use_fused_overlap": True}, "sparse_kv_offload_config.use_fused_overlap=true"),
    ({"fused_op_type": "fused_copy_sfa"},
     'sparse_kv_offload_config.fused_op_type="fused_copy_sfa"'),
    ({"fused_op_type": "nano"}, 'sparse_kv_offload_config.fused_op_type="nano"'),
    ({"use_fused_copy_sfa": True}, "sparse_kv_offload_config.use_fused_copy_sfa=true"),
])
def test_standin_fused_flags_make_switching_avsg_on_a_one_line_error(flags, named):
    module = standin_base()
    cls = backend.define_backend(module.SparseKVOffloadManager)
    before = StandInManager.host_pools_initialised
    with pytest.raises(backend.FusedPathConflict) as err:
        cls(vllm_config(0, 1, Publication()), kv_cache_config(), offload_config(**flags))
    text = str(err.value)
    assert "\n" not in text and named in text and "onload_topk_kv" in text
    assert "AVSG_VLLM_ASCEND" in text
    assert StandInManager.host_pools_initialised == before      # refused before the host pool


def test_standin_fused_flags_off_or_set_on_the_manager():
    module = standin_base()
    cls = backend.define_backend(module.SparseKVOffloadManager)
    cls(vllm_config(0, 1, Publication()), kv_cache_config(),
        offload_config(use_fused_overlap=False, fused_op_type="none"))
    # a key the config does not declare routes nothing (the pin ignores unknown keys)
    cls(vllm_config(0, 1, Publication(), additional={
        "sparse_kv_offload_config": {"use_fused_overlap": True}}), kv_cache_config(),
        offload_config())

    class SetsItItself(module.SparseKVOffloadManager):     # as upstream's manager keeps it
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.use_fused_overlap = True
    with pytest.raises(backend.FusedPathConflict, match="use_fused_overlap=true"):
        backend.define_backend(SetsItItself)(vllm_config(0, 1, Publication()),
                                             kv_cache_config(), offload_config())


def test_standin_pydantic_sparse_kv_offload_config_with_fused_overlap():
    """The flag as #14957 declares it: a field of the pydantic ``SparseKVOffloadConfig``."""
    from pydantic.dataclasses import dataclass as pydantic_dataclass

    @pydantic_dataclass
    class SparseKVOffloadConfig:
        enabled: bool = False
        topk_buffer_size: int = 4096
        dram_size_per_dp_GB: int = 128
        keep_device_kv_cache: bool = False
        use_fused_overlap: bool = False
    cfg = SparseKVOffloadConfig(**{"enabled": True, "use_fused_overlap": "true"})
    assert isinstance(backend.fused_path_conflict(cfg), backend.FusedPathConflict)
    assert backend.fused_path_conflict(SparseKVOffloadConfig(enabled=True)) is None


# ----------------------------------------------------------------------------- offload_new_kv
@pytest.mark.parametrize("variant", sorted(OFFLOAD_NEW_KV))
def test_standin_offload_new_kv_signatures_pass_through(variant, monkeypatch, tmp_path):
    engine = Engine(monkeypatch, tmp_path, variant=variant)
    cls = engine.cls
    assert "offload_new_kv" not in cls.__dict__          # vllm-ascend's own, whatever its shape
    assert inspect.signature(cls.offload_new_kv) == \
        inspect.signature(engine.module.SparseKVOffloadManager.offload_new_kv)
    for _ in range(2):
        engine.add()
    for _ in range(6):
        engine.step()
    calls = engine.module.offload_new_kv_calls
    assert len(calls) == 6 * len(LAYERS)
    if variant == "leading_layer_name":
        assert [c["layer_name"] for c in calls[:2]] == LAYERS
    if variant == "trailing_src_slot_mapping":
        assert all(c["src_slot_mapping"] is c["slot_mapping"] for c in calls)
    assert engine.exact > 0 and engine.hits() > 0


# ----------------------------------------------------------------------------- register_kv_caches
@pytest.mark.parametrize("host", ["memfabric", "per_rank"])
def test_standin_host_pool_views_after_registration(host, monkeypatch, tmp_path):
    """TP 2: with MemFabric only rank 0 holds host views (rank 1 uses its published addresses);
    with a per-rank mapping (Mooncake) every rank holds its own, at its own address, and must
    copy through it (the stand-in copy refuses another rank's mapping)."""
    engine = Engine(monkeypatch, tmp_path, host=host, tp_size=2)
    m0, m1 = engine.managers
    if host == "memfabric":
        assert m1.k_caches_cpu == [] and m1.avsg_host_source == "published addresses"
        assert m1.avsg_host_k_bases == m0.gvas_k_bases
    else:
        assert m1.avsg_host_source == "this rank's host views"
        assert m1.avsg_host_k_bases == [k.data_ptr() for k, _ in engine.pool.views(1)]
        assert m1.avsg_host_k_bases != m1.gvas_k_bases       # rank 0's addresses, not rank 1's
    for _ in range(2):
        engine.add()
    for _ in range(5):
        engine.step()
    assert engine.exact > 0 and engine.hits() > 0
    ranks = {rank for rank, src, _ in engine.offload.copies if src == engine.pool.owner(rank)}
    assert ranks == {0, 1}
    for a, b in zip(m0.avsg_kv_k, m1.avsg_kv_k):
        assert torch.equal(a, b)


def test_standin_register_kv_caches_passes_any_signature_through(monkeypatch, tmp_path):
    engine = Engine(monkeypatch, tmp_path, register="host_pool_kwarg")
    assert "register_kv_caches" in engine.cls.__dict__
    assert list(inspect.signature(engine.cls.register_kv_caches).parameters) == \
        ["self", "args", "kwargs"]
    engine.add()
    engine.step()
    assert engine.exact > 0


def test_standin_top_k_buffers_grown_by_two_tail_blocks(monkeypatch, tmp_path):
    engine = Engine(monkeypatch, tmp_path, tail_blocks=2)
    m = engine.managers[0]
    assert m.topk_buffers_k[0].shape[1] == S_BUF + 2 * BS
    assert m.avsg_kv_k[0].data_ptr() == m.topk_buffers_k[0].data_ptr()
    for _ in range(2):
        engine.add()
    for _ in range(4):
        engine.step()
    assert engine.exact > 0


def test_standin_connector_attributes_stay_valid(monkeypatch, tmp_path):
    """What vllm-ascend's connectors read, with the plugin on, equals what the stand-in's own
    registration made: the same tensors, addresses and block lengths."""
    engine = Engine(monkeypatch, tmp_path, tp_size=2)
    plain = [engine.module.SparseKVOffloadManager(
        vllm_config(rank, 2, Publication()), kv_cache_config(), offload_config())
        for rank in range(2)]
    for rank, (m, p) in enumerate(zip(engine.managers, plain)):
        kv = {name: (None, None, *engine.pool.views(rank)[layer], m.topk_buffers_k[layer],
                     m.topk_buffers_v[layer]) for layer, name in enumerate(LAYERS)}
        p.vllm_config.publication = engine.managers[0].vllm_config.publication
        p.register_kv_caches(kv)
        assert m.offload_layer_names == p.offload_layer_names == LAYERS
        for name in ("k_caches_cpu", "v_caches_cpu", "topk_buffers_k", "topk_buffers_v"):
            assert [t.data_ptr() for t in getattr(m, name)] == \
                [t.data_ptr() for t in getattr(p, name)], name
            assert [t.shape for t in getattr(m, name)] == [t.shape for t in getattr(p, name)]
        for name in ("gvas_k_bases", "gvas_v_bases", "cpu_block_lens"):
            assert getattr(m, name) == getattr(p, name), name
    engine.add()
    engine.step()                      # and they stay so after AVSG ran
    assert engine.managers[1].gvas_k_bases == plain[1].gvas_k_bases


# ----------------------------------------------------------------------------- the per-step hook
@pytest.mark.parametrize("runner", ["v1", "v2"])
def test_standin_per_step_hook_runs_where_each_runner_calls_it(runner, monkeypatch, tmp_path):
    """V1 calls ``update_sparse_kv_offload_metadata`` from its runner module with a
    ``CpuGpuBuffer``; Model Runner V2 from its model-state module, with numpy starts. Both
    by-name imports are rebound and both reach ``begin_step``."""
    engine = Engine(monkeypatch, tmp_path, runner=runner)
    stock = metadata_update_stock
    for name in (MANAGER_MODULE, V1_RUNNER, V2_MODEL_STATE):
        bound = engine.modules[name].update_sparse_kv_offload_metadata
        assert bound is not stock and bound._stock is stock, name
    seen = []
    manager = engine.managers[0]
    monkeypatch.setattr(manager, "begin_step", lambda ids, counts, identities=None: seen.append(
        (list(ids), [int(c) for c in counts])) or type(manager).begin_step(
            manager, ids, counts, identities))
    a, b = engine.add(), engine.add()
    engine.step()
    assert seen[0] == ([a.rid, b.rid], [T, T])
    assert engine.exact > 0
    plugin.uninstall()
    for name in (MANAGER_MODULE, V1_RUNNER, V2_MODEL_STATE):
        assert engine.modules[name].update_sparse_kv_offload_metadata is stock, name


@pytest.mark.parametrize("starts", [
    np.array([0, 2, 3], dtype=np.int32),
    torch.tensor([0, 2, 3], dtype=torch.int32),
    "buffer"])
def test_standin_query_start_loc_shapes(starts):
    if isinstance(starts, str):
        starts = Buffer(8, torch.int32)
        starts.np[:3] = [0, 2, 3]
    assert plugin.query_lengths(starts, 2).tolist() == [2, 1]


def test_standin_lifecycle_hooks_on_runner_v1_and_v2(monkeypatch, tmp_path):
    """V1's ``_update_states`` (its own method) and V2's ``finish_requests`` (inherited from
    vLLM's runner) hand every scheduler output to the manager first; uninstall restores both."""
    engine = Engine(monkeypatch, tmp_path)
    manager = engine.managers[0]
    applied = []
    monkeypatch.setattr(manager, "apply_scheduler_output", applied.append)
    v1 = engine.modules[V1_RUNNER].NPUModelRunner
    v2 = engine.modules[V2_RUNNER].NPUModelRunner
    assert v1._update_states._avsg and v2.finish_requests._avsg
    assert "finish_requests" in v2.__dict__
    out = SimpleNamespace(total_num_scheduled_tokens=0)
    runner_v1, runner_v2 = v1.__new__(v1), v2.__new__(v2)
    runner_v1.sparse_kv_offload_manager = manager
    runner_v1._update_states(out)
    runner_v2.finish_requests(out)             # no sparse_kv_offload_manager attribute on V2
    assert applied == [out, out]
    assert v1.applied[-1] is out and v2.finished[-1] is out
    plugin.uninstall()
    assert not getattr(v1._update_states, "_avsg", False)
    assert "finish_requests" not in v2.__dict__       # the inherited one again


# ----------------------------------------------------------------------------- runner-owned rows
def test_standin_runner_generation_is_the_row_identity(monkeypatch, tmp_path):
    """A request whose KV was replaced (recomputed into new blocks) without the plugin hearing of
    it from the scheduler (no ``apply_scheduler_output``) keeps its request id; the runner gives
    its row a new generation, and that alone resets the row: every read stays exact."""
    engine = Engine(monkeypatch, tmp_path, runner="v2")
    a, b = engine.add(), engine.add()
    for _ in range(3):
        engine.step()
    manager = engine.managers[0]
    row_before = manager.state_row_of(a.rid)
    engine.fill(a)                              # new KV in new blocks, same request id
    engine.give_runner_row(a)                   # the runner's new allocation
    engine.step()                               # check_reads: exact only after a reset
    assert manager.avsg_rows.identity_of(a.rid) == (a.slot, a.generation)
    assert manager.avsg_rows.identity_of(b.rid) == (b.slot, b.generation)
    assert engine.exact > 0 and engine.hits() > 0
    assert manager.state_row_of(a.rid) is not None and row_before is not None


def test_standin_same_generation_keeps_the_row_and_its_hits(monkeypatch, tmp_path):
    engine = Engine(monkeypatch, tmp_path, runner="v2")
    a = engine.add()
    engine.step()
    manager = engine.managers[0]
    row = manager.state_row_of(a.rid)
    resets = []
    for buf in manager.avsg_buffers:
        stock = buf.reset
        monkeypatch.setattr(buf, "reset", lambda rows=None, stock=stock: resets.append(rows)
                            or stock(rows))
    hits = engine.hits()
    for _ in range(3):
        engine.step()
    assert manager.state_row_of(a.rid) == row and not resets
    assert engine.hits() > hits


def test_standin_without_runner_rows_the_request_id_table_decides(monkeypatch, tmp_path):
    """The fallback: no slots or generations in the metadata. The same replaced-KV sequence
    then reads stale (nothing told the plugin), which shows the generation path above is what
    keeps it exact; with the scheduler output applied, the table frees the row and reads are
    exact again."""
    engine = Engine(monkeypatch, tmp_path, runner="v2")
    a = engine.add()
    engine.add()
    for _ in range(3):
        engine.step(runner_rows=False)
    engine.fill(a)
    with pytest.raises(AssertionError, match="stale read"):
        engine.step(runner_rows=False)
    engine2 = Engine(monkeypatch, tmp_path / "2", runner="v2")
    a2 = engine2.add()
    engine2.add()
    for _ in range(3):
        engine2.step(runner_rows=False)
    engine2.fill(a2)
    manager = engine2.managers[0]
    manager.apply_scheduler_output(SimpleNamespace(
        finished_req_ids=set(), preempted_req_ids=set(),
        scheduled_cached_reqs=SimpleNamespace(resumed_req_ids={a2.rid}), scheduled_new_reqs=[],
        num_scheduled_tokens={r.rid: T for r in engine2.batch}))
    engine2.step(runner_rows=False)
    assert engine2.exact > 0


def test_standin_inactive_runner_row_is_reset(monkeypatch, tmp_path):
    """``req_topk_buffer_active`` false: whatever the runner means by it, the row is reset
    (costs misses, never a stale read)."""
    engine = Engine(monkeypatch, tmp_path, runner="v2")
    a = engine.add()
    engine.step()
    manager = engine.managers[0]
    assert manager.adopt_runner_rows([a.slot], [a.generation], [True]) is False
    manager.begin_step([a.rid], [T])
    assert manager.adopt_runner_rows([a.slot], [a.generation], [False]) is True
    # a row reset since the last plan (nothing read into it yet) only records the identity
    assert manager.adopt_runner_rows([a.slot], [a.generation], [False]) is False


@pytest.mark.parametrize("tp_size", [1, 2])
def test_standin_split_attention_within_the_bf16_bound(tp_size, monkeypatch, tmp_path):
    """AVSG_SPLIT_ATTENTION=1: every step's hit and miss lists partition the slots and the
    split attention (hits, the copy stream's wait, misses, LSE merge; on CPU the stream is a
    no-op and the merge the reference) equals attention over the host pool's KV within the
    stated BF16 tolerance, on every layer and rank, through drops, MTP and evictions."""
    monkeypatch.setenv("AVSG_SPLIT_ATTENTION", "1")
    engine = Engine(monkeypatch, tmp_path, tp_size=tp_size, seed=3)
    assert all(m.avsg_split for m in engine.managers)
    for _ in range(2):
        engine.add()
    for step in range(10):
        engine.step()
        if step == 5:
            engine.batch.pop(0)
            engine.add()
    assert engine.split_checked > 0 and engine.hits() > 0
    # and off by default: no split lists written
    monkeypatch.delenv("AVSG_SPLIT_ATTENTION")
    plain = Engine(monkeypatch, tmp_path / "plain", seed=3)
    assert not plain.managers[0].avsg_split


def test_split_operator_waits_for_the_copies_before_a_call_it_does_not_split():
    """With the split on, a layer's step leaves its misses' copy running on the copy stream. A
    decode call over the manager's slots that the operator cannot split (the caller asks for
    the LSE itself, or passes more positional arguments) runs over every slot at once, misses
    included: it must wait for the copy stream first (it did not, and would have read slots the
    copy had not filled yet). A call over other slots, or with the split off, waits for nothing."""
    from avsg.integrations.vllm_ascend_plugin import split_operator

    events = []

    class Stock:
        @classmethod
        def execute_sparse_flash_attention_process(cls, *args, **kwargs):
            events.append("attention")
            return "out"

    class Streams:
        def wait(self):
            events.append("wait")

    slots = torch.zeros(4, 1, 8, dtype=torch.int32)
    manager = SimpleNamespace(avsg_split=True, avsg_copy_stream=Streams(),
                              reads_current_slots=lambda t: t is slots,
                              split_attention=lambda attend, n: events.append("split") or "out")
    op = split_operator(Stock, lambda: manager)
    fixed = (None, torch.zeros(4, 2), None, None)
    for extra, kwargs, other, expected in (
            ((), {"return_lse": True}, False, ["wait", "attention"]),
            (("extra",), {}, False, ["wait", "attention"]),
            ((), {}, False, ["split"]),
            ((), {"return_lse": True}, True, ["attention"])):
        events.clear()
        indices = torch.zeros_like(slots) if other else slots
        assert op.execute_sparse_flash_attention_process(*fixed, indices, None, None, None,
                                                         *extra, **kwargs) == "out"
        assert events == expected, (extra, kwargs, other)
    manager.avsg_split = False
    events.clear()
    op.execute_sparse_flash_attention_process(*fixed, slots, None, None, None, return_lse=True)
    assert events == ["attention"]
