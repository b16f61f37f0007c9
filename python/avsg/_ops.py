"""Loads the op library and completes the registrations of the ``torch.ops.avsg.*`` ops.

The schemas live in C++ (``op_host/avsg_ops.cpp``). This module adds:
* fake (Meta) implementations, so ``torch.compile(fullgraph=True)`` can trace a decode step;
  they serve FakeTensors and all-meta calls only, and refuse a call that mixes meta with real
  tensors (``check_meta_call``);
* the reference as the CPU implementation, only when the library brings no CPU kernel of its own.

The rest of the package calls the ops only through ``torch.ops.avsg``, so a backend swaps in
underneath without any API change.
"""
from __future__ import annotations

import glob
import os

import torch

from . import reference

_HERE = os.path.dirname(os.path.abspath(__file__))
OP_NAMES = ("plan", "plan_dual_pointer", "invalidate", "reset", "resize", "gather", "calibrate",
            "split_slots")

# op_host/calibrate_tiling.h: the calibration microkernel's lanes (the plan's kPlanProbes *
# kPlanChunk and kPlanChunk) and its output length. tests/kernels/test_calibrate.py checks them against
# the compiled op.
CALIB_GATHER_LANES = 4 * 512
CALIB_VECTOR_LANES = 512
CALIB_OUT_LEN = 8 + CALIB_GATHER_LANES


def _load_library() -> str:
    candidates = sorted(glob.glob(os.path.join(_HERE, "_C*.so")))
    if not candidates:
        raise ImportError(
            "avsg: the op library (avsg/_C*.so) is not built. Install the package with "
            "`pip install --no-build-isolation -e .` after `pip install torch==2.13.0`.")
    torch.ops.load_library(candidates[0])
    return candidates[0]


LIBRARY_PATH = _load_library()


def has_kernel(op: str, dispatch_key: str) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(f"avsg::{op}", dispatch_key)


def _layout(capacity: int, buckets: int, max_context: int, policy: int) -> reference.Layout:
    return reference.Layout(capacity, buckets, max_context, policy == reference.POLICY_IDS["reuse"])


def _layout_of(state, capacity: int, buckets: int, max_context: int) -> reference.Layout:
    """The layout of a state whose policy the op is not told (invalidate): read off its width."""
    reuse = reference.Layout(capacity, buckets, max_context, True)
    return reuse if state.shape[-1] == reuse.width else reuse._replace(reuse=False)


# ------------------------------------------------------------------- fake (shape) implementations

# The op library writes output rows at pitches padded to 32 B (op_host/plan_tiling.h) and returns
# views; the fake kernels return views of the same strides.
OUTPUT_ROW_ALIGN, COUNT_PITCH = 8, 8      # int32: PlanTiling::outPitch rounding, kPlanCountPitch


