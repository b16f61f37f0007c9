"""Copy the tables of docs/results/*.md into README.md (between the matching
'<!-- results:NAME -->' / '<!-- /results:NAME -->' markers). Run after regenerating the results
with the commands the README gives; tests/cli/test_bench_cli.py checks the copies match."""
import glob
import os
import re
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PATTERN = re.compile(r"<!-- results:([\w-]+) -->\n.*?<!-- /results:\1 -->\n", re.S)


def main() -> int:
    tables = {}
    for path in sorted(glob.glob(os.path.join(REPO, "docs", "results", "*.md"))):
        for m in PATTERN.finditer(open(path).read()):
            tables[m.group(1)] = m.group(0)
    readme_path = os.path.join(REPO, "README.md")
    readme = open(readme_path).read()
    missing = [name for name in re.findall(r"<!-- results:([\w-]+) -->", readme) if name not in tables]
    if missing:
        print(f"no results for README tables: {', '.join(missing)}", file=sys.stderr)
        return 1
    new = PATTERN.sub(lambda m: tables[m.group(1)], readme)
    if new != readme:
        open(readme_path, "w").write(new)
        print("README.md tables updated")
    return 0


if __name__ == "__main__":
    sys.exit(main())
