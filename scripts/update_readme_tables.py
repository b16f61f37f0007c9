"""Copy the tables of docs/results/*.md into every document that quotes them: README.md and
docs/*.md, between the matching '<!-- results:NAME -->' / '<!-- /results:NAME -->' markers.

docs/results/*.md are written by the commands the documents give (`avsg bench ... --tables`,
`avsg trace replay ... --tables`, `avsg serve-sim ... --tables`); run this after regenerating them.
`--check` changes nothing and exits 1 if a copy is stale. tests/house/test_docs.py checks the copies."""
import argparse
import glob
import os
import re
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PATTERN = re.compile(r"<!-- results:([\w-]+) -->\n.*?<!-- /results:\1 -->\n", re.S)


def committed_tables() -> dict:
    """NAME -> the marked block, from docs/results/*.md (the source of every copy)."""
    tables = {}
    for path in sorted(glob.glob(os.path.join(REPO, "docs", "results", "*.md"))):
        for m in PATTERN.finditer(open(path).read()):
            tables[m.group(1)] = m.group(0)
    return tables


def quoting_documents() -> list:
    """The documents that may quote results tables: README.md and docs/*.md (not docs/results)."""
    return [os.path.join(REPO, "README.md")] + sorted(glob.glob(os.path.join(REPO, "docs", "*.md")))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="report stale copies, write nothing")
    args = parser.parse_args(argv)
    tables = committed_tables()
    status = 0
    for path in quoting_documents():
        text = open(path).read()
        rel = os.path.relpath(path, REPO)
        missing = [n for n in re.findall(r"<!-- results:([\w-]+) -->", text) if n not in tables]
        if missing:
            print(f"{rel}: no docs/results table named {', '.join(missing)}", file=sys.stderr)
            status = 1
            continue
        new = PATTERN.sub(lambda m: tables[m.group(1)], text)
        if new == text:
            continue
        if args.check:
            print(f"{rel}: tables differ from docs/results", file=sys.stderr)
            status = 1
        else:
            open(path, "w").write(new)
            print(f"{rel}: tables updated")
    return status


if __name__ == "__main__":
    sys.exit(main())
