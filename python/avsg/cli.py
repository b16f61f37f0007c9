"""The ``avsg`` console entry point (``avsg ...`` or ``python -m avsg.cli ...``); the commands and
their table are in :mod:`avsg.commands`."""
from __future__ import annotations

import sys

from .commands import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
