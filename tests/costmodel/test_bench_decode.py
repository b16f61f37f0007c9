"""The decode projection: the link bounds every modelled copy, memory decides feasibility, the plan
cost follows the kernel's counted work, and ``avsg bench decode`` writes its records."""
import dataclasses
import json
import math

import numpy as np
import pytest
import torch

from avsg import cli, reference
from avsg.buffer import lookup_split
from avsg.lab.costmodel import hardware, host_lru, plan_cost, projection
from avsg.lab.costmodel import traffic as copy_traffic
from avsg.model_config import from_hf_config
from avsg.lab.traces import synth
from avsg.lab.traces.format import save_trace

CONFIG = from_hf_config(projection.V32_CONFIG)
RECORD_KEYS = ("mode", "batch", "context", "mtp", "profile", "launch_us", "launches_per_layer",
               "feasible", "tpot_ms", "tokens_per_s", "h2d_bytes_per_token", "plan_us_per_layer",
               "copy_us_per_layer", "rows_per_layer", "memory_gb")


def test_link_time_never_beats_the_link():
    hw = hardware.load_profile()
    for rows in (1, 100, 10_000, 1_000_000):
        for row_bytes in (656, 1152):
            t = hardware.link_time_s(hw, rows, row_bytes)
            assert t >= rows * row_bytes / hw["link_bytes_per_s"]
            assert t >= rows * hw["host_dma_latency_s"] / (hw["aiv_cores"] * hw["dma_in_flight_per_core"])


def test_profile_entries_name_their_source():
    hw = hardware.load_profile()
    for key, source in hw.sources().items():
        assert source, key


def test_kv_format_is_bf16_without_fp8_hardware():
    hw = hardware.load_profile()
    assert not hw["fp8_compute"]
    assert projection.kv_format(hw).row_bytes == 2 * (CONFIG.kv_lora_rank + CONFIG.qk_rope_head_dim)
    hw.override("fp8_compute", 1, "test")
    fmt = projection.kv_format(hw)
    # 512 e4m3 + 4 fp32 scales + 64 bf16 RoPE
    assert fmt.row_bytes == CONFIG.kv_lora_rank + 4 * 4 + 2 * CONFIG.qk_rope_head_dim


def _traffic(drafts=0):
    from test_fused_peer import _summary
    L = 3
    return copy_traffic.Traffic(drafts, 0.0, 1.0 + drafts * 0.5, 8192, 4096,
                          {"offload": [2048.0 * (1 + drafts)] * L, "lru-host": [400.0] * L,
                           "lru-device": [150.0, 120.0, 200.0], "slotmap-device": [160.0] * L,
                           "fused-2048": [600.0] * L, "fused-4096": [400.0] * L,
                           "avsg": [140.0, 110.0, 190.0]}, "test",
                          {"fused-2048": _summary(600), "fused-4096": _summary(400)})


def _costs(plan=100.0):
    # a quarter of the plan after its miss lists are out (avsg's plan_gather copies beside it)
    return plan_cost.Costs({m: {T: plan * T for T in range(1, 5)}
                            for m in ("avsg", "lru-device", "slotmap-device")}, 30.0, "test",
                           {m: {T: plan * T / 4 for T in range(1, 5)} for m in ("avsg", "lru-device")})


def test_memory_is_the_sum_of_its_parts_and_decides_feasibility():
    hw = hardware.load_profile()
    fmt = projection.kv_format(hw)
    L = CONFIG.num_hidden_layers + CONFIG.num_nextn_predict_layers
    batch, context, T, capacity, cards = 5, 65536, 2, 8192, 32
    m = projection.memory_per_card(CONFIG, hw, "avsg", batch, context, T, capacity, 4096, cards)
    # the op's state per slot: its layout at H = 2S (int16 buckets, four int32 slot sections)
    state = (reference.Layout(capacity, 2 * capacity).width - reference.STATE_HEADER) * 4 // capacity
    hand_kv = batch * L * (capacity * (fmt.row_bytes + state) + 4 * context)
    hand_index = batch * L * context * fmt.index_row_bytes
    assert m["kv_buffers"] == hand_kv and m["indexer_keys"] == hand_index
    assert m["total"] == pytest.approx(m["weights"] + hand_kv + hand_index + m["activations"])
    assert m["feasible"] == (m["total"] <= hw["hbm_bytes"])
    dev = projection.memory_per_card(CONFIG, hw, "device", 1, context, T, capacity, 4096, cards)
    assert dev["kv_buffers"] == L * context * fmt.row_bytes
    host = projection.memory_per_card(CONFIG, hw, "lru-host", 3, context, T, capacity, 4096, cards)
    assert host["kv_buffers"] == 3 * L * T * 4096 * fmt.row_bytes
    # more cards, fewer expert weights per card
    assert (projection.weights_per_card(CONFIG, 64, 1.0) < projection.weights_per_card(CONFIG, 32, 1.0)
            < projection.weights_per_card(CONFIG, 16, 1.0))


