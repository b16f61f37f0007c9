"""Conventions every ``avsg`` command follows.

* A user mistake raises ``UsageError``: ``avsg`` prints one line on stderr
  (``avsg <command>: error: <message>``) and exits with status 2. Tracebacks are for real bugs
  (or ``--debug``).
* One mechanism for everything else a user can get wrong: :func:`report_error` turns the
  library's argument errors (``ValueError``, whose message starts with the argument's name), a
  corrupted or unreadable file (``zipfile.BadZipFile``, ``zlib.error``, ``EOFError``,
  ``OSError``) and a failed allocation (``MemoryError``) into the same one line, naming the
  command's option when the library's argument has one (``capacity:`` becomes ``--capacity:``).
* Numbers are range-checked by argparse itself (:func:`int_in`, :func:`float_in`,
  :func:`size_list`): the message names the option and the valid range, as the help text does.
* Outputs are checked before any work (:func:`output_path`), sizes against memory before they are
  allocated (:func:`check_memory`); traces are read by :mod:`avsg.lab.traces.lookup`, whose
  ``TraceInputError`` is such a ``ValueError``.
* Long runs show a progress bar on stderr when it is a terminal (``--quiet`` silences it).
* The ``AVSG_*`` environment variables are checked before any command runs
  (:func:`check_environment`), so a bad value is the same one line, naming the variable.
* Commands that compute with torch on the CPU run it on the cores other processes leave idle
  (:func:`torch_threads`; ``AVSG_THREADS`` overrides).
"""
from __future__ import annotations

import argparse
import contextlib
import errno
import math
import os
import re
import stat
import sys
import time
import zlib
import zipfile
from typing import Dict, Iterable, Iterator, List, Optional, Tuple


class UsageError(Exception):
    """A mistake in what the user asked for; the message names the option."""


class OneLineParser(argparse.ArgumentParser):
    """argparse whose errors are one line on stderr and exit status 2."""

    def error(self, message: str):  # noqa: D401  (argparse API)
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())}\n")


# ------------------------------------------------------------------------ one error mechanism

#: what a command can raise because of its input rather than a bug of ours
INPUT_ERRORS = (UsageError, ValueError, zipfile.BadZipFile, zlib.error, EOFError, OSError,
                MemoryError)


