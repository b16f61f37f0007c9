"""When the hit/miss split pays: its price per layer step, and the rule that chooses it.

One piece of logic for two callers: the decode model (``avsg bench decode``, mode
``avsg-split``) prices the split with :func:`price`, and the serving core
(``SparseOffloadManager(split_policy=...)`` with ``step(split="auto")``) splits exactly when
:func:`choose_split` says so, from the same inputs. The numbers come in (``SplitProfile``):
this module knows no hardware; the lab's cost model builds a profile from its hardware profile
(``avsg.lab.costmodel.projection.split_profile``).

The price is docs/overlap.md section 5's. Per layer step, with ``t_L`` the cost of one launch,
``t_attn(n) = t_a0 + a·n`` sparse attention over ``n`` selections (summed over the step's
query tokens), ``t_copy(misses, C) = max(misses·row_bytes / link, misses·t_row / C)`` the copy
on ``C`` cores (``t_row``: one row's host read on one core, the DMA latency over the rows a
core keeps in flight), ``t_merge`` the LSE merge, ``P`` the AIV cores and ``A`` those the hits'
attention holds:

    unsplit  T1 = t_copy(misses, P) + t_attn(K_all)      (or unsplit_copy_s + t_attn(K_all))
    split    T2 = o·max(t_attn(K_hit), t_copy(misses, C)) + (1 - o)·(t_attn(K_hit) + t_copy(misses, C))
                  + t_attn(K_miss) + t_merge + n_L·t_L

``n_L`` is the launches the split adds (``launches``): ``SPLIT_LAUNCHES``, plus one where the
unsplit step runs the plan and its copy as one launch (``plan_gather``: the serving core's
default), since the split's copy runs on its own stream and leaves that launch
(``avsg.cache.manager.split_added_launches`` counts it from the manager's launch lists).

``o = 1`` only when the overlap is established (a measurement on the card and kernel in use, or
the model's premise "the cores allow it") **and** ``A + C <= P`` (section 4: two streams divide
the AI cores; nothing documented runs two kernels' blocks on one core). The plan is the same in
both and left out; a caller that prices the unsplit step as one launch whose copy runs beside
the end of its plan (the decode model, for ``plan_gather``) passes that copy as
``unsplit_copy_s``. ``K_miss``, the selections that read a miss, is taken at its upper bound
``min(T·misses, tokens·K)`` (every query token of a row selects every position the row
missed; exact at ``T = 1``): the hits' attention, which the copy may hide behind, is then never
overstated. The split is chosen only when ``T1 - T2 > 0``, so a caller that follows the rule
is never priced slower than without the split.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Dict, Optional

# The kernel launches the split adds per layer and pass beside an unsplit path that launches the
# plan and the gather apart (with one attention; where the unsplit path fuses them, the split adds
# the gather's own launch too: manager.split_added_launches): the hit/miss lists (one launch of the split_slots kernel, a kernel of its
# own: the plan kernel does not emit them), the second sparse attention call (over the misses)
# and the LSE merge (``npu_attention_update``). The serving step launches the first, the
# plugin's ``split_attention`` the other two (tests/integrations/test_vllm_ascend_upstream_standins.py
# counts them); the decode model prices them from here.
SPLIT_LAUNCHES = ("split_slots", "attention", "attention_update")


def _positive(name: str, value, whole: bool = False, allow_zero: bool = False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok and whole:
        ok = float(value).is_integer()
    if not ok or value < 0 or (value == 0 and not allow_zero):
        what = "a whole number" if whole else "a finite number"
        raise ValueError(f"{name}: expected {what} {'>= 0' if allow_zero else '> 0'}, got "
                         f"{value!r}")


@dataclasses.dataclass(frozen=True)
class SplitProfile:
    """The numbers the price reads, all per layer step; seconds, bytes, cores."""
    aiv_cores: int                    # P: physical AIV cores
    attention_cores: int              # A: AIV cores the hits' attention holds (an assumption)
    gather_cores: int                 # C: AIV cores the split's gather takes
    link_bytes_per_s: float           # host link, H2D
    row_bytes: int                    # one KV row of one layer
    row_latency_s: float              # t_row: one row's host read on one core
    attention_fixed_s: float          # t_a0: one attention call's fixed part
    attention_s_per_selection: float  # a: attention per selection (one query token, one row)
    merge_s_per_token: float          # t_merge per query token

    def __post_init__(self):
        for name in ("aiv_cores", "attention_cores", "gather_cores", "row_bytes"):
            _positive(name, getattr(self, name), whole=True)
        _positive("link_bytes_per_s", self.link_bytes_per_s)
        for name in ("row_latency_s", "attention_fixed_s", "attention_s_per_selection",
                     "merge_s_per_token"):
            _positive(name, getattr(self, name), allow_zero=True)
        if self.gather_cores > self.aiv_cores:
            raise ValueError(f"gather_cores: expected <= aiv_cores = {self.aiv_cores}, got "
                             f"{self.gather_cores}")

    def cores_allow_overlap(self) -> bool:
        """Section 4: the hits' attention and the gather run side by side only on disjoint
        cores."""
        return self.attention_cores + self.gather_cores <= self.aiv_cores


def copy_s(profile: SplitProfile, misses: float, cores: int) -> float:
    """The copy of ``misses`` rows on ``cores`` AIV cores: link- or per-core-latency-bound."""
    return max(misses * profile.row_bytes / profile.link_bytes_per_s,
               misses * profile.row_latency_s / cores)


def attention_s(profile: SplitProfile, selections: float) -> float:
    """One sparse attention call over ``selections`` selections: ``t_a0 + a·n``."""
    return profile.attention_fixed_s + profile.attention_s_per_selection * selections


@dataclasses.dataclass(frozen=True)
class SplitPrice:
    overlap: int          # o
    unsplit_s: float      # T1 (copy + attention)
    split_s: float        # T2 (copy + both attentions + merge + the split's launches)
    gain_s: float         # T1 - T2
    chosen: bool          # gain_s > 0
    launches: int         # launches the split adds when chosen (0 when not)

    def as_dict(self) -> Dict[str, float]:
        return dataclasses.asdict(self)


def price(profile: SplitProfile, rows: int, tokens_per_row: int, topk: int, misses: float,
          launch_s: float, overlap_established: bool,
          launches: Optional[int] = None, unsplit_copy_s: Optional[float] = None) -> SplitPrice:
    """One layer step of ``rows`` requests with ``tokens_per_row`` query tokens each (``topk``
    selections per token) copying ``misses`` rows in all, unsplit and split (module doc).
    ``launches``: the launches the split adds (default ``len(SPLIT_LAUNCHES)``: an unsplit path
    whose plan and gather are apart). ``unsplit_copy_s``: what the unsplit step's copy costs
    beside its plan, where the caller knows it (the decode model: avsg's one launch copies beside
    the end of its plan and pays a SyncAll); default: the whole copy on every core, after the
    plan."""
    if launches is None:
        launches = len(SPLIT_LAUNCHES)
    _positive("launches", launches, whole=True, allow_zero=True)
    _positive("rows", rows, whole=True, allow_zero=True)
    _positive("tokens_per_row", tokens_per_row, whole=True)
    _positive("topk", topk, whole=True)
    _positive("misses", misses, allow_zero=True)
    _positive("launch_s", launch_s, allow_zero=True)
    if not isinstance(overlap_established, bool):
        raise TypeError(f"overlap_established: expected a bool, got "
                        f"{type(overlap_established).__name__}")
    tokens = rows * tokens_per_row
    selections = tokens * topk
    miss_selections = min(tokens_per_row * misses, selections)
    o = int(overlap_established and profile.cores_allow_overlap())
    hit_attention = attention_s(profile, selections - miss_selections)
    copy_split = copy_s(profile, misses, profile.gather_cores)
    if unsplit_copy_s is None:
        unsplit_copy_s = copy_s(profile, misses, profile.aiv_cores)
    _positive("unsplit_copy_s", unsplit_copy_s, allow_zero=True)
    unsplit = unsplit_copy_s + attention_s(profile, selections)
    first = max(hit_attention, copy_split) if o else hit_attention + copy_split
    split = (first + attention_s(profile, miss_selections) + tokens * profile.merge_s_per_token
             + launches * launch_s)
    gain = unsplit - split
    chosen = rows > 0 and gain > 0
    return SplitPrice(overlap=o, unsplit_s=unsplit, split_s=split, gain_s=gain, chosen=chosen,
                      launches=launches if chosen else 0)


def choose_split(profile: SplitProfile, rows: int, tokens_per_row: int, topk: int,
                 misses: float, launch_s: float, overlap_established: bool,
                 launches: Optional[int] = None) -> bool:
    """The rule: split exactly where :func:`price` says the split is faster."""
    return price(profile, rows, tokens_per_row, topk, misses, launch_s,
                 overlap_established, launches).chosen


@dataclasses.dataclass
class SplitPolicy:
    """What a serving core needs to apply the rule on its own (``step(split="auto")``): the
    profile, the launch cost, whether the overlap is established on this card (never assumed:
    default False, so "auto" does not split until a measurement says the copy and the hits'
    attention really run side by side), and the expected misses per request and layer step
    (``None``: none, so the rule does not split until the caller gives them, e.g. from the
    decode model's replay or its own count of copied rows; the manager reads nothing from the
    device to decide)."""
    profile: SplitProfile
    launch_s: float
    overlap_established: bool = False
    expected_misses_per_row: Optional[float] = None

    def __post_init__(self):
        if not isinstance(self.profile, SplitProfile):
            raise TypeError(f"profile: expected a SplitProfile, got "
                            f"{type(self.profile).__name__}")
        _positive("launch_s", self.launch_s, allow_zero=True)
        if not isinstance(self.overlap_established, bool):
            raise TypeError(f"overlap_established: expected a bool, got "
                            f"{type(self.overlap_established).__name__}")
        if self.expected_misses_per_row is not None:
            _positive("expected_misses_per_row", self.expected_misses_per_row, allow_zero=True)

    def choose(self, rows: int, tokens_per_row: int, topk: int,
               misses_per_row: Optional[float] = None, launches: Optional[int] = None) -> bool:
        """:func:`choose_split` for ``rows`` requests, with ``misses_per_row`` (or, when None,
        ``expected_misses_per_row``; neither: 0). Without an established overlap ``o = 0`` and
        the rule never splits, whatever the misses (the copy on ``C <= P`` cores is no faster
        and the split adds work), so a caller need not measure them then."""
        per_row = self.expected_misses_per_row if misses_per_row is None else misses_per_row
        return choose_split(self.profile, rows, tokens_per_row, topk, (per_row or 0.0) * rows,
                            self.launch_s, self.overlap_established, launches)
