"""vllm-ascend's model runner applying scheduler outputs to the AVSG sparse KV offload, step by
step, steps that schedule no token included (project issue 40: a request preempted while it was
alone kept its buffer row and, once resumed, read the KV from before its preemption).

Run by the test functions at the end of vllm_ascend_drive.py (the session collects that file),
and built on it: the same manager, layers, stand-ins and per-output exactness check.

Real here: ``NPUModelRunner.execute_model`` up to its ``_prepare_inputs`` call, and its early
return for a step that schedules no token; ``NPUModelRunner._update_states`` and vLLM's
``GPUModelRunner._update_states`` behind it, on a real ``NPUInputBatch`` (add, remove, condense:
the batch order every layer sees); vLLM's ``SchedulerOutput``, ``NewRequestData`` and
``CachedRequestData``, filled as vLLM's scheduler fills them for new, running, preempted,
resumed and finished requests (``preempted_req_ids``, ``resumed_req_ids``, ``finished_req_ids``).

Replaced: the runner's construction (``__new__`` plus the attributes those paths read, as
vllm-ascend's own runner unit tests do), the PP and DCP groups (world size 1), numba when it is
not installed (the runner module imports it; nothing here runs it), and ``_prepare_inputs``,
which stands for the forward: it makes the call ``_build_attention_metadata`` makes (the runner
module's ``update_sparse_kv_offload_metadata`` with the persistent batch's request ids), runs the
drive's layers in that batch order, every attention output checked against the host's current KV
of its positions, then stops ``execute_model`` (the rest of a forward needs an NPU model).
"""
import importlib.util
import sys
import types
from types import SimpleNamespace
from unittest import mock

import torch

import vllm_ascend_drive as drive

if importlib.util.find_spec("numba") is None:
    # vllm-ascend's runner module imports numba-jitted helpers (EPLB, n-gram drafts) that
    # nothing here calls; requirements-vllm.txt does not install numba
    _numba = types.ModuleType("numba")
    _numba.njit = _numba.jit = lambda *a, **k: a[0] if a and callable(a[0]) else (lambda f: f)
    _numba.prange = range
    _numba.get_num_threads = lambda: 1
    _numba.set_num_threads = lambda n: None
    _numba.__getattr__ = lambda name: mock.MagicMock(name=f"numba.{name}")
    sys.modules["numba"] = _numba

import vllm.v1.worker.gpu_model_runner as gpu_runner  # noqa: E402
import vllm_ascend.worker.block_table as npu_block_table  # noqa: E402
import vllm_ascend.worker.model_runner_v1 as npu_runner  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.v1.core.sched.output import (CachedRequestData, NewRequestData,  # noqa: E402
                                       SchedulerOutput)
from vllm_ascend.worker.npu_input_batch import NPUInputBatch  # noqa: E402

T, R, BS = drive.T, drive.R, drive.BS
MAX_TOKENS = 64                         # the drive's max_num_batched_tokens
_ONE_RANK = SimpleNamespace(world_size=1, rank_in_group=0, is_first_rank=True,
                            is_last_rank=True)


class ForwardDone(Exception):
    """Raised by the stand-in forward once the layers ran: ``execute_model`` stops there."""