def mark_leaves(parser: argparse.ArgumentParser) -> None:
    """Give every leaf command its option strings (``args._options``), so that a library
    error naming an argument can be reported under the command's option."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        parser.set_defaults(_leaf=parser, _options=frozenset(
            o for a in parser._actions for o in a.option_strings if o.startswith("--")),
            _names={a.dest: next((o for o in a.option_strings if o.startswith("--")), a.dest)
                    for a in parser._actions if a.dest != "help"})
        return
    for sub in subs:
        for child in set(sub.choices.values()):
            mark_leaves(child)


#: errnos of a write that fails after its file was opened (a flush or close has no file name)
_WRITE_ERRNOS = frozenset(getattr(errno, name) for name in ("ENOSPC", "EDQUOT", "EFBIG", "EIO",
                                                             "EROFS") if hasattr(errno, name))


def error_message(error: BaseException, options: Iterable[str] = ()) -> str:
    """One line for ``error``: the library's argument name mapped to the command's option."""
    if isinstance(error, UsageError):
        text = str(error)
    elif isinstance(error, MemoryError):
        text = f"not enough memory for what was asked ({error or 'allocation failed'})"
    elif isinstance(error, OSError) and error.filename is not None:
        text = f"{error.filename}: {error.strerror or error}"
    elif isinstance(error, OSError) and error.errno in _WRITE_ERRNOS and _OUTPUTS:
        # a write that failed after its open (a full disk while flushing): the file is not in
        # the error, but it is one of the outputs the command checked before its work
        text = (f"writing {' / '.join(f'{o} {p}' for p, o in _OUTPUTS.items())} failed: "
                f"{error.strerror or error}")
    elif isinstance(error, UnicodeDecodeError):
        text = (f"a binary file where text was expected (byte {error.start} is not "
                f"{error.encoding})")
    elif isinstance(error, (zipfile.BadZipFile, zlib.error, EOFError)):
        text = f"a corrupted or truncated file ({type(error).__name__}: {error})"
    else:
        text = str(error) or type(error).__name__
        match = re.match(r"([a-z_][a-z0-9_]*):", text)
        if match:
            option = "--" + match.group(1).replace("_", "-")
            if option in set(options):
                text = option + text[len(match.group(1)):]
    return " ".join(text.split())


def report_error(prog: str, error: BaseException, options: Iterable[str] = ()) -> int:
    print(f"{prog}: error: {error_message(error, options)}", file=sys.stderr)
    return 2


# ------------------------------------------------------------------------ ranges (argparse types)

_SUFFIX = {"": 1, "k": 1024, "m": 1024 ** 2}


def _type(fn, name, low, high):
    fn.__name__ = name      # argparse names the type in its messages for plain ValueErrors
    fn.valid_range = (low, high)    # for the tests that feed every option its absurd values
    return fn


def _parse_int(text: str) -> int:
    """An integer, also written as 1e9 or with a K / M suffix (48K = 49152), as help texts do."""
    match = re.fullmatch(r"\s*([+-]?\d+)\s*([kKmM])\s*", text)
    if match:
        return int(match.group(1)) * _SUFFIX[match.group(2).lower()]
    value = float(text) if re.fullmatch(r"[+-]?\d+(\.0*)?[eE]\+?\d+", text.strip()) else None
    if value is not None and value.is_integer():
        return int(value)
    return int(text)


def _range_text(low, high) -> str:
    if high is None:
        return f">= {low:,}" if isinstance(low, int) else f">= {low:g}"
    if low is None:
        return f"<= {high:,}" if isinstance(high, int) else f"<= {high:g}"
    if isinstance(low, int) and isinstance(high, int):
        return f"{low:,}..{high:,}"
    return f"in [{low:g}, {high:g}]"


def int_in(low: Optional[int] = None, high: Optional[int] = None):
    """An argparse type: an integer in ``low..high`` (either end open when None)."""
    def parse(text: str) -> int:
        try:
            value = _parse_int(text)
        except (ValueError, OverflowError):
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if (low is not None and value < low) or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"expected an integer {_range_text(low, high)}, "
                                             f"got {text}")
        return value
    return _type(parse, "int", low, high)


def float_in(low: Optional[float] = None, high: Optional[float] = None,
             low_open: bool = False, high_open: bool = False):
    """An argparse type: a finite number in ``[low, high]`` (``low_open``/``high_open`` exclude
    the ends; None leaves that side open)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        below = low is not None and (value <= low if low_open else value < low)
        above = high is not None and (value >= high if high_open else value > high)
        if not math.isfinite(value) or below or above:
            if low is not None and high is not None:
                want = f"in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
            elif low is not None:
                want = f"{'>' if low_open else '>='} {low:g}"
            else:
                want = "" if high is None else f"{'<' if high_open else '<='} {high:g}"
            raise argparse.ArgumentTypeError(f"expected a finite number {want}".rstrip()
                                             + f", got {text}")
        return value
    return _type(parse, "float", low, high)


def parse_size(option: str, text: str, low: int = 1, high: Optional[int] = None) -> int:
    """An integer, or one with a K / M suffix (32K = 32768), in ``low..high``."""
    match = re.fullmatch(r"\s*(\d+)\s*([kKmM]?)\s*", text)
    if not match:
        raise UsageError(f"{option}: expected an integer like 32768 or 32K, got {text!r}")
    value = int(match.group(1)) * _SUFFIX[match.group(2).lower()]
    if value < low or (high is not None and value > high):
        raise UsageError(f"{option}: expected values {_range_text(low, high)}, got {text.strip()}")
    return value


