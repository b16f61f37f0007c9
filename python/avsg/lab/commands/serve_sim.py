"""avsg serve-sim: serving long-context requests under a device-memory budget for KV buffers.

Simulates continuous-batching decode of Poisson-arriving requests whose selections replay rows of
real selection traces, once per scheduler variant (fixed buffers, Spin's fixed ratio, the elastic
utility split with online miss curves, and the same with exact curves), on the decode model of
``avsg bench decode`` (a 910B profile: a projection, not a measurement). Then, for the elastic
scheduler, the step time with two micro-batches: split in arrival order or balanced by context
(CMR), in static order or with OFMS overlap. Prints the tables, writes JSON and plots.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from typing import List

import numpy as np

from ...cli_util import (UsageError, check_memory, check_writable, comma_list, float_in, int_in,
                        progress_bar, read_input, reject_together, write_text, writing)
from ..traces.lookup import read_trace

DEFAULT_OUT = os.path.join("avsg-results", "serve-sim")
SYNTHETIC_TOPK, SYNTHETIC_CONTEXT = 2048, 32768
MAX_REQUESTS = 1_000_000      # the simulation keeps every request's record
# The simulation's time grows with the output tokens it decodes per scheduler (requests x mean
# output length): about 45 us a token and scheduler on this project's 2-core x86 (300 requests x
# 384 tokens x 4 schedulers: 20 s). Past LONG_RUN_TOKENS (about 3 minutes a scheduler there) a
# run is refused with its estimate unless --long says it is meant: --requests 1000000 would
# otherwise start a run of many hours without a word.
LONG_RUN_TOKENS = 4_000_000
SECONDS_PER_TOKEN = 45e-6
MAX_BUFFER_GB = 1024.0        # device memory of a card is tens of GB
MAX_BATCH = 4096
DEFAULT_LAYERS_PER_TRACE = 8   # locality rows per trace
DEFAULT_TRACE_STEPS = 1024     # decode steps of each row
MICROBATCH_VARIANTS = (("none", "static"), ("arrival", "static"), ("cmr", "static"),
                       ("cmr", "ofms"))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ..costmodel import hardware
    from ..costmodel.projection import V32_CONFIG
    from ..budget.sim import VARIANTS, SimConfig
    d = SimConfig()
    parser.add_argument("--trace", action="append", metavar="TRACE",
                        help="selection trace for the requests' locality: a path, or a shipped "
                             "trace's name (asyncio_32k, debian_reference_32k, asyncio_32k_8x256); "
                             "repeatable (default: the embedded asyncio_32k_8x256)")
    parser.add_argument("--synthetic", action="store_true",
                        help="use generated traces instead (no trace files needed; not with "
                             "--trace)")
    parser.add_argument("--layers-per-trace", type=int_in(1, 4096), default=None,
                        help="trace layers used as locality rows, spread over each trace, 1..4096 "
                             f"(default {DEFAULT_LAYERS_PER_TRACE}, or all of a trace with fewer)")
    parser.add_argument("--trace-steps", type=int_in(1, 1 << 20), default=None,
                        help="decode steps of each row used, 1..1048576 (default "
                             f"{DEFAULT_TRACE_STEPS}, or all of a shorter trace; caps output lengths)")
    parser.add_argument("--requests", type=int_in(1, MAX_REQUESTS), default=300,
                        help=f"requests simulated, 1..{MAX_REQUESTS:,} (default 300)")
    parser.add_argument("--long", action="store_true",
                        help=f"run a simulation past {LONG_RUN_TOKENS:,} output tokens per "
                             f"scheduler (--requests x --output-mean; tens of minutes to hours); "
                             f"without it such a run is refused with an estimate of its time")
    parser.add_argument("--rate", type=float_in(0, 1e6, low_open=True), default=4.0,
                        help="Poisson arrival rate, requests per second, in (0, 1e6] (default 4: "
                             "saturating)")
    parser.add_argument("--prompt-mean", type=int_in(1, 1 << 24), default=48 * 1024,
                        help="mean prompt length in tokens, with --output-mean within the model's "
                             "context (<= 16777216; default 48K; log-normal, 8K-128K)")
    parser.add_argument("--output-mean", type=int_in(1, 1 << 24), default=384,
                        help="mean output length in tokens, 1..16777216, with --prompt-mean within "
                             "the model's context (default 384; log-normal)")
    parser.add_argument("--buffer-gb", type=float_in(0, MAX_BUFFER_GB, low_open=True),
                        default=d.buffer_gb,
                        help=f"device memory for KV buffers and their state per card, in (0, "
                             f"{MAX_BUFFER_GB:g}] (default {d.buffer_gb:g} GB)")
    parser.add_argument("--max-batch", type=int_in(1, MAX_BATCH), default=d.max_batch,
                        help=f"most requests decoding at once, 1..{MAX_BATCH} (default "
                             f"{d.max_batch})")
    parser.add_argument("--fixed-capacity", type=int_in(1, 1 << 24), default=d.fixed_capacity,
                        help=f"slots per request for the fixed variant, top-k..16777216 (default "
                             f"{d.fixed_capacity})")
    parser.add_argument("--spin-ratio", type=float_in(1, 1e4), default=d.spin_ratio,
                        help=f"buffer / mandatory ratio for the spin variant, in [1, 1e4] (default "
                             f"{d.spin_ratio:g})")
    parser.add_argument("--granule", type=int_in(1, 1 << 24), default=d.granule,
                        help=f"capacity step of the elastic split, slots, 1..16777216 (default "
                             f"{d.granule})")
    parser.add_argument("--rebalance-every", type=int_in(1, 1 << 20), default=d.rebalance_every,
                        help=f"iterations between rebalances, besides admit/finish, 1..1048576 (default "
                             f"{d.rebalance_every})")
    parser.add_argument("--sample-rate", type=float_in(0, 1, low_open=True), default=d.sample_rate,
                        help=f"share of positions the online miss curves track, in (0, 1], "
                             f"rounded to 1/n (default {d.sample_rate:g})")
    parser.add_argument("--tpot-slo-ms", type=float_in(0, 1e6), default=0.0,
                        help="admit only while the projected time per output token stays within "
                             "this many ms, in [0, 1e6] (default 0: no SLO, admission by memory "
                             "only)")
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help=f"comma-separated subset of {', '.join(VARIANTS)} (default all)")
    parser.add_argument("--hw", default=hardware.DEFAULT_PROFILE,
                        help="hardware profile JSON (default: the bundled 910B assumptions)")
    parser.add_argument("--config", default=V32_CONFIG, help="DeepSeek-V3.2 config.json")
    parser.add_argument("--cards", type=int_in(1, 4096), default=d.cards,
                        help=f"cards serving the model, experts spread over them, 1..4096 (default "
                             f"{d.cards})")
    parser.add_argument("--seed", type=int_in(0, 2**63 - 1), default=0,
                        help="workload seed, >= 0 (default 0)")
    parser.add_argument("--out", default=DEFAULT_OUT,
                        help=f"directory for the JSON and plots (default {DEFAULT_OUT})")
    parser.add_argument("--tables", metavar="PATH",
                        help="also write the schedulers table (markdown) to PATH, for "
                             "docs/serve-sim.md (scripts/update_readme_tables.py)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def _check_args(args, variants: int) -> None:
    """What argparse's ranges cannot see: options that contradict each other, a trace given
    twice, a run far longer than intended."""
    reject_together(args, "--synthetic", "--trace", "--synthetic generates the requests' "
                    "locality, --trace reads it from files; give one")
    from ..traces.lookup import find_trace
    seen = {}
    for path in args.trace or ():
        key = os.path.realpath(find_trace(path))       # a shipped trace's name is its file
        if key in seen:     # its rows would count twice as if they were another trace's
            same = "" if seen[key] == path else f" (as {seen[key]})"
            raise UsageError(f"--trace: {path} given twice{same}; each trace is given once")
        seen[key] = path
    tokens = args.requests * args.output_mean
    if tokens > LONG_RUN_TOKENS and not args.long:
        hours = tokens * variants * SECONDS_PER_TOKEN / 3600
        took = f"{hours:,.1f} h" if hours >= 1 else f"{60 * hours:.0f} min"
        raise UsageError(f"--requests: {args.requests:,} requests x --output-mean "
                         f"{args.output_mean:,} = {tokens:,} output tokens per scheduler, past "
                         f"{LONG_RUN_TOKENS:,}: about {took} for {variants} scheduler"
                         f"{'s' if variants > 1 else ''} on a 2-core x86; add --long to run it")


def _counted_plan_us(trace, hw) -> float:
    """The default policy's matching cost per row and layer (one query token, capacity 8192: the
    serving manager's plan carrying the drop, ``plan_cost.counted_plan_on``), read from the kernels'
    counted work on the first trace's first layers."""
    from ... import reference
    from ..costmodel import plan_cost
    steps = min(64, trace.sel.shape[1])
    if steps < 4:
        raise UsageError(f"--trace-steps: expected >= 4 for plan's counted cost, got {steps}")
    sel = np.asarray(trace.sel[:2, :steps])
    counters = plan_cost.counted_plan_on(sel, np.asarray(trace.positions[:steps]), int(trace.T),
                                         reference.DEFAULT_POLICY, 1, 8192,
                                         warmup=min(48, steps - 3), accept_mean=0.0)
    return plan_cost.counted_us(counters, hw, "mean")


