"""The documents agree with the repository: README.md and docs/*.md quote the committed results
tables byte for byte (docs/results/*.md, written by the commands the documents give, copied in by
scripts/update_readme_tables.py); every relative link and anchor in README.md, CHANGELOG.md and
docs/ resolves; every repository path a document names in backticks exists; and the README's test
command is the one .ci/run runs."""
from __future__ import annotations

import glob
import os
import re
import subprocess
import sys


def _repo() -> str:
    """The repository root, wherever under tests/ this file sits."""
    path = os.path.dirname(os.path.abspath(__file__))
    while not os.path.exists(os.path.join(path, ".ci", "run")):
        parent = os.path.dirname(path)
        assert parent != path, "no .ci/run above tests/"
        path = parent
    return path


REPO = _repo()
RESULTS = os.path.join(REPO, "docs", "results")
TABLE = re.compile(r"<!-- results:([\w-]+) -->\n(.*?)<!-- /results:\1 -->", re.S)


def _read(rel: str) -> str:
    with open(os.path.join(REPO, rel), encoding="utf-8") as f:
        return f.read()


def _documents(with_results: bool = False) -> list:
    """Repository-relative paths of the Markdown documents (docs/results only when asked)."""
    docs = sorted(os.path.relpath(p, REPO) for p in glob.glob(os.path.join(REPO, "docs", "*.md")))
    if with_results:
        docs += sorted(os.path.relpath(p, REPO) for p in glob.glob(os.path.join(RESULTS, "*.md")))
    return ["README.md", "CHANGELOG.md"] + docs


# ------------------------------------------------------------------ quoted results tables

def test_quoted_tables_match_the_committed_results():
    """Every results table a document quotes is the committed one, byte for byte; every committed
    results file is quoted by at least one document; the README quotes at least one table."""
    committed, by_file = {}, {}
    for path in sorted(glob.glob(os.path.join(RESULTS, "*.md"))):
        name = os.path.basename(path)
        by_file[name] = dict(TABLE.findall(_read(os.path.relpath(path, REPO))))
        for table in by_file[name]:
            assert table not in committed, f"results table '{table}' is in two docs/results files"
        committed.update(by_file[name])
    assert committed, "docs/results/*.md hold no tables"
    quoted = {}
    for doc in _documents():
        text = _read(doc)
        opened = re.findall(r"<!-- results:([\w-]+) -->", text)
        tables = dict(TABLE.findall(text))
        assert sorted(opened) == sorted(tables), f"{doc}: a results marker without its end marker"
        for name, table in tables.items():
            assert name in committed, f"{doc}: table '{name}' is in no docs/results file"
            assert table.strip() == committed[name].strip(), \
                f"{doc}: table '{name}' differs from docs/results (python scripts/update_readme_tables.py)"
            quoted.setdefault(name, []).append(doc)
        if doc == "README.md":
            assert tables, "the README quotes no results tables"
    for name, tables in by_file.items():
        assert set(tables) & set(quoted), f"docs/results/{name} is quoted by no document"


def test_the_update_script_finds_nothing_stale():
    res = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "update_readme_tables.py"),
                          "--check"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr


def test_the_update_script_rewrites_a_stale_copy(tmp_path):
    """The script copies a changed results table into every quoting document (README and docs/)."""
    import shutil
    repo = tmp_path / "repo"
    shutil.copytree(os.path.join(REPO, "docs"), repo / "docs")
    (repo / "scripts").mkdir()
    shutil.copy(os.path.join(REPO, "scripts", "update_readme_tables.py"), repo / "scripts")
    shutil.copy(os.path.join(REPO, "README.md"), repo / "README.md")
    name = TABLE.search((repo / "README.md").read_text()).group(1)
    source = next(p for p in (repo / "docs" / "results").glob("*.md")
                  if f"<!-- results:{name} -->" in p.read_text())
    text = source.read_text()
    source.write_text(text.replace(f"<!-- results:{name} -->\n", f"<!-- results:{name} -->\n| new |\n", 1))
    script = str(repo / "scripts" / "update_readme_tables.py")
    assert subprocess.run([sys.executable, script, "--check"], capture_output=True).returncode == 1
    assert subprocess.run([sys.executable, script], capture_output=True).returncode == 0
    assert f"<!-- results:{name} -->\n| new |\n" in (repo / "README.md").read_text()
    assert subprocess.run([sys.executable, script, "--check"], capture_output=True).returncode == 0


