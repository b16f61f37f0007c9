"""Plan-kernel test drivers shared by the kernel, policy, fast-build and NPU tests: ``Twin`` runs the
kernels (on any device) and the reference (on CPU) in lockstep and compares every output, the
whole state and the stats after every call; ``draw`` makes adversarial top-k (hot-window reuse,
MTP repeats, -1 padding, out-of-range junk); ``geometry`` / ``session`` are the hypothesis
strategies of a random session, ``run_session`` drives one (``idle_some`` leaves rows idle); ``colliding`` gives positions that
share one probe sequence; ``split_lookup`` turns the hash plan's split lookup on for a block;
``chunk_mix`` builds a step chunk by chunk from what the state holds (hits only, a few misses,
many, padding, repeats, stash pressure), the per-chunk paths of the lookup groups.
"""
from __future__ import annotations

import contextlib
import os

import torch
from hypothesis import strategies as st

import avsg  # noqa: F401  (loads the op library)
from avsg import reference

I32 = torch.int32


OUT_NAMES = ("slots", "miss_pos", "miss_slots", "miss_counts")
SPLIT_ENV = "AVSG_NPU_SPLIT"


@contextlib.contextmanager
def split_lookup(on=True):
    """Inside: the hash plan may spread a row's lookup over idle emulated cores (AVSG_NPU_SPLIT,
    read by every plan call; off by default in every build, as on the NPU). ``on=None``: the
    variable unset."""
    saved = os.environ.get(SPLIT_ENV)
    if on is None:
        os.environ.pop(SPLIT_ENV, None)
    else:
        os.environ[SPLIT_ENV] = "1" if on else "0"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(SPLIT_ENV, None)
        else:
            os.environ[SPLIT_ENV] = saved


class Twin:
    """Kernel state (on ``device``) and reference state (on CPU) driven in lockstep, under the
    lifetime policy (``max_context=0``), the reuse policy (``max_context >= 1``) or
    ``policy="lru"``."""

    def __init__(self, R, S, H, L, matcher="hash", device="cpu", max_context=0, policy=None):
        self.S, self.H, self.L, self.matcher, self.device = S, H, L, matcher, device
        self.C = max_context
        self.policy = policy or ("reuse" if max_context else "lifetime")
        self.layout = reference.Layout(S, H, max_context, self.policy == "reuse")
        self.policy_id = reference.POLICY_IDS[self.policy]
        self.ref_state = reference.new_state(R, self.layout, L, policy=self.policy)
        self.ref_stats = torch.zeros(R, 4, dtype=torch.int64)
        # clone first: .to() of a CPU tensor to "cpu" would alias the reference state
        self.state = self.ref_state.clone().to(device)
        self.stats = self.ref_stats.clone().to(device)

    def plan(self, topk, seq, valid_lens=None):
        """``valid_lens``: the plan drops what invalidate(valid_lens) would first, in its launch."""
        op = torch.ops.avsg.plan if self.matcher == "hash" else torch.ops.avsg.plan_dual_pointer
        lens = None if valid_lens is None else valid_lens.to(self.device)
        got = op(topk.to(self.device), seq.to(self.device), self.state, self.stats, self.S, self.H,
                 self.L, self.policy_id, self.C, lens)
        got = tuple(t.cpu() for t in got)
        want = reference.plan(self.ref_state, self.ref_stats, topk, seq, self.layout, self.L,
                              matcher=self.matcher, policy=self.policy, valid_lens=valid_lens)
        for name, a, b in zip(OUT_NAMES, got, want):
            assert a.dtype == b.dtype and torch.equal(a, b), f"{name} differs from the reference"
        self.check()
        return got

    def invalidate(self, valid_lens):
        torch.ops.avsg.invalidate(self.state, valid_lens.to(self.device), self.S, self.H, self.C)
        reference.invalidate(self.ref_state, self.layout, valid_lens)
        self.check()

    def reset(self, mask):
        torch.ops.avsg.reset(self.state, mask.to(self.device), self.S, self.H, self.L,
                             self.policy_id, self.C)
        reference.reset(self.ref_state, self.layout, mask, self.L, self.policy)
        self.check()

    def check(self):
        state = self.state.cpu()
        if not torch.equal(state, self.ref_state):
            diff = (state != self.ref_state).nonzero()[:8]
            raise AssertionError(f"state differs at {diff.tolist()}")
        assert torch.equal(self.stats.cpu(), self.ref_stats), "stats differ"


