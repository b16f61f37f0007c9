"""The cost model: what a decode step costs on an Ascend 910B, from counted work and a profile.

``hardware``    the hardware profile (bundled 910B assumptions, or a calibrated JSON) and the
                prices of counted work, HBM, cube and link time
``plan_cost``   the plan kernel's counted work on a trace turned into time; the slot map's and
                the host LRU's matching cost; the step cost of a trace replay
``traffic``     rows each mode copies per layer and iteration, replayed from a trace
``projection``  one decode iteration per mode: memory per card, compute, matching, copies
``host_lru``    vllm-ascend's host LRU (lab/host_lru.cpp, built with the ops), timed on this machine

Nothing here parses a command line; ``avsg bench decode``, ``avsg run`` and ``avsg serve-sim``
call it. These are estimates, not measurements: nothing here has run on an NPU.
"""