def test_the_largest_batch_fits_and_one_more_is_infeasible_and_not_projected():
    hw = hardware.load_profile()
    traffic, costs = _traffic(1), _costs()
    for mode in projection.MODES:
        b = projection.max_batch(CONFIG, hw, mode, 32768, 2, 8192, 4096, 32)
        if b:
            fits = projection.project(CONFIG, hw, traffic, costs, b, 32768, 32, modes=(mode,))[mode]
            assert fits["feasible"] and fits["tpot_s"] > 0
        over = projection.project(CONFIG, hw, traffic, costs, b + 1, 32768, 32, modes=(mode,))[mode]
        assert not over["feasible"]
        assert over["tpot_s"] is None and over["tokens_per_s"] is None
        assert over["memory"]["total"] > hw["hbm_bytes"]


def test_projection_is_monotone_and_device_is_the_floor():
    hw = hardware.load_profile()
    hw.override("hbm_bytes", 1e15, "test: no memory limit, to compare times")
    traffic, costs = _traffic(0), _costs()
    prev = None
    for batch in (1, 8, 32, 64):
        p = projection.project(CONFIG, hw, traffic, costs, batch, 32768, 32)
        steps = {m: p[m]["step_s"] for m in projection.MODES}
        assert all(steps["device"] <= s for s in steps.values())
        assert p["device"]["h2d_bytes_per_token"] == 0
        if prev:
            assert all(steps[m] >= prev[m] for m in projection.MODES)
        prev = steps
        longer = projection.project(CONFIG, hw, traffic, costs, batch, 131072, 32)
        assert all(longer[m]["step_s"] >= p[m]["step_s"] for m in projection.MODES)
    more = dict(traffic.rows, avsg=[r * 2 for r in traffic.rows["avsg"]])
    p = projection.project(CONFIG, hw, traffic, costs, 8, 32768, 32, modes=("avsg",))
    q = projection.project(CONFIG, hw, copy_traffic.Traffic(**{**traffic.__dict__, "rows": more}), costs, 8,
                       32768, 32, modes=("avsg",))
    assert q["avsg"]["step_s"] > p["avsg"]["step_s"]
    hidden = projection.project(CONFIG, hw, traffic, costs, 8, 32768, 32, overlap_avsg=True,
                            modes=("avsg",))
    assert hidden["avsg"]["step_s"] <= p["avsg"]["step_s"]
    # avsg's one launch (plan_gather) pays a SyncAll; a copy beside attention launches the plan alone
    sync_us = hw["sync_all_cycles"] / (hw["clock_ghz"] * 1e3)
    assert hidden["avsg"]["plan_us_per_layer"] == pytest.approx(p["avsg"]["plan_us_per_layer"] - sync_us)
    # avsg-apart's copy follows its plan on the main stream, --overlap or not: its whole link
    apart = [projection.project(CONFIG, hw, traffic, costs, 8, 32768, 32, overlap_avsg=o,
                                modes=(projection.APART_MODE,))[projection.APART_MODE]
             for o in (False, True)]
    assert apart[0]["step_s"] == apart[1]["step_s"] > 0
    assert apart[0]["copy_s"] == pytest.approx(
        CONFIG.num_hidden_layers * np.mean([projection._link_s(hw, rows * 8, projection.kv_format(hw).row_bytes)
                                             for rows in traffic.rows["avsg"]]))


def test_sensitivity_profiles_scale_the_named_constants():
    hw = hardware.load_profile()
    pess, opt = projection.profile_variant(hw, "pessimistic"), projection.profile_variant(hw, "optimistic")
    for key in projection.SENSITIVE:
        assert pess[key] == pytest.approx(3 * hw[key]) and opt[key] == pytest.approx(hw[key] / 3)
    assert pess["link_bytes_per_s"] == hw["link_bytes_per_s"]
    est = [hardware.launch_estimate(plan_cost.slotmap_counters(2048, 150), p)["serial_pipe_us"]
           for p in (opt, hw, pess)]
    assert est[0] < est[1] < est[2]


