import os
import sys

# tests import their helpers (oracle.py) as top-level modules
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import pytest


@pytest.fixture(autouse=True)
def _restore_emulation_build():
    """Commands run in-process (the CLI tests call ``cli.main``) may select the fast emulation
    build for the whole process, as `avsg run --emulation fast` does; every test starts from the
    build the one before it found."""
    from avsg import backend
    build = backend.get_emulation() if backend._has_op("emulation") else None
    yield
    if build is not None and backend.get_emulation() != build:
        backend.set_emulation(build)
