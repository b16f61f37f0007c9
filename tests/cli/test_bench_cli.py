"""``avsg bench ...``: every subcommand's help, one-line errors for bad input (exit 2, no
traceback), a tiny run of each benchmark writing its JSON and plot under --out, the link-aware
gather model. (The documents' copies of the results tables: tests/test_docs.py.)"""
from __future__ import annotations

import json
import os

import pytest

from avsg import backend, cli
from avsg import commands
from avsg.lab.costmodel import hardware
from avsg.lab.traces import synth
from avsg.lab.traces.format import save_trace

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(argv, capsys):
    try:
        status = cli.main(argv)
    except SystemExit as e:   # argparse: --help, or a parse error
        status = e.code
    out = capsys.readouterr()
    return status, out.out, out.err


@pytest.mark.parametrize("command", sorted(commands.COMMANDS["bench"][2]))
def test_help_renders_plain_text_and_every_option_has_help(command, capsys):
    status, out, err = run(["bench", command, "--help"], capsys)
    assert status == 0 and err == ""
    for markup in ("``", "**", ":func:", ":class:", ":mod:", ".. "):
        assert markup not in out, f"raw markup {markup!r} in 'avsg bench {command} --help'"
    sub = commands.build_parser()._subparsers._group_actions[0].choices["bench"]
    parser = sub._subparsers._group_actions[0].choices[command]
    for action in parser._actions:
        if action.dest != "help":
            assert action.help, f"avsg bench {command}: {action.option_strings} has no help text"


def test_bench_help_lists_every_subcommand(capsys):
    status, out, _ = run(["bench", "--help"], capsys)
    assert status == 0
    for command in commands.COMMANDS["bench"][2]:
        assert command in out


BAD = [
    ("plan", ["--rows", "0"], "--rows"), ("plan", ["--steps", "0"], "--steps"),
    ("plan", ["--steps", "-3"], "--steps"), ("plan", ["--warmup", "-1"], "--warmup"),
    ("plan", ["--hit-rate", "1.5"], "--hit-rate"), ("plan", ["--rows", "64"], "--rows"),
    ("plan", ["--hw", "/no/such.json"], "--hw"), ("plan", ["--trace", "/no/such.npz"], "--trace"),
    ("plan", ["--steps", "two"], "--steps"), ("plan", ["--device", "gpu"], "--device"),
    ("plan", ["--device", "npu"], "--device npu"), ("plan", ["--policies", "--no-trace"], "--policies"),
    ("gather", ["--batch", "0"], "--batch"), ("gather", ["--batch", "1,x"], "--batch"),
    ("gather", ["--batch", ""], "--batch"),
    ("gather", ["--miss-rate", "0"], "--miss-rate"), ("gather", ["--miss-rate", "1.5"], "--miss-rate"),
    ("gather", ["--row-bytes", "-8"], "--row-bytes"), ("gather", ["--topk", "0"], "--topk"),
    ("gather", ["--cores", "0"], "--cores"), ("gather", ["--cores", "99"], "--cores"),
    ("gather", ["--link-gbps", "0"], "--link-gbps"), ("gather", ["--hw", "/no/such.json"], "--hw"),
    ("gather", ["--device", "npu"], "--device npu"),
    ("hash-buckets", ["--layers", "0"], "--layers"), ("hash-buckets", ["--steps", "0"], "--steps"),
    ("hash-buckets", ["--ratios", "3"], "--ratios"), ("hash-buckets", ["--ratios", "8"], "--ratios"),
    ("hash-buckets", ["--ratios", "0"], "--ratios"), ("hash-buckets", ["--capacity", "0"], "--capacity"),
    ("hash-buckets", ["--trace", "/no/such.npz"], "--trace"),
    ("hash-buckets", ["--device", "npu"], "--device npu"),
    ("emulation", ["--steps", "0"], "--steps"), ("emulation", ["--rows", "0"], "--rows"),
    ("emulation", ["--capacity", "100"], "--capacity"), ("emulation", ["--warmup", "-1"], "--warmup"),
    ("emulation", ["--device", "npu"], "--device npu"),
    ("calibrate", ["--rows", "0"], "--rows"), ("calibrate", [], "torch_npu"),
    ("all", ["--only", "nothing"], "--only"), ("all", ["--device", "npu"], "--device npu"),
    ("decode", ["--batch", "0"], "--batch"),
    ("plan", ["--msprof", "prof", "--no-trace"], "--msprof"),
    ("decode", ["--json", "/proc/no/such/x.json"], "--json"),
    ("all", ["--quick", "--only", "decode,gather", "--hw", "/no/such.json"], "--hw"),
    ("gather", ["--msprof", "prof"], "--msprof"),
    ("hash-buckets", ["--msprof", "prof"], "--msprof"),
    ("emulation", ["--msprof", "prof"], "--msprof"),
]


