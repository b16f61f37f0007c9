"""``avsg run``: the same decode workload in three modes, side by side.

    offload   KV in host memory; every step copies the union of each request's selections
    avsg      KV in host memory; one SparseKVBuffer per layer, only misses are copied
    device    all KV on the device (the upper bound offload tries to approach)

Each mode builds its own store and algorithm around one shared model and replays the same
requests (same contexts, same first tokens, same simulated-acceptance draws), so the outputs,
and the logits, must be identical: the run checks it and says so.

Defaults: the ``demo`` model at 32K context, 4 rows serving 8 requests (continuous batching),
MTP-1 with simulated acceptance (0.8 drafts accepted per step, labelled as such), selections
from the embedded real trace (``--trace`` for another), 8K-slot buffers, about 128 output tokens
per request.
Times are this machine's CPU running the kernels through the CPU backend: they show where time
goes, not what an NPU takes.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import os
import sys
import time
from typing import Dict, List, Optional

import numpy as np
import torch

from ..cli_util import (UsageError, check_memory_total, comma_list, int_in, keep_freed_memory,
                        output_path, progress_bar, read_input, torch_threads, writing)
from .. import model_config, reference
from ..runtime import store as _stores  # noqa: F401  (registers the stores)
from ..runtime.base import SPLIT_ATTENTION_CHOICES, STORES, StoreSpec, auto_split_policy
from ..runtime.context import ContextFill
from ..runtime.engine import Engine, StepRecord, positions_needed
from ..kvformat import FORMAT_NAMES, get_format
from ..runtime.scheduler import Request
from ..runtime.spec import parse_acceptance
from ..runtime.step import Timers
from ..lab.traces.lookup import TRACE_HELP

MODES = ("offload", "avsg", "device")
DEFAULT_CONTEXT = 32768
DEFAULT_ACCEPTANCE = "sim:0.8"
# "plan_gather": the avsg store's plan and copy as one launch (the manager's fuse_copy)
PHASES = ("index_select", "plan", "plan_gather", "gather", "attention")


# ------------------------------------------------------------------------------ arguments

def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config",
                        help="model preset (tiny, demo) or a DeepSeek-V3.2 config.json (default: "
                             "the --checkpoint's config.json, else demo)")
    parser.add_argument("--checkpoint", help="directory with config.json and *.safetensors to "
                        "load the model from (default: random weights from --seed)")
    parser.add_argument("--batch", type=int_in(1, 4096), default=4,
                        help="rows decoded together, 1..4096 (default 4)")
    parser.add_argument("--requests", type=int_in(1, 1 << 20),
                        help="requests to serve, 1..1048576 (default 2 x batch)")
    parser.add_argument("--context", type=int_in(1, 1 << 24),
                        help="context length of a request with --select indexer, up to the model's "
                             "positions (<= 16777216; default 32768, or what the model's positions "
                             "hold beside the outputs; "
                             "requests vary by up to 1024 below it); with trace selection the "
                             "contexts end at the trace's query positions")
    parser.add_argument("--new-tokens", type=int_in(1, 1 << 20), default=128,
                        help="output tokens per request, 1..1048576 (default 128; requests vary by "
                             "+-25%%); contexts plus outputs must fit the model's positions")
    parser.add_argument("--mtp", type=int, default=1, choices=range(0, 4), metavar="N",
                        help="MTP drafts per step, 0..3 (default 1)")
    parser.add_argument("--acceptance",
                        help="'sim:MEAN': simulated geometric acceptance, MEAN accepted drafts "
                             "per step (default sim:0.8: random weights draft nothing useful); "
                             "'greedy': real verification of the MTP module's drafts")
    parser.add_argument("--capacity", type=int_in(1, 32768), default=8192,
                        help="buffer slots per row and layer for the avsg mode, (1 + mtp) x "
                             "top-k..32768 (default 8192)")
    parser.add_argument("--policy", choices=("lifetime", "reuse", "lru"),
                        default=reference.DEFAULT_POLICY,
                        help=f"the avsg buffers' residency policy (default "
                             f"{reference.DEFAULT_POLICY})")
    parser.add_argument("--lifetime", type=int_in(1, 255), default=None,
                        help=f"the lifetime policy's L, 1..255 (default {reference.DEFAULT_LIFETIME}; only "
                             f"with the lifetime policy, the default)")
    parser.add_argument("--split-attention", nargs="?", const="on", default="off",
                        choices=tuple(SPLIT_ATTENTION_CHOICES),
                        help="avsg mode: attention over the buffer's hits and over its misses, "
                             "merged by log-sum-exp (the schedule that lets the copy overlap the "
                             "hits' attention; docs/overlap.md); auto: where the split rule "
                             "chooses it (the decode model's rule; on CPU, or without a measured "
                             "overlap, it never splits); default off: one pass, bit-exact with "
                             "the other modes")
    parser.add_argument("--select", choices=("trace", "indexer"), default="trace",
                        help="selection source: a recorded trace (default) or the model's indexer")
    parser.add_argument("--trace", help=f"selection trace: {TRACE_HELP}")
    parser.add_argument("--kv-format", choices=FORMAT_NAMES, default="bf16",
                        help="KV cache format (default bf16: 1152 B per token and layer)")
    parser.add_argument("--modes", default=",".join(MODES),
                        help=f"comma-separated subset of {','.join(MODES)}, each at most once "
                             f"(default: all)")
    parser.add_argument("--device", default="cpu", help="cpu (default) or npu (needs torch_npu)")
    parser.add_argument("--emulation", choices=("fast", "strict"), default="fast",
                        help="CPU kernel build: fast (checks compiled out, default) or strict")
    parser.add_argument("--seed", type=int_in(0, 2**63 - 1), default=0,
                        help="weights, contexts and tokens, >= 0 (default 0)")
    parser.add_argument("--record-trace", metavar="PATH",
                        help="write the selections of row 0 (verify passes) as a trace .npz "
                             "(.npz is appended when PATH lacks it)")
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def _positive(name: str, value: int) -> int:
    if value < 1:
        raise UsageError(f"{name}: expected >= 1, got {value}")
    return value


# -------------------------------------------------------------------------------- setup

def resolve_device(name: str) -> torch.device:
    if name == "cpu":
        return torch.device("cpu")
    if name == "npu":
        try:
            import torch_npu  # noqa: F401
        except ImportError:
            raise UsageError("--device npu: torch_npu is not installed (CANN + torch_npu needed)")
        return torch.device("npu")
    raise UsageError(f"--device: expected cpu or npu, got {name!r}")


def load_config(spec: str):
    try:
        if spec in model_config.PRESETS:
            return model_config.preset(spec)
        if os.path.isdir(spec):
            spec = os.path.join(spec, "config.json")
        if not os.path.exists(spec):
            raise UsageError(f"--config: {spec!r} is neither a preset "
                             f"({', '.join(model_config.PRESETS)}) nor a config.json file")
        return read_input("--config", spec, model_config.from_hf_config)
    except ValueError as e:
        raise UsageError(f"--config: {e}") from None


def checkpoint_config(directory: str, has_config_option: bool = True):
    """The model config a checkpoint directory carries: its ``config.json``. Without one the
    error points at ``--config`` where the command has it (run), else at the directory."""
    if not os.path.isdir(directory):
        raise UsageError(f"--checkpoint: not a directory: {directory}")
    path = os.path.join(directory, "config.json")
    if not os.path.isfile(path):
        hint = ("pass --config for the model it holds" if has_config_option else
                "a checkpoint directory holds the model's config.json beside its weights")
        raise UsageError(f"--checkpoint: {directory} has no config.json ({hint})")
    try:
        return read_input("--checkpoint", path, model_config.from_hf_config)
    except ValueError as e:                       # a broken config.json (JSON errors included)
        raise UsageError(f"--checkpoint: {path}: {e}") from None


def build_model(config, checkpoint: Optional[str], seed: int, device: torch.device):
    from ..runtime.model import DeepseekV32
    from ..runtime import weights
    torch.manual_seed(seed)
    model = DeepseekV32(config)
    if checkpoint:
        try:
            weights.load_safetensors(model, checkpoint)
        except (ValueError, OSError) as e:
            raise UsageError(f"--checkpoint: {e}") from None
    else:
        weights.init_random(model, seed)
    return model.to(device).eval()


def load_selection_trace(path: Optional[str]):
    """The trace to replay (the embedded one unless ``--trace``), and a line naming it."""
    from ..lab.traces.lookup import EMBEDDED_TRACE, find_trace, read_trace, trace_label
    path = find_trace(path)
    # values checked: a position past T or an unsorted row would reach the kernels' checks
    trace = read_trace("--trace", path, check_values=True)
    size = "" if path == EMBEDDED_TRACE else f" ({trace.layers} layers, {trace.steps} steps)"
    return trace, f"trace {trace_label(path)}{size}"


@dataclasses.dataclass
class Workload:
    rows: int
    requests: List[Request]
    description: str

    def fresh(self) -> List[Request]:
        """Unstarted copies, one set per mode."""
        return [dataclasses.replace(r, output=[], steps=0, drafts_offered=0, drafts_accepted=0)
                for r in self.requests]


def build_workload(rows: int, count: int, new_tokens: int, mtp: int, vocab: int, seed: int,
                   context: int, trace_positions: Optional[range]) -> Workload:
    """``count`` requests with different context lengths and output lengths.

    With a trace, request i's context ends at a trace query position spread over the trace,
    leaving room for its outputs and drafts; otherwise contexts are ``context`` minus up to 1024.
    """
    rng = np.random.default_rng(seed)
    lengths = [max(1, int(round(new_tokens * f))) for f in rng.uniform(0.75, 1.25, count)]
    requests = []
    for i in range(count):
        reach = positions_needed(0, lengths[i], mtp)
        if trace_positions is not None:
            span = len(trace_positions) - reach
            if span < 1:
                raise UsageError(f"--new-tokens: {lengths[i]} outputs (+{mtp} drafts) do not fit "
                                 f"the trace's {len(trace_positions)} steps")
            context_len = trace_positions.start + int(rng.integers(0, span))
        else:
            context_len = context - int(rng.integers(0, min(1024, context // 2)))
        requests.append(Request(id=i, max_new_tokens=lengths[i], context_len=context_len,
                                first_token=int(rng.integers(0, vocab)), seed=seed * 7919 + i))
    contexts = [r.context_len for r in requests]
    return Workload(rows, requests, f"{count} requests on {rows} rows, contexts "
                    f"{min(contexts):,}..{max(contexts):,}, {min(lengths)}..{max(lengths)} "
                    f"output tokens each")


# ------------------------------------------------------------------------------ one mode

@dataclasses.dataclass
class ModeResult:
    mode: str
    records: List[StepRecord]
    outputs: Dict[int, List[int]]
    logit_digest: Dict[int, str]
    phase_totals: Dict[str, float]
    h2d_bytes: int
    h2d_fresh_rows: int
    h2d_rows: int
    hit_rate: Optional[float]
    drafts_offered: int
    drafts_accepted: int
    admit_seconds: float

    def summary(self) -> Dict[str, object]:
        latencies = []              # one entry per output token: its step's time / tokens
        for record in self.records:
            for tokens in record.emitted.values():
                latencies += [record.seconds / tokens] * tokens if tokens else []
        tokens = sum(len(o) for o in self.outputs.values())
        decode_s = sum(r.seconds for r in self.records)
        steps = max(len(self.records), 1)
        phase_ms = {p: 1e3 * self.phase_totals.get(p, 0.0) / steps for p in PHASES}
        phase_ms["rest"] = 1e3 * decode_s / steps - sum(phase_ms.values())
        ms = np.asarray(latencies) * 1e3 if latencies else np.zeros(1)
        return {
            "mode": self.mode,
            "tpot_ms": float(ms.mean()), "tpot_p50_ms": float(np.percentile(ms, 50)),
            "tpot_p99_ms": float(np.percentile(ms, 99)),
            "tokens_per_s": tokens / decode_s if decode_s else 0.0,
            "hit_rate": self.hit_rate,
            "h2d_bytes_per_token": self.h2d_bytes / tokens if tokens else 0.0,
            "h2d_fresh_share": self.h2d_fresh_rows / self.h2d_rows if self.h2d_rows else 0.0,
            "mtp_acceptance": (self.drafts_accepted / self.drafts_offered
                               if self.drafts_offered else None),
            "phase_ms": phase_ms,
            "steps": len(self.records), "output_tokens": tokens,
            "admit_s": self.admit_seconds,
        }


def run_mode(mode: str, model, config, workload: Workload, args, kv_format, device, trace,
             context_fill: ContextFill, recorder=None, show_progress: bool = True) -> ModeResult:
    from ..runtime.algo.dsa import DSA
    from ..runtime.algo.trace import TraceSelection
    timers = Timers()
    mtp = args.mtp
    split_attention = getattr(args, "split_attention", False) if mode == "avsg" else False
    max_len = max(positions_needed(r.context_len, r.max_new_tokens, mtp)
                  for r in workload.requests)
    spec = StoreSpec(layers=model.num_kv_layers, rows=workload.rows, max_len=max_len,
                     topk=config.index_topk, queries_per_step=1 + mtp, kv_format=kv_format,
                     device=device, capacity=args.capacity, policy=args.policy,
                     lifetime=args.lifetime, timers=timers,
                     split_attention=split_attention,
                     split_policy=auto_split_policy(config, device)
                     if split_attention == "auto" else None)
    store = STORES[mode](spec)
    algo = DSA(config, rows=workload.rows, max_len=max_len, device=device,
               layers=model.num_kv_layers, timers=timers)
    if trace is not None:
        algo = TraceSelection(algo, trace, model.num_kv_layers, config.index_topk, device)
    acceptance = parse_acceptance(args.acceptance, mtp) if mtp else None
    engine = Engine(model, algo, store, kv_format, workload.rows, mtp=mtp, acceptance=acceptance,
                    context_fill=context_fill, timers=timers, record_logits=True,
                    recorder=recorder)
    requests = workload.fresh()
    total_tokens = sum(r.max_new_tokens for r in requests)
    digests = {r.id: hashlib.sha256() for r in requests}
    bar = progress_bar(total=total_tokens, desc=f"{mode:>7}", unit="tok",
                       enabled=show_progress)

    def on_step(record: StepRecord) -> None:
        for request_id, logits in record.logits.items():
            digests[request_id].update(logits.float().cpu().numpy().tobytes())
        record.logits = None
        bar.update(sum(record.emitted.values()))

    started = time.perf_counter()
    records = engine.run(requests, on_step)
    bar.close()
    wall = time.perf_counter() - started
    decode = sum(r.seconds for r in records)
    return ModeResult(
        mode=mode, records=records, outputs={r.id: list(r.output) for r in requests},
        logit_digest={i: d.hexdigest() for i, d in digests.items()},
        phase_totals=dict(timers.totals), h2d_bytes=store.h2d_bytes(),
        h2d_fresh_rows=store.h2d_fresh_rows(), h2d_rows=store.h2d_rows(),
        hit_rate=store.hit_rate(), drafts_offered=sum(r.drafts_offered for r in requests),
        drafts_accepted=sum(r.drafts_accepted for r in requests), admit_seconds=wall - decode)


# ----------------------------------------------------------------------------- reporting

def format_table(results: List[Dict[str, object]]) -> str:
    def pct(x):
        return "-" if x is None else f"{100 * x:.1f}%"
    header = (f"{'mode':<8} {'TPOT ms':>8} {'p50':>7} {'p99':>7} {'tok/s':>7} {'hit rate':>8} "
              f"{'H2D B/tok':>10} {'MTP acc':>7} | ms/step: {'idx+sel':>7} {'plan':>6} "
              f"{'gather':>6} {'attn':>6} {'rest':>6}")
    lines = [header, "-" * len(header)]
    fused = []
    for r in results:
        p = r["phase_ms"]
        # a fused launch cannot be timed in two: its time is the plan column's ("-" for a
        # gather that never ran apart)
        if p["plan_gather"] > 0:
            fused.append(r["mode"])
        plan = p["plan_gather"] + p["plan"]
        gather = f"{'-':>6}" if p["plan_gather"] > 0 and p["gather"] == 0 else f"{p['gather']:6.1f}"
        lines.append(
            f"{r['mode']:<8} {r['tpot_ms']:8.1f} {r['tpot_p50_ms']:7.1f} {r['tpot_p99_ms']:7.1f} "
            f"{r['tokens_per_s']:7.1f} {pct(r['hit_rate']):>8} {r['h2d_bytes_per_token']:10,.0f} "
            f"{pct(r['mtp_acceptance']):>7} | {'':9}{p['index_select']:7.1f} {plan:6.1f} "
            f"{gather} {p['attention']:6.1f} {p['rest']:6.1f}")
    if fused:
        lines.append(f"  {', '.join(fused)}: plan and gather are one launch (plan_gather); its "
                     f"time is in the plan column")
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    args.split_attention = SPLIT_ATTENTION_CHOICES.get(args.split_attention, args.split_attention)
    with contextlib.ExitStack() as stack:       # torch's threads restored when the run ends
        return _main(args, stack)


def _main(args: argparse.Namespace, stack: contextlib.ExitStack) -> int:
    _positive("--batch", args.batch)
    if args.context is not None:
        _positive("--context", args.context)
        if args.select == "trace":
            raise UsageError("--context: with --select trace the contexts end at the trace's "
                             "query positions; use --select indexer to choose a context length")
    _positive("--new-tokens", args.new_tokens)
    _positive("--capacity", args.capacity)
    requests = _positive("--requests", args.requests) if args.requests is not None \
        else 2 * args.batch
    modes = comma_list("--modes", args.modes)
    for m in modes:
        if m not in STORES:
            raise UsageError(f"--modes: unknown mode {m!r}; expected a subset of "
                             f"{','.join(MODES)}")
    if args.split_attention and "avsg" not in modes:
        raise UsageError("--split-attention: splits the avsg buffer's hits from its misses; "
                         "add avsg to --modes")
    if args.lifetime is not None and args.policy != "lifetime":
        raise UsageError(f"--lifetime: only the lifetime policy has a lifetime; it does nothing "
                         f"with --policy {args.policy} (add --policy lifetime)")
    if args.lifetime is None:
        args.lifetime = reference.DEFAULT_LIFETIME
    json_path = output_path("--json", args.json)
    record_path = output_path("--record-trace", args.record_trace, ".npz")
    device = resolve_device(args.device)
    if args.checkpoint and not os.path.isdir(args.checkpoint):
        raise UsageError(f"--checkpoint: not a directory: {args.checkpoint}")
    if args.config is None and args.checkpoint:
        config = checkpoint_config(args.checkpoint)
        args.config = os.path.join(args.checkpoint, "config.json")
    else:
        args.config = args.config or "demo"
        config = load_config(args.config)
    if args.mtp and config.num_nextn_predict_layers < 1:
        raise UsageError(f"--mtp: the model ({args.config}) has no MTP layer "
                         f"(num_nextn_predict_layers = 0); use --mtp 0")
    topk = config.index_topk
    args.topk = topk
    if args.capacity < (1 + args.mtp) * topk and "avsg" in modes:
        raise UsageError(f"--capacity: expected >= (1 + mtp) x top-k = {(1 + args.mtp) * topk}, "
                         f"got {args.capacity}")
    if args.acceptance is not None and args.mtp == 0:
        # with no drafts nothing is accepted or verified: the option would do nothing
        raise UsageError(f"--acceptance: decides which MTP drafts are accepted; --mtp 0 makes "
                         f"none (drop --acceptance {args.acceptance} or give --mtp 1..3)")
    if args.acceptance is None:
        args.acceptance = DEFAULT_ACCEPTANCE if args.mtp else "greedy"
    try:
        parse_acceptance(args.acceptance, max(args.mtp, 1))
    except ValueError as e:
        if "accept_mean" not in str(e):
            raise UsageError(str(e)) from None
        raise UsageError(f"--acceptance: expected sim:MEAN with MEAN in 0..{max(args.mtp, 1)} "
                         f"(accepted drafts per step of --mtp {args.mtp}), got "
                         f"{args.acceptance}") from None
    if args.context is None:
        # 32K, or as much as the model holds with the longest request's outputs and drafts (the
        # tiny preset's 4,096 positions), so the indexer runs on any model without --context
        outputs = positions_needed(0, int(round(1.25 * args.new_tokens)), args.mtp)
        args.context = max(1, min(DEFAULT_CONTEXT, config.max_position_embeddings - outputs))
    if args.select == "indexer" and args.context > config.max_position_embeddings:
        raise UsageError(f"--context: {args.context} exceeds the model's "
                         f"max_position_embeddings = {config.max_position_embeddings}")
    if args.select == "indexer":
        longest = positions_needed(args.context, int(round(1.25 * args.new_tokens)), args.mtp)
        if longest > config.max_position_embeddings:
            raise UsageError(f"--new-tokens: --context {args.context:,} plus up to "
                             f"{int(round(1.25 * args.new_tokens)):,} outputs and drafts need "
                             f"{longest:,} positions, past the model's "
                             f"{config.max_position_embeddings:,}")
    _select_emulation(args.emulation)
    keep_freed_memory()

    trace, trace_line = None, "the model's own indexer"
    if args.select == "trace":
        trace, trace_line = load_selection_trace(args.trace)
        if trace.k != topk:
            raise UsageError(f"--trace: {trace_line} selects top-{trace.k}, the model's index_topk "
                             f"is {topk} (pass a top-{topk} trace or --select indexer)")
        if int(trace.positions[-1]) + 1 > config.max_position_embeddings:
            raise UsageError("--trace: its positions exceed the model's max_position_embeddings")
    elif args.trace:
        raise UsageError("--trace: only used with --select trace")
    positions = None
    if trace is not None:
        positions = range(int(trace.positions[0]), int(trace.positions[0]) + trace.steps)
    workload = build_workload(args.batch, requests, args.new_tokens, args.mtp, config.vocab_size,
                              args.seed, args.context, positions)
    _check_memory(config, workload, args)
    # chosen once, after the arguments were accepted: every mode computes with the same threads
    threads, threads_why = stack.enter_context(torch_threads())
    model = build_model(config, args.checkpoint, args.seed, device)
    kv_format = get_format(args.kv_format, config.kv_lora_rank, config.qk_rope_head_dim)
    accept_text = ("greedy verification" if args.acceptance == "greedy"
                   else parse_acceptance(args.acceptance, args.mtp).describe())
    show = not args.quiet and sys.stderr.isatty()
    print(f"avsg run: {args.config} model ({config.num_hidden_layers} layers + "
          f"{model.num_kv_layers - config.num_hidden_layers} MTP, top-{topk}), "
          f"{workload.description}")
    print(f"  MTP-{args.mtp} ({accept_text if args.mtp else 'no drafts'}), selections from "
          f"{trace_line}, KV {args.kv_format} ({kv_format.row_bytes} B/token/layer), "
          f"avsg buffer {args.capacity} slots, {args.policy} policy"
          + (f" (lifetime {args.lifetime})" if args.policy == "lifetime" else ""))
    print(f"  times: this machine's CPU ({os.cpu_count()} cores; torch on {threads} "
          f"thread{'s' if threads > 1 else ''}: {threads_why}; kernels via the {args.emulation} "
          f"CPU build), not an NPU")
    context_fill = ContextFill(model, kv_format, document_seed=args.seed)
    longest = max(r.context_len for r in workload.requests)
    started = time.perf_counter()
    context_fill.produce(longest)
    print(f"  context: {longest:,} positions x {model.num_kv_layers} layers produced at linear "
          f"cost in {time.perf_counter() - started:.1f} s (shared by all requests and modes)")
    recorder = None
    if args.record_trace:
        from ..runtime.algo.trace import TraceRecorder
        recorder = TraceRecorder(config.num_hidden_layers, topk)
    results = []
    for i, mode in enumerate(modes):
        results.append(run_mode(mode, model, config, workload, args, kv_format, device, trace,
                                context_fill, recorder if i == 0 else None, show))
    # the split's avsg logits differ from the others' in their last bits (docs/overlap.md):
    # then only the tokens are compared ("auto" splits only where the overlap is established:
    # never on CPU, where it is the one-pass path bit for bit)
    split = "avsg" in modes and (args.split_attention is True or (
        args.split_attention == "auto" and auto_split_policy(config, device).overlap_established))
    identical = all(r.outputs == results[0].outputs and
                    (split or r.logit_digest == results[0].logit_digest) for r in results)
    summaries = [r.summary() for r in results]
    print()
    print(format_table(summaries))
    print()
    by_mode = {s["mode"]: s for s in summaries}
    if "avsg" in by_mode and "offload" in by_mode and by_mode["offload"]["h2d_bytes_per_token"]:
        a, o = by_mode["avsg"], by_mode["offload"]
        print(f"  avsg moves {a['h2d_bytes_per_token'] / o['h2d_bytes_per_token']:.3f}x the H2D "
              f"bytes of offload per output token; {100 * a['h2d_fresh_share']:.1f}% of its "
              f"copies are KV produced in the last two passes")
    if len(results) > 1:
        what = "tokens; avsg's split-attention logits are within its stated tolerance, not " \
            "bit for bit" if split else "tokens and logits, bit for bit"
        print(f"  outputs identical across modes ({what}): {'yes' if identical else 'NO'}")
    else:   # one mode is compared with nothing
        print(f"  outputs not compared: one mode ran (--modes {results[0].mode})")
    projection = project_on_npu(results, workload, args, model.num_kv_layers)
    if projection:
        print("  est. DeepSeek-V3.2 on a 910B with these copies (a model, `avsg bench decode`; "
              "its resident-set peers there): TPOT " + ", ".join(
                  f"{m} {1e3 * p['tpot_s']:.1f} ms" if p["feasible"] else f"{m} infeasible (HBM)"
                  for m, p in projection.items()))
    if args.record_trace:
        from ..lab.traces import format as trace_format
        recorded = recorder.trace(max(r.context_len for r in workload.requests) + 4 * args.new_tokens,
                                  model=f"avsg runtime {args.config}", rule=f"selections of row 0, "
                                  f"query token 0, verify passes; source: {trace_line}")
        with writing("--record-trace", record_path):
            trace_format.save_trace(record_path, recorded)
        print(f"  trace written: {record_path} ({recorded.steps} steps)")
    if args.json:
        payload = {
            "config": {"model": args.config, **dataclasses.asdict(config)},
            "workload": {"rows": args.batch, "requests": requests, "mtp": args.mtp,
                         "acceptance": accept_text, "selection": trace_line,
                         "kv_format": args.kv_format, "capacity": args.capacity,
                         "policy": args.policy, "lifetime": args.lifetime, "device": args.device,
                         "split_attention": args.split_attention,
                         "emulation": args.emulation, "description": workload.description,
                         "contexts": [r.context_len for r in workload.requests]},
            "modes": summaries,
            "outputs_identical": identical,
            "npu_projection_estimate": projection,
        }
        with writing("--json", json_path), open(json_path, "w") as f:
            json.dump(payload, f, indent=2, default=str)
        print(f"  results written: {json_path}")
    return 0 if identical else 1


def _check_memory(config, workload: Workload, args) -> None:
    """The KV the modes hold (a host pool and the device's copy of it, every layer of every
    row), against this machine's memory, before the model is built."""
    max_len = max(positions_needed(r.context_len, r.max_new_tokens, args.mtp)
                  for r in workload.requests)
    layers = config.num_hidden_layers + config.num_nextn_predict_layers
    row_bytes = get_format(args.kv_format, config.kv_lora_rank, config.qk_rope_head_dim).row_bytes
    check_memory_total([
        ("--batch", 2 * layers * workload.rows * max_len * row_bytes,
         f"the KV of {workload.rows} rows x {max_len:,} positions x {layers} layers (host pool "
         f"and device copy)"),
        ("--capacity", layers * workload.rows * args.capacity * row_bytes,
         f"the avsg buffers ({args.capacity:,} slots)")])


