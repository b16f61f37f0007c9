"""The ``vllm.general_plugins`` entry point that puts vllm-ascend's sparse KV offload on AVSG.

vLLM calls ``register()`` in every process it starts. It does nothing (imports nothing from vllm
or vllm-ascend, patches nothing) unless ``AVSG_VLLM_ASCEND=1``. Switched on, it checks the
versions it supports and replaces, in vllm-ascend:

* ``sparse_kv_offload_manager.SparseKVOffloadManager`` (the class its
  ``init_sparse_kv_offload_manager`` instantiates) by ``AVSGSparseKVOffloadManager``;
* ``ascend_config.init_ascend_config`` (and every loaded module's binding of it) by a wrapper that
  turns vllm-ascend's refusal of ``additional_config["avsg"]`` (an ``AscendConfig`` that forbids
  unknown keys, #13838) into one line naming AVSG's own settings (``AVSG_CONFIG``,
  ``AVSG_POLICY``, ``AVSG_LIFETIME``); every other outcome passes through unchanged;

and, when that manager is created (the worker has imported its model runner by then):

* ``AscendSFAKVOffloadImpl._resident_views``: the manager's views over the whole per-request
  buffer (the stock one slices the first ``num_tokens`` per-token rows);
* ``update_sparse_kv_offload_metadata``, in the manager module and in every loaded vllm-ascend
  module that imported it by name (model runner V1; Model Runner V2's model-state and drafter
  modules): the original with its arguments as given, then ``manager.begin_step`` with the step's
  request ids and query lengths (``query_start_loc`` a ``CpuGpuBuffer``, a tensor or a numpy
  array). Modules imported later bind the wrapper from the manager module;
* ``AscendSFAKVOffloadMetadataBuilder.build`` / ``build_for_drafting``: where the common metadata
  carries the runner's per-request buffer rows (``req_topk_buffer_slots``,
  ``req_topk_buffer_generations``, ``req_topk_buffer_active``), ``manager.adopt_runner_rows``
  first (a changed generation resets the request's row), then the original as called;
* the request lifecycle, for every scheduler output (forward or not): model runner V1's
  ``NPUModelRunner._update_states`` (which ``execute_model`` runs before its early return when
  nothing is scheduled) and Model Runner V2's ``NPUModelRunner.finish_requests`` (likewise):
  ``manager.apply_scheduler_output`` with that output, then the original. Only there does the
  manager see a request leave (finished, preempted) or come back with recomputed KV (resumed)
  in a step that runs no forward: the metadata function above runs only with a forward.

``register_kv_caches`` and ``offload_new_kv`` are never re-called with fixed arguments: the
manager passes whatever ``register_kv_caches`` gets through to vllm-ascend's and reads the views
after it; ``offload_new_kv`` is vllm-ascend's own, untouched.

The upstream hook that would make all of this unnecessary is a manager-class key in
``sparse_kv_offload_config`` plus per-step calls on the manager (docs/vllm-ascend.md).
"""
from __future__ import annotations

import functools
import inspect
import os
import sys

from .vllm_ascend import ENV_SWITCH, config_refusal

SUPPORTED_VLLM = "0.27"             # the oldest vLLM supported; later ones are accepted, with a
RAN_VLLM = "0.27.1"                 # warning that only this one ran with the plugin here
SUPPORTED_VLLM_ASCEND = "main at 182b75ea (2026-08-22) or releases/v0.26.0rc"
_ONLOAD_PARAMS = ("layer_name", "num_tokens", "num_reqs", "block_table", "topk_indices_npu",
                  "current_slots_npu", "req_ids_npu", "stable_prefix_lens_npu",
                  "token_to_req_npu", "capturing", "skip_topk")
_METADATA_PARAMS = ("num_reqs", "req_ids", "query_start_loc")   # read by name, any order

