"""``avsg bench decode``: a modelled DeepSeek-V3.2 decode step on an Ascend 910B, per mode.

A projection, not a measurement: nothing here has run on an NPU. It combines

* **hit rates measured** on a selection trace: per decode iteration (1 + n query tokens of MTP-n
  with simulated acceptance), the rows ``offload`` copies (the union of the iteration's selections)
  and the rows ``avsg`` copies (its buffer's misses), from the trace lab's MTP replay with the real
  ``plan`` op;
* the **host link** (``hardware.link_time_s``: bandwidth and per-DMA latency, whichever binds);
* **HBM traffic** of the rest of the step: FP8 weights (attention, dense layers, the routed experts
  the batch's tokens touch, shared experts, the LM head), the indexer scanning every cached index
  key, and sparse MLA reading K selected rows per query token and layer;
* **plan**'s modelled time (the emulation's counted work; one row per AIV core);
* optional overlap of a layer's gather with compute (``--overlap``).

Per mode and per (batch, context, MTP): TPOT, throughput, H2D bytes per token, and device memory
per request, with how many requests fit in a KV budget and the throughput at equal memory. Every
constant is in the hardware profile (``--hw``), each with its source.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
from typing import Dict, List, Optional

import numpy as np

from ..cli_util import UsageError
from . import hardware

_HERE = os.path.dirname(os.path.abspath(__file__))
V32_CONFIG = os.path.join(_HERE, "profiles", "deepseek_v32_config.json")
MODES = ("device", "offload", "avsg")
FP8_ROW_BYTES = 656            # 512 e4m3 latent + 4 fp32 scales + 64 bf16 RoPE
INDEX_ROW_BYTES = 132          # 128 fp8 index-key values + one fp32 scale
STATE_BYTES_PER_SLOT = 4 * 4   # buffer state per slot (two hash buckets + slot pos + slot life)


@dataclasses.dataclass
class Traffic:
    """Measured per iteration per layer per request: selections and rows each mode copies."""
    drafts: int
    accept_mean: float
    union_rows: float          # offload: unique selected rows per iteration
    avsg_rows: float           # avsg: rows its buffer misses per iteration
    tokens_per_iteration: float
    capacity: int
    source: str


def measure_traffic(trace_path: Optional[str], drafts: int, accept_mean: float, capacity: int,
                    layers: int, steps: int) -> Traffic:
    from ..traces import format as trace_format
    from ..traces.mtp import mtp_replay
    from .. import backend
    from ..demo import trace_label
    trace = trace_format.load_trace(trace_path, check_values=False)
    trace = dataclasses.replace(trace, sel=trace.sel[:layers, :steps],
                                positions=trace.positions[:steps])
    with backend.emulation("fast"):
        res = mtp_replay(trace, policy="avsg", capacity=capacity, drafts=drafts,
                         accept_mean=accept_mean if drafts else 0.0, modes=("shared", "cold"))
    iterations = res["iterations"] * trace.layers
    return Traffic(drafts, accept_mean, res["modes"]["cold"]["fetched"] / iterations,
                   res["modes"]["shared"]["fetched"] / iterations,
                   res["emitted_tokens"] / res["iterations"], capacity,
                   f"{trace_label(trace_path)}: {trace.layers} layers x {res['iterations']} "
                   f"iterations, avsg policy (the plan op), capacity {capacity}")


def _weights_bytes(c, tokens: int, cards: int) -> Dict[str, float]:
    """FP8 weight bytes one card reads per decode step, serving ``tokens`` query tokens, with
    attention data-parallel (weights replicated) and routed experts spread over ``cards`` (expert
    parallelism, the way DeepSeek-V3.2 is served): a card reads its share of the experts that all
    cards' tokens touch."""
    H, heads = c.hidden_size, c.num_attention_heads
    qk = c.qk_nope_head_dim + c.qk_rope_head_dim
    attn = (H * c.q_lora_rank + c.q_lora_rank * heads * qk
            + H * (c.kv_lora_rank + c.qk_rope_head_dim)
            + c.kv_lora_rank * heads * (c.qk_nope_head_dim + c.v_head_dim)
            + heads * c.v_head_dim * H
            + c.q_lora_rank * c.index_n_heads * c.index_head_dim + H * c.index_head_dim
            + H * c.index_n_heads)
    dense = 3 * H * c.intermediate_size
    expert = 3 * H * c.moe_intermediate_size
    # experts all cards' tokens touch: each token picks num_experts_per_tok of n_routed_experts
    global_tokens = tokens * cards
    touched = c.n_routed_experts * (1 - (1 - c.num_experts_per_tok / c.n_routed_experts)
                                    ** global_tokens) / cards
    moe_layers = c.num_hidden_layers - c.first_k_dense_replace
    return {"attention": attn * c.num_hidden_layers,
            "dense_ffn": dense * c.first_k_dense_replace,
            "moe": moe_layers * (touched + c.n_shared_experts) * expert,
            "lm_head": H * c.vocab_size}


