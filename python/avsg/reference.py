"""AVSG reference: the executable specification of plan, invalidate, reset and gather.

Every backend (the AscendC kernels run through the CPU emulation, the same kernels on the NPU)
must reproduce what this file computes, entry for entry and bit for bit. It is written as
batched, data-parallel PyTorch over rows, in the pass structure the vector kernels use; the only
sequential piece is the scalar dual-pointer baseline matcher, which is sequential by nature.

Memory layout (one int32 state row per request row, one state tensor per layer)
-------------------------------------------------------------------------------
A buffer with ``S`` slots and ``H`` hash buckets keeps, per row, one contiguous int32 region so a
vector core can move a row's whole state GM<->UB with a few DMA copies. Each section is padded to
a multiple of 64 int32 (one 256-byte vector repeat). ``bucket_slot`` and ``slot_life`` hold int16
entries, two per int32 word (entry ``2w`` in the low half of word ``w``: little-endian), in
``Hw = H/2`` and ``Lw = Sp/2`` words rounded up to 64: a slot id lies below ``S <= 2**15`` and a
life or age below 1024, and the index, the largest section, is what every plan loads whole, the
lives what every plan loads and stores whole::

    [0,        64)          header       the row's geometry and scalars (below)
    [64,       64+Hw)       bucket_slot  int16: slot the bucket names, -1 = never used
    [64+Hw,    64+Hw+Sp)    slot_pos     position held by each slot, -1 = free
    [.. +Sp,   .. +Lw)      slot_life    int16: lifetime of each slot: -1 free, 0 reclaimable, 1..L live
    [.. +Lw,   .. +Sp)      stash_key    overflow index: positions no probe bucket could take
    [.. ,      .. +Sp)      stash_slot   their slots
    reuse policy only (the lifetime and lru policies have none of these):
    [.. ,      .. +Sp)      slot_count   use count of the position each slot holds, 0..255
    [.. ,      .. +G)       ghost        counts of evicted positions: ``tag << 8 | count``
    [.. ,      .. +B)       block_heat   selection density per 64-position block, 0..255

    header[0] = HEADER_MAGIC   header[1] = S   header[2] = H   header[3] = L
    header[4] = policy (0 lifetime, 1 reuse, 2 lru)   header[5] = max_context (0: none given)
    header[6] = active capacity A (slots the row may occupy: ``[0, A)``; ``T*K <= A <= S``)
    header[7] = 0   header[8] = stash_count (stash entries in use)
    header[9] = steps since the counts were last halved (reuse)
    header[10] = the hand (lifetime: where the next tie search starts, below)   header[11:64] = 0

Every section is sized by the buffer (``S``, ``H``), never by the context: ``G = 2H`` ghost
entries and ``B = max(64, H / 16)`` heat blocks (both powers of two). Under the reuse policy
``slot_life`` holds the slot's *age* (steps since last use, -1 free, saturating at 1023)
instead of a lifetime. ``max_context`` is only a check: when given (``>= 1``) positions at or
beyond it are treated as -1 by ``plan`` under every policy; it is recorded in the header so a
state cannot be driven with another one.

Ghosts (reuse): position ``p`` owns ghost entry ``p mod G`` and its tag is ``p >> log2(G)``.
The entry holds ``tag << 8 | count``: an evicted position leaves its count there (overwriting
whatever another position left), and a miss takes it back when the tag is its own (else it starts
from 0, as a position never seen). Direct mapping by the low bits spreads a context's positions
evenly: up to ``G`` consecutive positions never collide, beyond that two positions ``G`` apart
share one entry and the later eviction wins. The heat of block ``b = p >> 6`` lives at
``b mod B``: blocks ``64 B`` positions apart share one heat counter (no tag: the heat halves every
step, so a shared counter only ever sums recent selections).

``Sp = roundup(S, 64)``. ``H`` is a power of two, ``64 <= H <= 2**15`` and ``H >= S``; the default
is ``H = next_pow2(2*S)`` (load factor <= 1/2, see "Index" below). ``reset`` writes the header;
``plan`` checks magic, ``S``, ``H`` and ``L`` against its arguments (and the active capacity
against ``[T*K, S]``) and ``invalidate`` the first three (it only frees slots, so any active
capacity is harmless to it), so a state cannot be driven with a geometry it was not built for (on CPU a mismatch raises
``ValueError`` naming the argument; the NPU kernels cannot raise, so they leave such a row
untouched and report ``miss_counts[r] = -1``, slots and miss lists ``-1``). ``plan`` writes
``header[8:16]`` only. A separate int64 ``stats [R, 4]`` tensor counts, per row: selections looked
up, selections that hit, selections that missed, unique positions fetched.

Whatever the state holds
------------------------
No content of a state row (or of a plan passed to ``gather``) can make an op touch memory outside
that row or return a slot outside ``[0, S)``: every value read from the state is brought into its
domain before it is used, the same way here and in the kernels (so they stay bit-exact on any
content, up to which slot is returned when ``slot_pos`` holds one position twice, which the
dual-pointer kernel may resolve differently):

* ``stash_count`` is clamped to ``[0, S]`` (and written back clamped); the stash never grows past
  ``S`` entries: misses that would overflow it stay resident but unindexed (a later step misses
  them again; this cannot happen to a state built by the ops);
* a slot read from ``bucket_slot`` or ``stash_slot`` is clamped to ``[0, S-1]`` before it
  addresses ``slot_pos`` or is returned (the stored value is kept; the insert's freeness test
  clamps ``bucket_slot`` to ``[-1, S-1]``, -1 meaning never used); a bucket is occupied only if
  the clamped slot holds a position that probes it, a stash entry is valid only if the clamped
  slot holds its key, so a clamped entry is simply free (stale) or names the one slot that
  really holds the position;
* the insert's freeness test clamps the position a bucket's slot holds to ``[-1, 2**24]`` (so
  the kernels can blend it in float exactly) before hashing it; the stash lookup compares keys
  exactly; a negative stash key never matches; an invalid selection (negative or past the bound) never matches a slot;
* every ``plan`` that writes a row (all but an idle row without a drop: "One plan step") sets
  the ``Sp - S`` padding entries of ``slot_pos`` and ``slot_life`` to -1, and
  the decay clamps every lifetime to ``[-1, L-1]`` before the hits are set to ``L``. Then every
  slot not hit in the step is a victim candidate, so reservation cannot run short (see
  "Allocate"), whatever ``slot_life`` held or whatever lifetime it was built with;
* ``invalidate`` drops ``slot_pos >= clamp(valid_len, -1, 2**24)``: positions ``>= 2**24`` are out
  of range and always dropped (a plan's drop likewise, except in an idle row given
  ``valid_len >= 2**24``, which the plan leaves whole: no selection can name such a position);
* ``gather`` clamps ``miss_counts`` to ``[0, T*K]`` and skips entries whose slot lies outside
  ``[0, S)`` or whose host row lies outside the pool (``check=True`` rejects both up front).

``check_state`` validates every invariant of a state (cheaply, vectorised over rows).

``slot_pos`` is the ground truth of residency: position ``p`` is resident in row ``r`` exactly
when ``slot_pos[r, s] == p`` for some ``s < S``, and then for exactly one ``s``. The hash table
and the stash are an index over it that makes the lookup a handful of vector gathers.

Index (hash table + stash)
--------------------------
* Hash. With ``H = 2**m``, ``lo = p mod H`` and ``hi = (p >> m) mod H``::

      h = (lo*A1 + hi*B1) mod H           first bucket
      d = ((lo*A2 + hi*B2) mod H) | 1     odd stride, so the probe sequence never cycles early
      bucket_i = (h + i*d) mod H,  i = 0 .. RETRIES      (R = 3 retries: 4 probes)

  ``A1, B1, A2, B2`` are fixed odd 32-bit constants reduced mod ``H``. This is the paper's
  multiplicative double hashing ``(a*x) mod H`` with a second limb: plain ``(a*x) mod H`` depends
  on ``x mod H`` only, so ``x`` and ``x+H`` would always collide. Keeping both limbs and both
  constants below ``2**15`` keeps every product below ``2**30``: int32 vector arithmetic never
  overflows, and the A2 overflow behaviour of ``Muls``/``Add`` (undocumented) never matters.
* A bucket keeps no key: its entry is whatever the slot it names holds. Bucket ``b`` is
  *occupied* when it names a slot (``bucket_slot[b] >= 0``) that holds a position ``q``
  (``q = slot_pos[bucket_slot[b]] >= 0``) whose probes include ``b``; otherwise it is *free*. When a slot is given to another position, or
  freed by invalidate/reset, every bucket naming it turns free at once (unless the new position
  happens to probe it too, and then it is a valid entry of that position), with no search for
  it: free buckets are reclaimed lazily, by the next insert that probes them. The stash keeps
  its keys: a stash entry is valid when its slot holds its key.
* Lookup of ``p``: the first probe bucket whose slot holds ``p`` (``slot_pos[bucket_slot[b]] ==
  p``); failing that, the first valid stash entry whose key is ``p``. The stash is scanned only
  in rows whose stash is non-empty. Since ``slot_pos`` holds a position at most once, this finds
  the one slot that holds ``p`` whenever ``p`` has an index entry, and every resident position
  has one. The index is two int32 per bucket fewer than a keyed table would need, and the
  kernels gather from ``bucket_slot`` and ``slot_pos`` only, which fit the Unified Buffer whole
  at S = 8192.
* Insert (the misses of one step, in miss-list order ``j``): a miss one of whose probe buckets
  already names the slot that now holds it (its slot was given back to it, or a bucket left by
  the slot's previous position happens to be one of its probes) is indexed already and placed
  nowhere else. Then 4 rounds; in round ``i`` every miss not yet placed proposes its bucket
  ``bucket_i``; a proposed bucket that is free goes to the smallest proposing ``j``. Misses
  still unplaced after the 4 rounds
  are appended to the stash in ``j`` order. The stash drops its stale entries (order kept) twice
  per step: before the victims are taken (else a freed slot handed back to the same position
  would revive a stale entry beside the new one) and before the append.
  A scalar loop over ``j`` inside each round gives the same result, which is what the kernel does.
* Why a stash: with 4 probes an adversary (or bad luck) can make all of a position's buckets
  hold positions pinned by the current step. The stash (capacity ``S``, never more than one
  valid entry per slot) makes insertion always succeed, so invariant 3 (miss-only) holds whatever
  the collisions. It is not small: at ``H = 2S`` about half the buckets hold a live entry, so
  about one miss in 16 finds all four probes taken, and an entry leaves only with its slot. On
  the shipped ``asyncio_32k`` trace (S 8192, H 16384, K 2048, one query token) a row's stash
  holds 98-130 entries on average after 128 steps (layers 0 and 1).

Lifetime and allocation (per slot, not per bucket)
--------------------------------------------------
The paper keeps an 8-bit lifetime in the bucket metadata. Here it lives per slot: the victim
search runs over slots, and a contiguous ``slot_life`` vector lets decay be one vector pass.
``1 <= L <= 255`` (the paper's 8-bit field).

One ``plan`` step, per row (all rows independently, all in parallel):

1. **Refresh.** Decay: lives are clamped to ``[-1, L+1]`` (a no-op on a state the ops built),
   a slot filled in the previous step (``L+1``, "fresh") drops to ``first_life(L) - 1``, every
   other slot with ``life > 0`` loses one: every life is now in ``[-1, L-1]``. Look up every valid selection
   (``0 <= pos < min(seq_len, 2**24)``; everything else is treated as ``-1``). Every hit sets its
   slot's life to ``L``. Hit slots are now exactly the slots with ``life == L``: every other slot
   decayed, so it is at most ``L-1``. That is the pinning of invariant 4, with no extra mask.
2. **Classify.** The missed positions of the step, over all ``T`` query tokens, are de-duplicated
   and sorted ascending: ``miss_pos[:M]``. ``M = miss_counts[r]``. Sorting by position orders the
   batch's miss list by (row, pos), as the gather partition wants, and makes host reads ascend.
3. **Allocate.** Victims are the ``M`` slots with the smallest ``(life, turn)`` among slots with
   ``life < L`` below the row's active capacity ``A`` (``resize``; the policies' score searches
   likewise treat slots ``>= A`` as pinned; ``A >= T*K`` keeps the count below valid): free slots first (life -1), then reclaimable ones (0), then, if there are too few,
   the oldest live ones. This is "decay further, oldest first, until enough are free", without
   rewriting the survivors' lifetimes. ``miss_pos[j]`` gets the ``j``-th victim; its slot gets
   ``slot_pos = miss_pos[j]`` and ``life = L+1`` (fresh: pinned like a hit for the rest of the
   step, and ranked as ``L`` by ``resize``), so at the next step's decay it holds
   ``first_life(L) - 1``: a fetched position starts ``PROBATION_STEPS`` (4) short of the life a
   hit gives, or at half of it when ``L < 8`` (``first_life(L) = L - min(4, L // 2)``). A
   position that has not been reused yet is likelier to be a one-off than one that has; on the
   shared traces this probation is worth 0.6-0.7 pp of hit rate at 4K and 0.1 pp at 8K
   (docs/hit_rate.md, which also says why ``L = 255`` is the default).
   There are always enough victims, whatever the state held: after the refresh every slot not
   hit has ``life <= L-1`` (the decay clamps), the hits of the step pin at most ``#distinct selections - M`` slots (a slot holds one position) and
   ``S >= T*K >= #distinct selections``.
   ``turn = (slot - hand) mod S`` orders slots of equal life from the row's *hand* (header word
   10, taken as 0 unless it lies in ``[0, A)``) round the buffer; when ``M > 0`` the hand moves to
   the slot after the last victim (mod ``A``). Slots whose lives ran out at the same step tie, and
   the hand takes them in turns instead of always from slot 0 up, so a slot just refilled is not
   the first to go again (on the shared traces this is worth 0.2-0.4 pp of hit rate at 8K).
   The misses are then inserted in the index as above.
4. **Output.** ``slots[t, k]`` is the slot of ``topk_pos[t, k]`` (hit or newly reserved), ``-1``
   where the selection was ``-1`` or out of range. ``miss_pos``/``miss_slots`` hold ``M`` entries
   then ``-1``.

5. **Split** (``split_slots``, derived from the outputs above, not a pass of the plan). For each
   query token, the slots of its *hits* (positions resident before this step's copies) and of its
   *misses* (slots this step's copy fills), each ``[R, T, K]``: valid entries first, in selection
   order, then ``-1``. A valid selection is a miss exactly when its slot is one of its row's
   ``miss_slots[r, :miss_counts[r]]``: the step pins every hit, so a hit's slot is never a
   victim, and every selection of a missed position reads that position's reserved slot. The
   ``T`` tokens of a row share their misses: a position missed for token 0 and selected again
   by token 1 is a miss for both (token 1 must wait for its copy too). Hits and misses of a
   token partition its valid selections (with ``check=False`` a repeated position is listed as
   often as it was selected, as attention over ``slots`` reads it), so attention over the hits
   and attention over the misses, merged by log-sum-exp, is attention over ``slots``.

An *idle* row, ``seq_len <= 0``, selects nothing and does not age: its outputs are ``-1`` and
``miss_counts[r] = 0``, its statistics stay as they are, and so does its state (no decay, no
clamps, the hand and the reuse step counter unchanged), except for its drop: with
``valid_lens[r] < 2**24`` the step frees what ``invalidate`` would and, as every step that
writes a row, the padding slots. So ``plan(valid_lens=...)`` equals ``invalidate`` then ``plan``
on every state the ops build. An engine's persistent batch keeps rows without a request, and
such a row costs the kernels its header, not a plan.

MTP: the ``T`` query tokens of a row are one set of lookups against one table, so a later token
that selects what an earlier token missed shares the reserved slot (invariant 2) and the position
is fetched once. ``invalidate(valid_lens)`` frees every slot whose position is ``>= valid_lens``:
speculative positions can never produce a false hit, because residency is ``slot_pos`` itself.
``plan(..., valid_lens=...)`` runs that drop at the start of the step, in the same launch (the
serving path's one launch per layer and pass): equal to ``invalidate`` then ``plan``.

Residency policies
------------------
The header records the policy; ``plan`` checks it (and ``max_context``) like the geometry.

* ``lifetime`` (the AVSG paper's, with the hand and a probation for fetched positions; the
  default): above. Entries not hit for ``L`` steps all tie at lifetime 0 and leave in hand order;
  at the default ``L = 255`` (the 8-bit maximum) that is rare, so it ranks slots by the steps
  since their last use, as exact LRU does, with the probation on top: on the shared traces it
  hits more than exact LRU at 4K, 8K and 16K, and on every layer within 0.02 pp of it or above.
  Its plan is the cheapest of the three, and a step's cost is plan + copies: at 8K it has the
  lowest modelled step cost of the three on both shared traces, at batch 1 and 64.
* ``reuse``: evict what is least likely to be reused, judged by how often the position
  was selected, how long ago, and how densely the step selects its neighbourhood. Per step, per
  row (``_reuse_refresh``, ``reuse_scores``, ``lowest_scores``, ``_reuse_install``):

  1. every age grows by one (saturating at 1023; free slots stay -1); every heat halves;
  2. lookup as above; a hit sets the slot's age to 0 (which pins it: every other live slot is
     at least 1) and raises its count once per step, whatever ``T``: by 2 if it was not used in
     the previous step (a return: its age, one step older, is above 1), else by 1 (a streak:
     the same use continuing);
  3. every used position (hits and misses) adds one to the heat of its 64-position block;
  4. score every slot: ``log8(count) + log4(heat[(pos >> 6) mod B]) - log8(age)``, with
     ``log8(x) ≈ 8·log2(1+x)`` and ``log4(x) ≈ 4·log2(1+x)`` read from float32 bits (exact
     integer arithmetic); free slots score -128, pinned ones 127. The ``M`` misses take the
     ``M`` lowest ``(score, slot)``: threshold by search over the score range (compare + count
     passes; the kernel counts 7 thresholds per pass: 3 passes), then all slots below it and the first ties (a prefix count of the tie
     mask), in ascending slot order; misses ascending by position go to them in that order;
  5. an evicted position's count stays behind as a ghost (it survives eviction while no other
     position takes its ghost entry); a miss takes its ghost's count back plus 2 (a miss is
     always a return: a position used in the previous step is still resident); every 256 steps
     all counts (ghosts included) halve.

  Why returns count double: what Belady keeps and LRU drops are positions that come back after
  a gap. A position selected in a long unbroken run (the step's own neighbourhood, a sink) is
  resident, pinned, while the run lasts; how long the run was says less about a later return
  than how often the position has already returned. Measured on ``asyncio_32k`` (the tuning
  trace), this lifts the gap closed at 8192 from 25.6% to 26.1%; gains of 3 for a return are
  within 0.1 of 2 (docs/hit_rate.md).

  No sort of the slots and no per-access lists: O(S) vector passes, O(M) scalar updates,
  O(B) for the heat; the state is O(S + H) per row whatever the context. ``invalidate`` also
  zeroes the counts of the slots it frees and every ghost of a position ``>= valid_len``, so a
  rejected MTP draft leaves no count behind; the heat, shared by a block's valid positions and
  halved every step, is kept.
  Whatever the state holds, counts and heat are clamped to ``[0, 255]`` and ages to
  ``[-1, 1023]`` where read, a ghost's count is its low 8 bits (a negative word never matches
  a tag), and a held position is clamped to ``>= 0`` before its block addresses the heat.
  With ``T > 1`` (MTP), "the previous step" is the previous ``plan`` call: a rejected draft's
  selection of a valid position counts as a use (it was selected by a real query), so that
  position's next use continues a streak rather than returning.
* ``lru``: exact least recently used at step granularity, the reference point (no
  per-position state). Ages as in ``reuse`` (``_reuse_refresh``); every
  slot scores ``-age`` (free ``-1024``, used this step ``1``) and the misses take the lowest
  ``(score, slot)`` with ``lowest_scores``. Ages saturate at 1023 steps, beyond
  which entries tie and go by slot; ties within a step go by slot too, where the trace lab's
  numpy ``lru`` breaks them by position. ``invalidate`` frees slots as under ``lifetime``.

Gather
------
Miss ``j`` of row ``r`` copies host row ``hr`` of every ``src`` into slot ``miss_slots[r, j]`` of the
matching ``dst``. ``hr = pos`` for a contiguous pool ``[R, max_len, ...]`` (row ``r`` of the pool) and
``hr = block_table[r, pos // bs] * bs + pos % bs`` for a paged pool ``[num_blocks, bs, ...]``.
The work is split over ``C`` cores three ways (the copies are identical; only who does which differs):

* ``miss`` (S3): the batch's misses in (row, pos) order, cut into ``C`` contiguous chunks;
  chunk ``c`` is ``[c*total//C, (c+1)*total//C)``, so sizes differ by at most one.
* ``request`` (S1): all misses of row ``r`` go to core ``r mod C``.
* ``topk`` (S2): the fixed ``R*T*K`` miss-list entries, padding included, cut into ``C`` equal
  chunks the same way; padding entries (hits) are no-ops, so work follows the selection layout.
"""
from __future__ import annotations