def test_slotmap_counted_work_grows_with_misses_and_selections():
    hw = hardware.load_profile()
    t = lambda n, m: hardware.launch_estimate(plan_cost.slotmap_counters(n, m), hw)["serial_pipe_us"]  # noqa: E731
    assert t(2048, 0) < t(2048, 500) < t(2048, 2000)
    assert t(2048, 100) < t(8192, 100)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_host_lru_matches_its_statement(seed):
    rng = np.random.default_rng(seed)
    S, K, max_pos = 24, 10, 80
    lru = host_lru.HostLRU(2, S, K, max_pos)
    state = [(np.full(S, -1, np.int32), np.arange(S, dtype=np.int32)) for _ in range(2)]
    valid = 60
    for step in range(60):
        if step % 7 == 6:
            valid = int(rng.integers(30, max_pos))       # a speculative suffix dropped
        sel = np.stack([np.sort(rng.choice(valid, K, replace=False)) for _ in range(2)]).astype(np.int32)
        sel[rng.random(sel.shape) < 0.1] = -1            # -1 padding
        misses = lru.step(sel, np.full(2, valid, np.int32))
        for r, (slot_pos, order) in enumerate(state):
            held = set(slot_pos[(slot_pos >= 0) & (slot_pos < valid)].tolist())
            slots = host_lru.reference_step(slot_pos, order, sel[r], valid)
            assert np.array_equal(slots, lru.slot_of[r])
            assert np.array_equal(slot_pos, lru.slot_pos[r]) and np.array_equal(order, lru.order[r])
            wanted = set(sel[r][sel[r] >= 0].tolist())
            assert misses[r] == len(wanted - held)


def _trace(tmp_path):
    trace = tmp_path / "t.npz"
    save_trace(trace, synth.generate(steps=80, layers=2, k=2048, max_len=8000, seed=0))
    return trace


def _run(tmp_path, trace, name, extra=()):
    out = tmp_path / name
    status = cli.main(["bench", "decode", "--trace", str(trace), "--trace-steps", "40",
                       "--batch", "1,8", "--context", "32768", "--mtp", "0,1",
                       "--out", str(out), *extra])
    assert status == 0
    return json.loads((out / "decode.json").read_text())


