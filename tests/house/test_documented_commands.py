"""Every `avsg ...` command in the code blocks of README.md and docs/*.md runs on a fresh clone: the
installed package and nothing beside it (each runs in an empty temporary directory, so a path such
as ../shared/... resolves to nothing), exit status 0. The quick variants run in this process (one
decode of each shipped trace for all of them), a command with environment settings in a fresh one.

What runs by default is each command's *quick variant*, by one rule per command (:func:`quick`): the
trace commands replay layer 0 for 24 steps (``--layer-select 0 --steps 24``, ``--cost-every 8``),
`trace synth` writes 24-step, 1-layer, 4K-context traces, `serve-sim` serves 4 requests on 2 rows of
each trace for 64 steps, `avsg run` decodes 2 requests of 8 tokens; every output (``--out``,
``--tables``, ``--json``, a positional output) goes to the temporary directory; environment settings
before the command (``AVSG_EMULATION=fast``) are kept. A console transcript (a block whose lines
start with ``$ avsg``) runs exactly as written and must print the lines the document shows under it,
in order, each exactly; a line ``...`` stands for printed lines left out (times, paths).
The full commands run under ``-m slow``; a full command that writes a results table
(``--tables docs/results/X.md``) must write the committed table, figure for figure, or the table
is in ``DIFFERS`` and its note says why and what the command prints now.

Commands a clone cannot run (an Ascend NPU, a checkpoint of real weights) are listed with the
reason in ``CANNOT_RUN``, and the document must say so next to them.

No README or docs command refers to ``../shared``: the package ships the traces they replay.
"""
from __future__ import annotations

import glob
import os
import re
import shlex
import subprocess
import sys
from typing import Dict, List, NamedTuple, Optional

import pytest

from helpers import REPO

DOCUMENTS = ["README.md"] + sorted(os.path.relpath(p, REPO)
                                   for p in glob.glob(os.path.join(REPO, "docs", "*.md")))
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
ASSIGNMENT = re.compile(r"^([A-Z_][A-Z0-9_]*)=(.*)$")
# a placeholder some documents write for "either full trace"
PLACEHOLDERS = {"TRACE": ("asyncio_32k", "debian_reference_32k")}
# what a clone cannot have, how to recognise a command that needs it, and the words its document
# must say next to it
CANNOT_RUN = [
    ("an Ascend NPU", lambda argv: "npu" in argv or argv[1:3] == ["bench", "calibrate"], "NPU"),
    ("a checkpoint of real weights (DIR)", lambda argv: "--checkpoint" in argv, "checkpoint"),
]
OUTPUT_OPTIONS = ("--out", "--tables", "--json", "--plot", "--record-trace")


class Documented(NamedTuple):
    doc: str
    argv: List[str]            # starting with "avsg"
    env: Dict[str, str]
    expected: Optional[str]    # the output a console transcript shows
    offset: int                # where in the document, for the CANNOT_RUN check

    @property
    def id(self) -> str:
        return f"{self.doc}: {' '.join(self.argv)}"[:150]


def _subcommands():
    from avsg.commands import COMMANDS
    return set(COMMANDS)


def _logical_lines(block: str):
    lines, current = [], ""
    for line in block.split("\n"):
        if current:
            line = " " + line.strip()
        if line.rstrip().endswith("\\"):
            current += line.rstrip()[:-1]
            continue
        lines.append(current + line)
        current = ""
    return lines


def documented_commands() -> List[Documented]:
    commands = _subcommands()
    found = []
    for doc in DOCUMENTS:
        text = open(os.path.join(REPO, doc), encoding="utf-8").read()
        for block in FENCE.finditer(text):
            body = block.group(1)
            transcript = re.match(r"\$ (avsg .*)\n", body)
            if transcript:                       # one command, then what it prints
                argv = shlex.split(transcript.group(1))
                found.append(Documented(doc, argv, {}, body[transcript.end():], block.start()))
                continue
            variables = {}
            for line in _logical_lines(body):
                m = ASSIGNMENT.match(line.strip())
                if m and len(shlex.split(line, comments=True)) == 1:     # NAME="..." alone
                    variables[m.group(1)] = shlex.split(m.group(2))[0] if m.group(2) else ""
                    continue
                for name, value in variables.items():
                    line = line.replace(f"${name}", value)
                try:
                    words = shlex.split(line, comments=True)
                except ValueError:
                    continue
                env = {}
                while words and ASSIGNMENT.match(words[0]):
                    key, value = words.pop(0).split("=", 1)
                    env[key] = value
                if len(words) < 2 or words[0] != "avsg" or words[1] not in commands:
                    continue                     # prose or a table row, not a command
                words = [w for w in words if not (w.startswith("[") or w.endswith("]"))]
                expansions = [words]
                for name, values in PLACEHOLDERS.items():
                    if name in words:
                        expansions = [[values[i] if w == name else w for w in argv]
                                      for argv in expansions for i in range(len(values))]
                for argv in expansions:
                    found.append(Documented(doc, argv, env, None, block.start()))
    return found


