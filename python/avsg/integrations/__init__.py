"""Serving integrations: glue between an engine's flattened batches and the AVSG ops.

``SparseOffloadManager`` (``manager.py``) is framework-neutral: it takes what vLLM / vllm-ascend
or a MindIE model already has per step (top-k in TND layout, query start offsets, sequence lengths,
the host pool's block table) and returns what sparse flash attention reads. See
``docs/vllm-ascend.md`` and ``docs/mindie.md``.
"""
from .manager import RowSlots, SparseAttentionInputs, SparseOffloadManager, StepMeta

__all__ = ["SparseOffloadManager", "SparseAttentionInputs", "RowSlots", "StepMeta"]
