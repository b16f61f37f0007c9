"""Runtime tests drive the ops through whole decode loops. They use the fast CPU build of the
kernels (checked bit for bit against the strict build in tests/test_emulation_fast.py); a test
marked ``strict_kernels`` runs under the strict emulation instead, so new ways of calling the ops
from the runtime are also checked by every emulation rule."""
import pytest

from avsg import backend


def pytest_configure(config):
    config.addinivalue_line("markers", "strict_kernels: run under the strict kernel emulation")


@pytest.fixture(autouse=True)
def _kernel_build(request):
    build = "strict" if request.node.get_closest_marker("strict_kernels") else "fast"
    with backend.emulation(build):
        yield
