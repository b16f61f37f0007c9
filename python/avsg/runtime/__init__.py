"""The DSA decode runtime: a DeepSeek-V3.2-style model decoding with MTP over offloaded KV.

    engine.py     Engine: continuous batching over persistent rows, MTP drafting/verification
    base.py       the plug-in points: SparseAlgorithm (Index/Select/Attention) and KVStore
                  (Offload/Retrieve), with their registries
    algo/         dsa.py (lightning indexer + sparse MLA), trace.py (selections from a trace)
    store/        device.py, offload.py, avsg.py (SparseKVBuffer + gather)
    model.py      the model (module names = checkpoint names), rope.py, weights.py; the
                  config is avsg.model_config, the per-token KV layouts avsg.kvformat
    pool.py       the paged host pool
    context.py    linear-cost context fill; spec.py MTP acceptance; scheduler.py requests

The commands that drive it (``avsg run``, ``avsg generate``) are in :mod:`avsg.commands`.
"""
