"""Shared by the conftests of tests/runtime and tests/integrations: those tests drive the ops
through whole decode or engine loops, so they run on the fast CPU build of the kernels (bit-exact
with the strict build, tests/kernels/test_emulation_fast.py). A test marked ``strict_kernels`` runs under
the strict emulation, so the new ways these layers call the ops are also checked by every
emulation rule."""
import pytest

from avsg import backend


def register_marker(config):
    config.addinivalue_line("markers", "strict_kernels: run under the strict kernel emulation")


@pytest.fixture(autouse=True)
def kernel_build(request):
    build = "strict" if request.node.get_closest_marker("strict_kernels") else "fast"
    with backend.emulation(build):
        yield
