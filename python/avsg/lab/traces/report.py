"""Hit-rate reports: table, per-layer spread, JSON and a PNG plot (matplotlib, Agg, lazy)."""
from __future__ import annotations

import json
import os
import platform
from typing import Dict, Optional, Sequence

import numpy as np

from .replay import ReplayResult

__all__ = ["results_table", "layer_spread_table", "write_json", "plot_hit_rates", "build_report",
           "gap_table"]


def _by_key(results: Sequence[ReplayResult]):
    return {(r.policy, r.capacity): r for r in results}


def _order(results):
    pols, caps = [], []
    for r in results:
        if r.policy not in pols:
            pols.append(r.policy)
        if r.capacity not in caps:
            caps.append(r.capacity)
    return pols, sorted(caps)


def frac_of_belady(r: ReplayResult, results: Sequence[ReplayResult]) -> Optional[float]:
    b = _by_key(results).get(("belady", r.capacity))
    if b is None or b.total_hits == 0:
        return None
    return r.total_hits / b.total_hits


def results_table(results: Sequence[ReplayResult]) -> str:
    """policy x capacity: hit rate, MB moved per step (all layers), fraction of Belady's hits, time."""
    pols, caps = _order(results)
    by = _by_key(results)
    head = f"{'policy':<14s}" + "".join(f" | {'C=' + str(c):^30s}" for c in caps)
    sub = f"{'':<14s}" + "".join(f" | {'hit%':>7s} {'MB/step':>8s} {'%Bel':>6s} {'s':>5s}" for _ in caps)
    lines = [head, sub, "-" * len(sub)]
    for p in pols:
        row = f"{p:<14s}"
        for c in caps:
            r = by.get((p, c))
            if r is None:
                row += f" | {'':>30s}"
                continue
            fb = frac_of_belady(r, results)
            fbs = f"{100 * fb:6.1f}" if fb is not None else f"{'-':>6s}"
            row += f" | {100 * r.hit_rate:7.2f} {r.bytes_per_step / 1e6:8.3f} {fbs} {r.elapsed:5.1f}"
        lines.append(row)
    return "\n".join(lines)


def cost_table(results: Sequence[ReplayResult], costs: Dict) -> str:
    """Per (policy, capacity) with a counted plan: plan us per row-step (serial / overlapped
    pipe), misses and their link us per row-step, and the modelled step at batch 1 and 64."""
    lines = [f"{'policy':<14s} {'C':>6s} {'plan us':>8s} {'ovl us':>7s} {'miss/row':>8s} "
             f"{'link us':>8s} {'step B=1':>9s} {'step B=64':>10s}"]
    for r in results:
        c = costs.get((r.policy, r.capacity))
        if not c:
            continue
        lines.append(f"{r.policy:<14s} {r.capacity:6d} {c['plan_us_serial']:8.1f} "
                     f"{c['plan_us_overlapped']:7.1f} {c['misses_per_row_step']:8.1f} "
                     f"{c['link_us_per_row']:8.2f} {c['step_us_batch1']:9.1f} "
                     f"{c['step_us_batch64']:10.1f}")
    return "\n".join(lines)


def layer_spread_table(results: Sequence[ReplayResult]) -> str:
    """Per (policy, capacity): per-layer hit rate min / median / max and the worst layer."""
    lines = [f"{'policy':<14s} {'C':>6s} {'min%':>7s} {'median%':>8s} {'max%':>7s} {'worst layer':>11s}"]
    for r in results:
        pl = r.per_layer
        lines.append(f"{r.policy:<14s} {r.capacity:6d} {100 * pl.min():7.2f} {100 * np.median(pl):8.2f} "
                     f"{100 * pl.max():7.2f} {int(np.argmin(pl)):11d}")
    return "\n".join(lines)