def _padded_rows(like, R: int, width: int):
    pitch = -(-width // OUTPUT_ROW_ALIGN) * OUTPUT_ROW_ALIGN
    return like.new_empty((R, pitch), dtype=torch.int32)[:, :width]


def _padded_counts(like, R: int):
    return like.new_empty((R, COUNT_PITCH), dtype=torch.int32)[:, 0]


def _plan_fake(topk_pos, seq_lens, state, stats, capacity, buckets, lifetime, policy=0,
               max_context=0, valid_lens=None):
    R, T, K = topk_pos.shape
    return (_padded_rows(topk_pos, R, T * K).view(R, T, K), _padded_rows(topk_pos, R, T * K),
            _padded_rows(topk_pos, R, T * K), _padded_counts(topk_pos, R))


def _gather_fake(miss_pos, miss_slots, miss_counts, src, dst, block_table, block_size,
                 partition, num_cores):
    return miss_pos.new_empty((num_cores,), dtype=torch.int32)


def _plan_gather_fake(topk_pos, seq_lens, state, stats, capacity, buckets, lifetime, policy,
                      max_context, valid_lens, src, dst, block_table, block_size, partition,
                      num_cores):
    return (*_plan_fake(topk_pos, seq_lens, state, stats, capacity, buckets, lifetime),
            topk_pos.new_empty((num_cores,), dtype=torch.int32))


def _calibrate_fake(values, mode, iters):
    return values.new_empty((CALIB_OUT_LEN,), dtype=torch.int32)


def _split_slots_fake(slots, miss_slots, miss_counts, capacity):
    R, T, K = slots.shape
    return (_padded_rows(slots, R, T * K).view(R, T, K), _padded_rows(slots, R, T * K).view(R, T, K))


def _none_fake(*args):
    return None


def _resize_fake(state, rows, capacities, capacity, buckets, lifetime, policy, max_context,
                 min_active):
    R, W = state.shape[0], reference.resize_width(capacity)
    return _padded_rows(state, R, W), _padded_rows(state, R, W), _padded_counts(state, R)


# The tensor arguments of each op, in schema order (op_host/avsg_ops.cpp), for the device check.
TENSOR_ARGS = {
    "plan": ("topk_pos", "seq_lens", "state", "stats"),
    "plan_dual_pointer": ("topk_pos", "seq_lens", "state", "stats"),
    "invalidate": ("state", "valid_lens"),
    "reset": ("state", "row_mask"),
    "resize": ("state", "rows", "capacities"),
    "gather": ("miss_pos", "miss_slots", "miss_counts", "src", "dst", "block_table"),
    "plan_gather": ("topk_pos", "seq_lens", "state", "stats"),
    "calibrate": ("values",),
    "split_slots": ("slots", "miss_slots", "miss_counts"),
}


# Tensor arguments after the ints: ((position in the schema, name), ...).
TRAILING_TENSOR_ARGS = {"plan": ((9, "valid_lens"),), "plan_dual_pointer": ((9, "valid_lens"),),
                        "plan_gather": ((9, "valid_lens"), (10, "src"), (11, "dst"),
                                        (12, "block_table"))}


def _named_tensors(op: str, args, kwargs=None):
    pairs = list(zip(TENSOR_ARGS[op], args)) + list((kwargs or {}).items())
    for index, name in TRAILING_TENSOR_ARGS.get(op, ()):
        if len(args) > index:
            pairs.append((name, args[index]))
    for name, value in pairs:
        if isinstance(value, (list, tuple)):
            for i, t in enumerate(value):
                yield f"{name}[{i}]", t
        elif value is not None:
            yield name, value


def check_meta_call(op: str, args, kwargs=None) -> None:
    """The fake kernels serve two callers: FakeTensorMode (torch.compile tracing: every tensor a
    FakeTensor, whatever device it stands for) and a call on real meta tensors. The dispatcher
    also picks them when any ONE argument is on meta, which would run no kernel and leave the
    other tensors' outputs uninitialised: refuse that, naming the odd argument out."""
    from torch._subclasses.fake_tensor import is_fake
    real = [(name, t) for name, t in _named_tensors(op, args, kwargs)
            if isinstance(t, torch.Tensor) and not is_fake(t)]
    on_meta = [(name, t) for name, t in real if t.device.type == "meta"]
    others = [(name, t) for name, t in real if t.device.type != "meta"]
    if not on_meta or not others:
        return
    why = "(a call with a meta tensor runs only the shape function): pass all on one device"
    if len(on_meta) <= len(others):
        (name, _), (like, t) = on_meta[0], others[0]
        raise ValueError(f"avsg.{op}: {name}: expected a tensor on {t.device} like {like}, got "
                         f"one on meta {why}")
    (name, t), (like, _) = others[0], on_meta[0]
    raise ValueError(f"avsg.{op}: {name}: expected a tensor on meta like {like}, got one on "
                     f"{t.device} {why}")


def _device_checked(op: str, fake):
    def impl(*args, **kwargs):
        check_meta_call(op, args, kwargs)
        return fake(*args, **kwargs)
    impl.__name__ = f"_{op}_fake"
    return impl


torch.library.register_fake("avsg::plan")(_device_checked("plan", _plan_fake))
torch.library.register_fake("avsg::plan_dual_pointer")(_device_checked("plan_dual_pointer",
                                                                       _plan_fake))
torch.library.register_fake("avsg::invalidate")(_device_checked("invalidate", _none_fake))
torch.library.register_fake("avsg::reset")(_device_checked("reset", _none_fake))
torch.library.register_fake("avsg::resize")(_device_checked("resize", _resize_fake))
torch.library.register_fake("avsg::gather")(_device_checked("gather", _gather_fake))
torch.library.register_fake("avsg::plan_gather")(_device_checked("plan_gather",
                                                                 _plan_gather_fake))
torch.library.register_fake("avsg::calibrate")(_device_checked("calibrate", _calibrate_fake))
torch.library.register_fake("avsg::split_slots")(_device_checked("split_slots", _split_slots_fake))


# ---------------------------------------------------- reference CPU implementation (fallback)

def _plan_ref(matcher):
    def impl(topk_pos, seq_lens, state, stats, capacity, buckets, lifetime, policy=0,
             max_context=0, valid_lens=None):
        return reference.plan(state, stats, topk_pos, seq_lens,
                              _layout(capacity, buckets, max_context, policy), lifetime, matcher=matcher,
                              policy=reference.POLICY_NAMES[policy], valid_lens=valid_lens)
    return impl


def _invalidate_ref(state, valid_lens, capacity, buckets, max_context=0):
    reference.invalidate(state, _layout_of(state, capacity, buckets, max_context), valid_lens)


def _reset_ref(state, row_mask, capacity, buckets, lifetime, policy=0, max_context=0):
    reference.reset(state, _layout(capacity, buckets, max_context, policy), row_mask, lifetime,
                    reference.POLICY_NAMES[policy])


def _resize_ref(state, rows, capacities, capacity, buckets, lifetime, policy, max_context,
                min_active):
    return reference.resize(state, _layout(capacity, buckets, max_context, policy), rows, capacities,
                            lifetime, reference.POLICY_NAMES[policy], min_active)


def _gather_ref(miss_pos, miss_slots, miss_counts, src, dst, block_table, block_size,
                partition, num_cores):
    return reference.gather(miss_pos, miss_slots, miss_counts, src, dst, block_table,
                            block_size if block_table is not None else None, partition, num_cores)


def _plan_gather_ref(topk_pos, seq_lens, state, stats, capacity, buckets, lifetime, policy,
                     max_context, valid_lens, src, dst, block_table, block_size, partition,
                     num_cores):
    return reference.plan_gather(state, stats, topk_pos, seq_lens,
                                 _layout(capacity, buckets, max_context, policy), lifetime, src,
                                 dst, block_table, block_size if block_table is not None else None,
                                 partition, num_cores, policy=reference.POLICY_NAMES[policy],
                                 valid_lens=valid_lens)
def _split_slots_ref(slots, miss_slots, miss_counts, capacity):
    return tuple(reference.split_slots(slots, miss_slots, miss_counts, capacity))


_REFERENCE_IMPLS = {
    "plan": _plan_ref("hash"),
    "plan_dual_pointer": _plan_ref("dual_pointer"),
    "invalidate": _invalidate_ref,
    "reset": _reset_ref,
    "resize": _resize_ref,
    "gather": _gather_ref,
    "plan_gather": _plan_gather_ref,
    "split_slots": _split_slots_ref,
}

#: Which implementation serves each op on CPU: "kernel" (compiled) or "reference" (Python).
CPU_BACKEND = {}
_lib = torch.library.Library("avsg", "IMPL")  # keeps the Python registrations alive
for _name, _impl in _REFERENCE_IMPLS.items():
    if has_kernel(_name, "CPU"):
        CPU_BACKEND[_name] = "kernel"
    else:
        _lib.impl(_name, _impl, "CPU")
        CPU_BACKEND[_name] = "reference"


def npu_available() -> bool:
    """True when torch_npu imports and an NPU device is visible."""
    try:
        import torch_npu  # noqa: F401
    except Exception:
        return False
    return hasattr(torch, "npu") and torch.npu.is_available()


def has_op(name: str) -> bool:
    """Whether the loaded op libraries define ``torch.ops.avsg.<name>`` (some exist only in the
    emulation build or with the NPU backend)."""
    return hasattr(torch.ops.avsg, name)