def test_bench_decode_writes_every_record_and_follows_the_counted_work(tmp_path, monkeypatch):
    trace = _trace(tmp_path)
    base = _run(tmp_path, trace, "base")
    records = base["records"]
    assert base["estimate"] is True and base["kv_format"]["row_bytes"] == 1152
    hw = hardware.load_profile()
    launch_costs = {0.0, 2.0, 5.0, 10.0, 1e6 * hw["launch_graph_s"], 1e6 * hw["launch_eager_s"]}
    assert base["launch_us"]["records"] == pytest.approx(sorted(launch_costs))
    keys = [(r["mode"], r["batch"], r["context"], r["mtp"], r["profile"], r["launch_us"])
            for r in records]
    assert len(keys) == len(set(keys))
    assert set(keys) == {(m, b, 32768, n, p, u) for m in projection.MODES for b in (1, 8)
                         for n in (0, 1) for p in projection.PROFILES
                         for u in base["launch_us"]["records"]}
    assert {"fused-2048", "fused-4096"} <= set(projection.PEERS)
    # TPOT moves with the launch cost by the mode's launches, and only by them
    by_launch = {(r["mode"], r["batch"], r["mtp"], r["profile"], r["launch_us"]): r
                 for r in records}
    for (mode, b, n, p, u), r in by_launch.items():
        # the split modes add the split's launches on the layers where the rule split
        split = r["split"]["layers_split"] if mode in projection.SPLIT_MODES else 0.0
        assert r["launches_per_layer"] == pytest.approx(
            (1 - split) * projection.launches_per_layer(mode)
            + split * projection.launches_per_layer(mode, split_chosen=True))
        if r["feasible"] and u == 10.0:
            zero = by_launch[(mode, b, n, p, 0.0)]
            assert (r["tpot_ms"] > zero["tpot_ms"]) == (r["launches_per_layer"] > 0)
    # the sensitivity beside each ratio: avsg vs the best peer at 0, 2, 5 and 10 us per launch
    for row in base["summary"]:
        assert set(map(float, row["by_launch_us"])) == set(launch_costs)
        for u, got in row["by_launch_us"].items():
            if got["tpot_ratio"] is not None:
                peer = by_launch[(got["best_peer"], row["batch"], row["mtp"], "bundled", float(u))]
                mine = by_launch[("avsg", row["batch"], row["mtp"], "bundled", float(u))]
                assert got["tpot_ratio"] == pytest.approx(mine["tpot_ms"] / peer["tpot_ms"])
        for u, got in row["vs_fused_by_launch_us"].items():       # avsg vs the better fused
            fused = [by_launch[(m, row["batch"], row["mtp"], "bundled", float(u))]
                     for m in ("fused-2048", "fused-4096")]
            fused = [f["tpot_ms"] for f in fused if f["feasible"]]
            mine = by_launch[("avsg", row["batch"], row["mtp"], "bundled", float(u))]
            apart = by_launch[(projection.APART_MODE, row["batch"], row["mtp"], "bundled", float(u))]
            if fused and mine["feasible"]:
                assert got["tpot_ratio"] == pytest.approx(mine["tpot_ms"] / min(fused))
                assert got["avsg-apart_tpot_ratio"] == pytest.approx(apart["tpot_ms"] / min(fused))
    records = [r for r in records if r["launch_us"] == 1e6 * hw["launch_graph_s"]]
    for r in records:
        assert all(k in r for k in RECORD_KEYS)
        if r["feasible"]:
            assert r["tpot_ms"] > 0 and r["tokens_per_s"] > 0
        else:
            assert r["tpot_ms"] is None and r["tokens_per_s"] is None
        if r["mode"] == "device":
            assert r["h2d_bytes_per_token"] == 0 and r["plan_us_per_layer"] == 0
    by = {(r["mode"], r["batch"], r["mtp"], r["profile"]): r for r in records}
    assert set(base["launches_per_layer"]) == set(projection.MODES)
    # avsg-apart (an NPU's serving core before avsg doctor verified the cross-core wait): avsg's
    # plan without plan_gather's SyncAll, the same rows, all of its copy after the plan, and the
    # plan and the gather as two launches
    for (mode, b, n, p), r in by.items():
        if mode != projection.APART_MODE:
            continue
        a, hwp = by[("avsg", b, n, p)], projection.profile_variant(hw, p)
        sync_us = 1e6 * hwp["sync_all_cycles"] / (hwp["clock_ghz"] * 1e9)
        assert (r["launches_per_layer"], a["launches_per_layer"]) == (2, 1)
        assert r["rows_per_layer"] == a["rows_per_layer"] and r["memory_gb"] == a["memory_gb"]
        # its plan is a launch of its own, one core per row (no split before avsg doctor): the
        # slowest block whole, at most plan_gather's blocks meeting after the publish (slowest
        # before + slowest after) one core per row, without the SyncAll
        unsplit = base["matching_us_per_row"][p]["avsg"][str(1 + n)]
        assert 0 < r["plan_us_per_layer"] <= unsplit + 1e-6
        # avsg's: plan_gather's SyncAll and its plan with the lookup split over the cores the
        # rows leave (at batch 1 and 8 on 40 cores every row's lookup splits)
        split = lookup_split(int(hwp["aiv_cores"]), b, (1 + n) * CONFIG.index_topk, 8192)
        assert split > 1
        counted = {(e["T"], e["split"]): e["plan_us"] for e in base["split_plan_us"][p]["avsg"]}
        assert a["plan_us_per_layer"] == pytest.approx(sync_us + counted[(1 + n, split)])
        # lru-device, the op's lru policy, is given the same split (its plan alone: no SyncAll)
        lru = {(e["T"], e["split"]): e["plan_us"] for e in base["split_plan_us"][p]["lru-device"]}
        assert by[("lru-device", b, n, p)]["plan_us_per_layer"] == pytest.approx(
            lru[(1 + n, split)])
        if b == 1:      # 39 cores copy beside the end of avsg's plan; avsg-apart's 40 after it
            assert r["copy_us_per_layer"] > a["copy_us_per_layer"]
    for n in (0, 1):
        tr = base["traffic"][str(n)]["rows"]
        assert len(tr["avsg"]) == 2                      # every layer of the trace
        assert np.mean(tr["offload"]) >= max(np.mean(tr[m]) for m in tr)
    for b in (1, 8):
        for n in (0, 1):
            a = [by[("avsg", b, n, p)]["plan_us_per_layer"] for p in ("optimistic", "bundled",
                                                                      "pessimistic")]
            assert a[0] < a[1] < a[2]
    # the same run with the kernel's counted work doubled: plan's cost doubles, copies do not move
    from avsg import backend
    real = backend.last_launch_phases

    def doubled():
        c = real()
        return backend.LaunchPhases(c.names, c.fields, c.per_block * 2)
    monkeypatch.setattr(backend, "last_launch_phases", doubled)
    patched = _run(tmp_path, trace, "patched")
    pby = {(r["mode"], r["batch"], r["mtp"], r["profile"]): r for r in patched["records"]
           if r["launch_us"] == 1e6 * hw["launch_graph_s"]}
    for key, r in by.items():
        mode = key[0]
        if mode in ("avsg", "lru-device", *projection.SPLIT_MODES):
            assert pby[key]["plan_us_per_layer"] == pytest.approx(2 * r["plan_us_per_layer"],
                                                                  rel=0.05)
            assert pby[key]["plan_us_per_layer"] > r["plan_us_per_layer"]
            if r["feasible"]:
                assert pby[key]["tpot_ms"] > r["tpot_ms"]
        elif mode in ("device", "offload", "fused-2048", "fused-4096"):
            assert pby[key]["tpot_ms"] == r["tpot_ms"]
        assert pby[key]["h2d_bytes_per_token"] == r["h2d_bytes_per_token"]


