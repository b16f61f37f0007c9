"""Every ``avsg`` mistake is one line on stderr and exit status 2, never a traceback.

A generated set of bad inputs goes through every command in-process (``cli.main(argv)`` with
stderr captured, argparse's ``SystemExit`` caught), a few through a real subprocess:

* every trace-reading command gets truncated and bit-flipped copies of a valid trace (kept only
  when numpy itself cannot read them back), text, empty, a directory, a bare array, missing keys,
  pickled objects;
* every range-checked number of every command gets values just outside its range, negative,
  NaN, infinite, huge (2**70) and non-numbers; and no command has an unchecked number;
* every output option gets a directory, a path under a regular file and a path under /proc (the
  tests run as root, which writes anywhere else).

Then the targeted cases: contradictory options, library errors, sizes past memory, the paths a
command prints, headlines, messages, and the README's claims about the commands.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import re
import subprocess
import sys
import zipfile

import numpy as np
import pytest

from avsg import cli, commands
from avsg.lab.traces import synth
from avsg.lab.traces.format import Trace, save_trace

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(autouse=True)
def one_parser(monkeypatch):
    """The parser built once per test: argparse parsers are reusable, and building every
    command's parser for each of hundreds of cases would be most of the test's time."""
    parser = _PARSER.get("parser") or _PARSER.setdefault("parser", commands.build_parser())
    monkeypatch.setattr(commands, "build_parser", lambda: parser)


_PARSER = {}


# The memory checks compare a command's allocations with what the machine has free. The cases
# below must be refused on any machine, and never attempted on a roomy one: commands run here see
# a fixed 8 GiB free.
FUZZ_AVAILABLE_BYTES = 8 << 30


@pytest.fixture(autouse=True)
def _fixed_free_memory(monkeypatch):
    from avsg import cli_util
    monkeypatch.setattr(cli_util, "available_memory", lambda: FUZZ_AVAILABLE_BYTES)


def run(argv):
    """``avsg ARGV`` in this process: (exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = cli.main([str(a) for a in argv])
        except SystemExit as e:       # argparse: a parse error
            status = e.code
    return status, out.getvalue(), err.getvalue()


def assert_one_line_error(argv, needle=None):
    status, out, err = run(argv)
    lines = err.strip().splitlines()
    assert status == 2 and len(lines) == 1 and "Traceback" not in err, (argv, status, err[-2000:])
    assert lines[0].startswith("avsg"), (argv, lines)
    if needle is not None:
        assert needle in lines[0], (argv, lines[0])
    return lines[0]


# ------------------------------------------------------------------------------ inputs

@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz")
    good = root / "good.npz"
    save_trace(good, synth.generate(steps=20, layers=2, k=16, max_len=200, seed=0))
    big = root / "k2048.npz"
    # bench decode's counted plan warms up on 48 steps first
    save_trace(big, synth.generate(steps=56, layers=2, k=2048, max_len=8192, seed=1))
    data = good.read_bytes()
    bad = {"text": b"hello, not a trace\n", "empty": b""}
    rng = random.Random(17)
    for i in range(8):
        bad[f"truncated{i}"] = data[:rng.randrange(1, len(data))]
    flipped = 0
    while flipped < 8:
        b = bytearray(data)
        for _ in range(rng.randint(1, 3)):
            j = rng.randrange(len(b))
            b[j] ^= 1 << rng.randrange(8)
        path = root / "probe.npz"
        path.write_bytes(bytes(b))
        try:        # keep only the flips numpy itself cannot read back
            with np.load(path, allow_pickle=False) as f:
                for key in f.files:
                    f[key]
        except Exception:
            bad[f"flipped{flipped}"] = bytes(b)
            flipped += 1
    paths = {}
    for name, content in bad.items():
        paths[name] = root / f"{name}.npz"
        paths[name].write_bytes(content)
    np.save(root / "array.npy", np.arange(4))
    paths["array"] = root / "array.npy"
    np.savez(root / "nokeys.npz", sel=np.zeros((1, 2, 3), np.int32))
    paths["nokeys"] = root / "nokeys.npz"
    np.savez(root / "pickled.npz", sel=np.array([object()], dtype=object), positions=np.arange(2),
             T=np.int32(5), k=np.int32(1))
    paths["pickled"] = root / "pickled.npz"
    (root / "dir.npz").mkdir()
    paths["directory"] = root / "dir.npz"
    # a valid file whose values are not: positions past T, unsorted rows (for --no-check)
    sel = np.array([[[5, 3], [1, 900]]], np.int32)
    save_trace(root / "values.npz", Trace(sel, np.array([10, 11], np.int32), T=12, k=2),
               validate=False)
    # a context past the op's 2**24 positions
    save_trace(root / "hugeT.npz", Trace(np.array([[[1, 2], [2, 3]]], np.int32),
                                         np.array([4, 5], np.int32), T=(1 << 24) + 8, k=2))
    return dict(root=root, good=good, big=big, bad=paths, values=root / "values.npz",
                hugeT=root / "hugeT.npz", regular=good)


def _trace_readers(f):
    out = str(f["root"] / "out")
    return [
        lambda t: ["trace", "info", t],
        lambda t: ["trace", "replay", t, "--no-plot", "--out", out, "--policy", "lru",
                   "--capacity", "32"],
        lambda t: ["trace", "mtp", t, "--capacity", "64"],
        lambda t: ["demo", "--trace", t, "--capacity", "2048", "--layers", "1", "--steps", "2"],
        lambda t: ["serve-sim", "--trace", t, "--out", out, "--quiet"],
        lambda t: ["bench", "decode", "--trace", t, "--out", out],
        lambda t: ["bench", "hash-buckets", "--trace", t, "--out", out],
        lambda t: ["bench", "plan", "--trace", t, "--out", out],
        lambda t: ["run", "--trace", t, "--quiet"],
    ]


def test_corrupted_traces_are_one_line_in_every_reader(files):
    cases = 0
    for make in _trace_readers(files):
        for name, path in files["bad"].items():
            line = assert_one_line_error(make(str(path)))
            assert "allow_pickle" not in line, line
            assert line.count(str(path)) <= 1, line      # the path once, not repeated
            cases += 1
    assert cases >= 9 * 20


# ------------------------------------------------------------------------------ numbers

def _leaves(parser, prefix=()):
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield prefix, parser
    for sub in subs:
        for name, child in sub.choices.items():
            yield from _leaves(child, prefix + (name,))


#: the arguments each command needs besides the one fuzzed (positionals, required options)
def _base(command, f):
    good = str(f["good"])
    return {("trace", "replay"): [good], ("trace", "info"): [good], ("trace", "mtp"): [good],
            ("trace", "synth"): [str(f["root"] / "synth.npz")],
            ("generate",): ["--checkpoint", str(f["root"]), "--input-ids", "[[1]]"],
            }.get(command, [])


def _forms(value):
    forms = {str(value), f"{value:,}", f"{value:g}",
             f"{value:.0e}".replace("+0", "").replace("+", "")}
    if isinstance(value, float) and value.is_integer():
        forms.add(str(int(value)))
    return forms


def _bad_values(kind, low, high):
    values = ["nan", "inf", "-inf", "x", "", str(2 ** 70), "-" + str(2 ** 70)]
    if kind == "float":
        values += ["1e400"]
    if low is not None:
        values.append(str(low - 1) if kind == "int" else repr(low - 1e-3 * max(1, abs(low))))
    if high is not None:
        values.append(str(high + 1) if kind == "int" else repr(high * 1.001 + 1e-3))
    return values


def test_every_number_of_every_command_is_range_checked(files):
    """No option takes a bare int or float, and every range-checked one refuses what lies
    outside its range (and NaN, infinities, 2**70, non-numbers) in one line naming it."""
    unchecked, cases = [], 0
    for command, parser in _leaves(commands.build_parser()):
        for action in parser._actions:
            if action.type in (int, float) and action.choices is None:
                unchecked.append((command, action.option_strings))
            valid = getattr(action.type, "valid_range", None)
            if valid is None or not action.option_strings:
                continue
            option = action.option_strings[-1]
            low, high = valid
            assert high is not None, (command, option, "no upper bound")
            # the help states the range's upper end (seeds: 'n >= 0' suffices)
            said = high >= 2 ** 62 and f">= {low}" in action.help or any(
                form in action.help for form in _forms(high))
            assert said, (command, option, valid, action.help)
            kind = action.type.__name__
            for value in _bad_values(kind, *valid):
                argv = [*command, *_base(command, files), f"{option}={value}"]
                assert_one_line_error(argv, option)
                cases += 1
    assert not unchecked, f"options without a range check: {unchecked}"
    assert cases > 500


# ------------------------------------------------------------------------------ outputs

OUTPUTS = [  # (argv before the output, option, a file (True) or a directory (False))
    (["doctor", "--no-selftest"], "--json", True),
    (["run", "--quiet"], "--json", True),
    (["run", "--quiet"], "--record-trace", True),
    (["generate", "--checkpoint", "/", "--input-ids", "[[1]]"], "--json", True),
    (["trace", "replay", "GOOD", "--policy", "lru", "--capacity", "32", "--no-plot"], "--out", False),
    (["trace", "replay", "GOOD", "--policy", "lru", "--capacity", "32", "--no-plot"], "--json", True),
    (["trace", "replay", "GOOD", "--policy", "lru", "--capacity", "32"], "--plot", True),
    (["trace", "replay", "GOOD", "--policy", "lru", "avsg", "belady", "--capacity", "32",
      "--no-plot"], "--tables", True),
    (["trace", "mtp", "GOOD", "--capacity", "64"], "--json", True),
    (["trace", "synth", "--steps", "4", "--k", "8", "--max-len", "64"], None, True),
    (["serve-sim", "--quiet"], "--out", False),
    (["serve-sim", "--quiet"], "--tables", True),
    *[(["bench", b, "--quiet"], "--out", False)
      for b in ("plan", "gather", "hash-buckets", "emulation", "decode", "all")],
    *[(["bench", b, "--quiet"], "--tables", True)
      for b in ("plan", "gather", "hash-buckets", "emulation", "decode")],
    (["bench", "decode", "--quiet"], "--json", True),
]


def test_unwritable_outputs_are_one_line_before_any_work(files):
    """A directory, a path under a regular file or under /proc, and /dev/full (opens, refuses
    every write: found by an empty write up front, not after the results; and never the
    regular file /dev/full.npz or /dev/full.png a writer appending its suffix would create)."""
    under_file = str(files["regular"] / "x.json")
    under_proc = "/proc/avsg-fuzz/x.json"
    full_device = ["/dev/full"] if os.path.exists("/dev/full") else []
    cases = 0
    for argv, option, is_file in OUTPUTS:
        argv = [str(files["good"]) if a == "GOOD" else a for a in argv]
        bad = [under_file, under_proc] + ([str(files["root"])] + full_device if is_file
                                          else [str(files["good"])])
        for path in bad:
            full = argv + ([option, path] if option else [path])
            status, out, err = run(full)
            lines = err.strip().splitlines()
            assert status == 2 and len(lines) == 1 and (option or "out") in lines[0], (full, err)
            parents = [path] + [os.path.dirname(path), os.path.dirname(os.path.dirname(path))]
            assert any(p in lines[0] for p in parents), (full, "names no file", lines[0])
            assert out == "", (full, "printed results before refusing the output", out)
            cases += 1
    assert cases == (3 + len(full_device)) * len(OUTPUTS) - len(full_device) * sum(
        not is_file for _, _, is_file in OUTPUTS)
    for suffix in (".npz", ".png"):
        assert not os.path.exists("/dev/full" + suffix)


# ------------------------------------------------------------------------------ targeted cases

def test_listed_cases(files):
    """Every case of the review: library errors, absurd numbers, contradictions, messages."""
    good, big, values, hugeT = (str(files[k]) for k in ("good", "big", "values", "hugeT"))
    out = str(files["root"] / "targeted")
    cases = [
        # library ValueErrors, named by the option
        (["trace", "replay", big, "--capacity", "1000", "--policy", "lru", "--no-plot", "--out", out],
         "--capacity"),
        (["trace", "replay", good, "--capacity", "40000", "--policy", "avsg", "--no-plot"],
         "--capacity"),
        (["trace", "replay", good, "--lifetime", "0"], "--lifetime"),
        (["trace", "replay", good, "--lifetime", "256"], "--lifetime"),
        (["trace", "replay", good, "--policy", "setassoc-fifo", "--capacity", "32", "--ways", "5",
          "--no-plot", "--out", out], "--ways"),
        (["trace", "replay", hugeT, "--policy", "avsg", "--capacity", "32", "--no-plot",
          "--out", out], "T = 16,777,224"),
        (["trace", "replay", values, "--no-check", "--policy", "lru", "avsg", "--capacity", "32",
          "--no-plot", "--out", out], "--no-check"),
        (["trace", "replay", values, "--policy", "lru", "--capacity", "32", "--no-plot"], "trace"),
        (["trace", "replay", good, "--entry-bytes", "-1"], "--entry-bytes"),
        (["trace", "replay", good, "--entry-bytes", "0"], "--entry-bytes"),
        (["trace", "replay", good, "--entry-bytes", str(2 ** 70)], "--entry-bytes"),
        (["trace", "replay", good, "--buckets", "0"], "--buckets"),
        (["trace", "replay", good, "--bucket-width", "0"], "--bucket-width"),
        # trace synth
        *[(["trace", "synth", out + "/s.npz", *a], n) for a, n in [
            (["--gamma", "1.5"], "--gamma"), (["--steps", "0"], "--steps"), (["--k", "0"], "--k"),
            (["--k", "20000"], "--max-len"), (["--layers", "-1"], "--layers"),
            (["--sigma", "-1"], "--sigma"), (["--seed", "-1"], "--seed"),
            (["--steps", str(10 ** 12)], "--steps"), (["--mu-hist", "nan"], "--mu-hist")]],
        # trace mtp
        (["trace", "mtp", good, "--drafts", "-1"], "--drafts"),
        (["trace", "mtp", good, "--capacity", "0"], "--capacity"),
        (["trace", "mtp", good, "--accept-mean", "9"], "--accept-mean"),
        (["trace", "mtp", good, "--capacity", "32"], "--capacity"),
        (["trace", "mtp", good, "--seed", "-1"], "--seed"),
        # demo: sizes against memory, traces checked
        (["demo", "--steps", str(10 ** 12)], "--steps"),
        (["demo", "--layers", "1000", "--synthetic"], "--layers"),
        (["demo", "--capacity", str(2 ** 40)], "--capacity"),
        (["demo", "--trace", values, "--layers", "1", "--steps", "2"], "--trace"),
        (["run", "--trace", values], "--trace"),
        (["serve-sim", "--trace", values], "--trace"),
        (["demo", "--trace", hugeT, "--layers", "1", "--steps", "2"], "--"),
        (["demo", "--synthetic", "--trace", good], "--synthetic and --trace"),
        # serve-sim
        (["serve-sim", "--requests", str(10 ** 12)], "--requests"),
        (["serve-sim", "--buffer-gb", "1e30"], "--buffer-gb"),
        (["serve-sim", "--prompt-mean", str(10 ** 12), "--synthetic"], "--prompt-mean"),
        (["serve-sim", "--rate", "1e308"], "--rate"),
        (["serve-sim", "--max-batch", "1e9"], "--max-batch"),
        (["serve-sim", "--synthetic", "--trace", "/nonexistent.npz"], "--synthetic and --trace"),
        (["serve-sim", "--synthetic", "--trace-steps", "40000"], "--trace-steps"),
        (["serve-sim", "--synthetic", "--trace-steps", "30000", "--layers-per-trace", "4096"],
         "--layers-per-trace"),
        # run
        (["run", "--lifetime", "4", "--policy", "reuse"], "--lifetime"),
        (["run", "--lifetime", "4", "--policy", "lru"], "--policy"),
        (["run", "--modes", "avsg,avsg"], "--modes"),
        (["run", "--acceptance", "sim:5"], "--acceptance"),
        (["run", "--new-tokens", "100000"], "--new-tokens"),
        (["run", "--seed", "-1"], "--seed"),
        (["run", "--batch", "4000", "--select", "indexer"], "--batch"),
        # bench
        (["bench", "plan", "--no-trace", "--trace", "/nonexistent.npz"], "--no-trace and --trace"),
        (["bench", "decode", "--context", "10"], "--context"),
        (["bench", "decode", "--trace", "/nonexistent.npz"], "no such file"),
        (["bench", "all", "--only", "emulation,emulation"], "--only"),
    ]
    for argv, needle in cases:
        assert_one_line_error(argv, needle)


def test_trace_errors_name_the_path_once_without_numpy_advice(files):
    for name in ("text", "empty", "truncated0", "flipped0", "pickled"):
        path = str(files["bad"][name])
        line = assert_one_line_error(["trace", "info", path])
        assert line.count(path) == 1 and "allow_pickle" not in line and "pickle.load" not in line


def test_every_default_the_help_shows_parses():
    """'(default 48K)' in a help text: 48K is a value the option takes, and so is its real
    default."""
    checked = 0
    for command, parser in _leaves(commands.build_parser()):
        for action in parser._actions:
            if getattr(action.type, "valid_range", None) is None:
                continue
            shown = re.search(r"default:? ([0-9][0-9.eEkKmM+]*)", action.help or "")
            if shown:
                action.type(shown.group(1).rstrip(".;:,"))
                checked += 1
            if isinstance(action.default, (int, float)) and not isinstance(action.default, bool):
                action.type(str(action.default))
    assert checked > 50


def test_help_defaults_parse(files, tmp_path):
    """bench decode's help shows 32K,64K,128K: those values parse (the run stops at the
    missing trace, after the arguments were accepted)."""
    line = assert_one_line_error(["bench", "decode", "--context", "32K,64K,128K",
                                  "--trace", "/nonexistent.npz", "--out", str(tmp_path)])
    assert "--trace" in line


def test_printed_paths_are_the_written_ones(files, tmp_path):
    plot = tmp_path / "hits"          # no suffix: matplotlib would write hits.png
    pytest.importorskip("matplotlib")
    status, out, err = run(["trace", "replay", str(files["good"]), "--policy", "lru", "--capacity",
                            "32", "--out", str(tmp_path), "--plot", str(plot), "--quiet"])
    assert status == 0, err
    written = re.findall(r"^wrote (.+)$", out, re.M)
    assert written and all(os.path.isfile(p) for p in written), written
    assert str(plot) + ".png" in written


def test_run_prints_the_trace_and_json_it_wrote(tmp_path):
    record = tmp_path / "rec"          # no suffix: the trace is written as rec.npz
    status, out, err = run(["run", "--config", "tiny", "--select", "indexer", "--context", "64",
                            "--batch", "1", "--requests", "1", "--new-tokens", "2", "--mtp", "0",
                            "--modes", "offload,avsg", "--capacity", "16", "--quiet",
                            "--record-trace", str(record), "--json", str(tmp_path / "r.json")])
    assert status == 0, err
    trace = re.search(r"trace written: (\S+)", out).group(1)
    assert trace == str(record) + ".npz" and os.path.isfile(trace)
    assert re.search(r"results written: (\S+)", out).group(1) == str(tmp_path / "r.json")
    assert os.path.isfile(tmp_path / "r.json")


def test_synth_prints_the_file_it_wrote(tmp_path):
    target = tmp_path / "t"
    status, out, err = run(["trace", "synth", str(target), "--steps", "4", "--k", "8",
                            "--max-len", "64"])
    assert status == 0, err
    path = re.search(r"^wrote (\S+):", out, re.M).group(1)
    assert path == str(target) + ".npz" and os.path.isfile(path)


def test_bench_without_matplotlib_does_its_job_and_says_so(files, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)     # import matplotlib -> ImportError
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    status, out, err = run(["bench", "decode", "--trace", str(files["big"]), "--trace-layers",
                            "1", "--trace-steps", "12", "--mtp", "0", "--batch", "1",
                            "--context", "32K", "--quiet", "--out", str(tmp_path)])
    assert status == 0, err
    assert os.path.isfile(tmp_path / "decode.json")
    assert len([l for l in out.splitlines() if "skipped: matplotlib" in l]) == 1, out


def test_bench_all_headline_is_only_this_run(tmp_path, monkeypatch):
    """A JSON of an earlier run in --out is not quoted; without matplotlib the run completes."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    for name, payload in (("plan", {"anchors": {"pre-filled": {"dual/hash at S=K=2048": 9.99}}}),
                          ("decode", {"results": [{"modes": {"avsg": {"tpot_s": 1.0},
                                                            "offload": {"tpot_s": 3.0}}}]})):
        (tmp_path / name).mkdir()
        (tmp_path / name / f"{name}.json").write_text(json.dumps(payload))
    status, out, err = run(["bench", "all", "--quick", "--only", "emulation", "--out",
                            str(tmp_path), "--quiet"])
    assert status == 0, err
    headline = [l for l in out.splitlines() if l.startswith("headline")][-1]
    assert "9.99" not in headline and "decode" not in headline and "plan" not in headline
    assert "skipped: matplotlib" in out


# ------------------------------------------------------------------------------ subprocess

def test_trace_command_reports_one_line(files):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        status = cli.main(["trace", "info", str(files["bad"]["truncated0"])])
    assert status == 2 and len(err.getvalue().strip().splitlines()) == 1, err.getvalue()


@pytest.mark.parametrize("argv", [
    ["trace", "info", "TRUNCATED"],
    ["trace", "replay", "BIG", "--capacity", "1000", "--policy", "lru"],
])
def test_real_processes(files, argv, tmp_path):
    argv = [str(files["bad"]["truncated0"]) if a == "TRUNCATED" else
            str(files["big"]) if a == "BIG" else a for a in argv]
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "python"))
    res = subprocess.run([sys.executable, "-m", "avsg.cli", *argv], capture_output=True,
                         text=True, timeout=120, env=env, cwd=tmp_path)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and "Traceback" not in res.stderr, res.stderr


def test_a_reader_that_goes_away_is_no_error(files, tmp_path):
    """`avsg ... | head -1`: the pipe closes under a command still printing; it exits 0, silently."""
    # unbuffered, so that the first print after the close meets the closed pipe inside the command
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "python"), PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "avsg.cli", "trace", "mtp", str(files["good"]),
                             "--capacity", "64", "--drafts", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=tmp_path)
    proc.stdout.close()                        # the reader is gone before the first line
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0 and err == "", err


# ------------------------------------------------------------------------------ README claims

def _readme():
    return open(os.path.join(REPO, "README.md")).read()


def test_every_bench_takes_quiet():
    for command, parser in _leaves(commands.build_parser()):
        if command[0] == "bench":
            assert any("--quiet" in a.option_strings for a in parser._actions), command


def test_serve_sim_doc_labels_are_the_printed_variants():
    from avsg.lab.budget import sim
    doc = open(os.path.join(REPO, "docs", "serve-sim.md")).read()
    block = re.search(r"<!-- results:serve-sim -->(.*?)<!-- /results:serve-sim -->", doc,
                      re.S).group(1)
    labels = [row.split("|")[1].strip() for row in block.strip().splitlines()[2:]]
    assert labels and all(label.split(" ")[0] in sim.VARIANTS for label in labels), labels
    assert "elastic-oracle" in labels


def test_readme_lists_every_partition():
    from avsg import reference
    sentence = re.search(r"`partition` is (.*?)\(baselines\)", _readme(), re.S).group(1)
    for partition in reference.ALL_PARTITIONS:
        assert f'"{partition}"' in sentence, partition


def test_venv_is_ignored():
    res = subprocess.run(["git", "check-ignore", "-q", ".venv/bin/python"], cwd=REPO)
    assert res.returncode == 0


def test_library_errors_become_the_commands_options():
    """The backstop for what no command checks first: the library's argument name becomes the
    option, files and allocations are one line."""
    import zlib
    from avsg.cli_util import error_message
    options = {"--capacity", "--bucket-width"}
    assert error_message(ValueError("capacity: expected <= 32768, got 40000"), options) == \
        "--capacity: expected <= 32768, got 40000"
    assert error_message(ValueError("bucket_width: expected >= 1"), options).startswith(
        "--bucket-width:")
    assert error_message(ValueError("rows: expected >= 1"), options) == "rows: expected >= 1"
    assert error_message(ValueError("two\nlines"), options) == "two lines"
    assert "corrupted" in error_message(zlib.error("Error -3"))
    assert error_message(PermissionError(13, "Permission denied", "/x")) == "/x: Permission denied"
    assert "memory" in error_message(MemoryError())


def test_debug_shows_the_traceback(files):
    from avsg.lab.traces.lookup import TraceInputError
    with pytest.raises(TraceInputError, match="truncated0.npz"):
        with contextlib.redirect_stdout(io.StringIO()):
            cli.main(["--debug", "trace", "info", str(files["bad"]["truncated0"])])
    with pytest.raises(TraceInputError, match="truncated0.npz"):      # after the command too
        with contextlib.redirect_stdout(io.StringIO()):
            cli.main(["trace", "info", str(files["bad"]["truncated0"]), "--debug"])


def test_an_unknown_option_is_reported_by_its_command(files):
    line = assert_one_line_error(["trace", "info", str(files["good"]), "--bogus", "1"],
                                 "unrecognized arguments: --bogus 1")
    assert line.startswith("avsg trace info: error:"), line
    line = assert_one_line_error(["--bogus", "trace", "info", str(files["good"])],
                                 "unrecognized arguments: --bogus")
    assert line.startswith("avsg: error:"), line      # given before the command: not its option


def _profile(tmp_path, name, key, entry):
    """The bundled hardware profile with one entry replaced (``entry`` None: removed)."""
    from avsg.lab.costmodel import hardware
    with open(hardware.DEFAULT_PROFILE) as f:
        profile = json.load(f)
    if entry is None:
        del profile[key]
    else:
        profile[key] = entry
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(profile))
    return str(path)


def test_second_review_cases(files, tmp_path):
    """The second hostile review: an offline policy where no future exists, replays that count
    nothing, --hw profiles a model cannot run on, options named by the command that asked."""
    good, big = str(files["good"]), str(files["big"])
    out = str(tmp_path / "out")
    src = "a test"
    hw = {name: _profile(tmp_path, name, key, entry) for name, key, entry in [
        ("no_source", "clock_ghz", {"value": 1.85}),
        ("null", "clock_ghz", {"value": None, "source": src}),
        ("text", "clock_ghz", {"value": "fast", "source": src}),
        ("zero_link", "link_bytes_per_s", {"value": 0, "source": src}),
        ("zero_cores", "aiv_cores", {"value": 0, "source": src}),
        ("negative", "clock_ghz", {"value": -1.85, "source": src}),
        ("efficiency", "hbm_efficiency", {"value": 1.5, "source": src}),
        ("missing", "link_bytes_per_s", None)]}
    cases = [
        (["trace", "mtp", good, "--policy", "belady"], "--policy"),
        (["trace", "mtp", good, "--steps", "4"], "--steps"),
        (["trace", "replay", good, "--policy", "lru", "--capacity", "32", "--steps", "1",
          "--no-plot", "--out", out], "--steps"),
        (["trace", "info", good, "--stats", "--window", "19"], "--window"),
        (["trace", "info", good, "--stats", "--steps", "1"], "--stats"),
        (["trace", "synth", "", "--steps", "4", "--k", "16", "--max-len", "64"],
         "out: expected a value"),
        (["bench", "plan", "--trace", big, "--rows", "3", "--out", out], "--rows"),
        (["bench", "plan", "--trace", big, "--warmup", "56", "--out", out], "--warmup + --steps"),
        (["bench", "emulation", "--trace", big, "--rows", "3", "--out", out], "--rows"),
        (["bench", "hash-buckets", "--trace", good, "--capacity", "32", "--ratios", "1",
          "--out", out], "--ratios"),
        *[(["bench", "plan", "--quick", "--no-trace", "--hw", hw[n], "--out", out], needle)
          for n, needle in [("no_source", "'clock_ghz'"), ("null", "'clock_ghz'"),
                            ("text", "'clock_ghz'"), ("negative", "'clock_ghz'"),
                            ("efficiency", "'hbm_efficiency'"), ("missing", "'link_bytes_per_s'")]],
        (["bench", "decode", "--hw", hw["zero_link"], "--out", out], "'link_bytes_per_s'"),
        (["serve-sim", "--hw", hw["zero_cores"], "--out", out], "'aiv_cores'"),
        (["trace", "replay", good, "--policy", "avsg", "--capacity", "32", "--cost-every", "1",
          "--hw", hw["null"], "--no-plot", "--out", out], "'clock_ghz'"),
        # options that would do nothing, or do one thing twice
        (["trace", "replay", good, "--policy", "lru", "--lifetime", "8", "--no-plot"], "--lifetime"),
        (["trace", "replay", good, "--policy", "lru", "--ways", "3", "--no-plot"], "--ways"),
        (["trace", "mtp", good, "--policy", "lru", "--buckets", "3"], "--buckets"),
        (["trace", "mtp", good, "--modes", "shared", "shared"], "--modes"),
        (["serve-sim", "--variants", "fixed,fixed"], "--variants"),
        (["trace", "synth", out + "/grid", "--gamma", "0.5", "0.5"], "--gamma"),
        (["bench", "decode", "--trace-layers", "4096", "--out", out], "--trace-layers"),
        (["bench", "decode", "--trace-steps", "300", "--out", out], "--trace-steps"),
        (["serve-sim", "--trace", good, "--layers-per-trace", "9", "--out", out], "--layers-per-trace"),
        (["trace", "replay", good, "--progress", "--quiet"], "--progress and --quiet"),
        (["trace", "replay", good, "--plot", out + "/p.png", "--no-plot"], "--plot and --no-plot"),
        (["doctor", "--no-selftest", "--seconds", "5"], "--no-selftest and --seconds"),
        (["serve-sim", "--trace", good, "--trace-steps", "64", "--out", out], "--trace-steps"),
        # an empty string is never a value: as a path it would mean the current directory
        (["trace", "replay", good, "--out", ""], "--out"),
        (["bench", "plan", "--tables", ""], "--tables"),
        (["trace", "replay", good, "--layer-select", ""], "--layer-select"),
    ]
    for argv, needle in cases:
        assert_one_line_error(argv, needle)
    # the defaults take what a short trace has: gamma without recall, a decode replay of all of it
    status, out_text, err = run(["trace", "info", good, "--stats", "--steps", "5"])
    assert status == 0 and "recall (window 8): not measured" in out_text, err
    from avsg.lab.costmodel import hardware, traffic
    from avsg.lab.traces.lookup import TraceInputError
    assert traffic.load_trace_cut(big, None, None, default_steps=256).steps == 56   # all 56
    with pytest.raises(TraceInputError, match="--trace-steps: .* has 56 steps, asked for 57"):
        traffic.load_trace_cut(big, None, 57)
    # what a calibration writes loads: fitted slopes the model does not read may be any number,
    # and a fit may put a cost the model only multiplies by at 0
    hardware.load_profile(_profile(tmp_path, "calib", "calib_x_cycles_per_iter",
                                   {"value": -3.0, "source": src}))
    hardware.load_profile(_profile(tmp_path, "fit0", "vec_cycles_per_repeat",
                                   {"value": 0.0, "source": src}))
    # generate has no --config: its missing-config error must not send the user to one
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    line = assert_one_line_error(["generate", "--checkpoint", str(ckpt), "--input-ids", "[[1]]"],
                                 "no config.json")
    assert "--config" not in line, line
    # a grid point the context cannot hold is refused before any point is written
    grid = tmp_path / "grid"
    assert_one_line_error(["trace", "synth", str(grid), "--steps", "4", "--k", "16", "--max-len",
                           "64", "--gamma", "0.9", "0", "--mu-hist", "0"], "--max-len")
    assert not grid.exists() or not any(grid.iterdir())


def test_third_review_cases(files, tmp_path):
    """Every comma-separated option: an empty item (``1,,2``, a trailing comma) is a typo and a
    repeated value (also written differently, ``32K,32768``) would run twice; both are refused
    by name. --layer-select ranges must run forwards and name each layer once. Then errors that
    used to name the wrong cause."""
    good = str(files["good"])
    out = str(tmp_path / "out")
    cases = [
        (["bench", "decode", "--batch", "1,,2", "--out", out], "--batch: empty value"),
        (["bench", "decode", "--batch", "1,8,", "--out", out], "--batch: empty value"),
        (["bench", "decode", "--batch", "8,8", "--out", out], "--batch: 8 given twice"),
        (["bench", "decode", "--context", "32K,32768", "--out", out], "--context: a value given twice"),
        (["bench", "decode", "--mtp", "1,1", "--out", out], "--mtp: 1 given twice"),
        (["bench", "gather", "--miss-rate", "0.5,,0.25", "--out", out], "--miss-rate: empty value"),
        (["bench", "gather", "--row-bytes", "656,656", "--out", out], "--row-bytes: 656 given twice"),
        (["bench", "hash-buckets", "--trace", good, "--ratios", "2,,4", "--out", out], "--ratios: empty value"),
        (["bench", "emulation", "--capacity", "4096,4096", "--out", out], "--capacity: 4096 given twice"),
        (["bench", "all", "--only", ",", "--out", out], "--only: expected at least one value"),
        (["run", "--modes", "avsg,,device"], "--modes: empty value"),
        (["serve-sim", "--variants", "elastic,", "--out", out], "--variants: empty value"),
        (["trace", "replay", good, "--layer-select", "1-0", "--no-plot"], "runs backwards"),
        (["trace", "replay", good, "--layer-select", ",,", "--no-plot"], "got '' in ',,'"),
        (["trace", "replay", good, "--layer-select", "0-1,1", "--no-plot"], "more than once"),
        (["trace", "replay", good, "--layer-select", "-1", "--no-plot"], "--layer-select: expected indices"),
        (["trace", "replay", good, "--policy", "lru", "--cost-every", "5", "--no-plot"],
         "--cost-every: read only by avsg"),
    ]
    for argv, needle in cases:
        assert_one_line_error(argv, needle)
    # "--cost-every 0" (off) asks nothing of a policy, so any policy takes it
    status, _, err = run(["trace", "replay", good, "--policy", "lru", "--cost-every", "0",
                          "--no-plot", "--quiet", "--out", out])
    assert status == 0, err[-2000:]
    # errors that named the wrong cause: a trace whose context alone is too much state (not
    # --capacity), a model with fewer positions than its top-k (not --context), a capacity for
    # a store that has no buffer
    rng = np.random.default_rng(0)
    sel = np.sort(np.stack([[rng.choice(1000, 16, replace=False) for _ in range(40)]
                            for _ in range(2)]), axis=2)
    far = tmp_path / "far.npz"
    np.savez(far, sel=sel, positions=np.arange(40) + 2 ** 40 - 40, T=np.int64(2 ** 40),
             k=np.int32(16))
    line = assert_one_line_error(["trace", "replay", str(far), "--capacity", "32", "--no-plot"],
                                 f"trace: {far}")
    assert "--capacity" not in line, line
    from avsg.lab.costmodel.projection import V32_CONFIG
    with open(V32_CONFIG) as f:
        config = json.load(f)
    small = tmp_path / "small.json"
    small.write_text(json.dumps({**config, "max_position_embeddings": 100}))
    assert_one_line_error(["bench", "decode", "--config", str(small), "--out", out],
                          "--config: max_position_embeddings (100) is below index_topk")
    assert_one_line_error(["generate", "--checkpoint", str(tmp_path), "--input-ids", "[[1]]",
                           "--capacity", "64"], "--capacity: sizes the avsg buffer")
    from avsg.lab.commands.trace.common import parse_index_list
    assert parse_index_list(" 0-2, 5 ", 6) == [0, 1, 2, 5]


def test_run_projects_a_small_model_with_a_large_buffer(tmp_path):
    """A buffer of many top-k's (129 slots of a top-8 model) scales past the op's largest
    buffer in the V3.2 projection; the run still succeeds and prints its estimate."""
    status, out, err = run(["run", "--config", "tiny", "--select", "indexer", "--context", "64",
                            "--batch", "1", "--requests", "1", "--new-tokens", "1", "--capacity",
                            "129", "--quiet"])
    assert status == 0, err[-2000:]
    assert "est. DeepSeek-V3.2" in out
    assert "outputs identical across modes" in out


def test_run_with_one_mode_compares_nothing():
    status, out, err = run(["run", "--config", "tiny", "--select", "indexer", "--context", "64",
                            "--batch", "1", "--requests", "1", "--new-tokens", "1", "--modes",
                            "avsg", "--quiet"])
    assert status == 0, err[-2000:]
    assert "outputs identical" not in out and "outputs not compared: one mode ran" in out


# ------------------------------------------------------------------------------ issue 45

def _cli_process(argv, env_extra, cwd, code=None):
    """``python -m avsg.cli ARGV`` (or ``python -c CODE``) with ``env_extra`` set."""
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "python"), **env_extra)
    cmd = [sys.executable, "-c", code] if code else [sys.executable, "-m", "avsg.cli", *argv]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=cwd)


@pytest.mark.parametrize("value", ["bogus", "", "FAST", " strict "])
def test_avsg_emulation_never_breaks_import_or_help(value, tmp_path):
    """AVSG_EMULATION is read when avsg is imported, before the CLI runs: a bad value used to
    raise there, an 11-line traceback for every command, --help included. Now --help works, a
    command refuses in one line naming the variable, any case of a build name is taken."""
    help_ = _cli_process(["--help"], {"AVSG_EMULATION": value}, tmp_path)
    assert help_.returncode == 0 and help_.stderr == "" and "usage: avsg" in help_.stdout, \
        help_.stderr
    probe = _cli_process(None, {"AVSG_EMULATION": value}, tmp_path, code=(
        "import avsg; print(avsg.backend.get_emulation(), avsg.backend.emulation_env_error())"))
    assert probe.returncode == 0, probe.stderr
    demo = _cli_process(["demo", "--steps", "1", "--layers", "1"], {"AVSG_EMULATION": value},
                        tmp_path)
    lines = demo.stderr.strip().splitlines()
    if value == "bogus":
        assert probe.stdout.split()[0] == "strict"       # the checking build stays selected
        assert demo.returncode == 2 and len(lines) == 1 and demo.stdout == "", demo.stderr
        assert lines[0].startswith("avsg demo: error: AVSG_EMULATION='bogus'"), lines
        assert "strict or fast" in lines[0]
    else:
        expected = value.strip().lower() or "strict"
        assert probe.stdout.split() == [expected, "None"], probe.stdout
        assert demo.returncode == 0 and "Traceback" not in demo.stderr, demo.stderr


@pytest.mark.parametrize("name, value, needle", [
    ("AVSG_NUM_CORES", "0", "whole number of cores >= 1"),
    ("AVSG_NUM_CORES", "abc", "whole number of cores >= 1"),
    ("AVSG_NUM_CORES", "100", "at most 40"),
    ("AVSG_NPU_SPLIT", "yes", "expected 0 or 1"),
    ("AVSG_NPU_SPLIT_TIMEOUT", "99999", "0..65535"),
    ("AVSG_GATHER_PAGE_READS", "no", "expected 0 or 1"),      # the C++ would read "no" as on
    ("AVSG_EMU_GRANULE_CHECK", "off", "expected 0 or 1"),
    ("AVSG_THREADS", "0", "1..1024"),
    ("AVSG_THREADS", "two", "1..1024"),
])
def test_environment_is_checked_before_the_first_line(monkeypatch, name, value, needle):
    """A bad AVSG_* value is one line naming the variable, before the command prints anything
    (AVSG_NUM_CORES=0 used to print demo's header, then blame num_cores)."""
    monkeypatch.setenv(name, value)
    for argv in (["demo", "--steps", "1", "--layers", "1"], ["run", "--config", "tiny"]):
        status, out, err = run(argv)
        lines = err.strip().splitlines()
        assert status == 2 and len(lines) == 1 and out == "", (argv, status, out, err)
        assert f"{name}={value!r} in the environment" in lines[0] and needle in lines[0], lines


def test_layer_select_is_bounded_before_it_is_expanded(files):
    """`--layer-select 0-100000000` used to expand the range first: 40 s, 13.9 GB and a 989 MB
    error line. 0-10**15 could not be expanded at all: it must be refused from its ends."""
    good = str(files["good"])
    huge = "0-" + str(10 ** 15)
    for argv in (["trace", "info", good], ["trace", "replay", good, "--no-plot"],
                 ["trace", "mtp", good, "--capacity", "64"]):
        line = assert_one_line_error(argv + ["--layer-select", huge], "--layer-select")
        assert "not in 0..1" in line and len(line) < 200, line
    line = assert_one_line_error(["trace", "info", good, "--layer-select",
                                  ",".join(["0"] * 20000)], "listed more than once")
    assert len(line) < 200, line
    line = assert_one_line_error(["trace", "info", good, "--layer-select",
                                  ",".join(["x"] * 20000)], "expected indices")
    assert len(line) < 200, line
    from avsg.lab.commands.trace.common import parse_index_list
    from avsg.cli_util import UsageError
    with pytest.raises(UsageError, match="index 5 is not in 0..3"):
        parse_index_list("0,5", 4)
    assert parse_index_list("3,0-2", 4) == [3, 0, 1, 2]


def test_bench_decode_refuses_a_one_layer_trace_before_its_results(tmp_path):
    """It printed 7 lines of results, then blamed --layers, an option it does not have."""
    one = tmp_path / "one.npz"
    save_trace(one, synth.generate(steps=120, layers=1, k=2048, max_len=8192, seed=0))
    status, out, err = run(["bench", "decode", "--trace", str(one), "--out", str(tmp_path)])
    lines = err.strip().splitlines()
    assert status == 2 and out == "" and len(lines) == 1, (out, err)
    assert "--trace:" in lines[0] and "1 layer" in lines[0] and "--layers" not in lines[0], lines
    # the bound is the counted plan's: the command's constant follows the library's default
    import inspect
    from avsg.lab.commands.bench import decode
    from avsg.lab.costmodel.plan_cost import counted_plan
    assert decode.PLAN_ROWS == inspect.signature(counted_plan).parameters["rows"].default


def test_binary_files_name_their_option_and_file(files, tmp_path):
    """A binary file as --hw, --config or a checkpoint's config.json gave a bare "'utf-8' codec
    can't decode ...": now the option and the file are named."""
    binary = tmp_path / "binary.json"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff\xfe")
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_bytes(binary.read_bytes())
    out = str(tmp_path / "out")
    b = str(binary)
    for argv, option in [
        (["bench", "decode", "--hw", b, "--out", out], "--hw"),
        (["bench", "decode", "--config", b, "--out", out], "--config"),
        (["bench", "plan", "--quick", "--no-trace", "--hw", b, "--out", out], "--hw"),
        (["serve-sim", "--hw", b, "--out", out], "--hw"),
        (["serve-sim", "--config", b, "--out", out], "--config"),
        (["trace", "replay", str(files["good"]), "--policy", "avsg", "--capacity", "32",
          "--cost-every", "1", "--hw", b, "--no-plot", "--out", out], "--hw"),
        (["run", "--config", b], "--config"),
        (["run", "--checkpoint", str(ckpt)], "--checkpoint"),
        (["generate", "--checkpoint", str(ckpt), "--input-ids", "[[1]]"], "--checkpoint"),
    ]:
        line = assert_one_line_error(argv, option + ":")
        assert "codec" not in line and "not a text file" in line, (argv, line)
        assert "binary.json" in line or "config.json" in line, (argv, line)
    # a config the loader refuses: the command's option and the file, not the loader's "config:"
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"model_type": "deepseek_v32", "bogus": 1}))
    for argv in (["bench", "decode", "--config", str(wrong), "--out", out],
                 ["serve-sim", "--config", str(wrong), "--out", out],
                 ["run", "--config", str(wrong)]):
        assert_one_line_error(argv, f"error: --config: {wrong}: unknown key 'bogus'")


