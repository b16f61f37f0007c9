"""The kernels the serving path launches per layer and pass are the ones ``serving_launches``
states (the decode model prices launches from ``SERVING_LAUNCHES``, the runtime's default): every
``torch.ops.avsg`` op a ``retrieve`` / ``step`` dispatches is counted, on MTP passes with rejected
drafts, recorded drops and write-through, and must equal it, in order. By default that is one
launch per layer and pass (plan, drop and copy: ``plan_gather``); write-through, the split copy
and ``fuse_copy=False`` keep the plan and the gather apart."""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from avsg.lab.costmodel import projection
from avsg.cache import manager as serving, split_rule

from test_serving_manager import K, R, T, block_table, decode_inputs, make


class AvsgOps(TorchDispatchMode):
    """Records the name of every avsg op dispatched inside it (the torch glue is left out)."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "avsg":
            self.names.append(func._schema.name.split("::")[1])
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("write_through, fuse_copy", [(False, None), (True, None), (False, False)])
def test_retrieve_launches_what_serving_launches_states(write_through, fuse_copy):
    mgr, _ = make(write_through=write_through, fuse_copy=fuse_copy)
    for row in range(R):
        mgr.add(row)
    per_pass = []
    for step in range(4):
        qsl, seq, topk = decode_inputs(step)
        meta = mgr.begin_step(qsl, seq, block_table(), qsl[-1].item())
        news = None
        if write_through:
            news = [torch.randn(topk.shape[0], 1, c.width).to(c.dtype)
                    for c in mgr.kv_format.components]
        for layer in range(2):
            with AvsgOps() as ops:
                mgr.retrieve(layer, topk, meta, new_kv=news)
            per_pass.append(ops.names)
        mgr.invalidate(seq - 1)              # the engine drops a rejected draft: recorded only
        rtk = mgr.begin_step_rtk(seq + 1, T, block_table(), torch.ones(R, dtype=torch.bool))
        with AvsgOps() as ops:
            mgr.step(0, topk.view(R, T, K), rtk, new_kv=news and [
                n.view(R * T, 1, -1) for n in news])
        per_pass.append(ops.names)
    want = serving.serving_launches(write_through, fused=mgr.fuse_copy)
    assert len(per_pass) == 12 and all(names == list(want) for names in per_pass), per_pass
    if not write_through and fuse_copy is None:
        assert want == serving.SERVING_LAUNCHES == ("plan_gather",)    # one launch on CPU


def test_the_split_copy_keeps_the_gather_apart():
    mgr, _ = make()
    for row in range(R):
        mgr.add(row)
    qsl, seq, topk = decode_inputs(0)
    rtk = mgr.begin_step_rtk(seq + 1, T, block_table(), torch.ones(R, dtype=torch.bool))
    with AvsgOps() as ops:
        mgr.step(0, topk.view(R, T, K), rtk, split=True)
        mgr.copy_stream.wait()
    # the copy leaves the fused launch for its own stream, and the step emits the hit/miss lists
    assert ops.names == list(serving.serving_launches(split=True)) + ["split_slots"] \
        == ["plan", "gather", "split_slots"]
    # what the decode model and step(split="auto") price: these, beside the unsplit step's one
    # launch, plus the attention call and the merge the caller adds (SPLIT_LAUNCHES' other two)
    callers = [n for n in split_rule.SPLIT_LAUNCHES if n != "split_slots"]
    assert len(ops.names) + len(callers) - len(serving.SERVING_LAUNCHES) \
        == serving.split_added_launches()


def test_the_decode_model_takes_avsg_launches_from_the_serving_constant(monkeypatch):
    assert projection.launches_per_layer("avsg") == len(serving.SERVING_LAUNCHES) == 1
    monkeypatch.setattr(serving, "SERVING_LAUNCHES", ("plan", "gather"))
    assert projection.launches_per_layer("avsg") == 2
    assert projection.launches_per_layer("lru-device") == 2     # the same manager, lru policy
    assert projection.launches_per_layer("fused-2048") == 0