_MANAGER_MODULE = "vllm_ascend.distributed.kv_transfer.sparse_kv_offload.sparse_kv_offload_manager"
_CONFIG_MODULE = "vllm_ascend.ascend_config"
_RUNNER_MODULE = "vllm_ascend.worker.model_runner_v1"
_RUNNER_V2_MODULE = "vllm_ascend.worker.v2.model_runner"
_ATTN_MODULE = "vllm_ascend.attention.sfa_kv_offload"
_PACKAGE = "vllm_ascend"            # modules whose by-name imports are rebound
_METADATA_FUNCTION = "update_sparse_kv_offload_metadata"
_CONFIG_FUNCTION = "init_ascend_config"
_BUILDER_METHODS = ("build", "build_for_drafting")
# (module, class, method called with the scheduler output for every scheduler step)
_LIFECYCLE_HOOKS = ((_RUNNER_MODULE, "NPUModelRunner", "_update_states"),
                    (_RUNNER_V2_MODULE, "NPUModelRunner", "finish_requests"))


def enabled() -> bool:
    return os.environ.get(ENV_SWITCH, "").strip().lower() in ("1", "true", "yes", "on")


def register() -> None:
    """Entry point (``vllm.general_plugins``: ``avsg_sparse_kv_offload``)."""
    if not enabled():
        return
    install()


class UnsupportedVersion(RuntimeError):
    pass


def _version_tuple(text: str):
    parts = []
    for piece in str(text).split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def check_versions() -> None:
    """One-line ``UnsupportedVersion`` naming what is supported and what was found. vLLM older
    than 0.27 is refused; a later one is accepted with a warning (only 0.27.1 ran here). The
    vllm-ascend interface is checked by shape: ``onload_topk_kv``'s parameters (unchanged in
    every version seen) and the parameters of ``update_sparse_kv_offload_metadata`` the hook
    reads by name."""
    import vllm
    from importlib import metadata

    found_vllm = getattr(vllm, "__version__", "unknown")
    found_tuple = _version_tuple(found_vllm)
    if len(found_tuple) < 2 or found_tuple[:2] < _version_tuple(SUPPORTED_VLLM):
        raise UnsupportedVersion(f"{ENV_SWITCH}=1: AVSG's vllm-ascend backend supports vllm "
                                 f"{SUPPORTED_VLLM}.x (or later) with vllm-ascend "
                                 f"{SUPPORTED_VLLM_ASCEND}; found vllm {found_vllm}")
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
    update = getattr(vam, _METADATA_FUNCTION, None)
    update = getattr(update, "_stock", update)
    update_params = set(inspect.signature(update).parameters) if update is not None else set()
    if params != _ONLOAD_PARAMS or not set(_METADATA_PARAMS) <= update_params:
        raise UnsupportedVersion(f"{ENV_SWITCH}=1: AVSG's vllm-ascend backend supports vllm-ascend "
                                 f"{SUPPORTED_VLLM_ASCEND}; found {found} with another sparse KV "
                                 f"offload interface")
    if not str(found_vllm).startswith(RAN_VLLM[:len(SUPPORTED_VLLM)] + "."):
        from .vllm_ascend import _logger
        _logger().warning("AVSG sparse KV offload: vllm %s with vllm-ascend %s; the plugin ran "
                          "only with vllm %s and vllm-ascend 182b75ea, later upstream shapes are "
                          "handled from reading upstream's code (docs/vllm-ascend.md)",
                          found_vllm, found, RAN_VLLM)


def install() -> None:
    """Check versions, guard ``init_ascend_config``, then make
    ``init_sparse_kv_offload_manager`` build the AVSG manager."""
    check_versions()
    import importlib
    vam = importlib.import_module(_MANAGER_MODULE)
    if getattr(vam, "_ORIGINAL_SPARSE_KV_OFFLOAD_MANAGER", None) is None:
        vam._ORIGINAL_SPARSE_KV_OFFLOAD_MANAGER = vam.SparseKVOffloadManager
    try:
        _guard_config(importlib.import_module(_CONFIG_MODULE))
    except ImportError:
        pass
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


