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
  allocated (:func:`check_memory`); traces are read by :mod:`avsg.traces.lookup`, whose
  ``TraceInputError`` is such a ``ValueError``.
* Long runs show a progress bar on stderr when it is a terminal (``--quiet`` silences it).
"""
from __future__ import annotations

import argparse
import math
import os
import re
import sys
import zlib
import zipfile
from typing import Iterable, List, Optional


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


def error_message(error: BaseException, options: Iterable[str] = ()) -> str:
    """One line for ``error``: the library's argument name mapped to the command's option."""
    if isinstance(error, UsageError):
        text = str(error)
    elif isinstance(error, MemoryError):
        text = f"not enough memory for what was asked ({error or 'allocation failed'})"
    elif isinstance(error, OSError) and error.filename is not None:
        text = f"{error.filename}: {error.strerror or error}"
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
        path += suffix
    check_writable(option, path)
    return path


def check_writable(option: str, path) -> None:
    """Refuse, before any long work, an output file that cannot be written (one-line error)."""
    if not path:
        return
    path = os.fspath(path)
    if os.path.isdir(path):
        raise UsageError(f"{option}: {path} is a directory, expected a file name")
    _make_parent(option, os.path.dirname(os.path.abspath(path)))
    existed = os.path.exists(path)
    try:        # the real test (root passes every os.access check, /proc refuses anyway)
        with open(path, "ab"):
            pass
    except OSError as e:
        raise UsageError(f"{option}: cannot write {path}: {e.strerror}") from None
    if not existed:
        try:
            os.remove(path)
        except OSError:
            pass


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