@pytest.mark.parametrize("args", [["--batch", "0"], ["--mtp", "5"], ["--cards", "0"],
                                  ["--hw", "/no/such.json"], ["--link-gbps", "-1"],
                                  ["--topk-buffer-size", "10"], ["--trace-layers", "-1"],
                                  ["--context", "10"]])
def test_bench_decode_bad_input_exit_2(args, capsys, tmp_path):
    extra = [] if args[0] in ("--batch", "--mtp", "--cards", "--hw") else [
        "--trace", str(_trace(tmp_path))]
    try:
        status = cli.main(["bench", "decode", *extra, *args])
    except SystemExit as e:         # a range the argument parser checks
        status = e.code
    assert status == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and args[0] in err[0]


def test_avsg_runs_projection_line_is_the_decode_model(monkeypatch):
    """`avsg run`'s last line goes through projection.project with the run's copies and plan's
    counted cost: the same figures as calling the model directly."""
    from types import SimpleNamespace as NS
    from avsg.commands.run import project_on_npu
    seen = []
    monkeypatch.setattr(plan_cost, "counted_plan_on", lambda *a, **k: (seen.append(k), ["counted"])[1])
    monkeypatch.setattr(plan_cost, "counted_plan_us",
                        lambda launches, hw, statistic="mean", synced=False, split=1:
                        (123.0 - 10.0 * (split > 1), 7.0))
    records = [NS(emitted=[1, 1]) for _ in range(10)]
    outputs = {0: [1] * 15, 1: [1] * 15}
    kv_layers, iterations = 5, 10 * 2 * 5
    results = [NS(mode="offload", records=records, outputs=outputs, h2d_rows=iterations * 3000.0),
               NS(mode="avsg", records=records, outputs=outputs, h2d_rows=iterations * 200.0),
               NS(mode="device", records=records, outputs=outputs, h2d_rows=0.0)]
    workload = NS(rows=4, requests=[NS(context_len=32768)] * 4)
    args = NS(mtp=1, topk=2048, capacity=8192, trace=None, policy="lifetime")
    line = project_on_npu(results, workload, args, kv_layers)
    copies = copy_traffic.Traffic(1, 0.0, 30 / 20, 8192, 4096,
                             {"offload": [3000.0], "avsg": [200.0]}, "test")
    # 4 rows of 2 x 2048 selections (8 chunks) on 40 cores: each row on 9 (buffer.lookup_split)
    split = lookup_split(40, 4, 2 * 2048, 8192)
    assert split == 9
    direct = projection.project(CONFIG, hardware.load_profile(), copies,
                                plan_cost.Costs({"avsg": {2: 123.0}}, 0.0, "", {"avsg": {2: 7.0}},
                                                {"avsg": {(2, split): (113.0, 7.0)}}),
                                4, 32768, 32,
                                modes=("device", "offload", "avsg"))
    for mode in ("device", "offload", "avsg"):
        assert line[mode]["feasible"] == direct[mode]["feasible"]
        assert line[mode]["tpot_s"] == pytest.approx(direct[mode]["tpot_s"])
    hw = hardware.load_profile()       # the counted split plan and plan_gather's SyncAll
    assert line["avsg"]["plan_us_per_layer"] == pytest.approx(
        113.0 + hw["sync_all_cycles"] / (hw["clock_ghz"] * 1e3))
    # counted one core per row, then at the rows' split; both at the run's own acceptance
    assert [k.get("split", 1) for k in seen] == [1, split]
    assert all(k["accept_mean"] == pytest.approx(30 / 20 - 1) for k in seen)


