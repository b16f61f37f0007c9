"""The ``vllm.general_plugins`` entry point that puts vllm-ascend's sparse KV offload on AVSG.

vLLM calls ``register()`` in every process it starts. It does nothing (imports nothing from vllm
or vllm-ascend, patches nothing) unless ``AVSG_VLLM_ASCEND=1``. Switched on, it checks the
versions it supports and replaces, in vllm-ascend:

* ``sparse_kv_offload_manager.SparseKVOffloadManager`` (the class its
  ``init_sparse_kv_offload_manager`` instantiates) by ``AVSGSparseKVOffloadManager``;

and, when that manager is created (the worker has imported the model runner by then):

* ``AscendSFAKVOffloadImpl._resident_views``: the manager's views over the whole per-request
  buffer (the stock one slices the first ``num_tokens`` per-token rows);
* ``update_sparse_kv_offload_metadata`` (in the manager module and the model runner, which
  imported it by name): the original, then ``manager.begin_step`` with the step's request ids;
* ``NPUModelRunner._update_states`` (the runner's per-step state update, which ``execute_model``
  runs for every scheduler output, before returning early when it schedules no token):
  ``manager.apply_scheduler_output`` with that output, then the original. Only there does the
  manager see a request leave (finished, preempted) or come back with recomputed KV (resumed)
  in a step that runs no forward: the metadata function above runs only with a forward.

The upstream hook that would make all of this unnecessary is a manager-class key in
``sparse_kv_offload_config`` plus per-step calls on the manager (docs/vllm-ascend.md).
"""
from __future__ import annotations

import inspect
import os
import sys

from .vllm_ascend import ENV_SWITCH

SUPPORTED_VLLM = "0.27"
SUPPORTED_VLLM_ASCEND = "main at 182b75ea (2026-08-22) or releases/v0.26.0rc"
_ONLOAD_PARAMS = ("layer_name", "num_tokens", "num_reqs", "block_table", "topk_indices_npu",
                  "current_slots_npu", "req_ids_npu", "stable_prefix_lens_npu",
                  "token_to_req_npu", "capturing", "skip_topk")

_MANAGER_MODULE = "vllm_ascend.distributed.kv_transfer.sparse_kv_offload.sparse_kv_offload_manager"
_RUNNER_MODULE = "vllm_ascend.worker.model_runner_v1"
_ATTN_MODULE = "vllm_ascend.attention.sfa_kv_offload"


def enabled() -> bool:
    return os.environ.get(ENV_SWITCH, "").strip().lower() in ("1", "true", "yes", "on")


def register() -> None:
    """Entry point (``vllm.general_plugins``: ``avsg_sparse_kv_offload``)."""
    if not enabled():
        return
    install()


class UnsupportedVersion(RuntimeError):
    pass


def check_versions() -> None:
    """One-line ``UnsupportedVersion`` naming what is supported and what was found."""
    import vllm
    from importlib import metadata

    found_vllm = getattr(vllm, "__version__", "unknown")
    if not str(found_vllm).startswith(SUPPORTED_VLLM + "."):
        raise UnsupportedVersion(f"{ENV_SWITCH}=1: AVSG's vllm-ascend backend supports vllm "
                                 f"{SUPPORTED_VLLM}.x with vllm-ascend {SUPPORTED_VLLM_ASCEND}; "
                                 f"found vllm {found_vllm}")
    try:
        found = metadata.version("vllm_ascend")
    except metadata.PackageNotFoundError:
        found = "a source checkout"
    try:
        import importlib
        vam = importlib.import_module(_MANAGER_MODULE)
    except ImportError as exc:
        raise UnsupportedVersion(f"{ENV_SWITCH}=1: AVSG's vllm-ascend backend needs vllm-ascend "
                                 f"{SUPPORTED_VLLM_ASCEND} (with sparse KV offload); found "
                                 f"{found} without it ({exc})") from None
    cls = getattr(vam, "_ORIGINAL_SPARSE_KV_OFFLOAD_MANAGER", None) or \
        getattr(vam, "SparseKVOffloadManager", None)
    onload = getattr(cls, "onload_topk_kv", None)
    params = tuple(inspect.signature(onload).parameters)[1:] if onload else ()
    if params != _ONLOAD_PARAMS or not hasattr(vam, "update_sparse_kv_offload_metadata"):
        raise UnsupportedVersion(f"{ENV_SWITCH}=1: AVSG's vllm-ascend backend supports vllm-ascend "
                                 f"{SUPPORTED_VLLM_ASCEND}; found {found} with another sparse KV "
                                 f"offload interface")


def install() -> None:
    """Check versions, then make ``init_sparse_kv_offload_manager`` build the AVSG manager."""
    check_versions()
    import importlib
    vam = importlib.import_module(_MANAGER_MODULE)
    if getattr(vam, "_ORIGINAL_SPARSE_KV_OFFLOAD_MANAGER", None) is None:
        vam._ORIGINAL_SPARSE_KV_OFFLOAD_MANAGER = vam.SparseKVOffloadManager
    from .vllm_ascend import backend_class
    cls = backend_class()
    if not getattr(cls, "_avsg_hooks", False):
        orig_init = cls.__init__

        def __init__(self, *args, **kwargs):
            orig_init(self, *args, **kwargs)
            install_runtime_hooks()
        cls.__init__ = __init__
        cls._avsg_hooks = True
    vam.SparseKVOffloadManager = cls