from typing import List, NamedTuple, Optional, Sequence

import torch

RETRIES = 3
PROBES = 1 + RETRIES
VECTOR_INT32 = 64                      # int32 lanes in one 256-byte vector repeat
MAX_POSITION = 1 << 24                 # positions >= this are out of range (float-exact keys)
MAX_BUCKETS = 1 << 15                  # keeps hash products below 2**30
MAX_LIFETIME = 255
#: the lifetime policy's default L (docs/hit_rate.md: tuned on asyncio_32k, held out on debian)
DEFAULT_LIFETIME = 255
#: a position fetched on a miss starts this many steps short of a hit's life (``first_life``)
PROBATION_STEPS = 4
INT32_MAX = (1 << 31) - 1
STATE_HEADER = 64                      # int32 words of the per-row header
HEADER_MAGIC = 0x41565334              # "AVS4": a row written by reset, layout version 4
#: (version 2 kept bucket_slot as int32, version 1 also a bucket_key section before it; such rows
#: fail the magic check)
HEADER_MAGIC_WORD, HEADER_CAPACITY, HEADER_BUCKETS, HEADER_LIFETIME = range(4)
HEADER_POLICY, HEADER_MAX_CONTEXT = 4, 5
HEADER_ACTIVE = 6                      # active capacity: resident slots all lie below it (resize)
HEADER_STASH_COUNT = 8                 # its own 32-byte block: plan rewrites [8, 16) only
HEADER_STEP = 9                        # reuse policy: steps since the counts were last halved
HEADER_HAND = 10                       # lifetime policy: the slot its next tie search starts at