def comma_list(option: str, text: str) -> List[str]:
    """The comma-separated items of ``text``, stripped: at least one, none empty (``1,,2`` or a
    trailing comma is a typo, not a shorter list), none twice (every list option runs each
    value once)."""
    items = [p.strip() for p in text.split(",")]
    if not any(items):
        raise UsageError(f"{option}: expected at least one value, got {text!r}")
    if not all(items):
        raise UsageError(f"{option}: empty value in {text!r}")
    repeated = [v for i, v in enumerate(items) if v in items[:i]]
    if repeated:
        raise UsageError(f"{option}: {repeated[0]} given twice in {text!r}")
    return items


def size_list(option: str, text: str, low: int = 1, high: Optional[int] = None) -> List[int]:
    """Comma-separated :func:`parse_size` values (:func:`comma_list`); equal values written
    differently (``32K,32768``) count as repeats too."""
    values = [parse_size(option, p, low, high) for p in comma_list(option, text)]
    if len(set(values)) < len(values):
        raise UsageError(f"{option}: a value given twice in {text!r}")
    return values


def reject_together(args, first: str, second: str, why: str = "") -> None:
    """A usage error when both options were given (``first``/``second`` as typed, e.g.
    ``--synthetic``); an option counts as given when its value is not None/False/empty."""
    def given(option):
        return getattr(args, option.lstrip("-").replace("-", "_"), None) not in (None, False, [], "")
    if given(first) and given(second):
        raise UsageError(f"{first} and {second} contradict each other" + (f": {why}" if why else ""))


# ------------------------------------------------------------------------ files and memory

def read_input(option: str, path, load):
    """``load(path)`` for ``option``'s file; its errors are one line naming both: a file that
    is not text (a binary given as a JSON profile or config: not a bare ``'utf-8' codec can't
    decode``), and the loader's ``ValueError`` (``config: unknown key ...`` becomes
    ``--config: PATH: unknown key ...``)."""
    try:
        return load(path)
    except UnicodeDecodeError as e:
        raise UsageError(f"{option}: {path} is not a text file (byte {e.start} is not "
                         f"{e.encoding}); expected JSON") from None
    except ValueError as e:
        text = " ".join(str(e).split())
        match = re.match(r"(--)?[a-z_][a-z0-9_-]*: ", text)     # the loader's own argument name
        rest = text[match.end():] if match else text
        where = "" if os.fspath(path) in rest else f"{path}: "
        raise UsageError(f"{option}: {where}{rest}") from None


#: the outputs the running command checked (path -> option), for a write that fails later
_OUTPUTS: Dict[str, str] = {}


def forget_outputs() -> None:
    """A new command line starts with no outputs (``avsg.commands.main`` calls it)."""
    _OUTPUTS.clear()


def _kind(path: str) -> str:
    """What a path that is not a regular file is, in words."""
    mode = os.stat(path).st_mode
    for test, name in ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISFIFO, "a pipe"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def output_path(option: str, path, suffix: str = "") -> Optional[str]:
    """The path a command will write for ``option`` (``suffix`` appended when the writer
    appends it, as numpy and matplotlib do), checked before any work: not a directory, its
    directory creatable and writable. None when ``path`` is empty."""
    if not path:
        return None
    path = os.fspath(path)
    if suffix and not path.endswith(suffix):
        if os.path.isdir(path):
            raise UsageError(f"{option}: {path} is a directory, expected a {suffix} file name")
        if os.path.exists(path) and not os.path.isfile(path):
            # `trace synth /dev/full` would otherwise create a regular file /dev/full.npz
            raise UsageError(f"{option}: {path} is {_kind(path)}; expected a {suffix} file name "
                             f"(the file would be {path}{suffix}, beside it)")
        path += suffix
    check_writable(option, path)
    return path