def project(c, hw: hardware.Profile, traffic: Traffic, batch: int, context: int,
            overlap: bool, cards: int = 16) -> Dict[str, Dict[str, float]]:
    """One modelled decode iteration per mode (seconds, bytes), for ``batch`` requests per card."""
    T = 1 + traffic.drafts
    tokens = batch * T
    L, K = c.num_hidden_layers, c.index_topk
    weights = _weights_bytes(c, tokens, cards)
    weight_s = hardware.hbm_time_s(hw, sum(weights.values()))
    # indexer: every query token scores every cached key; keys read once per request and layer
    index_bytes = L * batch * context * INDEX_ROW_BYTES
    index_flops = 2 * L * tokens * context * c.index_n_heads * c.index_head_dim
    index_s = max(hardware.hbm_time_s(hw, index_bytes), hardware.cube_time_s(hw, index_flops, 8))
    # sparse MLA: K rows per query token and layer, absorbed (576-d scores, 512-d values)
    mla_bytes = L * tokens * K * FP8_ROW_BYTES
    mla_flops = 2 * L * tokens * K * c.num_attention_heads * (c.kv_lora_rank * 2 + c.qk_rope_head_dim)
    mla_s = max(hardware.hbm_time_s(hw, mla_bytes), hardware.cube_time_s(hw, mla_flops, 16))
    compute_s = weight_s + index_s + mla_s
    per_layer_compute = compute_s / L
    plan_s = L * np.ceil(batch / hw["aiv_cores"]) * hw["plan_us_per_row_step"] * 1e-6
    out = {}
    for mode in MODES:
        rows = {"device": 0.0, "offload": traffic.union_rows, "avsg": traffic.avsg_rows}[mode]
        link_layer = hardware.link_time_s(hw, rows * batch, FP8_ROW_BYTES)
        exposed = max(0.0, link_layer - per_layer_compute) if overlap else link_layer
        step = compute_s + L * exposed + (plan_s if mode == "avsg" else 0.0)
        emitted = batch * traffic.tokens_per_iteration
        out[mode] = {"step_s": step, "tpot_s": step / traffic.tokens_per_iteration,
                     "tokens_per_s": emitted / step, "link_s": L * link_layer,
                     "plan_s": plan_s if mode == "avsg" else 0.0, "compute_s": compute_s,
                     "h2d_bytes_per_token": L * rows * FP8_ROW_BYTES / traffic.tokens_per_iteration,
                     "device_bytes_per_request": device_bytes_per_request(c, mode, context,
                                                                          traffic, T)}
    return out


def device_bytes_per_request(c, mode: str, context: int, traffic: Traffic, T: int) -> float:
    """Device memory one request holds: KV (all of it, a scratch, or the buffer + its state) and
    the indexer keys, which stay on the device in every mode."""
    L, K = c.num_hidden_layers + c.num_nextn_predict_layers, c.index_topk
    index = L * context * INDEX_ROW_BYTES
    kv = {"device": L * context * FP8_ROW_BYTES,
          "offload": L * T * K * FP8_ROW_BYTES,
          "avsg": L * traffic.capacity * (FP8_ROW_BYTES + STATE_BYTES_PER_SLOT)}[mode]
    return index + kv


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--hw", default=hardware.DEFAULT_PROFILE,
                        help="hardware profile JSON (default: the bundled 910B assumptions)")
    parser.add_argument("--config", default=V32_CONFIG,
                        help="DeepSeek-V3.2 config.json (default: the released one's keys)")
    parser.add_argument("--trace", help="selection trace for the hit rates (default: the "
                        "embedded asyncio_32k_8x256)")
    parser.add_argument("--trace-layers", type=int, default=4, help="trace layers replayed (default 4)")
    parser.add_argument("--trace-steps", type=int, default=256, help="trace steps replayed (default 256)")
    parser.add_argument("--capacity", type=int, default=8192, help="avsg slots per request and layer")
    parser.add_argument("--batch", default="1,8,32,64", help="batch sizes (default 1,8,32,64)")
    parser.add_argument("--context", default="32768,65536,131072",
                        help="context lengths (default 32K,64K,128K)")
    parser.add_argument("--mtp", default="0,3", help="MTP draft counts (default 0,3)")
    parser.add_argument("--accept-mean", type=float, default=2.0,
                        help="mean accepted drafts per iteration at MTP-3 (scaled for other n; default 2.0)")
    parser.add_argument("--link-gbps", type=float, help="override the host link, GB/s")
    parser.add_argument("--kv-budget-gb", type=float, default=32.0,
                        help="device memory for KV + indexer keys per card (default 32 GB)")
    parser.add_argument("--cards", type=int, default=16,
                        help="cards serving the model: attention data-parallel, experts spread "
                             "over the cards (default 16)")
    parser.add_argument("--overlap", action="store_true",
                        help="overlap each layer's gather with its compute")
    parser.add_argument("--out", metavar="DIR", default=None,
                        help="directory for decode.json and the TPOT plot (default "
                             "avsg-results/bench-decode/)")
    parser.add_argument("--json", metavar="PATH", help="JSON path (default OUT/decode.json)")
    parser.add_argument("--tables", metavar="PATH",
                        help="also write the summary tables as Markdown to PATH (the README's copy "
                             "is docs/results/decode.md, regenerated this way)")


