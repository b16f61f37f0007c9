"""Sparse-attention algorithms (Index / Select / Attention). ``dsa``: DeepSeek Sparse Attention."""
from .dsa import DSA, gather_selected, sparse_mla_attention, topk_lowest_position_first

__all__ = ["DSA", "gather_selected", "sparse_mla_attention", "topk_lowest_position_first"]
