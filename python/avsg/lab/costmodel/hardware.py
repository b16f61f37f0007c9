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
import math
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
    check_entries(entries, path)
    return Profile(entries, path)


# Entries the model divides by or scales with: zero or less would give infinities, negative
# times or a schedule that cannot run, so a profile must give them a positive value.
POSITIVE_KEYS = frozenset((
    "hbm_bytes_per_s", "hbm_efficiency", "cube_flops_bf16", "cube_flops_int8", "cube_efficiency",
    "link_bytes_per_s", "dma_in_flight_per_core", "aiv_cores", "hbm_bytes", "clock_ghz",
    "mte_bytes_per_cycle", "weight_bytes_per_param",
    "host_cpu_time_factor", "host_lru_threads", "attention_aiv_cores"))
FRACTION_KEYS = frozenset(("hbm_efficiency", "cube_efficiency"))
# Entries that count things (cores, reads in flight, threads, copies): the model takes ceilings and
# products of them as whole numbers, so 39.5 cores is a mistake, not a value.
COUNT_KEYS = frozenset(("aiv_cores", "dma_in_flight_per_core", "host_lru_threads",
                        "activation_hidden_copies", "attention_aiv_cores"))
BINARY_KEYS = frozenset(("fp8_compute", "split_overlap_measured"))


def check_entries(entries: Dict, path: str) -> None:
    """Every entry but ``name`` / ``status`` is ``{"value": finite number, "source": text}``; the
    model's entries (the bundled profile's) are >= 0, the POSITIVE_KEYS > 0, the efficiencies
    <= 1, the COUNT_KEYS whole numbers and the BINARY_KEYS 0 or 1, and all of them are present. Other entries (a calibration
    run's fitted slopes, ``calib_*``) the model does not read: a number is all they need to be.
    A ValueError names the entry."""
    def bad(key, what):
        return ValueError(f"--hw: {path}: entry {key!r}: {what}")
    model_keys = set(_bundled_keys())
    for key, entry in entries.items():
        if key in ("name", "status"):
            continue
        if not isinstance(entry, dict):
            raise bad(key, f"expected {{\"value\": number, \"source\": text}}, got {entry!r}")
        value = entry.get("value")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad(key, f"expected a number as \"value\", got {value!r}")
        if not math.isfinite(value):
            raise bad(key, f"expected a finite value, got {value!r}")
        if key in model_keys and value < 0:
            raise bad(key, f"expected a value >= 0, got {value!r}")
        if key in POSITIVE_KEYS and value <= 0:
            raise bad(key, f"expected a value > 0 (the model divides by or scales with it), got {value!r}")
        if key in FRACTION_KEYS and value > 1:
            raise bad(key, f"expected a fraction in (0, 1], got {value!r}")
        if key in COUNT_KEYS and isinstance(value, float) and not value.is_integer():
            raise bad(key, f"expected a whole number (a count), got {value!r}")
        if key in BINARY_KEYS and value not in (0, 1):
            raise bad(key, f"expected 0 or 1, got {value!r}")
        if not isinstance(entry.get("source"), str):
            raise bad(key, "expected a \"source\" text (where the value comes from)")
    missing = sorted(k for k in model_keys if k not in entries)
    if missing:
        raise ValueError(f"--hw: {path}: no entry {missing[0]!r} (a profile gives every entry of "
                         f"the bundled one; {len(missing)} missing)")


def _bundled_keys():
    with open(DEFAULT_PROFILE) as f:
        return [k for k, v in json.load(f).items() if isinstance(v, dict)]


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


# ------------------------------------------------------------------ per-launch cost model
#
# The emulation counts, per block and per pipe, the work a launch issued
# (avsg.backend.last_launch_counters). These turn it into two estimates with the profile's
# constants (the defaults equal emulation/emu_core.h's CostModel):
#   serial-pipe     every pipe of a block runs one after the other (scalar + vector + MTE2 + MTE3
#                   + sync), the launch takes its slowest block;
#   overlapped-pipe a block's pipes overlap perfectly (the busiest pipe + sync), slowest block.
# Neither is a bound on real hardware: both are only as good as the constants, which are
# assumptions until calibrated ('avsg bench calibrate' on an NPU).
# Gather adds the host link to both (link_terms): the batch's H2D bytes over the link bandwidth,
# and per core rows x per-DMA latency of mapped host reads / the rows it keeps in flight; a
# modelled gather is never faster than the link.

REQUIRED_KEYS = ("clock_ghz", "vec_cycles_per_repeat", "vec_issue_cycles", "mte_bytes_per_cycle",
                 "mte_issue_cycles", "scalar_ub_cycles", "scalar_gm_cycles", "barrier_cycles",
                 "flag_cycles", "sync_all_cycles", "dcci_cycles", "link_bytes_per_s",
                 "host_dma_latency_s", "aiv_cores")