# ---------------------------------------------------------------------------------- helpers
def _rebind(name: str, stock, new, prefix: str = _PACKAGE) -> list:
    """In every loaded module of ``prefix`` whose attribute ``name`` is ``stock`` or an earlier
    wrapper of it, set it to ``new``; the modules changed."""
    changed = []
    for mod_name, module in list(sys.modules.items()):
        if module is None or not (mod_name == prefix or mod_name.startswith(prefix + ".")):
            continue
        current = getattr(module, name, None)
        if current is None or current is new:
            continue
        if current is stock or getattr(current, "_stock", None) is stock:
            setattr(module, name, new)
            changed.append(mod_name)
    return changed


def _guard_config(config_module, prefix: str = _PACKAGE) -> None:
    """Wrap ``init_ascend_config`` (idempotent): vllm-ascend's refusal of
    ``additional_config["avsg"]`` becomes ``vllm_ascend.AVSGConfigRefused``, one line."""
    if config_module is None:
        return
    current = getattr(config_module, _CONFIG_FUNCTION, None)
    if current is None:
        return
    stock = getattr(current, "_stock", current)

    @functools.wraps(stock)
    def init_ascend_config(vllm_config, *args, **kwargs):
        try:
            return stock(vllm_config, *args, **kwargs)
        except Exception as exc:
            refusal = config_refusal(exc, getattr(vllm_config, "additional_config", None))
            if refusal is None:
                raise
            raise refusal from None
    init_ascend_config._avsg = True
    init_ascend_config._stock = stock
    setattr(config_module, _CONFIG_FUNCTION, init_ascend_config)
    _rebind(_CONFIG_FUNCTION, stock, init_ascend_config, prefix)


def query_lengths(query_start_loc, num_reqs: int):
    """Per-request query lengths from ``query_start_loc``: a ``CpuGpuBuffer`` (its host side), a
    tensor (wherever it is) or a numpy array / sequence of cumulative starts."""
    import numpy as np
    import torch
    q = query_start_loc
    if isinstance(q, torch.Tensor):
        starts = q.detach().reshape(-1)[:num_reqs + 1].cpu().numpy()
    elif isinstance(getattr(q, "cpu", None), torch.Tensor):
        starts = q.cpu.reshape(-1)[:num_reqs + 1].numpy()
    else:
        starts = np.asarray(getattr(q, "np", q)).reshape(-1)[:num_reqs + 1]
    starts = starts.astype(np.int64)
    return starts[1:] - starts[:-1]


def wrap_metadata_update(stock, get_manager):
    """``update_sparse_kv_offload_metadata`` that runs ``stock`` with its arguments as given,
    then ``begin_step`` on ``get_manager()`` with the step's request ids and query lengths (read
    by parameter name, so any order and extra parameters pass)."""
    signature = inspect.signature(stock)

    @functools.wraps(stock)
    def update_sparse_kv_offload_metadata(*args, **kwargs):
        result = stock(*args, **kwargs)
        manager = get_manager()
        if manager is not None and hasattr(manager, "begin_step"):
            named = signature.bind(*args, **kwargs).arguments
            num_reqs = int(named["num_reqs"])
            req_ids = list(named["req_ids"][:num_reqs])
            lengths = query_lengths(named["query_start_loc"], num_reqs)
            manager.begin_step(req_ids, lengths[:len(req_ids)])
        return result
    update_sparse_kv_offload_metadata._avsg = True
    update_sparse_kv_offload_metadata._stock = stock
    return update_sparse_kv_offload_metadata


def runner_rows_of(args, kwargs):
    """``(slots, generations, active)`` from the first argument that carries the runner's
    per-request buffer rows (``req_topk_buffer_slots`` and ``req_topk_buffer_generations`` both
    set), or ``None``."""
    for value in list(args) + list(kwargs.values()):
        slots = getattr(value, "req_topk_buffer_slots", None)
        generations = getattr(value, "req_topk_buffer_generations", None)
        if slots is not None and generations is not None:
            return slots, generations, getattr(value, "req_topk_buffer_active", None)
    return None


