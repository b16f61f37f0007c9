#!/usr/bin/env python3
"""The third-party source trees some tests read, in one place: which trees, at which commits,
where they come from, and where this machine keeps them.

    python scripts/third_party.py                    # every tree: commit, present or absent, folder
    python scripts/third_party.py missing NAME ...   # exit 0 and print nothing when all are present,
                                                     # else one line saying what is missing, exit 1

A tree is the upstream source at one commit, unpacked in a folder of its own under the cache
root: ``$AVSG_THIRD_PARTY/<name>/<commit>/`` (root ~/.cache/avsg/third_party when the variable is
unset). Readers use it in place and write nothing into it; nothing from it is committed here.
docs/testing.md, "Third-party source trees", says how to fill the cache and what each tree
enables. Imports nothing from tests/, so scripts/typecheck_ascendc.py and .ci/run use it as is.
"""
import os
import sys
from typing import NamedTuple, Optional, Sequence

ROOT_ENV = "AVSG_THIRD_PARTY"
DEFAULT_ROOT = "~/.cache/avsg/third_party"
HOW_TO_FILL = 'docs/testing.md, "Third-party source trees"'

CANN_LICENCE = "CANN Open Software License Agreement 2.0"


class Tree(NamedTuple):
    name: str
    commit: str
    url: str
    licence: str
    # paths a filled tree has: an empty or half-copied folder counts as absent, not as a tree
    # whose readers then fail on a missing header
    expected: Sequence[str]


TREES = {tree.name: tree for tree in (
    Tree("vllm-ascend", "182b75ea84ff13ece27b57391331ef8935410aea",
         "https://github.com/vllm-project/vllm-ascend", "Apache 2.0", ("vllm_ascend", "tests/ut")),
    Tree("asc-devkit", "82b89a15f26329511fc7fbc807d5132a1f9b4ba7",
         "https://github.com/mirror-cann/asc-devkit", CANN_LICENCE, ("include", "impl")),
    Tree("asc-tools", "2113e48fa56bd012d07a81256ed7ceb66d338262",
         "https://github.com/hicann/asc-tools", CANN_LICENCE, ("cpudebug/include",)),
)}


def cache_root(root: Optional[str] = None) -> str:
    """``root`` if given, else $AVSG_THIRD_PARTY, else the default, as an absolute path."""
    return os.path.abspath(os.path.expanduser(root or os.environ.get(ROOT_ENV) or DEFAULT_ROOT))


def tree_dir(name: str, root: Optional[str] = None) -> str:
    tree = TREES[name]
    return os.path.join(cache_root(root), tree.name, tree.commit)


def _absent_parts(name: str, root: Optional[str]) -> list:
    folder = tree_dir(name, root)
    return [part for part in TREES[name].expected if not os.path.exists(os.path.join(folder, part))]


def is_present(name: str, root: Optional[str] = None) -> bool:
    return not _absent_parts(name, root)


def missing(names: Sequence[str], root: Optional[str] = None) -> Optional[str]:
    """None when every named tree is present; else one line naming each missing tree's folder, the
    variable that moves the cache root, and where the instructions to fill it are."""
    absent = []
    for name in names:
        parts = _absent_parts(name, root)
        if parts:
            folder = tree_dir(name, root)
            found = "" if not os.path.isdir(folder) else f" (it has no {', '.join(parts)})"
            absent.append(f"{name} at {folder}{found}")
    if not absent:
        return None
    return (f"third-party source tree not found: {'; '.join(absent)}. The cache root is "
            f"${ROOT_ENV} (default {DEFAULT_ROOT}); to fill it see {HOW_TO_FILL}")


def main(argv: Sequence[str]) -> int:
    if argv and argv[0] == "missing" and len(argv) > 1 and all(n in TREES for n in argv[1:]):
        why = missing(argv[1:])
        if why:
            print(why)
            return 1
        return 0
    if argv:
        print(f"usage: third_party.py [missing NAME ...]; names: {', '.join(TREES)}", file=sys.stderr)
        return 2
    for tree in TREES.values():
        state = "present" if is_present(tree.name) else "absent "
        print(f"{tree.name:<12} {tree.commit}  {state}  {tree_dir(tree.name)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