def _int_list(name: str, text: str) -> List[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UsageError(f"{name}: expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 0 or (name != "--mtp" and min(values) < 1):
        raise UsageError(f"{name}: expected positive integers, got {text!r}")
    return values


def main(args: argparse.Namespace) -> int:
    from ..runtime.config import from_hf_config
    from ..cli_util import check_writable
    from . import common
    check_writable("--json", args.json)
    check_writable("--tables", args.tables)
    batches = _int_list("--batch", args.batch)
    contexts = _int_list("--context", args.context)
    mtps = _int_list("--mtp", args.mtp)
    if max(mtps) > 3:
        raise UsageError(f"--mtp: expected values in 0..3, got {args.mtp!r}")
    if args.cards < 1:
        raise UsageError(f"--cards: expected >= 1, got {args.cards}")
    try:
        hw = hardware.load_profile(args.hw)
        config = from_hf_config(args.config)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if args.link_gbps is not None:
        if args.link_gbps <= 0:
            raise UsageError(f"--link-gbps: expected > 0, got {args.link_gbps}")
        hw.override("link_bytes_per_s", args.link_gbps * 1e9, "--link-gbps")
    trace = common.trace_path(args.trace)
    if args.capacity < 4 * config.index_topk:
        raise UsageError(f"--capacity: expected >= (1 + 3) x top-k = {4 * config.index_topk}")
    print(f"avsg bench decode: DeepSeek-V3.2 ({config.num_hidden_layers} layers, top-"
          f"{config.index_topk}), FP8 KV ({FP8_ROW_BYTES} B/token/layer), hardware '{hw.name}'")
    print(f"  MODEL ESTIMATE, not a measurement: {hw.status}")
    print(f"  link {hw['link_bytes_per_s'] / 1e9:.0f} GB/s, {hw['host_dma_latency_s'] * 1e6:.1f} us "
          f"per host DMA x {hw['dma_in_flight_per_core']:.0f} in flight x {hw['aiv_cores']:.0f} cores; "
          f"HBM {hw['hbm_bytes_per_s'] / 1e12:.1f} TB/s x {hw['hbm_efficiency']}; gather "
          f"{'overlapped with' if args.overlap else 'not overlapped with'} compute; "
          f"{args.cards} cards (experts spread over them), batch and budget per card")
    results = []
    for n in mtps:
        accept = args.accept_mean * n / 3 if n else 0.0
        traffic = measure_traffic(trace, n, accept, args.capacity, args.trace_layers,
                                  args.trace_steps)
        print(f"\n  MTP-{n}: measured on {traffic.source}: offload copies {traffic.union_rows:,.0f} "
              f"rows per iteration and layer, avsg {traffic.avsg_rows:,.0f} "
              f"({traffic.avsg_rows / traffic.union_rows:.3f}x); "
              f"{traffic.tokens_per_iteration:.2f} tokens per iteration (simulated acceptance)")
        print(f"  {'batch':>5} {'context':>8} | {'TPOT ms: device':>15} {'offload':>8} {'avsg':>8} "
              f"| {'avsg/offload':>12} {'tok/s ratio':>11} | {'requests in budget: device':>26} "
              f"{'avsg':>5} | {'tok/s at equal memory: offload':>30} {'avsg':>8}")
        for context in contexts:
            for batch in batches:
                p = project(config, hw, traffic, batch, context, args.overlap, args.cards)
                fits = {m: int(args.kv_budget_gb * 1e9 // p[m]["device_bytes_per_request"])
                        for m in MODES}
                at_memory = {}
                for m in ("offload", "avsg"):
                    b = max(1, min(batch, fits[m]))
                    at_memory[m] = project(config, hw, traffic, b, context, args.overlap,
                                           args.cards)[m]["tokens_per_s"] if fits[m] else 0.0
                print(f"  {batch:>5} {context:>8,} | {1e3 * p['device']['tpot_s']:>15.1f} "
                      f"{1e3 * p['offload']['tpot_s']:>8.1f} {1e3 * p['avsg']['tpot_s']:>8.1f} | "
                      f"{p['avsg']['tpot_s'] / p['offload']['tpot_s']:>12.2f} "
                      f"{p['avsg']['tokens_per_s'] / p['offload']['tokens_per_s']:>11.2f} | "
                      f"{fits['device']:>26} {fits['avsg']:>5} | {at_memory['offload']:>30,.0f} "
                      f"{at_memory['avsg']:>8,.0f}")
                results.append({"mtp": n, "batch": batch, "context": context, "modes": p,
                                "requests_in_budget": fits, "tokens_per_s_at_budget": at_memory,
                                "traffic": dataclasses.asdict(traffic)})
    print("\n  Left out of the model: kernel launch and host overheads, cross-layer pipelining other "
          "than --overlap, MoE all-to-all across cards, the FP8 dequantisation cost, queueing on a "
          "shared link between cards, and any NPU measurement: calibrate the profile on a card.")
    from . import common
    out = common.out_dir(args, "decode")
    json_path = args.json or os.path.join(out, "decode.json")
    os.makedirs(os.path.dirname(json_path) or ".", exist_ok=True)
    with open(json_path, "w") as f:
        json.dump({"hardware": hw.sources(), "hardware_name": hw.name, "estimate": True,
                   "kv_budget_gb": args.kv_budget_gb, "overlap": args.overlap,
                   "cards": args.cards,
                   "results": results}, f, indent=1)
    plot_path = os.path.join(out, "decode_tpot.png")
    _plot(results, plot_path)
    print(f"  JSON: {json_path}\n  plot: {plot_path}")
    if args.tables:
        common.write_tables(args.tables, common.invocation(args), _tables(results, args.kv_budget_gb),
                            note="A model of a 910B with assumed constants, not a measurement.")
        print(f"  tables: {args.tables}")
    return 0


HEADLINE = ((0, 8, 32768), (0, 64, 32768), (3, 8, 131072), (3, 64, 131072))


def _tables(results: List[Dict], budget_gb: float) -> List[str]:
    from . import common

    def row(r):
        m = r["modes"]
        return [str(r["mtp"]), str(r["batch"]), f"{r['context'] // 1024}K",
                f"{1e3 * m['device']['tpot_s']:.1f} ms", f"{1e3 * m['offload']['tpot_s']:.1f} ms",
                f"{1e3 * m['avsg']['tpot_s']:.1f} ms",
                f"{m['avsg']['tpot_s'] / m['offload']['tpot_s']:.2f}",
                f"{m['avsg']['tokens_per_s'] / m['offload']['tokens_per_s']:.2f}x",
                f"{r['requests_in_budget']['device']} / {r['requests_in_budget']['avsg']}"]
    header = ["MTP", "batch", "context", "TPOT device", "offload", "avsg", "avsg/offload TPOT",
              "throughput", f"requests in {budget_gb:g} GB: device / avsg"]
    head = [row(r) for key in HEADLINE for r in results
            if (r["mtp"], r["batch"], r["context"]) == key]
    blocks = [common.markdown_table("decode", header, [row(r) for r in results], "rrrrrrrrr")]
    if head:
        blocks.insert(0, common.markdown_table("decode-headline", header, head, "rrrrrrrrr"))
    return blocks


def _plot(results: List[Dict], path: str) -> None:
    from . import common
    plt = common.pyplot()
    mtps = sorted({r["mtp"] for r in results})
    contexts = sorted({r["context"] for r in results})
    fig, axes = plt.subplots(1, len(mtps), figsize=(6 * len(mtps), 4.2), squeeze=False)
    colors = {"device": "tab:green", "offload": "tab:red", "avsg": "tab:blue"}
    styles = ["-", "--", ":", "-."]
    for ax, n in zip(axes[0], mtps):
        for ci, ctx in enumerate(contexts):
            for mode in MODES:
                pts = sorted((r["batch"], r["modes"][mode]["tpot_s"] * 1e3) for r in results
                             if r["mtp"] == n and r["context"] == ctx)
                ax.plot([a for a, _ in pts], [b for _, b in pts], marker="o", color=colors[mode],
                        linestyle=styles[ci % len(styles)], label=f"{mode}, {ctx // 1024}K")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch per card")
        ax.set_ylabel("TPOT ms (modelled)")
        ax.set_title(f"MTP-{n}: TPOT vs batch and context")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
    fig.suptitle("avsg bench decode: DeepSeek-V3.2 on an assumed 910B profile, an estimate",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
