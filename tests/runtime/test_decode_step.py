"""One decode step, one way down (issue 22): the avsg store -> manager -> buffer -> ops.

* Calls, counted on an engine run (prompts and context fills, MTP-0/1/3): ``begin_step`` once per
  forward pass; each layer of a pass makes one call into the serving core (``manager.step``) and
  that makes one call into the buffer (``SparseKVBuffer.step``: drop + plan + copy), and nothing
  else reaches the buffer (no separate ``plan``, ``invalidate`` or ``gather``; the engine's
  invalidations are recorded, not launched); prefill passes plan nothing. The op launches are
  counted where they are dispatched (``torch.ops.avsg.*``): per layer and pass one plan, which
  carries the drop (``valid_lens``), and no invalidate (issue 43).
* Outputs: the tokens and logits equal the device store's bit for bit, and every row attention
  reads through the store's slots equals the host pool's row at the selected position (the KV
  bytes), on every retrieve.
* Before and after: the store's ``[R, T, K]`` path (``begin_step_rtk`` / ``step``) leaves
  exactly what the manager's TND path (``begin_step`` / ``retrieve``, the way the store drove it
  before, with an idle row holding no tokens) leaves: tokens, logits, host copies, fresh copies,
  write-through rows, hit rate, and every layer's buffer state, device KV and host pool, bytes.
"""
from __future__ import annotations

import collections
import dataclasses

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from avsg import buffer as avsg_buffer
from avsg.cache import manager as serving
from avsg.runtime.base import Retrieved
from avsg.runtime.scheduler import Request
from avsg.runtime.spec import SimulatedAcceptance
from avsg.runtime.store.avsg import AVSGStore
from avsg.runtime.step import StepBatch

from helpers.engine import make_engine, prompts_for, run_requests, tiny_model  # noqa: F401


def _requests(config, prompts: bool):
    if prompts:
        return [Request(id=i, max_new_tokens=7 + 2 * i, prompt=p)
                for i, p in enumerate(prompts_for(config, 3, seed=11))]
    return [Request(id=i, max_new_tokens=8 + 2 * i, context_len=30 + 7 * i, first_token=i, seed=i)
            for i in range(3)]


def _engine(model, store_cls, mtp, prompts, write_through=False):
    acceptance = None if prompts or not mtp else SimulatedAcceptance(mtp, 0.8 * mtp)
    engine, store = make_engine(model, "device", rows=2, mtp=mtp, max_len=120,
                                capacity=(1 + mtp) * model.config.index_topk + 6,
                                acceptance=acceptance)
    if store_cls is not None:
        store = store_cls(dataclasses.replace(store.spec, write_through=write_through))
        engine.store = store
    return engine, store


class OpLaunches(TorchDispatchMode):
    """Every ``torch.ops.avsg`` launch, where it is dispatched, into ``log``: ``("launch", op,
    whether a plan got valid_lens)``."""

    def __init__(self, log):
        super().__init__()
        self.log = log

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace == "avsg":
            name = func._schema.name.split("::")[1]
            lens = kwargs.get("valid_lens", args[9] if len(args) > 9 else None)
            self.log.append(("launch", name, name.startswith("plan") and lens is not None))
        return func(*args, **kwargs)


