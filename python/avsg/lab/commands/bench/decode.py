"""``avsg bench decode``: the decode model (:mod:`avsg.lab.costmodel.projection`: modes, inputs,
memory, sensitivity) printed for a grid of batch sizes, contexts and MTP depths.

A projection, not a measurement: nothing here has run on an NPU.

**Records** (``--out DIR``/decode.json, ``records``): one per mode, batch, context, MTP, profile and
launch cost (``launch_us``: 0, 2, 5, 10 and the profile's graph-captured and eager costs), with
``launches_per_layer`` (kernel launches per layer and pass beside attention, in the main pass;
``draft_launches_per_layer`` in a draft pass: the split modes' counts are means over the layers,
as the rule chooses per layer), ``feasible``, ``tpot_ms`` and ``tokens_per_s`` (None when
infeasible), ``modelled_tpot_ms`` (always: device-resident KV's is the floor every ratio is read
against, also where it does not fit one card), ``h2d_bytes_per_token``,
``plan_us_per_layer`` (the mode's matching cost per layer: plan or the slot-map lookup for the
device modes, the D2H + host LRU + descriptor copies for ``lru-host``, the selection update for
the fused modes), ``copy_us_per_layer`` (its exposed copy time), the rows it copies and its
memory per card (GB). The fused path is two modes, ``fused-2048`` and ``fused-4096``;
``avsg-apart`` is avsg as the serving core runs it on an NPU until ``avsg doctor`` has verified
the cross-core wait there (plan, then gather: two launches, no SyncAll, the copy after the plan);
avsg with the hit/miss split is two, ``avsg-split`` (overlap where the cores allow it, o = 1) and
``avsg-split-o0`` (no overlap), whose records add ``split``: the cores (``attention_cores``
assumed), ``overlap``, the share of layers the rule split, the gain per layer and
``forced_tpot_ms`` (the split switched on in every layer). ``summary`` rows also hold
``by_launch_us`` (avsg against the best peer at each launch cost) and ``vs_fused_by_launch_us``
(avsg, avsg-apart and the split modes against the better fused variant, and against device's
modelled TPOT);
``at_memory`` every mode at its largest batch per card, with device-resident KV at avsg's batch.
``matching_us_per_row`` holds each mode's counted plan one core per row; ``split_plan_us``
avsg's and lru-device's at each lookup split (``T``, ``split``) the batches need
(``buffer.lookup_split``), which is what their records are priced at.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
from typing import Dict, List

from ....cli_util import UsageError, float_in, int_in, read_input, size_list, writing
from ...costmodel import hardware
from ...costmodel.plan_cost import (SPLIT_PRICED, counted_plan_steps, measure_costs,
                                     plan_counters, serving_splits)
from ...costmodel.projection import (APART_MODE, LAUNCH_SENSITIVITY_US, MAX_BATCH, MODES, PEERS,
                                     PROFILES, SENSITIVE, SPLIT_MODES, V32_CONFIG, best_peer,
                                     kv_format, launches_per_layer, max_batch, profile_variant,
                                     project)
from ...costmodel.traffic import Traffic, load_trace_cut, measure_traffic
from ...traces.lookup import read_trace

DEFAULT_TRACE_STEPS = 256   # trace steps replayed unless --trace-steps says otherwise
PLAN_ROWS = 2               # trace layers plan_cost.counted_plan replays (its rows default)

# ---------------------------------------------------------------- the command

def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--hw", default=hardware.DEFAULT_PROFILE,
                        help="hardware profile JSON (default: the bundled 910B assumptions)")
    parser.add_argument("--config", default=V32_CONFIG,
                        help="DeepSeek-V3.2 config.json (default: the released one's keys)")
    parser.add_argument("--trace", help="selection trace for the copies (default: the "
                        "embedded asyncio_32k_8x256)")
    parser.add_argument("--trace-layers", type=int_in(0, 4096), default=0,
                        help="trace layers replayed, 0..4096 (default 0: all of them)")
    parser.add_argument("--trace-steps", type=int_in(8, 1 << 20), default=None,
                        help=f"trace steps replayed, 8..1048576 (default {DEFAULT_TRACE_STEPS}, or "
                             f"all of a shorter trace)")
    parser.add_argument("--capacity", type=int_in(1, 32768), default=8192,
                        help="slots per request and layer of avsg, lru-device and slotmap-device, "
                             "(1 + 3) x top-k..32768 (default 8192)")
    parser.add_argument("--topk-buffer-size", type=int_in(1, 1 << 20), default=4096,
                        help="lru-host slots per query token and layer (vllm-ascend's "
                             "topk_buffer_size), top-k..1048576 (default 4096)")
    parser.add_argument("--batch", default="1,8,32,64",
                        help=f"batch sizes per card, 1..{MAX_BATCH} (default 1,8,32,64)")
    parser.add_argument("--context", default="32K,128K",
                        help="context lengths, from the model's top-k to its positions (163840 "
                             "for DeepSeek-V3.2); 32K = 32768 (default 32K,128K)")
    parser.add_argument("--mtp", default="0,1,2,3", help="MTP draft counts, 0..3 (default 0,1,2,3)")
    parser.add_argument("--accept-mean", type=float_in(0, 3), default=2.0,
                        help="mean accepted drafts per iteration at MTP-3, 0..3 (scaled for other "
                             "n; default 2.0)")
    parser.add_argument("--link-gbps", type=float_in(0, 1e4, low_open=True),
                        help="override the host link, GB/s, in (0, 1e4]")
    parser.add_argument("--cards", type=int_in(1, 4096), default=32,
                        help="cards serving the model, 1..4096: attention data-parallel, experts "
                             "spread over the cards (default 32)")
    parser.add_argument("--overlap", action="store_true",
                        help="let avsg's copies overlap attention too (the device peers' do)")
    parser.add_argument("--attention-cores", type=int_in(1, 4096), default=None,
                        help="AIV cores sparse attention holds, 1..4096 and at most the "
                             "profile's aiv_cores (default: the profile's attention_aiv_cores, an assumption): the "
                             "split's overlap needs these + --gather-cores <= aiv_cores")
    parser.add_argument("--gather-cores", type=int_in(1, 4096), default=None,
                        help="AIV cores the split's gather takes, 1..4096 and at most the "
                             "profile's aiv_cores (default: the cores attention leaves)")
    parser.add_argument("--out", metavar="DIR", default=None,
                        help="directory for decode.json and the TPOT plot (default "
                             "avsg-results/bench-decode/)")
    parser.add_argument("--json", metavar="PATH", help="JSON path (default OUT/decode.json)")
    parser.add_argument("--quiet", action="store_true",
                        help="no progress output (the command shows none; accepted as by every "
                             "bench)")
    parser.add_argument("--tables", metavar="PATH",
                        help="also write the summary tables as Markdown to PATH "
                             "(docs/results/decode.md, regenerated this way, is what README.md "
                             "and docs/benchmarks.md quote)")


def load_inputs(args):
    from ....model_config import from_hf_config
    from .common import read_profile
    hw = read_profile(args.hw)
    try:
        config = read_input("--config", args.config, from_hf_config)
        for key in ("fp8_compute", "hbm_bytes", "weight_bytes_per_param", "host_cpu_time_factor",
                    "host_lru_threads", "host_callback_latency_s", "copy_launch_latency_s",
                    "activation_reserve_bytes", "activation_hidden_copies", "launch_graph_s",
                    "launch_eager_s", *SENSITIVE):
            hw[key]
    except (ValueError, KeyError) as e:
        raise UsageError(str(e).strip("'\"")) from None
    return hw, config


def main(args: argparse.Namespace) -> int:
    from . import common
    out = common.out_dir(args, "decode")        # where the results go, before any work
    batches = size_list("--batch", args.batch, 1, MAX_BATCH)
    mtps = sorted(set(size_list("--mtp", args.mtp, 0, 3)))
    hw, config = load_inputs(args)
    split_cores = split_core_args(args, hw)
    if config.max_position_embeddings < config.index_topk:
        raise UsageError(f"--config: max_position_embeddings ({config.max_position_embeddings:,}) "
                         f"is below index_topk ({config.index_topk:,}): the model selects every "
                         f"position it has, so there is no offload to model")
    contexts = size_list("--context", args.context, config.index_topk,
                         config.max_position_embeddings)
    if args.link_gbps is not None:
        hw.override("link_bytes_per_s", args.link_gbps * 1e9, "--link-gbps")
    trace = common.trace_path(args.trace)
    if args.capacity < 4 * config.index_topk:
        raise UsageError(f"--capacity: expected >= (1 + 3) x top-k = {4 * config.index_topk}, "
                         f"got {args.capacity}")
    if args.topk_buffer_size < config.index_topk:
        raise UsageError(f"--topk-buffer-size: expected >= top-k = {config.index_topk}, got "
                         f"{args.topk_buffer_size}")
    cut = load_trace_cut(trace, args.trace_layers or None, args.trace_steps,
                         min_steps=counted_plan_steps(1 + max(mtps), mtp=True),
                         default_steps=DEFAULT_TRACE_STEPS)
    args.trace_steps = cut.steps      # the default takes what a shorter trace has
    # plan's counted cost (plan_cost.plan_counters) replays the trace file's first PLAN_ROWS
    # layers, whatever --trace-layers says: refuse a thinner trace before the first result
    layers = cut.layers if not args.trace_layers else read_trace("--trace", trace).layers
    if layers < PLAN_ROWS:
        raise UsageError(f"--trace: {trace} has {layers} layer{'s' if layers != 1 else ''}; the "
                         f"counted plan cost replays its first {PLAN_ROWS} (give a trace of "
                         f">= {PLAN_ROWS} layers)")
    if cut.k != config.index_topk:
        raise UsageError(f"--trace: it selects top-{cut.k}, the model's index_topk is "
                         f"{config.index_topk}")
    t0 = time.perf_counter()
    fmt = kv_format(hw)
    print(f"avsg bench decode: DeepSeek-V3.2 ({config.num_hidden_layers} layers, top-"
          f"{config.index_topk}), {fmt.name.upper()} KV ({fmt.row_bytes} B/token/layer), "
          f"hardware '{hw.name}', {args.cards} cards (experts spread over them), batch per card")
    print(f"  MODEL ESTIMATE, not a measurement: {hw.status}")
    traffic: Dict[int, Traffic] = {}
    for n in mtps:
        accept = args.accept_mean * n / 3 if n else 0.0
        try:
            traffic[n] = measure_traffic(trace, n, accept, args.capacity, args.topk_buffer_size,
                                         args.trace_steps, args.trace_layers or None)
        except ValueError as e:
            raise UsageError(f"--trace: {e}") from None
    print(f"  copies measured on {traffic[mtps[0]].source} (MTP-n: 1+n query tokens, simulated "
          f"acceptance); rows per request, layer and iteration, mean [min-max over layers]:")
    for n in mtps:
        tr = traffic[n]
        print(f"    MTP-{n} ({tr.tokens_per_iteration:.2f} tokens/iteration): " + ", ".join(
            f"{m} {tr.mean(m):,.0f} [{tr.spread(m)['min']:,.0f}-{tr.spread(m)['max']:,.0f}]"
            for m in ("offload", "lru-host", "lru-device", "slotmap-device", "fused-2048",
                      "avsg")) + f"; fused-4096 = lru-host (the same per-token LRU)")
    stale = {n: sum(g["share"] * g["stale_hits"] for g in traffic[n].fused["fused-2048"].values())
             for n in mtps}
    print("    fused-2048 hits on bytes rewritten after their copy (rejected drafts; the merged "
          "kernel drops nothing), per query-token row and iteration: " + ", ".join(
              f"MTP-{n} {v:.2f}" for n, v in stale.items()))
    limits = {(m, ctx, n): max_batch(config, hw, m, ctx, 1 + n, args.capacity,
                                     args.topk_buffer_size, args.cards)
              for m in MODES for ctx in contexts for n in mtps}
    # the op's plan (avsg's, lru-device's) at each batch it is projected at: its lookup split
    # over the cores the rows leave (buffer.lookup_split), counted once per (T, split)
    splits = {}
    for n in mtps:
        planned = {*batches, *(limits[(m, ctx, n)] for m in (*SPLIT_PRICED, *SPLIT_MODES)
                               for ctx in contexts)} - {0}
        splits.update(serving_splits(int(hw["aiv_cores"]), planned, [1 + n],
                                     config.index_topk, args.capacity))
    counters = plan_counters(trace, [1 + n for n in mtps], args.capacity, args.topk_buffer_size,
                             {1 + n: traffic[n].accept_mean for n in mtps}, splits)
    # traffic keyed by T - 1 = drafts for the slot map's miss count
    costs = {name: measure_costs(trace, [1 + n for n in mtps], args.capacity,
                                 args.topk_buffer_size, traffic, profile_variant(hw, name), counters)
             for name in PROFILES}
    b = costs["bundled"]
    print("  matching per row and layer, us (counted work, serial-pipe, bundled profile): " +
          "; ".join(f"T={1 + n}: " + ", ".join(
                        f"{m} {b.plan_us[m][1 + n]:.0f}" + (" (lookup split " + ", ".join(
                            f"{p} ways {b.plan(m, 1 + n, p)[0]:.0f}" for p in splits[1 + n])
                            + ")" if splits[1 + n] else "") for m in SPLIT_PRICED)
                    + f", slotmap {b.plan_us['slotmap-device'][1 + n]:.0f}" for n in mtps)
          + "; the op's lookup splits over the cores the rows leave (avsg's plan_gather runs "
          "with AVSG_NPU_SPLIT=1; lru-device is given the same), one core per row where they "
          "leave too few")
    print(f"  {b.host_source}")
    from ...costmodel import fused as fused_model
    fmt_rows = (fmt.row_bytes, fmt.latent_bytes)

    def fused_us(n, variant, ctx):
        slots = config.index_topk if variant == "fused-2048" else args.topk_buffer_size
        return fused_model.matching_us(traffic[n].fused[variant], hw, ctx, config.index_topk,
                                       slots, *fmt_rows)["us_per_row"]
    print("  fused path's selection update per query-token row, us (counted-work model of its "
          "kernel source, bundled profile; direct map up to 16,376 tokens, sort + merge above): "
          + "; ".join(f"T={1 + n}: " + ", ".join(
              f"{v} at {ctx // 1024}K {fused_us(n, v, ctx):.0f}"
              for v in ("fused-2048", "fused-4096") for ctx in contexts) for n in mtps))
    print_split_setup(config, hw, fmt, split_cores)
    graph_us = round(1e6 * hw["launch_graph_s"], 6)
    launch_costs = sorted({*LAUNCH_SENSITIVITY_US, graph_us, round(1e6 * hw["launch_eager_s"], 6)})
    print(f"  kernel launches per layer and pass beside attention: " + ", ".join(
        f"{m} {launches_per_layer(m)}" + (f" (+{launches_per_layer(m, True) - launches_per_layer(m)}"
                                          f" where split)" if m in SPLIT_MODES else "")
        for m in MODES) + f"; {1e6 * hw['launch_graph_s']:g} us "
        f"per launch graph-captured (the tables' default), {1e6 * hw['launch_eager_s']:g} us "
        f"eager (profile)")
    records, rows = [], []
    for n in mtps:
        for context in contexts:
            for batch in batches:
                point, by_launch = {}, {}
                for name in PROFILES:
                    hwp = profile_variant(hw, name)
                    for launch_us in launch_costs:
                        p = project(config, hwp, traffic[n], costs[name], batch, context,
                                    args.cards, args.overlap, launch_s=launch_us * 1e-6,
                                    **split_cores)
                        if launch_us == graph_us:
                            point[name] = p
                        if name == "bundled":
                            by_launch[launch_us] = p
                        for mode, r in p.items():
                            records.append({
                                        "mode": mode, "batch": batch, "context": context,
                                        "mtp": n, "profile": name, "launch_us": launch_us,
                                        "launches_per_layer": r["launches_per_layer"],
                                        "draft_launches_per_layer": r.get(
                                            "draft_launches_per_layer", r["launches_per_layer"]),
                                        "feasible": r["feasible"],
                                        "tpot_ms": 1e3 * r["tpot_s"] if r["tpot_s"] else None,
                                        "modelled_tpot_ms": 1e3 * r["modelled_tpot_s"],
                                        **({"split": _split_record(r["split"])}
                                           if "split" in r else {}),
                                        "tokens_per_s": r["tokens_per_s"],
                                        "h2d_bytes_per_token": r["h2d_bytes_per_token"],
                                        "plan_us_per_layer": r["plan_us_per_layer"],
                                        "copy_us_per_layer": 1e6 * r["copy_s"] / config.num_hidden_layers,
                                        "rows_per_layer": r["rows_per_layer"],
                                        "memory_gb": {k: v / 1e9 for k, v in r["memory"].items()
                                                      if k != "feasible"}})
                rows.append(summarize(point, n, batch, context, by_launch))
    at_memory = []
    for n in mtps:
        for context in contexts:
            entry = {"mtp": n, "context": context}
            for name in PROFILES:
                hwp = profile_variant(hw, name)
                per_mode = {}
                for m in MODES:
                    b = limits[(m, context, n)]
                    if b < 1:
                        per_mode[m] = {"batch": 0, "tokens_per_s": None}
                        continue
                    r = project(config, hwp, traffic[n], costs[name], b, context, args.cards,
                                args.overlap, modes=(m,), **split_cores)[m]
                    per_mode[m] = {"batch": b, "tokens_per_s": r["tokens_per_s"],
                                   "tpot_ms": 1e3 * r["tpot_s"]}
                peers = [m for m in PEERS if per_mode[m]["tokens_per_s"]]
                best = max(peers, key=lambda m: per_mode[m]["tokens_per_s"]) if peers else None
                ratio = {m: per_mode[m]["tokens_per_s"] / per_mode[best]["tokens_per_s"]
                         if best and per_mode[m]["tokens_per_s"] else None
                         for m in ("avsg", *SPLIT_MODES)}
                # device-resident KV at avsg's batch, modelled whether or not it fits: the floor
                floor = None
                if per_mode["avsg"]["batch"]:
                    d = project(config, hwp, traffic[n], costs[name], per_mode["avsg"]["batch"],
                                context, args.cards, args.overlap, modes=("device",))["device"]
                    floor = {"batch": per_mode["avsg"]["batch"], "feasible": d["feasible"],
                             "modelled_tpot_ms": 1e3 * d["modelled_tpot_s"],
                             "modelled_tokens_per_s": per_mode["avsg"]["batch"]
                             * traffic[n].tokens_per_iteration / d["step_s"]}
                entry[name] = {"modes": per_mode, "best_peer": best,
                               "throughput_ratio": ratio["avsg"],
                               "split_throughput_ratio": ratio["avsg-split"],
                               "device_at_avsg_batch": floor}
            at_memory.append(entry)
    _print_summary(rows, limits, mtps, contexts, hw, config, args.cards)
    _print_at_memory(at_memory)
    _print_vs_fused(rows, graph_us)
    json_path = args.json or os.path.join(out, "decode.json")
    os.makedirs(os.path.dirname(json_path) or ".", exist_ok=True)
    with writing("--json" if args.json else "--out", json_path), open(json_path, "w") as f:
        json.dump({"hardware": hw.sources(), "hardware_name": hw.name, "estimate": True,
                   "kv_format": dataclasses.asdict(fmt), "cards": args.cards,
                   "overlap_avsg": args.overlap, "sensitive_constants": list(SENSITIVE),
                   "launch_us": {"graph": 1e6 * hw["launch_graph_s"],
                                 "eager": 1e6 * hw["launch_eager_s"],
                                 "sensitivity": list(LAUNCH_SENSITIVITY_US),
                                 "records": launch_costs},
                   "launches_per_layer": {m: launches_per_layer(m) for m in MODES},
                   "split": {"launches_where_split": {m: launches_per_layer(m, True)
                                                      for m in SPLIT_MODES},
                             **split_cores},
                   "traffic": {n: dataclasses.asdict(t) for n, t in traffic.items()},
                   "matching_us_per_row": {name: c.plan_us for name, c in costs.items()},
                   "split_plan_us": {name: {mode: [
                       {"T": T, "split": p, "plan_us": v[0], "after_publish_us": v[1]}
                       for (T, p), v in sorted(by_split.items())]
                       for mode, by_split in c.split_plan_us.items()}
                       for name, c in costs.items()},
                   "host_lru": counters["host"], "max_batch": [
                       {"mode": m, "context": ctx, "mtp": n, "max_batch": v}
                       for (m, ctx, n), v in limits.items()],
                   "summary": rows, "at_memory": at_memory, "records": records}, f, indent=1,
                  default=str)
    plot_path = common.save_plot(os.path.join(out, "decode_tpot.png"),
                                 lambda p: _plot(records, p))
    print(f"  JSON: {json_path}\n  plot: {plot_path}\n  ({time.perf_counter() - t0:.0f} s)")
    if args.tables:
        common.write_tables(args.tables, common.invocation(args),
                            _tables(rows, limits, mtps, contexts, hw, args.cards, at_memory),
                            note="A model of a 910B with assumed constants, not a measurement.")
        print(f"  tables: {args.tables}")
    return 0


def split_core_args(args, hw) -> Dict[str, int]:
    """--attention-cores / --gather-cores as project() takes them, checked against the
    profile's AIV cores (one-line errors)."""
    P = int(hw["aiv_cores"])
    for name in ("attention_cores", "gather_cores"):
        value = getattr(args, name)
        if value is not None and value > P:
            raise UsageError(f"--{name.replace('_', '-')}: expected 1..{P} (the profile's "
                             f"aiv_cores), got {value}")
    return {"attention_cores": args.attention_cores, "gather_cores": args.gather_cores}