@pytest.mark.parametrize("command, args, named", BAD, ids=[f"{c}{' '.join(a)}" for c, a, _ in BAD])
def test_bad_input_is_one_line_exit_2(command, args, named, capsys, tmp_path):
    status, out, err = run(["bench", command, *args, "--out", str(tmp_path / "o")]
                           if command != "all" or args[0] != "--device" else
                           ["bench", command, *args, "--only", "plan", "--out", str(tmp_path / "o")],
                           capsys)
    lines = err.strip().splitlines()
    assert status == 2, (status, err)
    assert len(lines) == 1 and named in lines[0] and "Traceback" not in err, err


def test_out_that_is_a_file_is_an_error(capsys, tmp_path):
    f = tmp_path / "file"
    f.write_text("")
    status, _, err = run(["bench", "gather", "--batch", "1", "--out", str(f)], capsys)
    assert status == 2 and "--out" in err and len(err.strip().splitlines()) == 1


# ------------------------------------------------------------------------- tiny runs

def _outputs(out_dir, names):
    for name in names:
        path = os.path.join(out_dir, name)
        assert os.path.getsize(path) > 0, path


def test_plan_tiny(capsys, tmp_path):
    out = tmp_path / "plan"
    status, text, _ = run(["bench", "plan", "--quick", "--steps", "1", "--rows", "1", "--no-trace",
                           "--out", str(out)], capsys)
    assert status == 0
    assert "paper anchors" in text and "left out of the plan model" in text and str(out) in text
    _outputs(out, ["plan.json", "plan_latency.png"])
    result = json.loads((out / "plan.json").read_text())
    assert result["estimate"] is True
    for p in result["points"]:
        assert p["fullness_before"] == 1.0            # pre-filled means full
        assert p["hash_serial_pipe_us"]["p50"] >= p["hash_overlapped_pipe_us"]["p50"] > 0


def test_plan_trace_mode_on_a_small_trace(capsys, tmp_path):
    trace = tmp_path / "t.npz"
    save_trace(trace, synth.generate(steps=6, layers=1, k=2048, max_len=9000, seed=0))
    out = tmp_path / "plan"
    status, text, _ = run(["bench", "plan", "--quick", "--steps", "2", "--warmup", "2", "--rows",
                           "1", "--trace", str(trace), "--out", str(out)], capsys)
    assert status == 0 and "trace:" in text
    modes = {p["mode"] for p in json.loads((out / "plan.json").read_text())["points"]}
    assert modes == {"pre-filled", "trace"}