def _trace_paths(args) -> List[str]:
    from ..traces.lookup import find_trace
    return args.trace or [find_trace(None)]


def _load_traces(args) -> List[tuple]:
    """The traces, and the effective --layers-per-trace / --trace-steps: an explicit value a
    trace cannot give is an error; the defaults take what a shorter trace has."""
    from ..traces import synth
    explicit_layers, explicit_steps = args.layers_per_trace, args.trace_steps
    args.layers_per_trace = explicit_layers or DEFAULT_LAYERS_PER_TRACE
    args.trace_steps = explicit_steps or DEFAULT_TRACE_STEPS
    if args.synthetic:
        longest = SYNTHETIC_CONTEXT - SYNTHETIC_TOPK - 9       # every step selects top-k anew
        if args.trace_steps > longest:
            raise UsageError(f"--trace-steps: the synthetic traces hold {SYNTHETIC_CONTEXT:,} "
                             f"positions, so at most {longest:,} steps of top-{SYNTHETIC_TOPK}, "
                             f"got {args.trace_steps:,}")
        check_memory("--layers-per-trace", 2 * 2 * args.layers_per_trace * args.trace_steps
                     * SYNTHETIC_TOPK, f"two synthetic traces of {args.layers_per_trace} layers x "
                     f"{args.trace_steps:,} steps")
        return [(f"synthetic gamma {g}",
                 synth.generate(steps=args.trace_steps, layers=args.layers_per_trace,
                                k=SYNTHETIC_TOPK, max_len=SYNTHETIC_CONTEXT, gamma=g, seed=i))
                for i, g in enumerate((0.6, 0.8))]
    out = []
    for p in _trace_paths(args):
        tr = read_trace("--trace", p, check_values=True)   # bad values would skew the model
        if tr.k > 4096 or tr.T < 2 * tr.k:
            raise UsageError(f"--trace: {p}: top-k {tr.k} / context {tr.T} not usable")
        if explicit_layers and explicit_layers > tr.layers:
            raise UsageError(f"--layers-per-trace: {p} has {tr.layers} layers, asked for "
                             f"{explicit_layers}")
        if explicit_steps and explicit_steps > tr.steps:
            raise UsageError(f"--trace-steps: {p} has {tr.steps} steps, asked for {explicit_steps}")
        out.append((os.path.splitext(os.path.basename(p))[0], tr))
    return out