def print_split_setup(config, hw, fmt, split_cores: Dict) -> None:
    """How the split modes are priced: the cores, the overlap, the fixed costs, the launches."""
    from ...costmodel.projection import split_profile
    from ....cache import manager, split_rule
    one = split_profile(config, hw, fmt, 1.0, 1, True, **split_cores)
    o = int(one.cores_allow_overlap())
    print(f"  hit/miss split (avsg-split; docs/overlap.md sections 4-5): attention holds "
          f"{one.attention_cores} of {one.aiv_cores} AIV cores (ASSUMED: "
          f"{'--attention-cores' if split_cores['attention_cores'] else 'profile attention_aiv_cores'}), "
          f"the gather {one.gather_cores}: o = {o} ({'the cores allow the overlap' if o else 'no overlap: the cores do not allow it'}); "
          f"avsg-split-o0: o = 0, the gather on all {one.aiv_cores}. Per layer and pass where "
          f"chosen: +{manager.split_added_launches()} launches "
          f"(the gather apart from plan_gather, {', '.join(split_rule.SPLIT_LAUNCHES)}), t_a0 {1e6 * hw['attention_fixed_s']:g} us, "
          f"the merge; the rule (split_rule.choose_split) chooses it per layer and pass")


def _split_record(split: Dict) -> Dict:
    """The split's fields of a record: the cores (the attention's an assumption), the overlap,
    where the rule split, and the price of the split switched on everywhere."""
    out = {k: v for k, v in split.items() if k not in ("forced_step_s", "forced_tpot_s")}
    out["forced_tpot_ms"] = 1e3 * split["forced_tpot_s"]
    return out


