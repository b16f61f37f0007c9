"""The serving core: what the runtime, the vllm-ascend plugin and the MindIE guide share.

- ``RowTable`` (``rows.py``): which request holds which state row; the resets a new holder needs.
- ``Residency`` (``residency.py``): every layer's ``SparseKVBuffer`` and its recorded drops; a
  layer's ``step`` is one call into the op library (drop + plan + the caller's copy).
- ``PagedKV`` (``paged.py``): device KV buffers, the engine's paged host pool, and the package's
  own copy between them (``gather``, write-through).
- ``tokens.py``: an engine's flat token layout (TND) to ``[R, T, K]`` by state row and back.
- ``SparseOffloadManager`` (``manager.py``): the three composed for an engine whose host pool
  AVSG addresses (the runtime's ``avsg`` store, MindIE); the vllm-ascend plugin composes
  ``RowTable``, ``Residency`` and ``tokens`` with vllm-ascend's own copy.
"""
from .manager import (RESIDENT_BLOCK_SIZE, RowSlots, SparseAttentionInputs, SparseOffloadManager,
                      StepMeta)
from .paged import PagedKV
from .residency import Residency
from .rows import RowTable

__all__ = ["SparseOffloadManager", "SparseAttentionInputs", "RowSlots", "StepMeta", "RowTable",
           "Residency", "PagedKV", "RESIDENT_BLOCK_SIZE"]