class CallLog:
    """Wraps the model's passes, the store's hook and the manager's and buffers' entries; the
    log is one list of events in call order."""

    def __init__(self, model, store, monkeypatch):
        self.events = []
        self.in_retrieve = False
        mgr = store.manager
        # the model is shared by the module's tests: its wrappers go when the test ends
        self._wrap(model, "forward", lambda *a, **k: ("pass", "main", a[1].prefill), monkeypatch)
        self._wrap(model, "mtp_forward", lambda *a, **k: ("pass", "mtp", a[4].prefill),
                   monkeypatch)
        self._wrap(store, "begin_pass", lambda *a, **k: ("begin_pass",))
        for name in ("begin_step", "begin_step_rtk", "retrieve", "invalidate"):
            self._wrap(mgr, name, lambda *a, _n=name, **k: ("manager." + _n,))
        step = mgr.step

        def traced_step(*args, **kwargs):
            self.events.append(("manager.step", args[0]))
            self.in_retrieve = True
            try:
                return step(*args, **kwargs)
            finally:
                self.in_retrieve = False
        mgr.step = traced_step
        for layer, buf in enumerate(mgr.buffers):
            for name in ("step", "plan", "invalidate", "reset", "resize"):
                self._wrap(buf, name,
                           lambda *a, _l=layer, _n=name, **k: ("buffer." + _n, _l, self.in_retrieve))
        gather = avsg_buffer.gather

        def traced_gather(*args, **kwargs):
            self.events.append(("gather",))
            return gather(*args, **kwargs)
        monkeypatch.setattr(avsg_buffer, "gather", traced_gather)

    def _wrap(self, obj, name, event, monkeypatch=None):
        original = getattr(obj, name)

        def wrapped(*args, **kwargs):
            self.events.append(event(*args, **kwargs))
            return original(*args, **kwargs)
        if monkeypatch is None:
            setattr(obj, name, wrapped)
        else:
            monkeypatch.setattr(obj, name, wrapped)

    def passes(self):
        """The events of each forward pass: ``(kind, prefill, events)``."""
        out = []
        for event in self.events:
            if event[0] == "pass":
                out.append((event[1], event[2], []))
            elif (event[0] == "buffer.reset" or event[:2] == ("launch", "reset")) and not out:
                continue                # admissions before the first pass
            else:
                assert out, f"{event} before any forward pass"
                out[-1][2].append(event)
        return out


@pytest.mark.parametrize("mtp", [0, 1, 3])
@pytest.mark.parametrize("prompts", [False, True], ids=["context-fill", "prompts"])
def test_calls_per_pass_and_per_layer(tiny_model, monkeypatch, mtp, prompts):  # noqa: F811
    config = tiny_model.config
    L, mtp_layer = config.num_hidden_layers, config.num_hidden_layers
    engine, store = _engine(tiny_model, AVSGStore, mtp, prompts)
    log = CallLog(tiny_model, store, monkeypatch)
    requests = _requests(config, prompts)
    with OpLaunches(log.events):
        steps = len(engine.run(requests))
    totals = collections.Counter(e[0] for e in log.events)
    launches = collections.Counter(e[1] for e in log.events if e[0] == "launch")
    passes = log.passes()
    expected_layers = {"main": list(range(L)), "mtp": [mtp_layer]}
    for kind, prefill, events in passes:
        names = [e[0] for e in events]
        # the hook once per pass, first, and the manager's per-pass mapping once, inside it
        assert names[:2] == ["begin_pass", "manager.begin_step_rtk"], names[:2]
        assert names.count("begin_pass") == 1 and names.count("manager.begin_step_rtk") == 1
        assert "manager.begin_step" not in names and "manager.retrieve" not in names
        # one core call per layer, one buffer call inside it, nothing else reaches the buffer
        # outside the lifecycle (reset: admissions)
        assert not [e for e in events
                    if e[0] in ("buffer.plan", "buffer.invalidate", "buffer.resize", "gather")]
        assert not [e for e in events if e[0] == "buffer.step" and not e[2]]
        stepped = [e[1] for e in events if e[0] == "buffer.step"]
        retrieved = [e[1] for e in events if e[0] == "manager.step"]
        # the pass's launches but the resets of admissions (between passes): one launch per
        # layer (SERVING_LAUNCHES: plan_gather, the drop and the copy inside it)
        ops = [e[1:] for e in events if e[0] == "launch" and e[1] != "reset"]
        if prefill:                     # attention reads the pass's own KV: nothing planned
            assert stepped == retrieved == ops == []
        else:                           # every layer of the pass once, one buffer call each
            assert stepped == retrieved == expected_layers[kind]
            assert serving.SERVING_LAUNCHES == ("plan_gather",)
            assert ops == [("plan_gather", True)] * len(stepped), ops
    decode = [kind for kind, prefill, _ in passes if not prefill]
    verify, mtp_passes = decode.count("main"), decode.count("mtp")
    prefills = len(passes) - len(decode)
    assert verify == steps
    # per step one catch-up and n - 1 drafts; a prompt's prefill is followed by n - 1 drafts
    assert mtp_passes == steps * mtp + (len(requests) * (mtp - 1) if prompts and mtp else 0)
    assert prefills == (len(requests) * (2 if mtp else 1) if prompts else 0)
    assert totals["pass"] == totals["begin_pass"] == totals["manager.begin_step_rtk"] \
        == len(passes)
    assert totals["buffer.step"] == totals["manager.step"] == launches["plan_gather"] == verify * L + mtp_passes
    assert set(launches) <= {"plan_gather", "reset"}
    if mtp:     # the engine drops rejected drafts twice per step (the MTP layer, then all)
        assert totals["manager.invalidate"] >= 2 * steps