def summarize(point: Dict[str, Dict[str, Dict]], mtp: int, batch: int, context: int,
              by_launch: Dict[float, Dict[str, Dict]] = None) -> Dict:
    """avsg against the best feasible peer under each profile (at the profile's graph-captured
    launch cost), and under the bundled profile at each launch cost of ``by_launch`` (the best
    peer chosen again at each)."""
    out = {"mtp": mtp, "batch": batch, "context": context, "by_launch_us": {}}
    for launch_us, p in (by_launch or {}).items():
        peer = best_peer(p)
        a = p["avsg"]
        out["by_launch_us"][launch_us] = {
            "best_peer": peer, "tpot_ratio": a["tpot_s"] / p[peer]["tpot_s"]
            if peer and a["feasible"] else None}
        fused = [m for m in FUSED if p[m]["feasible"] and p[m].get("tpot_s")]
        better = min(fused, key=lambda m: p[m]["tpot_s"]) if fused else None
        dev = p["device"]["modelled_tpot_s"]       # the floor, modelled where it does not fit
        vs = {**{f"{m}_tpot_ms": 1e3 * p[m]["tpot_s"] if p[m].get("tpot_s") else None
                 for m in FUSED},
              "better_fused": better, "device_tpot_ms": 1e3 * dev,
              "device_feasible": p["device"]["feasible"]}
        for mode in ("avsg", APART_MODE, *SPLIT_MODES):
            if mode not in p:
                continue
            r = p[mode]
            key = "" if mode == "avsg" else f"{mode}_"
            vs.update({f"{mode}_tpot_ms": 1e3 * r["tpot_s"] if r["tpot_s"] else None,
                       f"{key}tpot_ratio": r["tpot_s"] / p[better]["tpot_s"]
                       if better and r["feasible"] else None,
                       f"{key}vs_device": r["tpot_s"] / dev if r["feasible"] else None})
            if "split" in r:
                forced = r["split"]["forced_tpot_s"]
                vs.update({f"{key}forced_tpot_ratio": forced / p[better]["tpot_s"]
                           if better and r["feasible"] else None,
                           f"{key}overlap": r["split"]["overlap"],
                           f"{key}layers_split": r["split"]["layers_split"]})
        out.setdefault("vs_fused_by_launch_us", {})[launch_us] = vs
    for name, p in point.items():
        a = p["avsg"]
        peer = best_peer(p)
        d = {"avsg_feasible": a["feasible"], "avsg_tpot_ms": 1e3 * a["tpot_s"] if a["tpot_s"] else None,
             "best_peer": peer, "device_feasible": p["device"]["feasible"],
             # modelled even where device-resident KV does not fit one card: the floor
             "device_tpot_ms": 1e3 * p["device"]["modelled_tpot_s"],
             "avsg_gb": a["memory"]["total"] / 1e9}
        if peer:
            d["peer_tpot_ms"] = 1e3 * p[peer]["tpot_s"]
        if peer and a["feasible"]:
            d["tpot_ratio"] = a["tpot_s"] / p[peer]["tpot_s"]
            d["throughput_ratio"] = a["tokens_per_s"] / p[peer]["tokens_per_s"]
        out[name] = d
    return out


