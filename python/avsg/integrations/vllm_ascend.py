"""vllm-ascend backend: its sparse KV offload with residency planned by AVSG on the device.

What stays vllm-ascend's
------------------------
``AVSGSparseKVOffloadManager`` subclasses vllm-ascend's ``SparseKVOffloadManager`` (created lazily
by ``backend_class()``, so ``import avsg`` never imports vllm). It keeps the host pool set-up
(``__init__``), ``register_kv_caches`` (called with whatever arguments vllm-ascend passes: host
pool, published addresses, the per-layer top-k buffers; AVSG reads its views only after it ran),
``offload_new_kv`` (not overridden: its signature varies between branches) and every attribute
its connectors read. Only the C++ host LRU is not built, and ``onload_topk_kv`` (the per-layer
residency step, the same signature in every version seen) is replaced. A fused decode path
(``use_fused_overlap``, ``fused_op_type``) never calls ``onload_topk_kv``: switching AVSG on with
one of them set is a one-line ``FusedPathConflict``.

Settings
--------
AVSG's own (``resolve_options``): ``AVSG_CONFIG`` (a JSON file), ``AVSG_POLICY``,
``AVSG_LIFETIME``, then ``additional_config["avsg"]`` where vllm-ascend lets that key through
(``AVSGConfigRefused`` where its ``AscendConfig`` forbids it). None is read from inside
vllm-ascend's config objects.

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
   ``update_sparse_kv_offload_metadata``): request ids -> state rows (the serving core's
   ``avsg.cache.RowTable``). A request keeps its state
   row while it stays in the batch, wherever condense or swap moves it; a request absent from the
   batch frees its row (phase 0 has normally done so already), and a row is reset before a request
   without one gets it, so no hit outlives its request's KV. Where the runner owns per-request
   buffer rows (metadata ``req_topk_buffer_slots`` / ``_generations`` / ``_active``, read by the
   metadata builder hook: ``adopt_runner_rows``), a request whose (slot, generation) changed, or
   whose slot is not active, gets a reset row too. The batch-index -> state-row table
   and each request's scheduled token count go to the device in place (fixed addresses: graph
   replays read the current values).
2. per layer, on the device (``onload_topk_kv``): tokens -> (state row, query index ``j``) from the
   token-to-request map (target or drafter's); tokens past their request's scheduled count
   (graph padding, whose ``token_to_req`` is 0) are dropped. Positions ``>= stable_prefix_len``
   are dropped (rejected drafts are rewritten), the plan runs on ``[R, T, K]``, and the misses
   become ``offload.sparse_copy`` descriptors, all in the layer's one call into the serving core
   (``avsg.cache.Residency.step``, which drops the plan's misses if the copy raises) (host address from this rank's host view of the
   layer's pool where it holds one, else the address rank 0 published, + the host block table;
   device address in the layer's buffer),
   compacted on the device: one K and one V descriptor per miss. ``skip_topk`` layers (IndexCache)
   reuse the group's plan and copy the same misses into their own buffer.

No value of a plan can make a copy leave its row: every slot is clamped to ``[0, C)`` and every
block id to the host pool before an address is formed; entries past a row's miss count write a
zero-length descriptor.
"""
from __future__ import annotations

import json
import logging
import os
import sys
from typing import Dict, List, Optional, Sequence, Tuple

import contextlib

import torch

from ..buffer import split_slots
from ..cache import Residency, RowTable
from ..cache.overlap import CopyStream, attention_update, lse_of
from ..cache import tokens as token_layout
from ..cache.residency import NO_LIMIT

ENV_SWITCH = "AVSG_VLLM_ASCEND"
ENV_CONFIG = "AVSG_CONFIG"          # path of a JSON file: {"policy": ..., "lifetime": ...}
ENV_POLICY = "AVSG_POLICY"
ENV_LIFETIME = "AVSG_LIFETIME"
ENV_SPLIT = "AVSG_SPLIT_ATTENTION"  # 1: attention over hits, then misses, LSE-merged
CONFIG_KEY = "avsg"                 # additional_config["avsg"]: accepted where vllm-ascend lets it
OPTION_KEYS = ("policy", "lifetime", "split_attention")
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
DOCS = "docs/vllm-ascend.md"

_BACKEND = None