def test_a_write_failing_after_the_work_names_its_option(files, tmp_path, monkeypatch):
    """A disk that fills while the results are written: the error names the option and file
    (it was a bare '[Errno 28] No space left on device')."""
    import errno
    from avsg.lab.traces import report

    def full(path, payload):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(report, "write_json", full)
    path = tmp_path / "r.json"
    assert_one_line_error(["trace", "mtp", str(files["good"]), "--capacity", "64", "--json",
                           str(path)], f"--json: cannot write {path}: No space left on device")
    # the backstop for a write no command wrapped: the outputs it checked are named
    from avsg import cli_util
    cli_util.forget_outputs()
    cli_util.check_writable("--json", str(path))
    message = cli_util.error_message(OSError(errno.ENOSPC, "No space left on device"))
    assert message == f"writing --json {path} failed: No space left on device", message
    cli_util.forget_outputs()


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_synth_shows_progress_on_a_terminal(tmp_path):
    """A 105 s synth showed nothing; now a progress bar on stderr when it is a terminal."""
    pytest.importorskip("tqdm")
    argv = ["trace", "synth", str(tmp_path / "p.npz"), "--steps", "200", "--k", "16",
            "--max-len", "400", "--layers", "2"]
    err = _Terminal()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        assert cli.main(argv) == 0
    assert "drawing" in err.getvalue(), err.getvalue()
    err = _Terminal()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        assert cli.main(argv + ["--quiet"]) == 0
    assert err.getvalue() == ""
    # the draw reports every step of every layer, warm-up included
    counted = []
    synth.generate(steps=130, layers=3, k=8, max_len=300, window=5, progress=counted.append)
    assert sum(counted) == 3 * (130 + 5 + 1)