def _verdict(row: Dict) -> str:
    ratios = [row[p].get("tpot_ratio") for p in PROFILES]
    if any(r is None for r in ratios):
        return "-"
    if all(r < 0.97 for r in ratios):
        return "avsg faster (all three)"
    if all(r > 1.03 for r in ratios):
        return "avsg slower (all three)"
    if all(0.97 <= r <= 1.03 for r in ratios):
        return "within 3% (all three)"
    return "depends on the profile"


def _by_launch(row: Dict) -> str:
    """avsg/best-peer TPOT at each sensitivity launch cost (bundled profile)."""
    got = row.get("by_launch_us", {})
    return " / ".join(f"{got[u]['tpot_ratio']:.2f}" if got.get(u, {}).get("tpot_ratio") else "-"
                      for u in LAUNCH_SENSITIVITY_US)


def _cell(row: Dict) -> List[str]:
    b = row["bundled"]
    if not b["avsg_feasible"]:
        return ["infeasible", f"{b['avsg_gb']:.0f} GB > HBM", "-", "-", "-", "-", "-", "-"]
    if not b["best_peer"]:
        return [f"{b['avsg_tpot_ms']:.1f} ms", "no peer fits", "-", "-", "-", "-", "-", "-"]
    return [f"{b['avsg_tpot_ms']:.1f} ms", f"{b['best_peer']} {b['peer_tpot_ms']:.1f} ms",
            f"{b['tpot_ratio']:.2f}", _by_launch(row),
            f"{row['pessimistic'].get('tpot_ratio', float('nan')):.2f}",
            f"{row['optimistic'].get('tpot_ratio', float('nan')):.2f}",
            f"{b['throughput_ratio']:.2f}x", _verdict(row)]