def backend_class():
    """The manager class (defined on first use: it subclasses vllm-ascend's)."""
    global _BACKEND
    if _BACKEND is None:
        _BACKEND = _define_backend()
    return _BACKEND


# ---------------------------------------------------------------------------------- settings
def avsg_options(additional_config=None, environ=None) -> Dict[str, object]:
    """AVSG's residency options (``resolve_options`` without the sources)."""
    return resolve_options(additional_config, environ)[0]


def resolve_options(additional_config=None, environ=None
                    ) -> Tuple[Dict[str, object], Dict[str, str]]:
    """``(options, sources)``: the residency options and, per option, the setting it came from.

    Read from AVSG's own settings, none of them inside vllm-ascend's config objects. Later
    settings override earlier ones:

    1. defaults (``reference.DEFAULT_POLICY``, ``reference.DEFAULT_LIFETIME``, no split);
    2. the JSON file named by ``AVSG_CONFIG`` (an object with ``policy``, ``lifetime`` and/or
       ``split_attention``);
    3. ``AVSG_POLICY``, ``AVSG_LIFETIME``, ``AVSG_SPLIT_ATTENTION`` (``1``/``0``);
    4. ``additional_config["avsg"]`` (a dict or its JSON), the older way, where vllm-ascend
       accepts the key (``AVSGConfigRefused`` says where it does not).

    Every bad value is a one-line ``ValueError`` naming the setting it came from."""
    from .. import reference
    env = os.environ if environ is None else environ
    opts: Dict[str, object] = {"policy": reference.DEFAULT_POLICY,
                               "lifetime": reference.DEFAULT_LIFETIME, "split_attention": False}
    where = {"policy": "default", "lifetime": "default", "split_attention": "default"}
    path = str(env.get(ENV_CONFIG, "") or "").strip()
    if path:
        for key, value in _read_config_file(path).items():
            opts[key] = value
            where[key] = f"{ENV_CONFIG}={path}: {key}"
    policy = str(env.get(ENV_POLICY, "") or "").strip()
    if policy:
        opts["policy"], where["policy"] = policy, ENV_POLICY
    lifetime = str(env.get(ENV_LIFETIME, "") or "").strip()
    if lifetime:
        try:
            opts["lifetime"] = int(lifetime)
        except ValueError:
            raise ValueError(f"{ENV_LIFETIME}: expected an int in [1, {reference.MAX_LIFETIME}], "
                             f"got {lifetime!r}") from None
        where["lifetime"] = ENV_LIFETIME
    split = str(env.get(ENV_SPLIT, "") or "").strip().lower()
    if split:
        if split not in _TRUE + _FALSE:
            raise ValueError(f"{ENV_SPLIT}: expected 1 or 0, got {split!r}")
        opts["split_attention"], where["split_attention"] = split in _TRUE, ENV_SPLIT
    raw = additional_config.get(CONFIG_KEY) if isinstance(additional_config, dict) else None
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ValueError(f"additional_config.{CONFIG_KEY}: not JSON ({exc.msg})") from None
    if raw is not None:
        _check_keys(raw, f"additional_config.{CONFIG_KEY}")
        for key, value in raw.items():
            opts[key] = value
            where[key] = f"additional_config.{CONFIG_KEY}.{key}"
    if opts["policy"] not in reference.POLICY_IDS:
        raise ValueError(f"{where['policy']}: expected one of {tuple(reference.POLICY_IDS)}, "
                         f"got {opts['policy']!r}")
    if where["lifetime"] != "default" and opts["policy"] != "lifetime":
        raise ValueError(f"{where['lifetime']}: read only by the lifetime policy; the policy is "
                         f"{opts['policy']!r} (from {where['policy']})")
    value = opts["lifetime"]
    if isinstance(value, bool) or not isinstance(value, int) or \
            not 1 <= value <= reference.MAX_LIFETIME:
        raise ValueError(f"{where['lifetime']}: expected an int in "
                         f"[1, {reference.MAX_LIFETIME}], got {value!r}")
    if not isinstance(opts["split_attention"], bool):
        raise ValueError(f"{where['split_attention']}: expected true or false, got "
                         f"{opts['split_attention']!r}")
    return opts, where


def _check_keys(raw, name: str) -> None:
    if not isinstance(raw, dict):
        raise ValueError(f"{name}: expected a dict, got {type(raw).__name__}")
    unknown = set(raw) - set(OPTION_KEYS)
    if unknown:
        raise ValueError(f"{name}: unknown keys {sorted(unknown)}; expected "
                         f"{', '.join(repr(k) for k in OPTION_KEYS)}")