def check_writable(option: str, path) -> None:
    """Refuse, before any long work, an output file that cannot be written (one-line error).
    An existing file gets an empty write: a device that refuses every write (/dev/full) fails
    it, a regular file is left as it was."""
    if not path:
        return
    path = os.fspath(path)
    if os.path.isdir(path):
        raise UsageError(f"{option}: {path} is a directory, expected a file name")
    _make_parent(option, os.path.dirname(os.path.abspath(path)))
    existed = os.path.exists(path)
    try:        # the real test (root passes every os.access check, /proc refuses anyway)
        # O_NONBLOCK: a pipe nobody reads fails here instead of blocking the command
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK, 0o666)
        try:
            os.write(fd, b"")
        finally:
            os.close(fd)
    except OSError as e:
        if not existed:
            _remove_quietly(path)
        reason = "nothing reads that pipe" if e.errno == errno.ENXIO else e.strerror
        raise UsageError(f"{option}: cannot write {path}: {reason}") from None
    if not existed:
        _remove_quietly(path)
    _OUTPUTS[path] = option


def _remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


@contextlib.contextmanager
def writing(option: str, path) -> Iterator[None]:
    """Run a write of ``option``'s file ``path``; its failure (a disk that filled during the
    work) is one line naming both."""
    try:
        yield
    except OSError as e:
        raise UsageError(f"{option}: cannot write {path}: {e.strerror or e}") from None


def write_text(option: str, path, text: str) -> None:
    """Write ``text`` to ``option``'s file ``path``, a failure named by :func:`writing`."""
    with writing(option, path):
        with open(path, "w") as f:
            f.write(text)


def _make_parent(option: str, directory: str) -> None:
    """Create ``directory``; a one-line error naming the part of the path that is in the way."""
    if os.path.isdir(directory):
        return
    above = directory
    while above and not os.path.exists(above) and os.path.dirname(above) != above:
        above = os.path.dirname(above)
    if os.path.exists(above) and not os.path.isdir(above):
        raise UsageError(f"{option}: {above} is a file, not a directory")
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as e:
        raise UsageError(f"{option}: cannot create the directory {directory}: {e.strerror}") \
            from None


def check_dir_writable(option: str, path) -> str:
    """A directory the command will write into: created, and refused when it cannot be."""
    path = os.fspath(path)
    if os.path.exists(path) and not os.path.isdir(path):
        raise UsageError(f"{option}: {path} exists and is not a directory")
    _make_parent(option, os.path.abspath(path))
    if not os.access(path, os.W_OK | os.X_OK):
        raise UsageError(f"{option}: cannot write into {path}")
    _OUTPUTS[os.path.join(path, "")] = option
    return path


