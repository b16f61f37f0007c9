"""Gather-kernel test cases shared by the kernel, fast-build and NPU tests: ``make_case`` builds a
random miss list over contiguous or paged pools with several (src, dst) pairs of different
dtypes and row widths (``ROW_MENU``), entries outside the pool and garbage in the padding;
``run_kernel`` / ``run_reference`` run it, ``same_bytes`` compares bit patterns; ``cases`` is
the hypothesis strategy.
"""
from __future__ import annotations

import dataclasses
from typing import List, Optional, Tuple

import torch
from hypothesis import strategies as st

import avsg  # noqa: F401  (loads the op library)
from avsg import reference

I32 = torch.int32


TILING_BYTES = 18 * 8 + 5 * 8 * 8     # sizeof(avsg::GatherTiling), op_host/gather_tiling.h: 18 scalars, 5 per-pair arrays


COPY_BYTES_MAX = 32 * 1024            # kGatherCopyBytesMax: wider rows are copied in pieces


COPY_BUFFERS = 4                      # kGatherCopyBuffers: reads one core keeps in flight


COUNT_SLOT_BYTES = 32                 # each core writes its count as one 32 B block


ROW_MENU: List[Tuple[torch.dtype, Tuple[int, ...]]] = [
    (torch.uint8, (1,)),
    (torch.float16, (1,)),
    (torch.uint8, (3,)),
    (torch.float32, (3,)),
    (torch.float32, (1, 5)),
    (torch.float32, (16,)),
    (torch.bfloat16, (64,)),
    (torch.float16, (256,)),
    (torch.uint8, (656,)),
    (torch.bfloat16, (512,)),
    (torch.bfloat16, (576,)),
]


def random_bytes(shape, dtype, gen) -> torch.Tensor:
    """Random bit patterns (NaNs and all) of the given dtype, so equality is about bytes."""
    item = torch.empty((), dtype=dtype).element_size()
    raw = torch.randint(0, 256, (*shape[:-1], shape[-1] * item), generator=gen, dtype=torch.uint8)
    return raw.view(dtype)


