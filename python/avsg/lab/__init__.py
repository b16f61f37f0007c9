"""The lab beside the package: what measures, models and explains AVSG, not what serves with it.

- ``traces``: selection traces (format, the shipped traces, policy replay, synthesis, MTP);
  ``traces/policies.py`` is the one place for the lab's copies of buffer policies (LRU, Belady,
  the slot map's FIFO, ...; AVSG's own run the real ops). Elsewhere are models of other things:
  ``budget/curves.py``'s stack-distance LRU (hit curves), ``costmodel/fused.py`` (vllm-ascend's
  fused kernel's cache), the emulation benchmark's torch LRU (a timing baseline).
- ``costmodel``: the decode cost model (hardware profiles, counted plan cost, copy traffic,
  projections per mode, vllm-ascend's host LRU timed).
- ``budget``: serving under a device-memory budget (behind ``avsg serve-sim``).
- ``commands``: the CLI commands that run them (``avsg bench``, ``avsg trace``, ``avsg serve-sim``).

No module of the operator core (ops, buffer, serving core, integrations) imports it
(tests/house/test_layering.py). The runtime reads selection traces through ``lab.traces``.
"""