def first_life(lifetime: int) -> int:
    """The life a position fetched on a miss starts with under the lifetime policy, as its first
    decay sees it (the slot holds the fresh mark ``L+1`` until then): ``PROBATION_STEPS`` short of
    a hit's, or half a hit's (rounded up) when ``L`` is below ``2 * PROBATION_STEPS``."""
    return lifetime - min(PROBATION_STEPS, lifetime // 2)


# Residency policies: the id is stored in the header (word 4) so ops check it.
POLICY_IDS = {"lifetime": 0, "reuse": 1, "lru": 2}
#: the buffer's default: the cheapest modelled step (plan + link) on both shared traces; see
#: "Residency policies" above and docs/hit_rate.md
DEFAULT_POLICY = "lifetime"
POLICY_NAMES = {v: k for k, v in POLICY_IDS.items()}
REUSE_AGE_MAX = 1023                   # steps since last use saturate here (log8 <= 80)
REUSE_COUNT_MAX = 255                  # per-position use counts saturate here (log8 <= 64)
REUSE_HEAT_MAX = 255                   # per-block heat saturates here (log4 <= 32)
REUSE_BLOCK_LOG = 6                    # heat blocks of 64 positions
REUSE_HALVE_EVERY = 256                # counts are halved every this many steps
REUSE_GAIN_STREAK = 1                  # count gain of a use in the step after another use
REUSE_GAIN_RETURN = 2                  # ... and of a return after at least one step away
GHOST_COUNT_BITS = 8                   # a ghost entry: tag << 8 | count
GHOST_COUNT_MASK = (1 << GHOST_COUNT_BITS) - 1
HEAT_BLOCKS_PER_BUCKET_LOG = 4         # B = H / 16 heat blocks (at least one vector repeat)
SCORE_FREE = -128                      # below every real score (>= -80): free slots go first
SCORE_PINNED = 127                     # above every real score (<= 96): never a victim
LRU_SCORE_FREE = -REUSE_AGE_MAX - 1    # lru scores are -age: free below every real one
LRU_SCORE_PINNED = 1                   # and used this step above

HASH_A1 = 0x9E3779B1
HASH_B1 = 0x85EBCA77
HASH_A2 = 0xC2B2AE3D
HASH_B2 = 0x27D4EB2F

STAT_LOOKUPS, STAT_HITS, STAT_MISSES, STAT_FETCHED = range(4)
STAT_NAMES = ("lookups", "hits", "misses", "fetched")

PARTITIONS = ("miss", "request", "topk")
# The paper's S2: the R*N selection layout (selection_layout) split into equal chunks, hits no-ops.
# Apart from PARTITIONS because it reads the miss list in another layout.
SELECTION_PARTITION = "selection"
ALL_PARTITIONS = PARTITIONS + (SELECTION_PARTITION,)


def round_up(x: int, multiple: int) -> int:
    return (x + multiple - 1) // multiple * multiple


def default_buckets(capacity: int) -> int:
    """``next_pow2(2 * capacity)``, at least one vector repeat, at most ``MAX_BUCKETS``."""
    buckets = VECTOR_INT32
    while buckets < 2 * capacity and buckets < MAX_BUCKETS:
        buckets *= 2
    return buckets


def ghost_entries(buckets: int) -> int:
    """``G``: ghost entries of a reuse row (a power of two, two per bucket). With ``G = H`` the
    later of two positions ``H`` apart overwrites the other's count often enough to cost 0.06 pp
    of hits at 8192 slots on both shared traces (32K contexts); ``2H`` holds them apart there."""
    return 2 * buckets


def heat_entries(buckets: int) -> int:
    """``B``: heat blocks of a reuse row (a power of two, at least one vector repeat)."""
    return max(VECTOR_INT32, buckets >> HEAT_BLOCKS_PER_BUCKET_LOG)


class Layout(NamedTuple):
    """Section offsets (in int32 elements) of one row of the state tensor. ``reuse``: the row
    holds the reuse policy's sections (sized by ``S`` and ``H`` only); ``max_context`` is the
    bound recorded in the header (0: none), never a size."""

    capacity: int
    buckets: int
    max_context: int = 0
    reuse: bool = False

    @property
    def ghosts(self) -> int:
        """``G`` ghost entries (0 without the reuse sections)."""
        return ghost_entries(self.buckets) if self.reuse else 0

    @property
    def ghost_log(self) -> int:
        return ghost_entries(self.buckets).bit_length() - 1

    @property
    def heat_blocks(self) -> int:
        """``B`` heat blocks (0 without the reuse sections)."""
        return heat_entries(self.buckets) if self.reuse else 0

    @property
    def padded_capacity(self) -> int:
        return round_up(self.capacity, VECTOR_INT32)

    @property
    def header(self) -> int:
        return 0

    @property
    def bucket_slot(self) -> int:
        return STATE_HEADER

    @property
    def bucket_words(self) -> int:
        """int32 words of ``bucket_slot``: ``H`` int16 entries, rounded up to 64 words."""
        return round_up(self.buckets // 2, VECTOR_INT32)

    @property
    def slot_pos(self) -> int:
        return STATE_HEADER + self.bucket_words

    @property
    def slot_life(self) -> int:
        return self.slot_pos + self.padded_capacity

    @property
    def life_words(self) -> int:
        """int32 words of ``slot_life``: ``Sp`` int16 entries, rounded up to 64 words."""
        return round_up(self.padded_capacity // 2, VECTOR_INT32)

    @property
    def stash_key(self) -> int:
        return self.slot_life + self.life_words

    @property
    def stash_slot(self) -> int:
        return self.stash_key + self.padded_capacity

    @property
    def slot_count(self) -> int:
        return self.stash_key + 2 * self.padded_capacity

    @property
    def ghost(self) -> int:
        return self.slot_count + (self.padded_capacity if self.reuse else 0)

    @property
    def block_heat(self) -> int:
        return self.ghost + self.ghosts

    @property
    def stash_count(self) -> int:
        return HEADER_STASH_COUNT

    @property
    def width(self) -> int:
        return self.block_heat + self.heat_blocks


class StateView(NamedTuple):
    """Named, writable views into a state tensor ``[R, Layout.width]`` (unpadded lengths)."""

    bucket_slot: torch.Tensor     # [R, H] int16
    slot_pos: torch.Tensor        # [R, S]
    slot_life: torch.Tensor       # [R, S] int16
    stash_key: torch.Tensor       # [R, S]
    stash_slot: torch.Tensor      # [R, S]
    stash_count: torch.Tensor     # [R]
    header: torch.Tensor          # [R, 4]: magic, capacity, buckets, lifetime
    slot_count: torch.Tensor      # [R, Sp] (padding included) or [R, 0]: reuse policy only
    ghost: torch.Tensor           # [R, G]: tag << 8 | count of evicted positions
    block_heat: torch.Tensor      # [R, B]
    active: torch.Tensor          # [R]: the active capacity (header word 6)
    hand: torch.Tensor            # [R]: the lifetime policy's hand (header word 10)


def view_state(state: torch.Tensor, layout: Layout) -> StateView:
    S, H = layout.capacity, layout.buckets
    has_policy_state = layout.reuse
    return StateView(
        bucket_slot=state[:, layout.bucket_slot:layout.bucket_slot + H // 2].view(torch.int16),
        slot_pos=state[:, layout.slot_pos:layout.slot_pos + S],
        slot_life=life_entries(state, layout)[:, :S],
        stash_key=state[:, layout.stash_key:layout.stash_key + S],
        stash_slot=state[:, layout.stash_slot:layout.stash_slot + S],
        stash_count=state[:, layout.stash_count],
        header=state[:, :HEADER_LIFETIME + 1],
        slot_count=state[:, layout.slot_count:layout.slot_count + (
            layout.padded_capacity if has_policy_state else 0)],
        ghost=state[:, layout.ghost:layout.ghost + layout.ghosts],
        block_heat=state[:, layout.block_heat:layout.block_heat + layout.heat_blocks],
        active=state[:, HEADER_ACTIVE],
        hand=state[:, HEADER_HAND],
    )


def life_entries(state: torch.Tensor, layout: Layout) -> torch.Tensor:
    """int16 ``[R, Sp]``: ``slot_life`` with its padding entries (a writable view)."""
    Sp = layout.padded_capacity
    return state[:, layout.slot_life:layout.slot_life + Sp // 2].view(torch.int16)


def lifetime_hand(v: StateView) -> torch.Tensor:
    """int64 ``[R]``: where each row's lifetime tie search starts, the hand word when it lies in
    ``[0, A)`` and 0 otherwise (whatever the state holds, the rotation stays a permutation)."""
    hand = v.hand.to(torch.int64)
    return torch.where((hand >= 0) & (hand < v.active.to(torch.int64)), hand, torch.zeros_like(hand))


def new_state(rows: int, layout: Layout, lifetime: int, device="cpu",
              policy: str = "lifetime") -> torch.Tensor:
    state = torch.empty(rows, layout.width, dtype=torch.int32, device=device)
    reset(state, layout, torch.ones(rows, dtype=torch.bool, device=device), lifetime, policy)
    return state


def policy_id(policy: str, layout: Layout) -> int:
    """The header's policy word; ``ValueError`` when the layout does not fit the policy (the
    reuse policy's sections exist exactly in a reuse layout)."""
    if policy not in POLICY_IDS:
        raise ValueError(f"policy: expected one of {tuple(POLICY_IDS)}, got {policy!r}")
    if (policy == "reuse") != layout.reuse:
        raise ValueError(f"policy {policy!r}: the state layout "
                         f"{'holds' if layout.reuse else 'lacks'} the reuse policy's sections")
    if not 0 <= layout.max_context <= MAX_POSITION:
        raise ValueError(f"max_context: expected 0 (none) .. {MAX_POSITION}, got "
                         f"{layout.max_context}")
    return POLICY_IDS[policy]


def reset(state: torch.Tensor, layout: Layout, row_mask: torch.Tensor, lifetime: int,
          policy: str = "lifetime") -> None:
    """Forget everything the masked rows hold: the whole row returns to empty, and its header is
    (re)written with this geometry. It reads nothing from the row, so it also repairs any row."""
    fresh = torch.empty(layout.width, dtype=torch.int32, device=state.device)
    fresh.fill_(-1)
    fresh[:STATE_HEADER] = 0
    fresh[HEADER_MAGIC_WORD] = HEADER_MAGIC
    fresh[HEADER_CAPACITY] = layout.capacity
    fresh[HEADER_BUCKETS] = layout.buckets
    fresh[HEADER_LIFETIME] = lifetime
    fresh[HEADER_POLICY] = policy_id(policy, layout)
    fresh[HEADER_MAX_CONTEXT] = layout.max_context
    # A reset row gets the whole allocation back: reset reads nothing from the row (that is what
    # lets it repair any row), so it cannot keep an active capacity it would have to trust.
    fresh[HEADER_ACTIVE] = layout.capacity
    fresh[layout.stash_slot:layout.stash_slot + layout.padded_capacity] = 0
    fresh[layout.slot_count:] = 0                 # counts, ghosts, heat (reuse) start at 0
    state[row_mask] = fresh


def check_header(state: torch.Tensor, layout: Layout, lifetime: Optional[int] = None,
                 policy: Optional[str] = None, min_active: Optional[int] = None) -> None:
    """Raise ``ValueError`` naming the argument when a row's header disagrees with the geometry
    (and lifetime, policy) an op was called with. ``min_active``: the active capacity must lie in
    ``[min_active, S]`` (plan passes ``T*K``: below it a step's selections might not fit)."""
    header = state[:, :HEADER_MAX_CONTEXT + 1]
    bad = header[:, HEADER_MAGIC_WORD] != HEADER_MAGIC
    if bool(bad.any()):
        r = int(bad.nonzero()[0, 0])
        raise ValueError(f"state: row {r} holds no AVSG state header (word 0 = "
                         f"{int(header[r, 0]):#x}, expected {HEADER_MAGIC:#x}): build the state "
                         f"with reset")
    expected = [("capacity", HEADER_CAPACITY, layout.capacity),
                ("buckets", HEADER_BUCKETS, layout.buckets),
                ("max_context", HEADER_MAX_CONTEXT, layout.max_context)]
    if lifetime is not None:
        expected.append(("lifetime", HEADER_LIFETIME, lifetime))
    if policy is not None:
        expected.append(("policy", HEADER_POLICY, policy_id(policy, layout)))
    for name, word, value in expected:
        bad = header[:, word] != value
        if bool(bad.any()):
            r = int(bad.nonzero()[0, 0])
            built, got = int(header[r, word]), value
            if name == "policy":
                built, got = POLICY_NAMES.get(built, built), POLICY_NAMES[value]
            raise ValueError(f"{name}: the state was built with {built!r}, got {got!r} "
                             f"(state row {r})" if name == "policy" else
                             f"{name}: the state was built with {built}, got {got} (state row {r})")
    if min_active is not None:
        active = state[:, HEADER_ACTIVE]
        bad = (active < min_active) | (active > layout.capacity)
        if bool(bad.any()):
            r = int(bad.nonzero()[0, 0])
            raise ValueError(f"state: row {r} records an active capacity of {int(active[r])}, "
                             f"expected one in [{min_active}, {layout.capacity}] (T*K .. S)")


def invalidate(state: torch.Tensor, layout: Layout, valid_lens: torch.Tensor) -> None:
    """Free every slot whose position is ``>= valid_lens[row]``; its index entries go stale.

    Reuse policy: what a rejected draft did to the counts is undone for the positions it
    wrote: the counts of the freed slots and every ghost of a position ``>= valid_lens`` (its
    tag and entry give the position) return to 0, so a speculative position fetched, hit or
    counted before rejection starts from nothing when the real token arrives. Counts of positions below ``valid_lens`` that rejected draft tokens
    selected are kept (they are real positions, selected by a real indexer query), and so is
    the heat (it halves every step; a block's heat is shared with valid positions)."""
    check_header(state, layout)
    _drop_past(view_state(state, layout), layout, valid_lens)


def _drop_past(v: StateView, layout: Layout, valid_lens: torch.Tensor) -> None:
    """invalidate's drop, on a state whose header was checked (``plan(valid_lens=...)`` runs it
    first, after its own, stricter check)."""
    limit = valid_lens.to(torch.int64).clamp(-1, MAX_POSITION).to(torch.int32)
    drop = v.slot_pos >= limit[:, None]
    v.slot_pos.masked_fill_(drop, -1)
    v.slot_life.masked_fill_(drop, -1)
    if layout.reuse:
        v.slot_count[:, :layout.capacity].masked_fill_(drop, 0)
        v.ghost.masked_fill_(ghost_positions(v.ghost, layout) >= limit[:, None], 0)


def drop_entries(state: torch.Tensor, layout: Layout, slots: torch.Tensor,
                 positions: Optional[torch.Tensor] = None) -> None:
    """Free slot ``slots[r, j]`` of row ``r`` where it still holds ``positions[r, j]`` (every
    named slot when ``positions`` is None); entries ``< 0`` or ``>= S`` name nothing. Freed as
    ``invalidate`` frees (the index entries go stale; reuse: the slot's count returns to 0).

    This is how ``SparseKVBuffer`` forgets what a plan reserved when no copy filled it (a
    refused or missing ``gather``): the slots are the plan's ``miss_slots``, the positions its
    ``miss_pos``. Fixed-shape tensor work on the state's device (no host sync, no header
    check: it only ever frees slots, which no state content can make unsafe)."""
    v = view_state(state, layout)
    R, S = v.slot_pos.shape
    named = (slots >= 0) & (slots < S)
    column = torch.where(named, slots, S).long()           # column S: a spare that is never read
    held = torch.cat([v.slot_pos, v.slot_pos.new_full((R, 1), -1)], 1).gather(1, column)
    if positions is not None:
        named &= (positions >= 0) & (held == positions)
    drop = torch.zeros(R, S + 1, dtype=torch.bool, device=state.device)
    drop.scatter_(1, torch.where(named, column, S), True)
    drop = drop[:, :S]
    v.slot_pos.masked_fill_(drop, -1)
    v.slot_life.masked_fill_(drop, -1)
    if layout.reuse:
        v.slot_count[:, :S].masked_fill_(drop, 0)


def ghost_positions(ghost: torch.Tensor, layout: Layout) -> torch.Tensor:
    """The position each ghost entry names: ``tag * G + entry`` (int64; negative for an entry
    no op writes, whose tag is negative)."""
    tag = (ghost >> GHOST_COUNT_BITS).to(torch.int64)
    entry = torch.arange(ghost.shape[-1], device=ghost.device, dtype=torch.int64)
    return (tag << layout.ghost_log) + entry


def ghost_pack(pos: torch.Tensor, count: torch.Tensor, layout: Layout):
    """Entry index and packed value of the ghost ``pos`` (``>= 0``) leaves with ``count``."""
    pos = pos.to(torch.int64)
    entry = pos & (layout.ghosts - 1)
    value = ((pos >> layout.ghost_log) << GHOST_COUNT_BITS) | count.to(torch.int64)
    return entry, value.to(torch.int32)


def ghost_count(ghost: torch.Tensor, pos: torch.Tensor, layout: Layout) -> torch.Tensor:
    """Count the ghost table remembers for each ``pos`` (``>= 0``; rows of ``ghost`` match rows
    of ``pos``): the entry's count when its tag is ``pos``'s, else 0."""
    pos = pos.to(torch.int64)
    e = ghost.gather(1, (pos & (layout.ghosts - 1)).reshape(pos.shape[0], -1)).view(pos.shape)
    mine = (e >> GHOST_COUNT_BITS).to(torch.int64) == (pos >> layout.ghost_log)
    return torch.where(mine, e & GHOST_COUNT_MASK, torch.zeros_like(e))


def heat_block(pos: torch.Tensor, layout: Layout) -> torch.Tensor:
    """Heat entry of each position's 64-position block (``pos`` clamped to ``>= 0`` first)."""
    return (pos.clamp(min=0) >> REUSE_BLOCK_LOG) & (layout.heat_blocks - 1)


def resize_width(capacity: int) -> int:
    """Entries per row of ``resize``'s move lists. A shrink to ``c`` moves only survivors held at
    or past ``c`` into free slots below it: at most ``min(c, S - c) <= S // 2`` of them."""
    return max(1, capacity // 2)


def eviction_order(v: StateView, layout: Layout, r: int, lifetime: int,
                   policy: str) -> torch.Tensor:
    """The occupied slots of row ``r``, first victim first, as ``plan`` ranks them for its
    misses, with nothing pinned (``resize`` runs between steps, where no slot is in use) and the
    state taken as it stands (no decay or ageing: ``resize`` is not a step).

    lifetime: ``(life, (slot - hand) mod S)``, ties from ``plan``'s hand on; lru:
    ``(-age, slot)``, oldest first; reuse: ``(score, slot)`` with ``reuse_scores``' formula, a slot used in the last step (age 0) scored like any other.
    Values are clamped to their domains first, as everywhere ("Whatever the state holds")."""
    S = layout.capacity
    life = v.slot_life[r]
    if policy == "lifetime":
        turn = (torch.arange(S, device=life.device) - lifetime_hand(v)[r]) % S
        rank = life.clamp(-1, lifetime).to(torch.int64) * S + turn
    else:
        age = life.clamp(0, REUSE_AGE_MAX).to(torch.int64)
        if policy == "lru":
            rank = -age
        else:
            count = v.slot_count[r, :S].clamp(0, REUSE_COUNT_MAX)
            block = heat_block(v.slot_pos[r], layout)
            heat = v.block_heat[r].gather(0, block.long()).clamp(0, REUSE_HEAT_MAX)
            rank = (log8(count) + log4(heat) - log8(age)).to(torch.int64)
    occupied = v.slot_pos[r] >= 0
    rank = torch.where(occupied, rank, torch.full_like(rank, INT32_MAX))
    order = torch.argsort(rank, stable=True)          # stable: ties go by slot
    return order[:int(occupied.sum())]


def resize(state: torch.Tensor, layout: Layout, rows: torch.Tensor, capacities: torch.Tensor,
           lifetime: int, policy: str, min_active: int):
    """Set the active capacity of row ``rows[i]`` to ``capacities[i]`` (int64 ``[n]`` each).

    A row's resident slots always lie below its active capacity ``A`` (header word 6), so a
    paged device pool can lend the slots past it to other requests. Run between steps: nothing is
    pinned there. Per row, with ``c`` the new capacity:

    * grow (``c >= A``): ``A = c``; the new slots are empty;
    * shrink (``c < A``): evict ``occupied - c`` positions (when positive) in ``eviction_order``,
      exactly as ``plan`` evicts (the reuse policy leaves each evicted count as a ghost);
      then every survivor held in a slot ``>= c`` (ascending slot order) moves into the lowest free
      slot ``< c`` (ascending), keeping its position, life/age and count; the moved positions are
      re-indexed as ``plan`` inserts its misses (stale stash entries dropped first, then the probe
      rounds in move order, the rest to the stash). Their old index entries name a slot that is
      now free, so they are stale. Slots ``>= c`` end free whatever the state held.

    Returns int32 ``(src_slots, dst_slots, move_counts)``: ``[R, W]``, ``[R, W]`` and ``[R]``,
    ``W = resize_width(S)``; row ``r``'s first ``move_counts[r]`` entries say slot
    ``src_slots[r, j]`` moved to ``dst_slots[r, j]``, the rest are -1 (and rows not resized have
    none). Sources are ``>= c`` and destinations ``< c``, so the KV rows can be copied with
    ``gather`` using the device buffer as both the pool (host row = source slot) and the
    destination. Stats are not touched.

    Bad input raises ``ValueError`` naming the argument before anything changes: a row outside
    ``[0, R)`` or listed twice, a capacity outside ``[min_active, S]`` (``min_active = T*K``), a
    header that does not match."""
    R = state.shape[0]
    S = layout.capacity
    rows = rows.to(torch.int64).cpu()
    capacities = capacities.to(torch.int64).cpu()
    if rows.shape != capacities.shape or rows.dim() != 1:
        raise ValueError(f"capacities: expected the shape of rows {tuple(rows.shape)} (1-D), got "
                         f"{tuple(capacities.shape)}")
    if bool(((rows < 0) | (rows >= R)).any()):
        i = int(((rows < 0) | (rows >= R)).nonzero()[0, 0])
        raise ValueError(f"rows[{i}] = {int(rows[i])}: expected a row in [0, {R})")
    if rows.unique().numel() != rows.numel():
        raise ValueError(f"rows: a row is listed twice ({rows.tolist()}); each row takes one capacity")
    bad = (capacities < min_active) | (capacities > S)
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        raise ValueError(f"capacities[{i}] = {int(capacities[i])}: expected a capacity in "
                         f"[{min_active}, {S}] (T*K .. S, the allocated slots)")
    check_header(state, layout, lifetime, policy, min_active=min_active)
    W = resize_width(S)
    dev = state.device
    src = torch.full((R, W), -1, dtype=torch.int32, device=dev)
    dst = torch.full((R, W), -1, dtype=torch.int32, device=dev)
    counts = torch.zeros(R, dtype=torch.int32, device=dev)
    for r, c in zip(rows.tolist(), capacities.tolist()):
        if c >= int(state[r, HEADER_ACTIVE]):
            state[r, HEADER_ACTIVE] = c
            continue
        row = state[r:r + 1]                       # a view: the ops below write the state
        v = view_state(row, layout)
        victims = eviction_order(v, layout, 0, lifetime, policy)
        evict = victims[:max(0, victims.numel() - c)]
        if policy == "reuse":
            for s in sorted(evict.tolist()):       # spill in slot order (last one wins)
                held = v.slot_pos[0, s:s + 1]
                entry, value = ghost_pack(held, v.slot_count[0, s:s + 1].clamp(
                    0, REUSE_COUNT_MAX), layout)
                v.ghost[0, entry] = value
            v.slot_count[0, evict] = 0
        v.slot_pos[0, evict] = -1
        v.slot_life[0, evict] = -1
        slot_ids = torch.arange(S, device=dev)
        movers = slot_ids[(slot_ids >= c) & (v.slot_pos[0] >= 0)]
        targets = slot_ids[(slot_ids < c) & (v.slot_pos[0] < 0)][:movers.numel()]
        for section in (v.slot_pos, v.slot_life) + ((v.slot_count,) if policy == "reuse" else ()):
            section[0, targets] = section[0, movers]
        v.slot_pos[0, c:] = -1
        v.slot_life[0, c:] = -1
        if policy == "reuse":
            v.slot_count[0, c:S] = 0
        n = movers.numel()
        src[r, :n] = movers.to(torch.int32)
        dst[r, :n] = targets.to(torch.int32)
        counts[r] = n
        row[0, HEADER_ACTIVE] = c
        if n:
            # as plan: stale entries go before a freed slot can take back its old position
            compact_stash(v, [0])
            moved = v.slot_pos[0, targets][None, :]
            _insert(v, moved, targets.to(torch.int32)[None, :],
                    torch.ones_like(moved, dtype=torch.bool), layout.buckets)
    return src, dst, counts


def check_state(state: torch.Tensor, layout: Layout, lifetime: int,
                policy: str = "lifetime", min_active: int = 1) -> None:
    """Validate the invariants of a state built and updated by the ops; raise ``ValueError``
    naming the row, the section and the entry that breaks one. Vectorised over rows: a few
    passes over the state (one index lookup per resident slot), no per-step cost.

    Checked: the header (magic, ``S``, ``H``, ``L``, zero words); ``slot_pos`` in
    ``[-1, 2**24)`` and ``slot_life`` in ``[-1, L+1]`` (``L+1``: fresh), free exactly when the other is -1, no
    position held twice, padding free; ``stash_count`` in ``[0, S]``; every bucket's and stash
    entry's slot in ``[0, S)`` and every stash key in ``[-1, 2**24)``; stash entries past the count are ``(-1, 0)``;
    every resident position is found by the index at its own slot. Reuse policy: ``slot_life``
    holds ages in ``[-1, 1023]``, counts and heat lie in ``[0, 255]``, a free slot's count is 0,
    every ghost names a position in ``[0, 2**24)``, the step word in ``[0, 256)`` (0 under the
    other policies). The hand word lies in ``[0, S)`` under the lifetime policy and is 0 under the
    others. The active capacity lies in ``[min_active, S]`` and no slot at or past it is occupied.
    """
    check_header(state, layout, lifetime, policy, min_active=min_active)
    S, Sp = layout.capacity, layout.padded_capacity
    v = view_state(state, layout)

    def fail(section: str, mask: torch.Tensor, what: str) -> None:
        if bool(mask.any()):
            r, i = (int(x) for x in mask.nonzero()[0]) if mask.dim() == 2 else (
                int(mask.nonzero()[0, 0]), 0)
            value = {"slot_pos": v.slot_pos, "slot_life": v.slot_life,
                     "bucket_slot": v.bucket_slot, "stash_key": v.stash_key,
                     "stash_slot": v.stash_slot, "slot_count": v.slot_count,
                     "ghost": v.ghost, "block_heat": v.block_heat}.get(section)
            shown = f"[{r}, {i}] = {int(value[r, i])}" if value is not None and mask.dim() == 2 \
                else f"[{r}]"
            raise ValueError(f"state: {section}{shown}: {what}")

    header_rest = torch.cat([state[:, HEADER_ACTIVE + 1:HEADER_STASH_COUNT],
                             state[:, HEADER_HAND + 1:STATE_HEADER]], 1)
    fail("header", header_rest != 0, "reserved header words must be 0")
    hand_top = S if policy == "lifetime" else 1
    fail("header", (v.hand < 0) | (v.hand >= hand_top),
         f"hand word (10) expected in [0, {hand_top})" + ("" if policy == "lifetime" else
                                                         ": only the lifetime policy moves it"))
    if policy != "reuse":
        fail("header", state[:, HEADER_STEP] != 0, "step word (9) must be 0 outside the reuse policy")
    fail("stash_count", (v.stash_count < 0) | (v.stash_count > S),
         f"expected a count in [0, {S}]")
    fail("slot_pos", (v.slot_pos < -1) | (v.slot_pos >= MAX_POSITION),
         "expected -1 or a position in [0, 2**24)")
    aged = policy in ("reuse", "lru")
    top = REUSE_AGE_MAX if aged else lifetime + 1      # lifetime: L+1 marks a fresh slot
    fail("slot_life", (v.slot_life < -1) | (v.slot_life > top),
         f"expected a {'age' if aged else 'lifetime'} in [-1, {top}]")
    if policy == "reuse":
        for name, section, high in (("slot_count", v.slot_count, REUSE_COUNT_MAX),
                                    ("block_heat", v.block_heat, REUSE_HEAT_MAX)):
            fail(name, (section < 0) | (section > high), f"expected a value in [0, {high}]")
        named = ghost_positions(v.ghost, layout)
        fail("ghost", (named < 0) | (named >= MAX_POSITION),
             "expected tag << 8 | count naming a position in [0, 2**24)")
        fail("slot_count", (v.slot_count[:, :S] != 0) & (v.slot_pos == -1),
             "a free slot's count must be 0")
        fail("header", (state[:, HEADER_STEP] < 0) | (state[:, HEADER_STEP] >= REUSE_HALVE_EVERY),
             f"step word expected in [0, {REUSE_HALVE_EVERY})")
    beyond = torch.arange(S, device=state.device)[None, :] >= state[:, HEADER_ACTIVE, None]
    fail("slot_pos", beyond & (v.slot_pos != -1),
         "a slot at or past the row's active capacity (header word 6) must be free")
    fail("slot_life", (v.slot_life == -1) != (v.slot_pos == -1),
         "a slot is free (-1) in slot_pos exactly when it is free in slot_life")
    padding = torch.cat([state[:, layout.slot_pos + S:layout.slot_pos + Sp],
                         life_entries(state, layout)[:, S:].int()], 1)
    fail("padding", padding != -1, "slot_pos / slot_life padding must be -1")
    ordered = v.slot_pos.sort(1).values
    fail("slot_pos", (ordered[:, 1:] == ordered[:, :-1]) & (ordered[:, 1:] >= 0),
         "a position is held by two slots (sorted index shown)")
    buckets = v.bucket_slot.int()                  # int16 entries: S = 2**15 is no int16
    fail("bucket_slot", (buckets < -1) | (buckets >= S),
         f"expected -1 (never used) or a slot in [0, {S})")
    in_use = torch.arange(S, device=state.device)[None, :] < v.stash_count[:, None]
    fail("stash_key", in_use & ((v.stash_key < -1) | (v.stash_key >= MAX_POSITION)),
         "expected -1 or a position in [0, 2**24)")
    fail("stash_slot", in_use & ((v.stash_slot < 0) | (v.stash_slot >= S)),
         f"expected a slot in [0, {S})")
    fail("stash_key", ~in_use & ((v.stash_key != -1) | (v.stash_slot != 0)),
         "entries past stash_count must be (-1, 0)")
    found = index_lookup(v, v.slot_pos, layout.buckets)
    slot_ids = torch.arange(S, device=state.device, dtype=found.dtype).expand_as(found)
    fail("slot_pos", (v.slot_pos >= 0) & (found != slot_ids),
         "this resident position is not found at its slot by the hash index")


# ----------------------------------------------------------------------------------------- index

def hash_constants(buckets: int):
    return tuple(c % buckets for c in (HASH_A1, HASH_B1, HASH_A2, HASH_B2))


def probe_buckets(pos: torch.Tensor, buckets: int) -> torch.Tensor:
    """Buckets probed for each position: int64 ``[..., PROBES]``. ``pos`` must be >= 0."""
    a1, b1, a2, b2 = hash_constants(buckets)
    m = buckets.bit_length() - 1
    p = pos.to(torch.int64)
    lo = p & (buckets - 1)
    hi = (p >> m) & (buckets - 1)
    first = (lo * a1 + hi * b1) & (buckets - 1)
    stride = ((lo * a2 + hi * b2) & (buckets - 1)) | 1
    i = torch.arange(PROBES, dtype=torch.int64, device=pos.device)
    return (first[..., None] + i * stride[..., None]) & (buckets - 1)


def _gather_rows(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``table[r, index[r, ...]]`` for a 2-D table and an index of any trailing shape."""
    return table.gather(1, index.reshape(index.shape[0], -1).long()).view(index.shape)


def _capacity(v: StateView) -> int:
    return v.slot_pos.shape[-1]


def _stash_len(v: StateView, r: int) -> int:
    """Stash entries of row ``r`` in use: the count clamped to ``[0, S]``."""
    return min(max(int(v.stash_count[r]), 0), _capacity(v))


def _stash_lookup(v: StateView, sel: torch.Tensor, found: torch.Tensor) -> None:
    """Fill ``found`` (in place) from the stash for rows whose stash is not empty."""
    for r in torch.nonzero(v.stash_count > 0).flatten().tolist():
        n = _stash_len(v, r)
        keys = v.stash_key[r, :n]
        slots = v.stash_slot[r, :n].clamp(0, _capacity(v) - 1)
        live = v.slot_pos[r].gather(0, slots.long()) == keys
        match = (sel[r, :, None] == keys[None, :]) & live[None, :] & (sel[r, :, None] >= 0)
        has = match.any(1) & (found[r] < 0)
        first = match.int().argmax(1)
        found[r] = torch.where(has, slots[first], found[r])


def index_lookup(v: StateView, sel: torch.Tensor, buckets: int) -> torch.Tensor:
    """Plan's lookup: the slot holding each selected position, or -1. The first probe bucket
    whose slot holds the position, then the stash."""
    b = probe_buckets(sel.clamp(min=0), buckets)                     # [R, N, P]
    slots = _gather_rows(v.bucket_slot, b).clamp(0, _capacity(v) - 1)
    owner = _gather_rows(v.slot_pos, slots)
    want = sel[..., None]
    match = (owner == want) & (want >= 0)
    first = match.int().argmax(-1, keepdim=True)
    found = torch.where(match.any(-1), slots.gather(-1, first).squeeze(-1),
                        torch.full_like(sel, -1))
    _stash_lookup(v, sel, found)
    return found


def occupied_buckets(v: StateView, bucket: torch.Tensor, buckets: int) -> torch.Tensor:
    """Whether each bucket (int64 ``[R, ...]``) is occupied: it names a slot (``bucket_slot``
    clamped to ``[-1, S-1]``, -1: never used) that holds a position, clamped to ``[-1, 2**24]``,
    whose probes include the bucket."""
    slots = _gather_rows(v.bucket_slot, bucket).clamp(-1, _capacity(v) - 1)
    owner = _gather_rows(v.slot_pos, slots.clamp(min=0)).clamp(-1, MAX_POSITION)
    probes = probe_buckets(owner.clamp(min=0), buckets)
    return (slots >= 0) & (owner >= 0) & (probes == bucket[..., None]).any(-1)


def dual_pointer_lookup(v: StateView, sel: torch.Tensor) -> torch.Tensor:
    """Baseline matcher: sort the selections and the resident keys, merge with two pointers.

    This is the scalar-unit algorithm the dual-pointer kernel runs; it reads only ``slot_pos``.
    """
    found = torch.full_like(sel, -1)
    for r in range(sel.shape[0]):
        resident = v.slot_pos[r]
        res_order = torch.argsort(resident, stable=True).tolist()
        res_keys = resident.tolist()
        sel_row = sel[r].tolist()
        sel_order = sorted(range(len(sel_row)), key=lambda n: sel_row[n])
        out = found[r].tolist()
        i = 0
        for n in sel_order:
            want = sel_row[n]
            if want < 0:
                continue
            while i < len(res_order) and res_keys[res_order[i]] < want:
                i += 1
            if i < len(res_order) and res_keys[res_order[i]] == want:
                out[n] = res_order[i]
        found[r] = torch.tensor(out, dtype=sel.dtype)
    return found


def _insert(v: StateView, miss_pos: torch.Tensor, miss_slots: torch.Tensor,
            pending: torch.Tensor, buckets: int) -> None:
    """Place this step's misses in the index: 4 probe rounds, lowest j wins, rest to the stash."""
    R, N = miss_pos.shape
    b = probe_buckets(miss_pos.clamp(min=0), buckets)
    j = torch.arange(N, device=miss_pos.device).expand(R, N)
    row_base = torch.arange(R, device=miss_pos.device)[:, None] * buckets
    slots = _gather_rows(v.bucket_slot, b).clamp(-1, _capacity(v) - 1)
    owner = _gather_rows(v.slot_pos, slots.clamp(min=0))
    indexed = ((slots >= 0) & (owner == miss_pos[..., None])).any(-1)
    pending = pending & ~indexed
    for i in range(PROBES):
        cand = b[..., i]
        propose = pending & ~occupied_buckets(v, cand, buckets)
        winner = torch.full((R * buckets,), N, dtype=torch.int64, device=miss_pos.device)
        flat = (row_base + cand)[propose]
        winner.scatter_reduce_(0, flat, j[propose], reduce="amin")
        won = propose & (winner[(row_base + cand)] == j)
        rr, jj = won.nonzero(as_tuple=True)
        v.bucket_slot[rr, cand[rr, jj]] = miss_slots[rr, jj].to(torch.int16)   # < S <= 2**15
        pending &= ~won
    rows = torch.nonzero((v.stash_count > 0) | pending.any(1)).flatten().tolist()
    compact_stash(v, rows, miss_pos, miss_slots, pending)


def compact_stash(v: StateView, rows: Sequence[int], append_keys: Optional[torch.Tensor] = None,
                  append_slots: Optional[torch.Tensor] = None,
                  append: Optional[torch.Tensor] = None) -> None:
    """Drop the stale stash entries of ``rows`` (order kept), then append the masked entries
    while the stash has room (``S`` entries). Entries past the old count are not touched except
    by the append; freed entries in between become ``(-1, 0)``."""
    S = _capacity(v)
    for r in rows:
        n = _stash_len(v, r)
        keys, slots = v.stash_key[r, :n].clone(), v.stash_slot[r, :n].clone()
        live = v.slot_pos[r].gather(0, slots.clamp(0, S - 1).long()) == keys
        keys, slots = keys[live], slots[live]
        if append is not None:
            room = S - keys.numel()
            keys = torch.cat([keys, append_keys[r][append[r]][:room]])
            slots = torch.cat([slots, append_slots[r][append[r]][:room]])
        count = keys.numel()
        v.stash_key[r, :count] = keys
        v.stash_slot[r, :count] = slots
        v.stash_key[r, count:n] = -1
        v.stash_slot[r, count:n] = 0
        v.stash_count[r] = count


# ------------------------------------------------------------------------------------------ plan

def log8(x: torch.Tensor) -> torch.Tensor:
    """``≈ 8*log2(1+x)`` for ``0 <= x < 2**24``, from float32 bits: 8 times the exponent plus the
    top 3 mantissa bits (piecewise linear between powers of two, exact at them). Integer and
    float bit operations only, so every backend computes it bit for bit."""
    bits = (x.to(torch.int32) + 1).to(torch.float32).view(torch.int32)
    return (bits >> 20) - (127 << 3)


def log4(x: torch.Tensor) -> torch.Tensor:
    """``≈ 4*log2(1+x)``: 4 times the exponent plus the top 2 mantissa bits (see ``log8``)."""
    bits = (x.to(torch.int32) + 1).to(torch.float32).view(torch.int32)
    return (bits >> 21) - (127 << 2)


def reuse_scores(v: StateView, layout: Layout) -> torch.Tensor:
    """Per slot: how much keeping it is worth (reuse policy, after the step's age and heat
    updates). ``log8(count) + log4(heat of its 64-position block) - log8(age)``; free slots
    (age -1) score ``SCORE_FREE``, slots used this step (age 0) ``SCORE_PINNED``."""
    age = v.slot_life
    count = v.slot_count[:, :layout.capacity].clamp(0, REUSE_COUNT_MAX)
    heat = v.block_heat.gather(1, heat_block(v.slot_pos, layout).long())
    score = log8(count) + log4(heat) - log8(age.clamp(min=0))
    score = torch.where(age == 0, torch.full_like(score, SCORE_PINNED), score)
    return torch.where(age == -1, torch.full_like(score, SCORE_FREE), score)


def lru_scores(v: StateView) -> torch.Tensor:
    """Per slot (lru policy): ``-age``; free slots ``LRU_SCORE_FREE``, used this step
    ``LRU_SCORE_PINNED``."""
    age = v.slot_life
    score = torch.where(age == 0, torch.full_like(age, LRU_SCORE_PINNED), -age)
    return torch.where(age == -1, torch.full_like(score, LRU_SCORE_FREE), score)


def lowest_scores(score: torch.Tensor, m: torch.Tensor, free: int = SCORE_FREE,
                  pinned: int = SCORE_PINNED) -> torch.Tensor:
    """Mask of the ``m[r]`` slots with the lowest ``(score, slot)`` of each row, without a sort:
    binary search for the threshold ``theta`` (the smallest with ``count(score <= theta) >= m``;
    ``ceil(log2(pinned - free + 2))`` compare + count passes over the slots here: 8 for reuse,
    11 for lru. The kernels find the same ``theta`` in fewer: reuse's 8-ary search in 3; lru's
    first pass counts the 8 ages up to the oldest, and a theta below them takes more passes,
    8 thresholds each), then every slot below it and the first ``m - count(score < theta)``
    slots equal to it (a prefix count of the tie mask)."""
    lo = torch.full_like(m, free - 1)             # count(score <= lo) < m   (or m == 0)
    hi = torch.full_like(m, pinned)               # count(score <= hi) >= m
    while bool((hi - lo > 1).any()):
        mid = (lo + hi) >> 1
        enough = (score <= mid[:, None]).sum(1) >= m
        hi = torch.where(enough, mid, hi)
        lo = torch.where(enough, lo, mid)
    theta = hi[:, None]
    below = score < theta
    ties = score == theta
    room = m[:, None] - below.sum(1, keepdim=True)
    return below | (ties & (torch.cumsum(ties.int(), 1) <= room))


def _reuse_refresh(v: StateView, layout: Layout) -> None:
    """Ages one step older (clamped to ``[-1, 1023]`` first, whatever the state held; free
    slots stay -1) and heat halves (clamped to ``[0, 255]`` first; lru: no heat)."""
    age = v.slot_life.clamp(-1, REUSE_AGE_MAX)
    v.slot_life.copy_((age + 1).clamp(max=REUSE_AGE_MAX) + age.clamp(max=0))
    v.block_heat.copy_(v.block_heat.clamp(0, REUSE_HEAT_MAX) >> 1)


def _add_heat(v: StateView, layout: Layout, positions: torch.Tensor, used: torch.Tensor) -> None:
    """heat[(p >> 6) mod B] += 1 (saturating) for every used position (unique per row)."""
    blocks = v.block_heat.shape[1]
    rr, ii = used.nonzero(as_tuple=True)
    flat = rr * blocks + heat_block(positions[rr, ii].long(), layout)
    added = torch.bincount(flat, minlength=v.block_heat.numel()).view_as(v.block_heat)
    v.block_heat.copy_((v.block_heat + added).clamp(max=REUSE_HEAT_MAX))


def _reuse_install(v: StateView, layout: Layout, miss_pos: torch.Tensor,
                   miss_slots: torch.Tensor, is_miss: torch.Tensor) -> None:
    """Evicted positions leave their count as a ghost; each miss brings its own back (when its
    ghost survived), plus ``REUSE_GAIN_RETURN`` for this use. Spills first, then reloads; among
    spills to one ghost entry the last miss wins, as in the kernel's loop."""
    R, N = miss_pos.shape
    G = layout.ghosts
    rr, jj = is_miss.nonzero(as_tuple=True)
    slots = miss_slots[rr, jj].long()
    old = v.slot_pos[rr, slots].long()
    count = v.slot_count[rr, slots].clamp(0, REUSE_COUNT_MAX)
    spill = old >= 0
    rr_s, jj_s = rr[spill], jj[spill]
    entry, value = ghost_pack(old[spill], count[spill], layout)
    key = (rr_s * G + entry) * N + jj_s
    order = torch.argsort(key)
    target = (rr_s * G + entry)[order]
    last = torch.ones_like(target, dtype=torch.bool)
    last[:-1] = target[1:] != target[:-1]
    v.ghost[rr_s[order][last], entry[order][last]] = value[order][last]
    fresh = ghost_count(v.ghost, torch.where(is_miss, miss_pos, torch.zeros_like(miss_pos)),
                        layout)[rr, jj]
    v.slot_count[rr, slots] = (fresh + REUSE_GAIN_RETURN).clamp(max=REUSE_COUNT_MAX)


def idle_rows(seq_lens: torch.Tensor) -> torch.Tensor:
    """bool ``[R]``: the rows a plan selects nothing for and does not age, ``seq_len <= 0``
    (module docstring, "One plan step")."""
    return seq_lens <= 0


def _free_padding(state: torch.Tensor, layout: Layout) -> None:
    """The ``Sp - S`` padding slots free (``slot_pos``, ``slot_life`` -1; reuse: counts 0), as
    every plan that writes a row leaves them."""
    S = layout.capacity
    padding = layout.padded_capacity - S
    if padding:
        state[:, layout.slot_pos + S:layout.slot_pos + S + padding] = -1
        life_entries(state, layout)[:, S:S + padding] = -1
        if layout.reuse:
            view_state(state, layout).slot_count[:, S:] = 0


def plan(state: torch.Tensor, stats: torch.Tensor, topk_pos: torch.Tensor,
         seq_lens: torch.Tensor, layout: Layout, lifetime: int, matcher: str = "hash",
         policy: str = "lifetime", valid_lens: Optional[torch.Tensor] = None):
    """One step for every row. Returns ``(slots, miss_pos, miss_slots, miss_counts)``.

    ``matcher="hash"`` is the AVSG index; ``"dual_pointer"`` is the sort + merge baseline.
    Both give the same outputs and leave the same state: only the matching differs.
    ``policy`` picks the victims (module docstring, "Residency policies").

    ``valid_lens`` (int32 ``[R]``, optional): the step first drops every slot whose position is
    ``>= valid_lens[row]``, exactly as ``invalidate(state, layout, valid_lens)`` would, so one
    launch does what invalidate-then-plan did. The result is theirs, state and outputs, whenever
    this plan accepts the state; when it does not (a header that fails plan's stricter check),
    it raises before it writes anything, where invalidate alone would have dropped.
    """
    R, T, K = topk_pos.shape
    N = T * K
    S = layout.capacity
    dev = topk_pos.device
    reuse = policy == "reuse"
    lru = policy == "lru"
    check_header(state, layout, lifetime, policy, min_active=N)
    if matcher not in ("hash", "dual_pointer"):
        raise ValueError(f"matcher must be 'hash' or 'dual_pointer', got {matcher!r}")
    idle = idle_rows(seq_lens)
    if bool(idle.any()):
        # idle rows apply their drop alone (module docstring, "One plan step"); the others plan
        if valid_lens is not None:
            dropping = (idle & (valid_lens.to(torch.int64) < MAX_POSITION)).nonzero().flatten()
            if dropping.numel():
                sub = state[dropping]
                _drop_past(view_state(sub, layout), layout, valid_lens[dropping])
                _free_padding(sub, layout)
                state[dropping] = sub
        busy = (~idle).nonzero().flatten()
        slots = torch.full((R, T, K), -1, dtype=torch.int32, device=dev)
        miss_pos = torch.full((R, N), -1, dtype=torch.int32, device=dev)
        miss_slots = torch.full((R, N), -1, dtype=torch.int32, device=dev)
        miss_counts = torch.zeros(R, dtype=torch.int32, device=dev)
        if busy.numel():
            sub_state, sub_stats = state[busy], stats[busy]
            out = plan(sub_state, sub_stats, topk_pos[busy], seq_lens[busy], layout, lifetime,
                       matcher, policy, None if valid_lens is None else valid_lens[busy])
            state[busy], stats[busy] = sub_state, sub_stats
            for whole, part in zip((slots, miss_pos, miss_slots, miss_counts), out):
                whole[busy] = part.to(whole.dtype)
        return slots, miss_pos, miss_slots, miss_counts
    v = view_state(state, layout)
    if valid_lens is not None:
        _drop_past(v, layout, valid_lens)
    # victims only below the active capacity (resize): slots at or past it stay as they are
    beyond = torch.arange(S, device=dev)[None, :] >= state[:, HEADER_ACTIVE].long()[:, None]
    # whatever the state holds: counts into range, padding slots free (module docstring)
    v.stash_count.clamp_(0, S)
    _free_padding(state, layout)

    sel = topk_pos.reshape(R, N).to(torch.int32)
    bound = seq_lens.to(torch.int64).clamp(max=MAX_POSITION)
    if layout.max_context:
        bound = bound.clamp(max=layout.max_context)
    bound = bound[:, None]
    valid = (sel >= 0) & (sel < bound)
    sel = torch.where(valid, sel, torch.full_like(sel, -1))

    # 1. refresh: decay (age), look up, hits back to L (age 0) and thereby pinned
    life = v.slot_life
    if reuse or lru:
        _reuse_refresh(v, layout)
        aged = life.clone()               # before the hits pin: > 1 marks a return
    else:
        life.clamp_(-1, lifetime + 1)
        fresh = life == lifetime + 1         # filled in the previous step: on probation
        life.sub_((life > 0).to(torch.int32)).masked_fill_(fresh, first_life(lifetime) - 1)
    if matcher == "hash":
        hit_slot = index_lookup(v, sel, layout.buckets)
    else:
        hit_slot = dual_pointer_lookup(v, sel)
    hit = hit_slot >= 0
    rr, nn = hit.nonzero(as_tuple=True)
    life[rr, hit_slot[rr, nn].long()] = 0 if reuse or lru else lifetime

    # 2. classify: unique missed positions, ascending
    missing = valid & ~hit
    ordered = torch.where(missing, sel, torch.full_like(sel, INT32_MAX)).sort(dim=1).values
    run_start = torch.ones_like(missing)
    run_start[:, 1:] = ordered[:, 1:] != ordered[:, :-1]
    unique = run_start & (ordered != INT32_MAX)
    miss_counts = unique.sum(1).to(torch.int32)
    compact = ordered.gather(1, torch.argsort((~unique).to(torch.int8), dim=1, stable=True))
    col = torch.arange(N, device=dev).expand(R, N)
    is_miss = col < miss_counts[:, None]
    miss_pos = torch.where(is_miss, compact, torch.full_like(compact, -1))

    # 3. allocate
    slot_ids = torch.arange(S, device=dev, dtype=torch.int64)
    if reuse:
        # every slot used this step counts once and heats its block; victims: lowest scores
        used = torch.zeros(R, S, dtype=torch.bool, device=dev)
        used[rr, hit_slot[rr, nn].long()] = True
        count = v.slot_count[:, :S]
        gain = torch.where(aged[:, :S] > 1, REUSE_GAIN_RETURN, REUSE_GAIN_STREAK)
        count.copy_(torch.where(used, (count.clamp(0, REUSE_COUNT_MAX) + gain).clamp(
            max=REUSE_COUNT_MAX), count))
        _add_heat(v, layout, v.slot_pos, used)
        _add_heat(v, layout, miss_pos, is_miss)
        score = reuse_scores(v, layout).masked_fill(beyond, SCORE_PINNED)
        chosen = lowest_scores(score, miss_counts.to(torch.int64))
        victims = torch.argsort((~chosen).to(torch.int8), dim=1, stable=True)[:, :N]
        victims = victims.to(torch.int32)
    elif lru:
        # least recently used first (ages saturate at 1023 steps: older ones tie, by slot)
        score = lru_scores(v).masked_fill(beyond, LRU_SCORE_PINNED)
        chosen = lowest_scores(score, miss_counts.to(torch.int64), LRU_SCORE_FREE,
                               LRU_SCORE_PINNED)
        victims = torch.argsort((~chosen).to(torch.int8), dim=1, stable=True)[:, :N]
        victims = victims.to(torch.int32)
    else:
        # ties from the hand on (module docstring, "Allocate")
        active = v.active.clamp(1, S).to(torch.int64)
        hand = lifetime_hand(v)
        victim_key = torch.where((life < lifetime) & ~beyond,
                                 (life.to(torch.int64) + 1) * S + (slot_ids - hand[:, None]) % S,
                                 torch.full_like(slot_ids, INT32_MAX))
        victims = torch.argsort(victim_key, dim=1)[:, :N].to(torch.int32)
        last = victims.gather(1, (miss_counts.long() - 1).clamp(min=0)[:, None])[:, 0]
        # no misses: the word stays as it is (a hand outside [0, A) is read as 0, not repaired)
        state[:, HEADER_HAND] = torch.where(miss_counts > 0, ((last + 1) % active).to(torch.int32),
                                            state[:, HEADER_HAND])
    miss_slots = torch.where(is_miss, victims, torch.full_like(victims, -1))
    # Entries that went stale before this step go now: a freed slot may be handed back to the
    # same position below, which would revive its stale entry next to the new one.
    compact_stash(v, torch.nonzero(v.stash_count > 0).flatten().tolist())
    if reuse:
        _reuse_install(v, layout, miss_pos, miss_slots, is_miss)
    rr, jj = is_miss.nonzero(as_tuple=True)
    v.slot_pos[rr, miss_slots[rr, jj].long()] = miss_pos[rr, jj]
    life[rr, miss_slots[rr, jj].long()] = 0 if reuse or lru else lifetime + 1   # lifetime: fresh
    _insert(v, miss_pos, miss_slots, is_miss, layout.buckets)
    if reuse:
        # every REUSE_HALVE_EVERY steps all counts halve, so old popularity fades
        step = state[:, HEADER_STEP].clamp(0, REUSE_HALVE_EVERY - 1) + 1
        halve = step == REUSE_HALVE_EVERY
        v.slot_count[halve] = v.slot_count[halve].clamp(0, REUSE_COUNT_MAX) >> 1
        g = v.ghost[halve]                # the counts halve, the tags stay
        v.ghost[halve] = g - (((g & GHOST_COUNT_MASK) + 1) >> 1)
        state[:, HEADER_STEP] = torch.where(halve, torch.zeros_like(step), step)

    # 4. output: every selection's slot
    sorted_misses = torch.where(is_miss, miss_pos, torch.full_like(miss_pos, INT32_MAX))
    where_missed = torch.searchsorted(sorted_misses, sel).clamp(max=N - 1)
    reserved = miss_slots.gather(1, where_missed)
    slots = torch.where(hit, hit_slot, torch.where(missing, reserved, torch.full_like(sel, -1)))

    stats[:, STAT_LOOKUPS] += valid.sum(1)
    stats[:, STAT_HITS] += hit.sum(1)
    stats[:, STAT_MISSES] += missing.sum(1)
    stats[:, STAT_FETCHED] += miss_counts.to(torch.int64)
    return slots.view(R, T, K), miss_pos, miss_slots, miss_counts


# ----------------------------------------------------------------------------- hit/miss split

class SplitSlots(NamedTuple):
    """Per query token, the slots of its hits and of its misses (``split_slots``)."""
    hits: torch.Tensor          # int32 [R, T, K]  resident before the step's copies; -1 after
    misses: torch.Tensor        # int32 [R, T, K]  filled by the step's copies; -1 after


def compact_valid_first(values: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """``values`` where ``keep``, moved to the front of the last dimension in their order, then
    ``-1``: a prefix sum gives each kept entry its place (fixed shape, no sort, no host sync)."""
    K = values.shape[-1]
    kept = keep.to(torch.int64)
    place = torch.where(keep, kept.cumsum(-1) - 1, torch.full_like(kept, K))    # K: a spare column
    out = torch.full((*values.shape[:-1], K + 1), -1, dtype=values.dtype, device=values.device)
    out.scatter_(-1, place, torch.where(keep, values, torch.full_like(values, -1)))
    return out[..., :K]


def split_slots(slots: torch.Tensor, miss_slots: torch.Tensor, miss_counts: torch.Tensor,
                capacity: int) -> SplitSlots:
    """The hit/miss split of a plan's outputs (module docstring, step 5): ``slots`` int32
    ``[R, T, K]``, ``miss_slots`` int32 ``[R, T*K]``, ``miss_counts`` int32 ``[R]`` of a buffer
    with ``capacity`` slots per row. Entries of ``miss_slots`` past ``miss_counts`` (clamped to
    ``[0, T*K]``) or outside ``[0, capacity)`` mark nothing; a slot outside ``[0, capacity)`` in
    ``slots`` is neither a hit nor a miss (a plan never emits one). Fixed shape, no host sync:
    one scatter into a per-row slot mask, one gather, two prefix-sum compactions."""
    R, T, K = slots.shape
    N = miss_slots.shape[1]
    S = capacity
    dev = slots.device
    column = torch.arange(N, device=dev)[None, :]
    counts = miss_counts.to(torch.int64).clamp(0, N)[:, None]
    marks = (column < counts) & (miss_slots >= 0) & (miss_slots < S)
    # slot -> "filled by this step's copy", per row; column S absorbs the unmarked entries
    missed = torch.zeros(R, S + 1, dtype=torch.bool, device=dev)
    missed.scatter_(1, torch.where(marks, miss_slots.to(torch.int64), torch.full_like(column, S)),
                    marks)
    missed[:, S] = False
    sel = slots.reshape(R, T * K).to(torch.int64)
    valid = (sel >= 0) & (sel < S)
    is_miss = missed.gather(1, torch.where(valid, sel, torch.full_like(sel, S))) & valid
    is_miss = is_miss.view(R, T, K)
    valid = valid.view(R, T, K)
    slots = slots.to(torch.int32)
    return SplitSlots(compact_valid_first(slots, valid & ~is_miss),
                      compact_valid_first(slots, is_miss))


# ---------------------------------------------------------------------------------------- gather

def chunk_bounds(total: int, cores: int) -> List[int]:
    """``cores + 1`` boundaries of contiguous chunks whose sizes differ by at most one."""
    return [c * total // cores for c in range(cores + 1)]


def selection_layout(slots: torch.Tensor, miss_pos: torch.Tensor, miss_slots: torch.Tensor,
                     miss_counts: torch.Tensor):
    """The plan's misses in the selection layout the paper's S2 partition reads.

    Entry ``(r, t*K + k)`` is selection ``(t, k)`` of row ``r``: its position and slot when it is
    the row's first selection of a missed position, else ``-1`` (hits, repeats, ``-1``
    selections). Returns int32 ``(pos, slot)`` of shape ``[R, T*K]``. A miss's slot is never a
    hit's (the step pins its hits), so a selection is a miss exactly when its slot is one of the
    row's ``miss_slots``.
    """
    R, N = miss_pos.shape
    dev = miss_pos.device
    S = int(max(int(slots.max()) if slots.numel() else 0,
                int(miss_slots.max()) if miss_slots.numel() else 0)) + 1
    sel = slots.reshape(R, N).to(torch.int64)
    col = torch.arange(N, device=dev).expand(R, N)
    counts = miss_counts.to(torch.int64).clamp(0, N)
    valid = (col < counts[:, None]) & (miss_slots >= 0)
    slot_to_miss = torch.full((R, S + 1), -1, dtype=torch.int64, device=dev)
    ms = torch.where(valid, miss_slots.to(torch.int64), torch.full_like(col, S))
    slot_to_miss.scatter_(1, ms, torch.where(valid, col, torch.full_like(col, -1)))
    slot_to_miss[:, S] = -1
    idx = slot_to_miss.gather(1, torch.where(sel >= 0, sel, torch.full_like(sel, S)))
    is_miss = idx >= 0
    first = torch.full((R, N + 1), N, dtype=torch.int64, device=dev)
    first.scatter_reduce_(1, torch.where(is_miss, idx, torch.full_like(idx, N)),
                          torch.where(is_miss, col, torch.full_like(col, N)), reduce="amin")
    keep = is_miss & (first.gather(1, idx.clamp(min=0)) == col)
    safe = idx.clamp(min=0)
    pos = torch.where(keep, miss_pos.to(torch.int64).gather(1, safe), torch.full_like(col, -1))
    slot = torch.where(keep, sel, torch.full_like(col, -1))
    return pos.to(torch.int32), slot.to(torch.int32)


def assign_cores(miss_counts: torch.Tensor, entries_per_row: int, partition: str,
                 cores: int, miss_pos: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Core that copies each miss-list entry: int64 ``[R, entries_per_row]``, -1 for padding.

    ``selection`` (the paper's S2) reads the selection layout: ``miss_pos`` is needed, an entry is
    a copy when its position is ``>= 0``, and ``miss_counts`` is not used."""
    R = miss_counts.shape[0]
    dev = miss_counts.device
    col = torch.arange(entries_per_row, device=dev).expand(R, entries_per_row)
    is_miss = col < miss_counts[:, None].to(torch.int64)
    if partition == SELECTION_PARTITION:
        if miss_pos is None:
            raise ValueError("assign_cores: the selection partition needs miss_pos")
        is_miss = miss_pos >= 0
        order = torch.arange(R, device=dev)[:, None] * entries_per_row + col
        bounds = torch.tensor(chunk_bounds(R * entries_per_row, cores), device=dev)
        core = torch.searchsorted(bounds, order, right=True) - 1
    elif partition == "request":
        core = torch.arange(R, device=dev)[:, None].expand(R, entries_per_row) % cores
    elif partition == "miss":
        first = torch.cumsum(miss_counts.to(torch.int64), 0) - miss_counts.to(torch.int64)
        order = first[:, None] + col
        total = int(miss_counts.to(torch.int64).sum())
        bounds = torch.tensor(chunk_bounds(total, cores), device=dev)
        core = torch.searchsorted(bounds, order, right=True) - 1
    elif partition == "topk":
        order = torch.arange(R, device=dev)[:, None] * entries_per_row + col
        bounds = torch.tensor(chunk_bounds(R * entries_per_row, cores), device=dev)
        core = torch.searchsorted(bounds, order, right=True) - 1
    else:
        raise ValueError(f"partition must be one of {ALL_PARTITIONS}, got {partition!r}")
    return torch.where(is_miss, core, torch.full_like(core, -1))


def host_rows(miss_pos: torch.Tensor, pool_rows: int, rows_per_request: Optional[int],
              block_table: Optional[torch.Tensor], block_size: Optional[int]) -> torch.Tensor:
    """Flat host-pool row of each miss (int64); -1 for padding and for rows outside the pool
    (``pool_rows`` rows in all), which are skipped rather than read out of bounds."""
    pos = miss_pos.to(torch.int64)
    p = pos.clamp(min=0)
    if block_table is None:
        r = torch.arange(pos.shape[0], device=pos.device)[:, None]
        flat = r * rows_per_request + p
        inside = p < rows_per_request
    else:
        column = p // block_size
        inside = column < block_table.shape[1]
        block = block_table.to(torch.int64).gather(1, column.clamp(max=block_table.shape[1] - 1))
        inside &= (block >= 0)
        flat = block * block_size + p % block_size
    inside &= (pos >= 0) & (flat < pool_rows)
    return torch.where(inside, flat, torch.full_like(flat, -1))


def gather(miss_pos: torch.Tensor, miss_slots: torch.Tensor, miss_counts: torch.Tensor,
           src: Sequence[torch.Tensor], dst: Sequence[torch.Tensor],
           block_table: Optional[torch.Tensor], block_size: Optional[int],
           partition: str, cores: int) -> torch.Tensor:
    """Copy every miss's host row into its slot, for every (src, dst) pair.

    Returns int32 ``[cores]``: miss-list entries each core copied (per tensor pair). Entries whose
    host row lies outside the pool are skipped (``gather(check=True)`` rejects them up front).
    """
    R, N = miss_pos.shape
    S = dst[0].shape[1]
    miss_counts = miss_counts.clamp(0, N)
    core = assign_cores(miss_counts, N, partition, cores, miss_pos)
    rows_per_request = None if block_table is not None else src[0].shape[1]
    pool_rows = src[0].shape[0] * src[0].shape[1]
    flat_rows = host_rows(miss_pos, pool_rows, rows_per_request, block_table, block_size)
    inside = (flat_rows >= 0) & (miss_slots >= 0) & (miss_slots < S)
    core = torch.where(inside, core, torch.full_like(core, -1))
    rr, jj = (core >= 0).nonzero(as_tuple=True)
    for s, d in zip(src, dst):
        host = s.reshape(-1, *s.shape[2:])
        d[rr, miss_slots[rr, jj].long()] = host[flat_rows[rr, jj]].to(d.device)
    counts = torch.bincount(core[core >= 0], minlength=cores)
    return counts.to(torch.int32)


def plan_gather(state: torch.Tensor, stats: torch.Tensor, topk_pos: torch.Tensor,
                seq_lens: torch.Tensor, layout: Layout, lifetime: int, src: Sequence[torch.Tensor],
                dst: Sequence[torch.Tensor], block_table: Optional[torch.Tensor],
                block_size: Optional[int], partition: str, cores: int,
                policy: str = "lifetime", valid_lens: Optional[torch.Tensor] = None):
    """``plan`` (hash matcher, ``valid_lens`` as there) then ``gather`` of its outputs, as one
    launch: the op ``plan_gather``, for callers whose copy is the package's own gather.
    Returns ``(slots, miss_pos, miss_slots, miss_counts, copied)``, the plan's outputs and the
    gather's per-core counts, every one equal to what the two ops return when called in turn.

    Nothing else is copied and nothing else is read: a row the plan rejects (``miss_counts[r] =
    -1``, where the kernels cannot raise) copies nothing, and only the ``miss_counts[r]`` misses
    of a row, each into the slot the plan reserved for it this step. A call refused by a check
    (the plan's or the gather's; ``partition="selection"`` is refused, its layout is rewritten
    from a plan's outputs) raises before the state, the statistics or any ``dst`` change."""
    if partition not in PARTITIONS:
        raise ValueError(f"partition: expected one of {PARTITIONS} (the selection layout is "
                         f"rewritten from a plan's outputs: plan, then gather), got {partition!r}")
    out = plan(state, stats, topk_pos, seq_lens, layout, lifetime, policy=policy,
               valid_lens=valid_lens)
    copied = gather(out[1], out[2], out[3], src, dst, block_table, block_size, partition, cores)
    return (*out, copied)