def project_on_npu(results: List[ModeResult], workload: Workload, args,
                   kv_layers: int) -> Optional[Dict[str, Dict[str, float]]]:
    """The decode model of ``avsg bench decode`` (the same :func:`avsg.lab.costmodel.projection.project`) fed with this
    run's measured copies per iteration and layer (real DeepSeek-V3.2 dims, the bundled 910B
    profile, its default 32 cards) and plan's counted cost per row at this run's query-token
    count: an estimate, labelled so. The resident-set peers need the trace replay of
    ``avsg bench decode``; this run measures only offload and avsg."""
    from ..lab.costmodel import hardware, plan_cost, projection, traffic as copy_traffic
    from ..model_config import from_hf_config
    by_mode = {r.mode: r for r in results}
    if "offload" not in by_mode or "avsg" not in by_mode:
        return None
    iterations = sum(len(rec.emitted) for rec in by_mode["avsg"].records) * kv_layers
    tokens = sum(len(o) for o in by_mode["avsg"].outputs.values())
    if not iterations:
        return None
    config = from_hf_config(projection.V32_CONFIG)
    hw = hardware.load_profile()
    T = 1 + args.mtp
    # copies per selection carry over; scale them to DeepSeek-V3.2's top-k
    scale = config.index_topk / args.topk
    # (the op's largest buffer bounds it: a small model's buffer of many top-k's scales past it)
    from .. import reference
    from ..buffer import lookup_split
    capacity = min(max(args.capacity * config.index_topk // args.topk, T * config.index_topk),
                   reference.MAX_BUCKETS)
    per_iteration = tokens / (iterations / kv_layers)
    # this run's acceptance: the plan below follows it, rejected drafts invalidated as they were
    accept = min(max(per_iteration - 1.0, 0.0), float(T - 1))
    traffic = copy_traffic.Traffic(
        drafts=args.mtp, accept_mean=accept,
        tokens_per_iteration=per_iteration, capacity=capacity,
        topk_buffer=4096,
        rows={"offload": [scale * by_mode["offload"].h2d_rows / iterations],
              "avsg": [scale * by_mode["avsg"].h2d_rows / iterations]},
        source="this run")
    from ..lab.traces.lookup import find_trace, load_selections, synthetic_selections
    trace = find_trace(getattr(args, "trace", None))
    steps = plan_cost.counted_plan_steps(T, mtp=True)
    sel = None
    if trace:
        try:
            sel, positions, context_max = load_selections(trace, 2, steps)
        except ValueError:
            sel = None
    if sel is None or sel.shape[2] != config.index_topk:
        sel, positions, context_max = synthetic_selections(2, steps, config.index_topk, 32768)
    launches = plan_cost.counted_plan_on(sel, positions, int(context_max), args.policy, T,
                                        capacity, accept_mean=accept, phases=True)
    plan_us, after_us = plan_cost.counted_plan_us(launches, hw, "mean", synced=True)
    # and as the model prices avsg at this run's rows: its lookup split over the cores they leave
    split = lookup_split(int(hw["aiv_cores"]), workload.rows, T * config.index_topk, capacity)
    split_plan = {}
    if split > 1:
        split_plan[(T, split)] = plan_cost.counted_plan_us(
            plan_cost.counted_plan_on(sel, positions, int(context_max), args.policy, T, capacity,
                                      accept_mean=accept, phases=True, split=split),
            hw, "mean", synced=True, split=split)
    costs = plan_cost.Costs({"avsg": {T: plan_us}}, 0.0, "", {"avsg": {T: after_us}},
                            {"avsg": split_plan})
    context = int(np.mean([r.context_len for r in workload.requests]))
    projected = projection.project(config, hw, traffic, costs, workload.rows, context, cards=32,
                               modes=("device", "offload", "avsg"))
    return {m: {"tpot_s": p["tpot_s"], "tokens_per_s": p["tokens_per_s"],
                "feasible": p["feasible"], "plan_us_per_layer": p["plan_us_per_layer"]}
            for m, p in projected.items()}


def _select_emulation(build: str) -> None:
    from .. import backend
    if hasattr(backend, "set_emulation"):
        backend.set_emulation(build)
