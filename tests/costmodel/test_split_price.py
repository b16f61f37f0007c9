"""The decode model's split modes: priced by the serving core's rule (avsg.cache.split_rule),
never slower than avsg, no overlap where the cores do not allow it, the contention of a gather
on fewer cores, and device-resident KV's modelled TPOT kept where it does not fit."""
import dataclasses

import numpy as np
import pytest

from avsg import cli
from avsg.cache import manager, split_rule
from avsg.lab.costmodel import hardware, projection
from avsg.lab.costmodel import traffic as copy_traffic

from test_bench_decode import CONFIG, _costs, _trace, _traffic


def _hw(memory=True):
    hw = hardware.load_profile()
    if not memory:
        hw.override("hbm_bytes", 1e15, "test: no memory limit, to compare times")
    return hw


@pytest.mark.parametrize("drafts", [0, 1])
@pytest.mark.parametrize("launch_s", [0.0, 2e-6, 10e-6])
def test_the_split_is_never_slower_than_avsg_and_without_overlap_is_avsg(drafts, launch_s):
    hw, tr, costs = _hw(False), _traffic(drafts), _costs()
    for batch in (1, 8, 64):
        for rows in (5.0, 150.0, 1500.0):
            t = copy_traffic.Traffic(**{**tr.__dict__, "rows": {**tr.rows, "avsg": [rows] * 3}})
            p = projection.project(CONFIG, hw, t, costs, batch, 32768, 32, launch_s=launch_s,
                                   modes=("avsg", *projection.SPLIT_MODES))
            assert p["avsg-split"]["step_s"] <= p["avsg"]["step_s"] * (1 + 1e-12)
            assert p["avsg-split-o0"]["step_s"] == pytest.approx(p["avsg"]["step_s"], rel=1e-12)
            assert p["avsg-split-o0"]["split"]["layers_split"] == 0
            assert p["avsg-split-o0"]["split"]["overlap"] == 0
            assert p["avsg-split"]["split"]["overlap"] == 1
            # switched on without the overlap, the split only costs
            assert p["avsg-split-o0"]["split"]["forced_step_s"] > p["avsg"]["step_s"]


def test_the_split_step_is_avsgs_less_the_rules_gain():
    """Where the rule splits every layer, the iteration is avsg's less each layer's gain (main
    pass) and each draft pass's, as split_rule.price states them against avsg's one launch (its
    copy beside the end of the plan, its SyncAll)."""
    hw = _hw(False)
    costs = dataclasses.replace(_costs(), after_publish_us={})   # nothing beside: the rule splits
    tr = _traffic(1)
    rows = 600.0
    tr = copy_traffic.Traffic(**{**tr.__dict__, "rows": {**tr.rows, "avsg": [rows] * 3}})
    batch, launch_s = 16, 2e-6
    p = projection.project(CONFIG, hw, tr, costs, batch, 32768, 32, launch_s=launch_s,
                           modes=("avsg", "avsg-split"))
    fmt = projection.kv_format(hw)
    T = 1 + tr.drafts
    mla = projection.mla_time_s(CONFIG, hw, fmt, batch * T)
    prof = projection.split_profile(CONFIG, hw, fmt, mla, batch * T, True)
    K = CONFIG.index_topk
    added = manager.split_added_launches()
    # the rule weighs the split against avsg's one launch: its copy beside the end of the plan
    # and its SyncAll
    o = projection.layer_overhead_s("avsg", hw, fmt, costs, rows, batch, T, K, mla, False)
    one_launch = o["copy_s"] + o["sync_s"]
    main = split_rule.price(prof, batch, T, K, rows * batch, launch_s, True, added, one_launch)
    draft = split_rule.price(prof, batch, 1, K, rows * batch / T, launch_s, True, added,
                             o["copy_s"] / T + o["sync_s"])   # a draft pass launches: a whole SyncAll
    assert main.chosen and draft.chosen
    L = CONFIG.num_hidden_layers
    want = p["avsg"]["step_s"] - L * main.gain_s - tr.drafts * draft.gain_s
    assert p["avsg-split"]["step_s"] == pytest.approx(want, rel=1e-12)
    assert p["avsg-split"]["launches_per_layer"] == projection.launches_per_layer("avsg") + added