# ------------------------------------------------------------------ links and paths

def _prose(text: str) -> str:
    """The text outside fenced code blocks and inline code spans."""
    text = re.sub(r"^```.*?^```[^\n]*$", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def _anchors(text: str) -> set:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens, repeats -1, -2."""
    seen, anchors = {}, set()
    for heading in re.findall(r"^#{1,6} +(.+?) *#*$", re.sub(r"^```.*?^```[^\n]*$", "", text,
                                                             flags=re.S | re.M), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def _links(text: str) -> list:
    return re.findall(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", _prose(text))


def test_every_relative_link_and_anchor_resolves():
    broken = []
    for doc in _documents(with_results=True):
        for target in _links(_read(doc)):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):        # https:, mailto:, ...
                continue
            path, _, anchor = target.partition("#")
            rel = os.path.normpath(os.path.join(os.path.dirname(doc), path)) if path else doc
            if not os.path.exists(os.path.join(REPO, rel)):
                broken.append(f"{doc}: {target} (no {rel})")
            elif anchor and rel.endswith(".md") and anchor not in _anchors(_read(rel)):
                broken.append(f"{doc}: {target} (no heading '#{anchor}' in {rel})")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_the_link_checker_sees_a_broken_link():
    text = "# A `b` (c)\n\n[ok](#a-b-c) [bad](#nope) `[code](nowhere.md)`\n```\n[x](y.md)\n```\n"
    assert _links(text) == ["#a-b-c", "#nope"]
    assert _anchors(text) == {"a-b-c"}
    assert _anchors("## §3 The contract\n## x\n## x\n") == {"3-the-contract", "x", "x-1"}


REPO_PATH = re.compile(r"`((?:docs|tests|scripts|python|op_kernel|op_host)/[\w./*-]*)`")


def test_every_repository_path_a_document_names_exists():
    """`docs/...`, `tests/...`, `python/...` and the like in backticks name something that exists
    (a glob must match something), so a moved file cannot leave a document pointing nowhere.
    A path whose directory is not in this repository is another repository's (vllm-ascend's
    tests, asc-devkit's docs); a shared library is a build product."""
    missing = []
    for doc in _documents():
        for path in REPO_PATH.findall(_read(doc)):
            path = path.rstrip(".")
            parent = os.path.dirname(path.rstrip("/"))
            if path.endswith(".so") or not os.path.isdir(os.path.join(REPO, parent)):
                continue
            if not glob.glob(os.path.join(REPO, path)):
                missing.append(f"{doc}: {path}")
    assert not missing, "documents name paths that do not exist:\n" + "\n".join(sorted(set(missing)))


# ------------------------------------------------------------------ the README's commands

def test_the_readme_test_command_is_the_one_ci_runs():
    readme = _read("README.md")
    section = readme[readme.index("## Tests\n"):]
    command = re.search(r"```bash\n(.*?)\n```", section, re.S).group(1).strip()
    assert "\n" not in command and command.startswith("python -m pytest"), command
    ci_lines = [line.strip() for line in _read(".ci/run").splitlines()]
    assert command in ci_lines, f".ci/run does not run the README's test command: {command}"
    assert [line for line in ci_lines if "pytest" in line and not line.startswith(("#", "echo"))
            and "pip" not in line] == [command]


def test_the_quick_start_runs_ci_and_avsg_run():
    readme = _read("README.md")
    section = readme[readme.index("## Quick start\n"):readme.index("## Tests\n")]
    block = re.search(r"```bash\n(.*?)\n```", section, re.S).group(1)
    commands = [line.split("#")[0].strip() for line in block.splitlines()]
    assert commands == ["bash .ci/run", "avsg run"], commands
