"""Integration tests drive the manager through engine-like loops on the fast CPU build of the
kernels (bit-exact with the strict build, tests/test_emulation_fast.py); a test marked
``strict_kernels`` runs under the strict emulation, so the manager's ways of calling the ops are
also checked by every emulation rule."""
import pytest

from avsg import backend


def pytest_configure(config):
    config.addinivalue_line("markers", "strict_kernels: run under the strict kernel emulation")


@pytest.fixture(autouse=True)
def _kernel_build(request):
    build = "strict" if request.node.get_closest_marker("strict_kernels") else "fast"
    with backend.emulation(build):
        yield
