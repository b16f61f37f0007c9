"""Engine drivers shared by the runtime tests: a tiny random model (module fixture), prompts,
an engine over any registered store, and a run that returns outputs and logits per request."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from avsg import model_config
from avsg.kvformat import get_format
from avsg.runtime import weights
from avsg.runtime.algo.dsa import DSA
from avsg.runtime.base import STORES, StoreSpec
from avsg.runtime import store as _registered_stores  # noqa: F401  (fills STORES)
from avsg.runtime.context import ContextFill
from avsg.runtime.engine import Engine
from avsg.runtime.model import DeepseekV32

@pytest.fixture(scope="module")
def tiny_model():
    config = model_config.preset("tiny")
    model = DeepseekV32(config)
    weights.init_random(model, seed=3)
    return model.eval()


def prompts_for(config, count, seed=0, low=6, high=20):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, config.vocab_size, int(rng.integers(low, high))).tolist()
            for _ in range(count)]


def make_engine(model, mode, rows, mtp, max_len, capacity=None, algo=None, acceptance=None,
                kv_format="bf16", record_logits=True, recorder=None):
    config = model.config
    fmt = get_format(kv_format, config.kv_lora_rank, config.qk_rope_head_dim)
    spec = StoreSpec(layers=model.num_kv_layers, rows=rows, max_len=max_len,
                     topk=config.index_topk, queries_per_step=1 + mtp, kv_format=fmt,
                     device=torch.device("cpu"),
                     capacity=capacity or (1 + mtp) * config.index_topk + 8, block_size=16)
    store = STORES[mode](spec)
    if algo is None:
        algo = DSA(config, rows=rows, max_len=max_len, device="cpu", layers=model.num_kv_layers)
    return Engine(model, algo, store, fmt, rows, mtp=mtp, acceptance=acceptance,
                  context_fill=ContextFill(model, fmt, document_seed=5),
                  record_logits=record_logits, recorder=recorder), store


def run_requests(engine, requests):
    records = engine.run(requests)
    logits = {r.id: torch.cat([rec.logits[r.id] for rec in records if r.id in rec.logits])
              for r in requests}
    return [r.output for r in requests], logits