def test_plan_policies_writes_one_record_per_policy_t_and_profile(capsys, tmp_path):
    trace = tmp_path / "t.npz"
    save_trace(trace, synth.generate(steps=8, layers=1, k=2048, max_len=20000, seed=0))
    out = tmp_path / "plan"
    status, text, _ = run(["bench", "plan", "--policies", "--steps", "1", "--warmup", "1",
                           "--rows", "1", "--trace", str(trace), "--out", str(out)], capsys)
    assert status == 0 and "policy cost in the kernel" in text
    records = json.loads((out / "plan_policies.json").read_text())["records"]
    keys = {(r["policy"], r["T"], r["profile"]) for r in records}
    assert keys == {(p, t, f) for p in ("reuse", "lifetime", "lru") for t in (1, 2, 4)
                    for f in ("bundled", "pessimistic")}
    by = {(r["policy"], r["T"], r["profile"]): r for r in records}
    for (p, t, f), r in by.items():
        assert r["serial_pipe_us_p50"] >= r["overlapped_pipe_us_p50"] > 0
        assert r["misses_per_row"] >= 0 and r["state_bytes_per_row"] > 0
        if f == "pessimistic":
            assert r["serial_pipe_us_p50"] > by[(p, t, "bundled")]["serial_pipe_us_p50"]
    # the reuse policy's state is the lru one plus counts, ghosts and heat, sized by S and H
    assert by[("reuse", 1, "bundled")]["state_bytes_per_row"] > by[("lru", 1, "bundled")]["state_bytes_per_row"]


def test_gather_tiny_and_the_link_bounds_every_estimate(capsys, tmp_path):
    out = tmp_path / "gather"
    status, text, _ = run(["bench", "gather", "--batch", "1,3", "--miss-rate", "0.5,1", "--row-bytes",
                           "64,656", "--topk", "64", "--cores", "8", "--out", str(out)], capsys)
    assert status == 0 and "left out of the gather model" in text and "memcpy" in text
    _outputs(out, ["gather.json", "gather_bandwidth.png"])
    result = json.loads((out / "gather.json").read_text())
    link = hardware.load_profile()["link_bytes_per_s"] / 1e9
    for r in result["results"]:
        assert set(r["partitions"]) == {"miss", "request", "selection", "topk"}
        for p in r["partitions"].values():
            assert p["serial_pipe_gbps"] <= link * (1 + 1e-9)
            assert p["overlapped_pipe_gbps"] <= link * (1 + 1e-9)
            assert p["serial_pipe_us"] >= p["overlapped_pipe_us"] >= p["link_us"]
        assert r["partitions"]["miss"]["busiest_share"] <= r["partitions"]["request"]["busiest_share"]


def test_profile_defaults_reproduce_the_emulation_cost_model():
    """hardware.launch_estimate with the bundled profile = the emulation's own estimate."""
    import torch
    buf = __import__("avsg").SparseKVBuffer(rows=2, capacity=256, topk=64, max_context=4096)
    topk = torch.stack([torch.randperm(1000)[:64] for _ in range(2)]).to(torch.int32).view(2, 1, 64)
    buf.plan(topk, torch.full((2,), 1000, dtype=torch.int32))
    counters = backend.last_launch_counters()
    est = hardware.launch_estimate(counters, hardware.load_profile())
    assert est["serial_pipe_us"] == pytest.approx(backend.estimate_npu_time_us(counters, "serial"))
    assert est["overlapped_pipe_us"] == pytest.approx(backend.estimate_npu_time_us(counters, "overlap"))


def test_hash_buckets_tiny(capsys, tmp_path):
    trace = tmp_path / "t.npz"
    save_trace(trace, synth.generate(steps=6, layers=2, k=2048, max_len=9000, seed=1))
    out = tmp_path / "hb"
    status, text, _ = run(["bench", "hash-buckets", "--trace", str(trace), "--layers", "2",
                           "--steps", "4", "--ratios", "1,2", "--out", str(out)], capsys)
    assert status == 0 and "misses stashed" in text
    _outputs(out, ["hash_buckets.json", "hash_buckets.png"])


def test_hash_buckets_refuses_more_than_the_trace_holds(capsys, tmp_path):
    trace = tmp_path / "t.npz"
    save_trace(trace, synth.generate(steps=4, layers=2, k=2048, max_len=9000, seed=1))
    status, _, err = run(["bench", "hash-buckets", "--trace", str(trace), "--steps", "50",
                          "--layers", "2", "--out", str(tmp_path / "o")], capsys)
    assert status == 2 and "--steps" in err