def main(args: argparse.Namespace) -> int:
    from .bench import common
    from ...model_config import from_hf_config
    from ..budget import sim, workload
    variants = comma_list("--variants", args.variants)
    bad = [v for v in variants if v not in sim.VARIANTS]
    if bad:
        raise UsageError(f"--variants: expected a subset of {', '.join(sim.VARIANTS)}, got "
                         f"{args.variants!r}")
    _check_args(args, len(variants))
    check_writable("--tables", args.tables)
    out_dir = common.out_dir(args, "serve-sim")
    hw = common.read_profile(args.hw)
    try:
        config = read_input("--config", args.config, from_hf_config)
    except ValueError as e:
        raise UsageError(str(e)) from None
    longest = args.prompt_mean + args.output_mean
    if longest > config.max_position_embeddings:
        option = "--prompt-mean" if args.prompt_mean >= args.output_mean else "--output-mean"
        raise UsageError(f"{option}: --prompt-mean {args.prompt_mean:,} + --output-mean "
                         f"{args.output_mean:,} tokens on average are past the model's context "
                         f"of {config.max_position_embeddings:,} positions")
    traces = _load_traces(args)
    k = config.index_topk
    for name, tr in traces:
        if tr.k != k:
            raise UsageError(f"--trace: {name} selects top-{tr.k}, the model top-{k}")
    cfg = sim.SimConfig(buffer_gb=args.buffer_gb, max_batch=args.max_batch, granule=args.granule,
                        fixed_capacity=args.fixed_capacity, spin_ratio=args.spin_ratio,
                        rebalance_every=args.rebalance_every, sample_rate=args.sample_rate,
                        cards=args.cards, tpot_slo_ms=args.tpot_slo_ms)
    if args.fixed_capacity < k:
        raise UsageError(f"--fixed-capacity: expected >= top-k {k}, got {args.fixed_capacity}")
    if args.spin_ratio * k < k:
        raise UsageError(f"--spin-ratio: expected >= 1, got {args.spin_ratio}")
    try:
        for key in ("fp8_compute", "weight_bytes_per_param", "activation_reserve_bytes", "hbm_bytes"):
            hw[key]
    except KeyError as e:
        raise UsageError(f"--hw: {str(e).strip(chr(39) + chr(34))}") from None
    plan_us = _counted_plan_us(traces[0][1], hw)
    cost = sim.CostModel(config, hw, cfg.cards, plan_us)
    index_budget = cost.index_budget_bytes(cfg.buffer_gb)
    if index_budget <= 0:
        raise UsageError(f"--buffer-gb: {args.buffer_gb:g} GB of buffers + "
                         f"{cost.weights_bytes / 1e9:.1f} GB of weights + "
                         f"{cost.reserve_bytes / 1e9:.1f} GB of activations exceed the card's "
                         f"{hw['hbm_bytes'] / 1e9:.0f} GB (try --cards or a smaller --buffer-gb)")
    slots = int(cfg.buffer_gb * 1e9 // cost.bytes_per_slot())
    if slots < k:
        raise UsageError(f"--buffer-gb: {args.buffer_gb} GB cannot hold one request's mandatory "
                         f"{k} slots x {config.num_hidden_layers} layers")
    for v, option, need in (("fixed", "--fixed-capacity", args.fixed_capacity),
                            ("spin", "--spin-ratio", int(args.spin_ratio * k))):
        if v in variants and need > slots:
            raise UsageError(f"{option}: one {v} buffer ({need} slots) exceeds the budget of "
                             f"--buffer-gb {args.buffer_gb:g} ({slots} slots per layer)")
    show = not args.quiet and sys.stderr.isatty()
    n_rows = sum(min(args.layers_per_trace, tr.layers) for _, tr in traces)
    bar = progress_bar(n_rows, "locality rows (stack distances)", "row", show)
    rows = workload.locality_rows(traces, args.layers_per_trace, args.trace_steps, bar)
    bar.close()
    requests = workload.make_requests(args.requests, args.rate, rows, args.seed, args.prompt_mean,
                                      args.output_mean)
    from ..traces.lookup import trace_label
    sources = (", ".join(n for n, _ in traces) if args.synthetic
               else ", ".join(trace_label(p) for p in _trace_paths(args)))
    print(f"avsg serve-sim: {args.requests} requests, Poisson {args.rate:g}/s, prompts mean "
          f"{args.prompt_mean:,} tokens, outputs mean {args.output_mean}; locality from {len(rows)} "
          f"trace rows ({sources})")
    print(f"  MODEL ESTIMATE on '{hw.name}' ({hw.status}); buffers modelled as exact LRU; "
          f"{cfg.buffer_gb:g} GB of buffers per card = {int(cfg.buffer_gb * 1e9 // cost.bytes_per_slot()):,} "
          f"slots per layer; max batch {cfg.max_batch}; top-{k} mandatory; plan "
          f"{plan_us:.0f} us per row and layer (the kernel's counted work, serial-pipe)")
    print(f"  device memory per card: weights {cost.weights_bytes / 1e9:.1f} GB ({args.cards} "
          f"cards) + activations {cost.reserve_bytes / 1e9:.1f} GB + buffers {cfg.buffer_gb:g} GB "
          f"+ indexer keys up to {index_budget / 1e9:.1f} GB ({cost.index_bytes_per_token / 1e3:.1f} "
          f"KB per token, {cost.fmt.name}) = {hw['hbm_bytes'] / 1e9:.0f} GB of HBM; a request is "
          f"admitted only while its indexer keys fit")
    curves = {}
    results = []
    bar = progress_bar(len(variants) * args.requests, "simulating", "req", show)
    for v in variants:
        if v.startswith("elastic") and ("exact" if v == "elastic-oracle" else "online") not in curves:
            key = "exact" if v == "elastic-oracle" else "online"
            curves[key] = (sim.exact_curves if key == "exact" else sim.online_curves)(rows, cfg, k)
        results.append(sim.simulate(v, requests, rows, cost, cfg, curves, bar,
                                    record_batches=True))
    # Micro-batching projected on the same iterations (batches and misses) as the elastic run (else
    # the most-admitting variant), so that only the split and the order differ.
    base = next((r for r in results if r["variant"] == "elastic"),
                max(results, key=lambda r: r["concurrency"]))
    one_batch = sim.microbatch_projection(base["batches"], cost, "none", "static")
    mb_results = []
    for mode, order in MICROBATCH_VARIANTS:
        total = sim.microbatch_projection(base["batches"], cost, mode, order)
        mb_results.append({"variant": base["variant"], "split": mode, "order": order,
                           "decode_s": total, "vs_one_batch": total / one_batch,
                           "tokens_per_s": base["tokens"] / total})
    for r in results:
        del r["batches"]
    bar.close()
    _print_variants(results)
    _print_microbatch(mb_results)
    print("\n  Left out: prefill, MTP, the residency policy's difference from LRU, launch/host overheads, a "
          "link shared between cards; nothing here ran on an NPU.")
    path = os.path.join(out_dir, "serve_sim.json")
    with writing("--out", path), open(path, "w") as f:
        json.dump({"estimate": True, "hardware": hw.sources(), "config": dataclasses.asdict(cfg),
                   "workload": {"requests": args.requests, "rate": args.rate,
                                "prompt_mean": args.prompt_mean, "output_mean": args.output_mean,
                                "rows": [r.name for r in rows], "seed": args.seed},
                   "variants": results,
                   "microbatch": mb_results}, f)
    if args.tables:
        name = "serve-sim" + (f"-slo{args.tpot_slo_ms:g}ms" if args.tpot_slo_ms else "")
        write_text("--tables", args.tables, f"`{' '.join(['avsg'] + sys.argv[1:])}`\n\n"
                   f"{_markdown(results, mb_results, name)}")
    with writing("--out", out_dir):
        plots = _plot(results, mb_results, out_dir)
    print(f"  results written: {path}" + (f"; plots: {', '.join(plots)}" if plots else
                                           "; plots skipped: matplotlib is not installed"))
    return 0


def _markdown(results, mb_results, name: str) -> str:
    names = {"fixed": "fixed", "spin": "spin (fixed ratio)", "elastic": "elastic",
             "elastic-oracle": "elastic-oracle"}
    lines = [f"<!-- results:{name} -->",
             "| scheduler | tok/s | TPOT p50 | TPOT p99 | admitted (mean) | buffer in use | hit rate | "
             "hits / step / GB |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        lines.append(f"| {names[r['variant']]} | {r['tokens_per_s']:,.0f} | {r['tpot_p50_ms']:.1f} ms | "
                     f"{r['tpot_p99_ms']:.1f} ms | {r['concurrency']:.1f} | "
                     f"{r['buffer_gb_used']:.2f} GB | {100 * r['hit_rate']:.1f}% | "
                     f"{r['hits_per_step_per_gb']:,.0f} |")
    lines += [f"<!-- /results:{name} -->", "", f"<!-- results:{name}-microbatch -->",
              f"| two micro-batches on the {mb_results[0]['variant']} run | decode time vs one batch |",
              "|---|---:|"]
    for r in mb_results:
        label = "one batch" if r["split"] == "none" else f"{r['split']} split, {r['order']} order"
        lines.append(f"| {label} | {r['vs_one_batch']:.3f} |")
    lines.append(f"<!-- /results:{name}-microbatch -->")
    return "\n".join(lines) + "\n"


def _print_variants(results) -> None:
    print(f"\n  {'variant':<15} {'tok/s':>8} {'TPOT p50 ms':>11} {'p99':>7} {'wait p50 s':>10} "
          f"{'concurrency':>11} {'buffer GB':>9} {'hit rate':>8} {'hits/step/GB':>12}")
    for r in results:
        print(f"  {r['variant']:<15} {r['tokens_per_s']:>8,.0f} {r['tpot_p50_ms']:>11.1f} "
              f"{r['tpot_p99_ms']:>7.1f} {r['wait_p50_s']:>10.1f} {r['concurrency']:>11.1f} "
              f"{r['buffer_gb_used']:>9.2f} {100 * r['hit_rate']:>7.1f}% "
              f"{r['hits_per_step_per_gb']:>12,.0f}")


def _print_microbatch(mb_results) -> None:
    print(f"\n  two micro-batches, projected on the {mb_results[0]['variant']} run's iterations "
          f"(same batches and misses):")
    print(f"  {'split':<9} {'order':<7} {'decode time':>11} {'vs one batch':>12}")
    for r in mb_results:
        print(f"  {r['split']:<9} {r['order']:<7} {r['decode_s']:>10.1f}s {r['vs_one_batch']:>12.3f}")


def _plot(results, mb_results, out: str) -> List[str]:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    names = [r["variant"] for r in results]
    fig, axes = plt.subplots(1, 4, figsize=(16, 3.8))
    for ax, key, label in zip(axes, ("tokens_per_s", "tpot_p50_ms", "concurrency",
                                     "hits_per_step_per_gb"),
                              ("throughput, tokens/s", "TPOT p50, ms", "admitted concurrency",
                               "hits per step per GB of buffer")):
        ax.bar(names, [r[key] for r in results], color="#4472c4")
        ax.set_title(label, fontsize=10)
        ax.tick_params(axis="x", labelrotation=20, labelsize=8)
    fig.suptitle("avsg serve-sim: schedulers at an equal buffer budget (model estimate)", fontsize=11)
    fig.tight_layout()
    p1 = os.path.join(out, "serve_sim_variants.png")
    fig.savefig(p1, dpi=110)
    plt.close(fig)
    fig, axes = plt.subplots(1, 2, figsize=(12, 3.8), sharex=True)
    for r in results:
        s = r["series"]
        axes[0].plot(s["t"], s["batch"], label=r["variant"], lw=1)
        axes[1].plot(s["t"], np.array(s["slots"]) / r["slot_budget"], label=r["variant"], lw=1)
    axes[0].set_ylabel("running requests")
    axes[1].set_ylabel("share of the buffer budget in use")
    for ax in axes:
        ax.set_xlabel("simulated time, s")
        ax.legend(fontsize=8)
    fig.tight_layout()
    p2 = os.path.join(out, "serve_sim_timeline.png")
    fig.savefig(p2, dpi=110)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(6, 3.8))
    labels = [f"{r['split']}\n{r['order']}" if r["split"] != "none" else "one batch"
              for r in mb_results]
    ax.bar(labels, [r["vs_one_batch"] for r in mb_results], color="#ed7d31")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_ylabel("decode time vs one batch")
    ax.set_title(f"two micro-batches on the {mb_results[0]['variant']} run (model estimate)",
                 fontsize=10)
    fig.tight_layout()
    p3 = os.path.join(out, "serve_sim_microbatch.png")
    fig.savefig(p3, dpi=110)
    plt.close(fig)
    return [p1, p2, p3]
