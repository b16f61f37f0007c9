"""The avsg store over the integration manager with write-through: a pass's own new KV goes into
its reserved slots from the device, so the tokens stay bit-identical to the device store while
the host copies of fresh positions disappear."""
import dataclasses

import torch

from avsg.runtime.base import STORES
from avsg.runtime.scheduler import Request

from helpers.engine import make_engine, prompts_for, run_requests, tiny_model  # noqa: F401


def test_write_through_keeps_outputs_and_saves_fresh_copies(tiny_model):  # noqa: F811
    config = tiny_model.config
    prompts = prompts_for(config, 4, seed=7)
    results, stores = {}, {}
    for name, mode, write_through in (("device", "device", False), ("avsg", "avsg", False),
                                      ("avsg+wt", "avsg", True)):
        engine, store = make_engine(tiny_model, mode, rows=2, mtp=2, max_len=64,
                                    capacity=3 * config.index_topk + 8)
        if write_through:
            store = STORES["avsg"](dataclasses.replace(store.spec, write_through=True))
            engine.store = store            # the engine holds its store in one place
        requests = [Request(id=i, max_new_tokens=10, prompt=p) for i, p in enumerate(prompts)]
        results[name] = run_requests(engine, requests)
        stores[name] = store
    outputs, logits = results["device"]
    for name in ("avsg", "avsg+wt"):
        assert results[name][0] == outputs, name
        for rid in logits:
            assert torch.equal(results[name][1][rid], logits[rid]), (name, rid)
    plain, wt = stores["avsg"], stores["avsg+wt"]
    assert int(wt.manager.write_through_rows) > 0
    assert wt.h2d_rows() < plain.h2d_rows()
    assert wt.h2d_fresh_rows() < plain.h2d_fresh_rows()
    assert plain.h2d_rows() - wt.h2d_rows() == int(wt.manager.write_through_rows)