def test_no_overlap_where_attention_holds_every_core_and_fewer_gather_cores_cost():
    hw, costs = _hw(False), _costs()
    tr = copy_traffic.Traffic(**{**_traffic(0).__dict__,
                                 "rows": {**_traffic(0).rows, "avsg": [600.0] * 3}})
    args = (CONFIG, hw, tr, costs, 16, 32768, 32)
    avsg = projection.project(*args, modes=("avsg",))["avsg"]
    full = projection.project(*args, modes=("avsg-split",),
                              attention_cores=int(hw["aiv_cores"]))["avsg-split"]
    assert full["split"]["overlap"] == 0 and full["split"]["layers_split"] == 0
    assert full["step_s"] == pytest.approx(avsg["step_s"], rel=1e-12)
    # the gather on one core beside attention: latency-bound, the forced split pays for it
    many = projection.project(*args, modes=("avsg-split",), attention_cores=8)["avsg-split"]
    one = projection.project(*args, modes=("avsg-split",), attention_cores=8,
                             gather_cores=1)["avsg-split"]
    assert many["split"]["overlap"] == one["split"]["overlap"] == 1
    assert one["split"]["forced_step_s"] > many["split"]["forced_step_s"]
    assert one["step_s"] >= many["step_s"]


def test_device_keeps_its_modelled_tpot_where_it_does_not_fit():
    hw, costs, tr = _hw(), _costs(), _traffic(0)
    over = projection.max_batch(CONFIG, hw, "device", 32768, 1, 8192, 4096, 32) + 1
    d = projection.project(CONFIG, hw, tr, costs, over, 32768, 32, modes=("device",))["device"]
    assert not d["feasible"] and d["tpot_s"] is None
    assert d["modelled_tpot_s"] == pytest.approx(d["step_s"] / tr.tokens_per_iteration)
    roomy = projection.project(CONFIG, _hw(False), tr, costs, over, 32768, 32,
                               modes=("device",))["device"]
    assert roomy["tpot_s"] == pytest.approx(d["modelled_tpot_s"])


def test_split_modes_hold_avsgs_memory_plus_the_lists():
    hw = _hw()
    for mode in projection.SPLIT_MODES:
        a = projection.memory_per_card(CONFIG, hw, "avsg", 8, 32768, 2, 8192, 4096, 32)
        s = projection.memory_per_card(CONFIG, hw, mode, 8, 32768, 2, 8192, 4096, 32)
        assert s["kv_buffers"] == a["kv_buffers"]
        assert s["activations"] - a["activations"] == 8 * 2 * 2 * CONFIG.index_topk * 4


def test_bench_decode_records_the_split(tmp_path):
    trace = _trace(tmp_path)
    out = tmp_path / "out"
    assert cli.main(["bench", "decode", "--trace", str(trace), "--trace-steps", "40",
                     "--batch", "1,8", "--mtp", "0",
                     "--context", "32K", "--out", str(out), "--quiet"]) == 0
    import json
    data = json.load(open(out / "decode.json"))
    recs = [r for r in data["records"] if r["mode"] in projection.SPLIT_MODES]
    assert recs
    hw = hardware.load_profile()
    for r in recs:
        s = r["split"]
        assert s["attention_cores_assumed"] is True
        assert s["attention_cores"] == hw["attention_aiv_cores"]
        assert s["overlap"] == (1 if r["mode"] == "avsg-split" else 0)
        assert r["modelled_tpot_ms"] > 0 and s["forced_tpot_ms"] > 0
    dev = [r for r in data["records"] if r["mode"] == "device"]
    assert all(r["modelled_tpot_ms"] > 0 for r in dev)
    assert any(not r["feasible"] for r in dev)          # batch 8 at 32K does not fit a card
    for row in data["summary"]:
        for v in row["vs_fused_by_launch_us"].values():
            assert v["device_tpot_ms"] > 0
            assert v["avsg-split_tpot_ratio"] is None or v["avsg-split_tpot_ratio"] <= \
                v["tpot_ratio"] * (1 + 1e-12)
    assert {e["mtp"] for e in data["at_memory"]} == {0}
    for e in data["at_memory"]:
        assert set(e["bundled"]["modes"]) == set(projection.MODES)
        assert e["bundled"]["device_at_avsg_batch"]["modelled_tokens_per_s"] > 0


@pytest.mark.parametrize("args", [["--attention-cores", "41"], ["--gather-cores", "0"],
                                  ["--gather-cores", "41"]])
def test_bench_decode_split_cores_out_of_range_exit_2(args, capsys, tmp_path):
    try:
        status = cli.main(["bench", "decode", "--trace", str(_trace(tmp_path)), *args])
    except SystemExit as e:
        status = e.code
    assert status == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and args[0] in err[0]