def kv_zeros(R: int, S: int, *row: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A zeroed device KV buffer ``[R, S, *row]`` with slots padded to 32 B (avsg.kv_slots)."""
    return avsg.kv_slots(R * S, row, dtype).view(R, S, *row)


def padded_slots(t: torch.Tensor) -> torch.Tensor:
    """``t [R, S, *row]`` copied into slots padded to 32 B (avsg.kv_slots), as every dst of a
    multi-core gather must be."""
    R, S, *row = t.shape
    out = avsg.kv_slots(R * S, row, t.dtype).view(t.shape)
    out.copy_(t)
    return out


def pitched_like_plan(miss_pos, miss_slots, miss_counts, extra: int = 0):
    """The index tensors laid out as the op library's plan writes them: rows at a pitch of
    N rounded up to 8 (+ ``extra`` int32), counts at a pitch of 8; garbage in the padding."""
    R, N = miss_pos.shape
    pitch = -(-N // 8) * 8 + extra

    def rows(t):
        out = torch.full((R, pitch), 0x7FFF0000, dtype=I32)
        out[:, :N] = t
        return out[:, :N]
    counts = torch.full((R, 8), -7, dtype=I32)
    counts[:, 0] = miss_counts
    return rows(miss_pos), rows(miss_slots), counts[:, 0]


@dataclasses.dataclass
class Case:
    miss_pos: torch.Tensor
    miss_slots: torch.Tensor
    miss_counts: torch.Tensor
    srcs: List[torch.Tensor]
    dsts: List[torch.Tensor]
    block_table: Optional[torch.Tensor]
    block_size: int             # 0 for a contiguous pool
    partition: str
    cores: int

    @property
    def row_bytes(self) -> List[int]:
        return [d[0, 0].numel() * d.element_size() for d in self.dsts]


def make_case(seed: int, R: int, N: int, S: int, formats, paged: bool, partition: str, cores: int,
              max_len: int = 24, block_size: int = 4, outside: float = 0.15,
              pitched: bool = False) -> Case:
    """A random miss list in the plan's layout: row r's first miss_counts[r] entries are misses
    (distinct slots; positions possibly outside the pool), the rest is garbage padding. Every dst
    has slots padded to 32 B; ``pitched``: the index tensors are strided views as a plan returns
    them (``pitched_like_plan``)."""
    gen = torch.Generator().manual_seed(seed)
    counts = torch.randint(0, N + 1, (R,), generator=gen, dtype=I32)
    if paged:
        max_blocks = -(-max_len // block_size)
        num_blocks = R * max_blocks + 2
        table = torch.randint(0, num_blocks, (R, max_blocks), generator=gen, dtype=I32)
        table[torch.rand(R, max_blocks, generator=gen) < outside] = -1          # holes
        table[torch.rand(R, max_blocks, generator=gen) < outside / 2] = num_blocks + 5  # beyond
        pool_lead = (num_blocks, block_size)
        pos_limit = max_blocks * block_size
    else:
        table = None
        pool_lead = (R, max_len)
        pos_limit = max_len
    # positions: mostly inside, some beyond the pool's end, some -1
    pos = torch.randint(0, pos_limit, (R, N), generator=gen, dtype=I32)
    beyond = torch.rand(R, N, generator=gen) < outside
    pos[beyond] = pos_limit + torch.randint(0, 7, (int(beyond.sum()),), generator=gen, dtype=I32)
    pos[torch.rand(R, N, generator=gen) < outside / 3] = -1
    slots = torch.randint(-3, S + 3, (R, N), generator=gen, dtype=I32)       # garbage padding
    for r in range(R):
        c = int(counts[r])
        slots[r, :c] = torch.randperm(S, generator=gen)[:c].to(I32)
    if partition == reference.SELECTION_PARTITION:
        # the selection layout: copies (distinct slots) scattered among hits (-1), some entries
        # with a slot out of range or a position of -1 (no-ops for kernel and reference alike)
        copy = torch.rand(R, N, generator=gen) < 0.6
        slots = torch.where(torch.rand(R, N, generator=gen) < 0.5, torch.full_like(slots, -1),
                            torch.full_like(slots, S + 1))
        for r in range(R):
            c = int(copy[r].sum())
            slots[r, copy[r]] = torch.randperm(S, generator=gen)[:c].to(I32)
        pos[~copy & (torch.rand(R, N, generator=gen) < 0.7)] = -1
    srcs, dsts = [], []
    for dtype, shape in formats:
        srcs.append(random_bytes((*pool_lead, *shape), dtype, gen))
        dsts.append(padded_slots(random_bytes((R, S, *shape), dtype, gen)))
    if pitched:
        pos, slots, counts = pitched_like_plan(pos, slots, counts, extra=8 * (seed % 2))
    return Case(pos, slots, counts, srcs, dsts, table, block_size if paged else 0, partition, cores)


def run_kernel(case: Case, dsts=None) -> torch.Tensor:
    dsts = case.dsts if dsts is None else dsts
    return torch.ops.avsg.gather(case.miss_pos, case.miss_slots, case.miss_counts, case.srcs, dsts,
                                 case.block_table, case.block_size, case.partition, case.cores)


def run_reference(case: Case, dsts) -> torch.Tensor:
    return reference.gather(case.miss_pos, case.miss_slots, case.miss_counts, case.srcs, dsts,
                            case.block_table, case.block_size or None, case.partition, case.cores)


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.contiguous().view(torch.uint8),
                                              b.contiguous().view(torch.uint8))


@st.composite
def cases(draw):
    R = draw(st.integers(1, 5))
    T = draw(st.integers(1, 3))
    K = draw(st.integers(1, 12))
    N = T * K
    S = N + draw(st.integers(0, 6))
    formats = draw(st.lists(st.sampled_from(ROW_MENU), min_size=1, max_size=3))
    paged = draw(st.booleans())
    partition = draw(st.sampled_from(reference.ALL_PARTITIONS))
    cores = draw(st.integers(1, 40))
    max_len = draw(st.integers(1, 40))
    block_size = draw(st.integers(1, 8))
    seed = draw(st.integers(0, 2**31 - 1))
    return make_case(seed, R, N, S, formats, paged, partition, cores, max_len=max_len,
                     block_size=block_size, pitched=draw(st.booleans()))
