"""Hardware profiles for the modelled benchmarks: every constant with where it came from.

A profile is a JSON object whose entries are ``{"value": number, "source": text}``; ``source``
says *assumption* where that is what it is. ``profiles/ascend910b.json`` is the default; ``--hw
PATH`` loads another (e.g. one written by calibration runs on a real card), and single values can
be overridden on the command line.

The host link is what bounds offloaded KV: a gather of ``rows`` rows of ``row_bytes`` bytes cannot
finish sooner than ``rows * row_bytes / link_bytes_per_s`` (bandwidth), nor sooner than
``rows * host_dma_latency_s / (cores * dma_in_flight_per_core)`` (each core keeps only so many reads
of mapped host memory in flight). ``link_time_s`` takes the larger, so no modelled gather is ever
faster than its link.
"""
from __future__ import annotations

import json
import os
from typing import Dict

_HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_PROFILE = os.path.join(_HERE, "profiles", "ascend910b.json")


class Profile:
    def __init__(self, entries: Dict[str, Dict], path: str):
        self.entries = entries
        self.path = path
        self.name = entries.get("name", os.path.basename(path))
        self.status = entries.get("status", "")

    def __getitem__(self, key: str) -> float:
        if key not in self.entries or not isinstance(self.entries[key], dict):
            raise KeyError(f"hardware profile {self.path}: no value for {key!r}")
        return float(self.entries[key]["value"])

    def override(self, key: str, value: float, source: str) -> None:
        self.entries[key] = {"value": value, "source": source}

    def sources(self) -> Dict[str, str]:
        return {k: v["source"] for k, v in self.entries.items() if isinstance(v, dict)}


def load_profile(path: str = DEFAULT_PROFILE) -> Profile:
    try:
        with open(path) as f:
            entries = json.load(f)
    except OSError as e:
        raise ValueError(f"--hw: cannot read {path}: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"--hw: {path} is not JSON ({e.msg}, line {e.lineno})") from None
    if not isinstance(entries, dict):
        raise ValueError(f"--hw: {path}: expected a JSON object")
    return Profile(entries, path)


def link_time_s(profile: Profile, rows: float, row_bytes: int) -> float:
    """Time to move ``rows`` rows host -> device: bandwidth- or latency-bound, whichever is slower."""
    bandwidth = rows * row_bytes / profile["link_bytes_per_s"]
    in_flight = profile["aiv_cores"] * profile["dma_in_flight_per_core"]
    latency = rows * profile["host_dma_latency_s"] / in_flight
    return max(bandwidth, latency)


def hbm_time_s(profile: Profile, nbytes: float) -> float:
    return nbytes / (profile["hbm_bytes_per_s"] * profile["hbm_efficiency"])


def cube_time_s(profile: Profile, flops: float, bits: int = 8) -> float:
    peak = profile["cube_flops_fp8"] if bits == 8 else profile["cube_flops_bf16"]
    return flops / (peak * profile["cube_efficiency"])