def available_memory() -> int:
    """Bytes this process could still allocate: MemAvailable, else physical memory."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 1 << 62


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return f"{n:.3g} B"


#: share of the available memory one command may plan to allocate: the rest is for what it
#: does not count (temporaries, the interpreter, other processes)
MEMORY_SHARE = 0.75


def check_memory(option: str, nbytes: float, what: str) -> None:
    """Refuse, before allocating, ``nbytes`` past :data:`MEMORY_SHARE` of what is available."""
    available = available_memory()
    if nbytes > MEMORY_SHARE * available:
        raise UsageError(f"{option}: {what} would need {_bytes(nbytes)}, more than the "
                         f"{_bytes(MEMORY_SHARE * available)} a command may use here "
                         f"({MEMORY_SHARE:.0%} of the {_bytes(available)} available)")


def check_memory_total(parts, what: str = "") -> None:
    """``parts``: (option, bytes, what) allocated together; their sum checked at once, the error
    naming the option with the largest share."""
    parts = list(parts)
    total = sum(p[1] for p in parts)
    option, _, biggest = max(parts, key=lambda p: p[1])
    check_memory(option, total, " + ".join(p[2] for p in parts) if len(parts) > 1 else biggest)


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


def progress_bar(total: int, desc: str, unit: str = "it", enabled: bool = True):
    """A tqdm bar on stderr, or a silent stand-in when disabled or tqdm is missing."""
    if not enabled:
        return _NoBar()
    try:
        from tqdm import tqdm
    except ImportError:
        return _NoBar()
    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, leave=False,
                dynamic_ncols=True)


def keep_freed_memory() -> None:
    """Ask glibc to keep freed memory instead of returning it to the OS.

    A decode step allocates and frees tensors of tens of MB (gathered KV rows, scores). With
    glibc's defaults each of them is a fresh mmap whose pages fault in on first touch, which on
    CPU costs more than the arithmetic. Raising the mmap and trim thresholds keeps them in the
    heap. No effect (and no error) where glibc is not the allocator.
    """
    import ctypes
    import ctypes.util
    name = ctypes.util.find_library("c")
    if not name or not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(name)
        M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
        libc.mallopt(M_MMAP_THRESHOLD, 1 << 30)
        libc.mallopt(M_TRIM_THRESHOLD, 2**31 - 1)
    except (OSError, AttributeError):
        pass


def empty_argument(args: argparse.Namespace, names: dict) -> Optional[str]:
    """The option (or positional) the command line gave an empty string: no avsg argument takes
    one, and a path of "" would silently mean the current directory or a default."""
    for dest, value in vars(args).items():
        if value == "" or (isinstance(value, list) and "" in value):
            return names.get(dest, dest)
    return None


# ------------------------------------------------------------------------ environment

THREADS_ENV = "AVSG_THREADS"
MAX_THREADS = 1024


def _env_problems() -> Iterator[Tuple[str, str, str]]:
    """(variable, value, what was expected) for every AVSG_* variable set to a value that the
    code reading it would refuse later (after a command printed its header), fail on at import,
    or silently take for something else (the C++ reads ``AVSG_GATHER_PAGE_READS=no`` as on)."""
    from . import backend
    env = os.environ
    error = backend.emulation_env_error()
    if error is not None:
        yield backend.EMULATION_ENV, env.get(backend.EMULATION_ENV, ""), error
    text = env.get("AVSG_NUM_CORES", "").strip()
    if text:        # read as avsg.buffer reads it (there, only the first gather would fail)
        from .buffer import DEFAULT_NUM_CORES
        # the CPU emulation has a fixed core count: a gather over more cores fails at its first
        # launch, after the command printed its header (an NPU has its own count)
        emulated = (backend.emulated_cores() if hasattr(backend, "emulated_cores")
                    and not backend.backend_info()["npu_loaded"] else None)
        if not (text.isascii() and text.isdecimal()) or int(text) < 1:
            yield ("AVSG_NUM_CORES", text, f"expected a whole number of cores >= 1 (unset it "
                   f"for the default, {DEFAULT_NUM_CORES})")
        elif emulated and int(text) > emulated:
            yield ("AVSG_NUM_CORES", text, f"expected at most {emulated}, the AIV cores of the CPU "
                   f"emulation (unset it for the default, {DEFAULT_NUM_CORES})")
    for name, meaning in (("AVSG_NPU_SPLIT", "1: plan may split its lookup over idle cores"),
                          ("AVSG_GATHER_PAGE_READS", "1: gather may read whole host pages"),
                          ("AVSG_EMU_GRANULE_CHECK", "0: the strict emulation skips its 32 B "
                           "granule check")):
        text = env.get(name, "")
        if text and text not in ("0", "1"):
            yield name, text, f"expected 0 or 1 ({meaning})"
    text = env.get("AVSG_NPU_SPLIT_TIMEOUT", "")
    if text and not (text.isdigit() and int(text) <= 65535):
        yield ("AVSG_NPU_SPLIT_TIMEOUT", text, "expected whole seconds in 0..65535 (0: no limit)")
    text = env.get(THREADS_ENV, "").strip()
    if text and text != "auto" and not (text.isdigit() and 1 <= int(text) <= MAX_THREADS):
        yield (THREADS_ENV, text, f"expected 'auto' or a thread count in 1..{MAX_THREADS} (torch's "
               f"CPU threads for the commands that compute)")


def check_environment() -> None:
    """Refuse, before any command runs, an ``AVSG_*`` variable with a value its reader refuses:
    one line naming it instead of a traceback at import or an error after the first results."""
    for name, value, expected in _env_problems():
        raise UsageError(f"{name}={value!r} in the environment: {expected}")


# ------------------------------------------------------------------------ CPU threads

def _cpu_times(cpus: Iterable[int]) -> Optional[Tuple[float, float]]:
    """(idle, total) jiffies of ``cpus`` summed, from /proc/stat; None where it is unreadable."""
    want = {f"cpu{c}" for c in cpus}
    idle = total = 0.0
    try:
        with open("/proc/stat") as f:
            for line in f:
                fields = line.split()
                if fields and fields[0] in want:
                    values = [float(v) for v in fields[1:]]
                    idle += values[3] + (values[4] if len(values) > 4 else 0.0)  # idle, iowait
                    total += sum(values[:8])     # guest time is already counted in user
    except (OSError, ValueError, IndexError):
        return None
    return (idle, total) if total else None


def idle_cores(seconds: float = 0.25) -> Optional[float]:
    """How many of the cores this process may run on other processes left idle over the last
    ``seconds`` (this one sleeps meanwhile); None where /proc/stat cannot tell."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = list(range(os.cpu_count() or 1))
    before = _cpu_times(cpus)
    if before is None:
        return None
    time.sleep(seconds)
    after = _cpu_times(cpus)
    if after is None or after[1] <= before[1]:
        return None
    return len(cpus) * (after[0] - before[0]) / (after[1] - before[1])


