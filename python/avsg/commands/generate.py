"""``avsg generate``: greedy generation from a checkpoint directory, to check our model against yours.

    avsg generate --checkpoint DIR --input-ids '[[1, 2, 3], [4, 5]]' --max-new-tokens 20 \\
                  [--mode avsg] [--mtp 1] [--json OUT]

The checkpoint is a Hugging Face DeepSeek-V3.2 directory (``config.json`` + ``*.safetensors``).
Each prompt is prefilled through the model (real attention with the indexer's top-k), then decoded
greedily; with ``--mtp N`` the MTP module drafts and verification keeps exactly the greedy tokens.
The KV cache is fp32 by default here, so the output can be compared with an fp32 reference.
"""
from __future__ import annotations

import argparse
import json
from typing import List

import torch

from ..cli_util import UsageError, int_in, output_path, torch_threads, writing
from ..runtime import store as _stores  # noqa: F401  (registers the stores)
from ..runtime.base import SPLIT_ATTENTION_CHOICES, STORES, StoreSpec, auto_split_policy
from ..runtime.engine import Engine, positions_needed
from ..kvformat import FORMAT_NAMES, get_format
from ..runtime.scheduler import Request


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", required=True, help="Hugging Face DeepSeek-V3.2 directory")
    parser.add_argument("--input-ids", required=True,
                        help="JSON list of token-id lists (or @FILE holding it)")
    parser.add_argument("--max-new-tokens", type=int_in(1, 1 << 20), default=32,
                        help="output tokens per prompt, 1..1048576 (default 32)")
    parser.add_argument("--mode", choices=("device", "offload", "avsg"), default="device",
                        help="KV store (default device); outputs are identical in every mode")
    parser.add_argument("--mtp", type=int, default=0, choices=range(0, 4), metavar="N",
                        help="MTP drafts per step, 0..3 (default 0)")
    parser.add_argument("--capacity", type=int_in(1, 32768), help="avsg buffer slots, (1 + mtp) "
                        "x top-k..32768 (default: max(8192, (1 + mtp) x top-k))")
    parser.add_argument("--split-attention", nargs="?", const="on", default="off",
                        choices=tuple(SPLIT_ATTENTION_CHOICES),
                        help="avsg mode: attention over the buffer's hits and over its misses, "
                             "merged by log-sum-exp (the schedule that lets the copy overlap the "
                             "hits' attention; docs/overlap.md); auto: where the split rule "
                             "chooses it (the decode model's rule; on CPU, or without a measured "
                             "overlap, it never splits); default off: one pass, bit-exact")
    parser.add_argument("--kv-format", choices=FORMAT_NAMES, default="fp32",
                        help="KV cache format (default fp32)")
    parser.add_argument("--json", metavar="OUT", help="write {'outputs': [[ids...], ...]}")


def parse_input_ids(text: str) -> List[List[int]]:
    if text.startswith("@"):
        try:
            with open(text[1:]) as f:
                text = f.read()
        except OSError as e:
            raise UsageError(f"--input-ids: cannot read {text[1:]}: {e.strerror}") from None
        except UnicodeDecodeError as e:
            raise UsageError(f"--input-ids: {text[1:]} is not a text file (byte {e.start} is not "
                             f"{e.encoding})") from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise UsageError(f"--input-ids: not JSON ({e.msg} at column {e.colno})") from None
    if (not isinstance(value, list) or not value
            or not all(isinstance(p, list) and p for p in value)
            or not all(isinstance(t, int) and not isinstance(t, bool) for p in value for t in p)):
        raise UsageError("--input-ids: expected a non-empty JSON list of non-empty lists of ints")
    return value