def _read_config_file(path: str) -> Dict[str, object]:
    name = f"{ENV_CONFIG}={path}"
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise ValueError(f"{name}: cannot read it ({exc.strerror or exc})") from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{name}: not JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{name}: expected a JSON object, got {type(raw).__name__}")
    _check_keys(raw, name)
    return raw


class AVSGConfigRefused(ValueError):
    """vllm-ascend refused ``additional_config["avsg"]`` (its config forbids unknown keys)."""


def config_refusal(exc: BaseException, additional_config) -> Optional[AVSGConfigRefused]:
    """The one-line error to raise instead of ``exc`` when ``exc`` is vllm-ascend refusing the
    ``avsg`` key of ``additional_config`` (``AscendConfig`` with ``extra="forbid"``, #13838);
    ``None`` for any other error."""
    if not isinstance(additional_config, dict) or CONFIG_KEY not in additional_config:
        return None
    refused = False
    errors = getattr(exc, "errors", None)
    if callable(errors):
        try:
            for err in errors():
                loc = tuple(err.get("loc") or ())
                if loc and loc[-1] == CONFIG_KEY and err.get("type") in (
                        "extra_forbidden", "unexpected_keyword_argument"):
                    refused = True
        except Exception:       # not pydantic's errors(): judge by the text
            pass
    if not refused:
        text = str(exc)
        refused = (repr(CONFIG_KEY) in text or f"\n{CONFIG_KEY}\n" in text
                   or text.startswith(f"{CONFIG_KEY}\n")) and any(
            word in text for word in ("not permitted", "extra", "unexpected keyword"))
    if not refused:
        return None
    return AVSGConfigRefused(
        f"{ENV_SWITCH}=1: this vllm-ascend refuses additional_config.{CONFIG_KEY} (its "
        f"AscendConfig forbids unknown keys, vllm-ascend #13838); remove the key and give AVSG's "
        f"settings {additional_config[CONFIG_KEY]!r} through {ENV_CONFIG}=<file.json> or "
        f"{ENV_POLICY} / {ENV_LIFETIME} ({DOCS})")


# ---------------------------------------------------------------------------------- fused paths
class FusedPathConflict(ValueError):
    """A vllm-ascend setting routes decode around ``onload_topk_kv``, the step AVSG replaces."""


_FUSED_FLAGS = (
    # (setting, how it is off, what it does): every one of them skips onload_topk_kv
    ("use_fused_overlap", "false",
     "decode runs npu_fused_sparse_attention_overlap (vllm-ascend #14957)"),
    ("fused_op_type", '"none"',
     "decode runs the fused lightning-indexer-manage and copy + SFA ops (vllm-ascend #16640)"),
    ("use_fused_copy_sfa", "false", "the fused copy + SFA path (vllm-ascend #16640)"),
)


def _flag_on(name: str, value) -> bool:
    if value is None:
        return False
    if name == "fused_op_type":
        return str(value).strip().lower() not in ("", "none")
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


def fused_path_conflict(*configs) -> Optional[FusedPathConflict]:
    """The one-line error for switching AVSG on while vllm-ascend's sparse KV offload is set to a
    fused decode path (which never calls ``onload_topk_kv``, so AVSG would silently do
    nothing); ``None`` when no such setting is on. Reads the settings as attributes of each of
    ``configs`` (the ``SparseKVOffloadConfig``, the manager): a key vllm-ascend does not declare
    (the pin ignores unknown ones) routes nothing."""
    for name, off, what in _FUSED_FLAGS:
        for config in configs:
            value = getattr(config, name, None)
            if _flag_on(name, value):
                shown = json.dumps(value) if isinstance(value, (bool, str)) else repr(value)
                return FusedPathConflict(
                    f"{ENV_SWITCH}=1 with sparse_kv_offload_config.{name}={shown}: {what}, "
                    f"which never calls SparseKVOffloadManager.onload_topk_kv, the step AVSG "
                    f"replaces; set {name} to {off} to use AVSG, or unset {ENV_SWITCH} to use "
                    f"the fused path ({DOCS})")
    return None


