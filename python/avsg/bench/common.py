"""Shared pieces of the benchmarks: trace loading, the counted-work cost estimate, JSON output."""
from __future__ import annotations

import json
import os
import platform
from typing import Dict

import torch

from .. import backend


def machine() -> str:
    return f"{platform.machine()} {os.cpu_count()} cores, torch {torch.__version__}"


def counted_launch() -> Dict[str, float]:
    """The last emulated launch: estimated NPU time (both bounds, slowest block) plus the work."""
    counters = backend.last_launch_counters()
    total = counters.total()
    return dict(serial_us=backend.estimate_npu_time_us(counters, "serial"),
                overlap_us=backend.estimate_npu_time_us(counters, "overlap"),
                blocks=counters.blocks,
                vec_repeats=total["vec_repeats"],
                scalar_ops=sum(total[k] for k in ("scalar_ub_reads", "scalar_ub_writes",
                                                  "scalar_gm_reads", "scalar_gm_writes")),
                mte2_bytes=total["mte2_bytes"], mte3_bytes=total["mte3_bytes"],
                copies=total["mte2_copies"] + total["mte3_copies"])


def write_json(path: str, payload: dict) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump(payload, f, indent=1)
    print(f"wrote {path}")