def _device_cell(dev: Dict) -> str:
    """Device-resident KV's modelled TPOT, marked where it does not fit one card."""
    return f"{dev['device_tpot_ms']:.1f} ms" + ("" if dev["device_feasible"] else
                                                " (infeasible)")


HEADER = ["MTP", "batch", "context", "avsg TPOT", "best peer TPOT", "avsg/peer TPOT",
          "at " + " / ".join(f"{u:g}" for u in LAUNCH_SENSITIVITY_US) + " us per launch",
          "pessimistic", "optimistic", "throughput", "conclusion", "device TPOT"]


def _print_summary(rows, limits, mtps, contexts, hw, config, cards) -> None:
    print(f"\n  avsg vs the best feasible peer (lowest TPOT of {', '.join(PEERS)}); ratios at "
          f"{1e6 * hw['launch_graph_s']:g} us per launch under the bundled / pessimistic / "
          f"optimistic profiles, and under the bundled one at "
          + " / ".join(f"{u:g}" for u in LAUNCH_SENSITIVITY_US) + " us per launch (best peer "
          "chosen again at each)")
    print("  " + " | ".join(f"{h:>14}" if i > 2 else f"{h:>7}" for i, h in enumerate(HEADER)))
    for r in rows:
        dev = r["bundled"]
        cells = [str(r["mtp"]), str(r["batch"]), f"{r['context'] // 1024}K", *_cell(r),
                 _device_cell(dev)]
        print("  " + " | ".join(f"{c:>14}" if i > 2 else f"{c:>7}" for i, c in enumerate(cells)))
    print("\n  most requests per card that fit in HBM (weights + KV buffers + indexer keys + "
          "activations):")
    for ctx in contexts:
        for n in mtps:
            print(f"    {ctx // 1024}K, MTP-{n}: " + ", ".join(f"{m} {limits[(m, ctx, n)]}"
                                                          for m in MODES))
    print("\n  Left out of the model: the torch glue ops around each mode's kernels (index copies, "
          "masks: every integration has some), MoE all-to-all across cards, dequantisation, "
          "queueing on a link shared between cards, and any NPU measurement: calibrate the "
          "profile on a card.")