def test_synth_refuses_a_file_name_for_a_grid_and_a_device(tmp_path):
    """`synth s.npz --gamma 0.5 0.7` created a directory named s.npz; `synth /dev/full` wrote a
    regular file /dev/full.npz."""
    target = tmp_path / "s.npz"
    assert_one_line_error(["trace", "synth", str(target), "--gamma", "0.5", "0.7", "--steps",
                           "4", "--k", "8", "--max-len", "64"], "give a directory")
    assert not target.exists()
    if os.path.exists("/dev/full"):
        assert_one_line_error(["trace", "synth", "/dev/full", "--steps", "4", "--k", "8",
                               "--max-len", "64"], "/dev/full is a character device")
        assert not os.path.exists("/dev/full.npz")


def test_absurd_values_are_refused(files, tmp_path):
    """serve-sim --requests 1000000 started hours of work without a word; a fractional core
    count in --hw, the same --trace twice and --acceptance with no drafts were taken."""
    good = str(files["good"])
    out = str(tmp_path / "out")
    line = assert_one_line_error(["serve-sim", "--requests", "1000000", "--out", out],
                                 "--requests: 1,000,000 requests")
    assert "add --long" in line and " h " in line, line
    # --long takes it past the bound (the run then stops at the missing trace, before the work)
    assert_one_line_error(["serve-sim", "--requests", "1000000", "--long", "--trace",
                           str(tmp_path / "missing.npz"), "--out", out], "--trace")
    # the default run stays within the bound
    from avsg.lab.commands import serve_sim
    assert 300 * 384 <= serve_sim.LONG_RUN_TOKENS
    relative = os.path.relpath(good)
    assert_one_line_error(["serve-sim", "--trace", good, "--trace", good, "--out", out],
                          "given twice")
    assert_one_line_error(["serve-sim", "--trace", good, "--trace", relative, "--out", out],
                          "given twice")
    frac = _profile(tmp_path, "frac", "aiv_cores", {"value": 39.5, "source": "a test"})
    for argv in (["serve-sim", "--hw", frac, "--out", out],
                 ["bench", "decode", "--hw", frac, "--out", out],
                 ["bench", "plan", "--quick", "--no-trace", "--hw", frac, "--out", out]):
        assert_one_line_error(argv, "'aiv_cores': expected a whole number")
    for acceptance in ("greedy", "sim:0.5"):
        assert_one_line_error(["run", "--acceptance", acceptance, "--mtp", "0"],
                              "--acceptance: decides which MTP drafts are accepted; --mtp 0")