def _logger():
    """vLLM's logger when vLLM is loaded (its handlers and format), else this module's."""
    vllm_logger = sys.modules.get("vllm.logger")
    if vllm_logger is not None and hasattr(vllm_logger, "logger"):
        return vllm_logger.logger
    return logging.getLogger("avsg.vllm_ascend")


def _define_backend():
    from vllm_ascend.distributed.kv_transfer.sparse_kv_offload import \
        sparse_kv_offload_manager as vam
    base = getattr(vam, "_ORIGINAL_SPARSE_KV_OFFLOAD_MANAGER", vam.SparseKVOffloadManager)
    return define_backend(base)


def _bound_arguments(function, args, kwargs) -> Dict[str, object]:
    """``args``/``kwargs`` by parameter name of ``function`` (empty if they do not bind)."""
    import inspect
    try:
        return dict(inspect.signature(function).bind(*args, **kwargs).arguments)
    except (TypeError, ValueError):
        return {}


def define_backend(base):
    """``AVSGSparseKVOffloadManager``: a subclass of ``base`` (vllm-ascend's
    ``SparseKVOffloadManager``, or a stand-in with its documented interface). Its copies go
    through ``offload.sparse_copy`` of the module that defines ``base``, looked up per call."""
    logger = _logger()
    base_module = base.__module__

    class AVSGSparseKVOffloadManager(base):
        # __init__, register_kv_caches: whatever signature ``base`` has passes through;
        # offload_new_kv is not overridden at all (its signature varies between branches)
        def __init__(self, *args, **kwargs):
            named = _bound_arguments(base.__init__, (self,) + args, kwargs)
            vllm_config = named.get("vllm_config")
            offload_config = named.get("sparse_kv_offload_config")
            # refused before the base builds its host pool
            conflict = fused_path_conflict(offload_config)
            if conflict is not None:
                raise conflict
            options, sources = resolve_options(getattr(vllm_config, "additional_config", None))
            super().__init__(*args, **kwargs)
            vllm_config = vllm_config if vllm_config is not None else \
                getattr(self, "vllm_config", None)
            # (a base that takes its config some other way, or sets the flags on itself)
            conflict = fused_path_conflict(getattr(self, "sparse_kv_offload_config", None), self)
            if conflict is not None:
                raise conflict
            self.avsg_options = options
            self.avsg_option_sources = sources
            self.decode_width = 1
            spec = getattr(vllm_config, "speculative_config", None)
            if spec is not None:
                self.decode_width += spec.num_speculative_tokens
            logger.info("AVSG sparse KV offload backend active: residency planned on the device, "
                        "one buffer row per request; %s",
                        ", ".join(f"{k}={options[k]} ({sources[k]})" for k in OPTION_KEYS))

        def _build_cpp(self):
            """The host LRU is replaced; nothing to build."""
            self.sparse_kv_offload_cpp = None

        # ------------------------------------------------------------------ registration
        def register_kv_caches(self, *args, **kwargs):
            result = super().register_kv_caches(*args, **kwargs)
            self._avsg_register()
            return result

        def _avsg_register(self):
            """Everything AVSG reads from the registration, read after it ran: the top-k
            buffers, the host pool's views (this rank's own, where it holds them) or its
            published addresses, the block geometry."""
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
            # the serving core: which request holds which row, and every layer's buffer
            self.avsg_rows = RowTable(R)
            self.avsg_residency = Residency(
                self.num_layers, R, C, K, T, policy=policy, lifetime=int(opts["lifetime"]),
                max_context=self.max_model_len if policy == "reuse" else None, device=device,
                check=False)
            self.avsg_buffers = self.avsg_residency.buffers     # (inspection, tests)
            # the top-k buffers' memory read as one row per request (same bytes; a buffer
            # grown by tail blocks keeps them past the rows)
            self.avsg_kv_k = [_request_rows(b, R, C, "topk_buffers_k") for b in
                              self.topk_buffers_k]
            self.avsg_kv_v = [_request_rows(b, R, C, "topk_buffers_v") for b in
                              self.topk_buffers_v]
            self.avsg_row_bytes = (self.avsg_kv_k[0].shape[-1] * self.avsg_kv_k[0].element_size(),
                                   self.avsg_kv_v[0].shape[-1] * self.avsg_kv_v[0].element_size())
            self.avsg_host_k_bases, self.avsg_host_v_bases, self.avsg_host_source = \
                self._avsg_host_bases()
            bs = self.block_size
            self.avsg_pages_per_row = C // bs
            self.resident_block_table_npu = torch.zeros(
                self.max_num_topk_rows, C // bs, dtype=torch.int32, device=device)
            self.resident_seq_lens_npu = torch.full((self.max_num_topk_rows,), C,
                                                    dtype=torch.int32, device=device)
            # per step: the batch as begin_step saw it (host), device copies the layers read
            self._batch_req_ids: List[Optional[str]] = []
            self._batch_counts: List[int] = []
            self.avsg_state_row_of_batch = torch.full((R,), -1, dtype=torch.int64, device=device)
            self.avsg_batch_of_state_row = torch.zeros(R, dtype=torch.int64, device=device)
            self.avsg_scheduled_tokens = torch.zeros(R, dtype=torch.int64, device=device)
            # the group plan of the last non-skip layer (IndexCache reuses it)
            self._group_plan = None
            M = R * T * K
            self.avsg_max_misses = M
            self.h2d_src_npu = torch.zeros(2 * M + 2, dtype=torch.int64, device=device)
            self.h2d_dst_npu = torch.zeros(2 * M + 2, dtype=torch.int64, device=device)
            self.h2d_len_npu = torch.zeros(2 * M + 2, dtype=torch.int32, device=device)
            self.h2d_count_npu = torch.zeros(1, dtype=torch.int32, device=device)
            self.avsg_h2d_rows = torch.zeros((), dtype=torch.int64, device=device)
            # the hit/miss split (option split_attention): per token, the slots of its hits and
            # of its misses (valid first, then -1; fixed addresses, as current_slots_npu), and
            # the stream the copies go to so that attention over the hits need not wait
            self.avsg_split = bool(opts.get("split_attention", False))
            self.avsg_hit_slots_npu = torch.full((self.max_num_topk_rows, K), -1,
                                                 dtype=torch.int32, device=device)
            self.avsg_miss_slots_npu = torch.full((self.max_num_topk_rows, K), -1,
                                                  dtype=torch.int32, device=device)
            self.avsg_copy_stream = CopyStream(device)
            self.avsg_host_blocks = self.kv_cache_config.num_blocks
            logger.info("AVSG sparse KV offload: %d layers, %d request rows x %d slots (T=%d, "
                        "topk=%d), policy=%s, host pool through %s", self.num_layers, R, C, T, K,
                        policy, self.avsg_host_source)

        def _avsg_host_bases(self):
            """Per layer, the host pool's K and V base addresses as this rank may use them: its
            own views where it holds them (rank 0 of the MemFabric pool; every rank of a
            per-rank-mapped pool such as Mooncake's), else the addresses rank 0 published
            (``gvas_k_bases``/``gvas_v_bases``). Checked against ``cpu_block_lens`` (the bytes
            of one host block) where it is published."""
            L, bs = self.num_layers, self.block_size
            tk, tv = self.avsg_row_bytes
            local_k = list(getattr(self, "k_caches_cpu", None) or [])
            local_v = list(getattr(self, "v_caches_cpu", None) or [])
            published_k = list(getattr(self, "gvas_k_bases", None) or [])
            published_v = list(getattr(self, "gvas_v_bases", None) or [])
            k_bases, v_bases, sources = [], [], set()
            for layer in range(L):
                k = local_k[layer] if layer < len(local_k) else None
                v = local_v[layer] if layer < len(local_v) else None
                if k is not None and v is not None:
                    k_bases.append(int(k.data_ptr()))
                    v_bases.append(int(v.data_ptr()))
                    sources.add("this rank's host views")
                elif layer < len(published_k) and layer < len(published_v):
                    k_bases.append(int(published_k[layer]))
                    v_bases.append(int(published_v[layer]))
                    sources.add("published addresses")
                else:
                    raise ValueError(
                        f"AVSG sparse KV offload: layer {layer} has neither a host view "
                        f"(k_caches_cpu/v_caches_cpu) nor a published address "
                        f"(gvas_k_bases/gvas_v_bases) after register_kv_caches")
            block_lens = list(getattr(self, "cpu_block_lens", None) or [])
            for layer, lens in enumerate(block_lens[:L]):
                if tuple(int(x) for x in lens) != (bs * tk, bs * tv):
                    raise ValueError(
                        f"AVSG sparse KV offload: layer {layer}'s host block is {tuple(lens)} "
                        f"bytes (cpu_block_lens), not block_size * row bytes = ({bs * tk}, "
                        f"{bs * tv}): a host layout AVSG does not know")
            return k_bases, v_bases, " and ".join(sorted(sources))

        def _offload_api(self):
            """``offload`` (MemFabric's) as the manager module holds it now."""
            return sys.modules[base_module].offload

        # ------------------------------------------------------------------ per step (host)
        def begin_step(self, req_ids: Sequence[Optional[str]], scheduled_tokens,
                       identities: Optional[Sequence] = None) -> None:
            """Map this step's batch (``req_ids[i]`` in batch row ``i``, ``scheduled_tokens[i]``
            tokens) to state rows; free the rows of requests no longer in the batch and reset a
            row before a request without one gets it (``apply_scheduler_output`` has freed the
            rows of resumed and restarted requests, so they get a reset one here).

            ``identities[i]``, where the model runner provides them: ``(slot, generation,
            active)`` of batch row ``i``'s runner-owned top-k buffer row, or ``None``. A request
            whose ``(slot, generation)`` differs from the one its row was last used under, or
            whose slot is not active, gets a reset row: the runner's identity decides when a
            row's contents end; the request-id table is the fallback where it gives none."""
            R = self.max_num_reqs
            if len(req_ids) > R:
                raise ValueError(f"req_ids: expected at most max_num_seqs = {R} requests, got "
                                 f"{len(req_ids)}")
            keys = [r if isinstance(r, str) else None for r in req_ids]
            state_of_batch, fresh = self.avsg_rows.assign(keys, identities)
            self.avsg_residency.reset(fresh)
            state_of_batch += [-1] * (R - len(state_of_batch))
            batch_of_state = [0] * R
            counts = [0] * R
            for i, row in enumerate(state_of_batch):
                if row >= 0:
                    batch_of_state[row] = i
                    counts[i] = int(scheduled_tokens[i])
            self._batch_req_ids = list(req_ids)
            self._batch_counts = counts[:len(req_ids)]
            self.avsg_state_row_of_batch.copy_(torch.tensor(state_of_batch, dtype=torch.int64))
            self.avsg_batch_of_state_row.copy_(torch.tensor(batch_of_state, dtype=torch.int64))
            self.avsg_scheduled_tokens.copy_(torch.tensor(counts, dtype=torch.int64))

        def adopt_runner_rows(self, slots, generations, active=None) -> bool:
            """The model runner's per-request buffer rows of this step (metadata
            ``req_topk_buffer_slots`` / ``req_topk_buffer_generations`` /
            ``req_topk_buffer_active``, batch order, as in the last ``begin_step``). Rows whose
            identity changed are reset (``begin_step``'s ``identities``); True if any was."""
            if not hasattr(self, "avsg_rows") or not self._batch_req_ids:
                return False
            slots, generations = _host_ints(slots), _host_ints(generations)
            flags = _host_ints(active) if active is not None else None
            identities = []
            for i in range(len(self._batch_req_ids)):
                slot = slots[i] if i < len(slots) else -1
                gen = generations[i] if i < len(generations) else -1
                on = bool(flags[i]) if flags is not None and i < len(flags) else True
                identities.append((slot, gen, on) if slot >= 0 and gen >= 0 else None)
            keys = [r if isinstance(r, str) else None for r in self._batch_req_ids]
            changed = self.avsg_rows.stale(keys, identities)
            if changed or any(key is not None and ident is not None
                              and self.avsg_rows.identity_of(key) != tuple(ident[:2])
                              for key, ident in zip(keys, identities)):
                self.begin_step(self._batch_req_ids, self._batch_counts, identities)
            return bool(changed)

        def apply_scheduler_output(self, scheduler_output) -> None:
            """Free the state rows of the requests this scheduler step does not continue with
            their KV intact. Called for every ``SchedulerOutput`` the model runner applies,
            including one that schedules no token (no forward, so no ``begin_step``)."""
            if not hasattr(self, "avsg_rows"):
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
            self.release_rows([req for req in self.avsg_rows.keys()
                               if req in kv_replaced or req not in scheduled])

        def release_rows(self, req_ids: Sequence[str]) -> None:
            """Free the state rows of ``req_ids`` (ids without a row are skipped). A freed row is
            reset before ``begin_step`` gives it to any request, this one included."""
            self.avsg_rows.release(req_ids)

        def state_row_of(self, req_id: str) -> Optional[int]:
            return self.avsg_rows.row_of(req_id)

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
                self._copy_group_plan(layer_id)
                if current_slots_npu.data_ptr() != self.current_slots_npu.data_ptr():
                    current_slots_npu[:N].copy_(self.current_slots_npu[:N])
            else:
                self._step(layer_id, N, block_table, topk_indices_npu, stable_prefix_lens_npu,
                           token_to_req_npu, current_slots_npu)

        def _step(self, layer_id, N, block_table, topk_indices, stable_prefix_lens,
                  token_to_req, current_slots_out):
            """One layer through the serving core: this pass's tokens to state rows, one
            ``Residency.step`` (drop the positions at or past each request's stable prefix,
            plan, and copy the misses with vllm-ascend's descriptors), the slots back per
            token."""
            R, T = self.max_num_reqs, self.decode_width
            self.avsg_rows.planned()
            if token_to_req is None:
                req = torch.arange(N, dtype=torch.int64, device=self.avsg_device)
                query = torch.zeros_like(req)
            else:
                req, query = token_layout.requests_of_token_map(token_to_req, N, R)
            # tokens past their request's scheduled count (graph padding) are not planned
            live = query < self.avsg_scheduled_tokens.index_select(0, req)
            tokens = token_layout.token_rows(req, query, live, self.avsg_state_row_of_batch, R, T)
            by_state = token_layout.to_rows(topk_indices[:N], tokens, R, T)
            # per state row: the first rewritten position, and the kv length after this pass
            stable = token_layout.row_minimum(stable_prefix_lens[:N], tokens, R,
                                              NO_LIMIT).clamp(max=NO_LIMIT)
            count = token_layout.row_counts(tokens, R)
            seq_lens = torch.where(count > 0, stable + count, 0).to(torch.int32)
            batch_rows = self.avsg_batch_of_state_row.clone()

            def copy(p):
                with self._avsg_copying(p, block_table, batch_rows):
                    self._copy_misses(layer_id, p, block_table, batch_rows)
            plan = self.avsg_residency.step(layer_id, by_state, seq_lens, copy,
                                            stable.to(torch.int32))
            self._group_plan = (plan, block_table, batch_rows)
            current_slots_out[:N].copy_(token_layout.to_tokens(plan.slots, tokens))
            if self.avsg_split:
                hits, misses = split_slots(plan)
                self.avsg_hit_slots_npu[:N].copy_(token_layout.to_tokens(hits, tokens))
                self.avsg_miss_slots_npu[:N].copy_(token_layout.to_tokens(misses, tokens))
            # (a token that is not planned lists its request's pages too; it reads no slot)
            token_layout.resident_pages(self.avsg_state_row_of_batch.index_select(0, req),
                                        self.avsg_pages_per_row,
                                        out=self.resident_block_table_npu[:N])

        def _copy_group_plan(self, layer_id):
            """A ``skip_topk`` layer (IndexCache) reuses the group's plan: the same misses into
            its own buffer. If that copy fails the group's buffer drops the plan's entries
            (this layer would read slots no copy filled), even though the group's copy
            succeeded. (A plan made under torch.compile tracing carries no source: untracked.)"""
            plan, block_table, batch_rows = self._group_plan
            try:
                with self._avsg_copying(plan, block_table, batch_rows):
                    self._copy_misses(layer_id, plan, block_table, batch_rows)
            except BaseException:
                if plan.source is not None:
                    plan.source.discard(plan)
                raise

        def _avsg_copying(self, plan, *tensors):
            """Where a layer's copy runs: with the split, on the copy stream (after the plan;
            the miss attention waits for it); else in order on the current stream."""
            if not self.avsg_split:
                return contextlib.nullcontext()
            return self.avsg_copy_stream.copying(plan.miss_pos, plan.miss_slots,
                                                 plan.miss_counts, *tensors)

        def reads_current_slots(self, sparse_indices) -> bool:
            """``sparse_indices`` is the per-token slot list this manager wrote (what
            vllm-ascend's decode passes to sparse flash attention)."""
            return isinstance(sparse_indices, torch.Tensor) and \
                sparse_indices.data_ptr() == self.current_slots_npu.data_ptr()

        def split_attention(self, attend, num_tokens: int):
            """The decode layer's sparse flash attention as the split runs it: ``attend(indices)``
            runs vllm-ascend's op over ``indices`` (``[N, 1, K]``, valid first, then -1) with
            ``return_lse`` and returns ``(out, softmax_max, softmax_sum)``. Attention over the
            hits (already resident: it may run while the copy stream fills the misses), the
            wait for the copy, attention over the misses, and the merge by log-sum-exp
            (``torch_npu.npu_attention_update`` where torch_npu has it). Returns the merged
            output in the op's dtype. docs/overlap.md gives the tolerance against one pass."""
            N = num_tokens
            out_h, max_h, sum_h = attend(self.avsg_hit_slots_npu[:N].unsqueeze(1))
            self.avsg_copy_stream.wait()
            out_m, max_m, sum_m = attend(self.avsg_miss_slots_npu[:N].unsqueeze(1))
            return attention_update(out_h, _token_lse(lse_of(max_h, sum_h), out_h), out_m,
                                    _token_lse(lse_of(max_m, sum_m), out_m))

        def _copy_misses(self, layer_id, plan, table, batch_rows):
            """``plan``'s misses into this layer's buffer, from the shared host pool, by address
            (on every TP rank: this rank's own host views where it holds them, else the
            addresses rank 0 published); ``table`` the host block table in batch order,
            ``batch_rows`` the batch row of each state row."""
            R, C, bs = self.max_num_reqs, self.avsg_capacity, self.block_size
            M = self.avsg_max_misses
            dev = self.avsg_device
            W = plan.miss_pos.shape[1]
            counts = plan.miss_counts.to(torch.int64).clamp(0, W)
            idx = torch.arange(W, device=dev)[None, :]
            live = idx < counts[:, None]
            pos = plan.miss_pos.to(torch.int64).clamp(min=0)
            slot = plan.miss_slots.to(torch.int64).clamp(0, C - 1)
            batch_rows = batch_rows.clamp(0, table.shape[0] - 1)
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
            tk, tv = self.avsg_row_bytes
            src_k = self.avsg_host_k_bases[layer_id] + host_row * tk
            src_v = self.avsg_host_v_bases[layer_id] + host_row * tv
            dst_k = self.avsg_kv_k[layer_id].data_ptr() + dev_row * tk
            dst_v = self.avsg_kv_v[layer_id].data_ptr() + dev_row * tv
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
            # the copy settles the plan's misses: the caller (Residency.step, or
            # _copy_group_plan for a skip_topk layer) drops them if it raises
            self._offload_api().sparse_copy(self.h2d_src_npu, self.h2d_dst_npu,
                                            self.h2d_len_npu, self.h2d_count_npu, dev)

    return AVSGSparseKVOffloadManager


def _token_lse(lse: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Sparse flash attention's LSE in TND layout, ``[kv_heads = 1, N, heads]``, as ``out``'s
    ``[N, heads]`` (vllm-ascend's context-parallel decode permutes it the same way)."""
    return lse.permute(1, 0, 2).reshape(out.shape[:-1])


def _request_rows(buffer: torch.Tensor, rows: int, capacity: int, name: str) -> torch.Tensor:
    """``buffer`` (``[P, S, 1, width]``, possibly with tail blocks past ``S``) read as ``rows``
    request rows of ``capacity`` slots: the same bytes from its start."""
    width = buffer.shape[-1]
    need = rows * capacity * width
    if not buffer.is_contiguous() or buffer.numel() < need:
        raise ValueError(f"AVSG sparse KV offload: {name} of shape {tuple(buffer.shape)} "
                         f"(contiguous={buffer.is_contiguous()}) cannot hold {rows} request rows "
                         f"of {capacity} slots")
    return buffer.reshape(-1)[:need].view(rows, capacity, 1, width)


def _host_ints(values) -> List[int]:
    """A tensor, a CpuGpuBuffer (its host side), a numpy array or a sequence, as host ints."""
    if values is None:
        return []
    if isinstance(values, torch.Tensor):
        return [int(v) for v in values.reshape(-1).tolist()]
    host = getattr(values, "cpu", None)
    if isinstance(host, torch.Tensor):
        return [int(v) for v in host.reshape(-1).tolist()]
    tolist = getattr(values, "tolist", None)
    if callable(tolist):
        values = tolist()
    return [int(v) for v in values]
