"""Fast kernel build for these loop-level tests, strict for tests marked ``strict_kernels``
(see tests/helpers/kernel_build.py)."""
from helpers.kernel_build import kernel_build, register_marker  # noqa: F401  (autouse fixture)


def pytest_configure(config):
    register_marker(config)