def draw(gen, R, T, K, seq_lens, hot, pad=0.1, repeat=0.3, wild=0.05):
    """Hot-window reuse, MTP repeats across query tokens and within one, -1 padding, and
    out-of-range junk (the ops get no value check: out of range acts as -1)."""
    out = torch.empty(R, T, K, dtype=I32)
    for r in range(R):
        n = max(1, int(seq_lens[r]))
        lo = max(0, n - hot)
        out[r] = torch.randint(lo, n, (T, K), generator=gen, dtype=I32)
        if T > 1:
            share = torch.rand(T, K, generator=gen) < repeat
            out[r, 1:] = torch.where(share[1:], out[r, :1].expand(T - 1, K), out[r, 1:])
    out[torch.rand(R, T, K, generator=gen) < pad] = -1
    junk = torch.randint(-(1 << 31), (1 << 31) - 1, (R, T, K), generator=gen, dtype=torch.int64)
    junk = torch.where(torch.rand(R, T, K, generator=gen) < 0.5, junk % 7 - 5, junk).to(I32)
    return torch.where(torch.rand(R, T, K, generator=gen) < wild, junk, out)


geometry = st.tuples(
    st.integers(1, 3),                                   # R
    st.integers(1, 4),                                   # T (MTP)
    st.sampled_from([1, 3, 8, 16, 31, 64, 100]),         # K
    st.sampled_from([1.0, 1.0, 1.3, 2.0, 4.0]),          # S / (T*K): full buffers are common
    st.sampled_from([1, 2]),                             # H / default
    st.integers(1, 20),                                  # L
)


session = st.lists(st.sampled_from(["plan"] * 5 + ["plan_drop", "invalidate", "reset"]),
                   min_size=1, max_size=10)


def valid_lens_near(gen, seq, T, state=None, layout=None):
    """Valid lengths for a drop: around the lengths (rejected drafts, rewritten positions), and
    with ``state`` sometimes exactly a position a row holds (the limit drops it), or far out of
    range either way (clamped: everything or nothing dropped)."""
    R = seq.shape[0]
    lens = seq - torch.randint(-2, T + 3, (R,), generator=gen, dtype=I32)
    pick = torch.rand(R, generator=gen)
    if state is not None:
        held = reference.view_state(state, layout).slot_pos[:, :layout.capacity]
        for r in range(R):
            live = held[r][held[r] >= 0]
            if pick[r] < 0.3 and live.numel():
                lens[r] = live[int(torch.randint(0, live.numel(), (1,), generator=gen))]
    extreme = torch.tensor([-(1 << 31), -7, -1, 0, reference.MAX_POSITION, (1 << 31) - 1], dtype=I32)
    wild = extreme[torch.randint(0, extreme.numel(), (R,), generator=gen)]
    return torch.where(pick > 0.9, wild, lens)


def idle_some(gen, seq, share=0.2):
    """``seq`` with about ``share`` of the rows idle this step (an engine's rows without a
    request): seq_len 0, or negative junk. The plan selects nothing for such a row and does not
    age it; only a drop (valid_lens < 2**24) changes its state (reference.idle_rows)."""
    idle = torch.rand(seq.shape[0], generator=gen) < share
    return torch.where(idle, torch.randint(-3, 1, seq.shape, generator=gen, dtype=I32), seq)


def run_session(twin, ops, seed, R, T, K, S):
    """Drive a twin through a drawn sequence of plan / plan with a drop / invalidate / reset."""
    gen = torch.Generator().manual_seed(seed)
    seq = torch.randint(1, 4 * S + 8, (R,), generator=gen, dtype=I32)
    for op in ops:
        if op in ("plan", "plan_drop"):
            lens = valid_lens_near(gen, seq, T, twin.ref_state, twin.layout) if op == "plan_drop" else None
            seq = seq + torch.randint(0, T + 1, (R,), generator=gen, dtype=I32)
            twin.plan(draw(gen, R, T, K, seq, hot=2 * T * K), idle_some(gen, seq), lens)
        elif op == "invalidate":
            twin.invalidate(seq - torch.randint(-2, T + 3, (R,), generator=gen, dtype=I32))
        else:
            twin.reset(torch.rand(R, generator=gen) < 0.5)