def generate(model, prompts: List[List[int]], max_new_tokens: int, mode: str = "device",
             mtp: int = 0, kv_format_name: str = "fp32", capacity=None,
             record_logits: bool = False, split_attention=False):
    """Greedy outputs (lists of token ids) for ``prompts``; with ``record_logits`` also the
    verify logits of every step, per request. Every prompt gets its own row."""
    from ..runtime.algo.dsa import DSA
    config = model.config
    device = next(model.parameters()).device
    kv_format = get_format(kv_format_name, config.kv_lora_rank, config.qk_rope_head_dim)
    rows = len(prompts)
    max_len = max(positions_needed(len(p), max_new_tokens, mtp) for p in prompts)
    capacity = capacity or max(8192, (1 + mtp) * config.index_topk)
    spec = StoreSpec(layers=model.num_kv_layers, rows=rows, max_len=max_len,
                     topk=config.index_topk, queries_per_step=1 + mtp, kv_format=kv_format,
                     device=device, capacity=capacity, split_attention=split_attention,
                     split_policy=auto_split_policy(config, device)
                     if split_attention == "auto" else None)
    store = STORES[mode](spec)
    algo = DSA(config, rows=rows, max_len=max_len, device=device, layers=model.num_kv_layers)
    engine = Engine(model, algo, store, kv_format, rows, mtp=mtp, record_logits=record_logits)
    requests = [Request(id=i, max_new_tokens=max_new_tokens, prompt=list(p))
                for i, p in enumerate(prompts)]
    records = engine.run(requests)
    outputs = [r.output for r in requests]
    if not record_logits:
        return outputs
    logits = {r.id: [rec.logits[r.id] for rec in records if r.id in rec.logits] for r in requests}
    return outputs, logits


def main(args: argparse.Namespace) -> int:
    args.split_attention = SPLIT_ATTENTION_CHOICES.get(args.split_attention, args.split_attention)
    from .run import build_model, checkpoint_config
    if args.max_new_tokens < 1:
        raise UsageError(f"--max-new-tokens: expected >= 1, got {args.max_new_tokens}")
    json_path = output_path("--json", args.json)
    if args.capacity is not None and args.mode != "avsg":
        raise UsageError(f"--capacity: sizes the avsg buffer; --mode {args.mode} has none "
                         f"(add --mode avsg)")
    if args.split_attention and args.mode != "avsg":
        raise UsageError(f"--split-attention: splits the avsg buffer's hits from its misses; "
                         f"--mode {args.mode} has none (add --mode avsg)")
    config = checkpoint_config(args.checkpoint, has_config_option=False)
    prompts = parse_input_ids(args.input_ids)
    for i, prompt in enumerate(prompts):
        bad = [t for t in prompt if not 0 <= t < config.vocab_size]
        if bad:
            raise UsageError(f"--input-ids: prompt {i} holds token {bad[0]}, outside the "
                             f"vocabulary [0, {config.vocab_size})")
    longest = max(positions_needed(len(p), args.max_new_tokens, args.mtp) for p in prompts)
    if longest > config.max_position_embeddings:
        raise UsageError(f"--max-new-tokens: prompts plus outputs need {longest} positions, the "
                         f"model has {config.max_position_embeddings}")
    if args.mtp and config.num_nextn_predict_layers < 1:
        raise UsageError("--mtp: the checkpoint has no MTP layer (num_nextn_predict_layers = 0)")
    if args.capacity is not None and args.capacity < (1 + args.mtp) * config.index_topk:
        raise UsageError(f"--capacity: expected >= (1 + mtp) x top-k = "
                         f"{(1 + args.mtp) * config.index_topk}, got {args.capacity}")
    with torch_threads():       # the cores other processes leave idle (cli_util.torch_threads)
        model = build_model(config, args.checkpoint, seed=0, device=torch.device("cpu"))
        outputs = generate(model, prompts, args.max_new_tokens, args.mode, args.mtp,
                           args.kv_format, args.capacity,
                           split_attention=args.split_attention)
    for i, out in enumerate(outputs):
        print(f"request {i}: {out}")
    if json_path:
        with writing("--json", json_path), open(json_path, "w") as f:
            json.dump({"outputs": outputs}, f)
        print(f"outputs written: {json_path}")
    return 0