def markdown_table(results: Sequence[ReplayResult]) -> str:
    """Markdown: one row per policy, hit rate (and % of Belady's hits) per capacity."""
    pols, caps = _order(results)
    by = _by_key(results)
    lines = ["| policy | " + " | ".join(f"C = {c}" for c in caps) + " |",
             "|---|" + "---:|" * len(caps)]
    for p in pols:
        cells = []
        for c in caps:
            r = by.get((p, c))
            if r is None:
                cells.append("")
                continue
            fb = frac_of_belady(r, results)
            cells.append(f"{100 * r.hit_rate:.2f}%" + (f" ({100 * fb:.1f}% of Belady)"
                                                        if fb is not None and p != "belady" else ""))
        lines.append(f"| {p} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def gap_table(results: Sequence[ReplayResult], name: str, policy: str = "avsg") -> str:
    """Markdown, one row per capacity: exact LRU, ``policy`` (the default residency policy), Belady,
    the share of the LRU -> Belady gap ``policy`` closes (overall, and on the layer where LRU does
    worst), and its largest per-layer loss against LRU. Wrapped in ``<!-- results:NAME -->``
    markers so the copies in README.md and docs/ can be checked against it. Needs lru, ``policy`` and belady."""
    by = _by_key(results)
    caps = sorted(c for p, c in by if p == policy and ("lru", c) in by and ("belady", c) in by)
    if not caps:
        raise ValueError(f"--tables: needs the policies lru, {policy} and belady at one capacity")

    def gap(lru: float, ours: float, bel: float) -> str:
        return f"{100 * (ours - lru) / (bel - lru):.1f}%" if bel > lru else "-"

    lines = [f"<!-- results:{name} -->",
             f"| C | lru | **{policy} (reuse)** | belady | LRU→Belady gap closed | worst layer (lowest "
             "LRU): LRU → reuse (Belady), gap closed | largest per-layer loss vs LRU |",
             "|---:|---:|---:|---:|---:|---|---:|"]
    for c in caps:
        lru, ours, bel = by[("lru", c)], by[(policy, c)], by[("belady", c)]
        w = int(np.argmin(lru.per_layer))
        lw, ow, bw = lru.per_layer[w], ours.per_layer[w], bel.per_layer[w]
        diff = 100 * (ours.per_layer - lru.per_layer)
        loss = (f"none (+{diff.min():.3f} pp)" if diff.min() > 0 else
                "0" if diff.min() == 0 else f"−{-diff.min():.3f} pp (L{int(np.argmin(diff))})")
        lines.append(f"| {c} | {100 * lru.hit_rate:.2f}% | **{100 * ours.hit_rate:.2f}%** | "
                     f"{100 * bel.hit_rate:.2f}% | {gap(lru.hit_rate, ours.hit_rate, bel.hit_rate)} | "
                     f"L{w}: {100 * lw:.2f} → {100 * ow:.2f} ({100 * bw:.2f}), {gap(lw, ow, bw)} | "
                     f"{loss} |")
    lines.append(f"<!-- /results:{name} -->")
    return "\n".join(lines) + "\n"


def build_report(results: Sequence[ReplayResult], trace_info: Dict, settings: Dict) -> Dict:
    out = {"trace": trace_info, "settings": settings,
           "machine": {"python": platform.python_version(), "platform": platform.platform(),
                       "cpus": os.cpu_count()},
           "results": []}
    for r in results:
        d = r.to_dict()
        fb = frac_of_belady(r, results)
        d["frac_of_belady_hits"] = fb
        out["results"].append(d)
    return out


def write_json(path: str, report: Dict) -> None:
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    with open(path, "w") as f:
        json.dump(report, f, indent=1)


def plot_hit_rates(results: Sequence[ReplayResult], path: str, title: str = "") -> str:
    """Hit rate against capacity, one line per policy; Belady drawn as the bound (shaded above
    nothing can go). Imports matplotlib lazily with the Agg backend."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise RuntimeError("plotting needs matplotlib (`pip install matplotlib`), or pass --no-plot") from e
    pols, caps = _order(results)
    by = _by_key(results)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for p in pols:
        xs = [c for c in caps if (p, c) in by]
        ys = [100 * by[(p, c)].hit_rate for c in xs]
        if p == "belady":
            ax.plot(xs, ys, "k--", lw=2.2, marker="s", label="belady (offline optimum)", zorder=5)
            ax.fill_between(xs, ys, [100] * len(xs), color="0.85", alpha=0.6, zorder=0,
                            label="above Belady: unreachable (demand paging)")
        else:
            ax.plot(xs, ys, marker="o", label=p)
    ax.set_xscale("log", base=2)
    ax.set_xticks(caps)
    ax.set_xticklabels([str(c) for c in caps])
    ax.set_xlabel("buffer capacity (entries per layer)")
    ax.set_ylabel("hit rate (%)")
    ax.set_title(title or "hit rate vs buffer capacity")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
