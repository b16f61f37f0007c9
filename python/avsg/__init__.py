"""AVSG: miss-only KV-cache offload for DeepSeek Sparse Attention on Ascend NPUs.

    buf  = avsg.SparseKVBuffer(rows=R, capacity=S, topk=K, queries_per_step=T, max_context=N)
    plan = buf.plan(topk_pos, seq_lens)                  # match + reserve
    avsg.gather(plan, src=[host_kv], dst=[buffer_kv])    # copy only the misses
    buf.step(topk_pos, seq_lens, avsg.MissCopy([host_kv], [buffer_kv]))   # both, one launch
    buf.invalidate(valid_lens); buf.reset(rows); buf.stats()
"""
from . import _ops, reference  # noqa: F401  (_ops registers the ops)
from . import backend  # loads the NPU op library when it was built (scripts/build_npu.sh)
from .buffer import MissCopy, Plan, SparseKVBuffer, apply_moves, gather, get_num_cores, kv_slots, set_num_cores, split_slots

__all__ = ["MissCopy", "Plan", "SparseKVBuffer", "apply_moves", "gather", "get_num_cores", "kv_slots", "set_num_cores", "split_slots", "reference",
           "backend"]
__version__ = "0.1.0"