def test_emulation_tiny(capsys, tmp_path):
    out = tmp_path / "emu"
    status, text, _ = run(["bench", "emulation", "--rows", "1", "--queries", "1", "--topk", "64",
                           "--capacity", "128,192", "--context", "256", "--row-bytes", "32", "--steps",
                           "1", "--warmup", "0", "--out", str(out)], capsys)
    assert status == 0 and "identical across builds: True" in text
    _outputs(out, ["emulation.json", "emulation.png"])
    record = json.loads((out / "emulation.json").read_text())
    points = record["points"]
    assert record["fast_emulation_arch"] == backend.fast_emulation_arch()   # what the fast side ran as
    assert f"fast build for {backend.fast_emulation_arch()}" in text
    assert [p["S"] for p in points] == [128, 192]
    for p in points:
        assert p["torch_exact"] and p["identical"] and p["torch_ms"] > 0
        assert p["fast_over_torch"] == p["fast_ms"] / p["torch_ms"]
        assert p["fast_ms"] == p["fast_plan"] + p["fast_gather"]


def test_emulation_on_a_trace_with_mtp(capsys, tmp_path):
    """Trace mode: the rows are the trace's layers, T consecutive steps per query; the op and the
    baseline replay the same selections, so their hits agree closely."""
    from avsg.lab.traces import synth
    from avsg.lab.traces.format import save_trace
    trace = tmp_path / "t.npz"
    save_trace(trace, synth.generate(steps=6, layers=2, k=2048, max_len=9000, seed=1))
    out = tmp_path / "emu"
    status, text, _ = run(["bench", "emulation", "--trace", str(trace), "--rows", "2", "--queries",
                           "2", "--topk", "256", "--capacity", "1024", "--row-bytes", "16",
                           "--steps", "2", "--warmup", "2", "--policy", "lru", "--out", str(out)],
                          capsys)
    assert status == 0 and "read-back: exact" in text
    (p,) = json.loads((out / "emulation.json").read_text())["points"]
    assert p["identical"] and p["torch_exact"]
    assert abs(p["op_hit_rate"] - p["torch_hit_rate"]) < 0.02


def test_emulation_trace_and_context_together_is_an_error(capsys, tmp_path):
    status, _, err = run(["bench", "emulation", "--trace", "nope.npz", "--out", str(tmp_path)], capsys)
    assert status == 2 and "--trace" in err and len(err.strip().splitlines()) == 1
    status, _, err = run(["bench", "emulation", "--trace", str(tmp_path), "--context", "4096",
                          "--out", str(tmp_path / "o")], capsys)
    assert status == 2 and "--context" in err and len(err.strip().splitlines()) == 1


def test_plain_torch_baseline_is_exact_lru():
    """The baseline of `avsg bench emulation` against the trace lab's exact LRU: the same misses
    every step, and every selection reads its host row."""
    import numpy as np
    import torch
    from avsg.lab.commands.bench.emulation import TorchLRU, selections
    from avsg.lab.traces.policies import StepInput, make_policy, unique_rows
    R, T, K, S, N = 2, 2, 48, 160, 600
    steps = selections(R, T, K, N, 30, seed=3)
    host = torch.randint(0, 256, (R, N, 8), dtype=torch.uint8)
    base = TorchLRU(R, S, N, 8)
    lru = make_policy("lru", R, S, K, T, max_pos=N)
    for i, topk in enumerate(steps):
        slots, missed = base.plan_and_copy(topk, host)
        raw = topk.numpy().astype(np.int64)
        u, cnt = unique_rows(raw)
        hits = lru.step(i, StepInput(raw, u, cnt, np.full(R, N, np.int64)))
        assert missed == int((cnt - hits).sum()), f"step {i}"
        rows = torch.arange(R)[:, None, None].expand_as(topk)
        assert torch.equal(base.dst[rows, slots], host[rows, topk.long()])