def choose_torch_threads(default: int) -> Tuple[int, str]:
    """torch's CPU threads for a command that computes, and why, in words.

    ``AVSG_THREADS=N`` sets N; unset (or ``auto``), the cores other processes left idle, at
    least 1 and at most torch's own default. Why not torch's default (every core): its threads
    meet at a barrier after each parallel op and spin while they wait; on cores other processes
    keep busy, a waiting thread burns the time slice its peer needs, and `avsg run` took 554 s
    of CPU where it takes 59 s on an idle machine. One thread per idle core keeps the speed-up
    of an idle machine and costs nothing on a busy one. Chosen once per command, so that every
    mode of a run computes with the same threads."""
    text = os.environ.get(THREADS_ENV, "").strip()
    if text and text != "auto":
        return int(text), f"{THREADS_ENV}={text}"
    idle = idle_cores()
    if idle is None:
        return default, f"torch's default; {THREADS_ENV}=N sets it"
    threads = max(1, min(default, int(idle + 0.5)))
    if threads == default:
        return threads, f"{THREADS_ENV}=N sets it"
    return threads, (f"{idle:.1f} of {default} cores idle at the start; {THREADS_ENV}=N "
                     f"sets it")


@contextlib.contextmanager
def torch_threads() -> Iterator[Tuple[int, str]]:
    """The block computes with :func:`choose_torch_threads`'s count; torch's previous count is
    restored after it (callers in the same process, such as tests, keep theirs)."""
    import torch
    previous = torch.get_num_threads()
    threads, why = choose_torch_threads(previous)
    torch.set_num_threads(threads)
    try:
        yield threads, why
    finally:
        torch.set_num_threads(previous)


_COMMAND_RUNNER = None


def register_command_runner(runner) -> None:
    """The CLI's entry point (``avsg.commands.main``, which registers itself): ``runner(argv) ->
    exit status``."""
    global _COMMAND_RUNNER
    _COMMAND_RUNNER = runner


def run_command(argv) -> int:
    """Run one ``avsg`` command line as the CLI would (``avsg bench all`` runs each benchmark
    so)."""
    if _COMMAND_RUNNER is None:
        raise RuntimeError("run_command: the avsg command table is not loaded (import "
                           "avsg.commands)")
    return _COMMAND_RUNNER(argv)