def _at_memory_row(e: Dict) -> List[str]:
    b = e["bundled"]
    a = b["modes"]["avsg"]
    sp = b["modes"]["avsg-split"]
    peer = b["best_peer"]
    ratios = [e[p]["throughput_ratio"] for p in PROFILES]
    if any(r is None for r in ratios):
        verdict = "-"
    elif all(r > 1.03 for r in ratios):
        verdict = "avsg higher (all three)"
    elif all(r < 0.97 for r in ratios):
        verdict = "avsg lower (all three)"
    else:
        verdict = "depends on the profile"
    fmt = lambda r: f"{r:.2f}x" if r is not None else "-"  # noqa: E731
    at = lambda m: f"{m['batch']}: {m['tokens_per_s']:,.0f} tok/s" if m["tokens_per_s"] \
        else "none fits"  # noqa: E731
    floor = b["device_at_avsg_batch"]
    return [str(e["mtp"]), f"{e['context'] // 1024}K", at(a), at(sp),
            f"{peer} {at(b['modes'][peer])}" if peer else "none fits",
            *[fmt(r) for r in ratios], fmt(b["split_throughput_ratio"]), verdict,
            f"{floor['modelled_tokens_per_s']:,.0f} tok/s"
            + ("" if floor["feasible"] else " (infeasible)") if floor else "-"]


