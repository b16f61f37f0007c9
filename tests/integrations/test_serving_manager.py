"""SparseOffloadManager: lifecycle ops, row moves that keep the hits, the write path, bad input,
and torch.compile(fullgraph=True) of a layer step."""
import pytest
import torch

from avsg.cache import SparseOffloadManager
from avsg.cache.manager import serving_launches

R, T, K, S, BS, LAYERS = 3, 2, 8, 32, 8, 2
LATENT, ROPE = 16, 8
BLOCKS = 24


def make(**kwargs):
    args = dict(num_layers=LAYERS, max_rows=R, capacity=S, topk=K, queries_per_step=T,
                kv_format="bf16", resident_block_size=BS, latent_dim=LATENT, rope_dim=ROPE,
                max_context=BLOCKS * BS)
    args.update(kwargs)
    mgr = SparseOffloadManager(**args)
    gen = torch.Generator().manual_seed(0)
    host = [tuple(torch.randn(BLOCKS, BS, 1, c.width, generator=gen).to(c.dtype)
                  for c in mgr.kv_format.components) for _ in range(LAYERS)]
    mgr.register_host_kv(host)
    return mgr, host


def block_table(rows=R, per_row=6):
    return (torch.arange(rows * per_row, dtype=torch.int32).view(rows, per_row) * 5) % BLOCKS


def decode_inputs(step, rows=R, q_lens=None, seq0=20):
    """Every row decodes q_lens[r] tokens at seq0 + step...; top-k: a window that slides by one."""
    q_lens = q_lens or [T] * rows
    qsl = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0)), dtype=torch.int32)
    seq = torch.tensor([seq0 + step + q for q in q_lens], dtype=torch.int32)
    topk = []
    for r, q in enumerate(q_lens):
        for j in range(q):
            pos = int(seq[r]) - q + j
            window = [pos - i for i in range(K)]
            topk.append([p if p >= 0 else -1 for p in window])
    return qsl, seq, torch.tensor(topk, dtype=torch.int32).view(-1, 1, K)


def run_step(mgr, step, layer=0, order=None, **kwargs):
    """``order[i]``: the batch row that request i sits in this step (all rows busy)."""
    qsl, seq, topk = decode_inputs(step, **kwargs)
    bt = block_table()
    if order is not None:                      # the engine's tables follow its batch rows
        per_req_tokens = topk.view(R, T, 1, K)
        inverse = torch.argsort(torch.tensor(order))
        topk = per_req_tokens[inverse].reshape(-1, 1, K).contiguous()
        seq, bt = seq[inverse].contiguous(), bt[inverse].contiguous()
    meta = mgr.begin_step(qsl, seq, bt, qsl[-1].item())
    return mgr.retrieve(layer, topk, meta), topk


# ------------------------------------------------------------------------------- lifecycle

def test_move_and_swap_keep_every_hit():
    """The same requests, once in fixed rows and once moved and swapped between steps: every
    request gets the same slots, hits and state as if it had never moved."""
    still, _ = make()
    moving, _ = make()
    for mgr in (still, moving):
        for row in range(R):
            mgr.add(row)
    order = [0, 1, 2]                          # batch row of request i in `moving`
    for step in range(12):
        if step % 3 == 1:
            moving.swap_rows(0, 2)
            order = [{0: 2, 2: 0}.get(r, r) for r in order]
        if step % 4 == 2:                      # request in row 1 leaves, comes back via a move
            moving.swap_rows(1, 2)
            order = [{1: 2, 2: 1}.get(r, r) for r in order]
        want, _ = run_step(still, step)
        got, _ = run_step(moving, step, order=order)
        per_request = got.slots.view(R, T, K)[torch.argsort(torch.tensor(order))]
        assert torch.equal(per_request, want.slots.view(R, T, K))
        for i in range(R):                     # the resident block table follows the request
            assert torch.equal(got.block_table[order[i]], want.block_table[i])
    assert moving.hit_rate() == still.hit_rate() > 0.5
    for i in range(R):
        assert torch.equal(moving.buffers[0].state[moving.state_row(order[i])],
                           still.buffers[0].state[i])