def test_plain_torch_baseline_reads_every_selection_back():
    """The batched baseline on adversarial steps: -1 padding, positions past the context, MTP
    repeats across query tokens, a buffer exactly T*K slots wide (every step can replace all of
    it). Every valid selection must read its own host row from dst, every invalid one gets -1,
    distinct positions get distinct slots, and it fetches exactly the unique valid positions
    that were not resident before the step."""
    import torch
    from avsg.lab.commands.bench.emulation import TorchLRU
    R, T, K, N = 3, 3, 32, 200
    S = T * K
    gen = torch.Generator().manual_seed(5)
    host = torch.randint(0, 256, (R, N, 12), dtype=torch.uint8, generator=gen)
    base = TorchLRU(R, S, N, 12)
    for step in range(40):
        hot = torch.randint(0, N, (R, K), generator=gen)
        topk = torch.empty(R, T, K, dtype=torch.int32)
        for t in range(T):          # each token: a mix of shared (MTP repeats) and fresh positions
            fresh = torch.randint(-40, N + 40, (R, K), generator=gen)
            topk[:, t] = torch.where(torch.rand(R, K, generator=gen) < 0.6, hot, fresh)
        topk[torch.rand(R, T, K, generator=gen) < 0.1] = -1
        resident = [set(base.pos_of_slot[r].tolist()) - {-1} for r in range(R)]
        slots, fetched = base.plan_and_copy(topk, host)
        valid = (topk >= 0) & (topk < N)
        assert torch.equal(slots[~valid], torch.full_like(slots[~valid], -1)), f"step {step}"
        assert bool(((slots[valid] >= 0) & (slots[valid] < S)).all())
        expected = 0
        for r in range(R):
            pos, slot = topk[r][valid[r]].long(), slots[r][valid[r]]
            assert torch.equal(base.dst[r, slot], host[r, pos]), f"step {step} row {r}"
            pairs = set(zip(pos.tolist(), slot.tolist()))
            assert len(pairs) == len({p for p, _ in pairs}) == len({s for _, s in pairs})
            expected += len({p for p, _ in pairs} - resident[r])
        assert fetched == expected, f"step {step}"


@pytest.mark.slow
def test_bench_all_quick(capsys, tmp_path):
    status, text, _ = run(["bench", "all", "--quick", "--out", str(tmp_path)], capsys)
    assert status == 0
    assert text.strip().splitlines()[-1].startswith("headline")


def _walk(parser, name="avsg"):
    import argparse
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub, p in action.choices.items():
                yield from _walk(p, f"{name} {sub}")


def test_every_avsg_command_documents_every_option_without_markup():
    for name, parser in _walk(commands.build_parser()):
        text = parser.format_help()
        for markup in ("``", "**", ":func:", ":class:"):
            assert markup not in text, f"raw markup {markup!r} in '{name} --help'"
        for action in parser._actions:
            if action.dest != "help" and action.option_strings:
                assert action.help, f"{name}: {action.option_strings} has no help text"


def test_without_trace_plan_and_hash_buckets_replay_the_embedded_trace(capsys, tmp_path):
    """A fresh clone has no ../shared: plan's trace mode and hash-buckets replay the trace the
    package ships, and say so."""
    status, text, _ = run(["bench", "plan", "--quick", "--steps", "1", "--rows", "1", "--warmup",
                           "2", "--out", str(tmp_path / "p")], capsys)
    assert status == 0 and "trace asyncio_32k_8x256 (embedded" in text
    status, text, _ = run(["bench", "hash-buckets", "--layers", "1", "--steps", "3", "--ratios",
                           "1", "--out", str(tmp_path / "h")], capsys)
    assert status == 0 and "trace asyncio_32k_8x256 (embedded" in text
    assert "1 layers x 3 steps, top-2048" in text


@pytest.mark.slow
def test_bench_all_quick_reports_every_benchmark(capsys, tmp_path):
    status, text, _ = run(["bench", "all", "--quick", "--quiet", "--out", str(tmp_path)], capsys)
    assert status == 0
    for name in ("plan", "gather", "hash-buckets", "emulation", "decode"):
        assert os.path.isdir(tmp_path / name)