def make_runner(manager, forward):
    """An ``NPUModelRunner`` with what ``execute_model`` and ``_update_states`` read for a
    decode-only batch with one draft token per request (no PP, DP, KV connector, async
    scheduling, multimodal or pooling)."""
    with mock.patch.object(npu_block_table, "get_dcp_group", lambda: _ONE_RANK):
        batch = NPUInputBatch(
            max_num_reqs=R, max_model_len=drive.MAX_LEN, max_num_batched_tokens=MAX_TOKENS,
            device=torch.device("cpu"), pin_memory=False, vocab_size=256, block_sizes=[BS],
            kernel_block_sizes=[[BS]], max_num_blocks_per_req=[drive.MAX_LEN // BS],
            is_spec_decode=True, num_speculative_tokens=T - 1)
    runner = npu_runner.NPUModelRunner.__new__(npu_runner.NPUModelRunner)
    runner.__dict__.update(
        input_batch=batch, requests={}, num_prompt_logprobs={}, encoder_cache={},
        late_interaction_runner=SimpleNamespace(on_requests_finished=lambda ids: None,
                                                register_request=lambda *args: None),
        speculative_config=SimpleNamespace(use_ngram_gpu=lambda: False),
        num_spec_tokens=T - 1, use_async_scheduling=False, use_async_spec_decode=False,
        is_pooling_model=False, uses_mrope=False, uses_xdrope_dim=0,
        kv_cache_config=SimpleNamespace(kv_cache_groups=[]),   # (no attention-backend reorder)
        device=torch.device("cpu"), execute_model_state=None, prepare_inputs_event=None,
        vllm_config=SimpleNamespace(
            model_config=SimpleNamespace(enable_return_routed_experts=False)),
        ascend_config=SimpleNamespace(scheduler_config=SimpleNamespace(
            profiling_chunk_config=SimpleNamespace(enabled=False, need_timing=False))),
        parallel_config=SimpleNamespace(distributed_executor_backend="mp",
                                        data_parallel_size=1, enable_dbo=False),
        cache_config=SimpleNamespace(kv_sharing_fast_prefill=False),
        sparse_kv_offload_manager=manager,
        _start_dump_data=lambda **kwargs: None,
        _prepare_inputs=forward)
    return runner


class RunnerEngine(drive.Engine):
    """The drive's engine (host pool, true KV, layers) with a scheduler in front of vllm-ascend's
    model runner: the persistent batch, its order and its changes are the runner's."""

    def __init__(self, policy, seed=0):
        super().__init__(1, seed, policy=policy)
        self.manager = self.managers[0]
        self.runner = make_runner(self.manager, self._forward)
        self.known = {}              # req id -> drive.Request (its latest incarnation)
        self.running = []            # scheduler order
        self.blocks_sent = {}        # req id -> how many of its blocks the runner was told of
        self.events = {"new": set(), "resumed": set(), "preempted": set(), "finished": set()}
        self.pad_to = None
        self.forwards = 0
        self.steps = 0
        self.row_faults = []         # after a step: requests holding a state row they should not

    # ---- scheduler side: what vLLM's scheduler does between two steps
    def admit(self, rid=None):
        req = drive.Request(rid or f"req-{self.next_id}", self.rng.randint(20, 60), self.rng)
        self.next_id += 1
        req.prompt_len = req.n
        self.write_prefill(req)      # PD decode node: the prompt's KV arrives in the host pool
        self.known[req.rid] = req
        self.running.append(req)
        self.events["new"].add(req.rid)
        return req.rid

    def preempt(self, rid):
        req = self.known[rid]
        self.running.remove(req)
        self.release(req)            # its KV blocks go back to the pool
        self.waiting.append(req)
        self.events["preempted"].add(rid)

    def resume(self, rid):
        req = self.known[rid]
        self.waiting.remove(req)
        self.write_prefill(req)      # KV recomputed into new blocks: new values, new host rows
        self.running.append(req)
        self.events["resumed"].add(rid)

    def finish(self, rid):
        req = self.known[rid]
        self.running.remove(req)
        self.release(req)
        self.truth.pop(rid)
        self.events["finished"].add(rid)

    def scheduler_output(self):
        """This step's ``SchedulerOutput``: every running request decodes ``T`` tokens (one
        draft); none when nothing runs."""
        new_reqs, cached_ids, cached_blocks, computed = [], [], [], []
        resumed = self.events["resumed"]
        for req in self.running:
            self.ensure_blocks(req, req.n + T)
            if req.rid in self.events["new"]:
                new_reqs.append(NewRequestData(
                    req_id=req.rid, prompt_token_ids=[0] * req.prompt_len, mm_features=[],
                    sampling_params=SamplingParams(max_tokens=drive.MAX_LEN),
                    pooling_params=None, block_ids=(list(req.blocks),),
                    num_computed_tokens=req.n, lora_request=None))
            else:
                cached_ids.append(req.rid)
                sent = 0 if req.rid in resumed else self.blocks_sent[req.rid]
                added = list(req.blocks[sent:])
                # a resumed request's list replaces its old one; a running one's is appended
                cached_blocks.append((added,) if added or req.rid in resumed else None)
                computed.append(req.n)
            self.blocks_sent[req.rid] = len(req.blocks)
        # vLLM's scheduler lists the resumed after the running ones
        order = sorted(range(len(cached_ids)), key=lambda i: cached_ids[i] in resumed)
        cached = CachedRequestData(
            req_ids=[cached_ids[i] for i in order], resumed_req_ids=set(resumed),
            new_token_ids=[],
            all_token_ids={rid: [0] * self.known[rid].prompt_len for rid in resumed},
            new_block_ids=[cached_blocks[i] for i in order],
            num_computed_tokens=[computed[i] for i in order],
            num_output_tokens=[0] * len(order))
        scheduled = {req.rid: T for req in self.running}
        return SchedulerOutput(
            scheduled_new_reqs=new_reqs, scheduled_cached_reqs=cached,
            num_scheduled_tokens=scheduled, total_num_scheduled_tokens=sum(scheduled.values()),
            scheduled_spec_decode_tokens={rid: [0] * (T - 1) for rid in scheduled},
            scheduled_encoder_inputs={}, num_common_prefix_blocks=[0],
            finished_req_ids=set(self.events["finished"]), free_encoder_mm_hashes=[],
            preempted_req_ids=set(self.events["preempted"]))

    # ---- one engine step: schedule, then the runner
    def run_step(self, pad=False):
        out = self.scheduler_output()
        for happened in self.events.values():
            happened.clear()
        self.pad_to = R * T if pad and 0 < len(self.running) < R else None
        forwards = self.forwards
        with mock.patch.object(npu_runner, "get_pp_group", lambda: _ONE_RANK), \
                mock.patch.object(gpu_runner, "get_pp_group", lambda: _ONE_RANK):
            try:
                result = self.runner.execute_model(out)
            except ForwardDone:
                result = None
        if out.total_num_scheduled_tokens == 0:
            # the runner returned before building attention metadata: no begin_step
            assert result is npu_runner.EMPTY_MODEL_RUNNER_OUTPUT and self.forwards == forwards
        else:
            assert self.forwards == forwards + 1
        # whether or not a forward ran: rows only for this step's requests, none lost
        held = self.manager.avsg_rows.held()
        if set(held) != set(out.num_scheduled_tokens):
            self.row_faults.append((self.steps, sorted(held), sorted(out.num_scheduled_tokens)))
        assert sorted(list(held.values()) + self.manager.avsg_rows.free_rows()) == list(range(R))
        self.steps += 1

    def decode(self, steps):
        for i in range(steps):
            self.run_step(pad=i % 2 == 1)

    def _forward(self, scheduler_output, num_scheduled_tokens_np):
        """``_prepare_inputs``' place: the sparse KV offload's part of the forward."""
        batch = self.runner.input_batch
        req_ids = list(batch.req_ids[:batch.num_reqs])
        assert num_scheduled_tokens_np.tolist() == [T] * len(req_ids)
        assert sorted(req_ids) == sorted(r.rid for r in self.running)
        self.batch = [self.known[rid] for rid in req_ids]
        self.step(pad_to=self.pad_to, update_metadata=self._build_attention_metadata)
        self.forwards += 1
        raise ForwardDone

    def _build_attention_metadata(self, num_tokens, num_reqs, num_tokens_padded,
                                  num_reqs_padded, req_ids, query_start_loc, req_ids_buf,
                                  token_to_req_buf):
        """The runner's call: its module's function (the plugin's hook), the batch's ids."""
        batch = self.runner.input_batch
        assert list(req_ids) == list(batch.req_ids[:num_reqs])
        npu_runner.update_sparse_kv_offload_metadata(
            num_tokens, num_reqs, num_tokens_padded, num_reqs_padded,
            batch.req_ids[:num_reqs], query_start_loc, req_ids_buf, token_to_req_buf)


# ----------------------------------------------------------------------------- scenarios
def preempted_alone(engine):
    a = engine.admit()
    engine.decode(4)
    engine.preempt(a)
    engine.run_step()            # the only request preempted: nothing scheduled, no forward
    engine.run_step()            # nothing scheduled (it waits): no forward either
    engine.resume(a)
    engine.decode(4)


def _three_preempted_in_one_step(engine):
    rids = [engine.admit() for _ in range(3)]
    engine.decode(3)
    for rid in rids:
        engine.preempt(rid)
    engine.run_step()            # all of them preempted: nothing scheduled, no forward
    engine.run_step()
    return rids


def several_preempted_resumed_in_order(engine):
    a, b, c = _three_preempted_in_one_step(engine)
    engine.resume(a)
    engine.decode(2)
    engine.resume(b)
    engine.resume(c)
    engine.decode(3)


def several_preempted_resumed_in_reverse(engine):
    a, b, c = _three_preempted_in_one_step(engine)
    engine.resume(c)
    engine.decode(2)
    engine.resume(b)
    engine.resume(a)
    engine.decode(3)


def _one_beside_another_then_one_alone(engine):
    a, b = engine.admit(), engine.admit()
    engine.decode(3)
    engine.preempt(b)
    engine.run_step()            # b preempted beside a: a forward with a alone
    engine.decode(1)
    engine.preempt(a)
    engine.run_step()            # a preempted alone: no forward
    return a, b


def preempted_beside_then_alone_resume_earlier_first(engine):
    a, b = _one_beside_another_then_one_alone(engine)
    engine.resume(b)
    engine.decode(2)
    engine.resume(a)
    engine.decode(3)


def preempted_beside_then_alone_resume_later_first(engine):
    a, b = _one_beside_another_then_one_alone(engine)
    engine.resume(a)
    engine.decode(2)
    engine.resume(b)
    engine.decode(3)


def preempted_and_resumed_in_one_step(engine):
    """``reset_prefix_cache(reset_running_requests=True)``: every running request preempted and
    resumed by the next schedule, forwards on both sides."""
    rids = [engine.admit(), engine.admit()]
    engine.decode(3)
    for rid in rids:
        engine.preempt(rid)
    for rid in rids:
        engine.resume(rid)
    engine.decode(3)


def finished_alone_then_same_id_again(engine):
    a = engine.admit()
    engine.decode(3)
    engine.finish(a)
    engine.run_step()            # its finish reported in a step that schedules nothing
    engine.admit(a)              # a new request under the same id (an abort and resubmit)
    engine.decode(3)


SCENARIOS = {f.__name__: f for f in (
    preempted_alone, several_preempted_resumed_in_order, several_preempted_resumed_in_reverse,
    preempted_beside_then_alone_resume_earlier_first,
    preempted_beside_then_alone_resume_later_first, preempted_and_resumed_in_one_step,
    finished_alone_then_same_id_again)}


def run_scenario(name, policy, seed=0):
    drive.DeviceOperator.execute_sparse_flash_attention_process = classmethod(
        drive.cpu_sparse_flash_attention)
    engine = RunnerEngine(policy, seed)
    assert engine.manager.avsg_options["policy"] == policy
    SCENARIOS[name](engine)
    assert engine.forwards > 0 and engine.exact_tokens > 0
    # rows kept positions resident across steps, so a stale read was possible: exact reads mean
    # something only then
    hits = sum(buf.stats()["hits"] for buf in engine.manager.avsg_buffers)
    assert hits > 0, "no selection hit a resident position: the exactness check proved nothing"
    assert not engine.row_faults, f"rows kept past their request's step: {engine.row_faults}"
    return engine
