"""The plan kernel's counters by phase (AVSG_PHASE markers, strict emulation): per block the phases
add up to the launch's counters exactly (hash and dual-pointer plans, every policy, split and
unsplit lookups), each step lands in its own phase, kernels without markers have one phase, the
fast build refuses to answer; plan_cost.phase_breakdown prices them as the launch estimate does;
``avsg bench plan --phases`` prints a table with every phase and refuses contradicting options."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from avsg import backend, cli
from avsg.buffer import lookup_split
from avsg.lab.costmodel import hardware, plan_cost
from avsg.lab.traces import synth
from avsg.lab.traces.format import save_trace

from helpers.plan_cases import I32, Twin, draw, split_lookup

PHASES = ("setup", "row start", "stash runs", "lookup", "classify", "split sync+fold",
          "merge misses", "heat", "decay+pin", "victims", "publish", "lives back", "insert", "stash pending",
          "output+store", "split helper")
SUMMED = tuple(f for f in backend.counter_fields() if not f.endswith("_max"))


def _check_sums(phases: backend.LaunchPhases, counters: backend.LaunchCounters):
    assert phases.fields == counters.fields
    assert phases.per_block.shape == (counters.blocks, len(phases.names), len(counters.fields))
    for i, field in enumerate(phases.fields):
        per_phase = phases.per_block[:, :, i]
        want = counters.per_block[:, i]
        got = per_phase.max(1).values if field.endswith("_max") else per_phase.sum(1)
        assert torch.equal(got, want), field


def _work(phases: backend.LaunchPhases, name: str) -> torch.Tensor:
    """Per block: every summed counter of the phase, added."""
    c = phases.phase(name)
    return sum(c[f] for f in SUMMED)


@pytest.mark.parametrize("matcher", ["hash", "dual_pointer"])
@pytest.mark.parametrize("policy", ["lifetime", "reuse", "lru"])
@pytest.mark.parametrize("cores", [2, 8, 40], ids=["unsplit", "split", "spare"])
def test_phases_add_up_to_the_launch_counters(matcher, policy, cores):
    # 4 chunks of 512 per row: on 2 cores no split (rows * 2 > cores); on 8 a hash row splits
    # over 4 cores, its owner looking up a chunk; on 40 over 5, its owner looking up none
    R, T, K, S, H = 2, 2, 1000, 2048, 2048
    C = 4 * S if policy == "reuse" else 0
    split = cores > R
    gen = torch.Generator().manual_seed(7)
    saved = backend.emulated_cores()
    backend.set_emulated_cores(cores)
    try:
        with backend.emulation("strict"), split_lookup():
            twin = Twin(R, S, H, 4, matcher=matcher, max_context=C, policy=policy)
            seq = torch.randint(S, 3 * S, (R,), generator=gen, dtype=I32)
            for step in range(3):
                twin.plan(draw(gen, R, T, K, seq, hot=2 * S), seq)
                counters, phases = backend.last_launch_counters(), backend.last_launch_phases()
                assert phases.names == PHASES
                _check_sums(phases, counters)
                splits = matcher == "hash" and split
                parts = lookup_split(cores, R, T * K, S) if splits else 1
                assert counters.blocks == R * parts == R * {2: 1, 8: 4, 40: 5}[cores if splits else 2]
                owners, helpers = slice(0, R), slice(R, None)
                for name in ("setup", "row start", "lookup", "decay+pin", "output+store"):
                    assert bool((_work(phases, name)[owners] > 0).all()), name
                # an owner with a core to spare beside one per chunk classifies no chunk
                looks_up = parts <= 4
                assert bool((_work(phases, "classify")[owners] > 0).all()) == looks_up
                if step > 0:   # misses of a filled buffer: merged, victims, inserted
                    for name in ("merge misses", "victims", "insert"):
                        assert bool((_work(phases, name)[owners] > 0).all()), name
                assert bool((_work(phases, "heat") > 0).any()) == (policy == "reuse")
                assert bool((_work(phases, "split sync+fold")[owners] > 0).all()) == splits
                helper_work = _work(phases, "split helper")
                assert bool((helper_work[owners] == 0).all())
                if splits:
                    assert bool((helper_work[helpers] > 0).all())
                    # a helper does nothing but its part, then meets the owner in the SyncAll
                    # (under "split sync+fold": plan_cost.counted_plan_us waits for the slowest
                    # part there)
                    meet = phases.phase("split sync+fold")
                    assert bool((meet["sync_alls"][helpers] == 1).all())
                    assert bool((helper_work[helpers] + _work(phases, "setup")[helpers]
                                 + _work(phases, "split sync+fold")[helpers]
                                 == sum(counters[f] for f in SUMMED)[helpers]).all())
                    assert bool((phases.phase("split helper")["sync_alls"] == 0).all())
                seq += T
    finally:
        backend.set_emulated_cores(saved)


def test_a_kernel_without_markers_has_one_phase():
    twin = Twin(2, 256, 512, 3)
    seq = torch.full((2,), 600, dtype=I32)
    twin.plan(draw(torch.Generator().manual_seed(1), 2, 1, 128, seq, hot=500), seq)
    twin.invalidate(seq - 5)
    phases, counters = backend.last_launch_phases(), backend.last_launch_counters()
    assert phases.names == ("kernel",)
    _check_sums(phases, counters)
    assert torch.equal(phases.per_block[:, 0], counters.per_block)


def test_after_a_fast_launch_phases_are_refused():
    twin = Twin(1, 256, 512, 3)
    seq = torch.full((1,), 600, dtype=I32)
    with backend.emulation("fast"):
        twin.plan(draw(torch.Generator().manual_seed(2), 1, 1, 128, seq, hot=500), seq)
        with pytest.raises(RuntimeError, match="fast emulation"):
            backend.last_launch_phases()
    with pytest.raises(KeyError, match="phase: expected one of"):
        plan_launch_phases().phase("no such phase")


def plan_launch_phases():
    twin = Twin(1, 256, 512, 3)
    seq = torch.full((1,), 600, dtype=I32)
    twin.plan(draw(torch.Generator().manual_seed(3), 1, 1, 128, seq, hot=500), seq)
    return backend.last_launch_phases()


def test_phase_breakdown_prices_phases_as_the_launch_estimate():
    hw = hardware.load_profile()
    twin = Twin(3, 2048, 2048, 4)
    gen = torch.Generator().manual_seed(5)
    seq = torch.full((3,), 5000, dtype=I32)
    launches, estimates = [], []
    for _ in range(3):
        twin.plan(draw(gen, 3, 1, 1024, seq, hot=4000), seq)
        launches.append(backend.last_launch_phases())
        estimates.append(hardware.launch_estimate(backend.last_launch_counters(), hw))
        seq += 1
    one = plan_cost.phase_breakdown(launches[:1], hw)
    assert one["total"]["serial_us"] == pytest.approx(estimates[0]["serial_pipe_us"])
    assert sum(r["serial_us"] for r in one["phases"]) == pytest.approx(one["total"]["serial_us"])
    assert [r["phase"] for r in one["phases"]] == list(PHASES)
    each = plan_cost.phase_breakdown(launches, hw, blocks="each")
    assert each["samples"] == sum(launch.per_block.shape[0] for launch in launches)
    per_block = [us for e in estimates for us in e["serial_per_block_us"]]
    assert each["total"]["serial_us"] == pytest.approx(float(np.median(per_block)))
    slowest = plan_cost.phase_breakdown(launches, hw)
    assert slowest["samples"] == 3
    assert sum(r["share"] for r in slowest["phases"]) == pytest.approx(1.0)
    for r in (*one["phases"], one["total"]):   # one sample: its serial-pipe us is its pipes' sum
        pipes = sum(r[f"{p}_us"] for p in ("scalar", "vector", "mte2", "mte3", "sync"))
        assert r["serial_us"] == pytest.approx(pipes)
    total = launches[0].per_block.sum(1)
    b = int(torch.tensor(estimates[0]["serial_per_block_us"]).argmax())
    assert one["total"]["mte2_bytes"] == float(total[b, launches[0].fields.index("mte2_bytes")])
    with pytest.raises(ValueError, match="blocks"):
        plan_cost.phase_breakdown(launches, hw, blocks="fastest")
    with pytest.raises(ValueError, match="launches"):
        plan_cost.phase_breakdown([], hw)


def run(argv, capsys):
    try:
        status = cli.main(argv)
    except SystemExit as e:
        status = e.code
    out = capsys.readouterr()
    return status, out.out, out.err


@pytest.fixture(scope="module")
def tiny_trace(tmp_path_factory):
    path = tmp_path_factory.mktemp("trace") / "t.npz"
    save_trace(path, synth.generate(steps=8, layers=1, k=2048, max_len=20000, seed=0))
    return str(path)


def test_bench_plan_phases_prints_every_phase_per_policy_and_t(tiny_trace, capsys, tmp_path):
    out = tmp_path / "plan"
    status, text, err = run(["bench", "plan", "--phases", "--steps", "2", "--warmup", "1",
                             "--rows", "1", "--trace", tiny_trace, "--out", str(out)], capsys)
    assert status == 0, err
    tables = text.split("\n\n")[2:]
    titles = [t.strip().splitlines()[0] for t in tables if "T=" in t]
    assert len(titles) == 9
    for table in (t for t in tables if "T=" in t):
        lines = table.strip().splitlines()
        assert lines[1].split()[:3] == ["phase", "us", "share"]
        assert [line.split("  ")[1].strip() for line in lines[3:3 + len(PHASES)]] == list(PHASES)
        assert lines[3 + len(PHASES)].split()[0] == "total"
    records = json.loads((out / "plan_phases.json").read_text())["records"]
    assert {(r["policy"], r["T"]) for r in records} == {(p, t) for p in ("reuse", "lifetime", "lru")
                                                        for t in (1, 2, 4)}
    for r in records:
        assert [p["phase"] for p in r["phases"]] == list(PHASES)
        assert r["total"]["serial_us"] > 0 and r["samples"] == 2
        heat = next(p for p in r["phases"] if p["phase"] == "heat")
        assert (heat["serial_us"] > 0) == (r["policy"] == "reuse")


@pytest.mark.parametrize("args, named", [
    (["--phases", "--policies"], "--phases and --policies"),
    (["--phases", "--no-trace"], "--phases"),
    (["--phases", "--quick"], "--quick"),
    (["--phases", "--device", "npu"], "--phases"),
])
def test_bench_plan_phases_bad_combinations_are_one_line_exit_2(args, named, capsys, tmp_path):
    status, _, err = run(["bench", "plan", *args, "--out", str(tmp_path / "o")], capsys)
    lines = err.strip().splitlines()
    assert status == 2 and len(lines) == 1 and named in lines[0] and "Traceback" not in err, err