def _hook_builder(builder_cls, get_manager) -> None:
    """``build`` / ``build_for_drafting``: the runner's rows to the manager first (idempotent)."""
    for name in _BUILDER_METHODS:
        stock = builder_cls.__dict__.get(name)
        if stock is None or getattr(stock, "_avsg", False):
            continue

        def make(stock):
            @functools.wraps(stock)
            def method(self, *args, **kwargs):
                rows = runner_rows_of(args, kwargs)
                manager = get_manager()
                if rows is not None and manager is not None and \
                        hasattr(manager, "adopt_runner_rows"):
                    manager.adopt_runner_rows(*rows)
                return stock(self, *args, **kwargs)
            method._avsg = True
            method._stock = stock
            return method
        setattr(builder_cls, name, make(stock))


def hook_lifecycle(cls, method_name: str, get_manager) -> bool:
    """``cls.method_name(self, scheduler_output, ...)``: the scheduler output to the manager's
    ``apply_scheduler_output`` first, then the original (idempotent). False if ``cls`` has no
    such method."""
    stock = getattr(cls, method_name, None)
    if stock is None:
        return False
    if getattr(stock, "_avsg", False):
        return True

    @functools.wraps(stock)
    def method(self, scheduler_output, *args, **kwargs):
        manager = getattr(self, "sparse_kv_offload_manager", None) or get_manager()
        if manager is not None and hasattr(manager, "apply_scheduler_output"):
            manager.apply_scheduler_output(scheduler_output)
        return stock(self, scheduler_output, *args, **kwargs)
    method._avsg = True
    method._stock = stock
    method._own = method_name in cls.__dict__       # else inherited: uninstall deletes ours
    setattr(cls, method_name, method)
    return True


# ---------------------------------------------------------------------------------- runtime
def split_operator(stock, get_manager):
    """``stock`` (vllm-ascend's ``DeviceOperator``) as the sparse-KV-offload attention module
    sees it once the plugin is installed: its decode call of sparse flash attention over the
    manager's slot lists goes through ``manager.split_attention`` when the split is on (option
    ``split_attention``); every other call (split off, prefill, a caller asking for the LSE
    itself, another manager's slots) is the stock op's, unchanged, except that a call over the
    manager's slots with the split on first waits for the copy stream (the step queued the
    misses' copy there). The op itself is looked up at call time (tests replace it on
    ``stock``)."""
    class AVSGDeviceOperator(stock):
        _avsg = True
        _stock = stock

        @classmethod
        def execute_sparse_flash_attention_process(cls, sfa_impl, ql_nope, q_pe, kv_cache,
                                                   topk_indices, attn_metadata,
                                                   actual_seq_lengths_query,
                                                   actual_seq_lengths_key, *args, **kwargs):
            run = super().execute_sparse_flash_attention_process
            fixed = (sfa_impl, ql_nope, q_pe, kv_cache)
            lengths = (attn_metadata, actual_seq_lengths_query, actual_seq_lengths_key)
            manager = get_manager()
            ours = getattr(manager, "avsg_split", False) and \
                manager.reads_current_slots(topk_indices)
            if args or kwargs.get("return_lse") or not ours:
                if ours:
                    # over all of the manager's slots in one call: the misses among them are
                    # filled by the copy stream, which this layer's step left running
                    manager.avsg_copy_stream.wait()
                return run(*fixed, topk_indices, *lengths, *args, **kwargs)

            def attend(indices):
                return run(*fixed, indices, *lengths, **dict(kwargs, return_lse=True))
            return manager.split_attention(attend, ql_nope.shape[0])

    return AVSGDeviceOperator