def test_launch_counters_then_adds_per_block_and_keeps_the_larger_max():
    from avsg import backend
    fields = backend.counter_fields()
    gen = np.random.default_rng(0)
    first = backend.LaunchCounters(fields, torch.from_numpy(gen.integers(0, 100, (3, len(fields)))),
                                   {"Add": torch.tensor([[1, 2]] * 3)})
    later = backend.LaunchCounters(fields, torch.from_numpy(gen.integers(0, 100, (3, len(fields)))),
                                   {"Add": torch.tensor([[3, 4]] * 3), "Min": torch.tensor([[5, 6]] * 3)})
    both = first.then(later)
    for f in fields:
        want = (torch.maximum(first[f], later[f]) if f.endswith("_max") else first[f] + later[f])
        assert torch.equal(both[f], want), f
    assert any(f.endswith("_max") for f in fields)
    assert both.vector_apis["Add"].tolist() == [[4, 6]] * 3 and "Min" in both.vector_apis
    with pytest.raises(ValueError, match="later"):
        first.then(backend.LaunchCounters(fields, first.per_block[:2], {}))


@pytest.mark.parametrize("T", [1, 2, 4])
def test_counted_serving_matching_is_the_plan_with_its_drop_on_the_traffic_schedule(T, monkeypatch):
    """With an acceptance model each counted iteration is what the serving manager launches per
    layer: one plan that also drops everything at or past the pass's first position (every
    pass: whether a draft was rejected is on the device; the last pass's rejected drafts go
    there), the iterations advancing 1 + a steps, as the copy traffic's do. No separate
    invalidate runs. Without one, every draft is accepted and the plan drops nothing."""
    from avsg import backend
    from avsg.buffer import SparseKVBuffer
    from avsg.lab.traces.mtp import draw_accepted
    trace = synth.generate(steps=120, layers=2, k=256, max_len=4000, seed=1)
    sel, positions = np.asarray(trace.sel), np.asarray(trace.positions)
    args = (sel, positions, int(trace.T), "lifetime", T, 1024)
    drops, invalidated = [], []
    real_plan, real_invalidate = SparseKVBuffer.plan, SparseKVBuffer.invalidate

    def plan(self, topk, seq, *rest, valid_lens=None, **kwargs):
        drops.append(None if valid_lens is None else valid_lens.tolist())
        return real_plan(self, topk, seq, *rest, valid_lens=valid_lens, **kwargs)
    monkeypatch.setattr(SparseKVBuffer, "plan", plan)
    monkeypatch.setattr(SparseKVBuffer, "invalidate", lambda self, lens: (
        invalidated.append(lens.tolist()), real_invalidate(self, lens))[1])
    plain = plan_cost.counted_plan_on(*args, warmup=24, measured=6)
    assert drops and all(d is None for d in drops)
    drops.clear()

    accept = 0.4 * (T - 1)
    serving = plan_cost.counted_plan_on(*args, warmup=24, accept_mean=accept)
    measured = plan_cost.COUNTED_MTP_LAUNCHES if T > 1 else plan_cost.COUNTED_LAUNCHES
    assert len(serving) == measured
    assert not invalidated                             # the drop rides in the plan's launch
    # the schedule, drawn independently: iteration i starts at step s_i and drops from there
    schedule = draw_accepted(24 + measured, T - 1, accept) if T > 1 else np.zeros(24 + measured, int)
    want, step, i = [], 0, 0
    while len(want) < len(drops):
        want.append([int(positions[step])] * 2)
        step += 1 + int(schedule[i])
        i += 1
    assert drops == want
    if T > 1:
        assert any(a < T - 1 for a in schedule[:i]) and any(a == T - 1 for a in schedule[:i])
    drops.clear()
    plan_only = plan_cost.counted_plan_on(*args, warmup=24, accept_mean=accept, phases=True)
    assert drops == want                               # the same state, phases or not
    summed = [i for i, f in enumerate(backend.counter_fields()) if not f.endswith("_max")]
    for counters, phases in zip(serving, plan_only):  # one launch: its phases add up to it
        assert torch.equal(counters.per_block[:, summed], phases.per_block.sum(1)[:, summed])
    hw = hardware.load_profile()
    assert plan_cost.counted_us(serving, hw, "mean") > 0
    assert len(plain) == 6
    with pytest.raises(ValueError, match="statistic"):
        plan_cost.counted_us(serving, hw, "p99")


