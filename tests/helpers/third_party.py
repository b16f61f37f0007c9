"""The third-party source trees on the pytest side. scripts/third_party.py is the one list (names,
commits, the cache folder, $AVSG_THIRD_PARTY); this adds what a test does without a tree: skip,
saying which tree and which folder, or fail where CI found the trees and so requires them."""
import os
import sys

import pytest

from helpers import REPO

SCRIPTS = os.path.join(REPO, "scripts")
if SCRIPTS not in sys.path:
    sys.path.insert(0, SCRIPTS)
from third_party import missing, tree_dir  # noqa: E402


def require(*names, required_by):
    """The named trees' folders. Without one the calling test is skipped with the reason
    (scripts/third_party.py's line: the tree, the folder looked in, the variable, the docs), or
    failed when the environment variable ``required_by`` is 1: .ci/run sets it only after finding
    the trees, so a test that then misses one is broken, not skipped."""
    why = missing(names)
    if why:
        if os.environ.get(required_by) == "1":
            pytest.fail(f"{required_by}=1, but {why}")
        pytest.skip(why)
    return [tree_dir(name) for name in names]