def test_move_row_into_a_hole_like_condense():
    mgr, _ = make()
    for row in range(R):
        mgr.add(row)
    run_step(mgr, 0)
    before = mgr.state_row(2)
    mgr.free(0)
    mgr.move_row(2, 0)
    assert mgr.state_row(0) == before
    assert mgr.occupied.tolist() == [True, True, False]
    assert mgr.resident_block_table[0].tolist() == [before * (S // BS) + p for p in range(S // BS)]
    with pytest.raises(ValueError, match="src: batch row 2 holds no request"):
        mgr.move_row(2, 0)
    with pytest.raises(ValueError, match="dst: batch row 1 holds a request"):
        mgr.move_row(0, 1)


def test_add_resets_a_reused_row_and_free_needs_a_request():
    mgr, _ = make()
    mgr.add(0)
    with pytest.raises(ValueError, match="row: batch row 0 already holds a request"):
        mgr.add(0)
    with pytest.raises(ValueError, match="row: batch row 1 holds no request"):
        mgr.free(1)
    q = [T, 0, 0]
    for step in range(3):
        out, _ = run_step(mgr, step, q_lens=q)
    assert mgr.buffers[0].resident(0)
    mgr.free(0)
    mgr.add(0)                                  # a new request (or a resumed one): cold start
    assert mgr.buffers[0].resident(0) == {}
    hits = mgr.buffers[0].stats()["hits"]
    run_step(mgr, 3, q_lens=q)
    assert mgr.buffers[0].stats()["hits"] == hits


def test_uneven_tokens_and_prefill_bypass():
    """Requests with 2, 1 and 5 tokens (5 > T: a prefill chunk): the chunk's tokens bypass the
    buffer, padding tokens after qsl[-1] return -1, the others are exact."""
    mgr, host = make()
    for row in range(R):
        mgr.add(row)
    qsl = torch.tensor([0, 2, 3, 8], dtype=torch.int32)
    seq = torch.tensor([30, 25, 40], dtype=torch.int32)
    topk = torch.full((10, 1, K), -1, dtype=torch.int32)
    topk[0, 0, :3] = torch.tensor([3, 28, 10])
    topk[1, 0, :4] = torch.tensor([29, -1, 3, 11])     # -1 in the middle: slots come back compacted
    topk[2, 0, :2] = torch.tensor([24, 0])
    topk[3:8, 0, :1] = 1
    meta = mgr.begin_step(qsl, seq, block_table(), 10)
    out = mgr.retrieve(0, topk, meta)
    assert out.planned.tolist() == [True] * 3 + [False] * 7
    assert bool((out.slots[3:] == -1).all())
    assert out.kv_lens.tolist() == [S, S, 0]
    bt = block_table()
    for t, (row, positions) in enumerate([(0, [3, 28, 10]), (0, [29, 3, 11]), (1, [24, 0])]):
        slots = out.slots[t, 0]
        n = len(positions)
        assert bool((slots[n:] == -1).all())
        pages = out.block_table[row, (slots[:n] // BS).long()].long()
        for c in range(2):
            read = out.kv[c][pages, (slots[:n] % BS).long()]
            pos = torch.tensor(positions)
            want = host[0][c][bt[row, pos // BS].long(), pos % BS]
            assert torch.equal(read, want)


# ------------------------------------------------------------------------------ write path

def test_write_kv_goes_to_the_host_rows_of_the_slot_mapping():
    mgr, host = make()
    new = [torch.randn(4, 1, c.width).to(c.dtype) for c in mgr.kv_format.components]
    slot_mapping = torch.tensor([5, -1, 17, 100], dtype=torch.int64)
    before = [h.clone() for h in host[1]]
    mgr.write_kv(1, slot_mapping, new)
    for c in range(2):
        width = host[1][c].shape[-1]
        flat, old = host[1][c].view(-1, width), before[c].view(-1, width)
        assert torch.equal(flat[5], new[c][0, 0]) and torch.equal(flat[17], new[c][2, 0])
        assert torch.equal(flat[100], new[c][3, 0])
        untouched = torch.ones(flat.shape[0], dtype=torch.bool)
        untouched[[5, 17, 100]] = False
        assert torch.equal(flat[untouched], old[untouched])


def test_write_kv_out_of_range_unchecked_writes_nothing_else():
    mgr, host = make(check=False)
    new = [torch.randn(3, 1, c.width).to(c.dtype) for c in mgr.kv_format.components]
    before = [h.clone() for h in host[0]]
    mgr.write_kv(0, torch.tensor([-5, BLOCKS * BS + 3, 7]), new)
    for c in range(2):
        width = host[0][c].shape[-1]
        flat, old = host[0][c].view(-1, width), before[c].view(-1, width)
        assert torch.equal(flat[7], new[c][2, 0])
        keep = torch.ones(flat.shape[0], dtype=torch.bool)
        keep[7] = False
        assert torch.equal(flat[keep], old[keep])
    mgr.write_kv(0, torch.tensor([-1, -1]), [n[:2] for n in new])      # nothing valid at all
    assert all(torch.equal(host[0][c].view(-1, host[0][c].shape[-1])[keep],
                           before[c].view(-1, host[0][c].shape[-1])[keep]) for c in range(2))
    checked, _ = make()
    with pytest.raises(ValueError, match=r"slot_mapping\[1\] = 195: beyond the host pool's 192"):
        checked.write_kv(0, torch.tensor([-1, BLOCKS * BS + 3, 7]), new)


def test_write_through_fills_the_reserved_slot_without_a_host_copy():
    mgr, host = make(write_through=True)
    mgr.add(0)
    qsl = torch.tensor([0, 2], dtype=torch.int32)
    seq = torch.tensor([12], dtype=torch.int32)
    bt = block_table(1)
    new = [torch.randn(2, 1, c.width).to(c.dtype) for c in mgr.kv_format.components]
    slot_mapping = torch.tensor([int(bt[0, 1]) * BS + 2, int(bt[0, 1]) * BS + 3])  # pos 10, 11
    mgr.write_kv(0, slot_mapping, new)
    topk = torch.tensor([[[10, 3, -1, -1, -1, -1, -1, -1]], [[11, 10, 3, -1, -1, -1, -1, -1]]],
                        dtype=torch.int32)
    meta = mgr.begin_step(qsl, seq, bt, 2)
    out = mgr.retrieve(0, topk, meta, new_kv=new)
    assert int(mgr.write_through_rows) == 2 and int(mgr.h2d_rows) == 1    # only pos 3 copied
    slot_of = dict(zip(topk[1, 0, :3].tolist(), out.slots[1, 0, :3].tolist()))
    for c in range(2):
        assert torch.equal(mgr.kv[0][c][0, slot_of[10]], new[c][0])
        assert torch.equal(mgr.kv[0][c][0, slot_of[11]], new[c][1])


# ------------------------------------------------------------------------------- bad input

def test_tokens_of_a_row_without_a_request():
    mgr, _ = make()
    mgr.add(0)
    qsl, seq, topk = decode_inputs(0, rows=2)
    with pytest.raises(ValueError, match=r"query_start_loc: request 1 has 2 token\(s\) but batch "
                                         r"row 1 holds no request"):
        mgr.begin_step(qsl, seq, block_table(), 4)


def test_topk_beyond_seq_len():
    mgr, _ = make()
    for row in range(R):
        mgr.add(row)
    qsl, seq, topk = decode_inputs(0)
    topk[3, 0, 5] = int(seq[1])
    meta = mgr.begin_step(qsl, seq, block_table(), 6)
    with pytest.raises(ValueError, match=r"topk_indices\[token=3, 0, index=5\] = 22 is out of range: "
                                         r"expected < its request's seq_len = 22"):
        mgr.retrieve(0, topk, meta)


def test_block_table_too_short():
    mgr, _ = make()
    for row in range(R):
        mgr.add(row)
    qsl, seq, _ = decode_inputs(0)
    with pytest.raises(ValueError, match=r"block_table: request 0 has seq_len 22, which needs 3 "
                                         r"blocks of 8, but block_table has 2 columns"):
        mgr.begin_step(qsl, seq, block_table()[:, :2].contiguous(), 6)
    bt = block_table()
    bt[1, 2] = -1
    with pytest.raises(ValueError, match=r"block_table\[1, 2\] = -1: expected a host block"):
        mgr.begin_step(qsl, seq, bt, 6)
    with pytest.raises(ValueError, match=r"block_table: expected at least num_reqs = 3 rows"):
        mgr.begin_step(qsl, seq, bt[:2], 6)


def test_mismatched_layer_counts():
    mgr, host = make()
    with pytest.raises(ValueError, match=r"host_kv: expected 2 layers \(num_layers\), got 1"):
        mgr.register_host_kv(host[:1])
    with pytest.raises(ValueError, match=r"host_kv\[0\]: expected 2 components"):
        mgr.register_host_kv([host[0][:1], host[1]])
    for row in range(R):
        mgr.add(row)
    with pytest.raises(ValueError, match=r"layer: expected <= 1, got 2"):
        run_step(mgr, 0, layer=2)
    wt, _ = make(write_through=True)
    wt.add(0)
    qsl, seq, topk = decode_inputs(0, rows=1)
    meta = wt.begin_step(qsl, seq, block_table(1), 2)
    with pytest.raises(ValueError, match=r"new_kv: expected 2 components \(latent, pe\)"):
        wt.retrieve(0, topk, meta, new_kv=(torch.zeros(2, 1, LATENT, dtype=torch.bfloat16),))


def test_bad_input_unchecked_writes_nothing_outside_the_buffers():
    """check=False (the NPU default): every bad input above runs, and only the manager's own
    buffers and counters may change."""
    mgr, host = make(check=False)
    mgr.add(0)
    mgr.add(2)
    qsl, seq, topk = decode_inputs(0)
    topk[0, 0, 0] = 1000                       # beyond seq_len
    topk[1, 0, 1] = -7
    bt = block_table()[:, :2].contiguous()     # too short for seq_len 22
    bt[0, 0] = 999                             # and a block outside the pool
    inputs = [qsl, seq, topk, bt]
    snapshot = [t.clone() for t in inputs] + [h.clone() for layer in host for h in layer]
    meta = mgr.begin_step(qsl, seq, bt, 6)     # row 1 holds no request
    out = mgr.retrieve(1, topk, meta)
    assert bool((out.slots[2:4] == -1).all())  # the free row's tokens are dropped
    assert int(out.slots[0, 0, K - 1]) == -1 and int(out.slots[1, 0, K - 1]) == -1
    for before, after in zip(snapshot, inputs + [h for layer in host for h in layer]):
        assert torch.equal(before, after)
    for buf in mgr.buffers:
        buf.check_state()


# --------------------------------------------------------------------------------- compile

def layer_step(mgr, qsl, seq, bt, slot_mapping, topk, new):
    meta = mgr.begin_step(qsl, seq, bt, topk.shape[0])
    mgr.write_kv(1, slot_mapping, new)
    out = mgr.retrieve(1, topk, meta, new_kv=new)
    return out.slots, out.block_table, out.kv_lens, out.planned


@pytest.mark.parametrize("check", [False, True], ids=["check=False", "check=True"])
def test_compiled_layer_step_matches_eager(check):
    torch._dynamo.reset()
    eager, eager_host = make(write_through=True, check=check)
    graph, graph_host = make(write_through=True, check=check)
    for mgr in (eager, graph):
        for row in range(R):
            mgr.add(row)
    compiled = torch.compile(layer_step, fullgraph=True, backend="inductor")
    gen = torch.Generator().manual_seed(1)
    for step in range(4):
        qsl, seq, topk = decode_inputs(step)
        bt = block_table()
        pos = (seq[:, None] - T + torch.arange(T)[None, :]).reshape(-1)
        rows = torch.arange(R).repeat_interleave(T)
        slot_mapping = (bt[rows, pos // BS].long() * BS + pos % BS).contiguous()
        new = [torch.randn(R * T, 1, c.width, generator=gen).to(c.dtype)
               for c in eager.kv_format.components]
        want = layer_step(eager, qsl, seq, bt, slot_mapping, topk, new)
        got = compiled(graph, qsl, seq, bt, slot_mapping, topk, new)
        for a, b in zip(want, got):
            assert torch.equal(a, b)
        assert torch.equal(eager.buffers[1].state, graph.buffers[1].state)
        for a, b in zip(eager.kv[1], graph.kv[1]):
            assert torch.equal(a, b)
        for a, b in zip(eager_host[1], graph_host[1]):
            assert torch.equal(a, b)
    assert graph.buffers[1].stats()["hits"] > 0
    assert int(graph.write_through_rows) > 0


def test_compiled_retrieve_does_not_recompile_per_step():
    """begin_step eager, retrieve compiled (how a model runner splits them): the StepMeta's
    generation changes every step, and a guard on it would recompile the graph each time."""
    from torch._dynamo.testing import CompileCounter
    torch._dynamo.reset()
    mgr, _ = make(check=False)
    for row in range(R):
        mgr.add(row)
    counter = CompileCounter()

    def retrieve(mgr, topk, meta):
        out = mgr.retrieve(1, topk, meta)
        return out.slots, out.planned

    compiled = torch.compile(retrieve, fullgraph=True, dynamic=False, backend=counter)
    generations = set()
    for step in range(4):
        qsl, seq, topk = decode_inputs(step)
        meta = mgr.begin_step(qsl, seq, block_table(), topk.shape[0])
        generations.add(meta.generation)
        compiled(mgr, topk, meta)
    assert len(generations) == 4
    assert counter.frame_count == 1


def test_step_with_the_split_changes_nothing_but_adds_the_split_lists():
    """step(split=True): the same slots, copies, counts and buffer bytes as split=False, plus
    the hit/miss split of the slots (avsg.split_slots of the plan, cut to the pass's q), which
    costs the split_slots kernel's launch, and the copy's own launch apart from the plan's."""
    import avsg
    from torch.utils._python_dispatch import TorchDispatchMode

    class AvsgLaunches(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.namespace == "avsg":
                self.names.append(func.__name__.split(".")[0])
            return func(*args, **(kwargs or {}))
    outs, launched = [], {}
    for split in (False, True):
        mgr, _ = make()
        for r in range(R):
            mgr.add(r)
        got = []
        for step in range(4):
            seq = torch.full((R,), 20 + step, dtype=torch.int32)
            meta = mgr.begin_step_rtk(seq, T, block_table())
            pos = seq[:, None, None] - 1 - torch.arange(T * K).view(1, T, K) % (K + 2 * step)
            topk = torch.where(pos >= 0, pos, -1).to(torch.int32)
            with AvsgLaunches() as launches:
                out = mgr.step(0, topk, meta, split=split)
            launched.setdefault(split, []).append(launches.names)
            got.append((out.slots.clone(), out.host_pos.clone(), out.host_counts.clone(),
                        [kv.clone() for kv in mgr.kv[0]], out.split))
            if split:                       # the lists are the plan's split
                want = avsg.split_slots(out.plan)
                assert torch.equal(out.split.hits, want.hits[:, :T])
                assert torch.equal(out.split.misses, want.misses[:, :T])
        outs.append(got)
    # the split step's avsg launches: the plan and its copy apart (the copy on its own stream)
    # and the split_slots kernel; the unsplit step's are the serving path's (one fused launch)
    for plain, split in zip(launched[False], launched[True]):
        assert plain == list(serving_launches(fused=mgr.fuse_copy)), plain
        assert split == list(serving_launches(split=True)) + ["split_slots"], (plain, split)
    for (slots, pos, counts, kv, none), (slots2, pos2, counts2, kv2, split) in zip(*outs):
        assert none is None and torch.equal(slots, slots2) and torch.equal(pos, pos2)
        assert torch.equal(counts, counts2) and all(torch.equal(a, b) for a, b in zip(kv, kv2))
        hits, misses = split
        for r in range(R):
            for t in range(T):
                h = [s for s in hits[r, t].tolist() if s >= 0]
                m = [s for s in misses[r, t].tolist() if s >= 0]
                assert sorted(h + m) == sorted(s for s in slots[r, t].tolist() if s >= 0)
    # a bad switch is named, before anything runs
    mgr, _ = make()
    mgr.add(0)
    meta = mgr.begin_step_rtk(torch.full((R,), 5, dtype=torch.int32), T, block_table(),
                              active=torch.tensor([True, False, False]))
    with pytest.raises(TypeError, match="split"):
        mgr.step(0, torch.full((R, T, K), -1, dtype=torch.int32), meta, split="yes")


@pytest.mark.parametrize("fuse_copy", [None, False])
def test_gather_cores_is_the_copy_launch_core_count(fuse_copy):
    """gather_cores reaches the copy's launch (num_cores of plan_gather, or of the gather when
    the plan and the copy are apart) and changes no byte; bad values are named. Its default in
    plan_gather leaves the plan's row owners out of the copy."""
    from torch.utils._python_dispatch import TorchDispatchMode
    import avsg

    class Cores(TorchDispatchMode):
        seen = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.namespace == "avsg" and func._schema.name.split("::")[1] in ("gather", "plan_gather"):
                self.seen.append(args[-1])
            return func(*args, **(kwargs or {}))

    kv = []
    for cores in (None, 3):
        mgr, _ = make(gather_cores=cores, fuse_copy=fuse_copy)
        for r in range(R):
            mgr.add(r)
        with Cores():
            run_step(mgr, 0)
        kv.append([k.clone() for k in mgr.kv[0]])
    # by default plan_gather copies on the cores its plan leaves (the rows' owners finish their
    # rows meanwhile); a separate gather takes them all
    default = (avsg.get_num_cores() if fuse_copy is False
               else avsg.buffer.copy_cores_beside_plan(avsg.get_num_cores(), R))
    assert default != 3 and (fuse_copy is False or default == avsg.get_num_cores() - R)
    assert Cores.seen == [default, 3] and all(torch.equal(a, b) for a, b in zip(*kv))
    with pytest.raises(ValueError, match="gather_cores"):
        make(gather_cores=0)


def test_the_split_copy_marks_every_tensor_of_the_caller_it_reads():
    """With the split the copy runs on its own stream (an NPU's side stream): every tensor it
    reads that the caller's stream made (and may free once step returns) must be marked as in
    use by that stream (``CopyStream.copying``'s tensors), else the allocator may hand its memory
    out while the copy still reads it. The write-through's new KV was not marked: its rows could
    be overwritten before the copy wrote them into their slots, silently. Checked on CPU by
    recording what the copy's ops read."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from avsg.cache.overlap import CopyStream

    def storage(t):
        return t.untyped_storage().data_ptr()

    class Reads(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.read, self.made = set(), set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for a in torch.utils._pytree.tree_leaves((args, kwargs)):
                if isinstance(a, torch.Tensor) and storage(a) not in self.made:
                    self.read.add(storage(a))
            for o in torch.utils._pytree.tree_leaves(out):
                if isinstance(o, torch.Tensor) and not any(o is a for a in
                                                          torch.utils._pytree.tree_leaves(args)):
                    self.made.add(storage(o))
            return out

    class Recording(CopyStream):
        def __init__(self, device):
            super().__init__(device)
            self.unmarked = []

        def copying(self, *tensors):
            import contextlib

            @contextlib.contextmanager
            def run():
                with Reads() as reads:
                    yield
                marked = {storage(t) for t in tensors}
                self.unmarked.append(reads.read - marked)
            return run()

    mgr, host = make(write_through=True)
    for r in range(R):
        mgr.add(r)
    mgr.copy_stream = Recording(mgr.device)
    own = {storage(t) for layer in mgr.paged._storage for t in layer}
    own |= {storage(t) for layer in host for t in layer}
    own |= {storage(mgr.h2d_rows), storage(mgr.write_through_rows)}
    for step in range(3):
        seq = torch.full((R,), 20 + step, dtype=torch.int32)
        meta = mgr.begin_step_rtk(seq, T, block_table())
        new_kv = [torch.randn(R * T, 1, c.width).to(c.dtype) for c in mgr.kv_format.components]
        pos = seq[:, None, None] - 1 - torch.arange(T * K).view(1, T, K) % (K + 2 * step)
        topk = torch.where(pos >= 0, pos, -1).to(torch.int32)
        mgr.step(0, topk, meta, new_kv=new_kv, split=True)
        read = mgr.copy_stream.unmarked[-1] - own
        assert not read & {storage(t) for t in new_kv}, "new_kv read by the copy, not marked"
        assert not read, "the copy reads tensors of the caller's stream it does not mark"
