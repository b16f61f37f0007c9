"""Serving integrations: the vllm-ascend plugin (``vllm_ascend.py``, ``vllm_ascend_plugin.py``).

The serving core they share with the runtime lives in ``avsg.cache``; ``SparseOffloadManager`` is
re-exported here for code written against earlier releases. See ``docs/vllm-ascend.md`` and
``docs/mindie.md``.
"""
from ..cache import RowSlots, SparseAttentionInputs, SparseOffloadManager, StepMeta

__all__ = ["SparseOffloadManager", "SparseAttentionInputs", "RowSlots", "StepMeta"]