def install_runtime_hooks() -> None:
    """The attention-view and per-step hooks (idempotent)."""
    import importlib
    vam = importlib.import_module(_MANAGER_MODULE)
    attn = importlib.import_module(_ATTN_MODULE)
    impl = attn.AscendSFAKVOffloadImpl
    if not getattr(impl._resident_views, "_avsg", False):
        stock = impl._resident_views

        def _resident_views(manager, layer_name, rows):
            if hasattr(manager, "resident_views"):
                return manager.resident_views(layer_name, rows)
            return stock(manager, layer_name, rows)
        _resident_views._avsg = True
        _resident_views._stock = stock
        impl._resident_views = staticmethod(_resident_views)
    original = getattr(vam.update_sparse_kv_offload_metadata, "_stock",
                       vam.update_sparse_kv_offload_metadata)

    def update_sparse_kv_offload_metadata(num_tokens, num_reqs, num_tokens_padded,
                                          num_reqs_padded, req_ids, query_start_loc,
                                          offload_req_ids_tensor, offload_token_to_req):
        original(num_tokens, num_reqs, num_tokens_padded, num_reqs_padded, req_ids,
                 query_start_loc, offload_req_ids_tensor, offload_token_to_req)
        manager = vam._SPARSE_KV_OFFLOAD_MANAGER
        if manager is not None and hasattr(manager, "begin_step"):
            qsl = query_start_loc.cpu[:num_reqs + 1].numpy()
            manager.begin_step(list(req_ids[:num_reqs]), qsl[1:] - qsl[:-1])
    update_sparse_kv_offload_metadata._stock = original
    vam.update_sparse_kv_offload_metadata = update_sparse_kv_offload_metadata
    # the manager is built by the model runner (its only caller of init_sparse_kv_offload_manager
    # is NPUModelRunner.initialize_kv_cache), so the runner module is loaded by now in a server
    runner = sys.modules.get(_RUNNER_MODULE)
    if runner is None:
        from vllm.logger import logger
        logger.warning("AVSG sparse KV offload: %s is not loaded, so the per-step request "
                       "lifecycle hook is not installed; rows follow forward steps only",
                       _RUNNER_MODULE)
        return
    if hasattr(runner, "update_sparse_kv_offload_metadata"):
        runner.update_sparse_kv_offload_metadata = update_sparse_kv_offload_metadata
    _hook_update_states(vam, runner)


def _hook_update_states(vam, runner) -> None:
    """``NPUModelRunner._update_states``: the scheduler output to the manager first."""
    cls = getattr(runner, "NPUModelRunner", None)
    stock = getattr(cls, "_update_states", None)
    if stock is None:
        raise UnsupportedVersion(f"{ENV_SWITCH}=1: AVSG's vllm-ascend backend supports vllm-ascend "
                                 f"{SUPPORTED_VLLM_ASCEND}; found a model runner without "
                                 f"NPUModelRunner._update_states")
    if getattr(stock, "_avsg", False):
        return

    def _update_states(self, scheduler_output):
        manager = getattr(self, "sparse_kv_offload_manager", None) or \
            vam._SPARSE_KV_OFFLOAD_MANAGER
        if manager is not None and hasattr(manager, "apply_scheduler_output"):
            manager.apply_scheduler_output(scheduler_output)
        return stock(self, scheduler_output)
    _update_states._avsg = True
    _update_states._stock = stock
    _update_states.__wrapped__ = stock
    cls._update_states = _update_states


def uninstall() -> None:
    """Undo ``install`` and the runtime hooks (tests)."""
    vam = sys.modules.get(_MANAGER_MODULE)
    if vam is None:
        return
    orig = getattr(vam, "_ORIGINAL_SPARSE_KV_OFFLOAD_MANAGER", None)
    if orig is not None:
        vam.SparseKVOffloadManager = orig
    stock_update = getattr(vam.update_sparse_kv_offload_metadata, "_stock", None)
    if stock_update is not None:
        vam.update_sparse_kv_offload_metadata = stock_update
        runner = sys.modules.get(_RUNNER_MODULE)
        if runner is not None and getattr(runner, "update_sparse_kv_offload_metadata",
                                          None) is not None:
            runner.update_sparse_kv_offload_metadata = stock_update
    runner_cls = getattr(sys.modules.get(_RUNNER_MODULE), "NPUModelRunner", None)
    update_states = getattr(runner_cls, "_update_states", None)
    if getattr(update_states, "_avsg", False):
        runner_cls._update_states = update_states._stock
    attn = sys.modules.get(_ATTN_MODULE)
    if attn is not None:
        views = attn.AscendSFAKVOffloadImpl._resident_views
        if getattr(views, "_avsg", False):
            attn.AscendSFAKVOffloadImpl._resident_views = staticmethod(views._stock)
