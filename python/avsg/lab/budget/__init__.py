"""Serving under a device-memory budget: per-request miss curves, the budget split, admission,
context-balanced micro-batches with overlap, and the simulation behind ``avsg serve-sim``.

``curves``      exact LRU stack distances, LRU under resizes, sampled ghost-tag miss curves
``split``       greedy marginal-utility split with lookahead, the exact optimum, admission
``microbatch``  KARAT's context-balanced split (CMR) and the two-resource schedule (static / OFMS)
``workload``    arrivals, lengths, locality rows from selection traces
``sim``         the decode-iteration simulation per scheduler variant
"""