def _needs(argv):
    for what, needs, _ in CANNOT_RUN:
        if needs(argv):
            return what
    return None


def _set(argv: List[str], option: str, *values: str) -> List[str]:
    """argv with ``option`` given ``values`` (replacing what it had)."""
    out, i = [], 0
    while i < len(argv):
        if argv[i] == option:
            i += 1
            while i < len(argv) and not argv[i].startswith("-"):
                i += 1
            continue
        out.append(argv[i])
        i += 1
    return out + [option, *values]


def _outputs_to(argv: List[str], tmp: str) -> List[str]:
    """Every output the command writes, in ``tmp`` under its own base name."""
    out = list(argv)
    for i, word in enumerate(out[:-1]):
        if word in OUTPUT_OPTIONS:
            out[i + 1] = os.path.join(tmp, os.path.basename(out[i + 1].rstrip("/")) or "out")
    if out[1:3] == ["trace", "synth"]:
        out[3] = os.path.join(tmp, os.path.basename(out[3].rstrip("/")))
    return out


def quick(argv: List[str]) -> List[str]:
    """The quick variant of a documented command (the rule in the module docstring)."""
    head = argv[1:3]
    if head[0] == "trace" and head[1] in ("replay", "info", "mtp"):
        argv = _set(_set(argv, "--layer-select", "0"), "--steps", "24")
        if "--cost-every" in argv:
            argv = _set(argv, "--cost-every", "8")
        if head[1] == "replay" and "--no-plot" not in argv:
            argv = argv + ["--no-plot"]
    elif head == ["trace", "synth"]:
        for option, value in (("--steps", "24"), ("--layers", "1"), ("--max-len", "4096"),
                              ("--k", "256")):
            argv = _set(argv, option, value)
        argv = argv + ["--quiet"]
    elif head[0] == "serve-sim":
        for option, value in (("--requests", "4"), ("--layers-per-trace", "2"),
                              ("--trace-steps", "64")):
            argv = _set(argv, option, value)
    elif head[0] == "run":
        argv = _set(_set(_set(argv, "--requests", "2"), "--batch", "2"), "--new-tokens", "8")
        argv = argv + ["--quiet"]
    return argv


class Result(NamedTuple):
    returncode: int
    stdout: str
    stderr: str


def _run(argv: List[str], env: Dict[str, str], cwd: str, timeout: float, capsys=None,
         monkeypatch=None) -> Result:
    """The command as a user runs it: in this process (so the traces are decoded once for all the
    commands, as they are once per command), or in a fresh one when it sets environment variables
    read at import."""
    if capsys is not None and not env:
        from avsg import cli
        monkeypatch.chdir(cwd)
        capsys.readouterr()
        status = cli.main(argv[1:])
        out = capsys.readouterr()
        return Result(status, out.out, out.err)
    full_env = dict(os.environ, **env)
    full_env.pop("AVSG_SHARED_DIR", None)
    code = "import sys; from avsg import cli; sys.exit(cli.main(sys.argv[1:]))"
    result = subprocess.run([sys.executable, "-c", code, *argv[1:]], cwd=cwd, env=full_env,
                            capture_output=True, text=True, timeout=timeout)
    return Result(result.returncode, result.stdout, result.stderr)


COMMANDS = documented_commands()
RUNNABLE = [c for c in COMMANDS if _needs(c.argv) is None]


def test_the_documents_have_commands_and_transcripts():
    assert len(COMMANDS) >= 15
    assert any(c.expected for c in COMMANDS if c.doc == "README.md"), \
        "the README shows no trace-lab transcript"