class TNDStore(AVSGStore):
    """The avsg store driving the manager's TND entries, as a serving engine with flattened
    batches does (and as this store did before issue 22): each pass's active rows own ``T``
    tokens each, packed in row order; idle rows own none."""

    def begin_pass(self, batch: StepBatch) -> None:
        R, T = batch.pos.shape
        q_len = torch.where(batch.active, T, 0).to(torch.int32)
        qsl = torch.cat([torch.zeros(1, dtype=torch.int32), q_len.cumsum(0).to(torch.int32)])
        # token index of (row, query); idle rows go to a spare token R*T
        token = qsl[:-1, None].long() + torch.arange(T)[None, :]
        self._token = torch.where(batch.active[:, None], token, R * T).reshape(-1)
        self._meta = self.manager.begin_step(qsl, batch.seq_lens, self.pool.block_table, R * T,
                                             check=True)
        self._batch = batch
        self._pass_kv = [None] * self.spec.layers

    def _packed(self, rows: torch.Tensor) -> torch.Tensor:
        out = torch.full((rows.shape[0] + 1, rows.shape[-1]), -1, dtype=rows.dtype)
        return out.index_copy_(0, self._token, rows)[:-1]

    def retrieve(self, layer, topk_pos, batch) -> Retrieved:
        assert batch is self._batch
        R, T, K = topk_pos.shape
        new_kv = self._pass_kv[layer]
        if new_kv is not None:
            new_kv = tuple(self._packed(part) for part in new_kv)
        out = self.manager.retrieve(layer, self._packed(topk_pos.reshape(R * T, K)).view(-1, 1, K),
                                    self._meta, new_kv=new_kv, check=True)
        plan = out.plan
        copied = torch.where(out.host_copied, plan.miss_pos, torch.full_like(plan.miss_pos, -1))
        self._count_copies(layer, copied, out.host_copied.sum(1))
        view = tuple(kv.view(R, self.spec.capacity, kv.shape[-1]) for kv in self.manager.kv[layer])
        index = plan.slots[:, :T]
        # the TND slots are the same selections, valid first: attention would read the same rows
        tnd = out.slots.view(-1, K)[self._token.clamp(max=R * T - 1)].view(R, T, K)
        for r in range(R):
            for t in range(T):
                want = index[r, t][index[r, t] >= 0]
                assert torch.equal(tnd[r, t, :want.numel()], want) or not batch.active[r]
        return Retrieved(view=view, index=index)


def _checked_retrieve(store):
    """Every retrieve: the rows attention reads equal the host pool's rows, bit for bit."""
    retrieve = store.retrieve
    reads = [0]

    def checked(layer, topk_pos, batch):
        got = retrieve(layer, topk_pos, batch)
        R, T, K = topk_pos.shape
        selected = topk_pos >= 0
        assert torch.equal(got.index >= 0, selected)
        rows = torch.arange(R)[:, None, None].expand(R, T, K)
        host_rows = store.pool.host_rows(rows[selected], topk_pos[selected])
        for view, pool in zip(got.view, store.pool.layer(layer)):
            read = view[rows[selected], got.index[selected].long()]
            want = pool.reshape(-1, pool.shape[-1])[host_rows.long()]
            assert torch.equal(read, want), f"layer {layer}: stale or wrong KV"
        reads[0] += int(selected.sum())
        return got
    store.retrieve = checked
    return reads


@pytest.mark.parametrize("mtp,prompts,write_through", [
    (0, True, False), (1, True, False), (3, True, True), (1, False, True), (3, False, False)])
