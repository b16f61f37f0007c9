#!/usr/bin/env python
"""Record a selection trace from a local Hugging Face causal LM (offline).

    python scripts/record_trace.py --model /path/to/local/model --text corpus.txt \
        --out my_trace.npz [--context 32768] [--steps 1024] [--k 2048]

Rule (the same as the shipped ``asyncio_32k`` and ``debian_reference_32k``): the first ``context`` tokens of the text are
run through the model; the last ``steps`` positions are the decode steps (teacher forced). For each
layer and step, every earlier position (and the query itself) is scored by the causal attention
probability summed over the query heads, and the ``k`` highest form that step's selection
(:func:`avsg.lab.traces.record.select_topk`). The prefix is prefilled in chunks into the model's KV
cache; the decode positions are then run in chunks of ``--query-chunk`` with
``output_attentions=True`` (eager attention), so memory stays at about
``layers x heads x query_chunk x context x 4`` bytes.

``transformers`` is an optional dependency used only here (``pip install transformers``); nothing
is downloaded (``local_files_only=True``, HF_HUB_OFFLINE=1).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))  # run from a source checkout too


def _import_transformers():
    try:
        import transformers  # noqa: F401
        return transformers
    except ImportError:
        raise SystemExit(
            "record_trace.py needs the optional dependency 'transformers' (pip install transformers); "
            "it is not installed. Nothing else in avsg needs it.")


def record(model_dir: str, text: str, context: int, steps: int, k: int, query_chunk: int = 32,
           prefill_chunk: int = 1024, dtype: str = "float32", device: str = "cpu", log=print,
           tokenizer_dir: "str | None" = None):
    """Returns a :class:`avsg.lab.traces.format.Trace` recorded with the attention-probability rule."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    transformers = _import_transformers()
    import torch
    from avsg.lab.traces.format import Trace, smallest_sel_dtype
    from avsg.lab.traces.record import select_topk

    tok = transformers.AutoTokenizer.from_pretrained(tokenizer_dir or model_dir, local_files_only=True)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        model_dir, local_files_only=True, attn_implementation="eager",
        dtype=getattr(torch, dtype))
    model.to(device).eval()
    ids = tok(text, return_tensors="pt", add_special_tokens=False)["input_ids"][0]
    if ids.numel() < context:
        raise SystemExit(f"--text: {ids.numel()} tokens, need --context {context}")
    if not 0 < steps <= context:
        raise SystemExit(f"--steps: expected 1..context ({context}), got {steps}")
    ids = ids[:context].to(device)
    first = context - steps
    cache = transformers.DynamicCache() if hasattr(transformers, "DynamicCache") else None
    import inspect
    # newer transformers call the KV-cache argument `cache`, older ones `past_key_values`
    ckw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    def _next_cache(out, old):
        new = getattr(out, "past_key_values", None)
        if new is None:
            new = getattr(out, "cache", None)
        return old if new is None else new
    t0 = time.perf_counter()
    layers = model.config.num_hidden_layers
    sel = np.full((layers, steps, k), -1, np.int64)
    with torch.no_grad():
        for a in range(0, first, prefill_chunk):
            b = min(first, a + prefill_chunk)
            out = model(input_ids=ids[None, a:b], use_cache=True, **{ckw: cache})
            cache = _next_cache(out, cache)
        for a in range(first, context, query_chunk):
            b = min(context, a + query_chunk)
            out = model(input_ids=ids[None, a:b], use_cache=True, output_attentions=True,
                        **{ckw: cache})
            cache = _next_cache(out, cache)
            if out.attentions is None or len(out.attentions) != layers:
                raise SystemExit("the model returned no attentions (needs eager attention support)")
            qpos = np.arange(a, b)
            for l, att in enumerate(out.attentions):      # [1, heads, q, kv]
                sel[l, a - first:b - first] = select_topk(att[0].float().cpu(), qpos, k)
            log(f"  positions {a}..{b - 1} ({time.perf_counter() - t0:.1f}s)")
    padded = bool((sel < 0).any())
    sel = sel.astype(smallest_sel_dtype(context, padded))
    name = getattr(model.config, "_name_or_path", "") or os.path.basename(os.path.normpath(model_dir))
    heads = model.config.num_attention_heads
    rule = (f"per layer, per decode step: top-k of attention probability summed over {heads} query "
            f"heads, causal; teacher-forced over the last {steps} positions")
    return Trace(sel=sel, positions=np.arange(first, context, dtype=np.int32), T=context, k=k,
                 model=str(name), rule=rule)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="local Hugging Face model directory")
    p.add_argument("--tokenizer", help="local tokenizer directory (default: --model)")
    p.add_argument("--text", required=True, help="text file to read")
    p.add_argument("--out", required=True, help="output trace .npz")
    p.add_argument("--context", type=int, default=32768, help="context tokens (default 32768)")
    p.add_argument("--steps", type=int, default=1024, help="last N positions as decode steps")
    p.add_argument("--k", type=int, default=2048)
    p.add_argument("--query-chunk", type=int, default=32)
    p.add_argument("--prefill-chunk", type=int, default=1024)
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    p.add_argument("--device", default="cpu")
    a = p.parse_args(argv)
    _import_transformers()  # fail early with a clear message
    with open(a.text, encoding="utf-8", errors="replace") as f:
        text = f.read()
    tr = record(a.model, text, a.context, a.steps, a.k, a.query_chunk, a.prefill_chunk, a.dtype,
                a.device, tokenizer_dir=a.tokenizer)
    from avsg.lab.traces.format import save_trace
    save_trace(a.out, tr)
    print(f"wrote {a.out}: {tr.summary()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