AT_MEMORY_HEADER = ["MTP", "context", "avsg at its largest batch",
                    "avsg-split (o=1) at its largest batch", "best peer at its largest batch",
                    "throughput avsg/peer", "pessimistic", "optimistic", "avsg-split/peer",
                    "conclusion (avsg)", "device at avsg's batch"]


def _at_memory_modes_row(e: Dict) -> List[str]:
    """Every mode at its largest batch per card (bundled profile): batch, tokens per second."""
    modes = e["bundled"]["modes"]
    return [str(e["mtp"]), f"{e['context'] // 1024}K", *[
        f"{modes[m]['batch']}: {modes[m]['tokens_per_s']:,.0f}" if modes[m]["tokens_per_s"]
        else "none fits" for m in MODES]]


def _print_at_memory(at_memory: List[Dict]) -> None:
    print("\n  throughput per card with each mode at the largest batch its memory allows "
          "(bundled profile; device-resident KV also at avsg's batch, modelled where it does not "
          "fit: the floor):")
    print("    " + " | ".join(AT_MEMORY_HEADER))
    for e in at_memory:
        print("    " + " | ".join(_at_memory_row(e)))
    print("    every mode, batch: tokens/s: " + ", ".join(MODES))
    for e in at_memory:
        print("    " + " | ".join(_at_memory_modes_row(e)))


FUSED = ("fused-2048", "fused-4096")
VS_FUSED_HEADER = ["MTP", "batch", "context", "avsg TPOT", "fused-2048 TPOT", "fused-4096 TPOT",
                   "avsg / better fused",
                   "at " + " / ".join(f"{u:g}" for u in LAUNCH_SENSITIVITY_US) + " us per launch",
                   "avsg-apart / better fused (plan, then gather)",
                   "avsg-split TPOT (o=1)", "avsg-split / better fused: o=1 / o=0 (split forced)",
                   "layers split (o=1)", "device TPOT", "avsg / device", "avsg-split / device"]