# ------------------------------------------------------------------------------ CPU threads

def test_threads_follow_the_idle_cores(monkeypatch):
    """torch's threads spin at every barrier: on cores other processes keep busy they burn the
    time their peers need (a loaded `avsg run` took 554 s of CPU for 59 s of work). A command
    that computes takes one thread per idle core; AVSG_THREADS sets the count."""
    import torch
    from avsg import cli_util
    monkeypatch.delenv("AVSG_THREADS", raising=False)
    monkeypatch.setattr(cli_util, "idle_cores", lambda seconds=0.25: 0.1)
    assert cli_util.choose_torch_threads(2)[0] == 1
    monkeypatch.setattr(cli_util, "idle_cores", lambda seconds=0.25: 1.9)
    assert cli_util.choose_torch_threads(2)[0] == 2
    assert cli_util.choose_torch_threads(1)[0] == 1              # never past torch's own count
    monkeypatch.setattr(cli_util, "idle_cores", lambda seconds=0.25: None)
    assert cli_util.choose_torch_threads(4)[0] == 4              # unknown: torch's default
    monkeypatch.setenv("AVSG_THREADS", "3")
    assert cli_util.choose_torch_threads(2) == (3, "AVSG_THREADS=3")
    before = torch.get_num_threads()
    with cli_util.torch_threads() as (threads, _):
        assert threads == 3 and torch.get_num_threads() == 3
    assert torch.get_num_threads() == before
    idle = cli_util.idle_cores(0.05)
    assert idle is None or 0 <= idle <= len(os.sched_getaffinity(0)) + 1e-9