def install_runtime_hooks() -> None:
    """The attention-view, per-step and lifecycle hooks (idempotent)."""
    import importlib
    vam = importlib.import_module(_MANAGER_MODULE)
    attn = importlib.import_module(_ATTN_MODULE)

    def get_manager():
        return getattr(vam, "_SPARSE_KV_OFFLOAD_MANAGER", None)

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
    builder = getattr(attn, "AscendSFAKVOffloadMetadataBuilder", None)
    if builder is not None:
        _hook_builder(builder, get_manager)
    operator = getattr(attn, "DeviceOperator", None)
    if operator is not None and not getattr(operator, "_avsg", False):
        attn.DeviceOperator = split_operator(operator, get_manager)
    current = getattr(vam, _METADATA_FUNCTION)
    original = getattr(current, "_stock", current)
    update = wrap_metadata_update(original, get_manager)
    vam.update_sparse_kv_offload_metadata = update
    # by-name imports: model runner V1, Model Runner V2's model-state and drafter modules
    _rebind(_METADATA_FUNCTION, original, update)
    # the manager is built by the model runner (init_sparse_kv_offload_manager's caller), so
    # the runner module is loaded by now in a server
    hooked = []
    for module_name, class_name, method_name in _LIFECYCLE_HOOKS:
        module = sys.modules.get(module_name)
        if module is None:
            continue
        cls = getattr(module, class_name, None)
        if cls is None or not hook_lifecycle(cls, method_name, get_manager):
            if module_name == _RUNNER_MODULE:
                raise UnsupportedVersion(
                    f"{ENV_SWITCH}=1: AVSG's vllm-ascend backend supports vllm-ascend "
                    f"{SUPPORTED_VLLM_ASCEND}; found a model runner without "
                    f"{class_name}.{method_name}")
            continue
        hooked.append(f"{module_name}.{class_name}.{method_name}")
    if not hooked:
        from .vllm_ascend import _logger
        _logger().warning("AVSG sparse KV offload: no model runner module (%s) is loaded, so the "
                          "per-step request lifecycle hook is not installed; rows follow "
                          "forward steps only",
                          ", ".join(m for m, _, _ in _LIFECYCLE_HOOKS))


def uninstall() -> None:
    """Undo ``install`` and the runtime hooks (tests)."""
    vam = sys.modules.get(_MANAGER_MODULE)
    if vam is None:
        return
    orig = getattr(vam, "_ORIGINAL_SPARSE_KV_OFFLOAD_MANAGER", None)
    if orig is not None:
        vam.SparseKVOffloadManager = orig
    stock_update = getattr(getattr(vam, _METADATA_FUNCTION, None), "_stock", None)
    if stock_update is not None:
        vam.update_sparse_kv_offload_metadata = stock_update
        _rebind(_METADATA_FUNCTION, stock_update, stock_update)
    config_module = sys.modules.get(_CONFIG_MODULE)
    stock_config = getattr(getattr(config_module, _CONFIG_FUNCTION, None), "_stock", None)
    if stock_config is not None:
        setattr(config_module, _CONFIG_FUNCTION, stock_config)
        _rebind(_CONFIG_FUNCTION, stock_config, stock_config)
    for module_name, class_name, method_name in _LIFECYCLE_HOOKS:
        cls = getattr(sys.modules.get(module_name), class_name, None)
        method = getattr(cls, method_name, None)
        if getattr(method, "_avsg", False):
            if method._own:
                setattr(cls, method_name, method._stock)
            else:
                delattr(cls, method_name)
    attn = sys.modules.get(_ATTN_MODULE)
    if attn is not None:
        operator = getattr(attn, "DeviceOperator", None)
        if getattr(operator, "_avsg", False):
            attn.DeviceOperator = operator._stock
        views = attn.AscendSFAKVOffloadImpl._resident_views
        if getattr(views, "_avsg", False):
            attn.AscendSFAKVOffloadImpl._resident_views = staticmethod(views._stock)
        builder = getattr(attn, "AscendSFAKVOffloadMetadataBuilder", None)
        for name in _BUILDER_METHODS:
            method = builder.__dict__.get(name) if builder is not None else None
            if getattr(method, "_avsg", False):
                setattr(builder, name, method._stock)