def _vs_fused_row(r: Dict, launch_us: float) -> List[str]:
    """avsg, and avsg with the split, against vllm-ascend's better fused variant (bundled
    profile) at ``launch_us``, with avsg's ratio at each sensitivity launch cost; the split at
    o = 1 (where the cores allow it; the rule chooses per layer) and o = 0 (the rule never
    splits there, so this gives the split switched on anyway); against device-resident KV's
    modelled TPOT, marked where it does not fit one card."""
    v = r["vs_fused_by_launch_us"][launch_us]
    ms = lambda x: f"{x:.1f} ms" if x else "infeasible"  # noqa: E731
    ratio = lambda x: f"{x:.3f}" if x else "-"  # noqa: E731
    split_ratio = ratio(v.get("avsg-split_tpot_ratio")) + " / " + ratio(
        v.get("avsg-split-o0_forced_tpot_ratio"))
    layers = v.get("avsg-split_layers_split")
    return [str(r["mtp"]), str(r["batch"]), f"{r['context'] // 1024}K", ms(v["avsg_tpot_ms"]),
            ms(v["fused-2048_tpot_ms"]), ms(v["fused-4096_tpot_ms"]), ratio(v["tpot_ratio"]),
            " / ".join(ratio(r["vs_fused_by_launch_us"][u]["tpot_ratio"])
                       for u in LAUNCH_SENSITIVITY_US),
            ratio(v.get(f"{APART_MODE}_tpot_ratio")),
            ms(v.get("avsg-split_tpot_ms")), split_ratio,
            f"{100 * layers:.0f}%" if layers is not None else "-",
            _device_cell({"device_tpot_ms": v["device_tpot_ms"],
                          "device_feasible": v["device_feasible"]}),
            ratio(v["vs_device"]), ratio(v.get("avsg-split_vs_device"))]


def _vs_fused_rows(rows, launch_us: float) -> List[List[str]]:
    return [_vs_fused_row(r, launch_us) for r in rows
            if r["mtp"] in (0, 3) and r["batch"] in (1, 8) and r["bundled"]["avsg_feasible"]]


def _print_vs_fused(rows, launch_us: float) -> None:
    print(f"\n  avsg against vllm-ascend's better fused variant, bundled profile, {launch_us:g} us "
          f"per launch (and at " + " / ".join(f"{u:g}" for u in LAUNCH_SENSITIVITY_US) + " us):")
    print("    " + " | ".join(VS_FUSED_HEADER))
    for cells in _vs_fused_rows(rows, launch_us):
        print("    " + " | ".join(cells))


def _tables(rows, limits, mtps, contexts, hw, cards, at_memory=()) -> List[str]:
    from . import common
    body = []
    for r in rows:
        dev = r["bundled"]
        body.append([str(r["mtp"]), str(r["batch"]), f"{r['context'] // 1024}K", *_cell(r),
                     _device_cell(dev)])
    head = [row for r, row in zip(rows, body) if r["mtp"] in (0, 3) and r["batch"] in (1, 8)]
    blocks = [common.markdown_table("decode", HEADER, body, "rrrrlrrrrrlr")]
    if head:
        blocks.insert(0, common.markdown_table("decode-headline", HEADER, head, "rrrrlrrrrrlr"))
    cap = [[f"{ctx // 1024}K", str(n), *[str(limits[(m, ctx, n)]) for m in MODES]]
           for ctx in contexts for n in mtps]
    blocks.append(common.markdown_table("decode-max-batch", ["context", "MTP", *MODES], cap))
    vs_fused = _vs_fused_rows(rows, round(1e6 * hw["launch_graph_s"], 6))
    if vs_fused:
        blocks.insert(1, common.markdown_table("decode-vs-fused", VS_FUSED_HEADER, vs_fused,
                                               "r" * len(VS_FUSED_HEADER)))
    if at_memory:
        blocks.append(common.markdown_table("decode-at-memory", AT_MEMORY_HEADER,
                                            [_at_memory_row(e) for e in at_memory],
                                            "rrlllrrrrll"))
        blocks.append(common.markdown_table(
            "decode-at-memory-modes", ["MTP", "context", *[f"{m} (batch: tok/s)" for m in MODES]],
            [_at_memory_modes_row(e) for e in at_memory], "rr" + "r" * len(MODES)))
    return blocks


def _plot(records: List[Dict], path: str) -> None:
    from . import common
    plt = common.pyplot()
    recs = [r for r in records if r["profile"] == "bundled" and r["feasible"]]
    mtps = sorted({r["mtp"] for r in records})
    contexts = sorted({r["context"] for r in records})
    fig, axes = plt.subplots(len(contexts), len(mtps), figsize=(4.5 * len(mtps), 3.6 * len(contexts)),
                             squeeze=False)
    for ci, ctx in enumerate(contexts):
        for mi, n in enumerate(mtps):
            ax = axes[ci][mi]
            for mode in MODES:
                pts = sorted((r["batch"], r["tpot_ms"]) for r in recs
                             if r["mtp"] == n and r["context"] == ctx and r["mode"] == mode)
                if pts:
                    ax.plot([a for a, _ in pts], [b for _, b in pts], marker="o", label=mode)
            ax.set_xscale("log", base=2)
            ax.set_title(f"{ctx // 1024}K, MTP-{n}", fontsize=9)
            ax.set_xlabel("batch per card")
            ax.set_ylabel("TPOT ms (model)")
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle("avsg bench decode: DeepSeek-V3.2 on an assumed 910B profile (feasible rows only), "
                 "an estimate", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