def colliding(buckets, count, base=5, offset=0):
    return [base + (offset + n) * buckets * buckets for n in range(count)]


CHUNK = 512   # the plan's selection chunk (kPlanChunk): lookup groups and miss runs are made of them
CHUNK_KINDS = ("hits", "fresh", "few", "run_edge", "new", "pad", "some_pad", "repeat", "collide",
               "stashed", "junk")


def chunk_mix(gen, state, layout, seq, T, K, kinds):
    """Selections ``[R, T, K]`` built chunk by chunk (CHUNK selections, counted across the query
    tokens), chunk c of every row of kind ``kinds[c % len(kinds)]``, from what ``state`` (the
    reference's) holds before the step:

    * ``hits``: resident positions only (repeats included); ``fresh``: residents no earlier chunk
      of the row selected (a later query token's chunk then marks new slots);
    * ``few``: hits and 1-40 new positions; ``run_edge``: hits and 127-200 new positions (a chunk's
      misses around the 128 a shared miss run stages per chunk); ``new``: new positions only;
    * ``pad``: all -1; ``some_pad``: hits, -1 and a few new positions; ``repeat``: the previous
      chunk again (MTP repeats across tokens); ``collide``: new positions sharing one probe
      sequence (stash pressure) among hits; ``stashed``: the positions the stash holds;
      ``junk``: out-of-range values among hits.

    New positions lie in [0, seq) and are not resident (a kind without residents falls back to
    new positions)."""
    R, N = seq.shape[0], T * K
    v = reference.view_state(state, layout)
    out = torch.full((R, N), -1, dtype=I32)
    for r in range(R):
        held = v.slot_pos[r, :layout.capacity]
        held = held[held >= 0]
        stash = v.stash_key[r, :int(v.stash_count[r])]
        stash = stash[stash >= 0]
        bound = max(1, int(seq[r]))

        def new(n):
            if n == 0:
                return torch.empty(0, dtype=I32)
            fresh = torch.randint(0, bound, (2 * n + 64,), generator=gen, dtype=I32)
            fresh = fresh[~torch.isin(fresh, held)][:n]
            return torch.cat([fresh, torch.full((n - fresh.numel(),), -1, dtype=I32)])

        def pick(pool, n):
            if pool.numel() == 0:
                return new(n)
            return pool[torch.randint(0, pool.numel(), (n,), generator=gen)]

        for c in range(-(-N // CHUNK)):
            n = min(CHUNK, N - c * CHUNK)
            kind = kinds[c % len(kinds)]
            lo = c * CHUNK
            if kind == "hits":
                chunk = pick(held, n)
            elif kind == "fresh":
                chunk = pick(held[~torch.isin(held, out[r, :lo])], n)
            elif kind in ("few", "run_edge", "some_pad", "collide", "junk"):
                chunk = pick(held, n)
                m = min(n, int(torch.randint(*((1, 41) if kind != "run_edge" else (127, 201)), (1,),
                                             generator=gen)))
                lanes = torch.randperm(n, generator=gen)[:m]
                if kind in ("few", "run_edge"):
                    chunk[lanes] = new(m)
                elif kind == "some_pad":
                    chunk[torch.rand(n, generator=gen) < 0.5] = -1
                    chunk[lanes[:m // 4]] = new(m // 4)
                elif kind == "collide":
                    family = colliding(layout.buckets, m, base=int(lanes[0]) + 1)
                    chunk[lanes] = torch.tensor([p if p < bound else -1 for p in family], dtype=I32)
                else:
                    junk = torch.tensor([-5, -2, bound + 3, 1 << 24, (1 << 31) - 1], dtype=I32)
                    chunk[lanes] = junk[torch.randint(0, junk.numel(), (m,), generator=gen)]
            elif kind == "new":
                chunk = new(n)
            elif kind == "pad":
                chunk = torch.full((n,), -1, dtype=I32)
            elif kind == "repeat":
                chunk = out[r, lo - n:lo].clone() if lo >= n else pick(held, n)
            elif kind == "stashed":
                chunk = pick(stash if stash.numel() else held, n)
            else:
                raise ValueError(f"kinds: unknown chunk kind {kind!r}")
            out[r, lo:lo + n] = chunk
    return out.view(R, T, K)
