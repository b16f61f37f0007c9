"""Selection traces, buffer-policy replay against Belady's optimum, hit-rate reports.

* :mod:`.format`   -- load / save / validate trace ``.npz`` files (docs/design.md §8);
* :mod:`.compact`  -- the compact ``.avtrace`` encoding the full shipped traces use;
* :mod:`.policies` -- lru, clock, setassoc-fifo, bucketed-lru, prev-step, belady, avsg;
* :mod:`.replay`   -- the one driver (warm-up and counting rules);
* :mod:`.synth`    -- synthetic traces (AVSG paper settings) and gamma / recall measurement;
* :mod:`.mtp`      -- MTP replay (shared vs separate vs cold-start buffers);
* :mod:`.report`   -- tables, JSON, PNG plot;
* :mod:`.lookup`   -- which trace a command replays (the embedded default, the shipped traces by
  name, a path) and loading it.

The ``avsg trace {replay,synth,info,mtp}`` commands are in :mod:`avsg.lab.commands.trace`.

Nothing here needs the compiled operator except the ``avsg`` policy.
"""
from .format import Trace, TraceFormatError, load_trace, save_trace, validate_trace
from .policies import POLICIES, make_policy, policy_names
from .replay import ReplayResult, replay, replay_many

__all__ = ["Trace", "TraceFormatError", "load_trace", "save_trace", "validate_trace", "POLICIES",
           "make_policy", "policy_names", "ReplayResult", "replay", "replay_many"]
