"""The hit/miss split's mechanics: a copy stream with its event, and the log-sum-exp merge.

A decode layer that splits (``avsg.split_slots``) runs attention over its hits (resident before
the step's copies) while the misses are copied, waits for the copy, runs attention over the
misses and merges the two partial outputs by their log-sum-exp. ``CopyStream`` is the only place
that knows about streams: on an NPU the copies go to a side stream ordered after the plan, and an
event orders the miss attention after them; on CPU there are no streams, every method is a
no-op and the copies simply run first (the same schedule, in order). What the device does with
two streams at once, and what the overlap can therefore be worth, is docs/overlap.md's subject.

``merge_attention`` is the merge, a reference on every device; ``attention_update`` uses
torch_npu's fused ``npu_attention_update`` where it exists and ``merge_attention`` elsewhere.
"""
from __future__ import annotations

import contextlib
from typing import Iterator, Optional, Tuple

import torch


class CopyStream:
    """A side stream for a step's copies, and the event the miss attention waits on.

    ``copying(*tensors)``: the work queued inside runs on the copy stream after everything the
    current stream queued before it (the plan), and the copy stream records its event on exit;
    ``tensors`` made on the current stream and read by the copies are marked as in use by the
    copy stream (``record_stream``), so the allocator does not hand their memory out again while
    the copies still read it. ``wait()``: the current stream waits for that event (no host sync).
    On a device without streams (CPU) both are no-ops.
    """

    def __init__(self, device):
        self.device = torch.device(device)
        self._stream = None
        self._event = None
        if self.device.type == "npu":
            import torch_npu  # noqa: F401  (torch.npu)
            self._stream = torch.npu.Stream(device=self.device)
            self._event = torch.npu.Event()

    @property
    def has_streams(self) -> bool:
        return self._stream is not None

    @contextlib.contextmanager
    def copying(self, *tensors: torch.Tensor) -> Iterator[None]:
        if self._stream is None:
            yield
            return
        current = torch.npu.current_stream(self.device)
        self._stream.wait_stream(current)
        with torch.npu.stream(self._stream):
            yield
        for t in tensors:
            t.record_stream(self._stream)
        self._event.record(self._stream)

    def wait(self) -> None:
        if self._stream is not None:
            torch.npu.current_stream(self.device).wait_event(self._event)


def lse_of(softmax_max: torch.Tensor, softmax_sum: torch.Tensor) -> torch.Tensor:
    """Log-sum-exp from sparse flash attention's ``softmax_max`` and ``softmax_sum`` (fp32):
    ``max + log(sum)``, ``-inf`` where nothing was selected (``sum <= 0``, whatever ``max``
    holds there: what the op writes for a token with no valid index is not documented)."""
    total = softmax_sum.float()
    return torch.where(total > 0, softmax_max.float() + torch.log(total.clamp(min=1e-38)),
                       torch.full_like(total, float("-inf")))


def merge_attention(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor,
                    lse_b: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Attention over two disjoint parts of one selection, merged: ``out_*`` ``[..., D]`` (any
    float dtype), ``lse_*`` ``[...]`` fp32 log-sum-exp of each part's scores (``-inf``: the part
    is empty). Returns ``(out, lse)``: ``out = a * out_a + b * out_b`` in fp32, cast to
    ``out_a``'s dtype, with ``a = exp(lse_a - lse)``, ``b = exp(lse_b - lse)``,
    ``lse = m + log(exp(lse_a - m) + exp(lse_b - m))``, ``m = max(lse_a, lse_b)``; both parts
    empty gives zeros and ``-inf``. docs/overlap.md derives how far it may be from attention over
    the whole selection."""
    lse_a, lse_b = lse_a.float(), lse_b.float()
    top = torch.maximum(lse_a, lse_b)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    weight_a = torch.exp(lse_a - top)
    weight_b = torch.exp(lse_b - top)
    total = weight_a + weight_b
    lse = top + torch.log(total)
    scale = torch.where(total > 0, 1.0 / total, torch.zeros_like(total))
    # an empty part weighs 0 and its output (undefined for an empty selection) is not read
    a = torch.where((weight_a > 0)[..., None], out_a.float() * (weight_a * scale)[..., None], 0.0)
    b = torch.where((weight_b > 0)[..., None], out_b.float() * (weight_b * scale)[..., None], 0.0)
    return (a + b).to(out_a.dtype), lse


def _npu_attention_update():
    """torch_npu's fused merge, or None (not installed, or a release without it)."""
    try:
        import torch_npu
    except ImportError:
        return None
    return getattr(torch_npu, "npu_attention_update", None)


def attention_update(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor,
                     lse_b: torch.Tensor, fused: Optional[bool] = None) -> torch.Tensor:
    """``merge_attention``'s output, by ``torch_npu.npu_attention_update`` on an NPU tensor when
    torch_npu has it (``fused=None``: whenever it can; ``False``: never). Shapes as
    ``merge_attention`` with ``out_*`` ``[..., D]``; the fused op takes fp32 ``lse`` ``[N]`` and
    ``out`` ``[N, D]`` per part (``update_type`` 0, as vllm-ascend's context-parallel decode
    calls it) and returns fp32, cast here to ``out_a``'s dtype."""
    update = _npu_attention_update() if fused is not False and out_a.device.type == "npu" \
        else None
    if update is None:
        if fused:
            raise RuntimeError("attention_update(fused=True): torch_npu.npu_attention_update is "
                               "not available for this tensor")
        return merge_attention(out_a, lse_a, out_b, lse_b)[0]
    D = out_a.shape[-1]
    # the fused op's handling of -inf (an empty part) is not documented: an empty part gets
    # the most negative finite LSE (weight exp(-huge) = 0) and a zero output instead
    lowest = torch.finfo(torch.float32).min
    outs, lses = [], []
    for out, lse in ((out_a, lse_a), (out_b, lse_b)):
        lse = lse.reshape(-1).float()
        empty = ~torch.isfinite(lse)
        lses.append(torch.where(empty, lowest, lse))
        outs.append(torch.where(empty[:, None], 0.0, out.reshape(-1, D).float()))
    outs, lses = tuple(outs), tuple(lses)
    merged, _ = update(lses, outs, 0)
    return merged.view(out_a.shape).to(out_a.dtype)