def test_slotmap_counted_work_grows_with_rejected_drafts():
    hw = hardware.load_profile()
    t = lambda r: hardware.launch_estimate(plan_cost.slotmap_counters(4096, 150, r), hw)["serial_pipe_us"]  # noqa: E731
    assert t(0.0) < t(1.0) < t(2.0)


def test_avsgs_copy_runs_beside_the_end_of_its_plan():
    """avsg's one launch (plan_gather): a SyncAll, and, with a core per row and the copy on the
    cores the plan leaves, the copy beside the plan's phases after its miss lists are out: the
    layer takes plan + SyncAll + max(copy on those cores, what runs beside) - beside."""
    from avsg.buffer import copy_cores_beside_plan
    hw = hardware.load_profile()
    fmt = projection.kv_format(hw)
    sync = hw["sync_all_cycles"] / (hw["clock_ghz"] * 1e9)
    P = int(hw["aiv_cores"])
    for batch, rows in ((1, 130.0), (8, 130.0), (8, 4.0), (32, 130.0)):
        for beside_us in (0.0, 6.0):
            costs = plan_cost.Costs({"avsg": {1: 20.0}}, 0.0, "test", {"avsg": {1: beside_us}})
            o = projection.layer_overhead_s("avsg", hw, fmt, costs, rows, batch, 1, 2048, 0.0, False)
            cores = copy_cores_beside_plan(P, batch)
            link = projection._link_s(hw, rows * batch, fmt.row_bytes, cores=cores)
            assert o["match_s"] == pytest.approx(20e-6 + sync)
            if cores < P:
                assert o["copy_s"] == pytest.approx(max(0.0, link - beside_us * 1e-6))
            else:       # every core holds a row's owner: the copy waits for the rows
                assert o["copy_s"] == pytest.approx(projection._link_s(hw, rows * batch, fmt.row_bytes))


def test_counted_plan_us_prices_plan_gathers_mid_plan_sync():
    """Two blocks: one slow before the publish, the other slow after it. Alone (the plan op) a
    launch takes its slowest block; in plan_gather every block meets the others after the
    publish, so it takes the slowest "before" plus the slowest "after"."""
    import torch
    from avsg import backend
    hw = hardware.load_profile()
    fields = backend.counter_fields()
    names = ("lookup", "victims", *plan_cost.AFTER_PUBLISH)
    per_block = torch.zeros(2, len(names), len(fields), dtype=torch.int64)
    reads = fields.index("scalar_ub_reads")
    us = hw["scalar_ub_cycles"] / (hw["clock_ghz"] * 1e3)      # one scalar UB read, in us
    per_block[0, names.index("lookup"), reads] = 1000           # block 0: 1000 reads before
    per_block[1, names.index("lookup"), reads] = 200
    per_block[0, names.index("insert"), reads] = 100            # block 1: 600 reads after
    per_block[1, names.index("insert"), reads] = 600
    launch = backend.LaunchPhases(names, fields, per_block)
    alone, after = plan_cost.counted_plan_us([launch], hw)
    assert alone == pytest.approx(1100 * us) and after == pytest.approx(600 * us)
    synced, after = plan_cost.counted_plan_us([launch], hw, synced=True)
    assert synced == pytest.approx(1600 * us) and after == pytest.approx(600 * us)


