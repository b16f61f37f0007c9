"""scripts/third_party.py, the one list of the third-party source trees: where a tree is looked
for, when it counts as present, the one-line reason its absence gives, and the documents and
.ci/run keeping to the list. Needs no tree: the cache here is a temporary folder."""
import os
import re
import subprocess
import sys

from helpers import REPO

sys.path.insert(0, os.path.join(REPO, "scripts"))
import third_party as trees  # noqa: E402

SCRIPT = os.path.join(REPO, "scripts", "third_party.py")


def _fill(root, name):
    folder = root / name / trees.TREES[name].commit
    for part in trees.TREES[name].expected:
        (folder / part).mkdir(parents=True)
    return folder


def test_the_root_is_the_argument_else_the_variable_else_the_default(monkeypatch, tmp_path):
    monkeypatch.delenv(trees.ROOT_ENV, raising=False)
    assert trees.cache_root() == os.path.expanduser("~/.cache/avsg/third_party")
    monkeypatch.setenv(trees.ROOT_ENV, str(tmp_path / "env"))
    assert trees.tree_dir("asc-tools") == str(tmp_path / "env" / "asc-tools" / trees.TREES["asc-tools"].commit)
    assert trees.cache_root(str(tmp_path / "arg")) == str(tmp_path / "arg")


def test_a_tree_is_present_only_with_every_expected_part(monkeypatch, tmp_path):
    monkeypatch.setenv(trees.ROOT_ENV, str(tmp_path))
    folder = tmp_path / "asc-devkit" / trees.TREES["asc-devkit"].commit
    (folder / "include").mkdir(parents=True)
    assert not trees.is_present("asc-devkit")
    assert "(it has no impl)" in trees.missing(["asc-devkit"])
    (folder / "impl").mkdir()
    assert trees.is_present("asc-devkit") and trees.missing(["asc-devkit"]) is None
    other = tmp_path / "asc-devkit" / ("0" * 40)       # another commit is not this tree
    other.mkdir()
    assert trees.is_present("asc-devkit")


def test_the_reason_names_each_missing_tree_its_folder_the_variable_and_the_docs(tmp_path):
    _fill(tmp_path, "asc-devkit")
    why = trees.missing(["asc-devkit", "asc-tools", "vllm-ascend"], str(tmp_path))
    assert "\n" not in why and "asc-devkit" not in why
    for name in ("asc-tools", "vllm-ascend"):
        assert f"{name} at {trees.tree_dir(name, str(tmp_path))}" in why
    assert "$AVSG_THIRD_PARTY" in why and trees.DEFAULT_ROOT in why and "docs/testing.md" in why


def test_the_command_line_ci_uses(tmp_path):
    env = dict(os.environ, AVSG_THIRD_PARTY=str(tmp_path))
    run = lambda *args: subprocess.run([sys.executable, SCRIPT, *args], capture_output=True,  # noqa: E731
                                       text=True, env=env, timeout=60)
    absent = run("missing", "vllm-ascend")
    assert absent.returncode == 1 and absent.stdout.count("\n") == 1 and "vllm-ascend at" in absent.stdout
    _fill(tmp_path, "vllm-ascend")
    present = run("missing", "vllm-ascend")
    assert present.returncode == 0 and present.stdout == ""
    assert run("missing", "no-such-tree").returncode == 2 and run("missing").returncode == 2
    listing = run().stdout.splitlines()
    assert [line.split()[:3] for line in listing] == [
        [t.name, t.commit, "present" if t.name == "vllm-ascend" else "absent"] for t in trees.TREES.values()]


def test_the_docs_give_every_tree_its_url_commit_and_licence_and_ci_asks_for_each():
    """The list is kept once in scripts/third_party.py; docs/testing.md's table and fill commands
    repeat it for the reader, so they are checked against it."""
    docs = open(os.path.join(REPO, "docs", "testing.md")).read()
    section = docs[docs.index("## Third-party source trees"):]
    section = section[:section.index("\n## ")] if "\n## " in section else section
    ci = open(os.path.join(REPO, ".ci", "run")).read()
    asked = {name for args in re.findall(r"third_party\.py missing ([\w -]+)\)", ci) for name in args.split()}
    assert asked == set(trees.TREES)
    for tree in trees.TREES.values():
        row = next(line for line in section.splitlines() if line.startswith(f"| `{tree.name}` |"))
        assert tree.url in row and f"`{tree.commit}`" in row and tree.licence in row, row
        assert re.search(rf"^{re.escape(tree.name)} +{re.escape(tree.url)} +{tree.commit}$", section, re.M), tree.name