def test_run_computes_on_the_idle_cores_only(monkeypatch):
    """On a busy machine (no core idle) the run uses one torch thread and says so; its results
    do not depend on it."""
    import torch
    from avsg import cli_util
    monkeypatch.delenv("AVSG_THREADS", raising=False)
    monkeypatch.setattr(cli_util, "idle_cores", lambda seconds=0.25: 0.0)
    seen = []
    from avsg.commands import run as run_command
    real = run_command.run_mode

    def spy(*a, **kw):
        seen.append(torch.get_num_threads())
        return real(*a, **kw)
    monkeypatch.setattr(run_command, "run_mode", spy)
    before = torch.get_num_threads()
    status, out, err = run(["run", "--config", "tiny", "--select", "indexer", "--context", "64",
                            "--batch", "1", "--requests", "1", "--new-tokens", "2", "--quiet"])
    assert status == 0, err[-2000:]
    assert seen == [1, 1, 1], seen
    assert "torch on 1 thread: " in out, out
    if before > 1:      # it says why it took fewer than torch's own count
        assert f"torch on 1 thread: 0.0 of {before} cores idle" in out, out
    assert torch.get_num_threads() == before


def test_version_prints_the_package_version(capsys):
    import avsg
    from avsg import cli
    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"avsg {avsg.__version__}"
