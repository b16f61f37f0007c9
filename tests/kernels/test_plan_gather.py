"""``plan_gather``: the plan and the gather of its misses as one launch.

Three copies of every session run side by side: the fused op, the two ops it replaces (``plan``,
then ``gather`` of its outputs) and the reference (``reference.plan_gather``). After every call
all three hold the same state, statistics, plan outputs, per-core counts and KV bytes, in the
strict and the fast emulation build, on random and adversarial sessions: hash collisions, full
buffers, MTP with repeats, ``-1`` padding and out-of-range junk, idle rows, drops (``valid_lens``), every
policy, contiguous and paged pools, every partition the fused op takes, one to many cores, the
split lookup. The KV buffers start as random bytes, so a byte written where no miss of this step
goes shows up. Rows the kernels reject (a header that does not match, with the host's checks off
as on an NPU) copy nothing; refused calls change nothing.
"""
from __future__ import annotations

import pytest
import torch

from avsg import backend, reference
from helpers.gather_cases import padded_slots, random_bytes
from helpers.plan_cases import colliding, draw, idle_some, split_lookup, valid_lens_near

I32 = torch.int32
POLICIES = ("lifetime", "reuse", "lru")


class Trio:
    """The fused op, plan + gather, and the reference, in lockstep over one geometry."""

    def __init__(self, R, T, K, S, policy, gen, paged=False, partition="miss", cores=3, pairs=1,
                 L=7, H=None, max_len=None):
        self.R, self.T, self.K, self.S = R, T, K, S
        self.H = H or reference.default_buckets(S)
        self.L, self.policy = L, policy
        self.C = (max_len or 4 * S + 16) if policy == "reuse" else 0
        self.layout = reference.Layout(S, self.H, self.C, policy == "reuse")
        self.pid = reference.POLICY_IDS[policy]
        self.partition, self.cores = partition, cores
        self.max_len = max_len or 4 * S + 16
        state = reference.new_state(R, self.layout, L, policy=policy)
        self.states = [state.clone() for _ in range(3)]
        self.stats = [torch.zeros(R, 4, dtype=torch.int64) for _ in range(3)]
        widths = [(4, torch.float32), (16, torch.bfloat16), (40, torch.uint8)]
        self.block_size = 4 if paged else None
        self.src, dst = [], []
        for i in range(pairs):
            width, dtype = widths[i % len(widths)]
            if paged:
                blocks = R * (-(-self.max_len // self.block_size)) + 3
                self.src.append(random_bytes((blocks, self.block_size, width), dtype, gen))
            else:
                self.src.append(random_bytes((R, self.max_len, width), dtype, gen))
            dst.append(random_bytes((R, S, width), dtype, gen))
        self.dst = [[padded_slots(d) for d in dst] for _ in range(3)]
        self.block_table = None
        if paged:   # a shuffled table: every request's blocks scattered over the pool
            per_row = -(-self.max_len // self.block_size)
            perm = torch.randperm(R * per_row + 3, generator=gen)[:R * per_row].to(I32)
            self.block_table = perm.view(R, per_row)

    def _args(self, i, topk, seq, lens):
        return (topk, seq, self.states[i], self.stats[i], self.S, self.H, self.L, self.pid, self.C, lens)

    def step(self, topk, seq, lens=None):
        bs = self.block_size or 0
        self.idle = reference.idle_rows(seq)
        fused = torch.ops.avsg.plan_gather(*self._args(0, topk, seq, lens), self.src, self.dst[0],
                                           self.block_table, bs, self.partition, self.cores)
        if backend.get_emulation() == "strict":
            self.fused_phases = backend.last_launch_phases()
        planned = torch.ops.avsg.plan(*self._args(1, topk, seq, lens))
        copied = torch.ops.avsg.gather(planned[1], planned[2], planned[3], self.src, self.dst[1],
                                       self.block_table, bs, self.partition, self.cores)
        want = reference.plan_gather(self.states[2], self.stats[2], topk, seq, self.layout, self.L,
                                     self.src, self.dst[2], self.block_table, self.block_size,
                                     self.partition, self.cores, policy=self.policy, valid_lens=lens)
        for name, a, b, c in zip(("slots", "miss_pos", "miss_slots", "miss_counts", "copied"),
                                 fused, (*planned, copied), want):
            assert torch.equal(a, b), f"{name}: plan_gather differs from plan + gather"
            assert torch.equal(a, c), f"{name}: plan_gather differs from the reference"
        self.check()
        return fused

    def check(self):
        for i in (1, 2):
            assert torch.equal(self.states[0], self.states[i]), f"state differs ({i})"
            assert torch.equal(self.stats[0], self.stats[i]), f"stats differ ({i})"
            for p, (a, b) in enumerate(zip(self.dst[0], self.dst[i])):
                assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), f"dst[{p}] differs ({i})"

    def reads_host(self, out, topk, seq):
        """Every valid selection's slot holds its position's host row after the step."""
        slots = out[0]
        for r, t, k in ((topk >= 0) & (topk < seq[:, None, None])).nonzero().tolist():
            pos, slot = int(topk[r, t, k]), int(slots[r, t, k])
            for s, d in zip(self.src, self.dst[0]):
                if self.block_table is None:
                    row = s[r, pos]
                else:
                    row = s[int(self.block_table[r, pos // self.block_size]), pos % self.block_size]
                assert torch.equal(d[r, slot].view(torch.uint8), row.view(torch.uint8)), (r, t, k)


def session(trio, gen, steps, drops=True, wild=0.05):
    seq = torch.randint(1, trio.max_len // 2, (trio.R,), generator=gen, dtype=I32)
    for _ in range(steps):
        lens = None
        if drops and torch.rand(1, generator=gen).item() < 0.4:
            lens = valid_lens_near(gen, seq, trio.T, trio.states[2], trio.layout)
        seq = (seq + torch.randint(0, trio.T + 1, (trio.R,), generator=gen, dtype=I32)).clamp(max=trio.max_len)
        topk = draw(gen, trio.R, trio.T, trio.K, seq, hot=2 * trio.T * trio.K, wild=wild)
        planned = idle_some(gen, seq)
        out = trio.step(topk, planned, lens)
        if wild == 0:
            trio.reads_host(out, topk, planned)


@pytest.mark.parametrize("build", ["strict", "fast"])
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("seed", range(3))
def test_random_sessions_match_plan_then_gather_and_the_reference(build, policy, seed):
    gen = torch.Generator().manual_seed(100 + seed)
    R, T, K = (3, 1, 16), (2, 2, 8), (1, 4, 6)
    shape = (R, T, K)[seed]
    S = [2 * shape[1] * shape[2], shape[1] * shape[2], 40][seed]        # a full buffer in seed 1
    with backend.emulation(build):
        trio = Trio(*shape, S=S, policy=policy, gen=gen, paged=seed == 2,
                    partition=reference.PARTITIONS[seed], cores=(1, 3, 8)[seed])
        session(trio, gen, steps=8)


@pytest.mark.parametrize("policy", POLICIES)
def test_every_selection_reads_its_host_row(policy):
    gen = torch.Generator().manual_seed(7)
    trio = Trio(2, 2, 8, 24, policy, gen, paged=True, cores=4)
    session(trio, gen, steps=10, wild=0.0)


@pytest.mark.parametrize("policy", POLICIES)
def test_hash_collisions_and_a_full_buffer(policy):
    """Positions that share one probe sequence fill the buckets and the stash, in a buffer that
    holds exactly one step's selections."""
    gen = torch.Generator().manual_seed(3)
    R, T, K = 2, 2, 8
    trio = Trio(R, T, K, T * K, policy, gen, cores=5, H=64, max_len=200_000)
    pos = torch.tensor(colliding(64, T * K), dtype=I32)
    seq = torch.full((R,), int(pos.max()) + 1, dtype=I32)
    for step in range(4):
        topk = pos.roll(step * 3).view(1, T, K).repeat(R, 1, 1).clone()
        topk[1, 1] = topk[1, 0]                 # MTP repeats across query tokens
        topk[0, 0, :step] = -1                  # padding
        trio.step(topk, seq)
        trio.reads_host(trio.step(topk, seq), topk, seq)   # the second step: every one a hit


def test_the_split_lookup_composes():
    """With the split lookup a row's lookup runs on several blocks that sync once; the fused op
    adds blocks past the plan's (its gather takes more cores), which join that sync."""
    gen = torch.Generator().manual_seed(11)
    with split_lookup():
        for cores in (1, 7):
            trio = Trio(1, 2, 600, 1400, "lifetime", gen, cores=cores, max_len=4000)
            session(trio, gen, steps=3)


@pytest.mark.parametrize("build", ["strict", "fast"])
@pytest.mark.parametrize("policy", ["lifetime", "lru", "reuse"])
@pytest.mark.parametrize("rows, emulated, split", [(1, 2, 2), (1, 3, 3), (1, 4, 4), (2, 6, 3),
                                                   (2, 40, 4)])
def test_both_forms_of_the_split_compose(build, policy, rows, emulated, split):
    """plan_gather with each form of the split lookup (3 chunks a row): a row's own core looking
    up chunks too (on 2 cores it takes 2 of them, on 3 one), or, with a core beside one per
    chunk, none. Sessions with drops and junk selections, then without, bit for bit as plan,
    then gather, and the reference."""
    from avsg.buffer import lookup_split
    gen = torch.Generator().manual_seed(7 * emulated + rows)
    saved = backend.emulated_cores()
    backend.set_emulated_cores(emulated)
    try:
        assert lookup_split(emulated, rows, 2 * 600, 1400) == split
        with backend.emulation(build), split_lookup():
            trio = Trio(rows, 2, 600, 1400, policy, gen, cores=min(3, emulated), max_len=4000)
            session(trio, gen, steps=6)
            session(trio, gen, steps=3, wild=0)
            if build == "strict":   # the plan's blocks, and the copy's past them
                assert trio.fused_phases.per_block.shape[0] >= rows * split
    finally:
        backend.set_emulated_cores(saved)


@pytest.mark.parametrize("build", ["strict", "fast"])
@pytest.mark.parametrize("emulated, rows", [(2, 3), (4, 3), (40, 3), (3, 8), (2, 7)])
def test_the_copy_starts_beside_the_rows_it_waits_for(build, emulated, rows):
    """The plan publishes each row's miss lists after its victims, and every block meets the others
    once all its rows have published (phase "publish" of its last planned row); the copy then runs
    on the blocks after the owners while they finish their rows. 3 rows on 4 cores: the launch
    takes the 4, and the copy's cores 1 to 3 run on owner blocks after their rows; on 40: 3 + 4
    blocks, no owner copies. More rows than cores (3 on 2, 8 on 3, 7 on 2): a block plans its
    idle rows first and meets the others at its last other row's publish, so every count is out
    before any copy starts. Idle rows come and go (a block of idle rows only meets them at its
    end). All bit for bit as plan, then gather, and the reference, in both builds (the strict
    one shows where each block meets the others)."""
    gen = torch.Generator().manual_seed(21 + rows)
    saved = backend.emulated_cores()
    backend.set_emulated_cores(emulated)
    try:
        with backend.emulation(build):
            copiers = min(4, emulated)
            trio = Trio(rows, 2, 8, 24, "lifetime", gen, cores=copiers)
            for _ in range(3):
                session(trio, gen, steps=2)
                if build == "fast":
                    continue
                phases = trio.fused_phases
                blocks = max(min(rows, emulated), copiers, min(emulated, rows + copiers))
                assert phases.per_block.shape[0] == blocks
                publish = phases.phase("publish")["sync_alls"]
                # one SyncAll a block: at a publish where the block plans a row that is not idle
                planning = [int(any(not bool(trio.idle[r]) for r in range(k, rows, blocks)))
                            for k in range(blocks)]
                assert publish.tolist() == planning
                assert int(phases.per_block[:, :, phases.fields.index("sync_alls")].sum()) == blocks
    finally:
        backend.set_emulated_cores(saved)


def test_more_pairs_than_one_launch_holds():
    gen = torch.Generator().manual_seed(5)
    trio = Trio(2, 1, 8, 16, "lifetime", gen, pairs=10, cores=2)
    session(trio, gen, steps=3)


def test_a_rejected_row_copies_nothing():
    """With the host's value checks off (an NPU reads no state), a row whose header does not
    match is rejected by the kernel: miss_counts -1, no state change, no byte copied into it,
    exactly as plan then gather."""
    gen = torch.Generator().manual_seed(9)
    trio = Trio(3, 1, 8, 16, "lifetime", gen, cores=4)
    session(trio, gen, steps=2, drops=False)
    for st in trio.states[:2]:
        st[1, reference.HEADER_CAPACITY] += 1          # row 1 no longer matches the geometry
    before = [d.clone() for d in trio.dst[0]]
    state_row = trio.states[0][1].clone()
    seq = torch.full((3,), 40, dtype=I32)
    topk = torch.arange(8, dtype=I32).view(1, 1, 8).repeat(3, 1, 1) + 20
    old = torch.ops.avsg._set_host_value_checks(False)
    try:
        bs = trio.block_size or 0
        fused = torch.ops.avsg.plan_gather(*trio._args(0, topk, seq, None), trio.src, trio.dst[0],
                                           None, bs, "miss", 4)
        planned = torch.ops.avsg.plan(*trio._args(1, topk, seq, None))
        torch.ops.avsg.gather(planned[1], planned[2], planned[3], trio.src, trio.dst[1], None, bs, "miss", 4)
    finally:
        torch.ops.avsg._set_host_value_checks(old)
    assert int(fused[3][1]) == -1 and int(fused[3][0]) > 0
    for a, b in zip(fused[:4], planned):
        assert torch.equal(a, b)
    assert torch.equal(trio.states[0][1], state_row)
    for d, b in zip(trio.dst[0], before):
        assert torch.equal(d[1].view(torch.uint8), b[1].view(torch.uint8)), "a rejected row was written"
    assert torch.equal(trio.states[0], trio.states[1])
    for a, b in zip(trio.dst[0], trio.dst[1]):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))


@pytest.mark.parametrize("bad, error, needle", [
    ({"partition": "selection"}, ValueError, "partition"),
    ({"partition": "nope"}, ValueError, "partition"),
    ({"num_cores": 0}, ValueError, "num_cores"),
    ({"dst_slots": 8}, ValueError, "dst"),
    ({"dst_dtype": torch.float64}, TypeError, "src[0]"),
    ({"capacity": 32}, ValueError, "capacity"),
    ({"topk_dtype": torch.int64}, TypeError, "topk_pos"),
])
def test_refused_calls_change_nothing(bad, error, needle):
    gen = torch.Generator().manual_seed(1)
    trio = Trio(2, 1, 8, 16, "lifetime", gen)
    session(trio, gen, steps=2)
    state, stats = trio.states[0].clone(), trio.stats[0].clone()
    dst = [d.clone() for d in trio.dst[0]]
    topk = torch.randint(0, 30, (2, 1, 8), generator=gen, dtype=I32).to(bad.get("topk_dtype", I32))
    seq = torch.full((2,), 30, dtype=I32)
    d = trio.dst[0]
    if "dst_slots" in bad or "dst_dtype" in bad:
        d = [torch.zeros(2, bad.get("dst_slots", 16), 4, dtype=bad.get("dst_dtype", torch.float32))]
    with pytest.raises(error, match=needle.replace("[", r"\[").replace("]", r"\]")):
        torch.ops.avsg.plan_gather(topk, seq, trio.states[0], trio.stats[0], bad.get("capacity", 16),
                                   trio.H, trio.L, trio.pid, trio.C, None, trio.src, d, None, 0,
                                   bad.get("partition", "miss"), bad.get("num_cores", 2))
    assert torch.equal(trio.states[0], state) and torch.equal(trio.stats[0], stats)
    for a, b in zip(trio.dst[0], dst):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))
