"""Conventions every ``avsg`` command follows.

* A user mistake raises ``UsageError``: ``avsg`` prints one line on stderr
  (``avsg <command>: error: <message>``) and exits with status 2. Tracebacks are for real bugs
  (or ``--debug``).
* Long runs show a progress bar on stderr when it is a terminal (``--quiet`` silences it).
"""
from __future__ import annotations

import argparse
import sys


class UsageError(Exception):
    """A mistake in what the user asked for; the message names the option."""


class OneLineParser(argparse.ArgumentParser):
    """argparse whose errors are one line on stderr and exit status 2."""

    def error(self, message: str):  # noqa: D401  (argparse API)
        self.exit(2, f"{self.prog}: error: {message}\n")


def check_writable(option: str, path) -> None:
    """Refuse, before any long work, an output file that cannot be written (one-line error)."""
    if not path:
        return
    import os
    parent = os.path.dirname(str(path)) or "."
    try:
        os.makedirs(parent, exist_ok=True)
    except OSError as e:
        raise UsageError(f"{option}: cannot create the directory {parent}: {e.strerror}") from None
    if os.path.isdir(path) or not os.access(parent, os.W_OK):
        raise UsageError(f"{option}: cannot write {path}")


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