def test_outputs_and_bytes_identical_to_device_and_tnd_path(tiny_model, mtp, prompts,  # noqa
                                                            write_through):
    config = tiny_model.config
    runs = {}
    for name, cls in (("device", None), ("avsg", AVSGStore), ("tnd", TNDStore)):
        engine, store = _engine(tiny_model, cls, mtp, prompts, write_through)
        reads = _checked_retrieve(store) if cls is not None else [0]
        requests = _requests(config, prompts)
        runs[name] = (run_requests(engine, requests), store, reads[0])
    (outputs, logits), _, _ = runs["device"]
    for name in ("avsg", "tnd"):
        (got_out, got_logits), _, reads = runs[name]
        assert got_out == outputs, name
        assert all(torch.equal(got_logits[i], logits[i]) for i in logits), name
        assert reads > 0
    avsg, tnd = runs["avsg"][1], runs["tnd"][1]
    assert avsg.h2d_rows() == tnd.h2d_rows() > 0
    assert avsg.h2d_fresh_rows() == tnd.h2d_fresh_rows()
    assert avsg.hit_rate() == tnd.hit_rate() > 0
    assert int(avsg.manager.write_through_rows) == int(tnd.manager.write_through_rows)
    assert (int(avsg.manager.write_through_rows) > 0) == write_through
    for layer in range(len(avsg.buffers)):
        assert torch.equal(avsg.buffers[layer].state, tnd.buffers[layer].state), layer
        assert torch.equal(avsg.buffers[layer].stats_counts, tnd.buffers[layer].stats_counts)
        for mine, theirs in zip(avsg.manager.kv[layer], tnd.manager.kv[layer]):
            assert torch.equal(mine.view(torch.uint8), theirs.view(torch.uint8)), layer
        for mine, theirs in zip(avsg.pool.layer(layer), tnd.pool.layer(layer)):
            assert torch.equal(mine.view(torch.uint8), theirs.view(torch.uint8)), layer


def test_idle_rows_keep_their_residency_through_a_prefill(tiny_model):  # noqa: F811
    """A prompt admitted with MTP-3 runs draft passes in which only its own row is active: the
    other rows' buffers are not invalidated by them (before issue 22 the store gave an idle row
    T tokens at position 0, and the manager dropped the row's whole MTP-layer residency)."""
    config = tiny_model.config
    engine, store = _engine(tiny_model, AVSGStore, 3, prompts=True)
    prompts = prompts_for(config, 2, seed=3)
    engine.add(Request(id=0, max_new_tokens=12, prompt=prompts[0]))
    for _ in range(3):
        engine.step()
    mtp_layer = config.num_hidden_layers
    before = store.manager.resident(mtp_layer, 0)
    assert before
    engine.add(Request(id=1, max_new_tokens=4, prompt=prompts[1]))
    engine.admit()                          # row 1: prefill, MTP prefill, two draft passes
    after = store.manager.resident(mtp_layer, 0)
    assert after == before


def test_retrieve_needs_the_pass_begun(tiny_model):  # noqa: F811
    engine, store = _engine(tiny_model, AVSGStore, 0, prompts=False)
    config = tiny_model.config
    engine.add(Request(id=0, max_new_tokens=3, context_len=20, first_token=1))
    engine.step()
    batch = StepBatch.make(torch.zeros(2, 1, dtype=torch.int64), engine.length, engine.active)
    topk = torch.full((2, 1, config.index_topk), -1, dtype=torch.int32)
    with pytest.raises(RuntimeError, match="begin_pass"):
        store.retrieve(0, topk, batch)
    store.begin_pass(batch)
    assert store.retrieve(0, topk, batch).index.shape == (2, 1, config.index_topk)


def test_swapping_the_store_is_one_assignment(tiny_model):  # noqa: F811
    engine, store = _engine(tiny_model, None, 1, prompts=False)
    other = AVSGStore(store.spec)
    engine.store = other
    assert engine.ctx.store is other and engine.store is other
    engine.add(Request(id=0, max_new_tokens=3, context_len=20, first_token=1))
    while engine.step() is not None:
        pass
    assert other.hit_rate() is not None and other.h2d_rows() > 0 and store.h2d_rows() == 0