def test_no_document_refers_to_shared():
    """No command (a code block, an inline `avsg ...`) and no table header names ../shared, and no
    document names a trace file there: the package ships them. (Prose may still say that the test
    comparing them with the recorded files finds those in ../shared/traces.)"""
    results = sorted(os.path.relpath(p, REPO)
                     for p in glob.glob(os.path.join(REPO, "docs", "results", "*.md")))
    for doc in DOCUMENTS + results:
        text = open(os.path.join(REPO, doc), encoding="utf-8").read()
        assert not re.search(r"\.\./shared/traces/\S+\.npz", text), f"{doc} names a trace file in ../shared"
        for block in FENCE.findall(text):
            assert "../shared" not in block, f"{doc}: a code block refers to ../shared"
        for span in re.findall(r"`([^`]+)`", text):
            if span.lstrip().startswith("avsg ") or "--trace" in span:
                assert "../shared" not in span, f"{doc}: `{span}` refers to ../shared"
    for c in COMMANDS:
        assert not any("../shared" in w for w in c.argv), c.id


def test_what_a_clone_cannot_run_is_said_next_to_it():
    for c in COMMANDS:
        what = _needs(c.argv)
        if what is None:
            continue
        keyword = next(k for w, _, k in CANNOT_RUN if w == what)
        text = open(os.path.join(REPO, c.doc), encoding="utf-8").read()
        near = text[max(0, c.offset - 800):c.offset + 800]
        assert keyword.lower() in near.lower(), f"{c.id}: needs {what}; its document does not say so"


@pytest.mark.parametrize("command", RUNNABLE, ids=[c.id for c in RUNNABLE])
def test_documented_command_runs_on_a_fresh_clone(command, tmp_path, capsys, monkeypatch):
    argv = command.argv if command.expected else quick(command.argv)
    argv = _outputs_to(argv, str(tmp_path))
    result = _run(argv, command.env, str(tmp_path), timeout=300, capsys=capsys,
                  monkeypatch=monkeypatch)
    assert result.returncode == 0, f"{' '.join(argv)}\n{result.stderr[-2000:]}"
    if command.expected:
        assert_transcript(command.expected, result.stdout)


def assert_transcript(shown: str, printed: str) -> None:
    """Every line of ``shown`` is printed, in order; ``...`` skips any printed lines."""
    lines = [line.rstrip() for line in printed.rstrip().split("\n")]
    at, skipping = 0, False
    for want in (line.rstrip() for line in shown.rstrip().split("\n")):
        if want == "...":
            skipping = True
            continue
        if skipping:
            while at < len(lines) and lines[at] != want:
                at += 1
        assert at < len(lines) and lines[at] == want, \
            f"the document shows {want!r}; the command printed:\n{printed}"
        at, skipping = at + 1, False
    assert skipping or at == len(lines), f"printed more than the document shows:\n{printed}"


def test_transcript_matching_sees_a_changed_figure():
    printed = "a: 1\nelapsed 3.2s\nb: 2\n"
    assert_transcript("a: 1\n...\nb: 2\n", printed)
    for shown in ("a: 1\n...\nb: 3\n", "a: 1\nb: 2\n", "a: 1\n"):
        with pytest.raises(AssertionError):
            assert_transcript(shown, printed)


# results tables the command no longer writes figure for figure: the figure it prints now, which
# the note under the table must quote, saying why it differs
DIFFERS = {
    # the 4096 row was measured with a count per position, before reuse's ghost table
    "docs/results/hit_rate_asyncio_32k.md": "86.98%",
    "docs/results/hit_rate_debian_reference_32k.md": "84.92%",
}


@pytest.mark.slow
@pytest.mark.parametrize("command", [c for c in RUNNABLE if not c.expected],
                         ids=[c.id for c in RUNNABLE if not c.expected])
def test_documented_command_runs_in_full(command, tmp_path):
    argv = _outputs_to(command.argv, str(tmp_path))
    result = _run(argv, command.env, str(tmp_path), timeout=4 * 3600)
    assert result.returncode == 0, f"{' '.join(argv)}\n{result.stderr[-2000:]}"
    if "--tables" in command.argv:
        committed = command.argv[command.argv.index("--tables") + 1]
        written = open(os.path.join(tmp_path, os.path.basename(committed))).read()
        shown = open(os.path.join(REPO, committed)).read()
        body = lambda text: text.split("\n", 1)[1]        # the first line names the command
        if committed in DIFFERS:
            note = shown.split("<!-- /results:", 1)[1]
            assert DIFFERS[committed] in written and DIFFERS[committed] in note, committed
        else:
            assert body(written) == body(shown), committed