def test_counted_plan_us_waits_for_the_slowest_lookup_part():
    """A split launch (2 rows x 2 parts: block b works on row b % 2). The split's SyncParts is a
    SyncAll of the launch, so every owner goes on from the slowest lookup part of any row (here
    row 0's helper), then finishes its row alone: its fold (in "split sync+fold"), merge, decay,
    victims and publish, then the phases after the publish."""
    from avsg import backend
    hw = hardware.load_profile()
    fields = backend.counter_fields()
    names = ("lookup", "split sync+fold", "merge misses", "decay+pin", "victims", "publish",
             "split helper", *plan_cost.AFTER_PUBLISH)
    per_block = torch.zeros(4, len(names), len(fields), dtype=torch.int64)
    reads = fields.index("scalar_ub_reads")
    us = hw["scalar_ub_cycles"] / (hw["clock_ghz"] * 1e3)
    work = {(0, "lookup"): 100, (0, "split sync+fold"): 60, (0, "victims"): 300,      # row 0's
            (0, "insert"): 450,                                                        # owner
            (2, "split helper"): 700, (2, "split sync+fold"): 10,                      # its helper
            (1, "lookup"): 400, (1, "split sync+fold"): 50, (1, "merge misses"): 20,   # row 1's
            (1, "decay+pin"): 30, (1, "publish"): 40, (1, "victims"): 400,             # owner
            (1, "insert"): 400,
            (3, "split helper"): 100, (3, "split sync+fold"): 10}                      # its helper
    for (b, name), n in work.items():
        per_block[b, names.index(name), reads] = n
    launch = backend.LaunchPhases(names, fields, per_block)
    # every owner from 700 (row 0's helper); row 0: + 360, then 450; row 1: + 540, then 400
    alone, after = plan_cost.counted_plan_us([launch], hw, split=2)
    assert alone == pytest.approx(1640 * us) and after == pytest.approx(450 * us)
    synced, _ = plan_cost.counted_plan_us([launch], hw, synced=True, split=2)
    assert synced == pytest.approx((1240 + 450) * us)
    # read as four rows of one block each, nothing waits for another block
    assert plan_cost.counted_plan_us([launch], hw)[0] == pytest.approx(1340 * us)
    with pytest.raises(ValueError, match="split"):
        plan_cost.counted_plan_us([launch], hw, split=3)


def test_avsgs_plan_is_priced_at_its_lookup_split():
    """avsg's plan_gather runs with AVSG_NPU_SPLIT=1, so its plan's lookup spreads over the cores
    its rows leave (buffer.lookup_split); avsg-apart runs before avsg doctor, one core per row.
    Costs counted without the split price avsg one core per row; a split they lack is an
    error, not the unsplit figure."""
    hw = hardware.load_profile()
    fmt = projection.kv_format(hw)
    sync = hw["sync_all_cycles"] / (hw["clock_ghz"] * 1e9)
    costs = plan_cost.Costs({"avsg": {1: 20.0}}, 0.0, "test", {"avsg": {1: 5.0}},
                            {"avsg": {(1, 5): (15.0, 4.0), (1, 4): (16.0, 4.0),
                                      (1, 2): (18.0, 4.5)}})
    tr = _traffic()
    # 4 chunks per row: 40 cores give one row 5 (its owner looks up none), 10 rows 4 each
    for batch, plan_us in ((1, 15.0), (8, 15.0), (10, 16.0), (20, 18.0), (21, 20.0),
                           (41, 2 * 20.0)):
        o = projection.layer_overhead_s("avsg", hw, fmt, costs, 100.0, batch, 1, 2048, 0.0,
                                        False, tr)
        assert o["match_s"] == pytest.approx(plan_us * 1e-6 + sync), batch
    apart = projection.layer_overhead_s(projection.APART_MODE, hw, fmt, costs, 100.0, 1, 1, 2048,
                                        0.0, False, tr)
    assert apart["match_s"] == pytest.approx(20e-6)
    unsplit = dataclasses.replace(costs, split_plan_us=None)
    o = projection.layer_overhead_s("avsg", hw, fmt, unsplit, 100.0, 1, 1, 2048, 0.0, False, tr)
    assert o["match_s"] == pytest.approx(20e-6 + sync)
    with pytest.raises(ValueError, match="split: no counted avsg plan at T = 1 .* 3 ways"):
        projection.layer_overhead_s("avsg", hw, fmt, costs, 100.0, 13, 1, 2048, 0.0, False, tr)
    assert plan_cost.serving_splits(40, (1, 8, 13, 20, 21, 64), (1, 2), 2048, 8192) == {
        1: [2, 3, 5], 2: [2, 3, 5, 9]}