PLAN_LEAVES_OUT = ("left out of the plan model: instruction dependencies inside a pipe, the "
                   "scalar unit's DCache and branch costs, UB bank conflicts, kernel launch "
                   "overhead (~tens of us on a real stack), and any calibration: every constant is "
                   "an assumption (--hw).")
GATHER_LEAVES_OUT = ("left out of the gather model: PCIe packetisation and read-request sizes, the "
                     "host memory system and IOMMU, other traffic on the link, HBM write "
                     "contention, kernel launch overhead, and any calibration: link and latency "
                     "constants are assumptions (--hw).")


def pipe_cycles(counters, hw: Profile) -> Dict[str, "object"]:
    """Per block cycles of each pipe (torch float64 tensors ``[blocks]``)."""
    f = lambda name: counters[name].double()  # noqa: E731
    return {
        "scalar": (f("scalar_ub_reads") + f("scalar_ub_writes")) * hw["scalar_ub_cycles"]
        + (f("scalar_gm_reads") + f("scalar_gm_writes")) * hw["scalar_gm_cycles"],
        "vector": f("vec_instrs") * hw["vec_issue_cycles"]
        + f("vec_repeats") * hw["vec_cycles_per_repeat"],
        "mte2": f("mte2_copies") * hw["mte_issue_cycles"] + f("mte2_bytes") / hw["mte_bytes_per_cycle"],
        "mte3": f("mte3_copies") * hw["mte_issue_cycles"] + f("mte3_bytes") / hw["mte_bytes_per_cycle"],
        "sync": f("pipe_barriers") * hw["barrier_cycles"]
        + (f("set_flags") + f("wait_flags") + 2 * f("queue_syncs")) * hw["flag_cycles"]
        + f("sync_alls") * hw["sync_all_cycles"] + f("dcci") * hw["dcci_cycles"],
    }


def launch_estimate(counters, hw: Profile) -> Dict[str, float]:
    """serial-pipe and overlapped-pipe estimates of one launch (us), and its busiest pipe."""
    import torch
    c = pipe_cycles(counters, hw)
    pipes = torch.stack([c["scalar"], c["vector"], c["mte2"], c["mte3"]])
    serial = (pipes.sum(0) + c["sync"]) / (hw["clock_ghz"] * 1e3)
    overlapped = (pipes.max(0).values + c["sync"]) / (hw["clock_ghz"] * 1e3)
    slowest = int(serial.argmax()) if serial.numel() else 0
    names = ("scalar", "vector", "mte2", "mte3")
    return {"serial_pipe_us": float(serial.max()) if serial.numel() else 0.0,
            "overlapped_pipe_us": float(overlapped.max()) if overlapped.numel() else 0.0,
            "busiest_pipe": names[int(pipes[:, slowest].argmax())] if serial.numel() else "-",
            "serial_per_block_us": serial.tolist(), "overlapped_per_block_us": overlapped.tolist()}


def gather_estimate(counters, hw: Profile, rows_per_core, row_bytes: int) -> Dict[str, float]:
    """The gather launch with the host link: each core's estimate plus its latency term
    (rows x host DMA latency / rows it keeps in flight, from the counters), and the whole launch no
    faster than its H2D bytes over the link. ``rows_per_core``: rows each core copied."""
    import torch
    est = launch_estimate(counters, hw)
    rows = torch.as_tensor(rows_per_core, dtype=torch.float64)
    in_flight = (counters["mte2_inflight_bytes_max"].double() / row_bytes).floor().clamp(min=1)
    latency_us = rows * hw["host_dma_latency_s"] * 1e6 / in_flight
    h2d = float(rows.sum()) * row_bytes
    link_us = h2d / hw["link_bytes_per_s"] * 1e6
    serial = torch.tensor(est["serial_per_block_us"], dtype=torch.float64) + latency_us
    overlapped = torch.maximum(torch.tensor(est["overlapped_per_block_us"], dtype=torch.float64),
                               latency_us)
    out = {}
    for name, per_block in (("serial_pipe", serial), ("overlapped_pipe", overlapped)):
        core_us = float(per_block.max()) if per_block.numel() else 0.0
        t = max(core_us, link_us)
        out[f"{name}_us"] = t
        out[f"{name}_gbps"] = h2d / (t * 1e-6) / 1e9 if t > 0 else 0.0
        out[f"{name}_decided_by"] = "link bandwidth" if link_us >= core_us else (
            "host DMA latency" if float(latency_us.max()) >= 0.5 * core_us else "busiest core")
    cores_us = float(overlapped.max()) if overlapped.numel() else 0.0
    out.update(cores_overlapped_pipe_us=cores_us,
               cores_overlapped_pipe_gbps=h2d / (cores_us * 1e-6) / 1e9 if cores_us > 0 else 0.0,
               h2d_bytes=h2d, link_us=link_us, latency_us_max=float(latency_us.max()),
               rows_in_flight_max=float(in_flight.max()),
               link_gbps=hw["link_bytes_per_s"] / 1e9)
    return out
